"""The Python object surface of an fa.Array: copying and pickling, numpy's functions on arrays, printing, and the
errors of the dunders (each names the problem, none leaks Python internals)."""
import copy
import pickle

import numpy as np
import pytest
import torch

import flyarray as fa


@pytest.mark.parametrize("name", ["int8", "uint16", "bfloat16", "float8_e4m3fn", "complex64", "bool"])
def test_dtypes_survive_copy_and_pickle_as_the_same_instance(name):
    """One DType instance per dtype (identity is equality): a deep-copied or unpickled dtype used to be a second
    instance, and `copy + x` raised "no promotion rule for fa.int8 and fa.int8"."""
    d = getattr(fa, name)
    assert copy.copy(d) is d and copy.deepcopy(d) is d and pickle.loads(pickle.dumps(d)) is d
    tree = copy.deepcopy({"w": fa.zeros(2, dtype=d), "dtype": d})
    assert tree["dtype"] is d and tree["w"].dtype is d


def _lazy_values():
    x = fa.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    return {"leaf": x, "elementwise": fa.exp(x) * 2, "sin": fa.sin(x), "view": x[1:, ::2].mT,
            "reduction": x.sum(axis=0), "complex": x * 1j, "int8": fa.asarray(np.int8([1, -2, 3])) + 1,
            "bfloat16": x.astype(fa.bfloat16) / 3, "0-d": fa.asarray(2.5) + 1}


@pytest.mark.parametrize("kind", sorted(_lazy_values()))
def test_deepcopy_and_pickle_give_the_value_lazy_or_not(backend, kind):
    """A deep copy or a pickle round trip of any array -- lazy, a view, evaluated -- is an array of the same value
    and dtype that computes with the original; pickling a lazy array used to try the graph's lambdas (PicklingError),
    and a deep-copied lazy view read as None."""
    x = _lazy_values()[kind]
    want = np.asarray(x)
    for other in (copy.deepcopy(x), pickle.loads(pickle.dumps(x)), copy.copy(x)):
        assert other.dtype is x.dtype and other.shape == x.shape and other.device == x.device
        np.testing.assert_array_equal(np.asarray(other), want)
        np.testing.assert_array_equal(np.asarray(other + x), np.asarray(x + x))


def test_deepcopy_has_memory_of_its_own_pickle_holds_only_the_view(backend):
    x = (fa.asarray(np.arange(10_000, dtype=np.float32)) + 0).block_until_ready()
    deep = copy.deepcopy(x)
    assert deep.torch().data_ptr() != x.torch().data_ptr()
    assert copy.copy(x) is x   # immutable: a shallow copy is the same value
    assert len(pickle.dumps(x[5:6])) < 1_000   # the element, not its 40 KB base
    assert pickle.loads(pickle.dumps(x[5:6])).tolist() == [5.0]


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "uint8", "bfloat16"])
def test_every_dtype_unpickles_bit_for_bit(backend, name):
    """torch pickles uint16/32/64 and float8 tensors but cannot load them back ("UntypedStorage has no attribute
    dtype"): a pickled array of those loaded as an AttributeError. Their bits now travel as ints."""
    d = getattr(fa, name)
    x = fa.asarray(np.array([0, 1, 2, 100], np.float32)).astype(d)
    if name.startswith("uint"):
        x = fa.concat([x, fa.full((1,), np.iinfo(name).max, dtype=d)])
    y = pickle.loads(pickle.dumps(x))
    assert y.dtype is d and y.shape == x.shape
    assert torch.equal(y.torch().view(torch.uint8), x.torch().view(torch.uint8))


def test_pickle_of_a_meta_array_keeps_shape_and_dtype():
    with _meta():
        x = fa.zeros((2, 3), dtype=fa.float16) + 1
    y = pickle.loads(pickle.dumps(x))
    assert y.device.type == "meta" and y.shape == (2, 3) and y.dtype is fa.float16


class _meta:
    def __enter__(self):
        fa.set_default_device("meta")

    def __exit__(self, *exc):
        fa.set_default_device(None)


@pytest.mark.parametrize("fn", ["sum", "mean", "max", "min", "prod", "std", "var", "any", "all"])
def test_numpys_reductions_take_arrays(backend, fn):
    """np.sum(x) and friends call x.sum(axis=, dtype=, out=None, ...): the methods take numpy's keywords
    (the reductions raised "unexpected keyword argument 'out'", a keyword the user never passed)."""
    n = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    x = fa.asarray(n)
    for kwargs in ({}, {"axis": 0}, {"axis": 1, "keepdims": True}):
        got, want = getattr(np, fn)(x, **kwargs), getattr(np, fn)(n, **kwargs)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    if fn in ("std", "var"):
        np.testing.assert_allclose(np.asarray(getattr(np, fn)(x, ddof=1)), getattr(np, fn)(n, ddof=1), rtol=1e-6)
        with pytest.raises(TypeError, match="not both"):
            getattr(x, fn)(correction=1, ddof=1)
    with pytest.raises(TypeError, match=f"{fn}: out= is not supported"):
        getattr(x, fn)(out=fa.zeros(3))
    if fn in ("mean", "std", "var", "prod"):
        np.testing.assert_allclose(np.asarray(getattr(x, fn)(dtype=fa.float64)), getattr(n.astype(np.float64), fn)())


def test_dunder_errors_name_the_problem(backend):
    x = fa.asarray(np.arange(3, dtype=np.int32))
    with pytest.raises(TypeError, match="modulus is not supported"):
        pow(x, 2, 5)
    with pytest.raises(TypeError, match="immutable"):
        del x[0]
    for conversion in (int, float, complex):
        for bad in (x, x[:0]):
            with pytest.raises(TypeError, match=rf"{conversion.__name__}\(\) of an array of shape"):
                conversion(bad)
    assert (int(x[1:2]), float(x[2]), complex(x[0])) == (1, 2.0, 0j)
    for expr in (lambda: x @ 2, lambda: 2 @ x):   # one error in both orders, as numpy's
        with pytest.raises(ValueError, match="at least one dimension"):
            expr()
    with pytest.raises(TypeError, match="dtype None"):
        x.astype(None)
    with pytest.raises(TypeError, match="dtype None"):
        fa.astype(x, None)
    with pytest.raises(TypeError, match="use fa.asarray"):
        fa.Array([1, 2])


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_division_by_zero_gives_numpys_zero_on_both_backends(backend, dtype):
    """The reference backend raised torch's bare "ZeroDivisionError" at evaluation for signed integers; the
    kernels and numpy give 0 (the array API leaves it undefined)."""
    n = np.array([7, 0, 5, 3], dtype=dtype)
    d = np.array([0, 0, 2, 0], dtype=dtype)
    x, y = fa.asarray(n), fa.asarray(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        for got, want in ((x // y, n // d), (x % y, n % d), (x // 0, n // dtype(0)), (x % 0, n % dtype(0)),
                          (7 % fa.asarray(np.array([True, False])), 7 % np.array([1, 0]))):
            assert np.asarray(got).tolist() == want.tolist()


def test_repr_prints_the_shortest_digits_as_numpy(backend):
    """repr used torch's 4-decimal printing: [1.0, 1.00001] read [1.0000, 1.0000]."""
    assert repr(fa.asarray(np.float32([1.0, 1.00001]))) == "Array([1.     , 1.00001], dtype=float32)"
    assert repr(fa.asarray(np.float64(0.1)) + 0.2) == "Array(0.3, dtype=float64)"   # numpy: 8 digits at most
    assert repr(fa.asarray(np.float32([-0.0, 1.5]))) == "Array([-0. ,  1.5], dtype=float32)"
    assert repr(fa.zeros((0, 3))) == "Array([], shape=(0, 3), dtype=float32)"
    assert repr(fa.asarray(torch.tensor([0.1], dtype=torch.bfloat16))) == "Array([0.100098], dtype=bfloat16)"
    assert repr(fa.asarray(np.array([1 + 2j], dtype=np.complex64))) == "Array([1.+2.j], dtype=complex64)"
    assert repr(fa.asarray(np.uint64([2**64 - 1]))) == "Array([18446744073709551615], dtype=uint64)"


def test_asarray_stacks_lists_of_numpy_arrays_as_numpy_does(backend):
    """torch.tensor cannot read 0-d numpy arrays ("len() of unsized object" leaked) and warns on others: a list
    holding numpy arrays is numpy's stack, dtype included."""
    for obj in ([np.array(1.), np.array(2.)], [np.array(1), 2], [[np.array(1)], [np.array(2)]],
                [np.array([1, 2], np.int16), np.array([3, 4], np.int16)], (np.float32(1), np.array(2, np.float32))):
        got, want = fa.asarray(obj), np.asarray(obj)
        assert got.dtype is getattr(fa, want.dtype.name) and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), want)
    assert fa.asarray([np.array(1.), np.array(2.)], dtype=fa.float16).dtype is fa.float16
    with pytest.raises(TypeError, match="inhomogeneous|different shapes"):
        fa.asarray([np.array([1, 2]), np.array([1])])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_numpy_views_cannot_be_made_writable_again(backend, dtype):
    """np.asarray(x) is read-only, and so is every array under it: a view's flag could be set back to writable
    while its base was, and a write then changed x and every reference to it. The caller's own numpy array,
    which x shares, stays writable."""
    src = np.arange(4, dtype=np.float32)
    x = fa.asarray(src).astype(getattr(fa, dtype))
    view = np.asarray(x)
    link = view
    while isinstance(link, np.ndarray):
        with pytest.raises(ValueError, match="WRITEABLE"):
            link.setflags(write=True)
        link = link.base
    assert src.flags.writeable
    np.testing.assert_array_equal(np.asarray(x).astype(np.float32), src)


def test_in_place_operators_rebind_and_keep_dtype_and_shape(backend):
    """x op= y rebinds x to x op y (other references keep the old value) and, as the array API says, must not
    change x's dtype or shape: int32 `x += 1.5` made x float32, a (2,) `x += ones((2, 1))` made it (2, 2)."""
    x = fa.asarray(np.array([5, 6], np.int32))
    y = x
    x += 1
    x *= 2
    x //= 3
    x <<= 1
    assert x.dtype is fa.int32 and np.asarray(x).tolist() == [8, 8] and np.asarray(y).tolist() == [5, 6]
    with pytest.raises(TypeError, match=r"x \+= y: x is .*int32 but x \+ y is .*float32"):
        x += 1.5
    with pytest.raises(TypeError, match="x /= y"):
        x /= 2
    z = fa.ones((2,))
    with pytest.raises(ValueError, match=r"x \+= y: x has shape \(2,\) but x \+ y has \(2, 2\)"):
        z += fa.ones((2, 1))
    m = fa.ones((2, 2))
    m @= fa.eye(2)
    m **= 2
    assert m.shape == (2, 2) and np.asarray(m).tolist() == [[1, 1], [1, 1]]
    with pytest.raises(ValueError, match="x @= y"):
        m @= fa.ones((2, 3))
    assert np.asarray(x).tolist() == [8, 8] and z.shape == (2,)
