"""uint16, uint32 and uint64 in torch eager: exact array-API results where torch has no kernel.

torch has these dtypes but few CPU kernels for them (copies, ``==``/``!=``, ``&|^``, ``*``, sum, prod,
sort, cumsum; no ``+``, ``<``, ``//``, max, flip, gather, index_put, ...). The reference backend and the
torch-backed library ops therefore compute on **lanes**: int64 tensors holding each element exactly,
uint16/uint32 as their value (zero-extended) and uint64 as its bit pattern (two's complement). Addition,
subtraction, multiplication, negation and the bitwise ops give the right bits modulo 2^64 on lanes, and
``from_lanes`` wraps them modulo 2^bits; what depends on the unsigned order or on more than the low
bits (comparisons, max/min, division, remainder, right shifts, large shifts, pow) has its own rule here.
Moves (gather, scatter-set, flip) go through the same-width signed view: no arithmetic, no copy.

Nothing here is ever silently wrong: every elementwise primitive either has a rule below or is one
whose int64 result on lanes is the unsigned result's bits (``LANE_EXACT``); anything else raises.
"""
from __future__ import annotations

import torch

WIDE = (torch.uint16, torch.uint32, torch.uint64)
_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
_MIN64 = -(2 ** 63)
_MAX64 = 2 ** 63 - 1


def is_wide(dtype: torch.dtype) -> bool:
    """uint16, uint32 or uint64: the unsigned dtypes torch computes little on."""
    return dtype in _SIGNED


def signed_view(t: torch.Tensor) -> torch.Tensor:
    """The same bytes as the same-width signed dtype (a view: for moves, not for arithmetic)."""
    return t.view(_SIGNED[t.dtype]) if t.dtype in _SIGNED else t


def unsigned_view(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Undo ``signed_view``."""
    return t.view(dtype) if dtype in _SIGNED else t


# float8 (storage formats): torch's CPU has no move kernels (flip, gather) for them either
_MOVED_AS = {**_SIGNED, **{d: torch.int8 for d in (getattr(torch, n, None) for n in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")) if d is not None}}


def bits_view(t: torch.Tensor) -> torch.Tensor:
    """The same bytes as a same-width integer dtype torch has move kernels for (flip, gather): a view for
    moves only, never for values (-0.0 and 0.0 differ in it)."""
    return t.view(_MOVED_AS[t.dtype]) if t.dtype in _MOVED_AS else t


def from_bits(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Undo ``bits_view``."""
    return t.view(dtype) if dtype in _MOVED_AS else t


def to_lanes(t: torch.Tensor) -> torch.Tensor:
    """int64 lanes: uint16/uint32 values, uint64 bits."""
    if t.dtype == torch.uint64:
        return t.view(torch.int64)
    return t.to(torch.int64)


def from_lanes(r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int64 lanes -> ``dtype``, wrapping modulo 2^bits."""
    if r.dtype != torch.int64:
        r = r.to(torch.int64)
    if dtype == torch.uint64:
        return r.view(torch.uint64)
    mask = (1 << (torch.iinfo(dtype).bits)) - 1
    return (r & mask).to(dtype)


def order_key(lanes: torch.Tensor) -> torch.Tensor:
    """int64 whose signed order is the unsigned order of the lanes (the top bit flipped)."""
    return lanes ^ _MIN64


def _lt(a, b):
    return order_key(a) < order_key(b)


def _logical_rshift(a, s):
    """a >>> s for 0 <= s <= 63 (lanes as 64-bit words)."""
    once = (a >> 1) & _MAX64  # non-negative after one logical step: arithmetic shifts are logical
    return torch.where(s == 0, a, once >> (s - 1).clamp(min=0))


def _small_shift(s):
    """(shift amount clamped into 0..63, whether it is below 64 as an unsigned value)."""
    ok = (s >= 0) & (s < 64)
    return torch.where(ok, s, 0), ok


def udivmod(a, b):
    """Unsigned 64-bit floor division and remainder on lanes; a zero divisor gives 0 and 0 (numpy's)."""
    zero = b == 0
    big = b < 0  # a divisor >= 2^63: the quotient is 0 or 1
    d = torch.where(zero | big, 1, b)
    q = ((((a >> 1) & _MAX64) // d) << 1)  # floor(floor(a / 2) / d) * 2 is floor(a / d) or one less
    r = a - q * d
    fix = ~_lt(r, d)
    q, r = q + fix.to(torch.int64), torch.where(fix, r - d, r)
    ge = ~_lt(a, b)
    q = torch.where(big, ge.to(torch.int64), q)
    r = torch.where(big, torch.where(ge, a - b, a), r)
    return torch.where(zero, 0, q), torch.where(zero, 0, r)


def _pow(a, e):
    """a ** e modulo 2^64 by squaring over all 64 bits of e (torch.pow refuses 'negative' int64 exponents)."""
    result = torch.ones_like(a)
    base = a.clone()
    e = e.clone()
    for _ in range(64):
        if not bool((e != 0).any()):
            break
        result = torch.where((e & 1) != 0, result * base, result)
        base = base * base
        e = (e >> 1) & _MAX64
    return result


def _lshift(a, s):
    s, ok = _small_shift(s)
    return torch.where(ok, a << s, 0)


def _rshift(a, s):
    s, ok = _small_shift(s)
    return torch.where(ok, _logical_rshift(a, s), 0)


def _false(a, *_):
    return torch.zeros(a.shape, dtype=torch.bool, device=a.device)


# Rules on lanes for the primitives whose int64 result is not the unsigned result's bits.
RULES = {
    "less": _lt,
    "less_equal": lambda a, b: ~_lt(b, a),
    "greater": lambda a, b: _lt(b, a),
    "greater_equal": lambda a, b: ~_lt(a, b),
    "maximum": lambda a, b: torch.where(_lt(a, b), b, a),
    "minimum": lambda a, b: torch.where(_lt(b, a), b, a),
    "floor_divide": lambda a, b: udivmod(a, b)[0],
    "remainder": lambda a, b: udivmod(a, b)[1],
    "pow": _pow,
    "bitwise_left_shift": _lshift,
    "bitwise_right_shift": _rshift,
    "abs": lambda a: a,
    "relu": lambda a: a,
    "sign": lambda a: (a != 0).to(torch.int64),
    "signbit": _false,
    "isnan": _false,
    "isinf": _false,
    "isfinite": lambda a: torch.ones(a.shape, dtype=torch.bool, device=a.device),
}
# The int64 result on lanes is the unsigned result's bits (modulo 2^64, then wrapped by from_lanes).
LANE_EXACT = {"add", "subtract", "multiply", "negative", "positive", "square", "floor", "ceil", "trunc", "round",
              "bitwise_invert", "bitwise_and", "bitwise_or", "bitwise_xor", "equal", "not_equal", "logical_not",
              "logical_and", "logical_or", "logical_xor", "where"}


def elementwise(name: str, reference, out_bool: bool):
    """The reference of elementwise primitive ``name`` for wide unsigned inputs (tensors of that dtype in,
    that dtype or bool out)."""
    if name in RULES:
        fn = RULES[name]
    elif name in LANE_EXACT:
        fn = reference
    else:
        def fn(*_):
            raise TypeError(f"{name} has no exact rule for uint16/uint32/uint64 in the reference backend")

    def run(*args):
        dtype = next(a.dtype for a in args if a.dtype in _SIGNED)
        out = fn(*[to_lanes(a) if a.dtype in _SIGNED else a for a in args])
        return out if out_bool else from_lanes(out, dtype)
    return run


def reduce(name: str, reference):
    """The reference of reduction ``name`` for a wide unsigned input."""
    def run(x, axes):
        lanes = to_lanes(x)
        if name in ("max", "min"):
            return from_lanes(order_key(reference(order_key(lanes), axes)), x.dtype)
        if name in ("argmax", "argmin"):
            return reference(order_key(lanes), axes)
        if name in ("sum", "prod"):  # int64 sums wrap modulo 2^64: the bits of the uint64 result (cast by the caller)
            return reference(lanes, axes)
        return reference(x != 0, axes)  # any, all
    return run
