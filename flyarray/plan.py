"""Plans: one evaluation's schedule, code and launches, built once per graph structure and replayed.

Every evaluation (a trigger, ``fa.eval``, a ``fa.jit`` trace) goes through ``realize``:

  1. **walk** the graph under the requested arrays once, iteratively (depth-first pre-order), into
     a structural key: each node's (primitive, static params, shape, dtype) and the positions of its
     inputs (so sharing is part of the key), and for each realized leaf exactly what Triton
     specializes on (dtype, shape, strides, 16-byte alignment, device). Leaf buffers
     and the values of Python scalars (constant nodes) are collected beside the key, in walk order:
     they are *bound* into the plan, never part of it.
  2. **look up** the key in the plan cache (LRU, ``PLAN_CACHE_SIZE`` entries). On a miss, and only
     then, schedule (schedule.py), generate (codegen.py) and compile (runtime.py), and turn the
     steps into a ``Plan``: slots for buffers, and per step the slots it reads and writes.
  3. **run** the plan: allocate outputs, launch kernels with the bound buffers and scalars.
  4. **bind**: only after every launch returned do nodes receive their buffers, so an error leaves
     every array as it was and a retry recomputes.

A plan holds no nodes and no tensors (it pins no user memory). The key holds everything that
decided the plan -- no hash-only keys -- and ``FLYARRAY_PLAN_CHECK=1`` rebuilds the plan on every
hit and compares. ``fa.clear_caches()`` empties the cache.
"""
from __future__ import annotations

import collections
import contextlib
import os
import threading
import weakref

import numpy as np
import torch
import torch.autograd.profiler as _torch_profiler

from . import codegen, config, ir, precompile, profiling, runtime
from .kernel_ir import Kernel
from .kernels._triton import empty_template
from .expand import to_primitives
from .schedule import Allocate, KernelStep, LibraryCall, schedule

PLAN_CACHE_SIZE = 4096
# and at most this many graph nodes over all plans (a plan and its key hold ~1.5 KB a node): a loop whose
# unevaluated state grows makes a larger plan every step, and keeping them all grew memory quadratically
# (400 steps of `x = x * 0.999 + 1; float(x.sum())`: 200 MB). The newest plan stays, whatever its size.
PLAN_CACHE_NODES = 100_000
_plans: collections.OrderedDict = collections.OrderedDict()
_plan_nodes = 0  # graph nodes in _plans' keys
_newest = None  # the plan last used or added: already at the LRU end of _plans when it is hit again
_lock = threading.RLock()  # one evaluation at a time: buffers are bound only when all its launches are issued
# a process forked while another thread evaluated would wait for it forever: the child has only the forking thread
os.register_at_fork(after_in_child=_lock._at_fork_reinit)
_companions: dict = {}  # node id -> weak refs of nodes evaluated together with it (rms_norm's residual sum)


class _TraceState(threading.local):
    """Per thread, what fa.jit traces: ``sources``, the ids of traced source nodes, None while nothing
    traces; and ``batched``, the ids of the per-example stand-ins fa.vmap records its function on
    (batched_stand_ins). Class defaults rather than missing attributes: ``getattr(local, name, None)``
    on a missing one raises and catches AttributeError inside (half a microsecond of every evaluation)."""
    sources = None
    batched = None
    who = "fa.jit"   # what traces ``sources``, for the refusal's message (fa.inspect records the same way)


_trace = _TraceState()


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


@contextlib.contextmanager
def _autocast_off():
    """torch.autocast off on every device type it is on: a plan computes in the dtypes it recorded."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


class ConcretizationError(RuntimeError):
    """A traced value's data was needed while fa.jit traces (the value does not exist yet)."""


# ---- 1. the walk: structural key, leaves and scalars ---------------------------------------------
class Walk:
    """The graph under some roots, in post-order: its key and what binds into a plan."""
    __slots__ = ("nodes", "position", "leaves", "leaf_nodes", "scalars", "scalar_nodes", "key")

    def __init__(self, roots: list, backend: str):
        # Numbered in depth-first pre-order (a node before its inputs): deterministic, so structurally
        # equal graphs number alike, and one visit per node. Entries name inputs by number.
        position = {}  # node -> walk position (nodes hash by identity)
        nodes = []
        add_node = nodes.append
        for root in roots:
            stack = [root]
            pop = stack.pop
            while stack:
                node = pop()
                if node in position:
                    continue
                position[node] = len(nodes)
                add_node(node)
                if node.buffer is None:
                    stack += node.inputs
        entries, leaves, leaf_nodes, scalars, scalar_nodes = [], [], [], [], []
        add_entry, constant, plain, where = entries.append, ir.CONSTANT, _PLAIN_PARAMS, position.__getitem__
        for node in nodes:
            buffer = node.buffer
            if buffer is not None:
                leaves.append(buffer)
                leaf_nodes.append(node)
                # no storage offset: kernels address a leaf from its data pointer (which includes it), so
                # rows t[i] of one tensor share a plan; the 16-byte alignment Triton specializes on is kept
                add_entry(("leaf", node.dtype, node.shape, buffer.stride(), buffer.data_ptr() % 16, node.device))
                continue
            prim = node.prim
            if prim is constant:
                scalars.append(node.params)
                scalar_nodes.append(node)
                add_entry((constant, node.shape, node.dtype, node.device))
                continue
            params = node.params
            if params is not None and prim.kind not in plain:  # most nodes have none: no kind lookup
                params = _params_key(node)
            inputs = node.inputs
            # the entry is the same tuple whatever the arity; one and two inputs are spelled out because
            # star-unpacking a map builds a list first (a fifth of the walk's time on an elementwise chain)
            if len(inputs) == 2:
                a, b = inputs
                add_entry((prim, params, node.shape, node.dtype, where(a), where(b)))
            elif len(inputs) == 1:
                add_entry((prim, params, node.shape, node.dtype, where(inputs[0])))
            else:
                add_entry((prim, params, node.shape, node.dtype, *map(where, inputs)))
        self.nodes, self.position = nodes, position
        self.leaves, self.leaf_nodes = leaves, leaf_nodes
        self.scalars, self.scalar_nodes = scalars, scalar_nodes
        # the scheduler plans later-made roots first (schedule._Scheduler.run): that order is structure too
        made = () if len(roots) < 2 else tuple(sorted(range(len(roots)), key=lambda i: -roots[i].id))
        self.key = (tuple(entries), tuple([position[r] for r in roots]), backend, settings(), made)


_PLAIN_PARAMS = frozenset(("elementwise", "view", "reduce", "output", "concat"))  # None or tuples of ints


def _params_key(node):
    """A node's static params as a key: floats by their bits (0.0 and -0.0 differ, NaN equals itself)."""
    kind = node.prim.kind
    if kind in _PLAIN_PARAMS:
        return node.params
    if kind in ("library", "composite"):  # frozen once per node: kwargs do not change after recording
        params = node.params
        key = params.get("frozen")
        if key is None:
            key = params["frozen"] = (len(params["outputs"]), _freeze_kwargs(params["kwargs"]))
        return key
    return freeze(node.params)  # iota


def _freeze_kwargs(kwargs: dict) -> tuple:
    """``freeze`` of a library op's keyword arguments, in the order the call gave them (a call site
    gives them alike each time, so no sort: the record hot path)."""
    return tuple([(name, freeze(value)) for name, value in kwargs.items()])


def freeze(value):
    """A hashable, exact key for a static value (kwargs of library ops, iota params, jit statics)."""
    kind = type(value)
    if kind is bool or kind is int or kind is str or value is None:  # exact types first: the hot path
        return (kind, value)
    if isinstance(value, float):
        return (float, _float_bits(value))
    if isinstance(value, (bool, int, str, type(None))):
        return (type(value), value)
    if isinstance(value, complex):   # by bits too: -0.0 and 0.0 parts differ, a NaN part equals itself
        return (complex, _float_bits(value.real), _float_bits(value.imag))
    if isinstance(value, np.generic) and value.dtype.kind in "fc":   # np.float32(-0.0) == 0.0 as well
        return (kind, freeze(value.item()))
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(freeze(v) for v in value))
    if isinstance(value, dict):   # keys frozen too ({-0.0: v} is no {0.0: v}), ordered by their frozen form
        return (dict, tuple(sorted(((freeze(k), freeze(v)) for k, v in value.items()), key=repr)))
    hash(value)  # anything else must be hashable and compare exactly (dtypes, devices, enums)
    return (type(value), value)


def _float_bits(x: float) -> str:
    return x.hex() if x == x else "nan"


# ---- 2. plans -----------------------------------------------------------------------------------
class Plan:
    """Slots 0..n_leaves-1 hold the bound leaves; every step reads and fills slots."""
    __slots__ = ("steps", "labels", "n_slots", "n_leaves", "binds", "copy_binds", "description", "static_scalars",
                 "fresh_slots")

    def __init__(self, steps, labels, n_slots, n_leaves, binds, description, static_scalars=(), copy_binds=()):
        self.steps = steps
        self.labels = labels  # per step, what a profiler shows: fa::fused(exp,add) or fa::rms_norm+residual
        self.n_slots = n_slots
        self.n_leaves = n_leaves
        self.binds = binds  # (walk position, slot) or (library position, output index, slot)
        # (stand-in copy's walk position, its base's, slot): the base gets the slot too (ir.STAND_IN, ir.copied)
        self.copy_binds = copy_binds
        self.description = description  # structure only: what FLYARRAY_PLAN_CHECK compares
        self.static_scalars = list(static_scalars)
        self.fresh_slots = [None] * (n_slots - n_leaves)  # copied by leaves + fresh_slots, never written

    def run(self, leaves: list, scalars: list) -> list:
        if _any_autocast():   # 0.25 us: an ambient torch.autocast would change the dtypes of the torch ops a plan
            with _autocast_off():   # calls (a float32 matmul came out bfloat16, labelled float32)
                return self._run(leaves, scalars)
        return self._run(leaves, scalars)

    def _run(self, leaves: list, scalars: list) -> list:
        if self.static_scalars:
            scalars = scalars + self.static_scalars
        slots = leaves + self.fresh_slots
        if profiling.recording or _torch_profiler._is_profiler_enabled:
            if profiling.recording:  # fa.profile() is open: each launch timed (profiling.py)
                profiling.run_steps(self, slots, scalars)
            else:  # torch.profiler records: each step in a range named by its label
                profiling.run_labelled(self, slots, scalars)
            return slots
        for step in self.steps:
            step(slots, scalars)
        return slots

    def bind(self, walk: Walk, slots: list):
        """Hand every computed buffer to its node, then drop the graph above it. All or nothing: a Ctrl-C between
        two stores finishes them before it propagates (every store is idempotent), since one output of a
        multi-output op bound while its sibling is not made the next evaluation read the bound one as a buffer
        its plan did not know (rms_norm's residual sum: KeyError)."""
        try:
            self._bind(walk, slots)
        except BaseException:
            self._bind(walk, slots)
            raise

    def _bind(self, walk: Walk, slots: list):
        nodes = walk.nodes
        for bind in self.binds:
            if len(bind) == 2:
                node = nodes[bind[0]]
            else:
                node = nodes[bind[0]].params["outputs"][bind[1]]
            if node.prim is ir.VIEW:  # a view computed alone (schedule.py): a buffer of its own now
                with ir.REBIND:  # other threads may be recording views of it (ops/core.movement)
                    # the buffer first, the inputs last: a Ctrl-C between any two of these stores leaves a node
                    # that reads right (a buffer, or the view of its inputs), never one with neither
                    ir.keep_history(node)
                    node.buffer = slots[bind[-1]]
                    node.prim, node.params = ir.SOURCE, None
                    node.inputs = ()
            else:
                node.buffer = slots[bind[-1]]
                ir.forget_inputs(node)
        for copy, base, slot in self.copy_binds:
            base = nodes[base]
            if base.buffer is None:
                base.buffer = slots[slot]
                ir.forget_inputs(base)


class _Builder:
    """Schedule a walk's roots and turn the steps into a Plan."""

    def __init__(self, walk: Walk, roots: list, backend: str):
        self.walk, self.roots, self.backend = walk, roots, backend
        self.device = roots[0].device
        self.slot = {n.id: i for i, n in enumerate(walk.leaf_nodes)}
        self.scalar = {n.id: i for i, n in enumerate(walk.scalar_nodes)}
        self.n_slots = len(walk.leaf_nodes)
        self.allocated = set()  # slots of contiguous buffers this plan makes (not library outputs)
        self.static_scalars = []  # constants made by expanding composites: structure, so the plan keeps them
        self.steps, self.labels, self.binds, self.description, self.copy_binds = [], [], [], [], []
        self.warm_ups = []  # per kernel to compile ahead: make(leaves, scalars) -> job (precompile.py)

    def new_slot(self, node) -> int:
        slot = self.slot[node.id] = self.n_slots
        self.n_slots += 1
        position = self.walk.position.get(node)
        if position is not None:
            self.binds.append((position, slot))
            base = ir.copied(node)
            if base is not None and base.id not in self.slot and base in self.walk.position:
                # the copy is a transform's stand-in (grad's for a primal), its value its base's: the base gets
                # the buffer too, so a lazy array read through it is computed once, not its whole history
                # again at the next evaluation
                self.copy_binds.append((position, self.walk.position[base], slot))
        return slot

    def build(self) -> Plan:
        with ir.REBIND:  # composites expand and epilogues move in place: recording threads see before or after
            to_primitives(self.roots)
            steps = schedule(self.roots)
        for step in steps:
            if isinstance(step, KernelStep):
                self.add_kernel(step)
            elif isinstance(step, LibraryCall):
                self.add_library(step.node, step.into)
            else:
                self.add_allocation(step)
        return Plan(self.steps, self.labels, self.n_slots, len(self.walk.leaf_nodes), self.binds, tuple(self.description),
                    self.static_scalars, tuple(self.copy_binds))

    def add_allocation(self, step: Allocate):
        node = step.node
        slot, shape, template = self.new_slot(node), node.shape, _empty_like_of(node.dtype.torch, self.device)
        self.allocated.add(slot)

        def allocate(slots, scalars):
            slots[slot] = template.new_empty(shape)
        self.steps.append(allocate)
        self.labels.append("fa::alloc")
        self.description.append(("alloc", slot, shape, node.dtype.name))

    def add_kernel(self, step: KernelStep):
        kernel, backend = step.kernel, self.backend
        spec = None if backend == "reference" else codegen.launch_spec(kernel)
        ins = [self.slot[n.id] for n in step.inputs]
        fresh = [(n, self.new_slot(n)) for n in step.outputs if n.id not in self.slot]
        self.allocated.update(slot for _, slot in fresh)
        outs = [self.slot[n.id] for n in step.outputs]
        sc = [self.scalar_slot(n) for n in step.scalars]
        if backend == "reference":  # the step makes its fresh outputs (often with no copy): backends/reference.py
            run_kernel = runtime.reference_step(kernel, self.input_views(step), [n.shape for n in step.outputs],
                                                ins, outs, {slot for _, slot in fresh}, sc, self.device)
        else:
            launch = runtime.kernel_launcher(kernel, spec, backend, self.device, self.input_views(step),
                                             [n.shape for n in step.outputs])
            allocations = [(slot, n.shape, _empty_like_of(n.dtype.torch, self.device)) for n, slot in fresh]
            if hasattr(launch, "warm_up") and not precompile.has_compiled(launch.fn):
                dtypes = {self.slot[n.id]: n.dtype.torch for n in (*step.inputs, *step.outputs)}
                self.warm_ups.append(_kernel_warm_up(launch, ins, outs, sc, dtypes))

            def run_kernel(slots, scalars):
                for slot, shape, template in allocations:
                    slots[slot] = template.new_empty(shape)
                launch([slots[i] for i in ins], [slots[o] for o in outs], [scalars[j] for j in sc])
        self.steps.append(run_kernel)
        self.labels.append(profiling.kernel_label(kernel))
        self.description.append(("kernel", spec.key if spec else _kernel_key(kernel), tuple(spec.args) if spec else (),
                                 tuple(ins), tuple(outs), tuple(sc), tuple((n.shape, slot) for n, slot in fresh)))
        runtime._log(2, f"  kernel {spec.key[:12] if spec else 'reference'}: {len(kernel.ops)} ops, "
                        f"{len(ins)} in, {len(outs)} out")

    def warm_up_jobs(self, leaves: list, scalars: list) -> list:
        """The warm-up jobs for this evaluation's leaves (the real tensors) and scalars, in plan order:
        one per generated kernel not compiled yet, one per library call that can be dry-run."""
        return [make(leaves, scalars) for make in self.warm_ups]

    def scalar_slot(self, node) -> int:
        """Where a constant's value comes from: bound from the walk, or kept by the plan when an
        expansion made it (its value follows from the composite's params, which are in the key)."""
        slot = self.scalar.get(node.id)
        if slot is None:
            slot = self.scalar[node.id] = len(self.walk.scalars) + len(self.static_scalars)
            self.static_scalars.append(node.params)
        return slot

    def input_views(self, step: KernelStep) -> list:
        """How each input buffer lies in memory, where the plan knows it for every evaluation: a leaf's
        layout is in the key; a buffer this plan allocates is contiguous."""
        from .views import View
        out = []
        for node in step.inputs:
            slot = self.slot[node.id]
            if slot < len(self.walk.leaves):
                t = self.walk.leaves[slot]
                out.append(View(tuple(t.shape), tuple(t.stride()), 0))
            elif slot in self.allocated:
                out.append(View.contiguous(node.shape))
            else:
                out.append(None)  # a library kernel's output: its layout is the kernel's business
        return out

    def add_library(self, lib, into=None):
        """A library call; ``into`` (LibraryCall.into): outputs it writes straight into a concat's buffer."""
        prim, kwargs, backend = lib.prim, lib.params["kwargs"], self.backend
        ins, buffers = [], {}  # buffers: slot -> (shape, dtype, device) of each input's buffer (warm-up)
        for node in lib.inputs:
            base, ops = (node.inputs[0], node.params) if node.kind == "view" else (node, ())
            ins.append((self.slot[base.id], ops))
            buffers[self.slot[base.id]] = (base.shape, base.dtype.torch, self.device)
        outs = []
        lib_position = self.walk.position.get(lib)
        for i, child in enumerate(lib.params["outputs"]):
            slot = self.new_slot(child) if child.id not in self.slot else self.slot[child.id]
            if lib_position is not None and child not in self.walk.position:
                self.binds.append((lib_position, i, slot))
            outs.append(slot)

        counts = not prim.reinterpret  # view_as_real / view_as_complex (complex_lowering.py) are torch views
        # (output index, concat slot, View): written in place, read by nothing else of this plan (schedule.py)
        aimed = tuple((i, self.slot[concat.id], where) for i, (concat, where) in sorted((into or {}).items()))
        aimed_slots = {outs[i] for i, _, _ in aimed}

        moves = [(slot, runtime.Movement(ops) if ops else None) for slot, ops in ins]

        def run_library(slots, scalars):
            if counts:
                runtime._stats["library_calls"] += 1
                runtime._stats["kernels_launched"] += 1
            tensors = [slots[s] if move is None else move(slots[s]) for s, move in moves]
            given = None
            if aimed:
                given = [None] * len(outs)
                for i, concat, where in aimed:
                    given[i] = slots[concat].as_strided(where.shape, where.strides, where.offset)
            for slot, value in zip(outs, prim.run(backend, tensors, kwargs, given)):
                # fused kernels read a library output as contiguous (its layout is planned before it exists);
                # an output written into a concat is read by nothing else here
                slots[slot] = value if value.is_contiguous() or slot in aimed_slots else value.contiguous()
        self.steps.append(run_library)
        if backend == "gpu" and prim.warms_up:
            family = (prim.name, freeze(kwargs))
            if precompile.can_dry_run(family):
                self.warm_ups.append(_library_warm_up(prim, kwargs, ins, buffers, family))
        self.labels.append(profiling.library_label(prim.name, kwargs))
        self.description.append(("library", prim.name, freeze(kwargs), tuple(ins), tuple(outs),
                                 tuple((i, c, w.shape, w.strides, w.offset) for i, c, w in aimed)))


def _kernel_warm_up(launch, ins, outs, sc, dtypes):
    """make(leaves, scalars) -> the job that warms a generated kernel up: the real leaves, and the
    dtypes of the buffers the plan will make (``dtypes``: slot -> torch dtype)."""
    def make(leaves, scalars):
        def arg(slot):
            return leaves[slot] if slot < len(leaves) else dtypes[slot]
        return lambda: launch.warm_up([arg(i) for i in ins], [arg(o) for o in outs], [scalars[j] for j in sc])
    return make


def _library_warm_up(prim, kwargs, ins, buffers, family):
    """make(leaves, scalars) -> the job that dry-runs library call ``prim`` (precompile.dry_run): its
    inputs are fakes of the real leaves, or contiguous fakes of the buffers the plan makes (``buffers``:
    slot -> (shape, dtype, device); a library output is made contiguous too), then the call's movement
    ops. ``family``: (op name, frozen kwargs), whose fruitless dry runs precompile counts."""
    def make(leaves, scalars):
        def call(mode):
            def fake(slot):
                if slot < len(leaves):
                    return mode.from_tensor(leaves[slot])
                shape, dtype, device = buffers[slot]
                return torch.empty(shape, dtype=dtype, device=device)
            tensors = [runtime.apply_movement(fake(s), ops) if ops else fake(s) for s, ops in ins]
            prim.kernel(*tensors, **kwargs)
        return lambda: precompile.dry_run(call, family)
    return make


def _empty_like_of(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An empty tensor whose ``new_empty`` allocates like ``torch.empty(dtype=, device=)`` without
    parsing the dtype and device on every call (holds no data: a plan may keep it)."""
    template = empty_template(dtype, device)
    return template if template is not None else torch.empty(0, dtype=dtype, device=device)


def _kernel_key(kernel: Kernel):
    return repr(kernel)  # the reference backend evaluates the Kernel itself: its structure is the key


def _plan_for(walk: Walk, roots: list, backend: str) -> Plan:
    global _newest
    key = walk.key
    plan = _plans.get(key)
    if plan is not None:
        runtime._stats["plan_hits"] += 1
        _plans.move_to_end(key)
        _newest = plan
        if _plan_check:
            _check_plan(plan, walk, roots, backend)
        return plan
    runtime._stats["plan_misses"] += 1
    if runtime.config.log_level() >= 1:
        runtime._log(1, f"plan miss: {_miss_reason(key)}")
    builder = _Builder(walk, roots, backend)
    plan = builder.build()
    if builder.warm_ups:
        precompile.start(builder.warm_up_jobs(walk.leaves, walk.scalars + plan.static_scalars), builder.device)
    _plans[key] = plan
    _newest = plan
    _keep_within_bounds(len(key[0]))
    return plan


def _keep_within_bounds(added_nodes: int):
    """Evict least recently used plans past PLAN_CACHE_SIZE plans or PLAN_CACHE_NODES nodes."""
    global _plan_nodes
    _plan_nodes += added_nodes
    while len(_plans) > PLAN_CACHE_SIZE or (_plan_nodes > PLAN_CACHE_NODES and len(_plans) > 1):
        old, _ = _plans.popitem(last=False)
        _plan_nodes -= len(old[0])


def _check_plan(plan, walk, roots, backend):
    fresh = _Builder(walk, roots, backend).build()
    if fresh.description != plan.description or fresh.binds != plan.binds:
        raise AssertionError("FLYARRAY_PLAN_CHECK: the cached plan differs from a fresh one for the same key:\n"
                             f"cached {plan.description}\nfresh  {fresh.description}")


def _miss_reason(key) -> str:
    """Why no plan matched: the nearest cached structure and its first difference, for FLYARRAY_LOG."""
    entries = key[0]
    best, best_common = None, -1
    for other in _plans:
        if len(other[0]) != len(entries) or other[1:] != key[1:]:
            continue
        common = next((i for i, (a, b) in enumerate(zip(other[0], entries)) if a != b), len(entries))
        if common > best_common:
            best, best_common = other, common
    if best is None:
        return f"new graph structure ({len(entries)} nodes; roots, backend {key[2]!r} and settings as keyed)"
    old, new = best[0][best_common], entries[best_common]
    if old[0] == new[0] == "leaf":
        changed = [f"{name} {_short(a)} -> {_short(b)}" for name, a, b in zip(_LEAF_FIELDS, old, new) if a != b]
        return f"input buffer at node {best_common}: " + ", ".join(changed)
    what = getattr(new[0], "name", new[0])
    return f"node {best_common} ({what}) differs from a cached plan's: {_short(old)} -> {_short(new)}"


_LEAF_FIELDS = ("", "dtype", "shape", "strides", "16-byte alignment (ptr % 16)", "device")


def _short(entry) -> str:
    if not isinstance(entry, tuple):
        return getattr(entry, "name", None) or str(entry)
    return "(" + ", ".join(getattr(e, "name", None) or str(e) for e in entry) + ")"


def clear():
    global _newest, _plan_nodes
    with _lock:
        _plans.clear()
        _newest = None
        _plan_nodes = 0


# ---- 3/4. realize ---------------------------------------------------------------------------------
def realize(arrays):
    """Compute every array's value once; afterwards its node (or its view's base) holds a buffer."""
    roots = requested_nodes(arrays)
    if not roots:
        return
    with _lock:
        if len(roots) > 1 or not _pending(roots[0]):  # another thread may have computed them meanwhile
            roots = [r for r in roots if _pending(r)]
            if not roots:
                return
        _evaluate_requested(roots)


def realize_node(node):
    """``realize`` of one array whose node is not a view: the way out of ``Array.torch()`` and
    ``__dlpack__``, without building the request list (a view goes through ``realize``)."""
    with _lock:
        if node.buffer is None:  # else another thread computed it meanwhile
            _evaluate_requested([node])


def _evaluate_requested(roots: list):
    """Evaluate pending roots (under _lock) with their companions; refused while fa.jit traces them."""
    if _companions:
        roots = _with_companions(roots)
    if _trace.sources or _trace.batched:
        _refuse_traced(roots)
    first = roots[0].device
    if len(roots) > 1 and any(r.device != first for r in roots):   # fa.eval(a, b) of arrays on two devices
        _evaluate_per_device(roots)
        return
    evaluate(roots)


def _evaluate_per_device(roots: list):
    """One evaluation per device (a plan runs on one backend, chosen by its device); a 'meta' root refuses
    before any other runs (it has no values), whatever the order of the roots."""
    devices = list(dict.fromkeys(r.device for r in roots))
    for device in devices:
        runtime.backend_for(device)   # raises for 'meta' (and for a device no backend takes) first
    for device in devices:
        evaluate([r for r in roots if r.device == device])


def evaluate(roots: list) -> tuple:
    """Walk, plan, run and bind ``roots`` (unrealized nodes; a view node asks for that view only, which
    the scheduler may compute alone: schedule.py); returns (walk, plan, slots)."""
    global _newest
    backend = runtime.backend_for(roots[0].device)
    stats = runtime._stats
    stats["evaluations"] += 1
    walk = Walk(roots, backend)
    if runtime._check:
        _check_versions(walk)
    key = walk.key
    plan = _plans.get(key)
    if plan is None or _plan_check:
        plan = _plan_for(walk, roots, backend)
    else:  # the hit, inline: the hot path of every evaluation
        stats["plan_hits"] += 1
        if plan is not _newest:  # moving costs a second hash and compare of the whole key (3 us for 40 nodes)
            _plans.move_to_end(key)
            _newest = plan
    slots = plan.run(walk.leaves, walk.scalars)
    plan.bind(walk, slots)
    return walk, plan, slots


def _check_versions(walk: Walk):
    """FLYARRAY_CHECK: an input tensor written in place between record and evaluation is an error."""
    for node, tensor in zip(walk.leaf_nodes, walk.leaves):
        if node.prim is ir.SOURCE and node.params is not None and ir.version_of(tensor) != node.params:
            raise RuntimeError(f"FLYARRAY_CHECK: the tensor behind an input of shape {tuple(tensor.shape)} was "
                               "modified in place after fa.asarray recorded it and before evaluation; the result "
                               "would silently use the new values. Use fa.asarray(t, copy=True) or fa.eval earlier "
                               "(docs/semantics.md, 'Aliasing and zero copy').")


def unrealized_bases(arrays) -> list:
    """The nodes that hold the arrays' values (a view's base), where not computed yet."""
    roots = []
    for a in arrays:
        node = a._node
        if node.prim is ir.VIEW:
            node = node.inputs[0]
        if node.buffer is None and node not in roots:
            roots.append(node)
    return roots


def requested_nodes(arrays) -> list:
    """The nodes to compute for the arrays: a view of an unevaluated base is handed to the scheduler
    itself, which computes only what the view reads where that is cheaper (a small slice of a big
    broadcast expression); anything else as its base. A base evaluated together with companions
    (evaluate_together) is computed whole, with them."""
    roots = []
    for a in arrays:
        node = a._node
        if node.prim is ir.VIEW and (node.inputs[0].buffer is not None or node.inputs[0].id in _companions):
            node = node.inputs[0]
        if node.buffer is None and node not in roots:
            roots.append(node)
    return roots


def _pending(node) -> bool:
    return node.buffer is None and (node.prim is not ir.VIEW or node.inputs[0].buffer is None)


def evaluate_together(*arrays):
    """Whenever one of these arrays is evaluated, compute the others that are still held in the
    same evaluation (rms_norm(..., residual=) returns two values that one kernel writes)."""
    nodes = [a._node.inputs[0] if a._node.prim is ir.VIEW else a._node for a in arrays]
    for node in nodes:
        others = [weakref.ref(n) for n in nodes if n is not node]
        _companions[node.id] = others
        weakref.finalize(node, _companions.pop, node.id, None)


def _with_companions(roots: list) -> list:
    """``roots`` and the held companions of every pending node they compute, not only of the roots: a residual sum
    computed as another evaluation's input (top_k(h) of rms_norm's h) while its normed sibling stayed lazy was a
    buffer the sibling's later plan read but did not know (a KeyError on a plan hit)."""
    out = list(roots)
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node.id in seen or node.buffer is not None:
            continue
        seen.add(node.id)
        for ref in _companions.get(node.id, ()):
            other = ref()
            if other is not None and other.buffer is None and other not in out:
                out.append(other)
                stack.append(other)
        stack.extend(node.inputs)
    return out


def _refuse_traced(roots):
    """Under fa.jit a traced array has no value yet, and under fa.vmap an array computed from the
    batched arguments stands for every example at once; asking for its value is an error (JAX's rule),
    not the first example's value."""
    traced, batched = _trace.sources or (), _trace.batched or ()
    for node in upstream(roots):
        if node.id in traced:
            raise ConcretizationError(
                f"{_trace.who}: {_user_line()} needs the value of an array that depends on the traced arguments, "
                f"which has no value while {_trace.who} traces. Data-dependent Python control flow and printing "
                "cannot be traced: compute it outside the traced function, pass the value as a static argument "
                "(fa.jit's static_argnums=/static_argnames=), or use fa.where for a data-dependent choice.")
        if node.id in batched:
            raise ConcretizationError(
                f"fa.vmap: {_user_line()} needs the value of an array that depends on the batched arguments; "
                "inside the vectorized function it stands for every example at once, so it has no single value "
                "(float(), bool(), .item(), printing, a Python if on it). Use fa.where for a data-dependent "
                "choice, or compute the Python value outside the vmapped function.")


def depends_on_traced(roots) -> bool:
    """Whether anything ``roots`` depend on is one of fa.jit's traced or fa.vmap's batched arguments: a value
    with none while the transform records (structured control flow then records every branch)."""
    traced, batched = _trace.sources or (), _trace.batched or ()
    if not traced and not batched:
        return False
    return any(node.id in traced or node.id in batched for node in upstream(roots))


def upstream(roots):
    """Every node ``roots`` depend on (themselves included), each once."""
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node.id not in seen:
            seen.add(node.id)
            yield node
            stack.extend(node.inputs)


@contextlib.contextmanager
def batched_stand_ins(ids):
    """While fa.vmap records its function on the stand-ins ``ids`` (one example's values), asking for the
    value of anything computed from them raises ConcretizationError naming the user's line (JAX's rule)
    instead of answering with example 0's value for every example."""
    previous = _trace.batched
    _trace.batched = set(ids) | (previous or set())
    try:
        yield
    finally:
        _trace.batched = previous


def _user_line() -> str:
    """The innermost frame outside flyarray, torch and Python's own library: the user's line that asked for a
    value (torch.from_dlpack or copy.deepcopy of an array asks from inside those)."""
    import os
    import sysconfig
    import traceback
    package = os.path.dirname(os.path.abspath(__file__))
    interop = os.path.join(os.path.dirname(package), "interop")
    paths = sysconfig.get_paths()
    skipped = tuple(os.path.abspath(d) + os.sep for d in (package, interop, os.path.dirname(torch.__file__)))
    stdlib = os.path.abspath(paths["stdlib"]) + os.sep
    installed = tuple(os.path.abspath(paths[k]) + os.sep for k in ("purelib", "platlib"))  # may lie under stdlib
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith(skipped) and not (path.startswith(stdlib) and not path.startswith(installed)):
            return f"the line {frame.filename}:{frame.lineno} ({frame.line!r})"
    return "a trigger"


_settings = (config.env_eager_rounding(),)
_plan_check = config.plan_check()


def refresh_settings():
    """Re-read the switches that plans depend on (read once at import, and by fa.clear_caches)."""
    global _settings, _plan_check
    _settings = (config.refresh_eager_rounding(),)
    _plan_check = config.plan_check()


def settings() -> tuple:
    """The switches that plans depend on, as in effect now (part of every plan's key): the environment's,
    read by refresh_settings, with eager rounding as an enclosing config.eager_rounding_scope sets it."""
    forced = config.forced_eager_rounding()
    return _settings if forced is None or forced == _settings[0] else (forced,) + _settings[1:]
