"""jax.nn's activations and helpers beyond relu/silu/gelu (fa.nn): written on the elementwise primitives, so each
fuses into whatever kernel surrounds it, differentiates through its primitives' rules, and batches under vmap.

The forms are the numerically safe ones: softplus through logaddexp (no overflow of e^x), elu/celu through expm1
of the clamped negative part (no inf on the branch ``where`` discards, so no NaN in its derivative), logsumexp
shifted by its row maximum with no derivative through the shift (softmax's rule, nn._shift).
Bool and integer inputs compute in the default float dtype, as silu's; complex inputs raise TypeError.
"""
from __future__ import annotations

from .. import dtypes, views
from .._array import Array
from . import checks, elementwise as ew
from .core import array_arg, where

# selu's constants (Klambauer et al. 2017), as jax.nn.selu and torch's
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _real_float(x, op) -> Array:
    """``x`` as an Array of a real float dtype (bool/integer cast to the default float), else a TypeError."""
    x = array_arg(x, f"{op}: x")
    if x.dtype.is_complex:
        raise TypeError(f"{op}: x must be real, got {x.dtype}")
    return x if x.dtype.is_floating else x.astype(dtypes.default_float())


def _real_number(value, op, name) -> float:
    checks.check_number(op, name, value)
    return float(value)


def sigmoid(x, /):
    """1 / (1 + e^-x) (jax.nn.sigmoid; the same as fa.sigmoid)."""
    return ew.sigmoid(_real_float(x, "sigmoid"))


def softplus(x, /):
    """log(1 + e^x), as logaddexp(x, 0): x itself past where e^x overflows (jax.nn.softplus)."""
    return ew.logaddexp(_real_float(x, "softplus"), 0.0)


def log_sigmoid(x, /):
    """log(sigmoid(x)) = -softplus(-x), finite for every finite x (jax.nn.log_sigmoid)."""
    return -ew.logaddexp(-_real_float(x, "log_sigmoid"), 0.0)


def leaky_relu(x, /, negative_slope=0.01):
    """x where x >= 0, else negative_slope * x (jax.nn.leaky_relu)."""
    x = _real_float(x, "leaky_relu")
    return where(x >= 0, x, x * _real_number(negative_slope, "leaky_relu", "negative_slope"))


def elu(x, /, alpha=1.0):
    """x where x > 0, else alpha * (e^x - 1) (jax.nn.elu)."""
    x = _real_float(x, "elu")
    alpha = _real_number(alpha, "elu", "alpha")
    return where(x > 0, x, alpha * ew.expm1(where(x > 0, 0.0, x)))


def celu(x, /, alpha=1.0):
    """max(x, 0) + alpha * (e^(min(x, 0) / alpha) - 1) (jax.nn.celu); alpha must not be 0."""
    x = _real_float(x, "celu")
    alpha = _real_number(alpha, "celu", "alpha")
    if alpha == 0:
        raise ValueError("celu: alpha must not be 0 (it divides by it)")
    return ew.maximum(x, 0.0) + alpha * ew.expm1(ew.minimum(x, 0.0) / alpha)


def selu(x, /):
    """SELU_SCALE * elu(x, SELU_ALPHA) (jax.nn.selu)."""
    return SELU_SCALE * elu(_real_float(x, "selu"), SELU_ALPHA)


def relu6(x, /):
    """min(max(x, 0), 6) (jax.nn.relu6); its derivative is 0 at both kinks, as JAX's (and relu's at 0)."""
    x = _real_float(x, "relu6")
    return where(x >= 6.0, 6.0, ew.relu(x))


def hard_tanh(x, /):
    """x clipped to [-1, 1] (jax.nn.hard_tanh); its derivative is 1 at the kinks, as JAX's."""
    x = _real_float(x, "hard_tanh")
    return where(x > 1.0, 1.0, where(x < -1.0, -1.0, x))


def hard_sigmoid(x, /):
    """relu6(x + 3) / 6 (jax.nn.hard_sigmoid, torch's hardsigmoid); derivative 0 at -3 and 3, as JAX's."""
    return relu6(_real_float(x, "hard_sigmoid") + 3.0) / 6.0


def hard_silu(x, /):
    """x * hard_sigmoid(x) (jax.nn.hard_silu; torch's hardswish): 0 below -3, x above 3, x (x + 3) / 6 between
    (computed on x clipped to [-3, 3], so the derivative is 0 and 1 out there, not inf * 0, NaN, at +-inf; and
    the value at -inf is 0, where torch's and JAX's product is NaN)."""
    x = _real_float(x, "hard_silu")
    inner = ew.clip(x, -3.0, 3.0)
    return where(x <= -3.0, 0.0, where(x >= 3.0, x, inner * (inner + 3.0) / 6.0))


def mish(x, /):
    """x * tanh(softplus(x)) (jax.nn.mish)."""
    x = _real_float(x, "mish")
    return x * ew.tanh(softplus(x))


def glu(x, /, axis=-1):
    """a * sigmoid(b), ``x`` cut in halves a, b along ``axis``, whose length must be even (jax.nn.glu)."""
    x = _real_float(x, "glu")
    axis = views.normalize_axis(axis, x.ndim, "glu: axis")
    half, odd = divmod(x.shape[axis], 2)
    if odd:
        raise ValueError(f"glu: axis {axis} of x (shape {x.shape}) must have an even length")
    first = tuple(slice(None) if a != axis else slice(0, half) for a in range(x.ndim))
    second = tuple(slice(None) if a != axis else slice(half, None) for a in range(x.ndim))
    return x[first] * ew.sigmoid(x[second])


def logsumexp(x, /, axis=None, keepdims=False):
    """log(sum(e^x)) over ``axis`` (an int, a tuple, or None for all), computed as m + log(sum(e^(x - m))) with m
    the maximum (0 where it is not finite): no overflow, -inf for an empty or all -inf reduction, +inf where
    an element is +inf, NaN where one is NaN (jax.nn.logsumexp). Float x (integers raise, as softmax's).
    Its derivative is the softmax over ``axis``."""
    from ..transforms.autodiff import stop_gradient
    from .reductions import max, sum
    x = array_arg(x, "logsumexp: x")
    checks.check_float("logsumexp", "x", x)
    keepdims = checks.check_bool("logsumexp", "keepdims", keepdims)
    axes = views.normalize_axes(axis, x.ndim, "logsumexp: axis")
    if any(x.shape[a] == 0 for a in axes):   # no maximum to shift by; the empty sum's log is -inf
        from .creation import full
        shape = tuple(1 if a in axes else s for a, s in enumerate(x.shape)) if keepdims else \
            tuple(s for a, s in enumerate(x.shape) if a not in axes)
        return full(shape, float("-inf"), dtype=x.dtype, device=x.device)
    m = stop_gradient(max(x, axis=axes, keepdims=True))
    m = where(ew.isfinite(m), m, 0.0)
    out = ew.log(sum(ew.exp(x - m), axis=axes, keepdims=True)) + m
    if not keepdims:
        from .manipulation import squeeze
        out = squeeze(out, axis=axes) if axes else out
    return out


def one_hot(x, num_classes, *, dtype=None, axis=-1):
    """1 where ``x`` (integers) equals the class index along a new axis ``axis`` of length ``num_classes``,
    else 0 (jax.nn.one_hot): an index outside [0, num_classes) gives a row of zeros. ``dtype`` defaults to
    the default float."""
    from .creation import arange
    from .manipulation import expand_dims
    if isinstance(x, int) and not isinstance(x, bool):
        from .creation import asarray
        x = asarray(x)
    x = array_arg(x, "one_hot: x")
    if x.dtype.is_floating or x.dtype.is_complex or x.dtype == dtypes.bool_:
        raise TypeError(f"one_hot: x must hold integer class indices, got {x.dtype}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
        raise ValueError(f"one_hot: num_classes must be a non-negative int, got {num_classes!r:.40}")
    dtype = dtypes.default_float() if dtype is None else dtypes.dtype(dtype)
    axis = views.normalize_axis(axis, x.ndim + 1, "one_hot: axis")
    # compared in int64: x's own dtype may not hold num_classes (int8, 200); a uint64 past 2^63 turns negative,
    # which matches no class, as it matches none in its own dtype
    x = x.astype(dtypes.int64, copy=False)
    classes = arange(num_classes, dtype=dtypes.int64, device=x.device)
    shape = tuple(num_classes if a == axis else 1 for a in range(x.ndim + 1))
    from .manipulation import reshape
    return (expand_dims(x, axis=axis) == reshape(classes, shape)).astype(dtype)


def standardize(x, /, axis=-1, epsilon=1e-5):
    """(x - mean) / sqrt(variance + epsilon) over ``axis`` (jax.nn.standardize; the variance of the centered
    values, which keeps digits a mean of squares loses)."""
    from .reductions import mean
    x = _real_float(x, "standardize")
    axes = views.normalize_axes(axis, x.ndim, "standardize: axis")
    eps = _real_number(epsilon, "standardize", "epsilon")
    centered = x - mean(x, axis=axes, keepdims=True)
    return centered * ew.rsqrt(mean(centered * centered, axis=axes, keepdims=True) + eps)


swish = ew.silu   # jax.nn.swish is silu
hard_swish = hard_silu

__all__ = ["celu", "elu", "glu", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh", "leaky_relu", "log_sigmoid",
           "logsumexp", "mish", "one_hot", "relu6", "selu", "sigmoid", "softplus", "standardize", "swish"]
