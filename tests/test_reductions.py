"""Reductions against numpy: every axis combination, keepdims, empty axes, NaN, ties, layouts."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flyarray as fa

from .conftest import ALL_DTYPES, FLOAT_DTYPES, LAYOUTS, assert_matches, make_array, sample, scaled

REDUCTIONS = ["sum", "prod", "max", "min", "mean", "var", "std", "argmax", "argmin", "any", "all"]
NO_IDENTITY = {"max", "min", "argmax", "argmin"}


@st.composite
def shape_and_axis(draw, single_axis=False):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    nd = len(shape)
    options = [st.none()]
    if nd:
        options.append(st.integers(-nd, nd - 1))
        if not single_axis:
            options.append(st.lists(st.integers(0, nd - 1), unique=True, max_size=nd).map(
                lambda axes: tuple(a - nd if i % 2 else a for i, a in enumerate(axes))))  # mix signs
    return shape, draw(st.one_of(*options))


def result_dtype(name, dtype):
    kind = np.dtype(dtype).kind
    if name in ("sum", "prod"):  # the array API's: unsigned -> uint64, signed and bool -> int64
        return "uint64" if kind == "u" else "int64" if kind in "bi" else dtype
    if name in ("mean", "var", "std"):
        return "float32" if kind != "f" else dtype
    if name in ("argmax", "argmin"):
        return "int64"
    if name in ("any", "all"):
        return "bool"
    return dtype


def numpy_reduce(name, values, axis, keepdims, out_dtype):
    """numpy's answer, computed in float64 (or int64) and cast to flyarray's result dtype."""
    kind = values.dtype.kind
    wide = values.astype(np.float64) if kind == "f" or name in ("mean", "var", "std") else values.astype(np.int64)
    if name in ("any", "all"):
        wide = values
    if name in ("argmax", "argmin"):
        fn = np.argmax if name == "argmax" else np.argmin
        out = fn(values, axis=axis, keepdims=keepdims)
        return np.asarray(out).astype(np.int64)
    fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean, "var": np.var,
          "std": np.std, "any": np.any, "all": np.all}[name]
    with np.errstate(all="ignore"):
        out = fn(wide, axis=axis, keepdims=keepdims)
    return np.asarray(out).astype(out_dtype)


def draw_values(name, rng, shape, dtype):
    d = np.dtype(dtype)
    if name == "prod":
        return sample(rng, shape, dtype, 0.8, 1.2) if d.kind == "f" else sample(rng, shape, dtype, -3, 3)
    if name in ("argmax", "argmin") and d.kind == "f":  # halves: ties happen and must pick the first
        return (sample(rng, shape, "int8", -4, 4) / 2).astype(d)
    if d.kind == "u":
        return sample(rng, shape, dtype, 0, 9)
    if name in ("var", "std", "mean") and d.kind == "f":
        return sample(rng, shape, dtype, -1, 1)
    return sample(rng, shape, dtype, -9, 9)


def tolerance(name, out_dtype, n):
    if out_dtype == "float16":
        return dict(rtol=4e-3, atol=4e-3 * max(1, np.sqrt(n)) if name in ("sum", "var", "std", "mean") else 4e-3)
    if out_dtype == "float32":
        return dict(rtol=2e-5, atol=2e-5 if name in ("var", "std", "mean", "sum") else 1e-6)
    return dict(rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("name", REDUCTIONS)
@settings(max_examples=scaled(15))
@given(sa=shape_and_axis(), dtype=st.sampled_from(ALL_DTYPES), keepdims=st.booleans(),
       layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2 ** 32 - 1))
def test_reduction_matches_numpy(backend, name, sa, dtype, keepdims, layout, seed):
    shape, axis = sa
    if name in ("argmax", "argmin") and isinstance(axis, tuple):
        axis = axis[0] if len(axis) == 1 else None
    rng = np.random.default_rng(seed)
    values = draw_values(name, rng, shape, dtype)
    x = make_array(values, layout)
    fn = getattr(fa, name)
    norm = tuple(range(len(shape))) if axis is None else tuple(
        a % len(shape) for a in ((axis,) if isinstance(axis, int) else axis))
    empty_axis = any(shape[a] == 0 for a in norm)
    if name in NO_IDENTITY and empty_axis:
        with pytest.raises(ValueError):
            fn(x, axis=axis, keepdims=keepdims)
        return
    out_dtype = result_dtype(name, dtype)
    got = fn(x, axis=axis, keepdims=keepdims)
    want = numpy_reduce(name, values, axis, keepdims, out_dtype)
    assert got.shape == want.shape
    assert str(got.dtype) == f"fa.{out_dtype}"
    n = int(np.prod([shape[a] for a in norm])) if norm else 1
    assert_matches(got, want, **tolerance(name, out_dtype, n))


@pytest.mark.parametrize("name,identity", [("sum", 0), ("prod", 1), ("any", False), ("all", True)])
@pytest.mark.parametrize("dtype", ["int32", "float32", "bool"])
def test_empty_axes_give_the_identity(backend, name, identity, dtype):
    x = make_array(np.zeros((3, 0, 2), dtype))
    got = getattr(fa, name)(x, axis=1)
    assert got.shape == (3, 2)
    assert_matches(got, np.full((3, 2), identity, result_dtype(name, dtype)))
    got = getattr(fa, name)(x)
    assert got.shape == ()
    assert got.item() == identity


def test_mean_of_empty_is_nan(backend):
    got = fa.mean(make_array(np.zeros((0, 3), np.float32)), axis=0)
    assert np.isnan(np.asarray(got)).all()


def test_reduce_over_no_axes_is_the_identity_map(backend):
    v = np.arange(6, dtype=np.int8).reshape(2, 3)
    assert_matches(fa.sum(make_array(v), axis=()), v.astype(np.int64))
    assert_matches(fa.max(make_array(v), axis=()), v)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin", "sum"])
def test_nan_propagates_like_numpy(backend, name, dtype):
    v = np.array([[1.0, np.nan, 3.0, 7.0], [2.0, 5.0, np.nan, np.nan], [4.0, -1.0, 0.5, 9.0],
                  [np.nan, 1.0, 2.0, 3.0]], dtype)
    x = make_array(v)
    for axis in (None, 0, 1, -1):
        fn = getattr(np, name)
        want = np.asarray(fn(v, axis=axis))
        if name in ("argmax", "argmin"):
            want = want.astype(np.int64)
        assert_matches(getattr(fa, name)(x, axis=axis), want)


@pytest.mark.parametrize("name", ["max", "min"])
def test_infinities_and_integer_extremes(backend, name):
    v = np.array([[-np.inf, -np.inf], [np.inf, 1.0]], np.float32)
    assert_matches(getattr(fa, name)(make_array(v), axis=1), getattr(np, name)(v, axis=1))
    i = np.array([[np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0]], np.int64)
    assert_matches(getattr(fa, name)(make_array(i), axis=1), getattr(np, name)(i, axis=1))
    u = np.array([[255, 0, 7]], np.uint8)
    assert_matches(getattr(fa, name)(make_array(u), axis=-1), getattr(np, name)(u, axis=-1))


def test_any_all_on_floats_count_nan_as_true(backend):
    v = np.array([[0.0, np.nan], [0.0, -0.0], [1.0, 2.0]], np.float32)
    assert_matches(fa.any(make_array(v), axis=1), np.any(v, axis=1))
    assert_matches(fa.all(make_array(v), axis=1), np.all(v, axis=1))


def test_argmax_over_flattened_non_contiguous_input(backend):
    v = np.array([[3, 9, 9], [9, 1, 2]], np.int32)
    x = make_array(v.T.copy(), "contiguous").T  # a transposed view
    assert_matches(fa.argmax(x), np.int64(np.argmax(v)))
    assert_matches(fa.argmin(x, keepdims=True), np.argmin(v, keepdims=True).astype(np.int64))


@pytest.mark.parametrize("correction", [0, 1])
def test_var_std_correction(backend, correction):
    rng = np.random.default_rng(2)
    v = sample(rng, (4, 6), "float64", -2, 2)
    x = make_array(v)
    assert_matches(fa.var(x, axis=1, correction=correction), np.var(v, axis=1, ddof=correction))
    assert_matches(fa.std(x, axis=0, correction=correction), np.std(v, axis=0, ddof=correction))


def test_sum_dtype_argument(backend):
    v = np.arange(10, dtype=np.int8).reshape(2, 5)
    got = fa.sum(make_array(v), axis=1, dtype=fa.float64)
    assert str(got.dtype) == "fa.float64"
    assert_matches(got, v.sum(axis=1).astype(np.float64))


def test_methods_match_functions(backend):
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = make_array(v)
    assert_matches(x.sum(axis=0), v.sum(axis=0))
    assert_matches(x.mean(axis=1, keepdims=True), v.mean(axis=1, keepdims=True))
    assert_matches(x.max(), v.max())
    assert_matches(x.argmin(axis=1), v.argmin(axis=1).astype(np.int64))


def test_long_rows_use_the_looped_kernel(backend):
    """Rows longer than one block (codegen.ROW_BLOCK_LIMIT) take the looped path; results must not change."""
    from flyarray import codegen
    n = codegen.ROW_BLOCK_LIMIT + 37
    rng = np.random.default_rng(4)
    v = sample(rng, (2, n), "float32", -1, 1)
    x = make_array(v)
    assert_matches(fa.sum(x, axis=1), v.astype(np.float64).sum(axis=1).astype(np.float32), rtol=1e-4, atol=1e-3)
    assert_matches(fa.argmax(x, axis=1), v.argmax(axis=1).astype(np.int64))
    assert_matches(fa.max(x * 2, axis=1), (v * 2).max(axis=1))
    sm = fa.nn.softmax(x)
    e = np.exp(v.astype(np.float64) - v.max(axis=1, keepdims=True))
    assert_matches(sm, (e / e.sum(axis=1, keepdims=True)).astype(np.float32), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("axis", [None, 0, -1, (), (0,)])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_zero_dim_arrays_reduce_to_themselves(backend, name, axis):
    """A 0-d array has no axis; axis 0 / -1 are accepted (as torch) and the reduction is the identity map."""
    if name in ("argmax", "argmin") and isinstance(axis, tuple):
        return
    v = np.array(3.5, np.float32)
    got = getattr(fa, name)(make_array(v), axis=axis)
    want = numpy_reduce(name, v, None, False, result_dtype(name, "float32"))
    assert got.shape == ()
    assert_matches(got, want)


def test_zero_dim_axis_out_of_range(backend):
    x = make_array(np.array(1.0, np.float32))
    for bad in (1, -2):
        with pytest.raises(ValueError):
            fa.sum(x, axis=bad)
    assert_matches(fa.nn.softmax(x), np.float32(1.0))
    assert_matches(fa.flip(x, axis=0), np.float32(1.0))


def test_reducing_an_elementwise_value_over_axes_it_was_broadcast_along(backend):
    """sum/prod/mean of op(x) broadcast along the reduced axis count every copy (the reference backend
    reduced the unbroadcast value: sum gave [1, 2], and fa.grad of sum(X + b) half the bias gradient)."""
    x = np.array([[1.0], [2.0]])
    xa = fa.asarray(x)
    assert_matches(fa.sum(fa.broadcast_to(xa * 1.0, (2, 3)), axis=1), np.array([3.0, 6.0]))
    assert_matches(fa.prod(fa.broadcast_to(xa * 2.0, (2, 3)), axis=1), np.array([8.0, 64.0]))
    assert_matches(fa.mean(fa.broadcast_to(xa + 1.0, (2, 3)), axis=0), np.full(3, 2.5))
    assert_matches(fa.max(fa.broadcast_to(xa * 1.0, (2, 3)), axis=1), np.array([1.0, 2.0]))
    bias = fa.grad(lambda b: fa.sum(fa.asarray(np.ones((2, 3))) + b) * 0.7)(fa.asarray(np.zeros(3)))
    assert_matches(bias, np.full(3, 1.4))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mean_divides_by_n_as_numpy_does(backend, dtype):
    """mean multiplied the sum by a rounded 1/n: float32 [636962.0625] * 3 gave 636962.125, var 0.0039 and std
    0.0625 where numpy gives the constant, 0 and 0; about half of random constants were off. Rows of 2-4 equal
    values sum in the same order everywhere, so the results must be numpy's to the bit."""
    rng = np.random.default_rng(3)
    for c in [636962.0625, 672526.9613902353, *rng.uniform(-1e6, 1e6, 20)]:
        for n in (2, 3, 4):
            v = np.full((2, n), c, dtype)
            x = fa.asarray(v)
            assert np.asarray(fa.mean(x, axis=1)).tolist() == np.mean(v, axis=1).tolist()
            assert np.asarray(fa.var(x, axis=1)).tolist() == np.var(v, axis=1).tolist()
    for c in (636962.0625, 672526.9613902353):   # the fuzz's cases: exactly c, var and std 0
        x = fa.asarray(np.full(3, c, dtype))
        assert float(fa.mean(x)) == dtype(c) and float(fa.var(x)) == 0.0 and float(fa.std(x, correction=1)) == 0.0


def test_integer_mean_and_var_accumulate_in_float64(backend):
    """numpy's rule: int32 values near the range's ends cancel in a float32 sum (the backends then disagreed by
    their summation order: -4.0 and 0.72 for a mean of -3.125); the result is float32."""
    x = np.array([[-7, 7, 1, -2147483648, 7, -2147483648, -7, 2147483647], [0, -1, -2147483647, -1, 0, -2147483648,
                  -100, -1], [-1, 2147483646, 2147483647, 100, -7, 1, 1, 1], [7, 2, 0, 7, 2147483647, -7, 2, -100]],
                 dtype=np.int32)
    m = fa.mean(fa.asarray(x))
    assert m.dtype == fa.float32 and float(m) == -3.125
    np.testing.assert_allclose(np.asarray(fa.var(fa.asarray(x), axis=1)), np.var(x, axis=1), rtol=1e-6)


def test_float32_sums_are_pairwise_in_every_backend(backend):
    """Triton's interpreter ran tl.reduce's custom combine one element at a time: the interpret backend's var of
    4096 float32 values 1e6 + N(0, 1) was 894 (truth 0.97). Sums use tl.sum (pairwise there, a tree on a GPU)."""
    rng = np.random.default_rng(0)
    x = (1e6 + rng.standard_normal(4096)).astype(np.float32)
    truth = np.var(x.astype(np.float64))
    assert abs(float(fa.var(fa.asarray(x))) - truth) < 1e-2 * truth
    assert abs(float(fa.sum(fa.asarray(x))) - np.sum(x.astype(np.float64))) < 1e-6 * 4096e6


def test_argmax_and_argmin_check_axis_and_keepdims_as_the_other_reductions():
    """argmax refused a numpy int axis (sum, max and numpy take it) and took keepdims='yes' as true."""
    x = fa.asarray(np.array([[0.0, 1.0, 5.0], [3.0, 4.0, 9.0]]))
    for op in (fa.argmax, fa.argmin):
        want = getattr(np, op.__name__)(np.asarray(x), axis=1).tolist()
        assert np.asarray(op(x, axis=np.int64(1))).tolist() == want
        with pytest.raises(TypeError, match=f"{op.__name__}: keepdims must be a bool"):
            op(x, keepdims="yes")
        with pytest.raises(TypeError, match=f"{op.__name__}: axis must be an int or None"):
            op(x, axis=1.0)
        with pytest.raises(TypeError, match=f"{op.__name__}: axis must be an int or None"):
            op(x, axis=True)
