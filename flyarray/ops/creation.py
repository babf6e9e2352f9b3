"""Making arrays: from other libraries (zero copy through DLPack) and from nothing."""
from __future__ import annotations

import inspect
import math
import numbers

import numpy as np
import torch

from .. import dlpack as _dlpack
from .. import dtypes as dt
from .. import ir, views
from .._array import Array, _numpy_view
from .checks import check_bool
from .core import NaNToInteger, astype, constant, integer_of_float


class CopyRefused(ValueError):
    """copy=False where the data must be copied (moved, cast, stacked, made from Python values): asarray's
    ValueError, which from_dlpack turns into the array API's BufferError."""


def _device(device) -> torch.device:
    if device is None:
        from ..runtime import default_device
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {device!r}") from exc
    return _available(dev, device)


def _available(dev: torch.device, asked) -> torch.device:
    """``dev`` if arrays can live there (the CPU, a visible CUDA/ROCm device, and 'meta' for dry runs
    that record without evaluating, as the torch backend's), else a ValueError now: an absent device
    would otherwise fail later, at evaluation, with an unrelated error."""
    if dev.type in ("cpu", "meta"):
        from ..runtime import canonical_device
        return canonical_device(dev)
    if dev.type == "cuda" and torch.cuda.is_available():
        if dev.index is None or dev.index < torch.cuda.device_count():
            from ..runtime import canonical_device
            return canonical_device(dev)
    from ..namespace_info import __array_namespace_info__
    names = ", ".join(str(d) for d in __array_namespace_info__().devices())
    raise ValueError(f"device {asked!r} is not available here; arrays can live on: {names}")


def asarray(obj, dtype=None, device=None, copy=None) -> Array:
    """An Array over ``obj``; the same memory where device and layout allow (copy=None or False).

    A torch tensor that requires grad is taken detached: flyarray arrays carry no autograd (use
    ``flyarray.interop.torch``'s differentiable ops for that). The array and the tensor share memory:
    an in-place change to the tensor before evaluation changes the result (docs/semantics.md,
    "Aliasing and zero copy"); ``copy=True`` takes a snapshot instead. A (nested) list that holds arrays
    or tensors is their stack (lazy, as numpy's and JAX's ``asarray([a, b])``). With no ``device``, numpy data
    stays on the CPU (zero copy), a tensor where it is, and Python numbers and lists go to the default device."""
    if type(obj) is torch.Tensor and dtype is None and device is None and (copy is None or copy is False) \
            and not obj.requires_grad \
            and obj.layout is torch.strided and not obj.is_neg() and not obj.is_conj():
        # (a tensor with the negative or conjugate bit goes the slow way, which resolves it: kernels read raw
        # memory. Not only views carry the bits: t.conj().imag.detach() does; is_neg/is_conj cost ~0.05 us)
        d = dt.TORCH_TO_FLYARRAY.get(obj.dtype)
        if d is not None:  # the hot path of a torch round trip: no checks left to make, no copy. The buffer
            # is a tensor object of our own over the same memory (0.5 us): the caller's t.t_(), resize_()
            # or set_() then changes their tensor's shape, not what this array reads
            return Array(ir.Node(ir.SOURCE, (), ir.version_of(obj), tuple(obj.shape), d, obj.device, obj.detach()))
    copy = check_copy("asarray", copy)
    target_dtype = dt.dtype(dtype) if dtype is not None else None
    if isinstance(obj, Array):
        out = obj
        if device is not None and _device(device) != obj.device:
            if copy is False:
                raise CopyRefused(f"copy=False, but the array is on {obj.device}, not {device}")
            out = Array(ir.source(obj._tensor().to(_device(device))))
        if target_dtype is not None and target_dtype != out.dtype:
            if copy is False:
                raise CopyRefused(f"copy=False, but dtype {out.dtype} differs from {target_dtype}")
            return astype(out, target_dtype)
        return astype(out, out.dtype, copy=True) if copy else out
    held = _held_arrays(obj) if isinstance(obj, (list, tuple)) else None
    if held == "arrays":
        return _stacked(obj, dtype, device, copy)
    # numpy arrays in a list (0-d ones too, which torch.tensor cannot read): numpy stacks them, as its asarray does
    tensor = _to_tensor(obj, target_dtype, copy) if held is None else \
        _from_numpy(_copied(obj, copy, lambda: _numpy_stack(obj)), True)
    if device is None and _python_data(obj):
        device = _device(None)  # Python numbers and lists have no device: the default one (the array API's rule)
    if device is not None and tensor.device != _device(device):
        if copy is False:
            raise CopyRefused(f"copy=False, but the data is on {tensor.device}, not {device}")
        tensor = tensor.to(_device(device))
    if target_dtype is not None and tensor.dtype != target_dtype.torch:
        if copy is False:
            raise CopyRefused(f"copy=False, but dtype {dt.from_torch(tensor.dtype)} differs from {target_dtype}")
        return astype(Array(ir.source(tensor)), target_dtype)
    if copy:
        tensor = tensor.clone()
    return Array(ir.source(tensor))


def asarray_beside(obj, device, dtype=None) -> Array:
    """``obj`` as an array for an op whose other operands live on ``device``: numpy data and Python lists go
    there (numpy operands join the other operands' device), a tensor stays where it is."""
    return asarray(obj, dtype=dtype, device=None if isinstance(obj, torch.Tensor) else device)


def _python_data(obj) -> bool:
    """Python numbers and (nested) lists/tuples of them: data with no device of its own, unlike numpy's (the
    CPU, zero copy) and a tensor's."""
    return isinstance(obj, (bool, numbers.Number, list, tuple)) and not isinstance(obj, np.generic)


def _held_arrays(obj):
    """What a (nested) list holds that torch.tensor cannot take: "arrays" (fa arrays or torch tensors: stacked
    lazily), "numpy" (numpy arrays only: numpy stacks them), or None (numbers). One pass over the elements."""
    found = None
    for e in obj:
        if isinstance(e, (Array, torch.Tensor)):
            return "arrays"
        if isinstance(e, np.ndarray):
            found = "numpy"
        elif isinstance(e, (list, tuple)):
            inner = _held_arrays(e)
            if inner == "arrays":
                return inner
            found = found or inner
    return found


def _numpy_stack(obj):
    arr = np.asarray(obj)
    if arr.dtype == object:
        raise TypeError("a list of numpy arrays of different shapes (numpy would make an object array)")
    return arr


def _stacked(obj, dtype, device, copy):
    """A list of arrays (numpy's and JAX's asarray([a, b])): their stack, lazy; a new buffer always."""
    from .manipulation import stack
    if copy is False:
        raise CopyRefused("copy=False, but a list of arrays is stacked into a new buffer")
    return stack([asarray(e, dtype=dtype, device=device) for e in obj])  # not empty: it holds an array


def _copied(obj, copy, make):
    """``make()``: a new buffer from Python values (so copy=False is refused), its errors as TypeError."""
    if copy is False:
        raise CopyRefused("copy=False, but Python scalars and sequences must be copied")
    try:
        return make()
    except NaNToInteger as exc:
        raise NaNToInteger(f"cannot make an array from {type(obj).__name__}: {exc}") from None
    except OverflowError as exc:  # numpy: a Python int out of the dtype's range; or ours (_integer_values)
        raise OverflowError(f"cannot make an array from {type(obj).__name__}: {exc}") from exc
    except (TypeError, ValueError, RuntimeError) as exc:
        if "unpacking long long" in str(exc):  # torch: a Python int past int64 (no dtype given)
            raise OverflowError(f"cannot make an array from {type(obj).__name__}: a Python int past int64's range "
                                f"(-2**63..2**63-1); for 2**63..2**64-1 pass dtype=fa.uint64") from exc
        raise TypeError(f"cannot make an array from {type(obj).__name__}: {exc}") from exc


def _to_tensor(obj, target_dtype, copy) -> torch.Tensor:
    if isinstance(obj, torch.Tensor):
        return _plain_tensor(obj, copy)
    if isinstance(obj, np.ndarray):
        return _from_numpy(obj, copy)
    if isinstance(obj, np.generic) and obj.dtype.name in _ML_DTYPES:   # bfloat16/float8 scalars: torch.tensor refuses them
        return _from_numpy(np.asarray(obj), True)
    if hasattr(obj, "__dlpack__"):
        return from_dlpack(obj)._node.buffer
    wide_unsigned = target_dtype is not None and target_dtype.kind == "u" and target_dtype.itemsize > 1
    if (isinstance(obj, np.generic) and obj.dtype.kind == "u") or (wide_unsigned and isinstance(obj, (int, list, tuple))):
        # through numpy: torch.tensor refuses np.uint64, and older torch Python ints >= 2^63 for uint64
        arr = _copied(obj, copy, lambda: np.array(obj, dtype=target_dtype.name if wide_unsigned else None))
        return _from_numpy(arr, copy)
    if isinstance(obj, (bool, numbers.Number, list, tuple, np.generic)):
        if isinstance(obj, complex) and target_dtype is not None and target_dtype.kind != "c":
            raise TypeError(f"asarray: a Python complex {obj!r} cannot be {target_dtype}; use a complex dtype")
        if target_dtype is not None and target_dtype.kind in "iu":
            t = _copied(obj, copy, lambda: _integer_values(obj, target_dtype).to(target_dtype.torch))
        else:   # on the CPU, not torch's default device (a `with torch.device("meta")` around would make it meta)
            t = _copied(obj, copy, lambda: torch.tensor(obj, dtype=target_dtype.torch if target_dtype else None,
                                                        device="cpu"))
        if t.dtype == torch.float64 and target_dtype is None and not isinstance(obj, np.generic):
            t = t.float()  # the array API's default float is float32
        _check_supported(t.dtype)
        return t
    try:  # the buffer protocol (array.array, memoryview, bytearray), as the array API's asarray takes it
        view = memoryview(obj)
    except TypeError:
        view = None
    if view is not None:  # numpy reads the format and shape; the same memory unless read-only (then a copy)
        return _from_numpy(np.asarray(view), copy)
    raise TypeError(f"cannot make an array from {type(obj).__name__}: it is not a DLPack producer "
                    "(no __dlpack__), a numpy array, an object with the buffer protocol, or a (nested) "
                    "sequence of numbers")


def _integer_values(obj, d) -> torch.Tensor:
    """Python numbers (or nested lists of them) going into integer dtype ``d``, checked: torch would wrap -1 into
    uint8 as 255, and read a list holding a float as float32 (16777217.0 rounded) or float64 (a large int beside
    a float lost its low bits)."""
    t = torch.tensor(obj, device="cpu")
    if t.is_floating_point() or t.is_complex():   # element by element: ints exact, floats truncated, complex refused
        t = torch.tensor(_leaves_as_ints(obj, d), dtype=torch.int64, device="cpu")
    if not t.numel() or t.dtype == torch.bool:
        return t
    info, lo, hi = torch.iinfo(d.torch), int(t.min()), int(t.max())
    if lo < info.min or hi > info.max:
        raise OverflowError(f"a Python int ({lo if lo < info.min else hi}) does not fit {d} "
                            f"(range {info.min}..{info.max})")
    return t


def _leaves_as_ints(obj, d):
    """``obj``'s numbers as Python ints for integer dtype ``d``: floats truncate toward zero, as astype, and are
    refused where that has no value in ``d`` (NaN, inf, past its range), as fa.full refuses them."""
    if isinstance(obj, (list, tuple)):
        return [_leaves_as_ints(v, d) for v in obj]
    if isinstance(obj, complex) or (isinstance(obj, np.generic) and obj.dtype.kind == "c"):
        raise TypeError(f"asarray: a complex value {obj!r} cannot be {d}; use a complex dtype")
    if isinstance(obj, (float, np.floating)):
        return integer_of_float(float(obj), d)
    return int(obj)


def _plain_tensor(t: torch.Tensor, copy) -> torch.Tensor:
    """A torch tensor as an array's buffer: detached (arrays carry no autograd), strided, and holding plain
    values: a conjugate or negative view (t.conj(), t.conj().imag) is resolved into a copy, since kernels
    read memory and would miss the bit (so copy=False refuses it)."""
    _check_supported(t.dtype)
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        refuse_fake(t)
    refuse_sparse(t)
    t = t.detach()
    if t.is_conj() or t.is_neg():
        if copy is False:
            raise CopyRefused("copy=False, but this torch tensor is a conjugate/negative view, whose values must be "
                             "copied (resolve_conj()/resolve_neg())")
        t = t.resolve_conj().resolve_neg()
    return t


def refuse_sparse(t):
    if t.layout is not torch.strided:
        raise TypeError(f"cannot make an array from a {t.layout} torch tensor: only dense (strided) tensors; "
                        "use t.to_dense()")


def refuse_fake(t):
    """A FakeTensor (torch's FakeTensorMode) on the CPU or a GPU looks like a tensor there but has no memory
    (data_ptr 0): an array over it would be read by kernels and by torch.from_dlpack (a segfault). Refused, naming
    the way to a dry run; a fake on 'meta' (the torch backend's dry run) is a meta array, which never evaluates."""
    from torch._subclasses.fake_tensor import is_fake
    if t.device.type != "meta" and is_fake(t):
        raise RuntimeError("cannot make an array from a FakeTensor (made under torch's FakeTensorMode): it has no "
                           "memory; for a dry run pass a 'meta' tensor, which records without evaluating")


# dtypes numpy has only through ml_dtypes (what np.asarray gives out for them): taken in as same-width
# integers, which torch.from_numpy knows, then viewed back as torch's dtype of that name
_ML_DTYPES = {"bfloat16": (np.int16, torch.bfloat16), "float8_e4m3fn": (np.uint8, torch.float8_e4m3fn),
              "float8_e5m2": (np.uint8, torch.float8_e5m2)}


def _from_numpy(arr: np.ndarray, copy) -> torch.Tensor:
    if arr.dtype.name not in {d.name for d in dt.ALL} and arr.dtype != np.bool_:
        raise TypeError(f"numpy dtype {arr.dtype} has no flyarray equivalent")
    # torch has no negative strides, strides that are not a whole number of elements (a field of a
    # structured array), read-only or byte-swapped memory: those arrays are copied
    size = arr.itemsize
    if not arr.flags.writeable or arr.dtype.byteorder not in "=|" or any(s < 0 or s % size for s in arr.strides):
        if copy is False:
            raise CopyRefused("copy=False, but this numpy array is read-only, byte-swapped, or has negative strides "
                             "or strides that are not a multiple of its itemsize, and must be copied")
        arr = np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C", copy=True)
    ml = _ML_DTYPES.get(arr.dtype.name)
    if ml is not None and arr.dtype.itemsize == np.dtype(ml[0]).itemsize:
        return torch.from_numpy(arr.view(ml[0])).view(ml[1])
    return torch.from_numpy(arr)


def check_copy(where: str, copy):
    """``copy`` as the array API has it: True, False or None (numpy's bools too); "no" or 0.0 were taken by their
    truth value, the opposite of what was asked."""
    if copy is None or isinstance(copy, (bool, np.bool_)):
        return None if copy is None else bool(copy)
    raise TypeError(f"{where}: copy must be True, False or None, got {copy!r} of type {type(copy).__name__}")


def _check_supported(t: torch.dtype):
    dt.from_torch(t)  # raises a clear TypeError for dtypes we do not model


def from_dlpack(x, /, *, device=None, copy=None) -> Array:
    """Take any DLPack producer (torch, numpy, JAX, CuPy) without a copy.

    A torch tensor that requires grad is taken detached, as ``fa.asarray`` takes it: flyarray
    arrays carry no autograd (use flyarray.interop.torch's differentiable ops for gradients).
    """
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack needs an object with __dlpack__, got {type(x).__name__}")
    copy = check_copy("from_dlpack", copy)
    try:
        return _from_dlpack(x, device, copy)
    except CopyRefused as exc:   # the array API's from_dlpack: BufferError where copy=False needs a copy
        raise BufferError(f"from_dlpack: {exc}") from None


# torch >= 2.8's from_dlpack hands copy= to the producer's __dlpack__
_TORCH_PASSES_COPY = "copy" in inspect.signature(torch.from_dlpack).parameters


def _from_dlpack(x, device, copy) -> Array:
    if isinstance(x, Array):
        return asarray(x, device=device, copy=copy)
    if isinstance(x, np.ndarray):
        t = _from_numpy(x, copy)
        copy = copy and np.may_share_memory(x, _numpy_view(t))  # a copy already made (read-only memory) is not made twice
    elif isinstance(x, torch.Tensor):
        # taken as asarray takes it, not through torch's own export: that refuses a tensor that requires
        # grad or has the conjugate bit, and drops the negative bit (the values would change sign)
        resolved = x.is_conj() or x.is_neg()
        t = _plain_tensor(x, copy)
        copy = copy and not resolved  # resolving made the copy already
    elif not _dlpack.has_negative_strides(x):   # another producer (JAX, CuPy, array_api_strict): torch's consumer
        if copy is not None and _TORCH_PASSES_COPY:   # the producer's own copy or refusal (BufferError: a view it
            t, copy = torch.from_dlpack(x, copy=copy), False   # cannot export without copying)
        else:
            if copy is False:   # an older torch cannot pass copy=False on: ask the producer first
                x.__dlpack__(copy=False)
            t = torch.from_dlpack(x)
    else:   # which would abort the process on negative strides (dlpack.py): numpy's takes them on the CPU
        arr = _dlpack.numpy_of_cpu_producer(x)
        if arr is None:
            raise BufferError(f"from_dlpack: this {type(x).__name__} has negative strides, which torch's DLPack "
                              "consumer cannot take off the CPU; pass a contiguous copy of it")
        t = _from_numpy(arr, copy)   # a copy (torch has no negative strides): copy=False refuses
        copy = False
    _check_supported(t.dtype)
    if copy:
        t = t.clone()
    if device is not None and t.device != _device(device):
        if copy is False:
            raise CopyRefused(f"copy=False, but the data is on {t.device}, not {device}")
        t = t.to(_device(device))
    return Array(ir.source(t))


def full(shape, fill_value, *, dtype=None, device=None) -> Array:
    """A lazy constant array of ``shape`` filled with ``fill_value`` (no memory until evaluated).

    Default dtype from the scalar: bool -> bool, int -> int64, float -> float32 (numpy gives float64)."""
    return _full("full", shape, fill_value, dtype, device)


def _full(name, shape, fill_value, dtype, device) -> Array:
    shape = _shape(shape)
    if not isinstance(fill_value, (numbers.Number, np.generic)):
        raise TypeError(f"{name}: fill_value must be a Python or numpy scalar, got {fill_value!r} of type "
                        f"{type(fill_value).__name__}")
    if isinstance(fill_value, np.generic) and fill_value.dtype.kind in "biufc":   # numpy's np.full: its dtype
        dtype = fill_value.dtype if dtype is None else dtype
        fill_value = fill_value.item()
    d = dt.dtype(dtype) if dtype is not None else dt.result_type(fill_value)
    if d.kind in "iu" and isinstance(fill_value, float):
        fill_value = integer_of_float(fill_value, d)   # NaN, inf, 300.0 for uint8: refused as asarray refuses them
    return Array(constant(fill_value, shape, d, _device(device)))


def zeros(shape, *, dtype=None, device=None) -> Array:
    """A lazy array of zeros; any dtype, default float32 (numpy's is float64)."""
    return full(shape, 0, dtype=dtype or dt.default_float(), device=device)


def ones(shape, *, dtype=None, device=None) -> Array:
    """A lazy array of ones; any dtype, default float32 (numpy's is float64)."""
    return full(shape, 1, dtype=dtype or dt.default_float(), device=device)


def empty(shape, *, dtype=None, device=None) -> Array:
    """Uninitialized in spirit; we hand back zeros (any dtype, default float32), which cost nothing until read.

    numpy returns uninitialized memory; here the contents are always zero."""
    return zeros(shape, dtype=dtype, device=device)


def full_like(x, fill_value, *, dtype=None, device=None) -> Array:
    """``full`` with the shape of ``x`` and, unless given, its dtype and device."""
    from .core import array_arg
    x = array_arg(x, "full_like: x")
    return _full("full_like", x.shape, fill_value, dtype or x.dtype, device or x.device)


def zeros_like(x, *, dtype=None, device=None) -> Array:
    """Zeros with the shape of ``x`` and, unless given, its dtype and device."""
    return full_like(x, 0, dtype=dtype, device=device)


def ones_like(x, *, dtype=None, device=None) -> Array:
    """Ones with the shape of ``x`` and, unless given, its dtype and device."""
    return full_like(x, 1, dtype=dtype, device=device)


def empty_like(x, *, dtype=None, device=None) -> Array:
    """Like ``zeros_like``: flyarray's "empty" arrays are zeros (numpy leaves them uninitialized)."""
    return zeros_like(x, dtype=dtype, device=device)


def arange(start, /, stop=None, step=1, *, dtype=None, device=None) -> Array:
    """Evenly spaced values in [start, stop) with ``step``, computed lazily in the kernel that reads them.

    Default dtype: int64 when start, stop and step are all ints, else float32 (numpy gives float64)."""
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"arange: {name} must be a real number, got {v!r} of type {type(v).__name__}")
        if not math.isfinite(v):
            raise ValueError(f"arange: {name} must be finite, got {v!r}")
    # Python numbers from here on (numpy scalars too): a ramp's params key its plan (plan.freeze), and an int64
    # numpy start is an integer ramp, as numpy's
    start, stop, step = (int(v) if isinstance(v, numbers.Integral) else float(v) for v in (start, stop, step))
    if step == 0:
        raise ValueError("arange: step must not be zero")
    n = max(0, math.ceil((stop - start) / step))
    (n,) = views.check_shape((n,), f"arange({start}, {stop}, {step}) shape")
    if dtype is None:
        dtype = dt.int64 if all(isinstance(v, int) for v in (start, stop, step)) else dt.default_float()
    d = dt.dtype(dtype)
    if d.kind == "b" and n > 2:   # numpy's rule: a bool ramp of more than two values has no meaning
        raise TypeError(f"arange: dtype bool holds at most 2 values, got {n}")
    if d.kind in "iu" and n:
        _check_ramp_fits(start, start + (n - 1) * step, d)
    return _iota(("ramp", start, step), (n,), d, device)


def _check_ramp_fits(first, last, d):
    """An integer ramp's ends within ``d`` (a ramp is monotonic): arange(-5, 5, 3, dtype=uint8) would wrap."""
    info = torch.iinfo(d.torch)
    if not (info.min <= min(first, last) and max(first, last) <= info.max):
        raise OverflowError(f"arange: values from {first} to {last} do not fit {d} (range {info.min}..{info.max})")


def _iota(params, shape, d, device) -> Array:
    """An index ramp (arange, linspace, eye); a complex one is the real ramp cast (zero imaginary parts)."""
    if d.kind == "c":
        return Array(ir.Node(ir.IOTA, (), params, shape, dt.real_dtype(d), _device(device))).astype(d)
    return Array(ir.Node(ir.IOTA, (), params, shape, d, _device(device)))


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True) -> Array:
    """``num`` evenly spaced values from start to stop (stop included when ``endpoint``), computed lazily.

    Default dtype float32 (numpy's is float64); ``num`` is positional-or-keyword as in the array API."""
    num = views.as_int(num, "linspace: num")
    endpoint = check_bool("linspace", "endpoint", endpoint)
    for name, v in (("start", start), ("stop", stop)):
        if not (isinstance(v, numbers.Number) or hasattr(v, "__float__")):   # a 0-d array too
            raise TypeError(f"linspace: {name} must be a number, got {v!r} of type {type(v).__name__}")
    if num < 0:
        raise ValueError(f"linspace: num must be >= 0, got {num}")
    (num,) = views.check_shape((num,), "linspace: num")
    if isinstance(start, complex) or isinstance(stop, complex):
        d = dt.dtype(dtype) if dtype is not None else dt.complex64
        if d.kind != "c":
            raise TypeError(f"linspace: a complex start or stop ({start!r}, {stop!r}) needs a complex dtype, got {d}")
    else:
        d = dt.dtype(dtype) if dtype is not None else dt.default_float()
    if d.kind == "c":  # a ramp per part
        from .elementwise import complex_from_parts
        start, stop, r = complex(start), complex(stop), dt.real_dtype(d)
        parts = [linspace(getattr(start, p), getattr(stop, p), num, dtype=r, device=device, endpoint=endpoint)
                 for p in ("real", "imag")]
        return complex_from_parts(*parts)
    div = (num - 1) if endpoint else num
    step = (stop - start) / div if div > 0 else 0.0
    # an integer result is the float64 ramp rounded down (numpy's rule: -10..0 in 5 is -10 -8 -5 -3 0);
    # an integer ramp would round the step itself first
    ramp = d if d.kind == "f" else dt.float64
    node = ir.Node(ir.IOTA, (), ("ramp", float(start), float(step)), (num,), ramp, _device(device))
    values = Array(node)
    if endpoint and num > 1:  # numpy writes stop into the last slot: start + (num - 1) * step may miss it
        from .core import where
        last = float(stop)
        if ramp in (dt.float16, dt.bfloat16):  # a float16 ramp holds float16 values (rounded as codegen's)
            last = torch.tensor(last, dtype=torch.float64, device="cpu").float().to(ramp.torch).item()
        positions = dt.int32 if num <= 2**31 else dt.int64   # an int32 ramp would not hold num - 1
        values = where(_iota(("ramp", 0, 1), (num,), positions, device) == num - 1, last, values)
    if ramp is d:
        return values
    from .core import elementwise
    return (values if d.kind == "b" else elementwise("floor", values)).astype(d)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None) -> Array:
    """A 2-D array with ones on diagonal ``k`` and zeros elsewhere, computed lazily; default dtype float32."""
    n_cols = n_rows if n_cols is None else n_cols
    shape = views.check_shape((n_rows, n_cols), "eye: (n_rows, n_cols)")
    k = views.as_int(k, "eye: k")
    d = dt.dtype(dtype) if dtype is not None else dt.default_float()
    return _iota(("eye", k, shape[1]), shape, d, device)


def _shape(shape) -> tuple:
    return views.check_shape(shape)
