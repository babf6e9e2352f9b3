"""Collectives as lazy library nodes calling torch.distributed, with their derivative rules.

Each collective is a ``primitives.Library`` like matmul: recorded as one graph node, run by the plan
in graph order (the same on every rank, since every rank records the same program), with elementwise
work before and after it fused into kernels as usual. Static parameters (the mesh, its axes, the
gather axis, a permutation) are node params, so they are part of the plan's key and ``fa.jit``
replays the collective with the rest of the trace.

Derivatives (JAX's shard_map semantics, ``grad="psum"``): psum's VJP is psum of the cotangent,
all_gather's is psum_scatter and psum_scatter's is all_gather; ppermute's is the inverse permutation
and all_to_all's swaps its axes. The sharded-array propagation rules (sharded.py) keep a replicated
value's cotangent whole on every rank instead, so their all-reduce takes ``grad="full"`` (VJP:
identity) and their all-gather too (VJP: this rank's slice, no communication).
"""
from __future__ import annotations

import functools
import itertools

import torch

from . import dtypes as dt
from . import views
from .ops.library import Library, call

__all__ = ["psum", "all_gather", "psum_scatter", "ppermute", "all_to_all", "mesh_of", "register_mesh"]

_MESHES: dict = {}  # uid -> Mesh: node params hold the uid (hashable, stable), never the mesh
_uids = itertools.count(1)


def register_mesh(mesh) -> int:
    """The mesh's uid for node params (assigned on first use)."""
    uid = getattr(mesh, "_fa_uid", None)
    if uid is None:
        uid = mesh._fa_uid = next(_uids)
        _MESHES[uid] = mesh
    return uid


def mesh_of(uid):
    return _MESHES[uid]


def _dist():
    import torch.distributed as dist
    return dist


_REDUCE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


# ---- torch.distributed calls (the kernel and the reference: both backends run the same call) -------
def _group_positions(m, axes):
    """Where the rank at each index along ``axes`` (as the caller ordered them: axis_index's and ppermute's
    order) sits in the process group (whose order is the mesh's); None where the two agree."""
    in_mesh_order = tuple(sorted(axes, key=m.axis_names.index))
    if in_mesh_order == tuple(axes):
        return None
    group = m.group_ranks(in_mesh_order)
    return [group.index(r) for r in m.group_ranks(axes)]


def _inverse(positions):
    inverse = [0] * len(positions)
    for k, j in enumerate(positions):
        inverse[j] = k
    return inverse


# Integer dtypes torch.distributed's backends do not all take (gloo: "Invalid scalar type" for every 16-bit
# integer and uint32/uint64; NCCL has no 16-bit integer). Data movement sends their bytes; reductions
# widen 16-bit integers to int32 (exact: sums wrap back modulo 2^16 when narrowed) and view uint32/uint64
# as the signed type of their width: a sum wraps the same, and max/min compare as unsigned with the sign
# bit flipped on the way in and out (which maps unsigned order onto signed order).
_SIGNED_OF = {torch.uint32: torch.int32, torch.uint64: torch.int64}
_SIXTEEN = (torch.int16, torch.uint16)
_AS_BYTES = frozenset((torch.int16, torch.uint16, torch.uint32, torch.uint64))


def _bytes(t):
    """A contiguous tensor of one of ``_AS_BYTES`` as its bytes (a view, last dimension times the item
    size; a 0-d tensor becomes 1-d); other tensors as they are. torch calls a tensor contiguous whatever the
    strides of its size-1 dims (and of an empty one), but views it as bytes only with a last stride of 1: such a
    tensor is given its row-major strides first (the same memory)."""
    if t.dtype not in _AS_BYTES:
        return t
    if not t.dim():
        t = t.reshape(1)
    rowmajor = views.contiguous_strides(t.shape)
    if t.stride() != rowmajor:
        t = t.as_strided(t.shape, rowmajor, t.storage_offset())
    return t.view(torch.uint8)


def _reducible(t, op):
    """``t`` as a tensor every backend reduces with ``op`` (a new buffer), and the function that brings a
    reduced one back to ``t``'s dtype."""
    d = t.dtype
    if d in _SIXTEEN:
        wide = t.to(torch.int32)
        narrow = (lambda r: (r & 0xFFFF).to(torch.uint16)) if d is torch.uint16 else \
                 (lambda r: (r & 0xFFFF).to(torch.uint16).view(torch.int16))
        return wide, narrow
    signed = _SIGNED_OF.get(d)
    if signed is None:
        return t.contiguous().clone(), lambda r: r
    if op == "sum":   # two's complement addition wraps as unsigned addition does
        return t.contiguous().view(signed).clone(), lambda r: r.view(d)
    flip = torch.iinfo(signed).min
    return t.contiguous().view(signed) ^ flip, lambda r: (r ^ flip).view(d)


def _all_reduce(x, *, mesh, axes, op, grad):
    # torch.distributed reduces in place: a new buffer, the input's stays the input's
    out, back = _reducible(x, op)
    if mesh_of(mesh).size(axes) == 1:  # no axes, or axes of one rank: nothing to reduce with
        return back(out)
    if op != "sum" and out.is_floating_point():
        return _max_or_min_keeping_nan(out, op, mesh_of(mesh).group(axes))
    _dist().all_reduce(out, op=getattr(_dist().ReduceOp, _REDUCE_OPS[op]), group=mesh_of(mesh).group(axes))
    return back(out)


def _max_or_min_keeping_nan(x, op, group):
    """A float max/min over ranks that is NaN wherever any rank's value is, as fa.max on one device is (gloo's
    MAX/MIN drop NaNs, so the answer depended on which rank held one): the values and a NaN flag (1 for max,
    -1 for min, so the same reduction finds it) travel in one collective."""
    flag = torch.isnan(x).to(x.dtype)
    both = torch.stack([x, flag if op == "max" else -flag])
    _dist().all_reduce(both, op=getattr(_dist().ReduceOp, _REDUCE_OPS[op]), group=group)
    return torch.where(both[1] != 0, torch.full_like(x, float("nan")), both[0])


def _all_gather(x, *, mesh, axes, axis, tiled, grad):
    m = mesh_of(mesh)
    n = m.size(axes)
    src = (x if tiled else x.unsqueeze(axis)).movedim(axis, 0).contiguous()
    if n == 1:  # a new buffer, as every collective's result
        return src.movedim(0, axis).clone(memory_format=torch.contiguous_format)
    out = torch.empty((n * src.shape[0],) + tuple(src.shape[1:]), dtype=x.dtype, device=x.device)
    _dist().all_gather_into_tensor(_bytes(out), _bytes(src), group=m.group(axes))
    pos = _group_positions(m, axes)
    if pos is not None:  # block k: from index k along axes as given
        out = out.view((n, -1) + tuple(src.shape[1:]))[pos].flatten(0, 1)
    return out.movedim(0, axis).contiguous()


def _reduce_scatter(x, *, mesh, axes, axis, tiled):
    m = mesh_of(mesh)
    n = m.size(axes)
    src = x.movedim(axis, 0).contiguous()
    if n == 1:
        return (x if tiled else x.squeeze(axis)).contiguous().clone()
    pos = _group_positions(m, axes)
    if pos is not None:  # group position j keeps block k, the one of its index k along axes as given
        src = src.view((n, -1) + tuple(src.shape[1:]))[_inverse(pos)].flatten(0, 1).contiguous()
    src, back = _reducible(src, "sum")
    out = torch.empty((src.shape[0] // n,) + tuple(src.shape[1:]), dtype=src.dtype, device=x.device)
    _dist().reduce_scatter_tensor(out, src, group=m.group(axes))
    out = back(out).movedim(0, axis)
    return (out if tiled else out.squeeze(axis)).contiguous()


def _all_to_all(x, *, mesh, axes, split_axis, concat_axis):
    m = mesh_of(mesh)
    n = m.size(axes)
    if n == 1:
        return x.clone()
    src = torch.stack(x.chunk(n, split_axis)).contiguous()  # [n, ...]: chunk i goes to index i
    pos = _group_positions(m, axes)
    if pos is not None:  # the group sends chunk j to group position j: put index k's chunk at pos[k]
        src = src[_inverse(pos)].contiguous()
    out = torch.empty_like(src)
    _dist().all_to_all_single(_bytes(out), _bytes(src), group=m.group(axes))
    if pos is not None:  # received from group position j = index inverse[j]: back in index order
        out = out[pos]
    return torch.cat(out.unbind(0), dim=concat_axis).contiguous()


def _ppermute(x, *, mesh, axes, perm):
    dist, m = _dist(), mesh_of(mesh)
    ranks, me = m.group_ranks(axes), m.index(axes)
    out = torch.zeros_like(x, memory_format=torch.contiguous_format)  # JAX: an index no pair sends to gets zeros
    src = x.contiguous()
    ops = [dist.P2POp(dist.isend, _bytes(src), ranks[d]) for s, d in perm if s == me and d != me]
    ops += [dist.P2POp(dist.irecv, _bytes(out), ranks[s]) for s, d in perm if d == me and s != me]
    if (me, me) in perm:
        out.copy_(src)
    for work in (dist.batch_isend_irecv(ops) if ops else []):
        work.wait()
    return out


# ---- shape rules (record time: bad axes fail before anything runs) ----------------------------------------
def _axis(name, axis, ndim):
    if ndim == 0:
        raise ValueError(f"{name}: needs an array with at least one dimension here (got a 0-d array); "
                         "reshape it to (1,) first")
    if not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise ValueError(f"{name}: axis {axis!r} is out of range for {ndim} dims")
    return axis % ndim


def _same(x, **kw):
    return [(x.shape, x.dtype)]


def _all_gather_abstract(x, *, mesh, axes, axis, tiled, grad):
    n = mesh_of(mesh).size(axes)
    if tiled:
        return [(x.shape[:axis] + (x.shape[axis] * n,) + x.shape[axis + 1:], x.dtype)]
    return [(x.shape[:axis] + (n,) + x.shape[axis:], x.dtype)]


def _reduce_scatter_abstract(x, *, mesh, axes, axis, tiled):
    n = mesh_of(mesh).size(axes)
    size = x.shape[axis]
    if tiled and size % n:
        raise ValueError(f"psum_scatter: dimension {axis} of shape {x.shape} ({size}) is not divisible by the "
                         f"{n} ranks of mesh axes {axes}")
    if not tiled and size != n:
        raise ValueError(f"psum_scatter: dimension {axis} of shape {x.shape} must equal the {n} ranks of mesh "
                         f"axes {axes} (or pass tiled=True)")
    kept = (size // n,) if tiled else ()
    return [(x.shape[:axis] + kept + x.shape[axis + 1:], x.dtype)]


def _all_to_all_abstract(x, *, mesh, axes, split_axis, concat_axis):
    n = mesh_of(mesh).size(axes)
    if x.shape[split_axis] % n:
        raise ValueError(f"all_to_all: split dimension {split_axis} of shape {x.shape} is not divisible by {n}")
    shape = list(x.shape)
    shape[split_axis] //= n
    shape[concat_axis] *= n
    return [(tuple(shape), x.dtype)]


ALL_REDUCE = Library("all_reduce", _same, _all_reduce, _all_reduce)
ALL_GATHER = Library("all_gather", _all_gather_abstract, _all_gather, _all_gather)
REDUCE_SCATTER = Library("reduce_scatter", _reduce_scatter_abstract, _reduce_scatter, _reduce_scatter)
ALL_TO_ALL = Library("all_to_all", _all_to_all_abstract, _all_to_all, _all_to_all)
PPERMUTE = Library("ppermute", _same, _ppermute, _ppermute)


# ---- recording ------------------------------------------------------------------------------------------
def _check_float_or_int(name, x):
    from .ops.core import node_of
    d = node_of(x).dtype
    if d in dt.STORAGE_ONLY:
        raise TypeError(f"{name}: {d} is a storage format; cast it first")


def _counts(x):
    """A bool ``x`` as int32 for a sum over ranks (jax.lax.psum counts; a backend's bool SUM is an OR)."""
    from .ops import astype
    from .ops.core import node_of
    return astype(x, dt.int32) if node_of(x).dtype.kind == "b" else x


def psum(x, mesh, axes, *, op="sum", grad="psum"):
    """The sum (or max/min) of ``x`` over the ranks of mesh axes ``axes``, on each of them (all_reduce).
    A bool sum counts, in int32 (as jax.lax.psum); max/min of bools stay bool."""
    _check_float_or_int("psum", x)
    if op not in _REDUCE_OPS:
        raise ValueError(f"psum: op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
    if op == "sum":
        x = _counts(x)
    return call(ALL_REDUCE, [x], mesh=register_mesh(mesh), axes=mesh.check_axes(axes), op=op, grad=grad)[0]


def all_gather(x, mesh, axes, *, axis=0, tiled=False, grad="psum"):
    """Every rank's ``x`` along mesh axes ``axes``: stacked on a new ``axis`` or (``tiled``) concatenated."""
    _check_float_or_int("all_gather", x)
    axis = _axis("all_gather", axis, x.ndim + (0 if tiled else 1))
    return call(ALL_GATHER, [x], mesh=register_mesh(mesh), axes=mesh.check_axes(axes), axis=axis,
                tiled=bool(tiled), grad=grad)[0]


def psum_scatter(x, mesh, axes, *, axis=0, tiled=False):
    """The sum over ``axes`` of ``x``, of which each rank keeps its block along ``axis`` (reduce_scatter).
    A bool sum counts, in int32 (as psum)."""
    _check_float_or_int("psum_scatter", x)
    x = _counts(x)
    axis = _axis("psum_scatter", axis, x.ndim)
    return call(REDUCE_SCATTER, [x], mesh=register_mesh(mesh), axes=mesh.check_axes(axes), axis=axis,
                tiled=bool(tiled))[0]


def all_to_all(x, mesh, axes, split_axis, concat_axis):
    """Split ``x`` into blocks along ``split_axis``, send block i to rank i of ``axes``, concatenate the
    received blocks along ``concat_axis`` (all_to_all_single)."""
    _check_float_or_int("all_to_all", x)
    split_axis, concat_axis = _axis("all_to_all", split_axis, x.ndim), _axis("all_to_all", concat_axis, x.ndim)
    return call(ALL_TO_ALL, [x], mesh=register_mesh(mesh), axes=mesh.check_axes(axes), split_axis=split_axis,
                concat_axis=concat_axis)[0]


def ppermute(x, mesh, axes, perm):
    """``x`` sent from index s to index d along ``axes`` for each (s, d) in ``perm``; zeros where none arrives."""
    _check_float_or_int("ppermute", x)
    n = mesh.size(axes)
    perm = tuple((int(s), int(d)) for s, d in perm)
    srcs, dsts = [s for s, _ in perm], [d for _, d in perm]
    if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts) or not all(0 <= i < n for i in srcs + dsts):
        raise ValueError(f"ppermute: perm {perm} must be pairs of distinct sources and distinct destinations "
                         f"in 0..{n - 1}")
    return call(PPERMUTE, [x], mesh=register_mesh(mesh), axes=mesh.check_axes(axes), perm=perm)[0]


# ---- derivative rules ------------------------------------------------------------------------------------
def _local_slice(g, mesh, axes, axis, tiled):
    """This rank's block of a cotangent every rank holds whole: the all-gather's adjoint, no communication."""
    m = mesh_of(mesh)
    i = m.index(axes)
    if not tiled:
        return g[(slice(None),) * axis + (i,)]
    size = g.shape[axis] // m.size(axes)
    return g[(slice(None),) * axis + (slice(i * size, (i + 1) * size),)]


def _all_reduce_vjp(gs, e):
    kw = e.params["kwargs"]
    if kw["op"] != "sum":
        raise TypeError(f"psum with op={kw['op']!r} is not differentiable (only sums are)")
    if kw["grad"] == "full":
        return [gs[0]]
    return call(ALL_REDUCE, [gs[0]], **kw)


def _all_gather_vjp(gs, e):
    kw = dict(e.params["kwargs"])
    if kw.pop("grad") == "full":
        return [_local_slice(gs[0], **kw)]
    return call(REDUCE_SCATTER, [gs[0]], **kw)


def _reduce_scatter_vjp(gs, e):
    return call(ALL_GATHER, [gs[0]], grad="psum", **e.params["kwargs"])


def _all_to_all_vjp(gs, e):
    kw = e.params["kwargs"]
    return call(ALL_TO_ALL, [gs[0]], mesh=kw["mesh"], axes=kw["axes"], split_axis=kw["concat_axis"],
                concat_axis=kw["split_axis"])


def _ppermute_vjp(gs, e):
    kw = e.params["kwargs"]
    return call(PPERMUTE, [gs[0]], mesh=kw["mesh"], axes=kw["axes"], perm=tuple((d, s) for s, d in kw["perm"]))


ALL_REDUCE.vjp = _all_reduce_vjp
ALL_GATHER.vjp = _all_gather_vjp
REDUCE_SCATTER.vjp = _reduce_scatter_vjp
ALL_TO_ALL.vjp = _all_to_all_vjp
PPERMUTE.vjp = _ppermute_vjp


def _all_reduce_jvp(ts, e):
    kw = e.params["kwargs"]
    if kw["op"] != "sum":  # max's tangent is the argmax rank's, not the max of the tangents
        raise TypeError(f"psum with op={kw['op']!r} is not differentiable (only sums are)")
    return call(ALL_REDUCE, [ts[0]], **kw)


# Forward mode: every other collective is linear, so its tangent is the same collective of the tangent.
ALL_REDUCE.jvp = _all_reduce_jvp
ALL_GATHER.jvp = lambda t, e: call(ALL_GATHER, [t[0]], **e.params["kwargs"])
REDUCE_SCATTER.jvp = lambda t, e: call(REDUCE_SCATTER, [t[0]], **e.params["kwargs"])
ALL_TO_ALL.jvp = lambda t, e: call(ALL_TO_ALL, [t[0]], **e.params["kwargs"])
PPERMUTE.jvp = lambda t, e: call(PPERMUTE, [t[0]], **e.params["kwargs"])


# ---- boundaries between replicated and per-rank values (custom VJPs, identity forward) -----------------
@functools.lru_cache(maxsize=None)
def broadcast_boundary(mesh_uid, axes):
    """A replicated value entering per-rank work along ``axes``: identity; its VJP sums the per-rank
    cotangents (psum), since every rank's use contributed to the one value's derivative."""
    from .transforms import custom_vjp

    @custom_vjp
    def pbroadcast(x):
        return x
    pbroadcast.defvjp(lambda x: (x, None), lambda _, g: (psum(g, mesh_of(mesh_uid), axes),))
    pbroadcast.linear_tangent = lambda t: t  # forward mode: the replicated tangent meets every rank's work
    return pbroadcast


@functools.lru_cache(maxsize=None)
def split_boundary(mesh_uid, axes):
    """A value declared replicated along ``axes`` leaving shard_map: identity; its VJP hands each rank
    1/n of the whole cotangent, so psum's VJP (psum) inside adds it back up once (JAX's convention)."""
    from .transforms import custom_vjp
    n = mesh_of(mesh_uid).size(axes)

    @custom_vjp
    def unbroadcast(x):
        return x
    unbroadcast.defvjp(lambda x: (x, None), lambda _, g: (g / n if g.dtype.kind == "f" else g,))
    unbroadcast.linear_tangent = lambda t: t
    unbroadcast.replicates = True  # its result is the same on every rank of ``axes`` (shard_map's closure check)
    return unbroadcast
