"""fa.cumulative_sum/prod, sort, argsort, searchsorted, unique_*: both CPU backends against numpy (float64),
errors before work, grad and vmap."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import flyarray as fa

SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, 1.0])


def _data(shape, seed, special, dtype):
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(np.float64) if dtype != "float32" else rng.standard_normal(shape)
    if special and dtype == "float32":
        x = np.where(rng.random(shape) < 0.3, SPECIAL[rng.integers(0, len(SPECIAL), shape)], x)
    return x.astype(dtype)


@settings(max_examples=6, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 999), special=st.booleans(),
       dtype=st.sampled_from(["float32", "int32", "int8"]), data=st.data())
def test_scans_match_numpy(backend, shape, seed, special, dtype, data):
    x = _data(tuple(shape), seed, special, dtype)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    initial = data.draw(st.booleans())
    for fa_fn, np_fn, ident in ((fa.cumulative_sum, np.cumsum, 0), (fa.cumulative_prod, np.cumprod, 1)):
        got = fa_fn(x, axis=axis, include_initial=initial)
        want = np_fn(x.astype(np.float64), axis=axis)
        if initial:
            pad = np.full(np.take(x, [0], axis=axis).shape, ident, np.float64)
            want = np.concatenate([pad, want], axis=axis)
        assert got.dtype == (fa.float32 if dtype == "float32" else fa.int64)
        np.testing.assert_allclose(np.asarray(got).astype(np.float64), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=6, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=2), seed=st.integers(0, 999), special=st.booleans(),
       dtype=st.sampled_from(["float32", "int32", "int64", "float64"]), desc=st.booleans(), data=st.data())
def test_sort_argsort_match_numpy(backend, shape, seed, special, dtype, desc, data):
    x = _data(tuple(shape), seed, special, dtype if dtype != "float64" else "float32").astype(dtype)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    if desc:  # the array API's (and array_api_strict's) descending: flip, stable sort, flip
        n = x.shape[axis]
        want = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        want = np.argsort(x, axis=axis, kind="stable")
    idx = fa.argsort(x, axis=axis, descending=desc)
    assert idx.dtype == fa.int64
    np.testing.assert_array_equal(np.asarray(idx), want)
    np.testing.assert_array_equal(np.asarray(fa.sort(x, axis=axis, descending=desc)),
                                  np.take_along_axis(x, want, axis))


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted(backend, side):
    x1 = np.array([-np.inf, -1.0, -0.0, 0.0, 0.0, 2.0, np.inf, np.nan], np.float32)
    x2 = np.array([[np.nan, 0.0, -0.0], [3.0, -np.inf, 1.5]], np.float32)
    np.testing.assert_array_equal(np.asarray(fa.searchsorted(x1, x2, side=side)), np.searchsorted(x1, x2, side=side))
    perm = np.random.default_rng(0).permutation(8)
    sorter = np.argsort(x1[perm], kind="stable")
    np.testing.assert_array_equal(np.asarray(fa.searchsorted(x1[perm], x2, side=side, sorter=sorter)),
                                  np.searchsorted(x1[perm], x2, side=side, sorter=sorter))
    assert int(fa.searchsorted(np.arange(5), 2.5)) == 3  # int x1, float x2: promoted


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_unique_matches_numpy(backend, dtype):
    x = (_data((3, 5), 7, True, "float32") if dtype == "float32" else
         np.random.default_rng(1).integers(0, 3, (3, 5))).astype(dtype)
    v, i, inv, c = np.unique(x, return_index=True, return_inverse=True, return_counts=True, equal_nan=False)
    r = fa.unique_all(x)
    np.testing.assert_array_equal(np.asarray(r.values), v)
    np.testing.assert_array_equal(np.asarray(r.indices), i)
    np.testing.assert_array_equal(np.asarray(r.inverse_indices), inv.reshape(x.shape))
    np.testing.assert_array_equal(np.asarray(r.counts), c)
    np.testing.assert_array_equal(np.asarray(fa.unique_values(x)), v)
    np.testing.assert_array_equal(np.asarray(fa.unique_counts(x).counts), c)
    np.testing.assert_array_equal(np.asarray(fa.unique_inverse(x).inverse_indices), inv.reshape(x.shape))
    assert fa.unique_values(np.zeros(0, np.float32)).shape == (0,)


def test_unique_under_jit_needs_concrete_values():
    with pytest.raises(fa.ConcretizationError):
        fa.jit(fa.unique_values)(fa.asarray(np.arange(4.0)))


def test_errors_before_work():
    x = fa.asarray(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError):
        fa.cumulative_sum(x)  # axis required above 1-D
    with pytest.raises(ValueError):
        fa.cumulative_prod(x, axis=2)
    with pytest.raises(ValueError):
        fa.sort(x, axis=-3)
    with pytest.raises(TypeError):
        fa.sort(fa.asarray(np.array([True, False])))
    with pytest.raises(TypeError):
        fa.searchsorted(np.array([False, True]), np.array([True]))
    with pytest.raises(ValueError):
        fa.searchsorted(np.arange(3.0), 1.0, side="middle")
    with pytest.raises(ValueError):
        fa.searchsorted(np.zeros((2, 2)), 1.0)
    with pytest.raises(ValueError):
        fa.argsort(fa.asarray(np.float32(1)))


def test_grad_and_vmap(backend):
    rng = np.random.default_rng(3)
    X, W = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    g = fa.grad(lambda x: fa.sum(fa.cumulative_sum(x, axis=0) * W))(fa.asarray(X))
    np.testing.assert_allclose(np.asarray(g), np.flip(np.cumsum(np.flip(W, 0), 0), 0), rtol=1e-5, atol=1e-5)
    g = fa.grad(lambda x: fa.sum(fa.sort(x, axis=1, descending=True) * W))(fa.asarray(X))
    want = np.zeros_like(X)
    np.put_along_axis(want, np.argsort(-X, axis=1, kind="stable"), W, 1)
    np.testing.assert_allclose(np.asarray(g), want)
    np.testing.assert_array_equal(np.asarray(fa.vmap(fa.argsort)(X)), np.argsort(X, 1, kind="stable"))
    np.testing.assert_allclose(np.asarray(fa.vmap(lambda r: fa.cumulative_prod(r))(X)), np.cumprod(X, 1), rtol=1e-5)
    S = np.sort(X, 1)
    got = fa.vmap(lambda s, q: fa.searchsorted(s, q, side="right"))(S, X[:, :2].copy())
    np.testing.assert_array_equal(np.asarray(got), [np.searchsorted(S[i], X[i, :2], side="right") for i in range(3)])


@pytest.mark.parametrize("dtype,value,want", [(np.uint8, -1, 0), (np.uint8, 256, 3), (np.int8, 1000, 3),
                                              (np.int8, -1000, 0), (np.uint64, -5, 0), (np.uint64, 2**64, 3)])
@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_a_python_int_past_the_dtypes_range(dtype, value, want, side):
    """It wrapped into x1's dtype (-1 as uint8's 255: after every element) or raised a TypeError; every
    element is above (or below) it, whichever side."""
    x = fa.asarray(np.array([1, 2, 3], dtype))
    assert int(fa.searchsorted(x, value, side=side)) == want
