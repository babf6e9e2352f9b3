"""Compile, cache and launch: the last stage of an evaluation.

``kernel_launcher`` turns one generated kernel into a launch function for the
backend that owns the data's device (plan.py calls it once per plan, and the
plan calls the launch on every evaluation). Generated kernels are cached
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
import weakref

import numpy as np
import torch

from . import codegen, config, diskcache, ir, precompile, unsigned, views
from .kernel_ir import Kernel
from .kernels._triton import launch_hooks_set

BACKENDS = ("gpu", "interpret", "reference")
_stats = collections.Counter()
_memory = {}  # (key, backend) -> launchable kernel
_backend_override = None

# Objects whose ``.lock`` a forked child must find free (a jit function's traces, a trace, a CUDA graph): the child
# has only the forking thread, so a lock another thread held at the fork would stay held for good.
_FORK_LOCKED = weakref.WeakValueDictionary()   # id -> owner (a jit function's traces are a dict: unhashable)


def free_after_fork(owner) -> None:
    """Reinitialize ``owner.lock`` in a forked child (module-level locks register themselves with
    ``os.register_at_fork``)."""
    _FORK_LOCKED[id(owner)] = owner


os.register_at_fork(after_in_child=lambda: [owner.lock._at_fork_reinit() for owner in list(_FORK_LOCKED.values())])


# ---- settings ------------------------------------------------------------------------------------
_default_device_override = None


def default_device_choice():
    """fa.set_default_device's choice (None: the backend's default), as fa.jit keys its traces on it."""
    return _default_device_override


def default_device() -> torch.device:
    """Where creation functions and Python-number arrays go when no device is named: fa.set_default_device's
    choice, else the CPU under the interpret backend, else the GPU when torch sees one, else the CPU."""
    if _default_device_override is not None:
        return _default_device_override
    if backend_name() == "interpret":
        return torch.device("cpu")
    return canonical_device(torch.device("cuda")) if torch.cuda.is_available() else torch.device("cpu")


def canonical_device(device: torch.device) -> torch.device:
    """``cuda`` as the current device it means, ``cuda:0``: the name a tensor's device has, so an array made
    on "cuda" and one from a tensor are on one device (torch.device("cuda") != torch.device("cuda:0"))."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.type in ("meta", "cpu") and device.index is not None:   # one meta device, one CPU: torch's tensors
        return torch.device(device.type)                                # made on 'cpu:0' or 'meta:1' say 'cpu', 'meta'
    return device


def set_default_device(device):
    """Choose where arrays made without a device go, for this process (None: back to the default). Arrays
    converted from numpy stay on the CPU and tensors stay where they are, whatever this says."""
    global _default_device_override
    if device is None:
        _default_device_override = None
        return
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"set_default_device: {device!r} is not a device ({exc})") from None
    if chosen.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"set_default_device: flyarray computes on 'cpu' and 'cuda' (and records on 'meta'), "
                         f"not {chosen.type!r}")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"set_default_device: {device!r}, but torch sees no GPU here")
    if chosen.type == "cuda" and chosen.index is not None and chosen.index >= torch.cuda.device_count():
        raise ValueError(f"set_default_device: {device!r}, but torch sees {torch.cuda.device_count()} GPU(s) "
                         f"here (cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    _default_device_override = canonical_device(chosen)


_env_backend = None


def backend_name() -> str:
    """fa.set_backend's choice, else FLYARRAY_BACKEND (read once, when the process first needs a backend: its
    first array made without a device, or its first evaluation), else ''."""
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
    _backend_of.clear()


def backend_for(device: torch.device) -> str:
    found = _backend_of.get(device)
    if found is None:
        found = _backend_of[device] = _choose_backend(device)
    return found


_backend_of: dict = {}  # device -> backend, for the current choice (set_backend empties it)


def _choose_backend(device: torch.device) -> str:
    name = backend_name()
    chosen = f"fa.set_backend({name!r})" if _backend_override else f"FLYARRAY_BACKEND={name}"
    if device.type == "cpu":
        if name == "gpu":
            raise RuntimeError(f"{chosen}, but the data lives on the CPU; move it with fa.asarray(x, device='cuda')")
        return name or "reference"
    if device.type == "meta":
        no_values_on_meta()
    if name == "interpret":
        raise RuntimeError(f"{chosen} runs on the CPU, but the data lives on {device}")
    return name or "gpu"


def no_values_on_meta():
    raise RuntimeError("arrays on the 'meta' device have shapes and dtypes but no values, so they can be "
                       "recorded (a dry run) but not evaluated, converted or exported")


# ---- stats ------------------------------------------------------------------------------------------
def stats() -> dict:
    """Counters since the last reset: kernels_compiled, kernels_launched, cache_hits, disk_cache_hits,
    library_calls, evaluations, plan_hits, plan_misses, graph_replays (CUDA/HIP graphs), ..."""
    keys = ("kernels_compiled", "kernels_launched", "cache_hits", "disk_cache_hits", "library_calls", "evaluations",
            "plan_hits", "plan_misses", "graph_replays")
    out = {k: _stats.get(k, 0) for k in keys}
    out.update({k: v for k, v in _stats.items() if k not in out})
    return out


def reset_stats():
    """Zero the counters that ``fa.stats()`` reports (kernels compiled and launched, cache hits, ...)."""
    _stats.clear()


def _log(level: int, message: str):
    if config.log_level() >= level:
        print(f"[flyarray] {message}", file=sys.stderr)


# ---- launching one generated kernel ---------------------------------------------------------------
def kernel_launcher(kernel: Kernel, spec: codegen.LaunchSpec, backend: str, device: torch.device,
                    input_views=None, output_shapes=None):
    """``launch(inputs, outputs, scalars)`` for one generated kernel on ``backend``.

    On the gpu the first launch goes through Triton's JIT (which compiles, or loads its binary
    cache) and returns the ``CompiledKernel``; every later launch calls its launcher directly with
    the prebuilt grid and argument tail, skipping the JIT's per-call binding and specialization.
    The plan's key guarantees that later launches specialize exactly as the first one did.
    The reference launch also takes None for an output it should produce, and returns the outputs.
    """
    if backend == "reference":
        from .backends.reference import compile_kernel
        run_kernel = compile_kernel(kernel, input_views, output_shapes, device)

        def launch_reference(inputs, outputs, scalars):
            _stats["kernels_launched"] += 1
            return run_kernel(inputs, outputs, scalars)
        return launch_reference
    if spec.empty:
        def launch_nothing(inputs, outputs, scalars):
            _stats["kernels_launched"] += 1
        return launch_nothing
    fn = _compiled(spec, backend)
    if backend == "gpu":
        return _DirectLaunch(fn, kernel, spec, device)
    jit_launch = fn[spec.grid]
    args, warps, constexprs = spec.args, spec.num_warps, spec.constexprs

    def launch_interpreted(inputs, outputs, scalars):
        _stats["kernels_launched"] += 1
        # the interpreter computes every lane of a block with numpy, the masked-off padding too (0 / 0 there):
        # its floating-point warnings are noise, as a GPU raises none
        with np.errstate(all="ignore"):
            jit_launch(*inputs, *outputs, *args, *_scalar_args(kernel, scalars), num_warps=warps, **constexprs)
        if _check:
            _check_against_reference(kernel, inputs, outputs, scalars)
    return launch_interpreted


def reference_step(kernel: Kernel, input_views, output_shapes, ins, outs, made, scalar_slots, device):
    """A reference-backend kernel as a plan step ``step(slots, scalars)`` that reads and fills the plan's
    slots itself (backends/reference.py, ``compile_step``); counts its launches as ``kernel_launcher``'s."""
    from .backends.reference import compile_step
    return compile_step(kernel, input_views, output_shapes, ins, outs, made, scalar_slots, _stats, device)


def _scalar_args(kernel, scalars) -> list:
    return [codegen.scalar_arg(v, d) for v, d in zip(scalars, kernel.scalar_dtypes)]


class _DirectLaunch:
    """A generated kernel on a CUDA/ROCm device: JIT once, then the compiled kernel's own launcher."""

    def __init__(self, fn, kernel, spec, device):
        self.fn = fn
        self.jit = fn[spec.grid]
        self.kernel = kernel
        self.spec = spec
        self.grid = tuple(spec.grid) + (1,) * (3 - len(spec.grid))
        self.constexpr_values = tuple(spec.constexprs.values())  # the last parameters, in this order
        self.device_index = device.index if device.index is not None else torch.cuda.current_device()
        self.compiled = None
        self.ahead = None  # the warm-up's FutureKernel while the pool compiles it (precompile.py)
        self.last = ((), ())  # (scalars, their kernel arguments): an fa.jit replay passes the same objects again

    def __call__(self, inputs, outputs, scalars):
        _stats["kernels_launched"] += 1
        spec = self.spec
        tail = ()
        if scalars:  # the converted arguments of the last call, when these are the very same objects
            last, last_tail = self.last  # one attribute: another thread replaces the pair, never half of it
            if len(last) == len(scalars) and all(a is b for a, b in zip(last, scalars)):
                tail = last_tail
            else:
                tail = _scalar_args(self.kernel, scalars)
                self.last = (tuple(scalars), tail)
        compiled = self.compiled
        if compiled is None or launch_hooks_set():
            ahead, self.ahead = self.ahead, None
            if ahead is not None:  # its warm-up's compile, in the pool: wait for it rather than compile it twice
                ahead.result(ignore_errors=True)
            with diskcache.triton_cache_scope():  # the JIT may compile: its binaries go to our private cache
                compiled = self.jit(*inputs, *outputs, *spec.args, *tail, num_warps=spec.num_warps,
                                    **spec.constexprs)
            compiled = precompile.compiled_kernel(compiled)
            if self.compiled is None and hasattr(compiled, "packed_metadata"):
                compiled.run  # noqa: B018  (loads the binary and its launcher now, not on the hot path)
                self.compiled = compiled
        else:
            g0, g1, g2 = self.grid
            compiled.run(g0, g1, g2, _raw_stream(self.device_index), compiled.function, compiled.packed_metadata,
                         None, None, None, *inputs, *outputs, *spec.args, *tail, *self.constexpr_values)
        if _check:
            _check_against_reference(self.kernel, inputs, outputs, scalars)

    def warm_up(self, inputs, outputs, scalars):
        """Compile for these arguments (tensors, or dtypes for buffers not made yet) without launching:
        under precompile's AsyncCompileMode, in the background."""
        spec = self.spec
        compiled = self.fn.warmup(*inputs, *outputs, *spec.args, *_scalar_args(self.kernel, scalars), grid=spec.grid,
                                  num_warps=spec.num_warps, **spec.constexprs)
        if hasattr(compiled, "future"):  # Triton's FutureKernel: still compiling
            self.ahead = compiled


def _raw_stream(device_index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device_index)


_check = config.check_mode()


def refresh_settings():
    """Re-read the environment switches that launches consult (tests flip them)."""
    global _check
    _check = config.check_mode()


def _check_against_reference(kernel, inputs, outputs, scalars):
    from .backends.reference import run_kernel
    expected = [torch.empty_like(o) for o in outputs]
    for o, e in zip(outputs, expected):
        e.copy_(o)  # untouched elements (concat slices) compare equal
    run_kernel(kernel, inputs, expected, scalars)
    narrowest = _narrowest_float_bytes(kernel)
    for got, want in zip(outputs, expected):
        if got.dtype.is_floating_point:
            # the tolerance of the least precise float the kernel computes with: a float16 intermediate
            # is kept in float32 by the kernel (docs/semantics.md) and rounded by the reference, so a
            # float32 output of tanh(float16) + float32 differs by float16's rounding, not float32's
            narrow = min(got.element_size(), narrowest) < 4
            ok = torch.allclose(got.double(), want.double(), rtol=1e-2 if narrow else 1e-4,
                                atol=1e-3 if narrow else 1e-5, equal_nan=True)
        else:  # bit for bit (the signed view: torch's kernels for uint16/32/64 vary by device)
            ok = torch.equal(unsigned.signed_view(got), unsigned.signed_view(want))
        if not ok:
            raise AssertionError(f"FLYARRAY_CHECK: a fused kernel disagrees with the reference backend "
                                 f"(output {tuple(got.shape)} {got.dtype})")


def _narrowest_float_bytes(kernel) -> int:
    """The size of the narrowest float dtype among the kernel's loads, intermediates and stores (8 if none)."""
    sizes = [op.dtype.torch.itemsize for op in (*kernel.ops, *kernel.stores)
             if getattr(op, "dtype", None) is not None and op.dtype.kind == "f"]
    return min(sizes, default=8)


def synchronize(device: torch.device):
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


# ---- compile caches -----------------------------------------------------------------------------------
def _compiled(plan: codegen.LaunchSpec, backend: str):
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
    if node.prim is not ir.VIEW:
        return node.buffer
    return apply_movement(node.inputs[0].buffer, node.params)


def apply_movement(t: torch.Tensor, ops) -> torch.Tensor:
    for op in ops:
        t = _torch_movement(t, op)
    return t


class Movement:
    """``apply_movement(t, ops)`` for one plan step's input, remembered per input layout: a chain of views
    (reshape, permute, expand, slice) lands on a fixed (shape, strides, offset from t's) for a given layout
    of ``t``, so later calls make that view with one ``as_strided`` instead of a torch call per op (each
    costs microseconds of host time). Chains that copy (a flip, a reshape torch cannot view) always run op
    by op."""
    __slots__ = ("ops", "views")

    def __init__(self, ops):
        self.ops, self.views = ops, {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        key = (t.shape, t.stride())
        found = self.views.get(key)
        if found is not None:
            size, stride, delta = found
            return t.as_strided(size, stride, t.storage_offset() + delta)
        out = apply_movement(t, self.ops)
        if len(self.views) < 16:
            same = out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() and out.dtype == t.dtype
            if same and not any(op[0] == "flip" for op in self.ops):
                self.views[key] = (tuple(out.shape), out.stride(), out.storage_offset() - t.storage_offset())
        return out


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
        return t.as_strided(shape, views.stepped_strides(t.stride(), steps, shape), offset)
    if kind == "flip":
        # torch has no negative strides: this one copies (uint16/32/64, float8 through an integer view: no flip kernel)
        return unsigned.from_bits(unsigned.bits_view(t).flip(op[1]), t.dtype)
    raise ValueError(kind)
