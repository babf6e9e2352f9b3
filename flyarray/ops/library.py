"""Recording library ops: one node per call of a hand-written kernel.

The primitive and its rules (``primitives.Library``: abstract evaluation,
kernel, reference, epilogue) live with the other primitives; ``call`` checks
the inputs through the abstract rule, records one node, and returns one Array
per output.
"""
from __future__ import annotations

from .. import ir
from .._array import Array
from ..primitives import Library  # noqa: F401  (ops define their primitives through this name)
from .core import common_device, node_of


def call(prim: Library, inputs: list, **params) -> list:
    device = common_device(inputs)
    nodes = [node_of(a) for a in inputs]
    avals = prim.abstract(*nodes, **params)
    lib = ir.Node(prim, tuple(nodes), None, (), avals[0][1], device)
    outputs = [ir.Node(ir.OUTPUT, (lib,), i, shape, d, device) for i, (shape, d) in enumerate(avals)]
    lib.params = {"outputs": outputs, "kwargs": params}
    return [Array(o) for o in outputs]
