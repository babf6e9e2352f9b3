"""fa.inspect: what ``fn(*args)`` would launch, compiled for any target from any machine.

Records the graph, schedules it (running nothing), generates each fused
kernel's Triton source, and cross-compiles it for the target (gfx950, gfx942,
sm_90), reporting per kernel: the source, the assembly, the matrix
instructions, registers, LDS/shared bytes and spills. Library ops report the
representative specializations their kernel module lists in ``compile_specs``.
"""
from __future__ import annotations

import dataclasses
import importlib

from . import codegen, runtime
from .expand import expand_composites
from .plan import unrealized_bases
from .schedule import KernelStep, LibraryCall, schedule
from .targets import KernelSpec, compile_for

_POINTER = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "int8": "i8",
            "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "i1",
            "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}


@dataclasses.dataclass
class Inspection:
    target: str
    kernels: list  # KernelReport per launched kernel, in launch order

    def summary(self) -> list:
        return [k.summary() for k in self.kernels]

    def __repr__(self):
        lines = [f"fa.inspect: {len(self.kernels)} kernel(s) for {self.target}"]
        for k in self.kernels:
            s = k.summary()
            lines.append(f"  {s['name']}: regs={s['registers']} shared={s['shared_bytes']}B spills={s['spills']} "
                         f"matrix={s['matrix_instructions'] or '-'}")
        return "\n".join(lines)


def inspect(fn, *args, target: str = "gfx950", **kwargs) -> Inspection:
    out = fn(*args, **kwargs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    reports = []
    roots = unrealized_bases(outs)
    expand_composites(roots)
    for step in schedule(roots):
        if isinstance(step, KernelStep):
            reports.append(compile_for(fused_spec(step), target))
        elif isinstance(step, LibraryCall):
            reports.extend(compile_for(spec, target) for spec in library_specs(step.node.prim.name))
    return Inspection(target, reports)


def fused_spec(step: KernelStep) -> KernelSpec:
    """The KernelSpec of a fused kernel, with argument types as a launch would give them."""
    kernel = step.kernel
    spec = codegen.launch_spec(kernel)
    jit_fn = runtime._compiled(spec, "gpu")
    names = jit_fn.arg_names
    types = [f"*{_POINTER[n.dtype.name]}" for n in step.inputs]
    types += [f"*{_POINTER[st.dtype.name]}" for st in kernel.stores]
    types += [_scalar_type(v) for v in spec.args]
    types += ["fp32" if d.kind == "f" and d.name != "float64" else "i64" for d in kernel.scalar_dtypes]
    signature = dict(zip(names, types))
    for name in spec.constexprs:
        signature[name] = "constexpr"
    n_buffers = len(step.inputs) + len(kernel.stores)
    divisible = tuple(name for name, v in zip(names[n_buffers:], spec.args)
                      if isinstance(v, int) and not isinstance(v, bool) and v % 16 == 0 and v)
    return KernelSpec(f"fused_{spec.key[:12]}", jit_fn, signature, dict(spec.constexprs), spec.num_warps, 1,
                      divisible)


def _scalar_type(value) -> str:
    if isinstance(value, float):
        return "fp32"
    if isinstance(value, bool):
        return "i1"
    return "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"


_LIBRARY_MODULES = {"matmul": "gemm", "gemm": "gemm", "ragged_dot": "ragged_dot", "attention": "attention",
                    "rms_norm": "rms_norm", "softmax": "softmax", "top_k": "top_k",
                    "softmax_top_k": "top_k", "scaled_matmul": "scaled_matmul"}


def library_specs(name: str) -> list:
    module = _LIBRARY_MODULES.get(name)
    if module is None:
        return []
    mod = importlib.import_module(f"flyarray.kernels.{module}")
    return list(mod.compile_specs()) if hasattr(mod, "compile_specs") else []

