"""flyarray <-> PyTorch: zero-copy round trips, and differentiable torch ops backed by our kernels.

    import flyarray.interop.torch as fat
    y = fat.rms_norm(x, w)                        # torch.autograd sees it; forward and backward are ours
    f = fat.function(lambda a, b: fa.silu(a) * b)  # torch tensors in, torch tensors out, fused and cached
"""
from __future__ import annotations

import torch

import flyarray as fa


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
    """Differentiable RMSNorm (kernels/rms_norm.py); with ``residual`` returns (y, x + residual)."""
    from flyarray.kernels.rms_norm import rms_norm as _rms_norm
    return _rms_norm(x, weight, eps, residual)


def softmax(x: torch.Tensor, dim: int = -1, log: bool = False):
    """Differentiable softmax / log_softmax (kernels/softmax.py)."""
    from flyarray.kernels.softmax import SoftmaxFunction
    return SoftmaxFunction.apply(x, dim, log)


def dot_product_attention(q, k, v, bias=None, mask=None, *, scale=None, is_causal=False):
    """Differentiable flash attention in (batch, seq, heads, head_dim) layout (kernels/attention.py)."""
    from flyarray.kernels.attention import dot_product_attention as _attention
    return _attention(q, k, v, bias, mask, scale=scale, is_causal=is_causal)
