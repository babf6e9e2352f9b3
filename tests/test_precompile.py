"""Background compiles of a new plan's generated kernels (flyarray/precompile.py).

On the CPU, Triton's JIT is pointed at a stand-in driver that reports an sm_90 device, so the warm-ups
really compile (ptxas included) without a GPU; the plan's side is checked on the interpreter backend,
with its launches wrapped to record what each warm-up would be handed."""
import contextlib
import threading

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import flyarray as fa
from flyarray import diskcache, plan, precompile, runtime


@triton.jit
def _exp_plus_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.exp(tl.load(x_ptr + offs, mask=offs < n)) + 1, mask=offs < n)


@triton.jit
def _scaled_copy(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * scale, mask=offs < n)


@triton.jit
def _does_not_compile(x_ptr, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK < 0, "refused on purpose")


class _StandInSm90:
    """The parts of Triton's active driver that a warm-up (no launch) asks for."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


@pytest.fixture
def sm90_jit(monkeypatch, tmp_path):
    """Triton's JIT compiling for a stand-in sm_90 device, into a fresh private cache."""
    from triton.runtime import driver
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setattr(driver, "_active", _StandInSm90())
    for fn in (_exp_plus_one, _scaled_copy, _does_not_compile):
        monkeypatch.setattr(fn, "device_caches", type(fn.device_caches)(fn.create_binder))
    return tmp_path


def _compiled_entries(fn) -> list:
    return [k for caches in fn.device_caches.values() for k in caches[0].values()]


def _jobs():
    return [lambda: _exp_plus_one.warmup(torch.float32, torch.float32, 1000, BLOCK=128, grid=(8,)),
            lambda: _scaled_copy.warmup(torch.float16, torch.float16, 1000, 0.5, BLOCK=256, grid=(4,))]


def test_warm_up_compiles_every_kernel_and_the_launch_key_then_hits(sm90_jit):
    assert not precompile.has_compiled(_exp_plus_one) and not precompile.has_compiled(_scaled_copy)
    precompile.warm_up(_jobs(), contextlib.nullcontext())
    for fn in (_exp_plus_one, _scaled_copy):
        assert precompile.has_compiled(fn) and len(_compiled_entries(fn)) == 1
    compiled = _compiled_entries(_exp_plus_one)[0]
    assert type(compiled).__name__ == "CompiledKernel" and ".target sm_90" in compiled.asm["ptx"]
    # the same arguments again (as the launch would bind them): the JIT's cache answers, no new compile
    again = precompile.compiled_kernel(_exp_plus_one.warmup(torch.float32, torch.float32, 1000, BLOCK=128,
                                                             grid=(8,)))
    assert again is compiled and len(_compiled_entries(_exp_plus_one)) == 1


def test_the_compiles_run_on_the_pool_and_land_in_the_private_cache(sm90_jit, monkeypatch):
    import triton.compiler
    threads = set()
    real_compile = triton.compiler.compile

    def recording_compile(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return real_compile(*args, **kwargs)
    monkeypatch.setattr(triton.compiler, "compile", recording_compile)  # the JIT imports it per device cache
    precompile.warm_up(_jobs(), contextlib.nullcontext())
    assert threads and all(name.startswith("flyarray-compile") for name in threads)
    triton_dir = diskcache.directory("triton")
    assert triton_dir is not None and str(triton_dir).startswith(str(sm90_jit))
    assert any(p.suffix == ".ptx" for p in triton_dir.rglob("*")), "the binaries went somewhere else"


def test_a_failing_warm_up_is_dropped_and_the_others_still_compile(sm90_jit):
    def raises():
        raise RuntimeError("a job that fails before compiling")
    jobs = [raises, lambda: _does_not_compile.warmup(torch.float32, BLOCK=16, grid=(1,)), *_jobs()]
    precompile.warm_up(jobs, contextlib.nullcontext())  # returns, raises nothing
    assert not precompile.has_compiled(_does_not_compile)
    assert precompile.has_compiled(_exp_plus_one) and precompile.has_compiled(_scaled_copy)


def test_start_needs_a_cuda_device_and_the_switch(monkeypatch):
    assert precompile.start([lambda: None], torch.device("cpu")) is None
    monkeypatch.setenv("FLYARRAY_PRECOMPILE", "0")
    assert precompile.start([lambda: None], torch.device("cuda")) is None


class _RecordingLaunch:
    """An interpreted launch that also records what its warm-up is handed."""

    def __init__(self, launch, record):
        self.launch, self.record, self.fn = launch, record, object()

    def __call__(self, inputs, outputs, scalars):
        return self.launch(inputs, outputs, scalars)

    def warm_up(self, inputs, outputs, scalars):
        self.record.append((list(inputs), list(outputs), list(scalars)))


def test_a_new_plan_warms_its_kernels_up_with_the_leaves_dtypes_and_scalars(interpret, monkeypatch):
    record, started = [], []
    real_launcher = runtime.kernel_launcher
    monkeypatch.setattr(runtime, "kernel_launcher",
                        lambda *a, **k: _RecordingLaunch(real_launcher(*a, **k), record))

    def run_now(jobs, device):
        started.append(device)
        for job in jobs:
            job()
    monkeypatch.setattr(precompile, "start", run_now)
    plan.clear()
    x = torch.linspace(-1, 1, 40)
    y = torch.linspace(0, 2, 40).to(torch.float16)
    a = fa.asarray(x)
    got = (fa.exp(a) * 1.75 + fa.asarray(y).astype("float32")).torch()
    np.testing.assert_allclose(got.numpy(), (torch.exp(x) * 1.75 + y.float()).numpy(), rtol=1e-5)
    assert started == [torch.device("cpu")] and len(record) == 1
    inputs, outputs, scalars = record[0]
    assert {t.data_ptr() for t in inputs if isinstance(t, torch.Tensor)} == {x.data_ptr(), y.data_ptr()}
    assert outputs == [torch.float32]  # made by the plan: its dtype stands in
    assert 1.75 in scalars
    record.clear()
    (fa.exp(a) * 1.75 + fa.asarray(y).astype("float32")).torch()  # a plan hit: no warm-up again
    assert record == [] and len(started) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("switch", ["1", "0"])
def test_gpu_a_new_plan_is_right_while_its_kernels_compile_in_the_background(tmp_path, monkeypatch, switch):
    """A plan of several generated kernels around a library matmul, first run on a fresh cache: right,
    and (switched on) compiled at least partly by the pool's threads; switched off, by none."""
    import triton.compiler
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FLYARRAY_PRECOMPILE", switch)
    fa.clear_caches()
    threads = []
    real_compile = triton.compiler.compile

    def recording_compile(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real_compile(*args, **kwargs)
    monkeypatch.setattr(triton.compiler, "compile", recording_compile)
    g = torch.Generator(device="cuda").manual_seed(int(switch))
    x, y = torch.randn(300, 48, device="cuda", generator=g), torch.randn(48, device="cuda", generator=g)
    w = torch.randn(48, 40, device="cuda", generator=g)
    h = fa.exp(fa.asarray(x) * 0.1) * 2 + fa.asarray(y)
    m = h @ fa.asarray(w)
    rows, cols = fa.eval(fa.sum(fa.sin(m), axis=1), fa.max(m * 1.5, axis=0))
    want_m = (torch.exp(x * 0.1) * 2 + y) @ w
    torch.testing.assert_close(rows.torch(), torch.sin(want_m).sum(1), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(cols.torch(), (want_m * 1.5).amax(0), rtol=1e-4, atol=1e-3)
    pooled = [name for name in threads if name.startswith("flyarray-compile")]
    assert (len(pooled) > 0) == (switch == "1"), threads
