"""fa.grad / vjp / jvp against torch.autograd (fp32) and finite differences (fp64); pytrees; jit; fusion."""
import collections
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flyarray as fa
from flyarray import tree_util as tu
from flyarray.primitives import ELEMENTWISE

RTOL, ATOL = 1e-4, 1e-5


def _torch_grads(fn, *xs):
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    fn(*ts).backward()
    return [t.grad.numpy() for t in ts]


def _check(fa_fn, torch_fn, *xs, rtol=RTOL, atol=ATOL):
    got = fa.grad(fa_fn, argnums=tuple(range(len(xs))))(*[fa.asarray(x) for x in xs])
    want = _torch_grads(torch_fn, *xs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=atol)


rng = np.random.default_rng(0)
X = rng.uniform(-2, 2, (3, 4)).astype(np.float32)
POS = rng.uniform(0.5, 2, (3, 4)).astype(np.float32)
UNIT = rng.uniform(-0.9, 0.9, (3, 4)).astype(np.float32)
BIG = rng.uniform(1.2, 3, (3, 4)).astype(np.float32)

UNARY = {  # name: (fa fn, torch fn, domain)
    "exp": (fa.exp, torch.exp, X), "exp2": (fa.exp2, torch.exp2, X), "log": (fa.log, torch.log, POS),
    "log2": (fa.log2, torch.log2, POS), "log10": (fa.log10, torch.log10, POS), "sqrt": (fa.sqrt, torch.sqrt, POS),
    "rsqrt": (fa.rsqrt, torch.rsqrt, POS), "sin": (fa.sin, torch.sin, X), "cos": (fa.cos, torch.cos, X),
    "tan": (fa.tan, torch.tan, UNIT), "tanh": (fa.tanh, torch.tanh, X), "erf": (fa.erf, torch.erf, X),
    "erfc": (fa.erfc, torch.erfc, X),
    "sigmoid": (fa.sigmoid, torch.sigmoid, X), "acos": (fa.acos, torch.acos, UNIT),
    "acosh": (fa.acosh, torch.acosh, BIG), "asin": (fa.asin, torch.asin, UNIT), "asinh": (fa.asinh, torch.asinh, X),
    "atan": (fa.atan, torch.atan, X), "atanh": (fa.atanh, torch.atanh, UNIT), "cosh": (fa.cosh, torch.cosh, X),
    "sinh": (fa.sinh, torch.sinh, X), "expm1": (fa.expm1, torch.expm1, X), "log1p": (fa.log1p, torch.log1p, POS),
    "relu": (fa.relu, torch.relu, X), "silu": (fa.silu, torch.nn.functional.silu, X),
    "gelu": (fa.gelu, torch.nn.functional.gelu, X),
    "gelu_tanh": (lambda x: fa.gelu(x, approximate=True),
                  lambda x: torch.nn.functional.gelu(x, approximate="tanh"), X),
    "negative": (fa.negative, torch.negative, X), "positive": (fa.positive, torch.positive, X),
    "abs": (fa.abs, torch.abs, X), "square": (fa.square, torch.square, X),
    "reciprocal": (fa.reciprocal, torch.reciprocal, POS),
    "sign": (fa.sign, torch.sign, X), "floor": (fa.floor, torch.floor, X), "ceil": (fa.ceil, torch.ceil, X),
    "trunc": (fa.trunc, torch.trunc, X), "round": (fa.round, torch.round, X),
}
Y = rng.uniform(-2, 2, (3, 4)).astype(np.float32)
BINARY = {
    "add": (fa.add, torch.add, X, Y), "subtract": (fa.subtract, torch.subtract, X, Y),
    "multiply": (fa.multiply, torch.multiply, X, Y), "divide": (fa.divide, torch.divide, X, POS),
    "pow": (fa.pow, torch.pow, POS, Y), "maximum": (fa.maximum, torch.maximum, X, Y),
    "minimum": (fa.minimum, torch.minimum, X, Y), "atan2": (fa.atan2, torch.atan2, X, Y),
    "hypot": (fa.hypot, torch.hypot, X, Y), "logaddexp": (fa.logaddexp, torch.logaddexp, X, Y),
    "copysign": (fa.copysign, torch.copysign, X, Y), "remainder": (fa.remainder, torch.remainder, X, POS),
}
NO_GRAD = {"floor_divide", "nextafter", "where", "astype"}  # zero-gradient, or tested on their own below


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    f, tf, x = UNARY[name]
    w = rng.uniform(0.5, 1.5, x.shape).astype(np.float32)
    _check(lambda a: fa.sum(f(a) * fa.asarray(w)), lambda a: (tf(a) * torch.from_numpy(w)).sum(), x)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name):
    f, tf, x, y = BINARY[name]
    _check(lambda a, b: fa.sum(f(a, b)), lambda a, b: tf(a, b).sum(), x, y)


@pytest.mark.parametrize("x", [[2.0, 0.0, 3.0, 0.0], [2.0, 0.0, 3.0, 5.0], [2.0, -1.5, 3.0, 0.5], [0.0, 0.0, 0.0, 4.0]])
def test_prod_second_derivatives_with_zeros(x):
    """The Hessian of prod is the product of all but two entries (symmetric; nonzero at two zeros): the
    first-order rule's y / x form with a zero branch got its own derivative wrong."""
    want = torch.func.hessian(torch.prod)(torch.tensor(x, dtype=torch.float64)).numpy()
    got = np.asarray(fa.hessian(fa.prod)(fa.asarray(np.array(x))))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_prod_gradient_over_several_axes_and_empty_rows():
    x = np.random.default_rng(3).uniform(-2, 2, (3, 0, 2))
    assert np.asarray(fa.grad(lambda a: fa.sum(fa.prod(a, axis=1)))(fa.asarray(x))).shape == (3, 0, 2)
    x = np.random.default_rng(4).uniform(-2, 2, (3, 4, 2))
    x[1, 2, 0] = 0.0
    t = torch.tensor(x, requires_grad=True)
    t.prod(dim=2).prod(dim=0).sum().backward()   # torch has no multi-axis prod: over (0, 2) as two
    got = fa.grad(lambda a: fa.sum(fa.prod(a, axis=(0, 2))))(fa.asarray(x))
    np.testing.assert_allclose(np.asarray(got), t.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_python_control_flow_on_primal_values_works_as_in_jax():
    """Under grad (not jit or vmap) a primal has one value: a Python if picks a branch and its derivative
    (JAX's tutorial example), and a float() of it is a constant of the derivative, as in JAX."""
    f = lambda x: 3.0 * x ** 2 if float(x) < 3.0 else -4.0 * x   # noqa: E731
    assert float(fa.grad(f)(fa.asarray(np.float64(2.0)))) == 12.0
    assert float(fa.grad(f)(fa.asarray(np.float64(4.0)))) == -4.0
    x = fa.asarray(np.array([1.0, 2.0]))
    np.testing.assert_allclose(np.asarray(fa.grad(lambda a: fa.sum(a * float(fa.sum(a))))(x)), [3.0, 3.0])


def test_values_evaluated_inside_nested_transforms_keep_their_history():
    """Printing or converting a value inside the function of an inner transform (or one computed from the
    primal at first order) evaluates it; the enclosing derivative still flows through it (its history is
    kept aside while a derivative transform records), as in JAX."""
    x = np.array([0.5, -0.3, 0.8, 1.2])
    b0 = x[0]
    inner = lambda a: fa.sum(a ** 3) * float(a[0])   # noqa: E731  float(a[0]) is a constant
    for outer_arg in (lambda b: b, lambda b: b * 1.0):
        got = fa.grad(lambda b: fa.sum(fa.grad(inner)(outer_arg(b))))(fa.asarray(x))
        np.testing.assert_allclose(np.asarray(got), 6 * x * b0, rtol=1e-12)
    shown = lambda a: (np.asarray(a), str(a), fa.sum(a ** 3))[2]   # noqa: E731
    np.testing.assert_allclose(np.asarray(fa.grad(lambda b: fa.sum(fa.grad(shown)(b * 1.0)))(fa.asarray(x))),
                               6 * x, rtol=1e-12)
    _, tangent = fa.jvp(lambda b: fa.grad(shown)(b * 2.0), (fa.asarray(x),), (fa.ones_like(fa.asarray(x)),))
    np.testing.assert_allclose(np.asarray(tangent), 24 * x, rtol=1e-12)   # d/db 3 (2b)^2 * 2
    y_evaluated = lambda a: (lambda y: (float(fa.sum(y)), fa.sum(y * y))[1])(fa.sin(a))   # noqa: E731
    np.testing.assert_allclose(np.asarray(fa.grad(y_evaluated)(fa.asarray(x))), 2 * np.sin(x) * np.cos(x),
                               rtol=1e-12)
    from flyarray import ir
    assert len(ir.differentiating.history) == 0   # dropped after the outermost trace: no graph kept alive


def test_every_float_primitive_has_a_rule():
    """A new float-valued elementwise primitive needs a vjp rule in flyarray/ad_rules.py."""
    missing = [n for n, p in ELEMENTWISE.items()
               if p.out != "bool" and p.accepts in ("any", "numeric", "float") and not hasattr(p, "vjp")]
    assert not missing, f"no derivative rule for {missing}"
    assert set(UNARY) | set(BINARY) | NO_GRAD >= {n for n, p in ELEMENTWISE.items() if hasattr(p, "vjp")}


def test_max_min_ties_split_evenly():
    x = np.array([1.0, 3.0, 3.0, 2.0], np.float32)
    g = fa.grad(lambda a: fa.max(a))(fa.asarray(x))
    np.testing.assert_allclose(np.asarray(g), [0, 0.5, 0.5, 0])
    g = fa.grad(lambda a: fa.sum(fa.maximum(a, 3.0)))(fa.asarray(x))
    np.testing.assert_allclose(np.asarray(g), [0, 0.5, 0.5, 0])  # JAX's balanced tie rule


def test_where_and_astype():
    _check(lambda a, b: fa.sum(fa.where(a > 0, a * b, b * b)),
           lambda a, b: torch.where(a > 0, a * b, b * b).sum(), X, Y)
    _check(lambda a: fa.sum(fa.sin(a.astype(fa.float64)).astype(fa.float32) * a.astype(fa.float16)),
           lambda a: (torch.sin(a.double()).float() * a.half()).sum(), X, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_reductions(axis):
    dims = axis if axis is None or isinstance(axis, tuple) else (axis,)
    kw = {} if axis is None else {"dim": dims}
    _check(lambda a: fa.sum(fa.sin(fa.sum(a, axis=axis))), lambda a: torch.sin(a.sum(**kw)).sum(), X)
    _check(lambda a: fa.sum(fa.mean(a, axis=axis) ** 2), lambda a: (a.mean(**kw) ** 2).sum(), X)
    _check(lambda a: fa.sum(fa.max(a, axis=axis)), lambda a: a.amax(**kw).sum(), X)
    _check(lambda a: fa.sum(fa.min(a, axis=axis)), lambda a: a.amin(**kw).sum(), X)
    _check(lambda a: fa.sum(fa.var(a, axis=axis)), lambda a: a.var(**kw, unbiased=False).sum(), X)


def test_prod_with_zeros():
    for x in ([1.0, 2.0, 3.0, 4.0], [1.0, 0.0, 3.0, 4.0], [0.0, 2.0, 0.0, 4.0]):
        x = np.array(x, np.float32)
        _check(lambda a: fa.prod(a), lambda a: a.prod(), x)
    _check(lambda a: fa.sum(fa.prod(a, axis=1)), lambda a: a.prod(1).sum(), X)


@pytest.mark.parametrize("x, want", [
    ([1e30, 1e30, 0.0, 1.0], [0.0, 0.0, np.inf, 0.0]),       # inf * 0 inside the products of the others
    ([0.0, 1.0, 1e30, 1e30], [np.inf, 0.0, 0.0, 0.0]),       # the overflow after the zero
    ([np.inf, 0.0, 1.0, 2.0], [0.0, np.inf, np.nan, np.nan]),  # a real inf times a zero stays NaN (torch's)
    ([np.nan, 0.0, 1.0], [0.0, np.nan, np.nan]),
])
def test_prod_gradient_where_a_partial_product_overflows_before_a_zero(x, want):
    """The product of the others is 0 where it holds a zero, even if the finite values around it overflow
    float32 first (torch's gradient of the first case; of the second torch gives NaN at 1.0)."""
    got = np.asarray(fa.grad(fa.prod)(fa.asarray(np.array(x, np.float32))))
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    rows = np.asarray(fa.grad(lambda a: fa.sum(fa.prod(a, axis=1)))(fa.asarray(np.array([x, x], np.float32))))
    np.testing.assert_array_equal(rows, np.array([want, want], np.float32))


def test_views():
    x3 = rng.uniform(-1, 1, (2, 3, 4)).astype(np.float32)
    w = rng.uniform(-1, 1, (4, 3, 2)).astype(np.float32)
    tw = torch.from_numpy(w)
    _check(lambda a: fa.sum(fa.permute_dims(a, (2, 1, 0)) * fa.asarray(w)),
           lambda a: (a.permute(2, 1, 0) * tw).sum(), x3)
    _check(lambda a: fa.sum(fa.reshape(a, (4, 3, 2)) * fa.asarray(w)), lambda a: (a.reshape(4, 3, 2) * tw).sum(), x3)
    _check(lambda a: fa.sum(a[:, ::2, 1:] ** 2), lambda a: (a[:, ::2, 1:] ** 2).sum(), x3)
    _check(lambda a: fa.sum(a[1, 1:3, ::3] * 3.0), lambda a: (a[1, 1:3, ::3] * 3.0).sum(), x3)
    _check(lambda a: fa.sum(a[:, ::-1] * fa.asarray(x3)), lambda a: (a.flip(1) * torch.from_numpy(x3)).sum(), x3)
    _check(lambda a: fa.sum(fa.broadcast_to(a[:, None, :1, None], (2, 5, 1, 3)) ** 2),
           lambda a: (a[:, None, :1, None].expand(2, 5, 1, 3) ** 2).sum(), x3[:, 0])
    # broadcasting inside a binary op (a view the recorder adds)
    _check(lambda a, b: fa.sum(a * b), lambda a, b: (a * b).sum(), X, X[0])
    _check(lambda a: fa.sum(a.mT.mT * a.T.T), lambda a: (a * a).sum(), X)


def test_concat_stack():
    _check(lambda a, b: fa.sum(fa.concat([a, b * 2, a], axis=1) ** 2),
           lambda a, b: (torch.cat([a, b * 2, a], 1) ** 2).sum(), X, Y)
    _check(lambda a, b: fa.sum(fa.sin(fa.stack([a, b], axis=0))), lambda a, b: torch.sin(torch.stack([a, b])).sum(),
           X, Y)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.data())
def test_broadcast_shapes_hypothesis(shape, data):
    other = tuple(1 if data.draw(st.booleans()) else s for s in shape)[data.draw(st.integers(0, len(shape))):]
    a = rng.uniform(-1, 1, shape).astype(np.float32)
    b = rng.uniform(-1, 1, other).astype(np.float32)
    _check(lambda x, y: fa.sum(fa.tanh(x * y + y)), lambda x, y: torch.tanh(x * y + y).sum(), a, b)


@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((4,), (4, 3)),
                                    ((3, 4), (4,))])
def test_matmul(shapes):
    a = rng.uniform(-1, 1, shapes[0]).astype(np.float32)
    b = rng.uniform(-1, 1, shapes[1]).astype(np.float32)
    _check(lambda x, y: fa.sum(fa.sin(x @ y)), lambda x, y: torch.sin(x @ y).sum(), a, b)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_gradients_are_as_accurate_as_torchs(fn):
    """The row maximum is a shift with no derivative: its two derivative paths cancelled only up to rounding,
    an error on each row's largest element (log_softmax fp32, 16384 columns: 2.8e-4, torch 2.2e-7)."""
    torch.manual_seed(1)
    x, ct = torch.randn(2, 4096), torch.randn(2, 4096)
    _, pull = fa.vjp(getattr(fa.nn, fn), fa.asarray(x))
    (g,) = pull(fa.asarray(ct))
    exact = x.double().requires_grad_()
    getattr(torch, fn)(exact, -1).backward(ct.double())
    same_dtype = x.clone().requires_grad_()
    getattr(torch, fn)(same_dtype, -1).backward(ct)
    ours = (torch.from_dlpack(g).double() - exact.grad).abs().max().item()
    torchs = (same_dtype.grad.double() - exact.grad).abs().max().item()
    assert ours <= 4 * torchs + 1e-7, (ours, torchs)


def test_nn_ops():
    x = rng.uniform(-2, 2, (3, 8)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (8,)).astype(np.float32)
    tw = torch.from_numpy(w)
    _check(lambda a: fa.sum(fa.nn.softmax(a) * fa.asarray(w)), lambda a: (torch.softmax(a, -1) * tw).sum(), x)
    _check(lambda a: fa.sum(fa.nn.log_softmax(a, axis=0)[:, :3] * fa.asarray(w[:3])),
           lambda a: (torch.log_softmax(a, 0)[:, :3] * tw[:3]).sum(), x)
    _check(lambda a, b: fa.sum(fa.nn.rms_norm(a, b) ** 2),
           lambda a, b: (torch.nn.functional.rms_norm(a, (8,), b, 1e-6) ** 2).sum(), x, w)
    _check(lambda a: fa.sum(fa.nn.layer_norm(a) * fa.asarray(w)),
           lambda a: (torch.nn.functional.layer_norm(a, (8,), eps=1e-5) * tw).sum(), x, rtol=1e-3, atol=1e-4)


def test_top_k_and_attention():
    x = rng.uniform(-2, 2, (3, 8)).astype(np.float32)
    _check(lambda a: fa.sum(fa.top_k(a, 3)[0] ** 2), lambda a: (torch.topk(a, 3)[0] ** 2).sum(), x)
    q = rng.uniform(-1, 1, (1, 4, 2, 8)).astype(np.float32)
    k = rng.uniform(-1, 1, (1, 5, 1, 8)).astype(np.float32)
    v = rng.uniform(-1, 1, (1, 5, 1, 8)).astype(np.float32)

    def torch_attn(q, k, v):
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        kh, vh = kh.repeat_interleave(2, 1), vh.repeat_interleave(2, 1)
        return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=False).transpose(1, 2)
    w = rng.uniform(-1, 1, q.shape).astype(np.float32)
    _check(lambda a, b, c: fa.sum(fa.nn.dot_product_attention(a, b, c) * fa.asarray(w)),
           lambda a, b, c: (torch_attn(a, b, c) * torch.from_numpy(w)).sum(), q, k, v, rtol=1e-3, atol=1e-4)
    # with a bias: its gradient comes from the primitive formulation (the kernel has none)
    bias = rng.uniform(-1, 1, (1, 2, 4, 5)).astype(np.float32)
    _check(lambda a, b, c, d: fa.sum(fa.nn.dot_product_attention(a, b, c, bias=d) * fa.asarray(w)),
           lambda a, b, c, d: (torch.nn.functional.scaled_dot_product_attention(
               a.transpose(1, 2), b.transpose(1, 2).repeat_interleave(2, 1), c.transpose(1, 2).repeat_interleave(2, 1),
               attn_mask=d).transpose(1, 2) * torch.from_numpy(w)).sum(), q, k, v, bias, rtol=1e-3, atol=1e-4)


def test_attention_gradient_reuses_the_forward_residuals(interpret, monkeypatch):
    """The forward node keeps out and the log-sum-exp; the backward kernel reads them instead of running
    the forward again (it did: a gradient paid for two forward passes)."""
    from flyarray.kernels import attention
    calls = []
    forward = attention.attention_fwd
    monkeypatch.setattr(attention, "attention_fwd", lambda *a, **k: calls.append(1) or forward(*a, **k))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 9, 2, 16, generator=g) for _ in range(3))
    w = torch.randn(1, 9, 2, 16, generator=g)
    grads = fa.grad(lambda a, b, c: fa.sum(fa.nn.dot_product_attention(a, b, c, is_causal=True) * fa.asarray(w)),
                    argnums=(0, 1, 2))(*map(fa.asarray, (q, k, v)))
    fa.eval(*grads)
    assert len(calls) == 1
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    loss = (attention.reference_attention(*ref, is_causal=True) * w.double()).sum()
    for got, want in zip(grads, torch.autograd.grad(loss, ref)):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_gradient_through_the_attention_log_sum_exp(backend, causal):
    """The library op's second output (lse) is differentiable too: the backward folds its cotangent in
    (kernel) or differentiates the float64 reference with it (reference backend)."""
    from flyarray.kernels import attention
    from flyarray.ops.library import call
    from flyarray.ops.library_ops import ATTENTION
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 7, 2, 16, generator=g) for _ in range(3))
    w_out, w_lse = torch.randn(1, 7, 2, 16, generator=g), torch.randn(1, 2, 7, generator=g)

    def f(a, b, c):
        out, lse = call(ATTENTION, [a, b, c], scale=None, is_causal=causal, has_bias=False, has_mask=False)
        return fa.sum(out * fa.asarray(w_out)) + fa.sum(lse * fa.asarray(w_lse))
    grads = fa.grad(f, argnums=(0, 1, 2))(*map(fa.asarray, (q, k, v)))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    out, lse = attention.reference_attention(*ref, is_causal=causal, return_lse=True)
    loss = (out * w_out.double()).sum() + (lse * w_lse.double()).sum()
    for got, want in zip(grads, torch.autograd.grad(loss, ref)):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-5)


def test_attention_output_read_by_a_kernel_reference_backend():
    """A library output read by a fused kernel: the plan hands kernels contiguous library outputs
    (the attention reference returns transposed strides)."""
    q = rng.uniform(-1, 1, (1, 4, 2, 8)).astype(np.float32)
    out = fa.nn.dot_product_attention(*[fa.asarray(q)] * 3)
    once = np.asarray(out).copy()
    np.testing.assert_allclose(np.asarray(fa.nn.dot_product_attention(*[fa.asarray(q)] * 3) * 2.0), 2 * once)


def test_finite_differences_float64():
    x = rng.uniform(0.5, 1.5, (5,))

    def f(a):
        return fa.sum(fa.log(a) * fa.tanh(a) / (1.0 + a ** 3) + fa.prod(a) * fa.max(fa.sin(a)))
    g = np.asarray(fa.grad(f)(fa.asarray(x)))
    eps = 1e-6
    for i in range(5):
        d = np.zeros(5)
        d[i] = eps
        fd = (float(f(fa.asarray(x + d))) - float(f(fa.asarray(x - d)))) / (2 * eps)
        assert abs(g[i] - fd) < 1e-6 * max(1, abs(fd))
    assert fa.grad(f)(fa.asarray(x)).dtype == fa.float64


def test_pytrees_has_aux_argnums():
    params = {"w": rng.uniform(-1, 1, (3, 2)).astype(np.float32), "b": np.zeros(2, np.float32)}
    xs = rng.uniform(-1, 1, (4, 3)).astype(np.float32)

    def loss(p, x):
        y = fa.tanh(x @ p["w"] + p["b"])
        return fa.mean(y ** 2), {"y": y}
    (value, aux), grads = fa.value_and_grad(loss, has_aux=True)(params, fa.asarray(xs))
    assert set(grads) == {"w", "b"} and grads["w"].shape == (3, 2)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tl = (torch.tanh(torch.from_numpy(xs) @ tp["w"] + tp["b"]) ** 2).mean()
    tl.backward()
    np.testing.assert_allclose(float(value), tl.item(), rtol=1e-5)
    for k in tp:
        np.testing.assert_allclose(np.asarray(grads[k]), tp[k].grad.numpy(), rtol=RTOL, atol=ATOL)
    assert aux["y"].shape == (4, 2)
    gx, gp = fa.grad(lambda p, x: loss(p, x)[0], argnums=(1, 0))(params, fa.asarray(xs))
    assert gx.shape == (4, 3) and gp["w"].shape == (3, 2)
    # torch tensors and numpy in, the same gradient
    g_t = fa.grad(lambda p, x: loss(p, fa.asarray(x))[0])({k: torch.from_numpy(v) for k, v in params.items()},
                                                           torch.from_numpy(xs))
    np.testing.assert_allclose(np.asarray(g_t["w"]), tp["w"].grad.numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("tree, single", [(None, True), ((), True), ([], True), ({}, True), (1.0, True),
                                          ((1.0,), False), ([None], False), ({"a": None}, False)])
def test_treedef_is_leaf_asks_for_one_node_as_jax(tree, single):
    """tree_structure(None) was not a leaf; JAX's treedef_is_leaf is num_nodes == 1 (checked against jax 0.10.2)."""
    assert tu.treedef_is_leaf(tu.tree_structure(tree)) is single


def test_tree_util():
    P = collections.namedtuple("P", "a b")
    tree = {"z": 1, "a": (2, [3, None]), "p": P(4, 5)}
    leaves, treedef = tu.tree_flatten(tree)
    assert leaves == [2, 3, 4, 5, 1]
    assert tu.tree_unflatten(treedef, leaves) == tree
    assert tu.tree_map(lambda x, y: x * y, tree, tree)["p"] == P(16, 25)
    assert tu.tree_leaves([None, (None,)]) == []
    # as JAX: an OrderedDict keeps its insertion order, a defaultdict sorts its keys and keeps its factory
    ordered = collections.OrderedDict(b=1, a=2)
    assert tu.tree_leaves(ordered) == [1, 2] and tu.tree_map(lambda x: x * 3, ordered) == {"b": 3, "a": 6}
    assert list(tu.tree_map(lambda x: x, ordered)) == ["b", "a"]
    default = collections.defaultdict(list, b=1, a=2)
    leaves, treedef = tu.tree_flatten(default)
    back = tu.tree_unflatten(treedef, [10, 20])
    assert leaves == [2, 1] and back == {"a": 10, "b": 20} and back.default_factory is list

    class Box:
        def __init__(self, v):
            self.v = v
    tu.register_pytree_node(Box, lambda b: ([b.v], None), lambda _, c: Box(*c))
    assert tu.tree_leaves([Box(7), Box((8, 9))]) == [7, 8, 9]
    with pytest.raises(ValueError):
        tu.tree_map(lambda x, y: x, (1, 2), [1, 2])


def test_vjp_and_jvp():
    x = fa.asarray(X)
    out, f_vjp = fa.vjp(lambda a: (fa.sin(a) * 2, fa.sum(a * a)), x)
    (ct,) = f_vjp((fa.ones((3, 4)), fa.asarray(np.float32(3.0))))
    np.testing.assert_allclose(np.asarray(ct), 2 * np.cos(X) + 6 * X, rtol=RTOL, atol=ATOL)
    t = rng.uniform(-1, 1, X.shape).astype(np.float32)

    def f(a, b):
        return fa.sum(fa.exp(fa.sin(a) * b) @ fa.ones((4, 2)), axis=0)
    y, ty = fa.jvp(f, (x, fa.asarray(Y)), (fa.asarray(t), fa.zeros((3, 4))))
    _, want = torch.func.jvp(lambda a: (torch.exp(torch.sin(a) * torch.from_numpy(Y)) @ torch.ones(4, 2)).sum(0),
                             (torch.from_numpy(X),), (torch.from_numpy(t),))
    np.testing.assert_allclose(np.asarray(ty), want.numpy(), rtol=RTOL, atol=ATOL)
    # forward mode through reductions, views, concat, where
    g = lambda a: fa.max(fa.concat([a[:, ::2], fa.where(a > 0, a, 0.0)], axis=1) ** 2, axis=1)  # noqa: E731
    tg = lambda a: (torch.cat([a[:, ::2], torch.where(a > 0, a, 0.0)], 1) ** 2).amax(1)  # noqa: E731
    _, ty = fa.jvp(g, (x,), (fa.asarray(t),))
    _, want = torch.func.jvp(tg, (torch.from_numpy(X),), (torch.from_numpy(t),))
    np.testing.assert_allclose(np.asarray(ty), want.numpy(), rtol=RTOL, atol=ATOL)


def test_stop_gradient_stops_complex_values_too():
    """A complex value under stop_gradient is a constant of the derivative (JAX): nothing flows through it, so
    nothing complex is differentiated and nothing is refused."""
    x = fa.asarray(np.array([0.3, -0.7]))

    def f(a):
        return fa.sum(fa.real(fa.stop_gradient(a * (1 + 1j))) * a) + fa.sum(a)
    np.testing.assert_allclose(np.asarray(fa.grad(f)(x)), np.asarray(x) + 1, rtol=1e-12)
    _, t = fa.jvp(f, (x,), (fa.ones(2, dtype=fa.float64),))
    np.testing.assert_allclose(float(t), float(np.sum(np.asarray(x) + 1)), rtol=1e-12)


def test_a_complex_value_evaluated_inside_a_transform_is_refused_on_every_call():
    """Evaluating a real function of a complex intermediate inside fa.grad/jvp (a print, np.asarray): the plan
    miss lowers complex to real arithmetic in place, and the derivative used to walk that lowered graph on the
    first call (a value) and the recorded one on the next (a TypeError). It sees the recorded graph both times."""
    x = fa.asarray(np.array([0.3, -0.7]))

    def f(a):
        r = fa.abs(a * (2 - 1j) + 1j)
        np.asarray(r)
        return fa.sum(r)
    fa.clear_caches()   # the first call misses the plan cache
    for call in (1, 2):
        with pytest.raises(TypeError, match="complex"):
            fa.grad(f)(x)
        with pytest.raises(TypeError, match="complex"):
            fa.jvp(f, (x,), (fa.ones(2, dtype=fa.float64),))


def test_stop_gradient_and_closures():
    x = fa.asarray(X)
    g = fa.grad(lambda a: fa.sum(a * fa.stop_gradient(a)))(x)
    np.testing.assert_allclose(np.asarray(g), X, rtol=RTOL)
    # a closed-over value is a constant, even when it is the same array as the argument (as in JAX)
    g = fa.grad(lambda a: fa.sum(a * x))(x)
    np.testing.assert_allclose(np.asarray(g), X, rtol=RTOL)
    y = x * 2.0
    g = fa.grad(lambda a: fa.sum(a * y))(x)
    np.testing.assert_allclose(np.asarray(g), 2 * X, rtol=RTOL)
    # the same array twice: one gradient each
    ga, gb = fa.grad(lambda a, b: fa.sum(a * b * b), argnums=(0, 1))(x, x)
    np.testing.assert_allclose(np.asarray(ga), X * X, rtol=RTOL)
    np.testing.assert_allclose(np.asarray(gb), 2 * X * X, rtol=RTOL)


def test_custom_vjp_and_jvp():
    @fa.custom_vjp
    def clip_grad(x):
        return x * 1.0

    def fwd(x):
        return x * 1.0, None

    def bwd(_, g):
        return (fa.clip(g, -0.5, 0.5),)
    clip_grad.defvjp(fwd, bwd)
    g = fa.grad(lambda a: fa.sum(clip_grad(a) * 3.0))(fa.asarray(X))
    np.testing.assert_allclose(np.asarray(g), np.full(X.shape, 0.5), rtol=RTOL)

    @fa.custom_jvp
    def softplus(x):
        return fa.log1p(fa.exp(x))

    @softplus.defjvp
    def softplus_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return softplus(x), t * fa.sigmoid(x) * 2.0  # deliberately twice the true derivative
    g = fa.grad(lambda a: fa.sum(softplus(a)))(fa.asarray(X))
    np.testing.assert_allclose(np.asarray(g), 2 / (1 + np.exp(-X)), rtol=RTOL)
    _, t = fa.jvp(lambda a: softplus(a), (fa.asarray(X),), (fa.ones((3, 4)),))
    np.testing.assert_allclose(np.asarray(t), 2 / (1 + np.exp(-X)), rtol=RTOL)
    with pytest.raises(TypeError, match="forward-mode"):
        fa.jvp(lambda a: clip_grad(a), (fa.asarray(X),), (fa.ones((3, 4)),))


def test_fusion_count():
    x = fa.asarray(rng.uniform(-1, 1, (64,)).astype(np.float32))
    f = lambda a: fa.sum(fa.exp(fa.sin(a) * 2 + 1) * a)  # noqa: E731
    g = fa.grad(f)(x)
    fa.reset_stats()
    fa.eval(g)
    assert fa.stats()["kernels_launched"] <= 2, fa.stats()


def test_jit_of_grad():
    def loss(w, x):
        return fa.mean(fa.tanh(x @ w) ** 2)
    step = fa.jit(fa.grad(loss))
    for seed in range(3):  # replays with new data must see the new data
        r = np.random.default_rng(seed)
        w, x = r.uniform(-1, 1, (3, 2)).astype(np.float32), r.uniform(-1, 1, (4, 3)).astype(np.float32)
        got = step(torch.from_numpy(w), torch.from_numpy(x))
        want = fa.grad(loss)(fa.asarray(w), fa.asarray(x))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)
    assert len(step.cache) == 1
    vg = fa.jit(fa.value_and_grad(lambda a: fa.sum(fa.sin(a) * a)))
    v, g = vg(torch.from_numpy(X))
    np.testing.assert_allclose(np.asarray(g), np.sin(X) + X * np.cos(X), rtol=RTOL, atol=ATOL)


def test_deep_graph():
    """The transform walks iteratively: recording the gradient of a 10^4-deep chain works. (Evaluating one
    that deep hits the scheduler's recursive lowering, schedule.py, forward or backward alike: 200 here.)"""
    def f(a, depth):
        for _ in range(depth):
            a = fa.sin(a) * 1.0001
        return a
    g = fa.grad(f)(fa.asarray(np.float32(0.5)), 10000)
    assert g.shape == ()
    x = torch.tensor(0.5, requires_grad=True)
    y = x
    for _ in range(200):
        y = torch.sin(y) * 1.0001
    y.backward()
    np.testing.assert_allclose(float(fa.grad(f)(fa.asarray(np.float32(0.5)), 200)), x.grad.item(), rtol=1e-4)


def test_errors():
    x = fa.asarray(X)
    with pytest.raises(TypeError, match="scalar"):
        fa.grad(lambda a: a * 2)(x)
    with pytest.raises(TypeError, match="real-valued"):
        fa.grad(lambda a: fa.sum(a.astype(fa.float32)))(fa.arange(3))
    with pytest.raises(TypeError, match="real-valued"):
        fa.grad(lambda a: fa.sum(a > 0))(x)
    with pytest.raises(TypeError, match="pair"):
        fa.grad(lambda a: fa.sum(a), has_aux=True)(x)
    with pytest.raises(TypeError, match="must return arrays"):
        fa.grad(lambda a: (fa.sum(a), 1))(x)
    with pytest.raises(TypeError, match="scalar array"):
        fa.grad(lambda a: (fa.sum(a), a))(x)
    with pytest.raises(ValueError, match="argnums"):
        fa.grad(lambda a: fa.sum(a), argnums=2)(x)
    # integer inputs that are not differentiated are fine; vjp gives them None
    g = fa.grad(lambda a, n: fa.sum(a * n.astype(fa.float32)))(x, fa.arange(4))
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(np.arange(4, dtype=np.float32), X.shape))
    _, pull = fa.vjp(lambda a, n: a * n.astype(fa.float32), x, fa.arange(4))
    assert pull(fa.ones((3, 4)))[1] is None


def test_grad_of_grad():
    d2 = fa.grad(fa.grad(lambda a: fa.sin(a) * a))(fa.asarray(np.float32(0.7)))
    np.testing.assert_allclose(float(d2), 2 * np.cos(0.7) - 0.7 * np.sin(0.7), rtol=1e-5)


def test_interpret_backend(interpret):
    x = rng.uniform(-1, 1, (4, 8)).astype(np.float32)
    w = rng.uniform(-1, 1, (8,)).astype(np.float32)
    _check(lambda a, b: fa.sum(fa.nn.softmax(a * b) * fa.silu(a)),
           lambda a, b: (torch.softmax(a * b, -1) * torch.nn.functional.silu(a)).sum(), x, w)
    _check(lambda a: fa.sum(fa.concat([a[::3], a.mT[::2]], axis=0) ** 2) + fa.max(a),
           lambda a: (torch.cat([a[::3], a.mT[::2]], 0) ** 2).sum() + a.max(), x[:, :4])
    _check(lambda a: fa.sum(fa.prod(fa.exp(a * 0.1), axis=1)), lambda a: torch.exp(a * 0.1).prod(1).sum(), x)


def test_library_ops_more():
    from flyarray import ad_rules
    # ragged_dot: lhs through our kernel's transpose, rhs through group masks
    lhs = rng.uniform(-1, 1, (6, 4)).astype(np.float32)
    rhs = rng.uniform(-1, 1, (3, 4, 5)).astype(np.float32)
    gs = np.array([2, 0, 3], np.int32)

    def t_ragged(a, b):
        rows = [a[0:2] @ b[0], a[2:2] @ b[1], a[2:5] @ b[2], torch.zeros(1, 5)]
        return torch.sin(torch.cat(rows)).sum()
    _check(lambda a, b: fa.sum(fa.sin(fa.ragged_dot(a, b, fa.asarray(gs)))), t_ragged, lhs, rhs)
    # softmax_top_k through its formulation
    x = rng.uniform(-2, 2, (3, 8)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 2)).astype(np.float32)

    def t_stk(a):
        p = torch.softmax(a, -1)
        v, _ = torch.topk(p, 2)
        return ((v / v.sum(-1, keepdim=True)) * torch.from_numpy(w)).sum()
    _check(lambda a: fa.sum(fa.nn.softmax_top_k(a, 2, renormalize=True)[0] * fa.asarray(w)), t_stk, x)
    # the long-row softmax library op: its backward library op (softmax_bwd)
    _check(lambda a: fa.sum(fa.nn.long_row_softmax(a, log=True)[:, :3] * fa.asarray(w[:, :1])),
           lambda a: (torch.log_softmax(a, -1)[:, :3] * torch.from_numpy(w[:, :1])).sum(), x)
    # matmul_epilogue (made by the scheduler; differentiated through its formulation if ever seen)
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((3, 4), (4, 5)))
    bias = rng.uniform(-1, 1, (5,)).astype(np.float32)
    got = fa.vjp(lambda p, q, c: ad_rules._epilogue_formulation(p, q, c, activation="gelu", has_bias=True,
                                                                   has_residual=False, out_dtype="float32")[0],
                 fa.asarray(a), fa.asarray(b), fa.asarray(bias))[1](fa.ones((3, 5)))
    want = _torch_grads(lambda p, q, c: torch.nn.functional.gelu(p @ q + c).sum(), a, b, bias)
    for g, wt in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), wt, rtol=RTOL, atol=ATOL)
    # forward mode through a library op's formulation (top_k)
    t = rng.uniform(-1, 1, x.shape).astype(np.float32)
    _, ty = fa.jvp(lambda a: fa.top_k(a, 3)[0], (fa.asarray(x),), (fa.asarray(t),))
    _, want = torch.func.jvp(lambda a: torch.topk(a, 3)[0], (torch.from_numpy(x),), (torch.from_numpy(t),))
    np.testing.assert_allclose(np.asarray(ty), want.numpy(), rtol=RTOL, atol=ATOL)


def test_custom_vjp_nondiff_argnums():
    """JAX's nondiff_argnums: bwd(*nondiff_args, residuals, g) gives cotangents for the other arguments."""
    import functools

    @functools.partial(fa.custom_vjp, nondiff_argnums=(0, 2))
    def apply(f, x, limit):
        return f(x)

    def apply_fwd(f, x, limit):
        return apply(f, x, limit), x

    def apply_bwd(f, limit, x, g):
        return (fa.clip(g * fa.cos(x), -limit, limit),)  # the true derivative of sin, clipped
    apply.defvjp(apply_fwd, apply_bwd)
    x = fa.asarray(X)
    np.testing.assert_allclose(np.asarray(apply(fa.sin, x, 0.5)), np.sin(X), rtol=RTOL)
    g = fa.grad(lambda a: fa.sum(apply(fa.sin, a, 0.5) * 2.0))(x)
    np.testing.assert_allclose(np.asarray(g), np.clip(2 * np.cos(X), -0.5, 0.5), rtol=RTOL)
    per_row = fa.vmap(fa.grad(lambda a: fa.sum(apply(fa.sin, a, 0.5) * 2.0)))(x)  # the rule survives vmap
    np.testing.assert_allclose(np.asarray(per_row), np.clip(2 * np.cos(X), -0.5, 0.5), rtol=RTOL)
    g = fa.grad(lambda a: fa.sum(fa.jit(lambda b: apply(fa.sin, b, 0.5))(a)))(x)  # and jit tracing through
    np.testing.assert_allclose(np.asarray(g), np.clip(np.cos(X), -0.5, 0.5), rtol=RTOL)

    bad = fa.custom_vjp(lambda f, x: f(x), nondiff_argnums=0)
    bad.defvjp(lambda f, x: (f(x), x), lambda f, x, g: (g, g))  # one cotangent too many
    with pytest.raises(TypeError, match=r"one cotangent per argument not in nondiff_argnums \(1\).*length 2"):
        fa.grad(lambda a: fa.sum(bad(fa.sin, a)))(x)
    with pytest.raises(ValueError, match="nondiff_argnums names argument 3.*2 argument"):
        fa.custom_vjp(lambda f, x: f(x), nondiff_argnums=3).defvjp(lambda f, x: (f(x), x), lambda *a: a)(fa.sin, x)
    with pytest.raises(TypeError, match="nondiff_argnums must be ints"):
        fa.custom_vjp(lambda f, x: f(x), nondiff_argnums=("f",))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_gradients_of_slices_of_one_array_match_torch(data):
    """grad through several slices of one array (disjoint, overlapping, strided, reversed order): the
    padded cotangents are joined as one concat where they do not overlap (ad_rules.merged_pads), added
    where they do; torch autograd agrees."""
    n = data.draw(st.integers(2, 7))
    cuts = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(1, n), st.integers(1, 2)),
                              min_size=1, max_size=4))
    slices = [slice(a, max(a + 1, b), step) for a, b, step in cuts]
    weights = [float(w) for w in data.draw(st.lists(st.integers(-3, 3), min_size=len(slices),
                                                       max_size=len(slices)))]
    x = np.random.default_rng(len(cuts)).standard_normal((3, n)).astype(np.float32)

    def loss(a, lib):
        total = 0.0
        for w, s in zip(weights, slices):
            total = total + lib.sum(lib.sin(a[:, s]) * w)
        return total
    got = fa.grad(lambda a: loss(a, fa))(fa.asarray(x))
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    loss(t, torch).backward()
    np.testing.assert_allclose(np.asarray(got), t.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_gradient_of_a_stacked_qkv_is_written_by_the_attention_backward():
    """q, k, v sliced from one stacked array: their cotangents join as one concat (no zero padding, no
    additions), which attention's backward writes directly: no fused kernel after it."""
    torch.manual_seed(0)
    stacked = torch.randn(2, 8, 3, 2, 16)
    w = torch.randn(2, 8, 2, 16)

    def loss(qkv):
        out = fa.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True)
        return fa.sum(out * fa.asarray(w))
    grad = fa.grad(loss)
    fa.eval(grad(fa.asarray(stacked)))
    with fa.profile() as profile:
        g = grad(fa.asarray(stacked))
        fa.eval(g)
    names = [r.name for r in profile.rows]
    assert not [n for n in names if n.startswith("fused") and "multiply" not in n], names
    t = stacked.clone().requires_grad_()
    q, k, v = (t[:, :, i].transpose(1, 2) for i in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    (out * w).sum().backward()
    torch.testing.assert_close(g.torch(), t.grad, rtol=1e-5, atol=1e-5)


def test_vjp_refuses_complex_primals_as_grad_does():
    """fa.vjp with a complex primal raised nothing and its vjp_fn returned (None,): now refused by name,
    as fa.grad refuses it (integer primals still get None)."""
    x = fa.asarray(np.arange(6.0).reshape(2, 3).astype(np.complex64))
    with pytest.raises(TypeError, match="vjp: primal leaf 0 is fa.complex64"):
        fa.vjp(lambda a: a * 2, x)
    out, pull = fa.vjp(lambda a, n: a * 2, fa.asarray(np.ones(3, np.float32)), fa.asarray(np.arange(3)))
    grads = pull(fa.ones_like(out))
    assert grads[1] is None and np.allclose(np.asarray(grads[0]), 2.0)


_SCHEDULER_LOOPS = '''
import numpy as np, flyarray as fa
x = fa.asarray(np.array([0.5, 0.75]))
f = lambda a: fa.sum(fa.min(fa.roll(fa.stack([a, a], axis=-1), 0), axis=-1))
np.testing.assert_array_equal(np.asarray(fa.grad(f)(x)), [1.0, 1.0])
y = fa.asarray(np.random.default_rng(0).standard_normal((1, 2, 3)))
idx = fa.asarray(np.array([0]))
def g(a):
    a = a.at[idx].add(a[idx])
    a = fa.nn.softmax(a, axis=-2)
    return fa.sum(fa.nn.softmax(a, axis=0) * y)
np.testing.assert_allclose(np.asarray(fa.grad(g)(y)), np.zeros((1, 2, 3)), atol=1e-12)
x = np.array([[-0.11, 1.07, -0.06], [1.85, 0.26, 0.16]])
w = fa.asarray(np.random.default_rng(0).standard_normal((4, 4, 7)))
def h(a):
    a = fa.min(fa.stack([a, fa.cos(a), a], axis=-1), axis=(0,), keepdims=True)
    return fa.sum(fa.roll(fa.pad(a, ((1, 2), (1, 0), (2, 2)), constant_values=1.5), -4, axis=2) * w)
v, dx = fa.value_and_grad(h)(fa.asarray(x))
np.asarray(dx)  # the gradient first: v's plan then copies a realized reduction into a concat
assert float(v) == float(h(fa.asarray(x)))
print("ok")
'''


def test_gradients_whose_kernels_asked_for_themselves_finish():
    """Fuzzer-found backward graphs: two (a min over ties after a no-op roll; a scatter-add of a gather
    under two softmaxes) where a kernel's row-reduction domain could not store its own root, which then
    asked for its kernel again forever; one where a concat part was a realized reduction (IndexError).
    In a subprocess, so a regression fails instead of hanging."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", _SCHEDULER_LOOPS], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_forward_mode_through_integer_valued_library_ops():
    """searchsorted's indices and mx_quantize's codes carry no derivative: jvp treats them as constants
    (as grad does), instead of asking for a forward rule they cannot need."""
    edges = fa.asarray(np.array([0.0, 1.0]))
    f = lambda a: a * fa.searchsorted(edges, a).astype(a.dtype)  # noqa: E731
    x = fa.asarray(np.array([0.5, 2.0]))
    np.testing.assert_allclose(np.asarray(fa.jvp(f, (x,), (fa.ones(2, dtype=fa.float64),))[1]), [1.0, 2.0])
    w = fa.asarray(np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32))
    qd = lambda a: fa.quant.mx_dequantize(*fa.quant.mx_quantize(a, "e4m3"), "e4m3") + a  # noqa: E731
    np.testing.assert_array_equal(np.asarray(fa.jvp(qd, (w,), (fa.ones_like(w),))[1]), np.ones((2, 32)))


def test_attention_without_keys_in_forward_mode_and_second_order():
    q = fa.asarray(np.ones((1, 3, 1, 4), np.float32))
    k = v = fa.asarray(np.ones((1, 0, 1, 4), np.float32))
    f = lambda a: fa.nn.dot_product_attention(a, k, v)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(fa.jvp(f, (q,), (q,))[1]), np.zeros((1, 3, 1, 4)))
    gg = fa.grad(lambda a: fa.sum(fa.grad(lambda b: fa.sum(f(b) ** 2))(a)))(q)
    np.testing.assert_array_equal(np.asarray(gg), np.zeros((1, 3, 1, 4)))


def test_clip_gradient_at_a_bound_does_not_depend_on_how_the_bound_is_given():
    x = fa.asarray(np.array([0.0, 0.5, 1.0, -1.0, 2.0]))
    want = np.array([1.0, 1.0, 1.0, 0.0, 0.0])  # torch's clamp: x keeps its gradient at the bounds
    for lo, hi in ((0.0, 1.0), (fa.asarray(0.0), fa.asarray(1.0))):
        np.testing.assert_array_equal(np.asarray(fa.grad(lambda a: fa.sum(fa.clip(a, lo, hi)))(x)), want)


def test_truncated_normal_differentiates_in_its_bounds_in_both_modes():
    key = fa.random.key(9)
    f = lambda lo: fa.sum(fa.random.truncated_normal(key, lo, 1.7, (6,), dtype=fa.float64))  # noqa: E731
    lo = fa.asarray(np.float64(0.3))
    reverse = float(fa.grad(f)(lo))
    forward = float(fa.jvp(f, (lo,), (fa.asarray(np.float64(1.0)),))[1])
    h = 1e-6
    central = (float(f(fa.asarray(np.float64(0.3 + h)))) - float(f(fa.asarray(np.float64(0.3 - h))))) / (2 * h)
    assert np.isfinite(reverse) and abs(reverse - forward) < 1e-9 and abs(reverse - central) < 1e-4


def test_attention_with_heads_wider_than_the_kernels_matches_torch(backend):
    """head_dim 300 (the kernels stop at 256): fa.nn computes it with fused primitives, value and gradient."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 3, 2, 300)).astype(np.float32) for _ in range(3))
    f = lambda a: fa.sum(fa.nn.dot_product_attention(a, fa.asarray(k), fa.asarray(v), is_causal=True) ** 2)  # noqa: E731
    tq, tk, tv = (torch.from_numpy(t.copy()).transpose(1, 2) for t in (q, k, v))
    tq.requires_grad_()
    want = (torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True) ** 2).sum()
    want.backward()
    np.testing.assert_allclose(float(f(fa.asarray(q))), want.item(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(fa.grad(f)(fa.asarray(q))), tq.grad.transpose(1, 2).numpy(),
                               rtol=1e-4, atol=1e-5)


def test_logaddexp_gradient_where_the_answer_is_infinite():
    inf = np.inf
    a = np.array([inf, inf, -inf, -inf, 1.0, np.nan])
    b = np.array([1.0, inf, -inf, 1.0, 1.0, 1.0])
    ga, gb = fa.grad(lambda x, y: fa.sum(fa.logaddexp(x, y)), argnums=(0, 1))(fa.asarray(a), fa.asarray(b))
    np.testing.assert_allclose(np.asarray(ga), [1.0, 0.5, 0.5, 0.0, 0.5, np.nan], rtol=1e-15)  # JAX's values
    np.testing.assert_allclose(np.asarray(gb), [0.0, 0.5, 0.5, 1.0, 0.5, np.nan], rtol=1e-15)


def test_jvp_refuses_a_complex_primal_as_vjp_does():
    z = fa.asarray(np.array([1 + 2j, 0.5 - 1j]))
    with pytest.raises(TypeError, match="jvp: primal leaf 0 is fa.complex128; derivatives with respect to complex"):
        fa.jvp(lambda q: q * q, (z,), (z,))


def test_jvp_takes_none_as_an_integer_primals_tangent_and_refuses_a_float_one():
    i, x = fa.asarray(np.arange(3)), fa.asarray(np.ones(3))
    out, t = fa.jvp(lambda a, b: a * b, (i, x), (None, fa.ones_like(x)))
    np.testing.assert_array_equal(np.asarray(t), np.arange(3.0))
    with pytest.raises(TypeError, match="jvp: primal leaf 0 is fa.int64, which has no derivative: pass None"):
        fa.jvp(lambda a: a * 1.5, (i,), (fa.ones(3),))


def test_custom_jvp_rule_may_give_a_constant_tangent_under_grad():
    """A rule whose tangent output is a number or numpy array (a declared-constant derivative) works in
    reverse mode too, where the rule is differentiated: its gradient is zero."""
    x = fa.asarray(np.array([1.0, 2.0, 3.0]))
    frozen = fa.custom_jvp(lambda q: fa.sum(q))
    frozen.defjvp(lambda p, t: (frozen(p[0]), 0.0))
    np.testing.assert_array_equal(np.asarray(fa.grad(frozen)(x)), np.zeros(3))
    assert float(fa.jvp(frozen, (x,), (fa.ones(3, dtype=fa.float64),))[1]) == 0.0
    bad = fa.custom_jvp(lambda q: q * 2)
    bad.defjvp(lambda p, t: (p[0] * 2, "two"))
    with pytest.raises(TypeError, match="custom_jvp <lambda>: a tangent output must be an array"):
        fa.grad(lambda a: fa.sum(bad(a)))(x)


@pytest.mark.parametrize("make", [fa.grad, fa.value_and_grad, fa.vmap, fa.jit, fa.jacfwd, fa.jacrev, fa.hessian,
                                  fa.custom_vjp, fa.custom_jvp])
def test_transforms_refuse_a_non_function_when_made(make):
    with pytest.raises(TypeError, match="expected a function, got int 42"):
        make(42)


@pytest.mark.parametrize("kwargs, message", [
    (dict(static_argnums=("1",)), "static_argnums must be an int or a sequence of ints, got ('1',)"),
    (dict(static_argnums=True), "static_argnums must be an int or a sequence of ints, got True"),
    (dict(static_argnames=1), "static_argnames must be a str or a sequence of strs, got 1"),
])
def test_jit_checks_its_static_argument_options(kwargs, message):
    with pytest.raises(TypeError, match=re.escape(message)):
        fa.jit(lambda a, n: a * n, **kwargs)


def test_jit_says_a_static_array_argument_is_unhashable_because_it_is_static():
    x = fa.asarray(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="argument 1 is static .* but its value, a Array, is not hashable"):
        fa.jit(lambda a, n: a * n, static_argnums=1)(x, x)


def test_custom_vjp_nondiff_argnums_must_be_ints():
    with pytest.raises(TypeError, match="nondiff_argnums must be an int or a tuple of ints, got None"):
        fa.custom_vjp(lambda a: a, nondiff_argnums=None)


@pytest.mark.parametrize("k, order", [(0, 2), (1, 3), (5, 7), (1.0, 3), (2.0, 4), (3, 2)])
def test_higher_derivatives_of_powers_are_finite_at_zero(k, order):
    """d^n/dx^n x**k at 0: the exact value (0 past the power, k! at n == k), not NaN from 0 * 0**-1 in the
    branch a where does not take (the same answer torch.func gives)."""
    f = lambda a: a ** k   # noqa: E731
    for _ in range(order):
        f = fa.grad(f)
    want = math.factorial(int(k)) if order == k else 0.0
    assert float(f(fa.asarray(np.float64(0.0)))) == want


def test_second_derivatives_of_the_two_norm_at_zero_entries():
    """vector_norm and matrix_norm('fro') are smooth where an entry (not the norm) is 0: the Hessian is
    (I - x x^T / |x|^2) / |x| there too (|x| * |x| had abs's derivative 0 at 0 in it)."""
    x = np.array([0.0, 1.0, 2.0])
    n = np.linalg.norm(x)
    want = (np.eye(3) - np.outer(x, x) / n ** 2) / n
    np.testing.assert_allclose(np.asarray(fa.hessian(fa.linalg.vector_norm)(fa.asarray(x))), want, rtol=1e-12)
    m = x.reshape(3, 1)
    got = np.asarray(fa.hessian(fa.linalg.matrix_norm)(fa.asarray(m))).reshape(3, 3)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    z = np.array([0.0 + 0.0j, 3.0 + 4.0j])   # complex: the parts' squares, the same value
    np.testing.assert_allclose(float(fa.linalg.vector_norm(fa.asarray(z))), 5.0, rtol=1e-12)


def test_structure_and_dtype_mistakes_in_jvp_and_vjp_are_named():
    x = fa.asarray(np.ones(4))
    with pytest.raises(ValueError, match=r"jvp: got 1 primal\(s\) and 2 tangent\(s\)"):
        fa.jvp(lambda a: a * 2, (x,), (x, x))
    with pytest.raises(ValueError, match="jvp: the tangents"):
        fa.jvp(lambda a: a * 2, ((x, x),), ([x, x],))
    with pytest.raises(TypeError, match="jvp: tangent leaf 0 is fa.float32, its primal fa.float64"):
        fa.jvp(lambda a: a * 2, (x,), (fa.asarray(np.ones(4, np.float32)),))
    with pytest.raises(ValueError, match="vjp_fn: the cotangent"):
        fa.vjp(lambda a: (a * 2, a), x)[1](x)
    with pytest.raises(TypeError, match="^grad"):
        fa.grad(lambda a: 1.0)(x)


def test_custom_jvp_of_a_linear_function_whose_rule_calls_itself(backend):
    """A linear f with the rule (f(x), f(t)) (valid, and JAX's usual form): reverse mode recorded the rule, whose
    f(t) was another custom call, transposed by recording the rule again: RecursionError. Inside its own rule's
    recording, f is its body."""
    @fa.custom_jvp
    def lin(x):
        return 2 * fa.cumulative_sum(x)

    @lin.defjvp
    def _(primals, tangents):
        return lin(*primals), lin(*tangents)

    x = fa.asarray(np.arange(4.0))
    assert np.asarray(fa.jvp(lin, (x,), (fa.ones(4, dtype=fa.float64),))[1]).tolist() == [2, 4, 6, 8]
    assert np.asarray(fa.grad(lambda a: fa.sum(lin(a)))(x)).tolist() == [8, 6, 4, 2]
    assert np.asarray(fa.grad(lambda a: fa.sum(lin(lin(a))))(x)).tolist() == [40, 24, 12, 4]


def test_custom_jvp_whose_tangent_map_cannot_be_transposed_says_so(backend):
    """Reverse mode of a custom_jvp differentiates its tangent map; a map through fa.linalg.solve (no derivative
    rule) failed naming solve alone. The error names the custom_jvp and the way out."""
    @fa.custom_jvp
    def mysolve(a, y):
        return fa.linalg.solve(a, y)

    @mysolve.defjvp
    def _(primals, tangents):
        (a, y), (ta, ty) = primals, tangents
        x = fa.linalg.solve(a, y)
        return x, fa.linalg.solve(a, ty - ta @ x)

    a = fa.asarray(np.array([[3.0, 1.0], [1.0, 2.0]]))
    y = fa.asarray(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="custom_jvp mysolve: reverse mode.*solve.*custom_vjp"):
        fa.grad(lambda b: fa.sum(mysolve(a, b)))(y)
    with pytest.raises(TypeError, match="real-to-complex cast"):
        fa.grad(lambda v: fa.real(fa.sum(fa.fft.fft(v))))(y)


def test_vector_norm_and_cross_errors_name_their_function():
    with pytest.raises(ValueError, match="vector_norm: axis 2 is out of range"):
        fa.linalg.vector_norm(fa.ones((2, 2)), axis=2)
    with pytest.raises(ValueError, match="they must both be 3"):
        fa.linalg.cross(fa.ones((3, 4)), fa.ones((3, 4)))


@pytest.mark.parametrize("name,fn,tfn", [
    ("vector_norm", lambda v: fa.linalg.vector_norm(v), lambda t: torch.linalg.vector_norm(t)),
    ("vector_norm ord 3", lambda v: fa.linalg.vector_norm(v, ord=3), lambda t: torch.linalg.vector_norm(t, ord=3)),
    ("matrix_norm", lambda v: fa.linalg.matrix_norm(v.reshape(2, 2)), lambda t: torch.linalg.matrix_norm(t.reshape(2, 2))),
    ("std", lambda v: fa.std(v), lambda t: torch.std(t, correction=0)),
    ("std ddof 1", lambda v: fa.std(v, correction=1), lambda t: torch.std(t, correction=1)),
])
def test_norm_and_std_gradients_are_zero_where_the_root_is_of_zero(name, fn, tfn):
    """The root's slope at 0 is infinite and the sum's 0: the chain rule gave NaN at a zero vector, at a constant
    row, and inf where the squares underflow (1e-25 in float32). 0 there, as torch; elsewhere unchanged."""
    for values in ([0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0], [1e-25, 2e-25, -1e-25, 3e-25], [3.0, -4.0, 0.5, 1.0]):
        t = torch.tensor(values, dtype=torch.float32)
        if name.startswith("std") and values[0] == 1e-25:
            continue   # torch's std of these is finite (it accumulates in double); ours underflows to 0
        want = torch.func.grad(tfn)(t)
        got = torch.as_tensor(np.asarray(fa.grad(fn)(fa.asarray(t.numpy()))))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"{name} at {values}")


@pytest.mark.parametrize("zeros", [(), (2,), (0, 4), (0, 2, 4)])
def test_at_multiply_with_array_indices_is_differentiable(zeros):
    """x.at[idx].multiply(v) with repeated indices, against the same product written densely (grad and jvp);
    zeros among the values are counted, not divided by. (It raised 'not differentiable yet'; mode='drop' or
    'clip' on a plain int takes this route too, which JAX differentiates.)"""
    rng = np.random.default_rng(7)
    x, v = rng.normal(size=6), rng.normal(size=6)
    v[list(zeros)] = 0.0
    idx = np.array([1, 3, 1, 5, 1, 0])

    def scattered(x, v):
        return fa.sum(fa.sin(x.at[idx].multiply(v)))

    def dense(x, v):
        factors = fa.where(fa.asarray(idx)[:, None] == fa.arange(6)[None, :], v[:, None], 1.0)
        return fa.sum(fa.sin(x * fa.prod(factors, axis=0)))

    args = (fa.asarray(x), fa.asarray(v))
    for got, want in zip(fa.grad(scattered, argnums=(0, 1))(*args), fa.grad(dense, argnums=(0, 1))(*args)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-15)
    tangents = (fa.asarray(rng.normal(size=6)), fa.asarray(rng.normal(size=6)))
    np.testing.assert_allclose(float(fa.jvp(scattered, args, tangents)[1]), float(fa.jvp(dense, args, tangents)[1]),
                               rtol=1e-12)


@pytest.mark.parametrize("mode", [None, "drop", "clip"])
def test_at_int_multiply_is_differentiable_in_every_mode(mode):
    x, v = fa.asarray(np.array([1.0, 2.0, 2.0, 4.0])), fa.asarray(3.0)
    kw = {} if mode is None else {"mode": mode}
    dx, dv = fa.grad(lambda x, v: fa.sum(x.at[2].multiply(v, **kw)), argnums=(0, 1))(x, v)
    np.testing.assert_array_equal(np.asarray(dx), [1.0, 1.0, 3.0, 1.0])   # jax.grad's (a fuzz helper's check)
    assert float(dv) == 2.0


def test_max_gradient_finds_its_position_when_the_backward_recomputes_a_transcendental():
    """The reference backend computed atan2 (atanh, exp2, sigmoid, pow, hypot, logaddexp) with torch's CPU kernels,
    whose vectorized and scalar paths differ by an ulp (4 float64 elements against 8): the backward's recomputed
    atan2 then equalled the forward's max nowhere and the gradient was all 0 (JAX: 0.3824 at the argmax)."""
    y = np.array([2.0, 0.0, 0.0, -1.0])
    g = fa.grad(lambda v: fa.sum(fa.max(fa.atan2(fa.stack([v, v]), 4.3), axis=-1)))(fa.asarray(y))
    want = 2 * 4.3 / (4.3 ** 2 + 2.0 ** 2)   # both rows pick v[0]: d/dv atan2(v, c) = c / (v^2 + c^2), twice
    np.testing.assert_allclose(np.asarray(g), [want, 0, 0, 0], rtol=1e-12)
    rng = np.random.default_rng(0)
    for name in ("atan2", "pow", "hypot", "logaddexp", "atanh", "exp2", "sigmoid"):
        for dtype in (np.float32, np.float64):
            a = rng.uniform(0.1, 0.9, 64).astype(dtype)
            b = rng.uniform(0.5, 2.0, 64).astype(dtype)
            fn = getattr(fa, name) if hasattr(fa, name) else getattr(fa.nn, name)
            args = (a, b) if name in ("atan2", "pow", "hypot", "logaddexp") else (a,)
            whole = np.asarray(fn(*[fa.asarray(v) for v in args]))
            pieces = np.concatenate([np.asarray(fn(*[fa.asarray(v[i:i + 3]) for v in args])) for i in range(0, 64, 3)])
            np.testing.assert_array_equal(whole, pieces, err_msg=f"{name} {np.dtype(dtype).name}")


def test_vjp_fn_refuses_a_cotangent_of_another_dtype_as_jax_does():
    """A float32 cotangent of a float64 output used to come back as a float64 result, silently."""
    x = fa.asarray(np.linspace(0.1, 1.0, 3))
    _, pull = fa.vjp(fa.sin, x)
    for wrong in (fa.ones(3, dtype=fa.float32), np.ones(3, dtype=np.float32), torch.ones(3, dtype=torch.float16)):
        with pytest.raises(TypeError, match="cotangent 0 is .*float.*output 0 is .*float64"):
            pull(wrong)
    expected = np.cos(np.linspace(0.1, 1.0, 3))
    for right in (fa.ones(3, dtype=fa.float64), np.ones(3), torch.ones(3, dtype=torch.float64)):
        np.testing.assert_allclose(np.asarray(pull(right)[0]), expected, rtol=1e-12)
    _, pull_sum = fa.vjp(fa.sum, x)   # a Python scalar is weakly typed: it takes the output's dtype
    (g,) = pull_sum(2.0)
    assert g.dtype == fa.float64 and np.all(np.asarray(g) == 2.0)


@pytest.mark.parametrize("ord", [-2, -1, 0.5, 0.25])
def test_vector_norm_below_one_has_torchs_zero_slope_at_zero_entries(ord):
    """|x|^p for p < 1 has an infinite slope at 0, and times abs's 0 there fa.grad gave NaN at a zero entry
    (for p < 0 the norm is 0 and torch's gradient is 0 everywhere); torch's convention is 0 there."""
    v = np.array([0.0, 1.0, -2.0])
    got = np.asarray(fa.grad(lambda x: fa.linalg.vector_norm(x, ord=ord))(fa.asarray(v)))
    t = torch.tensor(v, requires_grad=True)
    torch.linalg.vector_norm(t, ord=ord).backward()
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, atol=0)
    np.testing.assert_allclose(np.asarray(fa.linalg.vector_norm(fa.asarray(v), ord=ord)),
                               np.linalg.norm(v, ord=ord), rtol=1e-12)


def test_norms_of_large_ints_and_16_bit_spectral_norms():
    """int64 magnitudes of 9e18: float32 squares overflowed to inf though the norm fits float32 (now float64
    inside); matrix_norm(ord=2 | -2 | 'nuc') of float16 refused in svdvals' words (now float32 inside)."""
    big = fa.full((16,), 9 * 10**18, dtype=fa.int64)
    got = fa.linalg.vector_norm(big)
    assert got.dtype is fa.float32 and np.isclose(float(got), 3.6e19, rtol=1e-6)
    assert np.isclose(float(fa.linalg.matrix_norm(big.reshape(4, 4))), 3.6e19, rtol=1e-6)
    m = np.array([[3.0, 1.0], [0.5, 2.0]], np.float32)
    for ord in (2, -2, "nuc"):
        r = fa.linalg.matrix_norm(fa.asarray(m).astype(fa.float16), ord=ord)
        assert r.dtype is fa.float16
        np.testing.assert_allclose(float(r), np.linalg.norm(m.astype(np.float16).astype(np.float64), ord=ord), rtol=2e-3)


def test_copysign_derivative_is_zero_at_signed_zeros_as_abs_and_torch():
    """copysign(x, 1) is abs(x): its derivative at +-0 was +-1 (x's sign bit), abs's and torch's are 0."""
    x = np.array([0.0, -0.0, 2.0, -3.0])
    for y in (1.0, -1.0):
        got = np.asarray(fa.grad(lambda a: fa.sum(fa.copysign(a, y)))(fa.asarray(x)))
        t = torch.tensor(x, requires_grad=True)
        torch.copysign(t, torch.tensor(y, dtype=torch.float64)).sum().backward()
        np.testing.assert_array_equal(got, t.grad.numpy())
        _, tangent = fa.jvp(lambda a: fa.copysign(a, y), (fa.asarray(x),), (fa.ones(4, dtype=fa.float64),))
        np.testing.assert_array_equal(np.asarray(tangent), t.grad.numpy())


def test_a_real_array_meeting_a_complex_one_is_named_as_such_under_grad():
    """The refusal blamed fa.fft's functions when no fft was called (a helper's derivative round)."""
    with pytest.raises(TypeError, match=r"a real-to-complex cast \(a real array meeting a complex one, or fa.fft"):
        fa.grad(lambda a: fa.sum(fa.real(a * (1 + 1j))))(fa.asarray(np.array([1.0, 2.0])))
