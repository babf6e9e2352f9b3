"""Profiler names: torch.profiler traces show each plan step under a label naming the user's ops,
and generated kernels carry names derived from their ops (what GPU traces show)."""
import torch

import flyarray as fa
from flyarray import codegen
from flyarray.schedule import KernelStep, schedule


def _fa_events(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.key for e in prof.key_averages() if e.key.startswith("fa::")]


def test_fused_kernel_and_library_steps_are_labelled():
    x, w = torch.randn(8, 64), torch.randn(64, 32)
    labels = _fa_events(lambda: ((fa.exp(fa.asarray(x)) + 1).sum(axis=1).torch(),
                                 (fa.asarray(x) @ fa.asarray(w)).torch()))
    assert "fa::fused(exp,add,sum)" in labels
    assert "fa::matmul" in labels


def test_no_labels_without_a_profiler(monkeypatch):
    seen = []
    from flyarray import profiling
    monkeypatch.setattr(profiling, "run_labelled", lambda plan, slots, scalars: seen.append(plan))
    (fa.exp(fa.asarray(torch.randn(5))) + 2).torch()
    assert seen == []


def test_generated_kernel_name_lists_its_ops():
    y = fa.exp(fa.asarray(torch.randn(4, 8))).sum(axis=1)
    (step,) = [s for s in schedule([y._node]) if isinstance(s, KernelStep)]
    source = codegen.launch_spec(step.kernel).source
    assert "def fa_rowred_exp_sum(" in source and "kernel = fa_rowred_exp_sum" in source
