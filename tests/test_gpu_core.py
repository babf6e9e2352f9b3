"""The core on a real GPU: generated kernels compiled by Triton, checked against torch (bf16 included)."""
import pytest
import torch

import flyarray as fa

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.fixture(autouse=True)
def gpu_backend():
    fa.set_backend("gpu")
    yield
    fa.set_backend(None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_elementwise_chain_is_one_kernel(dtype):
    x = torch.randn(1000, 333, device="cuda", dtype=dtype)
    b = torch.randn(333, device="cuda", dtype=dtype)
    fa.reset_stats()
    y = fa.silu(fa.asarray(x)) * fa.asarray(b) + 0.5 * fa.asarray(x) - 1.0
    out = torch.from_dlpack(y)
    assert fa.stats()["kernels_launched"] == 1
    ref = torch.nn.functional.silu(x.float()) * b.float() + 0.5 * x.float() - 1.0
    assert _rel(out, ref) < (1e-2 if dtype != torch.float32 else 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_negation_keeps_the_sign_of_zero(dtype):
    """-(+0.0) is -0.0 (Triton 3.6 compiles a float's -x as 0 - x, which gives +0.0); a NaN stays NaN (with its
    sign flipped, as on the CPU; torch's CUDA negation leaves a NaN's sign alone, so that is not compared)."""
    x = torch.tensor([0.0, -0.0, 1.5, float("inf"), float("nan")], device="cuda", dtype=dtype)
    got = torch.from_dlpack(-fa.asarray(x))
    assert torch.equal(torch.signbit(got[:4]), torch.signbit(-x[:4])) and torch.isnan(got[4])


@pytest.mark.parametrize("shape", [(64, 1000), (256, 20000), (3, 5, 17)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_rms_norm_match_torch(shape, dtype):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype)
    fa.reset_stats()
    s = torch.from_dlpack(fa.nn.softmax(fa.asarray(x)))
    assert fa.stats()["kernels_launched"] == 1
    assert _rel(s, torch.softmax(x.float(), -1)) < 1e-2
    r = torch.from_dlpack(fa.nn.rms_norm(fa.asarray(x).astype(fa.float32)) * fa.asarray(w))
    ref = torch.nn.functional.rms_norm(x.float(), (shape[-1],), eps=1e-6) * w.float()
    assert _rel(r, ref) < 1e-2


def test_reductions_and_argmax_on_gpu():
    torch.manual_seed(0)
    x = torch.randn(37, 129, 5, device="cuda")
    for axis in [None, 0, 1, 2, (0, 2), (1, 2)]:
        got = torch.from_dlpack(fa.sum(fa.asarray(x), axis=axis)).double()
        dims = axis if axis is not None else (0, 1, 2)
        want = x.double().sum(dim=dims)
        # a sum's error scales with the sum of magnitudes, not with the (cancelling) result: at most
        # (chunks + log2(block)) * eps = (6 + 12) * 6e-8 ~ 1.1e-6 of it for these sizes
        scale = x.double().abs().sum(dim=dims)
        assert ((got - want).abs() / scale).max() < 2e-6
    a = torch.from_dlpack(fa.argmax(fa.asarray(x), axis=1))
    assert torch.equal(a, x.argmax(1))


def test_zero_copy_round_trip_on_gpu():
    t = torch.randn(100, 7, device="cuda")
    x = fa.asarray(t)
    assert torch.from_dlpack(x).data_ptr() == t.data_ptr()
    y = fa.exp(x)
    out1, out2 = torch.from_dlpack(y), torch.from_dlpack(y)
    assert out1.data_ptr() == out2.data_ptr()


def test_jit_replays_on_gpu():
    f = fa.jit(lambda a, b: fa.nn.softmax(a * b))
    x, y = torch.randn(64, 512, device="cuda"), torch.randn(64, 512, device="cuda")
    first = torch.from_dlpack(f(x, y))
    fa.reset_stats()
    second = torch.from_dlpack(f(x, y))
    assert fa.stats()["kernels_compiled"] == 0 and fa.stats()["kernels_launched"] == 1
    assert torch.allclose(first, second)
    assert torch.allclose(second, torch.softmax(x * y, -1), atol=1e-6)


def test_concat_and_views_on_gpu():
    a, b = torch.randn(4, 5, device="cuda"), torch.randn(4, 3, device="cuda")
    c = torch.from_dlpack(fa.concat([fa.asarray(a), fa.asarray(b) * 2], axis=1))
    assert torch.allclose(c, torch.cat([a, b * 2], 1))
    v = torch.from_dlpack(fa.exp(fa.asarray(a).T[::-1, 1:]))
    assert torch.allclose(v, a.T.flip(0)[:, 1:].exp())


# ---- differential: random programs on the gpu backend against the reference backend ------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_UNARY = ["exp", "abs", "negative", "sqrt", "sin", "tanh", "floor", "square", "sigmoid", "log1p", "silu"]
_BINARY = ["add", "subtract", "multiply", "maximum", "minimum", "divide"]
_REDUCE = ["sum", "max", "min", "mean", "argmax", "prod", "var"]


def _program(draw_ops, x, y):
    for kind, name, arg in draw_ops:
        if kind == "u":
            x = getattr(fa, name)(fa.abs(x) if name in ("sqrt", "log1p") else x)
        elif kind == "b":
            x = getattr(fa, name)(x, y if name != "divide" else fa.abs(y) + 1.0)
        else:
            x = getattr(fa, name)(x, axis=arg, keepdims=True).astype(fa.float32)
            x = x * 0.5 + y
    return x


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_random_programs_match_the_reference(data):
    nd = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 300), min_size=nd, max_size=nd)))
    ops = []
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["u", "b", "r"]))
        name = data.draw(st.sampled_from({"u": _UNARY, "b": _BINARY, "r": _REDUCE}[kind]))
        ops.append((kind, name, data.draw(st.integers(-nd, nd - 1)) if kind == "r" else None))
    transpose = data.draw(st.booleans()) and nd >= 2
    x = torch.randn(shape) * 0.5
    y = torch.randn(shape) * 0.5
    results = {}
    for backend, device in (("reference", "cpu"), ("gpu", "cuda")):
        fa.set_backend(backend)
        xt, yt = x.to(device), y.to(device)
        if transpose:
            xt = xt.mT.contiguous().mT  # same values, transposed strides
        results[backend] = torch.from_dlpack(_program(ops, fa.asarray(xt), fa.asarray(yt))).cpu().double()
    want, got = results["reference"], results["gpu"]
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3, equal_nan=True)


# ---- other DLPack producers on the GPU: the same memory in and out ----------------------------------------
def test_cupy_round_trip_is_zero_copy():
    cupy = pytest.importorskip("cupy")
    c = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
    x = fa.asarray(c)
    t = torch.from_dlpack(x)
    assert t.data_ptr() == c.data.ptr
    back = cupy.from_dlpack(fa.exp(x))
    assert cupy.allclose(back, cupy.exp(c))


def test_jax_round_trip_is_zero_copy():
    import os
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU to torch
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax sees no GPU")
    j = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    x = fa.from_dlpack(j)
    assert torch.from_dlpack(x).data_ptr() == j.unsafe_buffer_pointer()
    y = jnp.from_dlpack(fa.sqrt(x))
    assert jnp.allclose(y, jnp.sqrt(j))


# ---- the plan stage on the GPU: direct launches bound with new buffers and scalars -------------------
def test_plan_hits_launch_directly_with_new_scalars_and_buffers():
    x = torch.randn(4097, device="cuda")
    results = []
    for scale, shift in [(0.5, 1.0), (0.7, -2.0), (-0.0, 0.0), (3.0, 2.5)]:
        fa.reset_stats()
        x = torch.randn(4097, device="cuda")
        out = torch.from_dlpack(fa.asarray(x) * scale + shift)
        results.append(fa.stats())
        torch.testing.assert_close(out, x * scale + shift)
    assert all(s["plan_hits"] == 1 and s["kernels_compiled"] == 0 for s in results[1:]), results


def test_signed_zero_and_wide_scalars_on_gpu():
    x = fa.asarray(torch.ones(8, device="cuda"))
    assert torch.isnan(torch.from_dlpack(1.0 / (x * 0.0) + 1.0 / (x * -0.0))).all()
    i = torch.arange(8, device="cuda", dtype=torch.int64)
    for v in (1, 2 ** 40, 16, -3):
        assert torch.equal(torch.from_dlpack(fa.asarray(i) + v), i + v)
    d = torch.zeros(8, device="cuda", dtype=torch.float64)
    for v in (0.0, 1e-300, 0.1):
        assert torch.equal(torch.from_dlpack(fa.asarray(d) + v), d + v)


def test_rms_norm_residual_one_kernel_on_gpu():
    x, r = (torch.randn(64, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    fa.reset_stats()
    y, h = fa.nn.rms_norm(fa.asarray(x), fa.asarray(w), 1e-6, residual=fa.asarray(r))
    ty, th = torch.from_dlpack(y), torch.from_dlpack(h)
    assert fa.stats()["kernels_launched"] == 1
    hf = (x + r).float()
    assert _rel(ty, hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()) < 1e-2
    assert _rel(th, hf) < 1e-2


def test_jit_replay_on_gpu_with_new_inputs_and_views():
    @fa.jit
    def f(a, b):
        h = fa.exp(a) * b + 1.0
        return h, h.T, fa.sum(h, axis=0)

    for _ in range(3):
        a, b = torch.randn(33, 65, device="cuda"), torch.randn(33, 65, device="cuda")
        h, ht, s = f(a, b)
        want = a.exp() * b + 1
        torch.testing.assert_close(torch.from_dlpack(h), want)
        torch.testing.assert_close(torch.from_dlpack(ht), want.T)
        torch.testing.assert_close(torch.from_dlpack(s), want.sum(0), rtol=1e-5, atol=1e-4)


def test_plan_check_mode_on_gpu(monkeypatch):
    monkeypatch.setenv("FLYARRAY_PLAN_CHECK", "1")
    fa.clear_caches()
    try:
        for _ in range(3):
            x = torch.randn(128, 300, device="cuda")
            torch.testing.assert_close(torch.from_dlpack(fa.nn.softmax(fa.asarray(x) * 2.0)), torch.softmax(x * 2, -1))
    finally:
        monkeypatch.delenv("FLYARRAY_PLAN_CHECK")
        fa.clear_caches()


def test_library_kernels_relaunch_directly_with_other_alignments_and_sizes():
    """kernels/_triton.DirectLaunch reuses a CompiledKernel only for the same specialization: an
    unaligned slice, a size of 1 and other sizes after a first launch still give right answers."""
    base = torch.randn(64 * 4096 + 8, device="cuda")
    for offset, rows, n in [(0, 64, 4096), (0, 64, 4096), (1, 64, 4096), (3, 1, 4096), (0, 17, 999), (0, 64, 4096)]:
        x = base[offset:offset + rows * n].view(rows, n)
        vals, idx = fa.top_k(fa.asarray(x), 8)
        want = torch.topk(x, 8)
        torch.testing.assert_close(torch.from_dlpack(vals), want.values)
    a = torch.randn(33, 64, device="cuda", dtype=torch.bfloat16)
    for m in (33, 1, 16, 33):
        out = torch.from_dlpack(fa.asarray(a[:m]) @ fa.asarray(a.T.contiguous()))
        assert _rel(out, a[:m].float() @ a.T.float()) < 1e-2


def test_random_bits_on_gpu_match_the_reference_backend():
    fa.set_backend(None)  # CPU arrays take the reference backend, CUDA ones the gpu backend
    cpu_key = fa.random.key(7, device="cpu")
    want = fa.random.bits(cpu_key, (1000,)).torch()
    wantu = fa.random.uniform(cpu_key, (1000,)).torch()
    key = fa.random.key(7, device="cuda")
    got = fa.random.bits(key, (1000,)).torch()
    assert torch.equal(got.cpu(), want)
    x = torch.ones(1000, device="cuda")
    fa.reset_stats()
    dropped = (fa.asarray(x) * (fa.random.uniform(key, (1000,)) > 0.5)).torch()
    assert fa.stats()["kernels_launched"] == 1
    assert torch.equal(dropped.cpu(), (wantu > 0.5).float())


def test_grad_on_gpu_matches_torch():
    x = torch.randn(257, device="cuda", requires_grad=True)
    torch.sum(torch.exp(torch.sin(x) * 2 + 1) * x).backward()
    g = fa.grad(lambda a: fa.sum(fa.exp(fa.sin(a) * 2 + 1) * a))(fa.asarray(x.detach()))
    assert _rel(g.torch(), x.grad) < 1e-5


def test_big_full_reductions_split_in_two_stages_on_gpu():
    """ops/core._split_full_reduction: rows of a (S, N/S) view, then the partials (not yet run on a GPU
    when written: this test is the first check there)."""
    x = torch.randn(1 << 24, device="cuda", dtype=torch.bfloat16)
    fa.reset_stats()
    got = fa.sum(fa.asarray(x).astype(fa.float32)).torch()
    assert fa.stats()["kernels_launched"] == 2
    want = x.double().sum()
    assert abs(got.double() - want) <= 1e-3 * x.double().abs().sum()
    m = fa.max(fa.asarray(x)).torch()
    assert m == x.max()
    loss = fa.mean((fa.asarray(x).astype(fa.float32) - 0.5) ** 2).torch()
    torch.testing.assert_close(loss, ((x.float() - 0.5) ** 2).mean(), rtol=1e-4, atol=1e-5)


def test_column_reductions_on_gpu():
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    got = fa.sum(fa.asarray(x).astype(fa.float32), axis=0).torch()
    assert _rel(got, x.float().sum(0)) < 1e-5
    assert torch.equal(fa.argmax(fa.asarray(x), axis=0).torch(), x.argmax(0))


def test_gemm_on_a_thread_of_its_own():
    """Triton keeps its scratch allocator (for TMA descriptors) per thread; autograd's backward runs
    GEMMs on a thread of its own, which must get one too (it raised 'no allocator was set')."""
    import threading
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    want = (a.float() @ b.float())
    out, errors = [], []

    def work():
        try:
            out.append(torch.from_dlpack(fa.asarray(a) @ fa.asarray(b)))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, errors
    assert _rel(out[0], want) < 1e-2


def test_logaddexp_near_zero_and_half_precision_nextafter():
    """The twenty-first session's codegen fixes on the GPU backend: logaddexp through libdevice's log1p,
    fp16/bf16 nextafter compared in fp32, a bf16 reduction rounded where it is recomputed."""
    a = torch.tensor([0.0, 0.0, -1e-3], device="cuda")
    b = torch.tensor([-20.0, -40.0, -100.0], device="cuda")
    got = torch.from_dlpack(fa.logaddexp(fa.asarray(a), fa.asarray(b)))
    torch.testing.assert_close(got, torch.logaddexp(a.double(), b.double()).float(), rtol=1e-5, atol=0)
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.tensor([-0.0, 1.0, 2.5, 100.0, float("inf")], device="cuda", dtype=dtype)
        for toward in (2.0, -1.0):
            y = torch.full_like(x, toward)
            want = torch.nextafter(x.cpu(), y.cpu()).cuda()   # the CPU kernel takes fp16/bf16
            assert torch.equal(torch.from_dlpack(fa.nextafter(fa.asarray(x), fa.asarray(y))), want)
    x = fa.asarray(torch.tensor([[3.0, 4.5], [-2.0, -2.0]], device="cuda", dtype=torch.bfloat16))
    y = fa.nn.softmax(fa.prod(fa.exp(x), axis=-1), axis=-1)
    assert torch.from_dlpack(y).float().tolist() == [1.0, 0.0]


def test_arrays_made_on_cuda_and_from_cuda_tensors_share_one_device():
    """torch.device("cuda") != torch.device("cuda:0"): creation names the current device as tensors do, so
    fa.ones(3) meets a tensor's array, and Python data and numpy operands follow."""
    t = torch.arange(3.0, device="cuda")
    made = [fa.ones(3), fa.ones(3, device="cuda"), fa.asarray([1.0, 2.0, 3.0]), fa.asarray(2.0), fa.random.key(0)]
    assert {a.device for a in made} == {t.device} == {fa.__array_namespace_info__().default_device()}
    got = (fa.ones(3) + fa.asarray(t) + fa.asarray([1.0, 1.0, 1.0], device="cuda")) * t.cpu().numpy()
    assert torch.equal(torch.from_dlpack(got), (t + 2) * t)
    absent = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match=f"set_default_device: '{absent}'.*sees {torch.cuda.device_count()} GPU"):
        fa.set_default_device(absent)


def test_gpu_float8_casts_to_and_from_integers_and_bool_compile():
    """The generated kernel casts float8 through float32 (Triton's sm_90 build refused `fp8.to(tl.int32)`)."""
    for t8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        values = torch.tensor([-0.0, 0.0, 1.0, -3.0, 7.5], device="cuda")
        x = fa.asarray(values.to(t8))
        assert torch.equal(x.astype(fa.int32).torch(), values.to(t8).to(torch.int32))
        assert torch.from_dlpack(x.astype(fa.bool)).tolist() == [False, False, True, True, True]
        ints = torch.tensor([0, 2, 7], device="cuda", dtype=torch.int16)
        assert torch.equal(fa.asarray(ints).astype(fa.dtypes.from_torch(t8)).torch().float(), ints.to(t8).float())
        assert fa.eye(2, dtype=fa.dtypes.from_torch(t8), device="cuda").torch().float().tolist() == [[1, 0], [0, 1]]


def _ulps(got, want, mantissa_bits):
    """|got - want| in units in the last place of ``want`` (float64 truth), normal range."""
    exponent = torch.floor(torch.log2(want.abs())).clamp(min=-126 if mantissa_bits == 24 else -1022)
    return ((got.double() - want) / torch.exp2(exponent - mantissa_bits + 1)).abs()


def test_exp_sigmoid_rsqrt_are_as_accurate_as_torch_on_gpu():
    """tl.exp is 2**(x * log2 e) on the approximate ex2 for float32 (~60 ulp at |x| ~ 85), tl.rsqrt is rsqrt.approx
    (float32 subnormals flushed, float64 unrefined): the kernels use libdevice's exp and 1 / sqrt instead."""
    x = torch.empty(1 << 20, device="cuda").uniform_(-100, 88.7)
    truth = torch.exp(x.double())
    normal = truth > 1.2e-38
    assert _ulps(fa.exp(fa.asarray(x)).torch(), truth, 24)[normal].max().item() <= 2
    s_truth = torch.sigmoid(x.double())
    s_normal = s_truth > 1.2e-38
    # 1 / (1 + e^-x): libdevice's expf (<= 2 ulp) then the add's and the division's roundings, counted in ulps of
    # the true value (just below a power of two that doubles them): 3.19 on the H100 (thirty-second session)
    assert _ulps(fa.sigmoid(fa.asarray(x)).torch(), s_truth, 24)[s_normal].max().item() <= 3.5
    for dtype, bits in ((torch.float32, 24), (torch.float64, 53)):
        y = torch.exp2(torch.empty(1 << 16, device="cuda", dtype=torch.float64).uniform_(-120, 120)).to(dtype)
        assert _ulps(fa.rsqrt(fa.asarray(y)).torch(), 1 / torch.sqrt(y.double()), bits).max().item() <= 1.5
    tiny = torch.full((8,), 1e-40, device="cuda")
    assert torch.equal(fa.rsqrt(fa.asarray(tiny)).torch(), 1 / torch.sqrt(tiny.double()).float())


def test_gelu_tails_are_accurate_on_gpu():
    x = torch.linspace(-12, 4, 4096, device="cuda")
    for approximate, truth in (("none", 0.5 * x.double() * torch.erfc(-x.double() / 2 ** 0.5)),
                               ("tanh", x.double() * torch.sigmoid(1.5957691216057308 * (x.double() + 0.044715 * x.double() ** 3)))):
        got = fa.nn.gelu(fa.asarray(x), approximate=approximate).torch().double()
        # condition number ~ x**2; below ~3 float32 min-normals (gelu_tanh from x ~ -10, where exp(-2u) overflows
        # and subnormals flush) the float32 result is 0 (the H100, thirty-first session: 2.9e-38 off at most)
        torch.testing.assert_close(got, truth, rtol=2e-5, atol=4e-38)
