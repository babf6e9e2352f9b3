"""Indexing: ``x[key]``, ``fa.take``, ``fa.take_along_axis``, ``fa.nonzero`` and JAX's functional updates
``x.at[key].set/add/multiply/divide/min/max/get``.

- Basic keys (ints, slices, None, ...) read through a view (no kernel), and update through a fused
  ``where`` over an iota mask: ``x.at[:, 1:3].set(0)`` is one elementwise kernel with its neighbours.
- Integer-array keys follow numpy's rules (advanced indices broadcast together; their dims replace them in
  place when they are adjacent in the key, else they go first) and record one library call: ``gather``
  (torch indexing) or ``scatter`` (torch ``index_put_``/``index_reduce_``). Both are graph nodes, lazy,
  differentiable and batchable (ad_rules.py, batch_rules.py).
- Boolean masks have data-dependent shapes: ``x[mask]`` evaluates the mask (a documented trigger) and
  indexes with its nonzero positions. ``x.at[mask].set(scalar)`` needs no shape and stays a lazy ``where``.

Out-of-range indices held in numpy arrays, lists or ints raise IndexError when recorded. Indices held in
fa arrays or torch tensors are device data, evaluated or not: checking them would read them back (a host
sync), so they are never checked; reads clamp them into range and updates drop them (JAX's rules).
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import NamedTuple

import numpy as np
import torch

from .. import dtypes as dt
from .. import unsigned, views
from .._array import Array
from .checks import check_bool
from .core import movement, node_of
from .library import Library, call


# ---- the two library primitives --------------------------------------------------------------------------------
# gather(z, idx): z[idx] along axis 0, idx already in range; scatter(z, idx, v, mode): z with rows idx combined
# with v (rows of idx outside [0, len(z)) are dropped). The front reduces every index form to these two.
def _gather_abstract(z, idx):
    _check_index_dtype("gather", idx.dtype)
    if not z.shape:
        raise ValueError("gather: the source must have at least one dimension")
    return [(idx.shape + z.shape[1:], z.dtype)]


def _gather_torch(z, idx):
    return unsigned.from_bits(unsigned.bits_view(z)[idx.long()], z.dtype)  # a move: any dtype


GATHER = Library("gather", _gather_abstract, _gather_torch, _gather_torch)

SCATTER_MODES = ("set", "add", "multiply", "min", "max")


def _scatter_abstract(z, idx, v, *, mode):
    _check_index_dtype("scatter", idx.dtype)
    if mode not in SCATTER_MODES:
        raise ValueError(f"scatter: mode must be one of {SCATTER_MODES}, got {mode!r}")
    if v.shape != idx.shape + z.shape[1:] or v.dtype != z.dtype:
        raise AssertionError(f"scatter: values {v.shape} {v.dtype} for indices {idx.shape} into {z.shape} {z.dtype}")
    return [(z.shape, z.dtype)]


def _scatter_torch(z, idx, v, *, mode):
    n = z.shape[0]
    # one spare row takes the dropped (out-of-range) updates: no data-dependent filtering, no host sync
    out = torch.cat([z, z.new_zeros((1,) + tuple(z.shape[1:]))])
    idx = idx.reshape(-1).long()
    idx = torch.where((idx >= 0) & (idx < n), idx, n)
    v = v.reshape((idx.numel(),) + tuple(z.shape[1:]))   # not -1: a zero-size row leaves -1 undecided
    as_bool = out.dtype == torch.bool and mode != "set"
    if as_bool:  # torch reduces no bools: or/and/min/max through uint8
        out, v = out.to(torch.uint8), v.to(torch.uint8)
    wide = out.dtype if unsigned.is_wide(out.dtype) else None
    if wide is not None:  # uint16/32/64 (no torch kernels): int64 lanes, min/max in the unsigned order
        out, v = unsigned.to_lanes(out), unsigned.to_lanes(v)
        if mode in ("min", "max"):
            out, v = unsigned.order_key(out), unsigned.order_key(v)
    if mode == "set":
        out = _set_last_wins(out, idx, v)
    elif mode == "multiply" and out.is_complex():
        out = _multiply_in_order(out, idx, v)
    elif mode == "add" and not as_bool:
        out.index_put_((idx,), v, accumulate=True)
    else:
        reduce = {"add": "amax", "multiply": "prod", "min": "amin", "max": "amax"}[mode]  # bool add is or
        with warnings.catch_warnings():  # "index_reduce() is in beta": its semantics are what we test
            warnings.simplefilter("ignore", UserWarning)
            out.index_reduce_(0, idx, v, reduce)
    out = out[:n]
    if wide is not None:
        return unsigned.from_lanes(unsigned.order_key(out) if mode in ("min", "max") else out, wide)
    return out.to(torch.bool) if as_bool else out


def _set_last_wins(out, idx, v):
    """``out[idx] = v`` where, of repeated indices, the last value lands (numpy's rule; index_put_ leaves it
    unspecified on a GPU). Deterministic, and what set's derivative assumes (ad_rules.scatter_winners)."""
    if v.shape[0] == 0:
        return out
    order = torch.arange(idx.shape[0], device=idx.device)
    winner = torch.full((out.shape[0],), -1, dtype=order.dtype, device=idx.device)
    winner.scatter_reduce_(0, idx, order, "amax")
    hit = (winner >= 0).reshape((-1,) + (1,) * (out.dim() - 1))
    return torch.where(hit, v[winner.clamp(min=0)], out)


def _multiply_in_order(out, idx, v):
    """``out[idx] *= v`` for complex dtypes (index_reduce_ has no complex kernel). Repeated indices multiply
    in the order they come, as numpy's multiply.at (complex products are not associative in floating
    point): round k takes the k-th occurrence of every index, so one round's indices are distinct."""
    if idx.numel() == 0:
        return out
    sorted_idx, perm = torch.sort(idx, stable=True)
    pos = torch.arange(idx.numel(), device=idx.device)
    new = torch.ones_like(sorted_idx, dtype=torch.bool)
    new[1:] = sorted_idx[1:] != sorted_idx[:-1]
    first = torch.cummax(torch.where(new, pos, 0), 0).values  # where each run of one index starts
    rank = torch.empty_like(pos)
    rank[perm] = pos - first
    for k in range(int(rank.max()) + 1):  # a host read: as many rounds as the most repeated index
        hit = rank == k
        rows = idx[hit]
        out[rows] = out[rows] * v[hit]
    return out


SCATTER = Library("scatter", _scatter_abstract, _scatter_torch, _scatter_torch)


def _check_index_dtype(op, d):
    if d.kind not in "iu":
        raise TypeError(f"{op}: indices must have an integer dtype, got {d}")


# ---- parsing a key -----------------------------------------------------------------------------------------------
class Slot(NamedTuple):
    """One entry of a normalized key: kind 'none' (a new axis), 'int' (value: the index, in range),
    'slice' (value: (start, step, count)) or 'array' (value: a lazy int Array or an in-range int64 ndarray)."""
    kind: str
    axis: int
    value: object


def _classify(k):
    """(kind, value) for one key entry; kinds: none, ellipsis, int, slice, array, mask."""
    if type(k) is int:  # the common cases first: recording x[0, 1:3] should cost microseconds
        return "int", k
    if type(k) is slice:
        return "slice", k
    if k is None:
        return "none", None
    if k is Ellipsis:
        return "ellipsis", None
    if isinstance(k, torch.Tensor):
        from .creation import asarray
        k = asarray(k)
    if isinstance(k, Array):
        if k.dtype == dt.bool_:
            return "mask", k
        if k.dtype.kind not in "iu":
            raise TypeError(f"index arrays must have an integer or bool dtype, got {k.dtype}")
        return "array", k
    if isinstance(k, (bool, np.bool_)):
        raise TypeError("a boolean scalar index (x[True]) is not supported; use fa.expand_dims or fa.where")
    if isinstance(k, slice):
        return "slice", k
    if isinstance(k, (list, np.ndarray)):
        arr = np.asarray(k)
        if arr.dtype == np.bool_:
            return "mask", arr
        if arr.size == 0 and arr.dtype.kind == "f" and isinstance(k, list):  # x[[]]: an empty integer index,
            # as in numpy (which refuses an empty float64 ndarray, as here)
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"index arrays must have an integer or bool dtype, got {arr.dtype}")
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:  # would wrap negative
            raise IndexError(f"index {arr.max()} is out of bounds (beyond any axis)")
        return "array", arr.astype(np.int64)
    if hasattr(k, "__index__"):
        return "int", operator.index(k)
    raise TypeError(f"unsupported index {k!r} of type {type(k).__name__}: use ints, slices, None, ..., "
                    "integer arrays or boolean masks")


def parse(shape, key, masks="evaluate") -> list:
    """``key`` for an array of ``shape`` -> a list of Slots. ``masks``: 'evaluate' turns boolean masks into
    their nonzero positions (evaluating lazy ones), 'keep' leaves them as ('mask', axis, mask)."""
    entries = [_classify(k) for k in (key if isinstance(key, tuple) else (key,))]
    if sum(kind == "ellipsis" for kind, _ in entries) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(np.ndim(v) if kind == "mask" else kind in ("int", "slice", "array") for kind, v in entries
               if kind not in ("none", "ellipsis"))
    if used > len(shape):
        raise IndexError(f"too many indices ({used}) for an array of shape {shape}")
    slots, axis, empty_ellipsis = [], 0, None
    for kind, value in entries:
        if kind == "ellipsis":
            if len(shape) == used:
                empty_ellipsis = len(slots)  # no slot, but it still parts the advanced indices around it
            for _ in range(len(shape) - used):
                slots.append(Slot("slice", axis, (0, 1, shape[axis])))
                axis += 1
        elif kind == "none":
            slots.append(Slot("none", axis, None))
        elif kind == "mask":
            slots += _mask_slots(shape, axis, value, masks)
            axis += np.ndim(value)
        else:
            slots.append(_slot(kind, axis, shape[axis], value))
            axis += 1
    slots += [Slot("slice", a, (0, 1, shape[a])) for a in range(axis, len(shape))]
    if any(s.kind == "array" for s in slots):  # with an array index, ints index as 0-d arrays (numpy)
        slots = [Slot("array", s.axis, np.asarray(s.value, np.int64)) if s.kind == "int" else s for s in slots]
        if empty_ellipsis is not None:
            slots = _Slots(slots)
            slots.parted = (any(s.kind == "array" for s in slots[:empty_ellipsis])
                            and any(s.kind == "array" for s in slots[empty_ellipsis:]))
    return slots


class _Slots(list):
    """parse's slots, and whether an ellipsis of no axes sits between array indices (``parted``): numpy
    then puts their broadcast dims first, as for any other entry between them."""
    parted = False


def _slot(kind, axis, size, value):
    if kind == "slice":
        start, stop, step = value.indices(size)
        count = len(range(start, stop, step))
        # a step longer than the axis picks at most one element: step 1 keeps strides (and ramps) in range
        return Slot("slice", axis, (start, step if count > 1 else 1, count))
    if kind == "int":
        if not -size <= value < size:
            raise IndexError(f"index {value} is out of bounds for axis {axis} with size {size}")
        return Slot("int", axis, value % size)
    if isinstance(value, np.ndarray):
        return Slot("array", axis, _in_range(value, axis, size))
    return Slot("array", axis, value)


def _in_range(idx: np.ndarray, axis, size) -> np.ndarray:
    """Known indices are checked now (numpy's IndexError) and made non-negative."""
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise IndexError(f"index {idx[bad].flat[0]} is out of bounds for axis {axis} with size {size}")
    return np.where(idx < 0, idx + size, idx).astype(np.int64)


def _mask_slots(shape, axis, mask, masks):
    k = np.ndim(mask)
    if k == 0:
        raise TypeError("a 0-d boolean index is not supported; use fa.where")
    if tuple(np.shape(mask)) != tuple(shape[axis:axis + k]):
        raise IndexError(f"boolean index of shape {tuple(np.shape(mask))} does not match axes {axis}..{axis + k - 1} "
                         f"of the indexed array's shape {shape}")
    if masks == "keep":
        return [Slot("mask", axis, mask)]
    if isinstance(mask, Array):  # data-dependent shape: the mask is evaluated here (docs/semantics.md)
        positions = [p.numpy() if p.device.type == "cpu" else p for p in torch.nonzero(mask._values(), as_tuple=True)]
    else:
        positions = np.nonzero(mask)
    return [Slot("array", axis + i, p if isinstance(p, np.ndarray) else _device_index(p)) for i, p in
            enumerate(positions)]


def _device_index(t):
    from .creation import asarray
    return asarray(t)


# ---- reading ---------------------------------------------------------------------------------------------------
def getitem(x, key, fill=None) -> Array:
    """``x[key]`` with numpy's semantics: basic indexing (ints, slices with steps, None, ...) is a view;
    integer arrays (fa, numpy, torch, lists) gather (a lazy library call); a boolean mask evaluates itself
    (the result's shape depends on its values) and gathers its nonzero positions.

    Out-of-range indices given on the host (ints, lists, numpy) raise IndexError; indices in fa arrays or
    torch tensors (device data, never read back) are clamped into range (as JAX); with ``fill`` (a scalar), their
    elements are ``fill`` instead (x.at[key].get(mode='fill'))."""
    node = node_of(x)
    slots = parse(node.shape, key)
    if not any(s.kind == "array" for s in slots):
        return basic(x, slots)
    return _gather(x, slots, fill)


def basic(x, slots) -> Array:
    """The view of ``x`` that ints, slices and new axes select (no array slots)."""
    node = node_of(x)
    starts, steps, sizes, flips, out_shape = [], [], [], [], []
    for s in slots:
        if s.kind == "none":
            out_shape.append(1)
        elif s.kind == "int":
            starts.append(s.value), steps.append(1), sizes.append(1)
        else:
            start, step, count = s.value
            if step < 0:  # a negative step is a positive-step slice of the flipped axis
                starts.append(start + (count - 1) * step if count else 0), steps.append(-step), flips.append(s.axis)
            else:
                starts.append(start if count else 0), steps.append(step)
            sizes.append(count)
            out_shape.append(count)
    ops = []
    if any(s != 0 for s in starts) or any(s != 1 for s in steps) or tuple(sizes) != node.shape:
        ops.append(("slice", tuple(starts), tuple(steps), tuple(sizes)))
    if flips:  # reversed slice == flip of the ascending slice (of the pre-reshape array)
        ops.append(("flip", tuple(flips)))
    out_shape = tuple(out_shape)
    if out_shape != tuple(sizes):
        ops.append(("reshape", out_shape))
    return movement(x, ops, out_shape) if ops else x


def _layout(slots):
    """(positions of the array slots, where their broadcast dims go in the result: numpy puts them in place
    when the array slots are adjacent in the key, else first)."""
    adv = [i for i, s in enumerate(slots) if s.kind == "array"]
    adjacent = adv == list(range(adv[0], adv[-1] + 1)) and not getattr(slots, "parted", False)
    return adv, (adv[0] if adjacent else 0)


def _index_arrays(x, slots, adv, clamp):
    """The array slots as int64 Arrays, negative indices wrapped, lazy ones clamped into range (``clamp``) or not;
    and the mask of where every lazy one was in range (None when all are known)."""
    from .creation import asarray
    from .elementwise import clip, logical_and, where
    out, valid = [], None
    for i in adv:
        s, n = slots[i], x.shape[slots[i].axis]
        if isinstance(s.value, np.ndarray):
            out.append(asarray(s.value, device=x.device))
            continue
        idx = s.value
        if idx.dtype == dt.uint64:  # past int64's range it would wrap negative: saturate (out of range)
            from .elementwise import minimum
            idx = minimum(idx, np.iinfo(np.int64).max)
        idx = idx.astype(dt.int64, copy=False)
        ok = (idx >= -n) & (idx < n)
        idx = where(idx < 0, idx + n, idx)
        if clamp:
            idx = clip(idx, 0, max(n - 1, 0))
        valid = ok if valid is None else logical_and(valid, ok)
        out.append(idx)
    return out, valid


def _on_index_dims(a, b_shape, place, ndim):
    """``a`` broadcast to the index arrays' shape ``b_shape``, on the result's dims for them (they sit at ``place``
    among ``ndim``)."""
    from .manipulation import broadcast_to, reshape
    return reshape(broadcast_to(a, b_shape), (1,) * place + b_shape + (1,) * (ndim - place - len(b_shape)))


def _linear(indices, sizes):
    """The flat index into the row-major product of ``sizes`` (int64, broadcast over the indices)."""
    strides = views.contiguous_strides(sizes)
    lin = None
    for idx, st in zip(indices, strides):
        term = idx * st if st != 1 else idx
        lin = term if lin is None else lin + term
    return lin


def _gather(x, slots, fill=None) -> Array:
    from .core import where
    from .creation import full
    from .manipulation import broadcast_to, moveaxis, permute_dims, reshape
    adv, place = _layout(slots)
    y = basic(x, [Slot("slice", s.axis, (0, 1, x.shape[s.axis])) if s.kind == "array" else s for s in slots])
    rest = [i for i in range(len(slots)) if i not in adv]  # every slot is one axis of y (no ints are left)
    sizes = tuple(x.shape[slots[i].axis] for i in adv)
    indices, valid = _index_arrays(x, slots, adv, clamp=True)
    b_shape = views.broadcast_shapes(*[i.shape for i in indices])
    if math.prod(sizes) == 0 and math.prod(b_shape) > 0:
        raise IndexError(f"cannot index into axes of size 0 (shape {x.shape}) with non-empty indices")
    lin = broadcast_to(_linear(indices, sizes), b_shape)
    z = reshape(permute_dims(y, tuple(adv + rest)), (math.prod(sizes),) + tuple(y.shape[i] for i in rest))
    (out,) = call(GATHER, [z, lin])
    if place:
        nb = len(b_shape)
        out = moveaxis(out, tuple(range(nb)), tuple(range(place, place + nb)))
    if fill is not None and valid is not None:   # out-of-range lazy indices read ``fill``
        fill = full((), fill, dtype=x.dtype, device=x.device)
        out = where(_on_index_dims(valid, b_shape, place, out.ndim), out, fill)
    return out


def take(x, indices, /, *, axis=None, mode=None, fill_value=None) -> Array:
    """Elements of ``x`` at ``indices`` along ``axis`` (flattened ``x`` when None): numpy's/JAX's take,
    ``x[(slice(None),) * axis + (indices,)]``. Any dtype for ``x``; integer indices of any shape.

    ``mode``: None (out-of-range host indices -- ints, lists, numpy -- raise IndexError; fa/torch arrays
    clamp; jnp.take's default fills instead), 'clip' (every index is clamped into range: a negative one is 0, as
    numpy's and JAX's), 'wrap' (indices are taken modulo the axis size), 'fill' (out-of-range indices read
    ``fill_value``: by default NaN, the lowest signed / highest unsigned integer, True, as JAX's). A lazy library call
    (gather)."""
    from .manipulation import reshape
    node = node_of(x)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    elif not node.shape:
        raise ValueError("take: x must have at least one dimension when axis is given")
    axis = views.normalize_axis(axis, x.ndim, "take: axis")
    if mode not in (None, "clip", "wrap", "fill"):
        raise ValueError(f"take: mode must be None, 'clip', 'wrap' or 'fill', got {mode!r}")
    if fill_value is not None and mode != "fill":
        raise ValueError(f"take: fill_value is used with mode='fill' only, got mode={mode!r}")
    kind, idx = _classify(indices if not isinstance(indices, (int, np.integer)) else np.asarray(indices))
    if kind != "array":
        raise TypeError(f"take: indices must be an integer array (or list), got {type(indices).__name__}")
    n = x.shape[axis]
    if mode in ("wrap", "clip") and n == 0 and np.size(idx):
        raise IndexError(f"take: cannot {mode} indices into axis {axis} of size 0")
    if mode == "wrap":
        idx = np.mod(idx, n) if isinstance(idx, np.ndarray) else idx % n
    elif mode == "clip":   # clamped into [0, n - 1] as they are: a negative index is 0, not counted from the end
        from .elementwise import clip
        idx = np.clip(idx, 0, max(n - 1, 0)) if isinstance(idx, np.ndarray) else clip(idx, 0, max(n - 1, 0))
    if mode == "fill":
        key = (slice(None),) * axis + (_as_lazy_indices(idx, x),)
        return getitem(x, key, fill=_default_fill(x.dtype) if fill_value is None else fill_value)
    return getitem(x, (slice(None),) * axis + (idx,))


def take_along_axis(x, indices, /, *, axis=-1) -> Array:
    """``x`` picked along ``axis`` at ``indices`` (same rank as ``x``; the other axes broadcast): the array
    API's/numpy's take_along_axis, e.g. ``take_along_axis(x, argsort_result, axis=-1)``. Any dtype for ``x``.
    Out-of-range host indices (lists, numpy) raise IndexError; fa/torch arrays are clamped. A lazy library
    call (gather)."""
    from .creation import arange
    from .manipulation import reshape
    node = node_of(x)
    if not node.shape:
        raise ValueError("take_along_axis: x must have at least one dimension (a 0-d array has no axis to take along)")
    kind, idx = _classify(indices)
    if kind != "array":
        raise TypeError(f"take_along_axis: indices must be an integer array, got {type(indices).__name__}")
    if np.ndim(idx) != len(node.shape):
        raise ValueError(f"take_along_axis: indices (shape {tuple(np.shape(idx))}) must have the rank of x "
                         f"(shape {node.shape})")
    axis = views.normalize_axis(axis, len(node.shape), "take_along_axis: axis")
    others = [s for i, s in enumerate(node.shape) if i != axis]
    idx_others = [s for i, s in enumerate(np.shape(idx)) if i != axis]
    views.broadcast_shapes(tuple(others), tuple(idx_others))  # raises naming both
    key = []
    for a, n in enumerate(node.shape):
        if a == axis:
            key.append(idx)
        elif n == 1:
            key.append(np.zeros((1,) * len(node.shape), np.int64))
        else:
            at_a = tuple(n if i == a else 1 for i in range(len(node.shape)))
            key.append(reshape(arange(n, device=node.device), at_a))
    return getitem(x, tuple(key))


def nonzero(x, /) -> tuple:
    """The indices of ``x``'s nonzero elements, one int64 array per axis (row-major order), as numpy.

    **Evaluates ``x``**: the result's length depends on its values. 0-d inputs raise ValueError."""
    from .creation import asarray
    node = node_of(x)
    if not node.shape:
        raise ValueError("nonzero: x must have at least one dimension (0-d input is not allowed)")
    # the signed view: the same zeros, and torch has no nonzero for uint16/32/64
    return tuple(asarray(p) for p in torch.nonzero(unsigned.signed_view(x._values()), as_tuple=True))


# ---- functional updates: x.at[key].op(values) ---------------------------------------------------------------------
class At:
    """``x.at``: JAX's functional updates. ``x.at[key].set(v)`` returns a new array equal to ``x`` except
    at ``key``; ``add``, ``multiply``, ``divide``, ``min``, ``max`` combine instead (repeated indices
    accumulate), ``get()`` reads ``x[key]``. ``x`` never changes (arrays are immutable)."""
    __slots__ = ("_x",)

    def __init__(self, x):
        self._x = x

    def __getitem__(self, key):
        return AtIndex(self._x, key)


class AtIndex:
    """``x.at[key]``: the updates of ``x`` at ``key`` (any index form ``x[key]`` takes)."""
    __slots__ = ("_x", "_key")

    def __init__(self, x, key):
        self._x, self._key = x, key

    def get(self, *, mode=None, indices_are_sorted=False, unique_indices=False, fill_value=None):
        """``x[key]`` (JAX's ``.at[key].get()``): out-of-range lazy indices clamp (``mode`` None, 'clip' or
        'promise_in_bounds'; 'clip' clamps known ones too) or read ``fill_value`` ('fill' or 'drop', as JAX's:
        its default is NaN for floats, the lowest value of a signed integer type, the highest of an unsigned one,
        True for bool; it is ignored in the other modes, as JAX's). The two hints are accepted and unused."""
        _check_mode(mode, ("clip", "fill", "drop", "promise_in_bounds"))
        _check_hints("get", indices_are_sorted, unique_indices)
        if mode in ("fill", "drop"):
            fill = _default_fill(self._x.dtype) if fill_value is None else fill_value
            return getitem(self._x, _as_lazy_indices(self._key, self._x), fill=fill)
        return getitem(self._x, _as_lazy_indices(self._key, self._x) if mode == "clip" else self._key)

    def set(self, values, **options):
        """A new array: ``x`` with ``values`` (broadcast to ``x[key].shape``, cast to ``x``'s dtype) at ``key``.
        With repeated indices the last value lands (numpy's rule; deterministic on every backend, and
        the gradient goes to that value alone)."""
        return self._update(values, "set", **options)

    def add(self, values, **options):
        """A new array: ``x`` with ``values`` added at ``key``; repeated indices accumulate (as JAX)."""
        return self._update(values, "add", **options)

    def multiply(self, values, **options):
        """A new array: ``x`` multiplied by ``values`` at ``key``; repeated indices accumulate."""
        return self._update(values, "multiply", **options)

    def divide(self, values, **options):
        """A new array: ``x`` divided by ``values`` at ``key`` (float and complex dtypes); repeated indices divide by the
        product of their values."""
        return self._update(values, "divide", **options)

    def min(self, values, **options):
        """A new array: ``minimum(x, values)`` at ``key``; repeated indices take the smallest."""
        return self._update(values, "min", **options)

    def max(self, values, **options):
        """A new array: ``maximum(x, values)`` at ``key``; repeated indices take the largest."""
        return self._update(values, "max", **options)

    def power(self, values, **options):
        """A new array: ``x ** values`` at ``key``; repeated indices raise to the product of their values (JAX's
        rule: x ** (the exponents multiplied into ones))."""
        return self._update(values, "power", **options)

    def _update(self, values, op, mode=None, indices_are_sorted=False, unique_indices=False, **unknown):
        """Out-of-range lazy indices are dropped (``mode`` None, 'drop', 'promise_in_bounds'; 'drop' drops known
        ones too) or clamped into range ('clip', known ones too: a negative one counts from the end first)."""
        if unknown:
            raise TypeError(f"at[].{op}() got an unexpected keyword argument {next(iter(unknown))!r} (it takes "
                            "values, mode, indices_are_sorted, unique_indices)")
        _check_mode(mode, ("drop", "clip", "promise_in_bounds"))
        _check_hints(op, indices_are_sorted, unique_indices)
        if values is None or isinstance(values, (str, bytes, dict, set)):
            raise TypeError(f"at[].{op}: values must be an array or a number, got {type(values).__name__}")
        key = _as_lazy_indices(self._key, self._x) if mode in ("drop", "clip") else self._key
        return update(self._x, key, values, op, clamp=mode == "clip")


def _as_lazy_indices(key, x):
    """``key`` with its host integer indices (ints, integer lists and numpy arrays) as arrays: a known index out of
    range raises IndexError, a lazy one clamps (get) or is dropped (updates), which is what an explicit
    mode='clip' / 'drop' asks for (as JAX's)."""
    from .creation import asarray

    def lazy(k):
        if isinstance(k, (bool, np.bool_)):
            return k
        if isinstance(k, (int, np.integer)) or (isinstance(k, np.ndarray) and k.dtype.kind in "iu"):
            return asarray(k, device=x.device)
        if isinstance(k, list) and k:   # flat or nested, as numpy reads it: integer lists only (not masks)
            values = np.asarray(k) if all(isinstance(v, (int, np.integer, list)) for v in k) else None
            if values is not None and values.dtype.kind in "iu":
                return asarray(values, device=x.device)
        return k
    return tuple(lazy(k) for k in key) if isinstance(key, tuple) else lazy(key)


def _check_hints(op, indices_are_sorted, unique_indices):
    """JAX's two hints are accepted and unused; still bools, as JAX's are (a string would read as True)."""
    check_bool(f"at[].{op}", "indices_are_sorted", indices_are_sorted)
    check_bool(f"at[].{op}", "unique_indices", unique_indices)


def _check_mode(mode, supported):
    if mode is not None and mode not in supported:
        raise ValueError(f"at[]: mode must be None or one of {', '.join(map(repr, supported))}, got {mode!r}")


def _default_fill(dtype):
    """JAX's fill for an out-of-range read: NaN, the lowest signed / highest unsigned integer, True."""
    if dtype == dt.bool_:
        return True
    if dtype.kind in "fc":
        return float("nan")
    info = np.iinfo(dtype.name)
    return int(info.min) if dtype.kind == "i" else int(info.max)


def _combine(mode, old, new):
    from .elementwise import divide, maximum, minimum, multiply, pow
    from .elementwise import add as add_
    return {"set": lambda: new, "add": lambda: add_(old, new), "multiply": lambda: multiply(old, new),
            "divide": lambda: divide(old, new), "min": lambda: minimum(old, new),
            "max": lambda: maximum(old, new), "power": lambda: pow(old, new)}[mode]()


def update(x, key, values, mode, clamp=False) -> Array:
    """``x.at[key].<mode>(values)``: the record-time checks, then one of three routes (module docstring)."""
    from .creation import asarray
    node = node_of(x)
    _check_update_dtype(mode, node.dtype)
    v = values if isinstance(values, Array) else asarray(values, device=node.device) \
        if not isinstance(values, (bool, int, float)) else _scalar_of(values, node.dtype, mode)
    if isinstance(v, Array) and v.dtype != node.dtype and mode in _CAST_FIRST:
        v = _saturating_cast(v, node.dtype)
    slots = parse(node.shape, key, masks="keep")
    masks = [s for s in slots if s.kind == "mask"]
    scalar = not isinstance(v, Array) or v.ndim == 0
    if masks and len(masks) == 1 and scalar and all(s.kind == "slice" and s.value == (0, 1, node.shape[s.axis])
                                                    for s in slots if s.kind != "mask"):
        return _masked_update(x, masks[0], v, mode)
    if masks:
        slots = parse(node.shape, key)
    if any(s.kind == "array" for s in slots):
        return _scatter(x, slots, v, mode, clamp)
    return _region_update(x, slots, v, mode)


def _check_update_dtype(mode, d):
    """Every route's record-time dtype rules (a scatter would otherwise fail only when evaluated)."""
    from ..primitives import check_storage_only
    if mode == "set":
        return  # a move: any dtype, float8 included
    check_storage_only(f"at[].{mode}", d)
    if mode == "divide" and d.kind not in "fc":
        raise TypeError(f"at[].divide needs a float or complex array, got {d}")
    if mode == "power" and d == dt.bool_:
        raise TypeError("at[].power does not accept bool arrays")
    if mode in ("min", "max") and d == dt.bool_:
        raise TypeError(f"at[].{mode} does not accept bool arrays (use add for or, multiply for and)")
    if mode in ("min", "max") and d.kind == "c":
        raise TypeError(f"at[].{mode} does not accept {d} arrays (complex numbers have no order)")


# JAX's at[]: set, divide and power cast the values to x's dtype first (divide and power multiply them into
# ones of x's dtype); add, multiply, min and max combine in the promoted dtype and cast the result back
_CAST_FIRST = frozenset(("set", "divide", "power"))


def _scalar_of(value, dtype, mode):
    """A Python scalar update value. ``set``/``divide``/``power`` cast it to the array's dtype (0.7 into int32
    sets 0; int32 ``x.at[i].power(2.5)`` squares); the other ops combine it with ``x`` as a weak scalar, in
    the dtype they promote to, and cast the result back (JAX's rule): int32 ``x.at[i].multiply(2.7)`` is
    ``int(x * 2.7)``, not ``x * 2``. A NaN or inf cannot end in an integer array and is refused."""
    if dtype.kind in "iu" and isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"at[]: cannot cast the update value {value} to {dtype}")
    if mode not in _CAST_FIRST:
        return value
    if dtype == dt.bool_:
        return bool(value)
    if dtype.kind in "iu" and isinstance(value, float):
        info = np.iinfo(dtype.name)   # truncates toward zero and saturates, as JAX's convert_element_type
        return min(max(int(value), int(info.min)), int(info.max))
    return value


def _saturating_cast(v, dtype):
    """``v`` cast to ``dtype`` as JAX's at[] casts (XLA's convert): a float beyond an integer type's range
    becomes its min or max, NaN becomes 0 (astype, numpy's and torch's cast, wraps or is undefined there:
    uint8 ``.at[0].min(-1.4)`` gave 255)."""
    from .core import where
    if not isinstance(v, Array):   # a Python scalar set: _scalar_of cast it already
        return v
    if v.dtype.kind != "f" or dtype.kind not in "iu":
        return v.astype(dtype, copy=False)
    info = np.iinfo(dtype.name)
    lo, hi = int(info.min), int(info.max)
    # float(hi) rounds up to a power of two for the wide types: at or past it is past the range
    cast = where(v != v, 0, v).astype(dtype, copy=False)
    return where(v >= float(hi), hi, where(v <= float(lo), lo, cast)).astype(dtype, copy=False)


def _masked_update(x, slot, v, mode):
    """x.at[mask].op(scalar): elementwise, so a lazy where (no evaluation, fuses)."""
    from .core import where
    from .creation import asarray
    from .manipulation import reshape
    mask = slot.value if isinstance(slot.value, Array) else asarray(slot.value, device=x.device)
    k, nd = mask.ndim, x.ndim
    mask = reshape(mask, (1,) * slot.axis + mask.shape + (1,) * (nd - slot.axis - k))
    return where(mask, _saturating_cast(_combine(mode, x, v), x.dtype), x)


def _region_update(x, slots, v, mode):
    """A basic key: where(in region, op(x, v placed over the region), x); all elementwise, so it fuses."""
    from .core import where
    from .creation import full
    from .manipulation import broadcast_to, reshape
    if isinstance(v, Array):
        region_shape = basic(x, slots).shape
        try:
            v = broadcast_to(v, region_shape)
        except ValueError:
            raise ValueError(f"at[]: values of shape {v.shape} do not broadcast to the indexed shape "
                             f"{region_shape}") from None
        # one axis per axis of x (an int's axis has size 1, new axes go): the region in x's rank
        v = reshape(v, tuple(1 if s.kind == "int" else s.value[2] for s in slots if s.kind != "none"))
    mask = _region_mask(x, slots)
    if mask is None:  # the whole array (reversed slices included: v still in the key's order)
        if isinstance(v, Array) and v.size != 1:
            v = _in_array_order(v, slots)
        out = _combine(mode, x, v)
        return _saturating_cast(out, x.dtype) if isinstance(out, Array) else full(x.shape, out, dtype=x.dtype,
                                                                                  device=x.device)
    if isinstance(v, Array) and v.size != 1:
        # divide by 1 outside the region: x / 0 there, discarded by the where, would still make its
        # gradient 0 * inf = NaN
        v = _embed(x, slots, v, fill=1 if mode == "divide" else 0)
    elif isinstance(v, Array):
        v = reshape(v, ())
    return where(mask, _saturating_cast(_combine(mode, x, v), x.dtype), x)


def _ascending(s):
    """(first, step, count) of an int or slice slot, as an ascending progression."""
    if s.kind == "int":
        return s.value, 1, 1
    start, step, count = s.value
    return (start + (count - 1) * step, -step, count) if step < 0 and count else (start if count else 0, abs(step),
                                                                                 count)


def _region_mask(x, slots):
    """A bool array broadcastable to ``x.shape``: whether each element lies in the region (None: all do)."""
    from .creation import arange
    from .manipulation import reshape
    mask = None
    for s in slots:
        if s.kind == "none":
            continue
        n = x.shape[s.axis]
        first, step, count = _ascending(s)
        if (first, step, count) == (0, 1, n):
            continue
        i = reshape(arange(n, device=x.device), tuple(n if a == s.axis else 1 for a in range(x.ndim)))
        inside = (i >= first) & (i <= first + (count - 1) * step) if count else i < 0
        if step > 1 and count > 1:
            inside = inside & ((i - first) % step == 0)
        mask = inside if mask is None else mask & inside
    return mask


def _in_array_order(v, slots):
    """``v`` (in x's rank, in the key's order) flipped along the axes a negative-step slice reverses."""
    from .manipulation import flip
    axes = tuple(s.axis for s in slots if s.kind == "slice" and s.value[1] < 0)
    return flip(v, axis=axes) if axes else v


def _embed(x, slots, v, fill=0):
    """``v`` (the region's shape) laid over ``x``'s shape at the region's positions, ``fill`` elsewhere."""
    from .manipulation import concat, reshape
    from .creation import full
    v = _in_array_order(v, slots)
    for s in slots:
        if s.kind == "none":
            continue
        first, step, count = _ascending(s)
        a, n = s.axis, x.shape[s.axis]
        if step > 1 and count > 1:  # interleave step-1 zeros after each element, then drop the tail
            spread = reshape(v, v.shape[:a + 1] + (1,) + v.shape[a + 1:])
            gap = full(spread.shape[:a + 1] + (step - 1,) + spread.shape[a + 2:], fill, dtype=v.dtype,
                       device=v.device)
            v = reshape(concat([spread, gap], axis=a + 1), v.shape[:a] + (count * step,) + v.shape[a + 1:])
            v = basic(v, [Slot("slice", b, (0, 1, v.shape[b])) if b != a else
                          Slot("slice", a, (0, 1, (count - 1) * step + 1)) for b in range(v.ndim)])
        pad = [(0, 0)] * v.ndim
        pad[a] = (first, n - first - v.shape[a])
        from .manipulation import pad as pad_
        v = pad_(v, pad, constant_values=fill)
    return v


def _scatter(x, slots, v, mode, clamp=False) -> Array:
    """An integer-array key: the flat index of every selected element, then one scatter call."""
    from .creation import arange, full, ones
    from .core import where
    from .elementwise import divide, pow
    from .manipulation import broadcast_to, reshape
    adv, place = _layout(slots)
    indices, valid = _index_arrays(x, slots, adv, clamp=clamp)
    if clamp:
        valid = None   # clamped indices all land
    b_shape = views.broadcast_shapes(*[i.shape for i in indices])
    others = [i for i in range(len(slots)) if i not in adv]
    dims = [slots[i].value[2] if slots[i].kind == "slice" else 1 for i in others]
    r_shape = tuple(dims[:place]) + b_shape + tuple(dims[place:])
    nb, coords = len(b_shape), {}
    for j, i in enumerate(others):  # a slice's coordinate runs along its own result dim
        s = slots[i]
        if s.kind == "slice":
            r = j if j < place else j + nb
            start, step, count = s.value
            ramp = arange(count, device=x.device) * step + start if count else arange(0, device=x.device)
            coords[s.axis] = reshape(ramp, tuple(count if d == r else 1 for d in range(len(r_shape))))
    for i, idx in zip(adv, indices):
        coords[slots[i].axis] = _on_index_dims(idx, b_shape, place, len(r_shape))
    lin = _linear([coords.get(a, 0) for a in range(x.ndim)], x.shape)
    lin = lin if isinstance(lin, Array) else full((), lin, dtype=dt.int64, device=x.device)
    if valid is not None:  # dropped updates point nowhere
        lin = where(_on_index_dims(valid, b_shape, place, len(r_shape)), lin, -1)
    lin = broadcast_to(lin, r_shape)
    # the values meet x in the dtype the two promote to (set: x's own, the values were cast already)
    work = dt.result_type(x.dtype, v.dtype if isinstance(v, Array) else v)
    v = v.astype(work, copy=False) if isinstance(v, Array) else full((), v, dtype=work, device=x.device)
    try:
        v = broadcast_to(v, r_shape)
    except ValueError:
        raise ValueError(f"at[]: values of shape {v.shape} do not broadcast to the indexed shape {r_shape}") from None
    flat = reshape(x, (-1,)).astype(work, copy=False)
    if mode in ("divide", "power"):  # x / (product of the values at each index), x ** (their product): JAX's
        (den,) = call(SCATTER, [ones(flat.shape, dtype=work, device=x.device), lin, v], mode="multiply")
        out = divide(flat, den) if mode == "divide" else pow(flat, den)
    else:
        (out,) = call(SCATTER, [flat, lin, v], mode=mode)
    out = _saturating_cast(reshape(out, x.shape), x.dtype)
    if work == x.dtype:
        return out
    # the elements no index reached keep x's own values: through ``work`` and back, an int64 2**31 - 1 became
    # 2**31 (float32), an int16 30001 became 30000 (float16)
    (hit,) = call(SCATTER, [full(flat.shape, False, dtype=dt.bool_, device=x.device), lin,
                            full(r_shape, True, dtype=dt.bool_, device=x.device)], mode="set")
    return where(reshape(hit, x.shape), out, x)
