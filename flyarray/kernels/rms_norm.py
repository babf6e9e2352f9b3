"""RMSNorm (optionally fused with a residual add) as hand-written Triton kernels.

Forward:  h = x (+ residual, rounded to x's dtype as torch rounds it)
          y = h * rsqrt(mean(h^2) + eps) * weight
Both h and y are written in one pass over the inputs; rstd (fp32, one per row)
is kept for the backward pass. All arithmetic is fp32.

Backward: with xhat = h * rstd and g = dy * weight,
          dh      = rstd * (g - xhat * mean(g * xhat))   (+ the incoming gradient of h)
          dweight = sum over rows of dy * xhat
The dweight reduction is deterministic: each program sums its own block of
rows into one row of an fp32 [programs, N] buffer, and a second kernel sums
that buffer over programs in a fixed order. No atomics.

Two shapes of kernel: rows that fit in one block are done in one pass, several
rows to a program when they are short; longer rows loop over chunks (a
statistics pass, then a write pass that re-reads the row, mostly from L2).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flyarray.kernels._triton import cdiv, current_arch, empty, next_pow2, pick_config, runner
from flyarray.targets import KernelSpec

# tile_elems: elements per program in the one-pass kernels (several short rows share a program).
# elems_per_thread: sets num_warps = tile / (elems_per_thread * warp size); 16 bf16 = two 16-byte loads.
# max_single_block: the longest row done in one pass; longer rows loop in `chunk`-sized pieces.
# bwd_programs_per_sm: how many programs share the rows in backward (each writes one dweight partial row).
# bwd_elems_per_thread: backward keeps dy, h, weight and the dweight accumulator live, so it spreads a
#   row over twice the threads to stay clear of spills and keep two programs per SM; rows past
#   bwd_max_single_block loop (a 16384-wide one-pass backward spills on sm_90).
CONFIGS = {
    "sm_90": {  # 32-lane warps, 64 warps/SM: 8 programs of 8 warps keep ~64 KiB of loads in flight per SM
        "warp_size": 32, "tile_elems": 4096, "elems_per_thread": 16, "max_rows": 64,
        "max_single_block": 16384, "chunk": 4096, "looped_warps": 8, "bwd_programs_per_sm": 4,
        # 8192-wide fp32 backward rows spill on sm_90 once compiled with a launch's alignment hints
        "bwd_elems_per_thread": 8, "bwd_max_single_block": 4096,
    },
    "gfx950": {  # wave64, 160 KiB LDS (only the cross-wave reduction uses it): 4 waves = 256 lanes per 4096 row
        "warp_size": 64, "tile_elems": 4096, "elems_per_thread": 16, "max_rows": 64,
        "max_single_block": 16384, "chunk": 4096, "looped_warps": 8, "bwd_programs_per_sm": 4,
        "bwd_elems_per_thread": 8, "bwd_max_single_block": 8192,
    },
    "default": {
        "warp_size": 32, "tile_elems": 4096, "elems_per_thread": 16, "max_rows": 64,
        "max_single_block": 16384, "chunk": 4096, "looped_warps": 8, "bwd_programs_per_sm": 4,
        "bwd_elems_per_thread": 8, "bwd_max_single_block": 8192,
    },
}


# ----------------------------------------------------------------------------- kernels

# Reductions are written tl.reduce(x, axis, tl.standard._sum_combine / _elementwise_max)
# rather than tl.sum / tl.max: those are @jit functions themselves, which a kernel run by
# `runner`'s interpreter cannot call, while the interpreter reduces with numpy when it
# sees exactly these combine functions (named by attribute, so runner leaves them as they
# are). The compiled code is the same as tl.sum's / tl.max's on floats.


@triton.jit
def _rms_norm_fwd_rows_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, rstd_ptr,
    M, N, x_stride, res_stride, y_stride, h_stride, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """BLOCK_M whole rows per program, one read of each input and one write of each output."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    mask = row_ok[:, None] & (cols < N)[None, :]
    rows64 = rows.to(tl.int64)[:, None]  # M * stride can pass 2^31
    x = tl.load(x_ptr + rows64 * x_stride + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows64 * res_stride + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        h = (x + r).to(h_ptr.dtype.element_ty)  # rounded as torch rounds x + residual
        tl.store(h_ptr + rows64 * h_stride + cols[None, :], h, mask=mask)
        x = h.to(tl.float32)
    rstd = tl.rsqrt(tl.reduce(x * x, 1, tl.standard._sum_combine) / N + eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0, eviction_policy="evict_last")
        y = y * w.to(tl.float32)[None, :]
    tl.store(y_ptr + rows64 * y_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_fwd_looped_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, rstd_ptr,
    M, N, x_stride, res_stride, y_stride, h_stride, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One long row per program: pass 1 sums squares (and writes h), pass 2 writes y."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    h_row = h_ptr + row * h_stride
    acc = tl.full([BLOCK_N], 0.0, tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        # evict_last: pass 2 re-reads this chunk, so keep it in L2
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            h = (x + r).to(h_ptr.dtype.element_ty)
            tl.store(h_row + cols, h, mask=mask)
            x = h.to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.reduce(acc, 0, tl.standard._sum_combine) / N + eps)
    tl.store(rstd_ptr + row, rstd)
    # last chunk first: the most recently read chunks are the likeliest still in L2
    num_chunks = (N + BLOCK_N - 1) // BLOCK_N
    for i in range(0, num_chunks):
        start = (num_chunks - 1 - i) * BLOCK_N
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        # the same thread wrote this h chunk in pass 1 (same layout), so it reads its own write
        if HAS_RESIDUAL:
            x = tl.load(h_row + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        y = x.to(tl.float32) * rstd
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last")
            y = y * w.to(tl.float32)
        tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_rows_kernel(
    dy_ptr, h_ptr, w_ptr, rstd_ptr, dhx_ptr, dx_ptr, dw_part_ptr,
    M, N, dy_stride, h_stride, dhx_stride, dx_stride, rows_per_program,
    HAS_WEIGHT: tl.constexpr, HAS_EXTRA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """A contiguous block of rows per program, BLOCK_M at a time; one dweight partial row per program."""
    pid = tl.program_id(0)
    row_begin = pid * rows_per_program
    row_end = tl.minimum(row_begin + rows_per_program, M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    for first in range(row_begin, row_end, BLOCK_M):
        rows = first + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        dy = tl.load(dy_ptr + rows64 * dy_stride + cols[None, :], mask=mask, other=0.0,
                     eviction_policy="evict_first").to(tl.float32)
        h = tl.load(h_ptr + rows64 * h_stride + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        xhat = h * rstd[:, None]
        g = dy * w[None, :] if HAS_WEIGHT else dy
        c = tl.reduce(g * xhat, 1, tl.standard._sum_combine) / N
        dx = (g - xhat * c[:, None]) * rstd[:, None]
        if HAS_EXTRA:
            dx += tl.load(dhx_ptr + rows64 * dhx_stride + cols[None, :], mask=mask, other=0.0,
                          eviction_policy="evict_first").to(tl.float32)
        tl.store(dx_ptr + rows64 * dx_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            dw_acc += dy * xhat
    if HAS_WEIGHT:
        tl.store(dw_part_ptr + pid.to(tl.int64) * N + cols, tl.reduce(dw_acc, 0, tl.standard._sum_combine), mask=col_ok)


@triton.jit
def _rms_norm_bwd_looped_kernel(
    dy_ptr, h_ptr, w_ptr, rstd_ptr, dhx_ptr, dx_ptr, dw_part_ptr,
    M, N, dy_stride, h_stride, dhx_stride, dx_stride, rows_per_program,
    HAS_WEIGHT: tl.constexpr, HAS_EXTRA: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Long rows: per row, pass 1 computes mean(g * xhat), pass 2 writes dx and adds to
    this program's own dweight partial row (zero-initialised; no other program touches it)."""
    pid = tl.program_id(0)
    row_begin = pid * rows_per_program
    row_end = tl.minimum(row_begin + rows_per_program, M)
    dw_row = dw_part_ptr + pid.to(tl.int64) * N
    for i in range(0, row_end - row_begin):
        row64 = (row_begin + i).to(tl.int64)  # (a plain int in the interpreter if it were the loop index)
        rstd = tl.load(rstd_ptr + row64)
        acc = tl.full([BLOCK_N], 0.0, tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < N
            g = tl.load(dy_ptr + row64 * dy_stride + cols, mask=mask, other=0.0,
                        eviction_policy="evict_last").to(tl.float32)
            h = tl.load(h_ptr + row64 * h_stride + cols, mask=mask, other=0.0,
                        eviction_policy="evict_last").to(tl.float32)
            if HAS_WEIGHT:
                g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            acc += g * h
        c = tl.reduce(acc, 0, tl.standard._sum_combine) * rstd / N  # mean(g * xhat)
        # last chunk first: the most recently read chunks are the likeliest still in L2
        num_chunks = (N + BLOCK_N - 1) // BLOCK_N
        for i in range(0, num_chunks):
            start = (num_chunks - 1 - i) * BLOCK_N
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < N
            dy = tl.load(dy_ptr + row64 * dy_stride + cols, mask=mask, other=0.0,
                         eviction_policy="evict_first").to(tl.float32)
            xhat = tl.load(h_ptr + row64 * h_stride + cols, mask=mask, other=0.0,
                           eviction_policy="evict_first").to(tl.float32) * rstd
            g = dy
            if HAS_WEIGHT:
                g = dy * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            dx = (g - xhat * c) * rstd
            if HAS_EXTRA:
                dx += tl.load(dhx_ptr + row64 * dhx_stride + cols, mask=mask, other=0.0,
                              eviction_policy="evict_first").to(tl.float32)
            tl.store(dx_ptr + row64 * dx_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if HAS_WEIGHT:
                part = tl.load(dw_row + cols, mask=mask, other=0.0)
                tl.store(dw_row + cols, part + dy * xhat, mask=mask)


@triton.jit
def _sum_partials_kernel(part_ptr, out_ptr, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n] = sum over p of part[p, n], always in the same order: deterministic."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc = tl.full([BLOCK_P, BLOCK_N], 0.0, tl.float32)
    for first in range(0, P, BLOCK_P):
        rows = first + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_ok[None, :]
        acc += tl.load(part_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.reduce(acc, 0, tl.standard._sum_combine).to(out_ptr.dtype.element_ty), mask=col_ok)


# ----------------------------------------------------------------------------- planning


def _warps_for(tile_elems: int, cfg: dict) -> int:
    warps = tile_elems // (cfg["elems_per_thread"] * cfg["warp_size"])
    return max(1, min(16, next_pow2(warps)))


def _plan(M: int, N: int, arch: str, block_n: int | None, backward: bool = False) -> dict:
    """Block shape and warps for an (M, N) problem. `block_n` forces the longest one-pass
    row (and the loop chunk), so tests can reach the looped kernels with tiny rows."""
    cfg = pick_config(CONFIGS, arch)
    max_single = block_n or cfg["bwd_max_single_block" if backward else "max_single_block"]
    if N <= max_single:
        block = next_pow2(N)
        rows = max(1, min(cfg["tile_elems"] // block, cfg["max_rows"], next_pow2(M)))
        if backward:
            cfg = {**cfg, "elems_per_thread": cfg["bwd_elems_per_thread"]}
        return {"looped": False, "BLOCK_M": rows, "BLOCK_N": block, "num_warps": _warps_for(rows * block, cfg)}
    chunk = next_pow2(block_n or cfg["chunk"])
    return {"looped": True, "BLOCK_M": 1, "BLOCK_N": chunk, "num_warps": cfg["looped_warps"]}


def _rows_view(t: torch.Tensor, N: int) -> torch.Tensor:
    """t as an (M, N) matrix with a unit column stride, copying only when it must.

    A strided last axis is made contiguous (the kernels need unit-stride rows for
    16-byte vector loads); leading axes that do not collapse to one row stride
    are copied by reshape. Anything else (e.g. a column slice) keeps its row stride.
    """
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t.reshape(math.prod(t.shape[:-1]), N)  # not -1: ambiguous when N == 0


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # the interpreter: still several programs, so the partial-sum path is exercised


# ----------------------------------------------------------------------------- launch functions


def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
                 residual: torch.Tensor | None = None, *, block_n: int | None = None,
                 config: dict | None = None):
    """(y, h or None, rstd): y = rms_norm(h) * weight over the last axis, h = x + residual.

    y and h have x's dtype and shape; rstd is fp32 with one value per row (x.shape[:-1]).
    `block_n` (longest one-pass row and loop chunk) and `config` ({"num_warps", "BLOCK_M"})
    override the planner: tests reach the looped kernel with tiny rows, the benchmark
    compares configs.
    """
    N = x.shape[-1]
    x2 = _rows_view(x, N)
    M = x2.shape[0]
    weight = weight.contiguous() if weight is not None else None  # the kernels read it with unit stride
    y = empty((M, N), x.dtype, x.device)
    rstd = empty((M,), torch.float32, x.device)
    h = empty((M, N), x.dtype, x.device) if residual is not None else None
    if M > 0:
        r2 = _rows_view(residual, N) if residual is not None else x2
        plan = {**_plan(M, N, current_arch(x.device), block_n), **(config or {})}
        args = (x2, r2, weight if weight is not None else x2, y, h if h is not None else y, rstd,
                M, N, x2.stride(0), r2.stride(0), y.stride(0), (h if h is not None else y).stride(0), float(eps))
        flags = {"HAS_RESIDUAL": residual is not None, "HAS_WEIGHT": weight is not None}
        if plan["looped"]:
            runner(_rms_norm_fwd_looped_kernel, x.device)[(M,)](
                *args, **flags, BLOCK_N=plan["BLOCK_N"], num_warps=plan["num_warps"])
        else:
            runner(_rms_norm_fwd_rows_kernel, x.device)[(cdiv(M, plan["BLOCK_M"]),)](
                *args, **flags, BLOCK_M=plan["BLOCK_M"], BLOCK_N=plan["BLOCK_N"], num_warps=plan["num_warps"])
    out_h = h.reshape(x.shape) if h is not None else None
    return y.reshape(x.shape), out_h, rstd.reshape(x.shape[:-1])


def rms_norm_bwd(dy: torch.Tensor, h: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                 dh_extra: torch.Tensor | None = None, *, block_n: int | None = None,
                 num_programs: int | None = None):
    """(dx, dweight or None). h is the normalized input (x, or x + residual); dx is also the
    residual's gradient. dh_extra, the gradient flowing into the h output, is added to dx.
    dweight is reduced deterministically (fixed-order partial sums, no atomics)."""
    N = h.shape[-1]
    dy2, h2 = _rows_view(dy, N), _rows_view(h, N)
    weight = weight.contiguous() if weight is not None else None
    M = h2.shape[0]
    dx = empty((M, N), h.dtype, h.device)
    if M == 0:
        dw = torch.zeros_like(weight) if weight is not None else None
        return dx.reshape(h.shape), dw
    extra2 = _rows_view(dh_extra, N) if dh_extra is not None else dy2
    plan = _plan(M, N, current_arch(h.device), block_n, backward=True)
    cfg = pick_config(CONFIGS, current_arch(h.device))
    programs = num_programs or _sm_count(h.device) * cfg["bwd_programs_per_sm"]
    programs = max(1, min(programs, cdiv(M, plan["BLOCK_M"])))
    rows_per_program = cdiv(M, programs)
    programs = cdiv(M, rows_per_program)
    # looped programs add into their partial row, so it must start at zero
    make = torch.zeros if plan["looped"] else torch.empty
    partial = make((programs, N), dtype=torch.float32, device=h.device) if weight is not None else dx
    args = (dy2, h2, weight if weight is not None else h2, rstd.reshape(-1), extra2, dx, partial,
            M, N, dy2.stride(0), h2.stride(0), extra2.stride(0), dx.stride(0), rows_per_program)
    flags = {"HAS_WEIGHT": weight is not None, "HAS_EXTRA": dh_extra is not None}
    if plan["looped"]:
        runner(_rms_norm_bwd_looped_kernel, h.device)[(programs,)](
            *args, **flags, BLOCK_N=plan["BLOCK_N"], num_warps=plan["num_warps"])
    else:
        runner(_rms_norm_bwd_rows_kernel, h.device)[(programs,)](
            *args, **flags, BLOCK_M=plan["BLOCK_M"], BLOCK_N=plan["BLOCK_N"], num_warps=plan["num_warps"])
    dw = None
    if weight is not None:
        dw = torch.empty_like(weight)
        runner(_sum_partials_kernel, h.device)[(cdiv(N, 64),)](
            partial, dw, programs, N, BLOCK_P=32, BLOCK_N=64, num_warps=4)
    return dx.reshape(h.shape), dw


# ----------------------------------------------------------------------------- autograd


class RMSNormFunction(torch.autograd.Function):
    """Differentiable fused (residual add +) RMSNorm: apply(x, weight, residual, eps) returns
    y, or (y, h) when a residual is given; gradients for x, weight and residual."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps):
        ctx.set_materialize_grads(False)  # an unused h output sends None, not a tensor of zeros to read
        y, h, rstd = rms_norm_fwd(x, weight, eps, residual)
        ctx.has_residual = residual is not None
        ctx.save_for_backward(h if h is not None else x, weight, rstd)
        if h is None:
            return y
        return y, h

    @staticmethod
    def backward(ctx, dy, *maybe_dh):
        h, weight, rstd = ctx.saved_tensors
        dh_extra = maybe_dh[0] if maybe_dh else None
        if dy is None:  # only h was used downstream
            dy = torch.zeros_like(h)
        dx, dw = rms_norm_bwd(dy, h, weight, rstd, dh_extra)
        need_w = weight is not None and ctx.needs_input_grad[1]
        dres = dx if ctx.has_residual and ctx.needs_input_grad[2] else None
        return dx, (dw if need_w else None), dres, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
             residual: torch.Tensor | None = None):
    """Differentiable RMSNorm over the last axis: y, or (y, h) with h = x + residual."""
    return RMSNormFunction.apply(x, weight, residual, eps)


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
                       residual: torch.Tensor | None = None):
    """The oracle, in float64: y, or (y, h) with a residual. h is rounded to x's dtype first
    (what the kernel stores and normalizes), then everything is float64."""
    h = x
    if residual is not None:
        h = (x.double() + residual.double()).to(x.dtype)
    h64 = h.double()
    y = h64 * torch.rsqrt(h64.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    return (y, h64) if residual is not None else y


# ----------------------------------------------------------------------------- compile specs


def compile_specs() -> list:
    """Forward (plain and with residual, bf16 and fp16, one-pass and looped) and backward kernels."""
    specs = []
    specs.append(KernelSpec(
        "rms_norm_fwd_rows_fp32_residual_16384", _rms_norm_fwd_rows_kernel, _fwd_signature("fp32"),
        {"HAS_RESIDUAL": True, "HAS_WEIGHT": True, "BLOCK_M": 1, "BLOCK_N": 16384}, num_warps=16))
    for dt in ("bf16", "fp16"):
        for has_res in (False, True):
            sig = _fwd_signature(dt)
            tag = f"{dt}{'_residual' if has_res else ''}"
            specs.append(KernelSpec(
                f"rms_norm_fwd_rows_{tag}_4096", _rms_norm_fwd_rows_kernel, sig,
                {"HAS_RESIDUAL": has_res, "HAS_WEIGHT": True, "BLOCK_M": 1, "BLOCK_N": 4096}, num_warps=8))
        specs.append(KernelSpec(
            f"rms_norm_fwd_looped_{dt}_residual", _rms_norm_fwd_looped_kernel, _fwd_signature(dt, rows=False),
            {"HAS_RESIDUAL": True, "HAS_WEIGHT": True, "BLOCK_N": 4096}, num_warps=8))
    specs.append(KernelSpec(
        "rms_norm_fwd_rows_bf16_short_rows", _rms_norm_fwd_rows_kernel, _fwd_signature("bf16"),
        {"HAS_RESIDUAL": False, "HAS_WEIGHT": True, "BLOCK_M": 16, "BLOCK_N": 256}, num_warps=8))
    specs.append(KernelSpec(
        "rms_norm_bwd_rows_bf16_4096", _rms_norm_bwd_rows_kernel, _bwd_signature("bf16", rows=True),
        {"HAS_WEIGHT": True, "HAS_EXTRA": True, "BLOCK_M": 1, "BLOCK_N": 4096}, num_warps=16))
    specs.append(KernelSpec(
        "rms_norm_bwd_rows_fp32_4096", _rms_norm_bwd_rows_kernel, _bwd_signature("fp32", rows=True),
        {"HAS_WEIGHT": True, "HAS_EXTRA": True, "BLOCK_M": 1, "BLOCK_N": 4096}, num_warps=16))
    specs.append(KernelSpec(
        "rms_norm_bwd_looped_bf16", _rms_norm_bwd_looped_kernel, _bwd_signature("bf16", rows=False),
        {"HAS_WEIGHT": True, "HAS_EXTRA": False, "BLOCK_N": 4096}, num_warps=8))
    specs.append(KernelSpec(
        "rms_norm_dweight_sum", _sum_partials_kernel,
        {"part_ptr": "*fp32", "out_ptr": "*bf16", "P": "i32", "N": "i32", "BLOCK_P": "constexpr", "BLOCK_N": "constexpr"},
        {"BLOCK_P": 32, "BLOCK_N": 64}, num_warps=4))
    return specs


def _fwd_signature(dt: str, rows: bool = True) -> dict:
    sig = {"x_ptr": f"*{dt}", "res_ptr": f"*{dt}", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "h_ptr": f"*{dt}",
           "rstd_ptr": "*fp32", "M": "i32", "N": "i32", "x_stride": "i32", "res_stride": "i32",
           "y_stride": "i32", "h_stride": "i32", "eps": "fp32", "HAS_RESIDUAL": "constexpr",
           "HAS_WEIGHT": "constexpr"}
    if rows:
        sig["BLOCK_M"] = "constexpr"
    sig["BLOCK_N"] = "constexpr"
    return sig


def _bwd_signature(dt: str, rows: bool) -> dict:
    sig = {"dy_ptr": f"*{dt}", "h_ptr": f"*{dt}", "w_ptr": f"*{dt}", "rstd_ptr": "*fp32", "dhx_ptr": f"*{dt}",
           "dx_ptr": f"*{dt}", "dw_part_ptr": "*fp32", "M": "i32", "N": "i32", "dy_stride": "i32",
           "h_stride": "i32", "dhx_stride": "i32", "dx_stride": "i32", "rows_per_program": "i32",
           "HAS_WEIGHT": "constexpr", "HAS_EXTRA": "constexpr"}
    if rows:
        sig["BLOCK_M"] = "constexpr"
    sig["BLOCK_N"] = "constexpr"
    return sig
