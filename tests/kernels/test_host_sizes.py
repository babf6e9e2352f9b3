"""The host-side size helpers that replace triton.cdiv / triton.next_power_of_2 (ConstexprFunctions,
~2.5 us a Python call) agree with Triton's own on every size a launch can see."""
import triton
from hypothesis import given, strategies as st

from flyarray.kernels._triton import cdiv, next_pow2


@given(n=st.integers(0, 2 ** 62), b=st.integers(1, 2 ** 31))
def test_cdiv_is_tritons(n, b):
    assert cdiv(n, b) == triton.cdiv(n, b)


@given(n=st.integers(-5, 2 ** 62))
def test_next_pow2_is_tritons_of_at_least_one(n):
    assert next_pow2(n) == triton.next_power_of_2(max(n, 1))


def test_edges():
    assert [next_pow2(n) for n in (0, 1, 2, 3, 4, 5, 1023, 1024, 1025)] == [1, 1, 2, 4, 4, 8, 1024, 1024, 2048]
    assert [cdiv(n, 16) for n in (0, 1, 15, 16, 17)] == [0, 1, 1, 1, 2]


def test_empty_is_torch_empty_and_keeps_no_fake_or_inference_template():
    """kernels._triton.empty: torch.empty's result for a launch, from a kept template. A template made
    under FakeTensorMode would make later real calls fake; none made under inference_mode is kept
    either (new_empty of one outside the mode gives a normal tensor, so this is caution, not a fix)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from flyarray.kernels import _triton
    device = torch.device("cpu")
    _triton._EMPTY_TEMPLATES.pop((torch.float16, device), None)
    with FakeTensorMode():
        fake = _triton.empty((3, 5), torch.float16, device)
    with torch.inference_mode():
        inference = _triton.empty((3, 5), torch.float16, device)
    assert inference.is_inference() and type(fake) is not torch.Tensor
    assert (torch.float16, device) not in _triton._EMPTY_TEMPLATES
    t = _triton.empty((3, 5), torch.float16, device)
    assert type(t) is torch.Tensor and not t.is_inference() and not t.requires_grad
    assert t.shape == (3, 5) and t.dtype == torch.float16 and t.device == device and t.is_contiguous()
    assert _triton.empty((2,), torch.float16, device).data_ptr() != t.data_ptr()
