"""Neural-network building blocks written on primitives; the scheduler fuses each into one row kernel."""
from __future__ import annotations

from .. import dtypes
from . import checks
from .core import array_arg, elementwise
from .creation import zeros
from .._array import Array
from .library import Composite, composite, expansion, record_composite
from .elementwise import gelu, relu, silu  # noqa: F401
from .reductions import max, mean, sum


def _empty_axis(x, axis) -> bool:
    """softmax over an axis of size 0 has no max to subtract; the answer is empty (as torch's)."""
    return x.ndim > 0 and x.shape[axis] == 0


def _array_args(op, x, **optional) -> list:
    """x and the optional arrays (None stays None: only x is required) as Arrays, numpy arrays and torch
    tensors converted; a TypeError naming the argument for anything else."""
    return [array_arg(x, f"{op}: x")] + [None if a is None else array_arg(a, f"{op}: {name}")
                                         for name, a in optional.items()]


def softmax(x, axis=-1):
    """exp(x - max) / sum over ``axis``; one fused row kernel, or the hand-written kernel for long rows.

    Float dtypes only (integers raise TypeError, unlike jax.nn.softmax); the result keeps x's dtype."""
    x = array_arg(x, "softmax: x")
    axis = checks.check_softmax("softmax", x, axis)
    if _empty_axis(x, axis):
        return zeros(x.shape, dtype=x.dtype, device=x.device)
    if _long_rows(x, axis):
        return long_row_softmax(x, axis, log=False)
    (y,) = composite(SOFTMAX, [x], [(x.shape, x.dtype)], axis=axis)
    return y


def _softmax(x, *, axis):
    e = elementwise("exp", x - _shift(x, axis))
    return e / sum(e, axis=axis, keepdims=True)


def _shift(x, axis):
    """The row maximum the exponentials are shifted by, with no derivative: the result does not depend on it,
    and the two derivative paths through it (the shift and the normalizer) cancel only up to rounding, an
    error on each row's largest element (log_softmax fp32: 2.8e-4 at 16384 columns, torch 2.2e-7)."""
    from ..transforms.autodiff import stop_gradient
    return stop_gradient(max(x, axis=axis, keepdims=True))


def log_softmax(x, axis=-1):
    """x - max - log(sum(exp(x - max))) over ``axis``, as jax.nn.log_softmax; fused like ``softmax``.
    Float dtypes only (integers raise TypeError); the result keeps x's dtype."""
    x = array_arg(x, "log_softmax: x")
    axis = checks.check_softmax("log_softmax", x, axis)
    if _empty_axis(x, axis):
        return zeros(x.shape, dtype=x.dtype, device=x.device)
    if _long_rows(x, axis):
        return long_row_softmax(x, axis, log=True)
    (y,) = composite(LOG_SOFTMAX, [x], [(x.shape, x.dtype)], axis=axis)
    return y


def _log_softmax(x, *, axis):
    shifted = x - _shift(x, axis)
    return shifted - elementwise("log", sum(elementwise("exp", shifted), axis=axis, keepdims=True))


# Recorded as one node each (recording and the plan's walk stay cheap); expanded on a plan miss.
SOFTMAX = Composite("softmax", expansion(_softmax))
LOG_SOFTMAX = Composite("log_softmax", expansion(_log_softmax))


def _long_rows(x, axis) -> bool:
    """Rows past what one block holds: generated code would re-read them once per reduction
    (and parallelize poorly over few rows); kernels/softmax.py does it in two passes, split
    across programs (docs/benchmarks.md: 64 x 1M fp32 at 1.77x the limit, torch 3.6x)."""
    from ..codegen import ROW_BLOCK_LIMIT
    return x.ndim > 0 and x.shape[axis] > ROW_BLOCK_LIMIT and x.dtype != dtypes.float64


def rms_norm(x, weight=None, eps=1e-6, *, residual=None):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, statistics in fp32 (fp64 for float64 x), result in x's dtype.

    With ``residual``: h = x + residual, returns (rms_norm(h) * weight, h) -- the pre-norm residual
    of LLM blocks, computed in one pass: one fused kernel writes both, whichever is read first.
    Written on primitives: on the H200 the fused code beats our hand-written kernel
    (docs/benchmarks.md); backward lives in flyarray.interop.torch.rms_norm.
    """
    if residual is None and type(x) is Array and type(weight) is Array and type(eps) is float:
        # the common call, recorded without the general checks: the same conditions, tested directly
        xn, wn = x._node, weight._node
        floats = checks.COMPUTE_FLOATS
        if (xn.dtype in floats and wn.dtype in floats and xn.shape and wn.shape == xn.shape[-1:]
                and eps >= 0 and xn.device == wn.device):
            return record_composite(RMS_NORM, (xn, wn), [(xn.shape, xn.dtype)], xn.device,
                                    {"eps": eps, "has_weight": True, "has_residual": False})[0]
    x, weight, residual = _array_args("rms_norm", x=x, weight=weight, residual=residual)
    checks.check_norm("rms_norm", x, weight=weight, residual=residual, eps=eps)
    inputs = [x] + [a for a in (weight, residual) if a is not None]
    avals = [(x.shape, x.dtype)]
    if residual is not None:
        avals.append((x.shape, dtypes.result_type(x.dtype, residual.dtype)))
    outs = composite(RMS_NORM, inputs, avals, eps=float(eps), has_weight=weight is not None,
                     has_residual=residual is not None)
    if residual is None:
        return outs[0]
    from ..plan import evaluate_together
    evaluate_together(*outs)  # reading either one computes both in one kernel
    return tuple(outs)


def _rms_norm(x, *rest, eps, has_weight, has_residual):
    weight = rest[0] if has_weight else None
    residual = rest[-1] if has_residual else None
    h = x + residual if residual is not None else x
    acc = dtypes.compute_dtype(x.dtype)   # torch's accumulation type: fp32 for fp16/bf16, else x's own
    hf = h.astype(acc, copy=False)
    y = hf * elementwise("rsqrt", mean(hf * hf, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight.astype(acc, copy=False)
    y = y.astype(x.dtype, copy=False)
    return (y, h) if residual is not None else (y,)


RMS_NORM = Composite("rms_norm", expansion(_rms_norm))


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance, as torch's).
    Float x, weight and bias (weight/bias of the last axis's size); the result is their promoted dtype;
    statistics in fp32 (fp64 for a float64 result), as torch.
    Recorded as one node and fused into one row kernel."""
    x, weight, bias = _array_args("layer_norm", x=x, weight=weight, bias=bias)
    checks.check_norm("layer_norm", x, weight=weight, bias=bias, eps=eps)
    inputs = [x] + [a for a in (weight, bias) if a is not None]
    (y,) = composite(LAYER_NORM, inputs, [(x.shape, _promoted(x, weight, bias))], eps=float(eps),
                     has_weight=weight is not None, has_bias=bias is not None)
    return y


def _promoted(*arrays):
    """The result dtype of layer_norm's operands (None where absent)."""
    d = arrays[0].dtype
    for a in arrays[1:]:
        if a is not None:
            d = dtypes.result_type(d, a.dtype)
    return d


def _layer_norm(x, *rest, eps, has_weight, has_bias):
    weight = rest[0] if has_weight else None
    bias = rest[-1] if has_bias else None
    out = _promoted(x, weight, bias)
    acc = dtypes.compute_dtype(out)   # statistics as torch's: fp32 for fp16/bf16, else the dtype itself
    xf = x.astype(acc, copy=False)
    mu = mean(xf, axis=-1, keepdims=True)
    centered = xf - mu
    y = centered * elementwise("rsqrt", mean(centered * centered, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight.astype(acc, copy=False)
    if bias is not None:
        y = y + bias.astype(acc, copy=False)
    return (y.astype(out, copy=False),)


LAYER_NORM = Composite("layer_norm", expansion(_layer_norm))


from .library_ops import dot_product_attention, long_row_softmax, scaled_matmul, softmax_top_k  # noqa: E402,F401
from .activations import (celu, elu, glu, hard_sigmoid, hard_silu, hard_swish, hard_tanh, leaky_relu,  # noqa: E402,F401
                          log_sigmoid, logsumexp, mish, one_hot, relu6, selu, sigmoid, softplus, standardize, swish)
from . import activations as _activations  # noqa: E402

# fa.nn's public names (the API reference and `from flyarray.nn import *`); the rest are this module's helpers
__all__ = sorted(["dot_product_attention", "gelu", "layer_norm", "log_softmax", "long_row_softmax", "relu", "rms_norm",
                  "scaled_matmul", "silu", "softmax", "softmax_top_k"] + _activations.__all__)
