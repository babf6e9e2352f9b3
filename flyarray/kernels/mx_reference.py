"""OCP Microscaling (MX) v1.0 conversions in plain numpy: the oracle for the MX kernels.

Written from the spec text (OCP Microscaling Formats (MX) v1.0, section 5
"MX formats" and section 6.3 "Conversion from FP32 to MX"), with ml_dtypes
doing the element rounding. Nothing here is tuned; it is meant to be read.

The spec's algorithm for one block of k=32 values V_i:

    shared_exp = floor(log2(max_i |V_i|)) - emax_elem
    X          = 2 ** shared_exp                       (an E8M0 number)
    P_i        = quantize_to_element_format(V_i / X)   (round to nearest even,
                                                        normal values clamped
                                                        to the largest normal)

and a decoded element is ``X * P_i``. Where the spec leaves a choice to the
implementation, flyarray picks (and the kernels in ``mx.py`` follow):

* overflow of V_i / X (it happens when rounding carries past the largest
  normal) saturates to +-max normal, for every element format;
* element subnormals are kept (never flushed);
* shared_exp is clamped below to -127, the smallest E8M0 exponent; so an
  all-zero block (max |V_i| = 0, log2 = -inf) gets scale code 0 (2^-127)
  and all-zero elements;
* a block whose max |V_i| is Inf or NaN gets the NaN scale (code 0xFF) and
  all element codes 0; by the spec's decoding rule (a NaN scale makes every
  element of the block NaN) the whole block then decodes to NaN. A finite
  input block always gets shared_exp <= 127 - emax_elem, so 0xFF is never
  produced for finite data;
* signs are kept, including the sign of zero (-0.0 -> element -0);
* FP4 (E2M1) elements are stored two per byte, the element with the lower
  index in the low nibble (the order tl.dot_scaled and torch's
  float4_e2m1fn_x2 use).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 0xFF

# element format -> (ml_dtypes type, emax_elem: exponent of the largest normal)
ELEMENT_TYPES = {
    "e4m3": (ml_dtypes.float8_e4m3fn, 8),    # max normal 448 = 1.75 * 2^8
    "e5m2": (ml_dtypes.float8_e5m2, 15),     # max normal 57344 = 1.75 * 2^15
    "e2m1": (ml_dtypes.float4_e2m1fn, 2),    # max normal 6 = 1.5 * 2^2
}


def _blocks(x: np.ndarray, axis: int) -> np.ndarray:
    """x with ``axis`` moved last and split into [..., n_blocks, 32]."""
    x = np.moveaxis(x, axis, -1)
    if x.shape[-1] % BLOCK:
        raise ValueError(f"length {x.shape[-1]} along axis is not a multiple of {BLOCK}")
    return x.reshape(x.shape[:-1] + (x.shape[-1] // BLOCK, BLOCK))


def shared_exponent(block_max: np.ndarray, fmt: str) -> np.ndarray:
    """The spec's shared_exp per block, as float64 (NaN for a block holding Inf/NaN)."""
    emax_elem = ELEMENT_TYPES[fmt][1]
    with np.errstate(divide="ignore", invalid="ignore"):
        exp = np.floor(np.log2(block_max.astype(np.float64))) - emax_elem
    exp = np.maximum(exp, -E8M0_BIAS)  # all-zero block: -inf -> -127 (NaN stays NaN)
    exp[~np.isfinite(block_max)] = np.nan
    return exp


def element_codes(values: np.ndarray, fmt: str) -> np.ndarray:
    """V_i / X (float64, exact) -> element codes (uint8), RNE with saturation."""
    elem_type = ELEMENT_TYPES[fmt][0]
    max_normal = float(ml_dtypes.finfo(elem_type).max)
    clipped = np.clip(values, -max_normal, max_normal)  # saturate; the sign of zero survives clip
    # ml_dtypes converts through float32; V_i / X is exact in float32 except
    # below 2^-126, where every element format rounds the value to zero anyway.
    return clipped.astype(np.float32).astype(elem_type).view(np.uint8)


def quantize(x: np.ndarray, fmt: str, axis: int = -1):
    """(codes, scales): MX-quantize float32 ``x`` along ``axis``.

    codes has x's shape (FP4: the axis halved, two codes a byte), scales has
    the axis divided by 32; both uint8, both with the quantized axis where x had it.
    """
    x = np.asarray(x, dtype=np.float32)
    blocks = _blocks(x, axis)
    block_max = np.max(np.abs(blocks), axis=-1)
    block_max = np.where(np.isnan(blocks).any(axis=-1), np.nan, block_max)
    exp = shared_exponent(block_max, fmt)
    special = np.isnan(exp)
    safe_exp = np.where(special, 0.0, exp)
    scaled = blocks.astype(np.float64) / np.exp2(safe_exp)[..., None]
    codes = element_codes(scaled, fmt)
    codes[special] = 0
    scales = np.where(special, E8M0_NAN, safe_exp + E8M0_BIAS).astype(np.uint8)
    codes = codes.reshape(codes.shape[:-2] + (codes.shape[-2] * codes.shape[-1],))
    if fmt == "e2m1":
        codes = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return np.moveaxis(codes, -1, axis), np.moveaxis(scales, -1, axis)


def decode_elements(codes: np.ndarray, fmt: str) -> np.ndarray:
    """Element codes (uint8, FP4 packed along the last axis) -> float64 values."""
    codes = np.asarray(codes, dtype=np.uint8)
    if fmt == "e2m1":
        unpacked = np.empty(codes.shape[:-1] + (codes.shape[-1] * 2,), np.uint8)
        unpacked[..., 0::2] = codes & 0xF
        unpacked[..., 1::2] = codes >> 4
        codes = unpacked
    return codes.view(ELEMENT_TYPES[fmt][0]).astype(np.float64)


def decode_scales(scales: np.ndarray) -> np.ndarray:
    """E8M0 codes -> float64 2^(code - 127); code 255 -> NaN."""
    scales = np.asarray(scales, dtype=np.uint8)
    values = np.exp2(scales.astype(np.float64) - E8M0_BIAS)
    return np.where(scales == E8M0_NAN, np.nan, values)


def dequantize(codes: np.ndarray, scales: np.ndarray, fmt: str, axis: int = -1) -> np.ndarray:
    """float64 X * P_i for every element, with the quantized axis where it was."""
    codes = np.moveaxis(np.asarray(codes), axis, -1)
    scales = np.moveaxis(np.asarray(scales), axis, -1)
    values = decode_elements(codes, fmt)
    blocks = values.shape[-1] // BLOCK   # spelled out: -1 cannot be inferred when another axis is 0
    values = values.reshape(values.shape[:-1] + (blocks, BLOCK)) * decode_scales(scales)[..., None]
    return np.moveaxis(values.reshape(values.shape[:-2] + (blocks * BLOCK,)), -1, axis)
