"""What every hand-written kernel needs to launch: the right runner and its arch's config.

A kernel is decorated with ``@triton.jit`` at import time, so Triton has
already decided to compile it. Tensors on the CPU can only run through Triton's
interpreter, so ``runner`` wraps the plain Python function of the kernel in an
``InterpretedFunction`` when the tensors live on the CPU (DESIGN.md: the
``interpret`` backend).
"""
from __future__ import annotations

import functools
import types

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction


@functools.lru_cache(maxsize=None)
def _interpreted(kernel) -> InterpretedFunction:
    return InterpretedFunction(_with_interpreted_globals(kernel.fn, {}))


def _with_interpreted_globals(fn, memo: dict):
    """``fn`` re-bound to a copy of its globals where every @triton.jit helper is interpreted too.

    The interpreter only rewrites the kernel it is handed; a nested @triton.jit
    call would otherwise refuse to run outside a compiled kernel. Copying the
    globals (rather than patching the module) keeps the compiled path intact.
    """
    if fn in memo:
        return memo[fn]
    env = dict(fn.__globals__)
    clone = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__ = fn.__kwdefaults__
    memo[fn] = clone
    for name, value in list(env.items()):
        if isinstance(value, triton.runtime.JITFunction):
            env[name] = InterpretedFunction(_with_interpreted_globals(value.fn, memo))
    return clone


def runner(kernel, device: torch.device):
    """The launchable form of ``kernel`` for tensors on ``device``."""
    if torch.device(device).type == "cpu":
        return _interpreted(kernel)
    return kernel


def current_arch(device: torch.device) -> str:
    """'sm_90', 'gfx950', 'gfx942', ... for a GPU device; 'cpu' for the interpreter."""
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu"
    props = torch.cuda.get_device_properties(device)
    arch = getattr(props, "gcnArchName", "") or ""
    if arch:  # ROCm reports e.g. 'gfx950:sramecc+:xnack-'
        return arch.split(":")[0]
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def pick_config(table: dict, arch: str) -> dict:
    """The tuned config for ``arch``: exact match, then its family, then 'default'."""
    if arch in table:
        return table[arch]
    family = "gfx9" if arch.startswith("gfx9") else arch[:4]
    for key, cfg in table.items():
        if key.startswith(family):
            return cfg
    return table["default"]


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))
