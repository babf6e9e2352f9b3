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
from flyarray import config, diskcache, plan, precompile, runtime


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


def _fresh_compiles_by_thread(tmp_path, monkeypatch, switch) -> list:
    """A fresh cache and empty in-memory caches, FLYARRAY_PRECOMPILE=switch; returns the list that
    receives (kernel name, thread name) of every Triton compile from now on."""
    import triton.compiler
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FLYARRAY_PRECOMPILE", switch)
    fa.clear_caches()
    compiles = []
    real_compile = triton.compiler.compile

    def recording_compile(src, *args, **kwargs):
        compiles.append((getattr(src, "name", "?"), threading.current_thread().name))
        return real_compile(src, *args, **kwargs)
    monkeypatch.setattr(triton.compiler, "compile", recording_compile)
    return compiles


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("switch", ["1", "0"])
def test_gpu_a_new_plan_is_right_while_its_kernels_compile_in_the_background(tmp_path, monkeypatch, switch):
    """A plan of several generated kernels around a library matmul, first run on a fresh cache: right,
    and (switched on) compiled at least partly by the pool's threads; switched off, by none."""
    compiles = _fresh_compiles_by_thread(tmp_path, monkeypatch, switch)  # filled from here on
    g = torch.Generator(device="cuda").manual_seed(int(switch))
    x, y = torch.randn(300, 48, device="cuda", generator=g), torch.randn(48, device="cuda", generator=g)
    w = torch.randn(48, 40, device="cuda", generator=g)
    h = fa.exp(fa.asarray(x) * 0.1) * 2 + fa.asarray(y)
    m = h @ fa.asarray(w)
    rows, cols = fa.eval(fa.sum(fa.sin(m), axis=1), fa.max(m * 1.5, axis=0))
    want_m = (torch.exp(x * 0.1) * 2 + y) @ w
    torch.testing.assert_close(rows.torch(), torch.sin(want_m).sum(1), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(cols.torch(), (want_m * 1.5).amax(0), rtol=1e-4, atol=1e-3)
    threads = [thread for _, thread in compiles]
    assert threads, "a fresh cache compiled nothing: the spy saw no compile"
    pooled = [name for name in threads if name.startswith("flyarray-compile")]
    assert (len(pooled) > 0) == (switch == "1"), threads


# --------------------------------------------------------------------------- library kernels: dry runs

def _gemm_and_attention_calls(make):
    """The library calls a Llama block's graphs make (GEMMs with and without an epilogue, a transposed
    operand, causal GQA attention forward and backward), on tensors passed through ``make``."""
    from flyarray.kernels import attention, gemm
    g = torch.Generator().manual_seed(0)

    def rand(*shape, dtype=torch.float32):
        return make(torch.randn(*shape, generator=g).to(dtype))
    a, b = rand(40, 32), rand(32, 48)
    gemm.matmul(a, b)
    gemm.matmul(a, b, bias=rand(48), residual=rand(40, 48), activation="gelu")
    gemm.matmul(rand(32, 40).t(), b)
    gemm.matmul(rand(2, 24, 16, dtype=torch.float16), rand(16, 8, dtype=torch.float16))
    q, k, v = rand(1, 20, 4, 16), rand(1, 20, 2, 16), rand(1, 20, 2, 16)
    out, lse = attention.attention_fwd(q, k, v, is_causal=True)
    attention.attention_bwd(rand(1, 20, 4, 16), q, k, v, out, lse, is_causal=True)


class _LaunchSpy:
    """Wraps ``_triton.runner`` (and the kernel modules' imports of it): records (kernel, launch key)
    of every real launch; a dry run's runner is passed through."""

    def __init__(self, monkeypatch):
        from flyarray.kernels import _triton, attention, gemm
        self.launches = []
        real = _triton.runner

        def spying(kernel, device):
            launcher = real(kernel, device)
            if _triton.is_warming_up():
                return launcher
            return _Spied(launcher, kernel, self.launches)
        for module in (_triton, gemm, attention):
            monkeypatch.setattr(module, "runner", spying)


class _Spied:
    def __init__(self, launcher, kernel, record):
        self.launcher, self.kernel, self.record = launcher, kernel, record

    def __getitem__(self, grid):
        from flyarray.kernels._triton import _specialization
        launch = self.launcher[grid]

        def spied(*args, **kwargs):
            self.record.append((self.kernel, _specialization(args, kwargs)))
            return launch(*args, **kwargs)
        return spied


def test_a_dry_run_asks_for_exactly_the_launches_of_the_real_call(interpret, monkeypatch):
    """Fake tensors through the GEMM's and attention's host code: compile_ahead is asked for the same
    kernels with the same specialization keys, in the same order, as the real call launches."""
    from flyarray.kernels import gemm
    asked = []
    monkeypatch.setattr(precompile, "compile_ahead", lambda kernel, key, args, kwargs: asked.append((kernel, key)))
    spy = _LaunchSpy(monkeypatch)
    planned = dict(gemm._plans)
    precompile.dry_run(lambda mode: _gemm_and_attention_calls(mode.from_tensor))
    assert spy.launches == [] and gemm._plans == planned  # nothing launched, no plan kept from fakes
    _gemm_and_attention_calls(lambda t: t)
    assert len(spy.launches) >= 8 and all(key is not None for _, key in spy.launches)
    assert asked == spy.launches


def test_a_dry_run_leaves_a_planned_gemm_launching(interpret, monkeypatch):
    """A dry run of a GEMM whose plan the real calls keep must neither use nor change that plan: a
    launcher made during the dry run compiles and launches nothing, so one kept for later calls would
    leave their results unwritten."""
    from flyarray.kernels import gemm
    monkeypatch.setattr(precompile, "compile_ahead", lambda *args: None)
    a, b = torch.randn(24, 16), torch.randn(16, 8)
    torch.testing.assert_close(gemm.matmul(a, b), a @ b)  # planned and kept for the calls that follow
    precompile.dry_run(lambda mode: gemm.matmul(mode.from_tensor(a), mode.from_tensor(b)))
    for _ in range(2):  # the kept plan's fixed launches are made now, outside any dry run
        torch.testing.assert_close(gemm.matmul(a, b), a @ b)


def test_a_dry_run_reads_no_data_and_stands_in_for_alignment():
    from flyarray.kernels._triton import StandIn, aligned16
    from torch._subclasses.fake_tensor import FakeTensorMode
    base = torch.zeros(64, dtype=torch.float16)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = mode.from_tensor(base)
        assert aligned16(fake) and not aligned16(fake[1:]) and aligned16(fake[8:])
        assert StandIn(fake[8:]).data_ptr() % 16 == 0 and StandIn(fake[3:]).data_ptr() % 16 != 0
    assert aligned16(base) and not aligned16(base[1:]) and StandIn(base[1:]).dtype == torch.float16


def test_a_dry_run_never_times_configs(monkeypatch):
    """An autotuned launch with no stored choice stops the dry run (it would have to time candidates);
    a stored choice is what the launch will use, so the dry run takes it."""
    from flyarray.kernels import _triton, tuning
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tuning, "_memory", {(str(config.cache_dir()), "k"): {"stored": {"BLOCK": 2}}})
    timed = []
    with _triton.warming_up():
        with pytest.raises(_triton.NotWarmable):
            tuning.tune("k", "new", [{"BLOCK": 1}, {"BLOCK": 2}], timed.append, {"BLOCK": 1})
        assert tuning.tune("k", "stored", [{"BLOCK": 1}, {"BLOCK": 2}], timed.append, {"BLOCK": 1}) == {"BLOCK": 2}
    assert timed == [] and not _triton.is_warming_up()


def test_only_library_ops_with_data_free_host_code_are_dry_run():
    from flyarray.primitives import LIBRARY
    assert {name for name, prim in LIBRARY.items() if prim.warms_up} == {
        "matmul", "matmul_epilogue", "attention", "attention_bwd"}


def test_compile_ahead_compiles_on_the_pool_and_a_launch_waits_for_it(sm90_jit, monkeypatch):
    """A warm-up's library launch compiles in the pool; a launch of the same specialization meanwhile
    waits for that compile (await_ahead) instead of compiling a second copy; afterwards nothing is left
    registered."""
    import triton.compiler
    from flyarray.kernels import _triton
    go, threads = threading.Event(), []
    real_compile = triton.compiler.compile

    def held_compile(*args, **kwargs):
        threads.append(threading.current_thread().name)
        assert go.wait(60)
        return real_compile(*args, **kwargs)
    monkeypatch.setattr(triton.compiler, "compile", held_compile)
    x, y = torch.zeros(1000), torch.zeros(1000)

    def job():
        with _triton.warming_up():
            _triton.runner(_exp_plus_one, torch.device("cpu"))[(8,)](x, y, 1000, BLOCK=128)
    warm = threading.Thread(target=precompile.warm_up, args=([job], contextlib.nullcontext()))
    warm.start()
    key = (id(_exp_plus_one), _triton._specialization((x, y, 1000), {"BLOCK": 128}))
    for _ in range(600):
        if key in precompile._ahead:
            break
        threading.Event().wait(0.05)
    assert key in precompile._ahead, "the warm-up registered nothing"
    waiter = threading.Thread(target=precompile.await_ahead, args=(_exp_plus_one, key[1]))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive(), "await_ahead returned before the compile finished"
    go.set()
    waiter.join(120)
    warm.join(120)
    assert not waiter.is_alive() and not warm.is_alive()
    assert len(threads) == 1 and threads[0].startswith("flyarray-compile"), threads  # compiled once, in the pool
    assert len(_compiled_entries(_exp_plus_one)) == 1
    assert key not in precompile._ahead


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_a_new_plans_gemms_and_attention_compile_ahead_and_their_launches_compile_nothing(tmp_path, monkeypatch):
    """A plan of GEMMs (plain, with a bias+GELU epilogue, on a transposed operand) and causal GQA
    attention, on a fresh cache, its warm-up finished before its run: every compile ran in the pool, and
    the launches compiled nothing more (the dry run keyed them as the real operands do); results right."""
    import torch._dynamo  # noqa: F401  (library dry runs happen where it is imported: precompile.can_dry_run)
    from flyarray.kernels import attention, attention_hopper, gemm
    library = set()
    for module in (gemm, attention, attention_hopper):  # forget what earlier tests compiled in this process
        for fn in vars(module).values():
            if hasattr(fn, "device_caches") and hasattr(fn, "create_binder"):
                monkeypatch.setattr(fn, "device_caches", type(fn.device_caches)(fn.create_binder))
                # the binder made anew binds triton.compiler.compile (recorded below) as fn.compile: undone after
                monkeypatch.setattr(fn, "compile", getattr(fn, "compile", None), raising=False)
                library.add(fn.__name__)
    by_kernel = _fresh_compiles_by_thread(tmp_path, monkeypatch, "1")
    monkeypatch.setattr(precompile, "_fruitless", {})  # earlier tests' dry runs found their kernels compiled
    real_start = precompile.start

    def start_and_finish(jobs, device):
        thread = real_start(jobs, device)
        if thread is not None:
            thread.join()
        return thread
    monkeypatch.setattr(precompile, "start", start_and_finish)
    g = torch.Generator(device="cuda").manual_seed(7)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g, dtype=torch.bfloat16)
    x, w1, b1, w2 = rand(256, 192), rand(320, 192), rand(320), rand(192, 320)
    q, k, v = rand(2, 200, 8, 64), rand(2, 200, 2, 64), rand(2, 200, 2, 64)
    h = fa.gelu(fa.asarray(x) @ fa.asarray(w1).T + fa.asarray(b1))
    y = h @ fa.asarray(w2).T
    att = fa.nn.dot_product_attention(fa.asarray(q), fa.asarray(k), fa.asarray(v), is_causal=True)
    got_y, got_att = fa.eval(y, att)
    want_h = torch.nn.functional.gelu(x.float() @ w1.float().T + b1.float())
    torch.testing.assert_close(got_y.torch().float(), want_h.bfloat16().float() @ w2.float().T, rtol=3e-2, atol=3e-1)
    want_att = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(got_att.torch(), want_att, rtol=2e-2, atol=2e-2)
    assert sum(name in library for name, _ in by_kernel) >= 3, by_kernel  # 2+ GEMM specializations, attention
    assert all(thread.startswith("flyarray-compile") for _, thread in by_kernel), by_kernel


def test_a_family_whose_dry_runs_compile_nothing_stops_being_dry_run(monkeypatch):
    """A plan rebuilt per size dry-runs its library calls each time: after FRUITLESS_LIMIT dry runs in a
    row found every kernel compiled, that family (op and keywords) is not dry-run again; one that still
    compiles something keeps its turn, and the count is per family."""
    import torch._dynamo  # noqa: F401  (can_dry_run asks for it; a dry run's FakeTensorMode imports from it)
    monkeypatch.setattr(precompile, "_fruitless", {})
    monkeypatch.setenv("FLYARRAY_PRECOMPILE", "1")
    started = []
    token = precompile._started_here.set(started)
    try:
        def compiles_something(mode):
            started.append(("kernel", "key"))
        for _ in range(precompile.FRUITLESS_LIMIT + 2):  # something new each time: never fruitless
            precompile.dry_run(compiles_something, "busy")
        assert precompile.can_dry_run("busy")
        for i in range(precompile.FRUITLESS_LIMIT):
            assert precompile.can_dry_run("idle"), i
            precompile.dry_run(lambda mode: None, "idle")
        assert not precompile.can_dry_run("idle") and precompile.can_dry_run("busy")
    finally:
        precompile._started_here.reset(token)
    monkeypatch.setenv("FLYARRAY_PRECOMPILE", "0")
    assert not precompile.can_dry_run("busy")
