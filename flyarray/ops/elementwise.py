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
    if _name not in ("where", "astype"):
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
    return where(x > 0, x, 0)


def silu(x, /):
    return x * elementwise("sigmoid", x)


def gelu(x, /, approximate=False):
    if approximate:
        return 0.5 * x * (1.0 + elementwise("tanh", 0.7978845608028654 * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + elementwise("erf", x * 0.7071067811865476))


def isclose(a, b, rtol=1e-5, atol=1e-8):
    return elementwise("less_equal", elementwise("abs", a - b), atol + rtol * elementwise("abs", b))


__all__ = [n for n in ELEMENTWISE if n not in ("astype",)] + ["clip", "conj", "real", "relu", "silu", "gelu",
                                                               "isclose", "astype"]
del dt
