"""The array API's inspection utilities: ``fa.__array_namespace_info__()`` and ``fa.isdtype``."""
from __future__ import annotations

import torch

from . import dtypes as dt

_KINDS = {
    "bool": "b",
    "signed integer": "i",
    "unsigned integer": "u",
    "integral": "iu",
    "real floating": "f",
    "complex floating": "c",
    "numeric": "iufc",
}


def isdtype(dtype, kind) -> bool:
    """Whether ``dtype`` is of ``kind``: a dtype, one of the array API's kind names ('bool', 'signed integer',
    'unsigned integer', 'integral', 'real floating', 'complex floating', 'numeric'), or a tuple of those."""
    d = dt.dtype(dtype)
    if isinstance(kind, tuple):
        return any(isdtype(d, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"isdtype: unknown kind {kind!r}; expected one of {sorted(_KINDS)}")
        return d.kind in _KINDS[kind] and d not in dt.STORAGE_ONLY
    return d == dt.dtype(kind)


class Info:
    """What this namespace supports (the array API's inspection object)."""

    def capabilities(self) -> dict:
        """{'boolean indexing': True, 'data-dependent shapes': True, 'max dimensions': 64}: boolean masks and
        nonzero evaluate their input to learn the result's shape."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self):
        """The device arrays are made on when none is given: the current CUDA/ROCm device if any, else CPU."""
        from .runtime import default_device
        return default_device()   # as devices() names it: cuda:0, not cuda

    def devices(self) -> list:
        """The devices arrays can live on: the CPU and every visible CUDA/ROCm device."""
        out = [torch.device("cpu")]
        if torch.cuda.is_available():
            out += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        return out

    def default_dtypes(self, *, device=None) -> dict:
        """The default dtypes: float32 for real floating, complex64 for complex, int64 for integral and indexing."""
        _check_device(device)
        return {"real floating": dt.float32, "complex floating": dt.complex64, "integral": dt.int64, "indexing": dt.int64}

    def dtypes(self, *, device=None, kind=None) -> dict:
        """Name -> dtype for the dtypes of ``kind`` (see fa.isdtype; None: all that compute, not float8)."""
        _check_device(device)
        names = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
                 "float32", "float64", "complex64", "complex128"]
        out = {n: dt.dtype(n) for n in names}
        return out if kind is None else {n: d for n, d in out.items() if isdtype(d, kind)}


def _check_device(device) -> None:
    """A device asked about is one arrays can live on (every such device supports the same dtypes): an unknown
    one is a ValueError, as fa.zeros(2, device=...) gives."""
    if device is not None:
        from .ops.creation import _device
        _device(device)


def __array_namespace_info__() -> Info:
    """The array API's inspection object: capabilities(), default_device(), devices(), default_dtypes(),
    dtypes()."""
    return Info()
