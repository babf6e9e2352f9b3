"""Derivatives of cumulative_prod (ad_rules._scan_vjp/_scan_jvp) against torch.func in float64, with zeros in
the input: none, one, several, adjacent, first and last. The textbook reverse_cumsum(g * y) / x is NaN at a
zero and wrong before it; flyarray's rule divides by nothing, so these must agree to float64 rounding."""
import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flyarray as fa

from .conftest import scaled

TOL = {"rtol": 1e-10, "atol": 1e-12}


def _torch_cumprod(x, axis, initial):
    axis %= x.dim()
    y = torch.cumprod(x, axis)
    if initial:
        ones = torch.ones(x.shape[:axis] + (1,) + x.shape[axis + 1:], dtype=x.dtype)
        y = torch.cat([ones, y], axis)
    return y


@st.composite
def _inputs(draw, max_dims=3):
    """(x with some exact zeros, axis, include_initial, weights of the output's shape)."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=max_dims, min_side=1, max_side=5), label="shape")
    axis = draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    initial = draw(st.booleans(), label="include_initial")
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16), label="seed"))
    x = rng.uniform(-1.5, 1.5, shape)
    zero_rate = draw(st.sampled_from([0.0, 0.2, 0.5]), label="zero_rate")
    x[rng.uniform(size=shape) < zero_rate] = 0.0
    out = list(shape)
    out[axis] += int(initial)
    return x, axis, initial, rng.uniform(-1, 1, out)


@settings(max_examples=scaled(25), deadline=None)
@given(_inputs())
def test_grad_and_jvp_match_torch_with_zeros(case):
    x, axis, initial, w = case
    f = lambda a: fa.cumulative_prod(a, axis=axis, include_initial=initial)
    got = fa.grad(lambda a: fa.sum(f(a) * fa.asarray(w)))(fa.asarray(x))
    want = torch.func.grad(lambda a: (_torch_cumprod(a, axis, initial) * torch.from_numpy(w)).sum())(
        torch.from_numpy(x))
    assert np.asarray(got).dtype == np.float64
    np.testing.assert_allclose(np.asarray(got), want.numpy(), **TOL)
    t = np.random.default_rng(3).uniform(-1, 1, x.shape)
    _, got_t = fa.jvp(f, (fa.asarray(x),), (fa.asarray(t),))
    _, want_t = torch.func.jvp(lambda a: _torch_cumprod(a, axis, initial), (torch.from_numpy(x),),
                               (torch.from_numpy(t),))
    np.testing.assert_allclose(np.asarray(got_t), want_t.numpy(), **TOL)


@pytest.mark.parametrize("zeros", [[], [0], [3], [5], [1, 2], [1, 4], [0, 2, 5]])
def test_rows_with_zeros_exactly(zeros):
    """Each placement of zeros in a row of 6 (first, middle, last, adjacent, several), and the Hessian:
    the rule is a polynomial in x (products and sums only), so second derivatives are exact at zeros too."""
    x = np.random.default_rng(len(zeros)).uniform(0.5, 1.5, 6) * np.array([1, -1, 1, -1, 1, -1])
    x[zeros] = 0.0
    w = np.random.default_rng(7).uniform(-1, 1, 6)
    f = lambda a: fa.sum(fa.cumulative_prod(a) * fa.asarray(w))
    tf = lambda a: (torch.cumprod(a, 0) * torch.from_numpy(w)).sum()
    got = np.asarray(fa.grad(f)(fa.asarray(x)))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, torch.func.grad(tf)(torch.from_numpy(x)).numpy(), **TOL)
    np.testing.assert_allclose(np.asarray(fa.hessian(f)(fa.asarray(x))),
                               torch.func.hessian(tf)(torch.from_numpy(x)).numpy(), **TOL)


def test_vmap_of_grad_and_float32():
    x = np.random.default_rng(0).uniform(-1, 1, (4, 3, 5))
    x[1, 0, 2] = 0.0
    x[2, 1, :] = 0.0
    g = fa.vmap(fa.grad(lambda a: fa.sum(fa.cumulative_prod(a, axis=1) ** 2)))(fa.asarray(x))
    want = torch.func.vmap(torch.func.grad(lambda a: (torch.cumprod(a, 1) ** 2).sum()))(torch.from_numpy(x))
    np.testing.assert_allclose(np.asarray(g), want.numpy(), **TOL)
    x32 = x.astype(np.float32)
    g32 = fa.grad(lambda a: fa.sum(fa.cumulative_prod(a, axis=2)))(fa.asarray(x32))
    assert np.asarray(g32).dtype == np.float32
    want32 = torch.func.grad(lambda a: torch.cumprod(a, 2).sum())(torch.from_numpy(x))
    np.testing.assert_allclose(np.asarray(g32), want32.numpy(), rtol=1e-5, atol=1e-6)


def test_interpret_backend(interpret):
    """The rule's graph (the scan kernel, concats, fused products) through the Triton interpreter."""
    x = np.array([[0.5, 0.0, 2.0, -1.0, 0.0, 3.0], [1.5, -2.0, 0.25, 1.0, 2.0, 0.5]], np.float32)
    got = fa.grad(lambda a: fa.sum(fa.cumulative_prod(a, axis=1, include_initial=True)))(fa.asarray(x))
    want = torch.func.grad(lambda a: _torch_cumprod(a, 1, True).sum())(torch.from_numpy(x.astype(np.float64)))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.parametrize("n", [7, 3000])
def test_gpu_grad_and_jvp(n):
    """On the GPU (the scan kernel and the fused doubling steps, compiled): float64 rows with zeros."""
    fa.set_backend("gpu")
    try:
        x = np.random.default_rng(n).uniform(0.9, 1.1, (4, n)) * np.sign(np.random.default_rng(1).uniform(-1, 1, (4, n)))
        x[1, n // 2] = 0.0
        x[2, [1, n - 2]] = 0.0
        w = np.random.default_rng(2).uniform(-1, 1, (4, n))
        xd = fa.asarray(x, device="cuda")
        got = fa.grad(lambda a: fa.sum(fa.cumulative_prod(a, axis=1) * fa.asarray(w, device="cuda")))(xd)
        want = torch.func.grad(lambda a: (torch.cumprod(a, 1) * torch.from_numpy(w)).sum())(torch.from_numpy(x))
        np.testing.assert_allclose(got.torch().cpu().numpy(), want.numpy(), rtol=1e-9, atol=1e-11)
        _, tan = fa.jvp(lambda a: fa.cumulative_prod(a, axis=1), (xd,), (fa.asarray(w, device="cuda"),))
        _, want_t = torch.func.jvp(lambda a: torch.cumprod(a, 1), (torch.from_numpy(x),), (torch.from_numpy(w),))
        np.testing.assert_allclose(tan.torch().cpu().numpy(), want_t.numpy(), rtol=1e-9, atol=1e-11)
    finally:
        fa.set_backend(None)
