"""The kernel IR: what the scheduler hands to code generation and to every backend.

A ``Kernel`` is pure structure: a domain (a full shape F and the axes it
reduces, A) and ops in SSA form over it. Values live on the *full* domain (one
per element of F) or on the *outer* one (one per row: F with the axes A set to
1). It names no graph node and holds no data: buffers and the values of
Python scalars arrive at launch (``Const.slot`` indexes the kernel's scalar
arguments), so one Kernel serves every evaluation of a graph structure and a
cached plan pins no user memory.
"""
from __future__ import annotations

import dataclasses

from .dtypes import DType
from .views import View


@dataclasses.dataclass(frozen=True)
class Load:
    input: int  # which input buffer
    view: View  # over the input buffer, shaped like the domain (full: F, outer: F_keep)
    domain: str
    dtype: DType


@dataclasses.dataclass(frozen=True)
class Iota:
    params: tuple  # ("ramp", start, step) | ("eye", k, n_cols)
    view: View  # over the iota's own contiguous index space
    domain: str
    dtype: DType


@dataclasses.dataclass(frozen=True)
class Const:
    slot: int  # which scalar argument: the value is bound at launch, never baked in
    domain: str
    dtype: DType


@dataclasses.dataclass(frozen=True)
class Elementwise:
    prim: str
    args: tuple  # op indices
    domain: str
    dtype: DType  # result
    in_dtype: DType  # what the arguments are (already promoted at record time)


@dataclasses.dataclass(frozen=True)
class Reduce:
    prim: str
    arg: int
    dtype: DType
    domain: str = "outer"


@dataclasses.dataclass(frozen=True)
class Store:
    op: int
    dtype: DType  # of the buffer written
    view: View  # over the output buffer, shaped like the domain of the op
    domain: str


@dataclasses.dataclass
class Kernel:
    full_shape: tuple
    axes: tuple  # reduced axes of full_shape; () for a pure elementwise kernel
    ops: list
    stores: list  # one per output buffer, in order
    n_inputs: int
    scalar_dtypes: list  # one per Const slot

    @property
    def keep_shape(self) -> tuple:
        return tuple(1 if i in self.axes else s for i, s in enumerate(self.full_shape))

    def op_names(self) -> list:
        """The primitives it computes, each once, in order: what its name and profiler label show."""
        names = []
        for op in self.ops:
            if isinstance(op, (Elementwise, Reduce)) and op.prim not in names:
                names.append(op.prim)
        return names
