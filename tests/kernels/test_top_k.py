"""top_k / softmax_top_k: interpreter tests against the float64 reference, GPU tests, cross-compiles.

The wide-row path is exercised on tiny rows by shrinking its chunk, group and
merge sizes through ``config=``, so chunking, the merge tree and the exact
fallback all run in the interpreter in a few seconds.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from flyarray.kernels.top_k import (
    compile_specs, reference_softmax_top_k, reference_top_k, softmax_top_k, top_k, wide_plan, CONFIGS,
)

# tiny chunks: a 100-long row becomes several chunks; merge_max small enough to build a tree
WIDE_SMALL = {"narrow_max_n": 0, "chunk": 32, "chunk_per_kpad": 2, "group_size": 2, "merge_max": 64}
NARROW = {}
PATHS = {"narrow": NARROW, "wide": WIDE_SMALL}

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def assert_same(x, k, got, config=None):
    """Values bit-for-bit equal to the reference (NaN where it has NaN), indices identical."""
    values, indices = got
    ref_values, ref_indices = reference_top_k(x, k)
    assert indices.dtype == torch.int32 and values.dtype == x.dtype
    assert values.shape == ref_values.shape == tuple(x.shape[:-1]) + (k,)
    assert torch.equal(indices.cpu(), ref_indices.cpu()), (config, indices, ref_indices)
    v, r = values.cpu().double(), ref_values.cpu().double()
    assert torch.equal(v.isnan(), r.isnan())
    assert torch.equal(v.nan_to_num(0.0), r.nan_to_num(0.0))
    # the element itself comes back: the sign of a zero is kept
    assert torch.equal(torch.signbit(v), torch.signbit(r))


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape,k", [((1, 1), 1), ((3, 37), 1), ((3, 37), 5), ((2, 37), 37),
                                     ((5,), 3), ((2, 3, 41), 7), ((2, 1, 2, 23), 4)])
def test_top_k_shapes(path, dtype, shape, k):
    x = torch.randn(shape).to(dtype)
    assert_same(x, k, top_k(x, k, config=PATHS[path]), path)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_ties_lower_index_wins(path):
    # few distinct values: long runs of ties, across chunk boundaries on the wide path
    x = torch.randint(-2, 3, (4, 100)).float()
    for k in (1, 9, 40, 100 if path == "wide" else 16):
        values, indices = top_k(x, k, config=PATHS[path])
        assert_same(x, k, (values, indices), path)
    x = torch.zeros(2, 70)
    assert top_k(x, 5, config=PATHS[path])[1].tolist() == [[0, 1, 2, 3, 4]] * 2


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_nan_inf_and_signed_zero(path, dtype):
    x = torch.randn(3, 90)
    x[0, [5, 50, 2]] = float("nan")
    x[0, 7] = -float("nan")  # a NaN with the sign bit set still ranks on top
    x[1, [3, 60]] = float("inf")
    x[1, [4, 61]] = -float("inf")
    x[2] = 0.0
    x[2, ::3] = -0.0  # -0.0 == +0.0: index order decides
    x = x.to(dtype)
    values, indices = top_k(x, 6, config=PATHS[path])
    assert_same(x, 6, (values, indices), path)
    assert indices[0, :4].tolist() == [2, 5, 7, 50]
    assert indices[1, :2].tolist() == [3, 60]
    assert indices[2].tolist() == [0, 1, 2, 3, 4, 5]
    # all -inf but one NaN, k = N
    y = torch.full((1, 9), -float("inf"), dtype=dtype)
    y[0, 4] = float("nan")
    assert_same(y, 9, top_k(y, 9, config=PATHS[path]), path)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_integers(dtype):
    lo, hi = (0, 255) if dtype == torch.uint8 else (-(2 ** 15), 2 ** 15 - 1)
    x = torch.randint(lo, hi, (3, 60)).to(dtype)
    if dtype == torch.int32:
        x[0, 3], x[0, 9] = -(2 ** 31), 2 ** 31 - 1  # the extremes of the key range
    for path, cfg in PATHS.items():
        assert_same(x, 8, top_k(x, 8, config=cfg), path)


def test_wide_path_pieces():
    x = torch.randn(2, 300)
    # several chunks, one merge (the default shape of the wide path, scaled down)
    assert_same(x, 20, top_k(x, 20, config={**WIDE_SMALL, "merge_max": 4096}))
    # a two-level merge tree
    assert wide_plan(300, 3, {**CONFIGS["default"], **WIDE_SMALL})["m_valid"] > 8
    assert_same(x, 3, top_k(x, 3, config={**WIDE_SMALL, "merge_max": 8}))
    # the exact fallback: strided group 0 holds every big value, so the group-max bound lets
    # through more than CAP and the chunk's exact k-th largest is searched instead
    f = -torch.rand(2, 128)
    f[:, ::8] = 100 + torch.arange(16.0)
    cfg = {"narrow_max_n": 0, "chunk": 128, "chunk_per_kpad": 2, "group_size": 16}
    plan = wide_plan(128, 2, {**CONFIGS["default"], **cfg})
    assert plan["groups"] == 8 and plan["cap"] < 16  # group 0 alone beats the cap
    assert_same(f, 2, top_k(f, 2, config=cfg))
    # sorted rows (the strided groups keep the bound tight)
    s = torch.arange(200.0).repeat(2, 1)
    assert_same(s, 10, top_k(s, 10, config=WIDE_SMALL))
    assert_same(-s, 10, top_k(-s, 10, config=WIDE_SMALL))


def test_non_contiguous_and_errors():
    x = torch.randn(40, 6).t()  # rows with stride 1 only after a copy
    assert_same(x, 3, top_k(x, 3))
    with pytest.raises(ValueError):
        top_k(x, 0)
    with pytest.raises(ValueError):
        top_k(x, 41)
    with pytest.raises(TypeError):
        top_k(torch.randn(3, 4, dtype=torch.float64), 2)
    values, indices = top_k(torch.randn(0, 5), 2)
    assert values.shape == (0, 2) and indices.shape == (0, 2)


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 3), n=st.integers(1, 80), data=st.data(),
       wide=st.booleans(), half=st.booleans(), distinct=st.integers(1, 6))
def test_top_k_hypothesis(rows, n, data, wide, half, distinct):
    k = data.draw(st.integers(1, n if wide else min(n, 16)))
    seed = data.draw(st.integers(0, 2 ** 16))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g)
    if distinct < 6:  # many ties
        x = torch.randint(0, distinct, (rows, n), generator=g).float()
    x = x.half() if half else x
    assert_same(x, k, top_k(x, k, config=WIDE_SMALL if wide else NARROW))


# ----------------------------------------------------------------------------- softmax_top_k

def assert_softmax_close(x, k, renormalize, got):
    probs, indices = got
    ref_probs, ref_indices = reference_softmax_top_k(x, k, renormalize)
    assert probs.dtype == x.dtype and indices.dtype == torch.int32
    assert torch.equal(indices.cpu(), ref_indices.cpu())
    tol = 2e-6 if x.dtype == torch.float32 else 2e-3
    torch.testing.assert_close(probs.cpu().double(), ref_probs.cpu(), rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape,k", [((1, 1), 1), ((7, 10), 3), ((3, 64), 8), ((2, 3, 33), 16)])
def test_softmax_top_k(renormalize, dtype, shape, k):
    x = (3 * torch.randn(shape)).to(dtype)
    assert_softmax_close(x, k, renormalize, softmax_top_k(x, k, renormalize))
    if renormalize:
        total = softmax_top_k(x, k, True)[0].double().sum(-1)
        torch.testing.assert_close(total, torch.ones_like(total), rtol=1e-3, atol=1e-3)


def test_softmax_top_k_special_rows():
    x = torch.randn(4, 20)
    x[0, 5] = float("nan")  # a NaN row: all NaN probabilities, the NaN logit picked first
    x[1, 3] = float("inf")
    x[2, 10:] = -float("inf")  # masked experts get probability 0 and lose every tie
    x[3] = 1.0  # all equal: the lowest indices, 1/N each
    probs, indices = softmax_top_k(x, 12)
    assert_softmax_close(x, 12, False, (probs, indices))
    assert indices[0, 0] == 5 and probs[0].isnan().all() and probs[1].isnan().all()
    assert (probs[2, 10:] == 0).all() and indices[3].tolist() == list(range(12))
    with pytest.raises(ValueError):
        softmax_top_k(torch.randn(2, 5000), 4)


# ----------------------------------------------------------------------------- GPU

@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,n,k", [(64, 131072, 50), (64, 131072, 1024), (7, 32000, 1),
                                      (16384, 256, 8), (33, 50257, 256), (5, 1000, 17)])
def test_top_k_gpu(dtype, rows, n, k):
    x = torch.randn(rows, n, device="cuda").to(dtype)
    assert_same(x, k, top_k(x, k))


@gpu
def test_top_k_gpu_ties_and_specials():
    x = torch.randint(-3, 3, (8, 131072), device="cuda").float()
    x[0, 1000::7] = float("nan")
    x[1, :] = -float("inf")
    assert_same(x, 50, top_k(x, 50))
    assert_same(x, 1024, top_k(x, 1024))
    s = torch.arange(131072.0, device="cuda").repeat(2, 1)
    assert_same(s, 300, top_k(s, 300))


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [False, True])
def test_softmax_top_k_gpu(dtype, renormalize):
    x = torch.randn(16384, 256, device="cuda").to(dtype)
    probs, indices = softmax_top_k(x, 8, renormalize)
    ref_probs, ref_indices = reference_softmax_top_k(x, 8, renormalize)
    assert torch.equal(indices, ref_indices)
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(probs.double(), ref_probs, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- cross-compile

# each spec compiled for the arch its plan is for; the k=1024 specs are slow to compile (report only)
FAST_SPECS = [(s, "sm_90" if s.name.endswith("sm_90") else "gfx950")
              for s in compile_specs() if "k1024" not in s.name]


@pytest.mark.parametrize("spec,target", FAST_SPECS, ids=lambda v: getattr(v, "name", v))
def test_cross_compile(spec, target):
    from flyarray.targets import compile_for
    assert spec.name.endswith(target)
    report = compile_for(spec, target)
    assert report.spills == 0, report.summary()
    assert report.matrix_instructions == []  # selection work: no matrix units
    assert report.registers > 0
