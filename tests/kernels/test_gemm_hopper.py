"""The warp-specialized Gluon GEMM for sm_90 (flyarray/kernels/gemm_hopper.py): what TMA can read
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


def test_kmajor_tells_which_way_a_tma_descriptor_reads_an_operand():
    x = torch.zeros(64, 40, dtype=torch.bfloat16)
    assert gemm_hopper.kmajor(x, 64, 40) == (True, 40)               # rows of 80 bytes
    assert gemm_hopper.kmajor(x.t(), 40, 64) == (False, 40)          # the transpose of the same
    assert gemm_hopper.kmajor(x[:, :36], 64, 36) == (True, 40)       # a column slice keeps the row stride
    assert gemm_hopper.kmajor(torch.zeros(8, 12, dtype=torch.bfloat16), 8, 12) is None  # 24-byte rows
    assert gemm_hopper.kmajor(x[:, 1:], 64, 39) is None              # base 2 bytes off 16
    assert gemm_hopper.kmajor(x[::2], 32, 40) == (True, 80)
    assert gemm_hopper.kmajor(x[:, ::2], 64, 20) is None            # neither dimension contiguous


def test_cross_compile_for_sm_90_uses_wgmma():
    """Every spec compiles for sm_90 to 64x256 HGMMA; the plain and bias/residual ones spill nothing
    (bias+gelu+residual does: see the module's DEFAULT note)."""
    from flyarray.targets import compile_for
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = [compile_for(spec, "sm_90") for spec in gemm_hopper.compile_specs("sm_90")]
    assert len(reports) == 6
    for r in reports:
        assert "HGMMA.64x256x16" in " ".join(r.matrix_instructions), r.name
        assert r.shared_bytes <= 227 * 1024, (r.name, r.shared_bytes)
        if "gelu" not in r.name:
            assert r.spills == 0, (r.name, r.spills)
    assert gemm_hopper.compile_specs("gfx950") == []


sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                          reason="needs an sm_90 GPU")


@sm90
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (200, 136, 72), (64, 8, 16), (300, 520, 4104)])
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
    out = gemm_hopper.matmul(a, b)
    assert out.shape == (M, N) and out.dtype == dtype
    assert rel_err(out, a.double() @ b.double()) <= TOL[dtype]


@sm90
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_gpu_epilogues_against_float64(act, bias, residual):
    M, N, K = 384, 264, 200
    g = torch.Generator(device="cuda").manual_seed(7)
    a, b = (torch.randn(*s, device="cuda", dtype=torch.float16, generator=g) for s in ((M, K), (N, K)))
    bias_t = torch.randn(N, device="cuda", dtype=torch.float16, generator=g) if bias else None
    res = torch.randn(M, N, device="cuda", dtype=torch.float16, generator=g) if residual else None
    out = gemm_hopper.matmul(a, b.t(), bias=bias_t, activation_code=gemm.ACTIVATIONS[act], residual=res)
    ref = gemm.reference_matmul(a.double(), b.t().double(), bias=None if bias_t is None else bias_t.double(),
                                activation=act, residual=None if res is None else res.double())
    assert rel_err(out, ref) <= TOL[torch.float16]


@sm90
def test_gpu_operands_tma_cannot_read_are_refused_before_launch():
    a = torch.randn(64, 12, device="cuda", dtype=torch.bfloat16)   # 24-byte rows
    with pytest.raises(ValueError, match="TMA"):
        gemm_hopper.matmul(a, torch.randn(12, 16, device="cuda", dtype=torch.bfloat16))
