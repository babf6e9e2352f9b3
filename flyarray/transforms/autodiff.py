"""Automatic differentiation on the lazy graph: fa.vjp, fa.grad, fa.value_and_grad, fa.jvp,
fa.stop_gradient, fa.custom_vjp, fa.custom_jvp (JAX's API and semantics).

Reverse mode: ``f`` is called on the primal Arrays, which records its graph. The nodes between the
inputs and the outputs are found by one iterative walk (no recursion: graphs may be 10^4 deep) and
snapshotted (primitive, inputs, params), because evaluating a node later drops its inputs. The
pullback walks them in reverse topological order, calling each primitive's VJP rule (flyarray/ad_rules.py)
with the cotangent accumulated for its value. Rules only record fa ops, so the backward pass is itself
a lazy graph that the scheduler fuses (and fa.jit can trace: nothing here evaluates).

Which nodes are differentiated: the inputs, and every floating node created *after* the transform
began that depends on one. Nodes that existed before (closed-over values, even if computed from the
same data) are constants, as values closed over by a JAX function are.

Forward mode (fa.jvp) walks the same nodes inputs-first, each primitive's JVP rule giving its tangent
from its inputs' tangents.
"""
from __future__ import annotations

import functools
import threading
import weakref

import numpy as np

from .. import ad_rules, ir
from ..expand import expand_composites
from .. import dtypes as dt
from .. import tree_util as tu
from .._array import Array
from ..primitives import ELEMENTWISE
from . import recording

__all__ = ["vjp", "grad", "value_and_grad", "jvp", "stop_gradient", "custom_vjp", "custom_jvp"]

_STOPPED = weakref.WeakSet()  # copy nodes made by stop_gradient: no derivative flows through them
_CUSTOM = weakref.WeakKeyDictionary()  # output copy node of a custom_vjp/custom_jvp call -> (group node, index)


# Graph-walk-only primitives: never scheduled (the nodes that carry them are never evaluated).
CUSTOM_OUT = ir.Tagged("custom_output", "custom_output")
CUSTOM_VJP = ir.Tagged("custom_vjp", "custom")
CUSTOM_JVP = ir.Tagged("custom_jvp", "custom")


class Eqn:
    """One differentiated node as it was when recorded: its primitive, inputs and params."""
    __slots__ = ("node", "prim", "inputs", "params", "active")

    def __init__(self, node, prim, inputs, params, active):
        self.node, self.prim, self.inputs, self.params, self.active = node, prim, inputs, params, active

    shape = property(lambda self: self.node.shape)
    dtype = property(lambda self: self.node.dtype)
    device = property(lambda self: self.node.device)

    @property
    def x(self):
        return [Array(n) for n in self.inputs]

    @property
    def y(self):
        if self.prim.kind == "library":
            return [Array(o) for o in self.params["outputs"]]
        return Array(self.node)

    @property
    def n_outputs(self):
        return len(self.params["outputs"]) if self.prim.kind == "library" else self.params.n_out


def _differentiable(d: dt.DType) -> bool:
    return d.kind == "f" and d not in dt.STORAGE_ONLY


def _edges(node):
    if node in _STOPPED:
        return (), None, None
    hit = _CUSTOM.get(node)
    if hit is not None:
        return (hit[0],), CUSTOM_OUT, hit[1]
    if not node.inputs and node.realized:   # evaluated inside an inner transform's function: its history
        past = ir.differentiating.history.get(node)
        if past is not None:
            return past[1], past[0], past[2]
    return node.inputs, node.prim, node.params


def _trace(roots, inputs, start):
    """The Eqns of the nodes that carry a derivative from ``inputs`` to ``roots``, inputs first."""
    input_ids = {n.id for n in inputs}
    order = ir.toposort(roots, lambda n: () if n.id in input_ids or n.id < start else _edges(n)[0])
    active, eqns = set(input_ids), []
    for node in order:
        if node.id in input_ids or node.id < start:
            continue
        inputs_, prim, params = _edges(node)
        if prim is None:  # stop_gradient
            continue
        if node.realized and node.kind not in ("source", "constant", "iota") and not inputs_ \
                and _differentiable(node.dtype):
            raise ValueError(f"cannot differentiate through {node.prim.name} of shape {node.shape}: it was "
                             "evaluated (printed, converted, fa.eval'd) inside the function being differentiated, "
                             "which drops its history; evaluate values only outside the transformed function")
        flags = tuple(i.id in active for i in inputs_)
        if not any(flags):
            continue
        if node.dtype.kind == "c" or any(i.dtype.kind == "c" for i in inputs_):
            # a library node's own shape is () (its outputs are its projections): name its inputs instead
            of = ", ".join(f"{i.dtype}{list(i.shape)}" for i in (inputs_ if prim.kind == "library" else (node,)))
            what = prim.name
            if prim.name == "astype" and all(i.dtype.kind != "c" for i in inputs_):   # e.g. fa.fft.fft of a real x
                what = "a real-to-complex cast (a real array meeting a complex one, or fa.fft of a real input)"
            raise TypeError(f"cannot differentiate through {what} of {of}: derivatives "
                            "of complex-valued functions are not implemented (complex values are supported "
                            "outside fa.grad/vjp/jvp); differentiate a real function of real parts instead")
        if prim.kind not in ("library", "custom") and not _differentiable(node.dtype):
            continue
        active.add(node.id)
        eqns.append(Eqn(node, prim, inputs_, params, flags))
    return eqns, active


def _fit(g, node, what):
    if not isinstance(g, Array):
        from ..ops import asarray
        g = asarray(g, device=node.device)
    if g.shape != node.shape:
        raise ValueError(f"{what}: got shape {g.shape}, expected {node.shape}")
    return g.astype(node.dtype, copy=False) if g.dtype != node.dtype else g


def _fit_dtype(g, node):
    return g.astype(node.dtype, copy=False) if g.dtype != node.dtype else g


def _zeros(node):
    return ad_rules.zeros(node.shape, node.dtype, node.device)


# ---- the inputs --------------------------------------------------------------------------------------
def _fresh(node, taken):
    """A node standing for one primal: its own identity, so that values closed over (made before the
    transform, perhaps from the same data) stay constants, and views or constants over it are not
    folded past it (ir.view composes chains; constants broadcast into new constants)."""
    from .. import plan
    traced = getattr(plan._trace, "sources", None)
    if node.id not in taken and node.prim is ir.SOURCE and traced and node.id in traced:
        return node  # an argument fa.jit is tracing: keep it (jit finds its arguments by node)
    if node.prim is ir.SOURCE and node.buffer is not None and not traced and not ir.differentiating.depth:
        # a fresh leaf over the same buffer (free); not under an outer transform, which must see the link
        return ir.Node(ir.SOURCE, (), node.params, node.shape, node.dtype, node.device, node.buffer)
    # a free copy; computing it hands its buffer to ``node`` too (ir.STAND_IN, plan.Plan.bind)
    copy = ir.Node(ELEMENTWISE["astype"], (node,), ir.STAND_IN, node.shape, node.dtype, node.device)
    return copy


class _Depth(threading.local):
    differentiated = ()  # the nodes reverse mode differentiates, of the transforms recording on this thread


_depth = _Depth()  # (how many transforms are recording on this thread: ir.differentiating.depth)


def derivative_stops_at(node) -> bool:
    """Whether no cotangent flows past ``node``: stop_gradient, or a dtype without derivatives."""
    return node in _STOPPED or not _differentiable(node.dtype)


def custom_owner(node):
    """The custom_vjp/custom_jvp function whose output ``node`` is, else None (fa.shard_map reads the
    sharding boundaries' marks on it)."""
    hit = _CUSTOM.get(node)
    return None if hit is None else hit[0].params.owner


def differentiated_nodes() -> tuple:
    """The input nodes that reverse-mode calls (grad/vjp) recording on this thread differentiate with respect
    to (fa.shard_map checks that its function closes over none of their descendants)."""
    return _depth.differentiated


def _call(fn, nodes, diff):
    # Python values of the primals stay allowed (JAX's grad: `if x < 3:` picks a branch, and a float()
    # is a constant of the derivative); under vmap and jit they are refused (plan._refuse_traced)
    ir.differentiating.depth += 1
    outer = _depth.differentiated
    _depth.differentiated = outer + tuple(n for n, d in zip(nodes, diff) if d)  # (zip: () adds none)
    try:
        with recording.recording():  # a jitted fn is inlined (fa.jit reads this)
            return list(fn(*[Array(n) for n in nodes]))
    finally:
        ir.differentiating.depth -= 1
        _depth.differentiated = outer


def _done_tracing():
    """After a transform traced its function: the history kept for values evaluated inside is needed by an
    enclosing transform's trace only (ir.differentiating), so the outermost one drops it."""
    if not ir.differentiating.depth:
        ir.differentiating.history.clear()


def _start():
    return next(ir._ids)  # every node made from now on has a larger id


def _inputs(primals, diff, start):
    taken, nodes = set(), []
    for p, d in zip(primals, diff):
        n = p._node
        if d:
            n = _fresh(n, taken)
            taken.add(n.id)
        nodes.append(n)
    return nodes


def vjp_flat(fn, primals, diff):
    """``fn(*arrays) -> list of arrays`` at ``primals``: (outputs, pullback(cotangents) -> one per primal,
    None where ``diff`` is False or no derivative flows)."""
    start = _start()
    nodes = _inputs(primals, diff, start)
    outs = _call(fn, nodes, diff)
    roots = [o._node for o in outs]
    expand_composites(roots)  # fa.nn's composite ops differentiate through their primitives
    targets = [n for n, d in zip(nodes, diff) if d]
    eqns, active = _trace(roots, targets, start)
    _done_tracing()

    def pullback(cts):
        return _backward(eqns, active, roots, cts, nodes, diff)
    return outs, pullback


def _backward(eqns, active, roots, cts, inputs, diff):
    ct, multi = {}, {}

    def add(node, g):
        prev = ct.get(node.id)
        if prev is None:
            ct[node.id] = g
        else:   # the padded cotangents of slices of one array join as one concat (ad_rules.merged_pads)
            merged = ad_rules.merged_pads(prev, g)
            ct[node.id] = merged if merged is not None else prev + g

    for r, g in zip(roots, cts):
        if g is not None and r.id in active:
            add(r, _fit(g, r, "cotangent"))
    for e in reversed(eqns):
        kind = e.prim.kind
        if kind in ("output", "custom_output"):
            g = ct.pop(e.node.id, None)
            if g is not None:
                owner = e.inputs[0]
                index = e.params
                slots = multi.setdefault(owner.id, {})
                slots[index] = g if index not in slots else slots[index] + g
            continue
        if kind in ("library", "custom"):
            slots = multi.pop(e.node.id, None)
            if slots is None:
                continue
            outs = e.params["outputs"] if kind == "library" else e.params.out_nodes
            if kind == "custom":  # a user's rule gets zeros for outputs nothing depended on, as JAX's
                gs = [slots.get(i) if slots.get(i) is not None else _zeros(o) for i, o in enumerate(outs)]
                res = e.params.vjp(gs, e)
            else:  # a library rule gets None there (no work for an unused output: attention's lse)
                gs = [slots.get(i) for i in range(len(outs))]
                rule = getattr(e.prim, "vjp", None)
                res = rule(gs, e) if rule is not None else None
                if res is None:
                    res = _formulation_vjp(e, gs)
        else:
            g = ct.pop(e.node.id, None)
            if g is None:
                continue
            rule = getattr(e.prim, "vjp", None)
            if rule is None:
                raise NotImplementedError(f"no derivative rule (vjp) for the primitive {e.prim.name!r}; add one in "
                                          "flyarray/ad_rules.py")
            res = rule(g, e)
        for node, flag, r in zip(e.inputs, e.active, res):
            if flag and r is not None:
                add(node, _fit(r, node, f"the cotangent {e.prim.name} gave its input"))
    return [ct.get(n.id) if d else None for n, d in zip(inputs, diff)]


def _formulation_vjp(e, gs):
    fn = ad_rules.FORMULATIONS.get(e.prim.name)
    if fn is None:
        raise NotImplementedError(f"no derivative rule for the library op {e.prim.name!r}")
    kwargs = e.params["kwargs"]
    _, pull = vjp_flat(lambda *xs: fn(*xs, **kwargs), e.x, list(e.active))
    return pull(gs)


# ---- forward mode ----------------------------------------------------------------------------------
def jvp_elementwise(t, e):
    """An elementwise primitive's Jacobian is diagonal in each input: its VJP rule applied to an input's
    tangent is that input's contribution to the output tangent."""
    out = None
    for i, ti in enumerate(t):
        if ti is None:
            continue
        part = e.prim.vjp(ti, e)[i]
        if part is not None:
            out = part if out is None else out + part
    return out


def jvp_flat(fn, primals, tangents):
    """(outputs, output tangents) of ``fn(*arrays) -> list`` at ``primals`` along ``tangents`` (None: zero)."""
    diff = [t is not None for t in tangents]
    start = _start()
    nodes = _inputs(primals, diff, start)
    outs = _call(fn, nodes, ())  # forward mode: shard_map closures are fine (differentiated_nodes)
    roots = [o._node for o in outs]
    expand_composites(roots)  # fa.nn's composite ops differentiate through their primitives
    eqns, _ = _trace(roots, [n for n, d in zip(nodes, diff) if d], start)
    _done_tracing()
    tan = {n.id: _fit(t, n, "tangent") for n, t in zip(nodes, tangents) if t is not None}
    multi = {}
    for e in eqns:
        t = [tan.get(i.id) for i in e.inputs]
        kind = e.prim.kind
        if kind in ("output", "custom_output"):
            parent = multi[e.inputs[0].id]
            res = None if parent is None else parent[e.params]
        elif all(ti is None for ti in t):
            # every input's tangent is zero (e.g. downstream of sign or floor): so is this node's, and
            # rules need not handle the all-zero case
            multi[e.node.id] = None
            continue
        elif kind == "custom":
            multi[e.node.id] = e.params.jvp(t, e)
            continue
        elif kind == "library":
            if not any(_differentiable(o.dtype) for o in e.params["outputs"]):
                multi[e.node.id] = None  # integer outputs only (searchsorted, mx_quantize's codes and scales):
                continue                 # no tangent, as reverse mode gives them no cotangent
            rule = getattr(e.prim, "jvp", None)
            multi[e.node.id] = rule(t, e) if rule is not None else _formulation_jvp(e, t)
            continue
        else:
            rule = getattr(e.prim, "jvp", None)
            if rule is None and kind == "elementwise" and hasattr(e.prim, "vjp"):
                rule = jvp_elementwise
            if rule is None:
                raise NotImplementedError(f"no forward-mode rule (jvp) for the primitive {e.prim.name!r}")
            res = rule(t, e)
        if res is not None:
            tan[e.node.id] = _fit(res, e.node, f"the tangent of {e.prim.name}")
    return outs, [tan.get(r.id) for r in roots]


def _formulation_jvp(e, t):
    fn = ad_rules.FORMULATIONS.get(e.prim.name)
    if fn is None:
        raise NotImplementedError(f"no forward-mode rule for the library op {e.prim.name!r}")
    kwargs = e.params["kwargs"]
    _, touts = jvp_flat(lambda *xs: fn(*xs, **kwargs), e.x, [ti if a else None for ti, a in zip(t, e.active)])
    return touts


# ---- the public API -----------------------------------------------------------------------------------
def _as_array(x, where):
    if isinstance(x, Array):
        return x
    from ..ops import asarray
    try:
        return asarray(x)
    except TypeError as exc:
        raise TypeError(f"{where}: every leaf of the arguments must be an array (fa.Array, torch.Tensor, numpy) "
                        f"or a number, got {type(x).__name__}") from exc


def _check_outputs(leaves, where):
    for leaf in leaves:
        if not isinstance(leaf, Array):
            raise TypeError(f"{where}: the function must return arrays (or pytrees of them), got a "
                            f"{type(leaf).__name__}")


class _Flat:
    """``fun`` on flat array leaves, remembering the output structure and aux."""

    def __init__(self, fun, in_tree, has_aux, where):
        check_has_aux(has_aux, where)
        self.fun, self.in_tree, self.has_aux, self.where = fun, in_tree, has_aux, where
        self.out_tree = self.aux = None

    def __call__(self, *leaves):
        out = self.fun(*tu.tree_unflatten(self.in_tree, leaves))
        if self.has_aux:
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise TypeError(f"{self.where} with has_aux=True: the function must return a pair (output, aux), "
                                f"got {type(out).__name__}")
            out, self.aux = out
        out_leaves, self.out_tree = tu.tree_flatten(out)
        _check_outputs(out_leaves, self.where)
        return out_leaves


def check_has_aux(has_aux, where):
    """has_aux is a bool: a string "False" read as True, and the result came back as an (output, aux) pair."""
    if not isinstance(has_aux, (bool, np.bool_)):
        raise TypeError(f"{where}: has_aux must be True or False, got {has_aux!r}")


def vjp(fun, *primals, has_aux=False):
    """(fun(*primals), vjp_fn[, aux]): ``vjp_fn(cotangent)`` (a pytree like the output) returns one cotangent
    pytree per primal. Integer primals get None (JAX gives float0 zeros)."""
    return _vjp(fun, primals, has_aux, "vjp")


def _vjp(fun, primals, has_aux, where):
    """vjp, its errors naming ``where`` (the transform the user called)."""
    leaves, in_tree = tu.tree_flatten(primals)
    arrays = [_as_array(x, "vjp") for x in leaves]
    for i, a in enumerate(arrays):
        if a.dtype.kind == "c":   # as grad: refused, not a silent None
            raise TypeError(f"vjp: primal leaf {i} is {a.dtype}; derivatives with respect to complex inputs are not "
                            "implemented (differentiate w.r.t. the real and imaginary parts as float arrays instead)")
    diff = [_differentiable(a.dtype) for a in arrays]
    flat = _Flat(fun, in_tree, has_aux, where)
    outs, pull = vjp_flat(flat, arrays, diff)
    out_tree = flat.out_tree

    def vjp_fn(cotangent):
        cts = tu._flatten_up_to(out_tree, cotangent, 1, "vjp_fn: the cotangent (it must have the output's structure; "
                                                        "the first tree is the output's)")
        got = pull([None if c is None else _fit(_typed_cotangent(c, o, i), o._node, "vjp_fn: the cotangent")
                    for i, (c, o) in enumerate(zip(cts, outs))])
        got = [g if g is not None or not d else ad_rules.zeros(a.shape, a.dtype, a.device)
               for g, d, a in zip(got, diff, arrays)]
        return tu.tree_unflatten(in_tree, got)

    out = tu.tree_unflatten(out_tree, outs)
    return (out, vjp_fn, flat.aux) if has_aux else (out, vjp_fn)


def _typed_cotangent(c, out, i):
    """A cotangent array (an Array, tensor or numpy array) must have its output's dtype, as in JAX: a float32
    cotangent of a float64 output would silently become a float64 result. Python scalars are weakly typed
    and take the output's dtype; an integer output's cotangent is ignored (JAX's float0), so it is not checked."""
    if isinstance(c, (bool, int, float, complex)) or out.dtype.kind not in "fc":
        return c
    if not isinstance(c, Array):
        from ..ops import asarray
        c = asarray(c, device=out.device)
    if c.dtype != out.dtype:
        raise TypeError(f"vjp_fn: cotangent {i} is {c.dtype}, but output {i} is {out.dtype}; a cotangent has its "
                        f"output's dtype (cast it with astype)")
    return c


def _argnums(argnums, n, where):
    """(single, argument indices): ``argnums`` checked against the ``n`` positional arguments."""
    single = isinstance(argnums, int) and not isinstance(argnums, bool)
    nums = (argnums,) if single else argnums
    if not isinstance(nums, (tuple, list)) or not nums \
            or any(isinstance(i, bool) or not isinstance(i, int) for i in nums):
        raise TypeError(f"{where}: argnums must be an int or a non-empty tuple of ints, got {argnums!r}")
    for i in nums:
        if not -n <= i < n:
            raise ValueError(f"{where}: argnums {argnums} names argument {i}, but the function was called with "
                             f"{n} positional argument(s)")
    idx = [i % n for i in nums]
    if len(set(idx)) != len(idx):
        # one argument differentiated twice would need two independent copies of it in the graph;
        # refused rather than giving one copy a zero gradient
        raise ValueError(f"{where}: argnums {argnums} names an argument more than once")
    return single, idx


def _prepare(fun, args, kwargs, argnums, where):
    """(the function of the differentiated arguments alone, those arguments as a tuple of float-array
    pytrees, single): the arguments ``argnums`` names, checked to be real-valued."""
    single, idx = _argnums(argnums, len(args), where)
    dyn = []
    for i in idx:
        leaves, tree = tu.tree_flatten(args[i])
        leaves = [_as_array(x, where) for x in leaves]
        for leaf in leaves:
            if leaf.dtype.kind == "c":
                raise TypeError(f"{where}: argument {i} is {leaf.dtype}; derivatives with respect to complex inputs "
                                "are not implemented (differentiate w.r.t. the real and imaginary parts as float "
                                "arrays instead)")
            if not _differentiable(leaf.dtype):
                raise TypeError(f"{where} requires real-valued (floating-point) inputs, but argument {i} has a "
                                f"leaf of dtype {leaf.dtype}; differentiate w.r.t. float arrays, or leave integer "
                                "arguments out of argnums")
        dyn.append(tu.tree_unflatten(tree, leaves))

    def partial(*diffs):
        full = list(args)
        for i, d in zip(idx, diffs):
            full[i] = d
        return fun(*full, **kwargs)
    return partial, tuple(dyn), single


def value_and_grad(fun, argnums=0, has_aux=False):
    """``fun``'s value and its gradient w.r.t. the arguments ``argnums`` (an int or a tuple of ints);
    ``fun`` must return a float scalar (shape ()), or (scalar, aux) with ``has_aux``."""
    recording.check_callable(fun, "grad")
    check_has_aux(has_aux, "grad")

    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        partial, diff_args, single = _prepare(fun, args, kwargs, argnums, "grad")
        res = _vjp(partial, diff_args, has_aux, "grad")
        out, pull = res[0], res[1]
        # An Array, or a registered wrapper of one (a replicated fa.sharding.ShardedArray holds its value here).
        leaves = tu.tree_leaves(out)
        if isinstance(out, (tuple, list, dict)) or len(leaves) != 1 or not isinstance(leaves[0], Array):
            raise TypeError(f"grad requires the function to return a scalar array, got {type(out).__name__}"
                            + ("" if has_aux else " (to return more, use has_aux=True: (scalar, aux))"))
        scalar = leaves[0]
        if scalar.shape != ():
            raise TypeError(f"grad requires a scalar (shape ()) output, got shape {scalar.shape}; use fa.vjp for "
                            "non-scalar outputs, or reduce the output (e.g. .sum())")
        if not _differentiable(scalar.dtype):
            raise TypeError(f"grad requires a real-valued (floating-point) output, got {scalar.dtype}")
        from ..ops import ones
        grads = pull(tu.tree_unflatten(tu.tree_structure(out), [ones((), dtype=scalar.dtype, device=scalar.device)]))
        g = grads[0] if single else tuple(grads)
        return ((out, res[2]) if has_aux else out), g

    return wrapped


def grad(fun, argnums=0, has_aux=False):
    """The gradient of scalar-valued ``fun`` w.r.t. argument(s) ``argnums`` (JAX's jax.grad)."""
    vg = value_and_grad(fun, argnums, has_aux)

    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        (value, g) = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapped


def jvp(fun, primals, tangents, has_aux=False):
    """(fun(*primals), the directional derivative along ``tangents``): JAX's jax.jvp. ``primals`` and
    ``tangents`` are tuples (or lists) of the same structure; tangents match the primals' shapes. An integer or
    bool primal takes None as its tangent; complex primals raise TypeError (as in vjp)."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError("jvp: primals and tangents must be tuples (or lists) of arguments, e.g. jvp(f, (x,), (t,))")
    if len(primals) != len(tangents):
        raise ValueError(f"jvp: got {len(primals)} primal(s) and {len(tangents)} tangent(s); pass one tangent per "
                         "primal, of its structure")
    leaves, in_tree = tu.tree_flatten(tuple(primals))
    t_leaves = tu._flatten_up_to(in_tree, tuple(tangents), 2, "jvp: the tangents (they must have the primals' "
                                                               "structure, the first tree)")
    arrays = [_as_array(x, "jvp") for x in leaves]
    ts = []
    for i, (a, t) in enumerate(zip(arrays, t_leaves)):
        if a.dtype.kind == "c":   # as vjp and grad: refused, not a silent zero
            raise TypeError(f"jvp: primal leaf {i} is {a.dtype}; derivatives with respect to complex inputs are not "
                            "implemented (differentiate w.r.t. the real and imaginary parts as float arrays instead)")
        if not _differentiable(a.dtype):
            if t is not None:   # JAX asks for a float0 tangent here; a float one would be silently ignored
                raise TypeError(f"jvp: primal leaf {i} is {a.dtype}, which has no derivative: pass None as its "
                                "tangent")
            ts.append(None)
            continue
        weak = isinstance(t, (int, float)) and not isinstance(t, bool)   # a Python number takes the primal's dtype
        t = _as_array(t, "jvp")
        if t.shape != a.shape:
            raise ValueError(f"jvp: a tangent has shape {t.shape}, its primal {a.shape}")
        if t.dtype != a.dtype and not weak:   # as jax.jvp: a float32 tangent of a float64 primal is a mistake
            raise TypeError(f"jvp: tangent leaf {i} is {t.dtype}, its primal {a.dtype}: their dtypes must match")
        ts.append(t)
    flat = _Flat(fun, in_tree, has_aux, "jvp")
    outs, touts = jvp_flat(flat, arrays, ts)
    touts = [t if t is not None else ad_rules.zeros(o.shape, o.dtype, o.device) for t, o in zip(touts, outs)]
    out, tout = tu.tree_unflatten(flat.out_tree, outs), tu.tree_unflatten(flat.out_tree, touts)
    return (out, tout, flat.aux) if has_aux else (out, tout)


def stop_gradient(x):
    """``x``'s value with no derivative flowing through it (a pytree of arrays)."""
    def stop(leaf):   # complex ones too: no derivative flows through them (and none would be refused)
        if not isinstance(leaf, Array) or not (_differentiable(leaf.dtype) or leaf.dtype.kind == "c"):
            return leaf
        node = leaf._node
        copy = ir.Node(ELEMENTWISE["astype"], (node,), None, node.shape, node.dtype, node.device)
        _STOPPED.add(copy)
        return Array(copy)
    return tu.tree_map(stop, x)


# ---- custom rules ----------------------------------------------------------------------------------------
class _CustomCall:
    """What one call of a custom_vjp/custom_jvp function recorded: its arguments and its outputs."""

    def __init__(self, owner, args, outs, out_tree, residuals=None):
        self.owner, self.args, self.out_tree, self.residuals = owner, args, out_tree, residuals
        self.arg_leaves, self.arg_tree = tu.tree_flatten(args)
        self.array_positions = [i for i, x in enumerate(self.arg_leaves) if isinstance(x, Array)]
        self.out_nodes = [o._node for o in outs]
        self.n_out = len(outs)

    def with_arrays(self, arrays):
        """The arguments with their array leaves replaced by ``arrays`` (in order)."""
        leaves = list(self.arg_leaves)
        for i, a in zip(self.array_positions, arrays):
            leaves[i] = a
        return tu.tree_unflatten(self.arg_tree, leaves)

    def vjp(self, gs, e):
        return self.owner._vjp(self, gs, e)

    def jvp(self, t, e):
        return self.owner._jvp(self, t, e)


def _record_custom(owner, prim, args, out, residuals=None):
    out_leaves, out_tree = tu.tree_flatten(out)
    _check_outputs(out_leaves, owner.__name__)
    arg_nodes = tuple(a._node for a in tu.tree_leaves(args) if isinstance(a, Array))
    first = out_leaves[0]._node if out_leaves else None
    copies = []
    for leaf in out_leaves:
        n = leaf._node
        copies.append(Array(ir.Node(ELEMENTWISE["astype"], (n,), None, n.shape, n.dtype, n.device)))
    call = _CustomCall(owner, args, copies, out_tree, residuals)
    if first is not None:
        group = ir.Node(prim, arg_nodes, call, (), first.dtype, first.device)
        for i, c in enumerate(copies):
            _CUSTOM[c._node] = (group, i)
    return tu.tree_unflatten(out_tree, copies)


class _InFwd(threading.local):
    def __init__(self):
        self.active = set()  # the custom_vjp functions whose fwd is running on this thread


_in_fwd = _InFwd()


class custom_vjp:
    """A function with a hand-written VJP (JAX's jax.custom_vjp)::

        @fa.custom_vjp
        def f(x): ...
        def f_fwd(x): return f(x), residuals
        def f_bwd(residuals, g): return (cotangent_for_x,)   # one entry per argument (None: zero)
        f.defvjp(f_fwd, f_bwd)

    Each call runs ``fwd`` (its residuals are lazy: unused ones never compute). Forward mode (fa.jvp)
    through a custom_vjp function raises, as in JAX.

    ``nondiff_argnums`` (JAX's): arguments that get no cotangent, e.g. a function or a config value;
    ``fwd`` takes all the arguments, ``bwd(*nondiff_args, residuals, g)`` returns one cotangent per
    *other* argument. Use it as ``@functools.partial(fa.custom_vjp, nondiff_argnums=(0,))``.
    """

    linear_tangent = None  # internal: where fun is linear, its map of tangents (forward mode through it)

    def __init__(self, fun, nondiff_argnums=()):
        recording.check_callable(fun, "custom_vjp")
        functools.update_wrapper(self, fun)
        self.fun, self.fwd, self.bwd = fun, None, None
        if not isinstance(nondiff_argnums, (int, tuple, list)):
            raise TypeError(f"custom_vjp: nondiff_argnums must be an int or a tuple of ints, got {nondiff_argnums!r}")
        nums = (nondiff_argnums,) if isinstance(nondiff_argnums, int) else tuple(nondiff_argnums)
        if any(isinstance(i, bool) or not isinstance(i, int) for i in nums):
            raise TypeError(f"custom_vjp: nondiff_argnums must be ints, got {nondiff_argnums!r}")
        self.nondiff_argnums = nums

    def defvjp(self, fwd, bwd):
        recording.check_callable(fwd, "custom_vjp.defvjp: fwd")
        recording.check_callable(bwd, "custom_vjp.defvjp: bwd")
        self.fwd, self.bwd = fwd, bwd
        return self

    def __call__(self, *args):
        if self.fwd is None:
            raise TypeError(f"custom_vjp {self.__name__}: no VJP defined; call {self.__name__}.defvjp(fwd, bwd)")
        for i in self.nondiff_argnums:
            if not -len(args) <= i < len(args):
                raise ValueError(f"custom_vjp {self.__name__}: nondiff_argnums names argument {i}, but it was "
                                 f"called with {len(args)} argument(s)")
        if self in _in_fwd.active:
            return self.fun(*args)  # fwd calling the function itself (JAX's idiom): bwd covers this call
        res = self.run_fwd(*args)
        if not (isinstance(res, (tuple, list)) and len(res) == 2):
            raise TypeError(f"custom_vjp {self.__name__}: fwd must return (output, residuals)")
        return _record_custom(self, CUSTOM_VJP, args, res[0], res[1])

    def run_fwd(self, *args):
        """``fwd(*args)``, during which a call of this function is its plain function (fa.vmap batches
        fwd through this too: a batched fwd calling the function must not start another batched call)."""
        _in_fwd.active.add(self)
        try:
            return self.fwd(*args)
        finally:
            _in_fwd.active.discard(self)

    def _nondiff(self, n):
        """The positions (of ``n`` arguments) that get no cotangent."""
        return {i % n for i in self.nondiff_argnums}

    def _vjp(self, call, gs, e):
        nondiff = self._nondiff(len(call.args))
        fixed = [call.args[i] for i in sorted(nondiff)]
        cts = self.bwd(*fixed, call.residuals, tu.tree_unflatten(call.out_tree, gs))
        want = len(call.args) - len(nondiff)
        if not isinstance(cts, (tuple, list)) or len(cts) != want:
            which = "argument" if not nondiff else "argument not in nondiff_argnums"
            raise TypeError(f"custom_vjp {self.__name__}: bwd must return a tuple with one cotangent per {which} "
                            f"({want}), got {type(cts).__name__}"
                            + (f" of length {len(cts)}" if isinstance(cts, (tuple, list)) else ""))
        it = iter(cts)
        cts = [None if i in nondiff else next(it) for i in range(len(call.args))]
        flat = []
        for arg, c in zip(call.args, cts):
            _, tree = tu.tree_flatten(arg)
            flat += [None] * tree.num_leaves if c is None else tu._flatten_up_to(tree, c, 0)
        return [flat[i] for i in call.array_positions]

    def _jvp(self, call, t, e):
        if self.linear_tangent is not None:  # the sharding boundaries: identities and slices
            t = [ti if ti is not None else ad_rules.zeros(p.shape, p.dtype, p.device) for ti, p in zip(t, e.x)]
            return tu._flatten_up_to(call.out_tree, self.linear_tangent(*t), 2)
        raise TypeError(f"can't apply forward-mode autodiff (jvp) to a custom_vjp function ({self.__name__}); "
                        "use custom_jvp")


_TRANSPOSING = threading.local()


def _transposing() -> set:
    """The custom_jvp functions whose rule this thread is recording for reverse mode (custom_jvp._vjp)."""
    inside = getattr(_TRANSPOSING, "functions", None)
    if inside is None:
        inside = _TRANSPOSING.functions = set()
    return inside


class custom_jvp:
    """A function with a hand-written JVP (JAX's jax.custom_jvp)::

        @fa.custom_jvp
        def f(x): ...
        @f.defjvp
        def f_jvp(primals, tangents): return f(*primals), tangent_out

    Reverse mode transposes the rule: the tangent output is linear in the tangents, so its VJP w.r.t.
    the tangents (taken by recording the rule once more) is the VJP of ``f``.
    """

    def __init__(self, fun):
        recording.check_callable(fun, "custom_jvp")
        functools.update_wrapper(self, fun)
        self.fun, self.rule = fun, None

    def defjvp(self, rule):
        recording.check_callable(rule, "custom_jvp.defjvp")
        self.rule = rule
        return rule

    def __call__(self, *args):
        out = self.fun(*args)
        if self.rule is None or self in _transposing():
            # inside reverse mode's recording of this function's own rule (a linear f whose rule is
            # (f(x), f(t))): f's body, recorded as plain ops -- a custom call here would be transposed by
            # recording the same rule again, forever
            return out
        return _record_custom(self, CUSTOM_JVP, args, out)

    def _tangent_out(self, call, primals, tangents):
        args = call.with_arrays(primals)
        t_args = call.with_arrays(tangents)
        t_leaves = tu.tree_leaves(t_args)  # non-array leaves (Python numbers) get a zero tangent
        t_args = tu.tree_unflatten(tu.tree_structure(t_args),
                                   [0.0 if not isinstance(x, Array) else x for x in t_leaves])
        res = self.rule(tuple(args), tuple(t_args))
        if not (isinstance(res, (tuple, list)) and len(res) == 2):
            raise TypeError(f"custom_jvp {self.__name__}: the rule must return (primal_out, tangent_out)")
        outs = tu._flatten_up_to(call.out_tree, res[1], 2)
        return [t if isinstance(t, Array) else self._constant_tangent(t, node)
                for t, node in zip(outs, call.out_nodes)]

    def _constant_tangent(self, t, node):
        """A tangent the rule gave as a number or a numpy array (a constant, often 0.0): an array of the
        output's shape and dtype, so reverse mode, which differentiates the rule, can take it too."""
        from ..ops import asarray, broadcast_to
        try:
            return broadcast_to(_fit_dtype(asarray(t, device=node.device), node), node.shape)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"custom_jvp {self.__name__}: a tangent output must be an array (or a number) that "
                            f"broadcasts to its output's shape {node.shape}, got {type(t).__name__}: {exc}") from None

    def _jvp(self, call, t, e):
        primals = e.x
        t = [ti if ti is not None else ad_rules.zeros(p.shape, p.dtype, p.device) for ti, p in zip(t, primals)]
        return self._tangent_out(call, primals, t)

    def _vjp(self, call, gs, e):
        primals = e.x
        zero_t = [ad_rules.zeros(p.shape, p.dtype, p.device) for p in primals]
        inside = _transposing()
        inside.add(self)
        try:
            _, pull = vjp_flat(lambda *ts: self._tangent_out(call, primals, list(ts)), zero_t, list(e.active))
            return pull(gs)
        except TypeError as exc:
            if "differentia" not in str(exc):
                raise
            raise TypeError(f"custom_jvp {self.__name__}: reverse mode differentiates the rule's tangent output "
                            f"with respect to the tangents, and {exc} (a linear map flyarray cannot transpose); "
                            "give it a custom_vjp for reverse mode") from None
        finally:
            inside.discard(self)
