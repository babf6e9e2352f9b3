"""Sharded arrays: a logical (global) array of which each rank holds its shard, and the rules that carry
shardings through ops.

A ``ShardedArray`` is a wrapper beside the graph: ``local`` is an ordinary lazy ``fa.Array`` (this
rank's shard, a node in this rank's graph), ``sharding`` a ``NamedSharding``, ``shape`` the global
shape. Ops on it record ops on the local shards plus, where the rules need them, collectives
(collectives.py): nothing in the plan, scheduler or codegen knows about sharding.

Propagation (docs/distributed.md):
- elementwise ops between arrays with the same sharding, replicated arrays and scalars: per shard, no
  communication (a replicated operand is sliced to this rank's block locally);
- reductions: local, plus an all-reduce over the mesh axes of any reduced dimension that is split;
- matmul: a split contraction dimension gives a local matmul and an all-reduce (row-parallel); split
  M / batch or N dimensions stay local (data- / column-parallel);
- anything else (``apply``, conflicting shardings): the operands are all-gathered first.

Derivatives: a replicated value's cotangent is held whole on every rank; where a replicated operand
meets per-rank work its cotangent is summed over the ranks (collectives.broadcast_boundary), so
``fa.grad`` through these rules equals the single-device gradient.
"""
from __future__ import annotations

import math

import torch

from . import collectives as C
from . import tree_util, views
from ._array import Array, _operand_ok
from .sharding import NamedSharding, PartitionSpec

__all__ = ["ShardedArray", "device_put", "device_get", "from_local", "apply", "elementwise"]


class ShardedArray:
    """A logical array split over a mesh: ``local`` is this rank's shard (an fa.Array), ``shape`` global."""
    __array_priority__ = 200  # numpy and fa.Array defer to our reflected operators

    def __init__(self, local: Array, sharding: NamedSharding):
        if not isinstance(local, Array):
            raise TypeError(f"ShardedArray: local must be an fa.Array, got {type(local).__name__}")
        axes = sharding.dim_axes(local.ndim)
        self.local, self.sharding = local, sharding
        self.shape = tuple(s * sharding.mesh.size(a) for s, a in zip(local.shape, axes))

    dtype = property(lambda self: self.local.dtype)
    device = property(lambda self: self.local.device)
    ndim = property(lambda self: self.local.ndim)
    size = property(lambda self: math.prod(self.shape))
    dim_axes = property(lambda self: self.sharding.dim_axes(self.local.ndim))

    def __repr__(self):
        return f"ShardedArray(shape={self.shape}, dtype={self.dtype.name}, {self.sharding!r})"

    def __bool__(self):
        raise TypeError("the truth value of a ShardedArray is ambiguous across ranks; use fa.device_get(x) first")

    def __array__(self, dtype=None, copy=None):
        raise TypeError("a ShardedArray holds only this rank's shard; use np.asarray(fa.device_get(x)) for the "
                        "whole array")

    def __dlpack_device__(self):
        return self.local.__dlpack_device__()

    def __dlpack__(self, *args, **kwargs):   # torch.from_dlpack(x): this message, not an invalid capsule
        raise TypeError("a ShardedArray holds only this rank's shard; use torch.from_dlpack(fa.device_get(x)) for "
                        "the whole array, or x.local for this rank's shard")

    # ---- ops (the propagation rules below) ---------------------------------------------------------
    def __matmul__(self, other):
        if not isinstance(other, ShardedArray) and not _operand_ok(other):
            return NotImplemented
        return matmul(self, other)

    def __rmatmul__(self, other):
        if not _operand_ok(other):
            return NotImplemented
        return matmul(other, self)

    def sum(self, axis=None, keepdims=False):
        return reduce("sum", self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return reduce("mean", self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return reduce("max", self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return reduce("min", self, axis, keepdims)

    def astype(self, dtype):
        return ShardedArray(self.local.astype(dtype), self.sharding)

    @property
    def T(self):
        if self.ndim != 2:
            raise ValueError(f".T needs a 2-D array (got shape {self.shape})")
        spec = self.dim_axes
        return ShardedArray(self.local.T, NamedSharding(self.sharding.mesh, _spec(spec[::-1])))


def _binary(op, reflected=False):
    def method(self, other):
        if not isinstance(other, ShardedArray) and not _operand_ok(other):
            # None, a str, a list...: Python's own answer, as fa.Array's (``xs == None`` is False,
            # ``xs + "a"`` a TypeError), never a NotImplemented passed on as a shard
            return NotImplemented
        fn = getattr(Array, op)
        return elementwise(lambda a, b: fn(b, a) if reflected else fn(a, b), self, other)
    return method


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift"):
    setattr(ShardedArray, f"__{_name}__", _binary(f"__{_name}__"))
    setattr(ShardedArray, f"__r{_name}__", _binary(f"__{_name}__", reflected=True))
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(ShardedArray, f"__{_name}__", _binary(f"__{_name}__"))
ShardedArray.__hash__ = object.__hash__
ShardedArray.__neg__ = lambda self: elementwise(lambda a: -a, self)
ShardedArray.__abs__ = lambda self: elementwise(abs, self)
ShardedArray.__pos__ = lambda self: elementwise(lambda a: +a, self)
ShardedArray.__invert__ = lambda self: elementwise(lambda a: ~a, self)

def _tree_sharding(s):
    """The sharding the tree structure holds: a replicated one as P(), which fits the local shard whatever
    dimensions a transform (vmap) adds or removes."""
    sharding = s.sharding
    if sharding.spec and sharding.is_replicated:
        return NamedSharding(sharding.mesh, PartitionSpec())
    return sharding


# fa.jit and fa.grad see a ShardedArray as its local shard; the sharding rides in the tree structure.
tree_util.register_pytree_node(ShardedArray, lambda s: ([s.local], _tree_sharding(s)),
                               lambda sharding, leaves: ShardedArray(leaves[0], sharding))


def _spec(dim_axes):
    """The PartitionSpec of per-dimension mesh axes, without trailing Nones: a replicated result's spec is
    P(), which fits any number of dimensions (fa.vmap can batch it)."""
    parts = [None if not a else (a[0] if len(a) == 1 else a) for a in dim_axes]
    while parts and parts[-1] is None:
        parts.pop()
    return PartitionSpec(*parts)


# ---- in and out -------------------------------------------------------------------------------------------
def device_put(x, sharding: NamedSharding) -> ShardedArray:
    """Shard ``x``, the *whole* logical array, which every rank passes (as JAX's device_put of a host
    array): each rank keeps its own block. A lazy view of ``x``, no communication (the VJP all-gathers
    the block's cotangent, so ``fa.grad`` through device_put of a replicated array is whole). Each split
    dimension must divide evenly. (An array that already is this rank's shard: ``fa.sharding.from_local``.)"""
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"device_put: sharding must be an fa.sharding.NamedSharding, got {type(sharding).__name__}")
    if isinstance(x, ShardedArray):
        x = device_get(x)
    from .ops import asarray
    x = asarray(x)
    axes = sharding.dim_axes(x.ndim)
    for d, (size, names) in enumerate(zip(x.shape, axes)):  # every dimension checked before any work
        n = sharding.mesh.size(names) if names else 1
        if size % n:
            raise ValueError(f"device_put: dimension {d} of shape {x.shape} ({size}) does not split evenly over "
                             f"the {n} ranks of mesh axes {names}")
    local = x
    for d, names in enumerate(axes):
        if names:  # this rank's block; differentiable: the block's cotangent is gathered back whole
            local = _block(local, sharding.mesh, names, d)
    return ShardedArray(local, sharding)


def from_local(local, sharding: NamedSharding) -> ShardedArray:
    """A ShardedArray from this rank's shard ``local`` (e.g. data each rank loaded itself)."""
    from .ops import asarray
    return ShardedArray(asarray(local), sharding)


def device_get(x):
    """The whole logical array on every rank (all-gathers each split dimension): a lazy fa.Array.
    Collective: every rank must call it (and evaluate the result) in the same order."""
    if isinstance(x, Array):
        return x
    if not isinstance(x, ShardedArray):
        raise TypeError(f"device_get: expected a ShardedArray or fa.Array, got {type(x).__name__}")
    return gather(x, range(x.ndim)).local


def gather(x: ShardedArray, dims) -> ShardedArray:
    """``x`` with dimensions ``dims`` no longer split (all-gathered; their cotangent: this rank's slice)."""
    mesh, local, axes = x.sharding.mesh, x.local, list(x.dim_axes)
    for d in dims:
        if axes[d]:
            local = C.all_gather(local, mesh, axes[d], axis=d, tiled=True, grad="full")
            axes[d] = ()
    return ShardedArray(local, NamedSharding(mesh, _spec(axes)))


# ---- elementwise --------------------------------------------------------------------------------------------
def _mesh_of(args):
    meshes = {id(a.sharding.mesh): a.sharding.mesh for a in args if isinstance(a, ShardedArray)}
    if len(meshes) > 1:
        raise ValueError("operands are sharded over different meshes; device_get one of them first")
    return next(iter(meshes.values()))


def _out_axes(args, ndim):
    """Per output dimension the mesh axes that split it, or None when operands disagree (then gather)."""
    out = [()] * ndim
    for a in args:
        if not isinstance(a, ShardedArray):
            continue
        for d, names in enumerate(a.dim_axes):
            od = ndim - a.ndim + d
            if not names:
                continue
            if out[od] and out[od] != names:
                return None
            out[od] = names
    used = [n for names in out for n in names]
    return out if len(used) == len(set(used)) else None


def _fit(a, target, mesh, extra=()):
    """Operand ``a`` as this rank's local operand of per-rank work split as ``target`` (mesh axes per
    dimension, right-aligned with a's) that also varies along the mesh axes ``extra``."""
    if not isinstance(a, (ShardedArray, Array)):
        return a  # a Python scalar
    if isinstance(a, Array):
        a = ShardedArray(a, NamedSharding(mesh, PartitionSpec()))  # a plain array is replicated
    local, lead = a.local, len(target) - a.ndim
    varying = set(extra)  # mesh axes the work varies along but this operand does not
    for od, names in enumerate(target):
        d = od - lead
        mine = a.dim_axes[d] if d >= 0 else ()
        if not names or mine == names:
            continue
        if d >= 0 and local.shape[d] != 1:  # replicated and whole along d: keep this rank's block
            local = _block(local, mesh, names, d)
        else:  # broadcast along d: the same value meets every rank's block
            varying.update(names)
    if varying:
        local = C.broadcast_boundary(C.register_mesh(mesh), _ordered(mesh, varying))(local)
    return local


def _ordered(mesh, names):
    return tuple(a for a in mesh.axis_names if a in names)


def _block(local, mesh, names, d):
    """This rank's block of a replicated ``local`` along ``d``: a view; its cotangent is all-gathered."""
    from .transforms import custom_vjp
    n, i = mesh.size(names), mesh.index(names)
    size = local.shape[d]
    if size % n:
        raise ValueError(f"dimension of size {size} does not split evenly over the {n} ranks of {names}")
    index = (slice(None),) * d + (slice(i * size // n, (i + 1) * size // n),)

    @custom_vjp
    def block(x):
        return x[index]
    block.defvjp(lambda x: (x[index], None),
                 lambda _, g: (C.all_gather(g, mesh, names, axis=d, tiled=True, grad="full"),))
    block.linear_tangent = lambda t: t[index]  # forward mode: this rank's block of the tangent
    block.block_of = (mesh, names)  # what shard_map's closure check reads (shard_map._own_block)
    return block(local)


def elementwise(fn, *args):
    """``fn`` (an elementwise fa function of Arrays and scalars) on sharded operands, per shard.

    Operands with the same sharding, replicated ones (plain fa.Arrays count as replicated) and Python
    scalars need no communication; operands split differently are all-gathered first. numpy arrays and
    torch tensors are whole arrays (replicated), as fa.Arrays; shapes broadcast as the global arrays'."""
    args = [_as_array(a) if _is_foreign_array(a) else a for a in args]
    if not any(isinstance(a, ShardedArray) for a in args):
        return fn(*args)  # nothing sharded: the plain op
    mesh = _mesh_of(args)
    shapes = [a.shape for a in args if isinstance(a, (ShardedArray, Array))]
    try:
        views.broadcast_shapes(*shapes)
    except ValueError as exc:
        raise ValueError(f"sharded elementwise op: the operands' (global) {exc}") from None
    ndim = max(a.ndim for a in args if isinstance(a, (ShardedArray, Array)))
    out_axes = _out_axes(args, ndim)
    if out_axes is None:  # conflicting shardings: gather everything, then run replicated
        args = [gather(a, range(a.ndim)) if isinstance(a, ShardedArray) else a for a in args]
        out_axes = [()] * ndim
    locals_ = [_fit(a, out_axes, mesh) for a in args]
    out = fn(*locals_)
    block = views.broadcast_shapes(*[a.shape for a in locals_ if isinstance(a, Array)])
    if not isinstance(out, Array) or tuple(out.shape) != tuple(block):
        # a reduction or reshape per block would come back as a global array of the wrong shape and values
        raise ValueError(f"sharded elementwise op: the function must be elementwise, but on blocks of shape {block} "
                         f"it returned {_shape_or_type(out)}; use shard_map for other per-block functions")
    return ShardedArray(out, NamedSharding(mesh, _spec(out_axes)))


def _shape_or_type(value) -> str:
    return f"shape {tuple(value.shape)}" if hasattr(value, "shape") else f"a {type(value).__name__}"


# ---- reductions ----------------------------------------------------------------------------------------------
def reduce(name, x: ShardedArray, axis=None, keepdims=False) -> ShardedArray:
    """A reduction: local over this rank's block, then an all-reduce over the split reduced dimensions."""
    from .views import normalize_axes
    axes = normalize_axes(axis, x.ndim)
    mesh, dim_axes = x.sharding.mesh, x.dim_axes
    over = _ordered(mesh, {n for d in axes for n in dim_axes[d]})
    op = "sum" if name in ("sum", "mean") else name
    local = x.local
    # float16/bfloat16 sums and means accumulate in float32 across ranks too, rounded once at the end (as
    # fa.sum/fa.mean): a float16 partial sum overflowed (the mean of 60000s was inf)
    narrow = op == "sum" and x.dtype.name in ("float16", "bfloat16")
    if narrow:
        from . import float32
        local = local.astype(float32)
    out = getattr(local, op)(axis=axes, keepdims=keepdims)
    if over:
        out = C.psum(out, mesh, over, op=op, grad="full")
    if name == "mean":
        out = out / math.prod(x.shape[d] for d in axes)
    if narrow:
        out = out.astype(x.dtype)
    kept = [() if d in axes else a for d, a in enumerate(dim_axes)]
    if not keepdims:
        kept = [a for d, a in enumerate(kept) if d not in axes]
    return ShardedArray(out, NamedSharding(mesh, _spec(kept)))


# ---- matmul --------------------------------------------------------------------------------------------------
def matmul(a, b) -> ShardedArray:
    """``a @ b`` for a of shape (..., M, K) and b of shape (K, N).

    Split K (the same mesh axes on both): a local matmul and an all-reduce (row-parallel); split M,
    batch or N: local (data- / column-parallel). K split on one operand only: the other, replicated,
    is sliced to this rank's block. Any other combination all-gathers first."""
    mesh = _mesh_of([a, b])
    a = a if isinstance(a, ShardedArray) else ShardedArray(_as_array(a), NamedSharding(mesh, PartitionSpec()))
    b = b if isinstance(b, ShardedArray) else ShardedArray(_as_array(b), NamedSharding(mesh, PartitionSpec()))
    if b.ndim != 2 or a.ndim < 2:
        raise ValueError(f"sharded matmul: a must be (..., M, K) and b (K, N), got {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"sharded matmul: contraction sizes differ: {a.shape} @ {b.shape}")
    ka, kb = a.dim_axes[-1], b.dim_axes[0]
    k = ka or kb
    if ka and kb and ka != kb:
        a, b, k = gather(a, [a.ndim - 1]), gather(b, [0]), ()
    out_axes = list(a.dim_axes[:-1]) + [b.dim_axes[1]]
    used = [n for names in out_axes for n in names] + list(k)
    if len(used) != len(set(used)):  # one mesh axis on two dimensions: gather both
        a, b, k = gather(a, range(a.ndim)), gather(b, range(2)), ()
        out_axes = [()] * (a.ndim)
    # a works on (..., M, K) blocks and meets every N block; b on (K, N) blocks and meets every M block.
    la = _fit(a, list(out_axes[:-1]) + [k], mesh, extra=out_axes[-1])
    lb = _fit(b, [k, out_axes[-1]], mesh, extra=[n for names in out_axes[:-1] for n in names])
    out = la @ lb
    if k:
        out = C.psum(out, mesh, k, grad="full")
    return ShardedArray(out, NamedSharding(mesh, _spec(out_axes)))


def _as_array(x):
    from .ops import asarray
    return asarray(x)


def _is_foreign_array(x):
    import numpy as np
    return isinstance(x, (np.ndarray, torch.Tensor))


# ---- anything else -----------------------------------------------------------------------------------------
def apply(fn, *args, **kwargs):
    """``fn`` on the whole arrays: every ShardedArray argument is all-gathered first (communication!),
    then ``fn`` runs replicated on every rank; its Array results come back as plain fa.Arrays."""
    args = [device_get(a) if isinstance(a, ShardedArray) else a for a in args]
    kwargs = {k: device_get(v) if isinstance(v, ShardedArray) else v for k, v in kwargs.items()}
    return fn(*args, **kwargs)
