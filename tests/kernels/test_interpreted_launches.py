"""What an interpreted launch (CPU tensors through Triton's interpreter, kernels/_triton.py) fixes up.

bfloat16: the interpreter keeps bf16 as raw uint16 bits and computes on them, so a bf16 tl.dot returned
values ~1e10; the kernel now gets float32 stand-ins (_bf16_as_float32), and the two bf16 casts are exact.
Aliasing storages: numpy views come with a storage each over shared memory, which the interpreter's
copy to the host and back could not take (_one_storage_per_memory)."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import flyarray as fa
from flyarray.kernels import _triton
from flyarray.kernels.attention import attention_fwd, reference_attention
from flyarray.kernels.gemm import matmul, reference_matmul


def _rel(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@triton.jit
def _dot_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(out_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, stride_x, stride_out, factor, BLOCK: tl.constexpr):
    """out[i] = x[i] * factor (strided)."""
    i = tl.arange(0, BLOCK)
    ok = i < n
    x = tl.load(x_ptr + i * stride_x, mask=ok)
    y = x * factor
    tl.store(out_ptr + i * stride_out, y, mask=ok)


@triton.jit
def _to_bf16_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    ok = i < n
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=ok).to(tl.bfloat16), mask=ok)


@triton.jit
def _failing_kernel(x_ptr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i) * 3.0)
    tl.static_assert(BLOCK < 0, "fails after writing")   # the interpreter runs it in order: after the store


def test_a_bf16_dot_multiplies_values_not_bits():
    a = torch.randint(-2, 3, (16, 16)).to(torch.bfloat16)
    b = torch.randint(-2, 3, (16, 16)).to(torch.bfloat16)
    out = torch.empty(16, 16)
    _triton.runner(_dot_kernel, torch.device("cpu"))[(1,)](a, b, out, N=16)
    assert torch.equal(out, a.float() @ b.float())   # small integers: exact


def test_arguments_on_one_storage_still_alias():
    """x is the even elements of a buffer, out its odd ones (one storage): the stand-ins share one copy,
    so the kernel reads and writes the places a GPU launch would, and nothing else changes."""
    buf = torch.arange(1, 41, dtype=torch.bfloat16)
    keep = buf.clone()
    x, out = buf[0::2], buf[1::2]
    _triton.runner(_scale_kernel, torch.device("cpu"))[(1,)](x, out, 20, 2, 2, -0.5, BLOCK=32)
    assert torch.equal(buf[0::2], keep[0::2])
    assert torch.equal(buf[1::2], (keep[0::2].float() * -0.5).to(torch.bfloat16))


def test_a_strided_view_with_an_offset_keeps_its_neighbours():
    base = torch.randn(6, 10).to(torch.bfloat16)
    keep = base.clone()
    col = base[1:, 3]                      # offset 13, stride 10
    out = torch.empty(5, dtype=torch.bfloat16)
    _triton.runner(_scale_kernel, torch.device("cpu"))[(1,)](col, out, 5, 10, 1, 2.0, BLOCK=8)
    assert torch.equal(out, (keep[1:, 3].float() * 2).to(torch.bfloat16))
    assert torch.equal(base, keep)


def test_a_float32_to_bf16_cast_rounds_to_nearest_even_as_torch_does():
    """The interpreter truncated: an ulp off in a third of a bf16 add's values. Ties (exactly half an
    ulp, both parities), carries into the exponent, overflow to inf, subnormals, zeros, inf, NaN."""
    torch.manual_seed(9)
    kept = torch.randint(0, 1 << 15, (512,), dtype=torch.int32) << 16
    ties = (kept | 0x8000).view(torch.float32)                      # half an ulp above each bf16 value
    special = torch.tensor([3.4e38, -3.4e38, 1e-40, -1e-40, 0.0, -0.0, float("inf"), -float("inf"),
                            float("nan"), 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 255.99])
    x = torch.cat([torch.randn(2000) * 100, torch.randn(500) * 1e-39, ties, -ties, special])
    out = torch.empty(x.numel(), dtype=torch.bfloat16)
    _triton.runner(_to_bf16_kernel, torch.device("cpu"))[(1,)](x, out, x.numel(), BLOCK=4096)
    want = x.to(torch.bfloat16)
    same = (out.view(torch.int16) == want.view(torch.int16)) | (out.isnan() & want.isnan())
    assert same.all(), (x[~same][:5], out[~same][:5], want[~same][:5])


def test_a_failed_launch_leaves_bf16_data_as_it_was():
    x = torch.randn(16).to(torch.bfloat16)
    keep = x.clone()
    with pytest.raises(Exception, match="fails after writing"):
        _triton.runner(_failing_kernel, torch.device("cpu"))[(1,)](x, BLOCK=16)
    assert torch.equal(x, keep)


def _bf16(bits) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


# +NaN, +NaN with a payload (signalling), -NaN, -NaN with a payload, -inf, a subnormal, -0.0, 1.0
_NAN_BITS = [0x7FC0, 0x7F81, 0xFFC0, 0xFF81, 0xFF80, 0x0001, 0x8000, 0x3F80]


def test_a_read_only_bf16_input_keeps_its_bits():
    """The stand-ins went back through torch's float32 -> bf16 copy_ into inputs too, which made every
    NaN 0xFFFF: reading a +NaN flipped it to -NaN in the caller's tensor."""
    x = _bf16(_NAN_BITS)
    keep = x.view(torch.int16).clone()
    out = torch.empty(x.numel())
    _triton.runner(_scale_kernel, torch.device("cpu"))[(1,)](x, out, x.numel(), 1, 1, 2.0, BLOCK=8)
    assert torch.equal(x.view(torch.int16), keep)


def test_a_stored_bf16_nan_keeps_its_sign():
    x = torch.tensor([0x7FC00000, 0xFFC00000 - (1 << 32), 0x7FC10000, 0x3F800000], dtype=torch.int32)
    out = torch.empty(4, dtype=torch.bfloat16)
    _triton.runner(_to_bf16_kernel, torch.device("cpu"))[(1,)](x.view(torch.float32), out, 4, BLOCK=4)
    assert torch.equal(out.view(torch.int16), _bf16([0x7FC0, 0xFFC0, 0x7FC1, 0x3F80]).view(torch.int16))


def test_flyarray_bf16_nans_keep_their_sign(interpret_backend):
    """The repro through fa: a read-only use of t rewrote it, and astype(+nan) stored a -NaN."""
    t = _bf16(_NAN_BITS)
    keep = t.view(torch.int16).clone()
    fa.eval(fa.asarray(t) * 2)
    assert torch.equal(t.view(torch.int16), keep)
    y = fa.eval(fa.astype(fa.asarray(np.array([np.nan, -np.nan, 1.0])), fa.bfloat16))
    assert y.torch().view(torch.int16).tolist() == _bf16([0x7FC0, 0xFFC0, 0x3F80]).view(torch.int16).tolist()
    assert fa.signbit(y).torch().tolist() == [False, True, False]


def test_other_dtypes_and_empty_tensors_pass_through():
    t16, empty = torch.ones(3, dtype=torch.float16), torch.empty(0, dtype=torch.bfloat16)
    args, kwargs, _ = _triton._bf16_as_float32((t16, 5, empty), {"BLOCK": 4})
    assert args[0] is t16 and args[1] == 5 and args[2] is empty and kwargs == {"BLOCK": 4}


@pytest.mark.parametrize("transposed", [False, True])
def test_gemm_bf16_with_bias_and_activation(transposed):
    torch.manual_seed(3)
    a = torch.randn(21, 37).to(torch.bfloat16)
    w = torch.randn(29, 37).to(torch.bfloat16)
    b = w.t() if transposed else w.t().contiguous()
    bias = torch.randn(29).to(torch.bfloat16)
    out = matmul(a, b, bias=bias, activation="gelu_tanh")
    assert out.dtype == torch.bfloat16
    assert _rel(out, reference_matmul(a, b, bias=bias, activation="gelu_tanh")) < 1e-2


def test_attention_bf16_gqa_causal():
    torch.manual_seed(4)
    q = torch.randn(1, 19, 4, 32).to(torch.bfloat16)
    k, v = (torch.randn(1, 27, 2, 32).to(torch.bfloat16) for _ in range(2))
    out, lse = attention_fwd(q, k, v, is_causal=True)
    ref, ref_lse = reference_attention(q, k, v, is_causal=True, return_lse=True)
    assert out.dtype == torch.bfloat16 and _rel(out, ref) < 1e-2
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3


def test_the_interpret_backend_computes_bf16_matmuls():
    """What a user saw: fa.matmul of bf16 arrays on the interpret backend was ~1e9 times too large."""
    torch.manual_seed(5)
    a, b = torch.randn(8, 24).to(torch.bfloat16), torch.randn(24, 16).to(torch.bfloat16)
    fa.set_backend("interpret")
    try:
        out = torch.from_dlpack(fa.asarray(a) @ fa.asarray(b))
    finally:
        fa.set_backend(None)
    assert out.dtype == torch.bfloat16 and _rel(out, a.double() @ b.double()) < 1e-2


@pytest.mark.parametrize("row", [0, 1])
def test_numpy_views_over_one_array_as_kernel_inputs(interpret_backend, row):
    """x and x[row] from numpy: two torch storages over the same memory (at one address for row 0,
    which raised "size does not match" inside the interpreter)."""
    x = np.arange(12.0).reshape(3, 4)
    got = fa.asarray(x) * fa.asarray(x[row])
    np.testing.assert_array_equal(np.asarray(got), x * x[row])
    got = fa.vmap(lambda a, b: a * b + 1.0, in_axes=(0, None))(fa.asarray(x), fa.asarray(x[row]))
    np.testing.assert_array_equal(np.asarray(got), x * x[row] + 1.0)


@pytest.fixture
def interpret_backend():
    fa.set_backend("interpret")
    yield
    fa.set_backend(None)
