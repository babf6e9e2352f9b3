"""Library ops: hand-written kernels as graph nodes.

A ``Library`` primitive names a kernel family and carries three functions:
``abstract(*avals, **params) -> [(shape, dtype), ...]`` (checks and result
types, run at record time), ``kernel(*tensors, **params)`` (our Triton
kernel; on CPU tensors it runs in Triton's interpreter), and
``reference(*tensors, **params)`` (torch eager). ``call`` records one node and
returns one Array per output.
"""
from __future__ import annotations

from .. import ir
from .._array import Array
from .core import common_device, node_of


class Library(ir.Primitive):
    kind = "library"

    def __init__(self, name, abstract, kernel, reference):
        super().__init__(name)
        self.abstract = abstract
        self.kernel = kernel
        self.reference = reference


def call(prim: Library, inputs: list, **params) -> list:
    device = common_device(inputs)
    nodes = [node_of(a) for a in inputs]
    avals = prim.abstract(*nodes, **params)
    lib = ir.Node(prim, tuple(nodes), None, (), avals[0][1], device)
    outputs = [ir.Node(ir.OUTPUT, (lib,), i, shape, d, device) for i, (shape, d) in enumerate(avals)]
    lib.params = {"outputs": outputs, "kwargs": params}
    return [Array(o) for o in outputs]


def run_library(node, backend: str, tensors: list) -> list:
    prim = node.prim
    kwargs = node.params["kwargs"]
    fn = prim.reference if backend == "reference" else prim.kernel
    out = fn(*tensors, **kwargs)
    return list(out) if isinstance(out, (tuple, list)) else [out]
