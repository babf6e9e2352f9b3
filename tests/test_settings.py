"""Settings changed mid-session, as a notebook changes them: on/off switches read strictly, the default device's
names, a torch default-device context left open, the tuned configs per cache directory, and errors that name
the setting the user actually chose."""
import numpy as np
import pytest
import torch

import flyarray as fa
from flyarray import config


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("ON", True), (" yes ", True), ("0", False),
                                       ("false", False), ("Off", False), ("no", False), ("", False)])
def test_switches_read_the_usual_words(monkeypatch, value, on):
    """FLYARRAY_EAGER_ROUNDING=false turned rounding on (anything but "" and "0" was on)."""
    for name in ("FLYARRAY_EAGER_ROUNDING", "FLYARRAY_CHECK", "FLYARRAY_PLAN_CHECK", "FLYARRAY_CUDA_GRAPHS",
                 "FLYARRAY_PRECOMPILE", "FLYARRAY_GEMM_WS", "FLYARRAY_AUTOTUNE"):
        monkeypatch.setenv(name, value)
        assert config.switch(name, not on) is on
    assert config.eager_rounding() is on and config.cuda_graphs() is on


def test_a_switch_with_another_value_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("FLYARRAY_CUDA_GRAPHS", "maybe")
    with pytest.raises(ValueError, match="FLYARRAY_CUDA_GRAPHS='maybe': expected 1/true/on/yes or 0/false/off/no"):
        config.cuda_graphs()
    monkeypatch.setenv("FLYARRAY_LOG", "yes")
    with pytest.raises(ValueError, match="FLYARRAY_LOG='yes': expected 0, 1"):
        config.log_level()
    monkeypatch.delenv("FLYARRAY_CUDA_GRAPHS")
    monkeypatch.delenv("FLYARRAY_LOG")
    assert config.cuda_graphs() is True and config.log_level() == 0


def test_eager_rounding_scope_takes_a_bool_not_a_word():
    with pytest.raises(TypeError, match="eager_rounding_scope: on must be a bool, got 'off'"):
        with config.eager_rounding_scope("off"):
            pass
    assert config.forced_eager_rounding() is None


def test_cpu_with_an_index_is_the_cpu():
    """torch makes tensors on 'cpu:0' and 'cpu:1' on the one CPU; an array on 'cpu:0' could not meet numpy's."""
    try:
        fa.set_default_device("cpu:0")
        x = fa.ones(3)
        assert x.device == torch.device("cpu")
        np.testing.assert_array_equal(np.asarray(x + fa.asarray(np.ones(3, np.float32))), [2, 2, 2])
    finally:
        fa.set_default_device(None)
    assert fa.ones(2, device="cpu:1").device == torch.device("cpu")


def test_cpu_arrays_evaluate_inside_a_meta_default_device_context(backend):
    """A `with torch.device("meta")` left open around an evaluation made host tensors on meta: maximum/minimum
    ("Cannot copy out of meta tensor"), remainder (no numpy of a meta tensor) and fa.random.normal (at recording:
    item() of a meta tensor) failed; every other op already gave the CPU's values."""
    a = fa.asarray(np.array([1.0, -1.0, 3.0], np.float32))
    k = fa.random.key(0)
    cases = {"maximum": lambda: fa.maximum(a, 0.5), "minimum": lambda: fa.minimum(a, a * 0), "remainder": lambda: a % 2.0,
             "normal": lambda: fa.random.normal(k, (3,)), "truncated_normal": lambda: fa.random.truncated_normal(k, -1.0, 1.0, (3,)),
             "linspace": lambda: fa.linspace(0, 1, 5)}
    want = {name: np.asarray(make()) for name, make in cases.items()}
    for name, make in cases.items():
        with torch.device("meta"):
            got = np.asarray(make())
        np.testing.assert_array_equal(got, want[name], err_msg=name)


def test_tuned_configs_are_kept_per_cache_directory(monkeypatch, tmp_path):
    from flyarray.kernels import tuning
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path / "a"))
    tuning.save("probe_kernel", "key", {"BLOCK": 64})
    assert tuning.load("probe_kernel") == {"key": {"BLOCK": 64}}
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path / "b"))
    assert tuning.load("probe_kernel") == {}   # another directory's table, not the first one's from memory
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path / "a"))
    fa.clear_caches()
    assert not tuning._memory and tuning.load("probe_kernel") == {"key": {"BLOCK": 64}}   # read again from disk


def test_a_backend_error_names_set_backend_when_that_chose_it():
    try:
        fa.set_backend("gpu")
        with pytest.raises(RuntimeError, match=r"fa.set_backend\('gpu'\), but the data lives on the CPU"):
            np.asarray(fa.asarray(np.ones(2, np.float32)) + 1)
    finally:
        fa.set_backend(None)


def test_tensordot_takes_numpy_axes_as_numpy_does():
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(fa.tensordot(fa.asarray(a), fa.asarray(b), axes=(np.array([1]), np.array([0])))),
                                  np.tensordot(a, b, axes=(np.array([1]), np.array([0]))))
