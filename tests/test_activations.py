"""fa.nn's jax.nn activations (flyarray/ops/activations.py) against torch in float64, their derivatives
against torch.autograd, their fusion, and their bad-input errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import flyarray as fa

from .conftest import scaled

nn = fa.nn

# name -> the torch function computing the same (softplus without torch's threshold=20 linear cut)
TORCH = {
    "sigmoid": torch.sigmoid,
    "softplus": lambda t: torch.log1p(torch.exp(-t.abs())) + t.clamp(min=0),
    "log_sigmoid": F.logsigmoid,
    "leaky_relu": F.leaky_relu,
    "elu": F.elu,
    "celu": F.celu,
    "selu": F.selu,
    "relu6": F.relu6,
    "hard_tanh": F.hardtanh,
    "hard_sigmoid": F.hardsigmoid,
    "hard_silu": lambda t: torch.where(t <= -3, 0.0, F.hardswish(t)),   # torch (and JAX): -inf * 0, NaN, at -inf
    "mish": lambda t: t * torch.tanh(torch.log1p(torch.exp(-t.abs())) + t.clamp(min=0)),
    "swish": F.silu,
}
EDGES = [-1e4, -100.0, -30.0, -3.0, -1.0, -1e-30, -0.0, 0.0, 1e-30, 1.0, 3.0, 6.0, 30.0, 100.0, 1e4,
         float("inf"), float("-inf"), float("nan")]



def _check(name, values, dtype, rtol):
    x = np.asarray(values, dtype=np.float64)
    got = np.asarray(getattr(nn, name)(fa.asarray(x).astype(dtype)), dtype=np.float64)
    t = torch.tensor(x).to(torch.float32 if dtype == fa.float32 else torch.float64)
    want = TORCH[name](t).double().numpy()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-37, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_activations_match_torch_at_the_edges(backend, name):
    _check(name, EDGES, fa.float32, 2e-6)
    _check(name, EDGES, fa.float64, 1e-12)


@settings(max_examples=scaled(20))
@given(st.lists(st.floats(-200, 200, allow_nan=False, width=32), min_size=1, max_size=9))
def test_activations_match_torch_on_random_values(values):
    for name in TORCH:
        _check(name, values, fa.float32, 2e-6)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_activation_derivatives_match_torch_autograd(name):
    x = np.array([-50.0, -4.0, -2.0, -0.25, 0.5, 2.0, 5.0, 7.0, 50.0])   # away from the kinks (-3, -1, 0, 1, 3, 6)
    got = np.asarray(fa.grad(lambda v: getattr(nn, name)(v).sum())(fa.asarray(x)))
    t = torch.tensor(x, requires_grad=True)
    TORCH[name](t).sum().backward()
    # torch's hardsigmoid/hardswish backward multiplies by 1/6 rounded to float32, also in float64; its sigmoid
    # backward s * (1 - s) is 0 at 50 (test_derivatives_keep_their_tails)
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-7 if name.startswith("hard_s") else 1e-10, atol=1e-21)


@pytest.mark.parametrize("dtype", [fa.float32, fa.float64])
def test_derivatives_keep_their_tails(dtype):
    """d expm1(x) = e^x was (expm1(x) + 1), 0 once e^x < eps (elu's derivative at -50: 0, not 1.9e-22), and
    d sigmoid = s * (1 - s) was 0 once s rounds to 1 (x > 17 in float32); torch and JAX compute both so."""
    x = fa.asarray([-50.0, -20.0, 20.0, 50.0]).astype(dtype)
    tail = np.exp(-np.array([50.0, 20.0, 20.0, 50.0]))
    rtol = 1e-6 if dtype == fa.float32 else 1e-12
    np.testing.assert_allclose(np.asarray(fa.grad(lambda v: fa.expm1(v).sum())(x))[:2], tail[:2], rtol=rtol)
    np.testing.assert_allclose(np.asarray(fa.grad(lambda v: nn.elu(v).sum())(x))[:2], tail[:2], rtol=rtol)
    np.testing.assert_allclose(np.asarray(fa.grad(lambda v: nn.sigmoid(v).sum())(x)), tail, rtol=1e-5)
    _, tangent = fa.jvp(fa.expm1, (x,), (fa.ones(4, dtype=dtype),))
    np.testing.assert_allclose(np.asarray(tangent)[:2], tail[:2], rtol=rtol)


@pytest.mark.parametrize("name, at, want", [
    ("relu6", [0.0, 6.0], [0.0, 0.0]),
    ("hard_sigmoid", [-3.0, 3.0], [0.0, 0.0]),
    ("hard_silu", [-3.0, 3.0, -np.inf, np.inf], [0.0, 1.0, 0.0, 1.0]),
    ("hard_tanh", [-1.0, 1.0], [1.0, 1.0]),
])
def test_derivatives_at_the_kinks_are_jaxs(name, at, want):
    """Found by fuzzing against jax.nn: minimum/maximum's tie rule gave 0.5 at relu6's kinks (JAX: 0), 1/12 at
    hard_sigmoid's, and hard_silu's derivative at +-inf was inf * 0, NaN."""
    got = fa.grad(lambda v: getattr(nn, name)(v).sum())(fa.asarray(at))
    np.testing.assert_array_equal(np.asarray(got), want)


def test_second_derivatives_at_infinity():
    """logaddexp's derivative exp(x - out) computed inf - inf where it was not taken: softplus'' at inf and
    log_sigmoid'' at -inf were NaN (JAX: 0)."""
    for f, at in ((nn.softplus, np.inf), (nn.log_sigmoid, -np.inf), (lambda v: fa.logaddexp(v, 0.0), np.inf)):
        x = fa.asarray(np.float32([at, 1.0]))
        got = np.asarray(fa.grad(lambda w: fa.grad(lambda u: f(u).sum())(w).sum())(x))
        assert got[0] == 0.0 and np.isclose(abs(got[1]), 0.19661193, rtol=1e-6), got


def test_integers_compute_in_the_default_float_and_complex_is_refused():
    assert nn.elu(fa.asarray([1, -2])).dtype == fa.float32
    with pytest.raises(TypeError, match="mish: x must be real, got fa.complex64"):
        nn.mish(fa.asarray([1j]))
    with pytest.raises(TypeError, match="leaky_relu: negative_slope must be a real number, got '0.1' of type str"):
        nn.leaky_relu(fa.ones(2), "0.1")
    with pytest.raises(ValueError, match="celu: alpha must not be 0"):
        nn.celu(fa.ones(2), 0.0)
    np.testing.assert_allclose(np.asarray(nn.leaky_relu(fa.asarray([-2.0, 3.0]), 0.5)), [-1.0, 3.0])
    np.testing.assert_allclose(np.asarray(nn.elu(fa.asarray([-1.0]), alpha=2.0)), [2.0 * np.expm1(-1.0)], rtol=1e-6)


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp_matches_torch_with_infinities(backend, axis, keepdims):
    a = np.random.default_rng(1).normal(size=(4, 5)) * 40
    a[1, 2] = np.inf
    a[2] = -np.inf
    a[3, 0] = np.nan
    dims = (0, 1) if axis is None else axis
    want = torch.logsumexp(torch.tensor(a), dim=dims, keepdim=keepdims).numpy()
    for dtype, rtol in ((fa.float64, 1e-12), (fa.float32, 2e-6)):
        got = nn.logsumexp(fa.asarray(a).astype(dtype), axis=axis, keepdims=keepdims)
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, equal_nan=True)


def test_logsumexp_of_nothing_is_minus_infinity_and_its_derivative_is_the_softmax():
    assert np.asarray(nn.logsumexp(fa.zeros((2, 0)), axis=1)).tolist() == [-np.inf, -np.inf]
    assert nn.logsumexp(fa.zeros((2, 0)), axis=1, keepdims=True).shape == (2, 1)
    x = np.random.default_rng(2).normal(size=(3, 6)) * 20
    got = fa.grad(lambda v: (nn.logsumexp(v, axis=1) * fa.asarray([1.0, 2.0, 3.0], dtype=fa.float64)).sum())(
        fa.asarray(x))
    want = torch.softmax(torch.tensor(x), 1).numpy() * np.array([[1.0], [2.0], [3.0]])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-300)
    with pytest.raises(TypeError, match="logsumexp"):
        nn.logsumexp(fa.asarray([1, 2]))
    with pytest.raises(ValueError, match="logsumexp: axis 2 is out of range"):
        nn.logsumexp(fa.ones((2, 2)), axis=2)


def test_one_hot_matches_torch_and_zeroes_out_of_range_indices():
    labels = np.array([[0, 3, 1], [2, 2, 0]])
    got = nn.one_hot(fa.asarray(labels), 4)
    assert got.dtype == fa.float32 and got.shape == (2, 3, 4)
    np.testing.assert_array_equal(np.asarray(got), F.one_hot(torch.tensor(labels), 4).numpy())
    np.testing.assert_array_equal(np.asarray(nn.one_hot(fa.asarray([-1, 5, 1]), 3, dtype=fa.int8)),
                                  [[0, 0, 0], [0, 0, 0], [0, 1, 0]])
    moved = nn.one_hot(fa.asarray(labels), 4, axis=0)
    np.testing.assert_array_equal(np.asarray(moved), np.moveaxis(F.one_hot(torch.tensor(labels), 4).numpy(), -1, 0))
    wide = nn.one_hot(fa.asarray(np.array([0, 5, 127], dtype=np.int8)), 200)   # more classes than int8 holds
    np.testing.assert_array_equal(np.asarray(wide).argmax(-1), [0, 5, 127])
    np.testing.assert_array_equal(np.asarray(nn.one_hot(2, 3)), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(np.asarray(nn.one_hot(fa.asarray(np.array([2**63 + 1], dtype=np.uint64)), 3)),
                                  [[0.0, 0.0, 0.0]])
    with pytest.raises(TypeError, match="one_hot: x must hold integer class indices, got fa.float32"):
        nn.one_hot(fa.ones(3), 3)
    with pytest.raises(ValueError, match="num_classes must be a non-negative int"):
        nn.one_hot(fa.asarray([1]), -1)


def test_glu_and_standardize():
    x = np.random.default_rng(3).normal(size=(3, 8))
    np.testing.assert_allclose(np.asarray(nn.glu(fa.asarray(x))), F.glu(torch.tensor(x), -1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(nn.glu(fa.asarray(x.T), axis=0)), F.glu(torch.tensor(x.T), 0).numpy(),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="glu: axis 0 of x \\(shape \\(3, 8\\)\\) must have an even length"):
        nn.glu(fa.asarray(x), axis=0)
    np.testing.assert_allclose(np.asarray(nn.standardize(fa.asarray(x))), F.layer_norm(torch.tensor(x), (8,)).numpy(),
                               rtol=1e-9, atol=1e-12)


def test_activations_fuse_into_one_kernel():
    fa.set_backend("reference")
    try:
        x = fa.asarray(np.linspace(-4, 4, 32).reshape(4, 8).astype(np.float32))
        fa.reset_stats()
        fa.eval(nn.mish(x) + nn.elu(x) * nn.hard_silu(x) - nn.log_sigmoid(x))
        assert fa.stats()["kernels_launched"] == 1
        fa.reset_stats()
        fa.eval(nn.logsumexp(x, axis=-1))
        assert fa.stats()["kernels_launched"] == 1    # max, exp, sum, log: one row kernel
    finally:
        fa.set_backend(None)
