"""The hand-written kernels (flyarray/kernels/) as graph nodes: shape and dtype rules, checked at record time.

Each op's rule raises a clear error naming the argument before anything runs;
its kernel runs on the gpu and interpret backends, its reference (torch eager,
kernels/*.reference_*) on the reference backend.
"""
from __future__ import annotations

import importlib
import math
import numbers

import torch

from .. import dtypes as dt
from . import checks
from .library import Library, call
from .._array import Array


def _kernels(name):
    return importlib.import_module(f"flyarray.kernels.{name}")


def _float_input(op, name, node, allowed=checks.KERNEL_FLOATS):
    checks.check_float(op, name, node, allowed)


# ---- top_k ------------------------------------------------------------------------------------------
# what the top_k kernel orders (kernels/top_k.py SUPPORTED_DTYPES): its floats and the integers up to 32 bits
TOP_K_DTYPES = checks.KERNEL_FLOATS + (dt.int8, dt.uint8, dt.int16, dt.int32)


def _top_k_abstract(x, *, k, op="top_k", name="x", dtypes=TOP_K_DTYPES):
    if x.dtype not in dtypes:
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected one of {', '.join(map(str, dtypes))}")
    if not x.shape:
        raise ValueError(f"{op}: {name} must have at least one dimension")
    n = x.shape[-1]
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"{op}: k must be an int, got {k!r}")
    if k <= 0 or k > n:
        raise ValueError(f"{op}: k={k} must be in 1..{n} (the last axis of shape {x.shape})")
    out = x.shape[:-1] + (k,)
    return [(out, x.dtype), (out, dt.int32)]


def _top_k_reference(x, *, k):
    values, indices = _kernels("top_k").reference_top_k(x, k)
    return values.to(x.dtype), indices.to(torch.int32)


TOP_K = Library("top_k", _top_k_abstract, lambda x, *, k: _kernels("top_k").top_k(x, k), _top_k_reference)


def _static_k(k):
    if isinstance(k, numbers.Integral) and not isinstance(k, bool):
        return int(k)   # numpy integers too: k is a static parameter, keyed as a Python int
    return k


def top_k(x, k):
    """(values, indices) of the k largest entries along the last axis, as jax.lax.top_k:
    values descending, ties broken by the lower index, NaN ranks above +inf; indices int32.
    float16/bfloat16/float32, and int8/uint8/int16/int32."""
    return tuple(call(TOP_K, [x], k=_static_k(k)))


def _softmax_top_k_abstract(x, *, k, renormalize):
    out = _top_k_abstract(x, k=k, op="softmax_top_k", name="logits", dtypes=checks.KERNEL_FLOATS)
    max_n, max_k = _kernels("top_k").softmax_top_k_limits()   # the kernel's, checked here on every backend
    if x.shape[-1] > max_n or k > max_k:
        raise ValueError(f"softmax_top_k: made for routers (rows <= {max_n}, k <= {max_k}), got rows of "
                         f"{x.shape[-1]} and k={k}; use fa.top_k(fa.nn.softmax(x), k)")
    return out


def _softmax_top_k_reference(x, *, k, renormalize):
    probs, idx = _kernels("top_k").reference_softmax_top_k(x, k, renormalize)
    return probs.to(x.dtype), idx.to(torch.int32)


SOFTMAX_TOP_K = Library("softmax_top_k", _softmax_top_k_abstract,
                        lambda x, *, k, renormalize: _kernels("top_k").softmax_top_k(x, k, renormalize),
                        _softmax_top_k_reference)


def softmax_top_k(logits, k, renormalize=False):
    """MoE routing in one kernel: softmax over the last axis (fp32 inside), then its top k.
    With ``renormalize`` the k probabilities are divided by their sum. Rows up to 1024 long and k up to 16
    (the kernel's limits, checked when recorded); past them, ``fa.top_k(fa.nn.softmax(x), k)``."""
    renormalize = checks.check_bool("softmax_top_k", "renormalize", renormalize)
    return tuple(call(SOFTMAX_TOP_K, [logits], k=_static_k(k), renormalize=renormalize))


# ---- softmax over long rows ---------------------------------------------------------------------------
def _softmax_abstract(x, *, axis, log):
    checks.check_softmax("log_softmax" if log else "softmax", x, axis, checks.KERNEL_FLOATS)
    return [(x.shape, x.dtype)]


def _softmax_reference(x, *, axis, log):
    out = torch.log_softmax(x.float(), axis) if log else torch.softmax(x.float(), axis)
    return out.to(x.dtype)


SOFTMAX = Library("softmax", _softmax_abstract,
                  lambda x, *, axis, log: _kernels("softmax").softmax(x, axis, log), _softmax_reference)


def long_row_softmax(x, axis=-1, log=False):
    """softmax / log_softmax through kernels/softmax.py (online, segmented for few long rows)."""
    return call(SOFTMAX, [x], axis=axis, log=checks.check_bool("long_row_softmax", "log", log))[0]


# ---- attention ------------------------------------------------------------------------------------------
def _attention_abstract(q, k, v, *extras, scale, is_causal, has_bias, has_mask):
    for name, t in (("query", q), ("key", k), ("value", v)):
        _float_input("dot_product_attention", name, t, (dt.float16, dt.bfloat16, dt.float32))
        if len(t.shape) != 4:
            raise ValueError(f"dot_product_attention: {name} must be (batch, seq, heads, head_dim), got {t.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"dot_product_attention: query/key/value dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    B, Sq, Hq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"dot_product_attention: key {k.shape} and value {v.shape} shapes differ")
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"dot_product_attention: query {q.shape} and key {k.shape} differ in batch or head_dim")
    if D == 0:   # the default scale 1/sqrt(head_dim) has no value, and no head_dim-0 model exists
        raise ValueError(f"dot_product_attention: head_dim is 0 (query {q.shape}); it must be at least 1")
    Hkv = k.shape[2]
    if Hkv == 0 or Hq == 0:   # (torch's SDPA returns an empty result; the kernels have no zero-head path)
        raise ValueError(f"dot_product_attention: query has {Hq} heads and key/value {Hkv}: zero heads are not "
                         "supported")
    if Hq % Hkv:
        raise ValueError(f"dot_product_attention: key/value heads ({Hkv}) must divide query heads ({Hq})")
    Sk = k.shape[1]
    checks.check_number("dot_product_attention", "scale", scale, optional=True)
    if scale is not None and not math.isfinite(scale):   # every score NaN: an output of NaN, for nothing
        raise ValueError(f"dot_product_attention: scale must be finite, got {scale}")
    it = iter(extras)
    from ..views import broadcast_shapes
    for flag, name in ((has_bias, "bias"), (has_mask, "mask")):
        if not flag:
            continue
        t = next(it)
        try:
            if broadcast_shapes(t.shape, (B, Hq, Sq, Sk)) != (B, Hq, Sq, Sk):
                raise ValueError
        except ValueError:
            raise ValueError(f"dot_product_attention: {name} of shape {t.shape} does not broadcast to "
                             f"(batch, heads, q_len, k_len) = {(B, Hq, Sq, Sk)}") from None
        if name == "mask" and t.dtype != dt.bool_:
            raise TypeError(f"dot_product_attention: mask must be bool (True keeps), got {t.dtype}")
        if name == "bias":
            checks.check_float("dot_product_attention", "bias", t, checks.KERNEL_FLOATS)
    # the output, and each query row's log-sum-exp of its scores (natural log, float32; -inf for a row
    # that sees no key): the backward's residual, so a gradient does not run the forward again
    return [((B, Sq, Hq, D), q.dtype), ((B, Hq, Sq), dt.float32)]


def _split_extras(extras, has_bias, has_mask):
    it = iter(extras)
    bias = next(it) if has_bias else None
    mask = next(it) if has_mask else None
    return bias, mask


def _attention_kernel(q, k, v, *extras, scale, is_causal, has_bias, has_mask):
    bias, mask = _split_extras(extras, has_bias, has_mask)
    out, lse = _kernels("attention").attention_fwd(q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal)
    return [out, lse]


def _attention_reference(q, k, v, *extras, scale, is_causal, has_bias, has_mask):
    bias, mask = _split_extras(extras, has_bias, has_mask)
    out, lse = _kernels("attention").reference_attention(q, k, v, bias, mask, scale=scale, is_causal=is_causal,
                                                         return_lse=True)
    return [out.to(q.dtype), lse.float()]


ATTENTION = Library("attention", _attention_abstract, _attention_kernel, _attention_reference, warms_up=True)


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False):
    """softmax(scale * q k^T + bias, masked) v in JAX's (batch, seq, heads, head_dim) layout, flash style.

    Any strides: torch (B, H, S, D) tensors pass as ``.transpose(1, 2)`` views without a copy.
    GQA/MQA when key/value have fewer heads. Two conventions differ from ``jax.nn.dot_product_attention``:
    causal with unequal lengths is aligned bottom-right (query i sees keys up to i + Sk - Sq: FlashAttention's
    rule, the one a KV-cache decode needs; JAX and torch's SDPA align top-left, ``tril(ones(Sq, Sk))``: pass
    that as ``mask`` for theirs), and a query row whose every key is masked gives 0 (and no gradient) where
    JAX gives the mean of ``value``. head_dim past 256 (the kernels' widest) is computed by the same math on
    fused primitives.
    """
    from .core import array_arg
    query = array_arg(query, "dot_product_attention: query")   # its head_dim is read before call() checks it
    key, value = array_arg(key, "dot_product_attention: key"), array_arg(value, "dot_product_attention: value")
    is_causal = checks.check_bool("dot_product_attention", "is_causal", is_causal)
    extras = [t for t in (bias, mask) if t is not None]
    if query.shape[-1] > checks.ATTENTION_MAX_HEAD_DIM and len(query.shape) == 4:
        return _wide_head_attention(query, key, value, extras, scale=scale, is_causal=is_causal,
                                    has_bias=bias is not None, has_mask=mask is not None)
    out, _ = call(ATTENTION, [query, key, value, *extras], scale=scale, is_causal=is_causal,
                  has_bias=bias is not None, has_mask=mask is not None)
    return out


def _wide_head_attention(query, key, value, extras, **kw):
    """The attention library op's formulation (ad_rules), after the op's own checks."""
    from ..ad_rules import _attention_formulation
    from .core import array_arg
    arrays = [array_arg(t, "dot_product_attention") for t in (query, key, value, *extras)]
    _attention_abstract(*[a._node for a in arrays], **kw)
    return _attention_formulation(*arrays, **kw)[0]


# ---- ragged_dot --------------------------------------------------------------------------------------------
def _ragged_dot_abstract(lhs, rhs, group_sizes):
    if len(lhs.shape) != 2 or len(rhs.shape) != 3 or len(group_sizes.shape) != 1:
        raise ValueError(f"ragged_dot: expects lhs [m, k], rhs [g, k, n], group_sizes [g]; got {lhs.shape}, "
                         f"{rhs.shape}, {group_sizes.shape}")
    if lhs.shape[1] != rhs.shape[1]:
        raise ValueError(f"ragged_dot: inner dimensions differ: lhs {lhs.shape} vs rhs {rhs.shape}")
    if group_sizes.shape[0] != rhs.shape[0]:
        raise ValueError(f"ragged_dot: {group_sizes.shape[0]} group sizes for {rhs.shape[0]} groups in rhs")
    if group_sizes.dtype not in (dt.int32, dt.int64):
        raise TypeError(f"ragged_dot: group_sizes must be int32 or int64, got {group_sizes.dtype}")
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"ragged_dot: lhs {lhs.dtype} and rhs {rhs.dtype} differ; cast one with astype")
    _float_input("ragged_dot", "lhs", lhs, (dt.float16, dt.bfloat16, dt.float32))
    return [((lhs.shape[0], rhs.shape[2]), lhs.dtype)]


RAGGED_DOT = Library("ragged_dot", _ragged_dot_abstract,
                     lambda lhs, rhs, gs: _kernels("ragged_dot").ragged_dot(lhs, rhs, gs),
                     lambda lhs, rhs, gs: _kernels("ragged_dot").reference_ragged_dot(lhs, rhs, gs).to(lhs.dtype))


def ragged_dot(lhs, rhs, group_sizes):
    """jax.lax.ragged_dot: rows of group i of lhs ``[m, k]`` times ``rhs[i]`` ``[k, n]`` -> ``[m, n]``, one launch.

    group_sizes stays on the device (no host synchronization); empty groups are allowed;
    rows past sum(group_sizes) are zero. Sizes known on the host (a list, a numpy array, a CPU torch tensor or an
    evaluated CPU array) are checked: none negative, their sum at most m. On a GPU (an fa array or a torch
    tensor there) that is the caller's contract: it cannot be checked without reading the device.
    """
    import numpy as np
    from .core import as_array, operands_device
    if isinstance(group_sizes, (list, tuple)):   # sizes written out: host values, checked as numpy's are
        group_sizes = np.asarray(group_sizes, dtype=np.int64) if group_sizes else np.zeros(0, np.int64)
    _check_host_group_sizes(lhs, group_sizes)
    operands = [lhs, rhs, group_sizes]
    device = operands_device(operands)   # numpy operands join the others' device
    return call(RAGGED_DOT, [as_array(a, device) for a in operands])[0]


def _check_host_group_sizes(lhs, group_sizes):
    import numpy as np
    from .._array import Array
    if type(group_sizes) is torch.Tensor and group_sizes.device.type == "cpu":   # not a fake: its values exist
        group_sizes = group_sizes.detach().numpy()
    elif isinstance(group_sizes, Array):   # evaluated on the CPU: read without evaluating anything
        buffer = group_sizes._node.buffer
        group_sizes = buffer.numpy() if buffer is not None and buffer.device.type == "cpu" else None
    if not isinstance(group_sizes, np.ndarray):
        return
    sizes = group_sizes
    shape = tuple(getattr(lhs, "shape", ()))
    if sizes.dtype.kind not in "iu" or sizes.ndim != 1 or len(shape) != 2:
        return   # the shape rule names the problem
    m = shape[0]
    if (sizes < 0).any():
        raise ValueError(f"ragged_dot: group_sizes must not be negative, got {sizes.tolist()}")
    if int(sizes.sum()) > m:
        raise ValueError(f"ragged_dot: group_sizes sum to {int(sizes.sum())}, past lhs's {m} rows")


# ---- scaled_matmul ------------------------------------------------------------------------------------------
_MX_STORAGE = {dt.float8_e4m3fn: "e4m3", dt.float8_e5m2: "e5m2", dt.uint8: "e2m1"}


def _scaled_matmul_abstract(lhs, rhs, *scales, preferred_element_type, has_lhs_scales, block_size=32):
    if block_size != 32:
        raise ValueError(f"scaled_matmul: block_size must be 32 (OCP MX), got {block_size}")
    if len(lhs.shape) != 2 or len(rhs.shape) != 2:
        raise ValueError(f"scaled_matmul: lhs [M, K] and rhs [N, K] (K-major), got {lhs.shape} and {rhs.shape}")
    if rhs.dtype not in _MX_STORAGE:
        raise TypeError(f"scaled_matmul: rhs must hold MX data (float8_e4m3fn, float8_e5m2, or uint8 packed "
                        f"e2m1), got {rhs.dtype}")
    if has_lhs_scales and lhs.dtype not in _MX_STORAGE:
        raise TypeError(f"scaled_matmul: lhs of dtype {lhs.dtype} with lhs_scales is not supported (lhs_scales "
                        "go with MX data: float8_e4m3fn, float8_e5m2 or uint8 packed e2m1; pass lhs_scales=None "
                        "for bf16/fp16 activations)")
    if not has_lhs_scales and lhs.dtype not in (dt.bfloat16, dt.float16):
        raise TypeError(f"scaled_matmul: lhs of dtype {lhs.dtype} with lhs_scales=None is not supported "
                        f"({'MX data needs its lhs_scales' if lhs.dtype in _MX_STORAGE else 'bf16 or fp16'})")
    k = _logical_k(lhs)
    if _logical_k(rhs) != k:
        raise ValueError(f"scaled_matmul: lhs {lhs.shape} ({lhs.dtype}) holds K={k} but rhs {rhs.shape} "
                         f"({rhs.dtype}) holds K={_logical_k(rhs)} (uint8 packs two e2m1 values a byte)")
    if k % block_size:
        raise ValueError(f"scaled_matmul: K={k} is not a multiple of the block size {block_size}")
    names = ("lhs_scales", "rhs_scales") if has_lhs_scales else ("rhs_scales",)
    operands = (lhs, rhs) if has_lhs_scales else (rhs,)
    for name, s, x in zip(names, scales, operands):
        if s.dtype != dt.uint8:
            raise TypeError(f"scaled_matmul: {name} must be E8M0 codes stored as uint8, got {s.dtype}")
        if tuple(s.shape) != (x.shape[0], k // block_size):
            raise ValueError(f"scaled_matmul: {name} must have shape {(x.shape[0], k // block_size)} (one scale "
                             f"per {block_size} values of K), got {tuple(s.shape)}")
    out = dt.dtype(preferred_element_type)
    if out.kind != "f":
        raise TypeError(f"scaled_matmul: preferred_element_type must be a floating dtype, got {out}")
    if out not in (dt.bfloat16, dt.float16, dt.float32):  # the kernels' _OUT_DTYPES: refuse on every backend
        raise ValueError(f"scaled_matmul: preferred_element_type must be one of bfloat16, float16, float32 "
                         f"(the kernels' output dtypes), got {out}")
    return [((lhs.shape[0], rhs.shape[0]), out)]


def _logical_k(x):
    """K of an operand: uint8 storage packs two e2m1 values a byte."""
    return x.shape[1] * 2 if x.dtype == dt.uint8 else x.shape[1]


def _scales_args(scales, has_lhs_scales):
    return (scales[0], scales[1]) if has_lhs_scales else (None, scales[0])


def _scaled_matmul_kernel(lhs, rhs, *scales, preferred_element_type, has_lhs_scales, block_size=32):
    sa, sb = _scales_args(scales, has_lhs_scales)
    return _kernels("scaled_matmul").scaled_matmul(lhs, rhs, sa, sb, preferred_element_type=dt.dtype(
        preferred_element_type).torch)


def _scaled_matmul_reference(lhs, rhs, *scales, preferred_element_type, has_lhs_scales, block_size=32):
    sa, sb = _scales_args(scales, has_lhs_scales)
    out = _kernels("scaled_matmul").reference_scaled_matmul(lhs, rhs, sa, sb)
    return out.to(dt.dtype(preferred_element_type).torch)


SCALED_MATMUL = Library("scaled_matmul", _scaled_matmul_abstract, _scaled_matmul_kernel, _scaled_matmul_reference)


def scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type=dt.bfloat16):
    """jax.nn.scaled_matmul: (lhs * lhs_scales) @ (rhs * rhs_scales)^T with OCP MX operands (K-major).

    MXFP8 x MXFP8, MXFP4 x MXFP4, mixed, and bf16 x MXFP4 weights (``lhs_scales=None``).
    On gfx950 this is the native scaled MFMA; on Hopper, see docs/benchmarks.md.
    """
    if rhs_scales is None:
        raise TypeError("scaled_matmul: rhs_scales is required (rhs is an MX operand: its E8M0 scales as uint8); "
                        "only lhs_scales may be None, for a bf16/fp16 lhs")
    named = (("lhs", lhs), ("rhs", rhs), ("lhs_scales", lhs_scales), ("rhs_scales", rhs_scales))
    for name, a in named:
        if a is not None and not isinstance(a, Array):
            raise TypeError(f"scaled_matmul: {name} must be a flyarray Array (or a numpy array / torch tensor), "
                            f"got {type(a).__name__}")
    inputs = [lhs, rhs] + ([lhs_scales] if lhs_scales is not None else []) + [rhs_scales]
    try:
        out_type = dt.dtype(preferred_element_type).name
    except TypeError as e:
        raise TypeError(f"scaled_matmul: preferred_element_type: {e}") from None
    (out,) = call(SCALED_MATMUL, inputs, preferred_element_type=out_type, has_lhs_scales=lhs_scales is not None)
    return out

