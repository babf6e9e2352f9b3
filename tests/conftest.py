"""Shared fixtures for the core suite: a private kernel cache, both CPU backends, a hypothesis profile.

The kernel tests under tests/kernels/ need none of this; they ignore it.
"""
import atexit
import os
import shutil
import tempfile

import numpy as np
import pytest

# A private cache dir for the whole session (flyarray.diskcache reads the variable at each first use).
_SESSION_CACHE = tempfile.mkdtemp(prefix="flyarray-test-cache-")
os.environ["FLYARRAY_CACHE_DIR"] = _SESSION_CACHE  # never the user's cache
# removed when the process ends (each xdist worker has its own): runs left 0.2-0.6 GB each behind, and
# a disk they filled failed a CI install
atexit.register(shutil.rmtree, _SESSION_CACHE, True)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

# The interpret backend runs generated Triton on the CPU: few, tiny examples; no deadline.
settings.register_profile("flyarray", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])
settings.register_profile("flyarray-long", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("FLYARRAY_HYPOTHESIS_PROFILE", "flyarray"))
# Tests pick their own example counts; FLYARRAY_HYPOTHESIS_SCALE=20 multiplies them all (a bug hunt).
EXAMPLE_SCALE = int(os.environ.get("FLYARRAY_HYPOTHESIS_SCALE", "1") or 1)


def scaled(n: int) -> int:
    return n * EXAMPLE_SCALE

BACKENDS = ["reference", "interpret"]


@pytest.fixture(scope="session")
def cache_dir():
    return os.environ["FLYARRAY_CACHE_DIR"]


def _skip_a_broken_interpreter(name):
    """Triton 3.6's interpreter breaks on numpy >= 2.4 (the GPU machine): interpret-backend tests
    skip there, saying why (interpreter_probe.py); CPU machines run them."""
    from .interpreter_probe import INTERPRETER_PROBLEM
    if name == "interpret" and INTERPRETER_PROBLEM:
        pytest.skip(f"Triton's interpreter is unreliable here: {INTERPRETER_PROBLEM}")


@pytest.fixture(autouse=True)
def _default_backend_and_device(request):
    """Every test starts on the default backend, with arrays made without a device on the CPU unless it is a
    GPU test (a skipif naming the GPU), and leaves both as they were. On a GPU host, fa.ones/fa.zeros would
    otherwise go to the GPU while numpy data stays on the CPU; and a test that calls fa.set_backend without
    undoing it must not decide where later tests' arrays go."""
    from flyarray import runtime

    from .interpreter_probe import is_gpu_test
    runtime.set_backend(None)
    runtime.set_default_device(None if is_gpu_test(request.node) else "cpu")
    yield
    runtime.set_backend(None)
    runtime.set_default_device(None)


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Run the test on one CPU backend; restore the default afterwards."""
    import flyarray as fa
    _skip_a_broken_interpreter(request.param)
    fa.set_backend(request.param)
    fa.reset_stats()
    yield request.param
    fa.set_backend(None)


@pytest.fixture
def interpret():
    import flyarray as fa
    _skip_a_broken_interpreter("interpret")
    fa.set_backend("interpret")
    fa.reset_stats()
    yield "interpret"
    fa.set_backend(None)


@pytest.fixture
def no_evaluation(backend):
    """Fails the test if anything was evaluated (errors must come at record time)."""
    import flyarray as fa
    fa.reset_stats()
    yield
    assert fa.stats()["evaluations"] == 0
    assert fa.stats()["kernels_launched"] == 0


def lazy(shape, dtype="float32"):
    """An unevaluated array of zeros (an exp over a buffer): record-time errors must not evaluate it."""
    import flyarray as fa
    return fa.exp(fa.asarray(np.zeros(shape, dtype)))


def assert_matches(got, want, *, rtol=None, atol=None, check_dtype=True):
    """Compare a flyarray result (anything np.asarray takes) with a numpy expectation."""
    want = np.asarray(want)
    got_np = np.asarray(got)
    assert got_np.shape == want.shape, f"shape {got_np.shape} != expected {want.shape}"
    if check_dtype:
        assert got_np.dtype == want.dtype, f"dtype {got_np.dtype} != expected {want.dtype}"
    if want.dtype.kind in "f":
        tol = {2: (2e-3, 2e-3), 4: (2e-5, 1e-5), 8: (1e-12, 1e-12)}[want.dtype.itemsize]
        np.testing.assert_allclose(got_np.astype(np.float64), want.astype(np.float64),
                                   rtol=rtol if rtol is not None else tol[0],
                                   atol=atol if atol is not None else tol[1], equal_nan=True)
    else:
        np.testing.assert_array_equal(got_np, want)


# ---- inputs -------------------------------------------------------------------------------------
ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8"]
LAYOUTS = ["contiguous", "torch_transposed", "fa_transposed", "stepped", "negative_step", "odd_strides"]


def sample(rng, shape, dtype, lo=-5.0, hi=5.0):
    """Values of ``dtype`` in [lo, hi] (clipped to what the dtype holds)."""
    return np.asarray(_sample(rng, shape, np.dtype(dtype), lo, hi))


def _sample(rng, shape, dtype, lo, hi):
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = max(int(np.ceil(lo)), info.min), min(int(np.floor(hi)), info.max)
        return rng.integers(low, high, size=shape, endpoint=True).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def make_array(values: np.ndarray, layout: str = "contiguous"):
    """An fa.Array holding ``values`` whose memory layout is ``layout`` (realized buffers, fa views)."""
    import torch

    import flyarray as fa
    if values.ndim == 0 or layout == "contiguous":
        return fa.asarray(torch.from_numpy(np.array(values, order="C", copy=True)))
    if layout == "torch_transposed":  # a torch tensor whose strides are reversed
        axes = tuple(reversed(range(values.ndim)))
        t = torch.from_numpy(np.ascontiguousarray(values.transpose(axes)).copy()).permute(axes)
        return fa.asarray(t)
    if layout == "fa_transposed":  # a permute view recorded by flyarray
        axes = tuple(reversed(range(values.ndim)))
        return fa.permute_dims(fa.asarray(np.ascontiguousarray(values.transpose(axes))), axes)
    if layout == "stepped":  # every other element of a wider buffer, starting at 1
        big = np.zeros(values.shape[:-1] + (2 * values.shape[-1] + 1,), values.dtype)
        big[..., 1::2] = values
        return fa.asarray(big)[..., 1::2]
    if layout == "negative_step":  # a reversed view of the reversed data
        return fa.asarray(np.ascontiguousarray(values[..., ::-1]))[..., ::-1]
    if layout == "odd_strides":  # torch.as_strided over padded storage: strides no reshape yields
        strides, acc = [], 1
        for size in reversed(values.shape):
            strides.append(acc)
            acc = acc * max(size, 1) + 3
        strides = tuple(reversed(strides))
        storage = torch.zeros(acc + 5, dtype=torch.from_numpy(values[:0].reshape(-1)).dtype)
        t = storage.as_strided(values.shape, strides, 2)
        t.copy_(torch.from_numpy(np.ascontiguousarray(values)))
        return fa.asarray(t)
    raise ValueError(layout)


def pytest_configure(config):
    # Masked-off lanes of interpreted kernels compute log(0) etc. on padding; numpy warns, nothing is wrong.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
    # numpy's own expectations for empty reductions (mean/var of nothing is NaN, as ours is)
    config.addinivalue_line("filterwarnings", "ignore:Mean of empty slice:RuntimeWarning")
    config.addinivalue_line("filterwarnings", "ignore:Degrees of freedom:RuntimeWarning")
    config.addinivalue_line("filterwarnings", "ignore:invalid value encountered:RuntimeWarning")


def promote(a: str, b: str) -> str:
    """The result dtype of two array dtypes as flyarray documents it (array API; JAX for int/bool + float)."""
    da, db = np.dtype(a), np.dtype(b)
    if da.kind == "f" and db.kind in "iub":
        return a
    if db.kind == "f" and da.kind in "iub":
        return b
    return np.promote_types(da, db).name


# Test-order tooling (benchmarks/bisect_order.py): FLYARRAY_TEST_ORDER_DIR records, per process (each
# pytest-xdist worker), the tests it ran in order with their outcome; FLYARRAY_TEST_SELECT names a file of
# test ids to run, in that file's order (a worker's sequence replayed in one process). Neither is set in CI.
_ORDER_DIR = os.environ.get("FLYARRAY_TEST_ORDER_DIR")
_SELECT = os.environ.get("FLYARRAY_TEST_SELECT")


def pytest_collection_modifyitems(config, items):
    if not _SELECT:
        return
    wanted = [line.rstrip("\n") for line in open(_SELECT) if line.strip()]
    by_id = {item.nodeid: item for item in items}
    missing = [w for w in wanted if w not in by_id]
    if missing:
        raise pytest.UsageError(f"FLYARRAY_TEST_SELECT: {len(missing)} ids not collected, e.g. {missing[0]!r}")
    items[:] = [by_id[w] for w in wanted]


def pytest_runtest_logreport(report):
    if _ORDER_DIR and (report.when == "call" or report.outcome != "passed"):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(_ORDER_DIR, f"{worker}.txt"), "a") as f:
            f.write(f"{report.outcome}\t{report.when}\t{report.nodeid}\n")
