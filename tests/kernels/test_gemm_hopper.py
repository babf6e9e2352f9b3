"""The warp-specialized Gluon GEMM for sm_90 (flyarray/kernels/gemm_hopper.py): which problems it takes
(CPU), cross-compiles for sm_90 (CPU: the matrix instructions and spills), results against a float64
product in every operand orientation and epilogue (sm_90 GPU only: Triton's interpreter does not run
Gluon)."""
import warnings

import pytest
import torch

from flyarray.kernels import gemm, gemm_hopper

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _step(a, b, bias=None, res=None, out_dtype=None):
    out = torch.empty(*a.shape[:-1], b.shape[-1], dtype=out_dtype or a.dtype)
    (step,) = gemm._plan_views(a, b, out, bias, res, 0)
    return step


def test_the_warp_specialized_kernel_takes_what_tma_reads_and_nothing_else():
    """gemm._ws_fits (CPU tensors: it looks at strides, dtypes and alignment only)."""
    x, w = torch.zeros(64, 40, dtype=torch.bfloat16), torch.zeros(24, 40, dtype=torch.bfloat16)
    fits = lambda step, arch="sm_90", scaled=0: gemm._ws_fits(step, arch, scaled, 0)
    assert fits(_step(x, w.t())) and fits(_step(x.t().contiguous().t(), w.t().contiguous()))
    bias, res = torch.zeros(24, dtype=torch.bfloat16), torch.zeros(64, 24, dtype=torch.bfloat16)
    assert fits(_step(x, w.t(), bias=bias, res=res))
    assert not fits(_step(x, w.t()), arch="gfx950")
    assert not fits(_step(x, w.t()), scaled=1)
    assert not fits(_step(x.float(), w.t().float()))                       # fp32: the Triton kernel
    assert not fits(_step(x, w.t(), out_dtype=torch.float32))              # the result in another dtype
    assert not fits(_step(x[:, 1:], w[:, 1:].t()))                         # a base 2 bytes off 16
    assert not fits(_step(x[:, :36], torch.zeros(36, 12, dtype=torch.bfloat16)))  # 24-byte rows of b
    assert not fits(_step(x, w.t(), bias=torch.zeros(64, 24, dtype=torch.bfloat16)))  # a bias per element
    assert not fits(_step(x, w.t(), res=torch.zeros(24, 64, dtype=torch.bfloat16).t()))  # column-major residual
    x2 = torch.zeros(2, 64, 40, dtype=torch.bfloat16)
    assert fits(_step(x2, w.t().expand(2, 40, 24)))                        # one b: the batch folds into M
    assert not fits(_step(x2, torch.zeros(2, 40, 24, dtype=torch.bfloat16)))  # a b per batch element


def test_cross_compile_for_sm_90_uses_wgmma():
    """Every spec compiles for sm_90 to 64x256 HGMMA; all but bias+gelu+residual spill nothing (that one does:
    see the module's DEFAULT note; gemm.WS_SPILLING keeps it on the Triton kernel). bias+gelu applies gelu by
    column halves: the whole tile at once spilled 265 bytes."""
    from flyarray.targets import compile_for
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = [compile_for(spec, "sm_90") for spec in gemm_hopper.compile_specs("sm_90")]
    assert len(reports) == 7
    for r in reports:
        assert "HGMMA.64x256x16" in " ".join(r.matrix_instructions), r.name
        assert r.shared_bytes <= 227 * 1024, (r.name, r.shared_bytes)
        if not r.name.endswith("gelu_residual"):
            assert r.spills == 0, (r.name, r.spills)


def test_exact_gelu_takes_the_warp_specialized_kernel_unless_a_residual_is_added(monkeypatch):
    """WS_GELU_BY_HALVES (off: correct but slower than the Triton GEMM, twenty-ninth session)."""
    monkeypatch.setattr(gemm, "WS_GELU_BY_HALVES", True)
    monkeypatch.setattr(gemm, "_PreparedWs", lambda step, cfg, activation: "ws")
    monkeypatch.setattr(gemm, "_PreparedGemm", lambda step, cfg, **kw: "triton")
    monkeypatch.setattr(gemm, "_ws_fits", lambda *args: True)
    x, w = torch.zeros(256, 64, dtype=torch.float16), torch.zeros(64, 256, dtype=torch.float16)
    bias, res = torch.zeros(256, dtype=torch.float16), torch.zeros(256, 256, dtype=torch.float16)
    choose = lambda step, act: gemm._prepare(step, WS_CONFIG, a_mode=0, b_mode=0, activation=act, arch="sm_90",
                                             allow_tf32=False)
    assert choose(_step(x, w, bias=bias), "gelu") == "ws"
    assert choose(_step(x, w, bias=bias, res=res), "gelu") == "triton"
    assert choose(_step(x, w, bias=bias, res=res), "silu") == "ws"
    monkeypatch.setattr(gemm, "WS_GELU_BY_HALVES", False)
    assert choose(_step(x, w, bias=bias), "gelu") == "triton"
    assert gemm_hopper.compile_specs("gfx950") == []


WS_CONFIG = dict(gemm.CONFIGS["sm_90"]["square"]["16"], WS={})
sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                          reason="needs an sm_90 GPU")


@sm90
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (200, 136, 72), (64, 8, 16), (304, 520, 4104)])
@pytest.mark.parametrize("a_kmajor", [True, False])
@pytest.mark.parametrize("b_kmajor", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_every_orientation_against_float64(shape, a_kmajor, b_kmajor, dtype):
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=dtype, generator=g)
    a = a if a_kmajor else a.t().contiguous().t()
    b = b.t().contiguous().t() if b_kmajor else b
    assert gemm._ws_fits(_step(a, b), "sm_90", 0, 0)
    out = gemm.matmul(a, b, config=WS_CONFIG)
    assert out.shape == (M, N) and out.dtype == dtype
    assert rel_err(out, a.double() @ b.double()) <= TOL[dtype]


@sm90
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_gpu_epilogues_against_float64(act, bias, residual, monkeypatch):
    monkeypatch.setattr(gemm, "WS_GELU_BY_HALVES", True)   # checked here though it is off by default (slower)
    M, N, K = 384, 264, 200
    g = torch.Generator(device="cuda").manual_seed(7)
    a, b = (torch.randn(*s, device="cuda", dtype=torch.float16, generator=g) for s in ((M, K), (N, K)))
    bias_t = torch.randn(N, device="cuda", dtype=torch.float16, generator=g) if bias else None
    res = torch.randn(M, N, device="cuda", dtype=torch.float16, generator=g) if residual else None
    out = gemm.matmul(a, b.t(), bias=bias_t, activation=act, residual=res, config=WS_CONFIG)
    ref = gemm.reference_matmul(a.double(), b.t().double(), bias=None if bias_t is None else bias_t.double(),
                                activation=act, residual=None if res is None else res.double())
    assert rel_err(out, ref) <= TOL[torch.float16]


@sm90
def test_gpu_a_kept_plan_relaunches_with_new_data(monkeypatch):
    """With WS in the default config, the second call of a signature takes matmul's kept plan
    (FixedLaunch's direct path) and still reads the new operands."""
    monkeypatch.setitem(gemm.CONFIGS["sm_90"]["square"], "16", WS_CONFIG)
    monkeypatch.setitem(gemm.CONFIGS["sm_90"]["tall"], "16", WS_CONFIG)  # 512x384 is a "tall" problem
    monkeypatch.setattr(gemm, "_plans", {})
    g = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(3):
        a, b = (torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g) for s in ((512, 256), (256, 384)))
        assert rel_err(gemm.matmul(a, b, tune=False), a.double() @ b.double()) <= 1.5e-2
    assert isinstance(next(iter(gemm._plans.values()))[1], gemm._PreparedWs)
