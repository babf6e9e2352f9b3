"""The interpret backend: generated and library Triton code through Triton's interpreter, on the CPU.

Triton's interpreter has no extern math library (libdevice), so generated
kernels call transcendental functions through a name ``ext`` that the gpu
backend binds to libdevice and this backend binds to ``InterpreterMath``:
numpy functions over the interpreter's tensors. The kernel source is the same.
"""
from __future__ import annotations

import math

import numpy as np
import triton.language as tl
from triton.runtime.interpreter import TensorHandle


def _lift(np_fn, result_bool=False):
    def fn(*args):
        datas = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
        with np.errstate(all="ignore"):
            out = np_fn(*datas)
        # the result's type is that of the operand of the result's (broadcast) shape: hypot(s, block)
        # with a scalar s first is a block
        tensors = [a for a in args if isinstance(a, tl.tensor)]
        first = next((a for a in tensors if np.shape(a.handle.data) == np.shape(out)), tensors[0])
        if result_bool:
            return tl.tensor(TensorHandle(np.asarray(out).astype(np.int32), tl.int32), first.type.with_element_ty(tl.int32)
                             if hasattr(first.type, "with_element_ty") else tl.int32)
        out = np.asarray(out).astype(first.handle.data.dtype)
        return tl.tensor(TensorHandle(out, first.handle.dtype.scalar), first.type)
    return fn


def _power(x, y):
    # numpy takes a scalar exponent of 0.5 as sqrt (sqrt(-inf) is NaN, C's pow(-inf, 0.5) is inf, and
    # -0.0 keeps its sign): operands of one shape go through pow itself
    shape = np.broadcast(x, y).shape   # the interpreter's scalars are 1-element arrays; numpy reads a
    # broadcast (stride 0) exponent as a scalar too, so it is copied out
    return np.power(np.ascontiguousarray(np.broadcast_to(x, shape)), np.ascontiguousarray(np.broadcast_to(y, shape)))


class InterpreterMath:
    exp = staticmethod(_lift(np.exp))
    erfc = staticmethod(_lift(np.vectorize(math.erfc, otypes=[np.float64])))
    tan = staticmethod(_lift(np.tan))
    tanh = staticmethod(_lift(np.tanh))
    acos = staticmethod(_lift(np.arccos))
    acosh = staticmethod(_lift(np.arccosh))
    asin = staticmethod(_lift(np.arcsin))
    asinh = staticmethod(_lift(np.arcsinh))
    atan = staticmethod(_lift(np.arctan))
    atanh = staticmethod(_lift(np.arctanh))
    cosh = staticmethod(_lift(np.cosh))
    sinh = staticmethod(_lift(np.sinh))
    expm1 = staticmethod(_lift(np.expm1))
    log1p = staticmethod(_lift(np.log1p))
    log10 = staticmethod(_lift(np.log10))
    trunc = staticmethod(_lift(np.trunc))
    nearbyint = staticmethod(_lift(np.rint))  # round half to even, as libdevice's nearbyint
    signbit = staticmethod(_lift(np.signbit, result_bool=True))
    pow = staticmethod(_lift(_power))
    atan2 = staticmethod(_lift(np.arctan2))
    hypot = staticmethod(_lift(np.hypot))
    copysign = staticmethod(_lift(np.copysign))
    nextafter = staticmethod(_lift(np.nextafter))
