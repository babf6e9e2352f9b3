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
import sys
from typing import Optional

from . import ir, views
from .kernel_ir import Const, Elementwise, Iota, Kernel, Load, Reduce, Store
from .primitives import ELEMENTWISE, LIBRARY
from .views import View

sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))


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


@dataclasses.dataclass
class Allocate:
    node: ir.Node  # a buffer that later kernels write parts of (concat)


class _Unviewable(Exception):
    """A movement chain that no strided map over the buffer describes."""


def schedule(roots: list) -> list:
    """Steps that realize every node in ``roots`` (non-view nodes), in an order that runs."""
    return _Scheduler(roots).run()


class _Scheduler:
    def __init__(self, roots):
        self.roots = [r for r in roots if not r.realized]
        self.wanted = {r.id for r in self.roots}
        self.planned = {}  # node id -> node whose buffer a step produces
        self.steps = []
        self.uses = {}
        for node in ir.toposort(self.roots):
            for i in node.inputs:
                self.uses[i.id] = self.uses.get(i.id, 0) + 1

    def run(self) -> list:
        # Later roots first: they tend to consume earlier ones, which then ride along as extra outputs.
        for root in sorted(self.roots, key=lambda n: -n.id):
            self.ensure(root)
        return self.steps

    def is_available(self, node) -> bool:
        return node.realized or node.id in self.planned

    def ensure(self, node: ir.Node):
        """Plan a step that gives ``node`` a buffer (after the steps it depends on)."""
        if self.is_available(node):
            return
        kind = node.kind
        if kind == "view":
            raise AssertionError("views are never materialized by themselves")
        if kind == "output":
            lib = node.inputs[0]
            for i in lib.inputs:
                self.ensure_materialized_input(i)
            if lib.id not in self.planned:
                self.planned[lib.id] = lib
                for child in lib.params["outputs"]:
                    self.planned[child.id] = child
                self.steps.append(LibraryCall(lib))
            return
        if kind == "concat":
            self.plan_concat(node)
            return
        if kind == "elementwise" and self.fuse_into_library(node):
            self.ensure(node)  # now the output of a library call
            return
        self.build_kernel(node)

    def fuse_into_library(self, node) -> bool:
        """Elementwise epilogues move into library kernels that take them (matmul: bias, act, residual, cast)."""
        return any(prim.epilogue(node, self.uses, self.wanted) for prim in LIBRARY.values() if prim.epilogue)

    def ensure_materialized_input(self, node: ir.Node):
        """Library kernels take buffers: realize the base of a view (the view itself is strided)."""
        base = node.inputs[0] if node.kind == "view" else node
        self.ensure(base)

    def plan_concat(self, node):
        self.planned[node.id] = node
        self.steps.append(Allocate(node))
        offset = 0
        axis = node.params
        full_strides = views.contiguous_strides(node.shape)
        for part in node.inputs:
            target = View(part.shape, full_strides, offset * full_strides[axis])
            self.build_kernel(part, target=(node, target))
            offset += part.shape[axis]

    # ---- kernels -----------------------------------------------------------------------------------
    def build_kernel(self, root: ir.Node, target=None):
        full, axes = self.domain_of(root)
        builder = _KernelBuilder(self, full, axes)
        builder.add_root(root, target)
        if target is None:
            self.planned[root.id] = root
        self.steps.append(builder.finish())

    def domain_of(self, root: ir.Node):
        if root.kind == "reduce":
            return root.inputs[0].shape, root.params
        for red in self._reachable_reductions(root):
            full, axes = red.inputs[0].shape, red.params
            if not _worth_a_row_kernel(full, red.shape):
                continue  # the reduction gets a kernel of its own; the rest stays elementwise
            if root.shape == full or _same_rows(root.shape, red.shape):
                return full, axes
        return root.shape, ()

    def _reachable_reductions(self, root):
        found, seen, stack = [], set(), [root]
        while stack:
            node = stack.pop()
            if node.id in seen or (node is not root and self.is_available(node)):
                continue
            seen.add(node.id)
            if node.kind == "reduce":
                found.append(node)
                continue
            if node.kind in ("elementwise", "view"):
                stack.extend(reversed(node.inputs))
        return found


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


class _KernelBuilder:
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

    def add_root(self, root, target=None):
        self.stored.add(root.id)  # stored below, not as a ride-along
        if root.shape == self.full and root.kind != "reduce":
            domain, chain = "full", ()
        else:
            domain = "outer"
            chain = (("reshape", self.keep),) if root.shape != self.keep else ()
        op = self.lower(root, chain, domain)
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
    def lower(self, node: ir.Node, chain: tuple, domain: str) -> int:
        key = (node.id, chain, domain)
        if key not in self.memo:
            self.memo[key] = self._lower(node, chain, domain)
        return self.memo[key]

    def _lower(self, node, chain, domain) -> int:
        if self.sched.is_available(node) and node.id not in self.stored:
            return self.load(node, chain, domain)
        kind = node.kind
        if kind == "view":
            return self.lower(node.inputs[0], node.params + chain, domain)
        if kind == "constant":
            return self.add(Const(self.scalar(node), domain, node.dtype))
        if domain == "full" and self.axes and kind in ("elementwise", "reduce", "iota"):
            outer_chain = self.as_row_broadcast(node.shape, chain)
            if outer_chain is not None:  # computed once per row, broadcast along it
                return self.lower(node, outer_chain, "outer")
        if kind == "iota":
            view = views.apply_all(View.contiguous(node.shape), chain)
            if view is None:
                self.sched.ensure(node)
                return self.load(node, chain, domain)
            return self.add(Iota(node.params, view, domain, node.dtype))
        if kind == "elementwise":
            return self.lower_elementwise(node, chain, domain)
        if kind == "reduce":
            return self.lower_reduce(node, chain, domain)
        self.sched.ensure(node)  # source, library output, concat
        return self.load(node, chain, domain)

    def lower_elementwise(self, node, chain, domain) -> int:
        wanted = node.id in self.sched.wanted and node.id not in self.stored
        if wanted and not (domain == "full" and self.is_identity(node.shape, chain, self.full)):
            self.sched.ensure(node)  # the user holds it and this kernel cannot store it as-is
            return self.load(node, chain, domain)
        if chain and not self.pushable(node, chain):
            self.sched.ensure(node)
            return self.load(node, chain, domain)
        args = tuple(self.lower(i, chain, domain) for i in node.inputs)
        in_dtype = node.inputs[0].dtype if node.prim.name != "where" else node.inputs[1].dtype
        op = self.add(Elementwise(node.prim.name, args, domain, node.dtype, in_dtype))
        if wanted:  # ride along: store this user-held value from this kernel
            self.sched.planned[node.id] = node
            self.stored.add(node.id)
            self.store(op, node, View.contiguous(self.full), "full")
        return op

    def lower_reduce(self, node, chain, domain) -> int:
        fits = node.inputs[0].shape == self.full and node.params == self.axes
        fits = fits and domain == "outer" and self.is_identity(node.shape, chain, self.keep)
        if not fits:
            self.sched.ensure(node)
            return self.load(node, chain, domain)
        arg = self.lower(node.inputs[0], (), "full")
        op = self.add(Reduce(node.prim.name, arg, node.dtype))
        if node.id in self.sched.wanted and node.id not in self.stored:
            self.sched.planned[node.id] = node
            self.stored.add(node.id)
            self.store(op, node, View.contiguous(self.keep), "outer")
        return op

    def load(self, node, chain, domain) -> int:
        if node.kind == "view":
            node, chain = node.inputs[0], node.params + chain
        view = views.apply_all(ir.buffer_view(node), chain)
        if view is None:  # e.g. flattening a transposed user buffer: copy it contiguous first
            copy = ir.Node(_copy_prim(), (node,), None, node.shape, node.dtype, node.device)
            self.sched.build_kernel(copy)
            node, view = copy, views.apply_all(View.contiguous(copy.shape), chain)
        if node.id not in self.input_index:
            self.input_index[node.id] = len(self.inputs)
            self.inputs.append(node)
        return self.add(Load(self.input_index[node.id], view, domain, node.dtype))

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
        view = views.apply_all(View.contiguous(shape), chain)
        if view is None or view.shape != tuple(want):
            return False
        ref = View.contiguous(want)
        return view.offset == 0 and all(a == b for a, b, s in zip(view.strides, ref.strides, want) if s != 1)

    def pushable(self, node, chain) -> bool:
        """Whether ``chain`` can be pushed through ``node`` down to what it reads."""
        key = ("push", node.id, chain)
        if key in self.memo:
            return self.memo[key]
        if node.kind == "view":
            ok = self.pushable(node.inputs[0], node.params + chain)
        elif node.kind == "constant":
            ok = True
        elif node.kind == "elementwise" and not self.sched.is_available(node):
            ok = all(self.pushable(i, chain) for i in node.inputs)
        elif node.kind == "iota" and not self.sched.is_available(node):
            ok = views.apply_all(View.contiguous(node.shape), chain) is not None
        elif self.sched.is_available(node) or node.kind == "source":
            ok = views.apply_all(ir.buffer_view(node), chain) is not None
        else:  # a reduction or boundary: it becomes a buffer, contiguous
            ok = views.apply_all(View.contiguous(node.shape), chain) is not None
        self.memo[key] = ok
        return ok


def _copy_prim():
    return ELEMENTWISE["astype"]
