"""flyarray: lazy, fused, JAX-style arrays on Triton, with zero-copy torch interop.

    import flyarray as fa
    x = fa.asarray(torch_tensor)         # same memory, no copy
    y = fa.nn.softmax(x * 2.0)           # recorded, not run
    torch.from_dlpack(y)                 # one fused kernel, no copy out
"""
import math as _math
import os as _os

_os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; this is its default

from . import dtypes as _dtypes  # noqa: E402
from ._array import Array  # noqa: E402
from .dtypes import (DType, bfloat16, bool_, finfo, float8_e4m3fn, float8_e5m2, float16, float32, float64,  # noqa: E402
                     iinfo, int8, int16, int32, int64, uint8, uint16, uint32, uint64)
from .dtypes import complex64, complex128  # noqa: E402,F401
from .ops import *  # noqa: E402,F401,F403
from .ops import nn  # noqa: E402
from . import quant  # noqa: E402
from . import random  # noqa: E402
from .plan import ConcretizationError  # noqa: E402
from .explain import explain  # noqa: E402
from .profiling import profile  # noqa: E402
from .runtime import reset_stats, set_backend, set_default_device, stats  # noqa: E402
from .transforms import jit  # noqa: E402
from .transforms import custom_jvp, custom_vjp, grad, jvp, stop_gradient, value_and_grad, vjp  # noqa: E402,F401
from . import tree_util  # noqa: E402,F401
from .transforms.batching import vmap  # noqa: E402,F401
from .transforms.jacobians import hessian, jacfwd, jacrev, linearize  # noqa: E402,F401
from . import linalg  # noqa: E402,F401
from . import fft  # noqa: E402,F401
from .namespace_info import __array_namespace_info__, isdtype  # noqa: E402,F401
from . import sharding, lax  # noqa: E402,F401
from .sharded import device_get, device_put  # noqa: E402,F401
from .shard_map import shard_map  # noqa: E402,F401

bool = bool_  # the array API spells it fa.bool
e, inf, nan, pi, newaxis = _math.e, _math.inf, _math.nan, _math.pi, None  # the array API's constants
__version__ = "0.1.0"
__array_api_version__ = "2024.12"


def result_type(*args):
    """The dtype an op over ``args`` (Arrays, DTypes, Python scalars) computes in: the array API's
    promotion table, with JAX's rules across kinds (int + float -> the float) and weak Python scalars."""
    import builtins  # this module's ``bool`` is fa.bool (a DType), not the Python type

    def dtype_of(a):
        if isinstance(a, (int, float, complex, builtins.bool)):
            return a
        return _dtype_of(a)
    return _dtypes.result_type(*[dtype_of(a) for a in args])


def _dtype_of(a):
    """A dtype, or an array's (Arrays, numpy arrays and scalars, torch tensors: what asarray takes)."""
    import numpy
    import torch
    if isinstance(a, (Array, numpy.ndarray, numpy.generic, torch.Tensor)):
        return _dtypes.dtype(a.dtype)
    return _dtypes.dtype(a)


def can_cast(from_, to):
    """Whether ``from_`` (a dtype or an array) promotes to ``to`` without changing ``to`` (the array API's
    can_cast); any dtype pair."""
    from_, to = _dtype_of(from_), _dtypes.dtype(to)
    try:
        return _dtypes.promote(from_, to) == to
    except TypeError:
        return False


def eval(*arrays):
    """Compute the given arrays now -- each argument an array or a pytree of them (a dict of parameters,
    a tuple of state), as JAX's block_until_ready takes -- in one schedule, so shared work runs once.
    Leaves that are not arrays (numbers, None, strings) are left alone. Returns the arguments."""
    from .plan import realize
    realize([a for a in tree_util.tree_leaves(arrays) if isinstance(a, Array)])
    return arrays[0] if len(arrays) == 1 else arrays


def clear_caches():
    """Empty the in-memory caches (plans, generated sources, loaded kernels, the hand-written kernels'
    launch plans, the tuned configs read from disk) and re-read the FLYARRAY_* switches that evaluations
    consult. The disk cache stays."""
    import sys
    from . import codegen, diskcache, plan, runtime
    plan.clear()
    codegen._SOURCES.clear()
    runtime._memory.clear()
    launching = sys.modules.get(__name__ + ".kernels._triton")
    if launching is not None:  # imported by the first hand-written kernel: nothing to empty before
        launching.clear_launch_caches()
    tuned = sys.modules.get(__name__ + ".kernels.tuning")
    if tuned is not None:   # the tuned configs read from disk: read again (the directory may have changed)
        tuned._memory.clear()
    diskcache.forget_modules("_interpret")  # the interpreter's kernels (the GPU's keep their modules loaded)
    plan.refresh_settings()
    runtime.refresh_settings()


def inspect(fn, *args, target="gfx950", **kwargs):
    """Compile the kernels that ``fn(*args)`` would launch for ``target`` (from any machine)."""
    from .inspection import inspect as _inspect
    return _inspect(fn, *args, target=target, **kwargs)


def _import_interop():
    """``interop/`` ships as ``flyarray.interop`` (pyproject's package-dir); from a source tree, map it here."""
    import importlib.util
    import sys
    name = __name__ + ".interop"
    if name in sys.modules:
        return sys.modules[name]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        root = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "interop")
        spec = importlib.util.spec_from_file_location(name, _os.path.join(root, "__init__.py"),
                                                      submodule_search_locations=[root])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module


interop = _import_interop()  # so `import flyarray.interop.torch` works from a source tree too


# ---- the public namespace --------------------------------------------------------------------------------------
# Importing a submodule binds its name here (``from . import plan`` anywhere in the package does), so
# internal modules (ir, plan, schedule, codegen, ops, ...) would show up as fa.ir etc. They are unbound
# and listed nowhere; ``import flyarray.schedule`` and ``from flyarray import plan`` keep working (the
# import system finds them in sys.modules) and ``fa.schedule`` still resolves through __getattr__ below.
_PUBLIC_MODULES = ("interop", "lax", "linalg", "nn", "quant", "random", "sharding", "tree_util")
for _name, _value in list(globals().items()):
    if isinstance(_value, type(_os)) and not _name.startswith("_") and _name not in _PUBLIC_MODULES:
        del globals()[_name]
__all__ = sorted(n for n in globals() if not n.startswith("_")) + ["__array_api_version__",
                                                                     "__array_namespace_info__"]


def __getattr__(name):
    """Internal submodules (fa.plan, fa.runtime, ...) stay reachable by name, though not listed."""
    import sys
    module = sys.modules.get(f"{__name__}.{name}")
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return module


def __dir__():
    return __all__ + ["__version__", "__doc__", "__name__", "__path__", "__file__"]
