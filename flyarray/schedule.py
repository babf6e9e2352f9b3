"""Cut a graph into kernels: the fusion rules.

The unit of work is a ``Kernel``: a domain (a full shape F and the axes it
reduces, A) and a list of ops in SSA form over that domain. Values live either
on the *full* domain (one per element of F) or on the *outer* domain (one per
row: F with the axes A set to 1). Every kernel root gets its own buffer; the
expression below it is pulled in until it meets a value that must already
exist in memory (a user buffer, a library kernel's output, a reduction that
does not fit this domain, a view no strided map can express).

Fusion rules, in order:
  * views never run: their movement ops are pushed down to the buffers they
    read and folded into one strided map per load (views.py);
  * elementwise ops fuse with everything around them; a value used twice
    inside one kernel is computed once (the op list is hash-consed);
    a cheap value used by two kernels is recomputed in each;
  * a reduction fuses with its elementwise producers, and with its consumers
    when they live on the same domain: softmax, log_softmax, rms_norm and
    layer_norm written on primitives become one row kernel;
  * a user-held value met inside a compatible kernel is stored by it too,
    instead of getting a kernel of its own (add + rms_norm: both outputs, one pass);
  * library ops (matmul, attention, ...) are boundaries: their inputs are
    materialized, their outputs are buffers.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from . import ir, views
from .kernel_ir import Const, Elementwise, Iota, Kernel, Load, Reduce, Store
from .primitives import ELEMENTWISE, LIBRARY
from .views import View


@dataclasses.dataclass
class KernelStep:
    """A generated kernel and the graph nodes it binds: the buffers it reads and writes, the
    constant nodes whose values are its scalar arguments."""
    kernel: Kernel
    inputs: list
    outputs: list  # one node per store: whose buffer the store writes
    scalars: list


@dataclasses.dataclass
class LibraryCall:
    node: ir.Node  # a library node; its OUTPUT children receive the results
    # output index -> (concat node, View of its buffer): that output is written there by the call itself
    # (the library's ``writes_into``), instead of a kernel copying it in (see _Scheduler.write_in_place)
    into: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Allocate:
    node: ir.Node  # a buffer that later kernels write parts of (concat)


def schedule(roots: list) -> list:
    """Steps that realize every node in ``roots``, in an order that runs.

    A root is a non-view node, or a view node the user asked for: when its base is an unevaluated
    elementwise/constant/iota expression larger than the view, one kernel over the view's shape
    computes only the elements the view reads into a buffer of the view node's own (a KernelStep
    whose output is the view node); otherwise the base is realized whole instead.
    """
    return _Scheduler(roots).run()


def _drive(gen):
    """Run recursion written as generators on an explicit stack: inside one, ``value = yield sub``
    calls the generator ``sub`` and receives what it returns. Graph walks as deep as the graph (a
    chain of 20000 fused ops) then need no Python recursion and no raised recursion limit."""
    stack, value, error = [gen], None, None
    while stack:
        try:
            sub = stack[-1].throw(error) if error is not None else stack[-1].send(value)
        except StopIteration as stop:
            stack.pop()
            value, error = stop.value, None
            continue
        except BaseException as exc:  # propagate to the caller's generator, as a real call would
            stack.pop()
            if not stack:
                raise
            value, error = None, exc
            continue
        stack.append(sub)
        value, error = None, None
    return value


class _Scheduler:
    def __init__(self, roots):
        self.planned = {}  # node id -> node whose buffer a step produces
        self.steps = []
        self.memo_version = 0  # len(planned) when the memos below were filled
        self.memos = ({}, {}, {})  # leaf_views, pushable, reachable reductions: see walk_memo
        roots = [r for r in roots if not r.realized]
        whole = {r.id for r in roots if r.kind != "view"}
        self.roots, ids = [], set()
        self.made = {}  # root id -> the id of the latest root (as the user made them) it stands for
        for given in roots:
            r = given
            if r.kind == "view" and not self.reads_part(r, whole):
                r = r.inputs[0]
            if not r.realized and r.id not in ids:
                ids.add(r.id)
                self.roots.append(r)
            self.made[r.id] = max(self.made.get(r.id, given.id), given.id)
        self.wanted = ids
        self.uses = {}
        self.users = {}  # node id -> the nodes that read it (finding siblings: see siblings)
        self.filling = set()  # ids of concats whose parts are being planned: not yet readable
        self.building = set()  # ids of the roots of kernels being built (see build_kernel)
        self.into = {}  # library output id -> (concat node, View): written in place by its call
        self.library_inputs = set()  # ids of values a library call reads: materialized whatever we fuse
        order = ir.toposort(self.roots)
        for node in order:
            for i in node.inputs:
                self.uses[i.id] = self.uses.get(i.id, 0) + 1
                self.users.setdefault(i.id, []).append(node)
            if node.kind == "library":
                self.note_library_inputs(node)
            elif ir.copied(node) is not None:
                # a same-dtype copy of a lazy value: fa.grad's stand-in for a lazy primal is one. Stored, its
                # buffer goes to the primal too (plan.Plan.bind), so a training loop that reads only the loss
                # does not carry every parameter's update history into the next step's graph
                self.library_inputs.add(node.id)
        self.deep_shared = _deep_shared_values(order, self.users)

    def must_store(self, node) -> bool:
        """Whether ``node`` gets a buffer whatever kernel computes it: the user holds it, or a library
        call reads it. A kernel that meets such a value on its own domain stores it as it goes (one
        pass) instead of recomputing it, and a second kernel then reads that buffer. (A deep shared value is
        stored by a kernel of its own: lower_elementwise.)"""
        return node.id in self.wanted or node.id in self.library_inputs or node.id in self.deep_shared

    def reads_part(self, view, whole) -> bool:
        """Whether a requested view gets a kernel over its own shape instead of its base computed
        whole: a slice of a huge broadcast expression then costs what it reads. Only for bases that
        are cheap per element (elementwise, constant, iota: reductions and library outputs are
        computed whole anyway), larger than the view, not requested whole, and reachable through
        the view's strided map."""
        base = view.inputs[0]
        return (base.kind in ("elementwise", "constant", "iota") and not base.realized and base.id not in whole
                and view.size < base.size and self.pushable(base, view.params))

    def run(self) -> list:
        # Later roots first: they tend to consume earlier ones, which then ride along as extra outputs.
        for root in sorted(self.roots, key=lambda n: -self.made[n.id]):   # (the plan's key holds this order)
            _drive(self.ensure(root))
        return self.steps

    def is_available(self, node) -> bool:
        return node.realized or node.id in self.planned

    # The methods below that ``yield`` are generators run by _drive (see there).
    def ensure(self, node: ir.Node):
        """Plan a step that gives ``node`` a buffer (after the steps it depends on)."""
        if self.is_available(node):
            return
        kind = node.kind
        if kind == "view":  # a requested view that reads part of its base (reads_part)
            yield self.build_kernel(node)
            return
        if kind == "output":
            lib = node.inputs[0]
            for i in lib.inputs:
                yield self.ensure_materialized_input(i)
            if lib.id not in self.planned:
                self.planned[lib.id] = lib
                outputs = lib.params["outputs"]
                for child in outputs:
                    self.planned[child.id] = child
                into = {i: self.into[c.id] for i, c in enumerate(outputs) if c.id in self.into}
                self.steps.append(LibraryCall(lib, into))
            return
        if kind == "concat":
            yield self.plan_concat(node)
            return
        if kind == "elementwise" and self.fuse_into_library(node):
            yield self.ensure(node)  # now the output of a library call
            return
        yield self.build_kernel(node)

    def fuse_into_library(self, node) -> bool:
        """Elementwise epilogues move into library kernels that take them (matmul: bias, act, residual, cast).
        The new call's inputs are library inputs from now on (must_store): a kernel that meets one (a residual
        a norm also reads) stores it instead of recomputing it inline, which would leave the call to compute
        it again (the GEMM under it twice)."""
        if not any(prim.epilogue(node, self.uses, self.wanted) for prim in LIBRARY.values() if prim.epilogue):
            return False
        self.note_library_inputs(node.inputs[0])
        return True

    def note_library_inputs(self, lib):
        """The buffers library call ``lib`` reads (a view's base) are materialized whatever we fuse."""
        self.library_inputs.update((i.inputs[0] if i.kind == "view" else i).id for i in lib.inputs)

    def ensure_materialized_input(self, node: ir.Node):
        """Library kernels take buffers: realize the base of a view (the view itself is strided)."""
        base = node.inputs[0] if node.kind == "view" else node
        yield self.ensure(base)

    def plan_concat(self, node):
        self.planned[node.id] = node
        self.filling.add(node.id)
        self.steps.append(Allocate(node))
        axis = node.params
        full_strides = views.contiguous_strides(node.shape)
        targets, offset = [], 0
        for part in node.inputs:
            targets.append(View(part.shape, full_strides, offset * full_strides[axis]))
            offset += part.shape[axis]
        # every part a library call can write itself is known before any call is planned: one call may
        # make several parts (attention_bwd's dq, dk, dv of a qkv gradient)
        in_place = [self.write_in_place(part, node, target) for part, target in zip(node.inputs, targets)]
        for part, target, output in zip(node.inputs, targets, in_place):
            if output is not None:
                yield self.ensure(output)
            else:
                yield self.build_kernel(part, target=(node, target))
        self.filling.discard(node.id)

    def write_in_place(self, part, concat, target):
        """The library output a concat part moves (through views alone) when that output's call can write it
        straight into the concat's buffer: the call is not planned yet, takes output buffers
        (``writes_into``), and nothing else reads the output or the views between; else None."""
        chain, node = [], part
        while node.kind == "view":
            if self.uses.get(node.id, 0) != 1 or node.id in self.wanted:
                return None
            chain.append(node.params)
            node = node.inputs[0]
        if (node.kind != "output" or node.dtype != concat.dtype or self.is_available(node)
                or self.uses.get(node.id, 0) != 1 or node.id in self.wanted):
            return None
        lib = node.inputs[0]
        if not lib.prim.writes_into or lib.id in self.planned:
            return None
        ops = tuple(op for params in reversed(chain) for op in params)
        where = views.pulled_back(node.shape, ops, target)
        if where is None:
            return None
        self.into[node.id] = (concat, where)
        return node

    # ---- kernels -----------------------------------------------------------------------------------
    def build_kernel(self, root: ir.Node, target=None):
        outermost = root.id not in self.building
        if not outermost or self.is_available(root):
            # asked for again from inside its own kernel (whose row-reduction domain could not store it as
            # it is), it gets a kernel over its own shape, or the two would ask for each other forever; so
            # does a value that has a buffer already (a concat part copied into place: a realized
            # reduction keeps no inputs to take a domain from)
            full, axes = root.shape, ()
        else:
            full, axes = self.domain_of(root)
        self.building.add(root.id)
        builder = _KernelBuilder(self, full, axes)
        yield builder.add_root(root, target)
        if target is None and not axes and root.shape == builder.full:
            for sibling in self.siblings(builder):
                yield builder.add_root(sibling)
                builder.riders.append(sibling)
        self.share_reductions(builder)
        if target is None:
            self.planned[root.id] = root
        for node in builder.riders:  # available from now on: their kernel is in the steps
            self.planned[node.id] = node
        self.steps.append(builder.finish())
        if outermost:  # an inner build for the same root leaves the outer one marked
            self.building.discard(root.id)

    # Horizontal fusion: two values needed as buffers (held by the user, or read by a library call) that
    # read the same inputs are computed by one kernel, which reads those inputs once (a SwiGLU backward's
    # two gradients: one pass over dy, gate and up instead of two).
    MAX_SIBLINGS = 4      # extra stores a kernel takes on this way
    SIBLING_NODES = 64    # the most nodes a sibling may add to a kernel

    def siblings(self, builder) -> list:
        """Values of the builder's (elementwise, full-domain) shape that must be stored, read what its
        kernel reads or computes, and need nothing else that is not already available: adding them to
        this kernel plans nothing new, so it cannot depend on this kernel's own results."""
        found, seen = [], set()
        stack = list(builder.inputs + builder.computed)
        while stack and len(seen) <= self.SIBLING_NODES:   # up through the elementwise values they feed
            for user in self.users.get(stack.pop().id, ()):
                if user.id in seen or self.is_available(user) or user.id in builder.stored:
                    continue
                if user.kind == "view":   # (a reshape to the batch shape torch graphs put everywhere)
                    seen.add(user.id)
                    stack.append(user)
                    continue
                if user.kind != "elementwise" or user.shape != builder.full:
                    continue
                seen.add(user.id)
                if not self.must_store(user):
                    stack.append(user)
                elif self.lowerable_in(builder, user):
                    found.append(user)
                    if len(found) == self.MAX_SIBLINGS:
                        return found
        return found

    def share_reductions(self, builder):
        """A reduction this kernel computes that a value outside it still needs (an RMSNorm backward's row
        statistic, which its weight gradient's column sum reads too) is stored as well -- one value a row --
        instead of a second kernel reading the whole input again to recompute it."""
        lowered = None
        for node, op in builder.reductions:
            if node.id in builder.stored or self.is_available(node):
                continue
            if lowered is None:
                lowered = {key[0] for key in builder.memo}
            if self.read_outside(node, lowered, builder.stored):
                builder.ride_along(node, op, "outer")

    def read_outside(self, node, lowered, stored) -> bool:
        """Whether a pending value outside ``lowered`` (a kernel's nodes) reads ``node``, directly or through
        values of that kernel it does not store: that value's kernel would compute ``node`` again. (Values
        the kernel stores are loaded by their other readers.)"""
        stack, seen = [node], {node.id}
        while stack:
            for user in self.users.get(stack.pop().id, ()):
                if user.id in seen or self.is_available(user) or user.id in stored:
                    continue
                seen.add(user.id)
                if user.id not in lowered:
                    return True
                if len(seen) < self.SIBLING_NODES:
                    stack.append(user)
        return False

    def lowerable_in(self, builder, node) -> bool:
        """Whether ``node`` lowers inside ``builder``'s kernel from what is available or computed there,
        through same-shape elementwise values nobody else stores, constants, and views of buffers."""
        stack, seen = list(node.inputs), set()
        while stack:
            n = stack.pop()
            if n.id in seen:
                continue
            seen.add(n.id)
            if len(seen) > self.SIBLING_NODES:
                return False
            if n.id in builder.stored or (n.id, (), "full") in builder.memo or n.kind == "constant":
                continue
            if n.kind == "view" or self.is_available(n):   # a load (of a view: of an available base only)
                base = n.inputs[0] if n.kind == "view" else n
                if not self.is_available(base) or base.id in self.filling:
                    return False
                if n.kind == "view" and base.realized and views.apply_all(ir.buffer_view(base), n.params) is None:
                    # no strided view of the buffer shows it (a transposed argument flattened): the load would
                    # need a copy first, which is planning something new (and it would take this kernel's
                    # siblings again: the copy's kernel asked for the same sibling forever)
                    return False
                continue
            if n.kind != "elementwise" or n.shape != builder.full or self.must_store(n):
                return False
            stack.extend(n.inputs)
        return True

    def domain_of(self, root: ir.Node):
        if root.kind == "reduce":
            return root.inputs[0].shape, root.params
        if root.kind == "view":  # elementwise over the view's shape; reductions below get kernels of their own
            return root.shape, ()
        for red in self._reachable_reductions(root):
            full, axes = red.inputs[0].shape, red.params
            if not _worth_a_row_kernel(full, red.shape):
                continue  # the reduction gets a kernel of its own; the rest stays elementwise
            if root.shape == full or _same_rows(root.shape, red.shape):
                return full, axes
        return root.shape, ()

    def walk_memo(self) -> tuple:
        """Memos of graph walks, shared by every kernel of this schedule. A walk's answer depends only
        on which nodes are available, which changes only when a node is planned: the memos are
        emptied then. Nothing is planned while a kernel's lowering descends through the nodes it must
        materialize first, so a chain of n such steps walks each node once instead of once per kernel
        (which made long chains cubic)."""
        if self.memo_version != len(self.planned):
            self.memo_version = len(self.planned)
            for memo in self.memos:
                memo.clear()
        return self.memos

    def _reachable_reductions(self, root) -> tuple:
        """Reductions that ``root`` computes through elementwise ops and views, in depth-first order, the first
        of each kind only (see _kinds_of) (a root already planned, a concat part, is looked through all the same)."""
        if not self.is_available(root):
            return self._reachable(root)
        if root.kind == "reduce":
            return (root,)
        if root.kind in ("elementwise", "view"):
            return _kinds_of(r for i in root.inputs for r in self._reachable(i))
        return ()

    def _reachable(self, node) -> tuple:
        memo = self.walk_memo()[2]
        stack = [node]
        while stack:  # post-order, iterative: graphs are deeper than Python's recursion limit
            n = stack[-1]
            if n.id in memo:
                stack.pop()
                continue
            if self.is_available(n):
                found = ()
            elif n.kind == "reduce":
                found = (n,)
            elif n.kind in ("elementwise", "view"):
                pending = [i for i in n.inputs if i.id not in memo]
                if pending:
                    stack.extend(pending)
                    continue
                found = _kinds_of(r for i in n.inputs for r in memo[i.id])
            else:
                found = ()
            stack.pop()
            memo[n.id] = found
        return memo[node.id]

    # ---- pushing views down ----------------------------------------------------------------------
    def pushable(self, node, chain) -> bool:
        """Whether the movement ``chain`` can be pushed through ``node`` down to what it reads: it must
        give a strided view over every buffer (or iota) below."""
        memo, key = self.walk_memo()[1], (node.id, chain)
        ok = memo.get(key)
        if ok is None:
            ok = memo[key] = all(v is not None and (views.addresses_one_element(v)
                                                    or views.apply_all(v, chain) is not None)
                                 for v in self.leaf_views(node))
        return ok

    def leaf_views(self, node) -> frozenset:
        """How ``node``'s elements lie in each buffer it is computed from, as views of ``node``'s shape
        (None where no strided view describes one). Elementwise ops and views are walked through,
        constants need no buffer, anything else is (or becomes) a buffer.

        One set per node answers every chain, so a chain that fails deep below fails here at once
        instead of being re-pushed down the whole graph (which made chains that materialize at each
        step cubic)."""
        memo = self.walk_memo()[0]
        stack = [node]
        while stack:  # post-order, iterative: graphs are deeper than Python's recursion limit
            n = stack[-1]
            if n.id in memo:
                stack.pop()
                continue
            through = n.kind in ("view", "elementwise") and not self.is_available(n)
            pending = [i for i in n.inputs if i.id not in memo] if through else ()
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            if not through:
                memo[n.id] = self._own_views(n)
            elif n.kind == "view":
                memo[n.id] = frozenset(None if v is None else views.apply_all(v, n.params) for v in memo[n.inputs[0].id])
            else:
                memo[n.id] = frozenset().union(*(memo[i.id] for i in n.inputs))
        return memo[node.id]

    def _own_views(self, node) -> frozenset:
        if node.kind == "constant":
            return frozenset()
        if self.is_available(node) or node.kind == "source":
            return frozenset((ir.buffer_view(node),))
        return frozenset((View.contiguous(node.shape),))  # an iota, or a reduction/boundary: a contiguous buffer


# Each node a movement chain meets applies it whole (to key the lowering, to check it can be pushed), and a chain
# grows by every view it passes that does not merge into it (views.prepend). Where views keep the layout strided
# (reshapes that move size-1 axes around, over a real buffer), a loop of them scheduled in time quadratic in its
# depth (37 s at 1000 steps). Past this many ops, a node the chain can read as a strided view of its contiguous
# buffer is stored and read so: one more kernel per this many views, and linear time. Real chains are a few ops.
MAX_PUSHED_CHAIN = 96


# A value read twice is recomputed by each kernel that reads it (cheap, when it is a few elementwise ops). A
# recorded loop makes that quadratic: a scan's carry feeds the next step and that step's output, so the kernel
# writing output i would recompute all i steps before it (a 400-step scan: 241,401 ops, the longest kernel 1,202).
# A value read twice that lies deeper than this many fused ops below the last stored one is a boundary instead:
# stored by a kernel of its own and read as a buffer, as a library input is. Read through a view as well, a value is
# recomputed once per distinct view even inside one kernel (y = f(y, a row of y broadcast), a row a step: 200 steps,
# one kernel of 81,402 ops), so it is a boundary from a smaller depth. Reductions do not count as readers: a row
# kernel reads a value directly and through its row reduction at once (y = y - mean(y) * 0.5, n times: one kernel).
MAX_RECOMPUTED_DEPTH = 64
MAX_RECOMPUTED_VIEW_DEPTH = 16


def _deep_shared_values(order, users) -> set:
    """Ids of the pending elementwise values read more than once (reductions aside) that lie more than
    MAX_RECOMPUTED_DEPTH (MAX_RECOMPUTED_VIEW_DEPTH if a view reads them) fused ops (elementwise and views)
    above anything stored, counting from the last such value."""
    depth, deep = {}, set()
    for node in order:   # inputs first
        if node.realized or node.kind not in ("elementwise", "view"):
            continue
        d = 1 + max((depth.get(i.id, 0) for i in node.inputs), default=0)
        readers = {user.id: user for user in users.get(node.id, ()) if user.kind != "reduce"}.values()   # v * v: one
        if node.kind == "elementwise" and len(readers) > 1:
            viewed = any(user.kind == "view" for user in readers)
            if d > (MAX_RECOMPUTED_VIEW_DEPTH if viewed else MAX_RECOMPUTED_DEPTH):
                deep.add(node.id)
                d = 0
        depth[node.id] = d
    return deep


def _too_long_to_push(node, chain) -> bool:
    return len(chain) > MAX_PUSHED_CHAIN and views.apply_all(View.contiguous(node.shape), chain) is not None


def _kinds_of(reductions) -> tuple:
    """The first reduction of each kind in ``reductions``, in order. A kind is what domain_of reads of one (the
    shape it reduces, its axes, its result's shape): a later one of a kind would give the same answer. All of them
    made the memo quadratic: in a chain y = y - mean(y) node i reaches i reductions, all of one kind."""
    first = {}
    for r in reductions:
        first.setdefault((r.inputs[0].shape, r.params, r.shape), r)
    return tuple(first.values())


def _worth_a_row_kernel(full, keep) -> bool:
    """Row kernels parallelize over rows: fine with many rows, or rows short enough for one block.

    A few very long rows (a full reduction of a big array) would leave the GPU idle, so the
    consumers of such a reduction run as a separate elementwise kernel instead.
    """
    from .codegen import ROW_BLOCK_LIMIT
    rows = math.prod(keep)
    return rows >= 128 or math.prod(full) // max(rows, 1) <= ROW_BLOCK_LIMIT


def _same_rows(shape, keep_shape) -> bool:
    """Whether ``shape`` is ``keep_shape`` up to size-1 axes (the same rows, in the same order)."""
    return [s for s in shape if s != 1] == [s for s in keep_shape if s != 1]


def _mapping(shape, chain):
    """What a movement ``chain`` addresses in a value of ``shape``: the strided view it makes of the value's
    contiguous layout (size-1 axes' strides zeroed), else the chain itself. Chains that address the same elements
    are one lowering: keyed by the raw chain, a value read whole and through a view at every step (x.at[i].add(x[j])
    in a loop) was lowered once per path, 2**depth times."""
    if not chain:
        return chain
    view = views.apply_all(View.contiguous(shape), chain)
    if view is None:
        return chain
    return ("view", view.shape, tuple(0 if n == 1 else s for n, s in zip(view.shape, view.strides)), view.offset)


class _KernelBuilder:
    """One kernel's ops. The lowering methods that ``yield`` are generators run by _drive."""

    def __init__(self, sched: _Scheduler, full: tuple, axes: tuple):
        self.sched = sched
        self.full = tuple(full)
        self.axes = tuple(axes)
        self.keep = tuple(1 if i in axes else s for i, s in enumerate(full))
        self.ops = []
        self.op_index = {}
        self.memo = {}
        self.inputs = []
        self.input_index = {}
        self.scalars = []
        self.scalar_index = {}
        self.stores = []
        self.targets = []
        self.stored = set()
        # Values this kernel stores along the way. They become available to other kernels only when
        # this one is finished: a kernel built while this one is still being lowered (an input it
        # must materialize first) runs before it, so it must not read them.
        self.riders = []
        self.computed = []  # elementwise values this kernel computes over its whole domain (siblings')
        self.reductions = []  # (node, op) of the reductions it computes without storing them

    def add_root(self, root, target=None):
        if not self.sched.is_available(root):  # (a concat part evaluated since it was recorded is loaded)
            self.stored.add(root.id)  # stored below, not as a ride-along
        if root.shape == self.full and root.kind != "reduce":
            domain, chain = "full", ()
        else:
            domain = "outer"
            chain = (("reshape", self.keep),) if root.shape != self.keep else ()
        op = yield self.lower(root, chain, domain)
        shape = self.full if domain == "full" else self.keep
        view = target[1] if target else View.contiguous(root.shape)
        if view.shape != shape:
            view = views.apply(view, ("reshape", shape))
        self.store(op, target[0] if target else root, view, domain)

    def store(self, op, node, view, domain):
        self.stores.append(Store(op, node.dtype, view, domain))
        self.targets.append(node)

    def finish(self) -> KernelStep:
        kernel = Kernel(self.full, self.axes, self.ops, self.stores, len(self.inputs),
                        [n.dtype for n in self.scalars])
        return KernelStep(kernel, self.inputs, self.targets, self.scalars)

    def scalar(self, node) -> int:
        """The scalar argument holding a constant node's value (one per node: equal values stay
        separate slots, so -0.0 and 0.0, or two NaNs, are never merged)."""
        if node.id not in self.scalar_index:
            self.scalar_index[node.id] = len(self.scalars)
            self.scalars.append(node)
        return self.scalar_index[node.id]

    def add(self, op) -> int:
        if op not in self.op_index:
            self.op_index[op] = len(self.ops)
            self.ops.append(op)
        return self.op_index[op]

    # ---- lowering ----------------------------------------------------------------------------------
    def lower(self, node: ir.Node, chain: tuple, domain: str):
        key = (node.id, _mapping(node.shape, chain), domain)
        if key not in self.memo:
            self.memo[key] = yield self._lower(node, chain, domain)
        return self.memo[key]

    def _lower(self, node, chain, domain):
        if self.sched.is_available(node) and node.id not in self.stored:
            return (yield self.load(node, chain, domain))
        kind = node.kind
        if kind == "view":
            base = node.inputs[0]
            return (yield self.lower(base, views.prepend(base.shape, node.params, chain), domain))
        if kind == "constant":
            return self.add(Const(self.scalar(node), domain, node.dtype))
        if domain == "full" and self.axes and kind in ("elementwise", "reduce", "iota"):
            outer_chain = self.as_row_broadcast(node.shape, chain)
            if outer_chain is not None:  # computed once per row, broadcast along it
                return (yield self.lower(node, outer_chain, "outer"))
        if kind == "iota":
            view = views.apply_all(View.contiguous(node.shape), chain)
            if view is None:
                yield self.sched.ensure(node)
                return (yield self.load(node, chain, domain))
            return self.add(Iota(node.params, view, domain, node.dtype))
        if kind == "elementwise":
            return (yield self.lower_elementwise(node, chain, domain))
        if kind == "reduce":
            return (yield self.lower_reduce(node, chain, domain))
        yield self.sched.ensure(node)  # source, library output, concat
        return (yield self.load(node, chain, domain))

    def lower_elementwise(self, node, chain, domain):
        if node.id in self.sched.deep_shared and node.id not in self.stored:
            # a boundary: stored by a kernel of its own, then read as a buffer (through any view)
            yield self.sched.ensure(node)
            return (yield self.load(node, chain, domain))
        wanted = self.sched.must_store(node) and node.id not in self.stored
        if wanted and not (domain == "full" and self.is_identity(node.shape, chain, self.full)):
            yield self.sched.ensure(node)  # the user holds it and this kernel cannot store it as-is
            return (yield self.load(node, chain, domain))
        if chain and (_too_long_to_push(node, chain) or not self.sched.pushable(node, chain)):
            yield self.sched.ensure(node)
            return (yield self.load(node, chain, domain))
        args = []
        for i in node.inputs:
            args.append((yield self.lower(i, chain, domain)))
        in_dtype = node.inputs[0].dtype if node.prim.name != "where" else node.inputs[1].dtype
        op = self.add(Elementwise(node.prim.name, tuple(args), domain, node.dtype, in_dtype))
        if not chain and domain == "full":
            self.computed.append(node)
        if wanted:  # ride along: store this user-held value from this kernel
            self.ride_along(node, op, "full")
        return op

    def lower_reduce(self, node, chain, domain):
        fits = node.inputs[0].shape == self.full and node.params == self.axes
        fits = fits and domain == "outer" and self.is_identity(node.shape, chain, self.keep)
        if not fits:
            yield self.sched.ensure(node)
            return (yield self.load(node, chain, domain))
        arg = yield self.lower(node.inputs[0], (), "full")
        op = self.add(Reduce(node.prim.name, arg, node.dtype))
        if self.sched.must_store(node) and node.id not in self.stored:
            self.ride_along(node, op, "outer")
        else:
            self.reductions.append((node, op))
        return op

    def ride_along(self, node, op, domain):
        """Store ``node`` (computed as ``op`` over ``domain``) from this kernel as it goes."""
        self.riders.append(node)
        self.stored.add(node.id)
        self.store(op, node, View.contiguous(self.full if domain == "full" else self.keep), domain)

    def load(self, node, chain, domain):
        if node.kind == "view" and node.id not in self.sched.planned:  # a planned view has a buffer of its own
            node, chain = node.inputs[0], views.prepend(node.inputs[0].shape, node.params, chain)
        view = views.apply_all(ir.buffer_view(node), chain)
        while view is None:  # e.g. flattening a transposed user buffer: copy it contiguous first
            node, chain = yield self.copy_through(node, chain)
            view = views.apply_all(View.contiguous(node.shape), chain)
        if node.id not in self.input_index:
            self.input_index[node.id] = len(self.inputs)
            self.inputs.append(node)
        return self.add(Load(self.input_index[node.id], view, domain, node.dtype))

    def copy_through(self, node, chain):
        """A contiguous copy of ``node`` seen through the longest start of ``chain`` its buffer can show
        as a strided view, and the rest of the chain: (copy, rest). Every op applies to a contiguous
        buffer, so copying again makes progress (a chain pushed onto a value that must be stored, such as
        the flattening of its broadcast, fails on its buffer even when its inputs would allow it)."""
        start = ir.buffer_view(node)
        done = 0
        while done < len(chain) and views.apply_all(start, chain[:done + 1]) is not None:
            done += 1
        if done:
            shape = views.apply_all(View.contiguous(node.shape), chain[:done]).shape
            node = ir.Node(ir.VIEW, (node,), chain[:done], shape, node.dtype, node.device)
        copy = ir.Node(_copy_prim(), (node,), None, node.shape, node.dtype, node.device)
        yield self.sched.build_kernel(copy)
        return copy, chain[done:]

    # ---- view algebra on this kernel's domain ---------------------------------------------------------
    def as_row_broadcast(self, shape, chain) -> Optional[tuple]:
        """If ``chain`` only broadcasts a per-row value along the reduced axes, the chain that
        reads it on the outer domain instead; else None."""
        view = views.apply_all(View.contiguous(shape), chain)
        if view is None or view.shape != self.full:
            return None
        if any(view.strides[a] != 0 for a in self.axes if self.full[a] != 1):
            return None
        return chain + (("slice", (0,) * len(self.full), (1,) * len(self.full), self.keep),)

    @staticmethod
    def is_identity(shape, chain, want) -> bool:
        """Whether ``chain`` moves a contiguous ``shape`` onto a contiguous ``want`` element for element (a
        slice that starts at 0 lands contiguously too, but leaves elements out)."""
        view = views.apply_all(View.contiguous(shape), chain)
        if view is None or view.shape != tuple(want) or math.prod(shape) != math.prod(want):
            return False
        ref = View.contiguous(want)
        return view.offset == 0 and all(a == b for a, b, s in zip(view.strides, ref.strides, want) if s != 1)


def _copy_prim():
    return ELEMENTWISE["astype"]
