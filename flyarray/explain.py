"""fa.explain: what evaluating some arrays would do, shown without running or compiling anything.

The same path an evaluation takes (plan.realize) up to the schedule, and no further: the walk
under the pending arrays (whose key says whether a plan is cached), composite expansion, and the
scheduler's steps. For each step: its kind, the primitive ops it contains, its inputs (user buffer
or an intermediate made by an earlier step) and outputs, the bytes it moves (inputs read once,
outputs written once) and, for a fused kernel, whether its generated source is compiled in memory.

Scheduling may rewrite nodes (a composite is expanded into primitives, a matmul epilogue moves into
the GEMM): that is exactly what an evaluation would do first, and changes no value. Nothing is
launched, compiled or bound: every array stays unevaluated.
"""
from __future__ import annotations

import dataclasses
import html
import math

from . import codegen, plan, runtime, tables
from .expand import rewrites_undone, to_primitives
from .kernel_ir import Elementwise, Iota, Reduce
from .schedule import Allocate, KernelStep, LibraryCall, schedule


@dataclasses.dataclass
class Buffer:
    shape: tuple
    dtype: str
    origin: str  # "user buffer" | "intermediate (step N)" | "output"

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)

    def describe(self) -> str:
        text = f"{self.dtype}{list(self.shape)}"
        return f"{text} {self.origin}" if self.origin != "output" else text


@dataclasses.dataclass
class StepInfo:
    index: int
    kind: str  # "fused kernel" | "library call" | "view" (a torch view of its input) | "allocation"
    ops: list
    inputs: list  # Buffer
    outputs: list  # Buffer
    compiled: str  # "yes" | "no" | "n/a (...)"
    key: str = ""  # the generated source's cache key (fused kernels)

    @property
    def bytes_moved(self) -> int:
        if self.kind in ("allocation", "view"):  # a view reads and writes no memory
            return 0
        return sum(b.nbytes for b in self.inputs) + sum(b.nbytes for b in self.outputs)


@dataclasses.dataclass
class Explanation:
    arrays: list  # (shape, dtype, "pending" | "evaluated (no work)") per requested array
    steps: list  # StepInfo, in launch order
    backend: str = ""
    plan_cached: bool = False

    @property
    def n_kernels(self) -> int:
        """Launches an evaluation would make: fused kernels and library calls."""
        return sum(s.kind not in ("allocation", "view") for s in self.steps)

    @property
    def bytes_moved(self) -> int:
        return sum(s.bytes_moved for s in self.steps)

    def _header(self) -> str:
        if not self.steps:
            return "fa.explain: evaluated (no work)"
        return (f"fa.explain: {len(self.steps)} step(s), {self.n_kernels} kernel launch(es) on backend "
                f"{self.backend!r}, {_fmt_bytes(self.bytes_moved)} moved; plan cached: "
                f"{'yes' if self.plan_cached else 'no'}")

    def _rows(self) -> list:
        return [[str(s.index), s.kind, ", ".join(s.ops) or "-", "; ".join(b.describe() for b in s.inputs) or "-",
                 "; ".join(b.describe() for b in s.outputs) or "-", _fmt_bytes(s.bytes_moved), s.compiled]
                for s in self.steps]

    _COLUMNS = ["#", "kind", "ops", "inputs", "outputs", "bytes", "compiled"]

    def __str__(self) -> str:
        lines = [self._header()]
        for i, (shape, dtype, state) in enumerate(self.arrays):
            lines.append(f"  array {i}: {dtype}{list(shape)} {state}")
        if self.steps:
            lines += tables.text_rows(self._COLUMNS, self._rows())
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        esc = html.escape
        parts = [f"<div><p>{esc(self._header())}</p>"]
        if self.arrays:
            parts.append("<ul>" + "".join(f"<li>array {i}: {esc(d)}{esc(str(list(s)))} {esc(st)}</li>"
                                          for i, (s, d, st) in enumerate(self.arrays)) + "</ul>")
        if self.steps:
            parts.append(tables.html_table(self._COLUMNS, self._rows()))
        parts.append("</div>")
        return "".join(parts)


def _refuse_traced(roots):
    """Inside a function fa.jit traces, the arguments are placeholders with no buffers, so no plan can
    be cut from them (the scheduler would wait for them forever). fa.vmap's batched arrays are
    explained as they are."""
    traced = plan._trace.sources
    if traced and any(node.id in traced for node in plan.upstream(roots)):
        raise plan.ConcretizationError(
            "fa.explain: an array computed from the arguments of a function fa.jit is tracing has no plan of "
            "its own yet; explain the jitted function's result outside it, e.g. fa.explain(f(x)) after the call")


def explain(*arrays) -> Explanation:
    """The pending graph under ``arrays`` (each an array or a pytree of them) and how an evaluation would
    cut it into kernels, without launching or compiling anything (see the module docstring)."""
    flat = _arrays_of(arrays)
    states = [(tuple(a.shape), a.dtype.name, "pending" if plan._pending(a._node) else "evaluated (no work)")
              for a in flat]
    with plan._lock:  # as plan.realize chooses its roots
        roots = [r for r in plan.requested_nodes(flat) if plan._pending(r)]
        if not roots:
            return Explanation(states, [])
        _refuse_traced(roots)
        if plan._companions:
            roots = plan._with_companions(roots)
        # one plan per device, as an evaluation runs them (plan._evaluate_per_device)
        devices = list(dict.fromkeys(r.device for r in roots))
        parts = [_explain_device([r for r in roots if r.device == d], d) for d in devices]
    steps = []
    for described, _, _ in parts:
        for info in described:  # numbered through the whole explanation, as they would run
            info.index = len(steps)
            steps.append(info)
    return Explanation(states, steps, " + ".join(backend for _, backend, _ in parts),
                       all(cached for _, _, cached in parts))


def _arrays_of(arguments) -> list:
    """The arrays in ``arguments`` (arrays or pytrees of them). A leaf that is no array is refused by
    name: explain would otherwise say "no work" for a torch tensor, a function or a generator of arrays;
    numbers, strings and None (a pytree's other leaves, which fa.eval leaves alone) are skipped."""
    from ._array import Array
    from .tree_util import tree_leaves
    if not arguments:
        raise TypeError("fa.explain: nothing to explain; pass the arrays (or pytrees of arrays) to evaluate")
    flat = []
    for leaf in tree_leaves(arguments):
        if isinstance(leaf, Array):
            flat.append(leaf)
        elif leaf is not None and not isinstance(leaf, (bool, int, float, complex, str)):
            raise TypeError(f"fa.explain: got a {type(leaf).__name__}, which is not an fa.Array; pass arrays or "
                            "pytrees (tuple, list, dict) of them (a torch tensor: fa.asarray(t) first)")
    return flat


def _explain_device(roots: list, device) -> tuple:
    """(steps, backend, plan cached) for the pending roots on one device."""
    # a meta array (the torch backend's dry run) is never evaluated: no backend, no plan to hit
    backend = "meta" if device.type == "meta" else runtime.backend_for(device)
    cached = backend != "meta" and plan.Walk(roots, backend).key in plan._plans
    with rewrites_undone(roots):
        to_primitives(roots)
        described = _describe(schedule(roots), backend)
    return described, backend, cached


def notebook_bundle(array):
    """Array._repr_mimebundle_: for an unevaluated array, text and HTML that say so and show its
    fa.explain view (nothing runs); None for an evaluated one (its ordinary repr costs nothing)."""
    if not plan._pending(array._node):
        return None
    title = (f"lazy fa.Array {array.dtype.name}{list(array.shape)}, not evaluated (displaying does not run it; "
             "print(x), x.torch() or fa.eval(x) evaluate)")
    e = explain(array)
    return {"text/plain": f"{title}\n{e}", "text/html": f"<div><p><b>{html.escape(title)}</b></p>{e._repr_html_()}</div>"}


def _describe(steps, backend) -> list:
    made = {}  # node id -> index of the step that makes its buffer
    out = []
    for index, step in enumerate(steps):
        if isinstance(step, KernelStep):
            kernel = step.kernel
            ops = [op.prim for op in kernel.ops if isinstance(op, (Elementwise, Reduce))]
            ops += ["iota" for op in kernel.ops if isinstance(op, Iota)][:1]
            inputs = [_input(n, made) for n in step.inputs]
            outputs = step.outputs
            compiled, key = _compiled_state(kernel, backend)
            info = StepInfo(index, "fused kernel", _compact(ops), inputs, [_output(n) for n in outputs], compiled, key)
        elif isinstance(step, LibraryCall):
            node = step.node
            inputs = [_library_input(n, made) for n in node.inputs]
            outputs = node.params["outputs"]
            written = [_output(n) if i not in step.into else  # written into a concat's buffer (schedule.py)
                       Buffer(n.shape, n.dtype.name, f"into step {made.get(step.into[i][0].id, '?')}'s buffer")
                       for i, n in enumerate(outputs)]
            info = StepInfo(index, "view" if node.prim.reinterpret else "library call", [_library_op(node)], inputs,
                            written, "n/a (library kernel)")
        elif isinstance(step, Allocate):
            outputs = [step.node]
            info = StepInfo(index, "allocation", [], [], [_output(step.node)], "n/a")
        else:  # pragma: no cover - a step kind this module does not know yet
            outputs = []
            info = StepInfo(index, type(step).__name__, [], [], [], "n/a")
        for n in outputs:
            made.setdefault(n.id, index)
        out.append(info)
    return out


def _library_input(node, made) -> Buffer:
    """A library call's operand: a view's base buffer, as big as the view reads of it (a broadcast reads
    the base once: a bias expanded over the rows is its own size, not the GEMM output's)."""
    if node.kind != "view":
        return _input(node, made)
    base = node.inputs[0]
    shape = node.shape if math.prod(node.shape) <= math.prod(base.shape) else base.shape
    return _input(base, made, shape=shape)


def _input(node, made, shape=None) -> Buffer:
    shape = node.shape if shape is None else shape
    if node.id in made:
        return Buffer(shape, node.dtype.name, f"intermediate (step {made[node.id]})")
    if node.buffer is not None:
        return Buffer(shape, node.dtype.name, "user buffer")
    return Buffer(shape, node.dtype.name, "intermediate")


def _output(node) -> Buffer:
    return Buffer(node.shape, node.dtype.name, "output")


def _compiled_state(kernel, backend):
    if backend in ("reference", "meta"):
        return f"n/a ({backend} {'backend' if backend == 'reference' else 'device: no values'})", ""
    try:
        spec = codegen.launch_spec(kernel)  # generates source (structure only); compiles nothing
    except Exception as exc:  # pragma: no cover - explain must not fail where evaluation would report
        return f"unknown ({type(exc).__name__})", ""
    if spec.empty:
        return "n/a (empty)", spec.key
    return ("yes" if (spec.key, backend) in runtime._memory else "no"), spec.key


def _library_op(node) -> str:
    kwargs = node.params.get("kwargs", {}) if isinstance(node.params, dict) else {}
    shown = [f"{k}={v}" for k, v in kwargs.items() if v not in (None, False)]
    return node.prim.name + (f"({', '.join(shown)})" if shown else "")


def _compact(ops: list) -> list:
    """Runs of the same op shown once with a count: exp, mul x2, add, sum."""
    out = []
    for op in ops:
        if out and out[-1][0] == op:
            out[-1][1] += 1
        else:
            out.append([op, 1])
    return [op if n == 1 else f"{op} x{n}" for op, n in out]


def _nbytes(shape, dtype_name) -> int:
    from . import dtypes
    n = 1
    for s in shape:
        n *= s
    return n * dtypes.dtype(dtype_name).itemsize


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


__all__ = ["Buffer", "Explanation", "StepInfo", "explain", "notebook_bundle"]
