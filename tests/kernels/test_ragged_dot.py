"""ragged_dot: interpreter tests against a float64 reference, GPU tests, cross-compiles."""
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import flyarray.kernels.gemm as gemm
import flyarray.kernels.ragged_dot as rd
from flyarray.kernels.ragged_dot import ragged_dot, reference_ragged_dot

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(lhs, rhs, sizes, dtype, **kw):
    group_sizes = torch.tensor(sizes, dtype=kw.pop("index_dtype", torch.int32), device=lhs.device)
    out = ragged_dot(lhs, rhs, group_sizes, **kw)
    ref = reference_ragged_dot(lhs, rhs, group_sizes, **kw)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert rel_err(out, ref) <= TOL[dtype], rel_err(out, ref)
    used = min(sum(sizes), lhs.shape[0])
    assert (out[used:] == 0).all(), "rows past sum(group_sizes) must be zero"
    return out


@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.integers(0, 20), min_size=1, max_size=6), extra=st.integers(0, 9),
       K=st.integers(1, 40), N=st.integers(1, 40), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       seed=st.integers(0, 2**16))
def test_random_groups(sizes, extra, K, N, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    m = sum(sizes) + extra  # sum < m: the tail rows must come out zero
    if m == 0:
        m = 1
    lhs = torch.randn(m, K, generator=g).to(dtype)
    rhs = torch.randn(len(sizes), K, N, generator=g).to(dtype)
    check(lhs, rhs, sizes, dtype)


@pytest.mark.parametrize("sizes", [[0, 0, 0], [1, 1, 1, 1], [0, 13, 0, 1, 0], [30], [0, 0, 30, 0]])
def test_empty_and_single_row_groups(sizes):
    lhs, rhs = torch.randn(30, 19), torch.randn(len(sizes), 19, 21)
    check(lhs, rhs, sizes, torch.float32)


def test_int64_group_sizes_fp16_and_strided_operands():
    lhs = torch.randn(24, 40, dtype=torch.float16).t().contiguous().t()  # column-major lhs
    rhs = torch.randn(3, 33, 40, dtype=torch.float16).transpose(1, 2)  # K-major rhs
    check(lhs, rhs, [5, 11, 6], torch.float16, index_dtype=torch.int64)


def test_fp8_emulated():
    lhs = torch.randn(20, 32).to(torch.float8_e4m3fn)
    rhs = torch.randn(3, 32, 24).to(torch.float8_e4m3fn)
    check(lhs, rhs, [4, 9, 2], torch.float32, out_dtype=torch.float32)


def test_no_groups_gives_zeros():
    out = ragged_dot(torch.randn(5, 4), torch.randn(0, 4, 3), torch.zeros(0, dtype=torch.int32))
    assert out.shape == (5, 3) and (out == 0).all()


def test_tma_descriptor_path_in_interpreter(monkeypatch):
    pass  # the interpreter needs no scratch allocator; setting one (per thread) is harmless
    lhs, rhs = torch.randn(40, 24, dtype=torch.float16), torch.randn(4, 24, 40, dtype=torch.float16)
    assert rd._tma_ok(lhs, rhs)
    sizes = torch.tensor([7, 0, 20, 5])
    out = torch.full((40, 40), float("nan"), dtype=torch.float16)
    rd.launch_ragged_dot(lhs, rhs, sizes, out, rd.CONFIGS["cpu"]["16"], "sm_90")
    ref = reference_ragged_dot(lhs, rhs, sizes)
    assert rel_err(out, ref) <= TOL[torch.float16] and (out[32:] == 0).all()


@pytest.mark.parametrize("target", ["gfx950", "sm_90"])
def test_cross_compile_matrix_instructions_no_spills(target):
    from flyarray.targets import compile_for
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = [compile_for(spec, target) for spec in rd.compile_specs(target)]
    for r in reports:
        text = " ".join(r.matrix_instructions)
        if target == "gfx950":
            assert "v_mfma" in text, (r.name, text)
            assert r.shared_bytes <= 160 * 1024
        else:
            assert "wgmma" in text and ("QGMMA" if "fp8" in r.name else "HGMMA") in text, (r.name, text)
        assert r.spills == 0, (r.name, r.spills)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def random_group_sizes(total_rows, groups, generator=None, device="cuda"):
    """Uneven sizes that add up to total_rows (some groups empty)."""
    weights = torch.rand(groups, generator=generator) ** 2
    sizes = (weights / weights.sum() * total_rows).floor().long()
    sizes[0] += total_rows - sizes.sum()
    return sizes.to(device=device, dtype=torch.int32)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_moe_shape(dtype):
    g = torch.Generator().manual_seed(0)
    sizes = random_group_sizes(1000, 8, g)
    lhs = torch.randn(1100, 512, device="cuda", dtype=dtype)
    rhs = torch.randn(8, 512, 384, device="cuda", dtype=dtype)
    out = ragged_dot(lhs, rhs, sizes)
    ref = reference_ragged_dot(lhs, rhs, sizes)
    assert rel_err(out, ref) <= TOL[torch.bfloat16] and (out[1000:] == 0).all()


@cuda
def test_gpu_fp8_and_no_host_sync():
    lhs = torch.randn(300, 256, device="cuda").to(torch.float8_e4m3fn)
    rhs = torch.randn(4, 256, 128, device="cuda").to(torch.float8_e4m3fn)
    sizes = torch.tensor([100, 0, 150, 30], device="cuda", dtype=torch.int32)
    ragged_dot(lhs, rhs, sizes)  # compile first
    torch.cuda.set_sync_debug_mode("error")  # a device->host read of group_sizes would raise
    try:
        out = ragged_dot(lhs, rhs, sizes)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = reference_ragged_dot(lhs, rhs, sizes)
    assert rel_err(out, ref) <= TOL[torch.bfloat16]
