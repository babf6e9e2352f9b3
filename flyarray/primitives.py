"""Every primitive's rules, in one table per kind.

An elementwise primitive states: its arity; which input kinds it accepts;
how the output dtype follows from the (already promoted) input dtype; its
reference implementation (torch eager: the CPU backend and the test oracle);
and its lowering (a Triton expression over argument expressions, computed in
``compute_dtype``). ``ext`` in a lowering is the extern math library:
Triton's libdevice on a GPU, numpy under the interpreter (backends/interpret.py).

A reduce primitive states its identity, its combine rule in Triton, its
reference, and its result dtype.

A library primitive (a hand-written kernel: matmul, attention, ...) states its
abstract evaluation (checks and result types, run at record time), its kernel,
its reference, and optionally an epilogue rule through which the scheduler
moves elementwise consumers into the kernel. The ops that define them register
here, so the scheduler and the runtime never import the front (``ops``).
"""
from __future__ import annotations

import numpy as np
import torch

from . import dtypes as dt
from . import unsigned
from .ir import Primitive


class Elementwise(Primitive):
    kind = "elementwise"
    # Complex inputs: the rule that rewrites this op on complex values into real ops (complex_lowering.py
    # registers it; None: complex inputs raise TypeError), and whether the result is real (abs).
    complex_rule = None
    complex_real_result = False

    def __init__(self, name, arity, accepts, out, reference, lower, lower_narrow=None):
        super().__init__(name)
        self.arity = arity
        self.accepts = accepts  # 'any' | 'numeric' | 'float' | 'integer' | 'int_bool'
        self.out = out  # 'same' | 'bool' | 'float' (integers promote to float32 first)
        self.reference = reference
        self.lower = lower  # (arg_exprs, compute DType) -> Triton expression
        # For the few ops whose answer depends on the storage precision (nextafter): the lowering
        # used when fp16/bf16 inputs are computed in fp32. (arg_exprs, storage DType) -> fp32 expression
        self.lower_narrow = lower_narrow
        self._unsigned_reference = None

    def reference_for(self, d: dt.DType):
        """The torch reference for inputs of dtype ``d``: uint16/32/64 through unsigned.py's exact rules
        (torch has no CPU arithmetic for them)."""
        if not unsigned.is_wide(d.torch):
            return self.reference
        if self._unsigned_reference is None:
            self._unsigned_reference = unsigned.elementwise(self.name, self.reference, self.out == "bool")
        return self._unsigned_reference


class Reduce(Primitive):
    kind = "reduce"

    def __init__(self, name, reference, combine, out):
        super().__init__(name)
        self.reference = reference
        self.combine = combine  # name of a combine function in codegen's prelude
        self.out = out  # 'sum' (signed ints and bool widen to int64, unsigned to uint64) | 'same' | 'index' | 'bool'
        self._unsigned_reference = None

    def reference_for(self, d: dt.DType):
        """The torch reference for an input of dtype ``d`` (uint16/32/64: unsigned.py)."""
        if not unsigned.is_wide(d.torch):
            return self.reference
        if self._unsigned_reference is None:
            self._unsigned_reference = unsigned.reduce(self.name, self.reference)
        return self._unsigned_reference


class Library(Primitive):
    """A hand-written kernel as a graph node.

    ``abstract(*nodes, **params) -> [(shape, dtype), ...]`` checks inputs and gives result types;
    ``kernel(*tensors, **params)`` is our Triton kernel (interpreted on CPU tensors);
    ``reference(*tensors, **params)`` is torch eager. ``epilogue(node, uses, wanted) -> bool``, where
    given, rewrites an elementwise ``node`` over this op's output into one call of the kernel.
    """
    kind = "library"
    reinterpret = False  # a torch view of its input (view_as_real/view_as_complex): no launch, no kernel

    def __init__(self, name, abstract, kernel, reference, epilogue=None, writes_into=False, warms_up=False):
        super().__init__(name)
        self.abstract = abstract
        self.kernel = kernel
        self.reference = reference
        self.epilogue = epilogue
        # ``kernel(*tensors, into=[tensor or None per output], **params)`` writes those outputs into the
        # given (strided) tensors: the scheduler then lets the call write a concat's parts itself
        self.writes_into = writes_into
        # a new plan may dry-run ``kernel`` on fake tensors to compile its launches ahead (precompile.py):
        # only for kernels whose host code reads no tensor data and keeps no state from such a run
        self.warms_up = warms_up
        LIBRARY[name] = self

    def run(self, backend: str, tensors: list, kwargs: dict, into=None) -> list:
        """The outputs; ``into`` (writes_into ops): a tensor per output to write it into, or None."""
        if into is not None and backend != "reference":
            out = self.kernel(*tensors, into=into, **kwargs)
        else:
            out = (self.reference if backend == "reference" else self.kernel)(*tensors, **kwargs)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        if into is not None and backend == "reference":   # the reference has no kernel to aim
            out = [result if given is None else given.copy_(result) for result, given in zip(out, into)]
        return out


class Composite(Primitive):
    """An op written on primitives, recorded as one node so recording and the plan's walk stay cheap.

    ``expand(*input_nodes, **params) -> [root node per output]`` builds its primitive graph; the
    plan stage calls it only on a plan miss (expand.py), so a hit never pays for the expansion.
    Python scalars in ``params`` are part of the plan's key (by their bits).
    """
    kind = "composite"

    def __init__(self, name, expand):
        super().__init__(name)
        self.expand = expand


ELEMENTWISE: dict = {}
REDUCE: dict = {}
LIBRARY: dict = {}


def _ew(name, arity, accepts, out, reference, lower, lower_narrow=None):
    ELEMENTWISE[name] = Elementwise(name, arity, accepts, out, reference, lower, lower_narrow)


def _f(expr):  # a lowering from a format string over a, b, c
    return lambda args, cdt: expr.format(*args)


def _in_float32_at_least(fn):
    """``fn`` computed as the kernels do: half types in float32, rounded once."""
    def reference(x, out=None):
        wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
        result = fn(wide).to(x.dtype)
        return out.copy_(result) if out is not None else result
    return reference


# Below these the logistic 1 / (1 + e^-z) is e^z to the dtype's precision (1 + e^z rounds to 1), and e^-z
# overflows first past -88.7 in float32 (silu(-89.05) gave -0.0 for -1.9e-37, sigmoid a 0 for a subnormal):
# sigmoid, silu and gelu_tanh take e^z there (JAX's logistic keeps that tail too).
_LOGISTIC_TAIL = {"float32": -20.0, "float64": -40.0}
# Below these e^z nears the subnormals, whose few significant bits x * e^z would scale up (silu(-102.9) was 50 ulps
# off): x * e^z is taken as (x * e^(z/2)) * e^(z/2) there, z/2 exact and e^(z/2) normal, rounded last where small.
_DEEP_TAIL = {"float32": -87.0, "float64": -708.0}


def _logistic_tail(name) -> float:
    return _LOGISTIC_TAIL["float64" if name == "float64" else "float32"]


def _deep_tail(name) -> float:
    return _DEEP_TAIL["float64" if name == "float64" else "float32"]


def _times_logistic(x, z, cdt):
    """x * sigmoid(z) as generated source (x None: sigmoid(z)), with e^z in the tail."""
    if x is None:
        return f"tl.where({z} < {_logistic_tail(cdt.name)!r}, ext.exp({z}), {_rn_div('1.0', f'(1.0 + ext.exp(-{z}))', cdt)})"
    x_exp = (f"tl.where({z} < {_deep_tail(cdt.name)!r}, ({x} * ext.exp(0.5 * {z})) * ext.exp(0.5 * {z}), "
             f"{x} * ext.exp({z}))")
    return f"tl.where({z} < {_logistic_tail(cdt.name)!r}, {x_exp}, {_rn_div(x, f'(1.0 + ext.exp(-{z}))', cdt)})"


def _x_times_exp(x, z):
    """x * e^z for the reference, as _times_logistic's generated tail computes it."""
    deep = _deep_tail("float64" if z.dtype == torch.float64 else "float32")
    half = torch.exp(0.5 * z)
    return torch.where(z < deep, (x * half) * half, x * torch.exp(z))


def _in_logistic_tail(z):
    """Where a float32 or float64 tensor ``z`` lies in the logistic's e^z tail (the reference's test)."""
    return z < _logistic_tail("float64" if z.dtype == torch.float64 else "float32")


def _layout_invariant(fn, numpy_fn):
    """``fn`` of floating CPU tensors through numpy in float64, rounded once to their dtype: torch's vectorized
    and scalar CPU paths of these functions differ by an ulp (atan2 of 4 float64 elements against 8; also atanh,
    exp2, sigmoid, pow, hypot, logaddexp, sinh, cosh), so one value computed in two kernels of different layouts
    was two values -- the gradient of max(atan2(stack([v, v]), c)) compared them and found no position equal to
    the max: all 0. numpy's are the same in every layout. Other devices and dtypes: ``fn``."""
    def reference(*args, out=None):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or tensors[0].device.type != "cpu" or not tensors[0].is_floating_point():
            return fn(*args) if out is None else fn(*args, out=out)
        with np.errstate(all="ignore"):
            result = numpy_fn(*[a.detach().to(torch.float64).resolve_neg().numpy() if isinstance(a, torch.Tensor)
                                else a for a in args])
        result = torch.from_numpy(np.asarray(result, dtype=np.float64)).to(tensors[0].dtype)
        return result if out is None else out.copy_(result)
    return reference


def _gelu_tanh_reference(x, z):
    return torch.where(_in_logistic_tail(z), _x_times_exp(x, z), x * _logistic_reference(z))


def _torch_logistic(z):
    return torch.where(_in_logistic_tail(z), torch.exp(z), torch.sigmoid(z))


def _numpy_logistic(z):
    return np.where(z < _LOGISTIC_TAIL["float64"], np.exp(z), 1.0 / (1.0 + np.exp(-z)))


# torch.sigmoid(z) with e^z in the tail, as the kernels compute it (z float32 or float64)
_logistic_reference = _layout_invariant(_torch_logistic, _numpy_logistic)


def _rn_div(a, b, cdt):
    """a / b correctly rounded, as torch's and numpy's: Triton lowers a float32 ``/`` to NVIDIA's div.full.f32
    (up to 2 ulp off; sigmoid measured 3.1 ulp on an H100); float64 ``/`` is div.rn already."""
    return f"tl.math.div_rn({a}, {b})" if cdt.name == "float32" else f"({a} / {b})"


def _sqrt_reference(x, out=None):
    """sqrt correctly rounded: torch's CPU kernels are off by an ulp on a sixth of float32 inputs (and
    some float64 ones), numpy's are exact; float16/bfloat16 round from an exact float32 result."""
    if x.device.type != "cpu" or x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return torch.sqrt(x, out=out)
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
    with np.errstate(invalid="ignore"):   # sqrt of a negative is NaN, as torch's, without a warning
        result = torch.from_numpy(np.asarray(np.sqrt(wide.resolve_neg().numpy())))
    if out is not None:
        return out.copy_(result)
    return result if result.dtype == x.dtype else result.to(x.dtype)


def _by_nonzero_integer(op, a, b):
    """``op(a, b)`` with an integer zero divisor giving numpy's 0, as the generated kernels do (torch raises
    ZeroDivisionError, late and unnamed, at evaluation; the wider unsigned types take unsigned.py's rule, which
    gives 0 too)."""
    if isinstance(b, torch.Tensor):
        if b.dtype.is_floating_point or b.dtype.is_complex:
            return op(a, b)
        zero = b == 0
        r = op(a, torch.where(zero, torch.ones((), dtype=b.dtype, device=b.device), b))
        return torch.where(zero, torch.zeros((), dtype=r.dtype, device=r.device), r)
    if type(b) is int and b == 0 and isinstance(a, torch.Tensor) and not (a.dtype.is_floating_point
                                                                        or a.dtype.is_complex):
        return torch.zeros_like(a)
    return op(a, b)


def _floor_divide_reference(a, b):
    t = a if isinstance(a, torch.Tensor) else b
    if t.dtype in (torch.float16, torch.bfloat16):   # in float32, rounded once, as the generated kernels: torch's
        wide = [x.float() if isinstance(x, torch.Tensor) else x for x in (a, b)]   # vectorized CPU loop rounds
        return torch.div(*wide, rounding_mode="floor").to(t.dtype)                 # its steps (bf16 45 // 0.1001: 450)
    return _by_nonzero_integer(lambda x, y: torch.div(x, y, rounding_mode="floor"), a, b)


def _remainder_of(a, b):
    """torch.remainder, except for floats on the CPU: torch's vectorized CPU remainder (and fmod)
    computes a - floor(a / b) * b, NaN where a / b overflows (1.0 % 1e-310, 1e300 % 1e-300; float32
    3e38 % 1e-8) though the remainder is finite; numpy's is libm's exact fmod, as the generated kernels'
    (float16/bfloat16 through float32, which holds their remainders exactly)."""
    t = a if isinstance(a, torch.Tensor) else b
    if not (t.dtype in _EXACT_REMAINDER_DTYPES and t.device.type == "cpu"):
        return torch.remainder
    return _exact_remainder


_EXACT_REMAINDER_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _exact_remainder(a, b):
    t = a if isinstance(a, torch.Tensor) else b
    wide = torch.float64 if t.dtype == torch.float64 else torch.float32
    a, b = torch.broadcast_tensors(torch.as_tensor(a, dtype=wide, device="cpu"),
                                   torch.as_tensor(b, dtype=wide, device="cpu"))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        r = torch.from_numpy(np.asarray(np.remainder(a.numpy(), b.numpy())))   # 0-d gives a numpy scalar
    return r.to(t.dtype)


def _remainder_reference(a, b, out=None):
    """torch.remainder, with a zero result signed as the divisor (the array API's rule; torch keeps the
    dividend's sign for floats)."""
    r = _by_nonzero_integer(_remainder_of(a, b), a, b)
    if r.dtype.is_floating_point:
        r = torch.where(r == 0, torch.copysign(torch.zeros_like(r), torch.as_tensor(b, dtype=r.dtype, device=r.device)),
                        r)
    return r if out is None else out.copy_(r)


def _float_only(fn_name):
    return lambda args, cdt: f"ext.{fn_name}({args[0]})"


# ---- unary, float results -------------------------------------------------------------
for _name, _ref, _low in [
    # libdevice exp, not tl.exp: for float32 Triton lowers that to 2**(x * log2(e)) on the approximate ex2, up to
    # ~60 ulp off for large |x| (the product's rounding is scaled by |x|); torch.exp is within 1-2
    ("exp", torch.exp, _float_only("exp")),
    ("exp2", _layout_invariant(torch.exp2, np.exp2), _f("tl.exp2({0})")),
    ("log", torch.log, _f("tl.log({0})")),
    ("log2", torch.log2, _f("tl.log2({0})")),
    # correctly rounded, as the array API asks: tl.sqrt is approximate for float32 (exact for float64,
    # which sqrt_rn does not take)
    ("sqrt", _sqrt_reference, lambda a, cdt: f"tl.sqrt({a[0]})" if cdt.name == "float64" else f"tl.sqrt_rn({a[0]})"),
    # 1 / correctly rounded sqrt: tl.rsqrt is rsqrt.approx on NVIDIA, flushing float32 subnormals (rsqrt(1e-40)
    # was inf) and unrefined for float64
    ("rsqrt", torch.rsqrt, lambda a, cdt: f"(1.0 / tl.sqrt({a[0]}))" if cdt.name == "float64"
     else _rn_div("1.0", f"tl.sqrt_rn({a[0]})", cdt)),
    ("sin", torch.sin, _f("tl.sin({0})")),
    ("cos", torch.cos, _f("tl.cos({0})")),
    ("erf", torch.erf, _f("tl.erf({0})")),
    # libdevice's erfc (the interpreter binds math.erfc): 1 - erf(x) cancels to nothing past x ~ 4
    ("erfc", torch.erfc, _f("ext.erfc({0})")),
    ("sigmoid", _in_float32_at_least(_logistic_reference), lambda a, cdt: _times_logistic(None, a[0], cdt)),
    ("tan", torch.tan, _float_only("tan")),
    ("tanh", torch.tanh, _float_only("tanh")),
    ("acos", torch.acos, _float_only("acos")),
    ("acosh", torch.acosh, _float_only("acosh")),
    ("asin", torch.asin, _float_only("asin")),
    ("asinh", torch.asinh, _float_only("asinh")),
    ("atan", torch.atan, _float_only("atan")),
    ("atanh", _layout_invariant(torch.atanh, np.arctanh), _float_only("atanh")),
    # (torch's vectorized CPU sinh/cosh also overflow exp(|x|) first: float32 |x| in (88.7, 89.4] gave inf in
    # arrays of 32+ elements, finite in shorter ones and in the kernels; float64 |x| in (709.78, 710.47] likewise)
    ("cosh", _layout_invariant(torch.cosh, np.cosh), _float_only("cosh")),
    ("sinh", _layout_invariant(torch.sinh, np.sinh), _float_only("sinh")),
    ("expm1", torch.expm1, _float_only("expm1")),
    # (torch's float32 CPU log1p loses subnormals: log1p(2^-149) gave 0, log1p(3 * 2^-149) 4 * 2^-149)
    ("log1p", _layout_invariant(torch.log1p, np.log1p), _float_only("log1p")),
    ("log10", torch.log10, _float_only("log10")),
]:
    _ew(_name, 1, "numeric", "float", _ref, _low)

# ---- activations (first-class so the scheduler can move them into a GEMM epilogue) ----------
_ew("relu", 1, "numeric", "same", torch.relu, _f("tl.where({0} < 0, 0, {0})"))
_ew("silu", 1, "float", "same",
    _in_float32_at_least(lambda x: torch.where(_in_logistic_tail(x), _x_times_exp(x, x), torch.nn.functional.silu(x))),
    lambda a, cdt: _times_logistic(a[0], a[0], cdt))
# Both GELUs in forms without cancellation: 0.5 * x * (1 + erf(x / sqrt 2)) and 0.5 * x * (1 + tanh(u)) lose every
# digit below x ~ -3 (torch's own kernels do: gelu(-6.8) gave 0 for 2.9e-11, and the two backends disagreed 10x);
# 0.5 * x * erfc(-x / sqrt 2) and x * sigmoid(2u) are the same functions, accurate in the tail.
_SQRT_HALF = 0.7071067811865476
_TWO_SQRT_2_OVER_PI = 1.5957691216057308


_ew("gelu", 1, "float", "same", _in_float32_at_least(lambda x: 0.5 * x * torch.erfc(x * -_SQRT_HALF)),
    _f(f"(0.5 * {{0}} * ext.erfc({{0}} * {-_SQRT_HALF!r}))"))
_ew("gelu_tanh", 1, "float", "same",
    _in_float32_at_least(lambda x: _gelu_tanh_reference(x, _TWO_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))),
    lambda a, cdt: _times_logistic(a[0], f"({_TWO_SQRT_2_OVER_PI!r} * ({a[0]} + 0.044715 * {a[0]} * {a[0]} * {a[0]}))", cdt))

# ---- unary, same dtype ----------------------------------------------------------------
def _negate(a, cdt):
    """A float's sign bit flipped, NaNs included (as torch.negative), rather than -x: Triton 3.6 lowers
    a float's -x to 0 - x, which makes -(+0.0) +0.0 (3.9 has fneg)."""
    if cdt.kind != "f":
        return f"(-{a[0]})"
    bits = 8 * cdt.itemsize
    return f"({a[0]}.to(tl.int{bits}, bitcast=True) ^ {-(1 << (bits - 1))}).to(tl.{cdt.triton}, bitcast=True)"


_ew("negative", 1, "numeric", "same", torch.negative, _negate)
_ew("positive", 1, "numeric", "same", torch.positive, _f("{0}"))
_ew("abs", 1, "numeric", "same", torch.abs, _f("tl.abs({0})"))
_ew("square", 1, "numeric", "same", torch.square, _f("({0} * {0})"))
_ew("sign", 1, "numeric", "same", lambda x: torch.where(torch.isnan(x), x, torch.sign(x)),  # sign(NaN) is NaN
    lambda a, cdt: (f"tl.where({a[0]} > 0, 1.0, tl.where({a[0]} < 0, -1.0, {a[0]} * 0.0 + 0.0)).to(tl.{cdt.triton})"
                    if cdt.kind == "f" else f"tl.where({a[0]} > 0, 1, tl.where({a[0]} < 0, -1, 0)).to(tl.{cdt.triton})"))
_ew("floor", 1, "numeric", "same", torch.floor, lambda a, cdt: f"tl.floor({a[0]})" if cdt.kind == "f" else a[0])
_ew("ceil", 1, "numeric", "same", torch.ceil, lambda a, cdt: f"tl.ceil({a[0]})" if cdt.kind == "f" else a[0])
_ew("trunc", 1, "numeric", "same", torch.trunc, lambda a, cdt: f"ext.trunc({a[0]})" if cdt.kind == "f" else a[0])
# nearbyint (half to even, as torch.round), not rint: Triton 3.6's HIP libdevice has no rint (gfx950 and gfx942 could
# not compile a round, so neither a complex prod)
_ew("round", 1, "numeric", "same", torch.round, lambda a, cdt: f"ext.nearbyint({a[0]})" if cdt.kind == "f" else a[0])
_ew("reciprocal", 1, "float", "same", torch.reciprocal, lambda a, cdt: _rn_div("1.0", a[0], cdt))
_ew("bitwise_invert", 1, "int_bool", "same", torch.bitwise_not,
    lambda a, cdt: f"({a[0]} == 0)" if cdt.kind == "b" else f"(~{a[0]})")
_ew("logical_not", 1, "any", "bool", torch.logical_not, _f("({0} == 0)"))
_ew("isnan", 1, "any", "bool", torch.isnan, lambda a, cdt: f"({a[0]} != {a[0]})" if cdt.kind == "f" else f"({a[0]} != {a[0]})")
_ew("isinf", 1, "any", "bool", torch.isinf,
    lambda a, cdt: f"(tl.abs({a[0]}) == float('inf'))" if cdt.kind == "f" else f"({a[0]} != {a[0]})")
_ew("isfinite", 1, "any", "bool", torch.isfinite,
    lambda a, cdt: f"(tl.abs({a[0]}) < float('inf'))" if cdt.kind == "f" else f"({a[0]} == {a[0]})")
_ew("signbit", 1, "numeric", "bool", torch.signbit,
    lambda a, cdt: f"(ext.signbit({a[0]}) != 0)" if cdt.kind == "f" else f"({a[0]} < 0)")

# ---- binary -----------------------------------------------------------------------------
_ew("add", 2, "any", "same", torch.add,
    lambda a, cdt: f"({a[0]} | {a[1]})" if cdt.kind == "b" else f"({a[0]} + {a[1]})")
_ew("subtract", 2, "numeric", "same", torch.subtract, _f("({0} - {1})"))
_ew("multiply", 2, "any", "same", torch.multiply,
    lambda a, cdt: f"({a[0]} & {a[1]})" if cdt.kind == "b" else f"({a[0]} * {a[1]})")
_ew("divide", 2, "float", "same", torch.divide, lambda a, cdt: _rn_div(a[0], a[1], cdt))
_ew("floor_divide", 2, "numeric", "same", _floor_divide_reference,
    lambda a, cdt: f"_ffloordiv({a[0]}, {a[1]})" if cdt.kind == "f" else f"_ifloordiv({a[0]}, {a[1]})")
_ew("remainder", 2, "numeric", "same", _remainder_reference,
    lambda a, cdt: f"_fremainder({a[0]}, {a[1]})" if cdt.kind == "f" else f"_iremainder({a[0]}, {a[1]})")
_ew("pow", 2, "numeric", "same", _layout_invariant(torch.pow, np.power),
    lambda a, cdt: f"ext.pow({a[0]}, {a[1]})" if cdt.kind == "f" else f"_ipow({a[0]}, {a[1]})")
def _ordered_zeros(fn, low_wins):
    """torch's maximum/minimum with IEEE 754-2019's order of zeros: -0 < +0 (JAX's answers; torch returns either
    operand, and its vectorized and scalar CPU paths differ)."""
    def reference(a, b, out=None):
        # a Python scalar's tensor where the other operand is (not torch's default device: a notebook's
        # `with torch.device("meta")` would make it a meta tensor)
        tensor = a if isinstance(a, torch.Tensor) else b
        device = tensor.device if isinstance(tensor, torch.Tensor) else "cpu"
        r = fn(torch.as_tensor(a, device=device), torch.as_tensor(b, device=device))
        if r.is_floating_point():
            a, b = torch.as_tensor(a, dtype=r.dtype, device=device), torch.as_tensor(b, dtype=r.dtype, device=device)
            first = torch.signbit(a) if low_wins else ~torch.signbit(a)
            r = torch.where(a == b, torch.where(first, a, b), r)
        return r if out is None else out.copy_(r)
    return reference


def _extremum(name, low_wins):
    """maximum/minimum: a tie (equal operands: only zeros differ) picks by the sign bit, as the reference."""
    def lower(a, cdt):
        if cdt.kind != "f":
            return f"_{name}({a[0]}, {a[1]})"
        negative = f"({a[0]}.to(tl.int{8 * cdt.itemsize}, bitcast=True) < 0)"
        pick = f"tl.where({negative}, {a[0]}, {a[1]})" if low_wins else f"tl.where({negative}, {a[1]}, {a[0]})"
        return f"tl.where({a[0]} == {a[1]}, {pick}, _f{name}({a[0]}, {a[1]}))"
    return lower


_ew("maximum", 2, "numeric", "same", _ordered_zeros(torch.maximum, False), _extremum("maximum", False))
_ew("minimum", 2, "numeric", "same", _ordered_zeros(torch.minimum, True), _extremum("minimum", True))
_ew("atan2", 2, "float", "same", _layout_invariant(torch.atan2, np.arctan2), _f("ext.atan2({0}, {1})"))
_ew("hypot", 2, "float", "same", _layout_invariant(torch.hypot, np.hypot), _f("ext.hypot({0}, {1})"))
_ew("copysign", 2, "float", "same", torch.copysign, _f("ext.copysign({0}, {1})"))
_ew("nextafter", 2, "float", "same", torch.nextafter, _f("ext.nextafter({0}, {1})"),
    lambda a, d: (f"_nextafter16({a[0]}.to(tl.{d.triton}).to(tl.float32), {a[1]}.to(tl.{d.triton}).to(tl.float32), "
                  f"{a[0]}.to(tl.{d.triton}))"))
_ew("logaddexp", 2, "float", "same", _layout_invariant(torch.logaddexp, np.logaddexp), _f("_logaddexp({0}, {1})"))
for _name, _ref, _op in [("equal", torch.eq, "=="), ("not_equal", torch.ne, "!="), ("less", torch.lt, "<"),
                         ("less_equal", torch.le, "<="), ("greater", torch.gt, ">"),
                         ("greater_equal", torch.ge, ">=")]:
    _ew(_name, 2, "any", "bool", _ref, _f("({0} %s {1})" % _op))
# Selects and a comparison rather than & | ^ of two truth values: Triton's interpreter cannot take a
# bitwise op of a block of them with a scalar one from a float argument (logical_or(x, 0.0)).
_ew("logical_and", 2, "any", "bool", torch.logical_and, _f("tl.where({0} != 0, {1} != 0, False)"))
_ew("logical_or", 2, "any", "bool", torch.logical_or, _f("tl.where({0} != 0, True, {1} != 0)"))
_ew("logical_xor", 2, "any", "bool", torch.logical_xor, _f("(({0} != 0) != ({1} != 0))"))
_ew("bitwise_and", 2, "int_bool", "same", torch.bitwise_and, _f("({0} & {1})"))
_ew("bitwise_or", 2, "int_bool", "same", torch.bitwise_or, _f("({0} | {1})"))
_ew("bitwise_xor", 2, "int_bool", "same", torch.bitwise_xor, _f("({0} ^ {1})"))
_ew("bitwise_left_shift", 2, "integer", "same", torch.bitwise_left_shift, _f("({0} << {1})"))
_ew("bitwise_right_shift", 2, "integer", "same", torch.bitwise_right_shift, _f("({0} >> {1})"))

# ---- ternary and casts --------------------------------------------------------------------
# where(cond, x, y): cond is bool, x and y share the output dtype (handled by the API).
_ew("where", 3, "any", "same", torch.where, _f("tl.where({0}, {1}, {2})"))
# astype's target dtype is the node's dtype; codegen emits the cast itself.
_ew("astype", 1, "any", "same", lambda x: x, _f("{0}"))


# ---- reductions ------------------------------------------------------------------------------
# sum and prod of float16/bfloat16 accumulate in float32, as the fused kernels do (the backend rounds the result)
REDUCE["sum"] = Reduce("sum", lambda x, axes: torch.sum(_acc(x), dim=axes, keepdim=True), "_add", "sum")
REDUCE["prod"] = Reduce("prod", lambda x, axes: _prod(_acc(x), axes), "_mul", "sum")
REDUCE["max"] = Reduce("max", lambda x, axes: torch.amax(x, dim=axes, keepdim=True), "_maximum", "same")
REDUCE["min"] = Reduce("min", lambda x, axes: torch.amin(x, dim=axes, keepdim=True), "_minimum", "same")
REDUCE["any"] = Reduce("any", lambda x, axes: torch.any(_flat(x, axes), dim=-1).reshape(_kept(x, axes)), "_or", "bool")
REDUCE["all"] = Reduce("all", lambda x, axes: torch.all(_flat(x, axes), dim=-1).reshape(_kept(x, axes)), "_and", "bool")
REDUCE["argmax"] = Reduce("argmax", lambda x, axes: _arg(x, axes, True), "_argmax", "index")
REDUCE["argmin"] = Reduce("argmin", lambda x, axes: _arg(x, axes, False), "_argmin", "index")


def _acc(x):
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _kept(x, axes):
    return tuple(1 if i in axes else s for i, s in enumerate(x.shape))


def _flat(x, axes):
    """Move ``axes`` last and flatten them into one."""
    kept = [i for i in range(x.dim()) if i not in axes]
    y = x.permute(*kept, *axes)
    reduced = 1
    for a in axes:
        reduced *= x.shape[a]
    return y.reshape(*[x.shape[i] for i in kept], reduced)  # not -1: ambiguous when there are no elements


def _prod(x, axes):
    return torch.prod(_flat(x, axes), dim=-1).reshape(_kept(x, axes))


def _arg(x, axes, largest):
    flat = _flat(x, axes)
    if flat.dtype == torch.bool:  # torch's argmax/argmin reject bool
        flat = flat.to(torch.uint8)
    idx = torch.argmax(flat, dim=-1) if largest else torch.argmin(flat, dim=-1)
    return idx.reshape(_kept(x, axes))


def reduce_dtype(prim: Reduce, d: dt.DType) -> dt.DType:
    if prim.out == "sum":
        return sum_dtype(d)
    if prim.out == "index":
        return dt.int64
    if prim.out == "bool":
        return dt.bool_
    return d


def sum_dtype(d: dt.DType) -> dt.DType:
    """The array API's sum/prod/cumulative_sum dtype: signed integers and bool -> int64 (the default
    integer), unsigned -> uint64 (the unsigned type of its width), floats keep theirs."""
    if d.kind == "u":
        return dt.uint64
    return dt.int64 if d.kind in "bi" else d


def elementwise_out_dtype(prim: Elementwise, d: dt.DType) -> dt.DType:
    if prim.out == "bool":
        return dt.bool_
    return dt.real_dtype(d) if prim.complex_real_result else d


_ACCEPTS = {
    "any": "biuf",
    "numeric": "iuf",
    "float": "f",
    "integer": "iu",
    "int_bool": "biu",
}


def check_storage_only(op: str, d: dt.DType):
    """float8 types are storage: no backend computes on them (torch CPU has no fp8 kernels), so refuse
    at record time rather than fail at evaluation. astype, views and copies never come here."""
    if d in dt.STORAGE_ONLY:
        raise TypeError(f"{op} does not accept {d} inputs: float8 types are storage formats; cast them with "
                        "astype (e.g. x.astype(fa.float32)) first, or use fa.nn.scaled_matmul / fa.quant")


def check_accepts(prim: Elementwise, d: dt.DType):
    check_storage_only(prim.name, d)
    if d.kind == "c":
        if prim.complex_rule is None:
            raise TypeError(f"{prim.name} does not accept {d} inputs (it is defined for real dtypes only)")
        return
    if d.kind not in _ACCEPTS[prim.accepts]:
        raise TypeError(f"{prim.name} does not accept {d} inputs")


# ---- counter-based random bits (fa.random) ---------------------------------------------------------
# threefry2x32 (Salmon et al., SC'11; JAX's default generator): a key (k0, k1) and a counter (c0, c1),
# 32-bit words held in int64, -> two 32-bit words. Written once in torch here (the reference) and once
# in Triton (codegen.PRELUDE's _threefry2x32): here int64 with every word masked to 32 bits, there uint32.
# RANDOM is registered into ELEMENTWISE by flyarray/random.py, after ops/elementwise.py has made one
# array API function per primitive: these are not fa.* functions. random_bits is JAX's 32 random bits
# (x0 ^ x1); threefry2x32_0 and _1 are the words (keys, 64-bit bits).
_M32 = 0xFFFFFFFF
_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k0, k1, c0, c1):
    """The two output words; works on int64 tensors and on Python ints."""
    ks = (k0 & _M32, k1 & _M32, (k0 ^ k1 ^ 0x1BD11BDA) & _M32)
    x0, x1 = (c0 + ks[0]) & _M32, (c1 + ks[1]) & _M32
    for i in range(5):
        for r in _THREEFRY_ROTATIONS[i % 2]:
            x0 = (x0 + x1) & _M32
            x1 = (((x1 << r) | (x1 >> (32 - r))) & _M32) ^ x0
        x0 = (x0 + ks[(i + 1) % 3]) & _M32
        x1 = (x1 + ks[(i + 2) % 3] + i + 1) & _M32
    return x0, x1


RANDOM = {name: Elementwise(name, 4, "integer", "same", ref, _f(f"{fn}({{0}}, {{1}}, {{2}}, {{3}})"))
          for name, ref, fn in [
              ("random_bits", lambda *a: _xor(*threefry2x32(*a)), "_threefry_xor"),
              ("threefry2x32_0", lambda *a: threefry2x32(*a)[0], "_threefry_x0"),
              ("threefry2x32_1", lambda *a: threefry2x32(*a)[1], "_threefry_x1")]}


def _xor(a, b):
    return a ^ b


from . import complex_lowering  # noqa: E402,F401  (registers each primitive's complex rule)
