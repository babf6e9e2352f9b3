"""The array API's elementwise functions, one per primitive in primitives.ELEMENTWISE."""
from __future__ import annotations

import math
import sys

import numpy as np

from .. import dtypes as dt
from .._array import Array
from ..primitives import ELEMENTWISE
from .core import array_arg, astype, binary, elementwise, unary, where  # noqa: F401  (re-exported)


# name -> what it computes (one line). The dtype sentence comes from the primitive's ``accepts``/``out``.
_MEANING = {
    "exp": "e**x", "exp2": "2**x", "expm1": "exp(x) - 1, accurate near 0", "log": "Natural logarithm",
    "log2": "Base-2 logarithm", "log10": "Base-10 logarithm", "log1p": "log(1 + x), accurate near 0",
    "sqrt": "Square root", "rsqrt": "1 / sqrt(x) (not in numpy)", "sin": "Sine (radians)", "cos": "Cosine (radians)",
    "tan": "Tangent (radians)", "asin": "Inverse sine", "acos": "Inverse cosine", "atan": "Inverse tangent",
    "sinh": "Hyperbolic sine", "cosh": "Hyperbolic cosine", "tanh": "Hyperbolic tangent",
    "asinh": "Inverse hyperbolic sine", "acosh": "Inverse hyperbolic cosine", "atanh": "Inverse hyperbolic tangent",
    "erf": "the error function (as scipy.special.erf; not in numpy)",
    "erfc": "1 - erf(x), without the cancellation where erf(x) is near 1 (as scipy.special.erfc; not in numpy)", "sigmoid": "The logistic 1 / (1 + exp(-x))",
    "relu": "max(x, 0)", "silu": "x * sigmoid(x)", "negative": "-x", "positive": "+x (a copy)", "abs": "|x|",
    "square": "x * x", "sign": "-1, 0 or 1 by the sign of x; NaN stays NaN", "floor": "Round toward -inf",
    "ceil": "Round toward +inf", "trunc": "Round toward 0",
    "round": "Round half to even; no ``decimals`` argument (numpy has one)", "reciprocal": "1 / x",
    "bitwise_invert": "Bitwise NOT (~x); logical NOT on bool", "logical_not": "x == 0",
    "isnan": "Whether x is NaN", "isinf": "Whether x is +-inf", "isfinite": "Whether x is neither inf nor NaN",
    "signbit": "Whether the sign bit is set (True for -0.0 and negative NaN)",
    "add": "x1 + x2 (logical or on bool)", "subtract": "x1 - x2", "multiply": "x1 * x2 (logical and on bool)",
    "divide": "True division x1 / x2", "floor_divide": "x1 // x2, rounding toward -inf (as numpy)",
    "remainder": "x1 % x2 with the sign of x2 (numpy's mod)",
    "pow": "x1 ** x2 (integers by repeated squaring, in the integer dtype)",
    "maximum": "The larger of x1 and x2; NaN propagates", "minimum": "The smaller of x1 and x2; NaN propagates",
    "atan2": "Angle of the point (x2, x1), in radians", "hypot": "sqrt(x1**2 + x2**2) without overflow",
    "copysign": "|x1| with the sign of x2", "nextafter": "The next representable value after x1 toward x2",
    "logaddexp": "log(exp(x1) + exp(x2)) without overflow", "equal": "x1 == x2", "not_equal": "x1 != x2",
    "less": "x1 < x2", "less_equal": "x1 <= x2", "greater": "x1 > x2", "greater_equal": "x1 >= x2",
    "logical_and": "x1 != 0 and x2 != 0", "logical_or": "x1 != 0 or x2 != 0",
    "logical_xor": "(x1 != 0) xor (x2 != 0)", "bitwise_and": "x1 & x2", "bitwise_or": "x1 | x2",
    "bitwise_xor": "x1 ^ x2", "bitwise_left_shift": "x1 << x2",
    "bitwise_right_shift": "x1 >> x2 (arithmetic for signed dtypes)",
}

# (accepts, out) -> the dtype sentence. Float8 (storage-only) inputs raise TypeError everywhere.
_FLOAT_RESULT = "the input's float dtype; bool/integer inputs compute in float32 (numpy: float64)"
_DTYPES = {
    ("numeric", "float"): "Bool, integer or float dtypes; returns " + _FLOAT_RESULT + ".",
    ("float", "same"): "Bool, integer or float dtypes; returns " + _FLOAT_RESULT + ".",
    ("numeric", "same"): "Integer and float dtypes (bool raises TypeError); returns the promoted input dtype.",
    ("numeric", "bool"): "Integer and float dtypes (bool raises TypeError); returns bool.",
    ("any", "same"): "Any dtype; returns the promoted input dtype.",
    ("any", "bool"): "Any dtype; returns bool.",
    ("int_bool", "same"): "Bool and integer dtypes; returns the promoted input dtype.",
    ("integer", "same"): "Integer dtypes; returns the promoted input dtype.",
}


def _doc(name, prim):
    args = "" if prim.arity == 1 else " Arrays and Python scalars broadcast and promote (``result_type``)."
    meaning = _MEANING.get(name, name)
    dtypes = _DTYPES.get((prim.accepts, prim.out), "")
    return f"Elementwise {name}: {meaning[0].lower() + meaning[1:]}.\n\n{dtypes}{args}"


def _make(name, arity):
    prim = ELEMENTWISE[name]
    if arity == 1:
        def fn(x, /):
            return unary(prim, x)
    elif arity == 2:
        def fn(x1, x2, /):
            return binary(prim, x1, x2)
    else:
        def fn(*args):
            return elementwise(name, *args)
    fn.__name__ = fn.__qualname__ = name
    # Python names a call's binding errors ("missing 1 required positional argument") by the code's qualified
    # name, which would be "_make.<locals>.fn"
    fn.__code__ = fn.__code__.replace(co_name=name, **({"co_qualname": name} if sys.version_info >= (3, 11) else {}))
    fn.__doc__ = _doc(name, prim)
    if arity == 2:
        fn.primitive = prim  # Array's operators record through core.binary directly (_array._recorder)
    return fn


for _name, _prim in ELEMENTWISE.items():
    if _name not in ("where", "astype", "gelu"):
        globals()[_name] = _make(_name, _prim.arity)


def clip(x, /, min=None, max=None):
    """Clamp to [min, max] (scalars or arrays; either may be None); NaN stays NaN (as numpy).

    The result is cast back to ``x``'s dtype (numpy promotes with the bounds' dtypes)."""
    x = array_arg(x, "clip: x")
    out = x
    for bound, name in ((min, "min"), (max, "max")):
        if isinstance(bound, (list, tuple)):   # (the comparison below would name `less`)
            raise TypeError(f"clip: {name} must be an array or a scalar, got a {type(bound).__name__}; "
                            "wrap it with fa.asarray")
        if isinstance(bound, float) and math.isnan(bound):
            # a comparison with NaN is False, so the scalar paths below would skip it; the array API's
            # result is NaN everywhere
            if x.dtype.kind not in "fc":
                raise TypeError(f"clip: {name} is NaN, which a {x.dtype} array cannot hold")
            return elementwise("add", x * 0, bound)
    # where, not maximum/minimum, for scalar and array bounds alike: at a bound, x keeps its gradient
    # (torch's clamp), whichever way the bound is given; a NaN in an array bound still gives NaN
    if min is not None:
        out = where(_past(out < min, min), min, out)
    if max is not None:
        out = where(_past(out > max, max), max, out)
    return astype(out, x.dtype, copy=False)


def _past(beyond, bound):
    return beyond | (bound != bound) if _is_array(bound) and bound.dtype.kind == "f" else beyond


def _is_array(v):
    from .._array import Array
    return isinstance(v, Array)


def isin(x1, x2, /, *, invert=False):
    """Whether each element of ``x1`` equals some element of ``x2`` (``not`` with ``invert``), as a bool array
    of ``x1``'s shape; any dtypes (they promote). A fused comparison and ``any`` over ``x2``'s elements. A Python
    scalar ``x2`` (or a list of Python ints) is weak, as in ``x1 == x2``, except that an int outside an integer
    ``x1``'s range matches nothing (as numpy's isin) rather than raising."""
    from .checks import check_bool
    from .creation import asarray, asarray_beside
    from .reductions import any as _any
    invert = check_bool("isin", "invert", invert)
    x1 = x1 if _is_array(x1) else asarray(x1)
    if isinstance(x2, (bool, int, float, complex)):   # a Python scalar is weak, as in x1 == x2 (2024.12)
        if type(x2) is int and _python_ints_dtype([x2], x1.dtype) is None and x1.dtype.kind in "iu":
            from .creation import full
            return full(x1.shape, bool(invert), dtype="bool", device=x1.device)   # out of range: no element is it
        hit = elementwise("equal", x1, x2)
        return elementwise("logical_not", hit) if invert else hit
    x2 = x2 if _is_array(x2) else asarray_beside(x2, x1.device, _python_ints_dtype(x2, x1.dtype))
    flat = x2.reshape((-1,))
    hit = _any(elementwise("equal", x1[..., None], flat), axis=-1)
    return elementwise("logical_not", hit) if invert else hit


def _python_ints_dtype(values, dtype):
    """``dtype`` for a list of Python ints that all fit it (weak, as a scalar would be: uint64 x1 with [5, 7]),
    else None (asarray's default)."""
    import numpy as np
    if dtype.kind not in "iu" or not isinstance(values, (list, tuple)) or not values \
            or not all(type(v) is int for v in values):
        return None
    info = np.iinfo(dtype.name)
    return dtype if all(info.min <= v <= info.max for v in values) else None


def _complex_part(prim, x):
    from .. import dtypes, ir
    from .._array import Array
    from .core import as_array, node_of
    node = node_of(as_array(x))
    d = dtypes.real_dtype(node.dtype) if prim.complex_real_result else node.dtype
    return Array(ir.Node(prim, (node,), None, node.shape, d, node.device))


def conj(x, /):
    """The complex conjugate (re - i im), in ``x``'s dtype; a real array is returned as is."""
    from ..complex_lowering import CONJ
    x = _operand(x, "conj")
    return _complex_part(CONJ, x) if x.dtype.kind == "c" else x


def real(x, /):
    """The real part: float32 for complex64, float64 for complex128; a real array is returned as is."""
    from ..complex_lowering import REAL
    x = _operand(x, "real")
    return _complex_part(REAL, x) if x.dtype.kind == "c" else x


def imag(x, /):
    """The imaginary part: float32 for complex64, float64 for complex128; zeros of ``x``'s dtype for a
    real array (as JAX; the array API defines imag for complex arrays only)."""
    from ..complex_lowering import IMAG
    x = _operand(x, "imag")
    if x.dtype.kind == "c":
        return _complex_part(IMAG, x)
    from .creation import zeros_like
    return zeros_like(x)


def complex_from_parts(re, im):
    """re + i im from two real float arrays of one dtype and shape (an internal building block: float32 parts
    give complex64, float64 parts complex128)."""
    from .. import dtypes, ir
    from .._array import Array
    from ..complex_lowering import COMPLEX
    a, b = re._node, im._node
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype not in (dtypes.float32, dtypes.float64):
        raise TypeError(f"complex parts must be float32 or float64 arrays of one dtype and shape, got "
                        f"{a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)}")
    return Array(ir.Node(COMPLEX, (a, b), None, a.shape, dtypes.complex_dtype(a.dtype), a.device))


def _operand(x, op):
    """``x`` as an array (a Python number, numpy or torch value converted); anything else a TypeError naming ``op``
    (a list or a str came back unchanged from real/conj)."""
    from .core import as_operand
    return array_arg(as_operand(x), f"{op}: x")


def relu(x, /):
    """max(x, 0) elementwise, in ``x``'s dtype; integer and float dtypes (bool raises TypeError).
    Fuses into a preceding matmul's epilogue. Not in numpy (jax.nn.relu)."""
    return elementwise("relu", x)


def silu(x, /):
    """x * sigmoid(x) elementwise; float dtypes keep theirs, bool/integer inputs give float32.
    Fuses into a preceding matmul's epilogue. Not in numpy (jax.nn.silu)."""
    return elementwise("silu", x)


def gelu(x, /, approximate=False):
    """GELU, x * Phi(x) exactly (erf) or with the tanh approximation when ``approximate``.
    Float dtypes keep theirs, bool/integer give float32. Unlike jax.nn.gelu, the default is exact.
    ``approximate``: a bool, or torch's spelling "none" / "tanh"."""
    tanh = {"none": False, "tanh": True}.get(approximate) if isinstance(approximate, str) else approximate
    if not isinstance(tanh, (bool, np.bool_)):   # "none" is torch's exact: truthy, it picked tanh
        raise TypeError(f"gelu: approximate must be a bool or 'none'/'tanh', got {approximate!r}")
    return elementwise("gelu_tanh" if tanh else "gelu", x)


_SMALL_POWERS = (2, 3, 4)  # x ** n by multiplications for these Python-int exponents
_STORAGE_ONLY = dt.STORAGE_ONLY


def pow(x1, x2, /):
    """Elementwise pow: x1 ** x2 (integers by repeated squaring, in the integer dtype).

    Arrays and Python scalars broadcast and promote (``result_type``). A float array raised to the
    Python int 2, 3 or 4 is computed by multiplication (``x * x``), as JAX's ``integer_pow`` and
    torch's ``pow(x, 2)`` do: far cheaper than a general pow on a GPU, and its
    derivative is a product rather than another pow. Bool inputs raise TypeError."""
    from .._array import Array
    if type(x2) is int and x2 in _SMALL_POWERS and isinstance(x1, Array) and x1.dtype.kind in "fc" \
            and x1.dtype not in _STORAGE_ONLY:
        square = elementwise("multiply", x1, x1)
        if x2 == 2:
            return square
        return elementwise("multiply", square, x1 if x2 == 3 else square)
    return elementwise("pow", x1, x2)


def isclose(a, b, rtol=1e-5, atol=1e-8):
    """|a - b| <= atol + rtol * |b| elementwise, as a bool array; numeric dtypes. An infinity is close
    to itself only (as numpy); NaN is close to nothing (numpy's default; no ``equal_nan``). Integer
    arrays compare in float64, as numpy's (a - b in their own dtype wraps: uint 1 - (2^32 - 1) is 2)."""
    for name, v in (("rtol", rtol), ("atol", atol)):   # a str or None failed deep in an operator
        if isinstance(v, bool) or not isinstance(v, (int, float, Array, np.ndarray, np.generic)):
            raise TypeError(f"isclose: {name} must be a real number (or an array of them), got {v!r}")
    a, b = (astype(v, _FLOAT64) if _integral(v) else v for v in (a, b))
    within = elementwise("less_equal", elementwise("abs", a - b), atol + rtol * elementwise("abs", b))
    # |a - inf| <= rtol * inf holds for every a, so a finite b is required and equal infinities added
    return elementwise("logical_or", elementwise("logical_and", within, elementwise("isfinite", b)),
                       elementwise("equal", a, b))


_FLOAT64 = dt.float64


def _integral(v) -> bool:
    """An fa array of an integer or bool dtype."""
    return isinstance(v, Array) and v.dtype.kind in "iub"


__all__ = [n for n in ELEMENTWISE if n not in ("astype", "gelu_tanh")] + ["clip", "conj", "real", "imag", "isclose", "isin",
                                                                           "astype"]
del dt
