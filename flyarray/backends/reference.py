"""The reference backend: a scheduled kernel evaluated op by op with torch eager.

It computes each value in its own dtype (as eager code would), so it is both
the CPU default and the oracle that check mode compares fused kernels with.
"""
from __future__ import annotations

import torch

from ..primitives import ELEMENTWISE, REDUCE
from ..kernel_ir import Const, Elementwise, Iota, Kernel, Load, Reduce
from ..views import View


def strided(t: torch.Tensor, view: View) -> torch.Tensor:
    """``t``'s elements through ``view`` (negative strides become flips)."""
    neg = [d for d, s in enumerate(view.strides) if s < 0 and view.shape[d] > 1]
    offset = view.offset
    strides = list(view.strides)
    for d in neg:
        offset += (view.shape[d] - 1) * strides[d]
        strides[d] = -strides[d]
    strides = [abs(s) for s in strides]
    out = torch.as_strided(t, view.shape, strides, t.storage_offset() + offset)
    return out.flip(neg) if neg else out


def run_kernel(kernel: Kernel, inputs: list, outputs: list, scalars: list):
    shapes = {"full": kernel.full_shape, "outer": kernel.keep_shape}
    values = []
    for op in kernel.ops:
        values.append(_evaluate(op, values, inputs, scalars, shapes, kernel.axes))
    for st, out in zip(kernel.stores, outputs):
        dest = strided(out, st.view)
        dest.copy_(values[st.op].expand(dest.shape))


def _evaluate(op, values, inputs, scalars, shapes, axes) -> torch.Tensor:
    device = inputs[0].device if inputs else None
    if isinstance(op, Load):
        return strided(inputs[op.input], op.view)
    if isinstance(op, Const):
        return torch.full(shapes[op.domain], scalars[op.slot], dtype=op.dtype.torch, device=device)
    if isinstance(op, Iota):
        top = op.view.offset + sum((n - 1) * s for n, s in zip(op.view.shape, op.view.strides) if s > 0 and n > 0)
        index = strided(torch.arange(top + 1, dtype=torch.int64, device=device), op.view)
        if op.params[0] == "ramp":
            vals = op.params[1] + index.double() * op.params[2]
            if op.dtype.kind in "iu":
                vals = op.params[1] + index * op.params[2]
            return vals.to(op.dtype.torch)
        k, ncols = op.params[1], op.params[2]
        return ((index % ncols) - (index // ncols) == k).to(op.dtype.torch)
    if isinstance(op, Elementwise):
        args = [values[a] for a in op.args]
        if op.prim == "astype":
            return args[0].to(op.dtype.torch)
        out = ELEMENTWISE[op.prim].reference(*args)
        return out.to(op.dtype.torch)
    if isinstance(op, Reduce):
        arg = values[op.arg]
        return REDUCE[op.prim].reference(arg, axes).to(op.dtype.torch)
    raise TypeError(f"unknown op {op}")
