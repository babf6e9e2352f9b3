"""OCP Microscaling (MX v1.0) formats: quantize and dequantize as Triton kernels.

An MX block is 32 consecutive values along one axis that share one E8M0 scale
(a bare power of two, 2^(code - 127); code 255 is NaN). The element formats:

    format  element dtype                  storage
    e4m3    float8_e4m3fn   (MXFP8)        torch.float8_e4m3fn, one a byte
    e5m2    float8_e5m2     (MXFP8)        torch.float8_e5m2, one a byte
    e2m1    float4_e2m1fn   (MXFP4)        torch.uint8, two a byte: the element
                                           with the lower index in the low nibble
                                           (tl.dot_scaled's and torch.float4_e2m1fn_x2's order)
    scales  float8_e8m0fnu                 torch.uint8 (the functions here also take
                                           torch.float8_e8m0fnu; fa.quant, fa.nn.scaled_matmul
                                           and torch.ops.flyarray take uint8 codes only)

The conversion follows the spec exactly; its choices where the spec leaves one
to the implementation (saturation, zero blocks, Inf/NaN) are written down in
``mx_reference.py``, the numpy oracle the kernels are tested against bit for
bit. Lengths along the quantized axis must be a multiple of 32: we refuse
rather than pad, because a padded tensor would need its true length carried
beside it everywhere.

The kernels do all the rounding in integer arithmetic on the float32 bit
pattern, so the result is the same on the interpreter, AMD and NVIDIA, and
does not depend on any hardware float8 conversion's rounding or saturation.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from torch import nn

from flyarray.kernels._triton import cdiv, current_arch, empty, pick_config, runner

BLOCK_SIZE = 32
E8M0_BIAS = 127
E8M0_NAN = 255


@dataclasses.dataclass(frozen=True)
class MXFormat:
    """Facts about one MX element format (OCP MX v1.0, section 5.3)."""
    name: str            # the name tl.dot_scaled uses
    exp_bits: int
    mantissa_bits: int
    bias: int
    emax: int            # exponent of the largest normal value
    max_normal: float
    min_normal: float
    min_subnormal: float
    max_code: int        # bit pattern (sign excluded) of the largest normal
    bits: int            # storage bits per element
    torch_dtype: torch.dtype  # what mx_quantize returns the data as
    ml_dtype: str        # the ml_dtypes name for the element type


FORMATS = {
    "e4m3": MXFormat("e4m3", 4, 3, 7, 8, 448.0, 2.0**-6, 2.0**-9, 0x7E, 8,
                     torch.float8_e4m3fn, "float8_e4m3fn"),
    "e5m2": MXFormat("e5m2", 5, 2, 15, 15, 57344.0, 2.0**-14, 2.0**-16, 0x7B, 8,
                     torch.float8_e5m2, "float8_e5m2"),
    "e2m1": MXFormat("e2m1", 2, 1, 1, 2, 6.0, 1.0, 0.5, 0x7, 4,
                     torch.uint8, "float4_e2m1fn"),
}
# The shared scale: E8M0, unsigned, no zero, no Inf; 255 is NaN.
SCALE_FORMAT = {"name": "e8m0", "bias": E8M0_BIAS, "emin": -127, "emax": 127, "nan_code": E8M0_NAN,
                "torch_dtype": torch.uint8, "ml_dtype": "float8_e8m0fnu"}

_ALIASES = {
    "e4m3": "e4m3", "fp8_e4m3": "e4m3", "float8_e4m3fn": "e4m3", "mxfp8": "e4m3", "mxfp8_e4m3": "e4m3",
    "e5m2": "e5m2", "fp8_e5m2": "e5m2", "float8_e5m2": "e5m2", "mxfp8_e5m2": "e5m2",
    "e2m1": "e2m1", "fp4": "e2m1", "fp4_e2m1": "e2m1", "float4_e2m1fn": "e2m1", "mxfp4": "e2m1",
}


def mx_format(fmt: str, where: str = "fmt") -> MXFormat:
    """The MXFormat for a name ('e4m3', 'mxfp8', 'float4_e2m1fn', ...); ValueError otherwise, naming ``where``."""
    key = _ALIASES.get(str(fmt).lower())
    if key is None:
        raise ValueError(f"{where}: unknown MX element format {fmt!r}; known: {sorted(_ALIASES)}")
    return FORMATS[key]


# ----------------------------------------------------------------------------
# Launching (Triton's interpreter for CPU tensors, through runner)
# ----------------------------------------------------------------------------

def launch(kernel, device, grid, *args, **kwargs):
    """runner(kernel, device)[grid](*args, **kwargs): Triton's interpreter for CPU tensors."""
    return runner(kernel, device)[grid](*args, **kwargs)


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------

@triton.jit
def _normalize_step(mant, exp, WIDTH: tl.constexpr):
    """Shift a nonzero mantissa whose top WIDTH bits (of 24) are clear up by WIDTH."""
    short = (mant > 0) & (mant < (1 << (24 - WIDTH)))
    return tl.where(short, mant << WIDTH, mant), tl.where(short, exp - WIDTH, exp)


@triton.jit
def _encode_elements(bits, shared_exp, MANT: tl.constexpr, EMIN: tl.constexpr, MAX_CODE: tl.constexpr,
                     SIGN_SHIFT: tl.constexpr):
    """float32 bit patterns (int32) / 2^shared_exp -> element codes, RNE and saturating.

    Works on the bits so that the division is exact (only the exponent moves)
    and the rounding is the same everywhere.
    """
    sign = (bits >> 31) & 1
    exp_field = (bits >> 23) & 0xFF
    mant = (bits & 0x7FFFFF) | tl.where(exp_field > 0, 0x800000, 0)
    exp = tl.maximum(exp_field, 1) - 127
    # A float32 subnormal has no leading one: shift it up to bit 23 (binary
    # search for the leading one), lowering the exponent to match.
    mant, exp = _normalize_step(mant, exp, 16)
    mant, exp = _normalize_step(mant, exp, 8)
    mant, exp = _normalize_step(mant, exp, 4)
    mant, exp = _normalize_step(mant, exp, 2)
    mant, exp = _normalize_step(mant, exp, 1)
    exp = exp - shared_exp                                      # unbiased exponent of V_i / X
    # Keep MANT bits below the leading one (more below EMIN: subnormals), round off the rest.
    shift = 23 - MANT + tl.maximum(EMIN - exp, 0)
    shift = tl.minimum(shift, 26)                               # beyond 25 everything rounds to 0
    kept = mant >> shift
    rest = mant & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    round_up = (rest > half) | ((rest == half) & ((kept & 1) == 1))
    kept = kept + round_up.to(tl.int32)
    # Exponent field and mantissa add up: a carry out of the mantissa bumps the exponent.
    magnitude = ((tl.maximum(exp, EMIN) - EMIN) << MANT) + kept
    magnitude = tl.where(kept == 0, 0, magnitude)               # rounded to zero (or was zero)
    magnitude = tl.minimum(magnitude, MAX_CODE)                 # saturate to the max normal
    return magnitude | (sign << SIGN_SHIFT)


@triton.jit
def _mx_quantize_kernel(x_ptr, data_ptr, scale_ptr, n_blocks,
                        MANT: tl.constexpr, EMIN: tl.constexpr, EMAX_ELEM: tl.constexpr,
                        MAX_CODE: tl.constexpr, SIGN_SHIFT: tl.constexpr, PACK_FP4: tl.constexpr,
                        BLOCKS_PER_PROGRAM: tl.constexpr):
    """Each row of the [n_blocks, 32] view of x is one MX block."""
    pid = tl.program_id(0)
    blk = pid * BLOCKS_PER_PROGRAM + tl.arange(0, BLOCKS_PER_PROGRAM)
    live = blk < n_blocks
    # Even and odd elements are loaded apart so FP4 codes pack without a reshape.
    half = tl.arange(0, 16)
    even_offs = blk.to(tl.int64)[:, None] * 32 + 2 * half[None, :]
    mask = live[:, None]
    even = tl.load(x_ptr + even_offs, mask=mask, other=0.0).to(tl.float32).to(tl.int32, bitcast=True)
    odd = tl.load(x_ptr + even_offs + 1, mask=mask, other=0.0).to(tl.float32).to(tl.int32, bitcast=True)
    # |x| bit patterns order like the values; Inf/NaN are >= 0x7F800000, so an
    # integer max finds the block max and whether it holds a special value.
    amax_bits = tl.maximum(tl.max(even & 0x7FFFFFFF, axis=1), tl.max(odd & 0x7FFFFFFF, axis=1))
    special = amax_bits >= 0x7F800000
    # floor(log2(amax)) is the exponent field; a zero or subnormal max lands
    # below -127 once emax_elem is taken off, and is clamped to -127.
    shared_exp = tl.maximum(((amax_bits >> 23) & 0xFF) - 127 - EMAX_ELEM, -127)
    shared_exp = tl.where(special, 0, shared_exp)
    even_code = _encode_elements(even, shared_exp[:, None], MANT, EMIN, MAX_CODE, SIGN_SHIFT)
    odd_code = _encode_elements(odd, shared_exp[:, None], MANT, EMIN, MAX_CODE, SIGN_SHIFT)
    even_code = tl.where(special[:, None], 0, even_code)
    odd_code = tl.where(special[:, None], 0, odd_code)
    scale = tl.where(special, 255, shared_exp + 127)
    tl.store(scale_ptr + blk, scale.to(tl.uint8), mask=live)
    if PACK_FP4:
        packed = (even_code | (odd_code << 4)).to(tl.uint8)
        offs = blk.to(tl.int64)[:, None] * 16 + half[None, :]
        tl.store(data_ptr + offs, packed, mask=mask)
    else:
        tl.store(data_ptr + even_offs, even_code.to(tl.uint8), mask=mask)
        tl.store(data_ptr + even_offs + 1, odd_code.to(tl.uint8), mask=mask)


@triton.jit
def _decode_elements(code, MANT: tl.constexpr, BIAS: tl.constexpr, SIGN_SHIFT: tl.constexpr,
                     NAN_CODE: tl.constexpr, INF_CODE: tl.constexpr):
    """Element codes (int32) -> float32 values, specials included.

    NAN_CODE/INF_CODE: the magnitude code at and above which the format holds
    NaN (resp. Inf); -1 when it has none.
    """
    sign = (code >> SIGN_SHIFT) & 1
    magnitude = code & ((1 << SIGN_SHIFT) - 1)
    exp_field = magnitude >> MANT
    mant = magnitude & ((1 << MANT) - 1)
    # value = mant * 2^(1-BIAS-MANT) for subnormals, (2^MANT + mant) * 2^(e-BIAS-MANT) otherwise.
    integer = tl.where(exp_field == 0, mant, mant + (1 << MANT))
    exp = tl.maximum(exp_field, 1) - BIAS - MANT
    value = integer.to(tl.float32) * _pow2(exp)               # exp >= -126 for every format here
    if INF_CODE >= 0:
        value = tl.where(magnitude == INF_CODE, float("inf"), value)
    if NAN_CODE >= 0:
        value = tl.where(magnitude >= NAN_CODE, float("nan"), value)
    # The sign goes in as a bit: compiled, -value is 0 - value, which turns code 0x80 (-0) into +0.
    return (value.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _pow2(exp):
    """float32 2^exp for an int32 exp in [-126, 127], built from its bits."""
    return ((exp + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _apply_e8m0(value, scale):
    """value * 2^(scale - 127) rounded once; scale 255 (NaN) -> NaN.

    The power of two is applied as two normal factors, so no operand is ever
    a float32 subnormal (2^-127 is one) and flush-to-zero hardware agrees.
    """
    exp = scale - 127
    first = tl.maximum(exp, -63)
    out = value * _pow2(first) * _pow2(exp - first)
    return tl.where(scale == 255, float("nan"), out)


@triton.jit
def _apply_e8m0_f64(value, scale):
    """value * 2^(scale - 127) in float64, exact for every code: in float32 the largest elements times scales
    near 2^127 would overflow (448 * 2^123 is 4.8e39)."""
    power = ((scale.to(tl.int64) + (1023 - 127)) << 52).to(tl.float64, bitcast=True)
    return tl.where(scale == 255, float("nan"), value.to(tl.float64) * power)


@triton.jit
def _mx_dequantize_kernel(data_ptr, scale_ptr, out_ptr, n_blocks,
                          MANT: tl.constexpr, BIAS: tl.constexpr, SIGN_SHIFT: tl.constexpr,
                          NAN_CODE: tl.constexpr, INF_CODE: tl.constexpr, PACK_FP4: tl.constexpr,
                          BLOCKS_PER_PROGRAM: tl.constexpr, NATIVE_FP8: tl.constexpr = 0):
    """BLOCKS_PER_PROGRAM consecutive blocks as one [blocks, 32] tile: contiguous loads and stores
    (fp4: the two nibbles of a byte decode side by side and interleave with a join). NATIVE_FP8:
    fp8 codes convert with the target's own instruction (exact, specials included) instead of the
    integer decode: 1 for e4m3, 2 for e5m2, 0 off."""
    pid = tl.program_id(0)
    blk = pid * BLOCKS_PER_PROGRAM + tl.arange(0, BLOCKS_PER_PROGRAM)
    live = blk < n_blocks
    row = blk.to(tl.int64)[:, None]
    scale = tl.load(scale_ptr + blk, mask=live, other=127).to(tl.int32)[:, None]
    if PACK_FP4:
        half = tl.arange(0, 16)
        packed = tl.load(data_ptr + row * 16 + half[None, :], mask=live[:, None], other=0).to(tl.int32)
        even = _decode_elements(packed & 0xF, MANT, BIAS, SIGN_SHIFT, NAN_CODE, INF_CODE)
        odd = _decode_elements((packed >> 4) & 0xF, MANT, BIAS, SIGN_SHIFT, NAN_CODE, INF_CODE)
        values = tl.reshape(tl.join(even, odd), (BLOCKS_PER_PROGRAM, 32))
    else:
        codes = tl.load(data_ptr + row * 32 + tl.arange(0, 32)[None, :], mask=live[:, None], other=0)
        if NATIVE_FP8 == 1:
            values = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        elif NATIVE_FP8 == 2:
            values = codes.to(tl.float8e5, bitcast=True).to(tl.float32)
        else:
            values = _decode_elements(codes.to(tl.int32), MANT, BIAS, SIGN_SHIFT, NAN_CODE, INF_CODE)
    if out_ptr.dtype.element_ty == tl.float64:
        out = _apply_e8m0_f64(values, scale)
    else:
        out = _apply_e8m0(values, scale)
    tl.store(out_ptr + row * 32 + tl.arange(0, 32)[None, :], out.to(out_ptr.dtype.element_ty),
             mask=live[:, None])


# ----------------------------------------------------------------------------
# Launch functions
# ----------------------------------------------------------------------------

# Blocks of 32 per program. Memory-bound and tiny per block: enough blocks per
# program to issue wide loads, few enough for many programs.
# dequant_*: the dequantize kernel's [blocks, 32] tile: a few thousand elements a program, 16 (8 on
# wave64) a thread, so loads and stores are 16-byte vectors (0.78 ms for 8192x8192 e4m3 -> bf16 with
# 32 blocks and byte-wise strided access on an H200).
CONFIGS = {
    # dequant_native_fp8: fp8 codes through the hardware conversion. H200, 8192 x 8192 -> bf16
    # (benchmarks/tune_mx_upcast.py, 2026-12-01): e4m3 0.100 -> 0.053 ms, e5m2 0.117 -> 0.053 ms, bit
    # for bit equal to the integer decode once that kept the sign of -0 (code 0x80; it gave +0);
    # test_gpu_dequantize_every_code_matches_reference checks both decodes on every code.
    "sm_90": {"blocks_per_program": 32, "num_warps": 4, "dequant_blocks": 128, "dequant_warps": 8,
              "dequant_native_fp8": True},
    "gfx950": {"blocks_per_program": 64, "num_warps": 4, "dequant_blocks": 128, "dequant_warps": 8},
    "cpu": {"blocks_per_program": 16, "num_warps": 1, "dequant_blocks": 16, "dequant_warps": 1},
    "default": {"blocks_per_program": 32, "num_warps": 4, "dequant_blocks": 128, "dequant_warps": 8},
}

_NATIVE_FP8 = {"e4m3": 1, "e5m2": 2}  # the dequantize kernel's NATIVE_FP8 codes

_FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16)


def _element_constants(f: MXFormat) -> dict:
    return dict(MANT=f.mantissa_bits, SIGN_SHIFT=f.bits - 1)


def _special_codes(f: MXFormat) -> tuple:
    """(NAN_CODE, INF_CODE): lowest magnitude code that decodes to NaN / the Inf code; -1: none."""
    if f.name == "e4m3":
        return 0x7F, -1
    if f.name == "e5m2":
        return 0x7D, 0x7C
    return -1, -1


def _check_block_size(block_size) -> None:
    if block_size != BLOCK_SIZE:
        raise ValueError(f"block_size: OCP MX v1.0 blocks are {BLOCK_SIZE} elements; got {block_size}")


def check_kernel_device(t: torch.Tensor, name: str) -> None:
    """The kernels run on a GPU (Triton) or on the CPU (Triton's interpreter): any other device is refused
    by name before any work (a 'meta' tensor reached torch's 'not compiled with CUDA' assertion)."""
    if t.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{name}: on device {t.device}; the MX kernels run on a GPU or the CPU")


# mx_dequantize's output dtypes: the floats a kernel stores (integers would truncate the values, NaN included)
_DEQUANT_OUTPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _normalize_axis(axis: int, ndim: int, name: str = "axis") -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim


def mx_quantize(x: torch.Tensor, fmt: str, axis: int = -1, block_size: int = 32):
    """(data, scales): ``x`` in MX format ``fmt`` along ``axis`` (OCP MX v1.0 conversion).

    data: fmt's storage dtype (float8_e4m3fn / float8_e5m2, or uint8 with two
    FP4 codes a byte for e2m1), x's shape with the axis halved for e2m1.
    scales: uint8 E8M0 codes, x's shape with the axis divided by 32.
    x: float32, float16 or bfloat16; x.shape[axis] must be a multiple of 32.
    """
    f = mx_format(fmt)
    _check_block_size(block_size)
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT_INPUTS:
        raise TypeError(f"x: expected a float32/float16/bfloat16 tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim == 0:
        raise ValueError("x: needs at least one dimension to quantize along")
    check_kernel_device(x, "x")
    axis = _normalize_axis(axis, x.ndim)
    length = x.shape[axis]
    if length % BLOCK_SIZE:
        raise ValueError(f"x: length {length} along axis {axis} is not a multiple of {BLOCK_SIZE} "
                         f"(MX blocks are not padded; pad x with zeros yourself)")
    moved = x.movedim(axis, -1).contiguous()
    n_blocks = moved.numel() // BLOCK_SIZE
    packed_len = length // 2 if f.name == "e2m1" else length
    data = empty(moved.shape[:-1] + (packed_len,), torch.uint8, x.device)
    scales = empty(moved.shape[:-1] + (length // BLOCK_SIZE,), torch.uint8, x.device)
    if n_blocks:
        cfg = pick_config(CONFIGS, current_arch(x.device))
        grid = (cdiv(n_blocks, cfg["blocks_per_program"]),)
        launch(_mx_quantize_kernel, x.device, grid,
            moved, data, scales, n_blocks, EMIN=1 - f.bias, EMAX_ELEM=f.emax, MAX_CODE=f.max_code,
            PACK_FP4=f.name == "e2m1", BLOCKS_PER_PROGRAM=cfg["blocks_per_program"],
            num_warps=cfg["num_warps"], **_element_constants(f))
    if f.torch_dtype != torch.uint8:
        data = data.view(f.torch_dtype)
    return _move_back(data, axis), _move_back(scales, axis)


def _move_back(t: torch.Tensor, axis: int) -> torch.Tensor:
    return t if axis == t.ndim - 1 else t.movedim(-1, axis).contiguous()


def _data_as_uint8(data: torch.Tensor, f: MXFormat, name: str = "data") -> torch.Tensor:
    """The raw codes of ``data`` as uint8, after checking its dtype fits format ``f``."""
    fp4_x2 = getattr(torch, "float4_e2m1fn_x2", None)
    allowed = {torch.uint8, f.torch_dtype} | ({fp4_x2} if f.name == "e2m1" and fp4_x2 else set())
    if not isinstance(data, torch.Tensor) or data.dtype not in allowed:
        raise TypeError(f"{name}: format {f.name} needs dtype in {sorted(map(str, allowed))}, "
                        f"got {getattr(data, 'dtype', type(data).__name__)}")
    return data.view(torch.uint8)


def scales_as_uint8(scales: torch.Tensor, name: str = "scales") -> torch.Tensor:
    """E8M0 scales as uint8 codes; accepts uint8 or torch.float8_e8m0fnu."""
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.uint8, e8m0):
        raise TypeError(f"{name}: E8M0 scales must be uint8 codes or float8_e8m0fnu, got "
                        f"{getattr(scales, 'dtype', type(scales).__name__)}")
    return scales.view(torch.uint8)


def logical_length(data: torch.Tensor, f: MXFormat, axis: int) -> int:
    """Number of elements along ``axis`` (twice the bytes for packed FP4)."""
    return data.shape[axis] * (2 if f.name == "e2m1" else 1)


def mx_dequantize(data: torch.Tensor, scales: torch.Tensor, fmt: str, axis: int = -1,
                  block_size: int = 32, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values X * P_i of an MX tensor, as ``dtype``, in the logical (unpacked) shape."""
    f = mx_format(fmt)
    _check_block_size(block_size)
    codes = _data_as_uint8(data, f)
    scale_codes = scales_as_uint8(scales)
    if dtype not in _DEQUANT_OUTPUTS:
        raise TypeError(f"dtype: the values come out as one of {[str(d) for d in _DEQUANT_OUTPUTS]}, got {dtype}")
    if codes.ndim == 0:
        raise ValueError("data: needs at least one dimension")
    check_kernel_device(codes, "data")
    axis, length = _check_block_shapes(codes, scale_codes, f, axis)
    if scale_codes.device != codes.device:
        raise ValueError(f"scales: on {scale_codes.device}, data on {codes.device}")
    moved = codes.movedim(axis, -1).contiguous()
    moved_scales = scale_codes.movedim(axis, -1).contiguous()
    out = empty(moved.shape[:-1] + (length,), dtype, codes.device)
    n_blocks = out.numel() // BLOCK_SIZE
    if n_blocks:
        nan_code, inf_code = _special_codes(f)
        cfg = pick_config(CONFIGS, current_arch(codes.device))
        grid = (cdiv(n_blocks, cfg["dequant_blocks"]),)
        launch(_mx_dequantize_kernel, codes.device, grid,
            moved, moved_scales, out, n_blocks, BIAS=f.bias, NAN_CODE=nan_code, INF_CODE=inf_code,
            PACK_FP4=f.name == "e2m1", BLOCKS_PER_PROGRAM=cfg["dequant_blocks"],
            NATIVE_FP8=_NATIVE_FP8.get(f.name, 0) if cfg.get("dequant_native_fp8") else 0,
            num_warps=cfg["dequant_warps"], **_element_constants(f))
    return _move_back(out, axis)


def _check_block_shapes(codes: torch.Tensor, scale_codes: torch.Tensor, f: MXFormat, axis: int):
    """(axis, values along it) of MX data, after checking they are whole blocks and that the scales hold one
    code per block (the data's shape otherwise)."""
    axis = _normalize_axis(axis, codes.ndim)
    length = logical_length(codes, f, axis)
    if length % BLOCK_SIZE:
        raise ValueError(f"data: axis {axis} of shape {tuple(codes.shape)} holds {length} {f.name} values, "
                         f"not a multiple of {BLOCK_SIZE}")
    expected = codes.shape[:axis] + (length // BLOCK_SIZE,) + codes.shape[axis + 1:]
    if tuple(scale_codes.shape) != tuple(expected):
        raise ValueError(f"scales: expected shape {tuple(expected)} for data of shape {tuple(codes.shape)} "
                         f"({f.name}, axis {axis}), got {tuple(scale_codes.shape)}")
    return axis, length


def reference_mx_dequantize(data, scales, fmt: str, axis: int = -1) -> torch.Tensor:
    """float64 values of an MX tensor, through the numpy spec reference (the oracle). Scales must have the
    data's shape with the axis holding one code per 32 values (numpy would broadcast a wrong shape)."""
    from flyarray.kernels import mx_reference
    f = mx_format(fmt)
    codes = _data_as_uint8(data, f)
    scale_codes = scales_as_uint8(scales)
    if codes.ndim == 0:
        raise ValueError("data: needs at least one dimension")
    axis, _ = _check_block_shapes(codes, scale_codes, f, axis)
    values = mx_reference.dequantize(codes.cpu().numpy(), scale_codes.cpu().numpy(), f.name, axis)
    return torch.from_numpy(values).to(data.device)


def compile_specs() -> list:
    """Representative specializations for the cross-compile report (one per format and direction)."""
    from flyarray.targets import KernelSpec
    specs = []
    for f in FORMATS.values():
        nan_code, inf_code = _special_codes(f)
        common = dict(BLOCKS_PER_PROGRAM=32, PACK_FP4=f.name == "e2m1", **_element_constants(f))
        specs.append(KernelSpec(
            f"mx_quantize_{f.name}", _mx_quantize_kernel,
            {"x_ptr": "*fp32", "data_ptr": "*u8", "scale_ptr": "*u8", "n_blocks": "i32",
             **{k: "constexpr" for k in ("MANT", "EMIN", "EMAX_ELEM", "MAX_CODE", "SIGN_SHIFT",
                                           "PACK_FP4", "BLOCKS_PER_PROGRAM")}},
            dict(EMIN=1 - f.bias, EMAX_ELEM=f.emax, MAX_CODE=f.max_code, **common)))
        specs.append(KernelSpec(
            f"mx_dequantize_{f.name}", _mx_dequantize_kernel,
            {"data_ptr": "*u8", "scale_ptr": "*u8", "out_ptr": "*bf16", "n_blocks": "i32",
             **{k: "constexpr" for k in ("MANT", "BIAS", "SIGN_SHIFT", "NAN_CODE", "INF_CODE",
                                           "PACK_FP4", "BLOCKS_PER_PROGRAM", "NATIVE_FP8")}},
            dict(BIAS=f.bias, NAN_CODE=nan_code, INF_CODE=inf_code, NATIVE_FP8=0,
                 **dict(common, BLOCKS_PER_PROGRAM=CONFIGS["default"]["dequant_blocks"])),
            num_warps=CONFIGS["default"]["dequant_warps"]))
        if f.name in _NATIVE_FP8:
            native = dict(specs[-1].constexprs, NATIVE_FP8=_NATIVE_FP8[f.name])
            specs.append(dataclasses.replace(specs[-1], name=f"mx_dequantize_native_{f.name}", constexprs=native))
    return specs


# ----------------------------------------------------------------------------
# Quantizing a torch model's nn.Linear weights
# ----------------------------------------------------------------------------
# ``quantize_linear_weights(model, sample_input)`` swaps every eligible
# nn.Linear (in place, like torch.ao's module swaps) for an MXLinear holding
# MX-quantized weights, and reports how much the model's output moved. The
# forward runs scaled_matmul: weight-only (bf16/fp16 activations times MX
# weights; the small-M decode kernel on Hopper), or with activation_format the
# activations are MX-quantized on the fly too (MXFP8 x MXFP{8,4}; the native
# scaled MFMA on MI350).

class MXLinear(nn.Module):
    """y = x @ dequant(W)^T + b, with W stored as MX data [out, in(/2)] and E8M0 scales [out, in/32]."""

    def __init__(self, linear: nn.Linear, weight_format: str = "e2m1", activation_format=None):
        super().__init__()
        if linear.in_features % BLOCK_SIZE:
            raise ValueError(f"linear: in_features={linear.in_features} is not a multiple of {BLOCK_SIZE}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_format = mx_format(weight_format).name
        self.activation_format = None if activation_format is None else mx_format(activation_format).name
        data, scales = mx_quantize(linear.weight.detach().float(), self.weight_format)
        self.register_buffer("weight_data", data)
        self.register_buffer("weight_scales", scales)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(),
                                                                   requires_grad=False)
        # nn.TransformerEncoderLayer's inference fast path reads linear.weight itself, which MXLinear has
        # not; a module with a forward hook turns that path off, so the layer calls this forward instead
        self.register_forward_pre_hook(_no_fast_path)
        import flyarray.interop.torch_ops  # noqa: F401  (torch.ops.flyarray, for a compiled forward)

    def _compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        if not x.is_cuda:   # the CPU runs kernels through Triton's interpreter, which has no bf16 arithmetic
            return torch.float16
        return x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        trains = self._check_input(x)
        if torch.compiler.is_compiling():
            return self._forward_through_custom_ops(x)
        rows = x.reshape(-1, self.in_features)
        out_dtype = _out_dtype(x)
        if trains:   # the layers before it train through it
            y = _WeightOnlyMXLinear.apply(rows, self.weight_data, self.weight_scales, self, out_dtype)
        else:
            y = self._matmul(rows, out_dtype)
        return self._output(y, x)

    def _check_input(self, x) -> bool:
        """Refuse what nn.Linear refuses, by name, before any work; True when a gradient flows back to x."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"MXLinear: input must be a real floating tensor, got "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"MXLinear: input's last dimension must be in_features={self.in_features}, got shape "
                             f"{tuple(x.shape)}")
        trains = torch.is_grad_enabled() and x.requires_grad
        if trains and self.activation_format is not None:
            raise RuntimeError("MXLinear: with activation_format the input is quantized, which has no "
                               "gradient; use weight-only MX (activation_format=None) to train through the "
                               "layer, or run it under torch.no_grad()")
        return trains

    def _forward_through_custom_ops(self, x):
        """The forward as torch.compile traces it: torch.ops.flyarray's custom ops (fake implementations and
        autograd registered), not the kernels' launches, which Dynamo would trace into."""
        import flyarray.interop.torch_ops  # noqa: F401  (registers torch.ops.flyarray; already imported by then)
        rows = x.reshape(-1, self.in_features)
        if self.activation_format is None:
            lhs, lhs_scales = rows.to(self._compute_dtype(x)), None
        else:
            lhs, lhs_scales = torch.ops.flyarray.mx_quantize(rows.contiguous(), self.activation_format, -1, 32)
        y = torch.ops.flyarray.scaled_matmul(lhs, self.weight_data, lhs_scales, self.weight_scales, _out_dtype(x))
        return self._output(y, x)

    def _output(self, y, x):
        """The product rows ``y`` of input ``x`` as the layer's output: + bias, x's leading dims, and float64
        for a float64 x (the GEMM computes in float32 at most)."""
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype if x.dtype == torch.float64 else y.dtype)

    def _apply(self, fn, recurse=True):
        """``.to(dtype)``, ``.half()``, ``.double()`` cast a module's floating buffers: the MX codes (float8
        data, E8M0 scales) keep their dtypes and follow only a move to another device."""
        codes = {name: self._buffers.pop(name) for name in ("weight_data", "weight_scales")}
        try:
            super()._apply(fn, recurse)
        finally:
            for name, t in codes.items():   # fn itself where it keeps the dtype (to_empty: from meta, no copy)
                moved = fn(t)
                self._buffers[name] = moved if moved.dtype == t.dtype else t.to(moved.device)
        return self

    def _matmul(self, rows, out_dtype):
        if self.activation_format is None:
            lhs, lhs_scales = rows.to(self._compute_dtype(rows)), None
        else:
            lhs, lhs_scales = mx_quantize(rows.contiguous(), self.activation_format)
        from flyarray.kernels.scaled_matmul import scaled_matmul  # it imports this module
        return scaled_matmul(lhs, self.weight_data, lhs_scales, self.weight_scales,
                             preferred_element_type=out_dtype, rhs_format=self.weight_format)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"weight_format={self.weight_format}, activation_format={self.activation_format}")


def _no_fast_path(module, args):
    return None


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32


class _WeightOnlyMXLinear(torch.autograd.Function):
    """rows @ dequant(W)^T with a gradient to rows (W is frozen codes, so it gets none):
    d rows = dy @ dequant(W), in float32, rounded to rows' dtype."""

    @staticmethod
    def forward(ctx, rows, weight_data, weight_scales, module, out_dtype):
        # the codes are saved, not read off the module at backward: an in-place update between the two (an
        # optimizer step, load_state_dict) is torch's version-counter error, as nn.Linear's weight would be
        ctx.save_for_backward(weight_data, weight_scales)
        ctx.weight_format, ctx.rows_dtype = module.weight_format, rows.dtype
        return module._matmul(rows, out_dtype)

    @staticmethod
    def backward(ctx, dy):
        data, scales = ctx.saved_tensors
        w = mx_dequantize(data, scales, ctx.weight_format, dtype=torch.float32)  # [out, in]
        return (dy.float() @ w).to(ctx.rows_dtype), None, None, None, None


def _relative_error(after, before) -> float:
    before64, after64 = before.detach().double(), after.detach().double()
    return ((after64 - before64).norm() / before64.norm().clamp_min(1e-300)).item()


def quantize_linear_weights(model: nn.Module, sample_input=None, weight_format: str = "mxfp4",
                            activation_format=None) -> dict:
    """Replace each nn.Linear in ``model`` (in place) by an MXLinear; return a report.

    Layers whose in_features is not a multiple of 32 are left alone and listed
    under 'skipped'. With ``sample_input`` (a tensor, or a tuple of positional
    arguments), the model runs before and after (in eval mode; its modes and buffers
    are restored), and 'rel_error' is ||after - before|| / ||before|| of its output
    (first output if a tuple).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_linear_weights: model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.Linear):   # in place: a bare Linear has no parent to hold its replacement
        raise ValueError("quantize_linear_weights: model is a bare nn.Linear, which cannot be replaced in place; "
                         "use MXLinear(linear, weight_format) or wrap it (nn.Sequential(linear))")
    mx_format(weight_format, "quantize_linear_weights: weight_format")  # fail early on a bad name
    if activation_format is not None:
        mx_format(activation_format, "quantize_linear_weights: activation_format")
    if sample_input is not None and not isinstance(sample_input, (torch.Tensor, tuple)):
        raise TypeError(f"quantize_linear_weights: sample_input must be a tensor or a tuple of positional "
                        f"arguments, got {type(sample_input).__name__}")
    before = _run(model, sample_input) if sample_input is not None else None
    replaced, skipped, bytes_before, bytes_after = [], [], 0, 0
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            # nn.MultiheadAttention's forward reads out_proj.weight itself: an MXLinear there has none
            if child.in_features % BLOCK_SIZE or isinstance(parent, nn.MultiheadAttention):
                skipped.append(full)
                continue
            new = MXLinear(child, weight_format, activation_format)
            setattr(parent, child_name, new)
            replaced.append(full)
            bytes_before += child.weight.numel() * child.weight.element_size()
            bytes_after += new.weight_data.numel() * new.weight_data.element_size() + new.weight_scales.numel()
    report = {"replaced": replaced, "skipped": skipped, "weight_format": mx_format(weight_format).name,
              "activation_format": activation_format, "weight_bytes_before": bytes_before,
              "weight_bytes_after": bytes_after, "rel_error": None}
    if sample_input is not None:
        report["rel_error"] = _relative_error(_run(model, sample_input), before)
    return report


@torch.no_grad()
def _run(model: nn.Module, sample_input):
    """The model's (first) output on ``sample_input``, leaving it as it was: run in eval mode (no dropout, no
    batch-norm statistics updated), each module's mode and every buffer restored after (a forward that counts
    its calls or fills a cache). Measuring the error must not change the model the user trains or serves."""
    args = sample_input if isinstance(sample_input, tuple) else (sample_input,)
    modes = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.clone()) for b in model.buffers()]
    model.eval()
    try:
        out = model(*args)
    finally:
        for m, training in modes:
            m.training = training
        for b, saved in buffers:
            b.copy_(saved)
    return out[0] if isinstance(out, (tuple, list)) else out
