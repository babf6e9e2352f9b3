"""RMSNorm kernels: the interpreter on small shapes (fp32, fp16) against a float64 oracle,
bf16 at real sizes on a GPU, and cross-compiles for gfx950 and sm_90."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from flyarray.kernels import rms_norm as K
from flyarray.targets import compile_for

CUDA = torch.cuda.is_available()
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()


def make(shape, dtype, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def check_forward(x, w, res, block_n=None, eps=1e-6):
    y, h, rstd = K.rms_norm_fwd(x, w, eps, res, block_n=block_n)
    ref = K.reference_rms_norm(x, w, eps, res)
    y_ref, h_ref = ref if res is not None else (ref, x.double())
    assert y.dtype == x.dtype and y.shape == x.shape
    assert rel_err(y, y_ref) < TOL[x.dtype]
    if res is not None:
        assert h.dtype == x.dtype and h.shape == x.shape
        assert rel_err(h, h_ref) < TOL[x.dtype]
    else:
        assert h is None
    assert rstd.dtype == torch.float32 and rstd.shape == x.shape[:-1]
    rstd_ref = torch.rsqrt(h_ref.pow(2).mean(-1) + eps)
    assert rel_err(rstd, rstd_ref) < 1e-5


@settings(max_examples=15, deadline=None)
@given(
    lead=st.lists(st.integers(1, 5), min_size=0, max_size=2),
    n=st.sampled_from([1, 3, 8, 37, 64, 100]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    weighted=st.booleans(),
    residual=st.booleans(),
    block_n=st.sampled_from([None, 16]),
    seed=st.integers(0, 2**16),
)
def test_forward_matches_float64(lead, n, dtype, weighted, residual, block_n, seed):
    """Ragged N, ranks 1-3, one-pass and looped (block_n=16 forces chunks for N > 16)."""
    shape = (*lead, n)
    x = make(shape, dtype, seed=seed)
    w = make((n,), dtype, seed=seed + 1) if weighted else None
    r = make(shape, dtype, seed=seed + 2) if residual else None
    check_forward(x, w, r, block_n)


@pytest.mark.parametrize("n,block_n", [(1, None), (50, None), (50, 16), (300, 64)])
def test_one_row(n, block_n):
    x = make((n,), torch.float32)
    check_forward(x, make((n,), torch.float32, seed=1), make((n,), torch.float32, seed=2), block_n)


def test_config_override():
    x, r, w = make((9, 40), torch.float32), make((9, 40), torch.float32, seed=2), make((40,), torch.float32, seed=1)
    y, h, _ = K.rms_norm_fwd(x, w, 1e-6, r, config={"BLOCK_M": 2, "num_warps": 2})
    y_ref, h_ref = K.reference_rms_norm(x, w, 1e-6, r)
    assert rel_err(y, y_ref) < 2e-6 and rel_err(h, h_ref) < 2e-6


def test_residual_sum_rounded_like_torch():
    """h is x + residual rounded to x's dtype: compare with torch's own fp16 add."""
    x, r = make((6, 40), torch.float16), make((6, 40), torch.float16, seed=3)
    _, h, _ = K.rms_norm_fwd(x, None, 1e-6, r)
    torch.testing.assert_close(h, x + r, rtol=1e-3, atol=1e-3)


def test_row_stride_is_used_without_copy():
    """A column slice keeps its row stride; a strided last axis is made contiguous."""
    base = make((7, 96), torch.float32)
    x = base[:, 10:60]
    assert not x.is_contiguous()
    w = make((50,), torch.float32, seed=1)
    check_forward(x, w, make((7, 50), torch.float32, seed=2))
    check_forward(x, w, None, block_n=16)
    xt = make((50, 7), torch.float32).t()  # last axis strided
    check_forward(xt, w, None)
    check_forward(x, make((100,), torch.float32, seed=3)[::2], None)  # a strided weight


def test_eps_and_large_scale():
    x = make((4, 33), torch.float32) * 1e3
    check_forward(x, None, None, eps=1e-2)


def grads_reference(x, w, r, dy, dh, eps):
    leaves = [t.double().requires_grad_() if t is not None else None for t in (x, w, r)]
    out = K.reference_rms_norm(*leaves[:2], eps, leaves[2])
    loss = (out[0] * dy.double()).sum() + (out[1] * dh.double()).sum() if r is not None \
        else (out * dy.double()).sum()
    wanted = [t for t in leaves if t is not None]
    return torch.autograd.grad(loss, wanted)


@pytest.mark.parametrize("block_n", [None, 16])
@pytest.mark.parametrize("weighted,residual", [(True, True), (True, False), (False, True), (False, False)])
def test_backward_matches_autograd(block_n, weighted, residual):
    shape, n, eps = (3, 4, 37), 37, 1e-6
    x = make(shape, torch.float32)
    w = make((n,), torch.float32, seed=1) if weighted else None
    r = make(shape, torch.float32, seed=2) if residual else None
    dy, dh = make(shape, torch.float32, seed=3), make(shape, torch.float32, seed=4)
    y, h, rstd = K.rms_norm_fwd(x, w, eps, r)
    dx, dw = K.rms_norm_bwd(dy, h if r is not None else x, w, rstd, dh if r is not None else None,
                            block_n=block_n, num_programs=3)
    ref = grads_reference(x, w, r, dy, dh, eps)
    assert rel_err(dx, ref[0]) < 1e-5
    if weighted:
        assert dw.dtype == w.dtype and rel_err(dw, ref[1]) < 1e-5
    else:
        assert dw is None


def test_autograd_function_all_gradients():
    """The differentiable wrapper: gradients for x, weight and residual, through y and h."""
    shape, eps = (5, 24), 1e-5
    x, r = make(shape, torch.float32).requires_grad_(), make(shape, torch.float32, seed=2).requires_grad_()
    w = make((24,), torch.float32, seed=1).requires_grad_()
    y, h = K.rms_norm(x, w, eps, r)
    dy, dh = make(shape, torch.float32, seed=3), make(shape, torch.float32, seed=4)
    ((y * dy).sum() + (h * dh).sum()).backward()
    gx, gw, gr = grads_reference(x.detach(), w.detach(), r.detach(), dy, dh, eps)
    assert rel_err(x.grad, gx) < 1e-5 and rel_err(w.grad, gw) < 1e-5 and rel_err(r.grad, gr) < 1e-5
    # only y used: the h gradient is absent, not a tensor of zeros
    x2 = x.detach().clone().requires_grad_()
    (K.rms_norm(x2, w.detach(), eps) * dy).sum().backward()
    assert rel_err(x2.grad, grads_reference(x.detach(), w.detach(), None, dy, dh, eps)[0]) < 1e-5


def test_fp16_backward():
    shape = (6, 40)
    x, w = make(shape, torch.float16), make((40,), torch.float16, seed=1)
    dy = make(shape, torch.float16, seed=3)
    _, _, rstd = K.rms_norm_fwd(x, w, 1e-6)
    dx, dw = K.rms_norm_bwd(dy, x, w, rstd)
    gx, gw = grads_reference(x, w, None, dy, None, 1e-6)
    assert dx.dtype == torch.float16 and rel_err(dx, gx) < 4e-3 and rel_err(dw, gw) < 4e-3


@pytest.mark.parametrize("block_n", [None, 16])
def test_dweight_is_deterministic(block_n):
    shape = (29, 40)
    x, w, dy = make(shape, torch.float32), make((40,), torch.float32, seed=1), make(shape, torch.float32, seed=2)
    _, _, rstd = K.rms_norm_fwd(x, w)
    runs = [K.rms_norm_bwd(dy, x, w, rstd, block_n=block_n, num_programs=4)[1] for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


# ----------------------------------------------------------------------------- GPU (bf16, real sizes)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("m,n", [(32768, 4096), (4096, 8192), (3000, 1000), (64, 65536)])
def test_gpu_bf16_forward(m, n):
    x, r = make((m, n), torch.bfloat16, "cuda"), make((m, n), torch.bfloat16, "cuda", seed=2)
    w = make((n,), torch.bfloat16, "cuda", seed=1)
    check_forward(x, w, r)
    check_forward(x, w, None)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("m,n", [(8192, 4096), (64, 65536)])
def test_gpu_bf16_backward_deterministic(m, n):
    x, r = make((m, n), torch.bfloat16, "cuda"), make((m, n), torch.bfloat16, "cuda", seed=2)
    w = make((n,), torch.bfloat16, "cuda", seed=1)
    dy, dh = make((m, n), torch.bfloat16, "cuda", seed=3), make((m, n), torch.bfloat16, "cuda", seed=4)
    _, h, rstd = K.rms_norm_fwd(x, w, 1e-6, r)
    dx, dw = K.rms_norm_bwd(dy, h, w, rstd, dh)
    dx2, dw2 = K.rms_norm_bwd(dy, h, w, rstd, dh)
    assert torch.equal(dw, dw2) and torch.equal(dx, dx2)
    gx, gw, _ = grads_reference(x, w, r, dy, dh, 1e-6)
    assert rel_err(dx, gx) < TOL[torch.bfloat16] and rel_err(dw, gw) < TOL[torch.bfloat16]


# ----------------------------------------------------------------------------- cross-compile


@pytest.mark.parametrize("target", ["gfx950", "sm_90"])
@pytest.mark.parametrize("spec", K.compile_specs(), ids=lambda s: s.name)
def test_compiles_without_spills(spec, target):
    report = compile_for(spec, target)
    assert report.spills == 0, report.summary()
    assert report.matrix_instructions == []  # a normalization does no matrix work
    if target == "gfx950":
        assert report.shared_bytes <= 160 * 1024
