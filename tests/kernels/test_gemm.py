"""GEMM kernel: interpreter tests against a float64 reference, GPU tests, cross-compiles."""
import json
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import flyarray.kernels.gemm as gemm
from flyarray.kernels import tuning
from flyarray.kernels.gemm import matmul, reference_matmul

# exp(-x) overflowing to inf in silu/gelu_tanh is intended (the result is exact: -0 / +-1).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
ACTS = [None, "relu", "gelu", "gelu_tanh", "silu"]


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(out, ref, dtype):
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert rel_err(out, ref) <= TOL[dtype], rel_err(out, ref)


def maybe_transposed(t, transposed):
    """The same values as a view with swapped last-two strides (no copy at use)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2) if transposed else t


# ---------------------------------------------------------------- interpreter

@settings(max_examples=12, deadline=None)
@given(M=st.integers(1, 40), N=st.integers(1, 40), K=st.integers(1, 40),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       a_t=st.booleans(), b_t=st.booleans(), act=st.sampled_from(ACTS),
       bias_kind=st.sampled_from([None, "row", "full"]), residual=st.booleans(),
       seed=st.integers(0, 2**16))
def test_random_shapes_and_epilogues(M, N, K, dtype, a_t, b_t, act, bias_kind, residual, seed):
    g = torch.Generator().manual_seed(seed)
    a = maybe_transposed(torch.randn(M, K, generator=g).to(dtype), a_t)
    b = maybe_transposed(torch.randn(K, N, generator=g).to(dtype), b_t)
    bias = {None: None, "row": torch.randn(N, generator=g).to(dtype),
            "full": torch.randn(M, N, generator=g).to(dtype)}[bias_kind]
    res = torch.randn(M, N, generator=g).to(dtype) if residual else None
    out = matmul(a, b, bias=bias, activation=act, residual=res)
    check(out, reference_matmul(a, b, bias=bias, activation=act, residual=res), dtype)


@pytest.mark.parametrize("act", ACTS)
def test_every_activation_with_bias_and_residual(act):
    a, b = torch.randn(33, 20), torch.randn(20, 18)
    bias, res = torch.randn(18), torch.randn(18, 33).t()  # residual with swapped strides
    out = matmul(a, b, bias=bias, activation=act, residual=res)
    check(out, reference_matmul(a, b, bias=bias, activation=act, residual=res), torch.float32)


def test_relu_epilogue_keeps_nan_and_negative_zero_as_torch_relu():
    """The epilogue's tl.maximum(x, 0) turned a NaN row into zeros, where torch.relu (and fa.relu, and the
    reference backend) keep it: a diverging model's NaNs were hidden behind a Linear+ReLU."""
    a = torch.tensor([[float("nan"), 1.0], [1.0, 2.0], [-1.0, 0.0]])
    for bias in (None, torch.tensor([-0.0, 0.5])):
        out = matmul(a, torch.eye(2), bias=bias, activation="relu")
        want = torch.relu(a @ torch.eye(2) + (0.0 if bias is None else bias))
        torch.testing.assert_close(out, want, equal_nan=True)
        assert torch.isnan(out[0]).all()


def test_k_equals_one_and_k_zero():
    a, b = torch.randn(17, 1), torch.randn(1, 9)
    check(matmul(a, b), reference_matmul(a, b), torch.float32)
    bias = torch.randn(9)
    out = matmul(torch.randn(5, 0), torch.randn(0, 9), bias=bias, activation="relu")
    assert torch.equal(out, torch.relu(bias).expand(5, 9))
    assert matmul(torch.randn(0, 4), torch.randn(4, 3)).shape == (0, 3)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((2, 1, 12, 10), (3, 10, 7)),  # both broadcast
    ((3, 5, 12, 10), (10, 7)),  # b has no batch: batch folds into M
    ((4, 12, 10), (4, 10, 7)),
    ((1, 12, 10), (2, 3, 10, 7)),
])
def test_batch_broadcasting(a_shape, b_shape):
    a, b = torch.randn(a_shape, dtype=torch.float16), torch.randn(b_shape, dtype=torch.float16)
    bias = torch.randn(7, dtype=torch.float16)
    out = matmul(a, b, bias=bias, activation="silu")
    ref = reference_matmul(a, b, bias=bias, activation="silu")
    check(out, ref, torch.float16)


def test_three_uncollapsible_batch_dims_and_permuted_views():
    # Batch dims permuted: no two collapse, so the host loops over the leading one.
    a = torch.randn(3, 4, 2, 9, 11).permute(2, 0, 1, 3, 4)
    b = torch.randn(11, 8).t().contiguous().t()
    res = torch.randn(2, 3, 4, 9, 8)
    out = matmul(a, b, residual=res)
    check(out, reference_matmul(a, b, residual=res), torch.float32)


def test_cached_plan_serves_new_tensors_of_the_same_signature():
    gemm._plans.clear()
    for _ in range(2):  # the second call takes the cached plan with other data
        a, b, res = torch.randn(3, 9, 14), torch.randn(14, 10), torch.randn(10)
        out = matmul(a, b, residual=res, activation="relu")
        check(out, reference_matmul(a, b, residual=res, activation="relu"), torch.float32)
    assert len(gemm._plans) == 1


def test_out_is_written_and_returned_on_both_paths():
    """out=: the first call (planning) and the cached plan's call write the given buffer and return it."""
    a, b = torch.randn(2, 9, 13), torch.randn(13, 6)
    want = reference_matmul(a, b)
    for _ in range(2):
        out = torch.empty(2, 9, 6)
        got = matmul(a, b, out=out)
        assert got is out
        check(got, want.to(torch.float32), torch.float32)


@pytest.mark.parametrize("bad, why", [
    (lambda: torch.empty(9, 7), "expected a \\(9, 6\\)"),
    (lambda: torch.empty(9, 6, dtype=torch.float16), "float16"),
    (lambda: torch.empty(6, 9).t(), "contiguous"),
    (lambda: torch.empty(9 * 6 + 1)[1:].view(9, 6), "16-byte"),
])
def test_bad_out_is_refused_before_any_work(bad, why):
    a, b = torch.randn(9, 13), torch.randn(13, 6)
    out = bad().fill_(7.0)
    with pytest.raises(ValueError, match=why):
        matmul(a, b, out=out, out_dtype=torch.float32)
    assert (out == 7.0).all()


def test_split_k_matches():
    cfg = dict(gemm.CONFIGS["cpu"]["decode"]["fp32"], SPLIT_K=3)
    a, b, bias = torch.randn(2, 5, 70), torch.randn(70, 33), torch.randn(5, 33)
    out = matmul(a, b, bias=bias, activation="gelu_tanh", config=cfg)
    check(out, reference_matmul(a, b, bias=bias, activation="gelu_tanh"), torch.float32)


def _prepared_for_sm90(a, b, out, cfg, *, bias=None, residual=None, activation=None):
    """The single step of ``a @ b`` into ``out`` and its launch as planned for sm_90 (in the interpreter)."""
    step = gemm._plan_views(a, b, out, bias, residual, gemm.SCALE_NONE)[0]
    return step, gemm._PreparedGemm(step, cfg, a_mode=gemm.SCALE_NONE, b_mode=gemm.SCALE_NONE,
                                    activation=activation, arch="sm_90", allow_tf32=False)


@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("schedule", [{"SPLIT_K": 2}, {"EPI_TMA": True, "FLATTEN": True}])
def test_tma_descriptor_path_in_interpreter(a_t, b_t, schedule):
    """The sm_90 tensor-descriptor branch, run by the interpreter (no allocator needed there): split-K,
    and the descriptor-store epilogue (EPI_TMA) on ragged 40x40 edges of 16x16 tiles with a residual."""
    a = maybe_transposed(torch.randn(40, 24, dtype=torch.float16), a_t)
    b = maybe_transposed(torch.randn(24, 40, dtype=torch.float16), b_t)  # 16-byte row strides
    assert gemm._tma_layout(a, 1) == (not a_t) and gemm._tma_layout(b, 0) == b_t
    out = torch.empty(40, 40, dtype=torch.float16)
    bias = torch.randn(40, dtype=torch.float16)
    residual = torch.randn(40, 40, dtype=torch.float16) if "EPI_TMA" in schedule else None
    cfg = dict(gemm.CONFIGS["cpu"]["square"]["16"], **schedule)
    step, prepared = _prepared_for_sm90(a, b, out, cfg, bias=bias, residual=residual, activation="relu")
    assert prepared.kwargs["USE_TMA"] and prepared.kwargs.get("EPI_TMA", False) == ("EPI_TMA" in schedule)
    assert prepared.kwargs.get("RES_TMA", False) == ("EPI_TMA" in schedule)  # the residual through a descriptor
    prepared(*step, None, None)
    check(out, reference_matmul(a, b, bias=bias, activation="relu", residual=residual), torch.float16)


def test_descriptor_store_needs_an_aligned_row_major_out():
    """EPI_TMA falls back to pointer stores where c cannot be a descriptor (rows not 16-byte aligned)."""
    a, b = torch.randn(8, 16, dtype=torch.float16), torch.randn(16, 16, dtype=torch.float16)[:, :9]
    cfg = dict(gemm.CONFIGS["cpu"]["square"]["16"], EPI_TMA=True)
    for out, wanted in ((torch.empty(8, 9, dtype=torch.float16), False),
                        (torch.empty(8, 16, dtype=torch.float16)[:, :9], True)):
        step, prepared = _prepared_for_sm90(a, b, out, cfg)
        assert prepared.kwargs.get("EPI_TMA", False) == wanted
        prepared(*step, None, None)
        check(out, reference_matmul(a, b), torch.float16)


@pytest.mark.parametrize("extra", [{"EPI_SPLIT": 4}, {"SPLIT_K": 2}])
def test_descriptor_store_needs_a_16_byte_piece_and_no_split_k(extra):
    """A 16-column fp16 tile in 4 epilogue pieces stores 8-byte rows, under a descriptor's 16-byte
    minimum; with split-K the reduction kernel stores the result: both take the pointer stores."""
    a, b = torch.randn(16, 48, dtype=torch.float16), torch.randn(48, 16, dtype=torch.float16)  # 3 K tiles
    out = torch.empty(16, 16, dtype=torch.float16)
    step, prepared = _prepared_for_sm90(a, b, out, dict(gemm.CONFIGS["cpu"]["square"]["16"], EPI_TMA=True, **extra))
    assert prepared.kwargs["USE_TMA"] and not prepared.kwargs.get("EPI_TMA", False)
    prepared(*step, None, None)
    check(out, reference_matmul(a, b), torch.float16)


def test_float64_never_takes_descriptors_even_with_a_tma_config():
    """Triton 3.6 cannot compile an fp64 dot fed by descriptors: a forced sm_90 config must not try."""
    a, b = torch.randn(32, 32, dtype=torch.float64), torch.randn(32, 32, dtype=torch.float64)
    out = torch.empty(32, 32, dtype=torch.float64)
    _, prepared = _prepared_for_sm90(a, b, out, dict(gemm.CONFIGS["cpu"]["square"]["16"], EPI_TMA=True))
    assert not prepared.kwargs["USE_TMA"] and prepared.kwargs["ACC_FP64"]


@pytest.mark.parametrize("epilogue", [{}, {"bias": True}, {"bias": True, "activation": "silu"}])
def test_every_epilogue_tier_falls_back_where_tma_cannot_run(epilogue):
    """A batched call cannot use descriptors: whatever tier its epilogue picks (CONFIGS' EPILOGUE /
    HEAVY), it runs the FALLBACK tile of pointer loads (the 128x256 pointer tile spills on sm_90)."""
    sq16 = gemm.CONFIGS["sm_90"]["square"]["16"]
    a, b = torch.randn(2, 256, 64, dtype=torch.bfloat16), torch.randn(2, 64, 256, dtype=torch.bfloat16)
    out = torch.empty(2, 256, 256, dtype=torch.bfloat16)
    bias = torch.randn(256, dtype=torch.bfloat16) if epilogue.get("bias") else None
    _, prepared = _prepared_for_sm90(a, b, out, sq16, bias=bias, activation=epilogue.get("activation"))
    assert not prepared.kwargs["USE_TMA"]
    fallback = sq16["FALLBACK"]
    assert (prepared.kwargs["BLOCK_M"], prepared.kwargs["BLOCK_N"]) == (fallback["BLOCK_M"], fallback["BLOCK_N"])


def _residuals(n):
    """An aligned residual, and three that cannot be descriptors: broadcast rows, a base off 16 bytes,
    rows that overlap (an unfolded view, 8 elements apart)."""
    return {"aligned": torch.randn(n, n, dtype=torch.float16),
            "broadcast": torch.randn(n, dtype=torch.float16).expand(n, n),
            "misaligned": torch.randn(n * n + 1, dtype=torch.float16)[1:].view(n, n),
            "overlapping": torch.randn(8 * n + n, dtype=torch.float16).as_strided((n, n), (8, 1))}


@pytest.mark.parametrize("kind", ["aligned", "broadcast", "misaligned", "overlapping"])
def test_sm90_epilogue_tier_follows_whether_the_residual_can_be_a_descriptor(kind):
    """On sm_90 any epilogue takes the 128x256 EPILOGUE tile when its result and residual move through
    descriptors (RES_TMA), and the 128x128 HEAVY one when the residual cannot (a pointer residual tile
    at 128x256 spills)."""
    sq16 = gemm.CONFIGS["sm_90"]["square"]["16"]
    a, b = torch.randn(256, 64, dtype=torch.float16), torch.randn(64, 256, dtype=torch.float16)
    out, bias = torch.empty(256, 256, dtype=torch.float16), torch.randn(256, dtype=torch.float16)
    _, prepared = _prepared_for_sm90(a, b, out, sq16, bias=bias, residual=_residuals(256)[kind], activation="gelu")
    tier = sq16["EPILOGUE"] if kind == "aligned" else sq16["HEAVY"]
    assert (prepared.kwargs["BLOCK_M"], prepared.kwargs["BLOCK_N"]) == (tier["BLOCK_M"], tier["BLOCK_N"])
    assert prepared.kwargs["EPI_TMA"] and prepared.kwargs.get("RES_TMA", False) == (kind == "aligned")


@pytest.mark.parametrize("kind", ["aligned", "broadcast", "misaligned", "overlapping"])
def test_residual_through_a_descriptor_or_pointers_in_interpreter(kind):
    """Both residual paths of the descriptor epilogue, run by the interpreter on ragged 48x48 edges of
    16x32 tiles split in two epilogue pieces, against the float64 reference."""
    tile = dict(gemm.CONFIGS["cpu"]["square"]["16"], BLOCK_M=16, BLOCK_N=32, EPI_SPLIT=2, EPI_TMA=True)
    cfg = dict(tile, EPILOGUE=tile, HEAVY=dict(tile, BLOCK_N=16, EPI_SPLIT=1))
    a, b = torch.randn(48, 24, dtype=torch.float16), torch.randn(24, 48, dtype=torch.float16)
    out, residual = torch.empty(48, 48, dtype=torch.float16), _residuals(48)[kind]
    step, prepared = _prepared_for_sm90(a, b, out, cfg, residual=residual, activation="silu")
    assert prepared.kwargs["EPI_TMA"] and prepared.kwargs.get("RES_TMA", False) == (kind == "aligned")
    prepared(*step, None, None)
    check(out, reference_matmul(a, b, activation="silu", residual=residual), torch.float16)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("per_row", [False, True])
def test_fp8_scales_emulated(fp8, per_row):
    a = (torch.randn(20, 48) * 2).to(fp8)
    b = (torch.randn(32, 48) * 2).to(fp8).t()  # K-major b, as torch._scaled_mm wants
    a_scale = torch.rand(20) + 0.5 if per_row else torch.tensor(0.3)
    b_scale = torch.rand(32) + 0.5 if per_row else torch.tensor(1.7)
    out = matmul(a, b, a_scale=a_scale, b_scale=b_scale, bias=torch.ones(32), out_dtype=torch.float32)
    ref = reference_matmul(a, b, a_scale=a_scale, b_scale=b_scale, bias=torch.ones(32), out_dtype=torch.float32)
    check(out, ref, torch.float32)


def test_float64_accumulates_in_float64():
    a, b = torch.randn(20, 300, dtype=torch.float64), torch.randn(300, 17, dtype=torch.float64)
    bias = torch.randn(17, dtype=torch.float64)
    out = matmul(a, b, bias=bias, activation="gelu")
    assert out.dtype == torch.float64
    assert rel_err(out, reference_matmul(a, b, bias=bias, activation="gelu")) < 1e-12
    cfg = dict(gemm.CONFIGS["cpu"]["decode"]["fp32"], SPLIT_K=2)
    assert rel_err(matmul(a, b, config=cfg), reference_matmul(a, b)) < 1e-12


def test_out_dtype_and_bad_activation():
    a, b = torch.randn(8, 8, dtype=torch.float16), torch.randn(8, 8, dtype=torch.float16)
    assert matmul(a, b, out_dtype=torch.float32).dtype == torch.float32
    with pytest.raises(ValueError):
        matmul(a, b, activation="tanh")


def test_collapse_rows_folds_batch_into_m():
    sizes, strides = gemm._collapse_rows([3, 5, 12], [[60, 12, 1], [0, 0, 0]])
    assert sizes == [180] and strides == [[1], [0]]
    sizes, strides = gemm._collapse_rows([3, 1, 12], [[12, 7, 1], [99, 5, 0]])
    assert sizes == [3, 12]


# ---------------------------------------------------------------- tuning

def test_tuning_persists_json_and_survives_corruption(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "_memory", {})
    monkeypatch.delenv("FLYARRAY_AUTOTUNE", raising=False)
    assert not tuning.enabled() and tuning.enabled(True)
    monkeypatch.setenv("FLYARRAY_AUTOTUNE", "1")
    assert tuning.enabled() and not tuning.enabled(False)
    key = tuning.make_key("gemm", "sm_90", "bfloat16", (100, 4096, 30))
    assert "128x4096x32" in key
    tuning.save("gemm", key, {"BLOCK_M": 64})
    path = tmp_path / "v1" / "tuning" / "gemm.json"
    assert json.loads(path.read_text()) == {key: {"BLOCK_M": 64}}
    monkeypatch.setattr(tuning, "_memory", {})
    assert tuning.load("gemm")[key] == {"BLOCK_M": 64}
    path.write_text("{not json")
    monkeypatch.setattr(tuning, "_memory", {})
    with pytest.warns(UserWarning, match="corrupt"):
        assert tuning.load("gemm") == {}
    tuning.save("gemm", key, {"BLOCK_M": 32})
    assert json.loads(path.read_text()) == {key: {"BLOCK_M": 32}}


def test_tune_never_runs_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "_memory", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    calls = []
    chosen = tuning.tune("gemm", "k", [{"a": 1}, {"a": 2}], calls.append, {"a": 0})
    assert chosen == {"a": 0} and calls == []
    cands = tuning.candidates_for(gemm.TUNING_CANDIDATES, "sm_90", "decode", {"x": 1})
    assert cands[0] == {"x": 1} and len(cands) > 2


# ---------------------------------------------------------------- cross-compile

@pytest.mark.parametrize("target", ["gfx950", "sm_90"])
def test_cross_compile_matrix_instructions_no_spills(target):
    from flyarray.targets import compile_for
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = [compile_for(spec, target) for spec in gemm.compile_specs(target)]
    for r in reports:
        text = " ".join(r.matrix_instructions)
        if target == "gfx950":
            assert "v_mfma" in text, (r.name, text)
            if "fp8" in r.name:
                assert "f8f6f4" in text or "fp8" in text, (r.name, text)
            assert r.shared_bytes <= 160 * 1024
        elif "decode" in r.name:
            assert "mma" in text, (r.name, text)  # 16-row tiles: mma.sync, memory bound anyway
        else:
            assert "wgmma" in text, (r.name, text)
            assert ("QGMMA" if "fp8" in r.name else "HGMMA") in text, (r.name, text)
        assert r.spills == 0, (r.name, r.spills)


# ---------------------------------------------------------------- GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@cuda
@pytest.mark.parametrize("shape", [(512, 384, 256), (16, 4096, 1024), (1000, 1000, 1000), (3, 128, 77)])
@pytest.mark.parametrize("act", [None, "silu"])
def test_gpu_bf16(shape, act):
    M, N, K = shape
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    for b in (w.t(), w.t().contiguous()):  # K-major and N-major b
        out = matmul(a, b, bias=bias, activation=act)
        check(out, reference_matmul(a, b, bias=bias, activation=act), torch.bfloat16)


@cuda
@pytest.mark.parametrize("shape", [(16, 1024, 4096), (512, 384, 256)])
def test_gpu_cached_plan_launches_directly_with_new_data(shape):
    """From the second call on, a cached plan launches through FixedLaunch (no specialization key):
    every call gets fresh operands, and each result is checked."""
    M, N, K = shape
    gemm._plans.clear()
    for _ in range(3):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        check(matmul(a, b, bias=bias, activation="silu"), reference_matmul(a, b, bias=bias, activation="silu"),
              torch.bfloat16)
    (_, prepared), = gemm._plans.values()
    assert prepared.fixed is not None and prepared.fixed[0].compiled is not None


@cuda
def test_gpu_batched_and_splitk():
    a = torch.randn(4, 2, 64, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(2, 256, 96, device="cuda", dtype=torch.float16)
    check(matmul(a, b), reference_matmul(a, b), torch.float16)
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    cfg = dict(gemm.default_config(gemm.current_arch(x.device), 8, 512, 4096, x.dtype), SPLIT_K=4)
    check(matmul(x, w, config=cfg), reference_matmul(x, w), torch.bfloat16)


@cuda
def test_gpu_fp32_is_exact_unless_tf32():
    a = torch.randn(256, 512, device="cuda")
    b = torch.randn(512, 128, device="cuda")
    assert rel_err(matmul(a, b), reference_matmul(a, b)) < 1e-5
    assert rel_err(matmul(a, b, allow_tf32=True), reference_matmul(a, b)) < 5e-3


@cuda
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("per_row", [False, True])
def test_gpu_fp8_vs_torch(fp8, per_row):
    M, N, K = 256, 512, 1024
    a = torch.randn(M, K, device="cuda").to(fp8)
    w = torch.randn(N, K, device="cuda").to(fp8)
    a_scale = (torch.rand(M, device="cuda") + 0.5) if per_row else torch.tensor(0.5, device="cuda")
    b_scale = (torch.rand(N, device="cuda") + 0.5) if per_row else torch.tensor(2.0, device="cuda")
    out = matmul(a, w.t(), a_scale=a_scale, b_scale=b_scale)
    assert out.dtype == torch.bfloat16
    check(out, reference_matmul(a, w.t(), a_scale=a_scale, b_scale=b_scale), torch.bfloat16)


@cuda
@pytest.mark.parametrize("epilogue", ["plain", "bias", "residual", "bias_residual", "gelu"])
@pytest.mark.parametrize("b_kmajor", [False, True])
def test_gpu_square_tiles_on_ragged_edges(epilogue, b_kmajor):
    """The square configs (128x256, FLATTEN + EPI_TMA on sm_90; 128x128 where the epilogue is heavy) on
    M and N that no tile divides, each epilogue, both b layouts, an M-major a."""
    M, N, K = 4100, 4104, 320
    a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16).t()
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    b = w.t() if b_kmajor else w.t().contiguous()
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if "bias" in epilogue else None
    residual = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) if "residual" in epilogue else None
    act = "gelu" if epilogue == "gelu" else None
    assert gemm.shape_class(M, N, K) == "square"
    out = matmul(a, b, bias=bias, residual=residual, activation=act)
    check(out, reference_matmul(a, b, bias=bias, residual=residual, activation=act), torch.bfloat16)
