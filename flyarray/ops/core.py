"""Recording: turn an API call into a checked graph node.

Every check happens here, when the op is recorded, before any work: dtypes
the primitive accepts, shapes that broadcast, devices that match, scalars
that fit. The resulting node's inputs already have the node's shape and
compute dtype, so the scheduler and code generator never re-derive them.
"""
from __future__ import annotations

import math
import weakref

import numpy as np
import torch

from .. import dtypes as dt
from .. import ir, views
from .._array import Array
from ..primitives import (ELEMENTWISE, REDUCE, check_accepts, check_storage_only, elementwise_out_dtype,
                          reduce_dtype, sum_dtype)


def node_of(x) -> ir.Node:
    if not isinstance(x, Array):
        raise TypeError(f"expected a flyarray Array (or a numpy array / torch tensor), got {type(x).__name__}")
    return x._node


def array_arg(x, where: str) -> Array:
    """``x`` as an Array (numpy arrays and torch tensors converted), else a TypeError naming ``where``
    (e.g. ``"mean: x"``), raised before anything is recorded."""
    x = as_array(x)
    if not isinstance(x, Array):
        raise TypeError(f"{where} must be a flyarray Array (or a numpy array / torch tensor), "
                        f"got {type(x).__name__}")
    return x


def common_device(args) -> torch.device:
    devices = {a._node.device for a in args if isinstance(a, Array)}
    if len(devices) > 1:
        raise ValueError(f"arrays live on different devices: {', '.join(sorted(map(str, devices)))}; "
                         "move them with fa.asarray(x, device=...) first")
    if devices:
        return devices.pop()
    from ..runtime import default_device
    return default_device()


def check_scalar_fits(value, d: dt.DType):
    if isinstance(value, bool) or not isinstance(value, int) or d.kind not in "iu":
        return
    info = torch.iinfo(d.torch)
    if not info.min <= value <= info.max:
        raise OverflowError(f"Python int {value} does not fit {d} (range {info.min}..{info.max})")


class NaNToInteger(ValueError):
    """A NaN asked to become an integer: a ValueError that creation keeps as one (it rewraps torch's as TypeError)."""


def integer_of_float(value: float, d: dt.DType) -> int:
    """A Python float going into integer dtype ``d``: truncated toward zero (astype's rule), and refused where
    that has no value in ``d`` (NaN, inf, past its range) instead of wrapping or failing at evaluation."""
    if value != value:
        raise NaNToInteger(f"a Python float NaN has no value in {d}")
    info = torch.iinfo(d.torch)
    if not info.min - 1 < value < info.max + 1:   # Python compares an int with a float exactly
        raise OverflowError(f"a Python float {value!r} does not fit {d} (range {info.min}..{info.max})")
    return int(value)


def constant(value, shape, d: dt.DType, device) -> ir.Node:
    check_scalar_fits(value, d)
    if d.kind == "c":  # complex(re, im) over two real constants: the plan binds both values, as any scalar's
        from ..complex_lowering import COMPLEX
        value = complex(value)
        r = dt.real_dtype(d)
        parts = tuple(ir.constant(as_float_of(v, r), tuple(shape), r, device) for v in (value.real, value.imag))
        return ir.Node(COMPLEX, parts, None, tuple(shape), d, device)
    if isinstance(value, complex):
        raise TypeError(f"a Python complex scalar {value!r} cannot be {d}: use a complex dtype")
    if d.kind == "b":
        value = bool(value)
    elif d.kind in "iu":
        value = int(value)
    else:
        value = as_float_of(value, d)
    return ir.constant(value, tuple(shape), d, device)


_FLOAT_MAX = {}


def as_float_of(value, d: dt.DType) -> float:
    """A Python number as the float it is in ``d``: past d's range, +-inf (``x < 1e300`` on float32 compares
    with inf, as numpy's float32(1e300); torch refuses such a scalar and Triton cannot pack it)."""
    value = float(value)
    limit = _FLOAT_MAX.get(d)
    if limit is None:
        limit = _FLOAT_MAX[d] = float(torch.finfo(d.torch).max)
    if -limit <= value <= limit or value != value or d is dt.float64:
        return value
    return float(torch.tensor(value, dtype=torch.float64, device="cpu").to(d.torch))


def broadcast_node(node: ir.Node, shape: tuple) -> ir.Node:
    if node.shape == shape:
        return node
    if node.kind == "constant":
        return ir.constant(node.params, shape, node.dtype, node.device)
    views.broadcast_shapes(node.shape, shape)  # raises with both shapes
    ops = []
    if len(node.shape) < len(shape):
        lead = (1,) * (len(shape) - len(node.shape)) + node.shape
        ops.append(("reshape", lead))
    ops.append(("expand", shape))
    return ir.view(node, tuple(ops), shape)


def cast_node(node: ir.Node, d: dt.DType) -> ir.Node:
    if node.dtype == d:
        return node
    if node.kind == "constant":
        return constant(node.params, node.shape, d, node.device)
    return ir.Node(ELEMENTWISE["astype"], (node,), None, node.shape, d, node.device)


def elementwise(name: str, *args) -> Array:
    """Record elementwise primitive ``name`` over Arrays and Python scalars."""
    prim = ELEMENTWISE[name]
    if len(args) == 2:
        return binary(prim, *args)
    if len(args) == 1:
        return unary(prim, args[0])
    return _general(prim, args)


def unary(prim, x) -> Array:
    """Record ``prim(x)``; an Array whose dtype the primitive took before needs no checks."""
    if type(x) is Array:
        node = x._node
        out_dtype = _RESULT_DTYPE.get((prim, node.dtype))
        if out_dtype is not None:
            return Array(ir.Node(prim, (node,), None, node.shape, out_dtype, node.device))
    return _general(prim, (x,))


def binary(prim, a, b) -> Array:
    """Record ``prim(a, b)``: two Arrays of one dtype, shape and device, or an Array with a Python
    scalar, take the fast paths (the record hot path); anything else promotes and broadcasts."""
    if type(a) is Array and type(b) is Array:
        na, nb = a._node, b._node
        if na.dtype is nb.dtype and na.shape == nb.shape and na.device == nb.device:
            out_dtype = _RESULT_DTYPE.get((prim, na.dtype))
            if out_dtype is not None:
                return Array(ir.Node(prim, (na, nb), None, na.shape, out_dtype, na.device))
    else:
        fast = _with_scalar(prim, a, b)
        if fast is not None:
            return fast
    return _general(prim, (a, b))


def _general(prim, args) -> Array:
    first = args[0]._node if isinstance(args[0], Array) else None
    if first is not None and all(isinstance(a, Array) and a._node.dtype is first.dtype
                                 and a._node.shape == first.shape and a._node.device == first.device
                                 for a in args):
        # same dtype, shape and device, nothing to promote or broadcast
        in_dtype, shape, device = first.dtype, first.shape, first.device
        inputs = tuple([a._node for a in args])
        if (prim.accepts == "float" or prim.out == "float") and in_dtype.kind not in "fc":
            in_dtype = dt.default_float()
            inputs = tuple(cast_node(n, in_dtype) for n in inputs)
    else:
        in_dtype, shape, device, inputs = _promote_and_broadcast(prim.name, prim, args)
    return Array(ir.Node(prim, inputs, None, shape, result_dtype(prim, in_dtype), device))


_RESULT_DTYPE: dict = {}  # (primitive, input dtype) -> result dtype, for inputs the primitive accepts


def result_dtype(prim, d: dt.DType) -> dt.DType:
    """The result dtype of elementwise ``prim`` on inputs of dtype ``d`` (already promoted); raises
    TypeError where the primitive does not accept ``d``. Remembered per pair: the record hot path."""
    out = _RESULT_DTYPE.get((prim, d))
    if out is None:
        check_accepts(prim, d)
        out = elementwise_out_dtype(prim, d)
        if not ((prim.accepts == "float" or prim.out == "float") and d.kind not in "fc"):
            _RESULT_DTYPE[(prim, d)] = out  # only dtypes that need no cast first: elementwise's fast path reads it
    return out


def _with_scalar(prim, a, b):
    """The common ``x * 0.5`` / ``2 - x``: a float scalar with a float array, or an int scalar with a
    non-bool array, takes the array's dtype (weak promotion) with nothing to broadcast or cast."""
    kind = type(b)
    if kind is float or kind is int:
        array, scalar, first = a, b, True
    else:
        kind = type(a)
        if kind is not float and kind is not int:
            return None
        array, scalar, first = b, a, False
    if type(array) is not Array:
        return None
    node = array._node
    d = node.dtype
    if d.kind == "f" and d not in dt.STORAGE_ONLY:  # a float array takes any Python number as its float
        const = ir.Node(ir.CONSTANT, (), as_float_of(scalar, d), node.shape, d, node.device)
    elif kind is float:
        return None
    elif d.kind not in "iuf" or d in dt.STORAGE_ONLY or (prim.accepts == "float" or prim.out == "float") \
            and d.kind != "f":
        return None
    else:
        const = constant(scalar, node.shape, d, node.device)
    inputs = (node, const) if first else (const, node)
    return Array(ir.Node(prim, inputs, None, node.shape, result_dtype(prim, d), node.device))


def as_array(x, device=None):
    """numpy arrays and scalars, torch tensors -> Arrays (zero copy where possible); anything else unchanged.
    ``device``: where numpy values go (the other operands' device; numpy data has none of its own)."""
    if isinstance(x, (np.ndarray, np.generic, torch.Tensor)) and not isinstance(x, (bool, int, float, complex)):
        from .creation import asarray
        return asarray(x, device=device if not isinstance(x, torch.Tensor) else None)
    return x


def operands_device(args):
    """The device of the first array or tensor among ``args``, else None: where their numpy operands go, so
    ``x * np.float32(0.5)`` runs on x's device (numpy values became CPU arrays: a device mismatch on a GPU)."""
    for a in args:
        if isinstance(a, Array):
            return a._node.device
        if isinstance(a, torch.Tensor):
            return a.device
    return None


def as_operand(x, device=None):
    """``x`` where an array must go: as_array's conversions, and a Python number as a 0-d array of the default
    dtypes (``fa.sum(3.0)``) on ``device``."""
    if isinstance(x, (bool, int, float, complex)):
        from .creation import asarray
        return asarray(x, device=device)
    return as_array(x, device)


def operands_as_arrays(operands) -> list:
    """Operands that must all be arrays (einsum's, tensordot's), each ``as_operand``, numpy data beside the other
    operands' device."""
    device = operands_device(operands)
    return [as_operand(x, device) for x in operands]


def _promote_and_broadcast(name, prim, args):
    device = operands_device(args)
    args = tuple(as_array(a, device) for a in args)
    for a in args:
        if not isinstance(a, (Array, bool, int, float, complex)):
            raise TypeError(f"{name}: unsupported operand of type {type(a).__name__}")
    arrays = [a for a in args if isinstance(a, Array)]
    device = common_device(arrays)
    in_dtype = dt.result_type(*[a.dtype if isinstance(a, Array) else a for a in args])
    if (prim.accepts == "float" or prim.out == "float") and in_dtype.kind not in "fc":
        in_dtype = dt.default_float()
    check_accepts(prim, in_dtype)
    shape = views.broadcast_shapes(*[a._node.shape for a in arrays])
    inputs = tuple(broadcast_node(cast_node(a._node, in_dtype), shape) if isinstance(a, Array)
                   else constant(a, shape, in_dtype, device) for a in args)
    return in_dtype, shape, device, inputs


def where(cond, x, y) -> Array:
    """``x`` where ``cond`` is true, else ``y``, elementwise, broadcasting all three. ``cond`` (cast to bool)
    and ``x``/``y`` may be Arrays or Python scalars; any dtypes; the result is ``result_type(x, y)``."""
    device = operands_device((cond, x, y))
    cond, x, y = as_array(cond, device), as_array(x, device), as_array(y, device)
    device = common_device((cond, x, y))
    if not isinstance(cond, Array):
        if not isinstance(cond, (bool, int, float)):   # bool([1, 0, 1]) is True: a list would pick x everywhere
            raise TypeError(f"where: cond must be an array (numpy/torch too) or a Python scalar, got "
                            f"{type(cond).__name__}; wrap a list with fa.asarray")
        cond = Array(constant(bool(cond), (), dt.bool_, device))
    d = dt.result_type(*[a.dtype if isinstance(a, Array) else a for a in (x, y)])
    shape = views.broadcast_shapes(*[a.shape for a in (cond, x, y) if isinstance(a, Array)])
    c = broadcast_node(cast_node(cond._node, dt.bool_), shape)
    branches = [broadcast_node(cast_node(a._node, d), shape) if isinstance(a, Array) else constant(a, shape, d, device)
                for a in (x, y)]
    return Array(ir.Node(ELEMENTWISE["where"], (c, *branches), None, shape, d, device))


def astype(x, dtype, /, *, copy=True, device=None) -> Array:
    """``x`` cast to ``dtype`` (any dtype to any dtype, torch's conversion rules: float -> int truncates).
    ``copy=False`` returns ``x`` itself when the dtype already matches; ``device`` (the array API's) moves
    the result there as ``to_device``."""
    node = node_of(x)  # an Array, or a TypeError before anything moves
    if not isinstance(copy, (bool, np.bool_)):   # "no" read as True
        raise TypeError(f"astype: copy must be True or False, got {copy!r}")
    if device is not None:
        from .creation import asarray
        x = asarray(x, device=device)
        node = x._node
    d = dt.dtype(dtype)
    if node.dtype == d and not copy:
        return x
    if node.dtype.kind == "c" and d.kind not in "bc":
        raise TypeError(f"astype: casting {node.dtype} to {d} would drop the imaginary part, which the array API "
                        "does not permit; take fa.real(x) (or fa.abs(x)) first")
    return Array(ir.Node(ELEMENTWISE["astype"], (node,), None, node.shape, d, node.device))


def reduce(name: str, x, axis=None, keepdims=False, dtype=None) -> Array:
    prim = REDUCE[name]
    node = node_of(x)
    if type(keepdims) is not bool:   # bool("no") is True
        from .checks import check_bool
        keepdims = check_bool(name, "keepdims", keepdims)
    # float8 is storage: no reduction computes in it. An explicit dtype= is what the reduction computes
    # in (the input is cast to it first: sum(x8, dtype=float32) is fine), so that is the one checked.
    check_storage_only(name, node.dtype if dtype is None or name in ("any", "all") else dt.dtype(dtype))
    if (node.dtype.kind == "c" or dtype is not None and dt.dtype(dtype).kind == "c") and \
            name not in ("sum", "prod", "any", "all"):
        raise TypeError(f"{name} does not accept complex inputs (complex numbers have no order)")
    axes = views.normalize_axes(axis, len(node.shape))
    if name in ("max", "min", "argmax", "argmin") and any(node.shape[a] == 0 for a in axes):
        raise ValueError(f"{name} of an empty slice: axes {axes} of shape {node.shape} have no elements "
                         "and the reduction has no identity")
    if name in ("any", "all"):
        node = cast_node(node, dt.bool_)
    elif dtype is not None:
        if node.dtype.kind == "c" and dt.dtype(dtype).kind != "c":
            raise TypeError(f"{name}: dtype={dt.dtype(dtype)} would drop the imaginary part of a {node.dtype} "
                            "array, which the array API does not permit; take fa.real(x) first")
        node = cast_node(node, dt.dtype(dtype))
    elif prim.out == "sum" and node.dtype.kind in "biu":
        node = cast_node(node, sum_dtype(node.dtype))
    out_dtype = reduce_dtype(prim, node.dtype)
    if dtype is not None and prim.out == "sum":  # the array API: sum/prod(dtype=d) compute in d and return d
        out_dtype = node.dtype
    keep_shape = tuple(1 if i in axes else s for i, s in enumerate(node.shape))
    if not axes:
        return Array(cast_node(node, out_dtype)) if name not in ("argmax", "argmin") else \
            Array(constant(0, node.shape, dt.int64, node.device))
    out_shape = tuple(s for i, s in enumerate(node.shape) if i not in axes)
    split = _split_full_reduction(name, node, axes, out_dtype)
    if split is None:
        split = _split_column_reduction(name, node, axes, out_dtype)
    if split is not None:
        return Array(ir.view(split, (("reshape", keep_shape if keepdims else out_shape),),
                             keep_shape if keepdims else out_shape))
    red = ir.Node(prim, (node,), axes, keep_shape, out_dtype, node.device)
    if keepdims:
        return Array(red)
    return Array(ir.view(red, (("reshape", out_shape),), out_shape))


SPLIT_MIN = 1 << 20  # a full reduction at least this big runs in two stages
SPLIT_ON_CPU = False  # CPU backends gain nothing from it (tests turn it on to check the rewrite)
_SPLITTABLE = ("sum", "prod", "max", "min", "any", "all")  # associative; arg-reductions keep one pass


def _split_full_reduction(name, node, axes, out_dtype):
    """A reduction of a whole big array as two reductions: over rows, then over the partial results.
    One row kernel over one row would run as one program (one SM); many rows spread it over the GPU.
    The rows are the array's own trailing axes when they make rows of >= 1024 elements and there are
    128..65536 of them: no reshape, so any layout (views, broadcast operands such as a bias) fuses
    into the partial kernel instead of being copied out flat first; else rows of a (S, N/S) view."""
    n = math.prod(node.shape)
    if not _splits(name, node) or len(axes) != len(node.shape) or n < SPLIT_MIN:
        return None
    ndim = len(node.shape)
    for k in range(ndim - 1, 0, -1):
        rows, length = math.prod(node.shape[:k]), math.prod(node.shape[k:])
        if length >= 1024:
            if 128 <= rows <= 65536:
                return _two_stages(name, node, tuple(range(k, ndim)), tuple(range(ndim)), out_dtype)
            break
    rows = _split_factor(n)
    if _needs_a_copy_to_reshape(node) or rows is None:
        return None
    flat = ir.view(node, (("reshape", (rows, n // rows)),), (rows, n // rows))
    return _two_stages(name, flat, (1,), (0, 1), out_dtype)


COLUMN_PROGRAMS = 1024  # a column reduction launching fewer programs than this is split (GPU)
_COLUMN_STRIP = 32  # kept elements per program of a column-major reduction kernel (codegen.COLUMN_TILE // 2)


def _split_column_reduction(name, node, axes, out_dtype):
    """A reduction over leading axes (a column sum of a tall matrix: a bias gradient) as two: over
    chunks of the reduced rows, then over the chunk partials. Its kernel parallelizes over strips
    of kept columns only; 4096 columns are 128 programs, too few to fill a GPU, each walking all
    8192 rows. Chunks multiply the programs."""
    if not _splits(name, node) or axes != tuple(range(len(axes))) or len(axes) == len(node.shape):
        return None
    if _needs_a_copy_to_reshape(node):  # folding the reduced axes into one
        return None
    rows = math.prod(node.shape[:len(axes)])
    kept = node.shape[len(axes):]
    chunks = _column_chunks(rows, -(-math.prod(kept) // _COLUMN_STRIP))
    if chunks is None:
        return None
    shape = (chunks, rows // chunks, *kept)
    return _two_stages(name, ir.view(node, (("reshape", shape),), shape), (1,), (0, 1), out_dtype)


def _splits(name, node) -> bool:
    """Whether a reduction may run in two stages: associative, and on a GPU (CPU backends gain nothing)."""
    return name in _SPLITTABLE and (node.device.type != "cpu" or SPLIT_ON_CPU)


def _needs_a_copy_to_reshape(node) -> bool:
    return node.kind == "view" or (node.buffer is not None and not ir.buffer_view(node).is_contiguous())


def _two_stages(name, source, first, second, out_dtype):
    """``name`` over axes ``first`` of ``source``, then over axes ``second`` of those partials, cast to
    ``out_dtype``. Partials of float16/bfloat16 are kept in float32."""
    partial_dtype = dt.float32 if out_dtype in (dt.float16, dt.bfloat16) else out_dtype
    if name not in ("any", "all"):
        source = cast_node(source, partial_dtype)
    partial = ir.Node(REDUCE[name], (source,), first, _kept(source.shape, first), partial_dtype, source.device)
    total = ir.Node(REDUCE[name], (partial,), second, _kept(partial.shape, second), partial_dtype, source.device)
    return cast_node(total, out_dtype)


def _kept(shape, axes) -> tuple:
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def _column_chunks(rows: int, programs: int):
    """The fewest chunks (a power of two dividing ``rows``, chunks of >= 256 rows) that give
    COLUMN_PROGRAMS programs; None when no split is needed or none divides."""
    chunks = 1
    while programs * chunks < COLUMN_PROGRAMS and rows % (chunks * 2) == 0 and rows // (chunks * 2) >= 256:
        chunks *= 2
    return chunks if chunks > 1 else None


def _split_factor(n: int):
    """The most rows (<= 2048) that divide ``n`` into rows of at least 1024 elements, or None."""
    for rows in range(min(2048, n // 1024), 1, -1):
        if n % rows == 0:
            return rows
    return None


def movement(x, ops, shape) -> Array:
    """A view of ``x``; materializes first if no strided map can describe it."""
    node = node_of(x)
    if node.prim is ir.SOURCE and len(ops) == 1 and ops[0][0] == "permute" and not _transforms_recording():
        # a transposed leaf (a Linear's weight.T): torch's own view of the buffer, as _leaf_over_buffer would
        # make it, without the View arithmetic (a third of a decode GEMM's host time went to the .T)
        return Array(ir.Node(ir.SOURCE, (), node.params, tuple(shape), node.dtype, node.device,
                             node.buffer.permute(ops[0][1])))
    with ir.REBIND:  # ``node`` stays a view, or a source, for the whole of this (plan.bind may turn it)
        return _movement(node, tuple(ops), shape)


def is_view_of_memory(x, ops) -> bool:
    """Whether movement ops ``ops`` of ``x`` make a view of its memory (strides over its buffer, or over the one
    its value will have), rather than a copy: what ``copy=False`` asks of reshape."""
    node = node_of(x)
    with ir.REBIND:
        return _folded(node, tuple(ops))[0] is not None


def _folded(node, ops) -> tuple:
    """(the View ``ops`` make over ``node``'s memory or None where strides cannot describe it, the start view
    of a non-view node)."""
    if node.kind == "view":
        parent = folded_view(node)
        return (views.apply_all(parent, ops) if parent is not None else None), None
    start = ir.buffer_view(node)
    return views.apply_all(start, ops), start


def _movement(node, ops, shape) -> Array:
    folded, start = _folded(node, ops)
    if folded is None:
        node = ir.Node(ELEMENTWISE["astype"], (node,), None, node.shape, node.dtype, node.device)  # a copy
        start = views.View.contiguous(node.shape)
        folded = views.apply_all(start, ops)
    else:
        leaf = _leaf_over_buffer(node, folded)
        if leaf is not None:
            return Array(leaf)
    if node.kind == "view" and len(ops) == 1 and ops[0][0] == "permute" and node.params[-1][0] == "permute":
        out = _merge_permutes(node, ops[0][1], tuple(shape))  # x.T.T...: keep the chain short
    else:
        out = ir.view(node, ops, tuple(shape))
    if out.kind == "view":
        base = out.inputs[0]
        _FOLDED[out] = (start if base is node and start is not None else ir.buffer_view(base), folded)
    return Array(out)


_DEPTH = []  # transforms.recording.depth, once imported (the transforms package imports this module)


def _transforms_recording() -> int:
    if not _DEPTH:
        from ..transforms.recording import depth
        _DEPTH.append(depth)
    return _DEPTH[0].value


def _leaf_over_buffer(node: ir.Node, folded) -> "ir.Node | None":
    """A view of a computed buffer as a leaf over the torch view (``x[i]`` of an evaluated array): the plan key
    then holds its shape and strides, not where it starts, so a loop over rows reuses one plan (a view node
    keyed its slice start: a plan miss for every new i). Not while a transform records (its derivative or
    batch rule needs the view of the traced value) and not for negative strides (torch has none)."""
    base = node.inputs[0] if node.kind == "view" else node
    buffer = base.buffer
    if buffer is None:  # the common case of a lazy value: decided before anything else
        return None
    if _transforms_recording() or any(st < 0 for st in folded.strides):
        return None
    leaf = ir.source(buffer.as_strided(folded.shape, folded.strides, buffer.storage_offset() + folded.offset))
    if base.prim is ir.SOURCE:  # the version fa.asarray recorded (FLYARRAY_CHECK), not the one of now
        leaf.params = base.params
    return leaf


def _merge_permutes(node: ir.Node, perm: tuple, shape: tuple) -> ir.Node:
    """The view ``node`` (ending in a permute) followed by ``perm``, as one permute (none if the identity)."""
    last = node.params[-1][1]
    composed = tuple(last[p] for p in perm)
    chain = node.params[:-1] + ((("permute", composed),) if composed != tuple(range(len(composed))) else ())
    base = node.inputs[0]
    return ir.Node(ir.VIEW, (base,), chain, shape, base.dtype, base.device) if chain else base


# view node -> (the base's View it was folded from, the folded View). Folding each new view from its
# parent's cached fold keeps recording a chain of N views O(N) (it was O(N^2): 8000 transposes took 51 s).
# The base's View is the key's other half: it changes if the base is realized into a strided buffer.
_FOLDED = weakref.WeakKeyDictionary()


def folded_view(node: ir.Node):
    """The strided map of view ``node`` over its base's memory; None when no strides describe it."""
    start = ir.buffer_view(node.inputs[0])
    hit = _FOLDED.get(node)
    if hit is not None and hit[0] == start:
        return hit[1]
    folded = views.apply_all(start, node.params)
    _FOLDED[node] = (start, folded)
    return folded


def numel(shape) -> int:
    return math.prod(shape)
