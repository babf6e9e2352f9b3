"""Sorting and searching along the last axis: stable sort with its permutation, and binary search.

Semantics, the same on every path and in the references:

* ``sort(x, descending) -> (values, indices)``: a **stable** sort of each row of the last axis;
  indices int64 (``values == take_along_axis(x, indices)``, bit for bit: a -0.0 stays -0.0).
  Ascending puts NaN **last**; descending is the reverse order with equal elements still in
  index order, so NaN comes **first** (as ``array_api_strict``: flip, stable sort, flip; and as
  torch). ``-0.0`` and ``+0.0`` are equal (their order is the input's). All NaNs are equal.
* ``searchsorted(seq, v, right) -> int64``: for each value of ``v[..., j]`` the insertion point in
  the sorted row ``seq[...]`` (numpy's): the first position whose element is ``>= v`` ('left') or
  ``> v`` ('right'), in the order above (NaN above +inf; -0.0 == 0.0). Rows of ``seq`` and ``v``
  pair up by their leading dims (vmap batches them; the array API's case is one row).

How the sort works. Each element becomes an order-preserving signed 32-bit key (floats: flip the
magnitude bits of negatives, every NaN becomes the top key, -0.0 folds onto +0.0; descending takes
the bitwise complement, which reverses the order exactly), and one signed 64-bit word
``key << 32 | column``. The words are distinct, so ``tl.sort`` (a bitonic network on a row padded
to a power of two with INT64_MAX) gives exactly the stable order; the column comes back out of the
low word and the value is gathered from it. One program sorts one row of up to ``max_n`` elements.

**Library call to torch** (no Triton kernel): rows longer than ``max_n``, and 64-bit dtypes
(int64, uint64, float64, whose keys do not fit the 32-bit half of the word), are sorted by
``torch.sort(stable=True)``; ``uses_kernel`` says which. uint16/32/64 go there as int64 keys in
their unsigned order (unsigned.order_key), the values gathered through the signed view. The binary search is a Triton kernel for
every dtype (it compares values, not keys).
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from flyarray import unsigned as _u
from flyarray.kernels._triton import cdiv, current_arch, empty, next_pow2, pick_config, runner
from flyarray.kernels.top_k import order_key
from flyarray.targets import KernelSpec

# max_n: longest row one program sorts in registers (int64 words; longer rows: torch.sort).
# lanes_per_warp_elems: the sort kernel gets one warp per this many elements (at most max_warps).
# search_block: values of v one binary-search program handles.
CONFIGS = {
    "sm_90": {"max_n": 4096, "elems_per_warp": 256, "max_warps": 8, "search_block": 256, "search_warps": 4},
    "gfx950": {"max_n": 4096, "elems_per_warp": 512, "max_warps": 8, "search_block": 512, "search_warps": 4},
    "default": {"max_n": 4096, "elems_per_warp": 256, "max_warps": 8, "search_block": 256, "search_warps": 4},
}

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8, torch.int16,
                 torch.int32, torch.bool, torch.uint16, torch.uint32)
_PAD = 2 ** 63 - 1  # above every packed word: padding sorts to the end


@triton.jit
def _sort_kernel(x_ptr, vals_ptr, idx_ptr, N, stride_x,
                 BLOCK: tl.constexpr, DESC: tl.constexpr, IS_FLOAT: tl.constexpr):
    """Program = one row: pack (key, column) into int64 words, tl.sort them, unpack and gather."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0)
    key = order_key(x, IS_FLOAT)  # order-preserving int32 key; all NaNs on top, -0.0 folded onto +0.0
    if DESC:
        key = ~key  # -key - 1: the exact reverse order, so ties stay in column order
    word = (key.to(tl.int64) << 32) | cols.to(tl.int64)
    word = tl.where(ok, word, 9223372036854775807)
    word = tl.sort(word, 0)
    idx = word & 0xFFFFFFFF
    v = tl.load(x_ptr + row * stride_x + idx, mask=ok, other=0)  # the elements themselves, bit for bit
    tl.store(vals_ptr + row * N + cols, v, mask=ok)
    tl.store(idx_ptr + row * N + cols, idx, mask=ok)


@triton.jit
def _searchsorted_kernel(seq_ptr, v_ptr, out_ptr, N, M, stride_seq, stride_v, steps,
                         BLOCK: tl.constexpr, RIGHT: tl.constexpr, IS_FLOAT: tl.constexpr):
    """Program (row, block of v): a branch-free binary search per value, ``steps`` = bit length of N."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = j < M
    v = tl.load(v_ptr + row * stride_v + j, mask=ok, other=0)
    lo = tl.zeros([BLOCK], tl.int32)
    hi = tl.zeros([BLOCK], tl.int32) + N
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        s = tl.load(seq_ptr + row * stride_seq + mid, mask=ok & active, other=0)
        # go right when seq[mid] < v ('left') or seq[mid] <= v ('right'); NaN ranks above everything
        if RIGHT:
            if IS_FLOAT:
                right = ~((v < s) | ((s != s) & (v == v)))
            else:
                right = s <= v
        else:
            if IS_FLOAT:
                right = (s < v) | ((v != v) & (s == s))
            else:
                right = s < v
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    tl.store(out_ptr + row * M + j, lo.to(tl.int64), mask=ok)


def _config(device, overrides):
    return dict(pick_config(CONFIGS, current_arch(device)), **(overrides or {}))


def uses_kernel(n: int, dtype: torch.dtype, config: dict | None = None, device="cpu") -> bool:
    """Whether rows of length ``n`` and ``dtype`` go through the Triton sort (else torch.sort)."""
    return dtype in KERNEL_DTYPES and n <= _config(torch.device(device), config)["max_n"]


def sort_warps(block: int, cfg: dict) -> int:
    return max(1, min(cfg["max_warps"], block // cfg["elems_per_warp"]))


def sort(x: torch.Tensor, descending: bool = False, *, config: dict | None = None):
    """(values, int64 indices) of a stable sort along the last axis; see the module docstring."""
    N = x.shape[-1]
    if not uses_kernel(N, x.dtype, config, x.device):  # the documented library call (long rows, 64-bit)
        if _u.is_wide(x.dtype):  # sort int64 keys in the unsigned order (torch's uint kernels vary by device)
            _, indices = torch.sort(_u.order_key(_u.to_lanes(x)), dim=-1, descending=descending, stable=True)
            return _u.unsigned_view(torch.gather(_u.signed_view(x), -1, indices), x.dtype), indices
        values, indices = torch.sort(x, dim=-1, descending=descending, stable=True)
        return values, indices
    values = torch.empty_like(x, memory_format=torch.contiguous_format)
    indices = empty(x.shape, torch.int64, x.device)
    if x.numel() == 0:
        return values, indices
    x2 = x.reshape(-1, N)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if x2.dtype == torch.bool:  # Triton loads bool as int1; a byte view sorts the same
        x2, values = x2.view(torch.uint8), values.view(torch.uint8)
    block = next_pow2(N)
    cfg = _config(x.device, config)
    runner(_sort_kernel, x.device)[(x2.shape[0],)](
        x2, values, indices, N, x2.stride(0), BLOCK=block, DESC=bool(descending),
        IS_FLOAT=x2.dtype.is_floating_point, num_warps=sort_warps(block, cfg))
    return values.view(x.dtype) if x.dtype == torch.bool else values, indices


def searchsorted(seq: torch.Tensor, v: torch.Tensor, right: bool = False, *, config: dict | None = None):
    """Insertion points (int64) of ``v[..., j]`` in the sorted rows ``seq[...]`` (same leading dims)."""
    N, M = seq.shape[-1], v.shape[-1]
    out = empty(v.shape, torch.int64, v.device)
    if out.numel() == 0:
        return out
    rows = v.numel() // M
    s2, v2 = seq.reshape(rows, N), v.reshape(rows, M)
    if N and s2.stride(-1) != 1:
        s2 = s2.contiguous()
    if v2.stride(-1) != 1:
        v2 = v2.contiguous()
    if s2.dtype == torch.bool:
        s2, v2 = s2.view(torch.uint8), v2.view(torch.uint8)
    cfg = _config(v.device, config)
    block = min(cfg["search_block"], next_pow2(M))
    runner(_searchsorted_kernel, v.device)[(v2.shape[0], cdiv(M, block))](
        s2, v2, out, N, M, s2.stride(0) if N else 0, v2.stride(0), int(N).bit_length(),
        BLOCK=block, RIGHT=bool(right), IS_FLOAT=s2.dtype.is_floating_point, num_warps=cfg["search_warps"])
    return out


# ----------------------------------------------------------------------------- references

def _numpy_rows(x: torch.Tensor) -> np.ndarray:
    t = x.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()  # exact
    return t.reshape(int(np.prod(x.shape[:-1])), x.shape[-1]).numpy()


def reference_sort(x: torch.Tensor, descending: bool = False):
    """The oracle: numpy's stable argsort (NaN last, -0.0 == 0.0); descending as flip, sort, flip."""
    N = x.shape[-1]
    rows = _numpy_rows(x)
    if descending:
        order = N - 1 - np.flip(np.argsort(np.flip(rows, -1), axis=-1, kind="stable"), -1)
    else:
        order = np.argsort(rows, axis=-1, kind="stable")
    indices = torch.from_numpy(np.ascontiguousarray(order)).to(torch.int64).reshape(x.shape).to(x.device)
    return _u.unsigned_view(torch.gather(_u.signed_view(x), -1, indices), x.dtype), indices


def reference_searchsorted(seq: torch.Tensor, v: torch.Tensor, right: bool = False):
    """The oracle: numpy.searchsorted row by row (NaN sorts last there too)."""
    s, w = _numpy_rows(seq), _numpy_rows(v)
    side = "right" if right else "left"
    out = np.stack([np.searchsorted(s[i], w[i], side=side) for i in range(w.shape[0])]) if w.shape[0] else \
        np.zeros((0, v.shape[-1]), np.int64)
    return torch.from_numpy(out.astype(np.int64)).reshape(v.shape).to(v.device)


# ----------------------------------------------------------------------------- compile specs

def compile_specs() -> list:
    """The longest kernel sort (fp32 and bf16 rows of max_n, descending) and a 1M-entry binary search."""
    specs = []
    for arch in ("sm_90", "gfx950"):
        cfg = CONFIGS[arch]
        block = cfg["max_n"]
        for name, t in (("fp32", "*fp32"), ("bf16", "*bf16"), ("i32", "*i32")):
            specs.append(KernelSpec(
                f"sort_{name}_n{block}_{arch}", _sort_kernel,
                {"x_ptr": t, "vals_ptr": t, "idx_ptr": "*i64", "N": "i32", "stride_x": "i32",
                 "BLOCK": "constexpr", "DESC": "constexpr", "IS_FLOAT": "constexpr"},
                {"BLOCK": block, "DESC": name == "bf16", "IS_FLOAT": name != "i32"},
                num_warps=sort_warps(block, cfg)))
        specs.append(KernelSpec(
            f"searchsorted_fp32_{arch}", _searchsorted_kernel,
            {"seq_ptr": "*fp32", "v_ptr": "*fp32", "out_ptr": "*i64", "N": "i32", "M": "i32",
             "stride_seq": "i32", "stride_v": "i32", "steps": "i32",
             "BLOCK": "constexpr", "RIGHT": "constexpr", "IS_FLOAT": "constexpr"},
            {"BLOCK": cfg["search_block"], "RIGHT": False, "IS_FLOAT": True},
            num_warps=cfg["search_warps"]))
    return specs
