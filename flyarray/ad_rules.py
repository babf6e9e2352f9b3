"""Derivative rules, one place per primitive: each rule is attached to its primitive object as ``vjp``
(and, where forward mode needs more than the generic rule, ``jvp``).

The primitives live in primitives.py (elementwise, reduce), ir.py (view, the movement ops), ops/manipulation.py
(concat) and the library-op modules (matmul, attention, ...). Their derivative rules are written with fa
ops, which primitives.py may not import (nothing below the front imports ``ops``: docs/architecture.md),
so they live here, in the same order as primitives.py's tables, and register onto those objects when
flyarray.transforms.autodiff is imported.

A VJP rule is ``rule(g, e) -> [cotangent or None per input]``: ``g`` is the cotangent of the node's value
(an Array of the node's shape and dtype; for a library node, a list with one per output, zeros where
an output is unused), ``e`` an ``autodiff.Eqn`` (``e.x`` the input Arrays, ``e.y`` the output Array(s),
``e.params``, ``e.shape``, ``e.dtype``, ``e.active``: which inputs want a cotangent). None means zero.
Rules only record ops: the backward pass is a lazy graph that the scheduler fuses like any other.

A JVP rule is ``rule(t, e) -> tangent`` (``t``: one tangent or None per input). An elementwise primitive
needs none: its Jacobian is diagonal in each input, so its VJP rule applied to an input's tangent is
that input's contribution to the output tangent (autodiff.jvp_elementwise).
"""
from __future__ import annotations

import math

from . import dtypes as dt
from . import ir, views, ops as F
from .ops import core
from .ops.decompositions import DECOMPOSITIONS
from .ops.indexing import GATHER, SCATTER
from .ops.library_ops import ATTENTION, RAGGED_DOT, SCALED_MATMUL, SOFTMAX, TOP_K
from .ops.linalg import MATMUL
from .ops.manipulation import CONCAT
from .ops.sorting import SCAN, SORT
from .primitives import ELEMENTWISE, REDUCE, Library

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def zeros(shape, d, device):
    return F.zeros(shape, dtype=d, device=device)


def _zero_rule(g, e):
    return [None] * len(e.x)


# ---- elementwise (primitives.ELEMENTWISE) ------------------------------------------------------------
def _unary(fn):
    return lambda g, e: [fn(g, e.x[0], e.y)]


def _binary(fn):
    return lambda g, e: list(fn(g, e.x[0], e.x[1], e.y))


def _balanced_eq(x, y, out):
    """JAX's tie rule for maximum/minimum: 1 where x alone is the answer, 0.5 where x and y tie."""
    return F.where(x == out, F.where(y == out, 0.5, 1.0), 0.0).astype(out.dtype, copy=False)


def _logaddexp_share(x, other, out):
    """d logaddexp / dx = exp(x - out), except where x is the infinite answer (inf - inf is NaN): there
    maximum's tie rule, 1 alone or 0.5 tied (JAX's); a NaN answer stays NaN."""
    infinite = F.isinf(out) & (x == out)
    # the exponent is 0 where it is not taken: inf - inf there made the second derivative NaN (where's trap)
    return F.where(infinite, _balanced_eq(x, other, out), F.exp(F.where(infinite, 0.0, x - out)))


_UNARY = {
    "exp": lambda g, x, y: g * y,
    "exp2": lambda g, x, y: g * y * math.log(2.0),
    "log": lambda g, x, y: g / x,
    "log2": lambda g, x, y: g / (x * math.log(2.0)),
    "log10": lambda g, x, y: g / (x * math.log(10.0)),
    "sqrt": lambda g, x, y: g * 0.5 / y,
    "rsqrt": lambda g, x, y: g * -0.5 * y / x,
    "sin": lambda g, x, y: g * F.cos(x),
    "cos": lambda g, x, y: -(g * F.sin(x)),
    "tan": lambda g, x, y: g * (1.0 + y * y),
    "tanh": lambda g, x, y: g * (1.0 - y * y),
    "erf": lambda g, x, y: g * (_TWO_OVER_SQRT_PI * F.exp(-(x * x))),
    "erfc": lambda g, x, y: g * (-_TWO_OVER_SQRT_PI * F.exp(-(x * x))),
    "sigmoid": lambda g, x, y: g * (y * F.sigmoid(-x)),   # 1 - y is 0 once y rounds to 1 (x > 17 in fp32)
    "acos": lambda g, x, y: -(g * F.rsqrt(1.0 - x * x)),
    "acosh": lambda g, x, y: g * F.rsqrt((x - 1.0) * (x + 1.0)),
    "asin": lambda g, x, y: g * F.rsqrt(1.0 - x * x),
    "asinh": lambda g, x, y: g * F.rsqrt(x * x + 1.0),
    "atan": lambda g, x, y: g / (1.0 + x * x),
    "atanh": lambda g, x, y: g / (1.0 - x * x),
    "cosh": lambda g, x, y: g * F.sinh(x),
    "sinh": lambda g, x, y: g * F.cosh(x),
    "expm1": lambda g, x, y: g * F.exp(x),   # y + 1 cancels to 0 where e^x < eps (x < -17 in fp32)
    "log1p": lambda g, x, y: g / (1.0 + x),
    "relu": lambda g, x, y: F.where(x > 0, g, 0.0),  # 0 at 0, as JAX and torch
    "silu": lambda g, x, y: g * _silu_grad(x),
    "gelu": lambda g, x, y: g * (0.5 * (1.0 + F.erf(x * 0.7071067811865476)) + x * F.exp(x * x * -0.5) * _INV_SQRT_2PI),
    "gelu_tanh": lambda g, x, y: g * _gelu_tanh_grad(x),
    "negative": lambda g, x, y: -g,
    "positive": lambda g, x, y: g,
    "abs": lambda g, x, y: g * F.sign(x),  # 0 at 0, as JAX
    "square": lambda g, x, y: g * (2.0 * x),
    "reciprocal": lambda g, x, y: -(g * y * y),
}


def _silu_grad(x):
    s = F.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _gelu_tanh_grad(x):
    t = F.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)


def _pow_rule(g, x, p, y):
    # JAX: d/dx x**0 is 0, also at x == 0. The exponent in the unused branch is kept finite too (x**1 there
    # where p == 0): its own derivative enters the next order, and 0 * (0 ** -1) would make that NaN
    zero = p == 0
    dx = g * F.where(zero, 0.0, p * F.pow(x, F.where(zero, 1.0, p - 1.0)))
    dp = g * F.log(F.where(x == 0, 1.0, x)) * y  # JAX: 0 where x == 0
    return dx, dp


def _hypot_rule(g, a, b, y):
    safe = F.where(y == 0, 1.0, y)
    return g * a / safe, g * b / safe


def _copysign_rule(g, a, b, y):
    """copysign(a, b) is |a| with b's sign: at a = +-0 the derivative is 0, as abs's is (torch and JAX agree)."""
    flip = F.signbit(a) != F.signbit(y)
    return F.where(a == 0, 0.0, F.where(flip, -g, g)), None


_BINARY = {
    "add": lambda g, a, b, y: (g, g),
    "subtract": lambda g, a, b, y: (g, -g),
    "multiply": lambda g, a, b, y: (g * b, g * a),
    "divide": lambda g, a, b, y: (g / b, -(g * y) / b),
    "pow": _pow_rule,
    "maximum": lambda g, a, b, y: (g * _balanced_eq(a, b, y), g * _balanced_eq(b, a, y)),
    "minimum": lambda g, a, b, y: (g * _balanced_eq(a, b, y), g * _balanced_eq(b, a, y)),
    "atan2": lambda g, a, b, y: (g * b / (a * a + b * b), -(g * a) / (a * a + b * b)),
    "hypot": _hypot_rule,
    "copysign": _copysign_rule,
    "logaddexp": lambda g, a, b, y: (g * _logaddexp_share(a, b, y), g * _logaddexp_share(b, a, y)),
    # remainder(a, b) = a - floor(a / b) * b: d/da = 1, d/db = -floor(a / b) (almost everywhere)
    "remainder": lambda g, a, b, y: (g, -(g * F.floor(a / b))),
}

# Piecewise-constant: zero gradient almost everywhere (JAX gives zeros too).
_ZERO = ("sign", "floor", "ceil", "trunc", "round", "floor_divide", "nextafter")


def _where_rule(g, e):
    c = e.x[0]
    return [None, F.where(c, g, 0.0), F.where(c, 0.0, g)]


def _astype_rule(g, e):
    """The cotangent is cast back to the input's dtype (float inputs only: integers get none)."""
    return [g.astype(e.x[0].dtype, copy=False)]


def _astype_jvp(t, e):
    return t[0].astype(e.dtype, copy=False)


for _name, _fn in _UNARY.items():
    ELEMENTWISE[_name].vjp = _unary(_fn)
for _name, _fn in _BINARY.items():
    ELEMENTWISE[_name].vjp = _binary(_fn)
for _name in _ZERO:
    ELEMENTWISE[_name].vjp = _zero_rule
ELEMENTWISE["where"].vjp = _where_rule
ELEMENTWISE["astype"].vjp = _astype_rule
ELEMENTWISE["astype"].jvp = _astype_jvp
# Bool-valued (comparisons, logical_*, is*, signbit) and integer-only (bitwise_*) primitives make no
# float values, so no cotangent ever reaches them: they need no rule.


# ---- reductions (primitives.REDUCE); nodes keep dims, params are the reduced axes --------------------
def _sum_vjp(g, e):
    return [F.broadcast_to(g, e.x[0].shape).astype(e.x[0].dtype, copy=False)]


def _sum_jvp(t, e):
    return F.sum(t[0], axis=e.params, keepdims=True).astype(e.dtype, copy=False)


def _chooser_weights(e):
    """max/min: the positions that attain the result share its cotangent equally (JAX's rule)."""
    x, y = e.x[0], e.y
    loc = (x == y).astype(x.dtype)
    return loc / F.sum(loc, axis=e.params, keepdims=True)


def _prod_weights(e):
    """d prod / d x_i = the product of the others, as exclusive products from both ends (prefix * suffix):
    right where x has zeros, and differentiable again. (y / x with a zero branch was right to first order
    but its own derivative was not: the Hessian at two zeros lost its nonzero entry, and at one zero it
    came out asymmetric.)"""
    x, axes = e.x[0], [a % e.x[0].ndim for a in e.params]
    kept = [a for a in range(x.ndim) if a not in axes]
    moved = F.permute_dims(x, kept + axes)   # the reduced axes last, then flattened into one
    rows = F.reshape(moved, moved.shape[:len(kept)] + (math.prod(x.shape[a] for a in axes),))
    prefix = F.cumulative_prod(rows, axis=-1, include_initial=True)[..., :-1]
    suffix = F.flip(F.cumulative_prod(F.flip(rows, axis=-1), axis=-1, include_initial=True)[..., :-1], axis=-1)
    others = _overflow_before_a_zero_is_zero(prefix * suffix, rows)
    others = F.reshape(others, moved.shape)
    return F.permute_dims(others, [(kept + axes).index(a) for a in range(x.ndim)])


def _overflow_before_a_zero_is_zero(products, rows):
    """The products of the others, with 0 where they are NaN only because a partial product of finite
    values overflowed before meeting a zero (``[1e30, 1e30, 0, 1]`` in float32: inf * 0): the true product
    is 0 (torch's gradient too). An inf or NaN among the others keeps the NaN."""
    def among_others(mask):
        count = F.sum(mask.astype(dt.int32), axis=-1, keepdims=True)
        return (count - mask.astype(dt.int32)) > 0
    overflowed = among_others(rows == 0) & ~among_others(~F.isfinite(rows)) & F.isnan(products)
    return F.where(overflowed, F.zeros((), dtype=products.dtype, device=products.device), products)


REDUCE["sum"].vjp = _sum_vjp
REDUCE["sum"].jvp = _sum_jvp
for _name, _weights in (("max", _chooser_weights), ("min", _chooser_weights), ("prod", _prod_weights)):
    REDUCE[_name].vjp = (lambda w: lambda g, e: [g * w(e)])(_weights)
    REDUCE[_name].jvp = (lambda w: lambda t, e: F.sum(t[0] * w(e), axis=e.params, keepdims=True))(_weights)
# any/all/argmax/argmin give bool or integer results: no cotangent reaches them.


# ---- views (ir.VIEW: a chain of movement ops over a base) -------------------------------------------
def _view_shapes(base_shape, ops):
    shapes = [tuple(base_shape)]
    for op in ops:
        shapes.append(views.output_shape(op, shapes[-1]))
    return shapes


def _permuted(g, axes):
    """``permute_dims(g, axes)``; a pending product transposed is the product of its operands
    transposed, in the other order: ``(a @ b).mT == b.mT @ a.mT``. The cotangent of ``x @ w.T``
    with respect to ``w`` is then computed in ``w``'s own layout, so an update ``w - lr * dw``
    reads it row by row instead of across a transpose (a GEMM reads either layout at full speed)."""
    node = g._node
    swap_last = len(axes) >= 2 and axes == tuple(range(len(axes) - 2)) + (len(axes) - 1, len(axes) - 2)
    if swap_last and node.kind == "output" and not node.realized and node.inputs[0].prim is MATMUL:
        a, b = (core.Array(i) for i in node.inputs[0].inputs)
        if a.ndim == b.ndim == len(axes):
            return F.matmul(b.mT, a.mT)
    return F.permute_dims(g, axes)


def _view_vjp(g, e):
    ops = e.params
    shapes = _view_shapes(e.x[0].shape, ops)
    for op, before in zip(reversed(ops), reversed(shapes[:-1])):
        kind = op[0]
        if kind == "reshape":
            g = F.reshape(g, before)
        elif kind == "permute":
            inverse = [0] * len(op[1])
            for i, p in enumerate(op[1]):
                inverse[p] = i
            g = _permuted(g, tuple(inverse))
        elif kind == "expand":
            axes = tuple(i for i, (b, a) in enumerate(zip(before, op[1])) if b == 1 and a != 1)
            if axes:
                g = F.sum(g, axis=axes, keepdims=True)
        elif kind == "slice":
            _, starts, steps, sizes = op
            for axis, (start, step, size, full) in enumerate(zip(starts, steps, sizes, before)):
                if start != 0 or step != 1 or size != full:
                    g = unslice(g, axis, start, step, full)
        else:
            g = F.flip(g, axis=op[1])
    return [g]


def unslice(g, axis, start, step, full):
    """The transpose of ``x[start : start + step * n : step]`` along ``axis``: ``g`` put back at those
    positions of an axis of size ``full``, zeros elsewhere (flyarray has no pad op: concat with zeros)."""
    n = g.shape[axis]
    if n == 0:
        return _zeros_along(g, axis, full)
    span = n
    if step > 1:  # interleave step-1 zeros after each element, then drop the trailing ones
        spread = F.expand_dims(g, axis + 1)
        spread = F.concat([spread, _zeros_along(spread, axis + 1, step - 1)], axis=axis + 1)
        shape = list(g.shape)
        shape[axis] = n * step
        g = F.reshape(spread, tuple(shape))
        span = (n - 1) * step + 1
        g = F.getitem(g, (slice(None),) * axis + (slice(0, span),))
    parts = [_zeros_along(g, axis, size) for size in (start, full - start - span) if size]
    if not parts:
        return g
    pieces = ([parts.pop(0)] if start else []) + [g] + parts
    return F.concat(pieces, axis=axis)


def merged_pads(a, b):
    """``a + b`` as one concatenation, where both are concatenations along one axis (``unslice``'s zero
    padding) whose non-zero parts do not overlap: the cotangents of slices of one array (``qkv[:, :, 0]``,
    ``[1]``, ``[2]``) then add up to a concat of the three gradients, written once, instead of three padded
    copies and two additions. None where that does not apply (the caller adds). A part that is -0.0 stays
    -0.0 (an addition would make it +0.0)."""
    pieces_a, pieces_b = _nonzero_pieces(a), _nonzero_pieces(b)
    if pieces_a is None or pieces_b is None or pieces_a[0] != pieces_b[0] or a.shape != b.shape \
            or a.dtype != b.dtype:
        return None
    axis = pieces_a[0]
    live = sorted(pieces_a[1] + pieces_b[1], key=lambda piece: piece[0])
    if any(later[0] < earlier[1] for earlier, later in zip(live, live[1:])):
        return None
    parts, at = [], 0
    for start, stop, part in live:
        if start > at:
            parts.append(_zeros_along(a, axis, start - at))
        parts.append(part)
        at = stop
    if at < a.shape[axis]:
        parts.append(_zeros_along(a, axis, a.shape[axis] - at))
    return F.concat(parts, axis=axis) if len(parts) > 1 else parts[0]


def _nonzero_pieces(x):
    """(axis, [(start, stop, part)] of its parts that are not a zero constant) of an unevaluated concat."""
    node = x._node
    if node.kind != "concat" or node.realized:
        return None
    axis, pieces, at = node.params, [], 0
    for part in node.inputs:
        size = part.shape[axis]
        if not (part.kind == "constant" and not part.realized and part.params == 0):
            pieces.append((at, at + size, core.Array(part)))
        at += size
    return axis, pieces


def _zeros_along(like, axis, size):
    shape = list(like.shape)
    shape[axis] = size
    return zeros(tuple(shape), like.dtype, like.device)


def _view_jvp(t, e):
    return core.movement(t[0], e.params, e.shape)


ir.VIEW.vjp = _view_vjp
ir.VIEW.jvp = _view_jvp


# ---- concat (ops/manipulation.CONCAT; params: the axis) --------------------------------------------
def _concat_vjp(g, e):
    axis, out, offset = e.params, [], 0
    for x in e.x:
        n = x.shape[axis]
        out.append(F.getitem(g, (slice(None),) * axis + (slice(offset, offset + n),)))
        offset += n
    return out


def _concat_jvp(t, e):
    return F.concat([ti if ti is not None else zeros(x.shape, x.dtype, x.device) for ti, x in zip(t, e.x)],
                    axis=e.params)


CONCAT.vjp = _concat_vjp
CONCAT.jvp = _concat_jvp


# ---- library ops (one node, outputs read through output nodes) ----------------------------------------
def unbroadcast(g, shape):
    """Sum ``g`` down to ``shape`` (the transpose of broadcasting ``shape`` up to ``g.shape``)."""
    lead = g.ndim - len(shape)
    if lead:
        g = F.sum(g, axis=tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if axes:
        g = F.sum(g, axis=axes, keepdims=True)
    return g


def _matmul_vjp(gs, e):
    (g,), (a, b) = gs, e.x
    return [unbroadcast(F.matmul(g, b.mT), a.shape) if e.active[0] else None,
            unbroadcast(F.matmul(a.mT, g), b.shape) if e.active[1] else None]


def _matmul_jvp(t, e):
    (a, b), (ta, tb) = e.x, t
    out = None
    if ta is not None:
        out = F.matmul(ta, b)
    if tb is not None:
        tb_part = F.matmul(a, tb)
        out = tb_part if out is None else out + tb_part
    return [out]


MATMUL.vjp = _matmul_vjp
MATMUL.jvp = _matmul_jvp


# Formulations: library ops written on primitives. A library op with no dedicated backward kernel is
# differentiated through its formulation (autodiff records it, then takes its VJP or JVP).
def _epilogue_formulation(a, b, *extras, activation, has_bias, has_residual, out_dtype, out_shape=None):
    it = iter(extras)
    f32 = dt.float32 if a.dtype != dt.float64 else dt.float64
    acc = F.matmul(a.astype(f32, copy=False), b.astype(f32, copy=False))
    if has_bias:
        acc = acc + next(it).astype(f32, copy=False)
    if activation is not None:
        acc = core.elementwise(activation, acc)
    if out_shape is not None:  # the product viewed back before the residual add (fuse_epilogue's reshape)
        acc = F.reshape(acc, out_shape)
    if has_residual:
        acc = acc + next(it).astype(f32, copy=False)
    return [acc.astype(dt.dtype(out_dtype), copy=False)]


def _attention_formulation(q, k, v, *extras, scale, is_causal, has_bias, has_mask):
    """softmax(scale q k^T + bias, masked) v on (B, S, H, D), GQA by repeating key/value heads;
    rows that see no key give 0, as the kernel."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    it = iter(extras)
    bias = next(it) if has_bias else None
    mask = next(it) if has_mask else None
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    f32 = dt.float32
    qh = F.permute_dims(q.astype(f32, copy=False), (0, 2, 1, 3))

    def heads(t):
        th = F.permute_dims(t.astype(f32, copy=False), (0, 2, 1, 3))  # B, Hkv, Sk, D
        if Hq != Hkv:
            th = F.broadcast_to(F.expand_dims(th, 2), (B, Hkv, Hq // Hkv, Sk, D))
            th = F.reshape(th, (B, Hq, Sk, D))
        return th

    s = F.matmul(qh, heads(k).mT) * scale
    if bias is not None:
        s = s + bias.astype(f32, copy=False)
    keep = None
    if is_causal:
        rows = F.reshape(F.arange(Sq, device=q.device), (Sq, 1))
        keep = F.arange(Sk, device=q.device) <= rows + (Sk - Sq)
    if mask is not None:
        keep = mask if keep is None else keep & mask
    if keep is not None:
        s = F.where(keep, s, -math.inf)
    from .transforms.autodiff import stop_gradient
    if Sk == 0:  # no keys: no maximum to shift by (every row sees none: lse -inf, out 0)
        m = F.zeros((B, Hq, Sq, 1), dtype=f32, device=q.device)
    else:
        m = F.max(s, axis=-1, keepdims=True)
        m = stop_gradient(F.where(F.isfinite(m), m, 0.0))  # a shift: softmax does not depend on it
    p = F.exp(s - m)
    denom = F.sum(p, axis=-1, keepdims=True)
    lse = F.reshape(F.log(denom) + m, (B, Hq, Sq))  # log(0) = -inf: a row that sees no key
    p = p / F.where(denom == 0, 1.0, denom)
    out = F.matmul(p, heads(v))
    return [F.permute_dims(out, (0, 2, 1, 3)).astype(q.dtype, copy=False), lse]


def _gather_last(x, idx):
    """x[..., idx[..., j]] along the last axis, written as a masked sum (no gather primitive)."""
    n = x.shape[-1]
    hit = F.expand_dims(idx, -1) == F.arange(n, dtype=idx.dtype, device=idx.device)
    return F.sum(F.where(hit, F.expand_dims(x, -2), 0.0), axis=-1)


def _top_k_formulation(x, *, k):
    from .transforms.autodiff import stop_gradient
    _, idx = F.top_k(stop_gradient(x), k)  # which positions: no derivative (and no recursion into top_k)
    return [_gather_last(x, idx), idx]


def _softmax_top_k_formulation(x, *, k, renormalize):
    from .transforms.autodiff import stop_gradient
    _, idx = F.top_k(stop_gradient(x), k)  # the indices are the logits' top k (softmax is monotone)
    p = _gather_last(F.nn.softmax(x.astype(dt.float32, copy=False), axis=-1), idx)
    if renormalize:
        p = p / F.sum(p, axis=-1, keepdims=True)
    return [p.astype(x.dtype, copy=False), idx]


def _softmax_formulation(x, *, axis, log):
    """The long-row softmax on primitives (fa.nn.softmax would record the long-row library op again, for
    rows past its threshold: forward mode recursed)."""
    xf = x.astype(dt.float32, copy=False)
    shifted = xf - F.max(xf, axis=axis, keepdims=True)
    e = F.exp(shifted)
    total = F.sum(e, axis=axis, keepdims=True)
    out = shifted - F.log(total) if log else e / total
    return [out.astype(x.dtype, copy=False)]


def _ragged_dot_formulation(lhs, rhs, group_sizes):
    onehot = _group_onehot(group_sizes, lhs.shape[0], lhs.dtype)  # (m, g)
    w = F.sum(F.reshape(onehot, onehot.shape + (1, 1)) * F.expand_dims(rhs, 0), axis=1)  # (m, k, n)
    return [F.sum(F.expand_dims(lhs, -1) * w, axis=1)]


def _group_onehot(group_sizes, m, d):
    """(m, g): 1 where row r belongs to group i (rows past the last group belong to none)."""
    g = group_sizes.shape[0]
    gs = group_sizes.astype(dt.int64, copy=False)
    j = F.arange(g, device=group_sizes.device)
    ends = F.sum(F.where(F.reshape(j, (1, g)) <= F.reshape(j, (g, 1)), F.reshape(gs, (1, g)), 0), axis=1)
    starts = ends - gs
    r = F.reshape(F.arange(m, device=group_sizes.device), (m, 1))
    return ((r >= F.reshape(starts, (1, g))) & (r < F.reshape(ends, (1, g)))).astype(d)


def _attention_bwd_formulation(q, k, v, *rest, scale, is_causal, has_bias, has_mask, has_dlse):
    """attention_bwd written on primitives (the VJP of the attention formulation at ``do`` and ``dlse``):
    what second derivatives through the attention kernel differentiate. It recomputes from q, k, v, so
    the forward's out and lse (the kernel's residuals) enter with no derivative of their own."""
    from .transforms.autodiff import vjp_flat
    bias, mask, _, _, do, dlse = _split(rest, has_bias, has_mask, has_dlse)
    extras = [t for t in (bias, mask) if t is not None]
    kw = {"scale": scale, "is_causal": is_causal, "has_bias": has_bias, "has_mask": has_mask}
    _, pull = vjp_flat(lambda a, b, c: _attention_formulation(a, b, c, *extras, **kw), [q, k, v], [True] * 3)
    return pull([do, dlse])


def _softmax_bwd_formulation(dy, y, *, axis, log):
    """softmax_bwd written on primitives (the float64 reference's closed form, in fp32 like the kernel):
    what second derivatives through the long-row softmax differentiate."""
    dyf, yf = dy.astype(dt.float32, copy=False), y.astype(dt.float32, copy=False)
    if log:
        dx = dyf - F.exp(yf) * F.sum(dyf, axis=axis, keepdims=True)
    else:
        dx = yf * (dyf - F.sum(dyf * yf, axis=axis, keepdims=True))
    return [dx.astype(y.dtype, copy=False)]


FORMULATIONS = {
    "attention_bwd": _attention_bwd_formulation,
    "softmax_bwd": _softmax_bwd_formulation,
    "matmul_epilogue": _epilogue_formulation,
    "attention": _attention_formulation,
    "top_k": _top_k_formulation,
    "softmax_top_k": _softmax_top_k_formulation,
    "softmax": _softmax_formulation,
    "ragged_dot": _ragged_dot_formulation,
}


# attention: the backward kernels of kernels/attention.py, recorded as one library node (dq, dk, dv).
# Inputs: q, k, v, [bias], [mask], the forward's out and lse (its residuals: no second forward pass),
# the output cotangent, and [the lse cotangent] (it folds into the kernel's row term, see attention_bwd).
def _attention_bwd_abstract(q, k, v, *rest, scale, is_causal, has_bias, has_mask, has_dlse):
    return [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]


def _split(rest, has_bias, has_mask, has_dlse):
    """(bias, mask, out, lse, do, dlse) from attention_bwd's inputs after q, k, v (None where absent)."""
    it = iter(rest)
    bias = next(it) if has_bias else None
    mask = next(it) if has_mask else None
    out, lse, do = next(it), next(it), next(it)
    return bias, mask, out, lse, do, next(it) if has_dlse else None


def _attention_bwd_kernel(q, k, v, *rest, scale, is_causal, has_bias, has_mask, has_dlse, into=None):
    from .kernels import attention
    bias, mask, out, lse, do, dlse = _split(rest, has_bias, has_mask, has_dlse)
    return attention.attention_bwd(do.contiguous(), q, k, v, out, lse, bias=bias, mask=mask, scale=scale,
                                   is_causal=is_causal, dlse=dlse, into=into)


def _attention_bwd_reference(q, k, v, *rest, scale, is_causal, has_bias, has_mask, has_dlse):
    from .kernels import attention
    bias, mask, _, _, do, dlse = _split(rest, has_bias, has_mask, has_dlse)
    grads = attention.reference_attention_bwd(do, q, k, v, bias, mask, scale=scale, is_causal=is_causal, dlse=dlse)
    return [gr.to(t.dtype) for gr, t in zip(grads, (q, k, v))]


ATTENTION_BWD = Library("attention_bwd", _attention_bwd_abstract, _attention_bwd_kernel, _attention_bwd_reference,
                        writes_into=True, warms_up=True)


def _attention_vjp(gs, e):
    kw = e.params["kwargs"]
    if kw["has_bias"] and e.active[3]:
        return None  # the kernel has no bias gradient: differentiate the formulation instead
    q = e.x[0]
    g, glse = gs
    if g is None:
        return None  # only the log-sum-exp has a cotangent: the formulation handles that
    out, lse = e.y
    inputs = [*e.x, out, lse, g.astype(q.dtype, copy=False)] + ([glse] if glse is not None else [])
    dq, dk, dv = core_call(ATTENTION_BWD, inputs, **kw, has_dlse=glse is not None)
    return [dq, dk, dv] + [None] * (len(e.x) - 3)


# long-row softmax: kernels/softmax.py's backward kernel, recorded as a library node.
def _softmax_bwd_abstract(dy, y, *, axis, log):
    return [(y.shape, y.dtype)]


def _softmax_bwd_kernel(dy, y, *, axis, log):
    from .kernels import softmax
    return softmax.softmax_bwd(dy, y, log, axis)


def _softmax_bwd_reference(dy, y, *, axis, log):
    import torch
    dyf, yf = dy.double(), y.double()
    if log:
        dx = dyf - torch.exp(yf) * dyf.sum(axis, keepdim=True)
    else:
        dx = yf * (dyf - (dyf * yf).sum(axis, keepdim=True))
    return dx.to(y.dtype)


SOFTMAX_BWD = Library("softmax_bwd", _softmax_bwd_abstract, _softmax_bwd_kernel, _softmax_bwd_reference)


def _softmax_vjp(gs, e):
    (g,), (y,) = gs, e.y
    kw = e.params["kwargs"]
    return core_call(SOFTMAX_BWD, [g.astype(y.dtype, copy=False), y], **kw)


def _top_k_vjp(gs, e):
    """values' cotangent goes back to the chosen positions (a masked sum: no scatter primitive)."""
    (x,), (gv, _) = e.x, gs
    if gv is None:  # only the (integer) indices were used
        return [None]
    idx = e.y[1]
    n = x.shape[-1]
    hit = F.expand_dims(idx, -1) == F.arange(n, dtype=idx.dtype, device=idx.device)  # (..., k, n)
    return [F.sum(F.where(hit, F.expand_dims(gv, -1), 0.0), axis=-2).astype(x.dtype, copy=False)]


def _ragged_dot_vjp(gs, e):
    (g,), (lhs, rhs, group_sizes) = gs, e.x
    dlhs = F.ragged_dot(g, F.permute_dims(rhs, (0, 2, 1)), group_sizes) if e.active[0] else None
    drhs = None
    if e.active[1]:
        onehot = _group_onehot(group_sizes, lhs.shape[0], lhs.dtype)  # (m, g)
        rows = F.expand_dims(F.permute_dims(onehot, (1, 0)), -1) * F.expand_dims(lhs, 0)  # (g, m, k)
        drhs = F.matmul(rows.mT, F.expand_dims(g, 0))  # (g, k, n)
    return [dlhs, drhs, None]


def _not_differentiable(name, why):
    def rule(g, e):
        raise TypeError(f"{name} is not differentiable: {why}")
    return rule


# ---- scaled_matmul: differentiable in a bf16/fp16 lhs (weight-only MX); MX storage operands are not -----
def _mx_rhs_values(e):
    """The MX weights (rhs, [N, K]) as float32 values."""
    from .ops.library_ops import _MX_STORAGE
    from .quant import mx_dequantize
    rhs, rhs_scales = e.x[1], e.x[-1]
    return mx_dequantize(rhs, rhs_scales, _MX_STORAGE[rhs.dtype], axis=-1, dtype=dt.float32)


def _scaled_matmul_vjp(g, e):
    if e.params["kwargs"]["has_lhs_scales"] and e.active[0]:
        raise TypeError("scaled_matmul is not differentiable in an lhs of MX data (fp8/packed fp4 storage); "
                        "only a bf16/fp16 lhs with lhs_scales=None has a gradient")
    out = [None] * len(e.x)
    if e.active[0]:
        lhs = e.x[0]
        out[0] = F.matmul(g[0].astype(dt.float32), _mx_rhs_values(e)).astype(lhs.dtype)
    return out


def _scaled_matmul_jvp(t, e):
    if e.params["kwargs"]["has_lhs_scales"] or t[0] is None:
        return [None]
    return [F.matmul(t[0].astype(dt.float32), F.matrix_transpose(_mx_rhs_values(e))).astype(e.y[0].dtype)]


def core_call(prim, inputs, **params):
    from .ops.library import call
    return call(prim, inputs, **params)


ATTENTION.vjp = _attention_vjp
SOFTMAX.vjp = _softmax_vjp
TOP_K.vjp = _top_k_vjp
RAGGED_DOT.vjp = _ragged_dot_vjp
SCALED_MATMUL.vjp = _scaled_matmul_vjp
SCALED_MATMUL.jvp = _scaled_matmul_jvp
# matmul_epilogue and softmax_top_k: differentiated through their formulations (FORMULATIONS).


def _shifted(v, d, fill):
    """``v`` moved ``d`` places along the last axis, ``fill`` coming in at the front (a concat of a view)."""
    n = v.shape[-1]
    head = F.full(v.shape[:-1] + (min(d, n),), fill, dtype=v.dtype, device=v.device)
    return F.concat([head, v[..., :n - d]], axis=-1) if d < n else head


def _linear_scan(a, b):
    """r with r[i] = b[i] + a[i] * r[i-1] along the last axis (r[-1] = 0): the first-order linear
    recurrence, solved by log2(n) doubling steps (Hillis-Steele over the affine maps r -> a * r + b).
    Only products and sums, no division: exact where a has zeros, and itself differentiable."""
    d = 1
    while d < a.shape[-1]:
        a, b = a * _shifted(a, d, 1.0), b + a * _shifted(b, d, 0.0)
        d *= 2
    return b


def _exclusive_prod(x):
    """E[i] = x[0] * ... * x[i-1] (E[0] = 1): the scan kernel with its leading identity, minus the total."""
    (ex,) = core_call(SCAN, [x], op="prod", include_initial=True)
    return ex[..., :-1]


def _scan_vjp(gs, e):
    """cumulative_sum's transpose is the reverse cumulative sum (the leading 0 of include_initial gets nothing).

    cumulative_prod (y[i] = x[0] * ... * x[i]): dx[j] = sum_{i >= j} g[i] * prod_{k <= i, k != j} x[k]
    = E[j] * R[j], with E the exclusive product and R[j] = g[j] + x[j+1] * R[j+1] a reverse linear
    recurrence (_linear_scan on flipped rows). No division by x, so zeros anywhere are exact (the
    textbook reverse_cumsum(g * y) / x is NaN at a zero and wrong before it)."""
    kw = e.params["kwargs"]
    (g,), (x,) = gs, e.x
    if kw["include_initial"]:
        g = g[..., 1:]  # the leading identity depends on nothing
    if kw["op"] == "prod":
        if not x.shape[-1]:
            return [F.zeros(x.shape, dtype=x.dtype, device=x.device)]
        xf = x.astype(g.dtype, copy=False)
        nxt = _shifted(F.flip(xf, axis=-1), 1, 0.0)  # row reversed: x[j+1] lands beside g[j]
        r = F.flip(_linear_scan(nxt, F.flip(g, axis=-1)), axis=-1)
        return [(_exclusive_prod(xf) * r).astype(x.dtype, copy=False)]
    (rev,) = core_call(SCAN, [F.flip(g, axis=-1)], op="sum", include_initial=False)
    return [F.flip(rev, axis=-1).astype(x.dtype, copy=False)]


def _sort_vjp(gs, e):
    """values[j] = x[perm[j]]: x's cotangent is values' cotangent put back through the inverse permutation."""
    (gv, _), (x,) = gs, e.x
    if gv is None:  # only the (integer) permutation was used
        return [None]
    inverse = F.argsort(e.y[1], axis=-1)
    return [F.take_along_axis(gv, inverse, axis=-1).astype(x.dtype, copy=False)]


def _scan_jvp(t, e):
    """cumulative_sum is linear: its tangent is the cumulative sum of the input's tangent.

    cumulative_prod: y[i] = x[i] * y[i-1], so ty[i] = x[i] * ty[i-1] + tx[i] * y[i-1]: the linear
    recurrence (_linear_scan) with a = x and b = tx * E (E the exclusive product); exact at zeros."""
    kw = e.params["kwargs"]
    (tx,), (x,) = t, e.x
    out_dtype = e.y[0].dtype
    if kw["op"] == "prod":
        xf, tf = x.astype(out_dtype, copy=False), tx.astype(out_dtype, copy=False)
        ty = _linear_scan(xf, tf * _exclusive_prod(xf)) if x.shape[-1] else tf
        if kw["include_initial"]:
            ty = F.concat([F.zeros(ty.shape[:-1] + (1,), dtype=out_dtype, device=ty.device), ty], axis=-1)
        return [ty]
    return core_call(SCAN, [tx.astype(out_dtype, copy=False)], **kw)


def _sort_jvp(t, e):
    """values[j] = x[perm[j]]: the tangent is the input's tangent gathered by the same permutation."""
    (tx,), perm = t, e.y[1]
    return [F.take_along_axis(tx, perm, axis=-1).astype(e.y[0].dtype, copy=False), None]


SCAN.vjp, SCAN.jvp = _scan_vjp, _scan_jvp
SORT.vjp, SORT.jvp = _sort_vjp, _sort_jvp


# ---- gather / scatter (ops/indexing.py; every index form reduces to these two) -------------------------------
def _valid_rows(idx, n):
    return (idx >= 0) & (idx < n)


def _gathered(g, idx):
    """g[idx] along axis 0 with zeros where idx is out of range (scatter dropped those updates)."""
    n = g.shape[0]
    ok = _valid_rows(idx, n)
    (rows,) = core_call(GATHER, [g, F.clip(F.where(ok, idx, 0), 0, max(n - 1, 0))])
    ok = F.reshape(ok, ok.shape + (1,) * (rows.ndim - ok.ndim))
    return F.where(ok, rows, 0).astype(g.dtype, copy=False)


def _gather_vjp(gs, e):
    (g,), (z, idx) = gs, e.x
    (dz,) = core_call(SCATTER, [zeros(z.shape, g.dtype, g.device), idx, g], mode="add")
    return [dz, None]


def _gather_jvp(t, e):
    return core_call(GATHER, [t[0], e.x[1]])


def scatter_winners(idx, n):
    """Which of ``idx``'s entries land in a set-scatter into ``n`` rows: the last of each repeated index
    (ops/indexing.py's rule), none of the out-of-range ones. A bool array of idx's shape."""
    order = F.reshape(F.arange(math.prod(idx.shape), dtype=dt.int64, device=idx.device), idx.shape)
    (last,) = core_call(SCATTER, [F.full((n,), -1, dtype=dt.int64, device=idx.device), idx, order], mode="max")
    return _valid_rows(idx, n) & (_gathered(last, idx) == order)


def _scatter_vjp(gs, e):
    (g,), (_, idx, v) = gs, e.x
    mode = e.params["kwargs"]["mode"]
    if mode == "set":  # the overwritten entries of z get no cotangent; each value that landed gets its row's
        (dz,) = core_call(SCATTER, [g, idx, zeros(v.shape, g.dtype, g.device)], mode="set")
        won = scatter_winners(idx, g.shape[0])
        won = F.reshape(won, won.shape + (1,) * (v.ndim - won.ndim))
        return [dz, None, F.where(won, _gathered(g, idx), 0).astype(g.dtype, copy=False)]
    if mode == "add":
        return [g, None, _gathered(g, idx)]
    if mode == "multiply":  # out[r] = z[r] * (the product of the values scattered to r)
        z = e.x[0]
        scaled = _scattered_product(idx, v, z.shape)
        dz = (g * scaled).astype(z.dtype, copy=False)
        return [dz, None, (_gathered(g * z, idx) * _products_of_others(idx, v, z.shape)).astype(v.dtype, copy=False)]
    raise TypeError(f"at[].{mode} with integer-array or mask indices is not differentiable yet; use add, multiply "
                    "or set")


def _scattered_product(idx, v, z_shape):
    """The product of the values scattered to each entry of a ``z_shape`` array (1 where none land)."""
    (product,) = core_call(SCATTER, [F.ones(z_shape, dtype=v.dtype, device=v.device), idx, v], mode="multiply")
    return product


def _products_of_others(idx, v, z_shape):
    """For each update j of a multiply-scatter: the product of the other values scattered to idx[j] (1 where
    there are none; 0 where one of them is 0). Zeros are counted, not divided by: the nonzero values' product
    over the entry divided by v[j] where v[j] is not 0."""
    zero = v == 0
    safe = F.where(zero, F.ones((), dtype=v.dtype, device=v.device), v)
    nonzero_product = _scattered_product(idx, safe, z_shape)
    (zeros_at,) = core_call(SCATTER, [F.zeros(z_shape, dtype=dt.int32, device=v.device), idx,
                                      zero.astype(dt.int32)], mode="add")
    zeros_among_others = _gathered(zeros_at, idx) - zero.astype(dt.int32)
    return F.where(zeros_among_others > 0, F.zeros((), dtype=v.dtype, device=v.device),
                   _gathered(nonzero_product, idx) / safe)


def _scatter_jvp(t, e):
    (z, idx, v), (tz, _, tv) = e.x, t
    mode = e.params["kwargs"]["mode"]
    if mode == "multiply":   # d out = dz * scaled + z * (sum over the updates j of dv[j] * the others' product)
        tz = tz if tz is not None else zeros(z.shape, z.dtype, z.device)
        tv = tv if tv is not None else zeros(v.shape, v.dtype, v.device)
        scaled = _scattered_product(idx, v, z.shape)
        (spread,) = core_call(SCATTER, [zeros(z.shape, v.dtype, v.device), idx,
                                        tv * _products_of_others(idx, v, z.shape)], mode="add")
        return [(tz * scaled + z * spread).astype(e.y[0].dtype, copy=False)]
    if mode not in ("set", "add"):
        raise TypeError(f"at[].{mode} with integer-array or mask indices has no forward-mode rule yet")
    tz = tz if tz is not None else zeros(z.shape, z.dtype, z.device)
    tv = tv if tv is not None else zeros(v.shape, v.dtype, v.device)
    return core_call(SCATTER, [tz, idx, tv], mode=mode)


GATHER.vjp = _gather_vjp
GATHER.jvp = _gather_jvp
SCATTER.vjp = _scatter_vjp
SCATTER.jvp = _scatter_jvp


# ---- torch.linalg calls (ops/decompositions.py): no derivative rules yet --------------------------------------
for _prim in DECOMPOSITIONS:
    _prim.vjp = _prim.jvp = _not_differentiable(f"fa.linalg.{_prim.name}",
                                                "torch.linalg calls have no derivative rules in flyarray yet")
