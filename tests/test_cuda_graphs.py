"""fa.jit replays a multi-kernel trace on a GPU as one CUDA graph (flyarray/graphs.py): the rule,
the opt-out, and on a GPU the values, fresh arguments, outputs that outlive the next replay."""
import types

import pytest
import torch

import flyarray as fa
from flyarray import graphs

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")


def _plan(kernels):
    return types.SimpleNamespace(description=[("alloc",)] + [("kernel",)] * kernels)


def test_the_rule_weighs_launches_against_copies(monkeypatch):
    monkeypatch.setattr(graphs.runtime, "backend_for", lambda device: "gpu")
    monkeypatch.setattr(graphs.torch.cuda, "is_available", lambda: True)
    arg = types.SimpleNamespace(device=torch.device("cuda"), numel=lambda: 1024, element_size=lambda: 4)
    assert graphs.worth_a_graph(_plan(6), [arg, arg], [0], None)  # 6 launches > 2 in + 1 out + 1
    assert not graphs.worth_a_graph(_plan(4), [arg, arg], [0], None)
    assert graphs.worth_a_graph(_plan(1), [arg], [0], True)  # forced
    assert not graphs.worth_a_graph(_plan(9), [arg], [0], False)  # opted out
    big = types.SimpleNamespace(device=torch.device("cuda"), numel=lambda: graphs.MAX_COPY_BYTES, element_size=lambda: 4)
    assert not graphs.worth_a_graph(_plan(9), [big], [0], None)
    monkeypatch.setenv("FLYARRAY_CUDA_GRAPHS", "0")
    assert not graphs.worth_a_graph(_plan(9), [arg], [0], True)


def test_no_graph_off_the_gpu_backend():
    w = torch.randn(8, 8)
    f = fa.jit(_layers, cuda_graph=True)
    fa.reset_stats()
    for _ in range(3):
        f(torch.randn(4, 8), w).torch()
    assert fa.stats().get("graph_replays", 0) == 0


def test_the_option_is_checked():
    with pytest.raises(TypeError, match="cuda_graph must be None, True or False"):
        fa.jit(_layers, cuda_graph="yes")


def _layers(x, w):
    for _ in range(6):
        x = fa.tanh(x @ w) * 0.5
    return x


@gpu
@pytest.mark.parametrize("chosen", [None, "gpu"])  # the default backend for CUDA data, and chosen by name
def test_a_multi_kernel_trace_replays_as_one_graph(chosen):
    fa.set_backend(chosen)
    try:
        w = torch.randn(64, 64, device="cuda") / 8
        f, plain = fa.jit(_layers), fa.jit(_layers, cuda_graph=False)
        xs = [torch.randn(32, 64, device="cuda") for _ in range(4)]
        f(xs[0], w)  # the trace
        fa.reset_stats()
        outs = [f(x, w).torch() for x in xs]  # the first replay captures, every replay runs the graph
        assert fa.stats()["graph_replays"] == 4
        for x, out in zip(xs, outs):  # each result survives the later replays (copied out)
            torch.testing.assert_close(out, plain(x, w).torch(), rtol=1e-5, atol=1e-5)
        fa.reset_stats()
        plain(xs[0], w).torch()
        assert fa.stats().get("graph_replays", 0) == 0
    finally:
        fa.set_backend(None)


@gpu
def test_a_closed_over_buffer_is_read_in_place_and_few_kernels_stay_plain():
    fa.set_backend("gpu")
    try:
        bias = fa.asarray(torch.randn(64, device="cuda"))
        one = fa.jit(lambda x: fa.exp(x) + bias)  # one kernel: a graph would only add copies
        x = torch.randn(64, device="cuda")
        for _ in range(3):
            got = one(x).torch()
        assert fa.stats().get("graph_replays", 0) == 0
        torch.testing.assert_close(got, torch.exp(x) + bias.torch())
    finally:
        fa.set_backend(None)


class _FakeGraph:
    """Stands in for a captured graph on the CPU: runs the plan itself and counts its replays."""
    def __init__(self, program, scalars):
        self.program, self.scalars, self.runs = program, scalars, 0

    def run(self, tensors):
        self.runs += 1
        return self.program.run(list(tensors), self.scalars)


def test_the_switch_is_read_at_every_replay(monkeypatch):
    captured = []

    def capture(program, leaf_sources, tensors, scalars, out_slots):
        captured.append(_FakeGraph(program, scalars))
        return captured[-1], None
    monkeypatch.setattr(graphs, "worth_a_graph", lambda *args: True)
    monkeypatch.setattr(graphs.GraphedPlan, "capture", capture)
    f = fa.jit(lambda a: fa.exp(a) * 2 + 1)
    x = torch.randn(8)
    expected = torch.exp(x) * 2 + 1
    monkeypatch.setenv("FLYARRAY_CUDA_GRAPHS", "0")
    for _ in range(3):   # the trace, then replays while graphs are off: nothing captured, nothing decided
        torch.testing.assert_close(f(x).torch(), expected)
    assert not captured
    monkeypatch.setenv("FLYARRAY_CUDA_GRAPHS", "1")
    torch.testing.assert_close(f(x).torch(), expected)   # decided now: captured, and this replay ran it
    assert len(captured) == 1 and captured[0].runs == 1
    monkeypatch.setenv("FLYARRAY_CUDA_GRAPHS", "0")
    torch.testing.assert_close(f(x).torch(), expected)   # off again: the graph rests
    assert captured[0].runs == 1
    monkeypatch.delenv("FLYARRAY_CUDA_GRAPHS")
    torch.testing.assert_close(f(x).torch(), expected)   # back on: the same graph, no second capture
    assert len(captured) == 1 and captured[0].runs == 2


@gpu
def test_turning_graphs_off_after_the_capture_stops_the_replays(monkeypatch):
    fa.set_backend("gpu")
    try:
        w = torch.randn(64, 64, device="cuda") / 8
        f = fa.jit(_layers)
        x = torch.randn(32, 64, device="cuda")
        for _ in range(3):
            f(x, w)
        monkeypatch.setenv("FLYARRAY_CUDA_GRAPHS", "0")
        fa.reset_stats()
        got = f(x, w).torch()
        assert fa.stats().get("graph_replays", 0) == 0
        torch.testing.assert_close(got, fa.jit(_layers, cuda_graph=False)(x, w).torch(), rtol=1e-5, atol=1e-5)
    finally:
        fa.set_backend(None)
