"""fa.shard_map: a function written for one shard, run on every rank over its own blocks (JAX's shard_map).

Inside ``f`` the arrays are plain local fa.Arrays (this rank's blocks, as ``in_specs`` split them) and
the collectives of ``fa.lax`` (psum, all_gather, psum_scatter, ppermute, all_to_all, axis_index) name
mesh axes; ``out_specs`` say how the local results assemble into ShardedArrays. An output whose spec
omits a mesh axis is *declared* the same on every rank of that axis (as JAX with check_rep=False:
not checked).

Derivatives follow JAX: inside, psum's VJP is psum. At the boundary an input replicated along a mesh
axis gets the sum of the per-rank cotangents over that axis, and an output replicated along an axis
hands each rank 1/n of its cotangent (collectives.broadcast_boundary / split_boundary), so the
gradient of a shard_map equals the single-device gradient.
"""
from __future__ import annotations

import contextlib
import threading

from . import collectives as C
from . import ir, tree_util
from ._array import Array
from .sharded import ShardedArray, _block, _ordered, gather
from .sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["shard_map", "current_mesh"]

_context = threading.local()


def current_mesh(op: str) -> Mesh:
    """The mesh of the innermost shard_map being traced (``op`` names the caller in the error)."""
    return _innermost(op)[0]


def current_device(op: str):
    """The device of the innermost shard_map's arrays (None: it had none), for values made from nothing."""
    return _innermost(op)[1]


def _innermost(op):
    stack = getattr(_context, "meshes", None)
    if not stack:
        raise RuntimeError(f"fa.lax.{op} names mesh axes, so it works only inside fa.shard_map(f, mesh, ...)")
    return stack[-1]


@contextlib.contextmanager
def _inside(mesh, device=None):
    stack = _context.__dict__.setdefault("meshes", [])
    stack.append((mesh, device))
    try:
        yield
    finally:
        stack.pop()


def _as_spec(spec, what):
    if isinstance(spec, PartitionSpec):
        return spec
    if spec is None:
        return PartitionSpec()
    raise TypeError(f"shard_map: each of {what} must be an fa.sharding.PartitionSpec (P(...)), got {spec!r}")


def shard_map(f, mesh: Mesh, in_specs, out_specs):
    """``f`` run per shard: ``in_specs`` one PartitionSpec per positional argument, ``out_specs`` one per
    output (a single spec for a single output, else a tuple/list matching f's returned tuple/list)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"shard_map: mesh must be an fa.sharding.Mesh, got {type(mesh).__name__}")
    one = isinstance(in_specs, PartitionSpec) or not isinstance(in_specs, (tuple, list))  # P is a tuple too
    in_specs = tuple(_as_spec(s, "in_specs") for s in ((in_specs,) if one else in_specs))

    def wrapped(*args):
        if len(args) != len(in_specs):
            raise TypeError(f"shard_map: {len(args)} arguments for {len(in_specs)} in_specs")
        locals_ = [_enter(a, mesh, spec, i) for i, (a, spec) in enumerate(zip(args, in_specs))]
        start = next(ir._ids)  # every node f makes has a larger id
        with _inside(mesh, locals_[0].device if locals_ else None):
            out = f(*locals_)
        _check_closures(out, start, {x._node.id for x in locals_})
        return _leave(out, mesh, out_specs)
    return wrapped


def _check_closures(out, start, entered):
    """Refuse what would be a silently wrong gradient: under fa.grad/vjp, ``f`` closing over an array that
    depends on what is differentiated. Its per-rank cotangents are never summed over the ranks (an argument's
    are, at the boundary), so each rank would get a different, partial gradient."""
    from .transforms.autodiff import differentiated_nodes
    targets = differentiated_nodes()
    if not targets:
        return
    lowest = min(n.id for n in targets)
    target_ids = {n.id for n in targets}
    seen, stack = set(), [leaf._node for leaf in tree_util.tree_leaves(out) if isinstance(leaf, Array)]
    closed = []
    while stack:  # the body's own nodes (ids >= start) down to the values from outside it
        node = stack.pop()
        if node.id in seen:
            continue
        seen.add(node.id)
        if node.id < start:
            if node.id not in entered:
                closed.append(node)
        else:
            stack.extend(node.inputs)
    for node in closed:
        if _partial_cotangent(node, target_ids, lowest):
            raise ValueError(f"shard_map: f closes over an array ({node.dtype}{list(node.shape)}) that depends on "
                             "what fa.grad/vjp differentiates; its gradient would miss the other ranks' parts. "
                             "Pass it to f as an argument (in_spec P() for a replicated value)")


def _partial_cotangent(node, target_ids, lowest):
    """Whether a derivative flows from closed-over ``node`` back to a target along a path on which each rank's
    cotangent is only a part that nothing adds up. A path ends safely at stop_gradient, at a value without
    derivatives, and at this rank's own block of a split array (a block over every mesh axis): no other rank
    uses that block, so its cotangent is whole, and the block's VJP assembles the array's. A replicated value
    on the way (a sharded reduction or gather, another shard_map's replicated output) is used by every rank,
    so a block beneath it no longer ends the path; nor does a block that other ranks share (a 2-D mesh's
    block over one axis)."""
    from .transforms.autodiff import custom_owner, derivative_stops_at
    seen, stack = set(), [(node, False)]
    while stack:
        n, replicated = stack.pop()
        if n.id in target_ids:
            return True
        if n.id < lowest or (n.id, replicated) in seen or derivative_stops_at(n):  # (made before every target)
            continue
        seen.add((n.id, replicated))
        owner = custom_owner(n)
        if owner is not None and not replicated and _own_block(owner):
            continue
        replicated = replicated or getattr(owner, "replicates", False) or _replicating_collective(n)
        stack.extend((i, replicated) for i in n.inputs)
    return False


def _own_block(owner) -> bool:
    """A sharded array's block (sharded._block) that this rank alone holds: split over every mesh axis."""
    block = getattr(owner, "block_of", None)
    return block is not None and set(block[1]) == set(block[0].axis_names)


def _replicating_collective(node) -> bool:
    """A collective of the ShardedArray API (grad="full"): its result is replicated and its VJP expects the
    whole cotangent on every rank, which a closure's per-rank cotangent is not."""
    return isinstance(node.params, dict) and node.params.get("kwargs", {}).get("grad") == "full" \
        and node.prim in (C.ALL_REDUCE, C.ALL_GATHER)


def _enter(x, mesh, spec, i):
    """Argument ``i`` as this rank's local block under ``spec``, with the boundary for replicated axes."""
    sharding = NamedSharding(mesh, spec)
    if isinstance(x, ShardedArray):
        if x.sharding.mesh is not mesh:
            raise ValueError(f"shard_map: argument {i} is sharded over another mesh ({x.sharding.mesh})")
        if x.sharding != sharding:
            x = gather(x, range(x.ndim))  # resharding goes through the whole array
    else:
        from .ops import asarray
        x = ShardedArray(asarray(x), NamedSharding(mesh, PartitionSpec()))  # a plain array is the whole array
    local = x.local
    for d, (mine, want) in enumerate(zip(x.dim_axes, sharding.dim_axes(x.ndim))):
        if want and mine != want:
            local = _block(local, mesh, want, d)
    mentioned = {n for names in sharding.dim_axes(x.ndim) for n in names}
    rest = _ordered(mesh, set(mesh.axis_names) - mentioned)
    return C.broadcast_boundary(C.register_mesh(mesh), rest)(local) if rest else local


def _leave(out, mesh, out_specs):
    leaves, tree = tree_util.tree_flatten(out)
    if isinstance(out_specs, PartitionSpec) or out_specs is None:  # one spec for every output
        specs = [out_specs] * len(leaves)
    else:  # a tree of specs like f's result (tuple, list, dict)
        specs = tree_util.tree_leaves(out_specs, is_leaf=lambda s: isinstance(s, PartitionSpec) or s is None)
    if len(specs) != len(leaves):
        raise ValueError(f"shard_map: f returned {len(leaves)} arrays but out_specs has {len(specs)} specs")
    wrapped = []
    for i, (leaf, spec) in enumerate(zip(leaves, specs)):
        if not isinstance(leaf, Array):
            raise TypeError(f"shard_map: output {i} of f is a {type(leaf).__name__}, not an fa.Array")
        sharding = NamedSharding(mesh, _as_spec(spec, "out_specs"))
        mentioned = {n for names in sharding.dim_axes(leaf.ndim) for n in names}
        rest = _ordered(mesh, set(mesh.axis_names) - mentioned)
        if rest:
            leaf = C.split_boundary(C.register_mesh(mesh), rest)(leaf)
        wrapped.append(ShardedArray(leaf, sharding))
    return tree_util.tree_unflatten(tree, wrapped)



