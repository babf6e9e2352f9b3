"""Recording library ops: one node per call of a hand-written kernel.

The primitive and its rules (``primitives.Library``: abstract evaluation,
kernel, reference, epilogue) live with the other primitives; ``call`` checks
the inputs through the abstract rule, records one node, and returns one Array
per output.
"""
from __future__ import annotations

from .. import ir
from .._array import Array
from ..primitives import Composite, Library  # noqa: F401  (ops define their primitives through these names)
from .core import common_device, node_of


def call(prim: Library, inputs: list, **params) -> list:
    """Record library op ``prim`` over Arrays ``inputs``: checks and result types come from ``prim.abstract``;
    returns one lazy Array per output. An internal building block (``fa.quant`` and ``fa.nn`` use it)."""
    device = common_device(inputs)
    try:
        nodes = [node_of(a) for a in inputs]
    except TypeError as e:   # the op's name at least; its callers name the argument where they can
        raise TypeError(f"{prim.name}: {e}") from None
    avals = prim.abstract(*nodes, **params)
    lib = ir.Node(prim, tuple(nodes), None, (), avals[0][1], device)
    outputs = [ir.Node(ir.OUTPUT, (lib,), i, shape, d, device) for i, (shape, d) in enumerate(avals)]
    lib.params = {"outputs": outputs, "kwargs": params}
    return [Array(o) for o in outputs]


def composite(prim: Composite, inputs: list, avals: list, **params) -> list:
    """Record a composite op as one node; ``avals`` [(shape, dtype), ...] are its outputs, already
    checked by the caller. ``prim.expand`` builds the primitives on a plan miss (expand.py)."""
    device = common_device(inputs)
    return record_composite(prim, tuple([node_of(a) for a in inputs]), avals, device, params)


def record_composite(prim: Composite, nodes: tuple, avals: list, device, params: dict) -> list:
    """``composite`` over input nodes already known to be Arrays' nodes of one ``device`` (a caller's
    fast path has checked them)."""
    node = ir.Node(prim, nodes, None, (), avals[0][1], device)
    if len(avals) == 1:
        outputs = [ir.Node(ir.OUTPUT, (node,), 0, avals[0][0], avals[0][1], device)]
    else:
        # Made last to first: the scheduler takes newer roots first, so output 0 (the op's result) is
        # planned first and the values it reads (rms_norm's residual sum) ride along in its kernel.
        outputs = [ir.Node(ir.OUTPUT, (node,), i, shape, d, device) for i, (shape, d) in reversed(list(enumerate(avals)))]
        outputs.reverse()
    node.params = {"outputs": outputs, "kwargs": params}
    return [Array(o) for o in outputs]


def expansion(fn):
    """A Composite's expand rule written on Arrays: nodes in, one root node per output back."""
    def expand(*nodes, **params):
        out = fn(*[Array(n) for n in nodes], **params)
        return [a._node for a in (out if isinstance(out, (tuple, list)) else (out,))]
    return expand
