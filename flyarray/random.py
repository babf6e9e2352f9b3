"""fa.random: explicit, counter-based random numbers (JAX's design), generated inside fused kernels.

A key is an int64 array of shape (2,) holding two 32-bit words (JAX's uint32[2] key data; flyarray
has no uint32). Every sampler is a pure function of (key, shape, parameters): the same key gives the
same numbers on every backend, and reusing a key reuses its numbers (derive new keys with ``split``
or ``fold_in``). The generator is threefry2x32 (primitives.threefry2x32, and codegen.PRELUDE's Triton
twin), an elementwise primitive over the key words and an iota counter: the bits are computed in the
kernel that consumes them, so ``x * (uniform(k, x.shape) > 0.1)`` is one kernel with no mask in
memory. Keys, bits, uniform, randint, bernoulli, categorical and permutation follow JAX (jax_threefry_partitionable,
the default since JAX 0.5) bit for bit; docs/random.md has the details.
"""
from __future__ import annotations

import math
import numbers
import operator

import numpy as np
import torch

from . import dtypes as dt
from ._array import Array
from .ops import core, creation, elementwise as ew, manipulation, reductions
from .primitives import ELEMENTWISE, RANDOM
from .views import broadcast_shapes

ELEMENTWISE.update(RANDOM)  # after ops/elementwise.py: no fa.random_bits function

__all__ = ["key", "PRNGKey", "key_data", "wrap_key_data", "split", "fold_in", "bits", "uniform", "normal",
           "bernoulli", "randint", "categorical", "gumbel", "permutation", "truncated_normal"]

_M32 = 0xFFFFFFFF


# ---- keys ------------------------------------------------------------------------------------------
def key(seed, *, device=None) -> Array:
    """A key from an integer seed: the words (seed >> 32, seed) mod 2**32, as ``jax.random.key``
    for seeds in [0, 2**64) (a negative seed is taken as its 64-bit two's complement)."""
    if isinstance(seed, Array):
        if seed.ndim != 0 or seed.dtype.kind not in "iu":
            raise TypeError(f"key: the seed must be a 0-d integer array, got {seed.dtype}{list(seed.shape)}")
        s = seed.astype(dt.int64)
        return manipulation.stack([ew.bitwise_and(ew.bitwise_right_shift(s, 32), _M32), ew.bitwise_and(s, _M32)])
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"key: the seed must be an integer, got {seed!r}")
    seed = int(seed)
    if not -2 ** 63 <= seed < 2 ** 64:
        raise OverflowError(f"key: seed {seed} does not fit 64 bits")
    return creation.asarray([(seed >> 32) & _M32, seed & _M32], dtype=dt.int64, device=device)


PRNGKey = key


def key_data(keys) -> Array:
    """The raw words of a key (or an array of keys, shape (..., 2)): int64 values in [0, 2**32)."""
    _check_keys(keys, "key_data")
    return keys


def wrap_key_data(data, *, device=None) -> Array:
    """A key from raw words, e.g. ``jax.random.key_data(k)`` (uint32) or ``key_data``'s output."""
    if isinstance(data, torch.Tensor):  # on its own device, its dtype checked before numpy sees it
        data = creation.asarray(data.detach(), device=device)
    if isinstance(data, Array):
        if data.dtype.kind not in "iu":
            raise TypeError(f"wrap_key_data: key data must be integers, got {data.dtype}")
        out = ew.bitwise_and(data.astype(dt.int64), _M32)
    else:
        a = np.asarray(data)
        if a.dtype.kind not in "iu":   # astype(int64) would truncate floats silently
            raise TypeError(f"wrap_key_data: key data must be integers, got {a.dtype}")
        out = creation.asarray(torch.as_tensor(a.astype(np.int64), device="cpu") & _M32, device=device)
    _check_keys(out, "wrap_key_data")
    return out


def _check_keys(k, fn):
    if not isinstance(k, Array):
        raise TypeError(f"{fn}: expected a key (an int64 array of shape (..., 2)), got {type(k).__name__}")
    if k.dtype is not dt.int64 or k.ndim < 1 or k.shape[-1] != 2:
        raise TypeError(f"{fn}: a key is an int64 array of shape (..., 2) (fa.random.key), "
                        f"got {k.dtype}{list(k.shape)}")


def _check_key(k, fn):
    _check_keys(k, fn)
    if k.shape != (2,):
        raise ValueError(f"{fn}: expected one key (shape (2,)), got shape {k.shape}; index a split first")
    return k[0], k[1]


def _threefry(prim, k, shape):
    """threefry2x32 primitive ``prim`` over key ``k`` and the flat index of ``shape`` (JAX's counter)."""
    return _threefry_words((prim,), k, shape)[0]


def _threefry_words(prims, k, shape) -> list:
    """The threefry2x32 primitives ``prims`` over one key and counter: the key's words and the counter
    recorded once for all of them (a split's two words: half the recording)."""
    k0, k1 = _check_key(k, "fa.random")
    shape = tuple(shape)
    n = math.prod(shape)
    idx = manipulation.reshape(creation.arange(n, dtype=dt.int64, device=k.device), shape)
    hi, lo = (0, idx) if n <= 2 ** 32 else (ew.bitwise_right_shift(idx, 32), ew.bitwise_and(idx, _M32))
    return [core.elementwise(prim, k0, k1, hi, lo) for prim in prims]


_BOTH_WORDS = ("threefry2x32_0", "threefry2x32_1")


def split(k, num=2) -> Array:
    """``num`` new keys, shape (num, 2): key i is threefry2x32(k, (0, i)), as JAX."""
    _check_key(k, "split")
    shape = num if isinstance(num, tuple) else (num,)
    if any(isinstance(n, bool) or not isinstance(n, numbers.Integral) for n in shape):
        raise TypeError(f"split: num must be an integer (or a tuple of them), got {num!r}")
    if any(n < 0 for n in shape):
        raise ValueError(f"split: num must not be negative, got {num!r}")
    words = _threefry_words(_BOTH_WORDS, k, shape)
    return manipulation.stack(words, axis=-1)  # a concat: the keys get a buffer, never recomputed per element


def fold_in(k, data) -> Array:
    """A new key from ``k`` and an integer (Python int, or a 0-d integer array) taken mod 2**32:
    threefry2x32(k, (0, data)), JAX's fold_in (and key ``data`` of ``split(k, n)``)."""
    k0, k1 = _check_key(k, "fold_in")
    if isinstance(data, Array):
        if data.ndim != 0 or data.dtype.kind not in "iu":
            raise TypeError(f"fold_in: data must be an integer or a 0-d integer array, got {data.dtype}"
                            f"{list(data.shape)}")
        hi, lo = 0, ew.bitwise_and(data.astype(dt.int64), _M32)
    elif isinstance(data, bool) or not isinstance(data, numbers.Integral):
        raise TypeError(f"fold_in: data must be an integer or a 0-d integer array, got {data!r}")
    else:
        hi, lo = 0, int(data) & _M32
    words = [core.elementwise(p, k0, k1, hi, lo) for p in ("threefry2x32_0", "threefry2x32_1")]
    return manipulation.stack([manipulation.reshape(w, ()) for w in words])


# ---- bits ------------------------------------------------------------------------------------------
def bits(k, shape=(), dtype=None) -> Array:
    """Random bits, as ``jax.random.bits``. dtype None: int64 holding 32 bits (JAX's uint32), in
    [0, 2**32); uint8 / uint16 / uint32 / int8 / int16 / int32: that many low bits (signed ones two's
    complement); uint64: JAX's 64 bits; int64: the same 64 bits, two's complement."""
    _check_key(k, "bits")
    shape = _shape(shape)
    d = dt.int64 if dtype is None else dt.dtype(dtype)
    if dtype is not None and d in (dt.int64, dt.uint64):
        x0, x1 = _threefry_words(_BOTH_WORDS, k, shape)
        out = ew.bitwise_or(ew.bitwise_left_shift(x0, 32), x1)
        return out if d is dt.int64 else out.astype(d)
    if d.kind not in "iu":
        raise TypeError(f"bits: dtype must be an integer type, got {d}")
    b = _threefry("random_bits", k, shape)
    return b if d is dt.int64 else b.astype(d)


def _low_bits(k, shape, nbits):
    """JAX's ``_random_bits(key, nbits, shape)`` for nbits <= 32, as non-negative int64."""
    b = _threefry("random_bits", k, shape)
    return b if nbits == 32 else ew.bitwise_and(b, (1 << nbits) - 1)


def _shape(shape):
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)) or not all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in shape):
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return shape


# ---- continuous distributions --------------------------------------------------------------------
_NMANT = {"float16": (16, 10), "bfloat16": (8, 7), "float32": (32, 23), "float64": (64, 52)}  # (random bits, mantissa bits), as JAX


def _float_dtype(dtype, fn, name="dtype"):
    """The float dtype a sampler draws in; ``name``: the argument it comes from (dtype, or the array p / logits
    whose dtype it is), for the error."""
    d = dt.default_float() if dtype is None else dt.dtype(dtype)   # None: the default, as fa.zeros
    if d.kind != "f" or d in dt.STORAGE_ONLY:
        raise TypeError(f"{fn}: {name} must be float16, bfloat16, float32 or float64, got {d}")
    return d


def _unit(k, shape, d) -> Array:
    """Uniform on [0, 1) in dtype ``d``: JAX's mantissa bits. (bits >> (nbits - nmant)) * 2**-nmant is
    exactly JAX's bitcast((bits >> shift) | bits(1.0)) - 1.0, with no bitcast."""
    nbits, nmant = _NMANT[d.name]
    if nbits == 64:
        x0, x1 = _threefry_words(_BOTH_WORDS, k, shape)
        m = ew.bitwise_or(ew.bitwise_left_shift(x0, 20), ew.bitwise_right_shift(x1, 12))
        return m.astype(dt.float64) * 2.0 ** -52
    m = ew.bitwise_right_shift(_low_bits(k, shape, nbits), nbits - nmant)
    u = m.astype(dt.float32) * 2.0 ** -nmant  # exact: m < 2**23
    return u if d is dt.float32 else u.astype(d)


def _scalar_or(x, d, fn, name, shape, k):
    """A Python number stays a (weak) scalar, rounded to ``d`` first as JAX converts it; an array (fa,
    numpy, torch) is cast to ``d`` and must broadcast to ``shape``."""
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return _round(float(x), d)
    x = _real_array(x, k, fn, name)
    _check_fits(x, shape, fn, name)
    return x.astype(d, copy=False)


def _real_array(x, k, fn, name) -> Array:
    """``x`` (an fa array, numpy, torch, a list) as an array beside the key, refused by name unless real."""
    if not isinstance(x, Array):
        if x is None or isinstance(x, (bool, str, bytes, numbers.Complex)):
            raise TypeError(f"{fn}: {name} must be a real number or an array, got {x!r}")
        x = creation.asarray_beside(x, k.device)
    if x.dtype.kind == "c":
        raise TypeError(f"{fn}: {name} must be real, got a {x.dtype} array")
    return x


def _round(x: float, d) -> float:
    """``x`` rounded to the nearest value of dtype ``d`` (numpy's astype), as a Python float."""
    return float(torch.tensor(x, dtype=torch.float64, device="cpu").to(d.torch))


def uniform(k, shape=(), dtype=dt.float32, minval=0.0, maxval=1.0) -> Array:
    """Uniform on [minval, maxval), as ``jax.random.uniform`` (its numbers, bit for bit), except where JAX leaves
    that range: ``u * (max - min) + min`` rounded up to ``max`` is taken one value below it, and a width that
    overflows (float16 [-60000, 60000)) is replaced by ``min * (1 - u) + max * u`` (JAX gives inf and NaN)."""
    _check_key(k, "uniform")
    d = _float_dtype(dtype, "uniform")
    shape = _shape(shape)
    lo, hi = (_scalar_or(minval, d, "uniform", "minval", shape, k),
              _scalar_or(maxval, d, "uniform", "maxval", shape, k))
    u = _unit(k, shape, d)
    scalars = not isinstance(lo, Array) and not isinstance(hi, Array)
    if scalars and (lo, hi) == (0.0, 1.0):
        return u
    width = _round(hi - lo, d) if scalars else _op_in(d, operator.sub, hi, lo)   # JAX subtracts in the dtype
    out = _op_in(d, operator.add, _op_in(d, operator.mul, u, width), lo)
    if not scalars or not math.isfinite(width):
        convex = _op_in(d, operator.add, _op_in(d, operator.mul, _op_in(d, operator.sub, 1.0, u), lo),
                        _op_in(d, operator.mul, u, hi))
        out = convex if scalars else ew.where(ew.isfinite(width), out, convex)
    below_hi = ew.nextafter(hi, _full_like_inf(hi, -1)) if isinstance(hi, Array) else _nextafter(hi, -math.inf, d)
    out = ew.maximum(ew.minimum(out, below_hi), lo)
    return manipulation.broadcast_to(out, shape) if out.shape != shape else out


def _full_like_inf(x, sign):
    return creation.full((), sign * math.inf, dtype=x.dtype, device=x.device)


def _op_in(d, op, a, b):
    """``op(a, b)`` rounded to ``d``, as JAX's ops in ``d`` are. A fused kernel holds float16/bfloat16
    values in float32 and rounds only where it stores or where a cast asks, so the op runs in float32
    (exact for a product of 16-bit values, and a sum or difference of close ones) and is cast to ``d``
    explicitly: every backend then gives the same bits (normal's erfinv sees JAX's u)."""
    a, b = (_wide(x) if isinstance(x, Array) else x for x in (a, b))
    return op(a, b).astype(d, copy=False)


def _nextafter(x: float, toward: float, d) -> float:
    t = torch.nextafter(torch.tensor(x, dtype=d.torch, device="cpu"), torch.tensor(toward, dtype=d.torch, device="cpu"))
    return float(t)


# Giles' single-precision erfinv (XLA's ErfInv for float32), in ops that fuse.
_ERFINV_SMALL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                 -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_LARGE = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                 -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _horner(w, coeffs):
    p = coeffs[0]
    for c in coeffs[1:]:
        p = c + p * w
    return p


def _erfinv(x: Array) -> Array:
    w = -ew.log1p(-(x * x))
    small = _horner(w - 2.5, _ERFINV_SMALL)
    large = _horner(ew.sqrt(ew.maximum(w, 5.0)) - 3.0, _ERFINV_LARGE)
    p = core.where(w < 5.0, small, large) * x
    if x.dtype == dt.float64:
        p = _refined_in_float64(p, x)
    # the infinities as constants: x * inf would send 0 * inf = NaN back through the branch not taken
    infinities = core.where(x > 0, float("inf"), float("-inf")).astype(x.dtype, copy=False)
    return core.where(ew.abs(x) == 1.0, infinities, p)


# Newton steps that take Giles' float32 erfinv to float64 accuracy: 4 reach 5 ulp of the true erfinv
# (mpmath at 50 digits) over 20,000 uniform u and u = +-(1 - 2**-k), k = 1..53; 3 leave u = 1 - 2**-53 at
# 2e6 ulp, where the float32 polynomial, extrapolated past its range, starts 12% off.
_FLOAT64_NEWTON_STEPS = 4
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _refined_in_float64(z: Array, x: Array) -> Array:
    """erfinv(x) from the estimate ``z``. Where |x| > 1/2 the step solves log erfc(|z|) = log(1 - |x|)
    (1 - |x| is exact there, and log erfc is nearly quadratic, so Newton converges from afar and keeps
    relative accuracy in the tail, where erf(z) - x would have cancelled); elsewhere erf(z) = x."""
    tail = ew.abs(x) > 0.5
    log_c = ew.log(1.0 - ew.abs(x))
    for _ in range(_FLOAT64_NEWTON_STEPS):
        a = ew.abs(z)
        density = _TWO_OVER_SQRT_PI * ew.exp(-(z * z))
        erfc_a = ew.erfc(a)
        tail_z = ew.copysign(a + (ew.log(erfc_a) - log_c) * erfc_a / density, x)
        z = core.where(tail, tail_z, z - (ew.erf(z) - x) / density)
    return z


def normal(k, shape=(), dtype=dt.float32) -> Array:
    """Standard normal, as ``jax.random.normal``: sqrt(2) * erfinv(u), u uniform on (-1, 1).
    The erfinv is Giles' float32 one (XLA's: the same bits as JAX's in float32); float64 refines it by
    Newton's method to within 5 ulp of the true erfinv (JAX's float64 polynomial differs by a few ulp)."""
    _check_key(k, "normal")
    d = _float_dtype(dtype, "normal")
    u = uniform(k, shape, d, _nextafter(-1.0, 0.0, d), 1.0)
    return _in(d, math.sqrt(2.0) * _erfinv(_wide(u)))


def _wide(x):  # fp16/bf16 math in float32 on every backend (fused kernels do it anyway)
    return x.astype(dt.float32) if x.dtype in (dt.float16, dt.bfloat16) else x


def _in(d, x):
    return x.astype(d, copy=False)


def truncated_normal(k, lower, upper, shape=None, dtype=dt.float32) -> Array:
    """Standard normal conditioned on (lower, upper), as ``jax.random.truncated_normal``."""
    _check_key(k, "truncated_normal")
    d = _float_dtype(dtype, "truncated_normal")
    lo, hi = (creation.asarray_beside(bound, k.device, d) if isinstance(bound, numbers.Real) and not isinstance(bound, bool)
              else _real_array(bound, k, "truncated_normal", name).astype(d, copy=False)
              for bound, name in ((lower, "lower"), (upper, "upper")))
    shape = _shape(broadcast_shapes(lo.shape, hi.shape) if shape is None else shape)
    _check_fits(lo, shape, "truncated_normal", "lower")
    _check_fits(hi, shape, "truncated_normal", "upper")
    sqrt2 = math.sqrt(2.0)
    a, b = ew.erf(_wide(lo) / sqrt2), ew.erf(_wide(hi) / sqrt2)
    a, b = _in(d, a), _in(d, b)
    u = uniform(k, shape, d, a, b)
    u = ew.where(u == a, ew.nextafter(a, b), u)   # erfinv(-1) = -inf (lower=-inf): -finfo.max after the clamp
    out = _in(d, sqrt2 * _erfinv(_wide(u)))
    out = ew.maximum(out, ew.nextafter(lo, _full_like_inf(lo, 1)))
    return ew.minimum(out, ew.nextafter(hi, _full_like_inf(hi, -1)))


def gumbel(k, shape=(), dtype=dt.float32) -> Array:
    """Standard Gumbel, as ``jax.random.gumbel`` (mode 'low'): -log(-log(u)), u uniform on [tiny, 1)."""
    _check_key(k, "gumbel")
    d = _float_dtype(dtype, "gumbel")
    u = uniform(k, shape, d, dt.finfo(d).smallest_normal, 1.0)
    return _in(d, -ew.log(-ew.log(_wide(u))))


def bernoulli(k, p=0.5, shape=None) -> Array:
    """True with probability p, as ``jax.random.bernoulli``: uniform(k, shape, p's dtype) < p."""
    _check_key(k, "bernoulli")
    if not (isinstance(p, numbers.Real) and not isinstance(p, bool)):
        p = _real_array(p, k, "bernoulli", "p")   # numpy, torch, lists: one draw per element, as for an fa array
    # a float16/bfloat16 p is compared with a float32 draw: JAX draws in p's dtype, whose 2**10 / 2**7 levels
    # make p = 1e-3 in bfloat16 come true 7.8e-3 of the time
    d = p.dtype if isinstance(p, Array) and p.dtype.kind == "f" else dt.float32
    d = dt.float32 if _float_dtype(d, "bernoulli", "p") in (dt.float16, dt.bfloat16) else d
    if shape is None:
        shape = p.shape if isinstance(p, Array) else ()
    shape = _shape(shape)
    if isinstance(p, Array):
        _check_fits(p, shape, "bernoulli", "p")
    return uniform(k, shape, d) < p


def _axis_in(axis, shape, fn, what) -> int:
    """``axis`` of an array of ``shape`` (at least one axis), normalized; a ValueError naming ``fn`` else."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral) or not -len(shape) <= axis < len(shape):
        raise ValueError(f"{fn}: axis {axis!r} is out of range for {what} of shape {shape}")
    return int(axis) % len(shape)


def categorical(k, logits, axis=-1) -> Array:
    """Samples of the categorical distributions exp(logits) (normalized along ``axis``), as
    ``jax.random.categorical``: argmax(logits + gumbel). The noise, the add and the argmax are one
    row kernel."""
    _check_key(k, "categorical")
    if not isinstance(logits, Array):
        logits = creation.asarray_beside(logits, k.device)
    if logits.ndim == 0:
        raise ValueError("categorical: logits must have at least one axis (the categories)")
    axis = _axis_in(axis, logits.shape, "categorical", "logits")
    d = _float_dtype(logits.dtype, "categorical", "logits") if logits.dtype.kind == "f" else dt.float32
    if d in (dt.float16, dt.bfloat16):   # noise drawn and added in float32: a 16-bit Gumbel has 2**10 / 2**7
        d, logits = dt.float32, logits.astype(dt.float32)   # levels, biased toward low indices and truncated
    g = gumbel(k, logits.shape, d)
    return reductions.argmax(g + logits, axis=axis)


# ---- integers -------------------------------------------------------------------------------------
_SIGN = -2 ** 63   # x ^ _SIGN is x - 2**63 mod 2**64: maps uint64 bits onto int64 keeping their order


def randint(k, shape, minval, maxval, dtype=dt.int32) -> Array:
    """Integers in [minval, maxval) (clipped to dtype's range), as ``jax.random.randint``: two 32-bit
    words per value reduced mod the span (JAX's formula, bias about span / 2**32). int64 and uint64 use
    32-bit words too (JAX's would use 64): their span must be at most 2**32. That is checked for
    Python-int bounds; array bounds are lazy, so a wider span is not refused: it is cut to 2**32, so its
    samples cover only its first 2**32 values (still in [minval, maxval))."""
    d = dt.int32 if dtype is None else dt.dtype(dtype)
    if d.kind not in "iu":
        raise TypeError(f"randint: dtype must be an integer type, got {d}")
    shape = _shape(shape)
    _check_key(k, "randint")
    mask = _M32  # 32-bit words for every dtype: JAX samples 8- and 16-bit types as int32
    if isinstance(minval, numbers.Real) and isinstance(maxval, numbers.Real):   # Python (or numpy) numbers
        lo, span = _python_span(minval, maxval, d)
        mult = ((2 ** 16 % span) ** 2 & mask) % span
    else:
        lo, span = _array_span(k, shape, minval, maxval, d)
        mult = ew.remainder(ew.bitwise_and(ew.square(ew.remainder(2 ** 16, span)), mask), span)
    keys = split(k)
    k1, k2 = keys[0], keys[1]
    higher, lower = _low_bits(k1, shape, 32), _low_bits(k2, shape, 32)
    offset = ew.bitwise_and(ew.remainder(higher, span) * mult, mask)
    offset = ew.remainder(ew.bitwise_and(offset + ew.remainder(lower, span), mask), span)
    out = offset + lo                 # no overflow: lo + offset < maxval
    if d is dt.uint64:                # back from the shifted int64 domain (see _array_span)
        out = ew.bitwise_xor(out, _SIGN)
    out = out.astype(d)
    return manipulation.broadcast_to(out, shape) if out.shape != shape else out


def _python_span(minval, maxval, d):
    """(lo, span) for Python-number bounds, exact Python ints; lo as an int64 value (uint64: shifted)."""
    for x, name in ((minval, "minval"), (maxval, "maxval")):
        if not isinstance(x, numbers.Integral) and not math.isfinite(x):
            raise ValueError(f"randint: {name} must be finite, got {x}")
    info = dt.iinfo(d)
    narrow = d.bits < 32
    top = info.max + 1 if narrow else info.max  # JAX clips a narrow maxval to max + 1: 256 for uint8
    out_of_range = not narrow and int(maxval) > info.max
    lo, hi = min(max(int(minval), info.min), info.max), min(max(int(maxval), info.min), top)
    span = 1 if hi <= lo else hi - lo + out_of_range
    if span > 2 ** 32:
        raise ValueError(f"randint: the range [{minval}, {maxval}) is wider than 2**32")
    return (lo + _SIGN if d is dt.uint64 else lo), span


def _array_span(k, shape, minval, maxval, d):
    """(lo, span) as int64 arrays for array bounds. uint64 works in int64 shifted by -2**63 (order kept,
    every value fits), so all the arithmetic below is int64. The span is computed so it cannot wrap:
    hi - lo past 2**63 - 1 wraps negative, and any span over 2**32 is cut to 2**32."""
    (mn, _), (mx, over) = (_int_bound(x, name, k.device, d, shape) for x, name in
                           ((minval, "minval"), (maxval, "maxval")))
    narrow = d.bits < 32
    info = dt.iinfo(dt.int64 if d is dt.uint64 else d)
    top = info.max + 1 if narrow else info.max  # JAX clips a narrow maxval to max + 1: 256 for uint8
    lo, hi = ew.clip(mn, info.min, info.max), ew.clip(mx, info.min, top)
    grow = 0
    if not narrow:   # maxval above the dtype's max: max itself is a value too
        grow = ew.logical_and(ew.logical_or(mx > info.max, over), hi > lo).astype(dt.int64)
    diff = hi - lo
    diff = core.where(diff < 0, 2 ** 32, ew.minimum(diff, 2 ** 32))
    return lo, core.where(hi <= lo, 1, ew.minimum(diff + grow, 2 ** 32))


def _int_bound(x, name, device, d, shape):
    """A randint bound beside an array bound, as (int64 array, over): uint64 target ``d`` shifted by
    -2**63 (see _array_span); values beyond int64 saturate, ``over`` where a bound was above it."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        x = int(x)
        if d is dt.uint64:   # clip to uint64's range, then shift
            return creation.asarray(min(max(x, 0), 2 ** 64 - 1) + _SIGN, dtype=dt.int64, device=device), False
        return creation.asarray(min(max(x, -2 ** 63), 2 ** 63 - 1), dtype=dt.int64, device=device), x >= 2 ** 63
    if not isinstance(x, Array):
        if x is None or isinstance(x, (float, bool, str, bytes)):
            raise TypeError(f"randint: {name} must be an int or an integer array, got {x!r}")
        x = creation.asarray_beside(x, device)
    if x.dtype.kind not in "iub":
        raise TypeError(f"randint: {name} must be an int or an integer array, got {x.dtype}")
    _check_fits(x, shape, "randint", name)
    v = x.astype(dt.int64, copy=False)
    if d is dt.uint64:   # into the shifted domain; a negative bound is below uint64's 0
        return (ew.bitwise_xor(v, _SIGN) if x.dtype is dt.uint64 else ew.maximum(v, 0) + _SIGN), False
    if x.dtype is dt.uint64:   # a uint64 bound above 2**63 - 1 was cast negative: saturate it
        return core.where(v < 0, 2 ** 63 - 1, v), v < 0
    return v, False


def _check_fits(x, shape, fn, name):
    """An array parameter must broadcast to the sample shape (checked before any work)."""
    try:
        fits = broadcast_shapes(tuple(x.shape), tuple(shape)) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{fn}: {name} of shape {tuple(x.shape)} does not broadcast to shape {tuple(shape)}")


def permutation(k, x, axis=0) -> Array:
    """A random permutation of ``arange(x)`` (an int) or of ``x`` along ``axis``, as
    ``jax.random.permutation`` (its stable sort of random bits, 3*log2(n)/32 rounds). Lazy: the sorts are
    fa.argsort, so it traces under fa.jit and batches under fa.vmap."""
    from .ops import indexing, sorting
    _check_key(k, "permutation")
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        n, values = int(x), None
        if n < 0:
            raise ValueError(f"permutation: x must be a non-negative size or an array, got {x}")
    else:
        values = x if isinstance(x, Array) else creation.asarray_beside(x, k.device)
        if values.ndim == 0:
            raise ValueError("permutation: x must be a size or an array with at least one axis")
        axis = _axis_in(axis, values.shape, "permutation", "an array")
        n = values.shape[axis]
    perm = creation.arange(n, dtype=dt.int64, device=k.device)
    rounds = math.ceil(3 * math.log(max(1, n)) / math.log(2 ** 32 - 1))
    for _ in range(rounds):
        ks = split(k)
        k, sub = ks[0], ks[1]
        sort_keys = _threefry("random_bits", sub, (n,))
        perm = indexing.take(perm, sorting.argsort(sort_keys, stable=True))
    return perm if values is None else indexing.take(values, perm, axis=axis)
