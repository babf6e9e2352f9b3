"""The public functional API, written on primitives (primitives.py) and library ops (library.py)."""
from .core import astype, where  # noqa: F401
from .creation import (arange, asarray, empty, empty_like, eye, from_dlpack, full, full_like, linspace,  # noqa: F401
                       ones, ones_like, zeros, zeros_like)
from .elementwise import *  # noqa: F401,F403
from .elementwise import clip, conj, gelu, imag, isclose, isin, real, relu, silu  # noqa: F401
from .indexing import getitem, nonzero, take, take_along_axis  # noqa: F401
from .library_ops import ragged_dot, top_k  # noqa: F401
from .einsum import einsum  # noqa: F401
from .linalg import cross, matmul, outer, tensordot, vecdot  # noqa: F401
from .linalg import numpy_diagonal as diagonal, numpy_trace as trace  # noqa: F401
from .manipulation import (broadcast_arrays, broadcast_shapes, broadcast_to, concat, diff, expand_dims, flip,  # noqa: F401
                           matrix_transpose, meshgrid, moveaxis, pad, permute_dims, repeat, reshape, roll, squeeze,
                           stack, tile, tril, triu, unstack)
from .sorting import (argsort, cumulative_prod, cumulative_sum, searchsorted, sort, unique_all,  # noqa: F401
                      unique_counts, unique_inverse, unique_values)
from .reductions import all, any, count_nonzero, argmax, argmin, max, mean, min, prod, std, sum, var  # noqa: F401
from . import nn  # noqa: F401

import functools as _functools  # noqa: E402
import itertools as _itertools  # noqa: E402
import types as _types  # noqa: E402

import numpy as _np  # noqa: E402
import torch as _torch  # noqa: E402

_FOREIGN = (_np.ndarray, _np.generic, _torch.Tensor)


def _convert(a, nested, device):
    from .core import as_array, as_operand
    if nested and isinstance(a, (list, tuple)) and [v for v in a if isinstance(v, _FOREIGN)]:
        return type(a)(as_array(v, device) for v in a)
    return as_operand(a, device)   # a Python scalar where an array goes: a 0-d array (fa.sum(3.0))


def _later(a, device):
    """An argument after the first: numpy arrays and tensors become arrays; anything else (k, axis, shift,
    numpy scalars among them) stays as given."""
    return _convert(a, False, device) if isinstance(a, (_np.ndarray, _torch.Tensor)) else a


def _operands_device(args, nested):
    """Where numpy operands go: the first array's or tensor's device among the arguments (a nested first
    argument's elements included), as elementwise ops place them; None: the numpy data's own (the CPU)."""
    from .core import operands_device
    first = args[0] if args else ()
    return operands_device(((tuple(first) if nested and isinstance(first, (list, tuple)) else (first,))
                            + tuple(args[1:])))


def _accepting_foreign(fn, first_only=False, nested=False):
    """``fn`` taking numpy arrays and torch tensors wherever it takes Arrays (converted by fa.asarray, zero
    copy where possible; numpy data joins the other arguments' device), and a Python or numpy scalar as its
    first argument (a 0-d array). ``first_only``: only the first argument is an array (indices stay as given,
    so known ones are range-checked); ``nested``: the first argument is a sequence of arrays (concat, stack)."""
    @_functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for i, a in enumerate(args[:1] if first_only or nested else args):  # a loop, not any(): the hot path
            if isinstance(a, _FOREIGN) or nested or i == 0 and isinstance(a, (bool, int, float, complex)):
                device = _operands_device(args, nested)
                args = (_convert(args[0], nested, device),) + tuple(
                    args[1:] if first_only else (_later(b, device) for b in args[1:]))
                break
        return fn(*args, **kwargs)
    return wrapper


_MAKERS = {"broadcast_shapes", "arange", "asarray", "empty", "eye", "from_dlpack", "full", "linspace", "ones", "zeros",
           "where",
           "ragged_dot"}   # converts its own arguments: it first checks group sizes that are still on the host
for _name in [n for n, v in list(globals().items()) if callable(v) and not isinstance(v, (_types.ModuleType, type))]:
    _fn = globals()[_name]
    if _name.startswith("_") or _name in _MAKERS or getattr(_fn, "__module__", "") == elementwise.__name__ and \
            _name not in ("clip", "isclose", "gelu", "relu", "silu", "conj", "real", "imag", "isin"):
        continue
    globals()[_name] = _accepting_foreign(_fn, first_only=_name in ("getitem", "take", "take_along_axis"),
                                         nested=_name in ("concat", "stack"))

def accepting_arrays(fn):
    """``fn`` (an fa.nn or fa.quant function: arrays in, positional or keyword) taking numpy arrays and torch
    tensors wherever it takes Arrays, converted by fa.asarray (zero copy where possible; numpy data joins the
    other arguments' device)."""
    foreign = (_np.ndarray, _torch.Tensor)

    @_functools.wraps(fn)
    def wrapper(*args, **kwargs):   # (this module's any() is fa.any: plain loops)
        for a in _itertools.chain(args, kwargs.values()):
            if isinstance(a, foreign):
                device = _operands_device(tuple(args) + tuple(kwargs.values()), False)
                args = tuple(_later(b, device) for b in args)
                kwargs = {k: _later(v, device) for k, v in kwargs.items()}
                break
        return fn(*args, **kwargs)
    return wrapper


for _name in ("dot_product_attention", "layer_norm", "log_softmax", "long_row_softmax", "rms_norm", "scaled_matmul",
              "softmax", "softmax_top_k"):
    setattr(nn, _name, accepting_arrays(getattr(nn, _name)))

# The public functions (``from .ops import *`` in flyarray/__init__ takes these and no submodules).
__all__ = sorted(n for n, v in globals().items() if not n.startswith("_") and not isinstance(v, _types.ModuleType)
                 and n != "accepting_arrays") \
    + ["nn"]
