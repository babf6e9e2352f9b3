"""Reductions over a strided axis (a sum over axis 0 of a row-major matrix) take column-major tiles
(codegen: the tile is [reduced, kept] so neighbouring threads read neighbouring addresses)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flyarray as fa
from flyarray import codegen
from flyarray.schedule import schedule

from .conftest import scaled

_REDUCTIONS = {
    "sum": (lambda a: fa.sum(a, axis=0), lambda t: t.sum(0)),
    "max": (lambda a: fa.max(a, axis=0), lambda t: t.amax(0)),
    "min": (lambda a: fa.min(a * -1.0, axis=0), lambda t: (t * -1).amin(0)),
    "argmax": (lambda a: fa.argmax(a, axis=0), lambda t: t.argmax(0)),
    "argmin": (lambda a: fa.argmin(a, axis=0), lambda t: t.argmin(0)),
    "centered": (lambda a: a - fa.mean(a, axis=0, keepdims=True), lambda t: t - t.mean(0, keepdim=True)),
    "bias_grad": (lambda a: fa.sum(fa.exp(a) * 0.5, axis=0) + 1.0, lambda t: (t.exp() * 0.5).sum(0) + 1),
}


def _column_major(array) -> bool:
    node = array._node.inputs[0] if array._node.prim.name == "view" else array._node
    steps = [s for s in schedule([node]) if hasattr(s, "kernel")]
    return any(codegen._Emitter(s.kernel, codegen._Layout(s.kernel)).t for s in steps)


@pytest.mark.parametrize("name", sorted(_REDUCTIONS))
@settings(max_examples=scaled(3))
@given(rows=st.integers(65, 300), cols=st.integers(2, 70))  # one column is a full reduction: no kept axis
def test_reductions_over_a_strided_axis(interpret, name, rows, cols):
    ours, ref = _REDUCTIONS[name]
    x = torch.randn(rows, cols)
    y = ours(fa.asarray(x))
    assert _column_major(ours(fa.asarray(x)))
    got, want = torch.from_dlpack(y), ref(x)
    if got.dtype.is_floating_point:
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-4, atol=1e-4)
    else:
        assert torch.equal(got, want)


@settings(max_examples=scaled(3))
@given(rows=st.integers(65, 300), cols=st.integers(2, 70))
def test_a_per_row_factor_keeps_the_column_major_walk(interpret, rows, cols):
    """An RMSNorm weight gradient, sum over tokens of dy * x * rstd[token]: the per-token factor is
    constant along the kept axis, so the tile stays column-major (row-major, every thread of a warp
    would read a different row: 16x the memory traffic on a GPU)."""
    x, dy = torch.randn(rows, cols), torch.randn(rows, cols)
    ms = (x * x).mean(1, keepdim=True)
    y = fa.sum(fa.asarray(dy) * fa.asarray(x) * fa.rsqrt(fa.asarray(ms) + 1e-6), axis=0)
    assert _column_major(fa.sum(fa.asarray(dy) * fa.asarray(x) * fa.rsqrt(fa.asarray(ms) + 1e-6), axis=0))
    torch.testing.assert_close(torch.from_dlpack(y), (dy * x * torch.rsqrt(ms + 1e-6)).sum(0), rtol=1e-4,
                               atol=1e-4)


def test_a_per_row_factor_in_a_split_column_reduction(interpret, monkeypatch):
    """The same in two stages (on a GPU a column sum of few columns splits its rows into chunks): the
    chunk becomes a kept axis along which the per-row factor varies; the walk stays column-major."""
    from flyarray.ops import core
    monkeypatch.setattr(core, "SPLIT_ON_CPU", True)
    x, dy = torch.randn(1024, 40), torch.randn(1024, 40)
    ms = (x * x).mean(1, keepdim=True)

    def weight_grad():
        return fa.sum(fa.asarray(dy) * fa.asarray(x) * fa.rsqrt(fa.asarray(ms) + 1e-6), axis=0)
    assert _column_major(weight_grad())
    fa.reset_stats()
    got = torch.from_dlpack(weight_grad())
    assert fa.stats()["kernels_launched"] == 2  # chunk partials, then their sum
    torch.testing.assert_close(got, (dy * x * torch.rsqrt(ms + 1e-6)).sum(0), rtol=1e-4, atol=1e-4)


def test_middle_axis_of_a_3d_array(interpret):
    x = torch.randn(3, 130, 17)
    torch.testing.assert_close(torch.from_dlpack(fa.sum(fa.asarray(x), axis=1)), x.sum(1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", ["gfx950", "sm_90"])
def test_column_major_kernels_compile_without_spills(target):
    x = fa.asarray(torch.randn(8192, 4096, dtype=torch.bfloat16))
    info = fa.inspect(lambda a: fa.sum(a.astype(fa.float32), axis=0), x, target=target)
    assert [k.summary()["spills"] for k in info.kernels] == [0]


# ---- full reductions of big arrays run in two stages (ops/core._split_full_reduction) ---------------
@pytest.mark.parametrize("name", ["sum", "max", "min", "prod", "mean", "any", "f16"])
def test_split_full_reductions(backend, monkeypatch, name):
    from flyarray.ops import core
    monkeypatch.setattr(core, "SPLIT_ON_CPU", True)
    monkeypatch.setattr(core, "SPLIT_MIN", 4096)
    x = torch.rand(8192) + 0.5
    cases = {"sum": (lambda a: fa.sum(a), lambda t: t.sum()),
             "max": (lambda a: fa.max(a * -2.0), lambda t: (t * -2).max()),
             "min": (lambda a: fa.min(a), lambda t: t.min()),
             "prod": (lambda a: fa.prod(a ** 0.001), lambda t: (t ** 0.001).prod()),
             "mean": (lambda a: fa.mean((a - 1.0) ** 2, keepdims=True), lambda t: ((t - 1) ** 2).mean().reshape(1)),
             "any": (lambda a: fa.any(a > 1.49), lambda t: (t > 1.49).any()),
             "f16": (lambda a: fa.sum(a.astype(fa.float16)), lambda t: t.half().float().sum().half())}
    ours, ref = cases[name]
    fa.reset_stats()
    got, want = ours(fa.asarray(x)).torch(), ref(x)
    assert fa.stats()["kernels_launched"] == 2  # the partial rows, then their total
    assert got.shape == want.shape and got.dtype == want.dtype
    # prod: 8192 float32 rounding errors compound (about 1e-5 relative apart from torch's order)
    rtol = {"f16": 2e-3, "prod": 1e-4}.get(name, 1e-5)
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=1e-5)


def test_split_full_reduction_over_own_rows_fuses_a_broadcast_operand(backend, monkeypatch):
    """A full reduction of a 2-D expression that broadcasts a bias: the first stage reduces the
    array's own rows (no flattening reshape), so the bias is read in place and nothing is copied."""
    from flyarray.ops import core
    monkeypatch.setattr(core, "SPLIT_ON_CPU", True)
    monkeypatch.setattr(core, "SPLIT_MIN", 4096)
    x, b = torch.randn(128, 1024), torch.randn(1024)
    fa.reset_stats()
    got = fa.mean((fa.asarray(x) + fa.asarray(b)) ** 2).torch()
    assert fa.stats()["kernels_launched"] == 2
    torch.testing.assert_close(got, ((x + b) ** 2).mean(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["sum", "max", "f16"])
def test_split_column_reductions(backend, monkeypatch, name):
    """A column reduction with few kept columns runs over row chunks, then over the chunk partials."""
    from flyarray.ops import core
    monkeypatch.setattr(core, "SPLIT_ON_CPU", True)
    x = torch.randn(2048, 40)
    cases = {"sum": (lambda a: fa.sum(fa.exp(a) * 0.5, axis=0), lambda t: (t.exp() * 0.5).sum(0)),
             "max": (lambda a: fa.max(a, axis=0, keepdims=True), lambda t: t.amax(0, keepdim=True)),
             "f16": (lambda a: fa.sum(a.astype(fa.float16), axis=0), lambda t: t.half().float().sum(0).half())}
    ours, ref = cases[name]
    fa.reset_stats()
    got, want = ours(fa.asarray(x)).torch(), ref(x)
    assert fa.stats()["kernels_launched"] == 2
    assert got.shape == want.shape and got.dtype == want.dtype
    # f16: column sums near 45, where one float16 ulp is 0.03; the result rounds once either way
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3 if name == "f16" else 1e-5,
                               atol=0.04 if name == "f16" else 1e-4)


def test_column_split_needs_leading_axes_and_enough_rows(monkeypatch):
    from flyarray.ops import core
    monkeypatch.setattr(core, "SPLIT_ON_CPU", True)
    assert core._column_chunks(8192, 128) == 8  # 4096 columns in strips of 32: 128 programs, x8
    assert core._column_chunks(300, 1) is None  # too few rows to cut into chunks of >= 256
    assert core._column_chunks(8192, 2048) is None  # enough programs already
    from flyarray import ir
    x = fa.asarray(torch.randn(2048, 40))

    def reductions(a):
        return sum(n.kind == "reduce" for n in ir.toposort([a._node]))
    assert reductions(fa.sum(x, axis=1)) == 1  # a row reduction: one stage
    assert reductions(fa.sum(x, axis=0)) == 2


def test_a_value_a_library_call_reads_is_computed_once(backend):
    """dh = f(x) feeds a matmul and a column sum (a layer's backward): dh is materialized for the
    matmul anyway, so no kernel recomputes it; where the reduction's kernel meets it first it
    stores dh as it goes (one pass)."""
    x, w = torch.randn(300, 48), torch.randn(48, 16)
    h = fa.exp(fa.asarray(x)) * 0.5
    s, m = fa.sum(h, axis=0) * 2.0, h @ fa.asarray(w)
    steps = fa.explain(s, m).steps
    assert sum("exp" in step.ops for step in steps) == 1
    fa.eval(s, m)
    ref = torch.exp(x) * 0.5
    torch.testing.assert_close(s.torch(), ref.sum(0) * 2, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(m.torch(), ref @ w, rtol=1e-4, atol=1e-4)


def test_a_layer_backward_is_one_pass_per_layer(backend):
    """The bias gradient (a column sum of dh) and dh itself (read by the weight-gradient matmul)
    come from one kernel: the reduction kernel is scheduled first and stores dh as it goes."""
    x, w, b = torch.randn(300, 48), torch.randn(16, 48), torch.randn(16)
    loss = lambda w, b: fa.sum(fa.tanh(fa.asarray(x) @ w.T + b))  # noqa: E731
    gw, gb = fa.grad(loss, argnums=(0, 1))(fa.asarray(w), fa.asarray(b))
    steps = fa.explain(gw, gb).steps
    fused = [s for s in steps if s.kind == "fused kernel" and "tanh" in s.ops]
    assert len(fused) == 1 and len(fused[0].outputs) == 2  # dh (for the matmul) and its column sum
    assert gw._node.kind == "output"  # dW = dh.T @ x made in w's layout, not (x.T @ dh).T
    wt, bt = w.clone().requires_grad_(), b.clone().requires_grad_()
    torch.tanh(x @ wt.T + bt).sum().backward()
    torch.testing.assert_close(gw.torch(), wt.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gb.torch(), bt.grad, rtol=1e-4, atol=1e-4)
