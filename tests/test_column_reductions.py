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
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3 if name == "f16" else 1e-5, atol=1e-5)
