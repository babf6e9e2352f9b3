"""complex64/complex128: promotion, elementwise functions against numpy's complex128, special values, reductions,
matmul/vecdot, DLPack without copies, fusion (complex is lowered to real arithmetic before scheduling:
complex_lowering.py), the interpret backend, autodiff's refusal, and the errors raised at record time."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flyarray as fa
from tests.conftest import scaled

CDTYPES = ["complex64", "complex128"]
TOL = {"complex64": {"rtol": 2e-5, "atol": 2e-6}, "complex128": {"rtol": 1e-11, "atol": 1e-12}}


def crandom(rng, shape, dtype="complex64", scale=2.0):
    z = rng.uniform(-scale, scale, shape) + 1j * rng.uniform(-scale, scale, shape)
    return z.astype(dtype)


def close(got, want, dtype=None, **kw):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if dtype is not None:
        assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    tol = {**TOL.get(str(got.dtype), TOL["complex64"]), **kw}
    np.testing.assert_allclose(got, want.astype(got.dtype), equal_nan=True, **tol)


# ---- dtypes and promotion ----------------------------------------------------------------------------------------
def test_dtypes_are_public_and_named():
    assert fa.complex64.kind == "c" and fa.complex128.itemsize == 16
    assert fa.asarray(np.zeros(2, np.complex128)).dtype == fa.complex128
    assert fa.isdtype(fa.complex64, "complex floating") and fa.isdtype(fa.complex64, "numeric")
    assert not fa.isdtype(fa.complex64, "real floating")
    info = fa.__array_namespace_info__()
    assert info.default_dtypes()["complex floating"] == fa.complex64
    assert set(info.dtypes(kind="complex floating")) == {"complex64", "complex128"}
    assert fa.finfo(fa.complex64).bits == 32 and fa.finfo(fa.complex128).eps == np.finfo(np.float64).eps


def test_promotion_matches_array_api_strict():
    xp = pytest.importorskip("array_api_strict")
    names = ["bool", "int8", "int16", "int32", "int64", "uint8", "float32", "float64", "complex64", "complex128"]
    checked = 0
    for a in names:
        for b in names:
            if "complex" not in a + b:
                continue
            try:
                want = xp.result_type(getattr(xp, a), getattr(xp, b))
            except TypeError:  # bool/int with complex: the standard is silent; JAX's rule (the complex)
                assert fa.result_type(getattr(fa, a), getattr(fa, b)) == getattr(fa, a if "complex" in a else b)
                continue
            assert fa.result_type(getattr(fa, a), getattr(fa, b)).name == str(want).split(".")[-1], (a, b)
            checked += 1
    assert checked >= 10
    assert fa.result_type(fa.float16, fa.complex64) == fa.complex64
    assert fa.result_type(fa.bfloat16, fa.complex128) == fa.complex128


@pytest.mark.parametrize("dtype,scalar,want", [
    ("float32", 1j, "complex64"), ("float64", 1j, "complex128"), ("int32", 1j, "complex64"),
    ("complex64", 2.5, "complex64"), ("complex128", 1, "complex128"), ("complex64", 1 + 1j, "complex64"),
])
def test_python_scalars_are_weak(dtype, scalar, want):
    x = fa.asarray(np.ones(3, dtype))
    for got in (x + scalar, scalar + x, x * scalar):
        assert got.dtype.name == want
    close(x * scalar, np.ones(3, want) * scalar)
    assert fa.result_type(x, scalar).name == want
    assert complex(fa.asarray(np.array(2 - 3j, np.complex64))) == 2 - 3j


def test_creation_and_item():
    close(fa.full((2, 3), 1 - 2j), np.full((2, 3), 1 - 2j, np.complex64), dtype="complex64")
    close(fa.zeros(4, dtype=fa.complex128), np.zeros(4, np.complex128), dtype="complex128")
    close(fa.ones_like(fa.asarray(np.zeros(2, np.complex64))), np.ones(2, np.complex64))
    close(fa.asarray([1 + 2j, 3j]), np.array([1 + 2j, 3j]), dtype="complex64")  # the default complex, as float32
    assert fa.asarray(1j).dtype == fa.complex64 and fa.asarray(np.complex128(1j)).dtype == fa.complex128
    assert fa.asarray(np.array([1 + 2j], np.complex64)).item() == 1 + 2j
    close(fa.astype(fa.asarray(np.arange(3.0, dtype=np.float32)), fa.complex128), np.arange(3.0).astype(np.complex128))
    close(fa.linspace(0, 1 + 2j, 5), np.linspace(0, 1 + 2j, 5).astype(np.complex64), dtype="complex64")
    close(fa.eye(3, k=1, dtype=fa.complex128), np.eye(3, k=1, dtype=np.complex128), dtype="complex128")
    close(fa.arange(4, dtype=fa.complex64), np.arange(4).astype(np.complex64), dtype="complex64")


RESHAPES = {  # a reshape that folds over the op's result but not over its input (a stride-2 part of a sliced buffer)
    "trace": (lambda x: fa.linalg.trace(x[:, :2]), lambda z: np.trace(z[:, :2])),
    "positive": (lambda x: fa.reshape(fa.positive(x[:, :2]), (4,)), lambda z: z[:, :2].reshape(4)),
    "conj": (lambda x: fa.reshape(fa.conj(x[:, :2]), (4,)), lambda z: np.conj(z[:, :2]).reshape(4)),
    "real": (lambda x: fa.reshape(fa.real(x[:, :2]), (4,)), lambda z: z[:, :2].real.reshape(4)),
    "imag of a transpose": (lambda x: fa.reshape(fa.imag(x.T), (6,)), lambda z: z.T.imag.reshape(6)),
    "astype to itself": (lambda x: fa.reshape(fa.astype(x.T, fa.complex64), (6,)), lambda z: z.T.reshape(6)),
    "real + 0": (lambda x: fa.reshape(fa.real(x.T) + 0, (3, 2)), lambda z: (z.T.real + 0).reshape(3, 2)),
}


@pytest.mark.parametrize("case", sorted(RESHAPES))
def test_views_over_parts_that_are_views(backend, case):
    z = (np.arange(6).reshape(2, 3) + 1j * np.arange(6).reshape(2, 3)[::-1]).astype(np.complex64)
    fn, want = RESHAPES[case]
    close(fn(fa.asarray(z)), want(z))


# A random program of complex ops and views, against numpy: views over complex values and over their parts,
# broadcasting, reductions and real results mixed in any order.
STEPS = ["exp", "conj", "neg", "square", "mul", "add_real", "div", "T", "slice", "flip", "reshape", "expand",
         "sum", "real_part", "abs_back", "where", "astype"]


def _apply(step, x, y, xp):
    if step == "exp":
        return xp.exp(x * 0.25)
    if step == "conj":
        return xp.conj(x)
    if step == "neg":
        return -x
    if step == "square":
        return x * x * 0.5
    if step == "mul":
        return x * (y if y.shape == x.shape else y.ravel()[0] if xp is np else fa.reshape(y, (-1,))[0])
    if step == "add_real":
        return x + (xp.real(x) if xp is np else fa.real(x))
    if step == "div":
        return x / (x * x + 2)
    if step == "T":
        return x.T
    if step == "slice":
        return x[::-1, 1:] if x.shape[1] > 1 else x[::2]
    if step == "flip":
        return xp.flip(x, axis=0)
    if step == "reshape":
        return xp.reshape(x, (x.shape[1], x.shape[0]))
    if step == "expand":
        return xp.broadcast_to(x[:1], x.shape) + x
    if step == "sum":
        return xp.sum(x, axis=1, keepdims=True) + x
    if step == "real_part":
        return (xp.real(x) if xp is np else fa.real(x)) * 1j + (xp.imag(x) if xp is np else fa.imag(x))
    if step == "abs_back":
        return xp.abs(x) + x
    if step == "where":
        return xp.where(xp.real(x) > 0, x, 1j) if xp is np else fa.where(fa.real(x) > 0, x, 1j)
    if step == "astype":
        return x.astype(np.complex128) if xp is np else fa.astype(x, fa.complex128)
    raise AssertionError(step)


@settings(max_examples=scaled(12))
@given(program=st.lists(st.sampled_from(STEPS), min_size=1, max_size=7), seed=st.integers(0, 2**16),
       evaluate_midway=st.booleans())
def test_random_programs_match_numpy(backend, program, seed, evaluate_midway):
    rng = np.random.default_rng(seed)
    z, w = crandom(rng, (3, 4), scale=1.0), crandom(rng, (3, 4), scale=1.0)
    x, y = fa.asarray(z), fa.asarray(w)
    want, got = z.astype(np.complex128), x
    for i, step in enumerate(program):
        want = _apply(step, want, w.astype(np.complex128), np)
        got = _apply(step, got, y, fa)
        if evaluate_midway and i == len(program) // 2:
            fa.eval(got)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_empty_and_zero_dimensional_arrays():
    e = fa.asarray(np.zeros((0, 3), np.complex64))
    close(fa.exp(e) * 2, np.zeros((0, 3), np.complex64))
    close(fa.sum(e, axis=0), np.zeros(3, np.complex64))
    close(fa.prod(e, axis=0), np.ones(3, np.complex64))
    close(e @ fa.asarray(np.ones((3, 2), np.complex64)), np.zeros((0, 2), np.complex64))
    s = fa.asarray(np.complex64(1 + 1j))
    close(fa.exp(s) * s, np.exp(np.complex64(1 + 1j)) * np.complex64(1 + 1j))
    assert complex(fa.sum(s)) == 1 + 1j and float(fa.abs(s)) == pytest.approx(2 ** 0.5)


def test_views_indexing_joins_and_linalg():
    z = crandom(np.random.default_rng(9), (4, 5))
    x = fa.asarray(z)
    close((x * 2)[1:, ::-2].T, (z * 2)[1:, ::-2].T)
    close(x[fa.asarray(np.array([2, 0]))], z[[2, 0]])
    close(fa.take(x * 1j, fa.asarray(np.array([1, 3])), axis=1), (z * 1j)[:, [1, 3]])
    close(x[fa.real(x) > 0], z[z.real > 0])
    close(x.at[0].set(5j), np.where(np.arange(4)[:, None] == 0, 5j, z))
    close(fa.concat([x, x * 1j], axis=1), np.concatenate([z, z * 1j], 1))
    close(fa.stack([x, fa.conj(x)]), np.stack([z, np.conj(z)]))
    close(fa.reshape(x.T * 1, (20,)), z.T.reshape(20))
    close(fa.einsum("ij,kj->ik", x, x), np.einsum("ij,kj->ik", z, z), rtol=1e-5)
    close(fa.linalg.vector_norm(x), np.linalg.norm(z.ravel()), dtype="float32")
    close(fa.linalg.vector_norm(x, ord=1, axis=0), np.linalg.norm(z, 1, axis=0), dtype="float32")
    assert fa.count_nonzero(x * 0) == 0
    close(fa.jit(lambda a: fa.exp(a) * a)(x), np.exp(z) * z, rtol=1e-5)


# ---- elementwise --------------------------------------------------------------------------------------------------
NP = {"asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh,
      "atanh": np.arctanh, "sign": lambda z: np.where(z == 0, 0, z / np.where(z == 0, 1, np.abs(z))),
      "reciprocal": lambda z: 1 / z, "positive": lambda z: +z, "round": lambda z: np.round(z)}
UNARY = ["abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "conj", "cos", "cosh", "exp", "expm1", "imag",
         "isfinite", "isinf", "isnan", "log", "log10", "log1p", "log2", "negative", "positive", "real", "reciprocal",
         "round", "sign", "sin", "sinh", "sqrt", "square", "tan", "tanh"]


def test_the_complex_functions_are_array_api_stricts():
    xp = pytest.importorskip("array_api_strict")
    z = xp.asarray([1 + 2j])
    accepted = set()
    for name in UNARY:
        getattr(xp, name)(z)  # array_api_strict takes each of ours
    for name in ("atan2", "ceil", "floor", "trunc", "maximum", "minimum", "less", "greater", "signbit", "copysign",
                 "hypot", "logaddexp", "nextafter", "remainder", "floor_divide"):
        with pytest.raises(TypeError):
            fn = getattr(fa, name)
            fn(fa.asarray(np.ones(2, np.complex64))) if name in ("ceil", "floor", "trunc", "signbit") else \
                fn(fa.asarray(np.ones(2, np.complex64)), fa.asarray(np.ones(2, np.complex64)))
        accepted.add(name)
    assert accepted


@pytest.mark.parametrize("name", UNARY)
@settings(max_examples=scaled(3))
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from(CDTYPES), transposed=st.booleans())
def test_unary_matches_numpy(name, seed, dtype, transposed):
    rng = np.random.default_rng(seed)
    z = crandom(rng, (3, 5), dtype)
    if name in ("sign", "reciprocal"):
        z[0, 0] = 0 if name == "sign" else z[0, 0]
    x = fa.asarray(z.T.copy()).T if transposed else fa.asarray(z)
    got = getattr(fa, name)(x)
    want = NP.get(name, getattr(np, name, None))(z.astype(np.complex128))
    if want.dtype == np.bool_:
        assert got.dtype == fa.bool
        np.testing.assert_array_equal(np.asarray(got), want)
        return
    real_result = name in ("abs", "real", "imag")
    assert got.dtype.name == (("float32" if dtype == "complex64" else "float64") if real_result else dtype)
    rtol = TOL[dtype]["rtol"] * (10 if name in ("acos", "acosh", "asin", "atan", "atanh", "tan", "expm1") else 1)
    np.testing.assert_allclose(np.asarray(got).astype(want.dtype), want, rtol=rtol, atol=TOL[dtype]["atol"])


BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide, "pow": np.power,
          "equal": np.equal, "not_equal": np.not_equal}


@pytest.mark.parametrize("name", sorted(BINARY))
@settings(max_examples=scaled(3))
@given(seed=st.integers(0, 2**16), dtypes=st.sampled_from([("complex64", "complex64"), ("complex64", "float64"),
                                                           ("float32", "complex64"), ("int16", "complex128")]))
def test_binary_matches_numpy_with_broadcasting(name, seed, dtypes):
    rng = np.random.default_rng(seed)
    a = crandom(rng, (4, 1, 3)) if "complex" in dtypes[0] else rng.uniform(-2, 2, (4, 1, 3))
    b = crandom(rng, (2, 3)) if "complex" in dtypes[1] else rng.uniform(-2, 2, (2, 3))
    a, b = a.astype(dtypes[0]), b.astype(dtypes[1])
    if name == "equal" and a.dtype.kind == b.dtype.kind:
        b[0] = a[0, 0]
    got = getattr(fa, name)(fa.asarray(a), fa.asarray(b))
    want = BINARY[name](a.astype(np.complex128), b.astype(np.complex128))
    if want.dtype == np.bool_:
        np.testing.assert_array_equal(np.asarray(got), want)
        return
    assert got.dtype == fa.result_type(fa.asarray(a), fa.asarray(b))
    tol = TOL[got.dtype.name]
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)


def test_operators_and_scalars():
    z = crandom(np.random.default_rng(1), (5,))
    x = fa.asarray(z)
    close((x * 2 - 1j) / (x + 0.5) ** 2, (z * 2 - 1j) / (z + 0.5) ** 2, rtol=1e-5)
    close(-x, -z)
    close(abs(x), np.abs(z))
    close(x ** 3, z ** 3, rtol=1e-5)
    close(1j ** x, 1j ** z.astype(np.complex128), rtol=1e-5)
    close(fa.where(fa.real(x) > 0, x, 1j), np.where(z.real > 0, z, 1j))
    close(fa.vecdot(x, x), np.vecdot(z, z), rtol=1e-5)  # |z|^2 summed: conjugates the first argument
    assert fa.vecdot(x, x).dtype == fa.complex64


def test_special_values():
    inf, nan = np.inf, np.nan
    z = np.array([complex(inf, 0), complex(-inf, 0), complex(0, 0), complex(1e30, 1e30), complex(nan, 1),
                  complex(1, inf), complex(-1, -inf), complex(-4, 0)], np.complex64)
    x = fa.asarray(z)
    with np.errstate(all="ignore"):
        close(fa.exp(x[:3]), np.exp(z[:3]))  # exp(+-inf + 0j) = (inf | 0) + 0j, no nan
        close(fa.abs(x), np.abs(z))  # 1e30 + 1e30j: hypot, no overflow in the square
        close(fa.sqrt(x), np.sqrt(z))  # sqrt(x +- inf j) = inf +- inf j; sqrt(-4) = 2j
        np.testing.assert_array_equal(np.asarray(fa.isnan(x)), np.isnan(z))
        np.testing.assert_array_equal(np.asarray(fa.isinf(x)), np.isinf(z))
        np.testing.assert_array_equal(np.asarray(fa.isfinite(x)), np.isfinite(z))
        big = fa.asarray(np.array([1e30 + 1e30j, 3e-30 + 1e30j], np.complex64))
        close(big / big, np.ones(2, np.complex64))  # Smith's division: no overflow in |d|^2
        close(fa.asarray(np.array([1 + 1j], np.complex64)) / 0, np.array([complex(inf, inf)], np.complex64))
        close(fa.sign(fa.asarray(np.array([3 + 4j, 0j], np.complex64))), np.array([0.6 + 0.8j, 0], np.complex64))


SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.5]
# Inputs where a NaN part propagates differently from C99/numpy in our formulas (docs/array_api.md says so); and
# expm1(+-inf/NaN + 0j), where we give the array API's +inf + 0j (numpy: inf + nan j).
SPECIAL_EXCEPTIONS = {"expm1": {(np.inf, 0.0), (np.nan, 0.0)}, "asinh": {(np.nan, 0.0)}, "atan": {(np.nan, 0.0)},
                      "asin": {(0.0, np.nan)}, "acos": {(0.0, np.nan)}, "acosh": {(0.0, np.nan)},
                      "atanh": {(0.0, np.nan)}}


@pytest.mark.parametrize("name", ["exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "sin", "cos", "tan", "sinh",
                                  "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh"])
def test_special_value_grid(name):
    """Every pair of {+-0, +-1, +-inf, NaN, 2.5}: which parts are NaN, and the magnitudes of the others, as numpy
    (C99 Annex G, which the array API's special cases follow; signs of zeros and of infinities the standard leaves
    unspecified are not compared)."""
    z = np.array([complex(a, b) for a in SPECIAL for b in SPECIAL], np.complex128)
    def key(a, b):  # signs are not told apart here
        return repr(abs(float(a))), repr(abs(float(b)))
    skip = {key(a, b) for a, b in SPECIAL_EXCEPTIONS.get(name, ())}
    with np.errstate(all="ignore"):
        want = NP.get(name, getattr(np, name, None))(z)
    got = np.asarray(getattr(fa, name)(fa.asarray(z)))
    for zi, g, w in zip(z, got, want):
        if key(zi.real, zi.imag) in skip:
            continue
        for gp, wp in ((g.real, w.real), (g.imag, w.imag)):
            assert np.isnan(gp) == np.isnan(wp) and (np.isnan(wp) or np.isclose(abs(gp), abs(wp), rtol=1e-12)), \
                (name, zi, g, w)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_accuracy_across_magnitudes_against_mpmath(dtype):
    """|z| from 1e-6 to 1e6 at every angle: the error in ulps of the result's magnitude, against 30-digit mpmath
    (numpy's own log1p loses digits near 0 here). The textbook log forms failed this by 1e5 ulps near 0 and
    near 3e3 (complex64)."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 30
    rng = np.random.default_rng(12)
    z = (10.0 ** rng.uniform(-6, 6, 400) * np.exp(1j * rng.uniform(-np.pi, np.pi, 400))).astype(dtype)
    eps = np.finfo(np.float32 if dtype == "complex64" else np.float64).eps
    for name in ("log", "log1p", "expm1", "sqrt", "tan", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh"):
        got = np.asarray(getattr(fa, name)(fa.asarray(z))).astype(np.complex128)
        want = np.array([complex(getattr(mp, name)(mp.mpc(complex(v)))) for v in z])
        ok = np.isfinite(want) & (np.abs(want) < 1e30) & (np.abs(want) > 1e-30)
        ulps = np.abs(got[ok] - want[ok]) / np.abs(want[ok]) / eps
        assert np.percentile(ulps, 99) < 4 and ulps.max() < 256, (name, np.percentile(ulps, 99), ulps.max())


def test_real_imag_conj_of_real_arrays():
    r = np.arange(3.0, dtype=np.float32)
    x = fa.asarray(r)
    assert fa.real(x) is x and fa.conj(x) is x
    close(fa.imag(x), np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="imaginary part"):
        fa.astype(fa.asarray(np.ones(2, np.complex64)), fa.float32)
    np.testing.assert_array_equal(np.asarray(fa.astype(fa.asarray(np.array([0j, 1j], np.complex64)), fa.bool)),
                                  [False, True])


# ---- reductions, matmul --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), ((0, 2), True), (-1, False)])
def test_reductions(dtype, axis, keepdims):
    z = crandom(np.random.default_rng(2), (3, 4, 5), dtype, scale=1.0)
    x = fa.asarray(z)
    close(fa.sum(x, axis=axis, keepdims=keepdims), np.sum(z, axis=axis, keepdims=keepdims), dtype=dtype)
    close(fa.prod(x, axis=axis, keepdims=keepdims), np.prod(z.astype(np.complex128), axis=axis, keepdims=keepdims),
          dtype=dtype, rtol=TOL[dtype]["rtol"] * 50)
    close(fa.mean(x * 2, axis=axis, keepdims=keepdims), np.mean(z * 2, axis=axis, keepdims=keepdims), dtype=dtype)
    np.testing.assert_array_equal(np.asarray(fa.any(x == 0, axis=axis)), np.any(z == 0, axis=axis))
    close(fa.cumulative_sum(x, axis=1), np.cumsum(z, axis=1), dtype=dtype)
    close(fa.cumulative_prod(x, axis=2, include_initial=True)[..., 1:], np.cumprod(z.astype(np.complex128), axis=2),
          dtype=dtype, rtol=TOL[dtype]["rtol"] * 50)


def test_products_whose_factors_exceed_the_float_max_in_modulus(backend):
    """|z| of 3e38+3e38j is past float32's maximum though both parts are finite: the magnitude-and-angle product
    (hypot of each factor multiplied) gave inf+infj for one factor; numpy returns the element."""
    z = np.array([3e38 + 3e38j], np.complex64)
    close(fa.prod(fa.asarray(z)), z[0], dtype="complex64", rtol=4e-7)
    close(fa.cumulative_prod(fa.asarray(z)), z, dtype="complex64", rtol=4e-7)
    w = np.array([1.5e308 + 1.5e308j, 0.5], np.complex128)
    close(fa.prod(fa.asarray(w)), np.prod(w), dtype="complex128", rtol=1e-15)
    close(fa.cumulative_prod(fa.asarray(w)), np.cumprod(w), dtype="complex128", rtol=1e-15)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_long_products_are_as_accurate_as_numpy(backend, dtype):
    """1000 unit-modulus factors: angles summed in float32 put complex64 products 1e-3 off (numpy: ~1e-6); one
    rounded float64 sum of angles ~3000 puts complex128 ones ~1e3 ulps off. Measured error now: complex64 < 1
    ulp, complex128 a few tens of ulps (numpy's sequential product: ~10)."""
    rng = np.random.default_rng(0)
    z = np.exp(1j * rng.uniform(2.5, 3.1, 1000) + rng.normal(0, 0.05, 1000)).astype(dtype)
    exact = np.cumprod(z.astype(np.clongdouble))
    eps = np.finfo(z.real.dtype).eps
    for got, want in ((fa.prod(fa.asarray(z)), exact[-1:]), (fa.cumulative_prod(fa.asarray(z)), exact)):
        got = np.asarray(got).reshape(-1).astype(np.clongdouble)
        err = np.max(np.abs(got - want) / np.abs(want)) / eps
        assert err < (4 if dtype == "complex64" else 100), err


def test_split_reductions_of_complex_values(monkeypatch):
    """The GPU's two-stage full and column reductions (forced on here) lower like one-stage ones."""
    from flyarray.ops import core
    monkeypatch.setattr(core, "SPLIT_ON_CPU", True)
    monkeypatch.setattr(core, "SPLIT_MIN", 4096)
    rng = np.random.default_rng(11)
    z = crandom(rng, (256, 40))
    x = fa.asarray(z)
    assert fa.explain(fa.sum(x * 2)).n_kernels == 2
    close(fa.sum(x * 2), np.sum(z.astype(np.complex128) * 2), rtol=1e-5)
    close(fa.sum(x, axis=0), np.sum(z.astype(np.complex128), axis=0), rtol=1e-5, atol=1e-5)
    close(fa.prod(x[:, :3] * 0.1 + 1, axis=0), np.prod(z[:, :3].astype(np.complex128) * 0.1 + 1, axis=0), rtol=1e-4)


@pytest.mark.parametrize("name", ["max", "min", "argmax", "std", "var", "sort"])
def test_orderings_and_real_only_reductions_refuse_complex(name):
    with pytest.raises(TypeError):
        getattr(fa, name)(fa.asarray(np.ones((2, 2), np.complex64)))


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((4,), (4, 3)), ((3, 4), (4,)),
                                    ((2, 1, 2, 3), (3, 3, 2))])
def test_matmul(dtype, shapes):
    rng = np.random.default_rng(3)
    a, b = crandom(rng, shapes[0], dtype), crandom(rng, shapes[1], dtype)
    close(fa.asarray(a) @ fa.asarray(b), a @ b, dtype=dtype, rtol=TOL[dtype]["rtol"] * 10,
          atol=TOL[dtype]["atol"] * 10)
    close(fa.matmul(fa.conj(fa.asarray(a)), fa.asarray(b) * 1j), np.conj(a) @ (b * 1j), rtol=TOL[dtype]["rtol"] * 10,
          atol=TOL[dtype]["atol"] * 10)


def test_matmul_mixed_with_real_promotes():
    rng = np.random.default_rng(4)
    a, b = crandom(rng, (3, 4)), rng.standard_normal((4, 2))
    got = fa.asarray(a) @ fa.asarray(b)
    assert got.dtype == fa.complex128
    close(got, a @ b, rtol=1e-6)


def test_matmul_is_one_gemm():
    rng = np.random.default_rng(5)
    y = fa.asarray(crandom(rng, (8, 16))) @ fa.asarray(crandom(rng, (16, 4)))
    e = fa.explain(y)
    assert [s.ops for s in e.steps if s.kind == "library call"] == [["matmul"]]
    assert e.n_kernels == 2  # the block matrix of b (one fused kernel) and the GEMM; a is read as it lies


def test_linalg_decompositions_of_complex_matrices():
    rng = np.random.default_rng(14)
    a = crandom(rng, (2, 4, 4), "complex128", scale=1.0)
    h = a @ np.conj(np.swapaxes(a, -1, -2)) + 4 * np.eye(4)  # Hermitian positive definite
    la, x = fa.linalg, fa.asarray(a)
    close(la.cholesky(fa.asarray(h)), np.linalg.cholesky(h), dtype="complex128")
    close(la.inv(x), np.linalg.inv(a))
    close(la.det(x), np.linalg.det(a))
    close(la.solve(x, fa.asarray(h)), np.linalg.solve(a, h))
    sign, logdet = la.slogdet(x)
    close(sign, np.linalg.slogdet(a)[0], dtype="complex128")
    np.testing.assert_allclose(np.asarray(logdet), np.linalg.slogdet(a)[1], rtol=1e-12)
    assert la.svdvals(x).dtype == fa.float64 and la.eigvalsh(fa.asarray(h)).dtype == fa.float64
    np.testing.assert_allclose(np.asarray(la.svdvals(x)), np.linalg.svd(a, compute_uv=False), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(la.matrix_norm(x, ord="nuc")), np.linalg.norm(a, "nuc", axis=(1, 2)),
                               rtol=1e-12)
    close(la.matrix_power(x, 3), np.linalg.matrix_power(a, 3))
    values, vectors = la.eig(x)  # unordered: check A v = v w
    v, w = np.asarray(vectors), np.asarray(values)
    np.testing.assert_allclose(a @ v, v * w[:, None, :], atol=1e-12)
    real = rng.standard_normal((3, 3)).astype(np.float32)
    got = np.asarray(la.eigvals(fa.asarray(real)))
    assert got.dtype == np.complex64
    np.testing.assert_allclose(np.sort_complex(got), np.sort_complex(np.linalg.eigvals(real)), rtol=1e-5, atol=1e-5)
    assert fa.vmap(la.eigvals)(x).shape == (2, 4)
    close(la.det(fa.exp(x * 0.1)), np.linalg.det(np.exp(a * 0.1)))  # a lazy complex input: materialized, then torch


# ---- DLPack and zero copy -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_dlpack_zero_copy(dtype):
    t = torch.randn(4, 3, dtype=dtype)
    x = fa.asarray(t)
    assert x._node.buffer.data_ptr() == t.data_ptr()
    assert torch.from_dlpack(x).data_ptr() == t.data_ptr()
    assert fa.from_dlpack(t)._node.buffer.data_ptr() == t.data_ptr()
    n = np.ones((2, 3), np.complex64)
    assert fa.asarray(n)._node.buffer.data_ptr() == n.__array_interface__["data"][0]
    y = x * (1 + 1j)
    out = torch.from_dlpack(y)
    assert out.dtype == dtype and out.data_ptr() == y._node.buffer.data_ptr()
    torch.testing.assert_close(out, t * (1 + 1j))
    assert np.asarray(y).dtype == np.dtype(str(dtype).split(".")[-1])


def test_a_lazily_conjugated_torch_tensor_reads_its_values():
    t = torch.randn(3, dtype=torch.complex64)
    close(fa.asarray(t.conj()) * 1, t.conj().resolve_conj().numpy())


# ---- fusion and plans ---------------------------------------------------------------------------------------------
def test_a_complex_chain_is_one_kernel(backend):
    rng = np.random.default_rng(6)
    a, b = crandom(rng, (3, 4)), crandom(rng, (4,))
    y = fa.sqrt(fa.exp(fa.asarray(a) * fa.asarray(b) + 1) / (fa.conj(fa.asarray(a)) - 2j)) * 3
    assert fa.explain(y).n_kernels == 1
    fa.reset_stats()
    close(y, np.sqrt(np.exp(a * b + 1) / (np.conj(a) - 2j)) * 3, rtol=1e-5)
    assert fa.stats()["kernels_launched"] == 1
    s = fa.sum(fa.asarray(a) * fa.asarray(b), axis=1)  # elementwise into the reduction: one kernel
    assert fa.explain(s).n_kernels == 1
    close(s, np.sum(a * b, axis=1), rtol=1e-5)
    r = fa.abs(fa.asarray(a) * 2) + fa.real(fa.asarray(a))  # real results of complex inputs: one kernel
    assert fa.explain(r).n_kernels == 1
    close(r, np.abs(a * 2) + a.real)


def test_scalars_bind_into_one_plan():
    x = fa.asarray(crandom(np.random.default_rng(7), (5,)))
    np.asarray(x * (1 + 2j))
    fa.reset_stats()
    got = x * (3 - 1j)
    close(got, np.asarray(x) * (3 - 1j))
    assert fa.stats()["plan_hits"] == 1 and fa.stats()["plan_misses"] == 0


def test_interpret_backend_runs_the_lowered_kernels(interpret):
    rng = np.random.default_rng(8)
    a, b = crandom(rng, (2, 3)), crandom(rng, (3, 2))
    x, y = fa.asarray(a), fa.asarray(b)
    close(fa.exp(x) * fa.conj(x) / (x + 1j), np.exp(a) * np.conj(a) / (a + 1j), rtol=1e-5)
    close(fa.sum(x, axis=0), a.sum(0))
    close(x @ y, a @ b, rtol=1e-5)
    close(fa.fft.fft(x), np.fft.fft(a), rtol=1e-5, atol=1e-5)
    assert fa.stats()["kernels_launched"] >= 4


def test_vmap_of_complex_functions():
    rng = np.random.default_rng(10)
    z, w = crandom(rng, (3, 4)), crandom(rng, (4, 2))
    f = lambda a: fa.fft.fft(fa.conj(a)) * fa.real(a) + fa.imag(a) * 1j  # noqa: E731
    close(fa.vmap(f)(fa.asarray(z)), np.stack([np.fft.fft(np.conj(r)) * r.real + r.imag * 1j for r in z]), rtol=1e-5)
    close(fa.vmap(lambda a: a @ fa.asarray(w))(fa.asarray(z)), z @ w, rtol=1e-5)
    close(fa.vmap(lambda a: fa.cumulative_sum(a))(fa.asarray(z)), np.cumsum(z, axis=1), rtol=1e-5)


# ---- autodiff ------------------------------------------------------------------------------------------------------
def test_grad_refuses_complex_values():
    x = fa.asarray(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="complex"):
        fa.grad(lambda v: fa.sum(fa.abs(fa.exp(v * 1j))))(x)
    with pytest.raises(TypeError, match="complex"):
        fa.grad(lambda z: fa.sum(fa.real(z)))(fa.asarray(np.ones(3, np.complex64)))
    with pytest.raises(TypeError, match="complex"):
        fa.grad(lambda v: fa.sum(fa.abs(fa.fft.rfft(v))))(x)
    with pytest.raises(TypeError, match="complex"):
        fa.jvp(lambda v: fa.real(fa.fft.ifft(v)), (x,), (x,))


# ---- on a GPU (skipped without one) -----------------------------------------------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")


@pytest.fixture
def gpu_backend():
    fa.set_backend("gpu")
    fa.reset_stats()
    yield
    fa.set_backend(None)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_gpu_elementwise_reduction_matmul_fft(gpu_backend, dtype):
    a = torch.randn(257, 129, dtype=dtype, device="cuda")
    b = torch.randn(129, 65, dtype=dtype, device="cuda")
    x, y = fa.asarray(a), fa.asarray(b)
    assert x._node.buffer.data_ptr() == a.data_ptr()
    fa.reset_stats()
    chain = torch.from_dlpack(fa.sqrt(fa.exp(x * 0.1 + 1j) / (fa.conj(x) - 2.0)) * 3)
    assert fa.stats()["kernels_launched"] == 1 and chain.dtype == dtype and chain.is_cuda
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.complex64 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(chain, torch.sqrt(torch.exp(a * 0.1 + 1j) / (a.conj() - 2.0)) * 3, **tol)
    torch.testing.assert_close(torch.from_dlpack(fa.sum(x * x, axis=0)), (a * a).sum(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.from_dlpack(fa.abs(x)), a.abs(), **tol)
    got, want = torch.from_dlpack(x @ y), a @ b
    rel = ((got - want).abs().norm() / want.abs().norm()).item()
    assert rel < (5e-3 if dtype == torch.complex64 else 1e-12), rel  # float32 GEMMs may use TF32
    torch.testing.assert_close(torch.from_dlpack(fa.fft.fft(x, axis=0)), torch.fft.fft(a, dim=0), **tol)
    torch.testing.assert_close(torch.from_dlpack(fa.fft.irfft(fa.fft.rfft(fa.real(x)), n=129)), a.real, **tol)


def test_lowered_constants_are_kernel_arguments_of_their_dtype(interpret, monkeypatch):
    """Every constant the lowering makes reaches a kernel as its slot's Python type (an int for an integer
    slot): the GPU's direct launcher refuses a float where the kernel takes an integer."""
    from flyarray import runtime
    seen, scalar_args = [], runtime._scalar_args

    def typed(kernel, scalars):
        seen.extend((d.kind, type(v)) for v, d in zip(scalars, kernel.scalar_dtypes))
        return scalar_args(kernel, scalars)
    monkeypatch.setattr(runtime, "_scalar_args", typed)
    z = crandom(np.random.default_rng(2), 6, "complex64", scale=2.0).astype("complex64")
    for name in ("exp", "sqrt", "conj", "tanh"):
        np.asarray(getattr(fa, name)(fa.asarray(z)))
    assert seen and all(t is (bool if k == "b" else int if k in "iu" else float) for k, t in seen), set(seen)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", CDTYPES)
def test_gpu_unary_functions_match_the_reference_backend(dtype):
    """The generated kernels (libdevice math) against the reference backend, on random and special values."""
    rng = np.random.default_rng(13)
    special = np.array([complex(a, b) for a in SPECIAL for b in SPECIAL])
    z = np.concatenate([crandom(rng, 200, "complex128", scale=3.0), special]).astype(dtype)
    tol = TOL[dtype]
    for name in UNARY:
        want = np.asarray(getattr(fa, name)(fa.asarray(z)))  # CPU: the reference backend
        fa.set_backend("gpu")
        try:
            got = getattr(fa, name)(fa.asarray(torch.from_numpy(z).cuda())).torch().cpu().numpy()
        finally:
            fa.set_backend(None)
        if want.dtype == np.bool_:
            np.testing.assert_array_equal(got, want, err_msg=name)
            continue
        np.testing.assert_allclose(got, want, rtol=tol["rtol"] * 10, atol=tol["atol"] * 10, equal_nan=True,
                                   err_msg=name)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_products_of_real_and_imaginary_factors_are_exactly_real_or_imaginary(backend, dtype):
    """Factors on an axis turn by whole quarter turns, counted exactly: prod of three -1s is -1 + 0j (the sum of
    three float64 pi's left -1 + 3.7e-16j), as numpy's and array_api_strict's; cumulative_prod likewise."""
    for values, want in (([-1, -1, -1], -1), ([-2, -3, -5], -30), ([1j, 1j, 1j], -1j), ([1j, -1, 2j, -3], -6),
                         ([2j, 2j], -4), ([-1j, 1j, -1], -1)):
        z = np.array(values, dtype)
        got = np.asarray(fa.prod(fa.asarray(z)))
        assert got == want, (values, got)
        steps = np.asarray(fa.cumulative_prod(fa.asarray(z)))
        np.testing.assert_array_equal(steps, np.cumprod(z.astype(np.complex128)).astype(dtype))
    mixed = np.array([2 + 3j, 1j, -1 - 1j, -2], dtype)   # off-axis factors keep their accuracy
    np.testing.assert_allclose(np.asarray(fa.prod(fa.asarray(mixed))), np.prod(mixed.astype(np.complex128)),
                               rtol=1e-6 if dtype == np.complex64 else 1e-14)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_cumulative_prod_starts_with_its_first_factor_exactly(backend, dtype):
    """A prefix of one factor is that factor: the polar form rounded 0.3+0.7j and gave inf+nan j for inf+0j,
    where numpy gives the element itself (later prefixes of an infinite factor are nan-laden in both)."""
    rng = np.random.default_rng(7)
    z = (rng.standard_normal((3, 5)) + 1j * rng.standard_normal((3, 5))).astype(dtype)
    z[1, 0] = np.inf
    for axis in (0, 1):
        got = np.asarray(fa.cumulative_prod(fa.asarray(z), axis=axis))
        np.testing.assert_array_equal(np.take(got, 0, axis=axis), np.take(z, 0, axis=axis))
        with_one = np.asarray(fa.cumulative_prod(fa.asarray(z), axis=axis, include_initial=True))
        np.testing.assert_array_equal(np.take(with_one, 0, axis=axis), np.ones(z.shape[1 - axis], dtype))
        np.testing.assert_array_equal(np.take(with_one, 1, axis=axis), np.take(z, 0, axis=axis))
    assert np.asarray(fa.cumulative_prod(fa.asarray(np.array([np.inf + 0j], dtype))))[0] == np.inf + 0j
    assert np.asarray(fa.cumulative_prod(fa.asarray(np.zeros(0, dtype)), include_initial=True)).tolist() == [1]


def test_complex_power_zero_is_one_everywhere():
    z = np.array([0j, 1 + 2j, np.inf + 0j, np.nan + 0j], np.complex64)
    np.testing.assert_array_equal(np.asarray(fa.asarray(z) ** 0), np.ones(4, np.complex64))
    np.testing.assert_array_equal(np.asarray(fa.pow(fa.asarray(z), fa.asarray(np.zeros(4, np.complex64)))),
                                  np.ones(4, np.complex64))


def test_complex_log_does_not_overflow_near_the_floats_maximum(backend):
    z = np.array([3.4028235e38 + 3.4028235e38j, -2e38 + 3e38j, 1 + 1j, 0j, np.inf + 1j], np.complex64)
    with np.errstate(all="ignore"):
        want = np.log(z.astype(np.complex128))
    got = np.asarray(fa.log(fa.asarray(z))).astype(np.complex128)
    np.testing.assert_allclose(got.real, want.real, rtol=1e-6)
    np.testing.assert_allclose(got.imag, want.imag, rtol=1e-6)


# Values next to the branch points and the float's limits, against numpy (or the value's closed form).
EDGES = [
    ("atanh", np.complex64, [-0.9999 + 1e-4j, 0.9999 + 1e-4j, -0.99 + 0.01j, 0.3 - 0.2j], np.arctanh),
    ("atanh", np.complex128, [-1.00000001 + 1e-8j, -0.5 + 2j], np.arctanh),
    ("atan", np.complex64, [1e-4 + 0.9999j, 0.5 + 0.5j], np.arctan),
    ("sqrt", np.complex64, [3e38 + 3e38j, 1e-45 + 0j, -3e38 + 1e-3j, 1 - 1j, 1e-45 - 1e-45j], np.sqrt),
    ("sqrt", np.complex128, [1.7e308 + 1.7e308j, 5e-324 + 0j, -2 - 2j], np.sqrt),
    # z / |z| with |z| past the float's range (numpy's own z / abs(z) overflows there)
    ("sign", np.complex64, [3e38 + 3e38j, -3e38 + 0j, 1 + 1j], lambda z: z / np.abs(z.astype(np.complex128))),
    # sinh a / cosh a past their overflow times a small sin b / cos b (the product is finite; it was inf)
    ("sinh", np.complex64, [100 + 1e-30j, -95 - 2e-35j, 3 + 1j], np.sinh),
    ("cosh", np.complex64, [100 + 1e-30j, -95 + 2e-35j], np.cosh),
    ("sinh", np.complex128, [800 + 1e-300j, -1212.3872880832648 - 2.2250738585072014e-308j], np.sinh),
    ("cosh", np.complex128, [800 + 1e-300j, -1000 + 1e-300j], np.cosh),
    # |z| in the subnormal range: log(max) + log1p((min/max)^2) / 2 (log of the rounded |z| was off by up to ln sqrt 2)
    ("log", np.complex64, [1e-45 - 1e-45j, 4e-45 - 1e-45j, 3e-39 + 1e-40j, 1e-30 + 1e-30j], np.log),
    ("log10", np.complex64, [1e-45 - 1e-45j], np.log10),
    ("log", np.complex128, [1e-320 + 1e-320j, 5e-324 + 5e-324j, 1e-310 - 3e-311j], np.log),
]


@pytest.mark.parametrize("name,dtype,values,want", EDGES, ids=[f"{e[0]}-{np.dtype(e[1]).name}" for e in EDGES])
def test_functions_next_to_branch_points_and_the_floats_limits(backend, name, dtype, values, want):
    """Finite results where the old formulas gave inf or 0: catanh's log1p argument rounded to -1 near
    z = -1, csqrt's |z| overflowed (and |a| / 2 flushed for subnormals), sign divided by an infinite |z|,
    csinh/ccosh multiplied an infinite sinh a by a tiny sin b; clog's |z| rounded below the normal range."""
    z = np.array(values, dtype)
    got = np.asarray(getattr(fa, name)(fa.asarray(z)))
    with np.errstate(over="ignore"):
        want = want(z)
    want, rtol = want.astype(dtype), 2e-6 if dtype == np.complex64 else 1e-12
    np.testing.assert_allclose(got.real, want.real, rtol=rtol)   # by parts: numpy compares complex infs badly
    np.testing.assert_allclose(got.imag, want.imag, rtol=rtol)


def test_sign_of_an_infinite_part_is_unit(backend):
    got = np.asarray(fa.sign(fa.asarray(np.array([complex(0, np.inf), complex(-np.inf, np.inf), complex(np.inf, 5)]))))
    np.testing.assert_allclose(got, [1j, (-1 + 1j) / np.sqrt(2), 1 + 0j])


def test_a_python_scalar_past_the_complex64_range_is_inf(backend):
    z = fa.asarray(np.array([1j], np.complex64))
    assert not np.asarray(z == 1e300).any() and np.asarray(z != 1e300j).all()
    np.testing.assert_array_equal(np.asarray(fa.where(fa.asarray(np.array([False])), z, 1e39)), [np.inf + 0j])


def test_fuzz_found_special_values_match_numpy(backend):
    """sign of a NaN part is NaN + NaN j (it was 0j); tanh of a finite |a| > 22 with b inf or NaN is
    NaN + NaN j (it was 1 + 0j; C99); atanh near +-1 with a tiny b stays finite (b * b underflowed: inf);
    exp keeps a finite e^a cos b past e^a's overflow (it was inf) and gives NaN + NaN j for a finite a with
    b inf or NaN (C99; it was inf + NaN j); acos/acosh next to +-1 (Kahan's forms: 0 or 11% off before);
    pad takes a Python complex constant (it raised)."""
    nan, inf = float("nan"), float("inf")
    cases = [("sign", [complex(nan, 0.0), complex(nan, 2.0)], np.complex128),
             ("tanh", [complex(23.0, nan), complex(-30.0, inf), complex(inf, 0.5)], np.complex128),
             ("arctanh", [complex(1.0, 1e-170), complex(-1.0, 1e-300)], np.complex128),
             ("arctanh", [complex(1.0, 1e-23), complex(1.0, 1e-30)], np.complex64),
             ("exp", [complex(710.0, 1.5), complex(1e30, nan), complex(1e30, inf), complex(inf, nan)], np.complex128),
             ("exp", [complex(88.9, 1.5)], np.complex64),
             ("arccos", [complex(1.0, 1e-30), complex(1.0, -1e-100), complex(-1.0, 1e-80), complex(2.0, -0.0)],
              np.complex128),
             ("arccosh", [complex(1.0, 1e-30), complex(1.0, -1e-100), complex(-1.0, 1e-80)], np.complex128),
             ("arccos", [complex(1.0, 1e-16), complex(1.0, 1e-10)], np.complex64)]
    for name, values, dtype in cases:
        x = np.asarray(values, dtype=dtype)
        fn = getattr(fa, name, None) or getattr(fa, "a" + name[3:])   # numpy's arctanh is fa.atanh
        got, want = np.asarray(fn(fa.asarray(x))), getattr(np, name)(x)
        for part in ("real", "imag"):   # part by part: assert_allclose's complex inf check is unreliable
            np.testing.assert_allclose(getattr(got, part), getattr(want, part), rtol=1e-5, equal_nan=True,
                                       err_msg=f"{name} {part}")
    padded = fa.pad(fa.asarray(np.asarray([1 + 1j, 2 - 1j])), 1, constant_values=3j)
    np.testing.assert_array_equal(np.asarray(padded), [3j, 1 + 1j, 2 - 1j, 3j])


def _ulps(got, want):
    """Distance in units in the last place of ``want``'s dtype, part by part (the larger)."""
    want = np.asarray(want)
    spacing = lambda v: np.spacing(np.abs(v).astype(want.real.dtype))   # noqa: E731
    return max(float(np.max(np.abs(got.real - want.real) / spacing(want.real))),
               float(np.max(np.abs(got.imag - want.imag) / spacing(want.imag))))


def test_thirty_fourth_session_fuzz_log_asin_and_their_special_values(backend):
    """Found by the elementwise fuzz (thirty-fourth session), each against numpy: log next to |z| = 1 lost the real
    part (log(hypot) cancels: 2727 ulp in complex64, 56,430 in complex128); log1p of a huge finite z was inf; asin
    next to +-1 (asinh next to +-i) was 12,593 ulp off (1 + w^2 cancelled: Hull, Fairgrieve and Tang's algorithm now); NaN special values lost their exact part (C99); asinh/asin
    dropped signed zeros."""
    z64 = np.array([1.0000158548355103 + 9.960435272660106e-05j, 0.9999 + 0.0141j], np.complex64)
    z128 = np.array([1.0000053866414857 + 7.988412015610762e-06j, 0.6 + 0.8000001j], np.complex128)
    for z in (z64, z128):
        assert _ulps(np.asarray(fa.log(fa.asarray(z))), np.log(z.astype(np.complex128)).astype(z.dtype)) <= 2
    huge = np.array([3.4028235e38 + 3.4028235e38j, 1.9999999e38 + 3e38j], np.complex64)
    np.testing.assert_allclose(np.asarray(fa.log1p(fa.asarray(huge))), [89.06941 + 0.7853982j, 88.78071 + 0.98279375j],
                               rtol=1e-6)
    near = np.array([0.9999993776506559 + 6.5796614709610055e-06j], np.complex128)
    assert _ulps(np.asarray(fa.asin(fa.asarray(near))), np.arcsin(near)) <= 2
    nan = float("nan")
    for name, value, want in [("asinh", complex(nan, 0.0), complex(nan, 0.0)), ("asin", complex(0, nan), complex(0, nan)),
                              ("acos", complex(0, nan), complex(np.pi / 2, nan)),
                              ("acosh", complex(0, nan), complex(nan, np.pi / 2)),
                              ("atanh", complex(0, nan), complex(0, nan)), ("atan", complex(nan, 0), complex(nan, 0))]:
        for dtype in (np.complex64, np.complex128):
            got = complex(np.asarray(getattr(fa, name)(fa.asarray(np.array([value], dtype))))[0])
            assert (np.isnan(got.real) if np.isnan(want.real) else got.real == np.float32(want.real)) and \
                (np.isnan(got.imag) if np.isnan(want.imag) else got.imag == np.float32(want.imag)), (name, dtype, got)
    with np.errstate(all="ignore"):   # exp(-inf + i y) = +0 cis y: zeros signed as cos y, sin y (it was +0 + 0j)
        z = np.array([complex(-np.inf, 2.0), complex(-np.inf, -1.0), complex(-np.inf, 4.0), complex(-800, 3.0)])
        got, want = np.asarray(fa.exp(fa.asarray(z))), np.exp(z)
    assert (np.signbit(got.real) == np.signbit(want.real)).all() and (np.signbit(got.imag) == np.signbit(want.imag)).all()
    for name, value in [("asinh", 1 - 0j), ("asinh", complex(-0.0, 0.0)), ("asin", 1j), ("asin", 0j),
                        ("asinh", complex(-2.0, -0.0)), ("asin", complex(-0.5, -0.0))]:
        z = np.array([complex(value)], np.complex128)
        got, want = np.asarray(getattr(fa, name)(fa.asarray(z))), getattr(np, "arc" + name[1:])(z)
        assert np.signbit(got.real) == np.signbit(want.real) and np.signbit(got.imag) == np.signbit(want.imag), \
            (name, value, got, want)
        np.testing.assert_allclose(got, want, rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_log_next_to_the_unit_circle_is_within_an_ulp_or_two(backend, dtype):
    """log|z| = log1p(|z|^2 - 1) / 2 where the two squares cancel: against the exact value (fractions and
    80-digit decimals) on random z at distances 1e-2 to 0 from the unit circle."""
    import decimal
    from fractions import Fraction
    decimal.getcontext().prec = 80
    rng = np.random.default_rng(34)
    t = rng.uniform(0, 2 * np.pi, 200)
    r = 1 + rng.normal(0, 1, 200) * rng.choice([1e-2, 1e-4, 1e-7, 1e-12, 0], 200)
    z = np.concatenate([(r * np.exp(1j * t)).astype(dtype), np.array([0.6 + 0.8j, 0.28 + 0.96j, 1e-3 + 1j], dtype)])
    got = np.asarray(fa.log(fa.asarray(z))).real

    def exact(v):
        square = Fraction(float(v.real)) ** 2 + Fraction(float(v.imag)) ** 2
        return float((decimal.Decimal(square.numerator) / decimal.Decimal(square.denominator)).ln() / 2)
    want = np.array([exact(v) for v in z]).astype(got.dtype)
    ulps = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want)).astype(np.float64)
    assert ulps.max() <= 2, (z[ulps.argmax()], got[ulps.argmax()], want[ulps.argmax()])


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_asin_and_asinh_near_the_axes_and_branch_points_are_within_two_ulps(backend, dtype):
    """Against mpmath at 50 digits, part by part: z next to +-1 with small imaginary parts down to 1e-10, in every
    quadrant (asin(-0.44 + 6.3e-12j)'s imaginary part was 6e10 ulp off in complex128, asin next to 1 12,593 ulp:
    the small part came from a log1p of a sum with absolute rounding error)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    rng = np.random.default_rng(34)
    a = 1 + rng.normal(0, 1, 120) * rng.choice([0.3, 1e-2, 1e-4, 1e-7], 120)
    b = np.abs(rng.normal(0, 1, 120)) * rng.choice([0.5, 1e-2, 1e-4, 1e-7, 1e-10], 120)
    sign = rng.choice([-1, 1], (2, 120))
    z = (sign[0] * a + 1j * sign[1] * b).astype(dtype)
    for name, exact in (("asin", mpmath.asin), ("asinh", mpmath.asinh)):
        zz = z if name == "asin" else (z * 1j).astype(dtype)
        got = np.asarray(getattr(fa, name)(fa.asarray(zz)))
        want = np.array([complex(exact(mpmath.mpc(float(v.real), float(v.imag)))) for v in zz]).astype(dtype)
        assert _ulps(got, want) <= 2, name
