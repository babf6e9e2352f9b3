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

FLYARRAY_PRECOMPILE=0 turns it off.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading

import torch

from . import config
from .diskcache import triton_cache_scope

_pool = None
_pool_lock = threading.Lock()


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
    try:
        with device_context, AsyncCompileMode(_shared_pool(), ignore_errors=True):
            for job in jobs:
                try:
                    job()
                except Exception:  # noqa: BLE001  (the launch compiles this kernel itself, and raises if it must)
                    continue
    except Exception:  # noqa: BLE001  (a background nicety: never an error of its own)
        return


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
