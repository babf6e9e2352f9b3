"""fa.jit: trace a function once per input signature, then replay its plan.

The first call with a signature records the function on abstract arrays (fresh source nodes over
the argument buffers), evaluates the outputs through the plan stage (plan.py), and keeps the plan
with where each of its leaves comes from: an argument, or a buffer the function closed over. Later
calls with the same signature bind the new arguments' buffers into that plan and launch: no
recording, no graph walk, no scheduling.

The signature is the structure of the arguments (pytrees, flattened with ``fa.tree_util``: tuples,
lists, dicts, None, namedtuples and classes registered with ``register_pytree_node``), for each array
exactly what the plan's launches specialize on (shape, dtype, strides, 16-byte
alignment, device), and the type and value of every other argument: a non-array argument is
static, as if named in ``static_argnums``, so it must be hashable. Outputs are pytrees of arrays
too, rebuilt with ``tree_unflatten`` on every replay. As in JAX, Python values the
function closes over are baked in at trace time, and asking for a traced value's data inside the
function (``float(x.sum())``, ``print(x)``, ``fa.eval(x)``, ``if x > 0:``) raises
``ConcretizationError`` naming the line.
"""
from __future__ import annotations

import functools
import inspect
import threading
import warnings

import numpy as np
import torch

from .. import config, graphs, ir, plan, runtime, tree_util
from .._array import Array
from . import recording
from .recording import check_callable


def jit(fn=None, *, static_argnums=(), static_argnames=(), cuda_graph=None):
    """Compile ``fn`` once per argument signature and replay it (see the module docstring).

    ``static_argnums`` / ``static_argnames`` name arguments that are never traced; they must be
    hashable, and each distinct value (compared with its type: 2, 2.0 and True differ) traces anew.
    ``cuda_graph``: None replays a multi-kernel trace on a GPU as one CUDA/HIP graph where the rule
    in ``flyarray/graphs.py`` says it pays (docs/semantics.md); False never; True whenever possible.
    """
    if fn is None:
        return functools.partial(jit, static_argnums=static_argnums, static_argnames=static_argnames,
                                 cuda_graph=cuda_graph)
    check_callable(fn, "fa.jit")
    if cuda_graph not in (None, True, False):
        raise TypeError(f"fa.jit: cuda_graph must be None, True or False, got {cuda_graph!r}")
    static_argnums, static_argnames = _static_args(static_argnums, static_argnames)
    static_argnums, static_argnames = _check_static_names(fn, static_argnums, static_argnames)
    cache = _Traces()

    def call(args, kwargs, as_torch):
        if _inside_a_transform():  # inlined into the enclosing trace, as JAX does (see _inside_a_transform)
            args, kwargs = _tensors_as_arrays(args, kwargs, static_argnums, static_argnames)
            return _as_tensors(fn(*args, **kwargs)) if as_torch else fn(*args, **kwargs)
        tensors = []
        # a trace replays its plan: one built under other settings, or with creation ops on another default
        # device, is another trace
        key = (_flatten_args(args, kwargs, static_argnums, static_argnames, tensors), runtime.backend_name(),
               plan.settings(), runtime.default_device_choice())
        trace = cache.get(key)
        if trace is None:
            # one thread traces a function at a time: threads making the first call of one signature at once
            # trace it once (the others replay that trace), and the bounded cache is trimmed by one thread
            with cache.lock:
                trace = cache.get(key)
                if trace is None:
                    trace, result = _Trace.record(fn, args, kwargs, tensors, static_argnums, static_argnames)
                    trace.cuda_graph = cuda_graph
                    _remember(cache, key, trace, fn)
                    return _as_tensors(result) if as_torch else result
        return trace.replay(tensors, as_torch)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return call(args, kwargs, False)

    wrapped.cache = cache
    # flyarray.interop.torch.function's entry: the outputs as torch tensors over their memory, made straight
    # from the replayed plan's buffers (no Array, no DLPack round trip: ~20 us a call on a GPU host)
    wrapped.call_returning_tensors = lambda *args, **kwargs: call(args, kwargs, True)
    return wrapped


def _as_tensors(out):
    """Every Array leaf of ``out`` as the torch tensor ``torch.from_dlpack`` would give (same memory)."""
    return tree_util.tree_map(lambda a: torch.from_dlpack(a) if isinstance(a, Array) else a, out)


MAX_TRACES = 64   # traces kept per jitted function (the oldest goes first)
_WARN_AFTER = 16  # traces of one function before saying why it keeps tracing


class _Traces(dict):
    """A jitted function's traces by signature, how many it has recorded in all, and the lock its tracing
    threads take (reentrant: a trace may call the function again, which then traces through)."""
    __slots__ = ("recorded", "lock", "__weakref__")

    def __init__(self):
        super().__init__()
        self.recorded = 0
        self.lock = threading.RLock()
        runtime.free_after_fork(self)


def _remember(cache: _Traces, key, trace, fn):
    """Keep ``trace`` (under ``cache.lock``); the cache is bounded (a static argument that changes every call,
    such as a Python float learning rate, would otherwise grow it forever) and says once why it keeps growing."""
    if len(cache) >= MAX_TRACES:
        del cache[next(iter(cache))]
    cache[key] = trace
    cache.recorded += 1
    if cache.recorded == _WARN_AFTER:
        warnings.warn(f"fa.jit: {getattr(fn, '__name__', 'the function')} has been traced {cache.recorded} times. "
                      "Arguments other than arrays are static: each new value (a Python float learning rate, "
                      "a step counter) traces again. Pass values that change as arrays (fa.asarray(lr)) to "
                      "trace once.", stacklevel=3)


def _tensors_as_arrays(args, kwargs, static_argnums, static_argnames):
    """The arguments with their torch tensor leaves as arrays (statics untouched): what a traced call's
    body sees, so an inlined call records the same graph (not torch math on the raw tensors)."""
    call = (args, kwargs)

    def leaf_array(leaf):
        if isinstance(leaf, np.ndarray) or _numpy_scalar(leaf):
            return _numpy_leaf(leaf, call)
        if not isinstance(leaf, torch.Tensor):
            return leaf
        return Array(ir.source(_plain(leaf)))   # as _flatten takes it

    def convert(value):
        return tree_util.tree_map(leaf_array, value)
    n = len(args)
    statics = {i % n for i in static_argnums if -n <= i < n}
    args = tuple(a if i in statics else convert(a) for i, a in enumerate(args))
    kwargs = {k: v if k in static_argnames else convert(v) for k, v in kwargs.items()}
    return args, kwargs


def _inside_a_transform() -> bool:
    """Whether grad/vjp/jvp, vmap or an outer fa.jit is recording a function on this thread. A jitted
    function called then must trace through: its cache key needs the arguments' buffers, and evaluating
    a recorded value drops the history the transform needs (vmap's stand-ins, grad's inputs), while an
    outer jit would bake the inner result in as a constant. The outer transform (or the outer jit's
    plan) then covers the inner function, so nothing is lost by not caching it."""
    return recording.depth.value > 0


def _static_args(static_argnums, static_argnames) -> tuple:
    """(static_argnums, static_argnames) as tuples: an int or ints, a str or strs; TypeError else."""
    nums = (static_argnums,) if isinstance(static_argnums, int) else static_argnums
    names = (static_argnames,) if isinstance(static_argnames, str) else static_argnames
    if not isinstance(nums, (tuple, list)) or any(isinstance(i, bool) or not isinstance(i, int) for i in nums):
        raise TypeError(f"fa.jit: static_argnums must be an int or a sequence of ints, got {static_argnums!r}")
    if not isinstance(names, (tuple, list)) or any(not isinstance(n, str) for n in names):
        raise TypeError(f"fa.jit: static_argnames must be a str or a sequence of strs, got {static_argnames!r}")
    return tuple(nums), tuple(names)


def _check_static_names(fn, static_argnums, static_argnames) -> tuple:
    """Check the static names against ``fn``'s signature; return (static_argnums, static_argnames), each
    completed from the other through the signature (as JAX does: a parameter static by position is static
    when passed by name too, and the other way round), with negative positions resolved against the
    positional parameters, not against each call's argument count: -1 of ``f(x, y, mode="add")`` is
    ``mode`` whether or not a call passes it."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return static_argnums, static_argnames
    names = list(params)
    for name in static_argnames:
        if name not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise ValueError(f"fa.jit: static_argnames names {name!r}, which {fn.__name__} has no parameter for "
                             f"(it takes {', '.join(names)})")
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        return static_argnums, static_argnames
    for i in static_argnums:
        if not -len(positional) <= i < len(positional):
            raise ValueError(f"fa.jit: static_argnums has {i}, but {fn.__name__} takes "
                             f"{len(positional)} positional argument(s)")
    nums = {i % len(positional) for i in static_argnums}
    by_name = {p.name: i for i, p in enumerate(positional) if p.kind is p.POSITIONAL_OR_KEYWORD}
    nums |= {by_name[name] for name in static_argnames if name in by_name}
    extra = tuple(positional[i].name for i in sorted(nums) if positional[i].kind is positional[i].POSITIONAL_OR_KEYWORD
                  and positional[i].name not in static_argnames)
    return tuple(sorted(nums)), tuple(static_argnames) + extra


# ---- the signature --------------------------------------------------------------------------------
def _flatten_args(args, kwargs, static_argnums, static_argnames, tensors) -> tuple:
    n = len(args)
    statics = {i % n for i in static_argnums if -n <= i < n} if static_argnums else ()
    call = (args, kwargs)
    key = [_static_key(a, f"argument {i}", static=True) if i in statics
           else _flatten(a, tensors, f"argument {i}", call) for i, a in enumerate(args)]
    for name in sorted(kwargs):
        value = kwargs[name]
        key.append((name, _static_key(value, name, static=True) if name in static_argnames
                    else _flatten(value, tensors, name, call)))
    return tuple(key)


def _call_device(call_args):
    """Where a call's numpy leaves go: numpy data has no device, so it joins the call's first array or tensor
    argument (a learning rate np.float32(lr) beside CUDA arrays is a CUDA 0-d array), else the default device.
    ``call_args``: the call's (args, kwargs); looked up only when a numpy leaf needs it (off the hot path)."""
    args, kwargs = call_args
    leaf = next((a for a in args if isinstance(a, (Array, torch.Tensor))), None)   # the common case: no tree walk
    if leaf is None:
        leaf = next((x for x in tree_util.tree_leaves(call_args) if isinstance(x, (Array, torch.Tensor))), None)
    if leaf is None:
        return None
    return leaf._node.device if isinstance(leaf, Array) else leaf.device


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A tensor argument as a plan binds it, as fa.asarray takes it: detached (arrays carry no autograd) and
    with its negative/conjugate bit resolved (a copy only then): kernels read the raw memory, which holds
    the values before the bit's negation/conjugation (torch._neg_view(r), z.conj().imag.detach())."""
    if t.requires_grad:
        t = t.detach()
    if t.is_neg() or t.is_conj():
        t = t.resolve_conj().resolve_neg()
    return t


def _leaf_key(t):
    """What a plan's launches specialize on for one array leaf."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)   # as the plan's leaf key: no offset


_PARAMETER = torch.nn.Parameter
_STRIDED = torch.strided


# node kinds that are no array's value to fix: sources read memory as the trace's arguments do, constants and
# iotas depend on nothing, and a library call's or custom rule's node stands for its several outputs (those are
# values: "output", "custom_output"). Anything else computed before the trace began is realized: elementwise,
# reduce, view, concat, composite...
_NOT_VALUES = ("source", "constant", "iota", "library", "custom")


def _realize_closed_over(leaves, start):
    """Evaluate the lazy arrays the traced function closed over (made before the trace began) first: their values
    are the trace's constants, as in JAX, fixed buffers every replay reads. Left lazy, the plan would recompute
    them on each replay from their sources' memory as it is then, and disagree with the arrays themselves once
    evaluated."""
    # the walk stops at them (and at buffers): only the lazy values the trace's own nodes read are found
    closed = [node for node in ir.toposort([a._node for a in leaves if isinstance(a, Array)],
                                           lambda n: () if n.realized or n.id < start else n.inputs)
              if node.id < start and not node.realized and node.kind not in _NOT_VALUES]
    if closed:
        plan.realize([Array(n) for n in closed])


def _tensor_leaf(t, tensors):
    """One tensor argument: bound as ``_plain`` takes it (the checks inline: no call for a plain tensor), its key."""
    if type(t) is not torch.Tensor and type(t) is not _PARAMETER:   # a subclass: a FakeTensor has no memory
        from ..ops.creation import refuse_fake
        refuse_fake(t)
    if t.layout is not _STRIDED:   # fa.asarray's refusal, not torch's raw one from reading its strides
        from ..ops.creation import refuse_sparse
        refuse_sparse(t)
    if t.requires_grad or t.is_neg() or t.is_conj():
        t = _plain(t)
    tensors.append(t)
    return _leaf_key(t)


def _flatten(value, tensors, where, call):
    """The signature of one argument (a pytree, flattened with fa.tree_util): its structure and, per
    leaf, the array signature or the static key; its array leaves are appended to ``tensors``."""
    if type(value) is torch.Tensor or type(value) is _PARAMETER:   # the commonest cases first (the torch backend's)
        return _tensor_leaf(value, tensors)
    if type(value) is np.ndarray:
        value = _numpy_leaf(value, call)
    if type(value) is Array:  # the common cases first: one array, no tree to walk
        value = value._tensor()
    if _numpy_scalar(value):  # a 0-d array (as in JAX and as eager ops take it), not a static value that
        value = _numpy_leaf(value, call)  # would retrace for every new learning rate
    if type(value) is torch.Tensor:   # an array's or a numpy value's tensor
        return _tensor_leaf(value, tensors)
    leaves, treedef = tree_util.tree_flatten(value)
    keys = []
    for leaf in leaves:
        if isinstance(leaf, np.ndarray) or _numpy_scalar(leaf):   # an array leaf as grad and vmap take it
            leaf = _numpy_leaf(leaf, call)
        if isinstance(leaf, Array):
            leaf = leaf._tensor()
        if isinstance(leaf, torch.Tensor):
            keys.append(_tensor_leaf(leaf, tensors))
        else:
            keys.append(_static_key(leaf, where))
    structure = _structure(treedef)
    try:
        hash(structure)
    except TypeError:
        raise TypeError(f"fa.jit: {where} is a pytree whose node data is not hashable ({treedef}); "
                        "register_pytree_node's aux_data must be hashable") from None
    return (structure, tuple(keys))


def _structure(treedef):
    """A treedef as nested tuples: hashed once per lookup (a PyTreeDef rebuilds its key on every
    hash and comparison, which made a pytree argument's signature cost ~20 us more)."""
    if treedef.kind is None:
        return None
    return (treedef.kind, _typed(treedef.aux), tuple([_structure(c) for c in treedef.children]))


def _typed(aux):
    """Node data with its types: dict keys 1 and 1.0, node data 0.0 and -0.0 compare equal but trace
    differently. Unhashable data stays unhashable (refused by the caller, naming the argument)."""
    if aux is None or type(aux) is str:
        return aux
    if type(aux) is tuple:
        return tuple([_typed(a) for a in aux])
    if type(aux) is float:
        return (float, aux.hex() if aux == aux else "nan")
    return (type(aux), aux)


def _static_key(value, where, static=False):
    if static and isinstance(value, torch.Tensor):   # hashable by identity: every new tensor would trace anew
        raise TypeError(f"fa.jit: {where} is static (static_argnums/static_argnames) but its value is a "
                        "torch.Tensor; a static argument is part of the signature, so pass hashable values "
                        "there (or leave an array argument traced)")
    try:
        return plan.freeze(value)
    except TypeError:
        if static:   # named static by the caller: being an array does not help it
            raise TypeError(f"fa.jit: {where} is static (static_argnums/static_argnames) but its value, a "
                            f"{type(value).__name__}, is not hashable; a static argument is part of the "
                            "signature, so pass hashable values there (or leave an array argument traced)") from None
        raise TypeError(f"fa.jit: {where} ({type(value).__name__}) is neither an array nor hashable; pass arrays "
                        "as fa.Array or torch.Tensor (or pytrees of them: tuples, lists, dicts, namedtuples, "
                        "registered classes), and other arguments as hashable values") from None


def _numpy_leaf(leaf, call):
    from ..ops import asarray
    return asarray(np.asarray(leaf) if isinstance(leaf, np.generic) else leaf, device=_call_device(call))


def _numpy_scalar(value) -> bool:
    """A numpy number or bool that eager ops take as a 0-d array (ops.core.as_array): not np.float64 and
    np.complex128, which subclass Python's float and complex and stay weak scalars (static here too). ml_dtypes'
    bfloat16/float8 scalars are numbers too, though not np.number."""
    if isinstance(value, (np.number, np.bool_)):
        return not isinstance(value, (float, complex))
    if not isinstance(value, np.generic):
        return False
    from ..ops.creation import _ML_DTYPES   # the ml_dtypes fa.asarray takes (rare here: off the common path)
    return value.dtype.name in _ML_DTYPES


_ARRAY_LEAVES = (Array, torch.Tensor, np.ndarray)


def _is_array_leaf(value) -> bool:
    return isinstance(value, _ARRAY_LEAVES) or _numpy_scalar(value)


def _rebuild(value, it):
    """``value`` with every array leaf replaced by the next abstract array from ``it`` (same order
    as ``_flatten``)."""
    if _is_array_leaf(value):
        return next(it)
    leaves, treedef = tree_util.tree_flatten(value)
    return tree_util.tree_unflatten(treedef, [next(it) if _is_array_leaf(leaf) else leaf for leaf in leaves])


# ---- trace and replay -----------------------------------------------------------------------------
class _Trace:
    """A plan, where each of its leaves comes from, the scalars baked in, and how to build outputs.

    A leaf is ("arg", i) -- the i-th array argument -- or ("fixed", tensor): a buffer the function
    closed over. Outputs are ("slot", s, view ops) over the plan's slots or ("arg", i, view ops).
    """

    def __init__(self, program, leaf_sources, scalars, out_refs, treedef):
        self.plan = program
        self.leaf_sources = leaf_sources
        self.scalars = scalars
        self.out_refs = out_refs
        self.treedef = treedef
        self.one_array = treedef.kind is None  # the function returned one array, not a pytree of them
        self.cuda_graph = None  # fa.jit's option
        self.graphed = None  # a graphs.GraphedPlan once captured
        self.graph_decided = False  # whether the first replay chose graph or plain launches
        self.lock = threading.Lock()
        runtime.free_after_fork(self)

    @classmethod
    def record(cls, fn, args, kwargs, tensors, static_argnums, static_argnames):
        # the traced arguments have no buffer while fn records: reading one's value (float(x), x[m],
        # print) then asks for an evaluation, which plan._refuse_traced refuses, instead of reading this
        # call's values into the trace for every later call
        start = next(ir._ids)   # nodes made from here on are the trace's; older lazy ones are closed over
        sources = [ir.source(t) for t in tensors]
        for node in sources:
            node.buffer = None
        it = iter(Array(n) for n in sources)
        n = len(args)
        statics = {i % n for i in static_argnums if -n <= i < n}
        call_args = [a if i in statics else _rebuild(a, it) for i, a in enumerate(args)]
        # the array leaves come in _flatten_args' order: keywords sorted by name, not as the caller wrote them
        call_kwargs = {k: (kwargs[k] if k in static_argnames else _rebuild(kwargs[k], it)) for k in sorted(kwargs)}
        traced = {node.id for node in sources}
        previous = getattr(plan._trace, "sources", None)
        plan._trace.sources = traced
        try:
            with recording.recording():
                out = fn(*call_args, **call_kwargs)
        finally:
            plan._trace.sources = previous
            for node, t in zip(sources, tensors):   # the values, for this call's evaluation of the trace; a
                node.buffer = t.detach()   # tensor object of their own (an output may be one: t.t_() must not move it)
        leaves, treedef = _flatten_outputs(out)
        _realize_closed_over(leaves, start)
        arg_of = {node.id: i for i, node in enumerate(sources)}
        with plan._lock:
            roots = plan.unrealized_bases(leaves)
            program, walk, slots = None, None, None
            if roots:
                walk, program, slots = plan.evaluate(roots)
            leaf_sources = _leaf_sources(walk, arg_of)
            out_refs = [_out_ref(a._node, walk, program, arg_of) for a in leaves]
        trace = cls(program, leaf_sources, list(walk.scalars) if walk else [], out_refs, treedef)
        if not trace.one_array:   # rebuilt as every replay rebuilds it (a dict's keys in one order on every call)
            out = tree_util.tree_unflatten(treedef, leaves)
        return trace, out

    def replay(self, tensors, as_torch=False):
        """The outputs of one call with these argument tensors: Arrays, or (``as_torch``) torch tensors."""
        slots = None
        # FLYARRAY_CUDA_GRAPHS is read at every replay: turned off, a captured graph rests and the trace
        # launches kernel by kernel; a trace first replayed while it was off decides when it is on again
        if (self.graphed is not None or not self.graph_decided) and config.cuda_graphs():
            slots = self.graphed.run(tensors) if self.graphed is not None else self._first_replay(tensors)
        if slots is None and self.plan is not None:
            leaves = [tensors[src] if type(src) is int else src for src in self.leaf_sources]
            slots = self.plan.run(leaves, self.scalars)
        outs = []
        source = ir.SOURCE
        for kind, index, ops, shape, base in self.out_refs:
            # an argument passed through gets a tensor object of its own over the caller's memory, as fa.asarray
            # gives it: an in-place shape change of the caller's tensor (t.t_()) must not reach the array
            t = slots[index] if kind == "slot" else tensors[index].detach() if kind == "arg" else index
            if as_torch and not ops:   # a tensor object of its own too: two outputs may share one buffer
                outs.append(t if kind == "arg" else t.detach())
                continue
            node = ir.Node(source, (), ir.version_of(t), *base, t)  # ir.source(t), its (shape, dtype, device) known
            out = Array(ir.view(node, ops, shape) if ops else node)
            outs.append(torch.from_dlpack(out) if as_torch else out)
        return outs[0] if self.one_array else tree_util.tree_unflatten(self.treedef, outs)


    def _first_replay(self, tensors):
        """Decide once whether this trace replays as a CUDA graph (graphs.py); capture it if so and
        return this call's output slots from it, else None (launch as usual)."""
        with self.lock:
            if self.graph_decided:
                return self.graphed.run(tensors) if self.graphed is not None else None
            self.graph_decided = True
            out_slots = sorted({index for kind, index, *_ in self.out_refs if kind == "slot"})
            arguments = [tensors[src] for src in dict.fromkeys(self.leaf_sources) if type(src) is int]
            if not graphs.worth_a_graph(self.plan, arguments, out_slots, self.cuda_graph):
                return None
            try:
                graphed, why = graphs.GraphedPlan.capture(self.plan, self.leaf_sources, tensors, self.scalars,
                                                          out_slots)
            except Exception as exc:  # noqa: BLE001 - anything uncapturable falls back to plain launches
                graphed, why = None, f"{type(exc).__name__}: {exc}"
            if graphed is None:
                runtime._log(1, f"fa.jit: no CUDA graph for this trace ({why}); launching kernel by kernel")
                return None
            self.graphed = graphed
            return graphed.run(tensors)


def _leaf_sources(walk, arg_of) -> list:
    """For each leaf of the plan: the argument index, or the buffer itself (a closed-over value)."""
    if walk is None:
        return []
    return [arg_of.get(node.id, buffer) for node, buffer in zip(walk.leaf_nodes, walk.leaves)]


def _out_ref(node, walk, program, arg_of):
    """(where the output's buffer comes from, which, its view ops, its shape, the buffer's (shape, dtype,
    device)): the last is fixed by the trace's key, so a replay builds the output node without asking
    the tensor."""
    base, ops = (node.inputs[0], node.params) if node.prim is ir.VIEW else (node, ())
    described = (base.shape, base.dtype, base.device)
    if base.id in arg_of:
        return ("arg", arg_of[base.id], ops, node.shape, described)
    if walk is not None and base in walk.position:
        position = walk.position[base]
        slot = next((b[-1] for b in program.binds if len(b) == 2 and b[0] == position), None)
        if slot is None and base in walk.leaf_nodes:
            slot = walk.leaf_nodes.index(base)
        if slot is not None:
            return ("slot", slot, ops, node.shape, described)
    return ("fixed", base.buffer, ops, node.shape, described)  # computed before the trace: a constant of the function


def _flatten_outputs(out):
    """The output's Array leaves and its structure (fa.tree_util: None and empty containers have no
    leaves); any other leaf is an error."""
    leaves, treedef = tree_util.tree_flatten(out)
    for leaf in leaves:
        if not isinstance(leaf, Array):
            raise TypeError(f"fa.jit: the function returned a {type(leaf).__name__}; return arrays, or pytrees "
                            "of arrays (tuples, lists, dicts, namedtuples, registered classes)")
    return leaves, treedef
