"""One Kernel (schedule.py) -> Triton source, plus the run-time arguments to launch it.

What is baked into the source (and so into the cache key): the ops and their
dtypes, the rank of the kept and reduced index spaces after coalescing, which
loads read per-row values, whether the row fits one block, and whether
indices need 64 bits. Everything else -- sizes, strides, offsets, scalar
constants -- is a run-time argument, so one source serves every shape. Triton
further specializes integer arguments equal to 1 (unit strides) on its own.

The values of Python scalars (``Const`` slots) are the last run-time
arguments, typed by annotation and never specialized on, so ``x * 0.5`` and
``x * 0.7`` share one compiled kernel and one plan: a plan binds them at launch.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import struct

from . import config
from . import dtypes as dt
from .kernel_ir import Const, Elementwise, Iota, Kernel, Load, Reduce
from .primitives import ELEMENTWISE, REDUCE

ROW_BLOCK_LIMIT = 16384  # widest row kept in registers in one pass
COLUMN_TILE = 64  # kept x reduced tile side of column-major row kernels (reductions over a strided axis)

# float64 transcendental functions (libdevice's sin, exp, log, ... in double) take many registers each: a
# kernel with one keeps few elements a thread, or it spills (the sm_90 cross-compile of complex128 tan: 552
# bytes at 8 elements a thread). Elementwise: 256 a program on 4 warps (2 a thread); row kernels: tiles of
# 512 elements on 8 warps (2 a thread; benchmarks/xc_generated.py finds such spills). Not 1024 on 16 warps: that
# caps a thread at 128 registers, and the complex128 sum(exp(z) * sin(z)) spilled 24 bytes there once csinh
# scales past overflow (sm_90, Triton 3.6; 142 registers and no spills on 8 warps).
HEAVY_EW_BLOCK = 256
HEAVY_ROW_TILE = 512
_HEAVY = frozenset(("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "sinh", "cosh",
                    "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "atan2", "erf", "erfc", "pow", "hypot",
                    "logaddexp", "sigmoid", "gelu", "silu"))


# float32 kernels with many of them spill the same way: a complex64 chain, exp(z * z + 1j) / (z - 2) then sqrt,
# lowers to 102 real ops, 5 of them heavy (sm_90, Triton 3.6: 128 registers and 8 spill bytes at 8 elements a thread)
HEAVY_OPS_PER_KERNEL = 4


# float64 values take two registers each: a kernel with this many float64 ops holds many tiles of them (a complex
# prod's magnitude parts, 13: 150 spill bytes at 255 registers on 4 warps, sm_90, Triton 3.6, 32 elements a thread)
HEAVY_FLOAT64_OPS = 8


def _heavy(kernel) -> bool:
    heavy = [op for op in kernel.ops if isinstance(op, Elementwise) and op.prim in _HEAVY]
    wide = [op for op in kernel.ops if isinstance(op, Elementwise) and op.dtype.name == "float64"]
    return (len(heavy) >= HEAVY_OPS_PER_KERNEL or len(wide) >= HEAVY_FLOAT64_OPS
            or any("float64" in (op.dtype.name, op.in_dtype.name) for op in heavy))


# Launch shapes (per-arch tuned values replace these in launch_shape; benchmarks/tune_fused.py explores them).
TUNING = {
    "ew_block": 1024,  # elements per program, elementwise kernels
    "ew_warps": 4,
    "row_tile": 4096,  # elements per [BLOCK_M, BLOCK_N] tile in row kernels
    "loop_block_n": 4096,  # chunk of a row too long for one block
    "reduce_block_n": None,  # pure reductions loop over chunks of this width instead of one pass (None: off)
    "row_warps": None,  # None: from the tile size
    "col_block_m": COLUMN_TILE // 2,  # column-major row kernels: kept columns per program (contiguous)
    "col_block_n": COLUMN_TILE * 2,  # ... and reduced rows per loop step
    "col_warps": 4,
}


def _tree_reduce(value: str, axis, combine: str) -> str:
    """A block reduced along ``axis``. A sum is tl.sum: on a GPU the same tree as tl.reduce with _add, but Triton's
    interpreter runs a custom combine one element at a time (float32 sums of 8000 elements 100x less accurate than
    torch's, var of 1e6 + N(0, 1) 900 for 1) where tl.sum is numpy's pairwise sum."""
    if combine == "_add":
        return f"tl.sum({value}, {axis}, keep_dims=True)"
    return f"tl.reduce({value}, {axis}, {combine}, keep_dims=True)"


@dataclasses.dataclass
class LaunchSpec:
    """How to launch one kernel: arguments are (inputs, outputs, ``args``, scalars, constexprs)."""
    key: str
    source: str
    args: list  # run-time arguments after the buffers that the structure fixes (sizes, offsets, strides, M, N)
    constexprs: dict
    grid: tuple
    num_warps: int
    empty: bool  # nothing to launch (no rows or no elements)


PRELUDE = '''import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _maximum(a, b):
    # nested, not (a > b) | (a != a): under the interpreter a scalar operand's comparison cannot be or-ed
    # with a block's
    return tl.where(a != a, a, tl.where(a > b, a, b))


@triton.jit
def _minimum(a, b):
    return tl.where(a != a, a, tl.where(a < b, a, b))


@triton.jit
def _fmaximum(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _fminimum(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _argmax(v1, i1, v2, i2):
    nan1 = v1 != v1
    nan2 = v2 != v2
    better = (v1 > v2) | (nan1 & ~nan2)
    tie = ((v1 == v2) | (nan1 & nan2)) & (i1 < i2)
    take = better | tie
    return tl.where(take, v1, v2), tl.where(take, i1, i2)


@triton.jit
def _argmin(v1, i1, v2, i2):
    nan1 = v1 != v1
    nan2 = v2 != v2
    better = (v1 < v2) | (nan1 & ~nan2)
    tie = ((v1 == v2) | (nan1 & nan2)) & (i1 < i2)
    take = better | tie
    return tl.where(take, v1, v2), tl.where(take, i1, i2)


@triton.jit
def _ifloordiv(a, b):
    q = a // b
    r = a % b
    return q - ((r != 0) & ((r < 0) != (b < 0))).to(q.dtype)


@triton.jit
def _ffloordiv(a, b):
    # torch's and numpy's float floor division: from fmod, so a // b * b + a % b == a holds where
    # floor(a / b) would round the quotient first (1 // 0.1 is 9, not 10)
    mod = a % b
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    floor = tl.floor(div)
    floor = tl.where(div - floor > 0.5, floor + 1.0, floor)
    floor = tl.where(div == 0, 0.0 * (a / b), floor)   # a zero takes the quotient's sign
    return tl.where(b == 0, a / b, floor)


@triton.jit
def _iremainder(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _fremainder(a, b):
    r = a % b
    r = tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
    zero = tl.abs(r)   # a zero result takes the divisor's sign (the array API's rule)
    return tl.where(r == 0, tl.where(b < 0, -zero, zero), r)


@triton.jit
def _ipow(a, b):
    one = a * 0 + 1
    result = one
    base = a
    e = b
    for _ in tl.static_range(64):  # every bit of a uint64 exponent (>> is logical on unsigned types)
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    # a negative exponent (signed types; >> kept its sign bit above): torch's integer result, 1 / a^-b
    # truncated: 1 for a == 1, +-1 for a == -1, else 0
    minus_one = a * 0 - 1
    at_minus_one = tl.where((b & 1) != 0, minus_one, one)
    reciprocal = tl.where(a == one, one, tl.where(a == minus_one, at_minus_one, a * 0))
    return tl.where(b < b * 0, reciprocal, result)


@triton.jit
def _nextafter16(xf, yf, x):
    # one step of a 16-bit float x (fp16 or bf16) toward y, on its sign-magnitude bits; xf, yf: x and y
    # widened to fp32 (exactly), where the comparisons are made: Triton's interpreter holds bf16 values
    # as their raw bits, so comparing them there compares bit patterns
    ix = x.to(tl.int16, bitcast=True)
    iy = yf.to(x.dtype).to(tl.int16, bitcast=True)
    step = tl.where((xf > 0) == (yf > xf), 1, -1).to(tl.int16)
    bits = tl.where(xf == 0, (iy & -32768) | 1, ix + step)
    out = bits.to(x.dtype, bitcast=True).to(tl.float32)
    out = tl.where(xf == yf, yf, out)
    out = tl.where(yf != yf, xf + yf, out)
    return tl.where(xf != xf, xf + yf, out)  # nested: see _maximum


@triton.jit
def _logaddexp(a, b):
    m = _maximum(a, b)
    d = tl.abs(a - b)
    # log1p: log(1 + e) loses e below the unit roundoff (logaddexp(0, -20) would be 0, not 2.1e-9)
    return tl.where(tl.abs(m) == float("inf"), m, m + ext.log1p(ext.exp(-d)))


# threefry2x32 (fa.random) on uint32 words (they wrap, as the algorithm wants); int64 in and out.
# The same algorithm in torch is primitives.threefry2x32 (the reference backend's, int64 with masks).
@triton.jit
def _threefry_rounds(x0, x1, r0: tl.constexpr, r1: tl.constexpr, r2: tl.constexpr, r3: tl.constexpr):
    x0 = x0 + x1
    x1 = ((x1 << r0) | (x1 >> (32 - r0))) ^ x0
    x0 = x0 + x1
    x1 = ((x1 << r1) | (x1 >> (32 - r1))) ^ x0
    x0 = x0 + x1
    x1 = ((x1 << r2) | (x1 >> (32 - r2))) ^ x0
    x0 = x0 + x1
    x1 = ((x1 << r3) | (x1 >> (32 - r3))) ^ x0
    return x0, x1


@triton.jit
def _threefry2x32(k0, k1, c0, c1):
    k0 = k0.to(tl.uint32)
    k1 = k1.to(tl.uint32)
    k2 = k0 ^ k1 ^ 0x1BD11BDA
    x0 = c0.to(tl.uint32) + k0
    x1 = c1.to(tl.uint32) + k1
    x0, x1 = _threefry_rounds(x0, x1, 13, 15, 26, 6)
    x0 = x0 + k1
    x1 = x1 + k2 + 1
    x0, x1 = _threefry_rounds(x0, x1, 17, 29, 16, 24)
    x0 = x0 + k2
    x1 = x1 + k0 + 2
    x0, x1 = _threefry_rounds(x0, x1, 13, 15, 26, 6)
    x0 = x0 + k0
    x1 = x1 + k1 + 3
    x0, x1 = _threefry_rounds(x0, x1, 17, 29, 16, 24)
    x0 = x0 + k1
    x1 = x1 + k2 + 4
    x0, x1 = _threefry_rounds(x0, x1, 13, 15, 26, 6)
    x0 = x0 + k2
    x1 = x1 + k0 + 5
    return x0, x1


@triton.jit
def _threefry_xor(k0, k1, c0, c1):
    x0, x1 = _threefry2x32(k0, k1, c0, c1)
    return (x0 ^ x1).to(tl.int64)


@triton.jit
def _threefry_x0(k0, k1, c0, c1):
    x0, x1 = _threefry2x32(k0, k1, c0, c1)
    return x0.to(tl.int64)


@triton.jit
def _threefry_x1(k0, k1, c0, c1):
    x0, x1 = _threefry2x32(k0, k1, c0, c1)
    return x1.to(tl.int64)
'''


def launch_spec(kernel: Kernel) -> LaunchSpec:
    return _Emitter(kernel, _Layout(kernel)).launch_spec()


def scalar_arg(value, d: dt.DType):
    """A Const slot's run-time argument: float64 travels as its bits (a Python float arrives as fp32),
    uint64 as the int64 of its bits (every integer slot is a tl.int64 argument)."""
    if d is dt.float64:
        return struct.unpack("<q", struct.pack("<d", value))[0]
    if d.kind == "b":
        return int(value)
    if d is dt.uint64 and value >= 2 ** 63:  # int64 arguments: its bits (const_expr casts them back)
        return value - 2 ** 64
    return value


class _Layout:
    """The kernel's views, permuted so reduced axes come last and coalesced.

    After this, the kept index space has rank p and the reduced one rank q;
    every view (loads, iotas, stores) has an offset and p + q strides.
    """

    def __init__(self, kernel: Kernel):
        full, axes = kernel.full_shape, kernel.axes
        kept = [i for i in range(len(full)) if i not in axes]
        perm = kept + list(axes)
        self.views = []
        for op in kernel.ops:
            if isinstance(op, (Load, Iota)):
                self.views.append(op.view)
        for st in kernel.stores:
            self.views.append(st.view)
        sizes = [full[i] for i in perm]
        strides = [[_stride_in_full(v, i, full) for i in perm] for v in self.views]
        self.kept_sizes, kept_strides = _coalesce(sizes[:len(kept)], [s[:len(kept)] for s in strides])
        self.red_sizes, red_strides = _coalesce(sizes[len(kept):], [s[len(kept):] for s in strides])
        self.offsets = [v.offset for v in self.views]
        self.kept_strides = kept_strides
        self.red_strides = red_strides
        self.M = math.prod(self.kept_sizes)
        self.N = math.prod(self.red_sizes)
        reach = max([self.M * self.N] + [abs(o) + sum(abs(s) * (n - 1) for s, n in zip(ks + rs, self.kept_sizes + self.red_sizes))
                                         for o, ks, rs in zip(self.offsets, kept_strides, red_strides)])
        self.index64 = reach >= 2 ** 31 - 1


def _stride_in_full(view, axis, full):
    """A view's stride along ``axis`` of the full domain: outer views repeat along reduced axes."""
    if view.shape[axis] == 1 and full[axis] != 1:
        return 0
    return view.strides[axis]


def _coalesce(sizes, strides_per_view):
    """Drop size-1 axes and merge neighbours that every view walks contiguously."""
    keep = [i for i, s in enumerate(sizes) if s != 1]
    sizes = [sizes[i] for i in keep]
    strides = [[st[i] for i in keep] for st in strides_per_view]
    i = len(sizes) - 2
    while i >= 0:
        if all(st[i] == st[i + 1] * sizes[i + 1] for st in strides):
            sizes[i] *= sizes[i + 1]
            del sizes[i + 1]
            for st in strides:
                st[i] = st[i + 1]
                del st[i + 1]
        i -= 1
    return sizes, strides


def _tl(d: dt.DType) -> str:
    return f"tl.{d.triton}"


def _cdt(d: dt.DType) -> dt.DType:
    return dt.compute_dtype(d)


def _is_float8(d: dt.DType) -> bool:
    return d in (dt.float8_e4m3fn, dt.float8_e5m2)


def _rounded_to(expr: str, narrow: dt.DType) -> str:
    """``expr`` rounded to float16/bfloat16 and held in float32 (their compute dtype). Through float32
    first, as torch converts float64 and integers (and as every target converts to bfloat16)."""
    return f"{expr}.to(tl.float32).to({_tl(narrow)}).to(tl.float32)"


_NEUTRAL = {"sum": "0", "prod": "1", "any": "0", "all": "1"}


class _Emitter:
    def __init__(self, kernel: Kernel, layout: _Layout):
        self.k = kernel
        self.lay = layout
        self.rows = bool(kernel.axes)
        self.p = len(layout.kept_sizes)
        self.q = len(layout.red_sizes)
        self.view_of_op = {}
        vi = 0
        for i, op in enumerate(kernel.ops):
            if isinstance(op, (Load, Iota)):
                self.view_of_op[i] = vi
                vi += 1
        self.store_view = list(range(vi, vi + len(kernel.stores)))
        chunk = TUNING["reduce_block_n"]
        self.pure_reduce = self.rows and all(st.domain == "outer" for st in kernel.stores)
        # Column-major tiles: where the loads walk the kept axis contiguously and the reduced one with a
        # stride (a sum over axis 0 of a row-major matrix), the tile is [BLOCK_N reduced, BLOCK_M kept]
        # so that neighbouring threads read neighbouring addresses; the row loop then walks the
        # reduced axis in chunks (a whole column in registers would not fit).
        self.t = self.rows and self.column_major()
        self.RX = "[None, :]" if self.t else "[:, None]"  # a per-row vector as a 2-D tile
        self.CX = "[:, None]" if self.t else "[None, :]"  # a per-column vector as a 2-D tile
        self.AX = 0 if self.t else 1  # the tile's reduced axis
        self.TILE = "[BLOCK_N, BLOCK_M]" if self.t else "[BLOCK_M, BLOCK_N]"
        self.one_pass = (not self.rows) or (layout.N <= ROW_BLOCK_LIMIT and not self.t and
                                            not (self.pure_reduce and chunk and layout.N > chunk))
        self.lines = []

    def column_major(self) -> bool:
        lay = self.lay
        loads = [self.view_of_op[i] for i, op in enumerate(self.k.ops) if isinstance(op, Load) and op.domain == "full"]
        if not loads or self.lay.N <= COLUMN_TILE or not lay.kept_sizes or not lay.red_sizes:
            return False
        # A load constant along the contiguous kept axis (a per-row statistic of the reduced axis, as an
        # RMSNorm weight gradient's rsqrt(mean square) per token, also when a split column reduction
        # makes the row chunk a kept axis) reads one value per reduced index that neighbouring threads
        # share: it neither asks for nor spoils the column-major walk.
        walking = [v for v in loads if lay.kept_strides[v][-1] != 0]
        return bool(walking) and all(lay.kept_strides[v][-1] == 1 and lay.red_strides[v][-1] != 1
                                     for v in walking)

    # ---- the launch ------------------------------------------------------------------------------
    def launch_spec(self) -> LaunchSpec:
        signature = self.signature()
        cached = _SOURCES.get(signature)
        if cached is None:
            body = self.emit()
            n_in, n_out = self.k.n_inputs, len(self.k.stores)
            params = [f"in{i}" for i in range(n_in)] + [f"out{i}" for i in range(n_out)]
            params += self.size_params() + self.view_params() + iota_names(self.k)
            params += ["M", "N"] if self.rows else ["NUMEL"]
            scalars = [f"s{i}" for i in range(len(self.k.scalar_dtypes))]
            params += [f"{name}: {_scalar_annotation(d)}" for name, d in zip(scalars, self.k.scalar_dtypes)]
            params += ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr"] if self.rows else ["BLOCK: tl.constexpr"]
            sig = ",\n    ".join(params)
            jit = f"@triton.jit(do_not_specialize={scalars!r})" if scalars else "@triton.jit"
            name = self.kernel_name()
            source = (PRELUDE + f"\n\n{jit}\ndef {name}(\n    {sig},\n):\n"
                      + "\n".join("    " + line for line in body) + f"\n\n\nkernel = {name}\n")
            cached = _SOURCES[signature] = (hashlib.sha256(source.encode()).hexdigest()[:32], source)
            SIGNATURES_BY_KEY[cached[0]] = signature
        key, source = cached
        args = self.size_args() + self.view_args() + iota_values(self.k)
        args += [self.lay.M, self.lay.N] if self.rows else [self.lay.M]
        constexprs, grid, warps = self.launch_shape()
        return LaunchSpec(key, source, args, constexprs, grid, warps, self.lay.M == 0)

    def kernel_name(self) -> str:
        """What a profiler shows: ``fa_<ew|rowred|colred>_<ops in order>``, e.g. ``fa_colred_add_erf_exp_sum``.
        Derived from the ops alone, so equal signatures still give the same source."""
        kind = "ew" if not self.rows else ("colred" if self.t else "rowred")
        names = self.k.op_names()
        shown = names[:NAME_OPS] + ([f"and{len(names) - NAME_OPS}"] if len(names) > NAME_OPS else [])
        return "_".join(["fa", kind] + [re.sub(r"\W", "", n) for n in shown])

    def signature(self) -> tuple:
        """Everything the source depends on; equal signatures give the same source."""
        ops = tuple(_op_signature(op) for op in self.k.ops)
        stores = tuple((st.op, st.domain, st.dtype.name) for st in self.k.stores)
        scalars = tuple(d.name for d in self.k.scalar_dtypes)
        return (self.rows, self.p, self.q, self.pow2_sizes(), self.lay.index64, self.one_pass, self.t, ops, stores,
                self.k.n_inputs, scalars, config.eager_rounding_in_effect())

    def launch_shape(self):
        lay = self.lay
        heavy = _heavy(self.k)
        if not self.rows:
            block = TUNING["ew_block"] if not heavy else HEAVY_EW_BLOCK
            if lay.M < block:
                block = max(16, 1 << max(lay.M - 1, 0).bit_length())
            warps = TUNING["ew_warps"] if block >= 1024 or heavy else max(1, block // 256)
            return {"BLOCK": block}, (max(1, -(-lay.M // block)),), warps
        n = max(lay.N, 1)
        if self.t:  # column-major: a narrow kept strip (more programs), a deeper reduced chunk
            block_m, block_n = TUNING["col_block_m"], TUNING["col_block_n"]
            return {"BLOCK_M": block_m, "BLOCK_N": block_n}, (max(1, -(-lay.M // block_m)),), TUNING["col_warps"]
        if self.one_pass:
            block_n = max(16, 1 << (n - 1).bit_length())
        elif self.pure_reduce and TUNING["reduce_block_n"]:
            block_n = TUNING["reduce_block_n"]
        else:
            block_n = TUNING["loop_block_n"]
        block_m = max(1, min(64, (TUNING["row_tile"] if not heavy else HEAVY_ROW_TILE) // block_n))
        block_m = 1 << (block_m.bit_length() - 1)
        tile = block_n * block_m
        warps = TUNING["row_warps"] or (4 if tile <= 4096 else (8 if tile <= 8192 else 16))
        if heavy:   # at most 2 elements a thread (16 warps is the most a program has)
            warps = max(warps, min(16, tile // 64))
        return {"BLOCK_M": block_m, "BLOCK_N": block_n}, (max(1, -(-lay.M // block_m)),), warps

    def size_params(self):
        # A size that is a power of two is a constexpr: index math divides by the inner sizes once per
        # element, and a division by a run-time value costs some twenty instructions (it dominated
        # a bias-broadcast kernel), by a constant power of two a shift. Other sizes stay run-time
        # arguments, so one source serves every shape.
        names = [f"K{i}" for i in range(1, self.p)] + [f"R{i}" for i in range(1, self.q)]
        return [f"{n}: tl.constexpr" if pow2 else n for n, pow2 in zip(names, self.pow2_sizes())]

    def pow2_sizes(self) -> tuple:
        sizes = list(self.lay.kept_sizes[1:]) + list(self.lay.red_sizes[1:])
        return tuple(s > 1 and s & (s - 1) == 0 for s in sizes)

    def size_args(self):
        return list(self.lay.kept_sizes[1:]) + list(self.lay.red_sizes[1:])

    def view_params(self):
        out = []
        for v in range(len(self.lay.views)):
            out.append(f"o{v}")
            out += [f"k{v}_{i}" for i in range(self.p)] + [f"r{v}_{i}" for i in range(self.q)]
        return out

    def view_args(self):
        out = []
        for v in range(len(self.lay.views)):
            out.append(self.lay.offsets[v])
            out += list(self.lay.kept_strides[v]) + list(self.lay.red_strides[v])
        return out

    # ---- the body ------------------------------------------------------------------------------
    def emit(self) -> list:
        L = self.lines
        idx = "tl.int64" if self.lay.index64 else "tl.int32"
        if not self.rows:
            L.append(f"lin = tl.program_id(0).to({idx}) * BLOCK + tl.arange(0, BLOCK).to({idx})")
            L.append("mask = lin < NUMEL")
            self.unravel("lin", "K", self.p, "i")
            self.offsets_for("i", "k", self.p, "off")
            for i, op in enumerate(self.k.ops):
                self.emit_op(i, op)
            for s, st in enumerate(self.k.stores):
                v = self.store_view[s]
                L.append(f"tl.store(out{s} + off{v}, {self.value_for_store(st)}, mask=mask)")
            return L
        L.append(f"rows = tl.program_id(0).to({idx}) * BLOCK_M + tl.arange(0, BLOCK_M).to({idx})")
        L.append(f"rmask = (rows < M){self.RX}")
        self.unravel("rows", "K", self.p, "i")
        self.offsets_for("i", "k", self.p, "ro", row=True)
        if self.one_pass:
            self.emit_cols("tl.arange(0, BLOCK_N)")
            for i, op in enumerate(self.k.ops):
                self.emit_op(i, op)
            self.emit_stores(full=True)
            self.emit_stores(full=False)
        else:
            self.emit_looped()
        return L

    def emit_cols(self, expr, indent=""):
        L = self.lines
        idx = "tl.int64" if self.lay.index64 else "tl.int32"
        L.append(f"{indent}cols = ({expr}).to({idx})")
        L.append(f"{indent}cmask = (cols < N){self.CX}")
        L.append(f"{indent}mask = rmask & cmask")
        self.unravel("cols", "R", self.q, "j", indent)
        self.offsets_for("j", "r", self.q, "co", indent=indent)

    def unravel(self, lin, size, rank, name, indent=""):
        L = self.lines
        if rank == 0:
            return
        rest = lin
        for d in range(rank - 1, 0, -1):
            L.append(f"{indent}{name}{d} = {rest} % {size}{d}")
            L.append(f"{indent}{name}_q{d} = {rest} // {size}{d}")
            rest = f"{name}_q{d}"
        L.append(f"{indent}{name}0 = {rest}")

    def offsets_for(self, idx, stride, rank, out, row=False, indent=""):
        """Per-view offsets along one index space (kept for rows, reduced for columns)."""
        L = self.lines
        for v in range(len(self.lay.views)):
            terms = [f"{idx}{d} * {stride}{v}_{d}" for d in range(rank)]
            if row or not self.rows:
                terms = [f"o{v}"] + terms
            expr = " + ".join(terms) if terms else "0"
            if self.rows and row:
                L.append(f"{indent}{out}{v} = ({expr}){self.RX}" if terms[1:] else f"{indent}{out}{v} = o{v} + rows{self.RX} * 0")
            elif self.rows:
                L.append(f"{indent}{out}{v} = ({expr}){self.CX}" if terms else f"{indent}{out}{v} = cols{self.CX} * 0")
            else:
                L.append(f"{indent}{out}{v} = {expr}" if rank else f"{indent}{out}{v} = o{v} + lin * 0")

    def address(self, v, domain):
        if not self.rows:
            return f"off{v}"
        return f"ro{v}" if domain == "outer" else f"ro{v} + co{v}"

    def mask_for(self, domain):
        return "mask" if (not self.rows or domain == "full") else "rmask"

    # ---- ops ---------------------------------------------------------------------------------------
    def emit_op(self, i, op, indent=""):
        L = self.lines
        cdt = _cdt(op.dtype)
        if isinstance(op, Load):
            v = self.view_of_op[i]
            # fp8 loads take no ``other``: Triton's interpreter cannot cast the 0 to fp8 (masked-off
            # lanes are never stored, and fp8 is storage only: no reduction reads them).
            other = "" if op.dtype in dt.STORAGE_ONLY else ", other=0"
            value = f"tl.load(in{op.input} + ({self.address(v, op.domain)}), mask={self.mask_for(op.domain)}{other})"
            # Widen only when the compute dtype differs: a cast to the storage dtype itself is a no-op,
            # and Triton's interpreter cannot even do that one for fp8.
            L.append(f"{indent}v{i} = {value}" + ("" if op.dtype.kind == "b" or cdt is op.dtype else f".to({_tl(cdt)})"))
        elif isinstance(op, Iota):
            L.append(f"{indent}v{i} = {self.iota_expr(i, op)}")
        elif isinstance(op, Const):
            L.append(f"{indent}v{i} = {self.const_expr(i, op)}")
        elif isinstance(op, Elementwise):
            L.append(f"{indent}v{i} = {self.elementwise_expr(op)}")
        elif isinstance(op, Reduce):
            self.emit_reduce_one_pass(i, op, indent)

    def const_expr(self, i, op: Const) -> str:
        name = f"s{op.slot}"
        if op.dtype == dt.float64:
            return f"{_int64_arg(name)}.to(tl.float64, bitcast=True)"
        if op.dtype.kind == "b":
            return f"(tl.cast({name}, tl.int32) != 0)"
        if _cdt(op.dtype) is not op.dtype and op.dtype.kind == "f":
            # A float16/bfloat16 constant (a weak Python float meeting such an array) holds that dtype's
            # value: rounded here (one conversion per program, no host cost), not used at float32
            # precision (f16 ``x == 0.1`` was False). Through float32, as the reference's torch.full.
            return f"tl.cast({name}, tl.float32).to({_tl(op.dtype)}).to(tl.float32)"
        if _cdt(op.dtype) in (dt.int64, dt.uint64):
            return f"tl.cast({_int64_arg(name)}, {_tl(_cdt(op.dtype))})"
        return f"tl.cast({name}, {_tl(_cdt(op.dtype))})"

    def iota_expr(self, i, op: Iota) -> str:
        v = self.view_of_op[i]
        addr = f"({self.address(v, op.domain)})"
        cdt = _cdt(op.dtype)
        a, b = f"c{i}a", f"c{i}b"
        if op.params[0] == "ramp":
            # A float ramp is computed in float64 and rounded once, as the reference backend does:
            # linspace(0.1, 0.7, 7) ends on 0.7 and arange(0, 1, 0.1) on 0.9, as numpy's (float32 ends
            # one ulp off). Its start and step arrive as float64 bits (iota_values).
            work = "tl.float64" if op.dtype.kind == "f" else "tl.int64"
            if op.dtype.kind == "f":
                a, b = (f"{_int64_arg(n)}.to(tl.float64, bitcast=True)" for n in (a, b))
            else:
                a, b = _int64_arg(a), _int64_arg(b)
            value = f"(tl.cast({a}, {work}) + {addr}.to({work}) * tl.cast({b}, {work}))"
        else:  # eye: ones where column - row == k
            value = f"(({addr} % {b}) - ({addr} // {b}) == {a})"
        if op.dtype.kind == "b":
            return f"({value} != 0)"
        if _is_float8(op.dtype):  # Triton casts float8 only from floats; eye's value is a bool
            value = f"{value}.to(tl.float32)"
        if cdt is not op.dtype:  # a float16/bfloat16 ramp holds float16/bfloat16 values, kept in float32
            return _rounded_to(value, op.dtype)
        return f"{value}.to({_tl(cdt)})"

    def elementwise_expr(self, op: Elementwise) -> str:
        args = [f"v{a}" for a in op.args]
        in_cdt = _cdt(op.in_dtype)
        out_cdt = _cdt(op.dtype)
        if op.prim == "astype":
            value = args[0]
            if _is_float8(in_cdt) and out_cdt.kind != "f":  # Triton casts float8 only to and from floats
                value = f"{value}.to(tl.float32)"
            if op.dtype.kind == "b":
                return f"({value} != 0)"   # compared as a float: -0.0 (float8 code 0x80) is False
            if _is_float8(out_cdt) and in_cdt.kind != "f":
                value = f"{value}.to(tl.float32)"
            expr = f"{value}.to({_tl(out_cdt)})"
            if out_cdt is not op.dtype and op.in_dtype is not op.dtype:
                # A cast the user asked for rounds (70000 -> inf in float16) even though the kernel
                # keeps the narrow value in float32: the float32-intermediate liberty covers arithmetic.
                expr = _rounded_to(args[0], op.dtype)
        elif op.prim == "where":
            expr = f"tl.where({args[0]}, {args[1]}, {args[2]})"
        elif ELEMENTWISE[op.prim].lower_narrow is not None and in_cdt is not op.in_dtype:
            expr = ELEMENTWISE[op.prim].lower_narrow(args, op.in_dtype)
        else:
            expr = ELEMENTWISE[op.prim].lower(args, in_cdt)
        if op.dtype.kind == "b":
            return expr
        if op.prim != "astype":
            expr = f"({expr}).to({_tl(out_cdt)})"
        if config.eager_rounding_in_effect() and op.dtype in (dt.float16, dt.bfloat16):
            expr = f"{expr}.to({_tl(op.dtype)}).to(tl.float32)"
        return expr

    # ---- reductions ------------------------------------------------------------------------------
    def reduce_parts(self, op: Reduce):
        """(combine fn, neutral literal, accumulate dtype, value prep) for a reduction."""
        arg_op = self.k.ops[op.arg]
        src = _cdt(arg_op.dtype)
        if src.kind == "b":
            src = dt.int32
        prim = op.prim
        if prim in ("any", "all"):
            return ("_maximum" if prim == "any" else "_minimum"), _NEUTRAL[prim], dt.int32
        if prim in ("sum", "prod"):
            return REDUCE[prim].combine, _NEUTRAL[prim], _cdt(op.dtype)
        fast = src.kind == "f" and prim in ("max", "min")  # one NaN-propagating max instruction
        combine = ("_f" + REDUCE[prim].combine[1:]) if fast else REDUCE[prim].combine
        if prim in ("max", "argmax"):
            return combine, _lowest(src), src
        return combine, _highest(src), src

    def emit_reduce_one_pass(self, i, op: Reduce, indent=""):
        L = self.lines
        combine, neutral, acc = self.reduce_parts(op)
        val = f"tl.where(mask, v{op.arg}.to({_tl(acc)}), {neutral})"
        if op.prim in ("argmax", "argmin"):
            L.append(f"{indent}v{i}_v, v{i} = tl.reduce(({val}, cols{self.CX} + rows{self.RX} * 0), {self.AX}, {combine}, keep_dims=True)")
            L.append(f"{indent}v{i} = v{i}.to(tl.int64)")
        else:
            L.append(f"{indent}v{i} = {_tree_reduce(val, self.AX, combine)}")
            L.append(f"{indent}v{i} = {self.finish_reduce(i, op)}")

    def finish_reduce(self, i, op: Reduce) -> str:
        if op.prim in ("any", "all"):
            return f"(v{i} != 0)"
        if op.dtype in (dt.float16, dt.bfloat16):
            # rounded to its dtype even where it stays in the kernel: the scheduler recomputes a reduction
            # in each kernel that reads it inline, and another kernel may store it (rounded) for others, so
            # an unrounded copy here would disagree with it (softmax(prod(x)) in bf16 above 1). A row's
            # result is rounded once; the accumulation itself stays in float32.
            return f"v{i}.to({_tl(op.dtype)}).to(tl.float32)"
        return f"v{i}.to({_tl(_cdt(op.dtype))})"

    def emit_looped(self):
        """Rows too long for one block: one loop over the row per stage of dependent reductions."""
        L = self.lines
        ops = self.k.ops
        stage = self.stages()
        done = set()
        # per-row values that need no reduction
        for i, op in enumerate(ops):
            if op.domain == "outer" and stage[i] == 0 and not isinstance(op, Reduce):
                self.emit_op(i, op)
                done.add(i)
        last = max(stage.values(), default=0)
        full_stores = [s for s in self.k.stores if s.domain == "full"]
        # Full values that need no reduction result are stored from the first loop, as they are
        # computed (one pass over the inputs), instead of by a loop of their own that recomputes them.
        stored_early = bool(full_stores) and last >= 1 and all(stage[s.op] == 0 for s in full_stores)
        for s in range(1, last + 1):
            reds = [i for i, op in enumerate(ops) if isinstance(op, Reduce) and stage[i] == s]
            for i in reds:
                combine, neutral, acc = self.reduce_parts(ops[i])
                L.append(f"acc{i} = tl.full({self.TILE}, {neutral}, {_tl(acc)})")
                if ops[i].prim in ("argmax", "argmin"):
                    L.append(f"idx{i} = tl.zeros({self.TILE}, tl.int64)")
            L.append("for n0 in range(0, N, BLOCK_N):")
            self.emit_cols("n0 + tl.arange(0, BLOCK_N)", indent="    ")
            roots = [ops[i].arg for i in reds] + ([st.op for st in full_stores] if stored_early and s == 1 else [])
            needed = self.full_closure(roots, done)
            for j in needed:
                self.emit_op(j, ops[j], indent="    ")
            if stored_early and s == 1:
                self.emit_stores(full=True, indent="    ")
            for i in reds:
                combine, neutral, acc = self.reduce_parts(ops[i])
                val = f"tl.where(mask, v{ops[i].arg}.to({_tl(acc)}), {neutral})"
                if ops[i].prim in ("argmax", "argmin"):
                    L.append(f"    acc{i}, idx{i} = {combine}(acc{i}, idx{i}, {val}, (cols{self.CX} + rows{self.RX} * 0).to(tl.int64))")
                else:
                    L.append(f"    acc{i} = {combine}(acc{i}, {val})")
            for i in reds:
                combine, _, _ = self.reduce_parts(ops[i])
                if ops[i].prim in ("argmax", "argmin"):
                    L.append(f"v{i}_v, v{i} = tl.reduce((acc{i}, idx{i}), {self.AX}, {combine}, keep_dims=True)")
                else:
                    L.append(f"v{i} = {_tree_reduce(f'acc{i}', self.AX, combine)}")
                    L.append(f"v{i} = {self.finish_reduce(i, ops[i])}")
                done.add(i)
            for i, op in enumerate(ops):
                if op.domain == "outer" and stage[i] == s and i not in done:
                    self.emit_op(i, op)
                    done.add(i)
        if full_stores and not stored_early:
            L.append("for n0 in range(0, N, BLOCK_N):")
            self.emit_cols("n0 + tl.arange(0, BLOCK_N)", indent="    ")
            for j in self.full_closure([s.op for s in full_stores], done):
                self.emit_op(j, ops[j], indent="    ")
            self.emit_stores(full=True, indent="    ")
        self.emit_stores(full=False)

    def stages(self) -> dict:
        """Per op, how many dependent reduction loops precede it. Ops are in SSA order, so one
        forward pass suffices (no recursion: a fused chain can be thousands of ops deep)."""
        stage, outer = {}, {}  # outer[i]: the latest stage of a per-row value that op i depends on
        for i, op in enumerate(self.k.ops):
            deps = [op.arg] if isinstance(op, Reduce) else list(getattr(op, "args", ()))
            if isinstance(op, Reduce):
                stage[i] = outer[op.arg] + 1
            else:
                stage[i] = max((stage[d] for d in deps), default=0)
            outer[i] = stage[i] if op.domain == "outer" else max((outer[d] for d in deps), default=0)
        return stage

    def full_closure(self, roots, done) -> list:
        """Full-domain ops (in order) needed for ``roots``, stopping at per-row values already computed."""
        need = set()
        stack = list(roots)
        while stack:
            i = stack.pop()
            if i in need or i in done:
                continue
            need.add(i)
            stack.extend(getattr(self.k.ops[i], "args", ()))
        return sorted(need)

    def emit_stores(self, full: bool, indent=""):
        for s, st in enumerate(self.k.stores):
            if (st.domain == "full") != full:
                continue
            v = self.store_view[s]
            value = self.value_for_store(st)
            self.lines.append(f"{indent}tl.store(out{s} + ({self.address(v, st.domain)}), {value}, "
                              f"mask={self.mask_for(st.domain)})")

    def value_for_store(self, st) -> str:
        op = self.k.ops[st.op]
        value = f"v{st.op}"
        target = st.dtype
        if not self.rows:
            shape = "lin"
        else:
            shape = f"(rows{self.RX} + cols{self.CX})" if st.domain == "full" else f"rows{self.RX}"
        if isinstance(op, Const) or (self.rows and st.domain == "full" and op.domain == "outer"):
            # broadcast by subtracting zeros (adding them would turn -0.0 into +0.0); a float8 value (no
            # arithmetic in Triton) goes through float32, which holds it exactly
            wide = f"{value}.to(tl.float32)" if _cdt(op.dtype) in dt.STORAGE_ONLY else value
            value = f"({wide} - {shape} * 0)"
        if target.kind == "b":
            return f"({value} != 0)"
        return f"{value}.to({_tl(target)})"


_SOURCES: dict = {}
# source key -> the signature it was generated from (its ops), for profiler names: kept through
# fa.clear_caches, since a jit trace keeps its launchers (and so its kernels' keys) through it
SIGNATURES_BY_KEY: dict = {}
NAME_OPS = 6  # op names shown in a kernel's name (profilers truncate long ones)


def _op_signature(op) -> tuple:
    if isinstance(op, Load):
        return ("L", op.input, op.domain, op.dtype.name)
    if isinstance(op, Iota):
        return ("I", op.params[0], op.domain, op.dtype.name)
    if isinstance(op, Const):
        return ("C", op.slot, op.domain, op.dtype.name)
    if isinstance(op, Elementwise):
        return ("E", op.prim, op.args, op.domain, op.dtype.name, op.in_dtype.name)
    return ("R", op.prim, op.arg, op.dtype.name)


def iota_names(kernel: Kernel) -> list:
    return [name for i, op in enumerate(kernel.ops) if isinstance(op, Iota) for name in (f"c{i}a", f"c{i}b")]


def iota_values(kernel: Kernel) -> list:
    """An iota's parameters are structure (part of every key), passed as run-time arguments."""
    values = []
    for op in kernel.ops:
        if isinstance(op, Iota):
            if op.params[0] == "ramp":
                d = dt.float64 if op.dtype.kind == "f" else op.dtype
                values += [_scalar(op.params[1], d), _scalar(op.params[2], d)]
            else:
                values += [int(op.params[1]), int(op.params[2])]
    return values


def _int64_arg(name: str) -> str:
    """An integer scalar argument at 64 bits. Triton's interpreter holds an int in [2^31, 2^32) as uint32 data,
    and its cast to int64 only relabels it (3e9 + 3e9 wrapped at 2^32); adding an int64 zero widens the data.
    Compiled, the addition folds away."""
    return f"(tl.cast({name}, tl.int64) + tl.zeros((), tl.int64))"


def _scalar_annotation(d: dt.DType) -> str:
    """A fixed argument type, so the value never changes which kernel Triton picks (i32 vs i64)."""
    return "tl.float32" if d.kind == "f" and d is not dt.float64 else "tl.int64"


def _scalar(value, d: dt.DType):
    return scalar_arg(float(value) if d.kind == "f" else bool(value) if d.kind == "b" else int(value), d)


def _lowest(d: dt.DType) -> str:
    if d.kind == "f":
        return 'float("-inf")'
    if d.kind == "b":
        return "0"
    import torch
    return str(torch.iinfo(d.torch).min)


def _highest(d: dt.DType) -> str:
    if d.kind == "f":
        return 'float("inf")'
    if d.kind == "b":
        return "1"
    import torch
    return str(torch.iinfo(d.torch).max)
