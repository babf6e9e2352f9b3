"""What profilers see of a plan's steps: a label per step, and ranges around steps while one listens.

A plan labels each step when it is built (``fa::fused(exp,multiply,sum)``, ``fa::rms_norm+residual``),
so torch.profiler traces show which of the user's ops a kernel runs. Annotating costs a context
manager per step, so ``Plan.run`` asks ``enabled()`` first: off (one attribute read) unless
torch.profiler records or a listener (``fa.profile``) is registered.
"""
from __future__ import annotations

import contextlib

import torch.autograd.profiler as _torch_profiler
from torch.profiler import record_function

from .kernel_ir import Elementwise, Reduce

_listeners: list = []  # callables (label) -> context manager, e.g. fa.profile's timer


def enabled() -> bool:
    return bool(_listeners) or _torch_profiler._is_profiler_enabled


@contextlib.contextmanager
def step(label: str):
    with contextlib.ExitStack() as stack:
        if _torch_profiler._is_profiler_enabled:
            stack.enter_context(record_function(label))
        for listener in list(_listeners):
            stack.enter_context(listener(label))
        yield


def kernel_label(kernel) -> str:
    names = []
    for op in kernel.ops:
        if isinstance(op, (Elementwise, Reduce)) and op.prim not in names:
            names.append(op.prim)
    return f"fa::fused({','.join(names)})"


def library_label(name: str, kwargs: dict) -> str:
    """The op and the options that change what runs: flags set True, and string choices."""
    extras = [k if v is True else str(v) for k, v in sorted(kwargs.items())
              if v is True or (isinstance(v, str) and v)]
    return "+".join([f"fa::{name}", *extras])
