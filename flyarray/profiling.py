"""fa.profile(): time every kernel that evaluations launch inside a ``with`` block.

    with fa.profile() as prof:
        y = fa.nn.softmax(x * 2.0).torch()
    print(prof)          # a table, one row per kernel; in a notebook the same as HTML

Every launch goes through ``plan.Plan.run``, which runs a plan's steps (closures) beside
``Plan.description`` (one structural entry per step: allocation, fused kernel or library call).
While a profile is open, the steps run through ``run_steps`` below, which times each launch: on a
GPU with CUDA events recorded on the current stream around the step (device time, read once the
block exits), on the CPU with a wall clock (the CPU backends run synchronously, so the wall clock
is the kernel's time plus its Python launch cost, and the table says so). On a GPU a spin kernel queued
before a plan's launches keeps the device behind the host, so the events time kernels, not launches
(``keep_the_gpu_ahead``).

The hook is ``recording``: a list that is empty when no profile is open, so ``Plan.run`` pays one
truthiness test per evaluation (not per step) when not profiling.
Profiles are process-wide (a launch from another thread inside the block is recorded too).
"""
from __future__ import annotations

import dataclasses
import html
import re
import os
import threading
import time

import torch
import torch.autograd.profiler as _torch_profiler
from torch.profiler import record_function

from . import tables

recording: list = []  # the open profiles; mutated in place, never rebound (plan.py may hold a reference)
_lock = threading.Lock()
# a forked child has only the forking thread: a lock another thread held at the fork would stay held for good
os.register_at_fork(after_in_child=_lock._at_fork_reinit)


@dataclasses.dataclass
class KernelRow:
    """One kernel's totals over every launch inside the profile."""
    kind: str  # "fused kernel" | "library call"
    name: str  # the ops a fused kernel fuses, or the library op
    key: str  # what tells two kernels apart (the generated source's key, or the op and its kwargs)
    calls: int = 0
    total_s: float = 0.0
    bytes: int = 0  # over all calls: each input read once, each output written once
    flops: int = 0  # over all calls; 0 where not known (only GEMM-like library ops know)

    @property
    def mean_s(self) -> float:
        return self.total_s / self.calls if self.calls else 0.0

    @property
    def gbps(self):
        return self.bytes / self.total_s / 1e9 if self.total_s > 0 and self.bytes else None

    @property
    def tflops(self):
        return self.flops / self.total_s / 1e12 if self.total_s > 0 and self.flops else None


class Profile:
    """The result of ``fa.profile()``: ``rows`` (KernelRow, first launch first), ``clock``
    ("cuda events" or "wall"), ``limit_gbps`` (measured copy bandwidth on a GPU, else None)."""

    def __init__(self, measure_limit: bool = True):
        self.rows: list = []
        self.clock = "wall"
        self.limit_gbps = None
        self._by_key: dict = {}
        self._pending: list = []  # (row, start event, end event) read when the block exits
        self._measure_limit = measure_limit
        self._open = False

    # ---- the context manager ------------------------------------------------------------------
    def __enter__(self):
        if self._open:
            raise RuntimeError("fa.profile: this profile is already open; make a new fa.profile() to nest")
        self._open = True
        with _lock:
            recording.append(self)
        return self

    def __exit__(self, *exc):
        with _lock:
            recording.remove(self)
        self._open = False
        self._read_events()
        return False

    # ---- recording ----------------------------------------------------------------------------
    def _row(self, description) -> KernelRow:
        key = _row_key(description)
        row = self._by_key.get(key)
        if row is None:
            kind = "fused kernel" if description[0] == "kernel" else "library call"
            row = self._by_key[key] = KernelRow(kind, _name(description), _short_key(description))
            self.rows.append(row)
        return row

    def _add(self, description, slots, seconds, events=None):
        row = self._row(description)
        row.calls += 1
        row.bytes += _bytes(description, slots)
        row.flops += _flops(description, slots)
        if events is None:
            row.total_s += seconds
        else:
            self.clock = "cuda events"
            self._pending.append((row, *events))

    def _read_events(self):
        if not self._pending:
            return
        torch.cuda.synchronize()
        for row, start, end in self._pending:
            row.total_s += start.elapsed_time(end) / 1e3
        self._pending.clear()
        if self._measure_limit:
            self.limit_gbps = _copy_gbps()

    # ---- display --------------------------------------------------------------------------------
    @property
    def total_s(self) -> float:
        return sum(r.total_s for r in self.rows)

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.rows)

    def _header(self) -> str:
        if self.clock == "wall":
            how = "CPU wall clock per launch (Python launch cost included; no device timer on the CPU)"
        else:
            how = "CUDA events around each launch (device time)"
        limit = f"; copy limit {self.limit_gbps:.0f} GB/s" if self.limit_gbps else ""
        return (f"fa.profile: {self.calls} launch(es) of {len(self.rows)} kernel(s), "
                f"{_fmt_time(self.total_s)} total; timed by {how}{limit}")

    COLUMNS = ("kernel", "kind", "calls", "total", "mean", "bytes", "GB/s", "TFLOP/s", "of limit")

    def _cells(self) -> list:
        out = []
        for r in sorted(self.rows, key=lambda r: -r.total_s):
            share = f"{100 * r.gbps / self.limit_gbps:.0f}%" if r.gbps and self.limit_gbps else "-"
            out.append([r.name, r.kind, str(r.calls), _fmt_time(r.total_s), _fmt_time(r.mean_s),
                        _fmt_bytes(r.bytes), f"{r.gbps:.3g}" if r.gbps else "-",
                        f"{r.tflops:.3g}" if r.tflops else "-", share])
        return out

    def __str__(self) -> str:
        lines = [self._header()]
        if self.rows:
            lines += tables.text_rows(self.COLUMNS, self._cells(), numeric_from=2)
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        parts = [f"<div><p>{html.escape(self._header())}</p>"]
        if self.rows:
            parts.append(tables.html_table(self.COLUMNS, self._cells()))
        return "".join(parts) + "</div>"


def profile(measure_limit: bool = True) -> Profile:
    """A context manager that times every kernel launched inside it; the result prints (and shows in a
    notebook) a table per kernel: calls, total and mean time, bytes moved, GB/s, TFLOP/s where the op's
    flops are known, and the share of the measured copy bandwidth (GPU). On a GPU from CUDA events around
    each launch; on the CPU from the wall clock (said so in the table). ``measure_limit`` False skips
    the copy-bandwidth measurement (a short copy on the GPU when the block exits)."""
    return Profile(measure_limit)


# ---- the hook -------------------------------------------------------------------------------------
def run_steps(plan, slots: list, scalars: list) -> None:
    """``Plan.run``'s loop while a profile is open: each launch timed and recorded in every open profile."""
    if len(plan.steps) != len(plan.description):  # zip would skip steps: a wrong result, not a slow one
        raise RuntimeError("fa.profile: this plan's steps and descriptions are not one to one "
                           f"({len(plan.steps)} != {len(plan.description)}); profiling.run_steps needs them to be")
    cuda = None
    for step, description in zip(plan.steps, plan.description):
        if not is_launch(description):
            step(slots, scalars)
            continue
        if cuda is None:
            cuda = _on_cuda(description, slots)
            if cuda:
                keep_the_gpu_ahead(len(plan.steps))
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(slots, scalars)
            end.record()
            for prof in recording:
                prof._add(description, slots, 0.0, (start, end))
        else:
            t0 = time.perf_counter()
            step(slots, scalars)
            seconds = time.perf_counter() - t0
            for prof in recording:
                prof._add(description, slots, seconds)


HOST_US_PER_STEP = 100  # more than one step's Python launch cost, even a first call's


def keep_the_gpu_ahead(steps: int) -> None:
    """Queue a spin kernel before a plan's timed launches. A CUDA event is stamped when the GPU reaches
    it: on an idle GPU the start event of a launch is stamped at once and its end only after the host
    has finished launching, so the host's launch cost would be counted as kernel time (the first kernel
    of a torch backend graph read 205 us in fa.profile where torch.profiler saw 42). With the spin ahead
    in the queue, every event is reached only after the launches before it, and the span between a
    launch's two events is device time. The spin itself is not timed."""
    if steps and hasattr(torch.cuda, "_sleep"):
        # cycles at 2 GHz (at or above today's clocks, so at least the time asked for); at most 10 ms
        torch.cuda._sleep(int(min(steps, 100) * HOST_US_PER_STEP * 2000))


# ---- what a step is ---------------------------------------------------------------------------------
def is_launch(description) -> bool:
    """Whether a plan step launches work: a fused kernel or a library call, but no allocation and no
    view_as_real/view_as_complex (a torch view: no launch, nothing read or written)."""
    if description[0] == "kernel":
        return True
    if description[0] != "library":
        return False
    from .primitives import LIBRARY
    return not LIBRARY[description[1]].reinterpret


def _row_key(description) -> tuple:
    if description[0] == "kernel":
        return ("kernel", description[1])  # the source key: one row per generated kernel
    return ("library", description[1], description[2])  # the op and its static kwargs


def _short_key(description) -> str:
    key = description[1]
    return key[:12] if description[0] == "kernel" and len(key) == 32 else str(key)[:40]


_NAMES: dict = {}


def _name(description) -> str:
    if description[0] == "library":
        kwargs = _kwargs(description)
        shown = [f"{k}={v}" for k, v in kwargs.items() if v not in (None, False)]
        return description[1] + (f"({', '.join(shown)})" if shown else "")
    key = description[1]
    name = _NAMES.get(key)
    if name is None:
        ops = _fused_ops(key)
        name = "fused: " + (", ".join(ops) if ops else "copy")
        if ops is not None:   # a key never seen generated is not named for good
            _NAMES[key] = name
    return name


def _fused_ops(key: str):
    """The primitive ops of a fused kernel, from its description's key: the generated source's key
    (the signature it was generated from lists the ops; None if this process generated no such source)
    or, on the reference backend, the Kernel's repr."""
    from . import codegen
    from .explain import _compact
    if len(key) == 32:
        signature = codegen.SIGNATURES_BY_KEY.get(key)
        if signature is None:
            return None
        return _compact([op[1] for op in _op_signatures(signature) if op[0] in ("E", "R")])
    return _compact(re.findall(r"(?:Elementwise|Reduce)\(prim='(\w+)'", key))


_OP_KINDS = ("L", "I", "C", "E", "R")  # load, iota, constant, elementwise, reduce (codegen._op_signature)


def _op_signatures(signature) -> tuple:
    """The per-op part of a codegen signature: the tuple of ("L"|"I"|"C"|"E"|"R", ...) entries."""
    for part in signature:
        if isinstance(part, tuple) and part and all(isinstance(op, tuple) and op and op[0] in _OP_KINDS
                                                    for op in part):
            return part
    return ()


def _kwargs(description) -> dict:
    frozen = description[2]  # plan.freeze(kwargs): (dict, (((str, name), (type, value)), ...))
    return {_thawed(name): _thawed(value) for name, value in frozen[1]}


def _thawed(value):
    """A value as plan.freeze gave it, (type, value) pairs nested in tuples and lists, back as it was."""
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], type)):
        return value
    kind, inner = value
    if kind in (tuple, list):
        return kind(_thawed(v) for v in inner)
    if kind is float:   # frozen by its bits (plan._float_bits)
        return float("nan") if inner == "nan" else float.fromhex(inner)
    return inner


def _tensors(description, slots):
    """(inputs, outputs) of a step as tensors, a library input's view applied."""
    from . import runtime
    if description[0] == "kernel":
        return [slots[i] for i in description[3]], [slots[o] for o in description[4]]
    ins = [runtime.apply_movement(slots[s], ops) if ops else slots[s] for s, ops in description[3]]
    return ins, [slots[o] for o in description[4]]


def _nbytes(t) -> int:
    """What reading ``t`` once moves: its elements, but no more than its storage (a broadcast reads less)."""
    if not isinstance(t, torch.Tensor):
        return 0
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def _bytes(description, slots) -> int:
    ins, outs = _tensors(description, slots)
    return sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs)


def _flops(description, slots) -> int:
    """Multiply-adds x 2 for the GEMM-like library ops; 0 (unknown) for everything else."""
    if description[0] != "library":
        return 0
    name = description[1]
    ins, outs = _tensors(description, slots)
    if not outs or not ins:
        return 0
    if name in ("matmul", "matmul_epilogue", "ragged_dot"):
        return 2 * outs[0].numel() * ins[0].shape[-1]
    if name == "scaled_matmul":  # K from the rhs scales [N, K/32] (the data may be packed e2m1)
        return 2 * outs[0].numel() * 32 * ins[-1].shape[-1]
    if name == "attention":  # q [B, Sq, H, D], k [B, Sk, Hk, D]: QK^T and PV
        batch, sq, heads, d = ins[0].shape
        flops = 4 * batch * heads * sq * ins[1].shape[1] * d
        return flops // 2 if _kwargs(description).get("is_causal") else flops
    return 0


def _on_cuda(description, slots) -> bool:
    """Whether this plan runs on a CUDA device: its step's inputs, else any bound buffer, else the default."""
    ins, _ = _tensors(description, slots)
    for t in ins + slots:
        if isinstance(t, torch.Tensor):
            return t.is_cuda
    from . import runtime
    return runtime.default_device().type == "cuda"


def _copy_gbps() -> float:
    """The device's copy bandwidth (read + write), the limit a memory-bound kernel can reach."""
    x = torch.empty(1 << 26, dtype=torch.float32, device="cuda")  # 256 MiB: beyond any L2
    y = torch.empty_like(x)
    y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 5 * 2 * x.nbytes / (start.elapsed_time(end) / 1e3) / 1e9


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def _fmt_bytes(n: int) -> str:
    from .explain import _fmt_bytes as fmt
    return fmt(n)


# ---- torch.profiler: labels per plan step ------------------------------------------------------------
def torch_profiler_on() -> bool:
    """Whether torch.profiler records now (one attribute read): plan steps then get labelled ranges."""
    return _torch_profiler._is_profiler_enabled


def run_labelled(plan, slots: list, scalars: list) -> None:
    """``Plan.run``'s loop while torch.profiler records: each step inside a range named by its label,
    so a trace shows ``fa::fused(exp,add)`` / ``fa::rms_norm+residual`` around the kernel it launched."""
    for step, label in zip(plan.steps, plan.labels):
        with record_function(label):
            step(slots, scalars)


def kernel_label(kernel) -> str:
    return f"fa::fused({','.join(kernel.op_names())})"


def library_label(name: str, kwargs: dict) -> str:
    """The op and the options that change what runs: flags set True, and string choices."""
    extras = [k if v is True else str(v) for k, v in sorted(kwargs.items())
              if v is True or (isinstance(v, str) and v)]
    return "+".join([f"fa::{name}", *extras])


__all__ = ["KernelRow", "Profile", "profile", "recording", "run_steps"]
