"""flyarray's library kernels as torch custom ops: ``torch.ops.flyarray.*``.

Each op is a ``torch.library.custom_op`` whose implementation goes through the flyarray API
(``fa.asarray`` on the tensors -> the fa op -> ``Array.torch()``), so it runs our kernels on the GPU
and the reference backend on the CPU, never a torch fallback. Each has a fake (meta) implementation
computed by the same shape/dtype rules the fa op records with (so a bad argument fails the same way
under ``torch.compile``'s tracing as in eager, before anything launches), and the differentiable
ones register their backward as one more custom op, ``flyarray::vjp``, which runs ``fa.vjp`` of
the forward: one implementation of every derivative, the one ``fa.grad`` uses.

Custom ops are opaque to Dynamo: inside ``torch.compile`` (any backend) they are single graph nodes,
never traced into (tracing the Triton interpreter shim is what failed with KeyError(torch.uint64)).
"""
from __future__ import annotations

import functools
import json
from typing import Optional

import torch
from torch import Tensor

import flyarray as fa
from flyarray import dtypes as dt
from flyarray import views
from flyarray.ops import checks

_OPTIONAL = {"weight", "residual", "bias", "mask", "lhs_scales", "grad_lse"}


# ---- argument checks: shared by the real and the fake implementation --------------------------------
def _avals(op, **tensors):
    """Shape/dtype/device of each tensor argument (None stays None where optional); one device."""
    avals = {}
    for name, t in tensors.items():
        if t is None and name in _OPTIONAL:
            avals[name] = None
        else:
            avals[name] = checks.aval(op, name, t)
    checks.same_device(op, **avals)
    return tuple(avals.values())


def _empty(aval_or_shape, dtype, like: Tensor) -> Tensor:
    return torch.empty(tuple(aval_or_shape), dtype=dt.dtype(dtype).torch, device=like.device)


def _out(array, inputs) -> Tensor:
    """The fa result as a fresh contiguous tensor: a custom op may not return an input's memory."""
    t = array.torch()
    if not t.is_contiguous():
        t = t.contiguous()
    if _shares_memory(t, inputs):
        t = t.clone()
    return t


def _shares_memory(t: Tensor, others) -> bool:
    """Whether ``t`` lies in the storage of one of ``others`` (anything not a tensor is skipped)."""
    if not t.numel():
        return False
    ptr = t.untyped_storage().data_ptr()
    return any(isinstance(o, Tensor) and o.numel() and o.untyped_storage().data_ptr() == ptr for o in others)


def _fa(t):
    return None if t is None else fa.asarray(t)


# ---- the forward computations, on fa arrays (also what flyarray::vjp differentiates) -------------------
def _rms_norm(x, weight, *, eps):
    return fa.nn.rms_norm(x, weight, eps)


def _add_rms_norm(x, residual, weight, *, eps):
    return fa.nn.rms_norm(x, weight, eps, residual=residual)


def _softmax(x, *, dim, log):
    return fa.nn.log_softmax(x, axis=dim) if log else fa.nn.softmax(x, axis=dim)


def _attention(q, k, v, bias, mask, *, scale, is_causal):
    return fa.nn.dot_product_attention(q, k, v, bias, mask, scale=scale, is_causal=is_causal)


def _attention_with_lse(q, k, v, bias, mask, *, scale, is_causal):
    """(out, lse): the attention library op's two outputs (flyarray::attention_forward)."""
    from flyarray.ops.library import call
    from flyarray.ops.library_ops import ATTENTION
    return tuple(call(ATTENTION, [q, k, v, *[t for t in (bias, mask) if t is not None]],
                      **_attention_kwargs(bias, mask, scale, is_causal)))


def _attention_grads(do, q, k, v, out, lse, dlse, bias, mask, *, scale, is_causal):
    """(dq, dk, dv) from the forward's (out, lse) and the cotangents (flyarray::attention_backward)."""
    from flyarray.ad_rules import ATTENTION_BWD
    from flyarray.ops.library import call
    tail = [out, lse, do.astype(q.dtype, copy=False)] + ([dlse] if dlse is not None else [])
    return tuple(call(ATTENTION_BWD, [q, k, v, *[t for t in (bias, mask) if t is not None], *tail],
                      **_attention_kwargs(bias, mask, scale, is_causal), has_dlse=dlse is not None))


# the epilogue activations fa.matmul's scheduler fuses (flyarray.ops.linalg.ACTIVATIONS), by name
_ACTIVATIONS = {"relu": fa.relu, "silu": fa.silu, "gelu": fa.gelu, "gelu_tanh": lambda y: fa.gelu(y, approximate=True)}


def _broadcasts_to(shape, target) -> bool:
    """Whether ``shape`` broadcasts to ``target`` without growing it (plain comparisons, so Dynamo traces
    them on its sizes)."""
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(tuple(shape)), reversed(tuple(target))))


def _matmul(a, b, bias, residual, *, activation, out_dtype):
    """[cast]([residual +] [act](a @ b [+ bias])): the pattern the scheduler fuses into one GEMM."""
    y = fa.matmul(a, b)
    if bias is not None:
        y = y + bias
    if activation is not None:
        y = _ACTIVATIONS[activation](y)
    if residual is not None:
        y = y + residual
    if out_dtype is not None and dt.dtype(out_dtype) != y.dtype:
        y = y.astype(dt.dtype(out_dtype))
    return y


def _ragged_dot(lhs, rhs, group_sizes):
    return fa.ragged_dot(lhs, rhs, group_sizes)


def _top_k(x, *, k):
    return fa.top_k(x, k)


def _scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, *, out_dtype):
    return fa.nn.scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type=dt.dtype(out_dtype))


FORWARD = {"rms_norm": _rms_norm, "add_rms_norm": _add_rms_norm, "softmax": _softmax,
           "dot_product_attention": _attention, "matmul": _matmul, "ragged_dot": _ragged_dot, "top_k": _top_k,
           "scaled_matmul": _scaled_matmul}


# ---- rms_norm / add_rms_norm ----------------------------------------------------------------------------
def _check_rms_norm(x, weight, eps, residual=None, with_residual=False):
    if with_residual and residual is None:   # (add_rms_norm's residual is not optional)
        raise TypeError("flyarray::add_rms_norm: residual must be a tensor, got None "
                        "(flyarray::rms_norm is the one without)")
    op = "rms_norm"   # fa.nn.rms_norm's messages, word for word
    xa, wa, ra = _avals(op, x=x, weight=weight, residual=residual)
    checks.check_norm(op, xa, weight=wa, residual=ra, eps=eps)
    return xa, ra


@torch.library.custom_op("flyarray::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """x / sqrt(mean(x^2, -1) + eps) * weight (fa.nn.rms_norm)."""
    _check_rms_norm(x, weight, eps)
    return _out(_rms_norm(fa.asarray(x), _fa(weight), eps=eps), (x, weight))


@rms_norm.register_fake
def _(x, weight, eps):
    xa, _ = _check_rms_norm(x, weight, eps)
    return _empty(xa.shape, xa.dtype, x)


@torch.library.custom_op("flyarray::add_rms_norm", mutates_args=())
def add_rms_norm(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor]:
    """(rms_norm(x + residual) * weight, x + residual): the pre-norm residual of an LLM block, one kernel."""
    _check_rms_norm(x, weight, eps, residual, with_residual=True)
    y, h = _add_rms_norm(fa.asarray(x), fa.asarray(residual), _fa(weight), eps=eps)
    return _out(y, (x, residual, weight)), _out(h, (x, residual, weight))


@add_rms_norm.register_fake
def _(x, residual, weight, eps):
    xa, ra = _check_rms_norm(x, weight, eps, residual, with_residual=True)
    return _empty(xa.shape, xa.dtype, x), _empty(xa.shape, dt.result_type(xa.dtype, ra.dtype), x)


# ---- softmax ----------------------------------------------------------------------------------------------
def _check_softmax(x, dim, log):
    op = "log_softmax" if log else "softmax"
    (xa,) = _avals(op, x=x)
    checks.check_softmax(op, xa, dim, name="dim")
    return xa


@torch.library.custom_op("flyarray::softmax", mutates_args=())
def softmax(x: Tensor, dim: int, log: bool) -> Tensor:
    """softmax (or log_softmax with ``log``) along ``dim`` (fa.nn.softmax)."""
    _check_softmax(x, dim, log)
    return _out(_softmax(fa.asarray(x), dim=dim, log=log), (x,))


@softmax.register_fake
def _(x, dim, log):
    xa = _check_softmax(x, dim, log)
    return _empty(xa.shape, xa.dtype, x)


# ---- dot_product_attention ------------------------------------------------------------------------------
def _check_attention(q, k, v, bias, mask, scale, is_causal):
    from flyarray.ops.library_ops import _attention_abstract
    avals = _avals("dot_product_attention", query=q, key=k, value=v, bias=bias, mask=mask)
    checks.check_number("dot_product_attention", "scale", scale, optional=True)
    (shape, dtype), _lse = _attention_abstract(*[a for a in avals if a is not None], scale=scale,
                                            is_causal=is_causal, has_bias=bias is not None,
                                            has_mask=mask is not None)
    checks.check_attention_head_dim("dot_product_attention", shape[-1])
    return shape, dtype


@torch.library.custom_op("flyarray::dot_product_attention", mutates_args=())
def dot_product_attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], mask: Optional[Tensor],
                          scale: Optional[float], is_causal: bool) -> Tensor:
    """Flash attention in (batch, seq, heads, head_dim) layout (fa.nn.dot_product_attention)."""
    _check_attention(q, k, v, bias, mask, scale, is_causal)
    out = _attention(fa.asarray(q), fa.asarray(k), fa.asarray(v), _fa(bias), _fa(mask), scale=scale,
                     is_causal=is_causal)
    return _out(out, (q, k, v, bias, mask))


@dot_product_attention.register_fake
def _(q, k, v, bias, mask, scale, is_causal):
    shape, dtype = _check_attention(q, k, v, bias, mask, scale, is_causal)
    return _empty(shape, dtype, q)


# ---- attention as a forward/backward pair: the backward reads the forward's residuals ---------------------
# flyarray::dot_product_attention's derivative goes through flyarray::vjp, which has only q, k, v and so runs
# the forward again for its log-sum-exp. These two keep (out, lse) between the passes, as torch's own SDPA
# does: the torch.compile backend routes SDPA through them.
def _attention_kwargs(bias, mask, scale, is_causal):
    return dict(scale=scale, is_causal=bool(is_causal), has_bias=bias is not None, has_mask=mask is not None)


@torch.library.custom_op("flyarray::attention_forward", mutates_args=())
def attention_forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], mask: Optional[Tensor],
                      scale: Optional[float], is_causal: bool) -> tuple[Tensor, Tensor]:
    """dot_product_attention's output and each query row's log-sum-exp ((batch, heads, q_len) float32,
    natural log): what flyarray::attention_backward reads."""
    _check_attention(q, k, v, bias, mask, scale, is_causal)
    out, lse = _attention_with_lse(*map(_fa, (q, k, v, bias, mask)), scale=scale, is_causal=is_causal)
    inputs = (q, k, v, bias, mask)
    return _out(out, inputs), _out(lse, inputs)


@attention_forward.register_fake
def _(q, k, v, bias, mask, scale, is_causal):
    shape, dtype = _check_attention(q, k, v, bias, mask, scale, is_causal)
    return _empty(shape, dtype, q), _empty((shape[0], shape[2], shape[1]), dt.float32, q)


def _check_attention_backward(do, q, k, v, out, lse, dlse, bias, mask, scale, is_causal):
    shape, dtype = _check_attention(q, k, v, bias, mask, scale, is_causal)
    rows = (shape[0], shape[2], shape[1])
    avals = _avals("attention_backward", query=q, grad_out=do, out=out, lse=lse, grad_lse=dlse)  # one device
    wanted = ((shape, dtype), (shape, dtype), (rows, dt.float32), (rows, dt.float32))
    for name, aval, (want, want_dtype) in zip(("grad_out", "out", "lse", "grad_lse"), avals[1:], wanted):
        if aval is not None and (tuple(aval.shape) != tuple(want) or aval.dtype != want_dtype):
            raise ValueError(f"flyarray::attention_backward: {name} must be {tuple(want)} {want_dtype}, "
                             f"got {tuple(aval.shape)} {aval.dtype}")


@torch.library.custom_op("flyarray::attention_backward", mutates_args=())
def attention_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                       dlse: Optional[Tensor], bias: Optional[Tensor], mask: Optional[Tensor],
                       scale: Optional[float], is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of attention_forward at the output cotangent ``do`` (and ``dlse`` for the
    log-sum-exp, or None), from the forward's own (out, lse): no second forward pass."""
    _check_attention_backward(do, q, k, v, out, lse, dlse, bias, mask, scale, is_causal)
    inputs = (do, q, k, v, out, lse, dlse, bias, mask)
    grads = _attention_grads(*map(_fa, inputs), scale=scale, is_causal=is_causal)
    return tuple(_out(g, inputs) for g in grads)


@attention_backward.register_fake
def _(do, q, k, v, out, lse, dlse, bias, mask, scale, is_causal):
    _check_attention_backward(do, q, k, v, out, lse, dlse, bias, mask, scale, is_causal)
    # contiguous, as the real op returns them (_out), whatever q's strides: empty_like would copy those,
    # and a torch view traced on them then fails on the real gradients
    return tuple(_empty(t.shape, t.dtype, t) for t in (q, k, v))


def _attention_forward_context(ctx, inputs, output):
    q, k, v, bias, mask, scale, is_causal = inputs
    if bias is not None and bias.requires_grad:
        # refused here, at the forward, not in a backward that runs later (and maybe far away)
        raise NotImplementedError("flyarray::attention_forward: bias requires grad, but this op has no "
                                  "gradient w.r.t. bias; flyarray::dot_product_attention has one (or pass "
                                  "bias.detach())")
    ctx.save_for_backward(q, k, v, output[0], output[1], bias, mask)
    ctx.scale, ctx.is_causal = scale, is_causal
    # lse is a residual, not a result to differentiate: no tangent for it (AOTAutograd would otherwise
    # fill one with zeros for every step); attention_backward still takes a dlse from direct callers
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _attention_forward_backward(ctx, dout, dlse):
    q, k, v, out, lse, bias, mask = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = torch.ops.flyarray.attention_backward(dout, q, k, v, out, lse, dlse, bias, mask, ctx.scale,
                                                       ctx.is_causal)
    return dq, dk, dv, None, None, None, None


attention_forward.register_autograd(_attention_forward_backward, setup_context=_attention_forward_context)


# ---- matmul with its epilogue -----------------------------------------------------------------------------
def _check_matmul(a, b, bias, residual, activation, out_dtype):
    from flyarray.ops.linalg import ACTIVATIONS, _matmul_abstract
    op = "matmul"
    aa, ba, biasa, ra = _avals(op, a=a, b=b, bias=bias, residual=residual)
    for name, x in (("a", aa), ("b", ba)):
        if len(x.shape) < 2:
            raise ValueError(f"{op}: {name} must be at least 2-D, got shape {x.shape}")
    views.broadcast_batch(op, (aa.shape, ba.shape), ("a", "b"))
    ((shape, dtype),) = _matmul_abstract(aa, ba)
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {sorted(ACTIVATIONS)} or None, got {activation!r}")
    for name, x in (("bias", biasa), ("residual", ra)):
        if x is not None:
            checks.check_float(op, name, x)
            if not _broadcasts_to(x.shape, shape):
                raise ValueError(f"{op}: {name} of shape {x.shape} does not broadcast to the product's shape {shape}")
            dtype = dt.result_type(dtype, x.dtype)
    if out_dtype is not None:
        dtype = dt.from_torch(out_dtype)
        checks.check_float(op, "out_dtype", fa.zeros((), dtype=dtype))
    return shape, dtype


@torch.library.custom_op("flyarray::matmul", mutates_args=())
def matmul(a: Tensor, b: Tensor, bias: Optional[Tensor], residual: Optional[Tensor], activation: Optional[str],
           out_dtype: Optional[torch.dtype]) -> Tensor:
    """[out_dtype]([residual +] [activation](a @ b [+ bias])), one GEMM with its epilogue fused."""
    _check_matmul(a, b, bias, residual, activation, out_dtype)
    y = _matmul(fa.asarray(a), fa.asarray(b), _fa(bias), _fa(residual), activation=activation,
                out_dtype=None if out_dtype is None else dt.from_torch(out_dtype))
    return _out(y, (a, b, bias, residual))


@matmul.register_fake
def _(a, b, bias, residual, activation, out_dtype):
    shape, dtype = _check_matmul(a, b, bias, residual, activation, out_dtype)
    return _empty(shape, dtype, a)


# ---- ragged_dot ----------------------------------------------------------------------------------------
def _check_ragged_dot(lhs, rhs, group_sizes):
    from flyarray.ops.library_ops import _check_host_group_sizes, _ragged_dot_abstract
    ((shape, dtype),) = _ragged_dot_abstract(*_avals("ragged_dot", lhs=lhs, rhs=rhs, group_sizes=group_sizes))
    _check_host_group_sizes(lhs, group_sizes)   # sizes in CPU memory (no fake): none negative, sum <= m
    return shape, dtype


@torch.library.custom_op("flyarray::ragged_dot", mutates_args=())
def ragged_dot(lhs: Tensor, rhs: Tensor, group_sizes: Tensor) -> Tensor:
    """Rows of group i of lhs [m, k] times rhs[i] [k, n] -> [m, n] (fa.ragged_dot)."""
    _check_ragged_dot(lhs, rhs, group_sizes)
    return _out(_ragged_dot(fa.asarray(lhs), fa.asarray(rhs), fa.asarray(group_sizes)), (lhs, rhs, group_sizes))


@ragged_dot.register_fake
def _(lhs, rhs, group_sizes):
    shape, dtype = _check_ragged_dot(lhs, rhs, group_sizes)
    return _empty(shape, dtype, lhs)


# ---- top_k -------------------------------------------------------------------------------------------
def _check_top_k(x, k):
    from flyarray.ops.library_ops import _top_k_abstract
    return _top_k_abstract(*_avals("top_k", x=x), k=k)


@torch.library.custom_op("flyarray::top_k", mutates_args=())
def top_k(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(values, int32 indices) of the k largest entries along the last axis (fa.top_k)."""
    _check_top_k(x, k)
    values, indices = _top_k(fa.asarray(x), k=k)
    return _out(values, (x,)), _out(indices, (x,))


@top_k.register_fake
def _(x, k):
    (vs, vd), (is_, id_) = _check_top_k(x, k)
    return _empty(vs, vd, x), _empty(is_, id_, x)


# ---- scaled_matmul and mx_quantize (no derivatives: quantized operands) ----------------------------------
def _check_scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype):
    from flyarray.ops.library_ops import _scaled_matmul_abstract
    avals = _avals("scaled_matmul", lhs=lhs, rhs=rhs, lhs_scales=lhs_scales, rhs_scales=rhs_scales)
    ((shape, dtype),) = _scaled_matmul_abstract(*[a for a in avals if a is not None],
                                                preferred_element_type=dt.from_torch(out_dtype).name,
                                                has_lhs_scales=lhs_scales is not None)
    return shape, dtype


@torch.library.custom_op("flyarray::scaled_matmul", mutates_args=())
def scaled_matmul(lhs: Tensor, rhs: Tensor, lhs_scales: Optional[Tensor], rhs_scales: Tensor,
                  out_dtype: torch.dtype) -> Tensor:
    """(lhs * lhs_scales) @ (rhs * rhs_scales)^T with OCP MX operands, K-major (fa.nn.scaled_matmul)."""
    _check_scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
    y = fa.nn.scaled_matmul(fa.asarray(lhs), fa.asarray(rhs), _fa(lhs_scales), fa.asarray(rhs_scales),
                            preferred_element_type=dt.from_torch(out_dtype))
    return _out(y, (lhs, rhs, lhs_scales, rhs_scales))


@scaled_matmul.register_fake
def _(lhs, rhs, lhs_scales, rhs_scales, out_dtype):
    shape, dtype = _check_scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
    return _empty(shape, dtype, lhs)


def _check_mx_quantize(x, fmt, axis, block_size):
    from flyarray.quant import _quantize_abstract
    (xa,) = _avals("mx_quantize", x=x)
    if xa.shape:  # the abstract rule checks the range too; this names the torch op first
        views.normalize_axis(axis, len(xa.shape), "mx_quantize: axis")
    return _quantize_abstract(xa, fmt=fmt, axis=axis, block_size=block_size)


@torch.library.custom_op("flyarray::mx_quantize", mutates_args=())
def mx_quantize(x: Tensor, fmt: str, axis: int, block_size: int) -> tuple[Tensor, Tensor]:
    """(data, E8M0 scales) of x in MX format ``fmt`` (e4m3, e5m2, e2m1) along ``axis`` (fa.quant.mx_quantize)."""
    _check_mx_quantize(x, fmt, axis, block_size)
    data, scales = fa.quant.mx_quantize(fa.asarray(x), fmt, axis, block_size)
    return _out(data, (x,)), _out(scales, (x,))


@mx_quantize.register_fake
def _(x, fmt, axis, block_size):
    (ds, dd), (ss, sd) = _check_mx_quantize(x, fmt, axis, block_size)
    return _empty(ds, dd, x), _empty(ss, sd, x)


# ---- derivatives: one custom op, fa.vjp of the forward ---------------------------------------------------
def vjp_arrays(op, kwargs, cotangents, primals, wanted):
    """On fa arrays (None where absent): the cotangents of the ``wanted`` primals of ``FORWARD[op]``,
    each in its primal's dtype. flyarray::vjp runs this under fa.jit; the torch.compile backend
    records it inside a region, so the backward fuses with what is around it."""
    present = [i for i, p in enumerate(primals) if p is not None]

    def f(*arrays):
        full = [None] * len(primals)
        for i, a in zip(present, arrays):
            full[i] = a
        return FORWARD[op](*full, **kwargs)

    out, pull = fa.vjp(f, *[primals[i] for i in present])
    grads = dict(zip(present, pull(tuple(cotangents) if isinstance(out, tuple) else cotangents[0])))
    return [grads[i] if grads[i].dtype == primals[i].dtype else grads[i].astype(primals[i].dtype)
            for i, w in enumerate(wanted) if w]


def _check_vjp(op, statics, cotangents, primals, wanted):
    """flyarray::vjp's arguments: a known op, statics a JSON object of its keyword arguments, one ``wanted`` flag
    per primal (a wanted one present), the primals and statics a call of the op takes."""
    import inspect
    if op not in FORWARD:
        raise ValueError(f"flyarray::vjp: unknown op {op!r}; expected one of {sorted(FORWARD)}")
    try:
        kwargs = json.loads(statics)
    except ValueError:
        kwargs = None
    if not isinstance(kwargs, dict):
        raise ValueError(f"flyarray::vjp: statics must be a JSON object of {op}'s keyword arguments, got {statics!r}")
    if len(wanted) != len(primals):
        raise ValueError(f"flyarray::vjp: {len(wanted)} wanted flags for {len(primals)} primals; give one per primal")
    missing = [i for i, (p, w) in enumerate(zip(primals, wanted)) if w and p is None]
    if missing:
        raise ValueError(f"flyarray::vjp: primals {missing} are wanted but None")
    try:
        inspect.signature(FORWARD[op]).bind(*primals, **kwargs)
    except TypeError as e:
        raise ValueError(f"flyarray::vjp: {op} does not take {len(primals)} primals and statics {sorted(kwargs)}: "
                         f"{e}") from None


@functools.lru_cache(maxsize=256)
def _jitted_vjp(op, statics, wanted):
    """One fa.jit per (op, statics, wanted): later calls replay the traced plan (no re-recording)."""
    kwargs = json.loads(statics)
    return fa.jit(lambda cotangents, primals: vjp_arrays(op, kwargs, cotangents, primals, list(wanted)))


@torch.library.custom_op("flyarray::vjp", mutates_args=())
def vjp(op: str, statics: str, cotangents: list[Optional[Tensor]], primals: list[Optional[Tensor]],
        wanted: list[bool]) -> list[Tensor]:
    """The cotangents of ``primals`` (those ``wanted``) for flyarray op ``op`` through ``fa.vjp``.

    ``statics`` is the op's non-tensor arguments as JSON (a string keeps the schema one for every op)."""
    _check_vjp(op, statics, cotangents, primals, wanted)
    grads = _jitted_vjp(op, statics, tuple(bool(w) for w in wanted))(list(cotangents), list(primals))
    result = []
    for g in grads:  # two cotangents may be one array (d(x + r)/dx == d(x + r)/dr): _out clones the second
        result.append(_out(g, primals + cotangents + result))
    return result


@vjp.register_fake
def _(op, statics, cotangents, primals, wanted):
    _check_vjp(op, statics, cotangents, primals, wanted)
    return [torch.empty(p.shape, dtype=p.dtype, device=p.device) for p, w in zip(primals, wanted) if w]


def _json(value):
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def _register_autograd(custom, name, n_tensors, static_names, differentiable, check=None):
    """Backward of ``custom`` (tensors first, then statics in its schema) through flyarray::vjp. ``check``
    (inputs -> None, or raises) refuses a call whose inputs want a gradient the op does not have."""
    def setup_context(ctx, inputs, output):
        if check is not None:
            check(inputs)
        ctx.statics = json.dumps({k: _json(v) for k, v in zip(static_names, inputs[n_tensors:])})
        ctx.save_for_backward(*inputs[:n_tensors])

    def backward(ctx, *grads):
        primals = list(ctx.saved_tensors)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (*grads, *primals)):
            # create_graph=True: flyarray::vjp's result would be cut from the graph (second derivatives
            # silently wrong), so refused
            raise RuntimeError(f"flyarray::{name}: no second derivative: backward with create_graph=True (double "
                               "backward, gradient penalties) through it is not supported; use the torch op there")
        wanted = [bool(ctx.needs_input_grad[i]) and i in differentiable and primals[i] is not None
                  for i in range(n_tensors)]
        cts = [g if g is not None and g.is_floating_point() else None for g in grads]
        got = iter(torch.ops.flyarray.vjp(name, ctx.statics, cts, primals, wanted) if any(wanted) else [])
        return tuple(next(got) if w else None for w in wanted) + (None,) * len(static_names)

    custom.register_autograd(backward, setup_context=setup_context)


def _no_mx_gradient(inputs):
    lhs, rhs, lhs_scales = inputs[:3]
    if lhs_scales is not None and lhs.requires_grad:
        raise RuntimeError("flyarray::scaled_matmul: an MX lhs (lhs_scales given) is quantized storage, which has "
                           "no gradient; pass bf16/fp16 activations (lhs_scales=None) to train through it, or run "
                           "it under torch.no_grad()")
    if rhs.requires_grad:   # (a float8 tensor can require grad; a uint8 one cannot)
        raise RuntimeError("flyarray::scaled_matmul: rhs is MX storage, which has no gradient; pass it detached "
                           "(rhs.detach()) or run under torch.no_grad()")


_register_autograd(rms_norm, "rms_norm", 2, ("eps",), {0, 1})
_register_autograd(add_rms_norm, "add_rms_norm", 3, ("eps",), {0, 1, 2})
_register_autograd(softmax, "softmax", 1, ("dim", "log"), {0})
_register_autograd(dot_product_attention, "dot_product_attention", 5, ("scale", "is_causal"), {0, 1, 2, 3})
_register_autograd(matmul, "matmul", 4, ("activation", "out_dtype"), {0, 1, 2, 3})
_register_autograd(ragged_dot, "ragged_dot", 3, (), {0, 1})
_register_autograd(top_k, "top_k", 1, ("k",), {0})
# a bf16/fp16 lhs (weight-only MX: accelerate(mx=...)) has a gradient; MX storage operands have none
_register_autograd(scaled_matmul, "scaled_matmul", 4, ("out_dtype",), {0}, check=_no_mx_gradient)


def _no_quantize_gradient(inputs):
    if inputs[0].requires_grad:   # else its data came back requiring grad, and backward failed in torch's words
        raise RuntimeError("flyarray::mx_quantize: x requires grad, but quantizing has no derivative (its output is "
                           "MX storage); pass x.detach() or run under torch.no_grad()")


_register_autograd(mx_quantize, "mx_quantize", 1, ("fmt", "axis", "block_size"), set(), check=_no_quantize_gradient)

OPS = ("rms_norm", "add_rms_norm", "softmax", "dot_product_attention", "attention_forward", "attention_backward",
       "matmul", "ragged_dot", "top_k", "scaled_matmul", "mx_quantize", "vjp")
