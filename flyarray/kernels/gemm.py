"""Dense GEMM with a fused epilogue: ``act(a @ b * scales + bias) + residual``.

One persistent Triton kernel serves every dtype (fp32, fp16, bf16, fp8 e4m3fn /
e5m2), any strides and broadcast batch dims. Design choices, and why:

* Persistent schedule: ``min(tiles, programs that fit)`` programs walk the tile
  list with a stride, so no tail wave of tiny launches, and tiles are visited in
  super-grouped order (``GROUP_M`` row-tiles share a column of ``b``) so that
  operands are re-read from L2, not HBM.
* Any strides: each operand passes both of its strides, so a transposed view
  (``w.t()``) is read in place; Triton specializes strides equal to 1, so the
  contiguous case still vectorizes.
* Batch dims are broadcast by stride 0 and collapsed on the host: a batch dim
  that only ``a`` has and that is contiguous with M is folded into M (a
  ``[B, S, H] @ [H, N]`` linear layer is one 2-D GEMM). Up to two batch dims go
  to the kernel; more are looped over on the host.
* On sm_90, when strides allow it (16-byte aligned bases and strides, unit last
  stride of a tile), operands are loaded through TMA tensor descriptors built on
  the device (``tl.make_tensor_descriptor``, needs ``triton.set_allocator``);
  elsewhere, and on Triton versions without descriptors, plain pointer loads.
* Memory-bound decode shapes (M <= 64) use a small BLOCK_M, wide K tiles and
  optionally split-K: partial sums go to an fp32 workspace and a second small
  kernel adds them and runs the epilogue.
* The epilogue runs in fp32 (fp64 for float64 operands) in a fixed order: ``acc * a_scale * b_scale`` ->
  ``+ bias`` -> activation -> ``+ residual`` -> cast. The graph scheduler
  pattern-matches exactly this vocabulary into one call.

1-D operands (vector-matrix products) are the caller's business: unsqueeze
them to 2-D first, as ``torch.matmul`` does internally.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from flyarray.kernels._triton import (HAS_TENSOR_DESCRIPTORS, FixedLaunch, aligned16, cdiv, current_arch, empty,
                                     ensure_tma_allocator, is_warming_up, launch_cache, next_pow2, runner)
from flyarray import config
from flyarray.targets import KernelSpec

ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Scale modes (constexpr): no scale, one scalar, one value per row (a) / column (b).
SCALE_NONE, SCALE_TENSOR, SCALE_VECTOR = 0, 1, 2


# --------------------------------------------------------------------------- kernels

@triton.jit
def _activate(x, ACTIVATION: tl.constexpr):
    """Activation in fp32; tanh is written with exp so it exists on every backend."""
    if ACTIVATION == 1:   # torch.relu's: NaN stays NaN (tl.maximum drops it) and -0.0 stays -0.0
        x = tl.where(x < 0.0, 0.0, x)
    elif ACTIVATION == 2:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == 3:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
        x = 0.5 * x * (1.0 + tanh)
    elif ACTIVATION == 4:
        x = x / (1.0 + tl.exp(-x))
    return x


@triton.jit
def _batch_offset(batch, B1, stride0, stride1):
    """Element offset (int64) of flat batch index ``batch`` in a [B0, B1, ...] view."""
    b0 = (batch // B1).to(tl.int64)
    b1 = (batch % B1).to(tl.int64)
    return b0 * stride0 + b1 * stride1


@triton.jit
def _epilogue_store(acc, offs_m, offs_n, M, N, c_ptr, s_cm, s_cn,
                    bias_ptr, s_biasm, s_biasn, res_ptr, s_rm, s_rn,
                    a_scale_ptr, b_scale_ptr,
                    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                    ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr, INDEX_64: tl.constexpr,
                    c_desc=None, row0=0, col0=0, EPI_TMA: tl.constexpr = False, r_desc=None,
                    RES_TMA: tl.constexpr = False):
    """acc * scales -> + bias -> activation -> + residual -> cast, stored under the bounds mask.

    ``c_ptr``/``bias_ptr``/``res_ptr`` already point at this tile's batch.
    Offsets are int32 unless INDEX_64 (a matrix spans >= 2**31 elements):
    int64 offset tiles double the registers the epilogue needs.
    EPI_TMA: the result goes out through ``c_desc`` at (row0, col0) (an asynchronous bulk store that
    clips at the edges) instead of pointer stores from the MMA layout. RES_TMA: the residual comes in
    through ``r_desc`` the same way (a bulk load, zero past the edges): a pointer tile in the MMA layout
    holds a 64-bit address per element, which pushed 128x256 tiles with a residual into spills.
    """
    mask_m = offs_m < M
    mask_n = offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]
    if A_SCALE == 1:
        acc = acc * tl.load(a_scale_ptr).to(acc.dtype)
    elif A_SCALE == 2:
        acc = acc * tl.load(a_scale_ptr + offs_m, mask=mask_m, other=0.0).to(acc.dtype)[:, None]
    if B_SCALE == 1:
        acc = acc * tl.load(b_scale_ptr).to(acc.dtype)
    elif B_SCALE == 2:
        acc = acc * tl.load(b_scale_ptr + offs_n, mask=mask_n, other=0.0).to(acc.dtype)[None, :]
    rows = offs_m[:, None]
    cols = offs_n[None, :]
    if INDEX_64:
        rows = rows.to(tl.int64)
        cols = cols.to(tl.int64)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows * s_biasm + cols * s_biasn, mask=mask, other=0.0).to(acc.dtype)
    acc = _activate(acc, ACTIVATION)
    if HAS_RESIDUAL:
        if RES_TMA:
            acc += r_desc.load([row0, col0]).to(acc.dtype)
        else:
            acc += tl.load(res_ptr + rows * s_rm + cols * s_rn, mask=mask, other=0.0).to(acc.dtype)
    if EPI_TMA:
        c_desc.store([row0, col0], acc.to(c_desc.dtype))
    else:
        tl.store(c_ptr + rows * s_cm + cols * s_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _epilogue_cols(acc, offs_m, col0, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_biasm, s_biasn,
                   res_ptr, s_rm, s_rn, a_scale_ptr, b_scale_ptr, WIDTH: tl.constexpr, HALVES: tl.constexpr,
                   A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                   ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr, INDEX_64: tl.constexpr,
                   c_desc, row0, EPI_TMA: tl.constexpr, r_desc, RES_TMA: tl.constexpr):
    """The epilogue on columns [col0, col0 + WIDTH) of a tile, as one piece or
    (HALVES) as its two column halves one after the other."""
    if HALVES:
        HALF: tl.constexpr = WIDTH // 2
        lo, hi = tl.split(tl.permute(tl.reshape(acc, (acc.shape[0], 2, HALF)), (0, 2, 1)))
        _epilogue_store(lo, offs_m, col0 + tl.arange(0, HALF), M, N, c_ptr, s_cm, s_cn, bias_ptr, s_biasm,
                        s_biasn, res_ptr, s_rm, s_rn, a_scale_ptr, b_scale_ptr, A_SCALE, B_SCALE,
                        HAS_BIAS, ACTIVATION, HAS_RESIDUAL, INDEX_64, c_desc, row0, col0, EPI_TMA, r_desc,
                        RES_TMA)
        _epilogue_store(hi, offs_m, col0 + HALF + tl.arange(0, HALF), M, N, c_ptr, s_cm, s_cn, bias_ptr,
                        s_biasm, s_biasn, res_ptr, s_rm, s_rn, a_scale_ptr, b_scale_ptr, A_SCALE,
                        B_SCALE, HAS_BIAS, ACTIVATION, HAS_RESIDUAL, INDEX_64, c_desc, row0, col0 + HALF,
                        EPI_TMA, r_desc, RES_TMA)
    else:
        _epilogue_store(acc, offs_m, col0 + tl.arange(0, WIDTH), M, N, c_ptr, s_cm, s_cn, bias_ptr, s_biasm,
                        s_biasn, res_ptr, s_rm, s_rn, a_scale_ptr, b_scale_ptr, A_SCALE, B_SCALE,
                        HAS_BIAS, ACTIVATION, HAS_RESIDUAL, INDEX_64, c_desc, row0, col0, EPI_TMA, r_desc,
                        RES_TMA)


@triton.jit
def _epilogue(acc, offs_m, pid_n, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_biasm, s_biasn,
              res_ptr, s_rm, s_rn, a_scale_ptr, b_scale_ptr,
              BLOCK_N: tl.constexpr, EPI_SPLIT: tl.constexpr,
              A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
              ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr, INDEX_64: tl.constexpr,
              c_desc, row0, EPI_TMA: tl.constexpr, r_desc, RES_TMA: tl.constexpr):
    """The epilogue on a full tile, or on EPI_SPLIT (2 or 4) column chunks one
    after the other: the pointer and operand tiles of only one chunk live at
    once (they sit in the MMA layout, one 64-bit pointer per element), so a
    large fp32 accumulator does not push the epilogue into spills."""
    col0 = pid_n * BLOCK_N
    if EPI_SPLIT == 1:
        _epilogue_cols(acc, offs_m, col0, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_biasm, s_biasn, res_ptr,
                       s_rm, s_rn, a_scale_ptr, b_scale_ptr, BLOCK_N, False, A_SCALE, B_SCALE, HAS_BIAS,
                       ACTIVATION, HAS_RESIDUAL, INDEX_64, c_desc, row0, EPI_TMA, r_desc, RES_TMA)
    else:
        HALF: tl.constexpr = BLOCK_N // 2
        lo, hi = tl.split(tl.permute(tl.reshape(acc, (acc.shape[0], 2, HALF)), (0, 2, 1)))
        _epilogue_cols(lo, offs_m, col0, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_biasm, s_biasn, res_ptr,
                       s_rm, s_rn, a_scale_ptr, b_scale_ptr, HALF, EPI_SPLIT == 4, A_SCALE, B_SCALE,
                       HAS_BIAS, ACTIVATION, HAS_RESIDUAL, INDEX_64, c_desc, row0, EPI_TMA, r_desc, RES_TMA)
        _epilogue_cols(hi, offs_m, col0 + HALF, M, N, c_ptr, s_cm, s_cn, bias_ptr, s_biasm, s_biasn,
                       res_ptr, s_rm, s_rn, a_scale_ptr, b_scale_ptr, HALF, EPI_SPLIT == 4, A_SCALE,
                       B_SCALE, HAS_BIAS, ACTIVATION, HAS_RESIDUAL, INDEX_64, c_desc, row0, EPI_TMA, r_desc, RES_TMA)


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Super-grouped order: GROUP_M row-tiles walk a column of b together (L2 reuse)."""
    in_group = GROUP_M * num_pid_n
    group = tile // in_group
    first_m = group * GROUP_M
    rows_here = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % rows_here
    pid_n = (tile % in_group) // rows_here
    return pid_m, pid_n


@triton.jit
def _gemm_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, res_ptr, a_scale_ptr, b_scale_ptr, ws_ptr,
    M, N, K, B1, BATCH,
    s_a0, s_a1, s_am, s_ak,
    s_b0, s_b1, s_bk, s_bn,
    s_c0, s_c1, s_cm, s_cn,
    s_bias0, s_bias1, s_biasm, s_biasn,
    s_r0, s_r1, s_rm, s_rn,
    NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
    EVEN_K: tl.constexpr, INDEX_64: tl.constexpr, EPI_SPLIT: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr, A_KMAJOR: tl.constexpr,
    B_KMAJOR: tl.constexpr, ACC_FP64: tl.constexpr = False, EPI_TMA: tl.constexpr = False,
    FLATTEN: tl.constexpr = False, RES_TMA: tl.constexpr = False,
):
    """Persistent GEMM. With SPLIT_K > 1 it writes fp32 partials to ``ws_ptr``
    ([SPLIT_K, BATCH, M, N], contiguous) and ``_splitk_reduce_kernel`` finishes.

    USE_TMA (sm_90, BATCH == 1): A_KMAJOR/B_KMAJOR say which stride of a/b is 1
    (True: the K stride), so the descriptor is built on the contiguous axis. With it, EPI_TMA stores
    the result through a descriptor too (c contiguous along N); FLATTEN pipelines the next tile's loads
    under this tile's epilogue (tl.range's flatten). (tl.range's warp_specialize does not compile here:
    Triton 3.6's Hopper pass stops at "unsupported op type" on this loop.)
    """
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_batch = num_pid_m * num_pid_n
    total = tiles_per_batch * BATCH * SPLIT_K
    k_tiles_all = tl.cdiv(K, BLOCK_K)
    k_tiles_split = tl.cdiv(k_tiles_all, SPLIT_K)

    if USE_TMA:
        if A_KMAJOR:
            a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[s_am, 1],
                                               block_shape=[BLOCK_M, BLOCK_K])
        else:
            a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[s_ak, 1],
                                               block_shape=[BLOCK_K, BLOCK_M])
        if B_KMAJOR:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[s_bn, 1],
                                               block_shape=[BLOCK_N, BLOCK_K])
        else:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[s_bk, 1],
                                               block_shape=[BLOCK_K, BLOCK_N])
    if EPI_TMA:  # (set only with USE_TMA)
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[s_cm, 1],
                                           block_shape=[BLOCK_M, BLOCK_N // EPI_SPLIT])
    else:
        c_desc = c_ptr  # unused: the pointer stores
    if RES_TMA:  # (set only with EPI_TMA)
        r_desc = tl.make_tensor_descriptor(res_ptr, shape=[M, N], strides=[s_rm, 1],
                                           block_shape=[BLOCK_M, BLOCK_N // EPI_SPLIT])
    else:
        r_desc = res_ptr  # unused: the pointer loads

    for work in tl.range(pid, total, NUM_PROGRAMS, flatten=FLATTEN):
        split = work % SPLIT_K
        tile_flat = work // SPLIT_K
        batch = tile_flat // tiles_per_batch
        pid_m, pid_n = _tile_coords(tile_flat % tiles_per_batch, num_pid_m, num_pid_n, GROUP_M)
        kt_begin = split * k_tiles_split
        kt_end = tl.minimum(kt_begin + k_tiles_split, k_tiles_all)

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        if ACC_FP64:  # float64 operands accumulate (and run the epilogue) in float64
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if USE_TMA:
            for kt in tl.range(kt_begin, kt_end):
                k0 = kt * BLOCK_K
                if A_KMAJOR:
                    a = a_desc.load([pid_m * BLOCK_M, k0])
                else:
                    a = a_desc.load([k0, pid_m * BLOCK_M]).T
                if B_KMAJOR:
                    b = b_desc.load([pid_n * BLOCK_N, k0]).T
                else:
                    b = b_desc.load([k0, pid_n * BLOCK_N])
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION, out_dtype=acc.dtype)
        else:
            # Rows/columns past a ragged edge wrap around (modulo) instead of
            # being masked, so loads stay unmasked; the store mask drops the
            # wrapped results. On even edges the plain arange keeps the
            # contiguity Triton needs for vector (and async) loads.
            rows_a = offs_m if EVEN_M else offs_m % M
            cols_b = offs_n if EVEN_N else offs_n % N
            if INDEX_64:
                rows_a = rows_a.to(tl.int64)
                cols_b = cols_b.to(tl.int64)
            a_ptrs = (a_ptr + _batch_offset(batch, B1, s_a0, s_a1) + rows_a[:, None] * s_am
                      + (kt_begin * BLOCK_K + offs_k)[None, :] * s_ak)
            b_ptrs = (b_ptr + _batch_offset(batch, B1, s_b0, s_b1) + cols_b[None, :] * s_bn
                      + (kt_begin * BLOCK_K + offs_k)[:, None] * s_bk)
            for kt in tl.range(kt_begin, kt_end):
                if EVEN_K:
                    a = tl.load(a_ptrs)
                    b = tl.load(b_ptrs)
                else:
                    k_left = K - kt * BLOCK_K
                    a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
                    b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION, out_dtype=acc.dtype)
                a_ptrs += BLOCK_K * s_ak
                b_ptrs += BLOCK_K * s_bk

        if SPLIT_K == 1:
            _epilogue(acc, offs_m, pid_n, M, N,
                      c_ptr + _batch_offset(batch, B1, s_c0, s_c1), s_cm, s_cn,
                      bias_ptr + _batch_offset(batch, B1, s_bias0, s_bias1), s_biasm, s_biasn,
                      res_ptr + _batch_offset(batch, B1, s_r0, s_r1), s_rm, s_rn,
                      a_scale_ptr, b_scale_ptr, BLOCK_N, EPI_SPLIT, A_SCALE, B_SCALE, HAS_BIAS,
                      ACTIVATION, HAS_RESIDUAL, INDEX_64, c_desc, pid_m * BLOCK_M, EPI_TMA, r_desc, RES_TMA)
        else:
            # One fp32 partial tile per split; the workspace is [SPLIT_K, BATCH, M, N].
            part = ws_ptr + (split * BATCH + batch).to(tl.int64) * M * N
            mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
            tl.store(part + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def _splitk_reduce_kernel(
    ws_ptr, c_ptr, bias_ptr, res_ptr, a_scale_ptr, b_scale_ptr,
    M, N, B1, BATCH,
    s_c0, s_c1, s_cm, s_cn,
    s_bias0, s_bias1, s_biasm, s_biasn,
    s_r0, s_r1, s_rm, s_rn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr, INDEX_64: tl.constexpr,
):
    """Sum the SPLIT_K fp32 partials of one tile, then the same epilogue as the GEMM."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_batch = tl.cdiv(M, BLOCK_M) * num_pid_n
    batch = pid // tiles_per_batch
    pid_m = (pid % tiles_per_batch) // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    offsets = offs_m[:, None] * N + offs_n[None, :]  # the host keeps M * N < 2**31 for split-K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ws_ptr.dtype.element_ty)
    for split in range(SPLIT_K):
        part = ws_ptr + (split * BATCH + batch).to(tl.int64) * M * N
        acc += tl.load(part + offsets, mask=mask, other=0.0)
    _epilogue_store(acc, offs_m, offs_n, M, N,
                    c_ptr + _batch_offset(batch, B1, s_c0, s_c1), s_cm, s_cn,
                    bias_ptr + _batch_offset(batch, B1, s_bias0, s_bias1), s_biasm, s_biasn,
                    res_ptr + _batch_offset(batch, B1, s_r0, s_r1), s_rm, s_rn,
                    a_scale_ptr, b_scale_ptr, A_SCALE, B_SCALE, HAS_BIAS, ACTIVATION, HAS_RESIDUAL,
                    INDEX_64)


# --------------------------------------------------------------------------- launching

def launch(kernel, device: torch.device, grid: tuple, *args, **kwargs):
    return runner(kernel, device)[grid](*args, **kwargs)


# --------------------------------------------------------------------------- configs

def _cfg(bm, bn, bk, group_m, warps, stages, split_k=1, **extra):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "SPLIT_K": split_k, "num_warps": warps, "num_stages": stages, **extra}


# Keyed arch -> shape class -> dtype class ('16': fp16/bf16, 'fp8', 'fp32').
# FALLBACK: the config to use where TMA cannot be (pointer loads of a 128x256
# tile need more registers than sm_90 has: cross-compiled, it spills).
# sm_90: 128x256 tiles with 2 warpgroups feed wgmma at full width; decode is
# memory bound: 16-row tiles with deep K stages keep enough bytes in flight.
# gfx950: 256x128x64 with 8 waves, two LDS stages (~100 KiB of the 160 KiB LDS);
# 256x256 spills there (cross-compiled). gfx942 has 64 KiB of LDS: smaller tiles.
CONFIGS = {
    "sm_90": {
        # 16-bit square: 128x256 with FLATTEN (the next tile's TMA loads start under this tile's
        # epilogue). Measured (benchmarks/tune_gemm_llama.py, H100, CUDA-graph device time, the 12
        # GEMM layouts of a Llama block's forward and backward plus 3 biased ones, two runs): totals
        # 11168 / 12905 us against cuBLAS's 11266 / 12971 and 11433 / 12988 without FLATTEN.
        # EPILOGUE, a call with any of bias, residual, activation: the same tile with EPI_TMA and
        # RES_TMA (the result stored, the residual loaded through descriptors: no pointer tiles in the
        # MMA layout, a 64-bit address per element). Cross-compiled for sm_90, 0 spills under Triton 3.6
        # and 3.9 for every mix (3.6: residual 168 registers, bias+silu 232, bias+gelu+residual 244,
        # bias+residual 255); without EPI_TMA bias alone spills 30, with a pointer residual bias+residual
        # spills 54 and bias+gelu+residual 137. The Llama residual GEMM: 1090 us against 1182 for the
        # 128x128 tile a residual took before.
        # HEAVY, an epilogue whose result or residual cannot be a descriptor (misaligned, broadcast):
        # 128x128 halves the accumulator (196 registers for gelu+bias+residual, 0 spills). It took every
        # call with two or more parts until 128x256 fit them: there it lost 7-12% (H100, tune_gemm_llama.py:
        # the seed block's bias+residual projection 240 us vs 211-220, the MLP's bias+gelu 1004 vs 900-938).
        "square": {"16": _cfg(128, 256, 64, 8, 8, 4, FLATTEN=True,
                              FALLBACK=_cfg(128, 128, 64, 8, 8, 4),
                              EPILOGUE=_cfg(128, 256, 64, 8, 8, 4, FLATTEN=True, EPI_TMA=True),
                              HEAVY=_cfg(128, 128, 64, 8, 8, 4, FLATTEN=True, EPI_TMA=True)),
                   "fp8": _cfg(128, 256, 128, 8, 8, 3, FALLBACK=_cfg(128, 128, 128, 8, 8, 4)),
                   "fp32": _cfg(128, 128, 32, 8, 8, 3)},
        "tall": {"16": _cfg(128, 128, 64, 8, 8, 4), "fp8": _cfg(128, 128, 128, 8, 8, 4),
                 "fp32": _cfg(64, 128, 32, 8, 4, 3)},
        # decode 16: pointer loads of 128-column tiles, 6 stages: 40.0 / 41.7 us for 16x14336x4096 (x @ w /
        # x @ w.T) against 43.4 / 43.5 for the 64-column TMA tile (SHAPES=decode benchmarks/tune_gemm.py,
        # CUDA-graph device time, 50 configs; cuBLAS 39.6 / 41.3 in the same run)
        "decode": {"16": _cfg(16, 128, 64, 1, 4, 6, TMA=False), "fp8": _cfg(16, 64, 256, 1, 4, 5),
                   "fp32": _cfg(16, 64, 64, 1, 4, 4)},
    },
    "gfx950": {
        "square": {"16": _cfg(256, 128, 64, 8, 8, 2), "fp8": _cfg(256, 128, 128, 8, 8, 2),
                   "fp32": _cfg(128, 128, 32, 8, 8, 2)},
        "tall": {"16": _cfg(128, 128, 64, 8, 4, 2), "fp8": _cfg(128, 128, 128, 8, 4, 2),
                 "fp32": _cfg(64, 128, 32, 8, 4, 2)},
        "decode": {"16": _cfg(16, 64, 256, 1, 4, 2), "fp8": _cfg(16, 64, 512, 1, 4, 2),
                   "fp32": _cfg(16, 64, 64, 1, 4, 2)},
    },
    "gfx942": {
        "square": {"16": _cfg(128, 128, 32, 8, 4, 2), "fp8": _cfg(128, 128, 64, 8, 4, 2),
                   "fp32": _cfg(128, 128, 32, 8, 8, 2)},
        "tall": {"16": _cfg(128, 128, 64, 8, 4, 2), "fp8": _cfg(128, 128, 128, 8, 4, 2),
                 "fp32": _cfg(64, 128, 32, 8, 4, 2)},
        "decode": {"16": _cfg(16, 64, 256, 1, 4, 2), "fp8": _cfg(16, 64, 256, 1, 4, 2),
                   "fp32": _cfg(16, 64, 64, 1, 4, 2)},
    },
    "default": {
        "square": {"16": _cfg(128, 128, 32, 8, 4, 3), "fp8": _cfg(128, 128, 64, 8, 4, 3),
                   "fp32": _cfg(64, 64, 32, 8, 4, 3)},
        "tall": {"16": _cfg(64, 128, 32, 8, 4, 3), "fp8": _cfg(64, 128, 64, 8, 4, 3),
                 "fp32": _cfg(64, 64, 32, 8, 4, 3)},
        "decode": {"16": _cfg(16, 64, 64, 1, 4, 3), "fp8": _cfg(16, 64, 128, 1, 4, 3),
                   "fp32": _cfg(16, 64, 32, 1, 4, 3)},
    },
    # The interpreter: small tiles keep numpy work small; few programs so the
    # persistent loop really loops.
    "cpu": {cls: {d: _cfg(16, 16, 16, 2, 1, 1) for d in ("16", "fp8", "fp32")}
            for cls in ("square", "tall", "decode")},
}

# Candidates the autotuner times on the device (flyarray/kernels/tuning.py).
TUNING_CANDIDATES = {
    "sm_90": {
        "square": [_cfg(128, 256, 64, 8, 8, 3), _cfg(128, 256, 64, 8, 8, 4), _cfg(256, 128, 64, 8, 8, 3),
                   _cfg(128, 128, 64, 8, 4, 4), _cfg(128, 128, 64, 8, 8, 4), _cfg(128, 256, 128, 8, 8, 3)],
        "tall": [_cfg(128, 128, 64, 8, 4, 4), _cfg(128, 256, 64, 8, 8, 3), _cfg(64, 128, 64, 8, 4, 4),
                 _cfg(128, 64, 64, 8, 4, 4)],
        "decode": [_cfg(16, 128, 64, 1, 4, 6, TMA=False), _cfg(16, 64, 128, 1, 4, 5), _cfg(16, 32, 256, 1, 4, 4),
                   _cfg(16, 64, 256, 1, 4, 4),
                   _cfg(16, 128, 128, 1, 4, 4, split_k=2), _cfg(16, 64, 128, 1, 4, 4, split_k=2),
                   _cfg(16, 128, 128, 1, 4, 4, split_k=4), _cfg(32, 64, 128, 1, 4, 5),
                   _cfg(64, 64, 128, 1, 4, 4)],
    },
    "gfx950": {
        "square": [_cfg(256, 128, 64, 8, 8, 2), _cfg(128, 256, 64, 8, 8, 2), _cfg(128, 128, 64, 8, 4, 2),
                   _cfg(256, 128, 64, 8, 8, 2, matrix_instr_nonkdim=16)],
        "tall": [_cfg(128, 128, 64, 8, 4, 2), _cfg(256, 128, 64, 8, 8, 2), _cfg(64, 128, 64, 8, 4, 2)],
        "decode": [_cfg(16, 64, 256, 1, 4, 2), _cfg(16, 128, 256, 1, 4, 2),
                   _cfg(16, 64, 256, 1, 4, 2, split_k=2), _cfg(32, 64, 256, 1, 4, 2)],
    },
}


def shape_class(M: int, N: int, K: int) -> str:
    """'decode' (few rows: memory bound), 'tall' (few tiles or a thin side), else 'square'."""
    if M <= 64:
        return "decode"
    if min(M, N) < 1024 or M * N < 4096 * 4096:
        return "tall"
    return "square"


def dtype_class(dtype: torch.dtype) -> str:
    if dtype in FP8_DTYPES:
        return "fp8"
    return "fp32" if dtype in (torch.float32, torch.float64) else "16"


FP64_CONFIG = _cfg(64, 64, 16, 8, 4, 2, TMA=False)  # float64 is for checking, not speed: small tiles, no
# spills, and no TMA (Triton 3.6 cannot compile an fp64 dot fed by tensor descriptors)


def default_config(arch: str, M: int, N: int, K: int, dtype: torch.dtype) -> dict:
    from flyarray.kernels._triton import pick_config
    if dtype == torch.float64 and arch != "cpu":
        return dict(FP64_CONFIG)
    shape = shape_class(M, N, K)
    cfg = dict(pick_config(CONFIGS, arch)[shape][dtype_class(dtype)])
    if arch == "sm_90" and shape == "square" and "WS" not in cfg and config.gemm_warp_specialized():
        cfg["WS"] = {}
    return cfg


# --------------------------------------------------------------------------- host side

def _scale_mode(scale: Optional[torch.Tensor], length: int) -> int:
    if scale is None:
        return SCALE_NONE
    if scale.numel() == 1:
        return SCALE_TENSOR
    if scale.numel() == length:
        return SCALE_VECTOR
    raise ValueError(f"scale of shape {tuple(scale.shape)}: expected a scalar or {length} values")


def _collapse_rows(sizes: list, operands: list) -> tuple:
    """Merge adjacent row dims (batch dims + M) that every operand walks contiguously.

    ``operands`` holds, per operand, its strides over those dims. Returns the
    new sizes and strides. A size-1 dim is dropped (its stride never matters).
    """
    dims = [(s, [st[i] for st in operands]) for i, s in enumerate(sizes)]
    keep = [d for d in dims[:-1] if d[0] != 1] + [dims[-1]]  # M itself always stays
    merged = [keep[-1]]
    for size, strides in reversed(keep[:-1]):
        inner_size, inner_strides = merged[0]
        if all(o == i * inner_size for o, i in zip(strides, inner_strides)):
            merged[0] = (size * inner_size, inner_strides)
        else:
            merged.insert(0, (size, strides))
    new_sizes = [d[0] for d in merged]
    new_strides = [[d[1][j] for d in merged] for j in range(len(operands))]
    return new_sizes, new_strides


def _plan_views(a, b, out, bias, residual, a_scale_mode):
    """Views of a, b, out, bias, residual as [B0, B1, rows, cols] with collapsed batch.

    Returns a list of view tuples (one per host-loop step; almost always one).
    """
    batch_shape = tuple(out.shape[:-2])
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    a_e = a.expand(*batch_shape, M, K)
    b_e = b.expand(*batch_shape, K, N)
    extras = [t.expand(out.shape) for t in (bias, residual) if t is not None]
    tensors = [a_e, out] + extras
    row_strides = [list(t.stride()[:-1]) for t in tensors]
    row_strides.append(list(b_e.stride()[:-2]) + [0])
    # A per-row a_scale is indexed by M alone: it forbids folding batch into M.
    row_strides.append([0] * len(batch_shape) + [1 if a_scale_mode == SCALE_VECTOR else 0])
    sizes, strides = _collapse_rows(list(batch_shape) + [M], row_strides)
    batch_sizes = sizes[:-1]
    while len(batch_sizes) < 2:  # the kernel takes exactly two batch dims
        batch_sizes.insert(0, 1)
        for st in strides:
            st.insert(0, 0)
    rows = sizes[-1]

    def view(t, row_strides, inner_shape, inner_strides):
        """t over the collapsed [B0, B1] batch, with its own last-two dims."""
        return t.as_strided(batch_sizes + list(inner_shape), list(row_strides) + list(inner_strides),
                            t.storage_offset())

    # Row operands: the collapsed row stride stands in for M's; b keeps K and N.
    a_v, out_v, *rest = [view(t, st[:-1], (rows, t.shape[-1]), (st[-1], t.stride(-1)))
                         for t, st in zip(tensors, strides)]
    b_view = view(b_e, strides[len(tensors)][:-1], (K, N), b_e.stride()[-2:])
    rest = iter(rest)
    bias_v = next(rest) if bias is not None else None
    res_v = next(rest) if residual is not None else None
    steps = [(a_v, b_view, out_v, bias_v, res_v)]
    # More than two batch dims survive collapsing: loop over the leading ones.
    while steps[0][0].dim() > 4:
        steps = [tuple(None if t is None else t[i] for t in step)
                 for step in steps for i in range(step[0].shape[0])]
    return steps


def _tma_layout(t: torch.Tensor, k_dim: int) -> Optional[bool]:
    """Whether t (2-D after the batch) can be a TMA descriptor, and along which axis.

    Returns True if the K axis is the contiguous one, False if the other axis
    is, None if neither (or the alignment rules of TMA fail)."""
    elem = t.element_size()
    if not aligned16(t):
        return None
    s_rows, s_cols = t.stride(-2), t.stride(-1)
    k_is_cols = k_dim == 1
    if s_cols == 1 and (s_rows * elem) % 16 == 0 and s_rows > 0:
        return k_is_cols
    if s_rows == 1 and (s_cols * elem) % 16 == 0 and s_cols > 0:
        return not k_is_cols
    return None


def _num_programs(device: torch.device, arch: str, cfg: dict) -> int:
    if device.type == "cpu":
        return 3
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    # Decode tiles are light (one warpgroup, small smem): several share an SM.
    per_sm = 1 if cfg["BLOCK_M"] * cfg["BLOCK_N"] >= 128 * 128 else 4
    return sms * per_sm


def _default_epi_split(cfg: dict) -> int:
    """Epilogue column chunks: enough that one chunk is at most 128x64."""
    area = cfg["BLOCK_M"] * cfg["BLOCK_N"]
    if cfg["BLOCK_N"] >= 128 and area >= 128 * 256:
        return 4
    return 2 if cfg["BLOCK_N"] >= 64 and area >= 128 * 128 else 1


def _for_epilogue(cfg: dict, operands: int, descriptors_fit) -> dict:
    """The config for an epilogue of ``operands`` parts (bias, residual, activation). A config may name
    an EPILOGUE tile for calls with any, whose result and residual move through descriptors, and a HEAVY
    one for when they cannot (``descriptors_fit(tier)`` False): a pointer tile in the MMA layout holds a
    64-bit address per element, which the larger tile has no registers for (see CONFIGS)."""
    if operands == 0 or "EPILOGUE" not in cfg:
        return cfg
    tier = cfg["EPILOGUE"]
    if "HEAVY" in cfg and not descriptors_fit(tier):
        return cfg["HEAVY"]
    return tier


def _descriptor_fits(t: torch.Tensor, block_n: int, epi_split: int) -> bool:
    """Whether the epilogue can move ``t`` (the result, or the residual) through a descriptor: contiguous
    along N with 16-byte aligned rows that neither repeat nor overlap (a broadcast or unfolded residual
    does not) and base, and an epilogue piece (BLOCK_N / EPI_SPLIT columns; EPI_SPLIT 1, 2 or 4) of 16
    bytes to 256 elements (a descriptor's block shape); otherwise pointer loads and stores run."""
    elem, piece = t.element_size(), block_n // max(epi_split, 1)
    return (epi_split in (1, 2, 4) and piece * elem >= 16 and piece <= 256 and t.stride(-1) == 1
            and t.stride(-2) >= t.shape[-1] and (t.stride(-2) * elem) % 16 == 0 and aligned16(t))


def _epilogue_descriptors_fit(tier: dict, use_tma: bool, out: torch.Tensor, res, split_k=None) -> bool:
    """Whether ``tier`` would store ``out`` and load ``res`` (if any) through descriptors (EPI_TMA);
    ``split_k``: the call's, where known (else the tier's own)."""
    split = int(tier.get("EPI_SPLIT", _default_epi_split(tier)))
    split_k = int(tier.get("SPLIT_K", 1)) if split_k is None else split_k
    return (use_tma and bool(tier.get("EPI_TMA")) and split_k == 1
            and all(_descriptor_fits(t, tier["BLOCK_N"], split) for t in (out, res) if t is not None))


def _span(t: torch.Tensor) -> int:
    """One past the largest element offset a view reaches within one batch (the
    last two dims); batch offsets are int64 in the kernel anyway."""
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape[-2:], t.stride()[-2:]))


def _dot_precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    if dtype == torch.float32:
        return "tf32" if allow_tf32 else "ieee"
    return "ieee"  # ignored for 16-bit and fp8 inputs


class _PreparedGemm:
    """Everything a launch needs except the tensors: built once per problem
    signature, so a steady-state call (a decode step runs for ~30 us) costs a
    dict lookup and the Triton launch, not the planning above."""

    def __init__(self, step, cfg, *, a_mode, b_mode, activation, arch, allow_tf32):
        a, b, out, bias, res = step
        B0, B1, M, K = a.shape
        N = b.shape[-1]
        batch = B0 * B1
        self.device = a.device
        acc_fp64 = a.dtype == torch.float64 or b.dtype == torch.float64
        use_tma, a_kmajor, b_kmajor = False, True, False
        # not for float64 whatever the config says: Triton 3.6 cannot compile an fp64 dot fed by descriptors
        if cfg.get("TMA", True) and arch == "sm_90" and HAS_TENSOR_DESCRIPTORS and batch == 1 and not acc_fp64:
            a_layout, b_layout = _tma_layout(a, 1), _tma_layout(b, 0)
            if a_layout is not None and b_layout is not None:
                use_tma, a_kmajor, b_kmajor = True, a_layout, b_layout
                ensure_tma_allocator()
        fallback = cfg.get("FALLBACK")  # an epilogue tier without its own falls back as the main tile does
        cfg = _for_epilogue(cfg, (bias is not None) + (res is not None) + (activation is not None),
                            lambda tier: _epilogue_descriptors_fit(tier, use_tma, out, res))
        fallback = cfg.get("FALLBACK", fallback)
        split_k = max(1, min(int(cfg.get("SPLIT_K", 1)), cdiv(K, cfg["BLOCK_K"])))
        if M * N >= 2**31:
            split_k = 1  # the workspace is indexed with int32 offsets per batch
        if not use_tma and fallback is not None:
            cfg = fallback
        epi_split = int(cfg.get("EPI_SPLIT", _default_epi_split(cfg)))
        epi_tma = _epilogue_descriptors_fit(cfg, use_tma, out, None, split_k)
        res_tma = epi_tma and res is not None and _descriptor_fits(res, cfg["BLOCK_N"], epi_split)
        self.ws_shape = (split_k, batch, M, N) if split_k > 1 else None
        self.ws_dtype = torch.float64 if acc_fp64 else torch.float32
        tiles = batch * cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
        programs = max(1, min(tiles * split_k, _num_programs(self.device, arch, cfg)))
        self.grid = (programs,)
        bias_st = bias.stride() if bias is not None else (0, 0, 0, 0)
        res_st = res.stride() if res is not None else (0, 0, 0, 0)
        index_64 = max(_span(t) for t in (a, b, out, bias, res) if t is not None) >= 2**31
        epilogue = dict(A_SCALE=a_mode, B_SCALE=b_mode, HAS_BIAS=bias is not None,
                        ACTIVATION=ACTIVATIONS[activation], HAS_RESIDUAL=res is not None)
        hip_extra = {k: cfg[k] for k in ("waves_per_eu", "matrix_instr_nonkdim", "kpack") if k in cfg}
        self.ints = (M, N, K, B1, batch, *a.stride(), *b.stride(), *out.stride(), *bias_st, *res_st, programs)
        self.kwargs = dict(
            BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
            SPLIT_K=split_k, EVEN_M=(M % cfg["BLOCK_M"] == 0), EVEN_N=(N % cfg["BLOCK_N"] == 0),
            EVEN_K=(K % cfg["BLOCK_K"] == 0), INDEX_64=index_64,
            EPI_SPLIT=epi_split,
            DOT_PRECISION=_dot_precision(a.dtype, allow_tf32), USE_TMA=use_tma, A_KMAJOR=a_kmajor,
            B_KMAJOR=b_kmajor, ACC_FP64=acc_fp64, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
            **self._schedule_flags(cfg, use_tma, epi_tma, res_tma), **hip_extra, **epilogue)
        if split_k > 1:
            rbm, rbn = min(64, next_pow2(M)), 64
            self.reduce_grid = (batch * cdiv(M, rbm) * cdiv(N, rbn),)
            self.reduce_ints = (M, N, B1, batch, *out.stride(), *bias_st, *res_st)
            self.reduce_kwargs = dict(BLOCK_M=rbm, BLOCK_N=rbn, SPLIT_K=split_k, num_warps=4,
                                      INDEX_64=index_64, **epilogue)
        self.fixed = None  # the launches of a cached plan (matmul's _plans): see fixed_launches

    @staticmethod
    def _schedule_flags(cfg, use_tma, epi_tma, res_tma):
        """EPI_TMA / RES_TMA / FLATTEN (the kernel's docstring), passed only when set so that the configs
        without them compile exactly as before."""
        flags = {"EPI_TMA": epi_tma, "RES_TMA": res_tma, "FLATTEN": bool(cfg.get("FLATTEN")) and use_tma}
        return {name: True for name, on in flags.items() if on}

    def fixed_launches(self):
        """This plan's launches with their specialization fixed: matmul caches a plan under a key of
        every operand's shape, strides, dtype and alignment, and allocates out/ws fresh (aligned), so a
        hit launches exactly what the first call compiled (no per-call specialization key)."""
        if self.fixed is None:
            gemm = FixedLaunch(_gemm_kernel, self.device, self.grid, self.kwargs)
            reduce = None if self.ws_shape is None else \
                FixedLaunch(_splitk_reduce_kernel, self.device, self.reduce_grid, self.reduce_kwargs)
            self.fixed = (gemm, reduce)
        return self.fixed

    def run_fixed(self, a, b, out, bias, res, a_scale, b_scale):
        """``__call__`` through fixed_launches (a cached plan's steady state)."""
        gemm, reduce = self.fixed_launches()
        ws, pointers = self._workspace_and_pointers(out, bias, res, a_scale, b_scale)
        gemm(a, b, out, *pointers, ws, *self.ints)
        if reduce is not None:
            reduce(ws, out, *pointers, *self.reduce_ints)

    def __call__(self, a, b, out, bias, res, a_scale, b_scale):
        """Launch on tensors whose data pointers are those of the planned step
        (the planner's as_strided views keep their base's storage offset)."""
        ws, pointers = self._workspace_and_pointers(out, bias, res, a_scale, b_scale)
        launch(_gemm_kernel, self.device, self.grid, a, b, out, *pointers, ws, *self.ints, **self.kwargs)
        if self.ws_shape is not None:
            launch(_splitk_reduce_kernel, self.device, self.reduce_grid, ws, out, *pointers,
                   *self.reduce_ints, **self.reduce_kwargs)

    def _workspace_and_pointers(self, out, bias, res, a_scale, b_scale):
        """The split-K workspace (``out`` itself without split-K) and the optional operands' pointers,
        ``out`` standing in for the unused ones (the constexpr flags skip them)."""
        ws = out if self.ws_shape is None else empty(self.ws_shape, self.ws_dtype, self.device)
        return ws, tuple(out if t is None else t for t in (bias, res, a_scale, b_scale))


def _prepare(step, cfg, *, a_mode, b_mode, activation, arch, allow_tf32):
    """The launch plan of one step: the warp-specialized sm_90 kernel where the config asks for it
    (``WS``: its tile settings) and the step fits it, else the Triton GEMM."""
    if cfg.get("WS") is not None and _ws_takes(activation, step[4]) and _ws_fits(step, arch, a_mode, b_mode):
        return _PreparedWs(step, cfg["WS"], activation)
    return _PreparedGemm(step, cfg, a_mode=a_mode, b_mode=b_mode, activation=activation, arch=arch,
                         allow_tf32=allow_tf32)


# Activations the warp-specialized kernel spills registers in when a residual is added too (cross-compiled for
# sm_90, Triton 3.6): exact gelu's erf, 730 bytes. Without a residual it applies gelu to the accumulator's
# column halves one after the other (gemm_hopper._store_gelu_by_halves): 0 spills, where the whole tile at
# once spilled 265 bytes, and the fp16 MLP (Linear -> GELU -> Linear) took 1951 us with that against 1631 us
# with the Triton GEMM (H100, docs/benchmarks.md, twenty-first session). Every other activation, with or
# without bias and residual, spills none.
WS_SPILLING = ("gelu",)
# The spill-free gelu by halves is correct on an H100 but slower (twenty-ninth session, benchmarks/mlp_gelu_ws.py:
# 4096x4096x16384 + bias + gelu 1165-1215 us against the Triton GEMM's 900-933 and cuBLAS + F.gelu's 885-924), so
# exact gelu stays on the Triton GEMM; the switch stays for the next try at the epilogue.
WS_GELU_BY_HALVES = False


def _ws_takes(activation, residual) -> bool:
    """Whether the warp-specialized kernel's epilogue takes this activation (and residual) without spilling."""
    if activation not in WS_SPILLING:
        return True
    return WS_GELU_BY_HALVES and residual is None


def _ws_fits(step, arch, a_mode, b_mode) -> bool:
    """What gemm_hopper's kernel takes: one 2-D fp16/bf16 problem without scales, a, b and the result
    readable by TMA (result and residual row-major, in a's dtype), a bias that is one row of N values."""
    a, b, out, bias, res = step
    if arch != "sm_90" or not HAS_TENSOR_DESCRIPTORS or a.shape[0] * a.shape[1] != 1 or a_mode or b_mode:
        return False
    if a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype or out.dtype != a.dtype:
        return False
    if _tma_layout(a, 1) is None or _tma_layout(b, 0) is None or _tma_layout(out, 1) is not True:
        return False
    if res is not None and (res.dtype != out.dtype or _tma_layout(res, 1) is not True):
        return False
    return bias is None or (bias.stride(-2) == 0 and bias.stride(-1) == 1)


class _PreparedWs:
    """``_PreparedGemm``'s interface for gemm_hopper's warp-specialized kernel (its docstring): the
    step's [1, 1, rows, cols] views pass their data pointers; the plan holds sizes, row strides, flags."""

    def __init__(self, step, ws_cfg, activation):
        from flyarray.kernels import gemm_hopper
        a, b, out, bias, res = step
        M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
        a_kmajor, b_kmajor = _tma_layout(a, 1), _tma_layout(b, 0)
        tile = dict(gemm_hopper.DEFAULT, **ws_cfg)
        self.device = a.device
        self.kernel = gemm_hopper._gemm_ws_kernel
        tiles = cdiv(M, gemm_hopper.BLOCK_M) * cdiv(N, tile["BLOCK_N"])
        programs = max(1, min(tiles, _num_programs(a.device, "sm_90", dict(tile, BLOCK_M=gemm_hopper.BLOCK_M))))
        self.grid = (programs,)
        self.ints = (M, N, K, a.stride(-2) if a_kmajor else a.stride(-1), b.stride(-1) if b_kmajor else b.stride(-2),
                     out.stride(-2), res.stride(-2) if res is not None else 0)
        self.kwargs = dict(A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, HAS_BIAS=bias is not None,
                           ACTIVATION=ACTIVATIONS[activation], HAS_RESIDUAL=res is not None, NUM_PROGRAMS=programs,
                           num_warps=4, **tile)
        self.fixed = None
        ensure_tma_allocator()

    def __call__(self, a, b, out, bias, res, a_scale, b_scale):
        launch(self.kernel, self.device, self.grid, a, b, out, out if bias is None else bias,
               out if res is None else res, *self.ints, **self.kwargs)

    def run_fixed(self, a, b, out, bias, res, a_scale, b_scale):
        if self.fixed is None:
            self.fixed = FixedLaunch(self.kernel, self.device, self.grid, self.kwargs)
        self.fixed(a, b, out, out if bias is None else bias, out if res is None else res, *self.ints)


def launch_gemm(step, cfg, *, a_scale, b_scale, activation, arch, allow_tf32):
    """Launch the GEMM (+ split-K reduction) on one [B0, B1, M, K] x [B0, B1, K, N] step."""
    a, b = step[0], step[1]
    prepared = _prepare(step, cfg, a_mode=_scale_mode(a_scale, a.shape[-2]),
                        b_mode=_scale_mode(b_scale, b.shape[-1]), activation=activation, arch=arch,
                        allow_tf32=allow_tf32)
    prepared(*step, a_scale, b_scale)


_plans: dict = launch_cache()  # call signature -> (out shape, _PreparedGemm) for single-step problems


def _signature(a, b, bias, residual, a_scale, b_scale, activation, out_dtype, allow_tf32, tune):
    """What a plan depends on: shapes, strides, dtypes, 16-byte alignment (TMA, and
    Triton's own pointer specialization), the epilogue and the tuning switch."""
    # written out for a and b (every call has them): a call's host time in the steady state is mostly this
    key = (a.shape, a.stride(), a.dtype, not a.data_ptr() & 15, b.shape, b.stride(), b.dtype, not b.data_ptr() & 15,
           activation, out_dtype, allow_tf32, tune, os.environ.get("FLYARRAY_AUTOTUNE", ""), a.device)
    if bias is None and residual is None and a_scale is None and b_scale is None:
        return key
    return key + tuple(None if t is None else (t.shape, t.stride(), t.dtype, aligned16(t))
                       for t in (bias, residual, a_scale, b_scale))


def matmul(a: torch.Tensor, b: torch.Tensor, *, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None, residual: Optional[torch.Tensor] = None,
           out_dtype: Optional[torch.dtype] = None, a_scale: Optional[torch.Tensor] = None,
           b_scale: Optional[torch.Tensor] = None, allow_tf32: bool = False,
           tune: Optional[bool] = None, config: Optional[dict] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``activation(a @ b * a_scale * b_scale + bias) + residual`` in one kernel.

    a [..., M, K], b [..., K, N] (batch dims broadcast; both at least 2-D: the
    caller unsqueezes 1-D operands). Any strides. bias and residual broadcast to
    [..., M, N]. a_scale: scalar or [M]; b_scale: scalar or [N] (fp32).
    out_dtype defaults to the input dtype, bf16 for fp8 inputs. ``tune``
    (default: env FLYARRAY_AUTOTUNE=1) times candidate configs on the device
    once per shape bucket; ``config`` forces one (tests, tuning). ``out``: the
    tensor to write and return instead of a new one: contiguous, of the result's
    shape and dtype, on a's device, 16-byte aligned (as a fresh allocation is).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}; expected one of {list(ACTIVATIONS)}")
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError("matmul takes operands of rank >= 2; unsqueeze 1-D operands first")
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else torch.bfloat16 if a.dtype in FP8_DTYPES else a.dtype
    if out is not None:
        _check_out(out, a, b, out_dtype)
    a_scale = a_scale.reshape(-1) if a_scale is not None else None
    b_scale = b_scale.reshape(-1) if b_scale is not None else None
    # no plan is kept for a forced config, nor read or kept by a dry run (precompile.py: its launcher
    # launches nothing)
    key = None if config is not None or is_warming_up() else _signature(
        a, b, bias, residual, a_scale, b_scale, activation, out_dtype, allow_tf32, tune)
    if key in _plans:  # the steady state: no planning
        out_shape, prepared = _plans[key]
        if out is None:
            out = empty(out_shape, out_dtype, a.device)
        prepared.run_fixed(a, b, out, bias, residual, a_scale, b_scale)
        return out
    M, N = a.shape[-2], b.shape[-1]
    batch_shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if out is None:
        out = torch.empty(*batch_shape, M, N, dtype=out_dtype, device=a.device)
    if out.numel() == 0:
        return out
    a_mode, b_mode = _scale_mode(a_scale, M), _scale_mode(b_scale, N)
    steps = _plan_views(a, b, out, bias, residual, a_mode)
    arch = current_arch(a.device)
    cfg = config or _choose_config(arch, steps[0], a_scale, b_scale, activation, allow_tf32, tune)
    for step in steps:
        prepared = _prepare(step, cfg, a_mode=a_mode, b_mode=b_mode, activation=activation, arch=arch,
                                 allow_tf32=allow_tf32)
        prepared(*step, a_scale, b_scale)
    if key is not None and len(steps) == 1 and len(_plans) < 4096:
        _plans[key] = (out.shape, prepared)
    return out


def _check_out(out, a, b, out_dtype):
    """``out`` must be what matmul would allocate: a plan cached for these operands assumes a fresh
    buffer's layout (contiguous, 16-byte aligned), whoever provides it."""
    shape = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])) + (a.shape[-2], b.shape[-1])
    if tuple(out.shape) != shape or out.dtype != out_dtype or out.device != a.device:
        raise ValueError(f"out: expected a {shape} {out_dtype} tensor on {a.device}, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    if not out.is_contiguous() or not aligned16(out):
        raise ValueError("out: must be contiguous with a 16-byte aligned data pointer (as torch.empty gives)")


def _choose_config(arch, step, a_scale, b_scale, activation, allow_tf32, tune) -> dict:
    from flyarray.kernels import tuning
    a, b = step[0], step[1]
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    default = default_config(arch, M, N, K, a.dtype)
    if arch == "cpu" or a.dtype == torch.float64 or not tuning.enabled(tune):
        return default  # float64 is for checking: its one small config (the tuned tiles do not fit fp64)
    candidates = tuning.candidates_for(TUNING_CANDIDATES, arch, shape_class(M, N, K), default)

    def run(cfg):
        launch_gemm(step, cfg, a_scale=a_scale, b_scale=b_scale, activation=activation, arch=arch,
                    allow_tf32=allow_tf32)

    key = tuning.make_key("gemm", arch, str(a.dtype).replace("torch.", ""),
                          (M, N, K, a.shape[0] * a.shape[1]), extra=[_tma_layout(a, 1), _tma_layout(b, 0)])
    return tuning.tune("gemm", key, candidates, run, default)


# --------------------------------------------------------------------------- reference

def reference_matmul(a, b, *, bias=None, activation=None, residual=None, out_dtype=None,
                     a_scale=None, b_scale=None, allow_tf32=False) -> torch.Tensor:
    """The same function in float64 (the oracle), cast to out_dtype at the end."""
    if out_dtype is None:
        out_dtype = torch.bfloat16 if a.dtype in FP8_DTYPES else a.dtype
    acc = torch.matmul(a.double(), b.double())
    if a_scale is not None:
        s = a_scale.double().reshape(-1)
        acc = acc * (s if s.numel() == 1 else s[:, None])
    if b_scale is not None:
        acc = acc * b_scale.double().reshape(-1)
    if bias is not None:
        acc = acc + bias.double()
    acc = reference_activation(acc, activation)
    if residual is not None:
        acc = acc + residual.double()
    return acc.to(out_dtype)


def reference_activation(x: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    if activation is None:
        return x
    if activation == "relu":
        return torch.relu(x)
    if activation == "gelu":
        return torch.nn.functional.gelu(x)
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if activation == "silu":
        return torch.nn.functional.silu(x)
    raise ValueError(activation)


# --------------------------------------------------------------------------- compile specs

_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
                 torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}


def _spec(name, dtype, out_dtype, cfg, *, activation=None, bias=False, residual=False, scales=SCALE_NONE,
          tma=False, b_kmajor=False, res_tma=True):
    """A KernelSpec for contiguous (or, with b_kmajor, transposed-b) operands; cfg's EPI_TMA / FLATTEN
    apply with tma, and with EPI_TMA the residual comes through a descriptor unless ``res_tma`` is False."""
    pointers = {"a_ptr": dtype, "b_ptr": dtype, "c_ptr": out_dtype, "bias_ptr": out_dtype,
                "res_ptr": out_dtype, "a_scale_ptr": torch.float32, "b_scale_ptr": torch.float32,
                "ws_ptr": torch.float32}
    constexprs = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                      GROUP_M=cfg["GROUP_M"], SPLIT_K=cfg["SPLIT_K"], EVEN_M=True, EVEN_N=True, EVEN_K=True,
                      INDEX_64=False, EPI_SPLIT=_default_epi_split(cfg),
                      A_SCALE=scales, B_SCALE=scales, HAS_BIAS=bias, ACTIVATION=ACTIVATIONS[activation],
                      HAS_RESIDUAL=residual, DOT_PRECISION="ieee", USE_TMA=tma, A_KMAJOR=True,
                      B_KMAJOR=b_kmajor, ACC_FP64=False,
                      **{flag: bool(cfg.get(flag)) and tma for flag in ("EPI_TMA", "FLATTEN")})
    constexprs["RES_TMA"] = constexprs["EPI_TMA"] and residual and res_tma
    # Unit strides are what Triton specializes at run time for contiguous data.
    for unit in ("s_ak", "s_cn", "s_biasn", "s_rn", "s_bk" if b_kmajor else "s_bn"):
        constexprs[unit] = 1
    signature = {}
    for arg in _gemm_kernel.arg_names:
        if arg in constexprs:
            signature[arg] = "constexpr"
        elif arg in pointers:
            signature[arg] = "*" + _TRITON_TYPES[pointers[arg]]
        else:
            signature[arg] = "i32"
    return KernelSpec(name=name, fn=_gemm_kernel, signature=signature, constexprs=constexprs,
                      num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                      divisible=strides_of(signature))


# Integer arguments that are sizes, not strides: a real launch sees strides of 16-aligned
# rows divisible by 16 (Triton specializes on it), sizes of any value.
SIZE_ARGS = frozenset({"M", "N", "K", "B1", "BATCH", "G", "NUM_PROGRAMS"})


def strides_of(signature: dict) -> tuple:
    """The i32 arguments of a spec that are strides (divisible by 16 at a real launch)."""
    return tuple(name for name, ty in signature.items() if ty == "i32" and name not in SIZE_ARGS)


def compile_specs(target: Optional[str] = None) -> list:
    """Representative specializations with ``target``'s configs (default: gfx950's):
    bf16/fp16 square tiles with fused epilogues, decode tiles, fp8 e4m3 with
    per-row scales. On sm_90 the square ones are the TMA variant (what runs for
    aligned 2-D operands) plus the pointer-load fallback."""
    arch = target or "gfx950"
    table = CONFIGS.get(arch, CONFIGS["default"])
    tma = arch == "sm_90" and HAS_TENSOR_DESCRIPTORS
    bf16, fp16, e4m3 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
    sq16, sq8 = table["square"]["16"], table["square"]["fp8"]
    # an epilogue through descriptors, and the tile for when its result or residual cannot be one
    epi16, heavy16 = _for_epilogue(sq16, 1, lambda tier: True), _for_epilogue(sq16, 1, lambda tier: False)
    specs = [
        _spec("gemm_bf16_square", bf16, bf16, sq16, tma=tma),
        _spec("gemm_fp16_square_residual", fp16, fp16, epi16, residual=True, tma=tma),
        _spec("gemm_bf16_square_bias", bf16, bf16, epi16, bias=True, tma=tma),
        _spec("gemm_fp16_square_gelu", fp16, fp16, epi16, activation="gelu", tma=tma),
        _spec("gemm_bf16_square_bias_silu", bf16, bf16, epi16, activation="silu", bias=True, tma=tma),
        _spec("gemm_fp16_square_bias_gelu_residual", fp16, fp16, epi16, activation="gelu", bias=True,
              residual=True, tma=tma),
        _spec("gemm_bf16_decode", bf16, bf16, table["decode"]["16"]),
        _spec("gemm_bf16_decode_splitk", bf16, bf16, dict(table["decode"]["16"], SPLIT_K=4)),
        _spec("gemm_fp8e4m3_square_rowscale", e4m3, bf16, sq8, scales=SCALE_VECTOR, b_kmajor=True, tma=tma),
    ]
    if tma:
        specs.append(_spec("gemm_fp16_square_bias_gelu_residual_pointer", fp16, fp16, heavy16, activation="gelu",
                           bias=True, residual=True, tma=tma, res_tma=False))
        specs.append(_spec("gemm_bf16_square_pointer_residual", bf16, bf16, sq16["FALLBACK"],
                           activation="silu", bias=True, residual=True))
        specs.append(_spec("gemm_fp8e4m3_square_pointer", e4m3, bf16, sq8["FALLBACK"],
                           scales=SCALE_TENSOR, b_kmajor=True))
    return specs
