"""MX quantize/dequantize kernels against the numpy spec reference, bit for bit."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from flyarray.kernels import mx, mx_reference

FORMATS = ["e4m3", "e5m2", "e2m1"]
NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _codes(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).cpu().numpy()


def _assert_matches_reference(x: torch.Tensor, fmt: str, axis: int = -1):
    data, scales = mx.mx_quantize(x, fmt, axis=axis)
    ref_codes, ref_scales = mx_reference.quantize(x.float().cpu().numpy(), fmt, axis=axis)
    np.testing.assert_array_equal(_codes(scales), ref_scales)
    np.testing.assert_array_equal(_codes(data), ref_codes)
    assert data.dtype == mx.FORMATS[fmt].torch_dtype and scales.dtype == torch.uint8
    return data, scales


def _wide_random(shape, seed):
    """Normal values times powers of two spanning most of the float32 range, per block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    exps = torch.randint(-140, 120, shape[:-1] + (shape[-1] // 32, 1), generator=g).float()
    return (x.reshape(shape[:-1] + (-1, 32)) * torch.exp2(exps)).reshape(shape)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_random_matches_spec_reference(fmt, dtype):
    x = (torch.randn(6, 64, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    _assert_matches_reference(x, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_wide_range_and_other_axis(fmt):
    x = _wide_random((3, 4, 64), seed=2)
    _assert_matches_reference(x, fmt)
    _assert_matches_reference(x.transpose(0, 2).contiguous(), fmt, axis=0)


def _special_values(fmt):
    f = mx.FORMATS[fmt]
    top = f.max_normal
    ulp_top = 2.0 ** (f.emax - f.mantissa_bits)
    return [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -3e-45, 2.0**-126,
            top, -top, top + ulp_top / 2, top + ulp_top * 0.49, 2 * top - ulp_top / 4,   # round past the max
            f.min_subnormal, f.min_subnormal / 2, f.min_subnormal * 1.5, f.min_normal,
            1.0, -1.0, 3.4e38, -3.4e38, 1.5, 2.5, 0.75]


def _block_strategy(fmt):
    element = st.one_of(
        st.sampled_from(_special_values(fmt)),
        st.floats(width=32, allow_nan=True, allow_infinity=True),
        st.floats(min_value=-10.0, max_value=10.0, width=32),
    )
    return st.lists(element, min_size=32, max_size=32)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_quantize_special_values_match_spec_reference(fmt, data):
    blocks = data.draw(st.lists(_block_strategy(fmt), min_size=1, max_size=4))
    scale_shift = data.draw(st.sampled_from([1.0, 2.0**-120, 2.0**100, 2.0**-3]))
    x = torch.tensor(blocks, dtype=torch.float32) * scale_shift
    x = x.reshape(len(blocks) // 2 or 1, -1) if len(blocks) % 2 == 0 else x
    _assert_matches_reference(x, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_documented_block_rules(fmt):
    f = mx.FORMATS[fmt]
    x = torch.zeros(4, 32)
    x[1, 0] = float("nan")
    x[2, 7] = float("-inf")
    x[3, :] = torch.linspace(-1, 1, 32)
    x[3, 0] = -0.0
    data, scales = _assert_matches_reference(x, fmt)
    codes = _codes(data)
    assert scales[0].item() == 0 and not codes[0].any()           # all-zero block: 2^-127, zeros
    assert scales[1].item() == 255 and not codes[1].any()         # NaN block: NaN scale
    assert scales[2].item() == 255                                # Inf block: NaN scale
    assert scales[3].item() == 127 - f.emax                       # max |x| = 1 -> 2^-emax
    first = codes[3, 0] & 0xF if fmt == "e2m1" else codes[3, 0]
    last = codes[3, -1] >> 4 if fmt == "e2m1" else codes[3, -1]
    assert first == 1 << (f.bits - 1)                             # -0.0 keeps its sign
    assert last == (f.emax + f.bias) << f.mantissa_bits           # 1.0 / 2^-emax = 2^emax exactly
    out = mx.mx_dequantize(data, scales, fmt)
    assert torch.isnan(out[1]).all() and torch.isnan(out[2]).all()
    assert (out[0] == 0).all()


def _check_every_code(fmt, device):
    per_byte = 2 if fmt == "e2m1" else 1
    codes = torch.arange(256, dtype=torch.uint8).reshape(-1, 32 // per_byte)
    if fmt != "e2m1":
        codes = codes.view(mx.FORMATS[fmt].torch_dtype)
    scales = torch.tensor([0, 1, 127, 254, 255, 100, 200, 3] * 2, dtype=torch.uint8)[: codes.shape[0], None]
    with np.errstate(over="ignore", invalid="ignore"):
        out = mx.mx_dequantize(codes.to(device), scales.to(device), fmt)
        ref = mx_reference.dequantize(_codes(codes), scales.numpy(), fmt).astype(np.float32)
    np.testing.assert_array_equal(out.cpu().numpy(), ref)       # NaNs in the same places
    numbers = ~np.isnan(ref)  # signs of zeros too (-0 is code 0x80); a NaN's sign means nothing
    np.testing.assert_array_equal(np.signbit(out.cpu().numpy())[numbers], np.signbit(ref)[numbers])
    assert out.shape == (codes.shape[0], 32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_every_code_matches_reference(fmt):
    _check_every_code(fmt, "cpu")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_native_fp8_dequantize_every_code_on_the_interpreter(fmt, monkeypatch):
    """The conversion-instruction decode through Triton's interpreter: its own fp8 conversion read e4m3's
    NaN and e5m2's Inf/NaN codes as numbers; interpreted launches now convert fp8 as torch does."""
    from flyarray.kernels._triton import current_arch, pick_config
    cfg = pick_config(mx.CONFIGS, current_arch(torch.device("cpu")))
    monkeypatch.setitem(cfg, "dequant_native_fp8", True)
    _check_every_code(fmt, "cpu")


@NEEDS_GPU
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("native_fp8", [False, True])
def test_gpu_dequantize_every_code_matches_reference(fmt, native_fp8, monkeypatch):
    """Both fp8 decodes (the target's conversion instruction, the integer decode) on the GPU."""
    from flyarray.kernels._triton import current_arch, pick_config
    cfg = pick_config(mx.CONFIGS, current_arch(torch.device("cuda")))
    monkeypatch.setitem(cfg, "dequant_native_fp8", native_fp8)
    _check_every_code(fmt, "cuda")


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_is_idempotent_and_close(fmt):
    x = _wide_random((2, 96), seed=3)
    data, scales = mx.mx_quantize(x, fmt)
    values = mx.mx_dequantize(data, scales, fmt)
    data2, scales2 = mx.mx_quantize(values, fmt)
    np.testing.assert_array_equal(_codes(data2), _codes(data))
    np.testing.assert_array_equal(_codes(scales2), _codes(scales))
    # each element is within half a step of the top binade's grid, or was
    # saturated (the spec's scale choice can leave the block max above max normal)
    f = mx.FORMATS[fmt]
    block_scale = torch.exp2(scales.double() - 127)[..., None]
    half_step = block_scale * 2.0 ** (f.emax - f.mantissa_bits - 1)
    clipped = block_scale * (2.0 ** (f.emax + 1) - f.max_normal)
    err = (values.double() - x.double()).reshape(2, -1, 32).abs()
    assert (err <= torch.maximum(half_step, clipped)).all()


def test_dequantize_dtype_and_axis():
    x = torch.randn(64, 3)
    data, scales = mx.mx_quantize(x, "e4m3", axis=0)
    assert data.shape == (64, 3) and scales.shape == (2, 3)
    out = mx.mx_dequantize(data, scales, "e4m3", axis=0, dtype=torch.float16)
    assert out.dtype == torch.float16 and out.shape == (64, 3)
    ref = mx.reference_mx_dequantize(data, scales, "e4m3", axis=0)
    torch.testing.assert_close(out.double(), ref, rtol=1e-3, atol=0)
    fp4, fp4_scales = mx.mx_quantize(x, "mxfp4", axis=0)
    assert fp4.shape == (32, 3) and fp4.dtype == torch.uint8


@pytest.mark.parametrize("fmt, code, scale", [("e4m3", 0x7E, 250), ("e5m2", 0x7B, 240), ("e2m1", 0x77, 254)])
def test_float64_dequantize_holds_values_past_float32s_range(fmt, code, scale):
    """A large element times a scale near 2^127 leaves float32's range; the float64 output holds it exactly
    (it came out inf: the scale was applied in float32 before the store)."""
    data = torch.full((2, 16 if fmt == "e2m1" else 32), code, dtype=torch.uint8)
    scales = torch.full((2, 1), scale, dtype=torch.uint8)
    out = mx.mx_dequantize(data, scales, fmt, dtype=torch.float64)
    ref = mx.reference_mx_dequantize(data, scales, fmt)
    assert torch.isfinite(ref).all() and (ref.abs() > 3.5e38).all()
    assert torch.equal(out, ref)


def test_bad_inputs_raise_naming_the_argument():
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="block_size"):
        mx.mx_quantize(x, "e4m3", block_size=16)
    with pytest.raises(ValueError, match="fmt"):
        mx.mx_quantize(x, "e3m3")
    with pytest.raises(ValueError, match="multiple of 32"):
        mx.mx_quantize(torch.randn(2, 48), "e4m3")
    with pytest.raises(TypeError, match="x"):
        mx.mx_quantize(torch.ones(2, 32, dtype=torch.int32), "e4m3")
    data, scales = mx.mx_quantize(x, "e2m1")
    with pytest.raises(ValueError, match="scales"):
        mx.mx_dequantize(data, scales[:, :1], "e2m1")
    with pytest.raises(TypeError, match="scales"):
        mx.mx_dequantize(data, scales.float(), "e2m1")
    with pytest.raises(TypeError, match="data"):
        mx.mx_dequantize(data.float(), scales, "e2m1")
    with pytest.raises(ValueError, match="block_size"):
        mx.mx_dequantize(data, scales, "e2m1", block_size=64)
    with pytest.raises(ValueError, match=r"data: axis 1 of shape \(2, 48\) holds 48 e4m3 values, not a multiple"):
        mx.mx_dequantize(torch.zeros(2, 48, dtype=torch.float8_e4m3fn), torch.zeros(2, 1, dtype=torch.uint8), "e4m3")


def test_format_table():
    import ml_dtypes
    for f in mx.FORMATS.values():
        info = ml_dtypes.finfo(getattr(ml_dtypes, f.ml_dtype))
        assert float(info.max) == f.max_normal and info.nmant == f.mantissa_bits
        assert info.maxexp - 1 == f.emax and float(info.smallest_subnormal) == f.min_subnormal


@pytest.mark.parametrize("target", ["gfx950", "sm_90"])
def test_kernels_compile_without_spills(target):
    from flyarray.targets import compile_for
    for spec in mx.compile_specs():
        if spec.name.endswith("e2m1") or spec.name.endswith("e4m3") or spec.name.endswith("e5m2"):
            report = compile_for(spec, target)
            assert report.spills == 0, (spec.name, target)


@NEEDS_GPU
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_quantize_bit_exact(fmt):
    x = _wide_random((256, 4096), seed=5)
    x[0, :5] = torch.tensor([float("nan"), 0.0, -0.0, float("inf"), 1e-40])
    x[1, :32] = 0.0
    x[2, :32] = 1e-41
    data, scales = mx.mx_quantize(x.cuda(), fmt)
    ref_codes, ref_scales = mx_reference.quantize(x.numpy(), fmt)
    np.testing.assert_array_equal(_codes(scales), ref_scales)
    np.testing.assert_array_equal(_codes(data), ref_codes)
    out = mx.mx_dequantize(data, scales, fmt)
    ref = mx_reference.dequantize(ref_codes, ref_scales, fmt).astype(np.float32)
    np.testing.assert_array_equal(out.cpu().numpy(), ref)


def _tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 24, bias=False),
                               torch.nn.Linear(24, 8))


@pytest.mark.parametrize("weight_format,activation_format,bound", [("mxfp4", None, 0.3), ("e4m3", None, 0.06),
                                                                    ("e4m3", "e4m3", 0.1)])
def test_quantize_linear_weights(weight_format, activation_format, bound):
    from flyarray.kernels.mx import MXLinear, quantize_linear_weights
    model = _tiny_model()
    x = torch.randn(3, 5, 64)
    # what the swapped model must compute: the same layers with dequantized weights
    expected = _tiny_model()
    for layer in (expected[0], expected[2]):
        data, scales = mx.mx_quantize(layer.weight.detach(), weight_format)
        layer.weight.data = mx.reference_mx_dequantize(data, scales, weight_format).float()
    report = quantize_linear_weights(model, x, weight_format=weight_format, activation_format=activation_format)
    assert report["replaced"] == ["0", "2"] and report["skipped"] == ["3"]      # 24 is not a multiple of 32
    assert isinstance(model[0], MXLinear) and isinstance(model[3], torch.nn.Linear)
    assert 0 < report["rel_error"] < bound
    assert report["weight_bytes_after"] < report["weight_bytes_before"] / 3
    with torch.no_grad():
        got, want = model(x), expected(x)
    assert got.shape == (3, 5, 8) and got.dtype == torch.float32
    tol = 2e-3 if activation_format is None else 0.1   # fp16 activations / MXFP8 activations
    assert ((got - want).norm() / want.norm()).item() < tol


@pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu"), reason="torch without float8_e8m0fnu")
def test_e8m0fnu_scales_are_taken_by_the_kernel_functions_only_as_documented():
    """The module docstrings: kernels/mx.py and kernels/scaled_matmul.py take float8_e8m0fnu scales;
    fa.quant (and fa.nn.scaled_matmul, torch.ops.flyarray) take uint8 codes only."""
    import flyarray as fa
    data, scales = mx.mx_quantize(torch.randn(2, 64), "e4m3")
    e8m0 = scales.view(torch.float8_e8m0fnu)
    torch.testing.assert_close(mx.mx_dequantize(data, e8m0, "e4m3"), mx.mx_dequantize(data, scales, "e4m3"))
    with pytest.raises(TypeError, match="float8_e8m0fnu"):
        fa.quant.mx_dequantize(data, e8m0, "e4m3")
