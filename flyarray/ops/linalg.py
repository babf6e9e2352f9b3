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


MATMUL = Library("matmul", _matmul_abstract, _matmul_kernel, _matmul_reference)  # epilogue rule: below


def matmul(x1, x2, /):
    """x1 @ x2 with the array API's rules: 1-D operands gain and lose an axis, batch axes broadcast.

    Float dtypes only (mixed dtypes promote first); unlike numpy, integer and bool operands raise TypeError."""
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
    """``sum(x1 * x2, axis=axis)`` with broadcasting (no conjugation: no complex dtypes). Numeric dtypes;
    unlike the array API, integer and bool inputs give int64 (sum's rule)."""
    from .reductions import sum
    return sum(x1 * x2, axis=axis)


# ---- epilogue fusion: matmul followed by bias / activation / residual / cast --------------------------------
ACTIVATIONS = {"relu": "relu", "silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_tanh"}


def _fused_abstract(a, b, *extras, activation, has_bias, has_residual, out_dtype):
    return [(_matmul_abstract(a, b)[0][0], dt.dtype(out_dtype))]


def _fused_args(extras, has_bias, has_residual):
    it = iter(extras)
    return (next(it) if has_bias else None), (next(it) if has_residual else None)


def _fused_kernel(a, b, *extras, activation, has_bias, has_residual, out_dtype):
    from ..kernels import gemm
    bias, residual = _fused_args(extras, has_bias, has_residual)
    return gemm.matmul(a, b, bias=bias, activation=activation, residual=residual,
                       out_dtype=dt.dtype(out_dtype).torch)


def _fused_reference(a, b, *extras, activation, has_bias, has_residual, out_dtype):
    bias, residual = _fused_args(extras, has_bias, has_residual)
    acc = torch.matmul(a.float(), b.float())
    if bias is not None:
        acc = acc + bias.float()
    if activation is not None:
        from ..primitives import ELEMENTWISE
        acc = ELEMENTWISE[activation].reference(acc)
    if residual is not None:
        acc = acc + residual.float()
    return acc.to(dt.dtype(out_dtype).torch)


MATMUL_EPILOGUE = Library("matmul_epilogue", _fused_abstract, _fused_kernel, _fused_reference)


def fuse_epilogue(root, uses: dict, wanted: set) -> bool:
    """If ``root`` is [cast]( [residual +] [act]( matmul [+ bias] ) ), turn it into one GEMM call.

    Every value between the matmul and ``root`` must be used only there (and not held by the
    user): the fused kernel never writes them. Returns whether ``root`` was rewritten.
    """
    from .. import ir

    def private(n):  # a realized node has dropped its inputs: it is a buffer now, never peeled
        return uses.get(n.id, 0) == 1 and n.id not in wanted and not n.realized

    def matmul_output(n):
        return (n.kind == "output" and not n.realized and n.inputs[0].prim is MATMUL and private(n)
                and len(n.shape) >= 2)

    def peel(n):
        """(matmul output, bias, activation) for act(mm + bias), or None."""
        act = None
        if n.kind == "elementwise" and n.prim.name in ACTIVATIONS and (n is root or private(n)):
            act, n = n.prim.name, n.inputs[0]
            if not private(n):
                return None
        if matmul_output(n):
            return n, None, act
        if n.kind == "elementwise" and n.prim.name == "add" and (n is root or private(n)):
            for i in (0, 1):
                if matmul_output(n.inputs[i]):
                    return n.inputs[i], n.inputs[1 - i], act
        return None

    node, out_dtype = root, root.dtype
    if node.kind == "elementwise" and node.prim.name == "astype" and node.dtype.kind == "f":
        node = node.inputs[0]
        if not private(node):
            return False
    match, residual = peel(node), None
    if match is None and node.kind == "elementwise" and node.prim.name == "add" and (node is root or private(node)):
        for i in (0, 1):
            inner = node.inputs[i]
            if inner.kind == "elementwise" and private(inner):
                match = peel(inner)
                if match is not None and match[1:] != (None, None):
                    residual = node.inputs[1 - i]
                    break
                match = None
    if match is None or (node is root and match[0] is root):
        return False
    mm, bias, act = match
    if mm.dtype.kind != "f" or any(x is not None and x.dtype.kind != "f" for x in (bias, residual)):
        return False
    a, b = mm.inputs[0].inputs
    extras = tuple(x for x in (bias, residual) if x is not None)
    lib = ir.Node(MATMUL_EPILOGUE, (a, b) + extras, None, (), out_dtype, root.device)
    lib.params = {"outputs": [root], "kwargs": dict(activation=act, has_bias=bias is not None,
                                                     has_residual=residual is not None, out_dtype=out_dtype.name)}
    root.prim, root.inputs, root.params = ir.OUTPUT, (lib,), 0
    return True


MATMUL.epilogue = fuse_epilogue
