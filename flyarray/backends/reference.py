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


def compile_kernel(kernel: Kernel, input_views=None, output_shapes=None):
    """``run(inputs, outputs, scalars) -> outputs`` evaluating ``kernel`` with torch eager.

    ``input_views[i]``, where known, is how input i lies in memory: a load that reads it whole
    then takes the tensor itself. An output given as None is produced (a contiguous buffer of
    ``output_shapes[k]``): the computed tensor becomes the buffer when it is fresh and laid out as
    that buffer would be (no copy), else a new buffer receives it.
    """
    shapes = {"full": kernel.full_shape, "outer": kernel.keep_shape}
    input_views = input_views or [None] * kernel.n_inputs
    steps = [_compile_op(op, shapes, kernel.axes, input_views, kernel.ops) for op in kernel.ops]
    for i in _scalars_only(kernel):  # read as Python scalars only: no tensor to make
        steps[i] = _nothing
    stores = []
    output_shapes = output_shapes or [st.view.shape for st in kernel.stores]
    for st, buffer_shape in zip(kernel.stores, output_shapes):
        fresh = st.view.is_contiguous() and isinstance(kernel.ops[st.op], (Elementwise, Reduce))
        stores.append((st.op, _strided_reader(st.view), st.view.shape, tuple(buffer_shape), st.dtype.torch, fresh))

    def run(inputs, outputs, scalars):
        values = []
        for step in steps:
            values.append(step(values, inputs, scalars))
        results = []
        for (op, dest_of, shape, buffer_shape, dtype, fresh), out in zip(stores, outputs):
            value = values[op]
            if out is None:
                if fresh and value.shape == shape and value.dtype is dtype and value.is_contiguous() \
                        and not value._is_view() and all(value is not t for t in inputs):
                    results.append(value if shape == buffer_shape else value.view(buffer_shape))  # no copy
                    continue
                out = torch.empty(buffer_shape, dtype=dtype, device=value.device)
            dest_of(out).copy_(value if value.shape == shape else value.expand(shape))
            results.append(out)
        return results
    return run


_SCALAR_OPERAND = {"add": torch.add, "multiply": torch.mul, "subtract": torch.sub, "divide": torch.div}
_COMMUTES = {"add", "multiply"}


def _compile_op(op, shapes, axes, input_views, ops):
    if isinstance(op, Load):
        index = op.input
        if input_views[index] == op.view:  # reads the buffer exactly as it lies: the tensor itself
            return lambda values, inputs, scalars: inputs[index]
        read = _strided_reader(op.view)
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
        scalar_form = _with_python_scalar(op, ops, dtype)
        if scalar_form is not None:
            return scalar_form
        fn = ELEMENTWISE[op.prim].reference

        def elementwise(values, inputs, scalars):
            out = fn(*[values[a] for a in args])
            return out if out.dtype is dtype else out.to(dtype)
        return elementwise
    if isinstance(op, Reduce):
        fn, arg = REDUCE[op.prim].reference, op.arg
        return lambda values, inputs, scalars: fn(values[arg], axes).to(dtype)
    raise TypeError(f"unknown op {op}")


def _nothing(values, inputs, scalars):
    return None


def _scalars_only(kernel) -> set:
    """Const ops that every user reads in the Python-scalar form (and no store writes)."""
    consts = {i for i, op in enumerate(kernel.ops) if isinstance(op, Const)}
    needed = {st.op for st in kernel.stores}
    for op in kernel.ops:
        if isinstance(op, Elementwise) and _scalar_operand(op, kernel.ops) is None:
            needed.update(op.args)
        elif isinstance(op, Reduce):
            needed.add(op.arg)
    return consts - needed


def _scalar_operand(op, ops):
    """(torch fn, tensor arg, const arg) when ``op`` can take its constant as a Python scalar."""
    fn = _SCALAR_OPERAND.get(op.prim)
    if fn is None or len(op.args) != 2 or op.in_dtype.kind not in "iuf" or op.dtype is not op.in_dtype:
        return None
    a, b = op.args
    if isinstance(ops[a], Const) and op.prim in _COMMUTES:
        a, b = b, a
    if isinstance(ops[a], Const) or not isinstance(ops[b], Const):
        return None
    return fn, a, b


def _with_python_scalar(op, ops, dtype):
    """``x + 0.5``: torch takes the Python scalar directly (same result dtype, no 0-d tensor made)."""
    found = _scalar_operand(op, ops)
    if found is None:
        return None
    fn, a, b = found
    slot = ops[b].slot
    return lambda values, inputs, scalars: fn(values[a], scalars[slot])


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
