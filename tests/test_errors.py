"""Errors are raised when an op is recorded, before anything runs, and name what went wrong."""
import warnings

import numpy as np
import pytest
import torch

import flyarray as fa

from .conftest import lazy






def test_broadcast_error_names_both_shapes(no_evaluation):
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 3\)|\(4, 3\).*\(2, 3\)"):
        lazy((2, 3)) + lazy((4, 3))
    with pytest.raises(ValueError, match=r"\(5,\).*\(2, 4\)"):
        fa.where(lazy((5,)) > 0, lazy((5,)), lazy((2, 4)))
    with pytest.raises(ValueError, match=r"\(3,\)"):
        fa.broadcast_to(lazy((3,)), (2, 4))


@pytest.mark.parametrize("bad", ["float128", "complex256", "int4", object, "bfloat17"])
def test_unknown_dtype(no_evaluation, bad):
    with pytest.raises(TypeError, match="dtype"):
        fa.zeros((2,), dtype=bad)
    with pytest.raises(TypeError, match="dtype"):
        lazy((2,)).astype(bad)


def test_unsupported_input_dtypes(no_evaluation):
    with pytest.raises(TypeError):
        fa.asarray(np.zeros(3, np.clongdouble))  # complex64 and complex128 are supported; no wider one
    with pytest.raises(TypeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "ComplexHalf support is experimental"
        fa.asarray(torch.zeros(3, dtype=torch.complex32))
    with pytest.raises(TypeError):
        fa.bitwise_and(lazy((2,)), lazy((2,)))  # floats have no bits to and
    with pytest.raises(TypeError):
        fa.abs(fa.asarray(np.array([True])))


def test_mixed_devices(no_evaluation):
    cpu = lazy((3,))
    other = fa.asarray(torch.zeros(3, device="meta"))
    with pytest.raises(ValueError, match="device"):
        cpu + other


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixed_cpu_and_cuda():
    a = fa.asarray(torch.zeros(3))
    b = fa.asarray(torch.zeros(3, device="cuda"))
    with pytest.raises(ValueError, match="cpu.*cuda|cuda.*cpu"):
        a + b


@pytest.mark.parametrize("key", [5, -6, (0, 3), (slice(None), -4), (0, 0, 0)])
def test_index_out_of_range(no_evaluation, key):
    with pytest.raises(IndexError):
        lazy((5, 3))[key]


def test_reshape_size_mismatch_names_both_shapes(no_evaluation):
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 2\)"):
        fa.reshape(lazy((2, 3)), (4, 2))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        fa.reshape(lazy((2, 3)), (4, -1))
    with pytest.raises(ValueError):
        fa.reshape(lazy((2, 3)), (-1, -1))


@pytest.mark.parametrize("obj", [object(), "text", {"a": 1}, None])
def test_non_dlpack_objects_are_type_errors(obj):
    with pytest.raises(TypeError):
        fa.from_dlpack(obj)
    if obj is not None and not isinstance(obj, str):
        with pytest.raises(TypeError):
            fa.asarray(obj)


def test_asarray_of_strings_is_a_type_error():
    with pytest.raises(TypeError):
        fa.asarray("text")
    with pytest.raises(TypeError):
        fa.asarray(None)


def test_matmul_inner_dimension_mismatch_names_both_shapes(no_evaluation):
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        lazy((2, 3)) @ lazy((4, 5))
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)|\(1, 3\).*\(4, 1\)"):
        fa.matmul(lazy((3,)), lazy((4,)))


@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin"])
def test_reduction_without_identity_over_an_empty_axis(no_evaluation, name):
    with pytest.raises(ValueError, match="empty"):
        getattr(fa, name)(lazy((3, 0)), axis=1)
    with pytest.raises(ValueError, match="empty"):
        getattr(fa, name)(lazy((0,)))


def test_bad_axes(no_evaluation):
    with pytest.raises(ValueError):
        fa.sum(lazy((2, 3)), axis=2)
    with pytest.raises(ValueError):
        fa.sum(lazy((2, 3)), axis=(0, 0))
    with pytest.raises(ValueError):
        fa.permute_dims(lazy((2, 3)), (0, 0))
    with pytest.raises(ValueError):
        fa.squeeze(lazy((2, 3)), axis=0)
    with pytest.raises(ValueError):
        fa.concat([lazy((2, 3)), lazy((3, 2))], axis=0)
    with pytest.raises(ValueError):
        fa.stack([lazy((2, 3)), lazy((3, 2))])


def test_immutable_and_unhashable():
    x = fa.asarray(np.zeros(3, np.float32))
    with pytest.raises(TypeError):
        x[0] = 1
    with pytest.raises(TypeError):
        hash(x)


def test_ambiguous_truth_value():
    with pytest.raises(ValueError, match="ambiguous"):
        bool(fa.asarray(np.zeros(3, np.float32)))


def test_bad_indices_are_refused_before_work(no_evaluation):
    with pytest.raises(TypeError, match="integer or bool"):
        lazy((4,))[lazy((2,))]  # float index array
    with pytest.raises(IndexError, match="out of bounds"):
        lazy((4,))[[0, 4]]
    with pytest.raises(IndexError, match="does not match"):
        lazy((4,))[np.ones(3, bool)]
    with pytest.raises(IndexError):
        lazy((4,))[..., ...]
    with pytest.raises(TypeError, match="at\\[key\\].set"):
        x = lazy((4,))
        x[0] = 1


def test_scalar_operand_of_unsupported_type(no_evaluation):
    with pytest.raises(TypeError):
        lazy((2,)) + "a"
    with pytest.raises(TypeError):
        fa.add(lazy((2,)), [1, 2])


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        fa.set_backend("cuda-please")
