"""Composite ops (fa.nn's softmax, rms_norm, ...) expanded into primitives, on a plan miss only.

A composite is recorded as one node with OUTPUT children (as a library op is): recording it and
walking it cost one node instead of a dozen. Before scheduling, each composite under the roots is
expanded: its ``expand`` rule builds the primitive graph over the same input nodes, and every
OUTPUT child *becomes* the root that computes it (the user's arrays keep their nodes). Values an
expansion shares between outputs (rms_norm's residual sum) are the children themselves, so the
scheduler sees one graph and fuses it as if it had been recorded op by op.
"""
from __future__ import annotations

import contextlib

from . import ir
from .primitives import ELEMENTWISE


def to_primitives(roots: list):
    """The graph the scheduler takes, in place (on a plan miss, and for explain/inspect): composites
    expanded, then complex values lowered to (re, im) pairs of real ones (complex_lowering.py)."""
    from .complex_lowering import lower_complex
    expand_composites(roots)
    lower_complex(roots)


@contextlib.contextmanager
def rewrites_undone(roots: list):
    """For looking without evaluating (fa.explain, fa.inspect): the nodes under ``roots`` get their
    (prim, inputs, params) back when the block ends, so what to_primitives and the scheduler rewrote in
    place (composites expanded, epilogues moved into a GEMM) is undone. Otherwise the user's graph
    would key differently afterwards and its evaluation would miss the plan its twins share."""
    with ir.REBIND:  # the rewrites and their undoing, whole to a thread recording views meanwhile
        saved = _as_they_are(roots)
        try:
            yield
        finally:
            for node, (prim, inputs, params) in saved.items():
                node.prim, node.inputs, node.params = prim, inputs, params


def _as_they_are(roots: list) -> dict:
    """node -> (prim, inputs, params) of every unevaluated node under ``roots``."""
    saved, stack = {}, list(roots)
    while stack:
        node = stack.pop()
        if node in saved or node.buffer is not None:
            continue
        saved[node] = (node.prim, node.inputs, node.params)
        stack.extend(node.inputs)
        if isinstance(node.params, dict):   # a library or composite node: its OUTPUT children are rewritten too
            stack.extend(node.params.get("outputs", ()))
    return saved


def expand_composites(roots: list):
    """Expand every composite node reachable from ``roots`` (iteratively; expansions may nest)."""
    while True:
        found = _composites_under(roots)
        if not found:
            return
        for node in found:
            _expand(node)


def _composites_under(roots) -> list:
    found, seen, stack = [], set(), list(roots)
    while stack:
        node = stack.pop()
        if node in seen or node.buffer is not None:
            continue
        seen.add(node)
        if node.prim.kind == "composite":
            found.append(node)
        stack.extend(node.inputs)
    return found


def _expand(node):
    children = node.params["outputs"]
    if all(child.prim is not ir.OUTPUT or child.inputs[:1] != (node,) for child in children):
        return  # expanded already (reached twice)
    roots = node.prim.expand(*node.inputs, **node.params["kwargs"])
    if len(roots) != len(children) or any((r.shape, r.dtype) != (c.shape, c.dtype) for r, c in zip(roots, children)):
        raise AssertionError(f"composite {node.prim.name}: its expansion does not give the recorded outputs")
    stand_in = {root: child for root, child in zip(roots, children)}
    _substitute(roots, stand_in)
    for root, child in zip(roots, children):
        if child.buffer is not None:
            continue
        if root in node.inputs or root.buffer is not None:  # the value is an existing array: copy it
            child.prim, child.inputs, child.params = ELEMENTWISE["astype"], (root,), None
        else:
            child.prim, child.inputs, child.params = root.prim, root.inputs, root.params


def _substitute(roots, stand_in: dict):
    """Inside the expansion, read each output's value through its child node (sharing preserved)."""
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node in seen or node.buffer is not None:
            continue
        seen.add(node)
        if any(i in stand_in for i in node.inputs):
            node.inputs = tuple(stand_in.get(i, i) for i in node.inputs)
        stack.extend(i for i in node.inputs if i not in stand_in)
