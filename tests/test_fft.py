"""fa.fft against numpy.fft: every function, norm, n/s and axis/axes; shape and dtype rules; errors raised at call
time (before any work); the transforms are lazy library nodes (torch.fft) that compose with our kernels."""
import numpy as np
import pytest

import flyarray as fa

RNG = np.random.default_rng(0)
Z = (RNG.standard_normal((4, 6, 5)) + 1j * RNG.standard_normal((4, 6, 5))).astype(np.complex64)
R = RNG.standard_normal((4, 6, 5)).astype(np.float32)
NORMS = ["backward", "ortho", "forward"]


def close(got, want, dtype):
    got = np.asarray(got)
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    tol = 2e-5 if dtype in ("complex64", "float32") else 1e-12
    np.testing.assert_allclose(got, want.astype(dtype), rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0))))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name,real_in", [("fft", False), ("ifft", False), ("rfft", True), ("irfft", False),
                                          ("hfft", False), ("ihfft", True)])
@pytest.mark.parametrize("n,axis", [(None, -1), (4, 0), (9, 1)])
def test_one_dimensional(name, real_in, norm, n, axis):
    for double in (False, True):
        x = R if real_in else Z
        x = x.astype({np.float32: np.float64, np.complex64: np.complex128}[x.dtype.type]) if double else x
        got = getattr(fa.fft, name)(fa.asarray(x), n=n, axis=axis, norm=norm)
        want = getattr(np.fft, name)(x, n=n, axis=axis, norm=norm)
        out = {"fft": x.dtype, "ifft": x.dtype}.get(name)
        if out is None:
            out = {np.dtype("float32"): "complex64", np.dtype("float64"): "complex128",
                   np.dtype("complex64"): "float32", np.dtype("complex128"): "float64"}[x.dtype]
        close(got, want, str(np.dtype(out)))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name,real_in", [("fftn", False), ("ifftn", False), ("rfftn", True), ("irfftn", False)])
@pytest.mark.parametrize("s,axes", [(None, None), ((3, 8), (0, 2)), (None, (-1, 1)), ((5, 4), None)])
def test_n_dimensional(name, real_in, norm, s, axes):
    x = R if real_in else Z
    got = getattr(fa.fft, name)(fa.asarray(x), s=s, axes=axes, norm=norm)
    np_axes = axes if axes is not None or s is None else tuple(range(-len(s), 0))  # the array API's rule
    want = getattr(np.fft, name)(x, s=s, axes=np_axes, norm=norm)
    out = {"fftn": "complex64", "ifftn": "complex64", "rfftn": "complex64", "irfftn": "float32"}[name]
    close(got, want, out)


def test_real_floats_are_read_as_complex_where_complex_is_taken():
    close(fa.fft.fft(fa.asarray(R)), np.fft.fft(R), "complex64")
    close(fa.fft.ifftn(fa.asarray(R.astype(np.float64))), np.fft.ifftn(R.astype(np.float64)), "complex128")


def test_frequencies_and_shifts():
    for n in (1, 6, 7):
        close(fa.fft.fftfreq(n, d=0.25), np.fft.fftfreq(n, 0.25), "float32")
        close(fa.fft.rfftfreq(n, dtype=fa.float64), np.fft.rfftfreq(n), "float64")
    for axes in (None, 1, (0, 2)):
        close(fa.fft.fftshift(fa.asarray(Z), axes=axes), np.fft.fftshift(Z, axes=axes), "complex64")
        close(fa.fft.ifftshift(fa.asarray(R), axes=axes), np.fft.ifftshift(R, axes=axes), "float32")
    close(fa.fft.ifftshift(fa.fft.fftshift(fa.asarray(Z))), Z, "complex64")


def test_round_trips_and_composition_with_our_kernels():
    x = fa.asarray(R)
    close(fa.fft.irfft(fa.fft.rfft(x * 2.0), n=5), R * 2, "float32")
    y = fa.abs(fa.fft.fftn(fa.exp(fa.asarray(Z) * 0.1), axes=(0, 1))) + 1.0
    close(y, np.abs(np.fft.fftn(np.exp(Z * 0.1), axes=(0, 1))) + 1, "float32")
    steps = fa.explain(fa.abs(fa.fft.fft(fa.exp(fa.asarray(Z))))).steps
    assert [s.kind for s in steps if s.kind != "view"] == ["fused kernel", "library call", "fused kernel"]


def test_empty_arrays():
    e = np.zeros((2, 0), np.complex64)
    close(fa.fft.fft(fa.asarray(e), axis=0), np.fft.fft(e, axis=0), "complex64")
    close(fa.fft.fft(fa.asarray(e), n=4), np.fft.fft(e, n=4), "complex64")  # zero-padded: zeros
    close(fa.fft.irfft(fa.asarray(np.zeros((0, 3), np.complex64)), axis=1), np.zeros((0, 4)), "float32")
    close(fa.fft.rfftn(fa.asarray(np.zeros((0, 4), np.float32)), axes=(1,)), np.zeros((0, 3), np.complex64),
          "complex64")


def test_fft_is_lazy():
    fa.reset_stats()
    y = fa.fft.fft(fa.asarray(Z))
    assert fa.stats()["evaluations"] == 0 and y._node.kind == "output"
    np.asarray(y)
    assert fa.stats()["library_calls"] == 1


@pytest.mark.parametrize("call,error,match", [
    (lambda: fa.fft.fft(fa.asarray(Z), axis=3), ValueError, "axis 3 is out of range"),
    (lambda: fa.fft.fft(fa.asarray(Z), n=0), ValueError, "n must be at least 1"),
    (lambda: fa.fft.ifft(fa.asarray(Z), n=-2), ValueError, "n must be at least 1"),
    (lambda: fa.fft.fft(fa.asarray(Z), n=2.5), TypeError, "n must be an int"),
    (lambda: fa.fft.fft(fa.asarray(Z), norm="none"), ValueError, "norm must be one of"),
    (lambda: fa.fft.rfft(fa.asarray(Z)), TypeError, "real float32 or float64"),
    (lambda: fa.fft.rfft(fa.asarray(np.arange(4))), TypeError, "real float32 or float64"),
    (lambda: fa.fft.fft(fa.asarray(np.arange(4))), TypeError, "complex64 or complex128"),
    (lambda: fa.fft.fft(fa.asarray(R.astype(np.float16))), TypeError, "complex64 or complex128"),
    (lambda: fa.fft.fftn(fa.asarray(Z), s=(2, 2), axes=(0,)), ValueError, "different lengths"),
    (lambda: fa.fft.fftn(fa.asarray(Z), axes=(0, 0)), ValueError, "repeat an axis"),
    (lambda: fa.fft.fftn(fa.asarray(Z), s=(2, 2, 2, 2, 2)), ValueError, "more entries than x has axes"),
    (lambda: fa.fft.irfft(fa.asarray(Z[..., :1])), ValueError, "pass n"),
    (lambda: fa.fft.fftfreq(0), ValueError, "at least 1"),
    (lambda: fa.fft.fftfreq(4, d=0), ValueError, "nonzero"),
    (lambda: fa.fft.fftshift(fa.asarray(Z), axes=(5,)), ValueError, "out of range"),
])
def test_errors_at_call_time(call, error, match):
    fa.reset_stats()
    with pytest.raises(error, match=match):
        call()
    assert fa.stats()["evaluations"] == 0 and fa.stats()["kernels_launched"] == 0


def test_namespace_is_the_array_apis():
    xp = pytest.importorskip("array_api_strict")
    assert set(xp.fft.__all__) == set(fa.fft.__all__)
    assert all(callable(getattr(fa.fft, n)) and getattr(fa.fft, n).__doc__ for n in fa.fft.__all__)


@pytest.mark.parametrize("name", ["fftn", "ifftn", "rfftn", "irfftn"])
@pytest.mark.parametrize("s", [(-1, 2), (4, -1), (-1, -1)])
def test_minus_one_in_s_takes_the_whole_axis(name, s):
    """The array API: s[i] == -1 uses axes[i] whole. For irfftn's last axis that is an output of 2 * (m - 1),
    which reads all m inputs (numpy 2 reads -1 as m there, which reads m // 2 + 1 of them)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5)) + (1j * rng.standard_normal((3, 5)) if name != "rfftn" else 0)
    got = getattr(fa.fft, name)(fa.asarray(x), s=s)
    whole = [m if v == -1 else v for v, m in zip(s, x.shape)]
    if name == "irfftn" and s[-1] == -1:
        whole[-1] = 2 * (x.shape[-1] - 1)
    want = getattr(np.fft, name)(x, s=whole)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-10)
