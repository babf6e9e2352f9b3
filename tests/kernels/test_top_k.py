"""top_k / softmax_top_k: interpreter tests against the float64 reference, GPU tests, cross-compiles.

The wide-row path is exercised on tiny rows by shrinking its chunk, group and
candidate sizes through ``config=``, so several programs a row, the candidate
overflow and both branches of the exact scan run in the interpreter in seconds;
``wide_threshold_state`` says which branch a row took.
"""
from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings, strategies as st

from flyarray.kernels.top_k import (
    compile_specs, reference_softmax_top_k, reference_top_k, softmax_top_k, top_k, wide_plan,
    wide_threshold_state, CONFIGS,
)

# tiny sizes: a 100-long row is several chunks and group-max programs, and 8 candidate slots
# overflow at the first flood of ties
WIDE_SMALL = {"narrow_max_n": 0, "direct_max_n": 0, "chunk": 64, "min_groups": 16, "groups_per_kpad": 4,
              "min_segment": 4, "min_cap": 8, "select_tile": 16, "fallback_elems_per_thread": 1,
              "fuse_max_elems": 0}
# the same with the compaction fused into the threshold program (small k: the default); piece
# maxima scanned 16 at a time
FUSED_SMALL = {**WIDE_SMALL, "fuse_max_elems": 1 << 20, "piece_tile": 16}
DIRECT = {"narrow_max_n": 0}  # the final kernel alone (rows up to direct_max_n)
NARROW = {}
PATHS = {"narrow": NARROW, "wide": WIDE_SMALL, "fused": FUSED_SMALL, "direct": DIRECT}

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
    for k in (1, 9, 40, 100 if path != "narrow" else 16):
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_returns_each_picked_element_bit_for_bit(dtype):
    """The oracle (the reference backend's top_k) gathered bfloat16 with torch's CPU gather, which rewrote a
    NaN's bits (0x7FC0 came back 0xFFFF, a negative NaN): the values are the elements themselves."""
    x = torch.tensor([[float("nan"), 1.0, -0.0, 2.0, -float("nan"), 0.0]], dtype=dtype)
    values, indices = reference_top_k(x, 6)
    bits = {4: torch.int32, 2: torch.int16}[x.element_size()]
    assert torch.equal(values.view(bits), x.view(bits).gather(1, indices.long()))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_integers(dtype):
    lo, hi = (0, 255) if dtype == torch.uint8 else (-(2 ** 15), 2 ** 15 - 1)
    x = torch.randint(lo, hi, (3, 60)).to(dtype)
    if dtype == torch.int32:
        x[0, 3], x[0, 9] = -(2 ** 31), 2 ** 31 - 1  # the extremes of the key range
    for path, cfg in PATHS.items():
        assert_same(x, 8, top_k(x, 8, config=cfg), path)


def test_fa_top_k_takes_the_kernels_integers(backend):
    """fa.top_k (and torch.ops.flyarray.top_k) refused integers the kernel orders: as jax.lax.top_k, they are
    taken, ties to the lower index, values in the input's dtype."""
    import numpy as np
    import flyarray as fa
    import flyarray.interop.torch  # noqa: F401  (torch.ops.flyarray)
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32):
        info = torch.iinfo(dtype)
        x = torch.randint(info.min, info.max, (3, 40), generator=g, dtype=torch.int64).to(dtype)
        x[0, :20] = x[0, 20]   # a flood of ties
        values, indices = fa.top_k(fa.asarray(x), 5)
        want = torch.from_numpy(np.argsort(-x.long().numpy(), axis=-1, kind="stable")[:, :5].astype(np.int32))
        assert torch.equal(torch.from_dlpack(indices), want)
        assert torch.equal(torch.from_dlpack(values), torch.take_along_dim(x, want.long(), -1))
    op_values, _ = torch.ops.flyarray.top_k(x, 5)
    assert op_values.dtype == torch.int32 and torch.equal(op_values, torch.from_dlpack(values))
    with pytest.raises(TypeError, match="top_k: x has dtype fa.int64; expected one of"):
        fa.top_k(fa.asarray(x.long()), 5)
    with pytest.raises(TypeError, match="softmax_top_k: logits has dtype fa.int32"):
        fa.nn.softmax_top_k(fa.asarray(x), 5)


def wide_branch(x, k, config=WIDE_SMALL):
    """Which branch of the final kernel each row takes: 'fits' (the compacted candidates), 'ties'
    (they overflow; fewer than k above the threshold, so it is the k-th largest) or 'search';
    'overflow' where the fused compaction found too many live pieces (the final kernel counts)."""
    state = wide_threshold_state(x, k, config=config)
    return ["fits" if c <= state["m"] else "overflow" if a < 0 else "ties" if a < k else "search"
            for c, a in zip(state["candidates"].tolist(), state["above"].tolist())]


def test_wide_plan_sizes():
    cfg = CONFIGS["sm_90"]
    p50, p1024 = wide_plan(131072, 50, cfg), wide_plan(131072, 1024, cfg)
    # 64 rows x 32 programs of 4096 elements, 8 warps, for the two data passes
    assert (p50["programs"], p50["n_chunks"], p50["chunk_warps"], p50["group_warps"]) == (32, 32, 8, 8)
    assert p50["groups"] == 1024 and p50["seg"] * p50["n_slabs"] == 4096 and p50["m"] == 128
    assert p1024["groups"] == 8192 and p1024["seg"] * p1024["n_slabs"] == 4096 and p1024["m"] == 2048
    assert wide_plan(131072, 50, CONFIGS["gfx950"])["chunk_warps"] == 4  # wave64: 256 lanes
    assert wide_plan(1000, 20, cfg)["direct"] and not wide_plan(5000, 20, cfg)["direct"]
    for n, k in [(2049, 1), (5000, 2048), (10 ** 6, 7), (3 * 10 ** 6, 1000)]:  # odd sizes stay consistent
        p = wide_plan(n, k, cfg)
        assert p["groups"] >= 4 * k and p["groups"] == p["programs"] * p["seg"]
        assert p["seg"] >= cfg["min_segment"] and p["seg"] * p["slabs"] <= p["chunk"]
        assert p["m"] >= 2 * p["kpad"] and p["n_chunks"] * p["chunk"] >= n


@pytest.mark.parametrize("path", ["wide", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wide_fits_random_and_sorted(dtype, path):
    cfg = PATHS[path]
    # random rows: about k candidates, no overflow; several rows, k not a power of two
    x = torch.randn(3, 300).to(dtype)
    for k in (1, 3, 6):
        assert wide_branch(x, k, cfg) == ["fits"] * 3
        assert_same(x, k, top_k(x, k, config=cfg))
    # sorted and reversed rows: the groups stride over the whole row, so the k largest (side by
    # side) are k group maxima and the threshold is exact
    s = torch.stack([torch.arange(300.0), -torch.arange(300.0), torch.arange(300.0).flip(0)]).to(dtype)
    assert wide_branch(s, 4, cfg) == ["fits"] * 3
    assert_same(s, 4, top_k(s, 4, config=cfg))
    if path == "wide":
        return
    # the default sizes on a full-length row (the interpreter runs it in about a second)
    x = torch.randn(1, 131072).to(dtype)
    assert_same(x, 50, top_k(x, 50))


@pytest.mark.parametrize("path", ["wide", "fused"])
def test_wide_tie_floods(path):
    """Overflowing candidates where the threshold is the k-th largest: all equal, few distinct
    values, NaN rows, signed zeros, -inf masks; ties go to the lowest columns across chunks."""
    cfg = PATHS[path]
    x = torch.zeros(6, 300)
    x[1] = torch.randint(0, 3, (300,)).float()
    x[2] = float("nan")
    x[2, 100:] = -float("nan")  # sign bit set: still a NaN, still on top
    x[3, ::2] = -0.0  # -0.0 == +0.0: index order; the element comes back with its sign
    x[4] = -float("inf")
    x[4, [7, 250]] = 1.0  # a masked row: two real values, k past them takes -inf ties
    x[5] = 1.0
    x[5, [3, 140, 299]] = torch.tensor([5.0, 4.0, 3.0])  # a few above, then a flood at the k-th value
    assert wide_branch(x, 5, cfg) == ["ties" if path == "wide" else "overflow"] * 6
    for k in (1, 5, 64):
        assert_same(x, k, top_k(x, k, config=cfg))
    assert top_k(x, 5, config=cfg)[1][5].tolist() == [3, 140, 299, 0, 1]
    for dtype in (torch.float16, torch.bfloat16):
        assert_same(x.to(dtype), 7, top_k(x.to(dtype), 7, config=cfg))


@pytest.mark.parametrize("path", ["wide", "fused"])
def test_wide_search_branch(path):
    """Overflow with k or more above the threshold (the big values share one strided group, so the
    group maxima bound is loose): the final kernel searches the k-th largest over the row."""
    cfg = {**PATHS[path], "chunk": 128, "groups_per_kpad": 2}  # 16 groups of 19 elements
    x = -torch.rand(3, 300)
    groups = wide_plan(300, 4, {**CONFIGS["default"], **cfg})["groups"]
    x[0, ::groups] = 100 + torch.arange(len(range(0, 300, groups)), dtype=torch.float32)  # distinct
    x[1, ::groups] = 100.0  # ties at the k-th value, after the search too
    x[1, 5] = 200.0
    x[2, 1::groups] = 7.0
    x[2, 2::groups] = 7.0
    assert wide_branch(x, 4, cfg) == ["search" if path == "wide" else "overflow"] * 3
    for k in (4, 11):
        assert_same(x, k, top_k(x, k, config=cfg))
    assert top_k(x, 4, config=cfg)[1][1].tolist() == [5, 0, groups, 2 * groups]
    # a threshold of the top 4 bits only: loose on random data, every row searches
    coarse = {**PATHS[path], "search_bits": 4}
    y = torch.randn(2, 200)
    assert wide_branch(y, 20, coarse) == ["search"] * 2  # fused: few enough live pieces to count them
    assert_same(y, 20, top_k(y, 20, config=coarse))


@pytest.mark.parametrize("path", ["wide", "fused"])
def test_threshold_search_stops_early_only_when_tight(path):
    """Past search_min_bits the threshold search stops once few group maxima reach t. Rows packed
    into one coarse bucket (uniform [0.5, 1): one exponent) keep refining, so their candidates fit
    the slots; a search cut at those bits overflows."""
    x = 0.5 + 0.5 * torch.rand(2, 2000, generator=torch.Generator().manual_seed(0))
    early = {**PATHS[path], "search_min_bits": 8}
    assert wide_branch(x, 8, early) == ["fits"] * 2
    assert "fits" not in wide_branch(x, 8, {**PATHS[path], "search_bits": 8})
    assert_same(x, 8, top_k(x, 8, config=early))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32])
def test_wide_integers(dtype):
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, (3, 300), dtype=torch.int64)
    x[1] = torch.randint(info.min, info.min + 3, (300,))  # a flood at the bottom of the key range
    x[2] = info.min  # INT32_MIN is key 0, the same as padding
    x[2, [4, 200]] = info.max
    x = x.to(dtype)
    for k in (3, 40):
        assert_same(x, k, top_k(x, k, config=WIDE_SMALL))
        assert_same(x, k, top_k(x, k, config=FUSED_SMALL))


def test_wide_sizes_and_large_k():
    # N not a multiple of anything, k = N, k past max_k (the packed-word torch.topk call)
    x = torch.randn(2, 257)
    for k in (1, 2, 100, 257):
        assert_same(x, k, top_k(x, k, config=WIDE_SMALL))
    assert_same(x, 9, top_k(x, 9, config={**WIDE_SMALL, "max_k": 8}))
    z = torch.zeros(2, 50)
    z[0, ::3] = float("nan")
    assert_same(z, 30, top_k(z, 30, config={"narrow_max_n": 0, "max_k": 8}))
    # non-contiguous, several leading dims, on the wide path
    y = torch.randn(300, 2, 3).permute(1, 2, 0)
    assert_same(y, 6, top_k(y, 6, config=WIDE_SMALL))


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


@pytest.mark.parametrize("shape,k", [((3, 37), 5), ((2, 3, 300), 20), ((2, 3000), 7)])  # narrow, direct, wide
def test_a_signatures_later_calls_replay_its_launches_on_their_own_tensors(monkeypatch, shape, k):
    """The first call of a signature is recorded (its allocations and launches), later calls replay it
    (on a GPU; the test sends the interpreter down the same path): each on its own input, into its own
    outputs, with every result checked; the replay keeps no tensor of the call it was recorded from;
    another k, a config override or a non-contiguous input takes the whole path."""
    import gc
    import weakref
    from flyarray.kernels import top_k as module
    monkeypatch.setattr(module, "_PREPARED_ON_CPU", True)
    monkeypatch.setattr(module, "_REPLAYS", {})
    first = torch.randn(shape)
    assert_same(first, k, top_k(first, k))
    assert len(module._REPLAYS) == 1
    (replay,) = module._REPLAYS.values()
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None   # the recorded launches' arguments hold no tensor of the first call
    for seed in range(2):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        values, indices = top_k(x, k)
        assert_same(x, k, (values, indices))
        again = top_k(x, k)
        assert again[0].data_ptr() != values.data_ptr()   # fresh outputs every call
    monkeypatch.setattr(module._Replay, "__call__", lambda self, x: _unreachable())
    x = torch.randn(shape)
    assert_same(x, k - 1, top_k(x, k - 1))      # another signature records its own
    assert_same(x, k, top_k(x, k, config=dict(narrow_tile=512)))   # overrides: never replayed
    t = torch.randn(tuple(reversed(shape))).transpose(0, -1)
    assert_same(t, k, top_k(t, k))              # not contiguous: the whole path
    assert len(module._REPLAYS) == 2 and replay in module._REPLAYS.values()


def _unreachable():
    raise AssertionError("replayed where the whole path was expected")


def test_softmax_top_k_replays_per_renormalize_flag(monkeypatch):
    from flyarray.kernels import top_k as module
    monkeypatch.setattr(module, "_PREPARED_ON_CPU", True)
    monkeypatch.setattr(module, "_REPLAYS", {})
    for seed in range(2):
        logits = torch.randn(33, 24, generator=torch.Generator().manual_seed(seed))
        for renormalize in (False, True):
            probs, indices = softmax_top_k(logits, 3, renormalize)
            ref_probs, ref_indices = reference_softmax_top_k(logits, 3, renormalize)
            assert torch.equal(indices, ref_indices)
            torch.testing.assert_close(probs.double(), ref_probs, rtol=2e-6, atol=2e-6)
    assert len(module._REPLAYS) == 2


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


WIDE_CONFIGS = {
    "small": WIDE_SMALL,
    "coarse": {**WIDE_SMALL, "search_bits": 8, "digit_bits": 2},  # loose thresholds, 2-bit rounds
    "roomy": {**WIDE_SMALL, "min_cap": 64, "chunk": 64, "min_groups": 64},
    "fused": FUSED_SMALL,
    "fused_coarse": {**FUSED_SMALL, "search_bits": 8, "digit_bits": 2, "piece_tile": 4},
    "fused_separate_final": {**FUSED_SMALL, "fuse_final": False},  # the final sort as a kernel of its own
    "column_grid": {**WIDE_SMALL, "group_row_major": False},  # group-max grid (rows, programs)
    "early": {**FUSED_SMALL, "search_min_bits": 4},  # the threshold search may stop after one round
}


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 3), n=st.integers(1, 400), data=st.data(), cfg=st.sampled_from(sorted(WIDE_CONFIGS)),
       dtype=st.sampled_from(["float32", "float16", "bfloat16", "int8", "int32"]),
       kind=st.sampled_from(["randn", "few", "flood", "sorted", "specials"]))
def test_wide_hypothesis(rows, n, data, cfg, dtype, kind):
    """Fresh random rows of every kind against the reference, on the small wide-path configs."""
    k = data.draw(st.integers(1, n))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31)))
    x = torch.randn(rows, n, generator=g) * 50
    if kind == "few":
        x = torch.randint(-2, 3, (rows, n), generator=g).float()
    elif kind == "flood":  # the k-th value shared by most of the row
        x = torch.where(torch.rand(rows, n, generator=g) < 0.8, 1.0, x)
    elif kind == "sorted":
        x = x.sort(-1, descending=bool(n % 2)).values
    elif kind == "specials":
        pick = torch.randint(0, 5, (rows, n), generator=g)
        x = torch.where(pick == 0, float("nan"), torch.where(pick == 1, float("inf"), x))
        x = torch.where(pick == 2, -float("inf"), torch.where(pick == 3, -0.0, x))
    if dtype.startswith("int"):
        x = x.nan_to_num(0.0, 100.0, -100.0).clamp(-128, 127)
    x = x.to(getattr(torch, dtype))
    assert_same(x, k, top_k(x, k, config=WIDE_CONFIGS[cfg]))


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
@pytest.mark.parametrize("k", [1, 50, 1024, 2048, 3000])
def test_top_k_gpu_wide_branches(k):
    """Every branch of the wide path at full size: fits, tie floods, the exact search, large k."""
    n = 131072
    x = torch.randn(8, n, device="cuda")
    x[0] = 1.0  # all equal
    x[1, ::2] = -0.0
    x[1, 1::2] = 0.0
    x[2] = float("nan")
    x[3] = -float("inf")
    x[3, 5000::9000] = torch.arange(15.0, device="cuda")  # a masked row
    x[4] = x[4].sort().values  # sorted
    x[5, ::8192] = 100 + torch.arange(16.0, device="cuda")  # the big values share one group
    x[6] = torch.randint(-3, 3, (n,), device="cuda").float()
    if k <= 2048:
        groups = wide_plan(n, k, CONFIGS["sm_90"])["groups"]
        x[7, ::groups] = 50.0  # loose threshold with ties at the k-th value
    assert_same(x, k, top_k(x, k))
    assert_same(x.bfloat16(), k, top_k(x.bfloat16(), k))
    i = torch.randint(-128, 127, (4, n), device="cuda", dtype=torch.int8)
    assert_same(i, k, top_k(i, k))


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


@gpu
@pytest.mark.parametrize("shape,k", [((64, 131072), 50), ((8, 4096), 1024), ((300, 257), 7), ((16, 5000), 3)])
def test_gpu_repeated_signatures_launch_directly_with_new_data(shape, k):
    """From the second call of a signature on, every kernel launches through FixedLaunch (replayed: the
    signature's recorded launches): each call gets new values (and one a row-strided view, which takes the
    whole path), each result is checked."""
    from flyarray.kernels import top_k as module
    module._LAUNCHES.clear()
    module._REPLAYS.clear()
    for _ in range(3):
        x = torch.randn(shape, device="cuda")
        assert_same(x, k, top_k(x, k))
    wide = torch.randn(shape[0], shape[1] + 3, device="cuda")[:, 3:]  # another row stride and alignment
    assert_same(wide, k, top_k(wide, k))
    launches = [launch for fixed in module._LAUNCHES.values() for launch in fixed.made.values()]
    assert launches and all(launch.compiled is not None for launch in launches)
    replayed = [fixed for replay in module._REPLAYS.values() for fixed, _, _ in replay.steps]
    assert replayed and all(fixed in launches for fixed in replayed)
    logits = torch.randn(4096, 64, device="cuda")
    for _ in range(2):
        probs, indices = softmax_top_k(logits, 4, True)
        assert torch.equal(indices, reference_softmax_top_k(logits, 4, True)[1])


# ----------------------------------------------------------------------------- cross-compile

# each spec compiled for the arch its plan is for (every kernel of the wide path, k=50 and k=1024)
SPECS = [(s, "sm_90" if s.name.endswith("sm_90") else "gfx950") for s in compile_specs()]


@pytest.mark.parametrize("spec,target", SPECS, ids=lambda v: getattr(v, "name", v))
def test_cross_compile(spec, target):
    from flyarray.targets import compile_for
    assert spec.name.endswith(target)
    report = compile_for(spec, target)
    assert report.spills == 0, report.summary()
    assert report.matrix_instructions == []  # selection work: no matrix units
    assert report.registers > 0
    print(f"{spec.name}: {report.registers} registers, {report.spills} spills, {spec.num_warps} warps")
