"""Complex numbers, lowered to real arithmetic before scheduling.

Triton has no complex type, so complex64/complex128 exist only in the recorded graph (the front) and
in buffers (torch complex tensors, DLPack). On a plan miss, after composites are expanded
(expand.py) and before the scheduler runs, ``lower_complex`` rewrites every complex node under the
roots into real nodes: each complex value becomes a pair (re, im) of real nodes of its shape, or
equivalently one *packed* real node of shape ``shape + (2,)`` (re at [..., 0], im at [..., 1]:
the memory layout of a complex tensor seen through ``torch.view_as_real``).

  * a complex buffer (a user's tensor, a library output such as fft's) is read through
    ``view_as_real`` (the ``AS_REAL`` library node: a torch view, no copy for a contiguous buffer);
    its parts are strided views of that (stride 2, no kernel);
  * an elementwise op on complex values becomes real elementwise ops on the parts, by the op's rule
    in ``RULES`` below (one rule per primitive, here and nowhere else);
  * a complex value that must exist in memory (a root the user asked for, a library input) is
    written packed: ``where(k == 0, re, im)`` over the packed shape, one fused kernel that computes
    both parts, then viewed as complex (``AS_COMPLEX``, a torch view);
  * sum reduces the packed value over the same axes (one kernel, already packed); prod multiplies
    magnitudes and adds angles.

The scheduler, code generation and every backend (gpu, interpret, reference) then see real ops only:
a chain of complex elementwise ops is one kernel, as a real chain is. The plan's key is the graph as
recorded (complex nodes included), so it captures everything the lowering decides.
"""
from __future__ import annotations

import math

import torch

from . import dtypes as dt
from . import ir, views
from .primitives import ELEMENTWISE, REDUCE, Elementwise, Library


# ---- the front's complex-only primitives (never scheduled: lowered first) --------------------------------
def _unused_lowering(args, cdt):  # pragma: no cover - complex nodes never reach code generation
    raise AssertionError("complex primitives are lowered to real ones before code generation")


REAL = Elementwise("real", 1, "any", "same", torch.real, _unused_lowering)
IMAG = Elementwise("imag", 1, "any", "same", torch.imag, _unused_lowering)
CONJ = Elementwise("conj", 1, "any", "same", torch.conj, _unused_lowering)
COMPLEX = Elementwise("complex", 2, "float", "same", torch.complex, _unused_lowering)  # (re, im) -> re + i im
COMPLEX_PRIMITIVES = (REAL, IMAG, CONJ, COMPLEX)


def _as_real_abstract(x):
    if x.dtype.kind != "c":
        raise TypeError(f"view_as_real needs a complex array, got {x.dtype}")
    return [(x.shape + (2,), dt.real_dtype(x.dtype))]


def _as_complex_abstract(x):
    if x.dtype not in (dt.float32, dt.float64) or not x.shape or x.shape[-1] != 2:
        raise TypeError(f"view_as_complex needs a float32/float64 array whose last axis has length 2, "
                        f"got {x.dtype}{list(x.shape)}")
    return [(x.shape[:-1], dt.complex_dtype(x.dtype))]


def _as_complex(t):
    if t.numel() == 0:   # an empty tensor's strides may be anything: view_as_complex would refuse them
        return torch.empty(t.shape[:-1], dtype=torch.complex128 if t.dtype == torch.float64 else torch.complex64,
                           device=t.device)
    if t.stride(-1) != 1 or t.storage_offset() % 2 or any(s % 2 for s in t.stride()[:-1]):
        t = t.contiguous()
    return torch.view_as_complex(t)


def _as_real(t):
    return torch.view_as_real(t.resolve_conj())  # a tensor with torch's lazy-conjugation bit is copied first


# Reinterpretations, not kernels: a torch view each (plan.py counts no launch for them).
AS_REAL = Library("view_as_real", _as_real_abstract, _as_real, _as_real)
AS_COMPLEX = Library("view_as_complex", _as_complex_abstract, _as_complex, _as_complex)
AS_REAL.reinterpret = AS_COMPLEX.reinterpret = True


# ---- building real nodes --------------------------------------------------------------------------------
class F:
    """A real node with arithmetic, so the rules below read as formulas."""
    __slots__ = ("n",)

    def __init__(self, n: ir.Node):
        self.n = n

    def _const(self, v, d=None):
        d = d or self.n.dtype  # the value in its dtype's Python type: a launch passes it as that kernel argument
        value = bool(v) if d.kind == "b" else int(v) if d.kind in "iu" else float(v)
        return ir.constant(value, self.n.shape, d, self.n.device)

    def _arg(self, v):
        return v.n if isinstance(v, F) else self._const(v)

    def _op(self, name, *others):
        args = (self.n,) + tuple(self._arg(o) for o in others)
        prim = ELEMENTWISE[name]
        out = dt.bool_ if prim.out == "bool" else self.n.dtype
        return F(ir.Node(prim, args, None, self.n.shape, out, self.n.device))

    def _rop(self, name, other):
        return F(self._arg(other))._op(name, self)

    __add__ = lambda self, o: self._op("add", o)  # noqa: E731
    __radd__ = lambda self, o: self._rop("add", o)  # noqa: E731
    __sub__ = lambda self, o: self._op("subtract", o)  # noqa: E731
    __rsub__ = lambda self, o: self._rop("subtract", o)  # noqa: E731
    __mul__ = lambda self, o: self._op("multiply", o)  # noqa: E731
    __rmul__ = lambda self, o: self._rop("multiply", o)  # noqa: E731
    __truediv__ = lambda self, o: self._op("divide", o)  # noqa: E731
    __rtruediv__ = lambda self, o: self._rop("divide", o)  # noqa: E731
    __neg__ = lambda self: self._op("negative")  # noqa: E731
    __and__ = lambda self, o: self._op("logical_and", o)  # noqa: E731
    __or__ = lambda self, o: self._op("logical_or", o)  # noqa: E731

    def __getattr__(self, name):  # x.exp(), x.atan2(y), x.equal(0), ...
        if name in ELEMENTWISE:
            return lambda *others: self._op(name, *others)
        raise AttributeError(name)

    def astype(self, d):
        if self.n.dtype == d:
            return self
        return F(ir.Node(ELEMENTWISE["astype"], (self.n,), None, self.n.shape, d, self.n.device))


def where(c: F, a, b) -> F:
    ref = a if isinstance(a, F) else b
    a, b = ref._arg(a), ref._arg(b)
    return F(ir.Node(ELEMENTWISE["where"], (c.n, a, b), None, ref.n.shape, ref.n.dtype, ref.n.device))


def prod_factors(re: F, im: F):
    """A complex product's factors z = re + i im as (scale, rest, hi, lo, quarters), all float64 (also for complex64:
    its angles summed in float32 lost ~1e-3 over 1000 factors). |z| = scale * rest with scale = max(|re|,
    |im|) and rest = sqrt(1 + (min/max)^2) in [1, sqrt 2], so neither product overflows where the result
    does not (|z| of 3e38+3e38j is past float32's maximum, hypot of 1.5e308+1.5e308j past float64's).
    arg z = hi + lo, hi a multiple of 2^-20 (their sum is exact), |lo| <= 2^-21: a sum of 1000 angles
    rounded once is already ~1e3 ulps off (its size times eps), their rotation (``rotation``) is not.
    A factor on an axis (a real or imaginary number) turns by whole quarter turns: those are counted in
    ``quarters`` (a sum of small integers is exact) and hi = lo = 0, so a product of such factors is exactly
    real or imaginary (the sum of k float64 pi's has a sine of ~1e-16 k: prod of three -1s was -1 + 3.7e-16j).
    The product is prod(scale) * (prod(rest) * quarter_turned(rotation(sum(hi), sum(lo)), sum(quarters))).
    Zero, inf and NaN parts go to scale (rest 1): a zero factor gives zero, NaN propagates."""
    re, im = re.astype(dt.float64), im.astype(dt.float64)
    a, b = re.abs(), im.abs()
    scale = a.maximum(b)
    finite = scale.greater(0) & scale.less(float("inf"))
    q = where(finite, a.minimum(b) / where(finite, scale, 1.0), 0.0)  # no 0/0 even off the taken branch
    angle = im.atan2(re)
    on_axis = (im.equal(0) | re.equal(0)) & (re.isnan() | im.isnan()).logical_not()
    quarters = where(on_axis, (angle * (2 / math.pi)).round(), 0.0)
    angle = where(on_axis, 0.0, angle)
    hi = (angle * 2.0 ** 20).round() * 2.0 ** -20
    return scale, (q * q + 1.0).sqrt(), hi, angle - hi, quarters


def rotation(hi: F, lo: F):
    """(cos, sin) of hi + lo without rounding hi + lo (hi is exact, lo small)."""
    ch, sh, cl, sl = hi.cos(), hi.sin(), lo.cos(), lo.sin()
    return ch * cl - sh * sl, sh * cl + ch * sl


def quarter_turned(c: F, s: F, quarters: F):
    """(c, s) turned by a whole number of quarter turns (a float64 integer), exactly: by 1, i, -1 or -i."""
    q = quarters - 4.0 * (quarters * 0.25).floor()
    cq = where(q.equal(0), 1.0, where(q.equal(2), -1.0, F(q._const(0.0))))
    sq = where(q.equal(1), 1.0, where(q.equal(3), -1.0, F(q._const(0.0))))
    return c * cq - s * sq, s * cq + c * sq


class Parts:
    """A complex value as real nodes: (re, im), and the packed ``shape + (2,)`` node, each made on demand."""
    __slots__ = ("_im", "_packed", "_re")

    def __init__(self, re: F = None, im: F = None, packed: ir.Node = None):
        self._re, self._im, self._packed = re, im, packed

    @property
    def re(self) -> F:
        if self._re is None:
            self._re = F(_part_view(self._packed, 0))
        return self._re

    @property
    def im(self) -> F:
        if self._im is None:
            self._im = F(_part_view(self._packed, 1))
        return self._im

    def packed(self) -> ir.Node:
        if self._packed is None:
            self._packed = _interleave(self._re.n, self._im.n)
        return self._packed


def view(node: ir.Node, ops: tuple, shape: tuple) -> ir.Node:
    """``ir.view``, copying ``node`` first where the composed chain is no strided map of the buffer below (as
    ops.core.movement does when recording): a part of a complex value is often itself a view (a stride-2 slice of
    the packed buffer), so a view that folded over the complex value need not fold over its part."""
    out = ir.view(node, ops, shape)
    if out.kind == "view" and views.apply_all(ir.buffer_view(out.inputs[0]), out.params) is None:
        copy = ir.Node(ELEMENTWISE["astype"], (node,), None, node.shape, node.dtype, node.device)
        out = ir.view(copy, ops, shape)
    return out


def _part_view(packed: ir.Node, k: int) -> ir.Node:
    shape = packed.shape[:-1]
    n = len(packed.shape)
    ops = (("slice", (0,) * (n - 1) + (k,), (1,) * n, shape + (1,)), ("reshape", shape))
    return ir.view(packed, ops, shape)


def _broadcast(node: ir.Node, lead: tuple, shape: tuple) -> ir.Node:
    return ir.view(node, (("reshape", lead), ("expand", shape)), shape)


def _interleave(re: ir.Node, im: ir.Node) -> ir.Node:
    """The packed value: ``where(k == 0, re, im)`` over ``shape + (2,)``; one fused elementwise kernel."""
    shape, dev = re.shape, re.device
    full = shape + (2,)
    k = ir.Node(ir.IOTA, (), ("ramp", 0, 1), (2,), dt.int32, dev)
    k = F(_broadcast(k, (1,) * len(shape) + (2,), full))
    first = k.equal(0)
    return where(first, F(_broadcast(re, shape + (1,), full)), F(_broadcast(im, shape + (1,), full))).n


def _packed_ops(ops) -> tuple:
    """Movement ops on a complex value, as the same ops on its packed value (a trailing axis of 2 rides along)."""
    out = []
    for op in ops:
        kind = op[0]
        if kind in ("reshape", "expand"):
            out.append((kind, tuple(op[1]) + (2,)))
        elif kind == "permute":
            out.append((kind, tuple(op[1]) + (len(op[1]),)))
        elif kind == "slice":
            out.append((kind, tuple(op[1]) + (0,), tuple(op[2]) + (1,), tuple(op[3]) + (2,)))
        elif kind == "flip":
            out.append(op)
        else:
            raise AssertionError(f"unknown movement op {kind}")
    return tuple(out)


def _from_node(x: ir.Node) -> Parts:
    """The parts of a complex buffer (a realized array or a library output): a view_as_real of it."""
    lib = ir.Node(AS_REAL, (x,), None, (), dt.real_dtype(x.dtype), x.device)
    out = ir.Node(ir.OUTPUT, (lib,), 0, x.shape + (2,), dt.real_dtype(x.dtype), x.device)
    lib.params = {"outputs": [out], "kwargs": {}}
    return Parts(packed=out)


def as_complex_node(packed: ir.Node, node: ir.Node = None) -> ir.Node:
    """A complex node over a packed real one (``node`` itself becomes it when given: a root)."""
    d = dt.complex_dtype(packed.dtype)
    lib = ir.Node(AS_COMPLEX, (packed,), None, (), d, packed.device)
    if node is None:
        node = ir.Node(ir.OUTPUT, (lib,), 0, packed.shape[:-1], d, packed.device)
    else:
        ir.keep_history(node)
        node.prim, node.inputs, node.params = ir.OUTPUT, (lib,), 0
    lib.params = {"outputs": [node], "kwargs": {}}
    return node


# ---- complex arithmetic on parts ---------------------------------------------------------------------------
def cmul(a: Parts, b: Parts) -> Parts:
    return Parts(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re)


def cdiv(a: Parts, b: Parts) -> Parts:
    """Smith's algorithm (as numpy's npymath): divide by the larger of |c|, |d| first, so no square overflows."""
    c, d = b.re, b.im
    big = c.abs().greater_equal(d.abs())
    r1 = d / c
    den1 = c + d * r1
    r2 = c / d
    den2 = c * r2 + d
    re = where(big, (a.re + a.im * r1) / den1, (a.re * r2 + a.im) / den2)
    im = where(big, (a.im - a.re * r1) / den1, (a.im * r2 - a.re) / den2)
    zero = c.equal(0) & d.equal(0)  # x / 0: each part divided by |0| (inf or nan), as numpy
    return Parts(where(zero, a.re / c.abs(), re), where(zero, a.im / c.abs(), im))


def cexp(z: Parts) -> Parts:
    """e^a (cos b + i sin b), with C99's special values: exp(x + 0j) = e^x + 0j exactly (x = +-inf too),
    exp(-inf + i y) = 0 for every y, exp(+inf + i y) = inf + nan j for infinite or NaN y, exp(x + i y) = nan +
    nan j for a finite x and such a y; past e^a's overflow, a finite e^a cos b is kept (scaled)."""
    e = z.re.exp()
    real_axis = z.im.equal(0)
    zero = e.equal(0)
    blown = z.re.isinf() & e.isinf() & z.im.isfinite().logical_not()   # +inf with b inf/NaN (a finite: NaN, NaN)
    # e^a overflows a little before e^a cos b does: past it, (e^(a/2) cos b) e^(a/2) (as C's cexp scales)
    half = (0.5 * z.re).exp()
    over = e.isinf() & z.re.isfinite()
    cos_part = where(over, half * z.im.cos() * half, e * z.im.cos())
    sin_part = where(over, half * z.im.sin() * half, e * z.im.sin())
    # exp(-inf + i y) is +0 cis y: zeros signed as cos y and sin y for a finite y (C99, numpy), +0 + 0j otherwise
    zero_re, zero_im = e * _finite_or_one(z.im.cos(), z.im), e * _finite_or_one(z.im.sin(), z.im)
    re = where(real_axis, e, where(zero, zero_re, where(blown, e, cos_part)))
    im = where(real_axis, z.im, where(zero, zero_im, where(blown, _nan(e), sin_part)))
    return Parts(re, im)


def _nan(like: F) -> F:
    return F(like._const(float("nan")))


def csinh(z: Parts) -> Parts:
    """(sinh a cos b, cosh a sin b); a zero part stays a (signed) zero whatever multiplies it (C99: sinh(0 + i inf)
    = 0 + nan j), and sinh(+-inf + i inf) = +-inf + nan j."""
    a, b = z.re, z.im
    blown = a.isinf() & b.isfinite().logical_not()
    re = where(blown, a, where(a.equal(0), a * _finite_or_one(b.cos(), b), _hyperbolic_times(a, a.sinh(), b.cos())))
    im = where(b.equal(0), b, _hyperbolic_times(a, a.cosh(), b.sin()))
    return Parts(re, im)


def ccosh(z: Parts) -> Parts:
    """(cosh a cos b, sinh a sin b), with C99's special values as csinh."""
    a, b = z.re, z.im
    blown = a.isinf() & b.isfinite().logical_not()
    re = where(blown, a.abs(), _hyperbolic_times(a, a.cosh(), b.cos()))
    im = where(a.equal(0), a * _finite_or_one(b.sin(), b),
               where(b.equal(0), b * where(a.less(0), F(a._const(-1.0)), 1.0), _hyperbolic_times(a, a.sinh(), b.sin())))
    return Parts(re, im)


def _hyperbolic_times(a: F, h: F, t: F) -> F:
    """h * t for h = sinh a or cosh a and t a cos/sin (|t| <= 1), also where h overflows at a finite a but the
    product does not: there |h| = e^|a| / 2, taken as (e^(|a|/2) t / 2) e^(|a|/2), as cexp scales (sinh(100 +
    1e-30j) in complex64 is inf + 1.3e13j; h * t gave inf j). Finite up to |a| = 2 log(max) (float32 177,
    float64 1419); past that only t below ~1e-38 (1e-308) could give a finite result."""
    half = (0.5 * a.abs()).exp()
    scaled = half * t * 0.5 * half
    return where(h.isinf() & a.isfinite(), where(h.less(0), -scaled, scaled), h * t)


def _finite_or_one(v: F, b: F) -> F:
    """``v`` (a cos/sin of b) where b is finite, else 1: the sign a zero part keeps when multiplied by it."""
    return where(b.isfinite(), v, 1.0)


def clog(z: Parts) -> Parts:
    """log|z| + i arg z. Where |z| overflows with finite parts (both near the float's maximum) or is subnormal,
    log|z| is log(max) + log1p((min / max)^2) / 2: log(hypot) gave inf past the maximum, and below the normal
    range read a |z| rounded to a few bits (log(1e-45 - 1e-45j) in complex64 was off by ln sqrt 2)."""
    a, b = z.re.abs(), z.im.abs()
    h = a.hypot(b)
    big, small = where(a.greater_equal(b), a, b), where(a.greater_equal(b), b, a)
    ratio = small / where(big.equal(0), 1.0, big)   # (no 0/0 off the taken branch)
    scaled = big.log() + 0.5 * (ratio * ratio).log1p()
    overflowed = h.isinf() & a.isfinite() & b.isfinite()
    subnormal = h.less(2.0 ** -1022 if a.n.dtype == dt.float64 else 2.0 ** -126) & big.greater(0)
    # near |z| = 1, log(hypot) keeps only hypot's absolute error: log(1.0000158548 + 9.96e-5j) in complex64 was
    # 2727 ulp off. There log|z| = log1p(|z|^2 - 1) / 2, with |z|^2 - 1 summed without losing what cancels
    # (z next to the unit circle): _unit_circle_distance
    unit = h.greater(0.5) & h.less(2.0)
    near_one = 0.5 * _unit_circle_distance(big, small).log1p()
    return Parts(where(overflowed | subnormal, scaled, where(unit, near_one, h.log())), z.im.atan2(z.re))


def _unit_circle_distance(big: F, small: F) -> F:
    """big^2 + small^2 - 1 for |z| in (0.5, 2), to the float's precision even where the terms cancel. complex64:
    in float64, where the squares of float32 values are exact. complex128: each square as its rounded value and
    its exact error (Dekker), big^2 - 1 exact (Sterbenz), the four terms added with their rounding errors kept
    (TwoSum)."""
    if big.n.dtype == dt.float32:
        wide_big, wide_small = big.astype(dt.float64), small.astype(dt.float64)
        return ((wide_big * wide_big - 1.0) + wide_small * wide_small).astype(dt.float32)
    p1, e1 = _exact_product(big, big)
    p2, e2 = _exact_product(small, small)
    s1, r1 = _two_sum(p1 - 1.0, p2)
    s2, r2 = _two_sum(s1, e1)
    s3, r3 = _two_sum(s2, e2)
    return s3 + (r1 + r2 + r3)


def _two_sum(a: F, b: F):
    """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth)."""
    s = a + b
    b_part = s - a
    return s, (a - (s - b_part)) + (b - b_part)


def _exact_product(x: F, y: F):
    """(p, e) with p = fl(x y) and p + e = x y exactly (Dekker's product over Veltkamp's halves: no FMA needed,
    and an FMA the compiler forms changes nothing, every partial product being exact). For |x|, |y| well inside
    the float's range (the halves' constant would overflow near its maximum)."""
    split = 134217729.0 if x.n.dtype == dt.float64 else 4097.0   # 2^27 + 1, 2^12 + 1

    def halves(v):
        c = v * split
        hi = c - (c - v)
        return hi, v - hi
    xh, xl = halves(x)
    yh, yl = halves(y)
    p = x * y
    return p, ((xh * yh - p) + xh * yl + xl * yh) + xl * yl


def clog1p(z: Parts) -> Parts:
    """log(1 + z): near 0, log1p of |1 + z|^2 - 1 = a (2 + a) + b^2 (no cancellation); elsewhere clog of 1 + z
    (which does not overflow: log1p(3.4e38 + 3.4e38j) in complex64 was inf through hypot)."""
    a, b = z.re, z.im
    small = (a.abs() + b.abs()).less(0.5)
    re = where(small, 0.5 * (a * (a + 2.0) + b * b).log1p(), clog(Parts(a + 1.0, b)).re)
    return Parts(re, b.atan2(a + 1.0))


def csqrt(z: Parts) -> Parts:
    """The principal root: t = sqrt((|a| + |z|) / 2), then the other part is b / 2t (Kahan's form). Near
    the float's maximum |z| overflows, and for the smallest subnormals |a| / 2 flushes to 0: there z is
    scaled by 1/4 or 2^100 first, t by 1/2 or 2^50 after (powers of two: exact)."""
    a, b = z.re, z.im
    largest = 2.0 ** 1023 if a.n.dtype == dt.float64 else 2.0 ** 127
    s = where(a.abs().greater_equal(b.abs()), a.abs(), b.abs())
    huge, tiny = s.greater(largest / 2), s.less(2.0 ** -100)
    one = F(a._const(1.0))
    scale_in = where(huge, 0.25, where(tiny, 2.0 ** 100, one))
    a_in, b_in = a * scale_in, b * scale_in
    t = (0.5 * a_in.abs() + 0.5 * a_in.hypot(b_in)).sqrt() * where(huge, 2.0, where(tiny, 2.0 ** -50, one))
    q = where(t.equal(0), b, b / (2.0 * t))
    right = a.greater_equal(0)
    re = where(right, t, q.abs())
    im = where(right, q, t.copysign(b))
    inf = b.isinf()  # sqrt(x +- inf j) = inf +- inf j for every x, NaN included
    return Parts(where(inf, b.abs(), re), where(inf, b, im))


def ctanh(z: Parts) -> Parts:
    """Kahan's formula (as C libraries): t = tan(b), s = sinh(a), rho = sqrt(1 + s^2); beyond |a| = 22 the
    real part is +-1 to every float's precision."""
    a, b = z.re, z.im
    t = b.tan()
    beta = 1.0 + t * t
    s = a.sinh()
    rho = (1.0 + s * s).sqrt()
    den = 1.0 + beta * s * s
    far = a.abs().greater(22.0) & (b.isfinite() | a.isinf())   # finite a with b inf/NaN: NaN + NaN j (C99)
    re = where(far, F(a._const(1.0)).copysign(a), where(a.equal(0), a, beta * rho * s / den))
    tail = where(b.isfinite(), 4.0 * b.sin() * b.cos() * (-2.0 * a.abs()).exp(), 0.0)  # tanh(inf + i inf) = 1 + 0j
    im = where(far, tail, t / den)
    return Parts(re, where(b.equal(0), b, im))


def _times_i(z: Parts) -> Parts:
    return Parts(-z.im, z.re)


def _times_minus_i(z: Parts) -> Parts:
    return Parts(z.im, -z.re)


def _one(z: Parts) -> Parts:
    return Parts(F(z.re._const(1.0)), F(z.re._const(0.0)))


def _plus(z: Parts, k: float) -> Parts:
    """z + k for a real k: the imaginary part is z's own (a -0.0 stays -0.0: it picks the side of a branch cut)."""
    return Parts(z.re + k, z.im)


def _add(a, b):
    return Parts(a.re + b.re, a.im + b.im)


def _neg(z: Parts) -> Parts:
    return Parts(-z.re, -z.im)


def _sub(a, b):
    return Parts(a.re - b.re, a.im - b.im)


def _big(z: Parts) -> F:
    """|z| beyond 1/sqrt(eps): there z^2 +- 1 is z^2 to the float's precision (and z^2 may overflow)."""
    eps = 2.0 ** -52 if z.re.n.dtype == dt.float64 else 2.0 ** -23
    return z.re.abs().greater(eps ** -0.5) | z.im.abs().greater(eps ** -0.5)


def _log2z(z: Parts) -> Parts:
    """log(2 z) without forming 2 z (no overflow): log z + log 2."""
    r = clog(z)
    return Parts(r.re + math.log(2), r.im)


def _choose(c: F, a: Parts, b: Parts) -> Parts:
    return Parts(where(c, a.re, b.re), where(c, a.im, b.im))


def casinh(z: Parts) -> Parts:
    """asinh(x + i y) on the first quadrant (x = |re|, y = |im|) is v + i u for asin(y + i x) = u + i v, by Hull,
    Fairgrieve and Tang's algorithm (_asin_first_quadrant); then each part takes its sign from z's (asinh is odd
    and asinh(conj z) = conj asinh z; -0.0 too: asinh(-0 + 2j) has a negative real part, asinh(1 - 0j) a -0
    imaginary one); log(2 w) for large |w| (no overflow; the infinities come out as C99 gives them).
    asinh(NaN +- 0j) is NaN +- 0j (C99). The log1p(w + w^2 / (1 + sqrt(1 + w^2))) form before lost the small part
    next to the imaginary axis and next to +-i (asin(-0.44 + 6.3e-12j)'s imaginary part was 6e10 ulp off in
    complex128, asin next to 1 12,593 ulp)."""
    w = Parts(z.re.abs(), z.im.abs())
    u, v = _asin_first_quadrant(w.im, w.re)
    r = _choose(_big(w), _log2z(w), Parts(v, u))
    nan_real = z.re.isnan() & z.im.equal(0)
    return Parts(where(nan_real, z.re, r.re.copysign(z.re)), where(nan_real, z.im, r.im.copysign(z.im)))


def _asin_first_quadrant(a: F, b: F):
    """(Re, Im) of asin(a + i b) for a, b >= 0 short of 1/sqrt(eps) (Hull, Fairgrieve and Tang, 1997): with r =
    |z + 1|, s = |z - 1| and A = (r + s) / 2, Im = log(A + sqrt(A^2 - 1)) from A - 1 formed without cancellation
    (b / sqrt((1 - a)(1 + a)) where b^2 underflows), and Re = asin(a / A), or an atan form where a / A is near 1."""
    r, s = (a + 1.0).hypot(b), (a - 1.0).hypot(b)
    big_a = 0.5 * (r + s)
    b2 = b * b
    r_sum, s_left, s_right = r + (a + 1.0), s + (1.0 - a), s + (a - 1.0)   # no cancellation on either side of 1
    left = b2 / r_sum
    a_minus_one = 0.5 * where(a.less(1.0), left + b2 / s_left, left + s_right)
    im = (a_minus_one + (a_minus_one * (big_a + 1.0)).sqrt()).log1p()
    tiny = 1e-150 if a.n.dtype == dt.float64 else 1e-18   # below it b^2 is no longer a normal float
    im = where(b.less(tiny) & a.less(1.0), b / ((1.0 - a) * (1.0 + a)).sqrt(), im)
    ratio = a / big_a
    inside = (a / (0.5 * (big_a + a) * (left + s_left)).sqrt()).atan()
    outside = (a / (b * (0.5 * ((big_a + a) / r_sum + (big_a + a) / s_right)).sqrt())).atan()
    re = where(ratio.less_equal(0.6417), ratio.asin(), where(a.less_equal(1.0), inside, outside))
    return re, im


def catanh(z: Parts) -> Parts:
    """Kahan's form: re = log1p(4a / ((1 - a)^2 + b^2)) / 4, im = atan2(2b, (1 - a)(1 + a) - b^2) / 2 (no
    difference of two nearly equal logarithms); for large |z|, 1/z + i pi/2 sign(b) (atanh(inf + i y) = 0 +
    i pi/2)."""
    a, b = z.re, z.im
    s = a.abs()  # atanh is odd: on |a| the log1p argument stays positive (near -1 it rounded to -1: -inf)
    one_minus = 1.0 - s
    den = one_minus * one_minus + b * b
    kahan = 0.25 * (4.0 * s / den).log1p()
    # near |a| = 1 the denominator underflows for a tiny b (4s / 0 = inf); there the two logarithms do not
    # cancel, so their difference over hypot (which does not underflow) is accurate
    near_one = 0.5 * ((1.0 + s).hypot(b).log() - one_minus.hypot(b).log())
    re = where(den.less(0.25), near_one, kahan).copysign(a)
    im = 0.5 * (2.0 * b).atan2(one_minus * (1.0 + s) - b * b)
    m = a.hypot(b)
    inf = m.isinf()
    tiny = where(inf, F(a._const(0.0)).copysign(a), (a / m) / m)  # 1/z = conj(z) / |z|^2
    half_pi = F(b._const(math.pi / 2)).copysign(b)
    far_im = where(b.isnan(), b, where(inf, half_pi, half_pi - (b / m) / m))
    r = _choose(_big(z), Parts(tiny, far_im), Parts(re, im))
    zero_nan = a.equal(0) & b.isnan()   # atanh(+-0 + NaN j) = +-0 + NaN j (C99)
    return Parts(where(zero_nan, a, r.re), where(zero_nan, b, r.im))


def cacosh(z: Parts) -> Parts:
    """Kahan's form: asinh(Re(conj(sqrt(z - 1)) sqrt(z + 1))) + 2i atan(Im sqrt(z - 1) / Re sqrt(z + 1)) (the
    log of z + sqrt(z + 1) sqrt(z - 1) lost the result next to 1: acosh(1 + 1e-100j) was 0); log(2 z) for
    large |z|."""
    below, above = csqrt(_plus(z, -1.0)), csqrt(_plus(z, 1.0))
    re = (below.re * above.re + below.im * above.im).asinh()
    im = 2.0 * below.im.atan2(above.re)
    r = _choose(_big(z), _log2z(z), Parts(re, im))
    zero_nan = z.re.equal(0) & z.im.isnan()   # acosh(+-0 + NaN j) = NaN + pi/2 j (C99)
    return Parts(where(zero_nan, z.im, r.re), where(zero_nan, math.pi / 2, r.im))


def casin(z: Parts) -> Parts:
    return _times_minus_i(casinh(_times_i(z)))


def _scale(z: Parts, k: float) -> Parts:
    return Parts(z.re * k, z.im * k)


def _pow(z: Parts, w: Parts) -> Parts:
    """exp(w log z); 0 ** w is 0 for Re(w) > 0, and z ** 0 is 1 for every z, 0 included (as numpy and Python)."""
    r = cexp(cmul(w, clog(z)))
    zero = z.re.equal(0) & z.im.equal(0) & w.re.greater(0)
    one = w.re.equal(0) & w.im.equal(0)
    return Parts(where(one, 1.0, where(zero, 0.0, r.re)), where(one, 0.0, where(zero, 0.0, r.im)))


def _sign(z: Parts) -> Parts:
    """z / |z|, over z / max(|re|, |im|) first (|z| of a large finite z overflowed: sign 0); an infinite
    part counts as +-1 and a finite one beside it as 0 (sign(inf j) = j, as numpy)."""
    a, b = z.re, z.im
    big = where(a.abs().greater_equal(b.abs()), a.abs(), b.abs())
    inf = big.isinf()
    ra = where(inf, where(a.isinf(), F(a._const(1.0)).copysign(a), 0.0), a / big)
    rb = where(inf, where(b.isinf(), F(b._const(1.0)).copysign(b), 0.0), b / big)
    m = ra.hypot(rb)
    zero = big.equal(0)
    nan = a.isnan() | b.isnan()   # a NaN part is NaN + NaN j (as numpy); the max above picked the other part
    return Parts(where(nan, a + b, where(zero, 0.0, ra / m)), where(nan, a + b, where(zero, 0.0, rb / m)))


def _acos(z: Parts) -> Parts:
    """Kahan's form: 2 atan(Re sqrt(1 - z) / Re sqrt(1 + z)) + i asinh(Im(conj(sqrt(1 + z)) sqrt(1 - z))) (pi/2 -
    asin(z) cancelled next to 1: acos(1 + 1e-100j) was -0j); pi/2 - asin(z) for large |z|."""
    r = casin(z)
    far = Parts(math.pi / 2 - r.re, -r.im)
    one_minus, one_plus = csqrt(_plus(_neg(z), 1.0)), csqrt(_plus(z, 1.0))
    re = 2.0 * one_minus.re.atan2(one_plus.re)
    im = (one_plus.re * one_minus.im - one_plus.im * one_minus.re).asinh()
    r = _choose(_big(z), far, Parts(re, im))
    zero_nan = z.re.equal(0) & z.im.isnan()   # acos(+-0 + NaN j) = pi/2 + NaN j (C99)
    return Parts(where(zero_nan, math.pi / 2, r.re), where(zero_nan, z.im, r.im))


def _cexpm1(z: Parts) -> Parts:
    a, b = z.re, z.im
    half = (0.5 * b).sin()
    re = a.expm1() * b.cos() - 2.0 * half * half  # e^a cos b - 1 without cancellation near 0
    real_axis = b.equal(0)
    return Parts(where(real_axis, a.expm1(), re), where(real_axis, b, a.exp() * b.sin()))


# Each primitive's complex rule: (node, args) -> Parts (a complex result) or F (a real one); ``args`` hold
# Parts for complex inputs and F for real ones. Registering a rule is what lets the primitive take complex
# inputs (primitives.check_accepts); the array API's list of complex-accepting functions is the guide.
RULES = {
    "add": lambda n, a: _add(*a),
    "subtract": lambda n, a: _sub(*a),
    "multiply": lambda n, a: cmul(*a),
    "divide": lambda n, a: cdiv(*a),
    "negative": lambda n, a: Parts(-a[0].re, -a[0].im),
    "positive": lambda n, a: Parts(a[0].re, a[0].im),
    "square": lambda n, a: cmul(a[0], a[0]),
    "reciprocal": lambda n, a: cdiv(_one(a[0]), a[0]),
    "abs": lambda n, a: a[0].re.hypot(a[0].im),
    "sign": lambda n, a: _sign(a[0]),
    "round": lambda n, a: Parts(a[0].re.round(), a[0].im.round()),
    "exp": lambda n, a: cexp(a[0]),
    "expm1": lambda n, a: _cexpm1(a[0]),
    "log": lambda n, a: clog(a[0]),
    "log1p": lambda n, a: clog1p(a[0]),
    "log2": lambda n, a: _scale(clog(a[0]), 1 / math.log(2)),
    "log10": lambda n, a: _scale(clog(a[0]), 1 / math.log(10)),
    "sqrt": lambda n, a: csqrt(a[0]),
    "pow": lambda n, a: _pow(*a),
    "sin": lambda n, a: _times_minus_i(csinh(_times_i(a[0]))),  # sin z = -i sinh(i z)
    "cos": lambda n, a: ccosh(_times_i(a[0])),  # cos z = cosh(i z)
    "sinh": lambda n, a: csinh(a[0]),
    "cosh": lambda n, a: ccosh(a[0]),
    "tanh": lambda n, a: ctanh(a[0]),
    "tan": lambda n, a: _times_minus_i(ctanh(_times_i(a[0]))),
    "asinh": lambda n, a: casinh(a[0]),
    "asin": lambda n, a: casin(a[0]),
    "acos": lambda n, a: _acos(a[0]),
    "acosh": lambda n, a: cacosh(a[0]),
    "atanh": lambda n, a: catanh(a[0]),
    "atan": lambda n, a: _times_minus_i(catanh(_times_i(a[0]))),
    "equal": lambda n, a: a[0].re.equal(a[1].re) & a[0].im.equal(a[1].im),
    "not_equal": lambda n, a: a[0].re.not_equal(a[1].re) | a[0].im.not_equal(a[1].im),
    "isnan": lambda n, a: a[0].re.isnan() | a[0].im.isnan(),
    "isinf": lambda n, a: a[0].re.isinf() | a[0].im.isinf(),
    "isfinite": lambda n, a: a[0].re.isfinite() & a[0].im.isfinite(),
    "where": lambda n, a: Parts(where(a[0], a[1].re, a[2].re), where(a[0], a[1].im, a[2].im)),
    "astype": lambda n, a: _astype(n, a[0]),
    "real": lambda n, a: a[0].re,
    "imag": lambda n, a: a[0].im,
    "conj": lambda n, a: Parts(a[0].re, -a[0].im),
    "complex": lambda n, a: Parts(a[0], a[1]),
}


def _astype(node, x):
    d = node.dtype
    if d.kind == "c":  # to complex: cast the parts; a real input gets a zero imaginary part
        r = dt.real_dtype(d)
        if isinstance(x, Parts):
            return Parts(x.re.astype(r), x.im.astype(r))
        re = x.astype(r)
        return Parts(re, F(re._const(0.0)))
    if d.kind == "b":  # nonzero: either part
        return x.re.not_equal(0) | x.im.not_equal(0)
    return x.re.astype(d)  # the real part (fa.astype refuses this; internal casts only)


for _name, _rule in RULES.items():
    if _name in ELEMENTWISE:
        ELEMENTWISE[_name].complex_rule = _rule
for _prim in (REAL, IMAG, CONJ, COMPLEX):
    _prim.complex_rule = RULES[_prim.name]
ELEMENTWISE["abs"].complex_real_result = True
REAL.complex_real_result = IMAG.complex_real_result = True


# ---- the pass -----------------------------------------------------------------------------------------------
def lower_complex(roots: list) -> None:
    """Rewrite the graph under ``roots`` so that no complex node is computed by a kernel (see the module
    docstring). Roots keep their node objects (the user's arrays hold them): a complex root becomes the
    view_as_complex of its packed value, a real root over complex values the real expression."""
    order = ir.toposort(roots)
    if not any(n.dtype.kind == "c" for n in order):
        return
    _Lowering(roots).run(order)


class _Lowering:
    def __init__(self, roots):
        self.roots = roots
        self.parts = {}  # complex node -> Parts
        self.new = {}  # real node -> its replacement

    def run(self, order):
        for node in order:
            if node.buffer is None:
                self.visit(node)
        for root in self.roots:
            if root.dtype.kind == "c":
                if root.kind != "output":
                    as_complex_node(self.get(root).packed(), root)
            elif root in self.new:
                _become(root, self.new[root])

    def get(self, node) -> Parts:
        """The parts of complex ``node`` (visited already, or a buffer)."""
        parts = self.parts.get(node)
        if parts is None:
            if node.buffer is None and node.kind != "output":
                raise AssertionError(f"complex lowering: {node} was not visited")
            parts = self.parts[node] = _from_node(node)
        return parts

    def real(self, node) -> ir.Node:
        return self.new.get(node, node)

    def arg(self, node):
        return self.get(node) if node.dtype.kind == "c" else F(self.real(node))

    def buffer_of(self, node) -> ir.Node:
        """A complex node that a library reads: it must exist in memory as a complex buffer."""
        if node.buffer is not None or node.kind == "output":
            return node
        if node.kind == "view":
            base = node.inputs[0]
            made = self.buffer_of(base)
            return node if made is base else ir.view(made, node.params, node.shape)
        return as_complex_node(self.get(node).packed())

    def visit(self, node):
        kind = node.kind
        if kind == "library":
            if node.prim is AS_REAL:  # its output is replaced by the packed value (below) where that is lazy
                return
            ins = tuple(self.buffer_of(i) if i.dtype.kind == "c" else self.real(i) for i in node.inputs)
            if ins != node.inputs:
                node.inputs = ins  # same values, now computable: library nodes are rewritten in place
            return
        if kind == "output":
            lib = node.inputs[0]
            if lib.prim is AS_COMPLEX:
                self.parts[node] = Parts(packed=self.real(lib.inputs[0]))
            elif lib.prim is AS_REAL and lib.inputs[0].dtype.kind == "c" and lib.inputs[0].kind != "output" \
                    and lib.inputs[0].buffer is None:
                self.new[node] = self.get(lib.inputs[0]).packed()
            return
        if kind in ("constant", "iota", "source"):
            if node.dtype.kind == "c":
                raise AssertionError(f"a complex {kind} node: complex scalars are recorded as complex(re, im)")
            return
        if kind == "composite":
            raise AssertionError("complex lowering runs after composites are expanded")
        if node.dtype.kind == "c":
            self.parts[node] = self.complex_value(node)
            return
        if any(i.dtype.kind == "c" for i in node.inputs):  # a real result of complex inputs: abs, real, isnan
            if kind != "elementwise":
                raise TypeError(f"{node.prim.name} of complex inputs is not supported")
            self.new[node] = node.prim.complex_rule(node, [self.arg(i) for i in node.inputs]).n
            return
        if any(i in self.new for i in node.inputs):
            self.new[node] = self.rebuilt(node)

    def rebuilt(self, node) -> ir.Node:
        ins = tuple(self.real(i) for i in node.inputs)
        if node.kind == "view":
            return view(ins[0], node.params, node.shape)
        return ir.Node(node.prim, ins, node.params, node.shape, node.dtype, node.device)

    def complex_value(self, node) -> Parts:
        kind = node.kind
        if kind == "view":
            base = self.get(node.inputs[0])
            if base._packed is not None:  # a buffer or a reduction: the same view of the packed value (no copy)
                return Parts(packed=view(base._packed, _packed_ops(node.params), node.shape + (2,)))
            return Parts(F(view(base.re.n, node.params, node.shape)), F(view(base.im.n, node.params, node.shape)))
        if kind == "elementwise":
            rule = node.prim.complex_rule
            if rule is None:
                raise TypeError(f"{node.prim.name} does not accept complex inputs")
            return rule(node, [self.arg(i) for i in node.inputs])
        if kind == "reduce":
            return self.reduce(node)
        if kind == "concat":
            packed = [self.get(i).packed() for i in node.inputs]
            r = packed[0].dtype
            return Parts(packed=ir.Node(node.prim, tuple(packed), node.params, node.shape + (2,), r, node.device))
        raise TypeError(f"complex values are not supported by {node.prim.name} ({kind})")

    def reduce(self, node) -> Parts:
        x = self.get(node.inputs[0])
        axes, name = node.params, node.prim.name
        if name == "sum":  # the packed value summed over the same axes is the packed sum
            p = x.packed()
            out = ir.Node(REDUCE["sum"], (p,), axes, node.shape + (2,), p.dtype, node.device)
            return Parts(packed=out)
        if name == "prod":  # magnitudes multiply, angles add (in float64: prod_factors)
            shape, r = node.shape, x.re.n.dtype
            scale, rest, hi, lo, quarters = prod_factors(x.re, x.im)
            s, h, big, small, turns = (F(ir.Node(REDUCE[op], (v.n,), axes, shape, dt.float64, node.device)) for op, v in
                                       (("prod", scale), ("prod", rest), ("sum", hi), ("sum", lo), ("sum", quarters)))
            c, si = quarter_turned(*rotation(big, small), turns)
            return Parts((s * (h * c)).astype(r), (s * (h * si)).astype(r))
        raise TypeError(f"{name} does not accept complex inputs")


def _become(node, new):
    """Root ``node`` computes ``new``'s value from now on (its object stays: the user's array holds it)."""
    ir.keep_history(node)   # inside fa.grad/jvp the derivative still sees the complex graph it was recorded as
    if new.kind in ("output", "view", "source", "constant", "iota") or new.buffer is not None:
        node.prim, node.inputs, node.params = ELEMENTWISE["astype"], (new,), None
    else:
        node.prim, node.inputs, node.params = new.prim, new.inputs, new.params
