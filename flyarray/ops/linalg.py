"""matmul as a library-op node (its kernel lives in flyarray/kernels/gemm.py)."""
from __future__ import annotations

import torch

from .. import dtypes as dt
from .. import views
from .core import node_of
from .library import Library, call


def _matmul_abstract(a, b):
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: operands have dtypes {a.dtype} and {b.dtype}; cast one with astype")
    if a.dtype.kind not in "f" or a.dtype in dt.STORAGE_ONLY:
        raise TypeError(f"matmul: {a.dtype} operands are not supported (use float16, bfloat16, float32, float64, "
                        "or fa.nn.scaled_matmul for fp8/MX)")
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise AssertionError("matmul operands are at least 2-D here")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} "
                         f"({a.shape[-1]} != {b.shape[-2]})")
    batch = views.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [(batch + (a.shape[-2], b.shape[-1]), a.dtype)]


def _matmul_kernel(a, b):
    from ..kernels import gemm
    return gemm.matmul(a, b)


def _matmul_reference(a, b):
    return torch.matmul(a, b)


MATMUL = Library("matmul", _matmul_abstract, _matmul_kernel, _matmul_reference)


def matmul(x1, x2, /):
    """x1 @ x2 with the array API's rules: 1-D operands gain and lose an axis, batch axes broadcast."""
    a, b = node_of(x1), node_of(x2)
    if not a.shape or not b.shape:
        raise ValueError(f"matmul: operands must have at least one dimension, got {a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        d = dt.promote(a.dtype, b.dtype)
        x1, x2 = x1.astype(d, copy=False), x2.astype(d, copy=False)
    if x1.dtype.kind != "f":
        raise TypeError(f"matmul: {x1.dtype} operands are not supported; cast to a float dtype first")
    lhs = x1[None, :] if x1.ndim == 1 else x1
    rhs = x2[:, None] if x2.ndim == 1 else x2
    (out,) = call(MATMUL, [lhs, rhs])
    if x1.ndim == 1:
        out = out[..., 0, :]
    if x2.ndim == 1:
        out = out[..., 0]
    return out


def vecdot(x1, x2, /, *, axis=-1):
    from .reductions import sum
    return sum(x1 * x2, axis=axis)
