"""Compile, cache and launch: the last stage of an evaluation.

``realize`` schedules the graph under the requested arrays, then runs each
step on the backend that owns the data's device. Generated kernels are cached
in memory by structural key and on disk as plain Python source under
``config.cache_dir()/kernels`` (flyarray/diskcache.py: private directories,
read once and verified by hash, compiled from the verified text; anything else
is rebuilt with a warning, never trusted). Triton's own binary cache lives
beside it, so a second process neither generates nor compiles a kernel it has seen.
"""
from __future__ import annotations

import collections
import os
import sys
import threading

import torch

from . import codegen, config, diskcache, ir
from .schedule import Allocate, Kernel, LibraryCall, schedule

BACKENDS = ("gpu", "interpret", "reference")
_stats = collections.Counter()
_memory = {}  # (key, backend) -> launchable kernel
_lock = threading.RLock()
_backend_override = None


# ---- settings ------------------------------------------------------------------------------------
def default_device() -> torch.device:
    if backend_name() == "interpret":
        return torch.device("cpu")
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


_env_backend = None


def backend_name() -> str:
    """fa.set_backend's choice, else FLYARRAY_BACKEND (read once, at the first evaluation), else ''."""
    global _env_backend
    if _backend_override:
        return _backend_override
    if _env_backend is None:
        name = os.environ.get("FLYARRAY_BACKEND", "").strip().lower()
        if name and name not in BACKENDS:
            raise ValueError(f"FLYARRAY_BACKEND={name!r}; choose one of {', '.join(BACKENDS)}")
        _env_backend = name
    return _env_backend


def set_backend(name):
    """Choose the backend for this process (None: back to FLYARRAY_BACKEND / the default)."""
    global _backend_override
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    _backend_override = name


def backend_for(device: torch.device) -> str:
    name = backend_name()
    if device.type == "cpu":
        if name == "gpu":
            raise RuntimeError("FLYARRAY_BACKEND=gpu, but the data lives on the CPU; move it with fa.asarray(x, device='cuda')")
        return name or "reference"
    if name == "interpret":
        raise RuntimeError(f"FLYARRAY_BACKEND=interpret runs on the CPU, but the data lives on {device}")
    return name or "gpu"


# ---- stats ------------------------------------------------------------------------------------------
def stats() -> dict:
    """Counters since the last reset: kernels_compiled, kernels_launched, cache_hits, disk_cache_hits, ..."""
    keys = ("kernels_compiled", "kernels_launched", "cache_hits", "disk_cache_hits", "library_calls", "evaluations")
    out = {k: _stats.get(k, 0) for k in keys}
    out.update({k: v for k, v in _stats.items() if k not in out})
    return out


def reset_stats():
    _stats.clear()


def _log(level: int, message: str):
    if config.log_level() >= level:
        print(f"[flyarray] {message}", file=sys.stderr)


# ---- evaluation ---------------------------------------------------------------------------------------
def realize(arrays, observer=None):
    """Compute every array's value (once); afterwards its node holds a buffer.

    ``observer(step, launch)`` sees each step as it runs (transforms/jit.py records them).
    """
    roots = unrealized_bases(arrays)
    if not roots:
        return
    with _lock:
        _stats["evaluations"] += 1
        for step in schedule(roots):
            launch = _execute(step)
            if observer is not None:
                observer(step, launch)
        for node in ir.toposort(roots):
            if node.realized:
                node.inputs = ()  # free the graph above a value we now hold


def unrealized_bases(arrays) -> list:
    """The nodes that hold the arrays' values (a view's base), where not computed yet."""
    roots = []
    for a in arrays:
        node = a._node
        base = node.inputs[0] if node.kind == "view" else node
        if not base.realized:
            roots.append(base)
    return roots


def _execute(step):
    """Run one step; for a kernel, return ``launch(inputs, outputs)`` that runs it again on other buffers."""
    if isinstance(step, Allocate):
        step.node.buffer = torch.empty(step.node.shape, dtype=step.node.dtype.torch, device=step.node.device)
    elif isinstance(step, LibraryCall):
        _run_library(step.node)
    else:
        return _run_kernel(step)


def _run_library(node):
    from .ops.library import run_library
    _stats["library_calls"] += 1
    _stats["kernels_launched"] += 1
    backend = backend_for(node.device)
    tensors = [tensor_of(i) for i in node.inputs]
    results = run_library(node, backend, tensors)
    for child, value in zip(node.params["outputs"], results):
        child.buffer = value
    _log(1, f"library {node.prim.name} on {backend}")


def _run_kernel(kernel: Kernel):
    device = kernel.stores[0].target.device
    backend = backend_for(device)
    inputs = [n.buffer for n in kernel.inputs]
    outputs = []
    for st in kernel.stores:
        if st.target.buffer is None:
            st.target.buffer = torch.empty(st.target.shape, dtype=st.target.dtype.torch, device=device)
        outputs.append(st.target.buffer)
    launch = _launcher(kernel, backend)
    launch(inputs, outputs)
    return launch


def _launcher(kernel: Kernel, backend: str):
    if backend == "reference":
        from .backends.reference import run_kernel

        def launch_reference(inputs, outputs):
            _stats["kernels_launched"] += 1
            run_kernel(kernel, inputs, outputs)
        return launch_reference
    plan = codegen.plan(kernel)
    fn = _compiled(plan, backend)
    grid, args, warps, constexprs = plan.grid, plan.args, plan.num_warps, plan.constexprs
    check = config.check_mode()
    verbose = config.log_level() >= 1  # read once: this closure is the hot path of fa.jit replays
    launcher = None if plan.empty else fn[grid]

    def launch(inputs, outputs):
        _stats["kernels_launched"] += 1
        if verbose:
            _log(1, f"launch {plan.key[:12]} on {backend} grid={grid} {constexprs}")
        if launcher is not None:
            launcher(*inputs, *outputs, *args, num_warps=warps, **constexprs)
        if check:
            _check_against_reference(kernel, inputs, outputs)
    return launch


def _check_against_reference(kernel, inputs, outputs):
    from .backends.reference import run_kernel
    expected = [torch.empty_like(o) for o in outputs]
    for o, e in zip(outputs, expected):
        e.copy_(o)  # untouched elements (concat slices) compare equal
    run_kernel(kernel, inputs, expected)
    for got, want in zip(outputs, expected):
        if got.dtype.is_floating_point:
            ok = torch.allclose(got.double(), want.double(), rtol=1e-2 if got.element_size() < 4 else 1e-4,
                                atol=1e-3 if got.element_size() < 4 else 1e-5, equal_nan=True)
        else:
            ok = torch.equal(got, want)
        if not ok:
            raise AssertionError(f"FLYARRAY_CHECK: a fused kernel disagrees with the reference backend "
                                 f"(output {tuple(got.shape)} {got.dtype})")


def synchronize(device: torch.device):
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


# ---- compile caches -----------------------------------------------------------------------------------
def _compiled(plan: codegen.Plan, backend: str):
    key = (plan.key, backend)
    fn = _memory.get(key)
    if fn is not None:
        _stats["cache_hits"] += 1
        return fn
    source, reason = diskcache.read_source("kernels", plan.key)
    if source is not None:
        _stats["disk_cache_hits"] += 1
        _log(1, f"disk cache hit {plan.key[:12]}")
    else:
        diskcache.write_source("kernels", plan.key, plan.source)
        source = plan.source  # what we generated, not what we wrote: the disk is not read back
        _stats["kernels_compiled"] += 1
        _log(1, f"compile {plan.key[:12]} ({reason})")
        _log(2, plan.source)
    fn = _load(source, plan.key, backend)
    _memory[key] = fn
    return fn


def _load(source: str, key: str, backend: str):
    module = diskcache.load_module(source, f"flyarray_kernel_{key}_{backend}")
    if backend == "interpret":
        from .backends.interpret import InterpreterMath
        from .kernels._triton import runner
        module.ext = InterpreterMath
        return runner(module.kernel, "cpu")
    from .backends.gpu import EXTERN_MATH
    module.ext = EXTERN_MATH
    return module.kernel


# ---- values ----------------------------------------------------------------------------------------------
def tensor_of(node: ir.Node) -> torch.Tensor:
    """The torch tensor for a realized node; views become torch views of the base buffer."""
    if node.kind != "view":
        return node.buffer
    t = node.inputs[0].buffer
    for op in node.params:
        t = _torch_movement(t, op)
    return t


def _torch_movement(t: torch.Tensor, op) -> torch.Tensor:
    kind = op[0]
    if kind == "reshape":
        return t.reshape(op[1])
    if kind == "permute":
        return t.permute(op[1])
    if kind == "expand":
        return t.expand(op[1])
    if kind == "slice":
        _, starts, steps, shape = op
        offset = t.storage_offset() + sum(s * st for s, st in zip(starts, t.stride()))
        return t.as_strided(shape, [st * step for st, step in zip(t.stride(), steps)], offset)
    if kind == "flip":
        return t.flip(op[1])  # torch has no negative strides: this one copies
    raise ValueError(kind)
