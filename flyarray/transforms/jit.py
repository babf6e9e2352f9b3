"""jit: trace a function once per input signature, then replay its kernels directly.

The first call with a given signature (shapes, dtypes, strides, devices of the
array arguments, and the values of the other arguments) records the graph,
schedules it and runs it as usual, while noting every step: which kernel, its
launch arguments, and where each buffer comes from (an argument, an
intermediate, an output). Later calls skip recording, scheduling and code
generation and only allocate and launch. As in JAX, Python values the
function closes over are baked in at trace time.
"""
from __future__ import annotations

import functools

import torch

from .. import ir, runtime
from .._array import Array
from ..schedule import Allocate, Kernel, LibraryCall


def jit(fn):
    cache = {}

    @functools.wraps(fn)
    def wrapped(*args):
        tensors, key = _signature(args)
        program = cache.get(key)
        if program is None:
            program, result = _trace(fn, args, tensors)
            cache[key] = program
            return result
        return program.run(tensors)

    wrapped.cache = cache
    return wrapped


def _signature(args):
    tensors, key = [], []
    for a in args:
        if isinstance(a, Array):
            t = a._tensor()
            tensors.append(t)
            key.append(("array", tuple(t.shape), t.dtype, tuple(t.stride()), t.device))
        elif isinstance(a, torch.Tensor):
            tensors.append(a)
            key.append(("tensor", tuple(a.shape), a.dtype, tuple(a.stride()), a.device))
        else:
            try:
                hash(a)
            except TypeError:
                raise TypeError(f"fa.jit: argument {a!r} is neither an array nor hashable; pass arrays as "
                                "fa.Array or torch.Tensor, and other arguments as hashable values") from None
            key.append(("static", a))
    return tensors, (tuple(key), runtime.backend_name())


def _trace(fn, args, tensors):
    sources = []
    call_args = []
    it = iter(tensors)
    for a in args:
        if isinstance(a, (Array, torch.Tensor)):
            node = ir.source(next(it))
            sources.append(node)
            call_args.append(Array(node))
        else:
            call_args.append(a)
    out = fn(*call_args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    recorder = _Recorder(sources)
    runtime.realize(outs, observer=recorder.observe)
    program = recorder.program(outs, isinstance(out, (tuple, list)))
    return program, out


class _Recorder:
    def __init__(self, sources):
        self.refs = {n.id: ("arg", i) for i, n in enumerate(sources)}
        self.steps = []

    def ref(self, node):
        if node.id not in self.refs:
            self.refs[node.id] = ("tmp", node.id)
        return self.refs[node.id]

    def observe(self, step, launch=None):
        if isinstance(step, Allocate):
            self.steps.append(("alloc", self.ref(step.node), step.node.shape, step.node.dtype.torch))
        elif isinstance(step, LibraryCall):
            lib = step.node
            self.steps.append(("library", lib, [self.input_ref(i) for i in lib.inputs],
                               [self.ref(o) for o in lib.params["outputs"]]))
        elif isinstance(step, Kernel):
            outs = []
            for st in step.stores:
                fresh = self.refs.get(st.target.id) is None
                outs.append((self.ref(st.target), st.target.shape, st.target.dtype.torch, fresh))
            self.steps.append(("kernel", launch, [self.ref(n) for n in step.inputs], outs))

    def input_ref(self, node):
        if node.kind == "view":
            return ("view", self.ref(node.inputs[0]), node.params)
        return self.ref(node)

    def program(self, outs, as_tuple):
        out_refs = [self.input_ref(o._node) for o in outs]
        return _Program(self.steps, out_refs, as_tuple)


class _Program:
    """The recorded steps, with every buffer named by where it comes from.

    A ref is ("arg", i) for the i-th array argument, ("tmp", node id) for a buffer the
    program allocates, or ("view", ref, movement ops) for a torch view of another ref.
    """

    def __init__(self, steps, out_refs, as_tuple):
        self.steps = steps
        self.out_refs = out_refs
        self.as_tuple = as_tuple

    def run(self, tensors):
        env = {("arg", i): t for i, t in enumerate(tensors)}
        device = tensors[0].device if tensors else runtime.default_device()
        get = env.__getitem__
        for step in self.steps:
            kind = step[0]
            if kind == "kernel":
                _, launch, ins, outs = step
                for ref, shape, dtype, fresh in outs:
                    if fresh and ref not in env:
                        env[ref] = torch.empty(shape, dtype=dtype, device=device)
                launch([get(r) if r[0] != "view" else _view(env, r) for r in ins], [env[o[0]] for o in outs])
            elif kind == "alloc":
                env[step[1]] = torch.empty(step[2], dtype=step[3], device=device)
            else:  # a library call
                from ..ops.library import run_library
                lib, ins, outs = step[1], step[2], step[3]
                results = run_library(lib, runtime.backend_for(device), [_view(env, r) if r[0] == "view" else get(r)
                                                                         for r in ins])
                env.update(zip(outs, results))
        results = [Array(ir.source(_view(env, r) if r[0] == "view" else env[r])) for r in self.out_refs]
        return tuple(results) if self.as_tuple else results[0]


def _view(env, ref):
    t = env[ref[1]] if ref[1][0] != "view" else _view(env, ref[1])
    for op in ref[2]:
        t = runtime._torch_movement(t, op)
    return t
