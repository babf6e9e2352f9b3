"""Ragged (grouped, MoE) GEMM with ``jax.lax.ragged_dot`` semantics.

``lhs [m, k]``, ``rhs [g, k, n]``, ``group_sizes [g]`` -> ``out [m, n]``: the
rows of group i are the consecutive block after the rows of groups < i and are
multiplied by ``rhs[i]``; rows past ``sum(group_sizes)`` are zero.

One launch, no host synchronization: ``group_sizes`` stays on the device. Each
persistent program loads the (small) group_sizes vector and computes the
group starts and per-group tile counts with ``tl.cumsum`` in registers, so the
number of tiles is known on the device only. Programs then walk the tile list
(group-major; inside a group, the m-tiles of one n-column are adjacent so they
read the same ``rhs`` tile at about the same time: one HBM read, L2 for the
rest). Rows past the sum of the group sizes form one extra "tail group" whose
tiles write zeros, so the output needs no separate memset.

On sm_90 ``lhs`` and ``rhs`` are read through TMA descriptors when aligned
(``rhs`` as a 3-D descriptor, so a K tile never crosses into the next group);
the output is stored with a row mask (a group's last tile must not touch the
next group's rows).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from flyarray.kernels._triton import (HAS_TENSOR_DESCRIPTORS, cdiv, current_arch, empty, ensure_tma_allocator,
                                     next_pow2, pick_config)
from flyarray.kernels.gemm import FP8_DTYPES, _TRITON_TYPES, _cfg, launch, strides_of
from flyarray.targets import KernelSpec


@triton.jit
def _pick(values, index, lanes):
    """values[index] for a register vector (a masked sum: no dynamic indexing in Triton)."""
    return tl.sum(tl.where(lanes == index, values, 0), axis=0)


@triton.jit
def _ragged_dot_kernel(
    lhs_ptr, rhs_ptr, sizes_ptr, out_ptr,
    M, N, K, G,
    s_lm, s_lk, s_rg, s_rk, s_rn, s_om, s_on,
    NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, G_POW2: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    lanes = tl.arange(0, G_POW2)
    sizes = tl.load(sizes_ptr + lanes, mask=lanes < G, other=0).to(tl.int32)
    sizes = tl.maximum(sizes, 0)
    ends = tl.cumsum(sizes, axis=0)
    total_rows = tl.minimum(tl.max(ends, axis=0), M)
    # The tail (rows past the groups) is group G: it lives in lane G when
    # G < G_POW2; the host pads G_POW2 so that it always does.
    tail = (lanes == G).to(tl.int32) * (M - total_rows)
    sizes = tl.where(lanes < G, sizes, tail)
    ends = tl.cumsum(sizes, axis=0)
    starts = ends - sizes
    m_tiles = tl.cdiv(sizes, BLOCK_M)
    tile_ends = tl.cumsum(m_tiles, axis=0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    total = tl.sum(m_tiles, axis=0) * num_pid_n

    if USE_TMA:
        lhs_desc = tl.make_tensor_descriptor(lhs_ptr, shape=[M, K], strides=[s_lm, 1],
                                             block_shape=[BLOCK_M, BLOCK_K])
        rhs_desc = tl.make_tensor_descriptor(rhs_ptr, shape=[G, K, N], strides=[s_rg, s_rk, 1],
                                             block_shape=[1, BLOCK_K, BLOCK_N])

    offs_k = tl.arange(0, BLOCK_K)
    for tile in tl.range(pid, total, NUM_PROGRAMS):
        m_tile_global = tile // num_pid_n  # group-major, n-columns inside a group
        group = tl.sum((tile_ends <= m_tile_global).to(tl.int32), axis=0)
        g_tiles = _pick(m_tiles, group, lanes)
        g_first_tile = _pick(tile_ends, group, lanes) - g_tiles
        local = tile - g_first_tile * num_pid_n
        pid_n = local // g_tiles
        pid_m = local % g_tiles
        g_start = _pick(starts, group, lanes)
        g_size = _pick(sizes, group, lanes)

        row_in_group = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = g_start + row_in_group
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_end = tl.where(group < G, K, 0)  # the tail group multiplies nothing
        if USE_TMA:
            for k0 in tl.range(0, k_end, BLOCK_K):
                a = lhs_desc.load([g_start + pid_m * BLOCK_M, k0])
                b = rhs_desc.load([group, k0, pid_n * BLOCK_N]).reshape(BLOCK_K, BLOCK_N)
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        else:
            # Rows past the group (or the array) read a valid row instead of
            # masking: they are never stored.
            rows_safe = tl.minimum(rows, M - 1)
            cols = offs_n if EVEN_N else offs_n % N
            a_ptrs = lhs_ptr + rows_safe.to(tl.int64)[:, None] * s_lm + offs_k[None, :] * s_lk
            b_ptrs = (rhs_ptr + group.to(tl.int64) * s_rg + offs_k[:, None] * s_rk
                      + cols[None, :] * s_rn)
            for k0 in tl.range(0, k_end, BLOCK_K):
                if EVEN_K:
                    a = tl.load(a_ptrs)
                    b = tl.load(b_ptrs)
                else:
                    a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k0, other=0.0)
                    b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k0, other=0.0)
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
                a_ptrs += BLOCK_K * s_lk
                b_ptrs += BLOCK_K * s_rk
        mask = ((row_in_group < g_size) & (rows < M))[:, None] & (offs_n < N)[None, :]
        out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * s_om + offs_n[None, :] * s_on
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


# sm_90: BLOCK_M=64 wastes fewer rows on each group's partial last tile than
# 128 (MoE groups are a few hundred rows), and 64x256 is still a full-width wgmma.
CONFIGS = {
    "sm_90": {"16": _cfg(64, 256, 64, 1, 4, 4), "fp8": _cfg(64, 256, 128, 1, 4, 4),
              "fp32": _cfg(64, 128, 32, 1, 4, 3)},
    "gfx950": {"16": _cfg(128, 128, 64, 1, 4, 2), "fp8": _cfg(128, 128, 128, 1, 4, 2),
               "fp32": _cfg(64, 128, 32, 1, 4, 2)},
    "gfx942": {"16": _cfg(128, 128, 32, 1, 4, 2), "fp8": _cfg(128, 128, 64, 1, 4, 2),
               "fp32": _cfg(64, 128, 32, 1, 4, 2)},
    "default": {"16": _cfg(64, 128, 32, 1, 4, 3), "fp8": _cfg(64, 128, 64, 1, 4, 3),
                "fp32": _cfg(64, 64, 32, 1, 4, 3)},
    "cpu": {d: _cfg(16, 16, 16, 1, 1, 1) for d in ("16", "fp8", "fp32")},
}

TUNING_CANDIDATES = {
    "sm_90": {"ragged": [_cfg(64, 256, 64, 1, 4, 4), _cfg(64, 256, 64, 1, 4, 3), _cfg(128, 256, 64, 1, 8, 3),
                         _cfg(128, 128, 64, 1, 4, 4), _cfg(128, 128, 64, 1, 8, 4), _cfg(64, 128, 64, 1, 4, 5)]},
    "gfx950": {"ragged": [_cfg(128, 128, 64, 1, 4, 2), _cfg(256, 128, 64, 1, 8, 2), _cfg(64, 128, 64, 1, 4, 2)]},
}


def _dtype_class(dtype):
    return "fp8" if dtype in FP8_DTYPES else ("fp32" if dtype == torch.float32 else "16")


def _tma_ok(lhs, rhs) -> bool:
    elem = lhs.element_size()
    return (lhs.stride(-1) == 1 and rhs.stride(-1) == 1 and lhs.data_ptr() % 16 == 0
            and rhs.data_ptr() % 16 == 0 and (lhs.stride(0) * elem) % 16 == 0
            and all((s * elem) % 16 == 0 for s in rhs.stride()[:2]))


def _programs(device, cfg) -> int:
    if device.type == "cpu":
        return 3
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_ragged_dot(lhs, rhs, group_sizes, out, cfg, arch):
    M, K = lhs.shape
    G, _, N = rhs.shape
    use_tma = bool(cfg.get("TMA", True) and arch == "sm_90" and HAS_TENSOR_DESCRIPTORS and _tma_ok(lhs, rhs))
    if use_tma:
        ensure_tma_allocator()
    # Upper bound on tiles: every group's partial tile, plus the tail group.
    max_tiles = (cdiv(M, cfg["BLOCK_M"]) + G + 1) * cdiv(N, cfg["BLOCK_N"])
    programs = max(1, min(max_tiles, _programs(lhs.device, cfg)))
    precision = "ieee"
    launch(_ragged_dot_kernel, lhs.device, (programs,),
           lhs, rhs, group_sizes, out, M, N, K, G,
           *lhs.stride(), *rhs.stride(), *out.stride(), programs,
           BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
           G_POW2=next_pow2(G + 1), EVEN_N=(N % cfg["BLOCK_N"] == 0),
           EVEN_K=(K % cfg["BLOCK_K"] == 0), USE_TMA=use_tma, DOT_PRECISION=precision,
           num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *,
               out_dtype: Optional[torch.dtype] = None, tune: Optional[bool] = None,
               config: Optional[dict] = None) -> torch.Tensor:
    """``jax.lax.ragged_dot(lhs, rhs, group_sizes)``: lhs [m, k], rhs [g, k, n],
    group_sizes [g] (int32/int64, on lhs's device) -> [m, n], in one launch with
    no host synchronization. fp32 is computed exactly (no tf32). out_dtype
    defaults to lhs's dtype (bf16 for fp8 inputs)."""
    if out_dtype is None:
        out_dtype = torch.bfloat16 if lhs.dtype in FP8_DTYPES else lhs.dtype
    M, K = lhs.shape
    G, _, N = rhs.shape
    out = empty((M, N), out_dtype, lhs.device)
    if M == 0 or N == 0:
        return out
    if G == 0:
        return out.zero_()
    arch = current_arch(lhs.device)
    cfg = config or _choose_config(arch, lhs, rhs, group_sizes, out, tune)
    launch_ragged_dot(lhs, rhs, group_sizes, out, cfg, arch)
    return out


def _choose_config(arch, lhs, rhs, group_sizes, out, tune):
    from flyarray.kernels import tuning
    default = dict(pick_config(CONFIGS, arch)[_dtype_class(lhs.dtype)])
    if arch == "cpu" or not tuning.enabled(tune):
        return default
    candidates = tuning.candidates_for(TUNING_CANDIDATES, arch, "ragged", default)
    M, K = lhs.shape
    G, _, N = rhs.shape
    key = tuning.make_key("ragged_dot", arch, str(lhs.dtype).replace("torch.", ""), (M, N, K, G),
                          extra=[_tma_ok(lhs, rhs)])
    return tuning.tune("ragged_dot", key, candidates,
                       lambda cfg: launch_ragged_dot(lhs, rhs, group_sizes, out, cfg, arch), default)


def reference_ragged_dot(lhs, rhs, group_sizes, *, out_dtype=None) -> torch.Tensor:
    """Float64 oracle: a loop over groups (reads group_sizes on the host)."""
    if out_dtype is None:
        out_dtype = torch.bfloat16 if lhs.dtype in FP8_DTYPES else lhs.dtype
    M, N = lhs.shape[0], rhs.shape[-1]
    out = torch.zeros((M, N), dtype=torch.float64, device=lhs.device)
    start = 0
    for g, size in enumerate(group_sizes.tolist()):
        end = min(start + int(size), M)
        if end > start:
            out[start:end] = lhs[start:end].double() @ rhs[g].double()
        start = end
    return out.to(out_dtype)


def _spec(name, dtype, cfg, tma=False):
    out_dtype = torch.bfloat16 if dtype in FP8_DTYPES else dtype
    pointers = {"lhs_ptr": dtype, "rhs_ptr": dtype, "out_ptr": out_dtype}
    constexprs = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], G_POW2=128,
                      EVEN_N=True, EVEN_K=True, USE_TMA=tma, DOT_PRECISION="ieee",
                      s_lk=1, s_rn=1, s_on=1)
    signature = {}
    for arg in _ragged_dot_kernel.arg_names:
        if arg in constexprs:
            signature[arg] = "constexpr"
        elif arg in pointers:
            signature[arg] = "*" + _TRITON_TYPES[pointers[arg]]
        elif arg == "sizes_ptr":
            signature[arg] = "*i32"
        else:
            signature[arg] = "i32"
    return KernelSpec(name=name, fn=_ragged_dot_kernel, signature=signature, constexprs=constexprs,
                      num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                      divisible=strides_of(signature))


def compile_specs(target: Optional[str] = None) -> list:
    """bf16, fp16 and fp8 e4m3 specializations with ``target``'s configs (default
    gfx950's); on sm_90 also the TMA variant."""
    table = CONFIGS.get(target or "gfx950", CONFIGS["default"])
    specs = [_spec("ragged_dot_bf16", torch.bfloat16, table["16"]),
             _spec("ragged_dot_fp16", torch.float16, table["16"]),
             _spec("ragged_dot_fp8e4m3", torch.float8_e4m3fn, table["fp8"])]
    if target == "sm_90" and HAS_TENSOR_DESCRIPTORS:
        specs.append(_spec("ragged_dot_bf16_tma", torch.bfloat16, table["16"], tma=True))
        specs.append(_spec("ragged_dot_fp8e4m3_tma", torch.float8_e4m3fn, table["fp8"], tma=True))
    return specs
