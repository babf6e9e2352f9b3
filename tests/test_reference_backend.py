"""The reference backend writes a float op into an argument it reads for the last time (torch's
``out=``), never into an input buffer or a value something else may still hold."""
import numpy as np
import pytest
import torch

import flyarray as fa
from flyarray import dtypes
from flyarray.backends.reference import _reusable_results
from flyarray.kernel_ir import Elementwise, Kernel, Load, Reduce, Store
from flyarray.views import View

F32 = dtypes.float32


def _ew(prim, *args):
    return Elementwise(prim, args, "full", F32, F32)


def test_only_dead_fresh_results_are_overwritten():
    view = View((4,), (1,), 0)
    ops = [Load(0, view, "full", F32),     # 0: the input buffer itself
           _ew("sin", 0),                  # 1: fresh, but its argument is the input
           _ew("exp", 1),                  # 2: may write into 1 (read last here)
           _ew("astype", 2),               # 3: .to() may return 2 itself
           _ew("multiply", 2, 3),          # 4: 2 is shared with astype, 3 is not fresh
           _ew("add", 4, 4)]               # 5: may write into 4
    kernel = Kernel((4,), (), ops, [Store(5, F32, view, "full")], 1, [])
    assert _reusable_results(kernel) == {2: 1, 5: 4}


def test_stored_values_are_not_overwritten():
    view = View((4,), (1,), 0)
    ops = [Load(0, view, "full", F32), _ew("sin", 0), _ew("exp", 1)]
    kernel = Kernel((4,), (), ops, [Store(1, F32, view, "full"), Store(2, F32, view, "full")], 1, [])
    assert _reusable_results(kernel) == {}


def test_a_row_value_is_not_overwritten_by_a_full_result():
    """An elementwise op over row values (a reduction's) is a row value whatever its domain label: a
    full-shaped result must not be written into it."""
    full = View((5, 4), (4, 1), 0)
    ops = [Load(0, full, "full", F32),
           Reduce("max", 0, F32),          # 1: [5, 1]
           _ew("negative", 1),             # 2: [5, 1], labelled "full"
           _ew("multiply", 2, 0),          # 3: [5, 4]: not into 2
           _ew("exp", 3)]                  # 4: [5, 4]: into 3
    kernel = Kernel((5, 4), (1,), ops, [Store(4, F32, full, "full")], 1, [])
    assert _reusable_results(kernel) == {4: 3}


def test_reuse_with_row_values_matches_torch(backend):
    t = torch.randn(5, 4)
    x = fa.asarray(t)
    got = fa.exp(x * -(fa.max(x, axis=1, keepdims=True) * 2.0)).torch()
    torch.testing.assert_close(got, torch.exp(t * -(t.amax(1, keepdim=True) * 2.0)))


def test_reuse_keeps_inputs_and_aliases_intact(backend):
    x = torch.randn(64, 33)
    before = x.clone()
    a = fa.sin(fa.asarray(x))
    b = a.astype(fa.float32, copy=True)  # the reference's .to() hands back the same tensor
    c = (a * 2.0 + 1.0) * fa.asarray(x)
    d = fa.exp(c * 0.1) - b
    got = d.torch()
    xd = x.double()
    want = torch.exp((torch.sin(xd) * 2 + 1) * xd * 0.1) - torch.sin(xd)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(x, before)
    torch.testing.assert_close(b.torch().double(), torch.sin(xd), rtol=1e-6, atol=1e-6)


def test_a_plan_step_equals_the_kernel_function_it_replaces():
    """``compile_step`` (a plan step reading and filling slots) computes what ``compile_kernel`` does for
    the same kernel, with inputs, outputs and scalars at arbitrary slots, an output written into a
    buffer already there, and counts one launch per call."""
    from flyarray import runtime
    from flyarray.backends.reference import compile_kernel, compile_step
    from flyarray.kernel_ir import Const
    view = View((2, 3), (3, 1), 0)
    ops = [Load(0, view, "full", F32), Load(1, View((2, 3), (0, 1), 0), "full", F32), Const(0, "full", F32),
           _ew("multiply", 0, 2), _ew("add", 3, 1), Const(1, "full", F32), _ew("subtract", 4, 5), _ew("sin", 6)]
    kernel = Kernel((2, 3), (), ops, [Store(6, F32, view, "full"), Store(7, F32, view, "full")], 2, [F32, F32])
    a, b, into = torch.randn(2, 3), torch.randn(3), torch.full((2, 3), 7.0)
    want = compile_kernel(kernel, [view, None])([a, b], [None, torch.empty(2, 3)], [0.5, -2.0])
    step = compile_step(kernel, [view, None], [(2, 3), (2, 3)], ins=[3, 0], outs=[1, 4], made={1},
                        scalar_slots=[2, 0], stats=runtime._stats)
    slots = [b, None, None, a, into]
    before = runtime._stats["kernels_launched"]
    step(slots, [-2.0, 99.0, 0.5])
    assert runtime._stats["kernels_launched"] == before + 1
    torch.testing.assert_close(slots[1], want[0])
    torch.testing.assert_close(slots[4], want[1])
    assert slots[4] is into  # written into the buffer that was there
    assert slots[0] is b and slots[3] is a


# ---- scalar operands: a cached 0-d tensor gives the Python scalar's bits -----------------------------
_SPECIAL = [0.0, -0.0, 1.0, -1.5, 0.1, 1 / 3, 3.0, 1e30, -1e-30, 1e300, 1e-40, -1e-310, 5e-324,
            float("inf"), float("-inf"), float("nan")]


@pytest.fixture
def reference():
    fa.set_backend("reference")
    yield
    fa.set_backend(None)


def _bits(t):
    return t.view({torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
                   torch.float64: torch.int64}[t.dtype])


def _assert_bits(got, want):
    assert got.dtype is want.dtype and torch.equal(_bits(got), _bits(want)), (got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scalar_operands_give_eager_bits(reference, dtype):
    """add/subtract/multiply/divide by a Python float (the reference passes a 0-d tensor of the op's
    dtype) equal torch eager with the Python scalar bit for bit: signed zeros, infinities, NaN,
    subnormals; every call after the first is a plan hit with another value (or another object of an
    equal value), in both operand orders and through an ``out=`` chain."""
    t = torch.tensor(_SPECIAL, dtype=torch.float64).to(dtype)
    x = fa.asarray(t)
    fa.reset_stats()
    for s in _SPECIAL + [float(repr(v)) for v in _SPECIAL]:  # the second round: equal values, new objects
        _assert_bits((x + s).torch(), t + s)
        _assert_bits((s + x).torch(), s + t)
        _assert_bits((x - s).torch(), t - s)
        _assert_bits((x * s).torch(), t * s)
        _assert_bits((s * x).torch(), s * t)
        _assert_bits((x / s).torch(), t / s)
        _assert_bits(((fa.exp(x) + s) * s - 0.5).torch(), (torch.exp(t) + s) * s - 0.5)
    assert fa.stats()["plan_misses"] <= 7 and fa.stats()["plan_hits"] >= 7 * (2 * len(_SPECIAL) - 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("first,second", [(0.5, 0.7), (0.0, -0.0), (-0.0, 0.0), (float("nan"), 1.0),
                                          (1.0, float("inf"))])
def test_a_plan_hit_with_a_new_scalar_uses_it(reference, dtype, first, second):
    t = torch.tensor([-0.0, 0.0, 1.25, -3.0], dtype=dtype)
    x = fa.asarray(t)
    for s in (first, second, first):
        _assert_bits((x * s + s).torch(), t * s + s)
        _assert_bits((x / s).torch(), t / s)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_float_scalar_is_rounded_to_a_half_arrays_dtype_first(reference, dtype):
    """docs/semantics.md: a Python float meeting a float16/bfloat16 array is rounded to its dtype first (numpy,
    JAX and the generated kernels do). The reference handed torch the Python float, which torch uses unrounded:
    x * 0.1 came out an ulp off the other backends in 13 of 64 bfloat16 values."""
    t = torch.arange(0x3E80, 0x3E80 + 64, dtype=torch.int16).view(torch.bfloat16).to(dtype)
    x = fa.asarray(t)
    for s in (0.1, 0.3, 1e-3):
        rounded = torch.tensor(s, dtype=dtype)
        _assert_bits((x * s).torch(), t * rounded)
        _assert_bits((s - x).torch(), rounded - t)


def test_the_scalar_tensor_is_reused_only_for_the_same_bits():
    from flyarray.backends.reference import _scalar_tensor
    as_tensor = _scalar_tensor(torch.float32)
    half = as_tensor(0.5)
    assert half.dtype is torch.float32 and half.dim() == 0 and half.device.type == "cpu"
    assert as_tensor(float("0.5")) is half  # an equal value, another object
    zero = as_tensor(0.0)
    negative_zero = as_tensor(-0.0)
    assert negative_zero is not zero and str(negative_zero) == "tensor(-0.)"
    nan = float("nan")
    assert as_tensor(nan) is as_tensor(nan)  # the same object
    assert torch.isnan(as_tensor(float("nan")))
    assert as_tensor(0.7).item() == torch.tensor(0.7, dtype=torch.float32).item()


# ---- plan steps hand a fresh result over as the output buffer ----------------------------------------
def test_only_fresh_contiguous_results_of_the_buffer_shape_are_handed_over():
    from flyarray.backends.reference import _handed_over
    view = View((2, 3), (3, 1), 0)
    ops = [Load(0, view, "full", F32), _ew("exp", 0), _ew("astype", 1)]
    stores = [Store(1, F32, view, "full"),                          # 0: a fresh exp: handed over
              Store(0, F32, view, "full"),                          # 1: the input itself
              Store(2, F32, view, "full"),                          # 2: .to() may return its argument
              Store(1, F32, View((2, 3), (1, 2), 0), "full"),       # 3: stored transposed
              Store(1, dtypes.float64, view, "full"),               # 4: another dtype
              Store(1, F32, view, "full")]                          # 5: into a (6,) buffer
    kernel = Kernel((2, 3), (), ops, stores, 1, [])
    assert _handed_over(kernel, [(2, 3)] * 5 + [(6,)]) == {0}


def test_a_result_laid_out_like_a_transposed_input_is_copied_contiguous(reference):
    t = torch.randn(5, 3).T
    got = (fa.exp(fa.asarray(t)) * 2.0).torch()
    assert got.is_contiguous()
    assert torch.equal(got, torch.exp(t) * 2.0)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_reversed_views_of_a_float8_buffer(reference, dtype):
    """torch's CPU has no flip for float8: a negative-step read of an evaluated float8 array moves its bytes."""
    import numpy as np
    t = torch.tensor([1.0, 2.0, -3.0, 4.0, 0.5]).to(dtype)
    want = t.float().numpy()
    x = fa.eval(fa.asarray(t))
    for got, expected in [(x[::-1], want[::-1]), (x[3::-2], want[3::-2]), (fa.flip(x), want[::-1]),
                          (x[[4, 0]], want[[4, 0]])]:
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(got.astype(fa.float32)), expected)


_H = torch.tensor([0.1, 300.0, 70.0, -2.5], dtype=torch.float16)
_B = torch.tensor([1.1640625, -1.1640625, 0.8359375, 3.0], dtype=torch.bfloat16)


@pytest.mark.parametrize("eager", [False, True])
def test_narrow_arithmetic_is_held_in_float32_as_the_kernels_hold_it(backend, eager):
    """float16/bfloat16 arithmetic inside a kernel is held in float32 and rounded where stored, on the
    reference backend as in the generated kernels, so the CPU default and the GPU agree (and check mode
    compares like with like); under eager rounding both round every value, as eager torch does."""
    from flyarray import config
    h, b = fa.asarray(_H), fa.asarray(_B)
    hf, bf = _H.float(), _B.float()
    with config.eager_rounding_scope(eager):
        got = [fa.round(fa.abs(b) * 3), fa.isinf(h * h * 10), fa.sqrt(h) * fa.sqrt(h) - h,
               fa.nextafter(h * 3, fa.zeros_like(h)), (h * 2 + 1).astype(fa.float32), fa.max(h * 1000 - h, axis=0)]
        got = [g.torch() for g in got]
    if eager:   # each value rounded, as eager torch computes
        want = [torch.round(torch.abs(_B) * 3), torch.isinf(_H * _H * 10), torch.sqrt(_H) * torch.sqrt(_H) - _H,
                torch.nextafter(_H * 3, torch.zeros_like(_H)), (_H * 2 + 1).float(), torch.amax(_H * 1000 - _H)]
    else:       # float32 throughout, rounded once where stored; nextafter takes its arguments rounded
        root = torch.from_numpy(np.sqrt(hf.numpy()))   # correctly rounded (torch's CPU float32 sqrt is not always)
        want = [torch.round(torch.abs(bf) * 3).bfloat16(), torch.isinf(hf * hf * 10), (root * root - hf).half(),
                torch.nextafter((hf * 3).half(), torch.zeros_like(_H)), hf * 2 + 1, torch.amax(hf * 1000 - hf).half()]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    assert not torch.equal(want[0], torch.round(torch.abs(_B) * 3)) or eager   # the two rules differ here


@pytest.mark.parametrize("eager", [False, True])
def test_narrow_floor_divide_is_rounded_once(backend, eager):
    """bfloat16 45 // 0.10009765625: floor(449.56...) = 449, 448 in bfloat16, on both backends and in both
    rounding modes (torch's vectorized CPU loop rounds its own steps and gives 450 for the same pair
    among others, 448 alone)."""
    from flyarray import config
    a = torch.tensor([45.0, 1.0, 7.0], dtype=torch.bfloat16)
    b = torch.tensor([0.10009765625, 0.1, 0.0999], dtype=torch.bfloat16)
    r = fa.floor_divide(fa.asarray(a), fa.asarray(b))
    with config.eager_rounding_scope(eager):
        fa.eval(r)
    assert r.torch().tolist() == [448.0, 9.0, 69.0]


def test_only_positive_and_astype_references_return_their_argument():
    """backends/reference._aliases assumes this: a store of any other op's value is a tensor of its own."""
    from flyarray.primitives import ELEMENTWISE
    for d in (torch.float32, torch.int32, torch.bool):
        x = torch.ones(3, dtype=d)
        for name, prim in ELEMENTWISE.items():
            if prim.arity != 1 or name in ("positive", "astype"):
                continue
            try:
                r = prim.reference_for(dtypes.from_torch(d))(x)
            except (RuntimeError, TypeError):
                continue   # the op refuses the dtype
            assert r.data_ptr() != x.data_ptr(), name


@pytest.mark.parametrize("copy_of", [lambda x: fa.asarray(x, copy=True), lambda x: fa.astype(x, x.dtype),
                                     fa.positive, fa.stop_gradient], ids=["copy", "astype", "positive", "stop"])
def test_a_copy_evaluated_with_its_original_has_its_own_buffer(backend, copy_of):
    x = fa.asarray(torch.arange(4.0)) * 0.5
    y = copy_of(x)
    fa.eval(x, y)
    torch.from_dlpack(y).fill_(99.0)
    assert x.torch().tolist() == [0.0, 0.5, 1.0, 1.5]
