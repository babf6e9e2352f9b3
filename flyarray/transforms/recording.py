"""Whether a transform is recording a function on this thread: the one flag fa.jit reads on every call
(a jitted function called while grad/jvp/vjp, vmap or an outer jit records is inlined, as in JAX)."""
from __future__ import annotations

import contextlib
import threading


class _Depth(threading.local):
    value = 0  # a class default: reading it costs no AttributeError (getattr(local, name, None) costs ~1 us)


depth = _Depth()  # how many transforms (grad/jvp/vjp, vmap, fa.jit traces) are recording on this thread


@contextlib.contextmanager
def recording():
    depth.value += 1
    try:
        yield
    finally:
        depth.value -= 1


def check_callable(fun, where: str):
    """Every transform's first check: ``fun`` is callable, refused when the transform is made (fa.grad(42)),
    not at its first call."""
    if not callable(fun):
        raise TypeError(f"{where}: expected a function, got {type(fun).__name__} {fun!r:.60}")
