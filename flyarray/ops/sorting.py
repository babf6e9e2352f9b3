"""The array API's sorting, searching, scan and set functions: sort, argsort, searchsorted,
cumulative_sum, cumulative_prod, unique_*.

Each is a library op over the last axis (kernels/scan.py, kernels/sort.py); any other axis is moved
last with a view first and back after. Arguments are checked here, at record time, before any work.
The unique_* functions **evaluate** (their length depends on the values): a sort, then a comparison
of neighbours and a scan, then one read of where the groups start.
"""
from __future__ import annotations

import importlib
from typing import NamedTuple

import numpy as np

from .. import dtypes as dt
from .. import views
from .._array import Array
from ..primitives import check_storage_only, sum_dtype
from . import checks
from .core import array_arg, node_of
from .library import Library, call


def _kernels(name):
    return importlib.import_module(f"flyarray.kernels.{name}")


def _real(op, name, node, allow_bool=False):
    check_storage_only(op, node.dtype)
    if node.dtype.kind not in ("biuf" if allow_bool else "iuf"):
        raise TypeError(f"{op}: {name} must have a real-valued{' or boolean' if allow_bool else ''} dtype, "
                        f"got {node.dtype}")


def _rows(op, node):
    if not node.shape:
        raise ValueError(f"{op}: x must have at least one dimension, got a 0-d array")


# ---- scans --------------------------------------------------------------------------------------------
def _scan_abstract(x, *, op, include_initial):
    _real(f"cumulative_{op}", "x", x, allow_bool=True)
    _rows(f"cumulative_{op}", x)
    # the array API's sum dtypes: signed ints and bool -> int64, unsigned -> uint64, floats keep theirs
    return [(x.shape[:-1] + (x.shape[-1] + int(include_initial),), sum_dtype(x.dtype))]


def _scan_kernel(x, *, op, include_initial):
    return _kernels("scan").scan(x, op, _scan_torch_dtype(x), include_initial)


def _scan_reference(x, *, op, include_initial):
    return _kernels("scan").reference_scan(x, op, _scan_torch_dtype(x), include_initial)


def _scan_torch_dtype(x):
    return sum_dtype(dt.from_torch(x.dtype)).torch


SCAN = Library("scan", _scan_abstract, _scan_kernel, _scan_reference)


def _last_axis(op, x, axis):
    """(x with ``axis`` moved last, the normalized axis); the array API's rule for axis=None."""
    node = node_of(x)
    if axis is None:
        if len(node.shape) > 1:
            raise ValueError(f"{op}: axis is required for arrays of more than one dimension (shape {node.shape})")
        axis = -1
    _rows(op, node)
    axis = views.normalize_axis(axis, len(node.shape), f"{op}: axis")
    from .manipulation import moveaxis
    return (moveaxis(x, axis, -1) if axis != len(node.shape) - 1 else x), axis


def _from_last(y, axis):
    from .manipulation import moveaxis
    return moveaxis(y, -1, axis) if axis != y.ndim - 1 else y


def _scan(op, x, axis, dtype, include_initial):
    x = array_arg(x, f"cumulative_{op}: x")
    include_initial = checks.check_bool(f"cumulative_{op}", "include_initial", include_initial)
    if x.dtype.kind == "c" and dtype is not None and dt.dtype(dtype).kind != "c":
        if dt.dtype(dtype).kind != "b":   # as sum: only bool, which astype allows, takes a complex x
            raise TypeError(f"cumulative_{op}: dtype={dt.dtype(dtype)} would drop the imaginary part of a complex x")
        x = x.astype(dt.bool_)
    if dtype is not None and dt.dtype(dtype).kind == "c" or x.dtype.kind == "c":
        return _complex_scan(op, x if dtype is None else x.astype(dt.dtype(dtype), copy=False), axis, include_initial)
    if dtype is not None:  # cast first, as sum(dtype=): the dtype computed in is the one checked (not float8)
        x = x.astype(dt.dtype(dtype), copy=False)
    _real(f"cumulative_{op}", "x", x._node, allow_bool=True)
    moved, axis = _last_axis(f"cumulative_{op}", x, axis)
    (out,) = call(SCAN, [moved], op=op, include_initial=bool(include_initial))
    out = _from_last(out, axis)
    # an explicit dtype is the result's dtype (the integer accumulator wraps into it, as numpy)
    return out if dtype is None or out.dtype == dt.dtype(dtype) else out.astype(dt.dtype(dtype))


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    """Cumulative sum along ``axis`` (optional for 1-D ``x``): the array API's ``cumulative_sum``.

    Integers and bool accumulate in int64 (the default integer dtype unless ``dtype`` says otherwise),
    float16/bfloat16 in float32, rounded once. ``include_initial`` puts a 0 in front (the axis grows by one).
    A Triton scan kernel (one pass, the prefix carried across blocks of a long row); differentiable."""
    return _scan("sum", x, axis, dtype, include_initial)


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    """Cumulative product along ``axis`` (optional for 1-D ``x``): the array API's ``cumulative_prod``.

    The same dtype rules as ``cumulative_sum``; ``include_initial`` puts a 1 in front. A Triton scan kernel;
    differentiable, exactly also where ``x`` has zeros (no division: docs/transforms.md)."""
    return _scan("prod", x, axis, dtype, include_initial)


def _complex_scan(op, x, axis, include_initial):
    """Complex cumulative sums scan the (re, im) pairs (view_as_real) with the real scan kernel; products
    multiply magnitudes and add angles: complex prod's rule (complex_lowering.prod_factors: float64, |z| split so
    that no product overflows early, the angle as whole quarter turns, an exact sum and a small one), its five
    parts scanned instead of reduced."""
    from ..complex_lowering import AS_COMPLEX, AS_REAL
    from .elementwise import complex_from_parts, imag, real
    from .manipulation import moveaxis
    moved, axis = _last_axis(f"cumulative_{op}", x, axis)
    if op == "prod":
        from ..complex_lowering import F, prod_factors, quarter_turned, rotation
        from .core import where
        from .creation import arange, ones
        from .manipulation import concat
        r = real(moved).dtype
        parts = prod_factors(F(node_of(real(moved))), F(node_of(imag(moved))))
        scale, rest, hi, lo, turns = (F(node_of(call(SCAN, [Array(p.n)], op=kind, include_initial=False)[0]))
                                      for p, kind in zip(parts, ("prod", "prod", "sum", "sum", "sum")))
        c, s = quarter_turned(*rotation(hi, lo), turns)
        out = complex_from_parts(Array((scale * (rest * c)).astype(r).n), Array((scale * (rest * s)).astype(r).n))
        # a prefix of one factor is that factor, exactly (numpy's): the polar form rounds it, and turns an
        # infinite real one into inf+nan j (inf * sin 0)
        out = where(arange(out.shape[-1], device=out.device) == 0, moved, out)
        if include_initial:
            out = concat([ones(out.shape[:-1] + (1,), dtype=out.dtype, device=out.device), out], axis=-1)
        return _from_last(out, axis)
    (pairs,) = call(AS_REAL, [moved])
    (out,) = call(SCAN, [moveaxis(pairs, -1, -2)], op="sum", include_initial=bool(include_initial))
    (out,) = call(AS_COMPLEX, [moveaxis(out, -2, -1)])
    return _from_last(out, axis)


# ---- sort -------------------------------------------------------------------------------------------------
def _sort_abstract(x, *, descending):
    _real("sort", "x", x, allow_bool=True)  # bool only from unique_* (the public sort refuses it)
    _rows("sort", x)
    return [(x.shape, x.dtype), (x.shape, dt.int64)]


SORT = Library("sort", _sort_abstract,
               lambda x, *, descending: _kernels("sort").sort(x, descending),
               lambda x, *, descending: _kernels("sort").reference_sort(x, descending))


def _sorted(op, x, axis, descending):
    x = array_arg(x, f"{op}: x")
    _real(op, "x", x._node)
    descending = checks.check_bool(op, "descending", descending)
    moved, axis = _last_axis(op, x, axis)
    values, indices = call(SORT, [moved], descending=descending)
    return _from_last(values, axis), _from_last(indices, axis)


def sort(x, /, *, axis=-1, descending=False, stable=True):
    """``x`` sorted along ``axis``: the array API's ``sort``. Always stable (``stable`` is accepted
    and ignored); NaN sorts last ascending and first descending (the reverse), -0.0 equals 0.0.

    A Triton kernel for rows up to 4096 of 8/16/32-bit dtypes; longer rows and int64/float64 are a
    library call to torch.sort (docs/array_api.md). Differentiable (the cotangent follows the permutation)."""
    checks.check_bool("sort", "stable", stable)
    return _sorted("sort", x, axis, descending)[0]


def argsort(x, /, *, axis=-1, descending=False, stable=True):
    """The int64 indices that sort ``x`` along ``axis``: the array API's ``argsort`` (stable; the same
    order as ``sort``, so ``take_along_axis(x, argsort(x)) == sort(x)``)."""
    checks.check_bool("argsort", "stable", stable)
    return _sorted("argsort", x, axis, descending)[1]


# ---- searchsorted --------------------------------------------------------------------------------------------
def _search_abstract(x1, x2, *, right):
    _real("searchsorted", "x1", x1)
    _real("searchsorted", "x2", x2)
    if not x1.shape or not x2.shape or x1.shape[:-1] != x2.shape[:-1] or x1.dtype != x2.dtype:
        raise ValueError(f"searchsorted: rows of x1 {x1.shape} and x2 {x2.shape} must pair up, one dtype")
    return [(x2.shape, dt.int64)]


SEARCHSORTED = Library("searchsorted", _search_abstract,
                       lambda s, v, *, right: _kernels("sort").searchsorted(s, v, right),
                       lambda s, v, *, right: _kernels("sort").reference_searchsorted(s, v, right))


def _outside_int_range(x1, x2, side):
    """For a Python int past the range of integer x1's dtype: the insertion point (0 below the range, the
    length above it), after the checks the call makes anyway; None otherwise."""
    if isinstance(x2, bool) or not isinstance(x2, int) or x1.dtype.kind not in "iu":
        return None
    if side not in ("left", "right") or x1.ndim != 1:
        return None  # refused below, with the call's own message
    info = dt.iinfo(x1.dtype)
    return 0 if x2 < info.min else x1.shape[0] if x2 > info.max else None


def searchsorted(x1, x2, /, *, side="left", sorter=None):
    """Insertion points (int64, the shape of ``x2``) that keep the 1-D ``x1`` sorted: the array API's
    ``searchsorted``. ``side='left'``: the first position whose element is >= the value; ``'right'``: > it.
    NaN ranks above +inf (as sort puts it). ``sorter``: indices that sort ``x1`` (``argsort(x1)``).
    A Triton binary-search kernel."""
    from .indexing import take
    from .manipulation import reshape
    x1 = array_arg(x1, "searchsorted: x1")
    if isinstance(x2, (bool, int, float)):  # a Python scalar x2 (array API 2024.12)
        from .creation import asarray
        outside = _outside_int_range(x1, x2, side)
        if outside is not None:  # it would wrap in x1's dtype (-1 as uint8's 255): every element is above/below
            return asarray(outside, dtype=dt.int64, device=x1.device)
        x2 = asarray(x2, dtype=dt.result_type(x1.dtype, x2), device=x1.device)
    x2 = array_arg(x2, "searchsorted: x2")
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if x1.ndim != 1:
        raise ValueError(f"searchsorted: x1 must be one-dimensional, got shape {x1.shape}")
    _real("searchsorted", "x1", x1._node)
    _real("searchsorted", "x2", x2._node)
    if sorter is not None:
        if isinstance(sorter, (list, tuple)):
            sorter = np.asarray(sorter)
        known = sorter if isinstance(sorter, np.ndarray) else None   # host indices: range-checked here, as numpy
        sorter = array_arg(sorter, "searchsorted: sorter")
        if sorter.dtype.kind not in "iu" or sorter.shape != x1.shape:
            raise ValueError(f"searchsorted: sorter must be integer indices of shape {x1.shape}, "
                             f"got {sorter.dtype} {sorter.shape}")
        if known is not None and known.size and not (0 <= known.min() and known.max() < known.size):
            raise IndexError(f"searchsorted: sorter holds an index outside [0, {known.size}): "
                             f"{int(known.min())}..{int(known.max())}")
        x1 = take(x1, sorter)
    d = dt.promote(x1.dtype, x2.dtype)
    x1, x2 = x1.astype(d, copy=False), x2.astype(d, copy=False)
    (out,) = call(SEARCHSORTED, [x1, reshape(x2, (x2.size,))], right=side == "right")
    return reshape(out, x2.shape)


# ---- unique_* (evaluate) -------------------------------------------------------------------------------------
class UniqueAll(NamedTuple):
    """unique_all's result: the array API's (values, indices, inverse_indices, counts)."""
    values: object
    indices: object
    inverse_indices: object
    counts: object


class UniqueCounts(NamedTuple):
    """unique_counts' result: (values, counts)."""
    values: object
    counts: object


class UniqueInverse(NamedTuple):
    """unique_inverse's result: (values, inverse_indices)."""
    values: object
    inverse_indices: object


def _unique(x, want_inverse, op="unique"):
    """(values, first indices, inverse (x's shape) or None, counts), evaluating where groups start.
    ``op`` (the public function's name) names the errors."""
    from .creation import asarray, zeros
    from .indexing import nonzero, take
    from .manipulation import concat, reshape
    x = array_arg(x, f"{op}: x")
    _real(op, "x", x._node, allow_bool=True)  # (complex values have no order to sort them by)
    flat = reshape(x, (x.size,))
    n = x.size
    keys = flat.astype(dt.uint8) if x.dtype == dt.bool_ else flat  # the sort kernel orders bytes
    values, perm = call(SORT, [keys], descending=False) if n else (keys, zeros((0,), dtype=dt.int64))
    # a group starts where a value differs from the one before it (NaN != NaN: each NaN is its own)
    new = concat([asarray([True], device=x.device), values[1:] != values[:-1]]) if n else values != values
    (starts,) = nonzero(new)  # evaluates: the number of unique values depends on the data
    ends = concat([starts[1:], asarray([n], dtype=dt.int64, device=x.device)])
    inverse = None
    if want_inverse:
        group = cumulative_sum(new.astype(dt.int64)) - 1  # the scan kernel
        inverse = reshape(zeros((n,), dtype=dt.int64, device=x.device).at[perm].set(group), x.shape)
    uniq = take(values, starts).astype(x.dtype, copy=False)
    return uniq, take(perm, starts), inverse, ends - starts


def unique_values(x, /):
    """The distinct values of ``x``, sorted (1-D): the array API's ``unique_values``. NaNs are each
    distinct; -0.0 and 0.0 are one value. **Evaluates** ``x`` (the length depends on the values)."""
    return _unique(x, False, "unique_values")[0]


def unique_counts(x, /):
    """(values, counts) of ``x``'s distinct values: the array API's ``unique_counts``. **Evaluates** ``x``."""
    values, _, _, counts = _unique(x, False, "unique_counts")
    return UniqueCounts(values, counts)


def unique_inverse(x, /):
    """(values, inverse_indices): ``values[inverse_indices] == x`` (inverse has ``x``'s shape): the array
    API's ``unique_inverse``. **Evaluates** ``x``."""
    values, _, inverse, _ = _unique(x, True, "unique_inverse")
    return UniqueInverse(values, inverse)


def unique_all(x, /):
    """(values, indices of first occurrences, inverse_indices, counts): the array API's ``unique_all``.
    **Evaluates** ``x``."""
    return UniqueAll(*_unique(x, True, "unique_all"))
