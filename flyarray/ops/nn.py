"""Neural-network building blocks written on primitives; the scheduler fuses each into one row kernel."""
from __future__ import annotations

from .. import views
from .core import elementwise
from .elementwise import gelu, relu, silu  # noqa: F401
from .reductions import max, mean, sum


def _check_float(name, x):
    if x.dtype.kind != "f":
        raise TypeError(f"{name}: needs a floating-point input, got {x.dtype}")


def softmax(x, axis=-1):
    _check_float("softmax", x)
    views.normalize_axis(axis, x.ndim)
    e = elementwise("exp", x - max(x, axis=axis, keepdims=True))
    return e / sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    _check_float("log_softmax", x)
    views.normalize_axis(axis, x.ndim)
    shifted = x - max(x, axis=axis, keepdims=True)
    return shifted - elementwise("log", sum(elementwise("exp", shifted), axis=axis, keepdims=True))


def rms_norm(x, weight=None, eps=1e-6):
    _check_float("rms_norm", x)
    if weight is not None and weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight shape {weight.shape} does not match the last axis of {x.shape}")
    y = x * elementwise("rsqrt", mean(x * x, axis=-1, keepdims=True) + eps)
    return y * weight if weight is not None else y


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    _check_float("layer_norm", x)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != x.shape[-1:]:
            raise ValueError(f"layer_norm: {name} shape {p.shape} does not match the last axis of {x.shape}")
    mu = mean(x, axis=-1, keepdims=True)
    centered = x - mu
    y = centered * elementwise("rsqrt", mean(centered * centered, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
