"""The array API's elementwise functions, one per primitive in primitives.ELEMENTWISE."""
from __future__ import annotations

from .. import dtypes as dt
from ..primitives import ELEMENTWISE
from .core import astype, elementwise, where  # noqa: F401  (re-exported)


def _make(name, arity):
    if arity == 1:
        def fn(x, /):
            return elementwise(name, x)
    else:
        def fn(x1, x2, /):
            return elementwise(name, x1, x2)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name} (array API), recorded lazily; fuses with its neighbours."
    return fn


for _name, _prim in ELEMENTWISE.items():
    if _name not in ("where", "astype", "gelu"):
        globals()[_name] = _make(_name, _prim.arity)


def clip(x, /, min=None, max=None):
    """Clamp to [min, max]; NaN stays NaN (as numpy)."""
    out = x
    if min is not None:
        out = where(out < min, min, out) if not _is_array(min) else elementwise("maximum", out, min)
    if max is not None:
        out = where(out > max, max, out) if not _is_array(max) else elementwise("minimum", out, max)
    return astype(out, x.dtype, copy=False)


def _is_array(v):
    from .._array import Array
    return isinstance(v, Array)


def conj(x, /):
    return x


def real(x, /):
    return x


def relu(x, /):
    return elementwise("relu", x)


def silu(x, /):
    return elementwise("silu", x)


def gelu(x, /, approximate=False):
    return elementwise("gelu_tanh" if approximate else "gelu", x)


def isclose(a, b, rtol=1e-5, atol=1e-8):
    return elementwise("less_equal", elementwise("abs", a - b), atol + rtol * elementwise("abs", b))


__all__ = [n for n in ELEMENTWISE if n not in ("astype", "gelu_tanh")] + ["clip", "conj", "real", "isclose",
                                                                           "astype"]
del dt
