"""softmax and log_softmax over the last axis as hand-written Triton kernels.

All math is fp32; the output has the input's dtype.

Three shapes of forward kernel, by row length:
- a row fits in one block: one read and one write per element, several short
  rows to a program;
- a long row per program (many rows): an online pass that keeps a running max
  and a rescaled running sum per lane (one read), then a write pass that
  re-reads the row (mostly from L2, the row was just read);
- few long rows (e.g. 64 x 1M, fewer rows than the GPU has programs in
  flight): each row is cut into segments so every SM works. A first kernel
  writes each segment's (max, sum); a second combines the segments of its row
  and writes the segment. It runs its programs in reverse order, so the first
  segments it re-reads are the ones the first kernel read last (still in L2).

Backward: softmax dx = y * (dy - sum(dy * y)); log_softmax dx = dy - exp(y) * sum(dy).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flyarray.kernels._triton import cdiv, current_arch, empty, next_pow2, pick_config, runner
from flyarray.targets import KernelSpec

# tile_elems / elems_per_thread / warp_size: as in rms_norm (num_warps = tile / (elems_per_thread * warp_size)).
# max_single_block: longest row done in one block; chunk / looped_warps: the looped kernels' step.
# programs_per_sm: below M = programs_per_sm * SMs rows, long rows are split into segments.
CONFIGS = {
    "sm_90": {  # 8192 bf16 per row -> 16 warps x 16 elements: two 16-byte loads per thread
        "warp_size": 32, "tile_elems": 4096, "elems_per_thread": 16, "max_rows": 64,
        "max_single_block": 16384, "chunk": 4096, "looped_warps": 8, "programs_per_sm": 4,
        "segment_elems": 32768,
    },
    "gfx950": {  # wave64: the same tile needs half as many waves
        "warp_size": 64, "tile_elems": 4096, "elems_per_thread": 16, "max_rows": 64,
        "max_single_block": 16384, "chunk": 4096, "looped_warps": 8, "programs_per_sm": 4,
        "segment_elems": 32768,
    },
    "default": {
        "warp_size": 32, "tile_elems": 4096, "elems_per_thread": 16, "max_rows": 64,
        "max_single_block": 16384, "chunk": 4096, "looped_warps": 8, "programs_per_sm": 4,
        "segment_elems": 32768,
    },
}

# Reductions are written tl.reduce(x, axis, tl.standard._sum_combine / _elementwise_max)
# rather than tl.sum / tl.max: those are @jit functions themselves, which a kernel run by
# `runner`'s interpreter cannot call, while the interpreter reduces with numpy when it
# sees exactly these combine functions (named by attribute, so runner leaves them as they
# are). The compiled code is the same as tl.sum's / tl.max's on floats.

_NEG_INF = tl.constexpr(float("-inf"))  # a jit function may only read constexpr globals


# ----------------------------------------------------------------------------- forward kernels


@triton.jit
def _softmax_rows_kernel(x_ptr, y_ptr, M, N, x_stride, y_stride,
                         LOG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """BLOCK_M whole rows per program: one read, one write."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = (cols < N)[None, :]
    # rows past M re-read row M-1 (never stored) so they hold no NaN or 0/0
    rows64 = tl.minimum(rows, M - 1).to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * x_stride + cols[None, :], mask=col_ok, other=_NEG_INF,
                eviction_policy="evict_first").to(tl.float32)
    m = tl.reduce(x, 1, tl.standard._elementwise_max)
    m = tl.where(m == _NEG_INF, 0.0, m)  # an all -inf row: exp gives 0, 0/0 gives NaN as torch does
    e = tl.exp(x - m[:, None])
    s = tl.reduce(e, 1, tl.standard._sum_combine)
    if LOG:   # (x - m) - log(s): m + log(s) would round log(s) away at a large row max (1e7: -log(4) -> 0)
        y = (x - m[:, None]) - tl.log(s)[:, None]
    else:
        y = e * (1.0 / s)[:, None]
    mask = (rows < M)[:, None] & col_ok
    tl.store(y_ptr + rows64 * y_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _combine_stats(m, s):
    """Row (max, sum of exp(x - max)) from per-lane or per-segment running pairs."""
    m_row = tl.reduce(m, 0, tl.standard._elementwise_max)
    m_row = tl.where(m_row == _NEG_INF, 0.0, m_row)  # an all -inf row: keep NaN out of the rescale
    s_row = tl.reduce(s * tl.exp(m - m_row), 0, tl.standard._sum_combine)
    return m_row, s_row


@triton.jit
def _write_normalized(x_row, y_row, begin, end, m_row, s_row, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """The write pass over columns [begin, end) of one row, given its (max, sum)."""
    inv_s = 1.0 / s_row
    log_s = tl.log(s_row)
    # last chunk first: the most recently read chunks are the likeliest still in L2
    num_chunks = (end - begin + BLOCK_N - 1) // BLOCK_N
    for i in range(0, num_chunks):
        start = begin + (num_chunks - 1 - i) * BLOCK_N
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < end
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        if LOG:   # (x - m) - log(s), as _softmax_rows_kernel
            y = (x - m_row) - log_s
        else:
            y = tl.exp(x - m_row) * inv_s
        tl.store(y_row + cols, y.to(y_row.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_online_kernel(x_ptr, y_ptr, m_part_ptr, s_part_ptr, N, x_stride, y_stride, seg_len, num_seg,
                           LOG: tl.constexpr, WRITE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program pid covers segment pid % num_seg of row pid // num_seg.

    One read pass keeps, per lane, a running max m and a sum s rescaled whenever m
    grows. WRITE (one segment per row): a second pass writes the output. Otherwise
    the segment's (max, sum) go to the partial buffers for _softmax_segment_write_kernel.
    """
    pid = tl.program_id(0)
    row = (pid // num_seg).to(tl.int64)
    begin = (pid % num_seg) * seg_len
    end = tl.minimum(begin + seg_len, N)
    x_row = x_ptr + row * x_stride
    m = tl.full([BLOCK_N], _NEG_INF, tl.float32)
    s = tl.full([BLOCK_N], 0.0, tl.float32)
    for start in range(begin, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        # evict_last: the write pass re-reads this chunk
        x = tl.load(x_row + cols, mask=cols < end, other=_NEG_INF, eviction_policy="evict_last").to(tl.float32)
        m_new = tl.maximum(m, x)
        m_ref = tl.where(m_new == _NEG_INF, 0.0, m_new)  # lanes that saw only -inf keep s = 0, not NaN
        s = s * tl.exp(m - m_ref) + tl.exp(x - m_ref)
        m = m_new
    m_row, s_row = _combine_stats(m, s)
    if WRITE:
        _write_normalized(x_row, y_ptr + row * y_stride, begin, end, m_row, s_row, LOG, BLOCK_N)
    else:
        tl.store(m_part_ptr + pid, m_row)
        tl.store(s_part_ptr + pid, s_row)


@triton.jit
def _softmax_segment_write_kernel(x_ptr, y_ptr, m_part_ptr, s_part_ptr, N, x_stride, y_stride,
                                  seg_len, num_seg, num_programs,
                                  LOG: tl.constexpr, SEG_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr):
    """Combine the (max, sum) of every segment of the row, then write this program's segment."""
    pid = num_programs - 1 - tl.program_id(0)  # reverse order: re-read what is still in L2 first
    row = pid // num_seg
    segs = tl.arange(0, SEG_BLOCK)
    seg_ok = segs < num_seg
    m_seg = tl.load(m_part_ptr + row * num_seg + segs, mask=seg_ok, other=_NEG_INF)
    s_seg = tl.load(s_part_ptr + row * num_seg + segs, mask=seg_ok, other=0.0)
    m_row, s_row = _combine_stats(m_seg, s_seg)
    begin = (pid % num_seg) * seg_len
    end = tl.minimum(begin + seg_len, N)
    _write_normalized(x_ptr + row.to(tl.int64) * x_stride, y_ptr + row.to(tl.int64) * y_stride,
                      begin, end, m_row, s_row, LOG, BLOCK_N)


# ----------------------------------------------------------------------------- backward kernels


@triton.jit
def _softmax_bwd_rows_kernel(dy_ptr, y_ptr, dx_ptr, M, N, dy_stride, y_stride, dx_stride,
                             LOG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    dy = tl.load(dy_ptr + rows64 * dy_stride + cols[None, :], mask=mask, other=0.0,
                 eviction_policy="evict_first").to(tl.float32)
    y = tl.load(y_ptr + rows64 * y_stride + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    if LOG:
        dx = dy - tl.exp(y) * tl.reduce(dy, 1, tl.standard._sum_combine)[:, None]
    else:
        dx = y * (dy - tl.reduce(dy * y, 1, tl.standard._sum_combine)[:, None])
    tl.store(dx_ptr + rows64 * dx_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_looped_kernel(dy_ptr, y_ptr, dx_ptr, M, N, dy_stride, y_stride, dx_stride,
                               LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    """One long row per program: pass 1 reduces, pass 2 writes dx."""
    row = tl.program_id(0).to(tl.int64)
    acc = tl.full([BLOCK_N], 0.0, tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        dy = tl.load(dy_ptr + row * dy_stride + cols, mask=mask, other=0.0,
                     eviction_policy="evict_last").to(tl.float32)
        if LOG:
            acc += dy
        else:
            acc += dy * tl.load(y_ptr + row * y_stride + cols, mask=mask, other=0.0,
                                eviction_policy="evict_last").to(tl.float32)
    c = tl.reduce(acc, 0, tl.standard._sum_combine)
    # last chunk first: the most recently read chunks are the likeliest still in L2
    num_chunks = (N + BLOCK_N - 1) // BLOCK_N
    for i in range(0, num_chunks):
        start = (num_chunks - 1 - i) * BLOCK_N
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        dy = tl.load(dy_ptr + row * dy_stride + cols, mask=mask, other=0.0,
                     eviction_policy="evict_first").to(tl.float32)
        y = tl.load(y_ptr + row * y_stride + cols, mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        if LOG:
            dx = dy - tl.exp(y) * c
        else:
            dx = y * (dy - c)
        tl.store(dx_ptr + row * dx_stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- planning


def _warps_for(tile_elems: int, cfg: dict) -> int:
    warps = tile_elems // (cfg["elems_per_thread"] * cfg["warp_size"])
    return max(1, min(16, next_pow2(warps)))


def _plan(M: int, N: int, arch: str, block_n: int | None) -> dict:
    """Block shape and warps. `block_n` forces the longest one-block row (and the loop
    chunk), so tests reach the looped kernels with tiny rows."""
    cfg = pick_config(CONFIGS, arch)
    max_single = block_n or cfg["max_single_block"]
    if N <= max_single:
        block = next_pow2(N)
        rows = max(1, min(cfg["tile_elems"] // block, cfg["max_rows"], next_pow2(M)))
        return {"looped": False, "BLOCK_M": rows, "BLOCK_N": block, "num_warps": _warps_for(rows * block, cfg)}
    chunk = next_pow2(block_n or cfg["chunk"])
    return {"looped": True, "BLOCK_M": 1, "BLOCK_N": chunk, "num_warps": cfg["looped_warps"]}


def _segments(M: int, N: int, chunk: int, arch: str, device: torch.device, num_segments: int | None):
    """(num_seg, seg_len): one segment per row when there are rows enough to fill the GPU,
    else segments of about `segment_elems`; each segment a whole number of chunks."""
    if num_segments is None:
        cfg = pick_config(CONFIGS, arch)
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2
        few_rows = M < cfg["programs_per_sm"] * sms
        num_segments = cdiv(N, max(chunk, cfg["segment_elems"])) if few_rows else 1
    num_segments = max(1, min(num_segments, cdiv(N, chunk)))
    seg_len = cdiv(cdiv(N, num_segments), chunk) * chunk
    return cdiv(N, seg_len), seg_len


def _last_axis_rows(x: torch.Tensor, axis: int):
    """(rows, restore): x with `axis` moved last as an (M, N) matrix with unit column stride,
    and a function that puts an (M, N) result back in x's layout.

    Moving another axis last costs a permute + contiguous copy (the kernels need unit-stride
    rows for vector loads); the result is returned as a permuted view of a contiguous buffer.
    A strided last axis is also made contiguous; leading axes that do not collapse to one row
    stride are copied by reshape; a row stride alone (e.g. a column slice) is kept.
    """
    axis = axis % x.ndim if x.ndim else 0
    moved = x.movedim(axis, -1) if x.ndim else x.reshape(1)
    if moved.stride(-1) != 1:
        moved = moved.contiguous()
    N = moved.shape[-1]
    shape = moved.shape

    def restore(out2: torch.Tensor) -> torch.Tensor:
        out = out2.reshape(shape)
        return out.movedim(-1, axis) if x.ndim else out.reshape(())
    return moved.reshape(math.prod(shape[:-1]), N), restore  # not -1: ambiguous when N == 0


# ----------------------------------------------------------------------------- launch functions


def softmax(x: torch.Tensor, axis: int = -1, log: bool = False, *, block_n: int | None = None,
            num_segments: int | None = None, config: dict | None = None) -> torch.Tensor:
    """softmax (or log_softmax with log=True) of x along `axis`, in x's dtype, fp32 inside.

    `block_n` (longest one-block row and loop chunk), `num_segments` and `config`
    ({"num_warps", "BLOCK_M"}) override the planner: tests use them to reach the looped
    and segmented kernels with tiny rows, the benchmark to compare configs."""
    x2, restore = _last_axis_rows(x, axis)
    M, N = x2.shape
    y = empty((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return restore(y)
    arch = current_arch(x.device)
    plan = {**_plan(M, N, arch, block_n), **(config or {})}
    if not plan["looped"]:
        runner(_softmax_rows_kernel, x.device)[(cdiv(M, plan["BLOCK_M"]),)](
            x2, y, M, N, x2.stride(0), y.stride(0),
            LOG=log, BLOCK_M=plan["BLOCK_M"], BLOCK_N=plan["BLOCK_N"], num_warps=plan["num_warps"])
        return restore(y)
    num_seg, seg_len = _segments(M, N, plan["BLOCK_N"], arch, x.device, num_segments)
    total = M * num_seg
    m_part = empty((total,), torch.float32, x.device)
    s_part = empty((total,), torch.float32, x.device)
    runner(_softmax_online_kernel, x.device)[(total,)](
        x2, y, m_part, s_part, N, x2.stride(0), y.stride(0), seg_len, num_seg,
        LOG=log, WRITE=num_seg == 1, BLOCK_N=plan["BLOCK_N"], num_warps=plan["num_warps"])
    if num_seg > 1:
        runner(_softmax_segment_write_kernel, x.device)[(total,)](
            x2, y, m_part, s_part, N, x2.stride(0), y.stride(0), seg_len, num_seg, total,
            LOG=log, SEG_BLOCK=next_pow2(num_seg), BLOCK_N=plan["BLOCK_N"], num_warps=plan["num_warps"])
    return restore(y)


def softmax_bwd(dy: torch.Tensor, y: torch.Tensor, log: bool = False, axis: int = -1, *,
                block_n: int | None = None) -> torch.Tensor:
    """The gradient of softmax (log=False) or log_softmax (log=True) w.r.t. its input, given
    the forward output y and the output gradient dy; in y's dtype."""
    y2, restore = _last_axis_rows(y, axis)
    dy2, _ = _last_axis_rows(dy, axis)
    M, N = y2.shape
    dx = empty((M, N), y.dtype, y.device)
    if M == 0 or N == 0:
        return restore(dx)
    plan = _plan(M, N, current_arch(y.device), block_n)
    args = (dy2, y2, dx, M, N, dy2.stride(0), y2.stride(0), dx.stride(0))
    if plan["looped"]:
        runner(_softmax_bwd_looped_kernel, y.device)[(M,)](
            *args, LOG=log, BLOCK_N=plan["BLOCK_N"], num_warps=plan["num_warps"])
    else:
        runner(_softmax_bwd_rows_kernel, y.device)[(cdiv(M, plan["BLOCK_M"]),)](
            *args, LOG=log, BLOCK_M=plan["BLOCK_M"], BLOCK_N=plan["BLOCK_N"], num_warps=plan["num_warps"])
    return restore(dx)


class SoftmaxFunction(torch.autograd.Function):
    """Differentiable softmax / log_softmax: SoftmaxFunction.apply(x, axis, log)."""

    @staticmethod
    def forward(ctx, x, axis=-1, log=False):
        y = softmax(x, axis, log)
        ctx.save_for_backward(y)
        ctx.axis, ctx.log = axis, log
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_bwd(dy, y, ctx.log, ctx.axis), None, None


def reference_softmax(x: torch.Tensor, axis: int = -1, log: bool = False) -> torch.Tensor:
    """The oracle: softmax / log_softmax in float64."""
    x64 = x.double()
    return torch.log_softmax(x64, dim=axis) if log else torch.softmax(x64, dim=axis)


# ----------------------------------------------------------------------------- compile specs


def compile_specs() -> list:
    """One-block (bf16/fp16, softmax and log), online/segmented long-row, and backward kernels."""
    specs = []
    for dt in ("bf16", "fp16"):
        for log in (False, True):
            specs.append(KernelSpec(
                f"softmax_rows_{dt}{'_log' if log else ''}_8192", _softmax_rows_kernel, _rows_signature(dt),
                {"LOG": log, "BLOCK_M": 1, "BLOCK_N": 8192}, num_warps=16))
    specs.append(KernelSpec(
        "softmax_rows_fp32_log_16384", _softmax_rows_kernel, _rows_signature("fp32"),
        {"LOG": True, "BLOCK_M": 1, "BLOCK_N": 16384}, num_warps=16))
    specs.append(KernelSpec(
        "softmax_rows_fp32_short_rows", _softmax_rows_kernel, _rows_signature("fp32"),
        {"LOG": False, "BLOCK_M": 16, "BLOCK_N": 256}, num_warps=8))
    for write in (True, False):
        specs.append(KernelSpec(
            f"softmax_online_fp32_{'fused' if write else 'stats'}", _softmax_online_kernel,
            {"x_ptr": "*fp32", "y_ptr": "*fp32", "m_part_ptr": "*fp32", "s_part_ptr": "*fp32", "N": "i32",
             "x_stride": "i32", "y_stride": "i32", "seg_len": "i32", "num_seg": "i32",
             "LOG": "constexpr", "WRITE": "constexpr", "BLOCK_N": "constexpr"},
            {"LOG": False, "WRITE": write, "BLOCK_N": 4096}, num_warps=8))
    specs.append(KernelSpec(
        "softmax_segment_write_fp32", _softmax_segment_write_kernel,
        {"x_ptr": "*fp32", "y_ptr": "*fp32", "m_part_ptr": "*fp32", "s_part_ptr": "*fp32", "N": "i32",
         "x_stride": "i32", "y_stride": "i32", "seg_len": "i32", "num_seg": "i32", "num_programs": "i32",
         "LOG": "constexpr", "SEG_BLOCK": "constexpr", "BLOCK_N": "constexpr"},
        {"LOG": False, "SEG_BLOCK": 16, "BLOCK_N": 4096}, num_warps=8))
    bwd_sig = {"dy_ptr": "*bf16", "y_ptr": "*bf16", "dx_ptr": "*bf16", "M": "i32", "N": "i32",
               "dy_stride": "i32", "y_stride": "i32", "dx_stride": "i32", "LOG": "constexpr"}
    for log in (False, True):
        specs.append(KernelSpec(
            f"softmax_bwd_rows_bf16{'_log' if log else ''}_8192", _softmax_bwd_rows_kernel,
            {**bwd_sig, "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"},
            {"LOG": log, "BLOCK_M": 1, "BLOCK_N": 8192}, num_warps=16))
    specs.append(KernelSpec(
        "softmax_bwd_looped_bf16", _softmax_bwd_looped_kernel, {**bwd_sig, "BLOCK_N": "constexpr"},
        {"LOG": False, "BLOCK_N": 4096}, num_warps=8))
    return specs


def _rows_signature(dt: str) -> dict:
    return {"x_ptr": f"*{dt}", "y_ptr": f"*{dt}", "M": "i32", "N": "i32", "x_stride": "i32", "y_stride": "i32",
            "LOG": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}
