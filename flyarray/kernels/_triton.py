"""What every hand-written kernel needs to launch: the right runner and its arch's config.

A kernel is decorated with ``@triton.jit`` at import time, so Triton has
already decided to compile it. Tensors on the CPU can only run through Triton's
interpreter, so ``runner`` wraps the plain Python function of the kernel in an
``InterpretedFunction`` when the tensors live on the CPU (DESIGN.md: the
``interpret`` backend).
"""
from __future__ import annotations

import types

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


_INTERPRETED: dict = {}


def _interpreted(kernel) -> InterpretedFunction:
    # Keyed by identity: hashing a JITFunction walks its dependencies (slow, and fragile mid-interpretation).
    found = _INTERPRETED.get(id(kernel))
    if found is None or found[0] is not kernel:
        found = _INTERPRETED[id(kernel)] = (kernel, InterpretedFunction(_with_interpreted_globals(kernel.fn, {})))
    return found[1]


def _with_interpreted_globals(fn, memo: dict):
    """``fn`` re-bound to a copy of its globals where every @triton.jit helper is interpreted too.

    The interpreter only rewrites the kernel it is handed; a nested @triton.jit
    call (ours, or one of triton.language's own such as tl.sigmoid or tl.sort)
    would otherwise refuse to run outside a compiled kernel. Copying the globals
    (rather than patching modules) keeps the compiled path intact.
    """
    if fn in memo:
        return memo[fn]
    env = dict(fn.__globals__)
    clone = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__ = fn.__kwdefaults__
    memo[fn] = clone
    for name, value in list(env.items()):
        if isinstance(value, triton.runtime.JITFunction) and not _is_builtin_combine(name, value):
            env[name] = InterpretedFunction(_with_interpreted_globals(value.fn, memo))
        elif value is tl:
            env[name] = _InterpretedLanguage(memo)
    env["_flyarray_real_tl"] = tl  # the interpreter looks for triton.language among the globals
    return clone


def _is_builtin_combine(name, jit_fn) -> bool:
    """triton.language's private combine functions stay as they are: the interpreter recognizes
    them by identity (tl.reduce with _sum_combine becomes one numpy sum)."""
    return name.startswith("_") and jit_fn.fn.__module__.startswith("triton.language")


class _InterpretedLanguage(types.ModuleType):
    """triton.language as seen from interpreted code: its @jit functions come back interpreted.

    Attributes are looked up on every access, so the interpreter's patches to
    triton.language (made while a kernel runs) are seen.
    """

    def __init__(self, memo):
        super().__init__("triton.language")
        self._memo = memo

    def __getattr__(self, name):
        value = getattr(tl, name)
        if isinstance(value, triton.runtime.JITFunction):
            return InterpretedFunction(_with_interpreted_globals(value.fn, self._memo))
        return value


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
