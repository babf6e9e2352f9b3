"""Indexing against numpy: x[key] (basic, integer arrays, boolean masks), take, take_along_axis, nonzero,
and x.at[key].set/add/multiply/divide/min/max/get; their gradients, vmap, fusion and errors."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flyarray as fa
from tests.conftest import assert_matches, lazy, scaled

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)

KEYS = [
    (np.array([1, 0]),),
    (slice(None), [2, 0, 1]),
    (0, slice(None), np.array([[1], [3]])),
    (np.array([1, 0]), slice(None), np.array([3, 2])),  # separated: the broadcast dims go first
    (..., np.array([-1, 0])),
    (X > 5,),
    (slice(None), X[0] > 3),
    (None, [1], 1),
    (np.array([[1, 0]]), np.array([[2], [1]])),
    (slice(None, None, -1), [0, 0]),
    (1, [2, 1], slice(1, None, 2)),
]


@pytest.mark.parametrize("key", KEYS, ids=range(len(KEYS)))
def test_getitem_matches_numpy(key):
    assert_matches(fa.asarray(X)[key], X[key])


def test_lazy_integer_indices_wrap_negatives_and_clamp():
    x = fa.asarray(X)
    i = fa.asarray(np.array([2, -1, 0, 9, -9]))
    assert_matches(x[:, i], X[:, [2, -1, 0, 2, 0]])  # JAX's rule: lazy indices clamp
    assert_matches(x[0, fa.asarray(np.array(1)), 2], X[0, 1, 2])  # a 0-d index array
    assert_matches(fa.take(x, fa.asarray([7]), axis=1), X[:, [-1]])  # evaluated fa arrays are device data too
    with pytest.raises(IndexError):
        fa.take(x, [7], axis=1)  # host indices are checked


def test_boolean_mask_of_a_lazy_array():
    x = fa.asarray(X) * 2
    assert_matches(x[x > 20], (X * 2)[X * 2 > 20])


def test_torch_and_list_indices():
    import torch
    x = fa.asarray(X)
    assert_matches(x[torch.tensor([1, 0])], X[[1, 0]])
    assert_matches(x[[[0], [1]], [0, 2]], X[[[0], [1]], [0, 2]])


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_take(axis):
    idx = np.array([[0, 1], [1, 0]])
    assert_matches(fa.take(fa.asarray(X), fa.asarray(idx), axis=axis), np.take(X, idx, axis=axis))
    assert_matches(fa.take(fa.asarray(X), idx.tolist(), axis=axis), np.take(X, idx, axis=axis))


def test_take_clip_mode_clamps_host_indices_too():
    """mode='clip' clamps indices given on the host (lists, numpy, ints) as it does fa arrays (it raised IndexError);
    a negative index clamps to 0, as numpy's and JAX's take (x.at[i].get(mode='clip') counts it from the end first,
    as JAX's indexing does)."""
    X = np.arange(24.0).reshape(2, 3, 4)
    x = fa.asarray(X)
    idx = [5, -1, -7, 0, 3]
    want = np.take(X, [3, 0, 0, 0, 3], axis=2)
    assert_matches(fa.take(x, idx, axis=2, mode="clip"), np.take(X, idx, axis=2, mode="clip"))
    assert_matches(fa.take(x, idx, axis=2, mode="clip"), want)
    assert_matches(fa.take(x, np.asarray(idx), axis=2, mode="clip"), want)
    assert_matches(fa.take(x, fa.asarray(idx), axis=2, mode="clip"), want)
    assert_matches(fa.take(x, 99, mode="clip"), np.asarray(23.0))
    with pytest.raises(IndexError, match="size 0"):
        fa.take(fa.zeros((2, 0)), [0], axis=1, mode="clip")


def test_take_wrap_mode():
    assert_matches(fa.take(fa.asarray(X), [5, -7], axis=2, mode="wrap"), np.take(X, [5, -7], axis=2, mode="wrap"))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_take_along_axis(axis):
    idx = np.argsort(-X, axis=axis)
    assert_matches(fa.take_along_axis(fa.asarray(X), fa.asarray(idx), axis=axis), np.take_along_axis(X, idx, axis))
    narrow = np.take(idx, [0], axis=axis)  # broadcasting the other axes
    assert_matches(fa.take_along_axis(fa.asarray(X), narrow, axis=axis), np.take_along_axis(X, narrow, axis))


def test_nonzero_evaluates_and_matches_numpy():
    m = X % 3 == 0
    got = fa.nonzero(fa.asarray(X) % 3 == 0)
    for g, w in zip(got, np.nonzero(m)):
        assert_matches(g, w)
    with pytest.raises(ValueError, match="0-d"):
        fa.nonzero(fa.asarray(1.0))


UFUNC = {"add": np.add, "multiply": np.multiply, "min": np.minimum, "max": np.maximum, "divide": np.divide}
UPDATE_KEYS = [
    ((0, slice(1, 3)), 7.0),
    ((slice(None), slice(None, None, -2)), np.full((2, 2, 4), 5, np.float32)),
    ((slice(None), slice(0, 3, 2), 1), np.array([[1, 2], [3, 4]], np.float32)),
    ((1,), 3.0),
    ((Ellipsis,), 1.0),
    ((None, 0, 2), np.arange(4, dtype=np.float32)),
    ((X > 10,), -1.0),
    ((X > 10,), np.arange(13, dtype=np.float32)),
    ((np.array([0, 0, 1]), 1), np.arange(12, dtype=np.float32).reshape(3, 4)),
    ((slice(None), np.array([2, 2, 0]), slice(0, 2)), 2.0),
]


def _numpy_update(key, mode, v):
    ref = X.copy()
    with np.errstate(divide="ignore"):
        _apply(ref, key, mode, v)
    return ref


def _apply(ref, key, mode, v):
    if mode == "set":
        ref[key] = v
    elif any(isinstance(k, np.ndarray) and k.dtype != bool for k in key):
        UFUNC[mode].at(ref, key, v)  # unbuffered: repeated indices accumulate
    else:
        ref[key] = UFUNC[mode](ref[key], v)


@pytest.mark.parametrize("mode", ["set", "add", "multiply", "divide", "min", "max"])
@pytest.mark.parametrize("case", range(len(UPDATE_KEYS)))
def test_at_updates_match_numpy(case, mode):
    key, v = UPDATE_KEYS[case]
    if mode == "set" and case == 9:
        return  # repeated indices: which value lands is unspecified for set
    x = fa.asarray(X)
    got = getattr(x.at[key], mode)(fa.asarray(v) if isinstance(v, np.ndarray) else v)
    assert_matches(got, _numpy_update(key, mode, v))
    assert_matches(x, X)  # x itself never changes


def test_at_get_and_lazy_indices_drop_out_of_range_updates():
    x = fa.asarray(X)
    assert_matches(x.at[:, [1]].get(mode="clip", indices_are_sorted=True), X[:, [1]])
    assert_matches(x.at[[1]].set(0.0, mode="drop", unique_indices=True), np.concatenate([X[:1], 0 * X[1:]]))
    y = fa.zeros(4).at[fa.asarray(np.array([0, 0, 3, 7, -9]))].add(1.0)
    assert_matches(y, np.array([2, 0, 0, 1], np.float32))


def test_at_on_int_and_bool_arrays():
    a = np.arange(6, dtype=np.int32)
    assert_matches(fa.asarray(a).at[[1, 1, 4]].add(5), a + np.array([0, 10, 0, 0, 5, 0], np.int32))
    b = np.zeros(4, bool)
    assert_matches(fa.asarray(b).at[1:3].set(True), np.array([False, True, True, False]))
    assert_matches(fa.asarray(b).at[[2, 2]].add(True), np.array([False, False, True, False]))


@pytest.mark.parametrize("key", [[1], np.array([1]), np.array([False, True, False, False])])
def test_at_with_a_promoting_value_leaves_the_elements_it_does_not_index_exactly_as_they_were(backend, key):
    """The scatter ran the whole array through the promoted dtype and back: an int64 2**31 - 1 nobody indexed
    came back as 2**31 (float32), an int16 30001 as 30000 (float16), a uint32 2**31 + 5 as 2**31."""
    big = np.array([2**31 - 1, 0, 16777217, 2**31 - 1], np.int64)
    assert_matches(fa.asarray(big).at[key].add(np.float32(1.5)), np.array([2**31 - 1, 1, 16777217, 2**31 - 1]))
    short = np.array([30001, 5, 30001, -30001], np.int16)
    assert_matches(fa.asarray(short).at[key].max(np.float16(7)), np.array([30001, 7, 30001, -30001], np.int16))
    wide = np.array([2**31 + 5, 1, 2**31 + 5, 7], np.uint32)
    assert_matches(fa.asarray(wide).at[key].multiply(2.5), np.array([2**31 + 5, 2, 2**31 + 5, 7], np.uint32))


def test_basic_and_scalar_mask_updates_stay_one_fused_kernel(backend):
    x = fa.asarray(X) * 2.0
    y = x.at[:, 1:3].set(0.0).at[x > 30].multiply(-1.0) + 1.0
    e = fa.explain(y)
    assert e.n_kernels == 1 and e.steps[0].kind == "fused kernel"
    ref = X * 2
    ref[:, 1:3] = 0
    ref[X * 2 > 30] *= -1
    assert_matches(y, ref + 1)


def test_interpret_backend_gather_scatter(interpret):
    x = fa.asarray(X[0])
    assert_matches(x[[2, 0]] * 2.0, X[0][[2, 0]] * 2)
    want = X[0].copy()
    np.add.at(want, ([0, 0], [1, 3]), 1.0)
    assert_matches(x.at[[0, 0], [1, 3]].add(1.0), want)
    want = X[0].copy()
    want[:, 1:3] = -1
    assert_matches(x.at[:, 1:3].set(-1.0), want)
    want = X[0].copy()
    want[1:, ::-2] *= np.array([2, 3], np.float32)
    assert_matches(x.at[1:, ::-2].multiply(fa.asarray(np.array([2, 3], np.float32))), want)


def test_grad_through_take_and_at_add():
    idx = fa.asarray(np.array([0, 0, 2]))
    g = fa.grad(lambda t: fa.sum(fa.take(t, idx) * fa.asarray(np.array([1., 2., 3.], np.float32))))(fa.ones(3))
    assert_matches(g, np.array([3, 0, 3], np.float32))
    g = fa.grad(lambda v: fa.sum(fa.zeros(4).at[np.array([1, 1, 3])].add(v) ** 2))(
        fa.asarray(np.array([1., 2., 3.], np.float32)))
    assert_matches(g, np.array([6, 6, 6], np.float32))
    # set: the overwritten entries of x get no gradient, the values get theirs
    gx, gv = fa.grad(lambda x, v: fa.sum(x.at[[0, 2]].set(v) * fa.arange(4.0)), argnums=(0, 1))(
        fa.ones(4), fa.ones(2))
    assert_matches(gx, np.array([0, 1, 0, 3], np.float32))
    assert_matches(gv, np.array([0, 2], np.float32))
    # a basic-slice update is where/pad: its gradient is automatic
    gx = fa.grad(lambda x: fa.sum(x.at[1:3].multiply(3.0)))(fa.ones(4))
    assert_matches(gx, np.array([1, 3, 3, 1], np.float32))
    # divide by an array over part of x: outside the region x is divided by 1, not 0 (the where drops
    # that quotient, but its derivative 1/0 made the gradient NaN there)
    x, v = np.arange(1.0, 7.0).reshape(2, 3), np.array([2.0, 4.0])
    gx, gv = fa.grad(lambda a, b: fa.sum(a.at[0, 1:].divide(b)), argnums=(0, 1))(fa.asarray(x), fa.asarray(v))
    assert_matches(gx, np.array([[1.0, 0.5, 0.25], [1.0, 1.0, 1.0]]))
    assert_matches(gv, -x[0, 1:] / v ** 2)


def test_jvp_through_gather():
    x = fa.asarray(np.array([1., 2., 3.], np.float32))
    _, t = fa.jvp(lambda a: a[[2, 2, 0]] * 2.0, (x,), (fa.ones(3),))
    assert_matches(t, np.array([2, 2, 2], np.float32))


def test_vmap_of_gather_and_scatter():
    rows = fa.asarray(X[0])
    idx = fa.asarray(np.array([[0, 1], [2, 2], [3, 0]]))
    want = np.take_along_axis(X[0], np.array([[0, 1], [2, 2], [3, 0]]), 1)
    assert_matches(fa.vmap(lambda r, i: r[i])(rows, idx), want)
    got = fa.vmap(lambda r, i: r.at[i].add(1.0))(rows, idx)
    want = X[0].copy()
    for r, i in enumerate([[0, 1], [2, 2], [3, 0]]):
        np.add.at(want[r], i, 1.0)
    assert_matches(got, want)


@settings(max_examples=scaled(30))
@given(st.data())
def test_random_integer_keys_match_numpy(data):
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    key = []
    for n in shape:
        kind = data.draw(st.sampled_from(["int", "slice", "array", "none"]))
        if kind == "int":
            key.append(data.draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            key.append(slice(data.draw(st.integers(-n, n)), data.draw(st.integers(-n, n)),
                             data.draw(st.sampled_from([1, 2, -1]))))
        elif kind == "array":
            key.append(np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=3))))
        else:
            key += [None, slice(None)]
    arrays = [k for k in key if isinstance(k, np.ndarray)]
    if len({a.shape for a in arrays}) > 1:
        key = [k if not isinstance(k, np.ndarray) else k[:1] for k in key]
    key = tuple(key)
    assert_matches(fa.asarray(x)[key], x[key])
    v = np.float32(data.draw(st.integers(-3, 3)))
    assert_matches(fa.asarray(x).at[key].add(v), _np_add_at(x, key, v))


def _np_add_at(x, key, v):
    ref = x.copy()
    np.add.at(ref, key, v)
    return ref


def test_errors_before_work(no_evaluation):
    x = lazy((3, 4))
    with pytest.raises(IndexError, match="out of bounds for axis 1 with size 4"):
        x[:, [0, 4]]
    with pytest.raises(IndexError, match="out of bounds"):
        x.at[5].set(1.0)
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, [0]]
    with pytest.raises(TypeError, match="integer or bool dtype"):
        x[np.array([0.5])]
    with pytest.raises(TypeError, match="boolean scalar"):
        x[True]
    with pytest.raises(TypeError, match="unsupported index"):
        x["a"]
    with pytest.raises(ValueError, match="do not broadcast"):
        x.at[:, [0, 1]].set(fa.ones(5))
    with pytest.raises(ValueError, match="do not broadcast"):
        x.at[0].add(fa.ones(3))
    with pytest.raises(TypeError, match="divide needs a float"):
        (fa.asarray(np.zeros(3, np.int32)) + 1).at[0].divide(2)
    with pytest.raises(TypeError, match="integer array"):
        fa.take(x, 1.5)
    with pytest.raises(ValueError, match="rank"):
        fa.take_along_axis(x, np.zeros(3, np.int64), axis=0)
    with pytest.raises(ValueError, match="mode"):
        fa.take(x, [0], mode="raise")
    with pytest.raises(ValueError, match="mode must be"):
        x.at[[0]].get(mode="wrap")
    with pytest.raises(ValueError, match="mode must be"):
        x.at[[0]].set(1.0, mode="fill")


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64"])
def test_gather_and_scatter_keep_every_dtype(dtype):
    x = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
    v = np.ones((3, 4), dtype)
    idx = np.array([0, 0, 2])
    assert_matches(fa.take(fa.asarray(x), [3, 1], axis=1), x[:, [3, 1]])
    want = x.copy()
    want[idx] = v
    assert_matches(fa.asarray(x).at[idx].set(fa.asarray(v)), want)
    want = x.copy()
    np.add.at(want, idx, v) if dtype != "bool" else np.logical_or.at(want, idx, v)
    assert_matches(fa.asarray(x).at[fa.asarray(idx)].add(fa.asarray(v)), want)
    assert_matches(fa.asarray(x).at[1:, ::2].set(v[0, 0]), np.where(
        (np.arange(3)[:, None] >= 1) & (np.arange(4) % 2 == 0), v[0, 0], x))


def test_at_update_over_reversed_whole_axes_keeps_the_key_order(backend):
    """x.at[::-1] selects every element in reverse: the values land reversed (as numpy's x[::-1] = v),
    also through grad; partial reversed regions the same."""
    v = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    want = np.zeros(4, np.float32)
    want[::-1] = v
    assert_matches(fa.zeros(4).at[::-1].set(fa.asarray(v)), want)
    assert_matches(fa.zeros(4).at[::-1].add(fa.asarray(v)), want)
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    for key, vals in (((slice(None), slice(None, None, -1)), w), ((slice(None, None, -1),) * 2, w),
                      ((slice(None, None, -1), slice(1, None)), w[:, :2]), ((slice(None), slice(None, None, -2)), w[:, :2])):
        want = np.zeros((2, 3), np.float32)
        want[key] = vals
        assert_matches(fa.zeros((2, 3)).at[key].set(fa.asarray(vals)), want)
    g = fa.grad(lambda t: fa.sum(fa.zeros(4).at[::-1].set(t) * fa.arange(4.0)))(fa.asarray(v))
    assert_matches(g, np.array([3.0, 2.0, 1.0, 0.0], np.float32))


def test_at_update_combines_in_the_promoted_dtype_then_casts_whatever_the_key(backend):
    """JAX's rule, one for every key kind (outputs of jax 0.10.2): the op runs in the dtype x and the values
    promote to and its result is cast back; set casts the values. (Casting the values first gave -3 and 6.)"""
    x = fa.asarray(np.array([-5, 3, 7], np.int32))
    for key in (0, [0], np.array([True, False, False]), slice(0, 1)):
        assert_matches(x.at[key].add(2.5), np.array([-2, 3, 7], np.int32))
        assert_matches(x.at[key].set(2.5), np.array([2, 3, 7], np.int32))
    for key in (1, [1]):
        assert_matches(x.at[key].multiply(2.5), np.array([-5, 7, 7], np.int32))
    with pytest.raises(ValueError, match="cannot cast the update value"):
        x.at[0].set(float("nan"))
    with pytest.raises(ValueError, match="cannot cast the update value"):
        x.at[[0]].add(float("inf"))
    x = fa.asarray(np.array([1, 2, 3, 4], np.int32))
    assert_matches(x.at[[1, 1]].add(0.6), np.array([1, 3, 3, 4], np.int32))   # 2 + 0.6 + 0.6, then cast
    assert_matches(x.at[1:3].multiply(fa.asarray(np.array([2.7, 1.5], np.float32))), np.array([1, 5, 4, 4], np.int32))
    assert_matches(x.at[[0, 0]].power(fa.asarray(np.array([0.5, 2.0]))), np.array([1, 2, 3, 4], np.int32))
    u = fa.asarray(np.array([0, 5, 200], np.uint8))
    minus_one = fa.asarray(np.array(-1, np.int32))
    for key in (0, [0]):   # max(0, -1) in int32 is 0 (the values cast first made -1 255)
        assert_matches(u.at[key].max(minus_one), np.array([0, 5, 200], np.uint8))
    assert_matches(u.at[[0, 2]].min(fa.asarray(np.array([-1, 300], np.int32))), np.array([255, 5, 200], np.uint8))
    h = fa.asarray(np.array([1.0, 2.0], np.float16))
    thousandth = np.float32(1e-3)
    assert_matches(h.at[[0, 0]].add(fa.asarray(np.array([thousandth] * 2))), np.array([1.002, 2.0], np.float16))


def test_at_divide_and_power_cast_the_values_first_and_casts_back_saturate(backend):
    """JAX's divide and power multiply the values into ones of x's dtype (a cast first); a float result cast
    back into an integer x saturates as XLA's convert does (outputs of jax 0.10.2; a re-fuzz found both)."""
    x = fa.asarray(np.array([3, -6, 7], np.int32))
    for key in (0, [0], slice(0, 1)):
        assert_matches(x.at[key].power(2.5), np.array([9, -6, 7], np.int32))
    assert_matches(x.at[1].power(fa.asarray(np.float32(2.5))), np.array([3, 36, 7], np.int32))
    h = fa.asarray(np.array([1.0, 1.0], np.float16))
    assert_matches(h.at[0].divide(fa.asarray(np.float32(70000.0))), np.array([0.0, 1.0], np.float16))
    u = fa.asarray(np.array([5, 7, 9], np.uint8))
    for key in (0, [0]):
        assert_matches(u.at[key].min(fa.asarray(np.float32(-1.4))), np.array([0, 7, 9], np.uint8))
    assert_matches(u.at[1].add(fa.asarray(np.float16(-8.5))), np.array([5, 0, 9], np.uint8))
    assert_matches(u.at[[2]].multiply(-1.5), np.array([5, 7, 0], np.uint8))
    i8 = fa.asarray(np.array([100, 1], np.int8))
    assert_matches(i8.at[0].add(fa.asarray(np.float32(156.9))), np.array([127, 1], np.int8))
    assert_matches(i8.at[np.array([True, False])].set(fa.asarray(np.float32(-1e9))), np.array([-128, 1], np.int8))


def test_uint64_indices_past_int64_are_out_of_range_not_negative(backend):
    x = fa.asarray(np.arange(5.0))
    with pytest.raises(IndexError, match="out of bounds"):
        x[np.array([2**64 - 1], np.uint64)]
    lazy = fa.asarray(np.array([2**64 - 1, 3], np.uint64))
    assert_matches(x.at[lazy].set(-1.0), np.array([0.0, 1.0, 2.0, -1.0, 4.0]))  # out of range: dropped
    assert_matches(x[lazy], np.array([4.0, 3.0]))  # reads clamp, as documented


@pytest.mark.parametrize("key", [
    (slice(None), np.array([0, 1, 2]), ..., np.array([3, 2, 1])),
    (np.array([1]), np.array([0, 2]), ..., 3),
    (None, np.array([[True, False, True], [False, True, False]]), ..., 2),
], ids=["arrays-around-it", "ints-and-arrays", "mask-and-int"])
def test_an_ellipsis_of_no_axes_still_parts_the_array_indices(backend, key):
    """numpy puts the broadcast dims first when anything -- an ellipsis that stands for no axis included --
    sits between the advanced indices; reads and .at updates both follow it."""
    x = np.arange(24).reshape(2, 3, 4)
    got = fa.asarray(x)[key]
    np.testing.assert_array_equal(np.asarray(got), x[key])
    want = x.copy()
    want[key] = -np.arange(x[key].size).reshape(x[key].shape)
    np.testing.assert_array_equal(np.asarray(fa.asarray(x).at[key].set(-np.arange(x[key].size).reshape(x[key].shape))),
                                  want)


def test_take_along_axis_refuses_a_0d_array():
    with pytest.raises(ValueError, match="take_along_axis: x must have at least one dimension"):
        fa.take_along_axis(fa.asarray(np.int32(1)), np.array(0))


def test_an_empty_float_ndarray_is_no_index_but_an_empty_list_is():
    a = fa.asarray(np.arange(6.0).reshape(2, 3))
    assert a[[]].shape == (0, 3)
    for bad in (lambda: a[np.zeros(0)], lambda: fa.take(a, np.zeros(0), axis=0)):
        with pytest.raises(TypeError, match="integer or bool dtype"):
            bad()


def test_set_with_repeated_indices_lands_the_last_value_and_only_it_gets_a_gradient(backend):
    x = np.zeros((4, 2))
    idx = np.array([[2, 0], [2, 9 - 10]])  # 2 twice, -1 (row 3) once, 0 once
    vals = np.arange(8.0).reshape(2, 2, 2)
    want = x.copy()
    want[idx] = vals  # numpy: the last of the repeated rows lands
    for key in (idx, fa.asarray(idx)):
        assert_matches(fa.asarray(x).at[key].set(fa.asarray(vals)), want)
    gv = fa.grad(lambda v: fa.sum(fa.asarray(x).at[fa.asarray(idx)].set(v) * fa.arange(8.0).reshape(4, 2)))(
        fa.asarray(vals))
    weights = np.arange(8.0).reshape(4, 2)
    landed = np.array([[False, True], [True, True]])  # the first write to row 2 is overwritten
    assert_matches(gv, np.where(landed[..., None], weights[idx], 0.0))
    _, tangent = fa.jvp(lambda v: fa.asarray(x).at[fa.asarray(idx)].set(v), (fa.asarray(vals),), (fa.asarray(vals),))
    assert_matches(tangent, want)


C = (np.arange(12).reshape(3, 4) + 1j * (np.arange(12).reshape(3, 4) % 5 - 2)).astype(np.complex64) / 3


@pytest.mark.parametrize("key", [(np.array([0, 2, 0, 0]),), (slice(None), np.array([3, 1, 3])), (1, slice(0, 3))])
@pytest.mark.parametrize("mode", ["add", "multiply", "divide"])
def test_complex_at_updates_match_numpy(backend, key, mode):
    """Complex scatters: multiply accumulates repeated indices in order (torch has no complex
    index_reduce); divide is allowed for complex arrays as for float ones."""
    x = fa.asarray(C)
    v = (np.arange(12).reshape(3, 4) * (0.5 - 1j) + 1j).astype(np.complex64)[:x[key].shape[0], :x[key].shape[-1]]
    v = v.reshape(x[key].shape) if v.size == x[key].size else v[0, :x[key].shape[-1]]
    want = C.copy()
    _apply(want, key, mode, v)
    got = np.asarray(getattr(x.at[key], mode)(fa.asarray(v)))
    # torch's complex product may round differently from numpy's by an ulp; repeated indices divide by the
    # product of their values (documented), not in turn
    np.testing.assert_allclose(got, want, rtol={"add": 0, "multiply": 1e-6, "divide": 1e-5}[mode])
    assert_matches(x, C)
    # Gaussian integers multiply exactly: repeated indices accumulate every factor
    z = np.array([1 + 1j, 2 - 1j, 3j], np.complex64)
    want = z.copy()
    np.multiply.at(want, [0, 2, 0, 0], np.array([1j, 2, 1 - 1j, -3], np.complex64))
    assert_matches(fa.asarray(z).at[[0, 2, 0, 0]].multiply(fa.asarray(np.array([1j, 2, 1 - 1j, -3], np.complex64))),
                   want)


def test_update_dtype_errors_come_when_recorded(no_evaluation):
    """Ordering updates refuse complex arrays, arithmetic updates refuse float8 (a storage format), with an
    integer-array key as with a basic one; float8 set stays a move."""
    c = lazy((3,), "complex64")
    for key in ([0, 0], 1):
        for mode in ("min", "max"):
            with pytest.raises(TypeError, match=f"at\\[\\].{mode} does not accept fa.complex64"):
                getattr(c.at[key], mode)(1j)
    f8 = fa.exp(fa.asarray(np.zeros(4, np.float32))).astype(fa.float8_e4m3fn)
    for key in ([0, 0, 3], slice(1, 3), fa.asarray(np.array([1]))):
        for mode in ("add", "multiply", "divide", "min", "max"):
            with pytest.raises(TypeError, match=f"at\\[\\].{mode} does not accept fa.float8_e4m3fn"):
                getattr(f8.at[key], mode)(2.0)
        f8.at[key].set(2.0)


def test_at_modes_and_power_as_jax(backend):
    """JAX 0.10.2's answers (run beside these): get(mode='fill'|'drop') reads fill_value (NaN, the lowest signed /
    highest unsigned integer by default) at out-of-range indices; updates with mode='clip' clamp (a negative index
    counts from the end first); .power raises to the product of the exponents at repeated indices."""
    x = fa.asarray(np.arange(5.0))
    i = fa.asarray(np.array([2, 9, -1, -9]))
    assert x.at[np.array([2, 2])].power(2.0).tolist() == [0.0, 1.0, 16.0, 3.0, 4.0]
    assert x.at[1:3].power(3.0).tolist() == [0.0, 1.0, 8.0, 3.0, 4.0]
    assert x.at[i].get(mode="fill", fill_value=-1).tolist() == [2.0, -1.0, 4.0, -1.0]
    np.testing.assert_array_equal(np.asarray(x.at[i].get(mode="drop")), [2.0, np.nan, 4.0, np.nan])
    assert fa.arange(5).at[np.array([2, 9])].get(mode="fill").tolist() == [2, np.iinfo(np.int64).min]
    assert fa.asarray(np.arange(5, dtype=np.uint8)).at[[2, 9]].get(mode="fill").tolist() == [2, 255]
    assert x.at[9].get(mode="fill", fill_value=-1.0).tolist() == -1.0
    assert x.at[i].set(10.0, mode="clip").tolist() == [10.0, 1.0, 10.0, 3.0, 10.0]
    assert x.at[i].add(10.0, mode="clip").tolist() == [10.0, 1.0, 12.0, 3.0, 24.0]
    assert x.at[i].get(mode="clip", fill_value=-1.0).tolist() == [2.0, 4.0, 4.0, 0.0]   # ignored, as JAX's
    m = fa.asarray(np.arange(12.0).reshape(3, 4))
    assert m.at[fa.asarray(np.array([0, 5])), 1:3].get(mode="fill", fill_value=-1).tolist() == [[1.0, 2.0], [-1.0, -1.0]]
    with pytest.raises(ValueError, match="at\\[\\]: mode must be None or one of 'drop', 'clip'"):
        x.at[0].set(1.0, mode="fill")
    with pytest.raises(TypeError, match="at\\[\\].power does not accept bool"):
        fa.asarray(np.array([True])).at[0].power(True)


def test_take_fill_mode_and_nested_list_keys_as_jax(backend):
    """JAX 0.10.2's answers: take(mode='fill') reads fill_value (default NaN / lowest int) at out-of-range indices,
    negative ones in range counting from the end; a nested integer list key under an explicit at[] mode is device
    data too (it raised IndexError where a flat list or numpy array did not)."""
    x = fa.asarray(np.arange(5.0))
    assert fa.take(x, [5, -6, 1, -1], mode="fill", fill_value=-1.0).tolist() == [-1.0, -1.0, 1.0, 4.0]
    np.testing.assert_array_equal(np.asarray(fa.take(x, fa.asarray(np.array([5, -6, 1])), mode="fill")), [np.nan, np.nan, 1.0])
    assert fa.take(fa.arange(5), np.array([7]), mode="fill").tolist() == [np.iinfo(np.int64).min]
    got = fa.take(fa.asarray(np.arange(6.0).reshape(2, 3)), [[0, 3]], axis=1, mode="fill")
    np.testing.assert_array_equal(np.asarray(got), [[[0.0, np.nan]], [[3.0, np.nan]]])
    assert x.at[[[5], [3]]].get(mode="clip").tolist() == [[4.0], [3.0]]
    assert x.at[[[5], [3]]].add(10.0, mode="drop").tolist() == [0.0, 1.0, 2.0, 13.0, 4.0]
    with pytest.raises(ValueError, match="fill_value is used with mode='fill' only"):
        fa.take(x, [0], fill_value=1.0)


@pytest.mark.parametrize("shape", [(3, 0), (3, 0, 2)])
def test_gradients_of_gathers_from_arrays_with_an_empty_trailing_axis(backend, shape):
    """The gradient of x[idx] and take scatters rows of zero elements: zeros of x's shape (the scatter's reshape
    to (-1, 0) was ambiguous to torch)."""
    x = fa.asarray(np.zeros(shape, np.float32))
    for f in (lambda x: fa.sum(x[np.array([0, 1])]),
              lambda x: fa.sum(fa.take(x, fa.asarray(np.array([], np.int64)), axis=0)),
              lambda x: fa.sum(fa.take(x, fa.asarray(np.array([2, 2])), axis=0))):
        g = fa.grad(f)(x)
        assert g.shape == shape and g.dtype == fa.float32
