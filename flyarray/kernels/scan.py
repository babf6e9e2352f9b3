"""Inclusive scans along the last axis: cumulative sum and product (array API ``cumulative_sum/prod``).

Semantics, the same here and in ``reference_scan``:

* ``scan(x, op, out_dtype, include_initial)``: ``op`` is ``"sum"`` or ``"prod"``; the result has
  ``out_dtype`` and shape ``x.shape`` (or the last axis one longer with ``include_initial``, whose
  first entry is the identity: 0 for sum, 1 for prod).
* Accumulation: float16/bfloat16 (and float32) in float32, float64 in float64, integers and bool in
  int64 (wrapping on overflow, as torch and numpy do). The result is rounded to ``out_dtype`` once,
  at the store, so a half-precision cumsum does not compound rounding along the row.

How it works. One program per row walks the row in blocks of BLOCK: ``tl.associative_scan`` scans
the block, the running prefix of the blocks before it is combined in, and the block's last
inclusive value becomes the next prefix. Long rows are therefore one pass with a carried prefix (a
sequential chain of blocks, like a CPU loop; many rows give the parallelism). Kernels call only
Triton's own combine functions (the interpreter recognizes them by identity).
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from flyarray.kernels._triton import current_arch, next_pow2, pick_config, runner
from flyarray.targets import KernelSpec

# block: elements a program scans at a time (a long row loops over blocks); warps: per program.
CONFIGS = {
    "sm_90": {"block": 1024, "warps": 4},
    "gfx950": {"block": 1024, "warps": 4},  # wave64: 4 waves, 4 elements a lane
    "default": {"block": 1024, "warps": 4},
}

_ADD = tl.standard._sum_combine
_MUL = tl.standard._prod_combine


@triton.jit
def _scan_kernel(x_ptr, out_ptr, N, stride_x, stride_out,
                 BLOCK: tl.constexpr, PROD: tl.constexpr, INITIAL: tl.constexpr, ACC: tl.constexpr):
    """Program = one row: blocks of BLOCK scanned in order, the prefix carried from block to block."""
    row = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    if PROD:
        carry = tl.full([], 1, ACC)
    else:
        carry = tl.full([], 0, ACC)
    if INITIAL:  # the identity in front: the row's output is one longer
        tl.store(out_row, carry.to(out_ptr.dtype.element_ty))
    if not PROD and ACC != tl.int64:   # -0.0 is the float sum's identity: a row of -0.0 sums to -0.0, as numpy's
        carry = tl.full([], -0.0, ACC)   # cumsum has it (+0.0 + -0.0 is +0.0)
    for start in range(0, N, BLOCK):
        cols = start + lane
        ok = cols < N
        if PROD:
            x = tl.load(x_row + cols, mask=ok, other=1).to(ACC)
            inc = tl.associative_scan(x, 0, _MUL) * carry
            # the last valid inclusive value: the product of the padded tail (1s) changes nothing
            carry = tl.reduce(tl.where(lane == BLOCK - 1, inc, 1), 0, _MUL)
        else:
            x = tl.load(x_row + cols, mask=ok, other=0).to(ACC)
            inc = tl.associative_scan(x, 0, _ADD) + carry
            if ACC == tl.int64:
                carry = tl.reduce(tl.where(lane == BLOCK - 1, inc, 0), 0, _ADD)
            else:   # the last lane's bits, summed as integers: a float sum may drop a -0.0's sign (the interpreter's)
                BITS: tl.constexpr = tl.int64 if ACC == tl.float64 else tl.int32
                carry = tl.sum(tl.where(lane == BLOCK - 1, inc.to(BITS, bitcast=True), 0), 0).to(ACC, bitcast=True)
        tl.store(out_row + cols + INITIAL, inc.to(out_ptr.dtype.element_ty), mask=ok)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulator of a scan whose result is ``dtype`` (module docstring; the op casts the input to
    the result's dtype first where they differ, as the array API says)."""
    if dtype == torch.float64:
        return torch.float64
    if dtype.is_floating_point:
        return torch.float32
    return torch.int64


_TL = {torch.float32: tl.float32, torch.float64: tl.float64, torch.int64: tl.int64}


def scan(x: torch.Tensor, op: str, out_dtype: torch.dtype, include_initial: bool = False,
         *, config: dict | None = None) -> torch.Tensor:
    """Cumulative ``op`` ('sum' | 'prod') along the last axis; see the module docstring."""
    N = x.shape[-1]
    out = torch.empty(tuple(x.shape[:-1]) + (N + int(include_initial),), dtype=out_dtype, device=x.device)
    if out.numel() == 0 or x.numel() == 0 and not include_initial:
        return out
    rows = out.numel() // out.shape[-1]
    x2 = x.reshape(rows, N)
    if x2.dtype == torch.bool:  # Triton loads bool as int1; a byte view loads the same values
        x2 = x2.view(torch.uint8)
    if N and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    cfg = dict(pick_config(CONFIGS, current_arch(x.device)), **(config or {}))
    acc = acc_dtype(out_dtype)
    runner(_scan_kernel, x.device)[(rows,)](
        x2, out.view(rows, -1), N, x2.stride(0), out.shape[-1],
        BLOCK=min(cfg["block"], next_pow2(N)), PROD=op == "prod", INITIAL=int(include_initial),
        ACC=_TL[acc], num_warps=cfg["warps"])
    return out


def reference_scan(x: torch.Tensor, op: str, out_dtype: torch.dtype, include_initial: bool = False, acc=None):
    """torch.cumsum / cumprod in the kernel's accumulator (``acc_dtype``: float32 for float16/bfloat16/float32,
    so the reference backend overflows, and loses small terms, where the kernel does), then rounded once.
    ``acc=torch.float64``: the tests' higher-precision oracle."""
    acc = acc or acc_dtype(out_dtype)
    xa = x.detach().to(acc)
    if acc == torch.float32 and xa.device.type == "cpu":
        out = _float32_scan_on_cpu(xa, op)
    else:   # (on a GPU torch's float32 scans accumulate in float32)
        out = torch.cumprod(xa, dim=-1) if op == "prod" else torch.cumsum(xa, dim=-1)
    if op == "sum" and out.is_floating_point() and out.numel():
        # a prefix of -0.0 only sums to -0.0 (numpy's cumsum, the kernel's); torch's cumsum starts from +0.0
        negative_zeros = torch.cummin(((xa == 0) & torch.signbit(xa)).to(torch.int8), dim=-1).values.bool()
        out = torch.where(negative_zeros, torch.full_like(out, -0.0), out)
    if include_initial:
        ident = torch.ones if op == "prod" else torch.zeros
        out = torch.cat([ident(tuple(x.shape[:-1]) + (1,), dtype=out.dtype, device=x.device), out], dim=-1)
    return out.to(out_dtype)


def _float32_scan_on_cpu(x: torch.Tensor, op: str) -> torch.Tensor:
    """An inclusive scan whose every partial result is a float32, in row order: torch's CPU cumsum/cumprod of
    float32 accumulate in float64 (neither overflowing where float32 does nor dropping what float32 drops);
    numpy's accumulate in the dtype."""
    ufunc = np.multiply if op == "prod" else np.add
    with np.errstate(all="ignore"):
        return torch.from_numpy(ufunc.accumulate(x.contiguous().numpy(), axis=-1, dtype=np.float32))


def compile_specs() -> list:
    """fp16 cumsum (fp32 accumulation) and fp32 cumprod rows, and an int32 cumsum (int64 accumulation)."""
    specs = []
    for arch in ("sm_90", "gfx950"):
        cfg = CONFIGS[arch]
        for name, xt, ot, prod, acc in (("cumsum_fp16", "*fp16", "*fp16", False, tl.float32),
                                        ("cumprod_fp32", "*fp32", "*fp32", True, tl.float32),
                                        ("cumsum_i32", "*i32", "*i64", False, tl.int64)):
            specs.append(KernelSpec(
                f"scan_{name}_{arch}", _scan_kernel,
                {"x_ptr": xt, "out_ptr": ot, "N": "i32", "stride_x": "i32", "stride_out": "i32",
                 "BLOCK": "constexpr", "PROD": "constexpr", "INITIAL": "constexpr", "ACC": "constexpr"},
                {"BLOCK": cfg["block"], "PROD": prod, "INITIAL": 0, "ACC": acc},
                num_warps=cfg["warps"]))
    return specs
