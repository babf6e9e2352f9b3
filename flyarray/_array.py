"""Array: an immutable, lazy handle on a graph node.

Nothing computes when an op is recorded. Evaluation is triggered only by
``fa.eval``, ``block_until_ready`` and data access (``__repr__``,
``__array__``, ``__dlpack__``, ``torch()``, ``item``,
``tolist``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``,
``__complex__``, ``__format__``, ``__contains__``) -- that list is the whole of it (docs/semantics.md).
"""
from __future__ import annotations

import numpy as np
import torch

from . import dlpack as _dlpack
from . import dtypes as _dt
from .ir import VIEW as _VIEW, Node


class Array:
    """An immutable, lazy n-d array: ops record a graph node; evaluation happens only on data access,
    ``fa.eval`` or ``block_until_ready``. Unlike numpy/JAX arrays it has no in-place ``__setitem__``."""
    __slots__ = ("_node", "__weakref__")
    __array_priority__ = 100  # numpy defers to our reflected operators
    __array_ufunc__ = None  # ndarray + Array -> Array.__radd__ (lazy), not an evaluated numpy array

    def __init__(self, node: Node):
        if not isinstance(node, Node):   # the public class is no constructor of values: fa.asarray is
            raise TypeError(f"fa.Array wraps a graph node, not {type(node).__name__}; use fa.asarray(value) "
                            "to make an array")
        self._node = node

    # ---- metadata (no evaluation) -------------------------------------------------------
    @property
    def shape(self) -> tuple:
        """The shape, a tuple of ints (no evaluation)."""
        return self._node.shape

    @property
    def dtype(self) -> _dt.DType:
        """The element type, an ``fa.DType`` (e.g. ``fa.float32``); no evaluation."""
        return self._node.dtype

    @property
    def device(self) -> torch.device:
        """The ``torch.device`` the array lives (or will be computed) on; no evaluation."""
        return self._node.device

    @property
    def ndim(self) -> int:
        """The number of dimensions, ``len(shape)`` (no evaluation)."""
        return len(self._node.shape)

    @property
    def size(self) -> int:
        """The number of elements, the product of ``shape`` (no evaluation)."""
        return self._node.size

    @property
    def sharding(self):
        """None: an fa.Array is whole on its device (fa.device_put makes a split fa.sharding.ShardedArray)."""
        return None

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    @property
    def T(self) -> "Array":
        """The transpose of a 2-D array (a lazy view). Unlike numpy, other ranks raise ValueError; use ``mT``."""
        if self.ndim != 2:
            raise ValueError(f".T needs a 2-D array (got shape {self.shape}); use .mT or permute_dims")
        return _ops().permute_dims(self, (1, 0))

    @property
    def mT(self) -> "Array":
        """The last two axes swapped (a lazy view); needs at least 2 dimensions. Any dtype."""
        if self.ndim < 2:
            raise ValueError(f".mT needs at least 2 dimensions (got shape {self.shape})")
        axes = list(range(self.ndim))
        axes[-1], axes[-2] = axes[-2], axes[-1]
        return _ops().permute_dims(self, tuple(axes))

    # ---- evaluation triggers ----------------------------------------------------------------
    def block_until_ready(self) -> "Array":
        """Evaluate this array and wait for its device to finish; returns ``self`` (as in JAX)."""
        from .runtime import synchronize
        _plan().realize([self])
        synchronize(self.device)
        return self

    def _values(self) -> torch.Tensor:
        """``_tensor()`` for a caller that reads the values (numpy, DLPack, Python scalars): an array on
        the 'meta' device has none, which it says in flyarray's words, not torch's."""
        self._refuse_meta()
        return self._tensor()

    def _refuse_meta(self):
        if self._node.device.type == "meta":
            from .runtime import no_values_on_meta
            no_values_on_meta()

    def _tensor(self) -> torch.Tensor:
        """The realized value as a torch tensor (a view of the buffer where torch can express it)."""
        node = self._node
        buffer = node.buffer
        if buffer is not None:  # realized and not a view: the common case after evaluation
            return buffer
        plan = _plan()
        if node.prim is not _VIEW:
            plan.realize_node(node)
        else:
            plan.realize([self])
        buffer = node.buffer
        return buffer if buffer is not None else _plan().runtime.tensor_of(node)

    def torch(self) -> torch.Tensor:
        """The value as a torch tensor sharing this array's memory: the fastest way out (evaluates).

        The tensor shares the array's memory (writing into it changes this array), but it is a tensor
        object of its own: an in-place shape change on it (t_(), resize_()) leaves the array as it is."""
        buffer = self._node.buffer
        return (buffer if buffer is not None else self._tensor()).detach()

    def __repr__(self):
        if self.device.type == "meta":   # shapes and dtypes, no values: nothing to evaluate (torch's form)
            return f"Array(..., shape={tuple(self.shape)}, dtype={self.dtype.name}, device='meta')"
        # numpy's printing: the shortest digits that tell values apart, where torch's rounds to 4 decimals
        inner = np.array2string(_printable(self._tensor()), separator=", ", prefix="Array(")
        if self.size == 0 and self.ndim != 1:   # "[]" alone hides the shape (numpy's form)
            inner += f", shape={self.shape}"
        return f"Array({inner}, dtype={self.dtype.name})"

    def __str__(self):
        """``print(x)`` and ``str(x)`` (evaluates): the values as numpy prints them (``[1.5 2. ]``,
        ``0.25`` for 0-d), as numpy's and JAX's arrays do; the repr keeps the dtype. A 'meta' array has
        no values: its repr."""
        if self.device.type == "meta":
            return repr(self)
        return np.array2string(_printable(self._tensor()))

    def _repr_mimebundle_(self, include=None, exclude=None):
        """A notebook's display: unevaluated, the array says it is lazy and shows its fa.explain view
        without running anything (repr and print still evaluate, as documented); evaluated, None
        (IPython then shows the repr)."""
        from .explain import notebook_bundle
        return notebook_bundle(self)

    def __array__(self, dtype=None, copy=None):
        """The value as a numpy array (evaluates): the array's own memory, read-only (arrays are immutable),
        unless ``copy`` or a ``dtype`` asks for a new one. bfloat16 and float8 need the ``ml_dtypes`` package."""
        t = self._values()
        if t.device.type != "cpu":
            t = t.cpu()
            if copy is False:
                raise ValueError("copy=False: the array is on a GPU, numpy needs host memory")
        elif copy is False and self._copied_view(t):
            raise ValueError("copy=False, but this view has no memory of its own (torch has no strides for it, "
                             "e.g. a flip): numpy would get a copy")
        arr = _numpy_view(t.detach())
        if dtype is not None:
            if copy is False and np.dtype(dtype) != arr.dtype:
                raise ValueError(f"copy=False, but the array is {arr.dtype}, not {np.dtype(dtype)}: converting "
                                 "copies (as numpy's np.array(a, dtype=..., copy=False) refuses)")
            arr = arr.astype(dtype, copy=bool(copy))
        if copy:
            return arr.copy()
        arr = arr.view()  # a read-only window on the buffer: writing would change an immutable array
        link = arr
        while isinstance(link, np.ndarray):   # the bases too: numpy lets a view be made writable again while
            link.flags.writeable = False       # its base is (and x.base would be writable itself)
            link = link.base
        return arr

    def _copied_view(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (this array's ``_tensor()``) is a fresh copy rather than this array's memory: a view
        torch cannot express over its base (a flip, a reshape of a transposed buffer) is materialized anew."""
        node = self._node
        if node.prim is not _VIEW or not t.numel():
            return False
        base = node.inputs[0].buffer
        return base is not None and t.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()

    def __array_namespace__(self, /, *, api_version=None):
        """The array API namespace of this array: the ``flyarray`` module (``api_version``: None or a
        version up to "2024.12")."""
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise ValueError(f"api_version {api_version!r} is not supported; flyarray implements '2024.12'")
        import flyarray
        return flyarray

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if max_version is not None or stream is not None:
            _dlpack.check_export_args(self._node.device, stream, max_version)
        if dl_device is None and copy is None:  # the buffer's own capsule, no copy
            buffer = self._node.buffer
            if buffer is None or buffer.device.type == "meta":
                buffer = self._values()
                if max_version is not None and self._copied_view(buffer):   # a flip's values: memory of its own
                    return _dlpack.mark_copied(_dlpack.buffer_capsule(buffer, stream, max_version))
            return _dlpack.buffer_capsule(buffer, stream, max_version)
        from .ops.creation import check_copy
        _dlpack.check_dl_device(dl_device)
        return _dlpack.export_dlpack(self, stream=stream, max_version=max_version, dl_device=dl_device,
                                     copy=check_copy("__dlpack__", copy))

    def __dlpack_device__(self):
        """(DLPack device type, index) of where the array lives: known without evaluating it (the value
        is computed by ``__dlpack__``, which a consumer calls next). A 'meta' array has no DLPack device
        (no memory): RuntimeError."""
        self._refuse_meta()
        return _dlpack.device_of(self._node.device)

    def item(self):
        """The value of a one-element array as a Python scalar (bool, int, float or complex); evaluates."""
        if self.size != 1:
            raise ValueError(f"item() needs an array of one element, got shape {self.shape}")
        return self._values().item()

    def tolist(self):
        """The value as nested Python lists of scalars (a scalar for 0-d); evaluates."""
        return self._values().tolist()

    def __bool__(self):
        if self.size != 1:
            raise ValueError(f"the truth value of an array of shape {self.shape} is ambiguous; use any() or all()")
        return bool(self._values().item())

    def _scalar(self, kind):
        if self.size != 1:   # TypeError, as numpy's
            raise TypeError(f"{kind}() of an array of shape {self.shape}: only an array of one element converts "
                            "to a Python scalar")
        return self._values().item()

    def __int__(self):
        return int(self._scalar("int"))

    def __float__(self):
        return float(self._scalar("float"))

    def __complex__(self):
        return complex(self._scalar("complex"))

    def __index__(self):
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer arrays can be used as an index, got {self.dtype}")
        if self.ndim != 0:  # as numpy: a (1,)-shaped array is no scalar index
            raise TypeError(f"only 0-d integer arrays can be used as a Python index, got shape {self.shape}")
        return int(self.item())

    def __format__(self, spec):
        """``format(x, spec)`` / f-strings (evaluates): the empty spec gives ``str(x)``; a 0-d array formats
        its Python scalar with any other spec (``f"{x:.2f}"``); any other array raises TypeError, as numpy."""
        if not spec:
            return str(self)
        if self.ndim == 0:
            return format(self.item(), spec)
        raise TypeError(f"unsupported format string {spec!r} passed to Array.__format__ (for an array of "
                        f"shape {self.shape}; only a 0-d array formats its value)")

    def __contains__(self, value):
        """``value in x`` (evaluates): whether any element equals ``value``, ``(x == value).any()``, as numpy."""
        if not _operand_ok(value):   # an operand arrays do not compare with (None, a str, a list): False
            return False
        equal = self == value
        return bool(_ops().any(equal))

    def __divmod__(self, other):
        """``divmod(x, y)``: ``(x // y, x % y)``, floor semantics, as numpy."""
        if not _operand_ok(other):
            return NotImplemented
        return _ops().floor_divide(self, other), _ops().remainder(self, other)

    def __rdivmod__(self, other):
        """``divmod(y, x)`` for a scalar or numpy/torch ``y``: ``(y // x, y % x)``."""
        if not _operand_ok(other):
            return NotImplemented
        return _ops().floor_divide(other, self), _ops().remainder(other, self)

    def __hash__(self):
        raise TypeError("Array is unhashable (it is a value, not an identity)")

    def __copy__(self):
        return self   # immutable: a copy is the same value

    def __deepcopy__(self, memo):
        """A new array holding a copy of this one's value (evaluated; its own memory, on the same device): a deep
        copy of a parameter tree is independent of it even through DLPack, as numpy's and JAX's are."""
        return _ops().asarray(self._values().clone())

    def __reduce__(self):
        """pickle: the value (evaluated, copied contiguous to the CPU: a view pickles its elements, not its base)
        and the device it lived on; unpickled as a new array there, or on the default device where that device
        is missing. A lazy array's graph is never pickled (as JAX pickles an array's value)."""
        if self._node.device.type == "meta":
            value = torch.empty(self.shape, dtype=self.dtype.torch, device="meta")
        else:
            value = self._values().detach().cpu().resolve_conj().resolve_neg().contiguous().clone()
        carrier = _PICKLED_AS.get(value.dtype)
        if carrier is not None:   # torch pickles these but cannot unpickle them: their bits travel as ints
            return (_unpickle, (value.view(carrier), str(self._node.device), str(value.dtype).split(".")[-1]))
        return (_unpickle, (value, str(self._node.device)))

    def __delitem__(self, key):
        raise TypeError("flyarray arrays are immutable: del x[key] cannot remove elements; build the array "
                        "you want instead (x[mask], fa.concat of slices)")

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    # ---- indexing ---------------------------------------------------------------------------------
    def __getitem__(self, key):
        return _indexing().getitem(self, key)

    def __setitem__(self, key, value):
        raise TypeError("flyarray arrays are immutable; use x = x.at[key].set(value) (a new array), "
                        "or fa.where(mask, value, x)")

    @property
    def at(self):
        """JAX's functional updates: ``x.at[key].set(v)`` / ``.add`` / ``.multiply`` / ``.divide`` / ``.min`` /
        ``.max`` return a new array (``x`` is unchanged); ``.get()`` reads ``x[key]``. Any index form."""
        from .ops.indexing import At
        return At(self)

    # ---- conversions ------------------------------------------------------------------------------
    def astype(self, dtype, copy=True, device=None):
        """This array cast to ``dtype`` (any dtype to any dtype); see ``fa.astype``."""
        return _ops().astype(self, dtype, copy=copy, device=device)

    def to_device(self, device, stream=None):
        """A copy of this array on ``device`` (a torch device or string); ``stream`` is ignored."""
        return _ops().asarray(self, device=device)

    def reshape(self, *shape):
        """``fa.reshape`` with the shape given as a tuple or as separate ints (numpy style)."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return _ops().reshape(self, tuple(shape))

    # The reductions' ``out=`` is refused by name (numpy's np.sum(x) etc. call these methods with out=None);
    # mean/var/std take numpy's ``dtype=`` (the input cast first) and var/std its ``ddof=``.
    def sum(self, axis=None, keepdims=False, dtype=None, out=None):
        """``fa.sum`` over ``axis``: bool/integer inputs sum to int64, floats keep their dtype."""
        _no_out(out, "sum")
        return _ops().sum(self, axis=axis, keepdims=keepdims, dtype=dtype)

    def mean(self, axis=None, keepdims=False, dtype=None, out=None):
        """``fa.mean`` over ``axis``: a float result (integers give float32); ``dtype`` casts the input first."""
        _no_out(out, "mean")
        return _ops().mean(self._cast(dtype), axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims=False, out=None):
        """``fa.max`` over ``axis``, in this array's dtype; an empty axis raises ValueError."""
        _no_out(out, "max")
        return _ops().max(self, axis=axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False, out=None):
        """``fa.min`` over ``axis``, in this array's dtype; an empty axis raises ValueError."""
        _no_out(out, "min")
        return _ops().min(self, axis=axis, keepdims=keepdims)

    def prod(self, axis=None, keepdims=False, dtype=None, out=None):
        """``fa.prod`` over ``axis``: bool/integer inputs multiply in int64, floats keep their dtype."""
        _no_out(out, "prod")
        return _ops().prod(self, axis=axis, keepdims=keepdims, dtype=dtype)

    def argmax(self, axis=None, keepdims=False):
        """``fa.argmax``: int64 index of the first maximum (into the flattened array when axis is None)."""
        return _ops().argmax(self, axis=axis, keepdims=keepdims)

    def argmin(self, axis=None, keepdims=False):
        """``fa.argmin``: int64 index of the first minimum (into the flattened array when axis is None)."""
        return _ops().argmin(self, axis=axis, keepdims=keepdims)

    def var(self, axis=None, correction=None, keepdims=False, dtype=None, out=None, ddof=None):
        """``fa.var`` over ``axis`` with ``correction`` (numpy's ``ddof``); a float result (integers give float32)."""
        _no_out(out, "var")
        return _ops().var(self._cast(dtype), axis=axis, correction=_correction(correction, ddof, "var"),
                          keepdims=keepdims)

    def std(self, axis=None, correction=None, keepdims=False, dtype=None, out=None, ddof=None):
        """``fa.std`` over ``axis`` with ``correction`` (numpy's ``ddof``); a float result (integers give float32)."""
        _no_out(out, "std")
        return _ops().std(self._cast(dtype), axis=axis, correction=_correction(correction, ddof, "std"),
                          keepdims=keepdims)

    def any(self, axis=None, keepdims=False, out=None):
        """``fa.any``: whether any element along ``axis`` is nonzero; a bool result."""
        _no_out(out, "any")
        return _ops().any(self, axis=axis, keepdims=keepdims)

    def all(self, axis=None, keepdims=False, out=None):
        """``fa.all``: whether every element along ``axis`` is nonzero; a bool result."""
        _no_out(out, "all")
        return _ops().all(self, axis=axis, keepdims=keepdims)

    def _cast(self, dtype):
        return self if dtype is None else _ops().astype(self, dtype)

    def flatten(self):
        """This array reshaped to 1-D in C order (a view where strides allow, else a copy). Any dtype."""
        return _ops().reshape(self, (-1,))


def _no_out(out, name):
    if out is not None:
        raise TypeError(f"{name}: out= is not supported (flyarray arrays are immutable; use the returned array)")


def _correction(correction, ddof, name):
    if correction is not None and ddof is not None:
        raise TypeError(f"{name}: pass correction or its numpy name ddof, not both")
    return correction if correction is not None else (ddof if ddof is not None else 0.0)


def _printable(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy prints them: bfloat16/float8 through ml_dtypes (float32 without it)."""
    t = t.detach().cpu().resolve_conj().resolve_neg()
    if t.dtype in _ML_DTYPES:
        try:
            return _numpy_view(t.contiguous())
        except TypeError:
            t = t.float()
    return t.numpy()


def _unpickle(value: torch.Tensor, device: str, dtype: str | None = None) -> "Array":
    """pickle's rebuild of an Array (``Array.__reduce__``): on ``device`` where this process has it; ``dtype``:
    the torch dtype name whose bits ``value`` carries (see _PICKLED_AS)."""
    from .ops.creation import _available
    from .runtime import default_device
    if dtype is not None:
        value = value.view(getattr(torch, dtype))
    try:
        target = _available(torch.device(device), device)
    except ValueError:   # pickled on a GPU this process lacks: the default device, as JAX does
        target = default_device()
    return _ops().asarray(value, device=target)


# dtypes torch 2.x pickles but cannot unpickle ("UntypedStorage has no attribute dtype"): the same bits as ints
_PICKLED_AS = {getattr(torch, name): carrier for name, carrier in (
    ("uint16", torch.int16), ("uint32", torch.int32), ("uint64", torch.int64), ("float8_e4m3fn", torch.uint8),
    ("float8_e5m2", torch.uint8), ("float8_e4m3fnuz", torch.uint8), ("float8_e5m2fnuz", torch.uint8),
    ("float8_e8m0fnu", torch.uint8)) if hasattr(torch, name)}

_OPS = None
_PLAN = None
_INDEXING = None


def _plan():
    global _PLAN
    if _PLAN is None:
        from . import plan
        _PLAN = plan
    return _PLAN


def _indexing():
    global _INDEXING
    if _INDEXING is None:
        from .ops import indexing
        _INDEXING = indexing
    return _INDEXING


def _ops():
    global _OPS
    if _OPS is None:
        from . import ops
        _OPS = ops
    return _OPS


def _binary(name, reflected=False):
    fn = None

    def method(self, other):
        nonlocal fn
        if fn is None:
            fn = _recorder(name)
        kind = type(other)
        if kind is not Array and kind is not float and kind is not int and not _operand_ok(other):
            if isinstance(other, _SEQUENCES):   # not NotImplemented: Python would then repeat the list
                raise TypeError(f"{name}: a {kind.__name__} operand is not an array (a 0-d integer array "
                                f"would repeat it); wrap it with fa.asarray")
            return NotImplemented
        return fn(other, self) if reflected else fn(self, other)
    method.__name__ = name
    return method


_SEQUENCES = (list, tuple, str, bytes)


def _recorder(name):
    """What ``fa.<name>(a, b)`` calls: for an elementwise primitive, ``binary`` bound to it (a C-level
    partial: one Python frame less per recorded op), else the fa function itself."""
    fn = getattr(_ops(), name)
    prim = getattr(fn, "primitive", None)
    if prim is None:
        return fn
    import functools
    from .ops.core import binary
    return functools.partial(binary, prim)


def _operand_ok(x) -> bool:
    return isinstance(x, (Array, bool, int, float, complex, np.ndarray, np.generic, torch.Tensor))


# dtypes numpy lacks, by their ml_dtypes name: the tensor's bits are viewed as that dtype
_ML_DTYPES = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}


def _numpy_view(t: torch.Tensor):
    """A CPU tensor as a numpy array over the same memory; bfloat16 and float8 through ml_dtypes' dtypes."""
    name = _ML_DTYPES.get(t.dtype)
    if name is None:
        return t.numpy()
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(f"numpy has no {name}: install ml_dtypes (pip install ml_dtypes), or use "
                        "x.astype(fa.float32) first") from None
    bits = torch.int16 if t.dtype.itemsize == 2 else torch.uint8
    return t.view(bits).numpy().view(getattr(ml_dtypes, name))


def _unary(name):
    def method(self):
        return getattr(_ops(), name)(self)
    return method


for _dunder, _fn in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "divide"),
                     ("floordiv", "floor_divide"), ("mod", "remainder"), ("pow", "pow"),
                     ("and", "bitwise_and"), ("or", "bitwise_or"), ("xor", "bitwise_xor"),
                     ("lshift", "bitwise_left_shift"), ("rshift", "bitwise_right_shift"),
                     ("matmul", "matmul")]:
    setattr(Array, f"__{_dunder}__", _binary(_fn))
    setattr(Array, f"__r{_dunder}__", _binary(_fn, reflected=True))
_POW = Array.__pow__


def _in_place(dunder, symbol):
    """``x op= y``: ``x = x op y`` (arrays are immutable: x is rebound, no other reference changes), refused
    where the result's dtype or shape differs from x's (the array API: an in-place operation keeps both), before
    anything is recorded past the checks. numpy refuses these too; without this, int32 ``x += 1.5`` made x float32."""
    def method(self, other):
        out = getattr(self, dunder)(other)
        if out is NotImplemented:
            return out
        if out.dtype is not self.dtype:
            raise TypeError(f"x {symbol}= y: x is {self.dtype} but x {symbol} y is {out.dtype}, and an in-place "
                            f"operator keeps x's dtype (the array API); write x = x {symbol} y")
        if out.shape != self.shape:
            raise ValueError(f"x {symbol}= y: x has shape {self.shape} but x {symbol} y has {out.shape}, and an "
                             f"in-place operator keeps x's shape (the array API); write x = x {symbol} y")
        return out
    method.__name__ = f"__i{dunder[2:]}"
    return method


for _dunder, _symbol in [("add", "+"), ("sub", "-"), ("mul", "*"), ("truediv", "/"), ("floordiv", "//"),
                         ("mod", "%"), ("pow", "**"), ("and", "&"), ("or", "|"), ("xor", "^"), ("lshift", "<<"),
                         ("rshift", ">>"), ("matmul", "@")]:
    setattr(Array, f"__i{_dunder}__", _in_place(f"__{_dunder}__", _symbol))


def _pow(self, other, modulo=None):
    if modulo is not None:
        raise TypeError("pow(x, y, modulo): a modulus is not supported; use (x ** y) % modulo")
    return _POW(self, other)


Array.__pow__ = _pow
for _dunder, _fn in [("lt", "less"), ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                     ("eq", "equal"), ("ne", "not_equal")]:
    setattr(Array, f"__{_dunder}__", _binary(_fn))
for _dunder, _fn in [("neg", "negative"), ("pos", "positive"), ("abs", "abs"), ("invert", "bitwise_invert")]:
    setattr(Array, f"__{_dunder}__", _unary(_fn))
