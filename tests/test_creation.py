"""Creation functions against numpy: zeros/ones/full/empty/arange/linspace/eye/*_like and asarray."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flyarray as fa

from .conftest import assert_matches, scaled

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)


@settings(max_examples=scaled(15))
@given(shape=shapes, dtype=st.sampled_from(["bool", "int8", "uint8", "int32", "int64", "float16", "float32",
                                             "float64"]))
def test_zeros_ones_empty_full(backend, shape, dtype):
    assert_matches(fa.zeros(shape, dtype=dtype), np.zeros(shape, dtype))
    assert_matches(fa.ones(shape, dtype=dtype), np.ones(shape, dtype))
    assert fa.empty(shape, dtype=dtype).shape == shape
    fill = True if dtype == "bool" else 7
    assert_matches(fa.full(shape, fill, dtype=dtype), np.full(shape, fill, dtype))
    assert_matches(fa.zeros(shape, dtype=dtype) + fa.ones(shape, dtype=dtype), np.ones(shape, dtype))


def test_default_dtypes(backend):
    assert str(fa.zeros(3).dtype) == "fa.float32"
    assert str(fa.ones((2, 2)).dtype) == "fa.float32"
    assert str(fa.full((2,), 3).dtype) == "fa.int64"
    assert str(fa.full((2,), 3.5).dtype) == "fa.float32"
    assert str(fa.full((2,), True).dtype) == "fa.bool"
    assert str(fa.arange(4).dtype) == "fa.int64"
    assert str(fa.arange(0.0, 1.0, 0.25).dtype) == "fa.float32"
    assert str(fa.linspace(0, 1, 5).dtype) == "fa.float32"
    assert str(fa.eye(3).dtype) == "fa.float32"


def test_full_values(backend):
    assert_matches(fa.full((2, 3), -2.5, dtype=fa.float16), np.full((2, 3), -2.5, np.float16))
    assert_matches(fa.full((2,), 0.1, dtype=fa.float64), np.full((2,), 0.1, np.float64))  # no fp32 rounding
    assert_matches(fa.full((), 5), np.array(5, np.int64))
    assert_matches(fa.full((3,), np.iinfo(np.int64).max, dtype=fa.int64), np.full(3, np.iinfo(np.int64).max))


@pytest.mark.parametrize("args,kwargs", [
    ((5,), {}), ((2, 9), {}), ((9, 2, -2), {}), ((0,), {}), ((3, 3), {}), ((5, 1), {}),
    ((0.0, 1.0, 0.1), {}), ((-1.5, 2.0, 0.5), {"dtype": "float64"}), ((10,), {"dtype": "float16"}),
    ((1, 20, 3), {"dtype": "int32"}), ((4,), {"dtype": "uint8"}),
])
def test_arange(backend, args, kwargs):
    got = fa.arange(*args, **kwargs)
    want = np.arange(*args, dtype=kwargs.get("dtype", "int64" if all(isinstance(a, int) for a in args)
                                             else "float32"))
    assert_matches(got, want, rtol=1e-6, atol=1e-6)
    assert_matches(got * 2, want * 2, rtol=1e-6, atol=1e-6)  # fused into a kernel, not only exported


@pytest.mark.parametrize("start,stop,num,endpoint,dtype", [
    (0, 1, 5, True, None), (0, 1, 5, False, None), (-3, 7, 1, True, None), (2, 2, 4, True, None),
    (0, 10, 0, True, None), (1.5, -2.5, 9, True, "float64"), (0, 1, 11, True, "float16"),
    (0, 10, 5, True, "int32"), (-10, 0, 5, True, "int64"), (0, 7, 4, False, "uint8"),  # numpy: float, then cast
])
def test_linspace(backend, start, stop, num, endpoint, dtype):
    got = fa.linspace(start, stop, num, endpoint=endpoint, dtype=dtype)
    want = np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype or "float32")
    assert_matches(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("start,stop,num", [(0.1, 0.7, 7), (1, 0, 4), (-3.3, 7.7, 11), (0, 1, 1000)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_linspace_is_exact(backend, start, stop, num, dtype):
    """Every value is numpy's float64 linspace rounded once to the dtype (stop itself included), fused
    or not: the generated ramp runs in float64 as the reference does, and a float16 ramp holds float16s."""
    want = torch.tensor(np.linspace(start, stop, num)).to(getattr(torch, dtype)).double().numpy()
    ramp = fa.linspace(start, stop, num, dtype=dtype)
    np.testing.assert_array_equal(np.asarray(fa.astype(ramp, fa.float64)), want)  # fused with the widening
    np.testing.assert_array_equal(np.asarray(fa.astype(ramp * 1, fa.float64)), want)
    assert np.asarray(fa.arange(0, 1, 0.1))[-1] == np.float32(0.9)


@pytest.mark.parametrize("n,m,k", [(3, None, 0), (3, 5, 1), (4, 2, -1), (5, 5, 7), (0, 3, 0), (2, 6, -3), (1, 1, 0)])
@pytest.mark.parametrize("dtype", [None, "int32", "bool"])
def test_eye(backend, n, m, k, dtype):
    got = fa.eye(n, m, k=k, dtype=dtype)
    assert_matches(got, np.eye(n, m, k=k, dtype=dtype or "float32"))
    assert_matches(got[::-1, 1:] if got.ndim == 2 else got, np.eye(n, m, k=k, dtype=dtype or "float32")[::-1, 1:])


def test_like_functions(backend):
    x = fa.asarray(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert_matches(fa.zeros_like(x), np.zeros((2, 3), np.int16))
    assert_matches(fa.ones_like(x), np.ones((2, 3), np.int16))
    assert_matches(fa.full_like(x, 9), np.full((2, 3), 9, np.int16))
    assert_matches(fa.full_like(x, 9, dtype=fa.float32), np.full((2, 3), 9, np.float32))
    assert fa.empty_like(x).shape == (2, 3) and str(fa.empty_like(x).dtype) == "fa.int16"
    assert_matches(fa.ones_like(x, dtype="bool"), np.ones((2, 3), bool))


# ---- asarray -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("obj,want", [
    ([1, 2, 3], np.array([1, 2, 3], np.int64)),
    ([[1.0, 2.0], [3.0, 4.0]], np.array([[1, 2], [3, 4]], np.float32)),  # the default float
    ([True, False], np.array([True, False])),
    (3, np.array(3, np.int64)), (2.5, np.array(2.5, np.float32)), (True, np.array(True)),
    ((1, 2), np.array([1, 2], np.int64)), ([], np.zeros((0,), np.float32)),
    (np.float64(1.25), np.array(1.25, np.float64)), (np.int8(-3), np.array(-3, np.int8)),
])
def test_asarray_from_python_and_numpy_scalars(backend, obj, want):
    got = fa.asarray(obj)
    assert_matches(got, want)


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32",
                                   "float64"])
def test_asarray_from_numpy_and_torch_keeps_dtype(backend, dtype):
    v = (np.arange(12) % 5).astype(dtype).reshape(3, 4)
    assert_matches(fa.asarray(v), v)
    assert_matches(fa.asarray(torch.from_numpy(v.copy())), v)
    assert_matches(fa.asarray(v, dtype="float64"), v.astype(np.float64))
    assert_matches(fa.asarray(v.tolist(), dtype=dtype), v)


@pytest.mark.parametrize("make", [
    lambda: np.arange(10, dtype=np.float32)[::-1],
    lambda: np.arange(12, dtype=np.int32).reshape(3, 4)[::-1, ::-2],
    lambda: np.arange(12, dtype=np.float64).reshape(3, 4).T,
    lambda: np.arange(6, dtype=">i4"),
    lambda: np.broadcast_to(np.arange(3, dtype=np.float32), (4, 3)),  # read-only, zero strides
    lambda: np.array(7.0, dtype=np.float16),  # 0-d
])
def test_asarray_from_unusual_numpy_layouts(backend, make):
    v = make()
    got = fa.asarray(v)
    assert got.shape == v.shape
    assert_matches(got + 0, v.astype(v.dtype.newbyteorder("=")) + 0, check_dtype=False)
    assert_matches(got, v.astype(v.dtype.newbyteorder("=")))


def test_asarray_copy_semantics():
    t = torch.arange(4, dtype=torch.float32)
    shared = fa.asarray(t)
    copied = fa.asarray(t, copy=True)
    t.add_(10)
    np.testing.assert_array_equal(np.asarray(shared), [10, 11, 12, 13])
    np.testing.assert_array_equal(np.asarray(copied), [0, 1, 2, 3])
    with pytest.raises(ValueError):
        fa.asarray([1, 2], copy=False)
    with pytest.raises(ValueError):
        fa.asarray(t, dtype=fa.float64, copy=False)


def test_asarray_takes_the_buffer_protocol():
    """The array API's asarray takes SupportsBufferProtocol: array.array, memoryview, bytearray (numpy reads
    the format); writable memory is shared, read-only memory copied (so copy=False refuses it)."""
    import array
    buf = array.array("d", [1.5, 2.5])
    x = fa.asarray(buf)
    assert x.dtype == fa.float64 and x.tolist() == [1.5, 2.5]
    buf[0] = 7.0
    assert x.tolist() == [7.0, 2.5]                             # the same memory
    assert fa.asarray(buf, copy=True).tolist() == [7.0, 2.5]
    snapshot = fa.asarray(buf, copy=True)
    buf[1] = 0.0
    assert snapshot.tolist() == [7.0, 2.5]
    m = memoryview(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert fa.asarray(m).shape == (2, 3) and fa.asarray(m, dtype=fa.float64).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert fa.asarray(bytearray(b"\x01\x02")).tolist() == [1, 2]
    assert fa.asarray(b"\x01\x02").dtype == fa.uint8            # read-only: copied
    with pytest.raises(ValueError, match="copy=False"):
        fa.asarray(b"\x01\x02", copy=False)
    with pytest.raises(TypeError, match="buffer protocol"):
        fa.asarray(object())


def test_asarray_of_array_and_from_dlpack(backend):
    x = fa.asarray(np.arange(3, dtype=np.int32))
    assert fa.asarray(x) is x
    assert_matches(fa.asarray(x, dtype=fa.float32), np.arange(3, dtype=np.float32))
    assert_matches(fa.from_dlpack(torch.arange(5)), np.arange(5))
    assert_matches(fa.from_dlpack(np.arange(5, dtype=np.float32)), np.arange(5, dtype=np.float32))


def test_creation_outputs_are_lazy_and_cheap(interpret):
    fa.reset_stats()
    z = fa.zeros((3, 4))
    o = fa.ones((3, 4))
    r = fa.arange(12)
    assert fa.stats()["kernels_launched"] == 0
    assert_matches(fa.reshape(r, (3, 4)) + z + o, np.arange(12).reshape(3, 4) + 1.0, check_dtype=False)
    assert fa.stats()["kernels_launched"] == 1  # the constants and the ramp fuse into the consumer


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
@pytest.mark.parametrize("start, stop, num", [(-2.5, 0.7, 10), (16777217.0, 0.7, 7), (0, 10, 7), (1e-3, 3.3, 33)])
def test_linspace_ends_on_stop_in_every_dtype(backend, dtype, start, stop, num):
    """numpy writes stop into the last slot; start + (num - 1) * step misses it by an ulp in float64
    (0.7000000000000002), and floors to stop - 1 for an integer result."""
    got = np.asarray(fa.linspace(start, stop, num, dtype=dtype))
    np.testing.assert_array_equal(got, np.linspace(start, stop, num, dtype=dtype))


def test_asarray_of_a_list_of_arrays_stacks_them():
    got = fa.asarray([fa.ones(2), fa.asarray(np.zeros(2)), [5.0, 6.0]])
    np.testing.assert_array_equal(np.asarray(got), [[1.0, 1.0], [0.0, 0.0], [5.0, 6.0]])
    with pytest.raises(ValueError, match="one shape"):
        fa.asarray([fa.ones(2), fa.ones(3)])
