"""fa.profile(): every kernel launched inside the block is recorded, with what it is and what it moved."""
import pytest
import torch

import flyarray as fa
from flyarray import plan, profiling


def _t(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _workload():
    """A fused row kernel, a library GEMM, an elementwise kernel and a fa.jit replay (which runs a plan too)."""
    x = fa.asarray(_t(8, 16))
    fa.nn.softmax(x * 2.0).torch()
    (fa.asarray(_t(8, 16)) @ fa.asarray(_t(16, 4, seed=1))).torch()
    fa.exp(x + 1.0).torch()
    step = fa.jit(lambda a: fa.tanh(a) * 3.0)
    step(x).torch()
    step(x).torch()


def test_profile_sees_every_kernel_launched_inside_it(backend):
    _workload()  # compile outside the block: the profile must count replays as well as misses
    fa.reset_stats()
    with fa.profile() as prof:
        _workload()
    launched = fa.stats()["kernels_launched"]
    assert launched >= 5
    assert prof.calls == launched
    names = " ; ".join(r.name for r in prof.rows)
    for op in ("exp", "sum", "max", "matmul", "tanh"):
        assert op in names, names
    tanh = next(r for r in prof.rows if "tanh" in r.name)
    assert tanh.calls == 2 and tanh.kind == "fused kernel"  # both jit replays, one row
    assert all(r.total_s > 0 for r in prof.rows)
    assert abs(prof.total_s - sum(r.mean_s * r.calls for r in prof.rows)) < 1e-9


def test_nothing_is_recorded_outside_and_plan_run_is_never_swapped(backend):
    """Plan.run hands its loop to profiling.run_steps while a profile is open (plan.py); nothing is
    patched, so leaving the block costs nothing to undo."""
    original = plan.Plan.run
    with fa.profile() as prof:
        assert plan.Plan.run is original
    fa.exp(fa.asarray(_t(4))).torch()
    assert prof.calls == 0 and not prof.rows
    assert plan.Plan.run is original  # no cost when not profiling: the plain loop
    assert profiling.recording == []


def test_bytes_and_flops(backend):
    a, b = fa.asarray(_t(8, 16)), fa.asarray(_t(16, 4, seed=1))
    x = fa.asarray(_t(32, 8))
    with fa.profile() as prof:
        (a @ b).torch()
        fa.exp(x).torch()
    gemm = next(r for r in prof.rows if r.name.startswith("matmul"))
    assert gemm.flops == 2 * 8 * 4 * 16
    assert gemm.bytes == (8 * 16 + 16 * 4 + 8 * 4) * 4
    assert gemm.tflops is not None and gemm.tflops > 0
    ew = next(r for r in prof.rows if "exp" in r.name)
    assert ew.bytes == 2 * 32 * 8 * 4 and ew.flops == 0 and ew.tflops is None


def test_broadcast_input_counts_its_storage_once(backend):
    x = fa.broadcast_to(fa.asarray(_t(1, 8)), (64, 8))
    with fa.profile() as prof:
        fa.exp(x + 0.0).torch()
    assert prof.rows[0].bytes == 8 * 4 + 64 * 8 * 4  # the (1, 8) input read once, not 64 times


def test_text_and_html_say_how_it_was_timed(backend):
    with fa.profile() as prof:
        fa.exp(fa.asarray(_t(4, 4))).torch()
    text = str(prof)
    assert "wall clock" in text and "fused: exp" in text and "GB/s" in text
    lines = text.splitlines()
    assert len({len(line) for line in lines[1:]}) == 1  # header, rule and rows aligned
    page = prof._repr_html_()
    assert "<table>" in page and "wall clock" in page and "fused: exp" in page


def test_a_jit_replay_keeps_its_kernels_name_through_clear_caches(backend):
    """fa.clear_caches empties the generated sources, but a jit trace keeps its kernels: the name was looked
    up among the sources and came out "fused: copy" for good."""
    step = fa.jit(lambda a: fa.exp(a) * 2.0 + 1.0)
    x = fa.asarray(_t(8, 16))
    step(x).torch()
    fa.clear_caches()
    with fa.profile() as prof:
        step(x).torch()
    assert [r.name for r in prof.rows] == ["fused: exp, multiply, add"], [r.name for r in prof.rows]


def test_nested_profiles_both_record(backend):
    with fa.profile() as outer:
        fa.exp(fa.asarray(_t(4))).torch()
        with fa.profile() as inner:
            fa.sin(fa.asarray(_t(4))).torch()
    assert outer.calls == 2 and inner.calls == 1


def test_reentering_one_profile_is_an_error(backend):
    prof = fa.profile()
    with prof, pytest.raises(RuntimeError, match="already open"):
        prof.__enter__()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_profile_uses_cuda_events():
    x = fa.asarray(torch.randn(1024, 1024, device="cuda"))
    fa.nn.softmax(x).torch()
    fa.reset_stats()
    with fa.profile() as prof:
        for _ in range(3):
            fa.nn.softmax(x).torch()
    assert prof.clock == "cuda events" and "CUDA events" in str(prof)
    assert prof.calls == fa.stats()["kernels_launched"] == 3
    assert prof.limit_gbps and prof.rows[0].gbps


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_profile_queues_a_spin_before_each_evaluation(monkeypatch):
    """The events must time kernels, not the host's launches (profiling.keep_the_gpu_ahead): one spin
    kernel per evaluation, sized by its plan's steps."""
    from flyarray import profiling
    spins = []
    real_sleep = torch.cuda._sleep
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: spins.append(cycles) or real_sleep(cycles))
    x = fa.asarray(torch.randn(256, 256, device="cuda"))
    (fa.exp(x) + 1.0).torch()
    with fa.profile(measure_limit=False) as prof:
        for _ in range(2):
            (fa.exp(x) + 1.0).torch()
    assert prof.calls == 2 and len(spins) == 2
    assert all(c >= profiling.HOST_US_PER_STEP * 2000 for c in spins)
