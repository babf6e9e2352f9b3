"""fa.inspect: what ``fn(*args)`` would launch, compiled for any target from any machine.

Records the graph, schedules it (running nothing), generates each fused
kernel's Triton source, and cross-compiles it for the target (gfx950, gfx942,
sm_90), reporting per kernel: the source, the assembly, the matrix
instructions, registers, LDS/shared bytes and spills. Library ops report the
representative specializations their kernel module lists in ``compile_specs``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import html
import importlib
import inspect as pyinspect

from . import codegen, plan, runtime, tables, tree_util
from ._array import Array
from .expand import rewrites_undone, to_primitives
from .plan import unrealized_bases
from .schedule import KernelStep, LibraryCall, schedule
from .targets import TARGETS, KernelSpec, check_cross_compiling, compile_for
from .transforms import recording

_POINTER = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "int8": "i8",
            "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32",
            "uint64": "u64", "bool": "i1",
            "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}


@dataclasses.dataclass
class Inspection:
    """What ``fa.inspect`` found: ``kernels`` (targets.KernelReport per kernel, in launch order) and
    ``kinds`` (per kernel: "fused kernel", or the library op whose representative specialization it is).
    Prints as a table; in a notebook, a table with each kernel's source and assembly collapsed."""
    target: str
    kernels: list  # KernelReport per launched kernel, in launch order
    kinds: list = dataclasses.field(default_factory=list)

    def summary(self) -> list:
        return [k.summary() for k in self.kernels]

    _COLUMNS = ("kernel", "from", "registers", "LDS / shared", "spills", "matrix instructions")

    def _rows(self) -> list:
        kinds = self.kinds or ["-"] * len(self.kernels)
        return [[k.name, kind, str(k.registers), f"{k.shared_bytes} B", str(k.spills),
                 ", ".join(k.matrix_instructions) or "-"] for k, kind in zip(self.kernels, kinds)]

    def _header(self) -> str:
        regs = "VGPRs" if self.target.startswith("gfx") else "registers per thread"
        return f"fa.inspect: {len(self.kernels)} kernel(s) for {self.target} (registers: {regs})"

    def __repr__(self):
        lines = [self._header()]
        if self.kernels:
            lines += tables.text_rows(self._COLUMNS, self._rows())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        parts = [f"<div><p>{esc(self._header())}</p>", tables.html_table(self._COLUMNS, self._rows())]
        asm = "AMDGCN" if self.target.startswith("gfx") else "PTX"
        for k in self.kernels:  # long texts collapsed: open the one you want
            parts.append(f"<details><summary>{esc(k.name)}: Triton source</summary><pre>{esc(k.triton_source)}</pre>"
                         f"</details><details><summary>{esc(k.name)}: {asm} ({len(k.asm.splitlines())} lines)"
                         f"</summary><pre>{esc(k.asm)}</pre></details>")
        return "".join(parts) + "</div>"


def inspect(fn, *args, target: str = "gfx950", **kwargs) -> Inspection:
    """Record ``fn(*args, **kwargs)``, schedule it (nothing runs) and compile its kernels for ``target``:
    each fused kernel as the call would generate it; for a library op, its kernel module's representative
    specializations that match the call (input dtype, and features such as the epilogue or causal mask)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known: {sorted(TARGETS)}")
    check_cross_compiling("fa.inspect")
    with recording.recording(), _arguments_traced(args, kwargs):   # an fa.jit function records inline: nothing runs
        out = fn(*args, **kwargs)
    outs = [leaf for leaf in tree_util.tree_leaves(out) if isinstance(leaf, Array)]   # any pytree of outputs
    planned = []   # (spec, kind): what to compile, taken from the schedule as explain takes it
    with plan._lock:
        roots = unrealized_bases(outs)
        with rewrites_undone(roots):   # fn may return the caller's arrays: leave their graph as it was
            to_primitives(roots)
            for step in schedule(roots):
                if isinstance(step, KernelStep):
                    planned.append((fused_spec(step), "fused kernel"))
                elif isinstance(step, LibraryCall):
                    specs, match = matching_specs(step.node, target)
                    kind = {"exact": "representative spec", "dtype": "representative spec, not the call's features",
                            "none": "representative spec, none of the call's dtype"}[match]
                    planned += [(spec, f"{step.node.prim.name} ({kind})") for spec in specs]
    reports = [compile_for(spec, target) for spec, _ in planned]   # outside the lock: compiles take seconds
    return Inspection(target, reports, [kind for _, kind in planned])


@contextlib.contextmanager
def _arguments_traced(args, kwargs):
    """The arguments' arrays stand for any values while fn records, as under fa.jit: an evaluation that
    needs them (float(x), fa.eval, a Python if) is refused, not run here and left out of the report."""
    ids = {leaf._node.id for leaf in tree_util.tree_leaves((args, kwargs)) if isinstance(leaf, Array)}
    previous, previous_who = plan._trace.sources, plan._trace.who
    plan._trace.sources, plan._trace.who = ids | (previous or set()), "fa.inspect"
    try:
        yield
    finally:
        plan._trace.sources, plan._trace.who = previous, previous_who


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
    constexprs = dict(spec.constexprs)
    n_buffers = len(step.inputs) + len(kernel.stores)
    for param, value in zip(jit_fn.params[n_buffers:], spec.args):
        if param.is_constexpr:  # a power-of-two size (codegen.size_params): its value is compiled in
            constexprs[param.name] = value
    for name in constexprs:
        signature[name] = "constexpr"
    divisible = tuple(name for name, v in zip(names[n_buffers:], spec.args)
                      if isinstance(v, int) and not isinstance(v, bool) and v % 16 == 0 and v
                      and name not in constexprs)
    return KernelSpec(f"fused_{spec.key[:12]}", jit_fn, signature, constexprs, spec.num_warps, 1, divisible)


def _scalar_type(value) -> str:
    if isinstance(value, float):
        return "fp32"
    if isinstance(value, bool):
        return "i1"
    return "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"


_MX_NAMES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "uint8": "e2m1", "bfloat16": "bf16"}
_LIBRARY_MODULES = {"matmul": "gemm", "gemm": "gemm", "matmul_epilogue": "gemm", "ragged_dot": "ragged_dot",
                    "attention": "attention", "rms_norm": "rms_norm", "softmax": "softmax", "top_k": "top_k",
                    "softmax_top_k": "top_k", "scaled_matmul": "scaled_matmul", "mx_quantize": "mx",
                    "mx_dequantize": "mx", "scan": "scan", "sort": "sort", "searchsorted": "sort"}


def library_specs(name: str, target: str | None = None) -> list:
    """The representative specializations a library op's kernel module lists (with ``target``'s configs
    where the module takes a target)."""
    module = _LIBRARY_MODULES.get(name)
    if module is None:
        return []
    specs = module_specs(module, target)
    own = [s for s in specs if s.name.startswith(name + "_")]  # a module of several ops (sort, searchsorted)
    return own or specs


def module_specs(module: str, target: str | None = None) -> list:
    """Every representative specialization of kernel module ``module`` (flyarray.kernels.<module>), with
    ``target``'s configs where the module takes a target, minus the ones named for another target."""
    mod = importlib.import_module(f"flyarray.kernels.{module}")
    if not hasattr(mod, "compile_specs"):
        return []
    params = list(pyinspect.signature(mod.compile_specs).parameters)
    takes_target = bool(params) and params[0] in ("target", "arch")
    specs = list(mod.compile_specs(target) if takes_target and target else mod.compile_specs())
    others = [t for t in TARGETS if t != target] if target else []
    own = [s for s in specs if not any(s.name.endswith(f"_{t}") for t in others)]  # another arch's tiles
    if own or not target:
        return own
    # none named for this target: the specs of the arch whose configs it runs (pick_config's family rule:
    # gfx942 takes the gfx950 tables where a module has no gfx942 entry)
    family = [t for t in others if t[:4] == target[:4]]
    return [s for s in specs if any(s.name.endswith(f"_{t}") for t in family[:1])]


KERNEL_MODULES = tuple(sorted(set(_LIBRARY_MODULES.values())))


def matching_specs(node, target: str | None = None) -> tuple:
    """(specs, how they match: "exact", "dtype" or "none"): the specs of a library node's op that match the call:
    its first input's dtype, then (where some spec has them) the features its kwargs ask for (an epilogue
    activation, bias or residual, a causal mask). All specs where none matches the dtype: the op is shown, not
    hidden; "dtype" where some feature the call asks for (or does not) no spec of its dtype has."""
    specs = library_specs(node.prim.name, target)
    pointer = _POINTER.get(node.inputs[0].dtype.name) if node.inputs else None
    same = [s for s in specs if _first_pointer(s) == pointer]
    if not same:
        return specs, "none"
    kwargs = node.params.get("kwargs", {}) if isinstance(node.params, dict) else {}
    tests = [lambda name: "bwd" not in name]  # the call is a forward op; backward kernels are their own ops
    if node.prim.name == "scaled_matmul":  # the MX formats of both operands, as the spec names spell them
        fmts = "x".join(_MX_NAMES.get(n.dtype.name, n.dtype.name) for n in node.inputs[:2])
        tests.append(lambda name, fmts=fmts: f"_{fmts}" in name)
    if node.prim.name == "attention":
        tests.append(lambda name, d=node.inputs[0].shape[-1]: f"_d{d}" in name)  # the head dim
    if node.prim.name in ("matmul", "matmul_epilogue"):   # a plain matmul asks for no epilogue: none shown
        kwargs = {"activation": None, "has_bias": False, "has_residual": False, **kwargs}
    match = "exact"
    for wanted in tests + _features(kwargs):
        narrowed = [s for s in same if wanted(s.name)]
        if narrowed:
            same = narrowed
        else:
            match = "dtype"
    return same, match


def _first_pointer(spec) -> str | None:
    return next((t[1:] for t in spec.signature.values() if t.startswith("*")), None)


def _features(kwargs: dict) -> list:
    """Tests on a spec's name for what the call's kwargs ask for (the names say what a spec fuses)."""
    out = []
    if kwargs.get("activation"):
        out.append(lambda name, act=str(kwargs["activation"]): act in name)
    elif "activation" in kwargs:   # asked for none
        out.append(lambda name: not any(act in name for act in ("relu", "silu", "gelu")))
    if "has_bias" in kwargs:
        out.append(lambda name, bias=bool(kwargs["has_bias"]): ("_bias" in name) == bias)
    if "has_residual" in kwargs:
        out.append(lambda name, res=bool(kwargs["has_residual"]): ("residual" in name) == res)
    if "is_causal" in kwargs:
        out.append(lambda name, causal=bool(kwargs["is_causal"]): ("causal" in name) == causal)
    return out
