"""Argument checks shared by ``fa.nn`` and ``flyarray.interop.torch``: one rule, one message, for both.

Each check takes avals: anything with ``shape`` (a tuple) and ``dtype`` (a flyarray DType), such as a
graph node, an Array, or ``aval(torch_tensor)``. Nothing is read from memory; everything is raised
before any work.
"""
from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np
import torch

from .. import dtypes as dt
from .. import views

KERNEL_FLOATS = (dt.float16, dt.bfloat16, dt.float32)  # what the hand-written kernels compute on
ATTENTION_MAX_HEAD_DIM = 256  # the attention kernels' widest head (padded to a power of two, tables to 256)


def check_attention_head_dim(op: str, head_dim: int):
    """The attention kernels take head_dim up to ATTENTION_MAX_HEAD_DIM."""
    if head_dim > ATTENTION_MAX_HEAD_DIM:
        raise ValueError(f"{op}: head_dim {head_dim} is past the attention kernels' {ATTENTION_MAX_HEAD_DIM} "
                         "(fa.nn.dot_product_attention computes wider heads with fused primitives)")
# the dtypes check_float accepts: floating, not storage-only (fa.nn's fast paths test membership)
COMPUTE_FLOATS = frozenset(d for d in dt.ALL if d.kind == "f" and d not in dt.STORAGE_ONLY)


class Aval(NamedTuple):
    shape: tuple
    dtype: dt.DType
    device: torch.device


def aval(op: str, name: str, t) -> Aval:
    """A torch tensor's shape, dtype and device; a TypeError naming the argument for anything else."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{op}: {name} is a {t.layout} tensor; only dense (strided) ones are taken: use t.to_dense()")
    try:
        d = dt.from_torch(t.dtype)
    except TypeError:
        raise TypeError(f"{op}: {name} has dtype {t.dtype}, which flyarray does not support") from None
    return Aval(tuple(t.shape), d, t.device)


def same_device(op: str, **avals):
    """All the given (non-None) avals live on one device."""
    devices = {f"{n} on {a.device}" for n, a in avals.items() if a is not None}
    if len({a.device for a in avals.values() if a is not None}) > 1:
        raise ValueError(f"{op}: arguments live on different devices: {', '.join(sorted(devices))}")


def check_float(op: str, name: str, x, allowed=None):
    """x has a floating dtype that can be computed on (float8 is storage only), or one of ``allowed``."""
    if allowed is not None and x.dtype not in allowed:
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected one of {', '.join(map(str, allowed))}")
    if x.dtype not in COMPUTE_FLOATS:
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected a floating-point dtype "
                        "(float8 types are storage only: cast them with astype first)")


def check_bool(op: str, name: str, value) -> bool:
    """A flag as a bool (numpy's too); anything else a TypeError: bool("False") would switch it on."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{op}: {name} must be a bool, got {value!r} of type {type(value).__name__}")


def check_number(op: str, name: str, value, *, optional=False):
    if optional and value is None:
        return
    if type(value) is float or type(value) is int:  # the common case, without the ABC check below
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op}: {name} must be a real number, got {value!r} of type {type(value).__name__}")


def check_softmax(op: str, x, axis, allowed=None, name: str = "axis") -> int:
    """softmax / log_softmax: a float x and an axis in range; returns the axis, normalized."""
    check_float(op, "x", x, allowed)
    return views.normalize_axis(axis, len(x.shape), f"{op}: {name}")


def check_norm(op: str, x, *, weight=None, bias=None, residual=None, eps=0.0, allowed=None):
    """rms_norm / layer_norm over the last axis: x at least 1-D and float; weight and bias of the last
    axis's size; residual of x's shape; all floats (``allowed`` narrows them to what a kernel takes)."""
    check_float(op, "x", x, allowed)
    if not x.shape:
        raise ValueError(f"{op}: x must have at least one dimension (it normalizes the last axis), got shape ()")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if tuple(p.shape) != tuple(x.shape[-1:]):
            raise ValueError(f"{op}: {name} shape {tuple(p.shape)} does not match the last axis of {tuple(x.shape)}")
        check_float(op, name, p, allowed)
    if residual is not None:
        if tuple(residual.shape) != tuple(x.shape):
            raise ValueError(f"{op}: residual shape {tuple(residual.shape)} differs from x's {tuple(x.shape)}")
        check_float(op, "residual", residual, allowed)
    check_number(op, "eps", eps)
    if not eps >= 0:   # NaN too: it would turn every output into NaN
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
