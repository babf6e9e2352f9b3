"""Batching rules for fa.vmap, one place per primitive: each is attached to its primitive object as ``batch``
(as ad_rules.py attaches ``vjp``/``jvp``), in the order of primitives.py's tables.

A rule is ``rule(b) -> Array`` (a library op: a list, one Array per output), ``b`` a ``batching.Batch``:
``b.node`` the per-example node being re-interpreted, ``b.n`` the batch size, ``b.x`` the input Arrays
(batched ones carry the batch axis in front: shape ``(n,) + input.shape``; the others are the per-example
values themselves), ``b.batched`` which inputs are batched, ``b.full(i)`` input ``i`` broadcast to batched,
``b.users`` the per-example graph's users of each node id (None: an output of the function).
A rule is called only when at least one input is batched, and returns the batched value with the batch
axis at 0 (shape ``(n,) + node.shape``). Rules only record fa ops: the batched graph is a lazy graph the
scheduler fuses like the hand-written batched function.

Primitives without a rule (ragged_dot, scaled_matmul, mx_quantize, ...) make vmap raise
NotImplementedError naming them.
"""
from __future__ import annotations

from . import dtypes as dt
from . import ir, ops as F, views
from ._array import Array
from .ad_rules import ATTENTION_BWD, SOFTMAX_BWD
from .ops import core
from .ops.decompositions import DECOMPOSITIONS, PINV_ARRAY_RTOL, RANK_ARRAY_RTOL, SOLVE
from .ops.indexing import GATHER, SCATTER
from .ops.library import call
from .collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, PPERMUTE, REDUCE_SCATTER
from .ops.library_ops import ATTENTION, SOFTMAX, SOFTMAX_TOP_K, TOP_K
from .ops.linalg import MATMUL
from .ops.manipulation import CONCAT
from .ops.sorting import SCAN, SEARCHSORTED, SORT
from .primitives import ELEMENTWISE, RANDOM, REDUCE
from .complex_lowering import AS_COMPLEX, AS_REAL, COMPLEX_PRIMITIVES
from .fft import FFT


def _node(b, prim, inputs, params):
    nd = b.node
    return Array(ir.Node(prim, tuple(inputs), params, (b.n,) + nd.shape, nd.dtype, nd.device))


# ---- elementwise (and where, astype, the random-bit primitives): inputs already share the node's shape --------
def _elementwise(b):
    return _node(b, b.node.prim, [b.full(i)._node for i in range(len(b.x))], b.node.params)


for _prim in list(ELEMENTWISE.values()) + list(RANDOM.values()) + list(COMPLEX_PRIMITIVES):
    _prim.batch = _elementwise


# ---- reductions (keepdims=True nodes; params: the reduced axes) ------------------------------------------------
def _reduce(b):
    return _node(b, b.node.prim, [b.x[0]._node], tuple(a + 1 for a in b.node.params))


for _prim in REDUCE.values():
    _prim.batch = _reduce


# ---- views: each movement op of the chain gains the batch axis in front -----------------------------------------
def _batched_op(op, n):
    kind = op[0]
    if kind in ("reshape", "expand"):
        return (kind, (n,) + tuple(op[1]))
    if kind == "permute":
        return (kind, (0,) + tuple(p + 1 for p in op[1]))
    if kind == "slice":
        return (kind, (0,) + tuple(op[1]), (1,) + tuple(op[2]), (n,) + tuple(op[3]))
    return (kind, tuple(a + 1 for a in op[1]))  # flip


def _view(b):
    ops = tuple(_batched_op(op, b.n) for op in b.node.params)
    out = core.movement(b.x[0], ops, (b.n,) + b.node.shape)
    node = out._node
    if node.kind == "view" and node.shape == node.inputs[0].shape and not node.inputs[0].realized \
            and core.folded_view(node) == views.View.contiguous(node.shape):
        return Array(node.inputs[0])  # the chain is the identity (matmul's vector case below): read the value itself
    return out


ir.VIEW.batch = _view


# ---- concat (params: the axis) -------------------------------------------------------------------------------
CONCAT.batch = lambda b: _node(b, CONCAT, [b.full(i)._node for i in range(len(b.x))], b.node.params + 1)


# ---- library ops: most take leading batch dims already -------------------------------------------------------
def _kwargs(b):
    return b.node.params["kwargs"]


def _leading(b):
    """Ops over the last axis with any leading dims (top_k, softmax_top_k): the batch axis is one more."""
    return call(b.node.prim, [b.x[0]], **_kwargs(b))


def _matmul(b):
    """Batch axes broadcast (right-aligned): a batched operand gets its batch axis in front of both ranks."""
    a, w = b.node.inputs
    users = b.users.get(b.node.params["outputs"][0].id, ())
    if b.batched == [True, False] and len(a.shape) == 2 and a.shape[0] == 1 and len(w.shape) == 2 \
            and len(users) == 1 and users[0] is not None and users[0].kind == "view" \
            and core.folded_view(users[0]) == views.View.contiguous((w.shape[1],)):
        # vector @ matrix (fa.matmul lifts the vector to 1 x K, then reads [..., 0, :]): one (n, K) @ (K, N), as
        # written by hand, so the scheduler's epilogue fusion still applies (the view then folds to the identity)
        (out,) = call(MATMUL, [F.reshape(b.x[0], (b.n, a.shape[1])), b.x[1]])
        return [F.reshape(out, (b.n, 1, w.shape[1]))]
    rank = max(len(i.shape) for i in b.node.inputs)
    xs = []
    for x, is_b, inp in zip(b.x, b.batched, b.node.inputs):
        if is_b and len(inp.shape) < rank:
            x = F.reshape(x, (b.n,) + (1,) * (rank - len(inp.shape)) + inp.shape)
        xs.append(x)
    return call(MATMUL, xs, **_kwargs(b))


def _axis_plus_one(b):
    """Long-row softmax and its backward: the axis moves one right; unbatched operands broadcast."""
    kw = dict(_kwargs(b))
    kw["axis"] = kw["axis"] % len(b.node.inputs[0].shape) + 1
    return call(b.node.prim, [b.full(i) for i in range(len(b.x))], **kw)


def _attention(b):
    """(B, S, H, D) operands: the vmap batch is folded into B by a reshape, and unfolded after.
    The forward's q, k, v (and the backward's trailing output cotangent) are 4-D; bias and mask broadcast
    to (B, H, Sq, Sk): an unbatched one without a batch dim of its own stays as it is."""
    kw, n = _kwargs(b), b.n
    B = b.node.inputs[0].shape[0]
    extras = int(kw["has_bias"]) + int(kw["has_mask"])
    xs = []
    for i, (x, inp) in enumerate(zip(b.x, b.node.inputs)):
        if 3 <= i < 3 + extras:  # bias / mask
            shape = (1,) * (4 - len(inp.shape)) + inp.shape
            if not b.batched[i] and shape[0] == 1:
                xs.append(x)
                continue
            x = F.broadcast_to(F.reshape(x, (n if b.batched[i] else 1,) + shape), (n, B) + shape[1:])
        else:
            x = b.full(i)
        xs.append(F.reshape(x, (n * B,) + x.shape[2:]))
    outs = call(b.node.prim, xs, **kw)
    return [F.reshape(o, (n, B) + o.shape[1:]) for o in outs]


def _collective(*axis_params):
    """Collectives act on each rank's whole block: the batch axis rides along in front, and the axes they
    gather, scatter or split along move one right."""
    def rule(b):
        kw = dict(_kwargs(b))
        for name in axis_params:
            kw[name] = kw[name] + 1
        return call(b.node.prim, [b.x[0]], **kw)
    return rule


ALL_REDUCE.batch = PPERMUTE.batch = _collective()
ALL_GATHER.batch = REDUCE_SCATTER.batch = _collective("axis")
ALL_TO_ALL.batch = _collective("split_axis", "concat_axis")
MATMUL.batch = _matmul
TOP_K.batch = _leading
SOFTMAX_TOP_K.batch = _leading
SOFTMAX.batch = _axis_plus_one
SOFTMAX_BWD.batch = _axis_plus_one
ATTENTION.batch = _attention
ATTENTION_BWD.batch = _attention
AS_REAL.batch = AS_COMPLEX.batch = _leading  # (re, im) pairs on a trailing axis: the batch leads
FFT.batch = lambda b: call(FFT, [b.x[0]], **{**_kwargs(b), "axes": tuple(a + 1 for a in _kwargs(b)["axes"])})
SCAN.batch = _leading  # scans, sorts and searches run along the last axis: the batch is one more row dim
SORT.batch = _leading
SEARCHSORTED.batch = lambda b: call(SEARCHSORTED, [b.full(0), b.full(1)], **_kwargs(b))


# ---- gather / scatter: the batch folds into the rows (axis 0), each example's indices offset by its rows --------
def _fold_rows(b):
    z = b.full(0)
    n, rows = b.n, z.shape[1]
    idx = b.full(1)
    offset = F.reshape(F.arange(n, device=z.device) * rows, (n,) + (1,) * (idx.ndim - 1))
    ok = (idx >= 0) & (idx < rows)
    idx = F.where(ok, idx.astype(dt.int64, copy=False) + offset, -1)
    return F.reshape(z, (n * rows,) + z.shape[2:]), idx


def _gather(b):
    z, idx = _fold_rows(b)
    return call(GATHER, [z, idx])


def _scatter(b):
    z, idx = _fold_rows(b)
    (out,) = call(SCATTER, [z, idx, b.full(2)], **_kwargs(b))
    return [F.reshape(out, (b.n,) + b.node.inputs[0].shape)]


GATHER.batch = _gather
SCATTER.batch = _scatter


# ---- torch.linalg calls: they take leading batch axes (solve's vector right-hand side becomes a batch of them) ---
def _linalg(b):
    return call(b.node.prim, [b.full(i) for i in range(len(b.x))], **_kwargs(b))


def _stacks_aligned(b, values, shapes, cores):
    """Batched ``values`` (batch axis in front; per example ``shapes``, whose trailing ``cores`` axes are not
    stack axes), each given size-1 axes just after the batch axis up to the most stack axes of any, so torch's
    right-aligned broadcast of the stacks lines the batch up with the batch, not with a stack axis."""
    stacks = max(len(s) - c for s, c in zip(shapes, cores))
    return [F.reshape(v, (b.n,) + (1,) * (stacks - len(s) + c) + tuple(s)) for v, s, c in zip(values, shapes, cores)]


def _solve(b):
    """solve(a, rhs) with the batch axis in front of both; a vector per example is solved as a column."""
    a_shape, rhs_shape = b.node.inputs[0].shape, b.node.inputs[1].shape
    a, rhs = b.full(0), b.full(1)
    vector = len(rhs_shape) == 1
    if vector:
        rhs, rhs_shape = F.expand_dims(rhs, -1), rhs_shape + (1,)
    (out,) = call(b.node.prim, _stacks_aligned(b, [a, rhs], [a_shape, rhs_shape], [2, 2]))
    return [out[..., 0]] if vector else [out]


def _array_rtol(b):
    """pinv / matrix_rank(x, rtol=array): every axis of rtol is a stack axis."""
    shapes = [i.shape for i in b.node.inputs]
    return call(b.node.prim, _stacks_aligned(b, [b.full(0), b.full(1)], shapes, [2, 0]))


for _prim in DECOMPOSITIONS:
    _prim.batch = _linalg
SOLVE.batch = _solve
PINV_ARRAY_RTOL.batch = RANK_ARRAY_RTOL.batch = _array_rtol
