"""``fa.fft``: the array API's fast Fourier transform extension.

The transforms (fft, ifft, fftn, ifftn, rfft, irfft, rfftn, irfftn, hfft, ihfft) are **lazy library calls to
torch.fft** (cuFFT / rocFFT / hipFFT on a GPU, pocketfft on the CPU), as JAX calls cuFFT: graph nodes like any
library op, recorded with their shape and dtype checked at call time, fused with nothing (their inputs are
materialized, their outputs are buffers that later elementwise work reads). They are not our kernels.
fftfreq, rfftfreq (an index ramp and a multiply), fftshift and ifftshift (a roll) are ours and lazy.

Dtypes: complex64/complex128 in, the same out (rfft/ihfft: float32 -> complex64, float64 -> complex128;
irfft/hfft the reverse). A real float array passed where complex is expected is treated as complex with a
zero imaginary part (numpy's rule; array_api_strict refuses it). float16/bfloat16 and integer inputs raise
TypeError: cast to float32 first. ``norm`` is "backward" (the default: 1/n on the inverse), "ortho" or
"forward". vmap-able; not differentiable (complex values are not, see docs/array_api.md).
"""
from __future__ import annotations

import numbers
import operator

import torch

from . import dtypes as dt
from . import views
from .ops.library import Library, call

_NORMS = ("backward", "ortho", "forward")
_REAL = (dt.float32, dt.float64)


# ---- the library node --------------------------------------------------------------------------------------
def _out_shape(shape, fn, s, axes) -> tuple:
    shape = list(shape)
    for size, axis in zip(s, axes):
        shape[axis] = size
    if fn in ("rfftn", "ihfft"):
        shape[axes[-1]] = s[-1] // 2 + 1
    return tuple(shape)


def _out_dtype(d, fn):
    if fn in ("rfftn", "ihfft"):
        return dt.complex_dtype(d)
    return dt.real_dtype(d) if fn in ("irfftn", "hfft") else d


def _fft_abstract(x, *, fn, s, axes, norm):
    shape = views.check_shape(_out_shape(x.shape, fn, s, axes), "fft: the result's shape")   # n=2**62: here
    return [(shape, _out_dtype(x.dtype, fn))]


def _fft_run(x, *, fn, s, axes, norm):
    if x.numel() == 0:  # an empty batch axis (the transformed ones are never empty): nothing to transform
        d = _out_dtype(dt.from_torch(x.dtype), fn)
        return torch.zeros(_out_shape(x.shape, fn, s, axes), dtype=d.torch, device=x.device)
    if fn in ("hfft", "ihfft"):  # the array API's are 1-D
        out = getattr(torch.fft, fn)(x, n=s[0], dim=axes[0], norm=norm)
    else:
        out = getattr(torch.fft, fn)(x, s=s, dim=axes, norm=norm)
    return out.resolve_conj()  # ihfft returns a lazily conjugated view; buffers hold plain values


FFT = Library("fft", _fft_abstract, _fft_run, _fft_run)


# ---- checks (all at call time, before any work) ---------------------------------------------------------------
def _array(op, x):
    from ._array import Array
    from .ops.core import as_array
    x = as_array(x)
    if not isinstance(x, Array):
        raise TypeError(f"fft.{op}: x must be an array, got {type(x).__name__}")
    return x


def _input(op, x, want):
    """``x`` checked (and a real float cast to complex where complex is wanted)."""
    x = _array(op, x)
    d = x.dtype
    if want == "real":
        if d not in _REAL:
            raise TypeError(f"fft.{op}: x has dtype {d}; it takes a real float32 or float64 array")
        return x
    if d in _REAL:
        return x.astype(dt.complex_dtype(d))
    if d.kind != "c":
        raise TypeError(f"fft.{op}: x has dtype {d}; it takes complex64 or complex128 (or float32/float64, "
                        "read as complex); cast other dtypes with astype first")
    return x


def _norm(op, norm):
    if norm not in _NORMS:
        raise ValueError(f"fft.{op}: norm must be one of {', '.join(map(repr, _NORMS))}, got {norm!r}")
    return norm


def _length(op, n, what="n"):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"fft.{op}: {what} must be an int, got {n!r}")
    if n < 1:
        raise ValueError(f"fft.{op}: {what} must be at least 1, got {n}")
    return operator.index(n)


def _axis(op, x, axis):
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"fft.{op}: axis must be an int, got {axis!r}")
    if not -x.ndim <= axis < x.ndim or x.ndim == 0:
        raise ValueError(f"fft.{op}: axis {axis} is out of range for an array of shape {x.shape}")
    return axis % x.ndim


def _axes_and_sizes(op, x, s, axes):
    for name, value in (("s", s), ("axes", axes)):
        if value is not None and (isinstance(value, (numbers.Number, str, bytes)) or not hasattr(value, "__len__")):
            raise TypeError(f"fft.{op}: {name} must be a sequence of ints or None, got {value!r}")
    if axes is None:
        if s is not None and len(s) > x.ndim:
            raise ValueError(f"fft.{op}: s {tuple(s)} has more entries than x has axes (shape {x.shape})")
        axes = tuple(range(x.ndim)) if s is None else tuple(range(x.ndim - len(s), x.ndim))
    else:
        axes = tuple(_axis(op, x, a) for a in axes)
        if len(set(axes)) != len(axes):
            raise ValueError(f"fft.{op}: axes {axes} repeat an axis")
    if s is not None:
        s = tuple(v if v == -1 and not isinstance(v, bool) else _length(op, v, "each entry of s (or -1)")
                  for v in s)
        if len(s) != len(axes):
            raise ValueError(f"fft.{op}: s {s} and axes {axes} have different lengths")
        # -1: the whole axis (the array API's), as s=None would take it
        s = tuple(x.shape[a] if v == -1 else v for v, a in zip(s, axes))
        if any(v < 1 for v in s):
            raise ValueError(f"fft.{op}: x (shape {x.shape}) is empty along an axis that s takes whole")
    if not axes:
        raise ValueError(f"fft.{op}: no axes to transform (x has shape {x.shape})")
    return s, axes


def _record(x, fn, s, axes, norm):
    (out,) = call(FFT, [x], fn=fn, s=tuple(s), axes=tuple(axes), norm=norm)
    return out


# ---- one-dimensional -----------------------------------------------------------------------------------------
def _one(op, fn, x, n, axis, norm, want):
    x = _input(op, x, want)
    axis = _axis(op, x, axis)
    norm = _norm(op, norm)
    n = x.shape[axis] if n is None else _length(op, n)
    if n < 1:
        raise ValueError(f"fft.{op}: axis {axis} of x (shape {x.shape}) is empty")
    return _record(x, fn, (n,), (axis,), norm)


def fft(x, /, *, n=None, axis=-1, norm="backward"):
    """One-dimensional discrete Fourier transform along ``axis``; ``n`` crops or zero-pads the input there.
    Complex in, the same dtype out. A lazy library call to torch.fft."""
    return _one("fft", "fftn", x, n, axis, norm, "complex")


def ifft(x, /, *, n=None, axis=-1, norm="backward"):
    """Inverse of ``fft`` along ``axis`` (``n``: the length used, cropping or zero-padding). A lazy library call."""
    return _one("ifft", "ifftn", x, n, axis, norm, "complex")


def rfft(x, /, *, n=None, axis=-1, norm="backward"):
    """Fourier transform of a real float32/float64 array along ``axis``: the n // 2 + 1 non-negative
    frequency terms, complex64/complex128. A lazy library call to torch.fft."""
    return _one("rfft", "rfftn", x, n, axis, norm, "real")


def irfft(x, /, *, n=None, axis=-1, norm="backward"):
    """Inverse of ``rfft``: a real array of length ``n`` along ``axis`` (default 2 * (m - 1) for m input
    terms). A lazy library call to torch.fft."""
    x = _input("irfft", x, "complex")
    axis = _axis("irfft", x, axis)
    return _record(x, "irfftn", (_real_length("irfft", x, n, axis),), (axis,), _norm("irfft", norm))


def hfft(x, /, *, n=None, axis=-1, norm="backward"):
    """Fourier transform of a Hermitian-symmetric signal given by its first half: a real array of length ``n``
    along ``axis`` (default 2 * (m - 1)). A lazy library call to torch.fft."""
    x = _input("hfft", x, "complex")
    axis = _axis("hfft", x, axis)
    return _record(x, "hfft", (_real_length("hfft", x, n, axis),), (axis,), _norm("hfft", norm))


def _real_length(name, x, n, axis) -> int:
    """The real output's length along ``axis`` of a Hermitian transform: ``n``, or 2 * (m - 1) for m terms."""
    n = 2 * (x.shape[axis] - 1) if n is None else _length(name, n)
    if n < 1:
        raise ValueError(f"fft.{name}: the output length 2 * (m - 1) is {n} for shape {x.shape}; pass n")
    return n


def ihfft(x, /, *, n=None, axis=-1, norm="backward"):
    """Inverse of ``hfft``: from a real float32/float64 array, the n // 2 + 1 complex terms along ``axis``.
    A lazy library call to torch.fft."""
    return _one("ihfft", "ihfft", x, n, axis, norm, "real")


# ---- n-dimensional -----------------------------------------------------------------------------------------
def _many(op, fn, x, s, axes, norm, want):
    x = _input(op, x, want)
    s, axes = _axes_and_sizes(op, x, s, axes)
    norm = _norm(op, norm)
    if s is None:
        s = tuple(x.shape[a] for a in axes)
        if any(v < 1 for v in s):
            raise ValueError(f"fft.{op}: x (shape {x.shape}) is empty along the axes {axes}")
    return _record(x, fn, s, axes, norm)


def fftn(x, /, *, s=None, axes=None, norm="backward"):
    """n-dimensional Fourier transform over ``axes`` (default: all, or the last len(s)); ``s`` gives the
    length used per axis (-1: the whole axis). Complex in, the same dtype out. A lazy library call to torch.fft."""
    return _many("fftn", "fftn", x, s, axes, norm, "complex")


def ifftn(x, /, *, s=None, axes=None, norm="backward"):
    """Inverse of ``fftn`` over ``axes``. A lazy library call to torch.fft."""
    return _many("ifftn", "ifftn", x, s, axes, norm, "complex")


def rfftn(x, /, *, s=None, axes=None, norm="backward"):
    """n-dimensional Fourier transform of a real float32/float64 array; the last axis keeps its
    s[-1] // 2 + 1 non-negative frequencies. A lazy library call to torch.fft."""
    return _many("rfftn", "rfftn", x, s, axes, norm, "real")


def irfftn(x, /, *, s=None, axes=None, norm="backward"):
    """Inverse of ``rfftn``: a real array with lengths ``s`` over ``axes`` (default: the input's, the last
    one 2 * (m - 1)). An entry -1 in ``s`` takes its axis whole, as the array API says: the input's length,
    and for the last axis 2 * (m - 1), which reads all m inputs (numpy 2 gives m there). A lazy library call
    to torch.fft."""
    x = _input("irfftn", x, "complex")
    given = s
    s, axes = _axes_and_sizes("irfftn", x, s, axes)
    if given is None or given[-1] == -1:   # the last axis's default output length, 2 * (m - 1)
        s = (s[:-1] if given is not None else tuple(x.shape[a] for a in axes[:-1])) + (2 * (x.shape[axes[-1]] - 1),)
        if any(v < 1 for v in s):
            raise ValueError(f"fft.irfftn: the output lengths {s} for shape {x.shape} are not positive; pass s")
    return _record(x, "irfftn", s, axes, _norm("irfftn", norm))


# ---- frequencies and shifts (ours, lazy) ---------------------------------------------------------------------
def _freq_args(op, n, d, dtype):
    n = _length(op, n)
    if isinstance(d, bool) or not isinstance(d, numbers.Real) or d == 0:
        raise ValueError(f"fft.{op}: d must be a nonzero real number, got {d!r}")
    dtype = dt.default_float() if dtype is None else dt.dtype(dtype)
    if dtype not in _REAL:
        raise TypeError(f"fft.{op}: dtype must be float32 or float64, got {dtype}")
    return n, float(d), dtype


def fftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies of an ``n``-point fft: [0, 1, ..., -(n // 2), ..., -1] / (d * n), float32 by
    default (the array API's default float). Lazy: an index ramp and a multiply."""
    from .ops.creation import arange
    from .ops.elementwise import where
    n, d, dtype = _freq_args("fftfreq", n, d, dtype)
    i = arange(n, device=device)
    k = where(i < (n + 1) // 2, i, i - n)
    return k.astype(dtype) * (1.0 / (d * n))


def rfftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies of ``rfft`` of ``n`` points: [0, 1, ..., n // 2] / (d * n). Lazy."""
    from .ops.creation import arange
    n, d, dtype = _freq_args("rfftfreq", n, d, dtype)
    return arange(n // 2 + 1, device=device).astype(dtype) * (1.0 / (d * n))


def _shift(op, x, axes, sign):
    from .ops.manipulation import roll
    x = _array(op, x)
    if x.ndim == 0:
        return x
    if axes is not None and not isinstance(axes, (numbers.Integral, tuple, list)):
        raise TypeError(f"fft.{op}: axes must be an int, a tuple of ints or None, got {axes!r}")
    axes = tuple(range(x.ndim)) if axes is None else \
        tuple(_axis(op, x, a) for a in ((axes,) if isinstance(axes, numbers.Integral) else axes))
    shifts = tuple(sign * (x.shape[a] // 2) for a in axes)
    return roll(x, shifts, axis=axes)


def fftshift(x, /, *, axes=None):
    """Move the zero frequency to the centre (a roll by n // 2 along ``axes``, default all). Lazy, any dtype."""
    return _shift("fftshift", x, axes, 1)


def ifftshift(x, /, *, axes=None):
    """Inverse of ``fftshift`` (a roll by -(n // 2)). Lazy, any dtype."""
    return _shift("ifftshift", x, axes, -1)


__all__ = ["fft", "fftfreq", "fftn", "fftshift", "hfft", "ifft", "ifftn", "ifftshift", "ihfft", "irfft", "irfftn",
           "rfft", "rfftfreq", "rfftn"]


def _wrap():
    from .ops import _accepting_foreign
    for name in __all__:
        if name not in ("fftfreq", "rfftfreq"):
            globals()[name] = _accepting_foreign(globals()[name])


_wrap()
