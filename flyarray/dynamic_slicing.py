"""fa.lax.dynamic_slice and dynamic_update_slice (JAX's): static sizes at start indices that may be arrays
(traced under fa.jit, batched under fa.vmap), the building blocks of loops over windows of an array.

JAX's rule for the starts (``allow_negative_indices=True``, its default): a negative start counts from the end
(``start + dim``), as Python's indices do, and then each start is clamped so that the window lies inside the
operand (a start past the end moves back, one still negative moves to 0). A window is a gather of
``start + arange(size)`` along each axis, and an update a scatter at the same indices (``.at[...].set``): ordinary
ops, so grad, vmap and jit apply unchanged.
"""
from __future__ import annotations

from . import views
from ._array import Array
from .dtypes import int64

__all__ = ["dynamic_slice", "dynamic_update_slice", "dynamic_slice_in_dim", "dynamic_index_in_dim",
           "dynamic_update_slice_in_dim", "dynamic_update_index_in_dim"]


def dynamic_slice(operand, start_indices, slice_sizes):
    """``operand[s0:s0 + n0, s1:s1 + n1, ...]`` for starts ``start_indices`` (ints or integer scalar arrays, one
    per axis) and static ``slice_sizes``; a negative start counts from the end, then each is clamped into
    [0, shape - size] (JAX's rule)."""
    operand = _operand(operand, "dynamic_slice")
    sizes = _sizes(slice_sizes, operand, "dynamic_slice")
    starts = _starts(start_indices, operand, sizes, "dynamic_slice")
    out = operand
    for axis, (start, size) in enumerate(zip(starts, sizes)):
        if size != operand.shape[axis]:
            out = _window(out, axis, start, size)
    return out


def dynamic_update_slice(operand, update, start_indices):
    """``operand`` with ``update`` written at ``start_indices`` (ints or integer scalar arrays, one per axis; a
    negative start counts from the end), each start clamped so that ``update`` fits (JAX's rule); ``update`` has
    ``operand``'s dtype and rank and is not larger on any axis."""
    from .ops import asarray
    operand = _operand(operand, "dynamic_update_slice")
    update = asarray(update) if not isinstance(update, Array) else update
    if update.dtype != operand.dtype:   # JAX refuses it too: a cast here would truncate 2.7 into an int quietly
        raise TypeError(f"fa.lax.dynamic_update_slice: update is {update.dtype} and operand {operand.dtype}; cast "
                        f"the update first")
    if update.ndim != operand.ndim or any(u > o for u, o in zip(update.shape, operand.shape)):
        raise ValueError(f"fa.lax.dynamic_update_slice: update of shape {update.shape} does not fit in operand "
                         f"of shape {operand.shape} (same rank, no axis longer)")
    starts = _starts(start_indices, operand, update.shape, "dynamic_update_slice")
    # all slices, or all index arrays (numpy's rules move the axes of index arrays that slices separate)
    dynamic = any(isinstance(start, Array) for start in starts)
    index = tuple(_axis_index(start, size, axis, operand.ndim, operand.device, dynamic)
                  for axis, (start, size) in enumerate(zip(starts, update.shape)))
    return operand.at[index].set(update)


def dynamic_slice_in_dim(operand, start_index, slice_size, axis=0):
    """dynamic_slice along ``axis`` alone (the other axes whole)."""
    operand = _operand(operand, "dynamic_slice_in_dim")
    axis = _axis(axis, operand, "dynamic_slice_in_dim")
    starts = [0] * operand.ndim
    sizes = list(operand.shape)
    starts[axis], sizes[axis] = start_index, slice_size
    return dynamic_slice(operand, starts, sizes)


def dynamic_index_in_dim(operand, index, axis=0, keepdims=True):
    """The slice of length 1 at ``index`` along ``axis`` (clamped), that axis kept unless ``keepdims`` is False."""
    from .ops import squeeze
    operand = _operand(operand, "dynamic_index_in_dim")
    axis = _axis(axis, operand, "dynamic_index_in_dim")
    out = dynamic_slice_in_dim(operand, index, 1, axis)
    return out if keepdims else squeeze(out, axis=axis)


def dynamic_update_slice_in_dim(operand, update, start_index, axis):
    """dynamic_update_slice with the start ``start_index`` along ``axis`` and 0 along the others."""
    operand = _operand(operand, "dynamic_update_slice_in_dim")
    axis = _axis(axis, operand, "dynamic_update_slice_in_dim")
    starts = [0] * operand.ndim
    starts[axis] = start_index
    return dynamic_update_slice(operand, update, starts)


def dynamic_update_index_in_dim(operand, update, index, axis):
    """``update`` (without ``axis``, or with it of length 1) written at ``index`` along ``axis``."""
    from .ops import asarray, expand_dims
    operand = _operand(operand, "dynamic_update_index_in_dim")
    axis = _axis(axis, operand, "dynamic_update_index_in_dim")
    update = asarray(update) if not isinstance(update, Array) else update
    if update.ndim == operand.ndim - 1:
        update = expand_dims(update, axis=axis)
    return dynamic_update_slice_in_dim(operand, update, index, axis)


# --- checks and helpers ---

def _operand(x, who) -> Array:
    from .ops.core import array_arg
    return array_arg(x, f"fa.lax.{who}: operand")


def _axis(axis, operand, who) -> int:
    return views.normalize_axis(axis, operand.ndim, f"fa.lax.{who}: axis")


def _sizes(slice_sizes, operand, who) -> tuple:
    sizes = _sequence(slice_sizes, operand, who, "slice_sizes")
    out = []
    for axis, size in enumerate(sizes):
        size = views.as_int(size, f"fa.lax.{who}: slice_sizes[{axis}]")
        if not 0 <= size <= operand.shape[axis]:
            raise ValueError(f"fa.lax.{who}: slice_sizes[{axis}] = {size} is outside [0, {operand.shape[axis]}] "
                             f"(operand shape {operand.shape})")
        out.append(size)
    return tuple(out)


def _sequence(values, operand, who, name) -> list:
    from .ops.core import as_array
    values = as_array(values) if not isinstance(values, (list, tuple)) else values   # numpy / torch vectors
    if isinstance(values, Array) and values.ndim == 1:
        values = [values[i] for i in range(values.shape[0])]
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"fa.lax.{who}: {name} must be a sequence with one entry per axis, got {type(values).__name__}")
    if len(values) != operand.ndim:
        raise ValueError(f"fa.lax.{who}: {name} has {len(values)} entries; operand has rank {operand.ndim}")
    return list(values)


def _starts(start_indices, operand, sizes, who) -> list:
    """Each start wrapped (negative: + dim) and clamped into [0, shape - size]: a Python int here, an array start
    with ``where`` and ``clip`` (recorded)."""
    from .namespace_info import isdtype
    from .ops import asarray, clip, where
    out = []
    for axis, start in enumerate(_sequence(start_indices, operand, who, "start_indices")):
        top = operand.shape[axis] - sizes[axis]
        dim = operand.shape[axis]
        if isinstance(start, int) and not isinstance(start, bool):
            out.append(min(max(start + dim if start < 0 else start, 0), top))
            continue
        start = asarray(start) if not isinstance(start, Array) else start
        if start.ndim != 0 or not isdtype(start.dtype, "integral"):
            raise TypeError(f"fa.lax.{who}: start_indices[{axis}] must be an int or an integer scalar array, got "
                            f"{start.dtype} of shape {start.shape}")
        if isdtype(start.dtype, "unsigned integer"):   # never negative; a uint64 past 2^63 must not wrap to one
            out.append(clip(start, 0, top).astype(int64, copy=False))
            continue
        start = start.astype(int64, copy=False)
        out.append(clip(where(start < 0, start + dim, start), 0, top))
    return out


def _window(x, axis, start, size):
    """``x``'s ``size`` entries from ``start`` (clamped already) along ``axis``."""
    from .ops import arange, take
    if isinstance(start, int):
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + size)
        return x[tuple(index)]
    return take(x, start + arange(size, dtype=int64, device=x.device), axis=axis)


def _axis_index(start, size, axis, ndim, device, dynamic):
    """The index along ``axis`` of an update of ``size`` entries at ``start``: a slice, or where any start is an
    array (``dynamic``), an integer array shaped to broadcast against the other axes' (as numpy's ``ix_``)."""
    from .ops import arange, reshape
    if not dynamic:
        return slice(start, start + size)
    positions = start + arange(size, dtype=int64, device=device)
    return reshape(positions, tuple(size if a == axis else 1 for a in range(ndim)))
