"""Shape and layout: reshape, permute, expand, squeeze, broadcast, flip, concat, stack, pad, roll, tile, repeat,
tril/triu, meshgrid, diff (indexing lives in indexing.py).

reshape, permute, expand, squeeze, broadcast, flip, unstack and meshgrid are views (views.py): they record
movement ops and run nothing. concat, stack, pad, roll and tile copy (one kernel); tril/triu are a where
over an iota mask (they fuse).
"""
from __future__ import annotations

import math

import numpy as np

from .. import ir, views
from .._array import Array
from .core import array_arg, astype, is_view_of_memory, movement, node_of


def reshape(x, shape, copy=None) -> Array:
    """``x`` with a new ``shape`` (one -1 is inferred), in C order; any dtype. A view where strides allow,
    else a copy made lazily. ``copy`` (the array API's): True always copies (the result is memory of its own,
    which DLPack consumers may write without touching x's); False raises ValueError where strides cannot
    describe the result over x's memory (a transposed buffer made flat), as numpy's; None: either."""
    node = node_of(x)
    if copy not in (None, True, False):
        raise TypeError(f"reshape: copy must be None, True or False, got {copy!r}")
    shape = tuple(views.as_int(s, "reshape: each size") for s in views.axis_tuple(shape, "reshape: shape"))
    shape = views.check_shape(_infer_minus_one(node.shape, shape), "reshape: shape")
    if copy:
        x = astype(x, node.dtype, copy=True)
    elif copy is False and shape != node.shape and not is_view_of_memory(x, [("reshape", shape)]):
        raise ValueError(f"reshape: copy=False, but {node.shape} -> {shape} needs a copy: no strides describe it "
                         "over this array's memory (a transposed layout made flat, for one); use copy=None")
    if shape == node.shape:
        return x
    return movement(x, [("reshape", shape)], shape)


def _infer_minus_one(old, shape):
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: at most one -1 in the new shape, got {shape}")
    if any(s < -1 for s in shape):
        raise ValueError(f"reshape: negative size in {shape}")
    known = math.prod(s for s in shape if s != -1)
    total = math.prod(old)
    if -1 in shape:
        if known == 0 or total % known:
            raise ValueError(f"cannot reshape array of shape {old} (size {total}) into shape {shape}")
        shape = tuple(total // known if s == -1 else s for s in shape)
    if math.prod(shape) != total:
        raise ValueError(f"cannot reshape array of shape {old} (size {total}) into shape {shape} "
                         f"(size {math.prod(shape)})")
    return shape


_TRANSPOSE = (('permute', (1, 0)),)


def permute_dims(x, axes) -> Array:
    """``x`` with its axes reordered by the permutation ``axes`` (numpy's transpose); a view, any dtype."""
    node = node_of(x)
    if axes == (1, 0) and len(node.shape) == 2:   # x.T, checked already: the common case, first
        return movement(x, _TRANSPOSE, node.shape[::-1])
    axes = tuple(views.normalize_axis(a, len(node.shape), "permute_dims: axis")
                 for a in views.axis_tuple(axes, "permute_dims: axes"))
    if sorted(axes) != list(range(len(node.shape))):
        raise ValueError(f"permute_dims: axes {axes} are not a permutation of the {len(node.shape)} dims of shape "
                         f"{node.shape}")
    if axes == tuple(range(len(axes))):
        return x
    shape = tuple(node.shape[a] for a in axes)
    return movement(x, [("permute", axes)], shape)


def matrix_transpose(x) -> Array:
    """``x`` with its last two axes swapped (``x.mT``); a view, any dtype; needs at least 2 dimensions."""
    from .core import array_arg
    return array_arg(x, "matrix_transpose: x").mT


def expand_dims(x, axis=0) -> Array:
    """``x`` with a size-1 axis inserted at ``axis`` (an int or, as in numpy, a tuple); a view, any dtype."""
    node = node_of(x)
    axes = views.axis_tuple(axis, "expand_dims: axis")
    ndim = len(node.shape) + len(axes)
    axes = sorted(views.normalize_axis(a, ndim, "expand_dims: axis") for a in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"expand_dims: repeated axis in {axis}")
    shape = list(node.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(x, tuple(shape))


def squeeze(x, axis=None) -> Array:
    """``x`` without the size-1 axes ``axis`` (all of them when None); a view, any dtype.

    A named axis whose size is not 1 raises ValueError."""
    node = node_of(x)
    if axis is None:
        axes = tuple(i for i, s in enumerate(node.shape) if s == 1)
    else:
        axes = views.normalize_axes(axis, len(node.shape))
    for a in axes:
        if node.shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} of shape {node.shape} has size {node.shape[a]}, not 1")
    return reshape(x, tuple(s for i, s in enumerate(node.shape) if i not in axes))


def broadcast_to(x, shape) -> Array:
    """``x`` broadcast to ``shape`` by numpy's rules; a stride-0 view (no copy), any dtype."""
    node = node_of(x)
    shape = views.check_shape(shape, "broadcast_to: shape")
    if views.broadcast_shapes(node.shape, shape) != shape:
        raise ValueError(f"cannot broadcast shape {node.shape} to {shape}")
    if shape == node.shape:
        return x
    lead = (1,) * (len(shape) - len(node.shape)) + node.shape
    ops = ([("reshape", lead)] if lead != node.shape else []) + [("expand", shape)]
    return movement(x, ops, shape)


def broadcast_shapes(*shapes) -> tuple:
    """The shape that arrays of ``shapes`` broadcast to (numpy's rules); ValueError naming every shape if none."""
    return views.broadcast_shapes(*[views.check_shape(s, "broadcast_shapes: shape") for s in shapes])


def broadcast_arrays(*arrays) -> list:
    """The arrays broadcast to their common shape, as a list of views (numpy returns a tuple); any dtypes."""
    arrays = [array_arg(a, f"broadcast_arrays: argument {i}") for i, a in enumerate(arrays)]
    shape = views.broadcast_shapes(*[a.shape for a in arrays])
    return [broadcast_to(a, shape) for a in arrays]


def flip(x, axis=None) -> Array:
    """``x`` reversed along ``axis`` (all axes when None); a view (numpy-style negative strides), any dtype."""
    node = node_of(x)
    axes = views.normalize_axes(axis, len(node.shape))
    axes = tuple(a for a in axes if node.shape[a] > 1)   # reversing one element (or none) is the identity:
    if not axes:                                          # no flip to copy (copy=False would refuse it)
        return x
    return movement(x, [("flip", axes)], node.shape)


def moveaxis(x, source, destination) -> Array:
    """``x`` with axes ``source`` moved to positions ``destination`` (ints or tuples); a view, any dtype."""
    x = array_arg(x, "moveaxis: x")
    nd = x.ndim
    src = [views.normalize_axis(a, nd, "moveaxis: source") for a in views.axis_tuple(source, "moveaxis: source")]
    dst = [views.normalize_axis(a, nd, "moveaxis: destination")
           for a in views.axis_tuple(destination, "moveaxis: destination")]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"moveaxis: source {source} and destination {destination} must be distinct axes, "
                         "as many of each")
    order = [a for a in range(nd) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return permute_dims(x, tuple(order))


def concat(arrays, axis=0) -> Array:
    """Concatenate along ``axis`` (None: flatten first): one output buffer, each input copied into its slice
    by our kernel. Dtypes promote as ``result_type``; 0-d arrays raise ValueError."""
    from .. import dtypes as dt
    from ..ir import Node
    from .core import array_arg, cast_node, common_device
    arrays = [array_arg(a, f"concat: arrays[{i}]") for i, a in enumerate(arrays)]
    if not arrays:
        raise ValueError("concat needs at least one array")
    if axis is None:
        arrays, axis = [reshape(a, (-1,)) for a in arrays], 0
    device = common_device(arrays)
    first = arrays[0].shape
    nd = len(first)
    if nd == 0:
        raise ValueError("concat: zero-dimensional arrays cannot be concatenated")
    axis = views.normalize_axis(axis, nd)
    for a in arrays:
        if len(a.shape) != nd or any(s != f for i, (s, f) in enumerate(zip(a.shape, first)) if i != axis):
            raise ValueError(f"concat: shapes {', '.join(str(b.shape) for b in arrays)} differ outside axis {axis}")
    d = dt.result_type(*[a.dtype for a in arrays])
    shape = list(first)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    inputs = tuple(cast_node(a._node, d) for a in arrays)
    return Array(Node(CONCAT, inputs, axis, tuple(shape), d, device))


def stack(arrays, axis=0) -> Array:
    """Join same-shaped arrays along a new axis ``axis``; dtypes promote (``result_type``). Copies, as concat."""
    from .core import array_arg
    arrays = [array_arg(a, f"stack: arrays[{i}]") for i, a in enumerate(arrays)]
    if not arrays:
        raise ValueError("stack needs at least one array")
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"stack: all arrays need one shape, got {', '.join(map(str, (a.shape for a in arrays)))}")
    axis = views.normalize_axis(axis, arrays[0].ndim + 1)
    return concat([expand_dims(a, axis) for a in arrays], axis=axis)


CONCAT = ir.Tagged("concat", "concat")


def _as_pairs(value, ndim):
    """numpy's forms of a pad argument (a scalar, (before, after), one pair per axis, or anything that broadcasts
    to (ndim, 2), as ((before, after),)) -> one (before, after) per axis, entries unchecked."""
    w = np.asarray(value, dtype=object)
    try:
        return [tuple(pair) for pair in np.broadcast_to(w, (ndim, 2))] if w.ndim <= 2 else None
    except ValueError:
        return None


def _pad_widths(pad_width, ndim):
    """numpy's forms (an int, (before, after), or one pair per axis) -> one (before, after) per axis."""
    w = np.asarray(pad_width, dtype=object)
    if ndim == 0 and w.ndim <= 1 and w.size <= 2:  # numpy: any of the forms pads a 0-d array by nothing
        for v in w.reshape(-1):
            views.as_int(v, "pad: pad_width entries")
        return []
    pairs = _as_pairs(pad_width, ndim)
    if pairs is None:
        raise ValueError(f"pad: pad_width {pad_width!r} must be an int, a (before, after) pair or {ndim} pairs")
    out = [tuple(views.as_int(v, "pad: pad_width entries") for v in pair) for pair in pairs]
    if any(v < 0 for pair in out for v in pair):
        raise ValueError(f"pad: pad_width {pad_width!r} has a negative width")
    return out


def _pad_value(v):
    """A constant_values entry as a Python scalar (a numpy scalar's value: x's dtype decides the result's)."""
    if isinstance(v, np.generic) and v.dtype.kind in "biufc":
        v = v.item()
    if not isinstance(v, (bool, int, float, complex)):
        raise TypeError(f"pad: constant_values must be Python or numpy scalars (one, a (before, after) pair, or "
                        f"a pair per axis), got {type(v).__name__}")
    return v


_PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def pad(x, pad_width, mode="constant", *, constant_values=0) -> Array:
    """``x`` padded as numpy's ``pad``: ``pad_width`` is an int, a (before, after) pair, or one pair per
    axis (or any form that broadcasts to those, as numpy's); ``mode`` is 'constant' (``constant_values``, cast to
    ``x``'s dtype: one scalar, a (before, after) pair or a pair per axis), 'edge', 'reflect',
    'symmetric' or 'wrap' (any widths, as numpy: the latter three repeat with periods 2(n-1), 2n, n).
    Any dtype. Lazy: the padding is a constant or views of ``x``, joined by concat (a copy per piece)."""
    from .creation import full
    node = node_of(x)
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode must be one of {', '.join(_PAD_MODES)}, got {mode!r}")
    if mode != "constant":
        return _pad_from_x(x, _pad_widths(pad_width, len(node.shape)), mode)
    widths = _pad_widths(pad_width, len(node.shape))
    if not widths:   # a 0-d x (numpy pads it by nothing): the values are only checked
        values = [tuple(np.asarray(constant_values, dtype=object).reshape(-1))]
    else:
        values = _as_pairs(constant_values, len(node.shape))
        if values is None:
            raise ValueError(f"pad: constant_values {constant_values!r} must be a scalar, a (before, after) pair or "
                             f"{len(node.shape)} pairs")
    values = [tuple(_pad_value(v) for v in pair) for pair in values]
    out = x
    for axis, (before, after) in enumerate(widths):
        parts = []
        for width, value in zip((before, after), values[axis]):
            shape = list(out.shape)
            shape[axis] = width
            parts.append(full(tuple(shape), value, dtype=node.dtype, device=node.device) if width else None)
        if parts[0] is not None or parts[1] is not None:
            out = concat([p for p in (parts[0], out, parts[1]) if p is not None], axis=axis)
    return out


def _pad_from_x(x, widths, mode):
    """Padding taken from ``x`` itself: per axis, the source index of every output position (numpy's rule
    for ``mode``), cut into runs that are views of ``x`` (a slice, a reversed slice, or one element
    broadcast), joined by a concat."""
    out = x
    for axis, (before, after) in enumerate(widths):
        if not before and not after:
            continue
        n = out.shape[axis]
        if n == 0:
            raise ValueError(f"pad: mode={mode!r} cannot pad axis {axis}, which is empty")
        # only the pads' positions are listed: the middle is x's own axis, one slice (listing all n + pads
        # positions made recording O(n): seconds for 2**24 elements)
        spans = [*_runs([_pad_source(i, n, mode) for i in range(-before, 0)]), (0, n, 1),
                 *_runs([_pad_source(i, n, mode) for i in range(n, n + after)])]
        parts = []
        for start, stop, step in spans:
            key = [slice(None)] * out.ndim
            if step == 0:
                key[axis] = slice(start, start + 1)
                piece = out[tuple(key)]
                shape = list(piece.shape)
                shape[axis] = stop
                parts.append(broadcast_to(piece, tuple(shape)))
            else:
                key[axis] = slice(start, stop if stop >= 0 else None, step)
                parts.append(out[tuple(key)])
        out = concat(parts, axis=axis) if len(parts) > 1 else parts[0]
    return out


def _pad_source(i, n, mode) -> int:
    """Which element of an axis of length n position i (0 = the first original one) copies."""
    if mode == "edge":
        return min(max(i, 0), n - 1)
    if mode == "wrap":
        return i % n
    if mode == "symmetric":
        j = i % (2 * n)
        return j if j < n else 2 * n - 1 - j
    if n == 1:  # reflect: the period 2(n - 1) of a single element is 0
        return 0
    j = i % (2 * n - 2)
    return j if j < n else 2 * n - 2 - j


def _runs(index):
    """(start, stop, step) slices covering ``index`` in order: runs stepping by +1 or -1, and repeats as
    (element, count, 0)."""
    runs, i = [], 0
    while i < len(index):
        j = i + 1
        if j < len(index) and index[j] == index[i]:
            while j < len(index) and index[j] == index[i]:
                j += 1
            runs.append((index[i], j - i, 0))
        else:
            step = index[j] - index[i] if j < len(index) and abs(index[j] - index[i]) == 1 else 1
            while j < len(index) and index[j] - index[j - 1] == step:
                j += 1
            runs.append((index[i], index[j - 1] + step, step))
        i = j
    return runs


def _triangle(x, k, upper):
    from .core import where
    from .creation import arange
    node = node_of(x)
    if len(node.shape) < 2:
        raise ValueError(f"{'triu' if upper else 'tril'}: x must have at least 2 dimensions, got shape {node.shape}")
    k = views.as_int(k, "k")
    n, m = node.shape[-2:]
    i = reshape(arange(n, device=node.device), (n, 1))
    j = arange(m, device=node.device)
    keep = (j - i >= k) if upper else (j - i <= k)
    return where(keep, x, 0).astype(node.dtype, copy=False)


def tril(x, /, *, k=0) -> Array:
    """The lower triangle of the last two axes of ``x`` (on and below diagonal ``k``), zeros elsewhere.
    Any dtype; a lazy where over an iota mask (it fuses)."""
    return _triangle(x, k, upper=False)


def triu(x, /, *, k=0) -> Array:
    """The upper triangle of the last two axes of ``x`` (on and above diagonal ``k``), zeros elsewhere.
    Any dtype; a lazy where over an iota mask (it fuses)."""
    return _triangle(x, k, upper=True)


def roll(x, /, shift, *, axis=None) -> Array:
    """``x`` with elements shifted by ``shift`` along ``axis`` (flattened when None), wrapping around, as
    numpy. ``shift`` and ``axis`` may be ints or equal-length tuples. Any dtype; two slices joined (concat)."""
    node = node_of(x)
    if axis is None:   # numpy's and JAX's: a tuple of shifts rolls the flat array by their sum
        total = sum(views.as_int(s, "roll: shift") for s in views.axis_tuple(shift, "roll: shift"))
        return reshape(roll(reshape(x, (-1,)), total, axis=0), node.shape)
    shifts, axes = views.axis_tuple(shift, "roll: shift"), views.axis_tuple(axis, "roll: axis", none_ok=True)
    if len(shifts) == 1 and len(axes) > 1:
        shifts = shifts * len(axes)
    if len(shifts) != len(axes):
        raise ValueError(f"roll: shift {shift} and axis {axis} must have the same length")
    out = x
    for s, a in zip(shifts, axes):
        a = views.normalize_axis(a, len(node.shape), "roll: axis")
        n = node.shape[a]
        s = views.as_int(s, "roll: shift") % n if n else 0
        if s:
            lead = (slice(None),) * a
            out = concat([out[lead + (slice(n - s, None),)], out[lead + (slice(0, n - s),)]], axis=a)
    return out


def tile(x, repetitions, /) -> Array:
    """``x`` repeated ``repetitions[i]`` times along each axis (numpy's tile: a shorter tuple applies to the
    last axes, a longer one adds leading axes). Any dtype; a broadcast then a reshape (a copy, lazily)."""
    node = node_of(x)
    reps = tuple(views.as_int(r, "tile: repetitions") for r in views.axis_tuple(repetitions, "tile: repetitions"))
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: repetitions {reps} must be non-negative")
    nd = max(len(reps), len(node.shape))
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - len(node.shape)) + node.shape
    spread = reshape(x, tuple(v for s in shape for v in (1, s)))
    wide = broadcast_to(spread, tuple(v for r, s in zip(reps, shape) for v in (r, s)))
    return reshape(wide, tuple(r * s for r, s in zip(reps, shape)))


def repeat(x, repeats, /, *, axis=None) -> Array:
    """Each element of ``x`` repeated ``repeats`` times along ``axis`` (flattened when None), as numpy.

    An int ``repeats`` is a broadcast and a reshape (lazy, no data read). Per-element repeats (a sequence or
    an array) make a data-dependent shape: a lazy fa.Array of repeats is **evaluated**, then the result
    is a gather. Any dtype for ``x``."""
    from .indexing import take
    node = node_of(x)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    axis = views.normalize_axis(axis, x.ndim, "repeat: axis")
    n = x.shape[axis]
    if hasattr(repeats, "__index__") and not isinstance(repeats, Array) or isinstance(repeats, np.integer):
        r = views.as_int(repeats, "repeat: repeats")
        if r < 0:
            raise ValueError(f"repeat: repeats must be non-negative, got {r}")
        shape = x.shape
        spread = expand_dims(x, axis + 1)
        wide = broadcast_to(spread, shape[:axis + 1] + (r,) + shape[axis + 1:])
        return reshape(wide, shape[:axis] + (n * r,) + shape[axis + 1:])
    if isinstance(repeats, Array):  # its dtype and shape are checked before its values are computed
        _check_repeats(not repeats.dtype.is_integer, repeats.dtype.name, tuple(repeats.shape), axis, n)
        counts = np.asarray(repeats._values().cpu())
    else:
        counts = np.asarray(repeats)
        if counts.size == 0 and not isinstance(repeats, np.ndarray):  # [] reads as float64: no counts at all
            counts = counts.astype(np.int64)
        _check_repeats(counts.dtype.kind not in "iu", counts.dtype, counts.shape, axis, n)
    if (counts < 0).any():
        raise ValueError("repeat: repeats must be non-negative")
    if counts.dtype == np.uint64 and (counts > np.iinfo(np.int64).max).any():
        raise ValueError("repeat: a repeat count above 2**63 - 1")
    counts = counts.astype(np.int64)   # numpy's repeat refuses uint64 counts ("cannot cast ... 'safe'")
    del node
    return take(x, np.repeat(np.arange(n), np.broadcast_to(counts, (n,))), axis=axis)


def _check_repeats(not_integer: bool, dtype, shape: tuple, axis: int, n: int):
    if not_integer or len(shape) > 1:
        raise TypeError(f"repeat: repeats must be an int or a 1-D integer sequence, got {dtype} of shape {shape}")
    if len(shape) == 1 and shape[0] not in (1, n):
        raise ValueError(f"repeat: {shape[0]} repeats for axis {axis} of size {n}")


def unstack(x, /, *, axis=0) -> tuple:
    """``x`` split along ``axis`` into a tuple of its slices (each a view, one dimension fewer). Any dtype."""
    node = node_of(x)
    if not node.shape:
        raise ValueError("unstack: x must have at least one dimension")
    axis = views.normalize_axis(axis, len(node.shape), "unstack: axis")
    return tuple(x[(slice(None),) * axis + (i,)] for i in range(node.shape[axis]))


def meshgrid(*arrays, indexing="xy") -> list:
    """Coordinate grids from 1-D arrays (numpy's meshgrid): ``indexing='xy'`` (default) swaps the first two
    output axes, ``'ij'`` does not. Each grid is a broadcast view (no copy); dtypes are kept."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    for i, a in enumerate(arrays):
        if node_of(a).shape and len(a.shape) != 1:
            raise ValueError(f"meshgrid: array {i} must be 1-D, got shape {a.shape}")
    sizes = [a.size for a in arrays]
    if indexing == "xy" and len(arrays) > 1:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for i, a in enumerate(arrays):
        at = (1 if i == 0 else 0) if indexing == "xy" and len(arrays) > 1 and i < 2 else i
        shape = tuple(a.size if d == at else 1 for d in range(len(arrays)))
        out.append(broadcast_to(reshape(a, shape), tuple(sizes)))
    return out


def _diff_edge(p, x, axis, name):
    """diff's ``prepend``/``append`` as numpy takes them: an array of x's shape but along ``axis``, or a scalar
    (Python, numpy, 0-d) spread over x's shape with length 1 along ``axis``."""
    from .. import dtypes as dt
    from .core import as_array, constant
    if p is None:
        return None
    shape = x.shape[:axis] + (1,) + x.shape[axis + 1:]
    if isinstance(p, (bool, int, float, complex)):   # weak, as in x - p
        return Array(constant(p, shape, dt.result_type(x.dtype, p), x.device))
    p = as_array(p, x.device)
    if not isinstance(p, Array):
        raise TypeError(f"diff: {name} must be an array or a scalar, got {type(p).__name__}")
    if p.ndim == 0:
        return broadcast_to(p, shape)
    if p.ndim != x.ndim or p.shape[:axis] + p.shape[axis + 1:] != x.shape[:axis] + x.shape[axis + 1:]:
        raise ValueError(f"diff: {name} of shape {p.shape} does not fit x of shape {x.shape} along axis {axis} "
                         "(it must match x's shape on every other axis, or be a scalar)")
    return p


def diff(x, /, *, axis=-1, n=1, prepend=None, append=None) -> Array:
    """The ``n``-th discrete difference ``x[1:] - x[:-1]`` along ``axis``, after joining ``prepend`` and
    ``append`` (arrays of x's shape but along ``axis``, or scalars, spread as numpy does); bool inputs give
    ``!=`` (numpy's rule). Lazy views and one elementwise op per order."""
    from .elementwise import not_equal, subtract
    node = node_of(x)
    if not node.shape:
        raise ValueError("diff: x must have at least one dimension")
    axis = views.normalize_axis(axis, len(node.shape), "diff: axis")
    n = views.as_int(n, "diff: n")
    if n < 0:
        raise ValueError(f"diff: n must be non-negative, got {n}")
    edges = [_diff_edge(p, x, axis, name) for p, name in ((prepend, "prepend"), (append, "append"))]
    parts = [p for p in (edges[0], x, edges[1]) if p is not None]
    out = concat(parts, axis=axis) if len(parts) > 1 else x
    lead = (slice(None),) * axis
    for _ in range(n):
        op = not_equal if out.dtype.kind == "b" else subtract
        out = op(out[lead + (slice(1, None),)], out[lead + (slice(None, -1),)])
    return out
