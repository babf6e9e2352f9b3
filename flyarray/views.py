"""Movement ops as index maps: reshape, permute, expand, slice, flip. No kernel runs.

A view of a lazy value is recorded as a chain of movement ops. When a kernel
reads the view, the chain is folded into one strided map over the buffer it
reads (``View``: shape, element strides, element offset; strides may be
negative or zero). Folding can fail only for a reshape of a layout that no
strides describe (e.g. flattening a transposed array); the scheduler then
materializes the value first.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Optional

import numpy as np

# A movement op is a tuple: ("reshape", shape) | ("permute", perm) |
# ("expand", shape) | ("slice", starts, steps, shape) | ("flip", axes)


@dataclasses.dataclass(frozen=True)
class View:
    shape: tuple
    strides: tuple
    offset: int = 0

    @staticmethod
    def contiguous(shape) -> "View":
        return View(tuple(shape), contiguous_strides(shape), 0)

    def is_contiguous(self) -> bool:
        return self.offset == 0 and all(
            st == cs for sz, st, cs in zip(self.shape, self.strides, contiguous_strides(self.shape)) if sz != 1)


def contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def apply(view: View, op: tuple) -> Optional[View]:
    """``view`` followed by the movement ``op``; None when no strided view describes it."""
    kind = op[0]
    if kind == "reshape":
        return _reshape(view, op[1])
    if kind == "permute":
        perm = op[1]
        return View(tuple(view.shape[p] for p in perm), tuple(view.strides[p] for p in perm), view.offset)
    if kind == "expand":
        shape = op[1]
        strides = tuple(st if old == new else 0 for old, new, st in zip(view.shape, shape, view.strides))
        return View(tuple(shape), strides, view.offset)
    if kind == "slice":
        _, starts, steps, shape = op
        offset = view.offset + sum(s * st for s, st in zip(starts, view.strides))
        strides = stepped_strides(view.strides, steps, shape)
        return View(tuple(shape), strides, offset)
    if kind == "flip":
        offset, strides = view.offset, list(view.strides)
        for ax in op[1]:
            if view.shape[ax] > 0:
                offset += (view.shape[ax] - 1) * strides[ax]
            strides[ax] = -strides[ax]
        return View(view.shape, tuple(strides), offset)
    raise ValueError(f"unknown movement op {kind}")


def output_shape(op: tuple, shape: tuple) -> tuple:
    """The shape movement ``op`` makes of ``shape``."""
    kind = op[0]
    if kind in ("reshape", "expand"):
        return tuple(op[1])
    if kind == "permute":
        return tuple(shape[p] for p in op[1])
    if kind == "slice":
        return tuple(op[3])
    return tuple(shape)  # flip


def prepend(shape: tuple, ops: tuple, chain: tuple) -> tuple:
    """``ops`` (applied to ``shape``) then ``chain`` (already simplified), as one chain that addresses the same
    elements from any view: an op that undoes its neighbour goes, two neighbours of a kind become one.

    A view pushed down a graph grows by each view it passes. Merged at the junction only, a chain that keeps
    undoing itself (x = (x.T * c) in a loop, or a reshape-transpose-reshape of a square) stays short, and the
    scheduler, which applies a node's chain whole, works in time linear in the graph's depth instead of
    quadratic."""
    front = []  # (op, the shape it applies to)
    for op in ops:
        if _is_identity(op, shape):
            continue
        rest, shape = _join(front, (op,), shape)
        if rest:
            front.append((rest[0], shape))
            shape = output_shape(rest[0], shape)
    rest = _join(front, tuple(chain), shape)[0]  # (pops from front: before front is read)
    return tuple(op for op, _ in front) + rest


def _join(front: list, rest: tuple, shape: tuple) -> tuple:
    """Merge the last ops of ``front`` (popping them) into the head of ``rest``, which applies to ``shape``:
    (what remains of ``rest``, the shape its head applies to)."""
    while rest and front:
        last, last_shape = front[-1]
        merged = _merged(last, last_shape, rest[0])
        if merged is None:
            break
        front.pop()
        rest, shape = merged + rest[1:], last_shape
    return rest, shape


def _is_identity(op: tuple, shape: tuple) -> bool:
    kind = op[0]
    if kind in ("reshape", "expand"):
        return tuple(op[1]) == tuple(shape)
    if kind == "permute":
        return tuple(op[1]) == tuple(range(len(op[1])))
    if kind == "flip":
        return all(shape[ax] <= 1 for ax in op[1])
    _, starts, steps, out = op
    return not any(starts) and all(t == 1 for t in steps) and tuple(out) == tuple(shape)


def _merged(a: tuple, shape: tuple, b: tuple) -> Optional[tuple]:
    """Op ``a`` on ``shape`` followed by op ``b``, as at most one op: () when they cancel, None when they do not
    merge. Exact for any view: reshapes compose (only the elements' order matters), as do permutations,
    broadcasts, slices (start and step) and flips (an axis flipped twice is back)."""
    kind = a[0]
    if kind != b[0]:
        return None
    if kind in ("reshape", "expand"):
        op = b
    elif kind == "permute":
        op = ("permute", tuple(a[1][k] for k in b[1]))
    elif kind == "flip":
        op = ("flip", tuple(sorted(ax for ax in set(a[1]) ^ set(b[1]) if shape[ax] > 1)))
    else:  # slice
        _, starts_a, steps_a, _ = a
        _, starts_b, steps_b, out = b
        starts = tuple(sa + sb * ta for sa, sb, ta in zip(starts_a, starts_b, steps_a))
        op = ("slice", starts, tuple(ta * tb for ta, tb in zip(steps_a, steps_b)), tuple(out))
    return () if _is_identity(op, shape) else (op,)


def addresses_one_element(view: View) -> bool:
    """Whether every index of ``view`` lands on one element (a broadcast scalar): any movement chain then gives
    a strided view again (all strides 0)."""
    return all(st == 0 or n <= 1 for n, st in zip(view.shape, view.strides))


def stepped_strides(strides, steps, shape) -> tuple:
    """Strides after stepping; an axis of at most one element keeps its stride (any stride addresses it),
    so steps composed over and over never overflow an int64 stride."""
    return tuple(st * step if n > 1 else st for st, step, n in zip(strides, steps, shape))


def apply_all(view: View, ops) -> Optional[View]:
    for op in ops:
        view = apply(view, op)
        if view is None:
            return None
    return view


def pulled_back(shape: tuple, ops, target: View) -> Optional[View]:
    """Where to write an array of ``shape`` so that the movement ``ops`` applied to it land on ``target``:
    a View ``w`` of ``shape`` with ``apply_all(w, ops)`` addressing what ``target`` addresses. Only for
    ops that move every element once (permutes, and reshapes that add or drop size-1 axes or otherwise
    keep each axis whole); None for anything else (a slice, a broadcast, a merge of axes)."""
    moved = apply_all(View.contiguous(shape), ops)
    if moved is None or moved.offset != 0 or math.prod(moved.shape) != math.prod(shape):
        return None
    own = contiguous_strides(shape)
    strides = [0] * len(shape)
    placed = set()
    for size, stride, goes_to in zip(moved.shape, moved.strides, target.strides):
        if size == 1:
            continue
        axis = next((b for b in range(len(shape)) if shape[b] == size and own[b] == stride and b not in placed), None)
        if axis is None:
            return None
        placed.add(axis)
        strides[axis] = goes_to
    if any(n > 1 and b not in placed for b, n in enumerate(shape)):
        return None
    return View(tuple(shape), tuple(strides), target.offset)


def _reshape(view: View, shape: tuple) -> Optional[View]:
    """Strides for ``shape`` over the same elements, when some exist (torch's rule)."""
    shape = tuple(shape)
    if math.prod(shape) == 0:
        return View(shape, contiguous_strides(shape), view.offset)
    # Drop size-1 dims; they carry no stride information.
    old = [(sz, st) for sz, st in zip(view.shape, view.strides) if sz != 1]
    new_strides = []
    oi = 0
    ni = 0
    new_dims = [i for i, s in enumerate(shape) if s != 1]
    result = [0] * len(shape)
    while ni < len(new_dims):
        # Take a run of old dims that is contiguous among itself, and split it into new dims.
        if oi >= len(old):
            return None
        run_size, run_stride = old[oi]
        chunk = [old[oi]]
        oi += 1
        target = shape[new_dims[ni]]
        # grow the run of old dims until the new dims that it must cover are covered
        group = [new_dims[ni]]
        covered = target
        while covered != run_size:
            if covered < run_size:
                ni += 1
                if ni >= len(new_dims):
                    return None
                group.append(new_dims[ni])
                covered *= shape[new_dims[ni]]
            else:
                if oi >= len(old):
                    return None
                size, stride = old[oi]
                if chunk[-1][1] != stride * size:
                    return None  # the old dims are not contiguous with each other
                chunk.append(old[oi])
                oi += 1
                run_size *= size
        # strides of the new dims inside this run: innermost stride is the run's innermost stride
        inner = chunk[-1][1]
        for dim in reversed(group):
            result[dim] = inner
            inner *= shape[dim]
        ni += 1
    if oi != len(old):
        return None
    for i, s in enumerate(shape):
        if s == 1:
            result[i] = 0
    del new_strides
    return View(shape, tuple(result), view.offset)


def broadcast_shapes(*shapes) -> tuple:
    """The array API's broadcast; the error names every shape."""
    if len(shapes) == 2 and shapes[0] == shapes[1]:   # the common case, on every binary op's record path
        return tuple(shapes[0])
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        size = 1
        for s in shapes:
            d = s[axis - ndim + len(s)] if axis - ndim + len(s) >= 0 else 1
            if d != 1:
                if size != 1 and size != d:
                    raise ValueError(
                        f"shapes {' and '.join(str(tuple(x)) for x in shapes)} do not broadcast "
                        f"(axis {axis - ndim}: {size} vs {d})")
                size = d
        out.append(size)
    return tuple(out)


def broadcast_batch(op: str, shapes: tuple, names: tuple = ("x1", "x2")) -> tuple:
    """The broadcast batch dims of two stacks of matrices (all but each shape's last two); where they do not
    broadcast, a ValueError naming ``op``, the operands and their shapes (matmul, solve, the interop GEMMs)."""
    (s1, s2), (n1, n2) = shapes, names
    b1, b2 = tuple(s1[:-2]), tuple(s2[:-2])
    try:
        return broadcast_shapes(b1, b2)
    except ValueError:
        raise ValueError(f"{op}: the batch dims of {n1} {tuple(s1)} and {n2} {tuple(s2)} do not broadcast "
                         f"({b1} against {b2})") from None


INT64_MAX = 2**63 - 1
MAX_ELEMENTS = 2**59 - 1   # times 16 bytes (complex128) still fits int64: torch's storage size overflows past it


def as_int(value, name: str) -> int:
    """``value`` as an int (numpy ints welcome); bools, floats and the rest raise a TypeError naming ``name``."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    return operator.index(value)


def check_shape(shape, name: str = "shape") -> tuple:
    """An int or a sequence of ints -> a tuple of non-negative sizes whose element count int64 can hold.

    Checked when an op is recorded, so a bad size fails at the call that wrote it, not inside torch.
    """
    if isinstance(shape, bool) or not (hasattr(shape, "__index__") or hasattr(shape, "__iter__")):
        raise TypeError(f"{name} must be an int or a sequence of ints, got {shape!r} of type {type(shape).__name__}")
    sizes = (shape,) if hasattr(shape, "__index__") else tuple(shape)
    for s in sizes:
        if isinstance(s, bool) or not hasattr(s, "__index__"):
            raise TypeError(f"{name} {sizes}: sizes must be ints, got {s!r} of type {type(s).__name__}")
    sizes = tuple(operator.index(s) for s in sizes)
    if any(s < 0 for s in sizes):
        raise ValueError(f"{name} {sizes}: sizes must be non-negative")
    if math.prod(sizes) > MAX_ELEMENTS or any(s > MAX_ELEMENTS for s in sizes):
        raise ValueError(f"{name} {sizes}: more elements than any array holds (at most 2**59 - 1: an int64 "
                         "still counts their bytes in the widest dtype, complex128)")
    return sizes


def normalize_axis(axis: int, ndim: int, name: str = "axis") -> int:
    axis = as_int(axis, name)
    if not -max(ndim, 1) <= axis < max(ndim, 1):  # a 0-d array takes axis 0 or -1, as torch
        raise ValueError(f"{name} {axis} is out of range for an array of rank {ndim}")
    return axis % ndim if ndim else 0


def axis_tuple(axis, name: str = "axis", none_ok: bool = False) -> tuple:
    """An int or a sequence of ints -> a tuple (not yet normalized); a TypeError names anything else.
    ``none_ok``: the caller takes None itself (before calling), so the message offers it."""
    if isinstance(axis, np.ndarray) and axis.ndim == 1 and axis.dtype.kind in "iu":   # numpy's axes, as numpy
        return tuple(int(a) for a in axis)                                             # takes them
    if hasattr(axis, "__index__") and not isinstance(axis, bool):
        return (axis,)
    if isinstance(axis, (tuple, list)):
        return tuple(axis)
    allowed = "an int, a tuple of ints or None" if none_ok else "an int or a tuple of ints"
    raise TypeError(f"{name} must be {allowed}, got {axis!r} of type {type(axis).__name__}")


def normalize_axes(axis, ndim: int, name: str = "axis") -> tuple:
    if axis is None:
        return tuple(range(ndim))
    if type(axis) is int and -ndim <= axis < ndim:  # the common case, checked in full below otherwise
        return (axis % ndim,)
    axes = axis_tuple(axis, name, none_ok=True)
    out = tuple(sorted(normalize_axis(a, ndim, name) for a in axes))
    if len(set(out)) != len(out):
        raise ValueError(f"{name} {axis} repeats an axis")
    return out if ndim else ()  # a 0-d array has no axis to reduce, flip or squeeze: the op is the identity
