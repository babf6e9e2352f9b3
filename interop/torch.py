"""flyarray <-> PyTorch: zero-copy round trips, torch custom ops backed by our kernels, and the
``torch.compile`` backend (docs/torch.md).

    import flyarray.interop.torch as fat
    y = fat.rms_norm(x, w)                        # torch.ops.flyarray.rms_norm: autograd and torch.compile see it
    f = fat.function(lambda a, b: fa.silu(a) * b)  # torch tensors in, torch tensors out, fused and cached
    model = fat.accelerate(model)                 # torch.compile(model, backend="flyarray")
"""
from __future__ import annotations

import torch

import flyarray as fa
from . import torch_ops  # noqa: F401  (registers torch.ops.flyarray.*)


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
    """Differentiable RMSNorm (``torch.ops.flyarray.rms_norm``); with ``residual`` returns (y, x + residual)
    (``torch.ops.flyarray.add_rms_norm``). Arguments are checked before any launch."""
    if residual is None:
        return torch.ops.flyarray.rms_norm(x, weight, float(_number("rms_norm", "eps", eps)))
    return torch.ops.flyarray.add_rms_norm(x, residual, weight, float(_number("rms_norm", "eps", eps)))


def softmax(x: torch.Tensor, dim: int = -1, log: bool = False):
    """Differentiable softmax / log_softmax along ``dim`` (``torch.ops.flyarray.softmax``)."""
    if not isinstance(log, bool):
        raise TypeError(f"softmax: log must be a bool, got {log!r}")
    return torch.ops.flyarray.softmax(x, _int("softmax", "dim", dim), log)


def dot_product_attention(q, k, v, bias=None, mask=None, *, scale=None, is_causal=False):
    """Differentiable flash attention in (batch, seq, heads, head_dim) layout
    (``torch.ops.flyarray.dot_product_attention``); GQA when key/value have fewer heads."""
    scale = None if scale is None else float(_number("dot_product_attention", "scale", scale))
    return torch.ops.flyarray.dot_product_attention(q, k, v, bias, mask, scale, bool(is_causal))


def matmul(a, b, *, bias=None, activation=None, residual=None, out_dtype=None):
    """Differentiable ``[out_dtype]([residual +] [activation](a @ b [+ bias]))`` as one GEMM with a fused
    epilogue (``torch.ops.flyarray.matmul``); activation: relu, silu, gelu, gelu_tanh or None."""
    return torch.ops.flyarray.matmul(a, b, bias, residual, activation, out_dtype)


def ragged_dot(lhs, rhs, group_sizes):
    """Differentiable grouped GEMM (``torch.ops.flyarray.ragged_dot``): rows of group i of lhs [m, k] times
    rhs[i] [k, n]."""
    return torch.ops.flyarray.ragged_dot(lhs, rhs, group_sizes)


def top_k(x, k: int):
    """(values, int32 indices) of the k largest along the last axis (``torch.ops.flyarray.top_k``);
    differentiable in the values."""
    return torch.ops.flyarray.top_k(x, _int("top_k", "k", k))


def scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype=torch.bfloat16):
    """MX GEMM (``torch.ops.flyarray.scaled_matmul``): operands from ``mx_quantize``, K-major."""
    return torch.ops.flyarray.scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype)


def mx_quantize(x, fmt: str, axis: int = -1, block_size: int = 32):
    """(data, E8M0 scales) of x in MX format ``fmt`` (e4m3, e5m2, e2m1) (``torch.ops.flyarray.mx_quantize``)."""
    if not isinstance(fmt, str):
        raise TypeError(f"mx_quantize: fmt must be a str (e4m3, e5m2, e2m1), got {fmt!r}")
    return torch.ops.flyarray.mx_quantize(x, fmt, _int("mx_quantize", "axis", axis),
                                          _int("mx_quantize", "block_size", block_size))


def _number(op, name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a real number, got {value!r}")
    return value


def _int(op, name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int, got {value!r}")
    return value
