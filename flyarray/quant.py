"""fa.quant: OCP Microscaling (MX) formats -- quantize, dequantize, and quantized linear layers.

The conversion is the OCP MX v1.0 one (kernels/mx.py; bit-exact against
kernels/mx_reference.py, written from the spec). ``fmt`` is 'e4m3' (MXFP8),
'e5m2' (MXFP8) or 'e2m1' (MXFP4, two codes per byte, low nibble first);
scales are E8M0 codes stored as uint8.
"""
from __future__ import annotations

import importlib

from . import dtypes as dt
from .ops import accepting_arrays
from .ops.library import Library, call
from .views import normalize_axis as _normalize_axis

__all__ = ["mx_dequantize", "mx_quantize", "quantize_linear_weights"]

BLOCK_SIZE = 32


def _mx():
    return importlib.import_module("flyarray.kernels.mx")


def _quantize_abstract(x, *, fmt, axis, block_size):
    f = _mx().mx_format(fmt, "mx_quantize: fmt")  # raises for an unknown format
    if block_size != BLOCK_SIZE:
        raise ValueError(f"mx_quantize: block_size must be {BLOCK_SIZE} (OCP MX), got {block_size}")
    if x.dtype not in (dt.float32, dt.float16, dt.bfloat16):
        raise TypeError(f"mx_quantize: x must be float32, float16 or bfloat16, got {x.dtype}")
    if not x.shape:
        raise ValueError("mx_quantize: x must have at least one dimension")
    ax = _normalize_axis(axis, len(x.shape), "mx_quantize: axis")
    if x.shape[ax] % BLOCK_SIZE:
        raise ValueError(f"mx_quantize: axis {axis} of shape {x.shape} has length {x.shape[ax]}, not a multiple "
                         f"of {BLOCK_SIZE}; pad it first (fa.concat with zeros)")
    data_shape = list(x.shape)
    data_dtype = dt.from_torch(f.torch_dtype)
    if f.name == "e2m1":  # the canonical name: aliases ('mxfp4', 'fp4', 'E2M1') pack too
        data_shape[ax] //= 2
    scale_shape = list(x.shape)
    scale_shape[ax] //= BLOCK_SIZE
    return [(tuple(data_shape), data_dtype), (tuple(scale_shape), dt.uint8)]


def _quantize_kernel(x, *, fmt, axis, block_size):
    data, scales = _mx().mx_quantize(x, fmt, axis, block_size)
    return data, _mx().scales_as_uint8(scales)


# torch has no MX conversion, so the reference backend runs our kernel too (through the interpreter
# on CPU data); its oracle in the tests is kernels/mx_reference.py, written from the spec.
MX_QUANTIZE = Library("mx_quantize", _quantize_abstract, _quantize_kernel, _quantize_kernel)


@accepting_arrays
def mx_quantize(x, fmt, axis=-1, block_size=BLOCK_SIZE):
    """(data, scales) of ``x`` in MX format ``fmt`` along ``axis`` (OCP MX v1.0)."""
    return tuple(call(MX_QUANTIZE, [x], fmt=fmt, axis=axis, block_size=block_size))


_STORAGE_OF = {"e4m3": dt.float8_e4m3fn, "e5m2": dt.float8_e5m2, "e2m1": dt.uint8}
_DEQUANTIZED = (dt.float32, dt.float16, dt.bfloat16, dt.float64)   # the kernel's outputs (kernels/mx.py)


def _dequantize_abstract(data, scales, *, fmt, axis, block_size, dtype):
    name = _mx().mx_format(fmt, "mx_dequantize: fmt").name
    if name in _STORAGE_OF and data.dtype != _STORAGE_OF[name]:
        raise TypeError(f"mx_dequantize: {name} data is stored as {_STORAGE_OF[name]}, got {data.dtype} "
                        "(the format must be the one the data was quantized to)")
    if block_size != BLOCK_SIZE:
        raise ValueError(f"mx_dequantize: block_size must be {BLOCK_SIZE} (OCP MX), got {block_size}")
    if scales.dtype != dt.uint8:
        raise TypeError(f"mx_dequantize: scales must be E8M0 codes stored as uint8, got {scales.dtype}")
    if dt.dtype(dtype) not in _DEQUANTIZED:
        raise TypeError(f"mx_dequantize: dtype must be one of {', '.join(d.name for d in _DEQUANTIZED)}, "
                        f"got {dt.dtype(dtype)}")
    if not data.shape:
        raise ValueError("mx_dequantize: data must have at least one dimension")
    shape = list(data.shape)
    ax = _normalize_axis(axis, len(shape), "mx_dequantize: axis")
    if name == "e2m1":
        shape[ax] *= 2
    if shape[ax] % BLOCK_SIZE:
        packed = f" ({data.shape[ax]} bytes of two e2m1 codes)" if name == "e2m1" else ""
        raise ValueError(f"mx_dequantize: axis {axis} of data {data.shape} holds {shape[ax]} values{packed}, not a "
                         f"multiple of {BLOCK_SIZE} (an MX block); was it quantized along another axis?")
    want = list(shape)
    want[ax] //= BLOCK_SIZE
    if list(scales.shape) != want:
        raise ValueError(f"mx_dequantize: scales of shape {scales.shape} do not fit data {data.shape} "
                         f"(expected {tuple(want)})")
    return [(tuple(shape), dt.dtype(dtype))]


def _dequantize_kernel(data, scales, *, fmt, axis, block_size, dtype):
    return _mx().mx_dequantize(data, scales, fmt, axis, block_size, dt.dtype(dtype).torch)


MX_DEQUANTIZE = Library("mx_dequantize", _dequantize_abstract, _dequantize_kernel, _dequantize_kernel)


@accepting_arrays
def mx_dequantize(data, scales, fmt, axis=-1, block_size=BLOCK_SIZE, dtype=dt.float32):
    """The values of an MX tensor (data, scales) as ``dtype`` (a floating dtype)."""
    return call(MX_DEQUANTIZE, [data, scales], fmt=fmt, axis=axis, block_size=block_size,
                dtype=dt.dtype(dtype).name)[0]


def quantize_linear_weights(model, sample_input=None, weight_format="mxfp4", activation_format=None) -> dict:
    """Replace each torch ``nn.Linear`` in ``model`` (in place) by an MX-quantized layer whose forward
    runs our scaled-matmul kernels; returns a report (replaced, skipped, rel_error on ``sample_input``,
    weight bytes before and after). See kernels/mx.py (MXLinear)."""
    return _mx().quantize_linear_weights(model, sample_input, weight_format, activation_format)
