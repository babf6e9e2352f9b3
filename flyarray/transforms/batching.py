"""fa.vmap: vectorizing map on the lazy graph (JAX's jax.vmap API and semantics).

``f`` is called once on per-example arrays: for each batched argument, a copy of ``x[0]`` with the batch
axis moved to the front (a stand-in: it is never computed unless ``f`` evaluates it). That records ``f``'s
per-example graph. Composite ops (fa.nn) are expanded into primitives, then one iterative walk (no
recursion) re-interprets the recorded nodes that depend on a stand-in, inputs first, with each
primitive's batching rule (flyarray/batch_rules.py): the stand-in reads as the batched argument, and each
rule records the batched op with the batch axis at 0. Nodes that depend on no stand-in (closed-over
values, constants, iota) are kept as they are and broadcast where they meet batched values. The outputs'
batch axis is then moved to ``out_axes``.

The result is an ordinary lazy graph, the one a hand-written batched function records: the scheduler
fuses it the same way (vmap of a softmax over rows is one kernel), and it composes with fa.grad (both
ways), fa.jit and vmap itself.
"""
from __future__ import annotations

import functools

from .. import batch_rules  # noqa: F401  (attaches the rules)
from .. import ir, plan
from .. import tree_util as tu
from .._array import Array
from ..expand import expand_composites
from ..primitives import ELEMENTWISE
from . import recording

__all__ = ["vmap"]


class Batch:
    """What a batching rule sees: the per-example ``node``, batch size ``n``, input values ``x`` and
    which of them are ``batched`` (batch axis at 0)."""
    __slots__ = ("node", "n", "x", "batched", "users")

    def __init__(self, node, n, x, batched, users):
        self.node, self.n, self.x, self.batched, self.users = node, n, x, batched, users

    def full(self, i) -> Array:
        """Input ``i`` with the batch axis: an unbatched one broadcast (a view, or a constant)."""
        if self.batched[i]:
            return self.x[i]
        node = self.node.inputs[i]
        from ..ops import core
        return Array(core.broadcast_node(node, (self.n,) + node.shape))


def _axes_per_leaf(prefix, tree, what):
    """One axis (int or None) per leaf of ``tree``, from ``prefix``: an int/None or a pytree prefix of ``tree``."""
    p_leaves, p_tree = tu.tree_flatten(prefix, is_leaf=lambda x: x is None)
    try:
        subtrees = tu._flatten_up_to(p_tree, tree, 1)
    except ValueError:
        whose = "arguments" if what == "in_axes" else "outputs"
        raise ValueError(f"vmap: {what} {prefix!r} is not a pytree prefix of the {whose} "
                         f"({tu.tree_structure(tree)})") from None
    axes = []
    for ax, sub in zip(p_leaves, subtrees):
        if ax is not None and (isinstance(ax, bool) or not isinstance(ax, int)):
            raise TypeError(f"vmap: {what} entries must be ints or None, got {ax!r}")
        axes += [ax] * len(tu.tree_leaves(sub))
    return axes


def _unbatchable(name, ax, exc) -> str:
    """The message for an argument that cannot be batched at ``ax``: which one, why, and what to do."""
    why = str(exc).removeprefix("vmap: ")
    if name.startswith("keyword"):
        fix = "keyword arguments are always batched at axis 0: pass it positionally with in_axes None, or close over it"
    elif isinstance(exc, TypeError):
        fix = "give it in_axes None"
    else:
        return f"vmap: {name}: {why}"
    return f"vmap: {name} is batched at axis {ax}, but {why}; {fix}"


def _output_array(o, i):
    """Output leaf ``i`` that is not an Array (a number, a numpy array) as one; anything else is refused by name."""
    from ..ops import asarray
    try:
        return asarray(o)
    except TypeError as exc:
        raise TypeError(f"vmap: output leaf {i} of the function is a {type(o).__name__}, which is not an array: "
                        f"{exc}") from exc


def _leaf_names(args, kwargs) -> list:
    """What each leaf of tree_flatten((args, kwargs)) is, for messages: 'argument 1', "argument 0['a']",
    "keyword 'scale'[2]"."""
    names = []
    for i, a in enumerate(args):
        names += _leaf_paths(a, f"argument {i}")
    for key in sorted(kwargs):   # tree_util flattens a dict in sorted key order
        names += _leaf_paths(kwargs[key], f"keyword {key!r}")
    return names


def _leaf_paths(tree, prefix) -> list:
    """``prefix`` plus the key path of each leaf of ``tree`` through dicts, lists and tuples (in tree_flatten's
    order); a custom pytree node's leaves all get the node's path."""
    if isinstance(tree, dict):
        return [p for k in sorted(tree) for p in _leaf_paths(tree[k], f"{prefix}[{k!r}]")]
    if type(tree) in (list, tuple):
        return [p for j, v in enumerate(tree) for p in _leaf_paths(v, f"{prefix}[{j}]")]
    return [prefix] * len(tu.tree_leaves(tree))


def _normalize(ax, ndim, what, shape):
    if not -ndim <= ax < ndim:
        raise ValueError(f"vmap: {what} {ax} is out of range for {'an argument' if what == 'in_axes' else 'an output'}"
                         f" of shape {shape} (rank {ndim})")
    return ax % ndim


def _stand_in(xb, n):
    """The per-example stand-in for batched ``xb`` (batch axis at 0): its own node, so views over it are not
    folded into ``xb``'s chain."""
    from ..ops import zeros
    first = xb[0] if n else zeros(xb.shape[1:], dtype=xb.dtype, device=xb.device)
    node = first._node
    return Array(ir.Node(ELEMENTWISE["astype"], (node,), None, node.shape, node.dtype, node.device))


def _batch_graph(roots, values: dict, start: int, n: int) -> dict:
    """Batched values (node id -> Array, batch axis at 0) of the nodes between the stand-ins in ``values``
    and ``roots``; nodes that depend on no stand-in are absent (they are kept as they are)."""
    from .autodiff import _CUSTOM, _STOPPED, stop_gradient
    order = ir.toposort(roots, lambda node: () if node.id in values or node.id < start else
                        (_CUSTOM[node][0].inputs if node in _CUSTOM else node.inputs))
    users = {r.id: [None] for r in roots}  # node id -> the nodes that read it (None: an output)
    for node in order:
        if node.id not in values and node.id >= start:
            for i in node.inputs:
                users.setdefault(i.id, []).append(node)
    library = {}  # library (or custom call) node id -> its batched outputs
    for node in order:
        if node in _CUSTOM and node.id >= start:
            group, index = _CUSTOM[node]
            if group.id not in library and any(i.id in values for i in group.inputs):
                library[group.id] = _batch_custom(group.params, values, n)
            if group.id in library:
                values[node.id] = library[group.id][index]
            continue
        if node.id in values or node.id < start:
            continue
        if node.prim is ir.OUTPUT:
            outs = library.get(node.inputs[0].id)
            if outs is not None:
                values[node.id] = outs[node.params]
            continue
        # A value evaluated inside the function (printed, converted) has no inputs now: it is unbatched, since
        # evaluating one that depends on the batch is refused (plan.batched_stand_ins), so it is a constant
        batched = [i.id in values for i in node.inputs]
        if not any(batched):
            continue
        rule = getattr(node.prim, "batch", None)
        if rule is None:
            what = "library op" if node.kind == "library" else "primitive"
            raise NotImplementedError(f"vmap: no batching rule for the {what} {node.prim.name!r}; add one in "
                                      "flyarray/batch_rules.py")
        xs = [values[i.id] if b else Array(i) for i, b in zip(node.inputs, batched)]
        out = rule(Batch(node, n, xs, batched, users))
        if node.kind == "library":
            library[node.id] = out
            continue
        if out.shape != (n,) + node.shape or out.dtype != node.dtype:
            raise AssertionError(f"vmap: the batching rule of {node.prim.name} gave {out.dtype}{list(out.shape)}, "
                                 f"expected {node.dtype}{list((n,) + node.shape)}")
        values[node.id] = stop_gradient(out) if node in _STOPPED else out
    return values


def _batch_custom(call, values, n):
    """A custom_vjp/custom_jvp call with a batched argument: the same call of a custom function whose
    function, fwd/bwd or JVP rule are vmapped (every array argument batched: an unbatched one is broadcast,
    so reverse mode sums its per-example cotangents through the broadcast)."""
    from ..ops import broadcast_to
    from .autodiff import custom_vjp, custom_jvp
    arrays = [call.arg_leaves[i] for i in call.array_positions]
    arrays = [values[a._node.id] if a._node.id in values else broadcast_to(a, (n,) + a.shape) for a in arrays]
    args = call.with_arrays(arrays)
    axes = tuple(tu.tree_unflatten(call.arg_tree, [0 if isinstance(x, Array) else None for x in call.arg_leaves]))
    owner = call.owner
    if isinstance(owner, custom_vjp):
        nondiff = sorted(owner._nondiff(len(axes)))
        batched = custom_vjp(vmap(owner.fun, in_axes=axes), nondiff_argnums=owner.nondiff_argnums)
        bwd_axes = tuple(axes[i] for i in nondiff) + (0, 0)  # bwd(*nondiff args, residuals, g)
        batched.defvjp(vmap(owner.run_fwd, in_axes=axes), vmap(owner.bwd, in_axes=bwd_axes))
    else:
        batched = custom_jvp(vmap(owner.fun, in_axes=axes))
        batched.defjvp(vmap(owner.rule, in_axes=(axes, axes)))
    return tu.tree_leaves(batched(*args))


def _refuse_sharded(value, where):
    """vmap batches plain arrays: a ShardedArray's spec names its dimensions, which a batch axis would shift
    (its local shard would be batched under the old spec: wrong shapes and values), so one is refused unless
    it is replicated (a loss under fa.hessian, say: its tree structure holds P(), for any number of dims)."""
    from ..sharded import ShardedArray
    if any(isinstance(x, ShardedArray) and not x.sharding.is_replicated
           for x in tu.tree_leaves(value, is_leaf=lambda x: isinstance(x, ShardedArray))):
        raise NotImplementedError(f"vmap: {where} include a ShardedArray, which vmap cannot batch (the batch axis "
                                  "would shift its sharding); vmap inside fa.shard_map over the local blocks, or "
                                  "fa.device_get the array first")


def vmap(fun, in_axes=0, out_axes=0):
    """Vectorize ``fun`` over an axis of its arguments (JAX's jax.vmap).

    ``in_axes``: an int, None, or a pytree prefix of the positional arguments (a tuple with one entry per
    argument, each an int/None or a prefix of that argument) giving the batched axis of each leaf (None:
    not batched). ``out_axes`` likewise for the outputs: where the batch axis goes (None: the output must
    not depend on the batched arguments). Keyword arguments are batched at axis 0. The batched axes must
    all have the same size.
    """
    recording.check_callable(fun, "vmap")
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)  # JAX takes a list of per-argument axes as a tuple

    @functools.wraps(fun)
    def vmapped(*args, **kwargs):
        from ..ops import asarray, broadcast_to, moveaxis
        if isinstance(in_axes, tuple) and len(in_axes) != len(args):
            raise ValueError(f"vmap: in_axes {in_axes} has {len(in_axes)} entries, but the function was called "
                             f"with {len(args)} positional argument(s)")
        _refuse_sharded((args, kwargs), "the arguments")
        leaves, tree = tu.tree_flatten((args, kwargs))
        axes = _axes_per_leaf(in_axes, args, "in_axes")
        axes += [0] * (len(leaves) - len(axes))  # keyword arguments are batched at axis 0, as in JAX
        sizes, batched, inner = [], {}, list(leaves)
        for i, (leaf, ax) in enumerate(zip(leaves, axes)):
            if ax is None:
                continue
            try:
                x = leaf if isinstance(leaf, Array) else asarray(leaf)
                ax = _normalize(ax, x.ndim, "in_axes", x.shape)
            except (TypeError, ValueError) as exc:
                raise type(exc)(_unbatchable(_leaf_names(args, kwargs)[i], ax, exc)) from None
            sizes.append((x.shape[ax], x.shape, ax, i))
            batched[i] = moveaxis(x, ax, 0) if ax else x
        if not sizes:
            raise ValueError("vmap: in_axes must batch at least one argument (every entry is None)")
        n = sizes[0][0]
        if any(s != n for s, _, _, _ in sizes):
            names = _leaf_names(args, kwargs)
            raise ValueError("vmap: the batched axes have different sizes: " + ", ".join(
                f"{names[i]} has size {s} at axis {ax} (shape {shape})" for s, shape, ax, i in sizes))
        start = next(ir._ids)  # every node made from now on has a larger id
        values = {}
        for i, xb in batched.items():
            inner[i] = _stand_in(xb, n)
            values[inner[i]._node.id] = xb
        inner_args, inner_kwargs = tu.tree_unflatten(tree, inner)
        with recording.recording(), plan.batched_stand_ins(inner[i]._node.id for i in batched):
            out = fun(*inner_args, **inner_kwargs)   # a jitted fun is inlined (fa.jit reads recording)
        _refuse_sharded(out, "the results")
        out_leaves, out_tree = tu.tree_flatten(out)
        out_leaves = [o if isinstance(o, Array) else _output_array(o, i) for i, o in enumerate(out_leaves)]
        expand_composites([o._node for o in out_leaves])  # fa.nn's composites batch through their primitives
        _batch_graph([o._node for o in out_leaves], values, start, n)
        results = []
        for o, ax in zip(out_leaves, _axes_per_leaf(out_axes, out, "out_axes")):
            value = values.get(o._node.id)
            if ax is None:
                if value is not None:
                    raise ValueError(f"vmap: out_axes is None for an output of shape {o.shape} that depends on the "
                                     "batched arguments (None is only for outputs that do not)")
                results.append(o)
                continue
            if value is None:
                value = broadcast_to(o, (n,) + o.shape)
            ax = _normalize(ax, value.ndim, "out_axes", value.shape)
            results.append(moveaxis(value, 0, ax) if ax else value)
        return tu.tree_unflatten(out_tree, results)

    return vmapped
