"""Data types, the array-API promotion table, and their torch/numpy/Triton names.

A DType is a small immutable value: its name, kind ('b' bool, 'i' signed,
'u' unsigned, 'f' float, 'c' complex) and item size. Complex dtypes have no Triton
type: graphs holding them are rewritten to real arithmetic before scheduling
(complex_lowering.py). Promotion follows the array API
standard's lattice; where the standard is silent (bool or int with float) we
follow JAX: bool meets anything at that thing, an integer meets a float at
that float. Python scalars are weak: they take the array's dtype.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch


@dataclasses.dataclass(frozen=True, eq=False)  # one instance per dtype: identity is equality (and fast)
class DType:
    """An element type (``fa.float32``, ``fa.int8``, ...): name, kind ('b', 'i', 'u', 'f'), itemsize, and the
    matching torch dtype. One instance per dtype (identity is equality); APIs that take a dtype also accept
    a torch dtype or a name such as "float32"."""
    name: str
    kind: str  # 'b', 'i', 'u', 'f', 'c'
    itemsize: int
    torch: torch.dtype = dataclasses.field(repr=False)
    triton: str = dataclasses.field(repr=False)  # triton.language name

    def __repr__(self):
        return f"fa.{self.name}"

    __str__ = __repr__

    # one instance per dtype survives copying and pickling (identity is equality): by name
    def __reduce__(self):
        return (dtype, (self.name,))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    @property
    def is_floating(self) -> bool:
        return self.kind == "f"

    @property
    def is_complex(self) -> bool:
        return self.kind == "c"

    @property
    def is_integer(self) -> bool:
        return self.kind in "iu"

    @property
    def bits(self) -> int:
        return self.itemsize * 8


bool_ = DType("bool", "b", 1, torch.bool, "int1")
int8 = DType("int8", "i", 1, torch.int8, "int8")
int16 = DType("int16", "i", 2, torch.int16, "int16")
int32 = DType("int32", "i", 4, torch.int32, "int32")
int64 = DType("int64", "i", 8, torch.int64, "int64")
uint8 = DType("uint8", "u", 1, torch.uint8, "uint8")
float16 = DType("float16", "f", 2, torch.float16, "float16")
bfloat16 = DType("bfloat16", "f", 2, torch.bfloat16, "bfloat16")
float32 = DType("float32", "f", 4, torch.float32, "float32")
float64 = DType("float64", "f", 8, torch.float64, "float64")
# OCP MX element types (storage only: arithmetic on them goes through fa.quant / scaled_matmul).
float8_e4m3fn = DType("float8_e4m3fn", "f", 1, torch.float8_e4m3fn, "float8e4nv")
float8_e5m2 = DType("float8_e5m2", "f", 1, torch.float8_e5m2, "float8e5")

ALL = [bool_, int8, int16, int32, int64, uint8, float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2]
STORAGE_ONLY = {float8_e4m3fn, float8_e5m2}

# Complex dtypes (a real and an imaginary part of float32 / float64): no Triton name; lowered to real pairs.
complex64 = DType("complex64", "c", 8, torch.complex64, "")
complex128 = DType("complex128", "c", 16, torch.complex128, "")
COMPLEX = (complex64, complex128)
ALL.extend(COMPLEX)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME["bool_"] = bool_
_BY_TORCH = {d.torch: d for d in ALL}
TORCH_TO_FLYARRAY = _BY_TORCH  # read-only outside this module

# Unsigned integers wider than a byte (issue 13). torch has the dtypes but few CPU kernels for them:
# the reference backend computes them exactly on int64 lanes (unsigned.py).
uint16 = DType("uint16", "u", 2, torch.uint16, "uint16")
uint32 = DType("uint32", "u", 4, torch.uint32, "uint32")
uint64 = DType("uint64", "u", 8, torch.uint64, "uint64")
for _d in (uint16, uint32, uint64):
    ALL.append(_d)
    _BY_NAME[_d.name] = _d
    _BY_TORCH[_d.torch] = _d

# The array API's promotion lattice for the pairs it defines (symmetric).
_PAIRS = {
    ("i", 1, "i", 2): int16, ("i", 1, "i", 4): int32, ("i", 1, "i", 8): int64,
    ("i", 2, "i", 4): int32, ("i", 2, "i", 8): int64, ("i", 4, "i", 8): int64,
    ("u", 1, "i", 1): int16, ("u", 1, "i", 2): int16, ("u", 1, "i", 4): int32, ("u", 1, "i", 8): int64,
}

# unsigned with unsigned: the wider; unsigned with signed: the smallest signed type holding both. None holds
# uint64 and a signed type: the array API leaves those pairs undefined, and promote() refuses them.
_PAIRS.update({
    ("u", 1, "u", 2): uint16, ("u", 1, "u", 4): uint32, ("u", 1, "u", 8): uint64,
    ("u", 2, "u", 4): uint32, ("u", 2, "u", 8): uint64, ("u", 4, "u", 8): uint64,
    ("u", 2, "i", 1): int32, ("u", 2, "i", 2): int32, ("u", 2, "i", 4): int32, ("u", 2, "i", 8): int64,
    ("u", 4, "i", 1): int64, ("u", 4, "i", 2): int64, ("u", 4, "i", 4): int64, ("u", 4, "i", 8): int64,
})


def dtype(obj) -> DType:
    """Anything that names a dtype -> DType; a clear error for anything else."""
    if isinstance(obj, DType):
        return obj
    if isinstance(obj, torch.dtype) and obj in _BY_TORCH:
        return _BY_TORCH[obj]
    if isinstance(obj, str) and obj in _BY_NAME:
        return _BY_NAME[obj]
    if obj is None:   # numpy reads None as float64; where None means "the default", callers say so first
        raise TypeError("dtype None: name a dtype (fa.float32, 'float32', torch.float32, ...)")
    if obj is bool:
        return bool_
    if obj is int:
        return int64
    if obj is float:
        return float32
    if obj is complex:
        return complex64
    try:
        npd = np.dtype(obj)
    except TypeError:
        npd = None
    if npd is not None and npd.name in _BY_NAME:
        return _BY_NAME[npd.name]
    if npd is not None and npd.name == "bool":
        return bool_
    known = ", ".join(d.name for d in ALL)
    raise TypeError(f"unknown dtype {obj!r}; flyarray supports: {known}")


def from_torch(t: torch.dtype) -> DType:
    """The DType of a torch dtype (TypeError for those flyarray does not model)."""
    if t not in _BY_TORCH:
        raise TypeError(f"torch dtype {t} has no flyarray equivalent")
    return _BY_TORCH[t]


def promote(a: DType, b: DType) -> DType:
    """The array API's result type of two array dtypes."""
    if a == b:
        return a
    if a in STORAGE_ONLY or b in STORAGE_ONLY:
        raise TypeError(f"{a} and {b}: float8 types are storage formats; cast them with astype first")
    if a.kind == "c" or b.kind == "c":
        return _promote_complex(a, b)
    if a.kind == "b" or b.kind == "b":
        other = b if a.kind == "b" else a
        return other  # bool meets anything at that thing (JAX's rule)
    if a.kind == "f" and b.kind == "f":
        if {a, b} == {float16, bfloat16}:
            return float32
        return a if a.itemsize > b.itemsize else b
    if a.kind == "f" or b.kind == "f":
        return a if a.kind == "f" else b  # int meets float at that float (JAX's rule)
    key = (a.kind, a.itemsize, b.kind, b.itemsize)
    if key in _PAIRS:
        return _PAIRS[key]
    key = (b.kind, b.itemsize, a.kind, a.itemsize)
    if key in _PAIRS:
        return _PAIRS[key]
    if {a.kind, b.kind} == {"u", "i"}:  # uint64 with a signed integer: no integer type holds both
        raise TypeError(f"{a} and {b} have no common dtype: the array API defines no promotion between uint64 and "
                        "a signed integer type (no integer type holds both ranges); cast one with astype first")
    raise TypeError(f"no promotion rule for {a} and {b}")


def real_dtype(d: DType) -> DType:
    """The dtype of a complex dtype's parts (complex64 -> float32); other dtypes map to themselves."""
    return {complex64: float32, complex128: float64}.get(d, d)


def complex_dtype(d: DType) -> DType:
    """The complex dtype holding parts of float dtype ``d`` (float64 -> complex128, other floats -> complex64)."""
    if d.kind == "c":
        return d
    return complex128 if d == float64 else complex64


def _promote_complex(a: DType, b: DType) -> DType:
    """complex with complex: the wider; with a float: the complex whose parts are the wider float
    (float64 + complex64 -> complex128); with bool or an integer: the complex (JAX's rule, as for floats)."""
    if a.kind == "c" and b.kind == "c":
        return a if a.itemsize > b.itemsize else b
    c, other = (a, b) if a.kind == "c" else (b, a)
    if other.kind == "f":
        return complex_dtype(promote(real_dtype(c), other))
    return c


def result_type(*args) -> DType:
    """Promote array dtypes; Python scalars are weak: they take the arrays' dtype when their kind fits."""
    arrays = [a for a in args if isinstance(a, DType)]
    scalars = [a for a in args if not isinstance(a, DType)]
    if not args:
        raise ValueError("result_type needs at least one array, dtype or Python scalar")
    if not arrays:
        return scalar_dtype(scalars[0]) if len(scalars) == 1 else _promote_all([scalar_dtype(s) for s in scalars])
    out = _promote_all(arrays)
    for s in scalars:
        out = _weak_promote(out, s)
    return out


def _promote_all(ds):
    out = ds[0]
    for d in ds[1:]:
        out = promote(out, d)
    return out


def scalar_dtype(value) -> DType:
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return int64
    if isinstance(value, float):
        return float32
    if isinstance(value, complex):
        return complex64
    raise TypeError(f"unsupported scalar {value!r} of type {type(value).__name__}")


def _weak_promote(d: DType, value) -> DType:
    if isinstance(value, bool):
        return d
    if isinstance(value, int):
        return d if d.kind != "b" else int64
    if isinstance(value, float):
        return d if d.kind in "fc" else float32
    if isinstance(value, complex):  # a float array meets a complex scalar at the complex of its precision
        return complex_dtype(d) if d.kind in "fc" else complex64
    raise TypeError(f"unsupported scalar {value!r} of type {type(value).__name__}")


def default_float() -> DType:
    return float32


def default_int() -> DType:
    return int64


def compute_dtype(d: DType) -> DType:
    """What fused kernels compute in: fp16/bf16 widen to fp32 (XLA's liberty; see EAGER_ROUNDING)."""
    return float32 if d in (float16, bfloat16) else d


@dataclasses.dataclass(frozen=True)
class FInfo:
    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: DType


@dataclasses.dataclass(frozen=True)
class IInfo:
    bits: int
    max: int
    min: int
    dtype: DType


def _dtype_of_array(d):
    """finfo/iinfo take an array as well as a dtype (the array API): an array's dtype. Classes (np.float32,
    whose ``dtype`` attribute is a descriptor) pass through."""
    if not isinstance(d, (DType, type)) and hasattr(d, "dtype") and hasattr(d, "shape"):
        return d.dtype
    return d


def finfo(d) -> FInfo:
    """Limits of a floating dtype or array's (bits, eps, max, min, smallest_normal), from torch.finfo; TypeError
    otherwise.
    A complex dtype gives its parts' limits (complex64: float32's), as the array API says."""
    d = real_dtype(dtype(_dtype_of_array(d)))
    if d.kind != "f":
        raise TypeError(f"finfo needs a floating dtype, got {d}")
    fi = torch.finfo(d.torch)
    return FInfo(fi.bits, fi.eps, fi.max, fi.min, fi.smallest_normal, d)


def iinfo(d) -> IInfo:
    """Limits of an integer dtype or array's (bits, max, min), from torch.iinfo; TypeError for bool and floats."""
    d = dtype(_dtype_of_array(d))
    if d.kind not in "iu":
        raise TypeError(f"iinfo needs an integer dtype, got {d}")
    ii = torch.iinfo(d.torch)
    return IInfo(ii.bits, ii.max, ii.min, d)
