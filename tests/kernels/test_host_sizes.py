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
