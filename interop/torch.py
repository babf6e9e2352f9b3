"""flyarray <-> PyTorch: zero-copy round trips, and differentiable torch ops backed by our kernels.

    import flyarray.interop.torch as fat
    y = fat.rms_norm(x, w)                        # torch.autograd sees it; forward and backward are ours
    f = fat.function(lambda a, b: fa.silu(a) * b)  # torch tensors in, torch tensors out, fused and cached
"""
from __future__ import annotations

import torch

import flyarray as fa
from flyarray.ops import checks


def to_torch(x) -> torch.Tensor:
    """The array as a torch tensor (same memory where torch can express the layout)."""
    return torch.from_dlpack(x)


def from_torch(t: torch.Tensor):
    """A flyarray Array over the tensor's memory (no copy)."""
    return fa.asarray(t)


def function(fn):
    """Wrap ``fn`` (written with fa ops) so it takes and returns torch tensors; traced once per signature.

    No autograd: use the differentiable ops below, or torch, where gradients are needed.
    """
    jitted = fa.jit(fn)

    def wrapped(*args):
        out = jitted(*args)
        if isinstance(out, tuple):
            return tuple(torch.from_dlpack(o) for o in out)
        return torch.from_dlpack(out)

    wrapped.__wrapped__ = fn
    return wrapped


def rms_norm(x: torch.Tensor, weight=None, eps: float = 1e-6, residual=None):
    """Differentiable RMSNorm (kernels/rms_norm.py); with ``residual`` returns (y, x + residual).

    Arguments are checked as fa.nn.rms_norm checks them (flyarray/ops/checks.py) before any launch:
    the kernels trust shapes and dtypes (a short weight would be read past its end)."""
    from flyarray.kernels.rms_norm import rms_norm as _rms_norm
    op = "rms_norm"
    xa, wa, ra = _avals(op, x=x, weight=weight, residual=residual)
    checks.check_norm(op, xa, weight=wa, residual=ra, eps=eps, allowed=checks.KERNEL_FLOATS)
    return _rms_norm(x, weight, float(eps), residual)


def softmax(x: torch.Tensor, dim: int = -1, log: bool = False):
    """Differentiable softmax / log_softmax (kernels/softmax.py); checked as fa.nn.softmax is."""
    from flyarray.kernels.softmax import SoftmaxFunction
    op = "log_softmax" if log else "softmax"
    if not isinstance(log, bool):
        raise TypeError(f"softmax: log must be a bool, got {log!r}")
    (xa,) = _avals(op, x=x)
    dim = checks.check_softmax(op, xa, dim, checks.KERNEL_FLOATS, name="dim")
    return SoftmaxFunction.apply(x, dim, log)


def dot_product_attention(q, k, v, bias=None, mask=None, *, scale=None, is_causal=False):
    """Differentiable flash attention in (batch, seq, heads, head_dim) layout (kernels/attention.py).

    Checked by the rule fa.nn.dot_product_attention records with (ops/library_ops.py) before any launch."""
    from flyarray.kernels.attention import dot_product_attention as _attention
    from flyarray.ops.library_ops import _attention_abstract
    op = "dot_product_attention"
    avals = _avals(op, query=q, key=k, value=v, bias=bias, mask=mask)
    _attention_abstract(*[a for a in avals if a is not None], scale=scale, is_causal=bool(is_causal),
                        has_bias=bias is not None, has_mask=mask is not None)
    return _attention(q, k, v, bias, mask, scale=scale, is_causal=bool(is_causal))


_OPTIONAL = {"weight", "residual", "bias", "mask"}


def _avals(op, **tensors):
    """Shape/dtype/device of each tensor argument (None stays None); all on one device."""
    avals = {name: None if t is None and name in _OPTIONAL else checks.aval(op, name, t)
             for name, t in tensors.items()}
    checks.same_device(op, **avals)
    return tuple(avals.values())
