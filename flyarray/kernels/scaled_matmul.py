"""Block-scaled (OCP MX) matrix multiplication: ``scaled_matmul``.

Convention (jax.nn.scaled_matmul's): both operands are K-major,

    lhs        [M, K]       (e2m1: uint8 [M, K/2], two codes a byte, low nibble first)
    rhs        [N, K]       (e2m1: uint8 [N, K/2])
    lhs_scales [M, K/32]    E8M0 codes, uint8 (this module's scaled_matmul also takes
                            torch.float8_e8m0fnu; fa.nn.scaled_matmul and
                            torch.ops.flyarray.scaled_matmul take uint8 only)
    rhs_scales [N, K/32]
    out        [M, N] = (lhs * repeat(lhs_scales, 32, -1)) @ (rhs * repeat(rhs_scales, 32, -1)).T

A leading batch dimension (B, M, K) x (B, N, K) -> (B, M, N) is accepted too.
A bf16/fp16 ``lhs`` with ``lhs_scales=None`` is the weight-only case
(activations times MX weights). Accumulation is float32.

Four ways, picked per arch and shape (``method=None``) or by name:

* ``"dot_scaled"``: a tiled GEMM on ``tl.dot_scaled``. On gfx950 (MI350) it
  lowers to the native scaled MFMA ``v_mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4``;
  on Hopper Triton upcasts the MX operands to bf16 before ``wgmma``.
* ``"decode"`` (for M <= 64, bf16/fp16 activations x MXFP4/MXFP8 weights):
  weight bytes dominate, so the kernel streams the 4-bit (or 8-bit) weights,
  decodes them to bf16 in registers and computes out^T = W x^T, so the decoded
  weights are the MMA's register operand (Hopper's wgmma takes A from
  registers) and the few activation rows the shared-memory one. On NVIDIA
  sm_90+ with bf16 activations it decodes 32-bit words of codes with inline PTX
  (FP4: a prmt table lookup, eight codes a word, ``_FP4_TO_BF16X8_ASM``; fp8:
  the hardware fp8x2 conversion); elsewhere plain Triton arithmetic. N spreads over many programs (and K over ``split_k`` programs
  when N is short). It moves ~4x (~2x) fewer bytes than a bf16 GEMV.
* ``"fp8_blocks"`` (MXFP8 x MXFP8 on Hopper): feeds the fp8 tensor cores
  directly, one K=32 MMA per scale block (wgmma's fp8 K is 32), and applies
  the two E8M0 scales to each block's fp32 partial product:
  ``acc += (dot(a_blk, b_blk) * sa[:, None]) * sb[None, :]``.
* ``"upcast"`` (any MX operands, or bf16 activations with M > 64): decodes
  each MX operand to bf16 in memory (``mx_dequantize``: exact, an MX value
  times its power of two fits bf16), then flyarray's bf16 GEMM. On Hopper this
  beats both kernels above at large shapes: the per-block fp32 rescale of
  "fp8_blocks" costs two CUDA-core operations per output element per 32 K,
  which at 8192^3 alone fills the FP32 units for about 1 ms, and
  "dot_scaled" converts every operand tile again for each output tile. It
  needs (M + N) * K * 2 bytes of scratch for the decoded operands.

On a GPU, "decode", "fp8_blocks" and the sm_90 MX GEMMs time their candidate
configs (and "upcast") once per shape on first use and keep the fastest
(``tuning_choices()`` lists them).

Numerics: MX products are exact and accumulate in fp32. "decode" rounds the
decoded weights to the activations' dtype, which is exact for E2M1/E4M3
values times a power of two in the bf16/fp16 range. "decode" (bf16: the scale
as a bf16 power of two, E8M0 code 0 = 2^-127 flushed to zero; fp16: through
fp32) and "fp8_blocks" (a normal float32) count a block whose scale is below
their range as zero (|values| under ~2^-118); "dot_scaled" follows Triton.
A NaN scale (255) makes its block, hence its output row/column, NaN.

On the CPU every kernel runs in Triton's interpreter (3.9's interpreter
implements tl.dot_scaled for all the combinations used here, so nothing is
emulated outside the kernels); use fp16 activations there (no bf16 arithmetic).
"""
from __future__ import annotations

import contextvars

import torch
import triton
import triton.language as tl

from flyarray.kernels._triton import (FixedLaunch, cdiv, current_arch, empty, is_warming_up, launch_cache,
                                      next_pow2, pick_config)
from flyarray.kernels.mx import BLOCK_SIZE, check_kernel_device, launch, mx_dequantize, mx_format, scales_as_uint8
from flyarray.targets import AMD_OPTIONS, amd_launch_options

_MX_FORMATS = ("e4m3", "e5m2", "e2m1")
_PLAIN_FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16}
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Per-arch tiles. "dot_scaled": BLOCK_K counts logical elements (e2m1 loads BLOCK_K/2 bytes).
CONFIGS = {
    # gfx950: picked by cross-compiling (benchmarks/sweep_gfx950_mx.py; table in docs/kernels.md) as
    # the largest tiles with 0 scratch that keep the native scaled MFMA. num_warps=8 puts 2 waves on
    # each SIMD, so a wave gets 256 VGPRs (4 warps: 512, but one wave per SIMD hides no latency);
    # in 256 VGPRs a 128x128 fp32 accumulator (64 a lane) leaves room for one K step of 64 fp8
    # elements (BLOCK_K=128: e4m3 x e4m3 spilled 249 B) or 128 fp4 ones (256 spilled 349-1154 B),
    # double-buffered (num_stages=2). bf16 x MX upcasts the weights to bf16 (bf16 MFMA), so its
    # K step is 64 too (BLOCK_K=128 spilled 408-704 B).
    "gfx950": {
        "dot_scaled": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=2),
        "dot_scaled_fp4": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=2),
        "mxfp8_method": "dot_scaled",
        "dot_scaled_wonly": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=2),
        # BLOCK_K=256 spilled at BLOCK_M=64 (29 B e2m1, 541 B e4m3); 128 fits (<= 335 VGPRs at M=64,
        # 4 waves). Both timed once per shape on first use.
        "decode_candidates": [
            dict(kernel="dot_scaled", BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=2),
            dict(kernel="dot_scaled", BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=2),
        ],
    },
    # sm_90: Triton upcasts MX operands to bf16 in registers before wgmma; the 128x128x128 tiles spilled
    # 446-1564 B (Triton 3.6 and 3.9), 128x128x64 still 124-193 B for e4m3 x e4m3. These compile clean
    # in both (tests/test_cross_compile.py); "upcast" is the fast path here anyway (docs/kernels.md).
    "sm_90": {
        "dot_scaled": dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
        "dot_scaled_fp4": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
        "dot_scaled_wonly": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3),
        "fp8_blocks": dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, num_warps=8, num_stages=5),
        # timed once per shape on first use, like the decode candidates
        "fp8_blocks_candidates": [
            dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, num_warps=8, num_stages=5),
            dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, num_warps=8, num_stages=3),
            dict(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=5),
            dict(BLOCK_M=128, BLOCK_N=64, GROUP_M=8, num_warps=4, num_stages=5),
            # Triton's own path (bf16 upcast), so the auto choice is never slower than it
            dict(kernel="dot_scaled", BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=8,
                 num_stages=3),
            dict(kernel="upcast"),
        ],
        "mxfp8_method": "fp8_blocks",
        # MX GEMMs with an e2m1 operand, and bf16 x MX past the decode sizes: timed once per shape
        "mx_candidates": [
            dict(kernel="dot_scaled"),   # the table's dot_scaled tile for the formats
            dict(kernel="upcast"),
        ],
        # timed once per shape on first use (the first is used where timing is impossible); "decode"
        # entries run the transposed decode kernel (sm_90: the PTX word decodes), "dot_scaled"
        # ones the tl.dot_scaled kernel with a small-M tile. benchmarks/tune_mx_decode.py (H200,
        # 16x14336x4096, best of 3 rounds): MXFP4 32/256 2 warps 30.3 us; MXFP8 64/256 4 warps 39.1 us
        # (not kept: it spills 259 B cross-compiled by Triton 3.9; 8 warps does not), 64/128 split 2
        # 47.1; dot_scaled 64/512 47.5 (MXFP4; dropped: it spills 2.3 KB under Triton 3.6 and 3.9).
        # Every entry compiles for sm_90 without spills.
        "decode_candidates": [
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=2, num_stages=3),
            dict(kernel="decode", BLOCK_N=64, BLOCK_K=256, SPLIT_K=1, num_warps=8, num_stages=3),
            dict(kernel="decode", BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, num_warps=8, num_stages=3),
            dict(kernel="decode", BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=3),
            # the fastest tile with more loads in flight: deeper pipeline, or K split in two (twice the
            # programs: 448 programs of 2 warps leave an SM ~7 warps at 16x14336x4096). Added untimed
            # (no GPU after they were written); BLOCK_N 16 and BLOCK_K 512 spilled 158-2501 B.
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=2, num_stages=5),
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=2, num_warps=2, num_stages=3),
            # few weight rows, long K (the MLP's down projection, 16x4096x14336: 128 tiles of 32 rows): four
            # K splits fill the machine. H100, mx_decode_probe.py: 28.3 us against 35.6 for the split in two
            # (the timed choice before), 56.1 unsplit; bf16 torch.matmul 44.0. With QUAD_SIGNS and ALIGNED_K
            # (GPU-tested among the untried since the eleventh session; K % 32 == 0 always holds) 25.9.
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=4, num_warps=2, num_stages=3),
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=4, num_warps=2, num_stages=3, QUAD_SIGNS=True,
                 ALIGNED_K=True),
        ],
        # Decode variants (_mx_decode_kernel's SPLIT_WORDS, QUAD_SIGNS, ALIGNED_K) never run on a GPU
        # yet: compiled (0 spills, the cross-compile test) and bit-checked by the GPU tests like the
        # candidates, timed by benchmarks/tune_mx_decode.py, but not among the candidates the timed choice
        # picks from until a GPU run shows them right (a wrong kernel must not win by being fast). The
        # fewest SASS instructions in the main loop per decoded fp4 element cross-compiled by Triton 3.6
        # at 16x14336x4096 (5.72 for the first candidate): 32/256 split 4 dots 4.62, 64/256 split 2
        # 4.53, 32/256 unsplit 5.09, 32/256 split 8 (the two-word decode) 4.86 (docs/kernels.md).
        "decode_untried": [
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=2, num_stages=3, SPLIT_WORDS=4,
                 QUAD_SIGNS=True, ALIGNED_K=True),
            dict(kernel="decode", BLOCK_N=64, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=3, SPLIT_WORDS=2,
                 QUAD_SIGNS=True, ALIGNED_K=True),
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=2, num_stages=3, QUAD_SIGNS=True,
                 ALIGNED_K=True),
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=2, num_stages=3, SPLIT_WORDS=8,
                 ALIGNED_K=True),
            # PAIR_STEPS: two K steps an iteration, both steps' scales loaded first (the scale loads stay
            # synchronous; one memory latency a step was exposed). At 2 stages the pair keeps the 3-stage
            # tile's 24.8 KB of shared memory (count_mx_decode.py: 5.60 SASS per fp4 element, 144
            # registers); split in two it doubles the programs at the same occupancy. Paired with
            # SPLIT_WORDS=4 QUAD_SIGNS ALIGNED_K (4.55 a element) it spills 32 B in the compile spec
            # (Triton 3.9), so that one is left to tune_mx_decode.py's sweep.
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=2, num_stages=2, PAIR_STEPS=True),
            dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=2, num_warps=2, num_stages=2, PAIR_STEPS=True),
        ],
    },
    "cpu": {
        # Triton's interpreter decodes a tl.dot_scaled operand through fp16: a bf16 lhs would lose its range
        "bf16_wonly_method": "upcast",
        "dot_scaled": dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=64, GROUP_M=2, num_warps=1, num_stages=1),
        "dot_scaled_fp4": dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=64, GROUP_M=2, num_warps=1, num_stages=1),
        "fp8_blocks": dict(BLOCK_M=16, BLOCK_N=16, GROUP_M=2, num_warps=1, num_stages=1),
        "mxfp8_method": "dot_scaled",
        "decode_candidates": [dict(kernel="decode", BLOCK_N=16, BLOCK_K=64, SPLIT_K=2, num_warps=1, num_stages=1)],
    },
    "default": {
        "dot_scaled": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3),
        "dot_scaled_fp4": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3),
        "fp8_blocks": dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, num_warps=8, num_stages=4),
        "mxfp8_method": "dot_scaled",
        "decode_candidates": [dict(kernel="decode", BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=3)],
    },
}
# gfx942 (MI300) has no scaled MFMA. An MX x MX product goes through "upcast" (both operands decoded
# to bf16, then the bf16 GEMM, as on Hopper): Triton 3.6 cannot lower an MX x MX tl.dot_scaled for
# gfx942 at all ("Unsupported DotScaleOp", measured with the H200 host's 3.6; 3.9 can). bf16 x MX
# keeps dot_scaled (its rhs is upcast in registers to the bf16 MFMA) with gfx950's tiles and the fp4
# K step of 64 (e4m3 x e2m1 at gfx950's BLOCK_K=128 spilled 109 B there under 3.9).
CONFIGS["gfx942"] = {**CONFIGS["gfx950"], "dot_scaled_fp4": dict(CONFIGS["gfx950"]["dot_scaled_fp4"], BLOCK_K=64),
                     "mxfp8_method": "upcast", "mx_pair_method": "upcast"}
DECODE_MAX_M = 64


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------

@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row tiles share their column tiles while in L2."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % group_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows
    return pid_m, pid_n


@triton.jit
def _dot_scaled_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, K,
                       stride_am, stride_ak, stride_bn, stride_bk, stride_sam, stride_sak,
                       stride_sbn, stride_sbk, stride_cm, stride_cn,
                       A_FORMAT: tl.constexpr, B_FORMAT: tl.constexpr, A_SCALED: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr):
    """C = (A * sa) @ (B * sb)^T with A [M, K], B [N, K] stored K-major (e2m1 packed along K)."""
    A_PACK: tl.constexpr = 2 if A_FORMAT == "e2m1" else 1
    B_PACK: tl.constexpr = 2 if B_FORMAT == "e2m1" else 1
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ka = tl.arange(0, BLOCK_K // A_PACK)
    kb = tl.arange(0, BLOCK_K // B_PACK)
    ks = tl.arange(0, BLOCK_K // 32)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + ka[None, :] * stride_ak
    b_ptrs = b_ptr + rn[None, :].to(tl.int64) * stride_bn + kb[:, None] * stride_bk   # [K, N] view
    sa_ptrs = sa_ptr + rm[:, None].to(tl.int64) * stride_sam + ks[None, :] * stride_sak
    sb_ptrs = sb_ptr + rn[:, None].to(tl.int64) * stride_sbn + ks[None, :] * stride_sbk
    A_ZERO: tl.constexpr = 0 if A_FORMAT == "e2m1" else 0.0   # fp8 tensors take a float fill
    B_ZERO: tl.constexpr = 0 if B_FORMAT == "e2m1" else 0.0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_left = K - k0
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (ka[None, :] < k_left // A_PACK), other=A_ZERO)
        b = tl.load(b_ptrs, mask=(rn[None, :] < N) & (kb[:, None] < k_left // B_PACK), other=B_ZERO)
        sb = tl.load(sb_ptrs, mask=(rn[:, None] < N) & (ks[None, :] < k_left // 32), other=127)
        if A_SCALED:
            sa = tl.load(sa_ptrs, mask=(rm[:, None] < M) & (ks[None, :] < k_left // 32), other=127)
            acc = tl.dot_scaled(a, sa, A_FORMAT, b, sb, B_FORMAT, acc)
        else:
            acc = tl.dot_scaled(a, None, A_FORMAT, b, sb, B_FORMAT, acc)
        a_ptrs += (BLOCK_K // A_PACK) * stride_ak
        b_ptrs += (BLOCK_K // B_PACK) * stride_bk
        sa_ptrs += (BLOCK_K // 32) * stride_sak
        sb_ptrs += (BLOCK_K // 32) * stride_sbk
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _e8m0_exp2(code, OFFSET: tl.constexpr):
    """float32 2^(code - 127 + OFFSET) for uint8 E8M0 codes; 255 -> NaN.

    Exact while the exponent stays >= -126; below that (codes < 1 - OFFSET,
    data far under any bf16 activation's reach) it flushes to 0.
    """
    code = code.to(tl.int32)
    biased = code + OFFSET
    value = tl.where(biased > 0, (tl.maximum(biased, 1) << 23).to(tl.float32, bitcast=True), 0.0)
    return tl.where(code == 255, float("nan"), value)


@triton.jit
def _e8m0_bf16_bits(code):
    """int32 E8M0 codes -> the int32 bit pattern of bf16 2^(code - 127): code << 7 (code 0, 2^-127, is
    bf16 zero: flushed), 255 -> NaN."""
    return tl.where(code == 255, 0x7FC0, code << 7)


@triton.jit
def _fp4_bits(code, FP16: tl.constexpr):
    """E2M1 codes (int32, 0..15) -> the int32 bit pattern of the same value in fp16 or bf16.

    A magnitude code m >= 2 is a normal float whose exponent and mantissa bits are m's bits,
    shifted into place and rebiased; m == 1 (0.5, E2M1's one subnormal) is the rebias alone;
    m == 0 is zero. The sign bit moves to bit 15.
    """
    mag = code & 7
    if FP16:
        bits = tl.where(mag >= 2, (mag << 9) + 0x3800, mag * 0x3800)
    else:
        bits = tl.where(mag >= 2, (mag << 6) + 0x3F00, mag * 0x3F00)
    return bits | ((code & 8) << 12)


@triton.jit
def _half_bits_as(bits, ty: tl.constexpr):
    """int32 holding an fp16/bf16 bit pattern -> that value as ``ty``. fp32 is bf16 under the interpreter (it
    hands bf16 tensors to a kernel as fp32 copies): bf16's bits are the upper half of the same fp32 value."""
    if ty == tl.float32:
        value = (bits << 16).to(tl.float32, bitcast=True)
    else:
        value = bits.to(tl.int16).to(ty, bitcast=True)
    return value


# E2M1 -> bf16 for 8 codes (one 32-bit word) at a time, scaled, on NVIDIA (sm_90: mul.bf16x2).
# prmt picks bytes out of two registers by 3-bit selectors, so with the magnitude codes as
# selectors it is an 8-entry table lookup, four codes an instruction: once for the bf16 values'
# high bytes (0x00 3F 3F 3F 40 40 40 40) and once for their low bytes (0x00 00 80 C0 00 40 80 C0).
# Two more prmts interleave them into bf16 pairs; a prmt in sign-replicating mode (selector msb)
# spreads each code's sign bit (bit 3 of the nibble: byte msb of the word shifted left by 4 for
# the even codes, of the word itself for the odd ones) over a byte, masked onto bits 15 and 31.
# QUAD_SIGNS puts the signs on the high-byte lookups instead, before the interleave: one such prmt
# and one lop3 per 4 codes rather than per 2 (14 integer-pipe instructions a word instead of 18).
def _fp4_to_bf16x8_asm(quad_signs: bool = False) -> str:
    """PTX: a 32-bit word of 8 E2M1 codes ($8) times a bf16x2 scale ($9) -> 8 bf16 ($0..$7)."""
    tables = """
{
.reg .b32 m, mh, a4, hl, hh, ll, lh, h0, l0, h1, l1, o, s;
mov.b32 hl, 0x3F3F3F00;
mov.b32 hh, 0x40404040;
mov.b32 ll, 0xC0800000;
mov.b32 lh, 0xC0804000;
and.b32 m, $8, 0x77777777;
shr.u32 mh, m, 16;
shl.b32 a4, $8, 4;
prmt.b32 h0, hl, hh, m;
prmt.b32 l0, ll, lh, m;
prmt.b32 h1, hl, hh, mh;
prmt.b32 l1, ll, lh, mh;
"""
    if quad_signs:   # h0 holds codes 0..3: signs at bits 3, 7 of bytes 0, 1 (bit 3: the msb of a4's byte)
        tables += """prmt.b32 s, a4, $8, 0xD9C8;
lop3.b32 h0, h0, s, 0x80808080, 0xF8;
prmt.b32 s, a4, $8, 0xFBEA;
lop3.b32 h1, h1, s, 0x80808080, 0xF8;
"""
    # per output pair: its low/high byte tables, the interleave selector, the sign-spreading selector
    pairs = [("l0", "h0", "0x5140", "0xC080"), ("l0", "h0", "0x7362", "0xD090"),
             ("l1", "h1", "0x5140", "0xE0A0"), ("l1", "h1", "0x7362", "0xF0B0")]
    signs = "" if quad_signs else """prmt.b32 s, a4, $8, {sign};
lop3.b32 o, o, s, 0x80008000, 0xF8;
"""
    return tables + "".join(f"""prmt.b32 o, {low}, {high}, {interleave};
{signs.format(sign=sign)}mul.rn.bf16x2 o, o, $9;
mov.b32 {{${2 * i}, ${2 * i + 1}}}, o;
""" for i, (low, high, interleave, sign) in enumerate(pairs)) + "}\n"


_FP4_TO_BF16X8_ASM = tl.constexpr(_fp4_to_bf16x8_asm())
_FP4_TO_BF16X8_QUAD_SIGNS_ASM = tl.constexpr(_fp4_to_bf16x8_asm(quad_signs=True))


# The same table decode for two words a, b at once, for dots that take output u of every word
# (_dot_outputs, one dot per u): an MMA register holds two k-neighbours of the operand, here code u of
# words t and t+1, so each output register pairs code u of a (low half) with code u of b (high half),
# ready for the MMA without repacking. prmt first gathers bytes [a.b0, b.b0, a.b1, b.b1] (and bytes
# 2, 3 likewise): a 16-bit selector then looks up codes a_2j, a_2j+1, b_2j, b_2j+1. The signs go onto
# the high-byte lookup before the interleave, one sign-replicating prmt and one lop3 per 4 codes.
def _fp4_pairs_to_bf16x8_asm() -> str:
    """PTX: words $8, $9 of 8 E2M1 codes times their bf16 scales ($10: two bf16) -> 8 bf16x2 ($0..$7),
    output u = (code u of $8, code u of $9)."""
    head = """
{
.reg .b32 hl, hh, ll, lh, p0, p1, q0, q1, m0, m1, t, h, l, s, o;
mov.b32 hl, 0x3F3F3F00;
mov.b32 hh, 0x40404040;
mov.b32 ll, 0xC0800000;
mov.b32 lh, 0xC0804000;
prmt.b32 p0, $8, $9, 0x5140;
prmt.b32 p1, $8, $9, 0x7362;
shl.b32 q0, p0, 4;
shl.b32 q1, p1, 4;
and.b32 m0, p0, 0x77777777;
and.b32 m1, p1, 0x77777777;
"""
    body = ""
    for j in range(4):
        half = "01"[j // 2]
        sel = f"m{half}" if j % 2 == 0 else "t"
        body += (f"shr.u32 t, m{half}, 16;\n" if j % 2 else "") + f"""prmt.b32 h, hl, hh, {sel};
prmt.b32 l, ll, lh, {sel};
prmt.b32 s, q{half}, p{half}, {"0xD9C8" if j % 2 == 0 else "0xFBEA"};
lop3.b32 h, h, s, 0x80808080, 0xF8;
prmt.b32 o, l, h, 0x6240;
mul.rn.bf16x2 ${2 * j}, o, $10;
prmt.b32 o, l, h, 0x7351;
mul.rn.bf16x2 ${2 * j + 1}, o, $10;
"""
    return head + body + "}\n"


_FP4_PAIRS_TO_BF16X8_ASM = tl.constexpr(_fp4_pairs_to_bf16x8_asm())


def _fp8_to_bf16x4_asm(fmt: str) -> str:
    """PTX: a 32-bit word of 4 fp8 codes (``fmt`` e4m3 or e5m2) times a bf16x2 scale -> 4 bf16. The
    hardware's fp8x2 -> f16x2 conversion (exact: every fp8 value is an fp16 one, NaN included), f16 -> f32
    -> bf16x2 (exact again), then one mul.bf16x2 per pair."""
    pairs = []
    for i, half in enumerate(("lo", "hi")):
        pairs.append(f"""cvt.rn.f16x2.{fmt}x2 a, {half};
mov.b32 {{h0, h1}}, a;
cvt.f32.f16 f0, h0;
cvt.f32.f16 f1, h1;
cvt.rn.bf16x2.f32 o, f1, f0;
mul.rn.bf16x2 o, o, $5;
mov.b32 {{${2 * i}, ${2 * i + 1}}}, o;""")
    return "{\n.reg .b16 lo, hi, h0, h1;\n.reg .b32 a, o;\n.reg .f32 f0, f1;\nmov.b32 {lo, hi}, $4;\n" + \
        "\n".join(pairs) + "\n}"


_E4M3_TO_BF16X4_ASM = tl.constexpr(_fp8_to_bf16x4_asm("e4m3"))
_E5M2_TO_BF16X4_ASM = tl.constexpr(_fp8_to_bf16x4_asm("e5m2"))


@triton.jit
def _fp8_words_split(words, scale2, E5M2: tl.constexpr):
    """[R, W] int32 words of 4 fp8 codes (lowest byte first) times their bf16x2 scales -> 4 [R, W] bf16,
    output u holding code u of each word."""
    if E5M2:
        outs = tl.inline_asm_elementwise(_E5M2_TO_BF16X4_ASM, "=h,=h,=h,=h,r,r", [words, scale2],
                                         dtype=(tl.bfloat16,) * 4, is_pure=True, pack=1)
    else:
        outs = tl.inline_asm_elementwise(_E4M3_TO_BF16X4_ASM, "=h,=h,=h,=h,r,r", [words, scale2],
                                         dtype=(tl.bfloat16,) * 4, is_pure=True, pack=1)
    return outs


@triton.jit
def _fp4_words_split(words, scale2, QUAD_SIGNS: tl.constexpr = False):
    """[R, W] int32 words of 8 E2M1 codes (low nibble first) times their bf16x2 scales -> 8 [R, W] bf16,
    output u holding code u of each word."""
    if QUAD_SIGNS:
        outs = tl.inline_asm_elementwise(_FP4_TO_BF16X8_QUAD_SIGNS_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                         [words, scale2], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        outs = tl.inline_asm_elementwise(_FP4_TO_BF16X8_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, scale2],
                                         dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    return outs


@triton.jit
def _fp4_word_pairs_split(words, scale):
    """[R, W] int32 words of 8 E2M1 codes times their bf16 scales -> 8 [R, W] bf16, output u holding
    code u of each word; decoded two words at a time (neighbours in a thread's registers)."""
    return tl.inline_asm_elementwise(_FP4_PAIRS_TO_BF16X8_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r", [words, scale],
                                     dtype=(tl.bfloat16,) * 8, is_pure=True, pack=2)


@triton.jit
def _interleave(outs, FIRST: tl.constexpr, G: tl.constexpr):
    """outs[FIRST..FIRST+G) ([R, W] each, G in 1, 2, 4, 8) -> [R, G*W], element G*t + c = outs[FIRST + c][:, t].

    join(a, b) adds a last axis [a, b], so joining the even outputs' tensor with the odd ones' puts
    output c at the flattened position c (recursively: 2 * (position among the halves) + parity)."""
    if G == 1:
        w = outs[FIRST]
    elif G == 2:
        w = tl.join(outs[FIRST], outs[FIRST + 1])
    elif G == 4:
        w = tl.join(tl.join(outs[FIRST], outs[FIRST + 2]), tl.join(outs[FIRST + 1], outs[FIRST + 3]))
    else:
        w = tl.join(tl.join(tl.join(outs[FIRST], outs[FIRST + 4]), tl.join(outs[FIRST + 2], outs[FIRST + 6])),
                    tl.join(tl.join(outs[FIRST + 1], outs[FIRST + 5]), tl.join(outs[FIRST + 3], outs[FIRST + 7])))
    return tl.reshape(w, (outs[FIRST].shape[0], outs[FIRST].shape[1] * G))


@triton.jit
def _xt(x_ptr, rm, m_ok, stride_xm, kk, k_end):
    """x[rm, kk]^T ([len(kk), BLOCK_M]), zero past k_end and past M."""
    return tl.load(x_ptr + rm[None, :] * stride_xm + kk[:, None], mask=(kk < k_end)[:, None] & m_ok, other=0.0)


@triton.jit
def _split_last(t, N: tl.constexpr):
    """[..., N] (N in 2, 4, 8) -> the N slices [...] along the last axis, in order."""
    if N == 2:
        parts = tl.split(t)
    elif N == 4:   # index 2p + q: split takes q first
        even, odd = tl.split(tl.reshape(t, t.shape[:-1] + (2, 2)))
        e0, e1 = tl.split(even)
        o0, o1 = tl.split(odd)
        parts = (e0, o0, e1, o1)
    else:          # index 4p + 2q + r
        even, odd = tl.split(tl.reshape(t, t.shape[:-1] + (2, 2, 2)))
        e0, e1 = tl.split(even)
        o0, o1 = tl.split(odd)
        x0, x4 = tl.split(e0)
        x2, x6 = tl.split(e1)
        x1, x5 = tl.split(o0)
        x3, x7 = tl.split(o1)
        parts = (x0, x1, x2, x3, x4, x5, x6, x7)
    return parts


@triton.jit
def _xt_groups(x_ptr, rm, m_ok, stride_xm, k0, k_end, W: tl.constexpr, UNIT: tl.constexpr, DOTS: tl.constexpr):
    """x^T for each of _dot_outputs' DOTS dots: [G*W, BLOCK_M] each (G = UNIT / DOTS), row G*t + c of
    dot v at k = k0 + UNIT*t + G*v + c.

    Loaded as one [W, BLOCK_M, UNIT] tile, contiguous along its last axis like x itself (so the copy
    is vectorized and pipelined, as the plain tile's), then split in registers: a stride-UNIT gather
    per dot would be UNIT-times narrower scalar loads that the pipeliner leaves synchronous."""
    G: tl.constexpr = UNIT // DOTS
    t = tl.arange(0, W)
    u = tl.arange(0, UNIT)
    kk = k0 + UNIT * t[:, None, None] + u[None, None, :]
    x3 = tl.load(x_ptr + rm[None, :, None] * stride_xm + kk, mask=(kk < k_end) & m_ok[:, :, None], other=0.0)
    if G == 1:
        xs = _split_last(x3, DOTS)
    else:   # [W, M, DOTS, G] -> [W, G, M, DOTS]: each dot's slice is [W, G, M], rows G*t + c
        x4 = tl.permute(tl.reshape(x3, (W, x3.shape[1], DOTS, G)), (0, 3, 1, 2))
        xs = _split_last(x4, DOTS)
    return xs


@triton.jit
def _dot_outputs(outs, acc, x_ptr, rm, m_ok, stride_xm, k0, k_end, UNIT: tl.constexpr, DOTS: tl.constexpr):
    """acc += the weights ``outs`` times x^T, in DOTS dots.

    outs[u][:, t] is the weight at k = k0 + UNIT*t + u (UNIT outputs per decoded unit: a word, or a
    byte's two nibbles). A dot does not care in which order it sums over K as long as x comes in the
    same order, so each dot takes G = UNIT / DOTS consecutive outputs, interleaved (_interleave; with
    DOTS == 1 back into k order, the plain tile) and x at the matching k (_xt_groups): fewer joins and
    reshapes of the decoded weights, x split instead (a [BLOCK_K, BLOCK_M] tile, smaller than the weights').
    """
    G: tl.constexpr = UNIT // DOTS
    W: tl.constexpr = outs[0].shape[1]
    tl.static_assert(G * W >= 16, "a dot's K is at least 16 (the MMA's): BLOCK_K / SPLIT_WORDS >= 16")
    if DOTS == 1:
        acc = tl.dot(_interleave(outs, 0, G), _xt(x_ptr, rm, m_ok, stride_xm, k0 + tl.arange(0, G * W), k_end), acc)
    else:
        xs = _xt_groups(x_ptr, rm, m_ok, stride_xm, k0, k_end, W, UNIT, DOTS)
        for v in tl.static_range(DOTS):
            acc = tl.dot(_interleave(outs, v * G, G), tl.reshape(xs[v], (G * W, xs[v].shape[-1])), acc)
    return acc


@triton.jit
def _scale_codes(s_ptrs, g, k0, k_end):
    """The E8M0 codes of the scale blocks in [k0, k0 + 32 * len(g)), 0 past k_end."""
    return tl.load(s_ptrs + k0 // 32, mask=(k0 + 32 * g < k_end)[None, :], other=0).to(tl.int32)


@triton.jit
def _decode_step(acc, codes, k0, k_end, x_ptr, rm, m_ok, stride_xm, w_ptrs, w_words, jb, jw,
                 W_FP4: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr,
                 PER_SCALE: tl.constexpr, PER_WORD: tl.constexpr, BYTES: tl.constexpr, UNIT: tl.constexpr,
                 DOTS: tl.constexpr, SCALE_NATIVE: tl.constexpr, ASM_DECODE: tl.constexpr, E5M2: tl.constexpr,
                 QUAD_SIGNS: tl.constexpr, ALIGNED_K: tl.constexpr):
    """acc += the weights of [k0, k0 + BLOCK_K) (decoded with their scale codes) times x there."""
    ZERO: tl.constexpr = 0 if W_FP4 else 0.0                      # fp8 tensors take a float fill
    compute_ty = x_ptr.dtype.element_ty
    if ASM_DECODE:
        if ALIGNED_K:   # the mask in whole scale blocks and k0 % BLOCK_K == 0: 16-byte loads
            k0 = tl.multiple_of(k0, BLOCK_K)
            word_ok = k0 + 32 * (jw // (32 // PER_WORD)) < k_end
        else:
            word_ok = k0 + PER_WORD * jw < k_end
        words = tl.load(w_words + k0 // PER_WORD, mask=word_ok[None, :], other=0)
        s16 = _e8m0_bf16_bits(codes)
        if W_FP4 and DOTS == 8:   # one bf16 scale a word
            s1 = tl.reshape(tl.broadcast_to(s16.to(tl.int16).to(tl.bfloat16, bitcast=True)[:, :, None],
                                            (BLOCK_N, GROUPS, 4)), (BLOCK_N, BLOCK_K // 8))
            outs = _fp4_word_pairs_split(words, s1)
        elif W_FP4:
            s2 = tl.reshape(tl.broadcast_to((s16 | (s16 << 16))[:, :, None], (BLOCK_N, GROUPS, 4)),
                            (BLOCK_N, BLOCK_K // 8))             # one bf16x2 scale a word
            outs = _fp4_words_split(words, s2, QUAD_SIGNS)
        else:
            s2 = tl.reshape(tl.broadcast_to((s16 | (s16 << 16))[:, :, None], (BLOCK_N, GROUPS, 8)),
                            (BLOCK_N, BLOCK_K // 4))
            outs = _fp8_words_split(words, s2, E5M2)
    else:
        if W_FP4:
            raw = tl.load(w_ptrs + k0 // 2, mask=(k0 + 2 * jb < k_end)[None, :], other=ZERO)
        else:
            raw = tl.load(w_ptrs + k0, mask=(k0 + jb < k_end)[None, :], other=ZERO)
        if W_FP4:   # the codes' values, exact in fp16/bf16 (and fp32, the interpreter's stand-in for bf16)
            packed = raw.to(tl.int32)
            lo = _half_bits_as(_fp4_bits(packed & 0xF, compute_ty == tl.float16), compute_ty)
            hi = _half_bits_as(_fp4_bits(packed >> 4, compute_ty == tl.float16), compute_ty)
            outs = (lo, hi)                                # byte j holds k = 2j (lo), 2j + 1 (hi)
        else:
            outs = (raw.to(compute_ty),)                   # fp8 -> fp16/bf16 is exact
        if not SCALE_NATIVE:
            xt = _xt(x_ptr, rm, m_ok, stride_xm, k0 + tl.arange(0, BLOCK_K), k_end)
            w = _interleave(outs, 0, UNIT)
            if compute_ty != tl.float16:   # bf16 off the native path (the interpreter loads it as fp32)
                return _dot_prescaled(w, xt, _e8m0_exp2(codes, 0), acc)
            return _dot_scaled_blocks(w, xt, _e8m0_exp2(codes, 0), acc)   # fp16: the scale after the dot
        code = tl.reshape(tl.broadcast_to(codes[:, :, None], (BLOCK_N, GROUPS, PER_SCALE)), (BLOCK_N, BYTES))
        scale = _e8m0_bf16_bits(code).to(tl.int16).to(compute_ty, bitcast=True)
        if W_FP4:   # bf16 has fp32's exponent range: the products are exact
            outs = (outs[0] * scale, outs[1] * scale)
        else:
            outs = (outs[0] * scale,)
    acc = _dot_outputs(outs, acc, x_ptr, rm, m_ok, stride_xm, k0, k_end, UNIT, DOTS)
    return acc


@triton.jit
def _dot_prescaled(w, xt, scale, acc):
    """acc += (w * scale) @ xt in fp32, the scale ([N, K/32]) on each weight before the dot, as the bf16 path
    applies it: a scaled code is exact in fp32 (bf16's range), and a block's sum of unscaled products, which
    _dot_scaled_blocks forms, can leave fp32's range where the scaled sum does not (x near 2^112, scale 2^-120)."""
    N: tl.constexpr = w.shape[0]
    K: tl.constexpr = w.shape[1]
    expanded = tl.reshape(tl.broadcast_to(scale[:, :, None], (N, K // 32, 32)), (N, K))
    return tl.dot(w.to(tl.float32) * expanded, xt.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def _dot_scaled_blocks(w, xt, scale, acc):
    """acc += sum over the step's 32-element blocks b of scale[:, b] * (w[:, b] @ xt[b]).

    w [N, K] holds the codes' unscaled values and xt [K, M] the activations, K a multiple of 32; scale [N, K/32]
    is fp32. Each block's product is the MMA's fp32 sum of exact products, scaled in fp32: a weight scaled
    before the dot would be rounded to fp16, whose range an E8M0 scale leaves (2^-127 .. 2^127) far behind."""
    N: tl.constexpr = w.shape[0]
    K: tl.constexpr = w.shape[1]
    M: tl.constexpr = xt.shape[1]
    BLOCKS: tl.constexpr = K // 32
    w3 = tl.permute(tl.reshape(w, (N, BLOCKS, 32)), (1, 0, 2))     # [blocks, N, 32]
    x3 = tl.reshape(xt, (BLOCKS, 32, M))                            # [blocks, 32, M]
    part = tl.dot(w3, x3)                                           # [blocks, N, M], fp32
    return acc + tl.sum(part * tl.permute(scale, (1, 0))[:, :, None], axis=0)


@triton.jit
def _mx_decode_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, k_per_split,
                      stride_xm, stride_wn, stride_sn, stride_om, stride_on, stride_split,
                      W_FP4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, SCALE_NATIVE: tl.constexpr, ASM_DECODE: tl.constexpr = False,
                      E5M2: tl.constexpr = False, SPLIT_WORDS: tl.constexpr = 1,
                      QUAD_SIGNS: tl.constexpr = False, ALIGNED_K: tl.constexpr = False,
                      PAIR_STEPS: tl.constexpr = False):
    """out[(split,) M, N] = x[M, K] @ dequant(w[N, K])^T for small M, computed transposed.

    Program (pid_m, pid_n, split) covers BLOCK_M rows of x, BLOCK_N rows of w and K range
    [split*k_per_split, +k_per_split); pid_m varies fastest, so the programs sharing a weight tile
    run together and read it once from memory (the rest from L2).
    The decoded weights are the MMA's left operand ([BLOCK_N, BLOCK_K], as they lie in memory)
    and x^T the right one, so on Hopper the weights go from the load through the decode to the
    tensor cores in registers (wgmma takes A from registers; B, here the few rows of x, comes
    from shared memory). Decodes: ASM_DECODE (NVIDIA sm_90, bf16), 32-bit words of codes through
    inline PTX (FP4: prmt tables; fp8: the fp8x2 conversion); else bit arithmetic (_fp4_bits) or
    Triton's fp8 conversion. The E8M0 scale is applied in the activations' dtype when SCALE_NATIVE
    (bf16 has fp32's exponent range, so the product is exact), else to each 32-element block's fp32
    product after the dot (_dot_scaled_blocks: fp16's range is too narrow for a scaled weight) for fp16, and
    to fp32 weights before an fp32 dot for bf16 in the interpreter (_dot_prescaled).
    SPLIT_WORDS (SCALE_NATIVE): how many dots a step's decoded weights feed (_dot_outputs), at most the
    outputs of one decoded unit (ASM: a word's 8 fp4 / 4 fp8 codes; else a byte's 2 fp4 nibbles, fp8 1): 1 is one
    [BLOCK_N, BLOCK_K] dot in k order; more skip interleaving the decoded values back into k order
    (fp4 ASM at 8: the two-word decode, _fp4_word_pairs_split). QUAD_SIGNS: the fp4 word decode that
    signs four codes at a time (_fp4_to_bf16x8_asm). ALIGNED_K (ASM): tells the compiler what always
    holds, k0 % BLOCK_K == 0 (k_per_split is a multiple of BLOCK_K) and k_end % 32 == 0 (K % 32 == 0),
    with the word mask written per scale block: the word loads become 16-byte copies (else 4-byte ones,
    each with its own predicate).
    PAIR_STEPS: two K steps an iteration, both steps' scale codes loaded first. Triton's pipeliner moves
    the weight and x loads steps ahead through cp.async, but not the scales (a byte a thread is too
    narrow for cp.async), so each step waits a memory latency for its scales before it can decode; paired,
    the second step's wait overlaps the first step's work. (Loading the next step's codes a step ahead
    instead, carried through the loop, made Triton route the decoded weights through shared memory:
    851 SASS instructions a step against 732.)
    """
    BYTES: tl.constexpr = BLOCK_K // 2 if W_FP4 else BLOCK_K     # weight bytes per row per step
    PER_SCALE: tl.constexpr = 16 if W_FP4 else 32                 # bytes sharing one scale
    GROUPS: tl.constexpr = BYTES // PER_SCALE
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_safe = tl.where(rn < N, rn, 0).to(tl.int64)   # rows past N read row 0; never stored
    m_ok = (rm < M)[None, :]
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    jb = tl.arange(0, BYTES)
    g = tl.arange(0, GROUPS)
    PER_WORD: tl.constexpr = 8 if W_FP4 else 4                    # k elements per 32-bit word
    jw = tl.arange(0, BLOCK_K // PER_WORD)
    w_ptrs = w_ptr + rn_safe[:, None] * stride_wn + jb[None, :]
    UNIT: tl.constexpr = PER_WORD if ASM_DECODE else (2 if W_FP4 else 1)   # decoded outputs a unit
    DOTS: tl.constexpr = SPLIT_WORDS if SPLIT_WORDS < UNIT else UNIT
    # ASM_DECODE reads the weights as 32-bit words (K % 32 == 0, so rows stay word-aligned)
    w_words = w_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + rn_safe[:, None] * (stride_wn // 4) + jw[None, :]
    s_ptrs = s_ptr + rn_safe[:, None] * stride_sn + g[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K * (1 + PAIR_STEPS)):
        codes = _scale_codes(s_ptrs, g, k0, k_end)
        if PAIR_STEPS:
            codes1 = _scale_codes(s_ptrs, g, k0 + BLOCK_K, k_end)
        acc = _decode_step(acc, codes, k0, k_end, x_ptr, rm, m_ok, stride_xm, w_ptrs, w_words, jb, jw,
                           W_FP4, BLOCK_N, BLOCK_K, GROUPS, PER_SCALE, PER_WORD, BYTES, UNIT, DOTS, SCALE_NATIVE,
                           ASM_DECODE, E5M2, QUAD_SIGNS, ALIGNED_K)
        if PAIR_STEPS:
            acc = _decode_step(acc, codes1, k0 + BLOCK_K, k_end, x_ptr, rm, m_ok, stride_xm, w_ptrs, w_words, jb,
                               jw, W_FP4, BLOCK_N, BLOCK_K, GROUPS, PER_SCALE, PER_WORD, BYTES, UNIT, DOTS,
                               SCALE_NATIVE, ASM_DECODE, E5M2, QUAD_SIGNS, ALIGNED_K)
    out_ptrs = out_ptr + split * stride_split + rm[None, :] * stride_om + rn[:, None] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok & (rn < N)[:, None])


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        total += tl.load(part_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fp8_blocks_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, K,
                       stride_am, stride_bn, stride_sam, stride_sbn, stride_cm, stride_cn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """MXFP8 x MXFP8 on fp8 tensor cores: one K=32 MMA per scale block, scaled in fp32.

    A [M, K] and B [N, K] are fp8, contiguous along K (K % 32 == 0);
    sa [M, K/32], sb [N, K/32] contiguous along K/32.
    """
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows past M/N read row 0 again (in bounds); their results are never stored.
    rm_safe = tl.where(rm < M, rm, 0).to(tl.int64)
    rn_safe = tl.where(rn < N, rn, 0).to(tl.int64)
    kk = tl.arange(0, 32)
    a_ptrs = a_ptr + rm_safe[:, None] * stride_am + kk[None, :]
    b_ptrs = b_ptr + rn_safe[:, None] * stride_bn + kk[None, :]
    sa_ptrs = sa_ptr + rm_safe * stride_sam
    sb_ptrs = sb_ptr + rn_safe * stride_sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, K // 32):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        sa = _e8m0_exp2(tl.load(sa_ptrs), 0)
        sb = _e8m0_exp2(tl.load(sb_ptrs), 0)
        partial = tl.dot(a, tl.trans(b))
        acc += (partial * sa[:, None]) * sb[None, :]
        a_ptrs += 32
        b_ptrs += 32
        sa_ptrs += 1
        sb_ptrs += 1
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


# ----------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------

def _infer_format(t: torch.Tensor, given, name: str) -> str:
    """The element format of operand ``name``: given, or read off its dtype."""
    if given is not None:
        if str(given).lower() in _PLAIN_FORMATS:
            return str(given).lower()
        try:
            return mx_format(given).name
        except ValueError:
            raise ValueError(f"{name}_format: unknown format {given!r}; use e4m3, e5m2, e2m1 (mxfp4), "
                             f"bf16 or fp16") from None
    by_dtype = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2", torch.uint8: "e2m1",
                torch.bfloat16: "bf16", torch.float16: "fp16"}
    fp4_x2 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4_x2 is not None:
        by_dtype[fp4_x2] = "e2m1"
    if t.dtype not in by_dtype:
        raise TypeError(f"{name}: dtype {t.dtype} is not an MX element type (float8_e4m3fn, float8_e5m2, "
                        f"uint8-packed e2m1) nor bf16/fp16")
    return by_dtype[t.dtype]


def _check_operand_dtype(t: torch.Tensor, fmt: str, name: str) -> None:
    allowed = {"e4m3": (torch.float8_e4m3fn, torch.uint8), "e5m2": (torch.float8_e5m2, torch.uint8),
               "e2m1": (torch.uint8, getattr(torch, "float4_e2m1fn_x2", torch.uint8)),
               "bf16": (torch.bfloat16,), "fp16": (torch.float16,)}[fmt]
    if t.dtype not in allowed:
        raise TypeError(f"{name}: format {fmt} needs dtype in {[str(d) for d in allowed]}, got {t.dtype}")


def _check_scales(scales, data: torch.Tensor, fmt: str, k: int, name: str):
    """Scales as uint8 [..., rows, K/32], or None for bf16/fp16 data."""
    if fmt in _PLAIN_FORMATS:
        if scales is not None:
            raise ValueError(f"{name}: must be None for an unscaled {fmt} operand")
        return None
    if scales is None:
        raise ValueError(f"{name}: required for the MX operand (format {fmt})")
    codes = scales_as_uint8(scales, name)
    expected = tuple(data.shape[:-1]) + (k // BLOCK_SIZE,)
    if tuple(codes.shape) != expected:
        raise ValueError(f"{name}: expected shape {expected} (one E8M0 scale per 32 elements along K), "
                         f"got {tuple(codes.shape)}")
    if codes.device != data.device:
        raise ValueError(f"{name}: on {codes.device}, its data on {data.device}")
    return codes


def _logical_k(t: torch.Tensor, fmt: str) -> int:
    return t.shape[-1] * (2 if fmt == "e2m1" else 1)


# ----------------------------------------------------------------------------
# Launch functions
# ----------------------------------------------------------------------------

def scaled_matmul(lhs: torch.Tensor, rhs: torch.Tensor, lhs_scales, rhs_scales,
                  preferred_element_type: torch.dtype = torch.bfloat16, lhs_format=None, rhs_format=None,
                  block_size: int = 32, method=None) -> torch.Tensor:
    """(lhs * lhs_scales) @ (rhs * rhs_scales)^T, both operands K-major (jax.nn.scaled_matmul's layout).

    lhs: [M, K] e4m3/e5m2 (float8 or uint8 codes), [M, K/2] uint8 e2m1, or [M, K] bf16/fp16
    with ``lhs_scales=None``. rhs: [N, K] / [N, K/2], an MX format. Scales: E8M0 uint8
    (or float8_e8m0fnu) [M, K/32] and [N, K/32]. A leading batch dim on both is allowed.
    Formats default from the dtypes (uint8 means e2m1). Returns [M, N] (or [B, M, N])
    in ``preferred_element_type``. ``method``: None (per arch and shape), 'dot_scaled',
    'decode', 'fp8_blocks' or 'upcast' (on the CPU, whose interpreter decodes a tl.dot_scaled operand
    through fp16, a bf16 lhs takes 'decode' or 'upcast': 'dot_scaled' is refused there).
    """
    key = _decode_call_key(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type, lhs_format, rhs_format,
                           block_size, method)
    if key is not None:
        fast = _FAST_DECODES.get(key)
        if fast is not None:
            return fast(lhs, rhs, rhs_scales)
    if block_size != BLOCK_SIZE:
        raise ValueError(f"block_size: OCP MX v1.0 blocks are {BLOCK_SIZE} elements; got {block_size}")
    for name, t in (("lhs", lhs), ("rhs", rhs)):
        if not isinstance(t, torch.Tensor) or t.ndim not in (2, 3):
            raise ValueError(f"{name}: expected a 2-D [rows, K] or 3-D [B, rows, K] tensor, "
                             f"got {getattr(t, 'shape', type(t).__name__)}")
    if lhs.ndim != rhs.ndim or (lhs.ndim == 3 and lhs.shape[0] != rhs.shape[0]):
        raise ValueError(f"lhs, rhs: batch dims differ: {tuple(lhs.shape)} vs {tuple(rhs.shape)}")
    if lhs.device != rhs.device:
        raise ValueError(f"rhs: on {rhs.device}, lhs on {lhs.device}")
    check_kernel_device(lhs, "lhs")
    a_fmt = _infer_format(lhs, lhs_format, "lhs")
    b_fmt = _infer_format(rhs, rhs_format, "rhs")
    _check_operand_dtype(lhs, a_fmt, "lhs")
    _check_operand_dtype(rhs, b_fmt, "rhs")
    if b_fmt not in _MX_FORMATS:
        raise ValueError(f"rhs_format: rhs must be an MX operand (e4m3, e5m2, e2m1), got {b_fmt}")
    k = _logical_k(lhs, a_fmt)
    if _logical_k(rhs, b_fmt) != k:
        raise ValueError(f"rhs: K differs: lhs {tuple(lhs.shape)} ({a_fmt}) has K={k}, "
                         f"rhs {tuple(rhs.shape)} ({b_fmt}) has K={_logical_k(rhs, b_fmt)}")
    if k % BLOCK_SIZE:
        raise ValueError(f"lhs: K={k} is not a multiple of {BLOCK_SIZE}")
    sa = _check_scales(lhs_scales, lhs, a_fmt, k, "lhs_scales")
    sb = _check_scales(rhs_scales, rhs, b_fmt, k, "rhs_scales")
    if preferred_element_type not in _OUT_DTYPES:
        raise ValueError(f"preferred_element_type: one of {_OUT_DTYPES}, got {preferred_element_type}")
    _check_method(method, lhs.shape[-2], a_fmt, b_fmt, lhs.device)
    if lhs.ndim == 3 and lhs.shape[0] == 0:
        return empty((0, lhs.shape[1], rhs.shape[1]), preferred_element_type, lhs.device)
    if lhs.ndim == 3:
        return torch.stack([
            _scaled_matmul_2d(lhs[i], rhs[i], None if sa is None else sa[i], sb[i], a_fmt, b_fmt,
                              preferred_element_type, method) for i in range(lhs.shape[0])])
    if key is None:
        return _scaled_matmul_2d(lhs, rhs, sa, sb, a_fmt, b_fmt, preferred_element_type, method)
    recorded = []
    token = _DECODES_RECORDED.set(recorded)
    try:
        out = _scaled_matmul_2d(lhs, rhs, sa, sb, a_fmt, b_fmt, preferred_element_type, method)
    finally:
        _DECODES_RECORDED.reset(token)
    _remember_decode(key, recorded, lhs, rhs, rhs_scales, out)
    return out


# ---- a decode loop's steady state: one call signature, one prepared launch --------------------------------------
# A weight-only decode call is host-bound in a loop (the kernel takes ~30 us). Everything its checks and choices
# decide follows from the call's signature (shapes, strides, dtypes, 16-byte alignment, devices, formats, method,
# output dtype), so once a signature has run one decode launch, its later calls allocate the output and launch
# that prepared decode (_DecodeLaunch) directly.
_FAST_DECODES: dict = launch_cache()   # call signature -> _FastDecode
_DECODES_RECORDED = contextvars.ContextVar("flyarray_decodes_recorded", default=None)


def _decode_call_key(lhs, rhs, lhs_scales, rhs_scales, out_dtype, lhs_format, rhs_format, block_size, method):
    """The signature of a call the fast path may take (plain tensors, no lhs scales: bf16/fp16 x MX), else None."""
    if (lhs_scales is not None or type(lhs) is not torch.Tensor or type(rhs) is not torch.Tensor
            or type(rhs_scales) is not torch.Tensor or not (lhs.is_cuda or _PREPARED_ON_CPU) or is_warming_up()):
        return None
    return (lhs.shape, lhs.stride(), lhs.dtype, lhs.data_ptr() & 15, lhs.device, rhs.shape, rhs.stride(), rhs.dtype,
            rhs.data_ptr() & 15, rhs.device, rhs_scales.shape, rhs_scales.stride(), rhs_scales.dtype,
            rhs_scales.data_ptr() & 15, rhs_scales.device, out_dtype, lhs_format, rhs_format, block_size, method)


class _FastDecode:
    """A checked call signature's one decode launch: the output allocated, the operands viewed as the launch
    takes them (the checks and the contiguity they found hold for every call with this signature)."""
    __slots__ = ("prepared", "w_fmt", "out_shape", "out_dtype")

    def __init__(self, prepared, w_fmt, out):
        self.prepared, self.w_fmt, self.out_shape, self.out_dtype = prepared, w_fmt, tuple(out.shape), out.dtype

    def __call__(self, lhs, rhs, rhs_scales):
        out = empty(self.out_shape, self.out_dtype, lhs.device)
        return self.prepared(lhs, _as_triton_operand(rhs, self.w_fmt), rhs_scales.view(torch.uint8), out, fixed=True)


def _remember_decode(key, recorded, lhs, rhs, rhs_scales, out) -> None:
    """Keep the one decode launch a checked call made, when it read the caller's tensors as they are
    (contiguous: no copies) and was a real launch (not a dry run, not the timed choice's many, not a capture)."""
    if len(recorded) != 1 or is_warming_up() or (lhs.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    if not (lhs.is_contiguous() and rhs.is_contiguous() and rhs_scales.is_contiguous()):
        return
    if len(_FAST_DECODES) >= 1024:
        _FAST_DECODES.clear()
    prepared, w_fmt = recorded[0]
    _FAST_DECODES[key] = _FastDecode(prepared, w_fmt, out)


METHODS = ("dot_scaled", "decode", "fp8_blocks", "upcast")


def _check_method(method, m: int, a_fmt: str, b_fmt: str, device: torch.device) -> None:
    """``method`` (None: chosen per arch and shape) fits the operands: checked before any work, empty
    problems included."""
    if method is None:
        return
    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}; use None, 'dot_scaled', 'decode', 'fp8_blocks' or 'upcast'")
    if method == "upcast" and a_fmt == "fp16":
        raise ValueError("method: 'upcast' decodes the operands to bf16; it needs an MX or bf16 lhs "
                         "(fp16 lhs: use 'decode' or 'dot_scaled')")
    if method == "decode" and (a_fmt not in _PLAIN_FORMATS or m > DECODE_MAX_M):
        raise ValueError(f"method: 'decode' needs bf16/fp16 lhs with M <= {DECODE_MAX_M}")
    if method == "fp8_blocks" and (a_fmt not in ("e4m3", "e5m2") or b_fmt not in ("e4m3", "e5m2")):
        raise ValueError("method: 'fp8_blocks' needs MXFP8 (e4m3/e5m2) lhs and rhs")
    if method == "dot_scaled" and a_fmt == "bf16" and device.type == "cpu":
        # Triton's interpreter decodes a tl.dot_scaled operand through fp16: bf16 values past fp16's range
        # would come out inf/NaN, small ones flushed
        raise ValueError("method: 'dot_scaled' with a bf16 lhs does not run exactly on the CPU (Triton's "
                         "interpreter decodes it through fp16); use None, 'decode' (M <= 64) or 'upcast'")


def _pick_method(m: int, a_fmt: str, b_fmt: str, cfg: dict) -> str:
    if a_fmt in _PLAIN_FORMATS and m <= DECODE_MAX_M:
        return "decode"
    if a_fmt in ("e4m3", "e5m2") and b_fmt in ("e4m3", "e5m2"):
        return cfg["mxfp8_method"]
    if a_fmt not in _PLAIN_FORMATS:
        return cfg.get("mx_pair_method", "dot_scaled")
    return cfg.get("bf16_wonly_method", "dot_scaled") if a_fmt == "bf16" else "dot_scaled"


def _scaled_matmul_2d(a, b, sa, sb, a_fmt, b_fmt, out_dtype, method):
    m, n = a.shape[0], b.shape[0]
    cfg = pick_config(CONFIGS, current_arch(a.device))
    mixed = method is None  # auto: the tuners may also pick other kernels' configs
    if method is None:
        method = _pick_method(m, a_fmt, b_fmt, cfg)
    out = empty((m, n), out_dtype, a.device)
    if m == 0 or n == 0:
        return out
    if a.shape[1] == 0:
        return out.zero_()
    if method == "decode":
        return _decode(a, b, sb, a_fmt, b_fmt, out, cfg, mixed)
    if method == "fp8_blocks":
        return _fp8_blocks(a, b, sa, sb, a_fmt, b_fmt, out, cfg, mixed)
    if method == "upcast":
        return _upcast(a, b, sa, sb, a_fmt, b_fmt, out)
    if mixed and a_fmt != "fp16" and len(cfg.get("mx_candidates", ())) > 1 and a.device.type == "cuda":
        return _timed_mx(a, b, sa, sb, a_fmt, b_fmt, out, cfg)
    return _dot_scaled(a, b, sa, sb, a_fmt, b_fmt, out, cfg)


def _as_triton_operand(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """What the kernel loads: fp8 as its float8 dtype (so Triton sees the type), e2m1 as bytes."""
    if fmt == "e4m3":
        return t.view(torch.float8_e4m3fn)
    if fmt == "e5m2":
        return t.view(torch.float8_e5m2)
    if fmt == "e2m1":
        return t.view(torch.uint8)
    return t


def _dot_scaled_tile(cfg: dict, a_fmt: str, b_fmt: str) -> dict:
    if a_fmt in _PLAIN_FORMATS and "dot_scaled_wonly" in cfg:
        return cfg["dot_scaled_wonly"]
    return cfg["dot_scaled_fp4" if "e2m1" in (a_fmt, b_fmt) else "dot_scaled"]


def _dot_scaled(a, b, sa, sb, a_fmt, b_fmt, out, cfg, tile=None):
    m, n, k = a.shape[0], b.shape[0], _logical_k(a, a_fmt)
    tile = tile or _dot_scaled_tile(cfg, a_fmt, b_fmt)
    a_op, b_op = _as_triton_operand(a, a_fmt), _as_triton_operand(b, b_fmt)
    sa_op = sa if sa is not None else sb  # a placeholder pointer when lhs is unscaled
    grid = (cdiv(m, tile["BLOCK_M"]) * cdiv(n, tile["BLOCK_N"]),)
    launch(_dot_scaled_kernel, a.device, grid,
           a_op, b_op, sa_op, sb, out, m, n, k,
           a_op.stride(0), a_op.stride(1), b_op.stride(0), b_op.stride(1),
           sa_op.stride(0), sa_op.stride(1), sb.stride(0), sb.stride(1), out.stride(0), out.stride(1),
           A_FORMAT=a_fmt, B_FORMAT=b_fmt, A_SCALED=sa is not None,
           BLOCK_M=tile["BLOCK_M"], BLOCK_N=tile["BLOCK_N"], BLOCK_K=tile["BLOCK_K"], GROUP_M=tile["GROUP_M"],
           num_warps=tile["num_warps"], num_stages=tile["num_stages"],
           **amd_launch_options(tile, current_arch(a.device)))
    return out


_FP8_BLOCKS_CHOICE: dict = {}
_MX_CHOICE: dict = {}


def _own_kernel_only(candidates: list, kernel: str) -> list:
    return [c for c in candidates if c.get("kernel", kernel) == kernel]


def _timed_choice(table: dict, key, candidates: list, run):
    """The fastest of ``candidates`` for ``key``, timed on the device the first time only."""
    if key not in table:
        table[key] = _fastest(candidates, run)
    return table[key]


def _shape_key(a, b, a_fmt, b_fmt, out, mixed=True) -> tuple:
    return (current_arch(a.device), a.shape[0], b.shape[0], a.shape[1], a_fmt, b_fmt, out.dtype, mixed)


def _fp8_blocks(a, b, sa, sb, a_fmt, b_fmt, out, cfg, mixed=True):
    a_op = _as_triton_operand(a, a_fmt).contiguous()
    b_op = _as_triton_operand(b, b_fmt).contiguous()
    sa, sb = sa.contiguous(), sb.contiguous()

    def run(tile):
        if tile.get("kernel") == "dot_scaled":
            return _dot_scaled(a, b, sa, sb, a_fmt, b_fmt, out, cfg, tile)
        if tile.get("kernel") == "upcast":
            return _upcast(a, b, sa, sb, a_fmt, b_fmt, out)
        return _fp8_blocks_launch(a_op, b_op, sa, sb, out, tile)
    candidates = cfg.get("fp8_blocks_candidates", [])
    if not mixed:
        candidates = _own_kernel_only(candidates, "fp8_blocks")
    if a.device.type == "cuda" and len(candidates) > 1:
        key = _shape_key(a, b, a_fmt, b_fmt, out, mixed)
        return run(_timed_choice(_FP8_BLOCKS_CHOICE, key, candidates, run))
    return run(candidates[0] if candidates else cfg["fp8_blocks"])


def _timed_mx(a, b, sa, sb, a_fmt, b_fmt, out, cfg):
    """dot_scaled (the table's tile) or upcast, whichever ran faster for this shape."""
    def run(c):
        if c["kernel"] == "upcast":
            return _upcast(a, b, sa, sb, a_fmt, b_fmt, out)
        return _dot_scaled(a, b, sa, sb, a_fmt, b_fmt, out, cfg, c.get("tile"))
    key = _shape_key(a, b, a_fmt, b_fmt, out)
    return run(_timed_choice(_MX_CHOICE, key, cfg["mx_candidates"], run))


def _upcast(a, b, sa, sb, a_fmt, b_fmt, out):
    """Each MX operand decoded to bf16 in memory, then flyarray's bf16 GEMM (rhs read K-major).

    Exact up to the GEMM's fp32 accumulation: an MX element times its E8M0 power of two has at
    most 4 significant bits and stays in bf16's (float32's) exponent range, except results under
    2^-126, which round to bf16 subnormals. The GEMM writes ``out``.
    On the CPU the decoded operands are float32: Triton's interpreter has no bf16 arithmetic.
    """
    from flyarray.kernels import gemm
    wide = torch.float32 if a.device.type == "cpu" else torch.bfloat16
    a_wide = a.to(wide) if a_fmt in _PLAIN_FORMATS else mx_dequantize(a, sa, a_fmt, dtype=wide)
    b_wide = mx_dequantize(b, sb, b_fmt, dtype=wide)
    return gemm.matmul(a_wide, b_wide.t(), out=out)


def _fp8_blocks_launch(a_op, b_op, sa, sb, out, tile):
    m, n, k = a_op.shape[0], b_op.shape[0], a_op.shape[1]
    grid = (cdiv(m, tile["BLOCK_M"]) * cdiv(n, tile["BLOCK_N"]),)
    launch(_fp8_blocks_kernel, a_op.device, grid,
           a_op, b_op, sa, sb, out, m, n, k,
           a_op.stride(0), b_op.stride(0), sa.stride(0), sb.stride(0), out.stride(0), out.stride(1),
           BLOCK_M=tile["BLOCK_M"], BLOCK_N=tile["BLOCK_N"], GROUP_M=tile["GROUP_M"],
           num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    return out


_DECODE_CHOICE: dict = {}


def _decode(x, w, sw, x_fmt, w_fmt, out, cfg, mixed=True):
    """Small-M activations x MX weights: the fastest candidate for this shape (timed once on a GPU)."""
    x = x.contiguous()
    w = w.contiguous()
    sw = sw.contiguous()
    candidates = cfg["decode_candidates"]
    if not mixed:
        candidates = _own_kernel_only(candidates, "decode") or [
            dict(kernel="decode", BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=3)]
    run = lambda c: _decode_candidate(x, w, sw, x_fmt, w_fmt, out, cfg, c)
    if x.device.type == "cuda" and len(candidates) > 1:
        key = (current_arch(x.device), next_pow2(x.shape[0]), w.shape[0], x.shape[1], w_fmt, x.dtype, out.dtype,
               mixed)
        if key not in _DECODE_CHOICE:
            k = x.shape[1]
            _DECODE_CHOICE[key] = _fastest(candidates, run, launches=lambda c: 1 + _decode_splits(c, k))
        return run(_DECODE_CHOICE[key])
    return run(candidates[0])


def _decode_candidate(x, w, sw, x_fmt, w_fmt, out, cfg, c):
    if c["kernel"] == "dot_scaled":
        tile = dict(c, BLOCK_M=max(16, next_pow2(x.shape[0])))
        return _dot_scaled(x, w, None, sw, x_fmt, w_fmt, out, cfg, tile)
    return _decode_launch(x, _as_triton_operand(w, w_fmt), sw, w_fmt, out, c)


def tuning_choices() -> dict:
    """Configs chosen so far by on-device timing, keyed by 'kernel shape...': for reports and logs."""
    named = [("decode", _DECODE_CHOICE), ("fp8_blocks", _FP8_BLOCKS_CHOICE), ("mx", _MX_CHOICE)]
    return {f"{name} {' '.join(map(str, key))}": dict(choice) for name, table in named for key, choice in table.items()}


def _decode_splits(c: dict, k: int) -> bool:
    """Whether decode config ``c`` splits a K of ``k`` (and so launches a second kernel to add the splits)."""
    return c["kernel"] == "decode" and c["SPLIT_K"] > 1 and k > c["BLOCK_K"]


# How much faster a candidate that launches one more kernel must be to win a timed choice. do_bench hides the
# host behind its L2 flush, but a loop of small calls is host-bound: each launch costs it ~10 us of host time
# (the H100 host), more than a few percent of a 30 us kernel (MXFP4 decode 16x14336x4096: one kernel 27.1 us,
# four K splits and their sum 27.6, bench mx_decode_probe.py).
EXTRA_LAUNCH_MARGIN = 0.05


def _fastest(candidates, run, launches=None):
    """The candidate config whose ``run`` is fastest (Triton's do_bench), skipping ones that fail; with
    ``launches`` (config -> kernels it launches), each launch past the fewest any candidate makes must buy
    EXTRA_LAUNCH_MARGIN of the time.

    Every candidate is compiled and run once before any is timed, and the timing takes the best of two
    interleaved rounds: an idle GPU ramps its clock up during the first milliseconds of work, which
    made whichever candidate came last look fastest. The choice is cached per shape by the caller,
    so each shape pays this once.
    """
    import triton.testing
    runnable = []
    for c in candidates:
        try:
            run(c)
            runnable.append(c)
        except Exception:  # a config that does not fit this GPU is simply not chosen
            continue
    if not runnable:
        raise RuntimeError("scaled_matmul: no candidate config ran on this device")
    best_ms = [float("inf")] * len(runnable)
    for _ in range(2):
        for i, c in enumerate(runnable):
            ms = triton.testing.do_bench(lambda: run(c), warmup=5, rep=25, return_mode="median")
            best_ms[i] = min(best_ms[i], ms)
    if launches is not None:
        counts = [launches(c) for c in runnable]
        best_ms = [ms * (1 + EXTRA_LAUNCH_MARGIN * (n - min(counts))) for ms, n in zip(best_ms, counts)]
    return runnable[best_ms.index(min(best_ms))]


def _has_bf16x2_ptx(device: torch.device) -> bool:
    """NVIDIA sm_90 or newer: the decode's inline PTX (mul.bf16x2) runs there; elsewhere (AMD, the
    interpreter) the decode is plain Triton arithmetic."""
    arch = current_arch(device)
    return arch.startswith("sm_") and arch[3:].isdigit() and int(arch[3:]) >= 90


# Rows of x per decode program: the MMA's smallest N; more rows take more programs (larger tiles spill
# the register-resident decoded weights, and M <= 16 is the decode case that matters).
_DECODE_BLOCK_M = 16


_DECODE_LAUNCHES: dict = launch_cache()   # call signature -> _DecodeLaunch
_PREPARED_ON_CPU = False   # tests turn it on: the interpreter then takes the prepared path too


class _DecodeLaunch:
    """One decode signature's launches, worked out once: the K split, the grid, the integer arguments and the
    constexprs. On a GPU they go through FixedLaunch (the compiled kernels' launchers directly, no per-call
    specialization key): a loop of decode calls is host-bound (bench --suite mx, H100 host: ~70 us a call
    back to back against ~30 us of kernel). Dry runs and the interpreter launch through ``launch``."""

    def __init__(self, x, w, sw, w_fmt, out, c):
        m, k = x.shape
        n = w.shape[0]
        block_k = c["BLOCK_K"]
        split_k = max(1, min(c["SPLIT_K"], cdiv(k, block_k)))
        k_per_split = cdiv(cdiv(k, split_k), block_k) * block_k
        self.split_k = cdiv(k, k_per_split)
        self.device = x.device
        self.grid = (cdiv(m, _DECODE_BLOCK_M), cdiv(n, c["BLOCK_N"]), self.split_k)
        self.partials = (self.split_k, m, n)
        self.ints = (m, n, k, k_per_split, x.stride(0), w.stride(0), sw.stride(0))
        # bf16 scale products on a GPU (Triton's interpreter multiplies bf16 by bf16 to 0)
        native = x.dtype == torch.bfloat16 and x.device.type != "cpu" and c.get("SCALE_NATIVE", True)
        asm = native and c.get("ASM_DECODE", True) and _has_bf16x2_ptx(x.device)
        self.kwargs = dict(W_FP4=w_fmt == "e2m1", BLOCK_M=_DECODE_BLOCK_M, BLOCK_N=c["BLOCK_N"], BLOCK_K=block_k,
                           SCALE_NATIVE=native, ASM_DECODE=asm, E5M2=w_fmt == "e5m2",
                           SPLIT_WORDS=c.get("SPLIT_WORDS", 1), QUAD_SIGNS=c.get("QUAD_SIGNS", False),
                           ALIGNED_K=c.get("ALIGNED_K", False), PAIR_STEPS=c.get("PAIR_STEPS", False),
                           num_warps=c["num_warps"], num_stages=c["num_stages"])
        self.sum_grid = (cdiv(m * n, 1024),)
        self.sum_kwargs = dict(SPLIT_K=self.split_k, BLOCK=1024, num_warps=4)
        self.fixed = None

    def __call__(self, x, w, sw, out, fixed: bool):
        split = self.split_k > 1
        target = empty(self.partials, torch.float32, self.device) if split else out
        args = (x, w, sw, target, *self.ints, target.stride(-2), target.stride(-1), target.stride(0) if split else 0)
        sum_args = (target, out, self.partials[1] * self.partials[2])
        if not fixed:
            launch(_mx_decode_kernel, self.device, self.grid, *args, **self.kwargs)
            if split:
                launch(_sum_splits_kernel, self.device, self.sum_grid, *sum_args, **self.sum_kwargs)
            return out
        if self.fixed is None:
            self.fixed = (FixedLaunch(_mx_decode_kernel, self.device, self.grid, self.kwargs),
                          FixedLaunch(_sum_splits_kernel, self.device, self.sum_grid, self.sum_kwargs) if split else None)
        decode, total = self.fixed
        decode(*args)
        if split:
            total(*sum_args)
        return out


def _decode_launch(x, w, sw, w_fmt, out, c):
    """Launch config ``c`` of the decode kernel (and the K splits' sum), prepared once per signature: shapes,
    strides, dtypes and 16-byte alignment (all Triton specializes on), the device, the format and ``c``."""
    key = (x.shape, x.stride(), x.dtype, x.data_ptr() & 15, w.shape, w.stride(), w.dtype, w.data_ptr() & 15,
           sw.shape, sw.stride(), sw.data_ptr() & 15, out.shape, out.stride(), out.dtype, out.data_ptr() & 15,
           x.device, w_fmt, tuple(c.items()))
    prepared = _DECODE_LAUNCHES.get(key)
    if prepared is None:
        if len(_DECODE_LAUNCHES) >= 1024:
            _DECODE_LAUNCHES.clear()
        prepared = _DECODE_LAUNCHES[key] = _DecodeLaunch(x, w, sw, w_fmt, out, c)
    recorded = _DECODES_RECORDED.get()
    if recorded is not None:
        recorded.append((prepared, w_fmt))
    return prepared(x, w, sw, out, fixed=(x.is_cuda or _PREPARED_ON_CPU) and not is_warming_up())


def reference_scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, lhs_format=None, rhs_format=None) -> torch.Tensor:
    """float64 (lhs * lhs_scales) @ (rhs * rhs_scales)^T through the numpy spec decode (the oracle)."""
    from flyarray.kernels.mx import reference_mx_dequantize
    a_fmt = _infer_format(lhs, lhs_format, "lhs")
    b_fmt = _infer_format(rhs, rhs_format, "rhs")
    a = lhs.double() if a_fmt in _PLAIN_FORMATS else reference_mx_dequantize(lhs, lhs_scales, a_fmt)
    b = reference_mx_dequantize(rhs, rhs_scales, b_fmt)
    return a @ b.transpose(-1, -2)


_POINTER_TYPES = {"e4m3": "*fp8e4nv", "e5m2": "*fp8e5", "e2m1": "*u8", "bf16": "*bf16", "fp16": "*fp16"}


def _dot_scaled_spec(arch: str, a_fmt: str, b_fmt: str, tile=None, tag: str = ""):
    from flyarray.targets import KernelSpec
    tile = dict(tile or _dot_scaled_tile(pick_config(CONFIGS, arch), a_fmt, b_fmt))
    tile.pop("kernel", None)
    launch_opts = {"num_warps": tile.pop("num_warps"), "num_stages": tile.pop("num_stages"),
                   "amd_options": {k: tile.pop(k) for k in AMD_OPTIONS if k in tile}}
    unit = ("stride_ak", "stride_bk", "stride_sak", "stride_sbk", "stride_cn")  # Triton specializes 1s
    ints = ("M", "N", "K", "stride_am", "stride_bn", "stride_sam", "stride_sbn", "stride_cm")
    signature = {"a_ptr": _POINTER_TYPES[a_fmt], "b_ptr": _POINTER_TYPES[b_fmt], "sa_ptr": "*u8",
                 "sb_ptr": "*u8", "c_ptr": "*bf16", **{k: "i32" for k in ints},
                 **{k: "constexpr" for k in unit},
                 **{k: "constexpr" for k in ("A_FORMAT", "B_FORMAT", "A_SCALED", *tile)}}
    constexprs = {**{k: 1 for k in unit}, "A_FORMAT": a_fmt, "B_FORMAT": b_fmt,
                  "A_SCALED": a_fmt in _MX_FORMATS, **tile}
    return KernelSpec(f"scaled_matmul_dot_scaled{tag}_{a_fmt}x{b_fmt}_{arch}", _dot_scaled_kernel,
                      signature, constexprs, **launch_opts)


def decode_kernel_configs(arch: str) -> list:
    """Every config of the decode kernel ``arch``'s table holds: the timed choice's candidates, then the
    untried variants (compiled and GPU-tested like them, not yet chosen from)."""
    cfg = pick_config(CONFIGS, arch)
    return [c for c in cfg["decode_candidates"] + cfg.get("decode_untried", []) if c["kernel"] == "decode"]


def _decode_spec(arch: str, w_fmt: str, c: dict | None = None, tag: str = ""):
    """The decode kernel as it runs on ``arch`` with bf16 activations (the PTX word decodes on sm_90)."""
    from flyarray.targets import KernelSpec
    c = dict(c or next(c for c in pick_config(CONFIGS, arch)["decode_candidates"] if c["kernel"] == "decode"))
    launch_opts = {"num_warps": c.pop("num_warps"), "num_stages": c.pop("num_stages")}
    c.pop("SPLIT_K"), c.pop("kernel")
    c = {"SPLIT_WORDS": 1, "QUAD_SIGNS": False, "ALIGNED_K": False, "PAIR_STEPS": False, **c}   # a compile spec names every constexpr, defaults included
    ints = ("M", "N", "K", "k_per_split", "stride_xm", "stride_wn", "stride_sn", "stride_om", "stride_split")
    signature = {"x_ptr": "*bf16", "w_ptr": _POINTER_TYPES[w_fmt], "s_ptr": "*u8", "out_ptr": "*bf16",
                 **{k: "i32" for k in ints}, "stride_on": "constexpr",
                 **{k: "constexpr" for k in ("W_FP4", "BLOCK_M", "SCALE_NATIVE", "ASM_DECODE", "E5M2", *c)}}
    constexprs = {"stride_on": 1, "W_FP4": w_fmt == "e2m1", "BLOCK_M": _DECODE_BLOCK_M, "SCALE_NATIVE": True,
                  "ASM_DECODE": arch.startswith("sm_"), "E5M2": w_fmt == "e5m2", **c}
    return KernelSpec(f"scaled_matmul_decode{tag}_bf16x{w_fmt}_{arch}", _mx_decode_kernel,
                      signature, constexprs, **launch_opts)


def _fp8_blocks_spec(arch: str):
    from flyarray.targets import KernelSpec
    tile = dict(pick_config(CONFIGS, arch)["fp8_blocks"])
    launch_opts = {"num_warps": tile.pop("num_warps"), "num_stages": tile.pop("num_stages")}
    ints = ("M", "N", "K", "stride_am", "stride_bn", "stride_sam", "stride_sbn", "stride_cm")
    signature = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "sa_ptr": "*u8", "sb_ptr": "*u8", "c_ptr": "*bf16",
                 **{k: "i32" for k in ints}, "stride_cn": "constexpr", **{k: "constexpr" for k in tile}}
    return KernelSpec(f"scaled_matmul_fp8_blocks_{arch}", _fp8_blocks_kernel, signature,
                      {"stride_cn": 1, **tile}, **launch_opts)


def compile_specs(arch: str | None = None) -> list:
    """Representative specializations: every MX combination through dot_scaled with ``arch``'s
    tiles (both gfx950 and sm_90 when None; gfx942 sends MX x MX to upcast, so bf16 x MX only),
    plus the Hopper decode and fp8_blocks kernels.
    On gfx950 and gfx942 that is every config the table holds: each dot_scaled tile with each format
    pair that uses it, and each dot_scaled decode candidate at BLOCK_M 16 and 64 (its extremes)."""
    archs = [arch] if arch else ["gfx950", "sm_90"]
    combos = [("e4m3", "e4m3"), ("e2m1", "e2m1"), ("e4m3", "e2m1"), ("bf16", "e2m1")]
    specs = [_dot_scaled_spec(a, fa, fb) for a in archs for fa, fb in combos
             if fa in _PLAIN_FORMATS or pick_config(CONFIGS, a).get("mx_pair_method", "dot_scaled") == "dot_scaled"]
    for amd in [a for a in archs if a in ("gfx950", "gfx942")]:
        specs.append(_dot_scaled_spec(amd, "bf16", "e4m3"))
        for i, c in enumerate(c for c in CONFIGS[amd]["decode_candidates"] if c["kernel"] == "dot_scaled"):
            specs += [_dot_scaled_spec(amd, "bf16", fb, dict(c, BLOCK_M=m), f"_decode{i}_m{m}")
                      for m in (16, DECODE_MAX_M) for fb in ("e2m1", "e4m3")]
    if "sm_90" in archs:
        decodes = decode_kernel_configs("sm_90")
        specs += [_decode_spec("sm_90", fmt, c, f"{i}") for i, c in enumerate(decodes) for fmt in ("e2m1", "e4m3")]
        specs += [_fp8_blocks_spec("sm_90"), _dot_scaled_spec("sm_90", "bf16", "e4m3")]
    return specs
