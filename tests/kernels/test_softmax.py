"""softmax / log_softmax kernels: the interpreter on small shapes (fp32, fp16) against a float64
oracle, bf16 and long rows at real sizes on a GPU, and cross-compiles for gfx950 and sm_90."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from flyarray.kernels import softmax as K
from flyarray.targets import compile_for

CUDA = torch.cuda.is_available()
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()


def make(shape, dtype, device="cpu", seed=0, scale=3.0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, device=device, dtype=torch.float32)).to(dtype)


def check(x, log, axis=-1, **plan):
    y = K.softmax(x, axis, log, **plan)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert rel_err(y, K.reference_softmax(x, axis, log)) < TOL[x.dtype]
    return y


@settings(max_examples=15, deadline=None)
@given(
    lead=st.lists(st.integers(1, 5), min_size=0, max_size=2),
    n=st.sampled_from([1, 3, 8, 37, 64, 100]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    log=st.booleans(),
    plan=st.sampled_from([{}, {"block_n": 16}, {"block_n": 16, "num_segments": 3}, {"block_n": 8, "num_segments": 1}]),
    seed=st.integers(0, 2**16),
)
def test_forward_matches_float64(lead, n, dtype, log, plan, seed):
    """Ragged N, ranks 1-3; one block, online looped (one segment) and segmented long rows."""
    check(make((*lead, n), dtype, seed=seed), log, **plan)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("plan", [{}, {"block_n": 8}, {"block_n": 8, "num_segments": 4}, {"block_n": 8, "num_segments": 1}])
def test_one_long_row(log, plan):
    """One row, many chunks (the 1M-row case in miniature); rows that are also not multiples of the chunk."""
    check(make((77,), torch.float32), log, **plan)
    check(make((2, 70), torch.float16), log, **plan)


def test_config_override():
    check(make((9, 40), torch.float32), False, config={"BLOCK_M": 2, "num_warps": 2})
    check(make((9, 40), torch.float32), True, block_n=16, config={"num_warps": 2})


def test_segment_planner_fills_the_machine():
    """Few long rows are cut into segments of whole chunks; many rows are not."""
    dev = torch.device("cpu")
    assert K._segments(1, 1 << 20, 4096, "cpu", dev, None) == (32, 32768)  # 1 row < 2 "SMs" x 4 programs
    assert K._segments(64, 1 << 20, 4096, "cpu", dev, None)[0] == 1  # 64 rows fill 8 programs already
    assert K._segments(1, 1000, 4096, "cpu", dev, None) == (1, 4096)  # never less than a chunk
    num_seg, seg_len = K._segments(3, 1000, 16, "cpu", dev, 5)
    assert seg_len % 16 == 0 and num_seg * seg_len >= 1000 and (num_seg - 1) * seg_len < 1000


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("axis", [0, 1, -3])
def test_other_axes(axis, log):
    check(make((4, 6, 5), torch.float32), log, axis)


def test_row_stride_and_strided_last_axis():
    base = make((7, 96), torch.float32)
    check(base[:, 10:60], False)
    check(base[:, 10:60], True, block_n=16, num_segments=2)
    check(make((50, 7), torch.float32).t(), False)


@pytest.mark.parametrize("plan", [{}, {"block_n": 8}, {"block_n": 8, "num_segments": 3}])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the all -inf row divides 0 by 0 on purpose
def test_minus_infinity(plan):
    """Masked entries give exact zeros; a fully masked row gives NaN, as torch does."""
    x = make((3, 30), torch.float32)
    x[0, ::3] = -math.inf
    x[1, :25] = -math.inf  # the first chunks see only -inf
    y = check(x[:2], False, **plan)
    assert (y[0, ::3] == 0).all()
    x[2] = -math.inf
    y = K.softmax(x, **plan)
    torch.testing.assert_close(y, torch.softmax(x, -1), equal_nan=True)
    assert torch.isnan(y[2]).all()


def test_large_magnitudes_do_not_overflow():
    check(make((3, 40), torch.float32, scale=1e4), False)
    check(make((3, 40), torch.float32, scale=1e4), True, block_n=8, num_segments=2)


@pytest.mark.parametrize("plan", [{}, {"block_n": 8}, {"block_n": 8, "num_segments": 2}])
def test_log_softmax_of_large_equal_logits_keeps_the_log_of_the_count(plan):
    """(x - m) - log(s), not x - (m + log(s)): at a row max of 1e7 the sum m + log(4) rounded to m + 1 (-1.0 for
    -log 4), at 3e38 to m (0.0); the backward reuses the output."""
    x = torch.tensor([[1e7] * 20, [3e38] * 20, [-3e38] * 20])
    y = K.softmax(x, -1, True, **plan)
    torch.testing.assert_close(y, torch.full_like(x, -math.log(20)))


def grad_reference(x, dy, log, axis=-1):
    x64 = x.double().requires_grad_()
    (g,) = torch.autograd.grad((K.reference_softmax(x64, axis, log) * dy.double()).sum(), x64)
    return g


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("block_n", [None, 8])
def test_backward_kernels(log, block_n):
    x, dy = make((5, 37), torch.float32), make((5, 37), torch.float32, seed=1, scale=1.0)
    y = K.softmax(x, log=log)
    dx = K.softmax_bwd(dy, y, log, block_n=block_n)
    assert rel_err(dx, grad_reference(x, dy, log)) < 1e-5


@pytest.mark.parametrize("log", [False, True])
def test_autograd_function(log):
    x = make((3, 4, 20), torch.float32).requires_grad_()
    dy = make((3, 4, 20), torch.float32, seed=1, scale=1.0)
    (K.SoftmaxFunction.apply(x, 1, log) * dy).sum().backward()
    assert rel_err(x.grad, grad_reference(x.detach(), dy, log, 1)) < 1e-5


def test_fp16_backward():
    x, dy = make((6, 40), torch.float16), make((6, 40), torch.float16, seed=1, scale=1.0)
    dx = K.softmax_bwd(dy, K.softmax(x), False)
    assert dx.dtype == torch.float16 and rel_err(dx, grad_reference(x, dy, False)) < 5e-3


# ----------------------------------------------------------------------------- GPU (bf16, real sizes)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("m,n,dtype", [(16384, 8192, torch.bfloat16), (3000, 1000, torch.bfloat16),
                                       (64, 1 << 20, torch.float32), (2048, 32768, torch.float32),
                                       (5, 300001, torch.bfloat16)])
def test_gpu_forward(m, n, dtype, log):
    check(make((m, n), dtype, "cuda"), log)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("m,n", [(4096, 8192), (16, 65536)])
def test_gpu_bf16_backward(m, n, log):
    x, dy = make((m, n), torch.bfloat16, "cuda"), make((m, n), torch.bfloat16, "cuda", seed=1, scale=1.0)
    dx = K.softmax_bwd(dy, K.softmax(x, log=log), log)
    assert rel_err(dx, grad_reference(x, dy, log)) < 3e-2


# ----------------------------------------------------------------------------- cross-compile


@pytest.mark.parametrize("target", ["gfx950", "sm_90"])
@pytest.mark.parametrize("spec", K.compile_specs(), ids=lambda s: s.name)
def test_compiles_without_spills(spec, target):
    report = compile_for(spec, target)
    assert report.spills == 0, report.summary()
    assert report.matrix_instructions == []  # no matrix work in a softmax
    if target == "gfx950":
        assert report.shared_bytes <= 160 * 1024
