"""The reference backend: a scheduled kernel evaluated op by op with torch eager.

It computes each value in its own dtype (as eager code would), so it is both
the CPU default and the oracle that check mode compares fused kernels with.
``compile_kernel`` turns a Kernel into a list of closures once (a plan keeps
it), so an evaluation does only the torch calls.
"""
from __future__ import annotations

import torch

from ..kernel_ir import Const, Elementwise, Iota, Kernel, Load, Reduce
from ..primitives import ELEMENTWISE, REDUCE
from ..views import View


def strided(t: torch.Tensor, view: View) -> torch.Tensor:
    """``t``'s elements through ``view`` (negative strides become flips)."""
    return _strided_reader(view)(t)


def _strided_reader(view: View):
    """A function t -> t's elements through ``view``, with the stride arithmetic done once."""
    neg = [d for d, s in enumerate(view.strides) if s < 0 and view.shape[d] > 1]
    offset = view.offset
    strides = list(view.strides)
    for d in neg:
        offset += (view.shape[d] - 1) * strides[d]
        strides[d] = -strides[d]
    shape, strides = tuple(view.shape), tuple(abs(s) for s in strides)
    as_strided = torch.as_strided
    if neg:
        return lambda t: as_strided(t, shape, strides, t.storage_offset() + offset).flip(neg)
    return lambda t: as_strided(t, shape, strides, t.storage_offset() + offset)


def run_kernel(kernel: Kernel, inputs: list, outputs: list, scalars: list):
    compile_kernel(kernel)(inputs, outputs, scalars)


def compile_kernel(kernel: Kernel):
    """``run(inputs, outputs, scalars)`` evaluating ``kernel`` with torch eager."""
    shapes = {"full": kernel.full_shape, "outer": kernel.keep_shape}
    steps = [_compile_op(op, shapes, kernel.axes) for op in kernel.ops]
    stores = [(st.op, _strided_reader(st.view), st.view.shape) for st in kernel.stores]

    def run(inputs, outputs, scalars):
        values = []
        for step in steps:
            values.append(step(values, inputs, scalars))
        for (op, dest_of, shape), out in zip(stores, outputs):
            value = values[op]
            dest_of(out).copy_(value if value.shape == shape else value.expand(shape))
    return run


def _compile_op(op, shapes, axes):
    if isinstance(op, Load):
        read, index = _strided_reader(op.view), op.input
        return lambda values, inputs, scalars: read(inputs[index])
    if isinstance(op, Const):
        shape, dtype, slot = shapes[op.domain], op.dtype.torch, op.slot
        return lambda values, inputs, scalars: torch.full((), scalars[slot], dtype=dtype, device=(
            inputs[0].device if inputs else None)).expand(shape)
    if isinstance(op, Iota):
        return lambda values, inputs, scalars: _iota(op, inputs[0].device if inputs else None)
    dtype = op.dtype.torch
    if isinstance(op, Elementwise):
        args = op.args
        if op.prim == "astype":
            a = args[0]
            return lambda values, inputs, scalars: values[a].to(dtype)
        fn = ELEMENTWISE[op.prim].reference

        def elementwise(values, inputs, scalars):
            out = fn(*[values[a] for a in args])
            return out if out.dtype is dtype else out.to(dtype)
        return elementwise
    if isinstance(op, Reduce):
        fn, arg = REDUCE[op.prim].reference, op.arg
        return lambda values, inputs, scalars: fn(values[arg], axes).to(dtype)
    raise TypeError(f"unknown op {op}")


def _iota(op: Iota, device) -> torch.Tensor:
    top = op.view.offset + sum((n - 1) * s for n, s in zip(op.view.shape, op.view.strides) if s > 0 and n > 0)
    index = strided(torch.arange(top + 1, dtype=torch.int64, device=device), op.view)
    if op.params[0] == "ramp":
        vals = op.params[1] + index.double() * op.params[2]
        if op.dtype.kind in "iu":
            vals = op.params[1] + index * op.params[2]
        return vals.to(op.dtype.torch)
    k, ncols = op.params[1], op.params[2]
    return ((index % ncols) - (index // ncols) == k).to(op.dtype.torch)
