"""uint16, uint32 and uint64 (issue 13) against numpy over their full range, on both CPU backends.

torch has these dtypes but almost no CPU kernels for them, so the reference backend computes on int64
lanes (flyarray/unsigned.py); the interpret backend runs the generated Triton (tl.uint16/32/64) and
the sort/scan/search kernels. Every value set below holds the edges (0, 1, 2^(n-1) - 1, 2^(n-1),
2^n - 1: for uint64 the values a signed 64-bit view gets wrong) besides hypothesis-drawn ones.
"""
import itertools
import re

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flyarray as fa
from tests.conftest import assert_matches, lazy, scaled

UINTS = ["uint16", "uint32", "uint64"]


def _edges(dtype):
    top = int(np.iinfo(dtype).max)
    half = top // 2 + 1
    return np.array([0, 1, 2, 3, 7, half - 1, half, half + 1, top - 1, top], dtype=dtype)


def _values(dtype, n=None):
    """A strategy: 1-D arrays of ``dtype`` over the full range, edges included half the time."""
    top = int(np.iinfo(dtype).max)
    elements = st.one_of(st.sampled_from([int(v) for v in _edges(dtype)]), st.integers(0, top))
    return hnp.arrays(dtype, n if n is not None else st.integers(1, 6), elements=elements)


def _pairs(dtype):
    """Every pair of edge values: (x1, x2) of 100 elements."""
    e = _edges(dtype)
    a, b = zip(*itertools.product(e, e))
    return np.array(a, dtype), np.array(b, dtype)


# ---- elementwise -----------------------------------------------------------------------------------------
# name -> (flyarray fn, numpy fn, the second operand's constraint)
BINARY = {
    "add": (lambda a, b: a + b, np.add, None),
    "subtract": (lambda a, b: a - b, np.subtract, None),
    "multiply": (lambda a, b: a * b, np.multiply, None),
    "floor_divide": (lambda a, b: a // b, np.floor_divide, "nonzero"),  # division by zero: unspecified
    "remainder": (lambda a, b: a % b, np.remainder, "nonzero"),
    "pow": (lambda a, b: a ** b, np.power, None),
    "maximum": (fa.maximum, np.maximum, None),
    "minimum": (fa.minimum, np.minimum, None),
    "equal": (lambda a, b: a == b, np.equal, None),
    "not_equal": (lambda a, b: a != b, np.not_equal, None),
    "less": (lambda a, b: a < b, np.less, None),
    "less_equal": (lambda a, b: a <= b, np.less_equal, None),
    "greater": (lambda a, b: a > b, np.greater, None),
    "greater_equal": (lambda a, b: a >= b, np.greater_equal, None),
    "bitwise_and": (lambda a, b: a & b, np.bitwise_and, None),
    "bitwise_or": (lambda a, b: a | b, np.bitwise_or, None),
    "bitwise_xor": (lambda a, b: a ^ b, np.bitwise_xor, None),
    "bitwise_left_shift": (lambda a, b: a << b, np.left_shift, "shift"),  # >= the bit width: unspecified
    "bitwise_right_shift": (lambda a, b: a >> b, np.right_shift, "shift"),
    "logical_and": (fa.logical_and, np.logical_and, None),
    "logical_xor": (fa.logical_xor, np.logical_xor, None),
    "where": (lambda a, b: fa.where(a > b, a, b - 1), lambda a, b: np.where(a > b, a, b - a.dtype.type(1)), None),
}
UNARY = {
    "negative": (lambda a: -a, np.negative), "positive": (lambda a: +a, np.positive), "abs": (fa.abs, np.abs),
    "sign": (fa.sign, np.sign), "square": (fa.square, np.square), "bitwise_invert": (lambda a: ~a, np.invert),
    "floor": (fa.floor, np.floor), "ceil": (fa.ceil, np.ceil), "trunc": (fa.trunc, np.trunc),
    "round": (fa.round, np.round), "logical_not": (fa.logical_not, np.logical_not),
    "isnan": (fa.isnan, np.isnan), "isinf": (fa.isinf, np.isinf), "isfinite": (fa.isfinite, np.isfinite),
    "signbit": (fa.signbit, lambda a: np.zeros(a.shape, bool)),
    "sqrt": (fa.sqrt, lambda a: np.sqrt(a.astype(np.float64)).astype(np.float32)),  # float32 results
}


def _constrain(b, rule):
    bits = b.dtype.itemsize * 8
    if rule == "nonzero":
        return np.where(b == 0, b.dtype.type(1), b)
    if rule == "shift":
        return (b % b.dtype.type(bits)).astype(b.dtype)
    return b


def _numpy(fn, *args):
    with np.errstate(all="ignore"):
        out = np.asarray(fn(*args))
    return out


def _check_binary(name, a, b):
    f, npf, rule = BINARY[name]
    b = _constrain(b, rule)
    if name == "pow" and a.dtype == np.uint64:  # numpy's uint64 ** ... is exact; keep its loop short
        b = b % np.uint64(200)
    want = _numpy(npf, a, b)
    assert_matches(f(fa.asarray(a), fa.asarray(b)), want.astype(want.dtype))


@pytest.mark.parametrize("dtype", UINTS)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_edges(backend, name, dtype):
    """Every pair of edge values (100 pairs), compiled once per op and dtype."""
    _check_binary(name, *_pairs(dtype))


@pytest.mark.parametrize("dtype", UINTS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_edges(backend, name, dtype):
    f, npf = UNARY[name]
    e = _edges(dtype)
    want = _numpy(npf, e)
    if name == "sqrt":
        assert_matches(f(fa.asarray(e)), want, rtol=1e-6)
    else:
        assert_matches(f(fa.asarray(e)), want.astype(e.dtype) if want.dtype.kind != "b" else want)


@settings(max_examples=scaled(60), deadline=None)
@given(data=st.data())
def test_binary_full_range_reference(data):
    """Random values anywhere in the range, every op and dtype (the reference backend: the oracle)."""
    dtype = data.draw(st.sampled_from(UINTS), label="dtype")
    name = data.draw(st.sampled_from(sorted(BINARY)), label="op")
    a = data.draw(_values(dtype, 5), label="a")
    b = data.draw(_values(dtype, 5), label="b")
    _check_binary(name, a, b)


def test_reference_division_by_zero_and_wide_shifts():
    """Left unspecified by the array API; the reference gives numpy's answers (0) and never raises."""
    for dtype in UINTS:
        a = _edges(dtype)
        z = np.zeros_like(a)
        assert_matches(fa.asarray(a) // fa.asarray(z), np.zeros_like(a))
        assert_matches(fa.asarray(a) % fa.asarray(z), np.zeros_like(a))
        bits = a.dtype.itemsize * 8
        s = np.full_like(a, bits + 3)
        assert_matches(fa.asarray(a) << fa.asarray(s), np.zeros_like(a))
        assert_matches(fa.asarray(a) >> fa.asarray(s), np.zeros_like(a))


@pytest.mark.parametrize("dtype", UINTS)
def test_python_scalars_and_big_constants(backend, dtype):
    """Weak Python ints take the array's dtype, including uint64 constants >= 2^63 (kernel arguments
    travel as int64 bits); ints the dtype cannot hold raise OverflowError (below)."""
    e = _edges(dtype)
    top = int(np.iinfo(dtype).max)
    x = fa.asarray(e)
    t = e.dtype.type
    with np.errstate(all="ignore"):
        assert_matches(x + top, e + t(top))
        assert_matches(x * 3, e * t(3))
        assert_matches(x // (top // 2 + 2), e // t(top // 2 + 2))
        assert_matches(x < top // 2 + 1, e < t(top // 2 + 1))
        assert_matches(fa.where(x > 5, x, top), np.where(e > 5, e, t(top)))
        assert_matches(fa.full((3,), top - 1, dtype=dtype), np.full((3,), top - 1, dtype))


@pytest.mark.parametrize("dtype", UINTS)
def test_astype_to_and_from(backend, dtype):
    e = _edges(dtype)
    x = fa.asarray(e)
    for target in ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                   "float32", "float64"]:
        with np.errstate(all="ignore"):
            want = e.astype(target)
        if target.startswith("float"):
            assert_matches(x.astype(target), want, rtol=1e-7 if target == "float32" else 1e-15)
        else:
            assert_matches(x.astype(target), want)
    ints = np.array([-1, 0, 5, -(2 ** 31), 2 ** 40 + 3], np.int64)
    assert_matches(fa.asarray(ints).astype(dtype), ints.astype(dtype))  # modulo 2^bits
    f = np.array([0.0, 1.9, 3e4, 6.5e4], np.float64)
    if dtype != "uint16":
        f = np.concatenate([f, [4.2e9] if dtype == "uint32" else [4.2e9, 1.5e19]])
    assert_matches(fa.asarray(f).astype(dtype), f.astype(dtype))


def test_mixed_integer_operands_promote_and_compute(backend):
    """The array API's mixed results (what numpy gives for these pairs too), with values at the edges."""
    for d1, d2 in [("uint8", "uint64"), ("uint16", "int8"), ("uint32", "int32"), ("uint32", "int64"),
                   ("uint16", "uint32"), ("uint8", "int16"), ("bool", "uint64")]:
        a = _edges(d1) if d1 != "bool" else np.array([True, False] * 5)
        b = _edges(d2)[: len(a)] if d2.startswith("u") else np.arange(-5, 5).astype(d2)
        want = _numpy(np.add, a, b) if d1 != "bool" else (a.astype(d2) + b)
        got = fa.asarray(a) + fa.asarray(b)
        assert got.dtype == fa.dtypes.dtype(want.dtype.name), (d1, d2)
        assert_matches(got, want)
        assert_matches(fa.asarray(a) < fa.asarray(b), a < b)


# ---- promotion and errors ------------------------------------------------------------------------------------
INTEGRAL = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def test_promotion_table_matches_array_api_strict():
    """Every pair of integer (and float with float) dtypes: the same result as array_api_strict, and a
    TypeError naming both dtypes exactly where it has none. (flyarray also mixes bool/int with floats, as
    JAX: docs/array_api.md.)"""
    xp = pytest.importorskip("array_api_strict")
    names = INTEGRAL + ["float32", "float64"]
    for n1, n2 in itertools.product(names, names):
        k1, k2 = n1[0] == "f", n2[0] == "f"
        if k1 != k2:
            continue
        try:
            want = xp.result_type(getattr(xp, n1), getattr(xp, n2))
        except TypeError:
            want = None
        if want is None:
            with pytest.raises(TypeError, match=rf"fa\.{n1}.*fa\.{n2}|fa\.{n2}.*fa\.{n1}"):
                fa.result_type(getattr(fa, n1), getattr(fa, n2))
        else:
            assert str(fa.result_type(getattr(fa, n1), getattr(fa, n2))) == f"fa.{str(want).split('.')[-1]}", \
                (n1, n2)


def _lazy(dtype):
    """An unevaluated integer array (a multiply over a buffer)."""
    return fa.asarray(np.zeros(3, dtype)) * 1


def test_errors_before_any_work(no_evaluation):
    u64 = _lazy("uint64")
    with pytest.raises(TypeError, match="fa.uint64 and fa.int64 have no common dtype"):
        u64 + _lazy("int64")
    with pytest.raises(TypeError, match="fa.int8 and fa.uint64"):
        fa.maximum(_lazy("int8"), u64)
    with pytest.raises(TypeError, match="fa.uint64 and fa.int32"):
        fa.where(lazy((3,)) > 0, u64, _lazy("int32"))
    with pytest.raises(TypeError, match="fa.uint64 and fa.int16"):
        fa.concat([u64, _lazy("int16")])
    for dtype, bad in [("uint16", 2 ** 16), ("uint32", 2 ** 32), ("uint64", 2 ** 64), ("uint32", -1)]:
        with pytest.raises(OverflowError, match=f"Python int {bad} does not fit fa.{dtype}"):
            _lazy(dtype) + bad
    with pytest.raises(OverflowError, match="does not fit fa.uint64"):
        fa.full((2,), -3, dtype=fa.uint64)
    with pytest.raises(TypeError, match="does not accept fa.float32"):
        fa.bitwise_left_shift(_lazy("uint32"), 1.5)


def test_namespace_iinfo_and_names():
    assert set(fa.__array_namespace_info__().dtypes(kind="unsigned integer")) == {"uint8", "uint16", "uint32",
                                                                                  "uint64"}
    for dtype in UINTS:
        info = fa.iinfo(getattr(fa, dtype))
        assert (info.bits, info.min, info.max) == (np.iinfo(dtype).bits, 0, int(np.iinfo(dtype).max))
        assert fa.isdtype(getattr(fa, dtype), "unsigned integer") and not fa.isdtype(getattr(fa, dtype), "signed integer")
        assert fa.dtypes.dtype(np.dtype(dtype)) is getattr(fa, dtype) is fa.dtypes.dtype(getattr(torch, dtype))


# ---- torch and numpy in and out -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", UINTS)
def test_dlpack_and_numpy_are_zero_copy(dtype):
    t = torch.tensor(_edges(dtype).astype(np.int64).tolist() if dtype != "uint64" else [0, 1, 2 ** 63, 2 ** 64 - 1],
                     dtype=getattr(torch, dtype))
    a = fa.asarray(t)
    assert a.dtype is getattr(fa, dtype) and a.torch().data_ptr() == t.data_ptr()
    out = torch.from_dlpack(a)
    assert out.dtype == t.dtype and out.data_ptr() == t.data_ptr()
    n = _edges(dtype)
    b = fa.asarray(n)
    assert b.torch().data_ptr() == n.ctypes.data  # numpy in: no copy
    back = np.from_dlpack(b)
    assert back.dtype == n.dtype and back.ctypes.data == n.ctypes.data
    r = (b + 1).block_until_ready()  # a result's buffer out through DLPack and numpy, no copy
    assert torch.from_dlpack(r).data_ptr() == r.torch().data_ptr() == np.asarray(r).ctypes.data
    assert np.asarray(b).tolist() == b.tolist() == n.tolist() and int(b[-1]) == int(n[-1])
    assert fa.asarray(n[-1]).dtype is getattr(fa, dtype) and fa.asarray(n[-1]).item() == int(n[-1])  # numpy scalar
    assert str(int(n[-1])) in repr(b)


def test_asarray_of_python_and_numpy_values():
    """Python ints up to 2^64 - 1 (through numpy: torch.tensor refuses them before torch 2.3-ish and refuses
    np.uint64 scalars), and a clear error for what does not fit."""
    assert fa.asarray([2 ** 64 - 1, 0], dtype=fa.uint64).tolist() == [2 ** 64 - 1, 0]
    assert fa.asarray(2 ** 32 - 1, dtype="uint32").item() == 2 ** 32 - 1
    assert fa.asarray(np.uint64(2 ** 63)).dtype is fa.uint64 and int(fa.asarray(np.uint64(2 ** 63))) == 2 ** 63
    for bad, dtype in (([-1], "uint64"), ([2 ** 16], "uint16"), ([2 ** 64], "uint64")):
        with pytest.raises(OverflowError, match="cannot make an array from list"):  # as for every integer dtype
            fa.asarray(bad, dtype=dtype)
    for bad in (2 ** 63, [1, -2 ** 63 - 1]):  # no dtype: int64's range, and the way to 2^63..2^64-1
        with pytest.raises(OverflowError, match=r"past int64's range .*dtype=fa.uint64"):
            fa.asarray(bad)


# ---- reductions, scans, sorting, searching, indexing ------------------------------------------------------------
def _check_reductions(x, axis):
    dtype = x.dtype.name
    a = fa.asarray(x)
    with np.errstate(all="ignore"):
        assert_matches(fa.sum(a, axis=axis), np.sum(x, axis=axis, dtype=np.uint64))  # the spec: uint64
        assert_matches(fa.prod(a, axis=axis), np.prod(x, axis=axis, dtype=np.uint64))
        if dtype != "uint16":  # dtype=d computes in d and returns d (the array API; wraps modulo 2^16)
            assert_matches(fa.sum(a, axis=axis, dtype="uint16"), np.sum(x.astype("uint16"), axis=axis, dtype=np.uint16))
    assert_matches(fa.max(a, axis=axis), np.max(x, axis=axis))
    assert_matches(fa.min(a, axis=axis), np.min(x, axis=axis))
    assert_matches(fa.argmax(a, axis=axis), np.asarray(np.argmax(x, axis=axis)).astype(np.int64))
    assert_matches(fa.argmin(a, axis=axis), np.asarray(np.argmin(x, axis=axis)).astype(np.int64))
    assert_matches(fa.any(a, axis=axis), np.any(x, axis=axis))
    assert_matches(fa.all(a, axis=axis), np.all(x, axis=axis))
    assert_matches(fa.mean(a, axis=axis), np.mean(x.astype(np.float64), axis=axis).astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("dtype", UINTS)
def test_reductions_edges(backend, dtype):
    """Rows of edge values (top-bit values beside small ones; ties for argmax/argmin pick the first)."""
    e = _edges(dtype)
    x = np.stack([e, e[::-1], np.roll(e, 3)])
    for axis in (None, 0, 1) if backend == "reference" else (1,):  # the interpreter is slow: the row kernel
        _check_reductions(x, axis)


@settings(max_examples=scaled(12), deadline=None)
@given(dtype=st.sampled_from(UINTS), data=st.data())
def test_reductions_full_range_reference(dtype, data):
    x = data.draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=4),
                             elements=st.sampled_from([int(v) for v in _edges(dtype)]) | st.integers(
                                 0, int(np.iinfo(dtype).max))), label="x")
    _check_reductions(x, data.draw(st.sampled_from([None, 0, -1]), label="axis"))


@pytest.mark.parametrize("dtype", UINTS)
def test_scans(backend, dtype):
    x = np.stack([_edges(dtype), _edges(dtype)[::-1]])
    with np.errstate(all="ignore"):
        assert_matches(fa.cumulative_sum(fa.asarray(x), axis=1), np.cumsum(x, axis=1, dtype=np.uint64))
        assert_matches(fa.cumulative_prod(fa.asarray(x), axis=0, include_initial=True),
                       np.concatenate([np.ones((1, x.shape[1]), np.uint64), np.cumprod(x, 0, dtype=np.uint64)]))
        assert_matches(fa.cumulative_sum(fa.asarray(x), axis=1, dtype=dtype), np.cumsum(x, axis=1, dtype=dtype))


@settings(max_examples=scaled(8), deadline=None)
@given(dtype=st.sampled_from(UINTS), data=st.data())
def test_sort_argsort_searchsorted_unique(backend, dtype, data):
    """The sort kernel's keys (uint16: zero-extended; uint32: top bit flipped) and uint64's torch.sort of
    int64 keys put values >= 2^(n-1) above the rest; ties stay in index order both ways."""
    x = data.draw(_values(dtype, st.integers(1, 12)), label="x")
    v = data.draw(_values(dtype, 4), label="v")
    a = fa.asarray(x)
    order = np.argsort(x, kind="stable")
    assert_matches(fa.sort(a), x[order])
    assert_matches(fa.argsort(a), order.astype(np.int64))
    desc = len(x) - 1 - np.flip(np.argsort(np.flip(x), kind="stable"))  # array_api_strict's descending
    assert_matches(fa.argsort(a, descending=True), desc.astype(np.int64))
    assert_matches(fa.sort(a, descending=True), x[desc])
    s = np.sort(x)
    for side in ("left", "right"):
        assert_matches(fa.searchsorted(fa.asarray(s), fa.asarray(v), side=side),
                       np.searchsorted(s, v, side=side).astype(np.int64))
    assert_matches(fa.unique_values(a), np.unique(x))


def test_long_rows_sort_through_torch_keys(interpret):
    """Rows longer than the kernel's (and every uint64 row) go to torch.sort on order-preserving int64 keys."""
    rng = np.random.default_rng(0)
    for dtype in ("uint32", "uint64"):
        top = int(np.iinfo(dtype).max)
        x = rng.integers(0, top, 5000, dtype=dtype, endpoint=True)
        x[::7] = x[3]  # ties
        x[:4] = [top, 0, top // 2 + 1, top // 2]
        assert_matches(fa.argsort(fa.asarray(x)), np.argsort(x, kind="stable").astype(np.int64))
        assert_matches(fa.sort(fa.asarray(x), descending=True), np.sort(x)[::-1])


@pytest.mark.parametrize("dtype", UINTS)
def test_indexing_gather_scatter_nonzero(backend, dtype):
    e = _edges(dtype)
    top = e[-1]
    x = fa.asarray(e)
    idx = np.array([9, 0, 6, 6])
    assert_matches(x[fa.asarray(idx)], e[idx])
    assert_matches(fa.take(x, fa.asarray(idx)), e[idx])
    assert_matches(x[x > 2], e[e > 2])
    assert_matches(fa.nonzero(x)[0], np.nonzero(e)[0])
    assert_matches(fa.flip(x), e[::-1])
    vals = fa.asarray(np.array([top, 1], dtype))
    at = fa.asarray(np.array([1, 1]))
    for mode, fn in (("max", np.maximum), ("min", np.minimum), ("add", np.add), ("multiply", np.multiply)):
        want = e.copy()
        with np.errstate(all="ignore"):
            fn.at(want, [1, 1], np.array([top, 1], dtype))
        assert_matches(getattr(x.at[at], mode)(vals), want)
    want = e.copy()
    want[[0, 5]] = [top, 3]
    assert_matches(x.at[fa.asarray([0, 5])].set(fa.asarray(np.array([top, 3], dtype))), want)
    assert_matches(fa.concat([x, x[::-2]]), np.concatenate([e, e[::-2]]))


def test_vmap_and_jit_on_unsigned(backend):
    e = np.stack([_edges("uint64"), _edges("uint64")[::-1]])
    f = fa.jit(lambda r: fa.max(r) - fa.min(r) + r // 3)
    assert_matches(fa.vmap(f)(fa.asarray(e)), (e.max(1) - e.min(1))[:, None] + e // np.uint64(3))


# ---- generated code uses the unsigned instructions -----------------------------------------------------------------
def test_generated_code_compares_divides_and_shifts_unsigned():
    """One fused uint64 kernel cross-compiled for Hopper and MI350: unsigned compare, divide, remainder,
    shift and max instructions, never the signed ones (what a signed view of the bits would get wrong)."""
    a = fa.asarray(np.array([1, 2], np.uint64))
    b = fa.asarray(np.array([3, 4], np.uint64))
    f = lambda a, b: fa.where(a < b, a // b, a % b) + (a >> b) + fa.maximum(a, b)
    ptx = fa.inspect(f, a, b, target="sm_90").kernels[0].asm
    for op in ("setp.lt.u64", "div.u64", "shr.u64", "max.u64"):  # (the remainder reuses the quotient)
        assert op in ptx, op
    assert not re.search(r"\b(setp\.[a-z]+|div|rem|shr|max)\.s64\b", ptx)
    gcn = fa.inspect(f, a, b, target="gfx950").kernels[0].asm
    assert re.search(r"v_cmp_(lt|gt)_u64", gcn) and "v_lshrrev_b64" in gcn
    assert not re.search(r"v_cmp_(lt|gt)_i64|v_ashrrev_i64", gcn)


def _every_op(a, b):
    """Every elementwise op of the tables on one pair, summed into one uint64 array: one fused kernel."""
    outs = [fn(a, b) for fn, _, _ in BINARY.values()] + [fn(a) for n, (fn, _) in UNARY.items() if n != "sqrt"]
    outs += [a.astype(t) for t in ("bool", "int8", "int64", "uint8", "float32", "float64")]
    total = outs[0].astype(fa.uint64)
    for o in outs[1:]:
        total = total + o.astype(fa.uint64)
    return total


def _every_reduction(x):
    """max, min, argmax, argmin, sum, prod over rows: one fused row kernel (their neutral elements are
    the dtype's limits, up to 2^64 - 1, as literals in the source)."""
    return (fa.max(x, axis=1) - fa.min(x, axis=1) + fa.argmax(x, axis=1).astype(fa.uint64)
            + fa.argmin(x, axis=1).astype(fa.uint64) + fa.sum(x, axis=1) + fa.prod(x, axis=1))


@pytest.mark.parametrize("target", ["sm_90", "gfx950"])
@pytest.mark.parametrize("dtype", UINTS)
def test_every_op_compiles_for_gpus(dtype, target):
    a, b = (fa.asarray(np.array([1, 2], dtype)) for _ in range(2))
    kernels = fa.inspect(_every_op, a, b, target=target).kernels
    assert len(kernels) == 1 and f"tl.{dtype}" in kernels[0].triton_source
    if dtype == "uint64":
        kernels = fa.inspect(_every_reduction, fa.asarray(np.arange(12, dtype=dtype).reshape(3, 4)),
                             target=target).kernels
        assert len(kernels) == 1 and "18446744073709551615" in kernels[0].triton_source


# ---- on a GPU (skipped without one): compiled Triton and torch's CUDA/ROCm build --------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")


@pytest.fixture
def on_gpu():
    fa.set_backend("gpu")
    yield "cuda"
    fa.set_backend(None)


def _host(x):
    return x.torch().cpu().numpy()


@gpu
@pytest.mark.parametrize("dtype", UINTS)
def test_gpu_matches_numpy(on_gpu, dtype):
    """The edge grids through compiled kernels on the GPU: every elementwise op (one fused kernel each),
    Python constants >= 2^63, reductions, scans, the sort kernel and the torch.sort path, search, indexing."""
    dev = on_gpu
    a, b = _pairs(dtype)
    A = fa.asarray(a, device=dev)
    for name, (f, npf, rule) in BINARY.items():
        bb = _constrain(b, rule)
        if name == "pow" and dtype == "uint64":
            bb = bb % np.uint64(200)
        want = _numpy(npf, a, bb)
        np.testing.assert_array_equal(_host(f(A, fa.asarray(bb, device=dev))), want, err_msg=name)
    for name, (f, npf) in UNARY.items():
        want = _numpy(npf, a)
        got = _host(f(A))
        if name == "sqrt":
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(got, want.astype(a.dtype) if want.dtype.kind != "b" else want, err_msg=name)
    top = int(np.iinfo(dtype).max)
    t = a.dtype.type
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_host(A + top), a + t(top))
        np.testing.assert_array_equal(_host(A < top // 2 + 1), a < t(top // 2 + 1))
        np.testing.assert_array_equal(_host(A // (top // 2 + 2)), a // t(top // 2 + 2))
    x = np.stack([_edges(dtype), _edges(dtype)[::-1]])
    X = fa.asarray(x, device=dev)
    with np.errstate(all="ignore"):
        for fn, want in ((fa.sum, np.sum(x, 1, dtype=np.uint64)), (fa.prod, np.prod(x, 1, dtype=np.uint64)),
                         (fa.max, x.max(1)), (fa.min, x.min(1)), (fa.argmax, x.argmax(1)), (fa.argmin, x.argmin(1))):
            np.testing.assert_array_equal(_host(fn(X, axis=1)), want, err_msg=fn.__name__)
        np.testing.assert_array_equal(_host(fa.sum(X)), np.sum(x, dtype=np.uint64))
        np.testing.assert_array_equal(_host(fa.cumulative_sum(X, axis=1)), np.cumsum(x, 1, dtype=np.uint64))
        np.testing.assert_array_equal(_host(fa.cumulative_prod(X, axis=1)), np.cumprod(x, 1, dtype=np.uint64))
    rng = np.random.default_rng(1)
    for n in (37, 5000):  # the sort kernel (uint16/32), and torch.sort on int64 keys (uint64, long rows)
        r = rng.integers(0, top, n, dtype=dtype, endpoint=True)
        r[::5] = r[1]
        r[:3] = [top, 0, top // 2 + 1]
        R = fa.asarray(r, device=dev)
        np.testing.assert_array_equal(_host(fa.argsort(R)), np.argsort(r, kind="stable"))
        np.testing.assert_array_equal(_host(fa.sort(R, descending=True)), np.sort(r)[::-1])
        s = np.sort(r)
        np.testing.assert_array_equal(_host(fa.searchsorted(fa.asarray(s, device=dev), A)), np.searchsorted(s, a))
        np.testing.assert_array_equal(_host(fa.unique_values(R)), np.unique(r))
    idx = np.array([9, 0, 6, 6])
    np.testing.assert_array_equal(_host(A[fa.asarray(idx, device=dev)]), a[idx])
    np.testing.assert_array_equal(_host(fa.nonzero(A)[0]), np.nonzero(a)[0])
    want = a.copy()
    np.maximum.at(want, [1, 1], np.array([top, 1], dtype))
    got = A.at[fa.asarray([1, 1], device=dev)].max(fa.asarray(np.array([top, 1], dtype), device=dev))
    np.testing.assert_array_equal(_host(got), want)
    np.testing.assert_array_equal(_host(fa.flip(A)), a[::-1])
    t_in = torch.tensor([0, 1, 5], dtype=getattr(torch, dtype), device=dev)
    assert fa.asarray(t_in).torch().data_ptr() == t_in.data_ptr() == torch.from_dlpack(fa.asarray(t_in)).data_ptr()


def test_isclose_of_unsigned_ints_does_not_wrap(backend):
    """|a - b| in the ints' own dtype wrapped (uint32 1 - (2^32 - 1) = 2: "close"); numpy compares in
    float64, and so does isclose now."""
    cases = [(np.array([1], np.uint32), np.array([2**32 - 1], np.uint32), {}),
             (np.array([0, 255, 5], np.uint8), np.array([255, 255, 5], np.uint8), {"rtol": 0.01}),
             (np.array([127], np.int8), np.array([-128], np.int8), {})]
    for a, b, kw in cases:
        np.testing.assert_array_equal(np.asarray(fa.isclose(fa.asarray(a), fa.asarray(b), **kw)), np.isclose(a, b, **kw))


def test_uint8_division_by_zero_gives_numpys_zero(backend):
    a, b = np.array([5, 7, 255, 0], np.uint8), np.array([0, 2, 0, 3], np.uint8)
    with np.errstate(divide="ignore"):
        want_q, want_r = a // b, a % b
    if backend == "reference":  # the interpreter's value at a zero divisor is undefined; the reference's is numpy's
        np.testing.assert_array_equal(np.asarray(fa.asarray(a) // fa.asarray(b)), want_q)
        np.testing.assert_array_equal(np.asarray(fa.asarray(a) % fa.asarray(b)), want_r)
    nonzero = b != 0
    np.testing.assert_array_equal(np.asarray(fa.asarray(a) // fa.asarray(b))[nonzero], want_q[nonzero])
