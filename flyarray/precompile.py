"""A new plan's generated kernels, compiled side by side in the background.

A plan's first run compiles each generated kernel just before its launch (Triton's JIT), one after
another and between the library kernels' own compiles: the first call of a model spends seconds in
one thread (a Llama block's forward and backward: 9-18 s on the H100 host against torch.compile's
4-6 s). When a plan is built for a GPU, ``start`` hands the compiles of its generated kernels to a
thread pool through Triton's AsyncCompileMode and returns at once; the run goes on meanwhile. Triton
compiles outside the GIL for the most part, so the pool's compiles overlap each other and the run's.

A launch finds its kernel in the JIT's cache when the pool got there first; otherwise it compiles it
as before (on Triton 3.9 it waits for the pool's compile of the same key instead). The warm-up knows
the plan's leaves (the real tensors) and scalars; the buffers the plan makes are passed as their
dtypes (Triton's MockTensor: 16-byte aligned, as the allocator's are). A warm-up that specializes
differently from the real launch, or fails, costs only its background work: the launch compiles
for itself, and any error is the launch's to raise.

The library kernels (GEMMs, attention) are warmed up too: their host code decides which kernel and
specialization a call launches from its operands' shapes, strides, dtypes and alignment, so the
warm-up runs that code on fake tensors (no memory, no data) with ``_triton.warming_up`` set, under
which every launch compiles instead (``compile_ahead``). A launch that finds its specialization still
compiling in the pool waits for it (``await_ahead``) instead of compiling it a second time, as
Triton 3.9's JIT does by itself and 3.6's does not.

FLYARRAY_PRECOMPILE=0 turns it off.
"""
from __future__ import annotations

import concurrent.futures
import contextvars
import os
import sys
import threading

import torch

from . import config
from .diskcache import triton_cache_scope

_pool = None
_pool_lock = threading.Lock()
# (id(kernel), launch key) -> (kernel, Triton's FutureKernel): library compiles a warm-up started
_ahead: dict = {}


def _forget_the_parents_pool():
    """A forked child has none of the pool's threads: work sent to the parent's pool would never run, a compile it
    had started would never finish, and a lock another thread held at the fork would stay held."""
    global _pool
    _pool = None
    _ahead.clear()
    _pool_lock._at_fork_reinit()


os.register_at_fork(after_in_child=_forget_the_parents_pool)
# the keys of _ahead that the running warm-up added (each warm-up thread drops its own when done)
_started_here = contextvars.ContextVar("flyarray_precompile_started", default=None)


class _ScopedPool(concurrent.futures.ThreadPoolExecutor):
    """A thread pool whose tasks run inside ``triton_cache_scope`` (compiles land in our private cache
    directory, whichever thread entered the scope first)."""

    def submit(self, fn, /, *args, **kwargs):
        def scoped():
            with triton_cache_scope():
                return fn(*args, **kwargs)
        return super().submit(scoped)


def _shared_pool() -> _ScopedPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = max(1, min(8, (os.cpu_count() or 2) - 1))
            _pool = _ScopedPool(max_workers=workers, thread_name_prefix="flyarray-compile")
        return _pool


def start(jobs: list, device: torch.device) -> threading.Thread | None:
    """Run ``jobs`` (callables that each warm one kernel up: ``JITFunction.warmup``) in a background
    thread under Triton's AsyncCompileMode on the shared pool; returns that thread (None: nothing to do)."""
    if not jobs or not config.precompile() or device.type != "cuda":
        return None
    thread = threading.Thread(target=warm_up, args=(jobs, torch.cuda.device(device)), name="flyarray-precompile")
    thread.start()
    return thread


def warm_up(jobs: list, device_context):
    """Run the warm-up ``jobs`` under ``device_context`` (the device Triton's JIT asks for) and Triton's
    AsyncCompileMode on the shared pool; returns once every compile is done. Never raises."""
    from triton.runtime._async_compile import AsyncCompileMode
    started = []
    token = _started_here.set(started)
    try:
        with device_context, AsyncCompileMode(_shared_pool(), ignore_errors=True):
            for job in jobs:
                try:
                    job()
                except Exception:  # noqa: BLE001  (the launch compiles this kernel itself, and raises if it must)
                    continue
    except Exception:  # noqa: BLE001  (a background nicety: never an error of its own)
        return
    finally:
        _started_here.reset(token)
        for key in started:  # finished (the mode's exit waited): Triton's JIT cache holds them now
            _ahead.pop(key, None)


# A library call family (op name and keyword arguments) -> how many of its dry runs in a row found every
# kernel compiled already. A plan rebuilt per size (a decode loop, dynamic shapes) would otherwise dry-run
# its calls on every step, long after their specializations are all compiled.
_fruitless: dict = {}
FRUITLESS_LIMIT = 3


def can_dry_run(family=None) -> bool:
    """Whether a new plan dry-runs a library call of ``family``: FakeTensorMode's first use imports
    torch._dynamo (3.4 s of Python on a 2-core CPU, contending with the first call for the GIL), so only in
    a process that has imported it already (every torch.compile user has); and not a family whose last
    FRUITLESS_LIMIT dry runs compiled nothing."""
    return (config.precompile() and "torch._dynamo" in sys.modules
            and _fruitless.get(family, 0) < FRUITLESS_LIMIT)


def dry_run(call, family=None):
    """``call(mode)``: a library op on tensors it makes inside (fakes: ``mode`` is the FakeTensorMode,
    whose ``from_tensor`` fakes a real one), run with ``_triton.warming_up`` set: its launches become
    ``compile_ahead``s. Counts, per ``family``, the dry runs in a row that had nothing to compile."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .kernels._triton import warming_up
    started = _started_here.get()
    before = len(started) if started is not None else None
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, warming_up():
        call(mode)
    if before is not None:
        _fruitless[family] = 0 if len(started) > before else _fruitless.get(family, 0) + 1


def compile_ahead(kernel, key, args: tuple, kwargs: dict):
    """Compile ``kernel`` for these arguments (tensors replaced by ``_triton.StandIn``) without launching:
    under warm_up's AsyncCompileMode, in the pool. ``key``: DirectLaunch's specialization key, under
    which the launch looks for it (``await_ahead``); None for arguments it does not key."""
    with triton_cache_scope():
        compiled = kernel.warmup(*args, grid=(1,), **kwargs)
    started = _started_here.get()
    if key is not None and hasattr(compiled, "future") and started is not None:
        _ahead[(id(kernel), key)] = (kernel, compiled)
        started.append((id(kernel), key))
    return compiled


def await_ahead(kernel, key):
    """Before a launch compiles ``kernel`` for ``key`` itself: wait for a warm-up's compile of it, if one
    is in the pool (then Triton's JIT finds it)."""
    entry = _ahead.pop((id(kernel), key), None)
    if entry is not None:
        entry[1].result(ignore_errors=True)


def compiled_kernel(kernel):
    """The CompiledKernel behind what Triton's JIT returned: Triton 3.9 hands back the pool's
    FutureKernel while (or after) the pool compiles it; ``result()`` waits for it."""
    result = getattr(kernel, "result", None)
    return result() if callable(result) and hasattr(kernel, "future") else kernel


def has_compiled(fn) -> bool:
    """Whether Triton's JIT holds a compiled kernel of ``fn`` already (a plan rebuilt for new shapes
    mostly reuses its kernels: no background thread for those)."""
    try:
        return any(caches[0] for caches in fn.device_caches.values())
    except (AttributeError, TypeError, IndexError):
        return False
