"""``torch.compile(model, backend="flyarray")``: ATen graphs lowered to flyarray's lazy fused graph.

Flow: Dynamo's graph -> (pre-pass) ``F.scaled_dot_product_attention`` and ``F.rms_norm`` become our
custom ops -> AOTAutograd (forward and backward ATen graphs; backward-only ATen ops are decomposed
into elementwise ops and reductions, which we fuse) -> for each graph, a static partition: every run
of nodes we lower becomes one *region*, an ``fa.jit`` function (traced once per input signature,
then replayed through its plan: no recording, no scheduling on later calls); every other node runs
as the torch op it is, between regions. A torch op that does not depend on the open region does not
close it (it runs before the region), so shape arithmetic and unrelated torch ops do not split fusion.
"""
from __future__ import annotations

import functools
import json
import operator
import os
import threading

import torch
import torch.fx

import flyarray as fa
from flyarray import dtypes as dt
from flyarray.config import eager_rounding_scope
from flyarray.ops.checks import ATTENTION_MAX_HEAD_DIM, KERNEL_FLOATS
from flyarray.ops.linalg import addmm

from . import torch_ops

aten = torch.ops.aten

# Op families accelerate(ops=...) can turn off; "elementwise" covers views and reductions too.
FAMILIES = ("elementwise", "matmul", "attention", "norm", "softmax", "topk")


# ---- lowerings: ATen op -> a function on fa arrays (Python scalars and lists pass through) --------------
def _axes(dims, ndim):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return None
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(d % max(ndim, 1) for d in dims)


def _reduce(fn):
    def lower(x, dims=None, keepdim=False, *, dtype=None):
        if dtype is not None:
            x = x.astype(dt.from_torch(dtype))
        return fn(x, axis=_axes(dims, x.ndim), keepdims=keepdim)
    return lower


def _opmath_scalar(value, d, device):
    """A Python number beside a float16/bfloat16 operand (result dtype ``d``) as torch computes with it: a
    float32 0-d array, so the op runs in float32 and rounds once (x * 1e5 is finite where 1e5 in float16
    is inf); else the number itself."""
    if type(value) in (int, float) and d in (fa.float16, fa.bfloat16):
        return fa.full((), value, dtype=fa.float32, device=device)
    return value


def _times_alpha(b, alpha, other):
    """``b * alpha`` as add/sub/rsub compute it: in the result's dtype (an int8 b of u8 + i8 * 2 is widened
    first), and for a float16/bfloat16 result with alpha in float32, rounded once (as torch's opmath)."""
    if alpha == 1 or not isinstance(b, fa.Array):
        return b if alpha == 1 else b * alpha
    d = fa.result_type(b, other)
    if b.dtype != d:
        b = b.astype(d)
    return b * _opmath_scalar(alpha, d, b.device)


def _add(a, b, *, alpha=1):
    return a + _times_alpha(b, alpha, a)


def _sub(a, b, *, alpha=1):
    return a - _times_alpha(b, alpha, a)


def _to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    return x if dtype is None else x.astype(dt.from_torch(dtype))


def _slice(x, dim=0, start=None, end=None, step=1):
    key = [slice(None)] * x.ndim
    key[dim] = slice(start, end, step)
    return x[tuple(key)]


def _select(x, dim, index):
    key = [slice(None)] * x.ndim
    key[dim] = index
    return x[tuple(key)]


def _select_backward(grad, input_sizes, dim, index):
    """``grad`` placed at ``index`` of axis ``dim`` of zeros (the backward of x[..., index, ...])."""
    dim %= len(input_sizes)
    index %= input_sizes[dim]
    parts = []
    for count in (index, None, input_sizes[dim] - index - 1):
        if count is None:
            parts.append(fa.expand_dims(grad, axis=dim))
        elif count:
            shape = tuple(count if i == dim else s for i, s in enumerate(input_sizes))
            parts.append(fa.zeros(shape, dtype=grad.dtype, device=grad.device))
    return fa.concat(parts, axis=dim) if len(parts) > 1 else parts[0]


def _transpose(x, d0, d1):
    axes = list(range(x.ndim))
    axes[d0], axes[d1] = axes[d1], axes[d0]
    return fa.permute_dims(x, tuple(axes))


def _squeeze(x, dims=None):
    dims = range(x.ndim) if dims is None else [dims] if isinstance(dims, int) else dims
    axes = tuple(d % x.ndim for d in dims if x.shape[d] == 1)
    return fa.reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in axes)) if axes else x


def _gelu(x, *, approximate="none"):
    return fa.gelu(x, approximate=approximate == "tanh")


def _rounded_once(fn, x, *args, **kwargs):
    """``fn(x, ...)`` computed in float32 and rounded once to x's float16/bfloat16 dtype, as eager torch computes
    one op (softmax, pow): under the regions' eager rounding a lowering made of several flyarray ops would
    round each intermediate (x * x before x * x * x), up to 4x eager's error, and not eager's bits."""
    if x.dtype not in (fa.float16, fa.bfloat16):
        return fn(x, *args, **kwargs)
    return fn(x.astype(fa.float32), *args, **kwargs).astype(x.dtype)


def _softmax(x, dim, half_to_float):
    if half_to_float:
        return fa.nn.softmax(x.astype(fa.float32), axis=dim)
    return _rounded_once(fa.nn.softmax, x, axis=dim)


def _log_softmax(x, dim, half_to_float):
    if half_to_float:
        return fa.nn.log_softmax(x.astype(fa.float32), axis=dim)
    return _rounded_once(fa.nn.log_softmax, x, axis=dim)


def _layer_norm(x, normalized_shape, weight, bias, eps):
    """(out, mean, rstd) of aten.native_layer_norm over the last axis; statistics in fp32 (fp64 for a
    float64 x: torch's accumulation type). Parameters in x's dtype, or float32 ones beside a float16/bfloat16
    x (torch's mixed-dtype rule); other mixes run as torch's op, which refuses them."""
    for p in (weight, bias):
        if p is not None and p.dtype != x.dtype and not (p.dtype == fa.float32 and x.dtype in (fa.float16, fa.bfloat16)):
            raise TypeError(f"layer_norm: a {p.dtype.name} parameter beside a {x.dtype.name} input")
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise TypeError(f"layer_norm: weight {weight.dtype.name} and bias {bias.dtype.name} differ")
    out = fa.nn.layer_norm(x, weight, bias, eps)
    xf = x.astype(fa.dtypes.compute_dtype(x.dtype))
    mean = fa.mean(xf, axis=-1, keepdims=True)
    rstd = fa.rsqrt(fa.mean(fa.square(xf - mean), axis=-1, keepdims=True) + eps)
    return out, mean, rstd


def _pow_scalar(x, exponent):
    """torch computes x ** 0.5 as sqrt and x ** -0.5 as rsqrt (sqrt(-0.0) = -0.0, sqrt(-inf) = nan), where
    IEEE pow gives +0 and +inf: the same ops here, so the special values match eager."""
    if exponent == 0.5 and x.dtype.kind == "f":
        return fa.sqrt(x)
    if exponent == -0.5 and x.dtype.kind == "f":
        return fa.rsqrt(x)
    return _rounded_once(fa.pow, x, exponent)   # x ** 3 is a chain of multiplies: rounded once, as eager's


def _same_dtypes(op, *arrays):
    """torch's GEMMs refuse operands of different dtypes, where flyarray's promote: refused here too, so
    the node runs as the torch op (and raises torch's error)."""
    dtypes = {a.dtype for a in arrays if isinstance(a, fa.Array)}
    if len(dtypes) > 1:
        raise TypeError(f"{op}: operands of different dtypes {sorted(d.name for d in dtypes)}")


def _mm(a, b):
    _same_dtypes("mm", a, b)
    return fa.matmul(a, b)


def _addmm(bias, a, b, *, beta=1, alpha=1):
    _same_dtypes("addmm", bias, a, b)
    if bias.dtype.kind in "iub":  # torch converts alpha and beta to an integer result's type (0.5 -> 0)
        beta, alpha = int(beta), int(alpha)
    if alpha == 1 and beta == 1:   # linalg.addmm: product + bias rounded as torch's addmm rounds them
        return addmm(bias, a, b)
    if alpha == 0:  # torch does not read the product then: inf and NaN in a or b do not propagate
        y = fa.broadcast_to(fa.zeros_like(a[:, :1]), (a.shape[0], b.shape[1]))
    else:
        y = fa.matmul(a, b) if alpha == 1 else fa.matmul(a, b) * alpha  # a bare mm + bias: the fused epilogue
    if beta == 0:   # torch ignores the input then: NaN and inf in it do not propagate
        return y
    return y + (bias if beta == 1 else bias * beta)


def _topk(x, k, dim=-1, largest=True, sorted=True):
    return fa.top_k(x, k)


def _grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm of a [m, k] and b [g, k, n] with offs (each group's end row) -> ragged_dot,
    which takes each group's size."""
    starts = fa.concat([fa.zeros((1,), dtype=offs.dtype, device=offs.device), offs[:-1]], axis=0)
    return fa.ragged_dot(a, b, offs - starts)


def _cat(tensors, dim=0):
    tensors = list(tensors)
    # torch skips a legacy empty 1-D tensor beside tensors of higher rank (transformers' DynamicCache starts
    # from torch.tensor([])), though its dtype still takes part in the result's
    kept = [t for t in tensors if t.shape != (0,)]
    if kept and len(kept) < len(tensors) and any(t.ndim > 1 for t in kept):
        dtype = fa.result_type(*tensors)
        tensors = [t.astype(dtype, copy=False) for t in kept]
    return fa.concat(tensors, axis=dim)


def _full(size, value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return fa.full(tuple(size), value, dtype=None if dtype is None else dt.from_torch(dtype), device=device)


_EW = {
    aten.add.Tensor: _add, aten.add.Scalar: _add, aten.sub.Tensor: _sub, aten.sub.Scalar: _sub,
    aten.mul.Tensor: operator.mul, aten.mul.Scalar: operator.mul, aten.div.Tensor: operator.truediv,
    aten.div.Scalar: operator.truediv, aten.rsub.Scalar: lambda a, b, alpha=1: b - _times_alpha(a, alpha, b),
    aten.neg.default: operator.neg, aten.exp.default: fa.exp, aten.log.default: fa.log,
    aten.sqrt.default: fa.sqrt, aten.rsqrt.default: fa.rsqrt, aten.abs.default: fa.abs,
    aten.tanh.default: fa.tanh, aten.sigmoid.default: fa.sigmoid, aten.relu.default: fa.relu,
    aten.silu.default: fa.silu, aten.gelu.default: _gelu, aten.sin.default: fa.sin, aten.cos.default: fa.cos,
    aten.erf.default: fa.erf, aten.erfc.default: fa.erfc, aten.reciprocal.default: fa.reciprocal, aten.log1p.default: fa.log1p,
    aten.expm1.default: fa.expm1, aten.pow.Tensor_Scalar: _pow_scalar, aten.pow.Tensor_Tensor: fa.pow,
    aten.maximum.default: fa.maximum, aten.minimum.default: fa.minimum,
    aten.where.self: fa.where, aten.eq.Tensor: fa.equal, aten.eq.Scalar: fa.equal,
    aten.ne.Tensor: fa.not_equal, aten.ne.Scalar: fa.not_equal, aten.lt.Tensor: fa.less,
    aten.lt.Scalar: fa.less, aten.le.Tensor: fa.less_equal, aten.le.Scalar: fa.less_equal,
    aten.gt.Tensor: fa.greater, aten.gt.Scalar: fa.greater, aten.ge.Tensor: fa.greater_equal,
    aten.ge.Scalar: fa.greater_equal, aten.logical_not.default: fa.logical_not,
    aten._to_copy.default: _to_copy, aten.clone.default: lambda x, *, memory_format=None: x,
    aten.alias.default: lambda x: x, aten.detach.default: lambda x: x,  # graphs here carry no autograd
    aten.scalar_tensor.default: lambda value, *, dtype=None, layout=None, device=None, pin_memory=None: fa.full(
        (), value, dtype=None if dtype is None else dt.from_torch(dtype), device=device),
    aten.sum.dim_IntList: _reduce(fa.sum), aten.sum.default: lambda x, *, dtype=None: _reduce(fa.sum)(x, dtype=dtype),
    aten.mean.dim: _reduce(fa.mean), aten.amax.default: _reduce(fa.max), aten.amin.default: _reduce(fa.min),
    aten.view.default: fa.reshape, aten._unsafe_view.default: fa.reshape, aten.reshape.default: fa.reshape,
    aten.permute.default: fa.permute_dims, aten.t.default: fa.matrix_transpose, aten.transpose.int: _transpose,
    aten.expand.default: lambda x, size, *, implicit=False: fa.broadcast_to(
        x, tuple(x.shape[i - (len(size) - x.ndim)] if s == -1 else s for i, s in enumerate(size))),
    aten.unsqueeze.default: fa.expand_dims, aten.squeeze.dim: _squeeze, aten.squeeze.dims: _squeeze,
    aten.squeeze.default: _squeeze, aten.slice.Tensor: _slice, aten.select.int: _select,
    aten.select_backward.default: _select_backward, aten.cat.default: _cat, aten.full.default: _full,
}
_FAMILY_OPS = {
    "matmul": {aten.mm.default: _mm, aten.bmm.default: _mm, aten.addmm.default: _addmm,
               torch.ops.flyarray.matmul.default: lambda a, b, bias, res, act, out: torch_ops._matmul(
                   a, b, bias, res, activation=act, out_dtype=None if out is None else dt.from_torch(out)),
               torch.ops.flyarray.ragged_dot.default: fa.ragged_dot, aten._grouped_mm.default: _grouped_mm},
    "attention": {torch.ops.flyarray.dot_product_attention.default: lambda q, k, v, b, m, scale, causal:
                  fa.nn.dot_product_attention(q, k, v, b, m, scale=scale, is_causal=causal),
                  torch.ops.flyarray.attention_forward.default: lambda q, k, v, b, m, scale, causal:
                  torch_ops._attention_with_lse(q, k, v, b, m, scale=scale, is_causal=causal),
                  torch.ops.flyarray.attention_backward.default: lambda do, q, k, v, o, lse, dlse, b, m, scale, causal:
                  torch_ops._attention_grads(do, q, k, v, o, lse, dlse, b, m, scale=scale, is_causal=causal)},
    "norm": {aten.native_layer_norm.default: _layer_norm,
             torch.ops.flyarray.rms_norm.default: lambda x, w, eps: fa.nn.rms_norm(x, w, eps),
             torch.ops.flyarray.add_rms_norm.default: lambda x, r, w, eps: fa.nn.rms_norm(x, w, eps, residual=r)},
    "softmax": {aten._softmax.default: _softmax, aten._log_softmax.default: _log_softmax,
                torch.ops.flyarray.softmax.default: lambda x, dim, log: torch_ops._softmax(x, dim=dim, log=log)},
    "topk": {torch.ops.flyarray.top_k.default: fa.top_k},
}


# Which family a flyarray::vjp node belongs to: that of the forward op it differentiates.
_VJP_FAMILY = {"rms_norm": "norm", "add_rms_norm": "norm", "softmax": "softmax", "dot_product_attention": "attention",
               "matmul": "matmul", "ragged_dot": "matmul", "top_k": "topk"}
_VJP_ENABLED = "flyarray::vjp forward ops"  # a key of the lowering table: the ops whose vjp we lower


def _vjp(op, statics, cotangents, primals, wanted):
    return torch_ops.vjp_arrays(op, json.loads(statics), cotangents, primals, wanted)


def lowerings(ops=None) -> dict:
    """ATen op -> lowering for the enabled families (``ops``: a collection of FAMILIES names; None: all)."""
    enabled = set(FAMILIES) if ops is None else set(ops)
    unknown = enabled - set(FAMILIES)
    if unknown:
        raise ValueError(f"flyarray backend: unknown op families {sorted(unknown)}; expected some of {FAMILIES}")
    table = dict(_EW) if "elementwise" in enabled else {}
    for family, ops_ in _FAMILY_OPS.items():
        if family in enabled:
            table.update(ops_)
    if "topk" in enabled:
        table[aten.topk.default] = _topk
    table[torch.ops.flyarray.vjp.default] = _vjp
    table[_VJP_ENABLED] = {op for op, family in _VJP_FAMILY.items() if family in enabled}
    return table


# Backward-only ATen ops decomposed (by AOTAutograd) into ops we lower, so backward fuses too.
_DECOMPOSE = [aten._softmax_backward_data, aten._log_softmax_backward_data, aten.native_layer_norm_backward,
              aten.silu_backward, aten.gelu_backward, aten.threshold_backward, aten.sigmoid_backward,
              aten.tanh_backward]


# ---- which nodes a region may hold ------------------------------------------------------------------------
def _fa_dtype_ok(t) -> bool:
    try:
        d = dt.from_torch(t.dtype)
    except TypeError:
        return False
    return d.kind != "c"  # complex nodes stay with torch here (the lowering rules are not wired for aten's ops)


def _metas(node):
    val = node.meta.get("val")
    return list(val) if isinstance(val, (tuple, list)) else [val]


def _lowerable(node, table) -> bool:
    """We lower ``node`` if we know its op, every tensor it reads or makes has a flyarray dtype, and
    (for the ops whose lowering only covers a case) the case is the covered one."""
    if node.op != "call_function" or node.target not in table:
        return False
    vals = _metas(node) + [a.meta.get("val") for a in node.all_input_nodes]
    if not all(isinstance(v, torch.Tensor) and _fa_dtype_ok(v) for v in vals if v is not None):
        return False
    if any(v is None for v in _metas(node)):
        return False
    t, args = node.target, node.args
    if t is torch.ops.flyarray.vjp.default:
        return args[0] in table[_VJP_ENABLED]
    if t is aten.native_layer_norm.default:
        return len(args[1]) == 1
    if t is aten.topk.default:   # fa.top_k: the last dim of a >= 1-d array of a kernel float, largest first
        x = args[0].meta["val"]
        dim = args[2] if len(args) > 2 else -1
        largest = args[3] if len(args) > 3 else node.kwargs.get("largest", True)
        if x.ndim == 0 or dt.from_torch(x.dtype) not in KERNEL_FLOATS:
            return False
        return dim % x.ndim == x.ndim - 1 and largest
    if t is aten._grouped_mm.default:  # the MoE forward: a [m, k] x b [g, k, n] with offs, nothing else
        a, b = args[0].meta["val"], args[1].meta["val"]
        extra = [args[i] if len(args) > i else node.kwargs.get(k) for i, k in ((2, "offs"), (3, "bias"),
                                                                             (4, "out_dtype"))]
        return a.ndim == 2 and b.ndim == 3 and extra[0] is not None and extra[1] is None and extra[2] is None
    if t is aten.cat.default:
        return len(args[0]) > 0
    if t is aten._to_copy.default:  # a cast, not a move: flyarray keeps an array on its device
        device = node.kwargs.get("device")
        return device is None or torch.device(device) == args[0].meta["val"].device
    if t is aten.gelu.default:
        return node.kwargs.get("approximate", "none") in ("none", "tanh")
    return True


class Region:
    """A run of lowered nodes; ``inputs`` come from outside, ``outputs`` are read outside."""

    def __init__(self):
        self.nodes, self.inputs, self.outputs, self.inside = [], [], [], frozenset()
        self.passing_through = frozenset()   # outputs the dry run saw come back as (views of) memory given

    def finish(self, users_outside):
        inside = self.inside = frozenset(self.nodes)
        seen = set()
        for n in self.nodes:
            for a in n.all_input_nodes:
                if a not in inside and a not in seen:
                    seen.add(a)
                    self.inputs.append(a)
        self.outputs = [n for n in self.nodes if any(u not in inside for u in users_outside(n))]


def _mutates(node) -> bool:
    """Whether ``node`` writes to a tensor (AOTAutograd's copy_ back into a mutated input, ...)."""
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def partition(graph: torch.fx.Graph, table: dict, excluded=frozenset()) -> list:
    """Steps in execution order: ("torch", node) or ("region", Region). ``excluded``: nodes that
    run as torch ops although their op has a lowering (its dry run failed, see CompiledGraph)."""
    steps, open_region, in_region = [], None, set()  # in_region: the open region's nodes
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        lowered = node not in excluded and (_lowerable(node, table) or (
            node.op == "call_function" and node.target is operator.getitem and node.args[0] in in_region))
        if lowered:
            if open_region is None:
                open_region, in_region = Region(), set()
                steps.append(("region", open_region))
            open_region.nodes.append(node)
            in_region.add(node)
        elif open_region is not None and (_mutates(node) or any(a in in_region for a in node.all_input_nodes)):
            open_region, in_region = None, set()  # a write may change what the region reads: keep the order
            steps.append(("torch", node))
        else:  # independent of the open region (and writes nothing): it runs before it
            at = len(steps) - 1 if open_region is not None else len(steps)
            steps.insert(at, ("torch", node))
    for kind, item in steps:
        if kind == "region":
            item.finish(lambda n: n.users)
            _check_outputs(item)
    return steps


def _check_outputs(region):
    """A region's outputs must be arrays (a tuple-valued node is read through its getitems)."""
    for n in region.outputs:
        if not isinstance(n.meta.get("val"), torch.Tensor):
            raise AssertionError(f"flyarray backend: region output {n} is not a tensor")


# ---- running a partitioned graph -------------------------------------------------------------------------
def _map(value, env):
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, env) for k, v in value.items()}
    return value


def _fit(array, node):
    """The lowered value with exactly the dtype torch gives (promotion rules differ at the edges)."""
    want = node.meta["val"]
    # a symbolic size (a graph compiled for dynamic shapes) is checked by torch's guards, not here
    if len(array.shape) != want.ndim or any(type(w) is int and a != w for a, w in zip(array.shape, want.shape)):
        raise AssertionError(f"flyarray backend: {node.target} lowered to shape {tuple(array.shape)}, "
                             f"torch says {tuple(want.shape)}")
    wanted = dt.from_torch(want.dtype)
    if array.dtype == wanted or node.target in _KEEPS_DTYPE:
        # a move keeps the dtype its value arrives with: torch's fake kernel may have guessed another
        # (native_group_norm's mean/rstd of bfloat16 input: bfloat16 there, float32 from the CPU kernel)
        return array
    return array.astype(wanted)


def _region_fn(region, table, on_error=None):
    """The region as a function of its inputs' values, returning its outputs (traced by fa.jit).
    ``on_error``: an exception type to raise, with the node, where a lowering fails."""
    def run(*values):
        env = dict(zip(region.inputs, values))
        for n in region.nodes:
            args, kwargs = _map(n.args, env), _map(n.kwargs, env)
            if on_error is not None and kwargs.get("device") is not None:
                kwargs["device"] = torch.device("meta")  # the dry run: creation ops beside meta inputs
            if n.target is operator.getitem:
                env[n] = args[0][args[1]]
                continue
            try:
                env[n] = _lower(n, table, args, kwargs)
            except Exception as exc:
                if on_error is None:
                    raise
                raise on_error(n, exc) from exc
        return tuple(env[n] for n in region.outputs)
    return run


# Binary elementwise ops whose operands torch converts to one dtype before computing (TensorIterator's
# common dtype, torch.result_type: a 0-d tensor of the same category as a sized one does not promote).
_COMMON_DTYPE_OPS = {aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor,
                     aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.rsub.Scalar, aten.maximum.default,
                     aten.minimum.default, aten.pow.Tensor_Tensor, aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor,
                     aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor, aten.eq.Scalar, aten.ne.Scalar, aten.lt.Scalar,
                     aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar, aten.where.self}


def _in_torch_dtypes(node, args):
    """``args`` of a _COMMON_DTYPE_OPS node as torch computes with them: every tensor operand takes the
    common dtype first (uint8 [n] with an int8 0-d tensor -41 compares against 215; u8 + i8 * alpha is
    computed in int16; a float64 0-d tensor beside a float32 one is rounded to float32, so x - s is 0
    where x == s in float32). A Python number beside a float16/bfloat16 tensor: ``_opmath_scalar`` for
    arithmetic (torch's float32 opmath), rounded to the tensor's dtype for comparisons (as torch's
    compare kernels: f16(0.1) == 0.1)."""
    first = 1 if node.target is aten.where.self else 0
    operands = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args[first:first + 2]]
    if len(operands) != 2 or not any(isinstance(o, torch.Tensor) for o in operands):
        return args
    if not all(isinstance(o, (torch.Tensor, bool, int, float)) for o in operands):
        return args
    common = torch.result_type(*operands)
    if node.target in (aten.div.Tensor, aten.div.Scalar) and not (common.is_floating_point or common.is_complex):
        # true division of integers is computed in the default float dtype, each operand converted from its
        # own dtype: through the integer common dtype, a 0-d int16 -50 beside uint8 would wrap to 206
        common = torch.get_default_dtype()
    out = list(args)
    for i in range(first, first + 2):
        value = out[i]
        want = dt.from_torch(common)
        if isinstance(value, fa.Array):
            if value.dtype != want:
                out[i] = value.astype(_cpu_scalar_opmath(node, i, value, want))
        else:
            other = out[2 * first + 1 - i]  # the other operand of the two
            if node.target in _COMPARISONS and type(value) in (int, float) and want in (fa.float16, fa.bfloat16):
                out[i] = fa.full((), value, dtype=want, device=other.device)
            else:
                out[i] = _opmath_scalar(value, want, other.device)
    return out


def _cpu_scalar_opmath(node, i, value, want):
    """The dtype operand ``i`` of a float16/bfloat16 op takes: ``want``, except a 0-d real tensor (float,
    integer or bool) as the second operand of mul/div on the CPU, which torch's CPU kernels read in
    float32 (their opmath) from its own dtype instead of rounding it to the result's (x * tensor(70000)
    is finite); CUDA kernels round a 0-d CUDA tensor."""
    if (i == 1 and value.ndim == 0 and value.dtype.kind in "fiub" and want in (fa.float16, fa.bfloat16)
            and node.target in (aten.mul.Tensor, aten.div.Tensor) and value.device.type == "cpu"):
        return fa.float32
    return want


_COMPARISONS = {aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor,
                aten.eq.Scalar, aten.ne.Scalar, aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar}


def _lower(node, table, args, kwargs):
    if node.target in _COMMON_DTYPE_OPS:
        args = _in_torch_dtypes(node, args)
    out = table[node.target](*args, **kwargs)
    if isinstance(out, (tuple, list)):
        return tuple(_fit(o, ref) for o, ref in zip(out, _getitem_refs(node, len(out))))
    return _fit(out, node)


class _Meta:
    def __init__(self, val):
        self.meta = {"val": val}


def _getitem_refs(node, count):
    return [_Meta(v) for v in _metas(node)][:count]


def _meta_value(node):
    """A stand-in for ``node``'s value to record on: a meta-device array (recording runs nothing, sizes
    from ``_dry_run_size``), the Python value, or None where no size can be given (the dry run is
    skipped then)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        shape, stride = [_dry_run_size(d) for d in val.shape], [_dry_run_size(d) for d in val.stride()]
        if None in shape or None in stride:
            return None
        return fa.asarray(torch.empty_strided(shape, stride, dtype=val.dtype, device="meta"))
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _dry_run_size(val)
    return val


def _dry_run_size(size):
    """An int, or a symbolic value's example (its hint): a graph compiled for dynamic shapes is dry-run on
    the sizes it was traced with, so dtype and case refusals still fall back to torch. A data-dependent
    size (unbacked: a boolean mask's row count, mark_unbacked) has no hint: its expression is evaluated
    with each unbacked symbol at a stand-in value (``_unbacked_stand_in``; layout decisions, which must
    not rest on a stand-in, use ``_hint``); None if that fails."""
    if type(size) is int:
        return size
    node = getattr(size, "node", None)
    hint = getattr(node, "hint", None)
    if hint is not None:
        return type(hint)(hint)
    return _unbacked_stand_in(node) if isinstance(size, torch.SymInt) else None


_UNBACKED_SIZE = 2   # the dry run only records (dtypes, cases): any size past the 0/1 special cases serves


def _unbacked_stand_in(node):
    """A data-dependent size's value for the dry run alone: backed symbols at their hints, unbacked ones at
    _UNBACKED_SIZE. Without it the dry run skipped such regions, and a case flyarray does not cover (an
    int64 top-k) crashed instead of running as the torch op."""
    expr, shape_env = getattr(node, "expr", None), getattr(node, "shape_env", None)
    if expr is None or shape_env is None:
        return None
    known = getattr(shape_env, "backed_var_to_val", None)   # torch >= 2.13 (var_to_val: deprecated there)
    known = shape_env.var_to_val if known is None else known
    values = {sym: known.get(sym, _UNBACKED_SIZE) for sym in expr.free_symbols}
    try:
        return int(expr.xreplace(values))
    except (TypeError, ValueError):
        return None


def _dry_run(steps, table):
    """Record every region once on meta arrays (nothing runs): the first node whose lowering raises
    (a case flyarray does not cover: an int GEMM, a dtype rule that differs) is returned, so it can
    run as the torch op instead of failing the model; None when every region records."""
    from flyarray import config
    for kind, region in steps:
        if kind != "region":
            continue
        values = [_meta_value(n) for n in region.inputs]
        if any(v is None for v in values):  # no recorded value, or a size no stand-in reaches: trust the lowering
            continue
        try:
            outputs = _region_fn(region, table, on_error=_Failed)(*values)
        except _Failed as failed:
            if config.log_level() >= 1:
                print(f"[flyarray] backend: {failed.node.target} runs as the torch op ({failed.cause!r})")
            return failed.node
        region.passing_through = _passing_through(region, outputs)
    return None


def _passing_through(region, outputs) -> frozenset:
    """The region outputs whose recorded value is an input's memory, or the memory of another output that
    torch also makes fresh (a view chain followed to its base): what an identity lowering hands back (the sum
    of a 0-d tensor is that tensor to flyarray, a fresh one in torch). An output torch makes as a view of
    another shares its memory in eager too: that pair is no reason to copy (the backward's saved ``y`` and
    ``y.t()``)."""
    from flyarray import ir
    from flyarray.ops.core import node_of
    roots = []
    for array in outputs:
        node = node_of(array)
        while node.prim is ir.VIEW:
            node = node.inputs[0]
        roots.append(node)
    fresh = [not _is_torch_view(n) for n in region.outputs]
    return frozenset(n for i, (n, root) in enumerate(zip(region.outputs, roots))
                     if root.buffer is not None
                     or any(j != i and other is root and fresh[j] for j, other in enumerate(roots)))


class _Failed(Exception):
    def __init__(self, node, cause):
        super().__init__(f"{node}: {cause!r}")
        self.node, self.cause = node, cause


class _OutputLayout:
    """What torch promises of a region output that flyarray's zero-copy results may not keep.

    - Layout. A tensor torch makes contiguous (``x.transpose(...).contiguous()``, then a torch ``view`` of
      it) comes out contiguous. Where torch code reads the output (a torch op outside the regions, or the
      caller: ``exact``), every dense layout torch gives is kept, its dims in torch's memory order
      (``y = x.t() * 2`` keeps x's order in eager; a later ``y.view``/``as_strided`` depends on it).
    - Memory of its own. An op that is no view in torch (``clone``, a same-dtype ``_to_copy``: identities
      to flyarray's immutable arrays) shares memory neither with the region's inputs nor with its other
      outputs (a saved-for-backward tensor among them), which a later in-place update (``x.add_``)
      would otherwise change under it.
    """

    def __init__(self, node, exact: bool, region):
        self.node = node
        val = node.meta.get("val")
        order = _dense_order(val) if exact else None
        self.order = None if order == tuple(range(len(order or ()))) else order  # None: contiguity (or nothing)
        self.contiguous = order is not None and self.order is None or _known_contiguous(val)
        self.exact = exact
        self.fresh = exact and order is not None and _offset_hint(val) == 0  # no storage offset either
        # checked at run time only where flyarray may hand back memory it was given or shares (~1 us a
        # tensor compared) and torch may not: against the region's inputs (the graph may update one in
        # place later), and where torch code gets it (the caller may update it in place) its other outputs
        self.check_memory = _copied_in_torch(node, region.inside) or (
            node in region.passing_through and not _is_torch_view(node))
        self.check_outputs = exact and self.check_memory

    def as_torch_gives_it(self, t, others):
        """``t`` as torch gives it; ``others``: the region's inputs (and its other outputs where
        ``check_outputs``)."""
        if (self.contiguous and not t.is_contiguous() or self.order is not None and not _in_order(t, self.order)
                or self.fresh and t.storage_offset()):
            return _copy_in_order(t, self.order)
        if self.check_memory and torch_ops._shares_memory(t, others):
            return t.clone()
        return t


def _views_among(region, layouts) -> dict:
    """{output index: the torch view ops (FX nodes, base first) that make it from another output} for
    outputs the caller or a torch op gets (``exact``) that torch makes as views of another such output
    (``b, b.t()``): rebuilt from that output's final tensor, they alias it as in eager even where it was
    copied (re-laid out, or a clone given memory of its own). In dependency order: bases before views."""
    exact = {layout.node: i for i, layout in enumerate(layouts) if layout.exact}
    inside = region.inside
    views = {}
    for node, i in exact.items():
        chain, at = [], node
        while (at.op == "call_function" and isinstance(at.target, torch._ops.OpOverload)
               and _is_torch_view(at) and not at.target._schema.is_mutable and at.args and isinstance(at.args[0], torch.fx.Node)
               and all(a not in inside for a in at.all_input_nodes if a is not at.args[0])):
            chain.append(at)
            at = at.args[0]
            if at in exact:
                views[i] = (exact[at], chain[::-1])
                break
            if at not in inside:
                break
    order, placed = {}, set()
    while len(order) < len(views):  # a base that is itself a view of another output goes after that one
        progressed = False
        for i, (base, chain) in views.items():
            if i not in placed and (base not in views or base in placed):
                order[i], progressed = chain, True
                placed.add(i)
        if not progressed:  # a cycle cannot happen in an FX graph; never leave an output unmade
            return {}
    return order


def _hint(n):
    """An int, or a symbolic size's example value (None where it has none)."""
    if type(n) is int:
        return n
    hint = getattr(getattr(n, "node", None), "hint", None)
    return hint if type(hint) is int else None


def _offset_hint(val):
    return _hint(val.storage_offset()) if isinstance(val, torch.Tensor) else None


def _dense_order(val):
    """The dims of ``val`` outermost first in memory, where its elements are dense and do not overlap
    (a permutation of a contiguous tensor; symbolic sizes by their example values); else None."""
    if not isinstance(val, torch.Tensor) or val.layout != torch.strided:
        return None
    sizes, strides = [_hint(n) for n in val.shape], [_hint(n) for n in val.stride()]
    if None in sizes or None in strides or 0 in sizes:
        return None
    order = tuple(sorted(range(len(sizes)), key=lambda d: -strides[d]))  # stable: ties keep logical order
    return order if _in_order_of(sizes, strides, order) else None


def _in_order_of(sizes, strides, order) -> bool:
    expected = 1
    for d in reversed(order):
        if sizes[d] != 1 and strides[d] != expected:
            return False
        expected *= sizes[d]
    return True


def _in_order(t, order) -> bool:
    return _in_order_of(t.shape, t.stride(), order)


def _copy_in_order(t, order):
    """A fresh copy of ``t`` laid out in ``order`` (None: contiguous)."""
    if order is None:
        return t.clone(memory_format=torch.contiguous_format)
    return torch.empty_permuted(t.shape, order, dtype=t.dtype, device=t.device).copy_(t)


def _known_contiguous(val) -> bool:
    """Whether ``val`` is contiguous without guarding on a symbolic size (an unbacked one cannot be
    guarded on: Tensor.is_contiguous raised GuardOnDataDependentSymNode for a mask-selected result)."""
    if not isinstance(val, torch.Tensor):
        return False
    import torch._prims_common as prims
    if hasattr(prims, "is_contiguous_or_false"):
        return prims.is_contiguous_or_false(val)
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    return statically_known_true(val.is_contiguous())   # older torch: only what needs no guard


# lowered to flyarray movement (or nothing): their result may be an input's memory, viewed
_MOVEMENT = {aten.clone.default, aten._to_copy.default, aten.alias.default, aten.detach.default, aten.view.default,
             aten._unsafe_view.default, aten.reshape.default, aten.permute.default, aten.t.default, aten.transpose.int,
             aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
             aten.slice.Tensor, aten.select.int}
_KEEPS_DTYPE = _MOVEMENT - {aten._to_copy.default}   # moves whose result has their input's dtype


def _copied_in_torch(node, inside) -> bool:
    """Whether ``node`` ends a chain of movement ops in its region (``inside``: which flyarray lowers to
    views of one value, so its result may be memory another tensor holds too) with one of them no view in
    torch (clone, _to_copy: torch promises new memory). The chain stops at the region's edge: past it the
    input is a tensor already, whose own aliasing torch made (a torch view of a cast output, then a select
    in this region, aliases that output as in eager)."""
    while (node in inside and node.op == "call_function" and node.target in _MOVEMENT
           and isinstance(node.args[0], torch.fx.Node)):
        if not _is_torch_view(node):
            return True
        node = node.args[0]
    return False


def _is_torch_view(node) -> bool:
    target = getattr(node, "target", None)
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None)


class CompiledGraph:
    """An FX graph run as regions (fa.jit, replayed per signature) and torch ops."""

    def __init__(self, gm: torch.fx.GraphModule, table: dict, visible_outputs=None):
        """``visible_outputs``: the positions of the graph's outputs that reach the caller (a forward
        graph's others are saved for the backward, which reads any layout); None: all of them."""
        self.gm = gm
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.output = next(n for n in gm.graph.nodes if n.op == "output")
        self.excluded = set()  # lowered ops whose case flyarray turned out not to cover
        while True:
            steps = partition(gm.graph, table, self.excluded)
            bad = _dry_run(steps, table)
            if bad is None:
                break
            self.excluded.add(bad)
        read_by_torch = self._read_by_torch(steps, visible_outputs)
        self.steps = []
        for kind, item in steps:
            if kind == "region":
                fn = fa.jit(_region_fn(item, table))
                layouts = [_OutputLayout(n, n in read_by_torch, item) for n in item.outputs]
                self.steps.append((kind, (item, fn, layouts, _views_among(item, layouts))))
            else:
                self.steps.append((kind, item))
        self.regions = sum(1 for k, _ in self.steps if k == "region")

    def _read_by_torch(self, steps, visible_outputs) -> set:
        """The nodes whose value torch code reads: an op run as torch, or the caller."""
        read = {a for kind, item in steps if kind == "torch" for a in item.all_input_nodes}
        outputs = list(self.output.args[0]) if isinstance(self.output.args[0], (tuple, list)) else [self.output.args[0]]
        positions = range(len(outputs)) if visible_outputs is None else visible_outputs
        read.update(outputs[i] for i in positions if i < len(outputs) and isinstance(outputs[i], torch.fx.Node))
        return read

    def __call__(self, *args):
        env = dict(zip(self.placeholders, args))
        for kind, item in self.steps:
            if kind == "region":
                region, fn, layouts, views = item
                ins = [env[n] for n in region.inputs]
                with eager_rounding_scope():  # a torch program: fp16/bf16 values rounded as eager's (docs/torch.md)
                    made = [o.torch() for o in fn(*ins)]
                for i, (layout, t) in enumerate(zip(layouts, made)):
                    if i in views:
                        continue  # a view of another output: made from that one's final tensor below
                    others = ins + made[:i] + made[i + 1:] if layout.check_outputs else ins
                    env[layout.node] = layout.as_torch_gives_it(t, others)
                for i, chain in views.items():  # bases first (their order in ``views``)
                    t = env[chain[0].args[0]]
                    for op in chain:
                        t = op.target(t, *_map(op.args[1:], env), **_map(op.kwargs, env))
                    env[layouts[i].node] = t
            else:
                env[item] = self._run_torch(item, env)
        return _map(self.output.args[0], env)

    def _run_torch(self, node, env):
        if node.op == "get_attr":
            return functools.reduce(getattr, node.target.split("."), self.gm)
        args, kwargs = _map(node.args, env), _map(node.kwargs, env)
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if node.op == "call_module":
            return self.gm.get_submodule(node.target)(*args, **kwargs)
        raise NotImplementedError(f"flyarray backend: FX node kind {node.op!r}")


# ---- the Dynamo-level pre-pass: library calls torch would decompose become our custom ops ------------------
def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention (B, H, S, D) through flyarray::attention_forward (B, S, H, D), whose
    backward reads the forward's (out, lse) instead of recomputing them; the result in eager's memory order. Under torch.autocast the inputs
    are cast to its dtype first, as torch's SDPA (autocast has no rule for our op, which would run in fp32)."""
    device = query.device.type
    if query.shape[1] == 0:   # no heads (_sdpa_takes): the empty result, connected to every input for autograd
        return query * 0 + (key.sum() + value.sum()).to(query.dtype) * 0
    if device != "meta" and torch.is_autocast_enabled(device):   # meta has no autocast (it raises)
        low = torch.get_autocast_dtype(device)
        query, key, value = (t.to(low) for t in (query, key, value))
    out, _ = torch.ops.flyarray.attention_forward(query.transpose(1, 2), key.transpose(1, 2),
                                                  value.transpose(1, 2), None, None, scale, is_causal)
    out = out.transpose(1, 2)  # (B, H, S, D) in (B, S, H, D) order: CUDA's flash/efficient/cuDNN SDPA layout
    # torch's CPU SDPA, and its math path on CUDA (head dims it cannot take unpadded), give a contiguous one: a
    # copy always (.contiguous() asks whether it already is, a guard on S != 1 under backed_size_oblivious)
    return out.clone(memory_format=torch.contiguous_format) if device != "cuda" or query.shape[-1] % 8 else out


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    """F.rms_norm through flyarray::rms_norm. eps=None is torch's default: the machine epsilon of the type
    ATen computes in (float32 for float16/bfloat16 inputs, 1.2e-7), not of x's dtype (7.8e-3 for bfloat16,
    which would visibly rescale rows of small mean square)."""
    if eps is None:
        eps = torch.finfo(torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype).eps
    return torch.ops.flyarray.rms_norm(x, weight, float(eps))


_SDPA_TARGETS = {torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
_RMS_TARGETS = {torch.nn.functional.rms_norm, torch.rms_norm}


def _example(node, name, index):
    a = node.kwargs.get(name, node.args[index] if len(node.args) > index else None)
    return a.meta.get("example_value") if isinstance(a, torch.fx.Node) else a


# What Dynamo records where it inlines torch.func.grad / jvp / vmap / jacrev (the transform's levels)
_FUNCTORCH_LEVELS = frozenset(("_grad_increment_nesting", "_jvp_increment_nesting", "_vmap_increment_nesting",
                               "_wrap_for_grad", "_unwrap_for_grad", "_enter_dual_level"))


def _under_torch_func(gm: torch.fx.GraphModule) -> bool:
    """Whether a Dynamo graph runs inside a torch.func transform: torch's custom ops (ours) have no functorch
    rules ("an autograd.Function ... must override setup_context"), so the calls stay torch's there."""
    return any(n.op == "call_function" and getattr(n.target, "__name__", None) in _FUNCTORCH_LEVELS
               for n in gm.graph.nodes)


def rewrite_library_calls(gm: torch.fx.GraphModule, families) -> int:
    """Point SDPA (no mask, no dropout, 4-D) and 1-D-shaped rms_norm at our custom ops; returns how many.
    None inside a torch.func transform (``_under_torch_func``)."""
    count = 0
    if _under_torch_func(gm):
        return count
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in _SDPA_TARGETS and "attention" in families and _sdpa_ok(node):
            node.target = _sdpa
            count += 1
        elif node.target is torch.nn.functional.multi_head_attention_forward and "attention" in families:
            node.target = _mha_forward
            count += 1
        elif node.target in _RMS_TARGETS and "norm" in families and _rms_ok(node):
            node.target = _rms_norm
            count += 1
    if count:
        gm.recompile()
    return count


def _sdpa_ok(node):
    return _sdpa_takes(*(_example(node, name, i) for i, name in enumerate(
        ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"))))


def _sdpa_takes(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Whether an SDPA call with these arguments (tensors or fake tensors) is one our kernels compute."""
    if not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in (q, k, v)):
        return False
    if v.shape[-1] != q.shape[-1] or q.shape[-1] == 0:   # torch allows value's head_dim to differ (or be 0)
        return False
    if q.shape[-1] > ATTENTION_MAX_HEAD_DIM:  # past our kernels' widest head
        return False
    if not (q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16, torch.float32)):
        return False                  # float64 and mixed dtypes stay torch's (our kernels are fp16/bf16/fp32)
    if k.shape != v.shape or k.shape[0] != q.shape[0]:
        return False                  # torch broadcasts batch and kv-head dims; our kernels take them equal
    if q.shape[1] == 0:               # no heads: an empty result, made by _sdpa without a kernel (torch 2.11's
        # CPU flash kernel stops the process with a division by zero on it: SIGFPE, eager included)
        return attn_mask is None and not dropout_p and (k.shape[1] == 0 or enable_gqa)
    if k.shape[1] == 0:               # kv without heads for query heads: torch's error
        return False
    # GQA: with enable_gqa, query head h reads key/value head h // (Hq / Hkv), as our kernels do
    heads = k.shape[1] == q.shape[1] or (enable_gqa and 0 < k.shape[1] and q.shape[1] % k.shape[1] == 0)
    return (attn_mask is None and not dropout_p and heads
            and not (is_causal and q.shape[2] != k.shape[2]))  # where the causal diagonal sits differs


# nn.MultiheadAttention (and the Transformer layers on it) reaches Dynamo as one call of
# F.multi_head_attention_forward, which AOTAutograd traces into torch's own SDPA kernels. Traced through
# _mha_forward instead, its SDPA call (need_weights=False, no mask, no dropout) becomes ours.
_mha_routing = threading.local()
_torch_sdpa = torch.nn.functional.scaled_dot_product_attention


def _routed_sdpa(*args, **kwargs):
    if getattr(_mha_routing, "on", False) and _sdpa_takes(*args, **kwargs):
        return _sdpa(*args, **kwargs)
    return _torch_sdpa(*args, **kwargs)


def _mha_forward(*args, **kwargs):
    """F.multi_head_attention_forward with the SDPA it calls routed to _sdpa where our kernels take it."""
    functional = torch.nn.functional
    with _MHA_LOCK:   # the module global is swapped while this thread traces (other threads: torch's SDPA)
        previous, functional.scaled_dot_product_attention = functional.scaled_dot_product_attention, _routed_sdpa
        _mha_routing.on = True
        try:
            return functional.multi_head_attention_forward(*args, **kwargs)
        finally:
            _mha_routing.on = False
            functional.scaled_dot_product_attention = previous


_MHA_LOCK = threading.RLock()
# a forked child has only the forking thread: a lock another thread held at the fork would stay held for good
os.register_at_fork(after_in_child=_MHA_LOCK._at_fork_reinit)


def _rms_ok(node):
    shape = _example(node, "normalized_shape", 1)
    x = _example(node, "input", 0)
    w = _example(node, "weight", 2)
    return (isinstance(shape, (list, tuple)) and len(shape) == 1 and isinstance(x, torch.Tensor)
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
            and (w is None or w.dtype == x.dtype))  # torch promotes x * w; fa.nn.rms_norm keeps x's dtype


# ---- the backend -----------------------------------------------------------------------------------------
def decompositions() -> dict:
    """What AOTAutograd decomposes for us: the backward-only ATen ops in _DECOMPOSE."""
    from torch._decomp import get_decompositions
    return get_decompositions(_DECOMPOSE)


# ---- the ATen-level pass: sums of select_backward become one cat ------------------------------------------
def merge_select_backward_sums(gm: torch.fx.GraphModule) -> int:
    """``q, k, v = qkv.unbind(0)`` (or ``qkv[0], qkv[1], ...``) in a forward makes a backward that adds up
    one ``select_backward`` per index: zeros with one slice filled, each, then the sums. When the
    indices are distinct, that is the gradients stacked along the axis (zeros where no index was
    selected): one ``cat`` writes the result once instead of a fill and a copy per index plus the adds.
    (Only a -0.0 gradient differs: the sum made it +0.0.) Returns how many sums were merged."""
    merged = 0
    for node in reversed(list(gm.graph.nodes)):
        if node.graph is None or not _plain_add(node):
            continue
        leaves, inner = _add_tree(node)
        plan = _stack_plan(leaves)
        if plan is None:
            continue
        with gm.graph.inserting_before(node):
            new = _stacked(gm.graph, plan, leaves[0])
        node.replace_all_uses_with(new)
        for n in [node, *inner, *leaves]:
            if not n.users:
                gm.graph.erase_node(n)
        _permute_parts_instead(gm.graph, new)
        merged += 1
    if merged:
        gm.graph.lint()
        gm.recompile()
    return merged


def _permute_parts_instead(graph, cat):
    """cat(parts, d) whose one user is permute(., p) -> cat(permute(part, p) for each part, p.index(d)): the
    stacked gradient is written once, straight in the layout its consumer reads (the qkv projection's
    backward reshapes it to (tokens, 3 * hidden)), instead of stacked and then copied into that layout."""
    (user,) = cat.users if len(cat.users) == 1 else (None,)
    if user is None or user.target is not aten.permute.default or user.args[0] is not cat:
        return
    parts, dim = cat.args
    perm = [p % len(user.args[1]) for p in user.args[1]]
    with graph.inserting_before(user):
        moved = []
        for part in parts:
            m = graph.call_function(aten.permute.default, (part, perm))
            m.meta["val"] = part.meta["val"].permute(perm)
            moved.append(m)
        out = graph.call_function(aten.cat.default, (moved, perm.index(dim)))
        out.meta["val"] = user.meta["val"].new_empty(tuple(user.meta["val"].shape))
    user.replace_all_uses_with(out)
    graph.erase_node(user)
    graph.erase_node(cat)


def _plain_add(node) -> bool:
    return node.op == "call_function" and node.target is aten.add.Tensor and node.kwargs.get("alpha", 1) == 1 \
        and len(node.args) == 2


def _add_tree(root):
    """The leaves of the additions under ``root`` (an inner addition counts when ``root``'s tree is its only
    user), and the inner additions."""
    leaves, inner, stack = [], [], list(root.args)
    while stack:
        n = stack.pop()
        if isinstance(n, torch.fx.Node) and _plain_add(n) and len(n.users) == 1:
            inner.append(n)
            stack.extend(n.args)
        else:
            leaves.append(n)
    return leaves, inner


def _stack_plan(leaves):
    """(axis, size, {index: gradient node}) when every leaf is a select_backward used once, all with the
    same input sizes, axis and dtype, at distinct indices; else None."""
    if len(leaves) < 2 or not all(isinstance(n, torch.fx.Node) and n.op == "call_function" and
                                  n.target is aten.select_backward.default and len(n.users) == 1 for n in leaves):
        return None
    sizes = tuple(leaves[0].args[1])
    if not all(type(s) is int for s in sizes):   # a dynamic size (a SymInt node): left as it is
        return None
    dim = leaves[0].args[2] % len(sizes)
    vals = [n.meta.get("val") for n in leaves]
    if any(v is None for v in vals) or len({v.dtype for v in vals}) != 1:
        return None
    by_index = {}
    for n in leaves:
        if tuple(n.args[1]) != sizes or n.args[2] % len(sizes) != dim:
            return None
        index = n.args[3] % sizes[dim]
        if index in by_index:
            return None
        by_index[index] = n.args[0]
    return dim, sizes, by_index


def _stacked(graph, plan, like):
    """cat([unsqueeze(g_i, axis) at index i, zeros for each run of unselected indices], axis)."""
    dim, sizes, by_index = plan
    val = like.meta["val"]
    parts, index = [], 0
    while index < sizes[dim]:
        if index in by_index:
            part = graph.call_function(aten.unsqueeze.default, (by_index[index], dim))
            part.meta["val"] = val.new_empty(tuple(1 if i == dim else s for i, s in enumerate(sizes)))
            index += 1
        else:
            run = next((j for j in range(index, sizes[dim]) if j in by_index), sizes[dim]) - index
            shape = [run if i == dim else s for i, s in enumerate(sizes)]
            part = graph.call_function(aten.full.default, (shape, 0.0),
                                       {"dtype": val.dtype, "device": val.device})
            part.meta["val"] = val.new_empty(tuple(shape))
            index += run
        parts.append(part)
    out = graph.call_function(aten.cat.default, (parts, dim))
    out.meta["val"] = val.new_empty(tuple(sizes))
    return out


def make_backend(ops=None):
    """A Dynamo backend lowering the op families ``ops`` (None: all of FAMILIES)."""
    from torch._dynamo.backends.common import aot_autograd
    table = lowerings(ops)
    families = set(FAMILIES) if ops is None else set(ops)

    def compile_graph(gm, example_inputs, user_outputs=None):
        """``user_outputs``: how many outputs the Dynamo graph has (a forward or inference graph); None
        for a backward, whose outputs (gradients) go to autograd, which reads any layout: AccumulateGrad
        makes a gradient the parameter's layout anyway, so keeping eager's transposed layout of a weight
        gradient our GEMM writes contiguous would cost a copy there and another in AccumulateGrad."""
        from torch._functorch.aot_autograd import make_boxed_func
        if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in example_inputs):
            # meta tensors have shapes and no values: nothing to compute, and torch's meta kernels give the
            # outputs' shapes, dtypes and strides as eager (and Inductor) would
            return make_boxed_func(gm)
        if "elementwise" in families:
            merge_select_backward_sums(gm)
        return make_boxed_func(CompiledGraph(gm, table, _visible_outputs(user_outputs)))

    from torch._functorch.partitioners import min_cut_rematerialization_partition
    # Inductor's partitioner, for the same reason Inductor uses it: we fuse elementwise ops too, so the
    # forward saves what is cheapest to keep (matmul outputs) and the backward recomputes the cheap
    # elementwise values from them (the SwiGLU forward no longer writes silu(gate) for the backward).
    # Not for a graph that updates a tensor in place: it may save that input to recompute from it, and
    # the backward would then read the updated value (or fail torch's version check) -- AOTAutograd's
    # default partition saves the values computed before the update instead.
    def backend(gm, example_inputs, **kwargs):
        rewrite_library_calls(gm, families)
        outputs = _count_outputs(gm)
        forward = functools.partial(compile_graph, user_outputs=outputs)
        compilers = dict(fw_compiler=forward, inference_compiler=forward, bw_compiler=compile_graph,
                         decompositions=decompositions())
        if not _updates_in_place(gm):
            compilers["partition_fn"] = min_cut_rematerialization_partition
        return aot_autograd(**compilers)(gm, example_inputs, **kwargs)
    return backend


def _count_outputs(gm: torch.fx.GraphModule) -> int:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return len(torch.utils._pytree.tree_leaves(out.args[0]))


def _visible_outputs(user_outputs):
    """The positions of a graph's outputs that reach the caller: a forward graph returns the new values
    of the inputs it updates in place first (AOTAutograd's metadata counts them), then the
    ``user_outputs``, then the intermediate bases (an intermediate that several outputs view: AOTAutograd
    rebuilds those outputs from it, so it needs eager's layout as they do), then (training) the tensors saved
    for the backward. None (all of them) where AOTAutograd says nothing; none for a backward graph
    (compile_graph)."""
    if user_outputs is None:
        return range(0)
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    start = getattr(meta, "num_mutated_inp_runtime_indices", None)
    if start is None:
        return None
    return range(start, start + user_outputs + getattr(meta, "num_intermediate_bases", 0))


# What Dynamo records for ``t[i] = v`` and for augmented assignments on a tensor (``t += 1``, ``t *= 2``):
# functions of the operator module, not methods ending in ``_``.
_OPERATOR_IN_PLACE = frozenset((operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                                operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                                operator.ixor, operator.ilshift, operator.irshift, operator.imatmul))


def _may_be_tensor(arg) -> bool:
    """Whether a Dynamo graph argument is (or, with no recorded value, may be) a tensor."""
    if not isinstance(arg, torch.fx.Node):
        return isinstance(arg, torch.Tensor)
    value = arg.meta.get("example_value", arg.meta.get("val"))
    return value is None or isinstance(value, torch.Tensor)


def _updates_in_place(gm: torch.fx.GraphModule) -> bool:
    """Whether a Dynamo graph has an in-place op (``x.add_``, ``torch.relu_``, ``F.relu(x, inplace=True)``,
    ``torch.mul(x, 3, out=x)``, ``x[i] = v``, ``x += 1``; an ATen op whose schema mutates, as ``_mutates``
    reads it)."""
    for node in gm.graph.nodes:
        if node.op not in ("call_method", "call_function"):
            continue
        if _mutates(node) or node.kwargs.get("inplace") or node.kwargs.get("out") is not None:
            return True
        if node.target in _OPERATOR_IN_PLACE and node.args and _may_be_tensor(node.args[0]):
            return True
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        if name.endswith("_") and not name.endswith("__") and name != "requires_grad_":
            return True
    return False


def flyarray_backend(gm, example_inputs, **kwargs):
    """The ``"flyarray"`` Dynamo backend: every op family lowered."""
    return _DEFAULT(gm, example_inputs, **kwargs)


_DEFAULT = make_backend()


def register():
    """Register the backend under the name "flyarray" (the entry point does this on a pip install)."""
    from torch._dynamo.backends import registry
    # torch keeps registered compilers in _COMPILER_FNS (the entry point's lookup lands there too); a second
    # register_backend under the same name is an AssertionError
    if "flyarray" not in getattr(registry, "_COMPILER_FNS", {}):
        registry.register_backend(name="flyarray")(flyarray_backend)
