"""matmul as a library-op node (its kernel lives in flyarray/kernels/gemm.py), and the linear algebra built on
views, elementwise ops, reductions and matmul: outer, tensordot, diagonal, trace, cross, vector and matrix norms."""
from __future__ import annotations

import math
import numbers

import numpy as np

import torch

from .. import dtypes as dt
from .. import views
from .core import array_arg, node_of, operands_as_arrays
from .manipulation import permute_dims, reshape
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


MATMUL = Library("matmul", _matmul_abstract, _matmul_kernel, _matmul_reference, warms_up=True)  # epilogue rule: below


def matmul(x1, x2, /):
    """x1 @ x2 with the array API's rules: 1-D operands gain and lose an axis, batch axes broadcast.

    Float and complex operands run the GEMM kernel; integer ones a fused multiply-and-sum in their own
    dtype (wrapping, as numpy's); mixed dtypes promote first. Bool operands raise TypeError (the array
    API's matmul is for numeric dtypes)."""
    x1, x2 = operands_as_arrays((x1, x2))   # a scalar operand is refused below for its rank, in both orders
    a, b = node_of(x1), node_of(x2)
    if not a.shape or not b.shape:
        raise ValueError(f"matmul: operands must have at least one dimension, got {a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        d = dt.promote(a.dtype, b.dtype)
        x1, x2 = x1.astype(d, copy=False), x2.astype(d, copy=False)
    if x1.dtype.kind not in "fciu":
        raise TypeError(f"matmul: {x1.dtype} operands are not supported (numeric dtypes only); cast them first")
    lhs = x1[None, :] if x1.ndim == 1 else x1
    rhs = x2[:, None] if x2.ndim == 1 else x2
    if lhs.shape[-1] != rhs.shape[-2]:  # every path below (GEMM, complex block GEMM, multiply-and-sum)
        raise ValueError(f"matmul: inner dimensions differ: {x1.shape} @ {x2.shape} "
                         f"({lhs.shape[-1]} != {rhs.shape[-2]})")
    views.broadcast_batch("matmul", (lhs.shape, rhs.shape))
    if x1.dtype.kind in "iu":
        out = contract(lhs, rhs)
    elif x1.dtype.kind == "c":
        out = _complex_matmul(lhs, rhs)
    else:
        (out,) = call(MATMUL, [lhs, rhs])
    if x1.ndim == 1:
        out = out[..., 0, :]
    if x2.ndim == 1:
        out = out[..., 0]
    return out


def _complex_matmul(a, b):
    """Complex a @ b as one real GEMM of our kernel: a's (re, im) pairs are a real (..., m, 2k) matrix as
    they lie in memory, b becomes the real (..., 2k, 2n) block matrix [[re, im], [-im, re]] per element
    (one fused kernel), and the (..., m, 2n) product is the complex result's (re, im) pairs: 4 real
    multiply-adds per complex one, as 4 real GEMMs would do, in one launch and with no copy of a."""
    from ..complex_lowering import AS_COMPLEX, AS_REAL
    from .creation import arange
    from .elementwise import where
    (pa,) = call(AS_REAL, [a])
    (pb,) = call(AS_REAL, [b])
    *batch_a, m, k, _ = pa.shape
    n = pb.shape[-2]
    lhs = reshape(pa, (*batch_a, m, 2 * k))
    re, im = pb[..., None, :, None, 0], pb[..., None, :, None, 1]  # (..., k, 1, n, 1)
    row = reshape(arange(2, device=a.device), (2, 1, 1))
    col = arange(2, device=a.device)
    block = where(row == col, re, where(row < col, im, -im))  # (..., k, 2, n, 2)
    rhs = reshape(block, (*block.shape[:-4], 2 * k, 2 * n))
    (prod,) = call(MATMUL, [lhs, rhs])
    (out,) = call(AS_COMPLEX, [reshape(prod, (*prod.shape[:-1], n, 2))])
    return out


def vecdot(x1, x2, /, *, axis=-1):
    """``sum(conj(x1) * x2, axis=axis)`` with broadcasting (the array API conjugates the first argument;
    real arrays are their own conjugates). The result has the operands' promoted dtype, integers included
    (the array API's rule, as matmul); bool inputs give sum's int64."""
    from .elementwise import conj
    from .reductions import sum
    x1, x2 = operands_as_arrays((x1, x2))
    _check_contracted_axis("vecdot", node_of(x1).shape, node_of(x2).shape, axis)
    product = conj(x1) * x2
    return sum(product, axis=axis, dtype=product.dtype if product.dtype.kind in "iu" else None)


def _check_contracted_axis(name, shape1, shape2, axis, size=None):
    """The axis a vecdot/cross contracts must be each operand's own, of one size (``size`` if given), not made by
    broadcasting (the array API's rule; numpy's): counted from the end of each shape, as the broadcast aligns them."""
    axis = views.as_int(axis, f"{name}: axis")
    nd = max(len(shape1), len(shape2))
    if not -nd <= axis < nd:
        raise ValueError(f"{name}: axis {axis} is out of range for shapes {shape1} and {shape2}")
    back = axis - nd if axis >= 0 else axis
    for which, shape in (("x1", shape1), ("x2", shape2)):
        if -back > len(shape):
            raise ValueError(f"{name}: {which} (shape {shape}) has no axis {axis} to contract")
    n1, n2 = shape1[back], shape2[back]
    if n1 != n2 or (size is not None and n1 != size):
        need = f" (they must both be {size})" if size is not None else ""
        raise ValueError(f"{name}: axis {axis} has size {n1} in x1 (shape {shape1}) and {n2} in x2 (shape {shape2})"
                         f"{need}; it is contracted, not broadcast")


# ---- epilogue fusion: matmul followed by bias / activation / residual / cast --------------------------------
ACTIVATIONS = {"relu": "relu", "silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_tanh"}


def _fused_abstract(a, b, *extras, activation, has_bias, has_residual, out_dtype, out_shape=None):
    return [(out_shape if out_shape is not None else _matmul_abstract(a, b)[0][0], dt.dtype(out_dtype))]


def _as_product(residual, product_shape, out_shape):
    """The residual (of the output's shape, when a reshape sits between the product and the add: a torch
    Linear on a 3-D input is a 2-D GEMM) in the product's shape: a view of a contiguous residual."""
    if out_shape is None or residual is None:
        return residual
    return residual.expand(out_shape).reshape(product_shape)


def _fused_args(extras, has_bias, has_residual):
    it = iter(extras)
    return (next(it) if has_bias else None), (next(it) if has_residual else None)


def _product_shape(a, b):
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    # torch.broadcast_shapes costs tens of microseconds of host time a call; equal batch dims need none of it
    batch = batch_a if batch_a == batch_b else torch.broadcast_shapes(batch_a, batch_b)
    return tuple(batch) + (a.shape[-2], b.shape[-1])


def _fused_kernel(a, b, *extras, activation, has_bias, has_residual, out_dtype, out_shape=None):
    from ..kernels import gemm
    bias, residual = _fused_args(extras, has_bias, has_residual)
    if residual is not None and out_shape is not None:
        residual = _as_product(residual, _product_shape(a, b), out_shape)
    out = gemm.matmul(a, b, bias=bias, activation=activation, residual=residual, out_dtype=dt.dtype(out_dtype).torch)
    return out if out_shape is None else out.reshape(out_shape)


def _fused_reference(a, b, *extras, activation, has_bias, has_residual, out_dtype, out_shape=None):
    bias, residual = _fused_args(extras, has_bias, has_residual)
    residual = _as_product(residual, _product_shape(a, b), out_shape)
    if out_shape is not None:
        return _fused_reference(a, b, *[t for t in (bias, residual) if t is not None], activation=activation,
                                has_bias=has_bias, has_residual=has_residual, out_dtype=out_dtype).reshape(out_shape)
    # float32 accumulation, as the kernel's; float64 operands keep float64 (the unfused matmul does)
    acc_dtype = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    acc = torch.matmul(a.to(acc_dtype), b.to(acc_dtype))
    if bias is not None:
        acc = acc + bias.to(acc_dtype)
    if activation is not None:
        from ..primitives import ELEMENTWISE
        acc = ELEMENTWISE[activation].reference(acc)
    if residual is not None:
        acc = acc + residual.to(acc_dtype)
    return acc.to(dt.dtype(out_dtype).torch)


MATMUL_EPILOGUE = Library("matmul_epilogue", _fused_abstract, _fused_kernel, _fused_reference, warms_up=True)


def fuse_epilogue(root, uses: dict, wanted: set) -> bool:
    """If ``root`` is [cast]( [residual +] [reshape]( [act]( matmul [+ bias] ) ) ), turn it into one GEMM call
    (the reshape: torch's Linear on (batch, seq, features) is a 2-D GEMM whose output is viewed back before the
    residual add; the kernel reads the residual as the product's shape and its output is viewed back).

    Every value between the matmul and ``root`` must be used only there (and not held by the
    user): the fused kernel never writes them. Returns whether ``root`` was rewritten.
    """
    def private(n):  # a realized node has dropped its inputs: it is a buffer now, never peeled
        return uses.get(n.id, 0) == 1 and n.id not in wanted and not n.realized

    def matmul_output(n):
        return (n.kind == "output" and not n.realized and n.inputs[0].prim is MATMUL and private(n)
                and len(n.shape) >= 2)

    def peel(n):
        """(matmul output, bias, activation, reshaped) for act([reshape](mm + bias)), or None. The
        reshape: torch's Linear on a 3-D input, act(view(addmm)); fusing through it keeps the bias add
        in the fp32 accumulator, as torch's addmm does (rounding the product to 16 bits first moves
        values near zero across an activation's kink: a ReLU mask that differs from eager's)."""
        act, reshaped = None, False
        if n.kind == "elementwise" and n.prim.name in ACTIVATIONS and (n is root or private(n)):
            act, n = n.prim.name, n.inputs[0]
            if not private(n):
                return None
            if _is_reshape(n):
                n, reshaped = n.inputs[0], True
                if not private(n):
                    return None
        if matmul_output(n):
            return n, None, act, reshaped
        if n.kind == "elementwise" and n.prim.name == "add" and (n is root or private(n)):
            for i in (0, 1):
                if matmul_output(n.inputs[i]):
                    return n.inputs[i], n.inputs[1 - i], act, reshaped
        return None

    if _relu_into_epilogue(root, private):
        return True
    node, out_dtype = root, root.dtype
    if node.kind == "elementwise" and node.prim.name == "astype" and node.dtype.kind == "f":
        node = node.inputs[0]
        if not private(node):
            return False
    match, residual, reshaped = peel(node), None, False
    if match is None and node.kind == "elementwise" and node.prim.name == "add" and (node is root or private(node)):
        for i in (0, 1):
            inner = node.inputs[i]
            reshaped = _is_reshape(inner) and private(inner)
            if reshaped:
                inner = inner.inputs[0]
                if matmul_output(inner):  # residual + reshape(matmul): Llama's projections, no bias
                    match, residual = (inner, None, None, False), node.inputs[1 - i]
                    break
            if inner.kind == "elementwise" and private(inner):
                match = peel(inner)
                if match is not None and match[1:3] != (None, None) and not (reshaped and match[3]):
                    residual = node.inputs[1 - i]
                    break
                match = None
    if match is None or (node is root and match[0] is root):
        return False
    mm, bias, act, inner_reshaped = match
    reshaped = reshaped or inner_reshaped
    if mm.dtype.kind != "f" or any(x is not None and x.dtype.kind != "f" for x in (bias, residual)):
        return False
    if _rounds_as_eager(mm.dtype) and (bias is not None or residual is not None or act not in (None, "relu")
                                 or out_dtype != mm.dtype):
        # eager torch rounds a product to 16 bits before an add, an activation or a cast reads it; the fused
        # kernel would keep it in fp32 (720 of 4096 fp16 values differed for relu(a @ b + bias) + r, 1573 for
        # silu(a @ b)). relu commutes with that rounding, so it still fuses. torch's addmm (a Linear) rounds
        # product + bias once: the torch backend records it with addmm, and its relu fuses there.
        return False
    a, b = mm.inputs[0].inputs
    extras = tuple(x for x in (bias, residual) if x is not None)
    _become_fused_gemm(root, (a, b) + extras, reshaped, activation=act, has_bias=bias is not None,
                       has_residual=residual is not None, out_dtype=out_dtype.name)
    return True


def _become_fused_gemm(root, inputs: tuple, reshaped: bool, **kwargs):
    """Rewrite ``root`` in place as the output of one fused GEMM call over ``inputs`` (a, b, then bias and
    residual where the kwargs say so); ``reshaped``: the GEMM's output is viewed as root's shape."""
    from .. import ir
    lib = ir.Node(MATMUL_EPILOGUE, inputs, None, (), root.dtype, root.device)
    if reshaped:
        kwargs["out_shape"] = tuple(root.shape)
    lib.params = {"outputs": [root], "kwargs": kwargs}
    root.prim, root.inputs, root.params = ir.OUTPUT, (lib,), 0


def addmm(bias, x1, x2):
    """bias + x1 @ x2 (2-D operands; bias broadcasts to the product) as torch's addmm computes it. Where this
    evaluation rounds as eager torch does (_rounds_as_eager: the torch.compile backend's regions), one GEMM that
    adds the bias in its fp32 accumulator and rounds once, as torch's addmm does (cuBLASLt's bias epilogue, CPU
    BLAS with beta=1), where an mm then an add rounds twice: an activation or a residual after a Linear then
    reads the value eager torch's reads (a relu still fuses: _relu_into_epilogue). Elsewhere the matmul and the
    add, which the epilogue fusion joins with whatever follows."""
    if not _rounds_as_eager(x1.dtype):
        return matmul(x1, x2) + bias
    return call(MATMUL_EPILOGUE, [x1, x2, bias], activation=None, has_bias=True, has_residual=False,
                out_dtype=x1.dtype.name)[0]


def _relu_into_epilogue(root, private) -> bool:
    """relu([reshape](fused GEMM without activation or residual)) -> the GEMM with relu (relu commutes with the
    GEMM's rounding: the same values as relu after it, one launch fewer). The GEMM: addmm's."""
    if not (root.kind == "elementwise" and root.prim.name == "relu"):
        return False
    n, reshaped = root.inputs[0], False
    if _is_reshape(n) and private(n):
        n, reshaped = n.inputs[0], True
    if not (n.kind == "output" and not n.realized and n.inputs[0].prim is MATMUL_EPILOGUE and private(n)):
        return False
    lib = n.inputs[0]
    kwargs = lib.params["kwargs"]
    if (kwargs["activation"] is not None or kwargs["has_residual"] or kwargs.get("out_shape") is not None
            or dt.dtype(kwargs["out_dtype"]) != root.dtype):
        return False
    _become_fused_gemm(root, lib.inputs, reshaped, **dict(kwargs, activation="relu"))
    return True


def _rounds_as_eager(dtype) -> bool:
    """Whether this evaluation rounds 16-bit intermediates as eager torch does (config.eager_rounding_scope,
    FLYARRAY_EAGER_ROUNDING, the torch.compile backend's regions) and a product of ``dtype`` is one."""
    from .. import config
    return dtype in (dt.float16, dt.bfloat16) and config.eager_rounding_in_effect()


def _is_reshape(n) -> bool:
    """A view that only reshapes its (freshly computed, so contiguous) base: free on the GEMM's output."""
    return n.kind == "view" and len(n.params) == 1 and n.params[0][0] == "reshape"


MATMUL.epilogue = fuse_epilogue


# ---- built on views, elementwise ops, reductions and matmul (they fuse; no torch fallback) --------------------------
def _promoted(x1, x2):
    d = dt.promote(x1.dtype, x2.dtype)
    return x1.astype(d, copy=False), x2.astype(d, copy=False)


def outer(x1, x2, /):
    """The outer product of two 1-D arrays, ``x1[:, None] * x2[None, :]``; numeric dtypes promote. Elementwise
    (it fuses with its neighbours)."""
    x1, x2 = array_arg(x1, "outer: x1"), array_arg(x2, "outer: x2")
    for name, x in (("x1", x1), ("x2", x2)):
        if len(node_of(x).shape) != 1:
            raise ValueError(f"outer: {name} must be 1-D, got shape {x.shape}")
    return x1[:, None] * x2[None, :]


def tensordot(x1, x2, /, *, axes=2):
    """Sum of products over ``axes`` of ``x1`` and ``x2`` (the array API's/numpy's tensordot): an int (the
    last ``axes`` of x1 with the first of x2) or two sequences of axes. Float dtypes run one matmul; integer
    dtypes a fused multiply-and-sum. Dtypes promote."""
    x1, x2 = operands_as_arrays((x1, x2))
    a, b = node_of(x1), node_of(x2)
    if isinstance(axes, int) or hasattr(axes, "__index__"):
        k = views.as_int(axes, "tensordot: axes")
        if k < 0 or k > min(len(a.shape), len(b.shape)):
            raise ValueError(f"tensordot: axes={k} must be in 0..{min(len(a.shape), len(b.shape))} for shapes "
                             f"{a.shape} and {b.shape}")
        ax1, ax2 = list(range(len(a.shape) - k, len(a.shape))), list(range(k))
    else:
        if not isinstance(axes, (list, tuple)):
            raise TypeError(f"tensordot: axes must be an int or two sequences of axes, got {axes!r} of type "
                            f"{type(axes).__name__}")
        if len(axes) != 2:
            raise ValueError(f"tensordot: axes must be an int or two sequences of axes, got {axes!r}")
        ax1 = [views.normalize_axis(v, len(a.shape), "tensordot: axes") for v in views.axis_tuple(axes[0])]
        ax2 = [views.normalize_axis(v, len(b.shape), "tensordot: axes") for v in views.axis_tuple(axes[1])]
        for name, ax, shape in (("x1", ax1, a.shape), ("x2", ax2, b.shape)):
            if len(set(ax)) != len(ax):
                raise ValueError(f"tensordot: axes {axes!r} name an axis of {name} (shape {shape}) twice")
    if len(ax1) != len(ax2) or any(a.shape[i] != b.shape[j] for i, j in zip(ax1, ax2)):
        raise ValueError(f"tensordot: contracted axes {ax1} of {a.shape} and {ax2} of {b.shape} differ in size")
    x1, x2 = _promoted(x1, x2)
    free1 = [i for i in range(len(a.shape)) if i not in ax1]
    free2 = [i for i in range(len(b.shape)) if i not in ax2]
    out_shape = tuple(a.shape[i] for i in free1) + tuple(b.shape[i] for i in free2)
    size = math.prod(a.shape[i] for i in ax1)
    rows, cols = math.prod(a.shape[i] for i in free1), math.prod(b.shape[i] for i in free2)
    lhs = reshape(permute_dims(x1, free1 + ax1), (rows, size))   # sizes spelled out: -1 is ambiguous at 0
    rhs = reshape(permute_dims(x2, ax2 + free2), (size, cols))
    return reshape(contract(lhs, rhs), out_shape)


def contract(a, b):
    """(..., M, K) x (..., K, N) -> (..., M, N), batch axes broadcast: matmul for floats, else a fused
    multiply-and-sum, in the operands' dtype for integers (the array API's result type) and int64 for bools."""
    from .reductions import sum as _sum
    if a.dtype.kind in "fc":
        return matmul(a, b)
    return _sum(a[..., :, :, None] * b[..., None, :, :], axis=-2, dtype=a.dtype if a.dtype.kind in "iu" else None)


def diagonal(x, /, *, offset=0):
    """The diagonal ``offset`` of the last two axes (the array API's linalg.diagonal): a view of a
    flattened matrix with step n + 1 (a copy first where the layout does not allow it). Any dtype."""
    node = node_of(x)
    if len(node.shape) < 2:
        raise ValueError(f"diagonal: x must have at least 2 dimensions, got shape {node.shape}")
    offset = views.as_int(offset, "diagonal: offset")
    n, m = node.shape[-2:]
    count = max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m))
    start = offset if offset >= 0 else -offset * m
    flat = reshape(x, node.shape[:-2] + (n * m,))
    if count == 0:
        return flat[..., :0]
    return flat[..., start:start + (count - 1) * (m + 1) + 1:m + 1]


def trace(x, /, *, offset=0, dtype=None):
    """The sum of diagonal ``offset`` of the last two axes (the array API's linalg.trace); integer and bool
    inputs sum to int64 unless ``dtype`` is given."""
    from .reductions import sum as _sum
    return _sum(diagonal(x, offset=offset), axis=-1, dtype=dtype)


def cross(x1, x2, /, *, axis=-1):
    """The cross product of 3-vectors along ``axis`` (broadcasting the others), as the array API's
    linalg.cross; numeric dtypes promote. Views and elementwise ops (it fuses)."""
    from .manipulation import broadcast_arrays
    x1, x2 = array_arg(x1, "cross: x1"), array_arg(x2, "cross: x2")
    if dt.bool_ in (x1.dtype, x2.dtype):
        raise TypeError(f"cross: bool operands are not supported (numeric dtypes only), got {x1.dtype} and "
                        f"{x2.dtype}")
    _check_contracted_axis("cross", x1.shape, x2.shape, axis, size=3)
    x1, x2 = broadcast_arrays(*_promoted(x1, x2))
    axis = axis % x1.ndim
    a = [_pick(x1, axis, i) for i in range(3)]
    b = [_pick(x2, axis, i) for i in range(3)]
    parts = [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
    from .manipulation import stack
    return stack(parts, axis=axis)


def _pick(x, axis, i):
    return x[(slice(None),) * axis + (i,)]


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    """The vector ``ord``-norm over ``axis`` (all axes when None): 2 (default), 1, inf, -inf, 0 (the count
    of nonzeros) or any real p, as the array API's linalg.vector_norm. Float results (integers give float32).
    Elementwise ops and one reduction (they fuse)."""
    from . import reductions as R
    from .elementwise import abs as _abs
    from .elementwise import pow as _pow
    x = array_arg(x, "vector_norm: x")
    if axis is not None:   # checked here, so a bad axis names vector_norm (the reductions below would name theirs)
        views.normalize_axes(axis, x.ndim, "vector_norm: axis")
    if x.dtype.kind == "c" and ord == 2:   # |z|^2 from the parts: smooth at 0, as x * x below
        from .elementwise import imag, real
        re, im = real(x), imag(x)
        return R.root_with_zero_slope_at_zero(R.sum(re * re + im * im, axis=axis, keepdims=keepdims))
    if x.dtype.kind == "c":  # the norm of the magnitudes, in the parts' dtype
        x = _abs(x)
    if not isinstance(ord, numbers.Real) or isinstance(ord, (bool, np.bool_)):   # numpy's scalars are Real
        raise TypeError(f"vector_norm: ord must be a real number, got {ord!r}")
    if x.dtype.kind in "iu" and x.dtype.itemsize == 8:   # float32 squares of 9e18 overflow though their norm fits:
        return vector_norm(x.astype(dt.float64), axis=axis, keepdims=keepdims, ord=ord).astype(dt.default_float())
    if x.dtype.kind != "f":
        x = x.astype(dt.default_float())
    ord = float(ord) if isinstance(ord, np.floating) else int(ord) if isinstance(ord, np.integer) else ord
    if x.dtype in (dt.float16, dt.bfloat16):  # squares of 300 overflow float16: float32 inside, as torch
        return vector_norm(x.astype(dt.float32), axis=axis, keepdims=keepdims, ord=ord).astype(x.dtype)
    if ord == 2:   # x * x, not |x| * |x|: abs's derivative at 0 is 0, which made the second derivative 0 there
        return R.root_with_zero_slope_at_zero(R.sum(x * x, axis=axis, keepdims=keepdims))
    a = _abs(x)
    if ord == 1:
        return R.sum(a, axis=axis, keepdims=keepdims)
    if ord == math.inf:
        return _max_of_magnitudes(a, axis, keepdims)
    if ord == -math.inf:
        return R.min(a, axis=axis, keepdims=keepdims)
    if ord == 0:
        return R.sum((a != 0).astype(x.dtype), axis=axis, keepdims=keepdims)
    total = R.sum(_magnitudes_to_the(a, float(ord)), axis=axis, keepdims=keepdims)
    return R.root_with_zero_slope_at_zero(total, float(ord)) if ord > 0 else _pow(total, 1.0 / ord)


def _magnitudes_to_the(a, p: float):
    """|x|^p. For p < 1 its slope at 0 is infinite, and times abs's 0 there a gradient was NaN: the zeros take a
    constant branch (0^p: 0, or inf for p < 0), so their derivative is 0, torch's convention."""
    from .core import where
    from .elementwise import pow as _pow
    if p >= 1:
        return _pow(a, p)
    zero = a == 0
    return where(zero, math.inf if p < 0 else 0.0, _pow(where(zero, 1.0, a), p))


def matrix_norm(x, /, *, keepdims=False, ord="fro"):
    """The matrix norm of the last two axes: 'fro' (default), 1, -1, inf, -inf (the array API's
    linalg.matrix_norm). 'nuc', 2 and -2 need singular values (``fa.linalg.svdvals``). Real float results (complex
    input: its parts' dtype)."""
    from . import reductions as R
    from .elementwise import abs as _abs
    x = array_arg(x, "matrix_norm: x")
    if x.ndim < 2:
        raise ValueError(f"matrix_norm: x must have at least 2 dimensions, got shape {x.shape}")
    if isinstance(ord, (bool, np.bool_)):   # True == 1: it was the 1-norm (vector_norm refuses a bool too)
        raise ValueError(f"matrix_norm: ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, got {ord!r}")
    if ord == "fro":   # vector_norm takes every dtype (64-bit integers through float64)
        return vector_norm(x, axis=(-2, -1), keepdims=keepdims)
    if x.dtype.kind not in "fc":  # complex: the norms of the magnitudes (svdvals takes the complex matrix)
        x = x.astype(dt.default_float())
    if ord in ("nuc", 2, -2):
        from .decompositions import svdvals
        if x.dtype in (dt.float16, dt.bfloat16):   # torch's SVD takes no 16-bit floats: float32 inside, as 'fro'
            return matrix_norm(x.astype(dt.float32), keepdims=keepdims, ord=ord).astype(x.dtype)
        s = svdvals(x)
        r = R.sum(s, axis=-1) if ord == "nuc" else _max_of_magnitudes(s, -1, False) if ord == 2 else R.min(s, axis=-1)
        return r[..., None, None] if keepdims else r
    if ord not in (1, -1, math.inf, -math.inf):
        raise ValueError(f"matrix_norm: ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, got {ord!r}")
    inner, outer_axis = (-2, -1) if ord in (1, -1) else (-1, -2)
    sums = R.sum(_abs(x), axis=inner, keepdims=True)
    r = _max_of_magnitudes(sums, outer_axis, True) if ord > 0 else R.min(sums, axis=outer_axis, keepdims=True)
    return r if keepdims else r[..., 0, 0]


def _max_of_magnitudes(a, axis, keepdims):
    """max(|x|) over ``axis``: 0 where the axes are empty (the inf-norm of nothing, as numpy's), which a
    plain max refuses."""
    from . import reductions as R
    if any(a.shape[i] == 0 for i in views.normalize_axes(axis, a.ndim)):
        return R.sum(a, axis=axis, keepdims=keepdims)   # zeros of the reduced shape
    return R.max(a, axis=axis, keepdims=keepdims)


# ---- numpy's spellings at the top level (fa.diagonal, fa.trace): any two axes, default the first two -------------
def _to_end(x, axis1, axis2):
    from .manipulation import moveaxis
    nd = len(node_of(x).shape)
    if nd < 2:
        raise ValueError(f"x must have at least 2 dimensions, got shape {x.shape}")
    a1, a2 = views.normalize_axis(axis1, nd, "axis1"), views.normalize_axis(axis2, nd, "axis2")
    if a1 == a2:
        raise ValueError(f"axis1 and axis2 must differ, got {axis1} and {axis2}")
    return moveaxis(x, (a1, a2), (-2, -1))


def numpy_diagonal(x, /, offset=0, axis1=0, axis2=1):
    """numpy's diagonal: the diagonal ``offset`` of the 2-D slices over ``axis1`` and ``axis2``, as the last
    axis of the result (fa.linalg.diagonal takes the last two axes). A view where the layout allows; any dtype."""
    return diagonal(_to_end(x, axis1, axis2), offset=offset)


def numpy_trace(x, /, offset=0, axis1=0, axis2=1, dtype=None):
    """numpy's trace: sums of diagonal ``offset`` over ``axis1`` and ``axis2`` (fa.linalg.trace takes the
    last two axes); integer and bool inputs sum to int64 unless ``dtype`` is given."""
    return trace(_to_end(x, axis1, axis2), offset=offset, dtype=dtype)


numpy_diagonal.__name__, numpy_trace.__name__ = "diagonal", "trace"
