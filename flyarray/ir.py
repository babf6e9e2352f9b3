"""The graph: nodes that record an operation, its inputs, static params and result type.

A Node is created once per recorded op and never changes, except that
evaluation attaches its result (``buffer``, a torch tensor) so later graphs
read it as a leaf. Kinds of node, by ``prim.kind``:

  source      a buffer the user handed in (or a realized result)
  constant    a scalar filled over a shape (zeros, full, a Python scalar operand)
  iota        arange-like index ramps (arange, eye, linspace)
  view        a chain of movement ops over a non-view base (views.py)
  elementwise a primitive from primitives.py over same-shape inputs
  reduce      a reduction with keepdims=True (the API squeezes with a view)
  library     a hand-written kernel (matmul, attention, ...), one node per call,
              its outputs read through ``output`` nodes
"""
from __future__ import annotations

import itertools
import math
import os
import threading
import weakref
from typing import Any, Optional

import torch

from . import dtypes as _dt
from .views import View as _View

_ids = itertools.count()


class Primitive:
    """A named operation; subclasses in primitives.py carry its rules."""
    kind = "abstract"

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"<{self.kind} {self.name}>"


class Tagged(Primitive):
    """A primitive whose rules live elsewhere (the scheduler, a transform): only its name and kind."""

    def __init__(self, name, kind):
        super().__init__(name)
        self.kind = kind


SOURCE = Tagged("source", "source")
CONSTANT = Tagged("constant", "constant")
IOTA = Tagged("iota", "iota")
VIEW = Tagged("view", "view")
OUTPUT = Tagged("output", "output")


class Node:
    __slots__ = ("id", "prim", "inputs", "params", "shape", "dtype", "device", "buffer", "__weakref__")

    def __init__(self, prim: Primitive, inputs: tuple, params: Any, shape: tuple, dtype: _dt.DType,
                 device: torch.device, buffer: Optional[torch.Tensor] = None):
        self.id = next(_ids)
        self.prim = prim
        self.inputs = tuple(inputs)
        self.params = params
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device
        self.buffer = buffer

    @property
    def kind(self) -> str:
        return self.prim.kind

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def realized(self) -> bool:
        return self.buffer is not None

    def __repr__(self):
        return f"Node#{self.id}({self.prim.name}, {self.shape}, {self.dtype.name})"


class _Differentiating(threading.local):
    """Per thread: how many grad/vjp/jvp calls are recording their function (autodiff._call), and ``history``:
    node -> (prim, inputs, params) it had before an evaluation realized it. A value evaluated inside a
    differentiated function (float(x), print(x)) becomes a leaf, but the transform (or an enclosing one) still
    differentiates through it (autodiff._edges reads this). Emptied once the outermost transform has traced its
    function (autodiff._done_tracing): holding on to it would keep whole graphs alive through a kept loss."""
    depth = 0

    def __init__(self):
        self.history = weakref.WeakKeyDictionary()


differentiating = _Differentiating()


def forget_inputs(node: Node):
    """Drop a realized node's inputs (its buffer stands for them now), keeping them aside while a derivative
    transform records on this thread."""
    keep_history(node)
    node.inputs = ()


def keep_history(node: Node):
    """Keep what ``node`` computes from (its first form: an evaluation may rewrite a node in place first, as
    complex lowering does on a plan miss) while a derivative transform records on this thread: autodiff then
    sees the graph as recorded, whether or not that evaluation missed the plan cache."""
    if differentiating.depth and node.inputs and node not in differentiating.history:
        differentiating.history[node] = (node.prim, node.inputs, node.params)


def buffer_view(node: Node):
    """How a non-view node's elements lie in memory: a buffer's real strides, else contiguous."""
    t = node.buffer
    if t is not None:
        return _View(tuple(t.shape), tuple(t.stride()), 0)
    return _View.contiguous(node.shape)


def source(tensor: torch.Tensor) -> Node:
    """A leaf over a tensor; its params keep the tensor's version counter, which FLYARRAY_CHECK
    compares at evaluation (an in-place write in between would change a recorded value)."""
    return Node(SOURCE, (), version_of(tensor), tuple(tensor.shape), _dt.from_torch(tensor.dtype), tensor.device,
                tensor)


def version_of(tensor: torch.Tensor):
    """The tensor's in-place version counter; None for inference tensors, which keep none."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def constant(value, shape, dtype: _dt.DType, device) -> Node:
    return Node(CONSTANT, (), value, shape, dtype, device)


# An evaluation that computes a view alone turns that view node into a source over its own buffer
# (plan.Plan.bind: three fields change). Recording in other threads reads a view's base and ops to
# compose views over it; they take this lock to see the node wholly before or wholly after.
REBIND = threading.RLock()
# a forked child has only the forking thread: a lock another thread held at the fork would stay held for good
os.register_at_fork(after_in_child=REBIND._at_fork_reinit)


def view(base: Node, ops: tuple, shape: tuple) -> Node:
    """A view node always sits on a non-view base; chains of views compose here."""
    if base.prim is VIEW:  # (a node that is no view reads nothing of its own here: no lock)
        with REBIND:
            if base.prim is VIEW:
                ops = base.params + tuple(ops)
                base = base.inputs[0]
    if not ops:
        return base
    return Node(VIEW, (base,), tuple(ops), shape, base.dtype, base.device)


# The params of a copy that stands for an array inside a transform (autodiff's primal stand-in): when the plan
# computes one, the array it copies gets the same buffer (same values; nobody can write into a stand-in), so
# its history is not recomputed later. A user's own copy (astype, asarray(copy=True)) has params None: it
# must own its memory. Being params, it is part of the plan key.
STAND_IN = "stand-in"


def copied(node: Node):
    """The lazy value fa.grad's stand-in copy (autodiff._fresh) copies, else None: the schedule stores such a
    copy and the plan binds its buffer to that value too. A user's own copy (astype, asarray(copy=True)) is
    not one: it fuses as any elementwise op."""
    if node.params != STAND_IN or not node.inputs or node.kind != "elementwise":
        return None
    base = node.inputs[0]
    if base.buffer is not None or base.prim is VIEW or base.dtype != node.dtype or base.shape != node.shape:
        return None
    return base


def toposort(roots, inputs_of=None) -> list:
    """Nodes reachable from ``roots``, inputs before users (iteratively: graphs are deep).

    ``inputs_of(node)`` says which inputs to follow; by default a realized node's are not (it is a
    buffer now), so the walk stops at values already computed."""
    order, seen = [], set()
    stack = [(r, False) for r in roots]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node.id in seen:
            continue
        seen.add(node.id)
        stack.append((node, True))
        if inputs_of is not None:
            stack.extend((i, False) for i in inputs_of(node))
        elif not node.realized:
            stack.extend((i, False) for i in node.inputs)
    return order
