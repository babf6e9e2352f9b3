"""Every differentiable primitive and library op, in float64 over hypothesis-drawn shapes: fa.grad against
torch.func.grad, fa.jvp against central finite differences of flyarray's own forward.

Which primitives are covered is derived from flyarray.primitives (ELEMENTWISE, REDUCE, LIBRARY), not
listed by hand: a primitive with a float output (or a library op) that has no case here fails
``test_every_differentiable_primitive_is_covered``, so a new one needs a derivative rule *and* a case.
Skipped, by rule: bool/index outputs (comparisons, logical_*, is*, signbit, any, all, argmax, argmin)
and integer-only inputs (bitwise_*, shifts, the random-bit primitives): no derivative exists.
"""
import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flyarray as fa
from flyarray import ad_rules
from flyarray.ops.decompositions import DECOMPOSITIONS
from flyarray.primitives import ELEMENTWISE, LIBRARY, REDUCE

from .conftest import scaled

F = torch.nn.functional
EXAMPLES = scaled(4)  # per primitive: the whole file takes seconds (FLYARRAY_HYPOTHESIS_SCALE multiplies it)


def _no_derivative(prim) -> bool:
    """A primitive no derivative can exist for: bool/index output, or integer-only inputs."""
    return getattr(prim, "out", None) in ("bool", "index") or getattr(prim, "accepts", None) in ("int_bool", "integer")


# ---- elementwise: name -> (fa fn, torch fn or None, domain of each float argument) ------------------------
R, POS, UNIT, BIG = (-2.0, 2.0), (0.5, 2.0), (-0.9, 0.9), (1.2, 3.0)
ZERO_GRAD = "the derivative is 0 almost everywhere; torch has no derivative for it"


def _t(name):
    return getattr(torch, name)


ELEMENTWISE_CASES = {
    **{n: (getattr(fa, n), _t(n), (R,)) for n in (
        "exp", "exp2", "sin", "cos", "erf", "erfc", "sigmoid", "tanh", "asinh", "atan", "cosh", "sinh", "expm1", "relu",
        "negative", "positive", "abs", "square", "sign", "floor", "ceil", "trunc", "round")},
    **{n: (getattr(fa, n), _t(n), (POS,)) for n in ("log", "log2", "log10", "sqrt", "rsqrt", "log1p", "reciprocal")},
    **{n: (getattr(fa, n), _t(n), (UNIT,)) for n in ("acos", "asin", "atanh", "tan")},
    "acosh": (fa.acosh, torch.acosh, (BIG,)),
    "silu": (fa.silu, F.silu, (R,)),
    "gelu": (fa.gelu, F.gelu, (R,)),
    "gelu_tanh": (lambda x: fa.gelu(x, approximate=True), lambda x: F.gelu(x, approximate="tanh"), (R,)),
    **{n: (getattr(fa, n), _t(n), (R, R)) for n in (
        "add", "subtract", "multiply", "maximum", "minimum", "atan2", "hypot", "copysign", "logaddexp")},
    "divide": (fa.divide, torch.divide, (R, POS)),
    "remainder": (fa.remainder, torch.remainder, (R, POS)),
    "pow": (fa.pow, torch.pow, (POS, R)),
    "floor_divide": (fa.floor_divide, None, (R, POS)),
    "nextafter": (fa.nextafter, None, (R, R)),
    "where": (lambda a, b: fa.where(a > b, a * b, b - a), lambda a, b: torch.where(a > b, a * b, b - a), (R, R)),
    "astype": (lambda a: fa.sin(a).astype(fa.float32).astype(fa.float64) * a,
               lambda a: torch.sin(a).float().double() * a, (R,)),
}
LOOSE = {"astype"}
NOT_BY_DIFFERENCES = {  # checked against flyarray's documented rule instead of finite differences
    "nextafter": "it moves x by one ulp, so differences see the identity in x; flyarray's rule is 0 "
                 "(docs/transforms.md), as for the other float-grid ops, and torch and JAX define none",
}  # a float32 round trip inside: float32 tolerances


def _values(seed, shapes, domains):
    rng = np.random.default_rng(seed)
    return [rng.uniform(lo, hi, s) for s, (lo, hi) in zip(shapes, domains)]


def _check_grad(f, tf, xs, rtol=1e-9, atol=1e-12):
    """fa.grad of sum(f(xs) * w) against torch.func.grad in float64 (tf None: the gradient is 0)."""
    out_shape = np.asarray(f(*map(fa.asarray, xs))).shape
    w = np.random.default_rng(1).uniform(0.5, 1.5, out_shape)
    argnums = tuple(range(len(xs)))
    got = fa.grad(lambda *a: fa.sum(f(*a) * fa.asarray(w.astype(xs[0].dtype))), argnums=argnums)(*map(fa.asarray, xs))
    if tf is None:
        want = [np.zeros(x.shape) for x in xs]
    else:
        want = torch.func.grad(lambda *a: (tf(*a) * torch.from_numpy(w)).sum(), argnums=argnums)(*_torch64(xs))
        want = [t.numpy() for t in want]
    for g, wt, x in zip(got, want, xs):
        assert g.shape == x.shape and np.asarray(g).dtype == x.dtype
        np.testing.assert_allclose(np.asarray(g), wt, rtol=rtol, atol=atol)


def _torch64(xs):
    return [torch.from_numpy(x.astype(np.float64)) for x in xs]


def _tangents(xs):
    return [np.random.default_rng(2).uniform(-1, 1, x.shape).astype(x.dtype) for x in xs]


def _check_jvp(f, xs, rtol=1e-5, atol=1e-7, h=1e-6):
    """fa.jvp along a random tangent against the central difference of f in float64."""
    ts = _tangents(xs)
    _, got = fa.jvp(f, tuple(map(fa.asarray, xs)), tuple(map(fa.asarray, ts)))
    plus = np.asarray(f(*[fa.asarray(x + h * t) for x, t in zip(xs, ts)]))
    minus = np.asarray(f(*[fa.asarray(x - h * t) for x, t in zip(xs, ts)]))
    np.testing.assert_allclose(np.asarray(got), (plus - minus) / (2 * h), rtol=rtol, atol=atol)


def _check_jvp_torch(f, tf, xs, rtol, atol):
    """fa.jvp against torch.func.jvp in float64 (for float32-only ops, where differences are too noisy)."""
    ts = _tangents(xs)
    _, got = fa.jvp(f, tuple(map(fa.asarray, xs)), tuple(map(fa.asarray, ts)))
    _, want = torch.func.jvp(tf, tuple(_torch64(xs)), tuple(_torch64(ts)))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(ELEMENTWISE_CASES))
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_elementwise(name, data):
    f, tf, domains = ELEMENTWISE_CASES[name]
    if len(domains) == 1:
        shapes = [data.draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=4), label="shape")]
    else:
        shapes = list(data.draw(hnp.mutually_broadcastable_shapes(num_shapes=len(domains), min_dims=0, max_dims=3,
                                                                  max_side=4), label="shapes").input_shapes)
    xs = _values(data.draw(st.integers(0, 2 ** 16), label="seed"), shapes, domains)
    loose = name in LOOSE  # float32 rounding inside: a wide difference step, float32-level tolerances
    _check_grad(f, tf, xs, **({"rtol": 1e-6, "atol": 1e-7} if loose else {}))
    if name in NOT_BY_DIFFERENCES:
        _, t = fa.jvp(f, tuple(map(fa.asarray, xs)), tuple(fa.ones_like(fa.asarray(x)) for x in xs))
        np.testing.assert_array_equal(np.asarray(t), 0.0)
        return
    _check_jvp(f, xs, **({"rtol": 1e-3, "atol": 1e-4, "h": 1e-2} if loose else {}))


# ---- reductions ------------------------------------------------------------------------------------------
def _torch_reduce(name, x, axes, keepdims):
    if name == "prod":  # torch.prod takes one dim: reduce the axes from the last
        for ax in sorted(axes, reverse=True):
            x = x.prod(ax, keepdim=keepdims)
        return x
    fn = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}[name]
    return fn(x, dim=axes, keepdim=keepdims)


@pytest.mark.parametrize("name", sorted(n for n, p in REDUCE.items() if not _no_derivative(p)))
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_reduction(name, data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), label="shape")
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1), label="axes")))
    keepdims = data.draw(st.booleans(), label="keepdims")
    (x,) = _values(data.draw(st.integers(0, 2 ** 16), label="seed"), [shape], [(0.5, 1.5) if name == "prod" else R])
    f = lambda a: getattr(fa, name)(a, axis=axes, keepdims=keepdims)
    _check_grad(f, lambda a: _torch_reduce(name, a, axes, keepdims), [x])
    _check_jvp(f, [x])


# ---- library ops: name -> a builder drawing (fa fn, torch fn, arguments) ---------------------------------
def _sizes(data, n, hi=5):
    return [data.draw(st.integers(1, hi), label=f"size{i}") for i in range(n)]


def _matmul(data):
    m, k, n, b = _sizes(data, 4, 4)
    return fa.matmul, torch.matmul, [(b, m, k), (k, n)]


def _gather(data):
    m, n, j = _sizes(data, 3)
    idx = np.random.default_rng(m * 7 + j).integers(0, m, j)  # repeats: their cotangents add up
    return (lambda x: x[fa.asarray(idx)] ** 2), (lambda x: x[torch.from_numpy(idx)] ** 2), [(m, n)]


def _scatter(data):
    m, n, j = _sizes(data, 3)
    j = min(j, m)
    idx = np.random.default_rng(m + 3 * j).permutation(m)[:j]  # distinct: torch's index_copy needs them
    mode = data.draw(st.sampled_from(["add", "set"]), label="mode")
    ti = torch.from_numpy(idx)
    tf = (lambda x, v: x.index_add(0, ti, v)) if mode == "add" else (lambda x, v: x.index_copy(0, ti, v))
    return (lambda x, v: getattr(x.at[fa.asarray(idx)], mode)(v) * x), (lambda x, v: tf(x, v) * x), [(m, n), (j, n)]


def _top_k(data):
    m, n = _sizes(data, 2, 6)
    k = data.draw(st.integers(1, n), label="k")
    return (lambda x: fa.top_k(x, k)[0]), (lambda x: torch.topk(x, k)[0]), [(m, n)]


def _scan(data):
    """cumulative_sum and cumulative_prod (zeros in the input: tests/test_cumprod_derivatives.py)."""
    m, n = _sizes(data, 2, 6)
    op = data.draw(st.sampled_from(["sum", "prod"]), label="op")
    initial = data.draw(st.booleans(), label="include_initial")
    fa_fn, torch_fn, ident = (fa.cumulative_sum, torch.cumsum, 0.0) if op == "sum" else \
        (fa.cumulative_prod, torch.cumprod, 1.0)

    def tf(x):
        y = torch_fn(x, 1)
        return (torch.cat([torch.full((m, 1), ident, dtype=x.dtype), y], 1) if initial else y) ** 2
    return (lambda x: fa_fn(x, axis=1, include_initial=initial) ** 2), tf, [(m, n)]


def _sort(data):
    m, n = _sizes(data, 2, 6)
    descending = data.draw(st.booleans(), label="descending")
    w = np.random.default_rng(m * 5 + n).uniform(-1, 1, (m, n))  # the cotangent differs per position
    return ((lambda x: fa.sort(x, axis=-1, descending=descending) * fa.asarray(w)),
            (lambda x: torch.sort(x, -1, descending=descending)[0] * torch.from_numpy(w)), [(m, n)])


def _softmax_top_k(data):
    m, n = _sizes(data, 2, 6)
    k = data.draw(st.integers(1, n), label="k")

    def tf(x):
        v = torch.topk(torch.softmax(x, -1), k)[0]
        return v / v.sum(-1, keepdim=True)
    return (lambda x: fa.nn.softmax_top_k(x, k, renormalize=True)[0]), tf, [(m, n)]


def _softmax(data):
    m, n = _sizes(data, 2, 6)
    log = data.draw(st.booleans(), label="log")
    return ((lambda x: fa.nn.long_row_softmax(x, log=log)),
            (lambda x: (torch.log_softmax if log else torch.softmax)(x, -1)), [(m, n)])


def _attention(data):
    b, s, t, d = _sizes(data, 4, 4)
    causal = data.draw(st.booleans(), label="causal") and s == t

    def tf(q, k, v):  # written out: torch's fused CPU attention has no forward-mode derivative
        logits = torch.einsum("bshd,bthd->bhst", q, k) / d ** 0.5
        if causal:
            logits = logits.masked_fill(torch.ones(s, t, dtype=torch.bool).triu(1), float("-inf"))
        return torch.einsum("bhst,bthd->bshd", torch.softmax(logits, -1), v)
    return ((lambda q, k, v: fa.nn.dot_product_attention(q, k, v, is_causal=causal)), tf,
            [(b, s, 2, d), (b, t, 2, d), (b, t, 2, d)])


def _ragged_dot(data):
    k, n = _sizes(data, 2, 4)
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3), label="group_sizes")
    m = max(sum(sizes), 1)
    gs = np.array(sizes, np.int32)

    def tf(a, b):
        rows, start = [], 0
        for g, s in enumerate(sizes):
            rows.append(a[start:start + s] @ b[g])
            start += s
        rows.append(torch.zeros((m - start, n), dtype=a.dtype))
        return torch.cat(rows)
    return (lambda a, b: fa.ragged_dot(a, b, fa.asarray(gs))), tf, [(m, k), (len(sizes), k, n)]


def _matmul_epilogue(data):
    """Made only by the scheduler (the transform sees the unfused graph); recorded directly here, so its
    derivative comes from its formulation (ad_rules.FORMULATIONS)."""
    from flyarray.ops.library import call
    from flyarray.ops.linalg import MATMUL_EPILOGUE
    m, k, n = _sizes(data, 3, 4)

    def f(a, b, c):
        return call(MATMUL_EPILOGUE, [a, b, c], activation="gelu", has_bias=True, has_residual=False,
                    out_dtype="float64")[0]
    return f, (lambda a, b, c: F.gelu(a @ b + c)), [(m, k), (k, n), (n,)]


def _softmax_bwd(data):
    """A second derivative: the gradient through the long-row softmax records softmax_bwd."""
    f, tf, shapes = _softmax(data)
    w = np.random.default_rng(5).uniform(-1, 1, shapes[0])
    return (fa.grad(lambda x: fa.sum(f(x) ** 2 * fa.asarray(w.astype(np.float32)))),
            torch.func.grad(lambda x: (tf(x) ** 2 * torch.from_numpy(w)).sum()), shapes)


def _attention_bwd(data):
    """A second derivative: the gradient through attention records attention_bwd (dq, dk, dv)."""
    f, tf, shapes = _attention(data)
    w = np.random.default_rng(6).uniform(-1, 1, shapes[0])
    return (lambda q, k, v: fa.grad(lambda a: fa.sum(f(a, k, v) ** 2 * fa.asarray(w.astype(np.float32))))(q),
            lambda q, k, v: torch.func.grad(lambda a: (tf(a, k, v) ** 2 * torch.from_numpy(w)).sum())(q), shapes)


def _scaled_matmul(data):
    """Weight-only MX: a bf16/fp16 lhs (differentiable) times fixed MX weights (not)."""
    m, n = _sizes(data, 2, 4)
    fmt = data.draw(st.sampled_from(["e4m3", "e2m1"]), label="weight format")
    w = fa.asarray(np.random.default_rng(m * 10 + n).uniform(-1, 1, (n, 64)).astype(np.float32))
    w_data, w_scales = fa.quant.mx_quantize(w, fmt)
    w_values = torch.from_numpy(np.asarray(fa.quant.mx_dequantize(w_data, w_scales, fmt)).astype(np.float64))

    def f(a):
        y = fa.nn.scaled_matmul(a.astype(fa.float16), w_data, None, w_scales, preferred_element_type=fa.float32)
        return y.astype(a.dtype)
    return f, (lambda a: a @ w_values.T), [(m, 64)]


LIBRARY_CASES = {"matmul": _matmul, "gather": _gather, "scatter": _scatter, "top_k": _top_k, "scan": _scan,
                 "sort": _sort,
                 "softmax_top_k": _softmax_top_k, "softmax": _softmax, "attention": _attention,
                 "ragged_dot": _ragged_dot, "matmul_epilogue": _matmul_epilogue, "softmax_bwd": _softmax_bwd,
                 "attention_bwd": _attention_bwd, "scaled_matmul": _scaled_matmul}
HALF_PRECISION = {"scaled_matmul"}
FLOAT32_ONLY = {"attention", "attention_bwd", "ragged_dot", "softmax", "softmax_bwd", "softmax_top_k", "top_k"}  # their kernels take no float64
# Collectives need a process group: their VJPs/JVPs are checked against one device on 2 gloo processes
# in tests/test_distributed.py (tests/distributed_checks.py), not here.
CHECKED_ELSEWHERE = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ppermute"}
NO_DERIVATIVE = {  # library op -> why it has none (each raises a clear error when differentiated)
    "mx_quantize": "quantization (integer codes)",
    "mx_dequantize": "reads integer codes", "searchsorted": "integer insertion indices",
    **{p.name: "torch.linalg call: no derivative rules yet" for p in DECOMPOSITIONS},
    **{name: "complex values: derivatives of complex functions raise TypeError (tests/test_complex.py)"
       for name in ("view_as_real", "view_as_complex", "fft")},
}


@pytest.mark.parametrize("name", sorted(LIBRARY_CASES))
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_library_op(name, data):
    f, tf, shapes = LIBRARY_CASES[name](data)
    xs = _values(data.draw(st.integers(0, 2 ** 16), label="seed"), shapes, [(-1.0, 1.0)] * len(shapes))
    if name in HALF_PRECISION:  # the op rounds its differentiable input to fp16
        xs = [x.astype(np.float32) for x in xs]
        _check_grad(f, tf, xs, rtol=2e-3, atol=2e-3)
        _check_jvp_torch(f, tf, xs, rtol=2e-3, atol=2e-3)
    elif name in FLOAT32_ONLY:  # float32 against torch's float64
        xs = [x.astype(np.float32) for x in xs]
        _check_grad(f, tf, xs, rtol=1e-4, atol=1e-5)
        _check_jvp_torch(f, tf, xs, rtol=1e-4, atol=1e-5)
    else:
        _check_grad(f, tf, xs)
        _check_jvp(f, xs)


def test_every_differentiable_primitive_is_covered():
    """A new primitive with a float output needs a derivative rule and a case in this file."""
    for table, cases in ((ELEMENTWISE, ELEMENTWISE_CASES), (REDUCE, None)):
        for name, prim in table.items():
            if _no_derivative(prim):
                assert not hasattr(prim, "vjp"), f"{name} has a bool/index output or integer inputs but a vjp rule"
                continue
            assert hasattr(prim, "vjp"), f"the primitive {name} has no derivative rule (flyarray/ad_rules.py)"
            assert cases is None or name in cases, f"the primitive {name} has no case in ELEMENTWISE_CASES"
    for name, prim in LIBRARY.items():
        if name in CHECKED_ELSEWHERE:
            assert hasattr(prim, "vjp") and hasattr(prim, "jvp"), f"the collective {name} has no VJP/JVP"
            continue
        assert (name in LIBRARY_CASES) != (name in NO_DERIVATIVE), \
            f"the library op {name} needs a case in LIBRARY_CASES, or a reason in NO_DERIVATIVE (not both)"
        if name in LIBRARY_CASES:
            assert hasattr(prim, "vjp") or name in ad_rules.FORMULATIONS, f"the library op {name} has no VJP"


@pytest.mark.parametrize("name", ["cholesky", "inv", "det", "eigvalsh", "svdvals"])
def test_decompositions_say_they_are_not_differentiable(name):
    a = np.random.default_rng(0).uniform(-1, 1, (3, 3))
    a = fa.asarray(a @ a.T + 3 * np.eye(3))
    with pytest.raises(TypeError, match=f"fa.linalg.{name} is not differentiable"):
        fa.grad(lambda x: fa.sum(getattr(fa.linalg, name)(x)))(a)


def test_forward_over_reverse_through_a_library_op_evaluates_the_tangent_alone():
    """The tangent of jvp(grad(long-row softmax)) evaluated on its own: the softmax library node reads
    jvp's copy of the input, which another kernel stored along the way; that kernel must run first
    (it raised KeyError in the plan until schedule.py made such values available only after their
    kernel is finished)."""
    x, w, t = (np.random.default_rng(s).uniform(-1, 1, (1, 2)).astype(np.float32) for s in (0, 5, 2))
    g = fa.grad(lambda a: fa.sum(fa.nn.long_row_softmax(a) ** 2 * fa.asarray(w)))
    _, tangent = fa.jvp(g, (fa.asarray(x),), (fa.asarray(t),))
    _, want = torch.func.jvp(torch.func.grad(lambda a: (torch.softmax(a, -1) ** 2 * torch.from_numpy(w)).sum()),
                             (torch.from_numpy(x),), (torch.from_numpy(t),))
    np.testing.assert_allclose(np.asarray(tangent), want.numpy(), rtol=1e-4, atol=1e-5)
