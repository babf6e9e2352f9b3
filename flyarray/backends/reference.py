"""The reference backend: a scheduled kernel evaluated op by op with torch eager.

It computes each value in its own dtype, except float16/bfloat16 arithmetic, which it holds in
float32 and rounds where a kernel stores it (or a reduction or cast the user asked for rounds
it), as the generated kernels do (docs/semantics.md); under eager rounding every value is
rounded to its dtype, as eager torch code would. It is both the CPU default and the oracle that
check mode compares fused kernels with.
``compile_kernel`` turns a Kernel into a list of closures once (a plan keeps
it), so an evaluation does only the torch calls.
"""
from __future__ import annotations

from math import copysign
from typing import NamedTuple

import torch

from .. import config, unsigned
from ..diskcache import COMPILE_LOCK
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
    if neg:  # flipped through an integer view: torch has no flip for uint16/32/64 or float8
        return lambda t: unsigned.from_bits(
            unsigned.bits_view(as_strided(t, shape, strides, t.storage_offset() + offset)).flip(neg), t.dtype)
    return lambda t: as_strided(t, shape, strides, t.storage_offset() + offset)


def run_kernel(kernel: Kernel, inputs: list, outputs: list, scalars: list):
    made_on = next((t.device for t in outputs if t is not None), None)
    compile_kernel(kernel, device=made_on)(inputs, outputs, scalars)


def compile_kernel(kernel: Kernel, input_views=None, output_shapes=None, device=None):
    """``run(inputs, outputs, scalars) -> outputs`` evaluating ``kernel`` with torch eager.

    ``input_views[i]``, where known, is how input i lies in memory: a load that reads it whole
    then takes the tensor itself. An output given as None is produced (a contiguous buffer of
    ``output_shapes[k]``): the computed tensor becomes the buffer when it is fresh and laid out as
    that buffer would be (no copy), else a new buffer receives it.

    The kernel becomes one straight-line Python function (generated here from the kernel's own
    structure, never read from disk), so an evaluation pays for the torch calls and little else.
    """
    names = _Names([f"inputs[{i}]" for i in range(kernel.n_inputs)],
                   [f"scalars[{j}]" for j in range(len(kernel.scalar_dtypes))])
    env, body = _kernel_body(kernel, input_views, names, device)
    output_shapes = output_shapes or [st.view.shape for st in kernel.stores]
    stores = [_store_call(env, kernel, k, shape, f"outputs[{k}]", "inputs") for k, shape in enumerate(output_shapes)]
    body.append(f"return [{', '.join(stores)}]")
    return _define("run(inputs, outputs, scalars)", body, env, kernel)


def compile_step(kernel: Kernel, input_views, output_shapes, ins, outs, made, scalar_slots, stats, device=None):
    """``compile_kernel`` as a plan step ``step(slots, scalars)``: input i is ``slots[ins[i]]``, scalar j
    is ``scalars[scalar_slots[j]]``, output k goes to ``slots[outs[k]]`` (produced when its slot is in
    ``made``, else written into the buffer already there); counts the launch in ``stats``.

    The code reads the plan's slots and scalars where they are and writes its outputs there: no lists
    to build and no function to call per evaluation beyond the torch calls (on the CPU the Python
    around a small kernel's calls is a good part of its time)."""
    names = _Names([f"slots[{i}]" for i in ins], [f"scalars[{j}]" for j in scalar_slots])
    env, body = _kernel_body(kernel, input_views, names, device)
    env["stats"] = stats
    body.insert(0, 'stats["kernels_launched"] += 1')
    handed_over = _handed_over(kernel, output_shapes)
    for k, (st, o, shape) in enumerate(zip(kernel.stores, outs, output_shapes)):
        if o not in made:  # written into the buffer already there (the inputs are not consulted)
            body.append(f"slots[{o}] = {_store_call(env, kernel, k, shape, f'slots[{o}]', '()')}")
        elif k in handed_over:  # the fresh result becomes the buffer; copied only if torch strided it
            copy = _store_call(env, kernel, k, shape, "None", "()")
            body.append(f"slots[{o}] = v{st.op} if v{st.op}.is_contiguous() else {copy}")
        else:  # the store decides, and must know the inputs (one passed through is copied)
            inputs = f"({''.join(f'{name}, ' for name in names.inputs)})"
            body.append(f"slots[{o}] = {_store_call(env, kernel, k, shape, 'None', inputs)}")
    return _define("run(slots, scalars)", body, env, kernel)


class _Names(NamedTuple):
    """How the generated code names input i and scalar j: ``compile_kernel``'s arguments, or the
    plan's slots and scalars that a step reads in place."""
    inputs: list
    scalars: list


def _kernel_body(kernel: Kernel, input_views, names: _Names, device=None):
    """(env, lines) of the code computing each op's ``v{i}``; the objects the lines name go into env.
    ``device``: where a kernel without inputs makes its constants (its outputs' device; None: torch's default,
    which ``with torch.device("meta")`` around CPU work would make meta)."""
    shapes = {"full": kernel.full_shape, "outer": kernel.keep_shape}
    input_views = input_views or [None] * kernel.n_inputs
    env = {"torch": torch, "kernel_device": device}
    body = []
    skip = _scalars_only(kernel)  # read as Python scalars only: no tensor to make
    if any(isinstance(op, (Const, Iota)) for i, op in enumerate(kernel.ops) if i not in skip):
        body.append(f"dev = {names.inputs[0]}.device" if names.inputs else "dev = kernel_device")
    held = held_dtypes(kernel)
    reuse = _reusable_results(kernel, held)
    values = _value_shapes(kernel)
    for i, op in enumerate(kernel.ops):
        if i not in skip:
            # an elementwise value over broadcast inputs can be smaller than the kernel's domain: a reduction
            # reduces it over the domain (a sum over an axis it was broadcast along counts every copy)
            short = isinstance(op, Reduce) and values[op.arg] != tuple(kernel.full_shape)
            body += _emit_op(i, op, shapes, kernel.axes, input_views, kernel.ops, env, names, held, reuse.get(i),
                             expand_to=tuple(kernel.full_shape) if short else None)
    return env, body


def _store_call(env, kernel: Kernel, k: int, buffer_shape, out: str, inputs: str) -> str:
    """The call writing store k's value into ``out`` (None: a buffer it makes, or the value itself:
    ``_store``); the function goes into env."""
    st = kernel.stores[k]
    # a value stored twice (equal expressions share an op) becomes the buffer of its first store only; a cast to
    # the dtype a value already has is that value's tensor (asarray(x, copy=True), positive, stop_gradient):
    # never a buffer of its own
    op = kernel.ops[st.op]
    fresh = st.view.is_contiguous() and isinstance(op, (Elementwise, Reduce)) and not _aliases(kernel, st.op) \
        and all(earlier.op != st.op for earlier in kernel.stores[:k])
    env[f"store{k}"] = _store(_strided_reader(st.view), tuple(st.view.shape), tuple(buffer_shape),
                              st.dtype.torch, fresh)
    return f"store{k}(v{st.op}, {out}, {inputs})"


def _handed_over(kernel: Kernel, output_shapes) -> set:
    """Stores whose value can become the output buffer itself, checked here once: a tensor its torch
    call just allocated (``_allocating``: never an input, a view or an expanded constant), of the
    store's dtype and the buffer's shape, stored contiguously. Only whether torch laid it out
    contiguously is left to the run (an op over a transposed input gives a transposed result). One value
    stored twice (two equal expressions evaluated together share an op) is handed over once: each array
    gets a buffer of its own."""
    allocating, shapes, held = _allocating(kernel), _value_shapes(kernel), held_dtypes(kernel)
    found, given = set(), set()
    for k, (st, buffer_shape) in enumerate(zip(kernel.stores, output_shapes)):
        if st.op in allocating and st.op not in given and held[st.op] is st.dtype.torch \
                and st.view.is_contiguous() and shapes[st.op] == tuple(st.view.shape) == tuple(buffer_shape):
            found.add(k)
            given.add(st.op)
    return found


def _aliases(kernel, i) -> bool:
    """Whether op ``i``'s tensor may be its argument's tensor itself: a cast to the dtype held already
    (``_emit_op``), or torch.positive, which returns its argument (tests/test_reference_backend.py checks
    that no other unary reference does)."""
    op = kernel.ops[i]
    if not isinstance(op, Elementwise):
        return False
    if op.prim == "astype":
        held = held_dtypes(kernel)
        return held[i] is held[op.args[0]]
    return op.prim == "positive"


def _define(signature: str, body: list, env: dict, kernel: Kernel):
    source = f"def {signature}:\n" + "".join(f"    {line}\n" for line in body)
    with COMPILE_LOCK:  # see there: compile() in two threads at once can fail on CPython 3.11
        code = compile(source, f"<flyarray reference kernel {id(kernel):x}>", "exec")
    exec(code, env)
    return env["run"]


def _store(dest_of, shape, buffer_shape, dtype, fresh):
    def store(value, out, inputs):
        if out is None:
            if fresh and value.shape == shape and value.dtype is dtype and value.is_contiguous() \
                    and not value._is_view():
                for t in inputs:
                    if value is t:  # an input passed through: the output must be a buffer of its own
                        break
                else:
                    return value if shape == buffer_shape else value.view(buffer_shape)  # torch just made it
            out = torch.empty(buffer_shape, dtype=dtype, device=value.device)
        dest_of(out).copy_(value if value.shape == shape else value.expand(shape))
        return out
    return store


_SCALAR_OPERAND = {"add": torch.add, "multiply": torch.mul, "subtract": torch.sub, "divide": torch.div}
# torch functions that return their (same-dtype) float arguments' dtype (the check after them is skipped)
# and take ``out=`` (_reusable_results writes into a dead argument); tests/test_reliability.py checks both
_KEEPS_FLOAT_DTYPE = frozenset(("add", "subtract", "multiply", "divide", "negative", "exp", "log", "sin", "cos", "tan",
                                "tanh", "sqrt", "abs", "maximum", "minimum", "expm1", "log1p", "rsqrt", "sigmoid",
                                "square", "reciprocal", "erf", "erfc", "sinh", "cosh", "exp2", "log2", "log10", "atan", "asin",
                                "acos", "asinh", "atanh", "atan2", "hypot", "copysign", "logaddexp", "floor", "ceil",
                                "trunc", "round"))
_COMMUTES = {"add", "multiply"}


def _reusable_results(kernel, held=None) -> dict:
    """op index -> the earlier result it may overwrite (torch's ``out=``): a kernel's intermediates are
    its own, so a float op whose argument is read for the last time writes into that argument's
    tensor instead of allocating (on small CPU tensors the allocation is a third of an op's cost).

    Only results that ``_emit_op`` makes with a fresh allocation qualify -- a simple or scalar-operand
    torch call of one float dtype, or one that itself wrote into such a result -- and only when every
    op reading them is such a call too (any other reader, ``astype``'s ``.to`` or a reduction, might
    hand the same tensor on): never an input buffer, a view of one, an expanded constant, or a value
    a store still needs; and only into a tensor of the result's own shape."""
    ops = kernel.ops
    held = held or held_dtypes(kernel)
    allocating = _allocating(kernel)
    last_use, shared = {}, {st.op for st in kernel.stores}
    for i, op in enumerate(ops):
        reads = op.args if isinstance(op, Elementwise) else (op.arg,) if isinstance(op, Reduce) else ()
        for a in reads:
            last_use[a] = i
            if i not in allocating:
                shared.add(a)  # read by something that may pass the tensor itself on
    shape = _value_shapes(kernel)
    reuse = {}
    for i, tensors in allocating.items():
        for a in tensors:
            if a in allocating and a not in shared and last_use[a] == i and shape[a] == shape[i] \
                    and held[a] is held[i]:
                reuse[i] = a
                break
    return reuse


def _allocating(kernel) -> dict:
    """op -> its tensor arguments, for the ops whose torch call returns a fresh tensor of the op's own
    (float) dtype (as held: ``held_dtypes``): a scalar-operand call or one of ``_KEEPS_FLOAT_DTYPE`` over
    arguments of that dtype."""
    ops = kernel.ops
    allocating = {}
    for i, op in enumerate(ops):
        if isinstance(op, Elementwise) and op.dtype.kind == "f" and not unsigned.is_wide(op.in_dtype.torch):
            found = _scalar_operand(op, ops)
            args = (found[1],) if found is not None else op.args if op.prim in _KEEPS_FLOAT_DTYPE else ()
            if args and all(ops[a].dtype is op.dtype for a in args):
                allocating[i] = args
    return allocating


def _value_shapes(kernel) -> list:
    """The shape of each op's tensor as ``_emit_op`` makes it (a domain label does not say it: an
    elementwise op over two row values is a row value, whatever its domain)."""
    ops, keep = kernel.ops, kernel.keep_shape
    shapes = []
    for i, op in enumerate(ops):
        if isinstance(op, (Load, Iota)):
            shapes.append(tuple(op.view.shape))
        elif isinstance(op, Const):
            shapes.append(kernel.full_shape if op.domain == "full" else keep)
        elif isinstance(op, Reduce):
            shapes.append(keep)
        else:
            found = _scalar_operand(op, ops)
            args = (found[1],) if found is not None else op.args  # a Python scalar operand adds no shape
            shapes.append(tuple(torch.broadcast_shapes(*[shapes[a] for a in args])))
    return shapes


_NARROW = (torch.float16, torch.bfloat16)


def held_dtypes(kernel) -> list:
    """The torch dtype of each op's tensor as ``_emit_op`` makes it: the op's own, except float16/bfloat16
    arithmetic, held in float32 unless eager rounding is in effect -- the generated kernels' rule
    (codegen's ``elementwise_expr``): a reduction's result is rounded, a cast to another dtype rounds, a
    cast to the same dtype does nothing, and an op whose answer depends on the storage precision
    (``lower_narrow``: nextafter) takes its arguments rounded and gives an exact narrow value."""
    eager = config.eager_rounding_in_effect()
    held = []
    for op in kernel.ops:
        dtype = op.dtype.torch
        if isinstance(op, Elementwise) and not eager and dtype in _NARROW:
            if op.prim == "astype":
                dtype = held[op.args[0]] if op.in_dtype is op.dtype else dtype
            elif ELEMENTWISE[op.prim].lower_narrow is None:
                dtype = torch.float32
        held.append(dtype)
    return held


def _operand(a, held, compute) -> str:
    """``v{a}`` as an op computing in ``compute`` reads it: a float16/bfloat16 tensor widened for a float32
    computation, a float32-held one rounded for a narrow computation (nextafter's)."""
    if compute is torch.float32 and held[a] in _NARROW:
        return f"v{a}.float()"
    if compute in _NARROW and held[a] is not compute and held[a].is_floating_point:
        return f"v{a}.to({compute})"   # str(torch.float16) is "torch.float16", a name the code can read
    return f"v{a}"


def _emit_op(i, op, shapes, axes, input_views, ops, env, names, held, into=None, expand_to=None) -> list:
    """Source lines computing ``v{i}``; the objects they name go into ``env``; ``names`` says how they
    read inputs and scalars; ``held``: each op's tensor dtype (``held_dtypes``). ``into``: an earlier
    result this one may be written into (``_reusable_results``)."""
    out = f", out=v{into}" if into is not None else ""
    if isinstance(op, Load):
        if input_views[op.input] == op.view:  # reads the buffer exactly as it lies: the tensor itself
            return [f"v{i} = {names.inputs[op.input]}"]
        env[f"read{i}"] = _strided_reader(op.view)
        return [f"v{i} = read{i}({names.inputs[op.input]})"]
    if isinstance(op, Const):
        env[f"shape{i}"], env[f"dtype{i}"] = shapes[op.domain], op.dtype.torch
        scalar = names.scalars[op.slot]
        if op.dtype.torch == torch.uint64:  # its int64 bits, viewed: older torch refuses values >= 2^63 here
            env[f"bits{i}"] = lambda v: v - 2 ** 64 if v >= 2 ** 63 else v
            return [(f"v{i} = torch.full((), bits{i}({scalar}), dtype=torch.int64, device=dev)"
                     f".view(dtype{i}).expand(shape{i})")]
        return [f"v{i} = torch.full((), {scalar}, dtype=dtype{i}, device=dev).expand(shape{i})"]
    if isinstance(op, Iota):
        env[f"iota{i}"] = lambda device, op=op: _iota(op, device)
        return [f"v{i} = iota{i}(dev)"]
    env[f"dtype{i}"] = op.dtype.torch
    if isinstance(op, Reduce):
        env[f"fn{i}"], env[f"axes{i}"] = REDUCE[op.prim].reference_for(ops[op.arg].dtype), axes
        arg = f"v{op.arg}"
        if expand_to is not None:  # (``expand_to``: the domain, where the argument's value is smaller)
            env[f"full{i}"] = expand_to
            arg = f"v{op.arg}.expand(full{i})"
        return [f"v{i} = fn{i}({arg}, axes{i})", f"if v{i}.dtype is not dtype{i}: v{i} = v{i}.to(dtype{i})"]
    if not isinstance(op, Elementwise):
        raise TypeError(f"unknown op {op}")
    if op.prim == "astype":
        return [f"v{i} = v{op.args[0]}" if held[i] is held[op.args[0]] else f"v{i} = v{op.args[0]}.to(dtype{i})"]
    compute = held[i] if op.dtype.kind == "f" else None   # narrow arithmetic widens its narrow operands
    found = _scalar_operand(op, ops)
    if found is not None:  # ``x + 0.5``: torch takes the Python scalar (same result dtype, no tensor made)
        env[f"fn{i}"], a, b = found
        scalar = names.scalars[ops[b].slot]
        if op.dtype.torch in _SCALAR_TENSOR_DTYPES:  # torch wraps a Python float per call: hand it a ready one
            env[f"scalar{i}"] = _scalar_tensor(op.dtype.torch)
            scalar = f"scalar{i}({scalar})"
        return [f"v{i} = fn{i}({_operand(a, held, compute)}, {scalar}{out})"]
    env[f"fn{i}"] = ELEMENTWISE[op.prim].reference_for(op.in_dtype)
    env[f"dtype{i}"] = held[i]
    args = ", ".join(_operand(a, held, compute) for a in op.args)
    if op.prim in _KEEPS_FLOAT_DTYPE and op.dtype.kind == "f" and all(ops[a].dtype is op.dtype for a in op.args):
        return [f"v{i} = fn{i}({args}{out})"]  # torch gives floats of one dtype back in that dtype: nothing to check
    return [f"v{i} = fn{i}({args})", f"if v{i}.dtype is not dtype{i}: v{i} = v{i}.to(dtype{i})"]


# Where a 0-d tensor of the op's dtype gives the Python scalar's bits: torch wraps a Python float as a
# double tensor and converts it to the op's dtype (one rounding, as torch.tensor(v, dtype) does). For
# float16/bfloat16 the 0-d tensor is also what rounds the scalar to the array's dtype first (docs/semantics.md,
# as numpy, JAX and the generated kernels do): handed a Python float, torch would compute with it unrounded.
_SCALAR_TENSOR_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _scalar_tensor(dtype):
    """v -> a 0-d CPU tensor of ``dtype`` holding the Python float ``v``, for a scalar-operand op.

    Wrapping a Python float costs torch more than the op itself on a small tensor (2.5 against 1.2
    us), and the same value comes back on every plan hit (a literal, a static scalar), so the last
    (value, tensor) pair is kept and reused when the value has the same bits (compared as floats:
    ``==`` holds for 0.0 and -0.0, never for NaN).

    The tensor lives on the CPU whatever the operand's device (FLYARRAY_BACKEND=reference and check
    mode run this backend on a GPU too): torch's CUDA kernels take a 0-d CPU tensor as they take a
    Python scalar, as a kernel argument (``is_cpu_scalar``, e.g. div's multiply by the reciprocal),
    where a 0-d CUDA tensor would be a tensor operand of another kernel.
    """
    # One tuple, replaced whole: fa.jit replays run a plan outside plan._lock, so two threads may
    # call this at once; each reads the old pair or the new one, never a value with another's tensor.
    last = (None, None)

    def as_tensor(v):
        nonlocal last
        held, t = last
        if v is held:
            return t
        if type(v) is not float:  # plans bind floats for float constants (ops/core.py): just in case
            return v
        if v == held and copysign(1.0, v) == copysign(1.0, held):
            return t
        with torch.inference_mode(False):  # a normal tensor: autograd may have to save it later
            t = torch.tensor(v, dtype=dtype, device="cpu")
        last = (v, t)
        return t
    return as_tensor


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
    if fn is None or len(op.args) != 2 or op.in_dtype.kind not in "iuf" or op.dtype is not op.in_dtype \
            or unsigned.is_wide(op.in_dtype.torch):
        return None
    a, b = op.args
    if isinstance(ops[a], Const) and op.prim in _COMMUTES:
        a, b = b, a
    if isinstance(ops[a], Const) or not isinstance(ops[b], Const):
        return None
    return fn, a, b


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
