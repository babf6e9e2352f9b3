"""flyarray <-> PyTorch: zero-copy round trips, torch custom ops backed by our kernels, and the
``torch.compile`` backend (docs/torch.md).

    import flyarray.interop.torch as fat
    y = fat.rms_norm(x, w)                        # torch.ops.flyarray.rms_norm: autograd and torch.compile see it
    f = fat.function(lambda a, b: fa.silu(a) * b)  # torch tensors in, torch tensors out, fused and cached
    model = fat.accelerate(model)                 # torch.compile(model, backend="flyarray")
"""
from __future__ import annotations

import collections.abc
import inspect

import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad

import flyarray as fa

from . import torch_backend, torch_ops  # importing torch_ops registers torch.ops.flyarray.*

torch_backend.register()  # backend="flyarray" from a source tree too (a pip install registers the entry point)


def to_torch(x) -> torch.Tensor:
    """The array as a torch tensor (same memory where torch can express the layout)."""
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"to_torch: expected an fa.Array (or another DLPack exporter), got {type(x).__name__}")
    return torch.from_dlpack(x)


def from_torch(t: torch.Tensor):
    """A flyarray Array over the tensor's memory (no copy)."""
    return fa.asarray(t)


def function(fn):
    """Wrap ``fn`` (written with fa ops) so it takes and returns torch tensors; traced once per signature.

    No autograd: use the differentiable ops below, or torch, where gradients are needed. With inputs that require
    grad (and grad mode on) the float outputs require grad too, and a backward through them raises.
    """
    if not callable(fn):
        raise TypeError(f"function: expected a function, got {type(fn).__name__}")
    jitted = fa.jit(fn)

    def wrapped(*args, **kwargs):
        if _functorch_level() is not None or _forward_ad._current_level >= 0:   # 0.2 us: only inside a transform
            _refuse_torch_transforms(args, kwargs)
        # keywords as fa.jit takes them (tensors traced, other values static); any pytree of arrays comes
        # back with the same structure, each leaf a tensor over its memory
        out = jitted.call_returning_tensors(*args, **kwargs)
        if torch.is_grad_enabled():
            wanting = _wanting_grad(args, kwargs)
            if wanting:
                return _without_derivative(out, wanting)
        return out

    wrapped.__wrapped__ = fn
    return wrapped


_functorch_level = torch._C._functorch.maybe_current_level


def _refuse_torch_transforms(args, kwargs):
    """A tensor of torch.func's (vmap, grad, jvp wrap their inputs) or a forward-AD dual: fat.function has no
    batching or derivative rule for torch's transforms, which failed inside torch ("Cannot access data pointer
    of Tensor that doesn't have storage") or dropped a dual's tangent without a word."""
    for t in fa.tree_util.tree_leaves((args, kwargs)):
        if not isinstance(t, torch.Tensor):
            continue
        if torch._C._functorch.is_functorch_wrapped_tensor(t) or (
                _forward_ad._current_level >= 0 and _carries_a_tangent(t)):
            raise RuntimeError("fat.function: torch.func transforms (vmap, grad, jvp) and forward-mode AD cannot "
                               "see inside a flyarray function; transform the fa function instead (fa.vmap, "
                               "fa.grad, fa.jvp), or write the differentiable part with torch or fat's ops")


def _carries_a_tangent(t) -> bool:
    """Whether ``t`` has a forward-mode tangent: a constant computed inside torch.func.jvp is wrapped too, and has
    none. Under a vmap inside the jvp torch cannot unpack a dual ("Batching rule not implemented"): any wrapped
    tensor counts then."""
    try:
        return _forward_ad.unpack_dual(t).tangent is not None
    except RuntimeError:
        return torch._C._functorch.is_functorch_wrapped_tensor(t)


def _wanting_grad(args, kwargs) -> list:
    """The tensor arguments that require grad (plain tensor arguments checked without a tree walk)."""
    if not kwargs and all(type(a) is torch.Tensor for a in args):
        return [a for a in args if a.requires_grad]
    return [t for t in fa.tree_util.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]


class _NoDerivative(torch.autograd.Function):
    """The float outputs of a fat.function call whose inputs require grad, tied to those inputs by a backward
    that raises (torch's rule for an op without a derivative): cut from the graph instead, the gradient through
    the function was silently missing."""

    @staticmethod
    def forward(ctx, n_outputs, *tensors):
        return tuple(t.view_as(t) for t in tensors[:n_outputs])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("fat.function has no derivative: a gradient was asked through it. Use the differentiable "
                           "ops of flyarray.interop.torch (rms_norm, matmul, ...) or torch there, or detach the inputs")


def _without_derivative(out, wanting: list):
    leaves, treedef = fa.tree_util.tree_flatten(out)
    floats = [i for i, t in enumerate(leaves)
              if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
    if not floats:
        return out
    tied = _NoDerivative.apply(len(floats), *[leaves[i] for i in floats], *wanting)
    for i, t in zip(floats, tied):
        leaves[i] = t
    return fa.tree_util.tree_unflatten(treedef, leaves)


def rms_norm(x: torch.Tensor, weight=None, eps: float = 1e-6, residual=None):
    """Differentiable RMSNorm (``torch.ops.flyarray.rms_norm``); with ``residual`` returns (y, x + residual)
    (``torch.ops.flyarray.add_rms_norm``). Arguments are checked before any launch."""
    _tensors("rms_norm", x=x, weight=weight, residual=residual)
    if residual is None:
        return torch.ops.flyarray.rms_norm(x, weight, float(_number("rms_norm", "eps", eps)))
    return torch.ops.flyarray.add_rms_norm(x, residual, weight, float(_number("rms_norm", "eps", eps)))


def softmax(x: torch.Tensor, dim: int = -1, log: bool = False):
    """Differentiable softmax / log_softmax along ``dim`` (``torch.ops.flyarray.softmax``)."""
    _tensors("softmax", x=x)
    return torch.ops.flyarray.softmax(x, _int("softmax", "dim", dim), _bool("softmax", "log", log))


def dot_product_attention(q, k, v, bias=None, mask=None, *, scale=None, is_causal=False):
    """Differentiable flash attention in (batch, seq, heads, head_dim) layout
    (``torch.ops.flyarray.dot_product_attention``); GQA when key/value have fewer heads."""
    _tensors("dot_product_attention", query=q, key=k, value=v, bias=bias, mask=mask)
    scale = None if scale is None else float(_number("dot_product_attention", "scale", scale))
    return torch.ops.flyarray.dot_product_attention(q, k, v, bias, mask, scale,
                                                    _bool("dot_product_attention", "is_causal", is_causal))


def matmul(a, b, *, bias=None, activation=None, residual=None, out_dtype=None):
    """Differentiable ``[out_dtype]([residual +] [activation](a @ b [+ bias]))`` as one GEMM with a fused
    epilogue (``torch.ops.flyarray.matmul``); activation: relu, silu, gelu, gelu_tanh or None."""
    _tensors("matmul", a=a, b=b, bias=bias, residual=residual)
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"matmul: activation must be None or a str (relu, silu, gelu, gelu_tanh), got {activation!r}")
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"matmul: out_dtype must be None or a torch.dtype, got {out_dtype!r}")
    return torch.ops.flyarray.matmul(a, b, bias, residual, activation, out_dtype)


def ragged_dot(lhs, rhs, group_sizes):
    """Differentiable grouped GEMM (``torch.ops.flyarray.ragged_dot``): rows of group i of lhs [m, k] times
    rhs[i] [k, n]."""
    _tensors("ragged_dot", lhs=lhs, rhs=rhs, group_sizes=group_sizes)
    return torch.ops.flyarray.ragged_dot(lhs, rhs, group_sizes)


def top_k(x, k: int):
    """(values, int32 indices) of the k largest along the last axis (``torch.ops.flyarray.top_k``);
    differentiable in the values."""
    _tensors("top_k", x=x)
    return torch.ops.flyarray.top_k(x, _int("top_k", "k", k))


def scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype=torch.bfloat16):
    """MX GEMM (``torch.ops.flyarray.scaled_matmul``): operands from ``mx_quantize``, K-major."""
    _tensors("scaled_matmul", lhs=lhs, rhs=rhs, lhs_scales=lhs_scales, rhs_scales=rhs_scales)
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f"scaled_matmul: out_dtype must be a floating torch.dtype, got {out_dtype!r}")
    return torch.ops.flyarray.scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype)


def mx_quantize(x, fmt: str, axis: int = -1, block_size: int = 32):
    """(data, E8M0 scales) of x in MX format ``fmt`` (e4m3, e5m2, e2m1) (``torch.ops.flyarray.mx_quantize``)."""
    _tensors("mx_quantize", x=x)
    if not isinstance(fmt, str):
        raise TypeError(f"mx_quantize: fmt must be a str (e4m3, e5m2, e2m1), got {fmt!r}")
    return torch.ops.flyarray.mx_quantize(x, fmt, _int("mx_quantize", "axis", axis),
                                          _int("mx_quantize", "block_size", block_size))


def _number(op, name, value):
    from flyarray.ops import checks
    checks.check_number(op, name, value)  # fa.nn's message, word for word
    return value


def _bool(op, name, value):
    if not isinstance(value, bool):   # bool("False") is True: a string would switch the option on
        raise TypeError(f"{op}: {name} must be a bool, got {value!r}")
    return value


def _int(op, name, value):
    """An int argument (a numpy integer too, as fa's ops take it), as a Python int for the custom op's schema."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{op}: {name} must be an int, got {value!r}")
    return int(value)


# ---- accelerate: the one-line form ------------------------------------------------------------------------
_MX = {"mxfp8": "e4m3", "mxfp4": "e2m1"}


def accelerate(model: torch.nn.Module, ops=None, mx=None, sample_input=None, **compile_kwargs):
    """``torch.compile(model, backend="flyarray")`` with flyarray's defaults: the module to call.

    ``ops``: which op families to lower (a collection of names from ``torch_backend.FAMILIES``:
    elementwise, matmul, attention, norm, softmax, topk), or a dict turning some off
    (``{"attention": False}``); None lowers all. Everything not lowered runs as torch ops.
    ``mx``: "mxfp8" or "mxfp4" swaps every eligible ``nn.Linear`` (in place) for MX weights with
    ``fa.quant.quantize_linear_weights`` (``sample_input`` lets it measure the error), computed by
    ``torch.ops.flyarray.scaled_matmul``; the returned module's ``mx_report`` is quantize_linear_weights'
    report (the layers replaced and skipped, the bytes, and with ``sample_input`` the measured ``rel_error``).
    ``compile_kwargs`` go to ``torch.compile`` (``dynamic=``, ``fullgraph=``...); they are checked before the model
    is touched."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"accelerate: model must be a torch.nn.Module, got {type(model).__name__}")
    families = _families(ops)
    _check_compile_kwargs(compile_kwargs)
    if mx is not None and mx not in _MX:
        raise ValueError(f"accelerate: mx must be one of {sorted(_MX)} or None, got {mx!r}")
    if sample_input is not None and mx is None:
        raise ValueError("accelerate: sample_input measures the error of MX weights; it needs mx='mxfp8' or 'mxfp4'")
    report = None
    if mx is not None:
        report = fa.quant.quantize_linear_weights(model, sample_input, weight_format=_MX[mx])
    backend = torch_backend.flyarray_backend if families is None else torch_backend.make_backend(families)
    compiled = torch.compile(model, backend=backend, **compile_kwargs)
    compiled.mx_report = report
    return compiled


def _check_compile_kwargs(compile_kwargs: dict) -> None:
    """What torch.compile would refuse, refused before ``mx`` swaps any layer: an error leaves the model as it was."""
    if "backend" in compile_kwargs:
        raise TypeError("accelerate: backend is flyarray's; use torch.compile(model, backend=...) for another")
    tuning = sorted(k for k in ("mode", "options") if k in compile_kwargs)
    if tuning:   # torch would only log that the backend ignores them, at the first call
        raise TypeError(f"accelerate: {' and '.join(tuning)} {'configure' if len(tuning) > 1 else 'configures'} "
                        f"Inductor; the flyarray backend takes no mode and no options")
    try:
        inspect.signature(torch.compile).bind(None, **compile_kwargs)
    except TypeError as e:
        raise TypeError(f"accelerate: torch.compile does not take {sorted(compile_kwargs)}: {e}") from None
    for name, none_ok in (("fullgraph", False), ("disable", False), ("dynamic", True)):   # torch asserts on these late
        value = compile_kwargs.get(name, False)
        if not (isinstance(value, bool) or none_ok and value is None):
            raise TypeError(f"accelerate: {name} must be a bool{' or None' if none_ok else ''}, got {value!r}")


def _families(ops):
    if ops is None:
        return None
    if isinstance(ops, (str, bytes)) or not isinstance(ops, collections.abc.Iterable):
        raise TypeError(f"accelerate: ops must be a collection of family names or a dict, got {ops!r}")
    if not isinstance(ops, dict):
        ops = list(ops)   # a one-shot iterable is read once, here
        if not all(isinstance(f, str) for f in ops):
            raise TypeError(f"accelerate: ops must name op families by str, got {ops!r}")
    unknown = set(ops) - set(torch_backend.FAMILIES)   # a dict's keys, or the collection's names
    if unknown:
        raise ValueError(f"accelerate: unknown op families {sorted(map(str, unknown))}; expected some of "
                         f"{torch_backend.FAMILIES}")
    if isinstance(ops, dict):
        bad = {k: v for k, v in ops.items() if not isinstance(v, bool)}
        if bad:   # "False" would be true
            raise TypeError(f"accelerate: ops dict values must be bools, got {bad!r}")
        return {f for f in torch_backend.FAMILIES if ops.get(f, True)}
    return set(ops)


def _tensors(op, **tensors):
    """A TypeError naming the argument for anything that is not a tensor (None where optional); a tangent for
    forward-mode AD refused (``_refuse_forward_mode``)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) and not (t is None and name in torch_ops._OPTIONAL):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if _forward_ad._current_level >= 0:   # a forward-AD level is open (torch.func.jvp opens one too)
        _refuse_forward_mode(op, tensors)


def _refuse_forward_mode(op, tensors):
    """torch's custom ops (ours) have no forward-mode rule, and torch gives their outputs a zero tangent under
    torch.func.jvp and none for a forward_ad dual, without a word: refused here instead. vmap (torch's fallback)
    and reverse mode (the registered backward) are fine."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and _carries_a_tangent(t):
            raise RuntimeError(f"fat.{op}: forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) does not "
                               f"reach flyarray's custom ops (torch would give {name}'s tangent as zero); use "
                               "reverse mode, or fa.jvp over fa's ops")
