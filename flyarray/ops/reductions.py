"""Reductions over any axes, with keepdims. mean/var/std are compositions of sum."""
from __future__ import annotations

import math
import numbers
import operator

from .. import dtypes as dt
from .. import views
from . import checks
from .core import array_arg, astype, reduce


def sum(x, /, *, axis=None, keepdims=False, dtype=None):
    """Sum over ``axis`` (int, tuple or None for all). bool/signed integer inputs give int64, unsigned ones
    uint64 (the array API's rule; wrapping modulo 2^64); floats keep their dtype, float16/bfloat16 accumulating
    in float32. ``dtype=d`` casts first and returns d (int32 sums wrap modulo 2^32)."""
    return reduce("sum", x, axis, keepdims, dtype)


def prod(x, /, *, axis=None, keepdims=False, dtype=None):
    """Product over ``axis``: bool/signed integer inputs give int64, unsigned ones uint64, floats keep their
    dtype (float16/bfloat16 accumulate in float32); ``dtype=d`` casts the input first and returns d. Empty
    axes give 1."""
    return reduce("prod", x, axis, keepdims, dtype)


def max(x, /, *, axis=None, keepdims=False):
    """Maximum over ``axis``, in ``x``'s dtype (bool, integer or float); NaN propagates as in numpy.
    An empty axis raises ValueError."""
    return reduce("max", x, axis, keepdims)


def min(x, /, *, axis=None, keepdims=False):
    """Minimum over ``axis``, in ``x``'s dtype (bool, integer or float); NaN propagates as in numpy.
    An empty axis raises ValueError."""
    return reduce("min", x, axis, keepdims)


def any(x, /, *, axis=None, keepdims=False):
    """Whether any element along ``axis`` is nonzero (any input dtype, as bool); a bool result."""
    return reduce("any", x, axis, keepdims)


def all(x, /, *, axis=None, keepdims=False):
    """Whether every element along ``axis`` is nonzero (any input dtype, as bool); a bool result."""
    return reduce("all", x, axis, keepdims)


def argmax(x, /, *, axis=None, keepdims=False):
    """int64 index of the first maximum along ``axis`` (an int; None: into the flattened array).
    NaN counts as the maximum, as in numpy. Any dtype; an empty axis raises ValueError."""
    return _arg("argmax", x, axis, keepdims)


def argmin(x, /, *, axis=None, keepdims=False):
    """int64 index of the first minimum along ``axis`` (an int; None: into the flattened array).
    NaN counts as the minimum, as in numpy. Any dtype; an empty axis raises ValueError."""
    return _arg("argmin", x, axis, keepdims)


def _arg(name, x, axis, keepdims):
    x = array_arg(x, f"{name}: x")
    keepdims = checks.check_bool(name, "keepdims", keepdims)   # as the other reductions: not any truthy value
    if axis is not None:   # numpy ints too, as the other reductions take them
        if isinstance(axis, bool) or not hasattr(axis, "__index__"):
            raise TypeError(f"{name}: axis must be an int or None, got {axis!r}")
        axis = operator.index(axis)
    if x.ndim == 0:
        if axis not in (None, 0, -1):  # 0 and -1 pass as elsewhere for 0-d arrays (as torch)
            raise ValueError(f"{name}: axis {axis} is out of range for a 0-d array")
        return reduce(name, x, None, keepdims)
    if axis is None:  # the index into the flattened array (all axes reduced in C order)
        out = reduce(name, x, None, True)
        return out if keepdims else out.reshape(())
    return reduce(name, x, axis, keepdims)


def _count(x, axis) -> int:
    axes = views.normalize_axes(axis, x.ndim)
    return math.prod(x.shape[a] for a in axes)


def _float_input(name, x):
    """(x in the dtype to accumulate in, the result dtype): integers give float32, accumulated in float64 (as
    numpy does: a float32 sum of int32 values cancels, and its order then decides the answer); float16/bfloat16
    are computed in float32 and rounded once at the end, so every backend gives the same answer
    (the reference backend rounds each op to its dtype: a float16 sum of large values overflows)."""
    from ..primitives import check_storage_only
    x = array_arg(x, f"{name}: x")
    check_storage_only(name, x.dtype)
    if x.dtype.kind == "c" and name != "mean":
        raise TypeError(f"{name} does not accept {x.dtype} inputs (the array API defines it for real floats only)")
    out = x.dtype if x.dtype.kind in "fc" else dt.default_float()
    return astype(x, dt.compute_dtype(out) if x.dtype.kind in "fc" else dt.float64, copy=False), out


def mean(x, /, *, axis=None, keepdims=False):
    """Arithmetic mean over ``axis``. Float inputs keep their dtype (float16/bfloat16 computed in float32);
    integer/bool inputs give float32 (numpy gives float64). An empty axis gives NaN."""
    xf, out = _float_input("mean", x)
    n = _count(xf, axis)
    # divided, not multiplied by a rounded 1/n: [c, c, c] has mean c exactly (and var 0), as numpy's
    m = sum(xf, axis=axis, keepdims=keepdims) / (n if n else float("nan"))
    return astype(m, out, copy=False)


def _var(xf, axis, correction, keepdims, name="var"):
    if not isinstance(correction, numbers.Real):
        raise TypeError(f"{name}: correction must be a real number (numpy's ddof), got {correction!r}")
    n = _count(xf, axis)
    centered = xf - mean(xf, axis=axis, keepdims=True)
    denom = n - correction
    return sum(centered * centered, axis=axis, keepdims=keepdims) / (denom if denom > 0 else float("nan"))


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    """Variance over ``axis``, dividing by N - ``correction`` (numpy's ddof). Float inputs keep their dtype;
    integer/bool inputs give float32 (numpy: float64). N - correction <= 0 gives NaN."""
    xf, out = _float_input("var", x)
    return astype(_var(xf, axis, correction, keepdims), out, copy=False)


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    """Standard deviation, sqrt of ``var`` (``correction`` is numpy's ddof). Float inputs keep their dtype;
    integer/bool inputs give float32 (numpy: float64). Its gradient at a constant row is 0, as torch's."""
    xf, out = _float_input("std", x)
    return astype(root_with_zero_slope_at_zero(_var(xf, axis, correction, keepdims, "std")), out, copy=False)


def root_with_zero_slope_at_zero(s, p=2.0):
    """``s ** (1 / p)`` (sqrt for p = 2) of a non-negative sum, whose derivative is taken as 0 where ``s`` is 0:
    the root's slope there is infinite and the sum's is 0, so the chain rule gave NaN (the gradient of a norm
    at a zero vector, of std at a constant row). 0 is torch's answer there (JAX's is NaN); the value is the
    same. The double where keeps the unused branch's derivative finite."""
    from .core import elementwise, where
    zero = s == 0
    safe = where(zero, 1.0, s)
    root = elementwise("sqrt", safe) if p == 2.0 else elementwise("pow", safe, 1.0 / p)
    return where(zero, 0.0, root)


def count_nonzero(x, /, *, axis=None, keepdims=False):
    """The number of nonzero elements along ``axis`` (all axes when None), as int64; any dtype. One fused
    comparison-and-sum."""
    x = array_arg(x, "count_nonzero: x")
    from .core import elementwise
    return sum(elementwise("not_equal", x, 0) if x.dtype != dt.bool_ else x, axis=axis, keepdims=keepdims)
