"""The benchmark harness behind ``python -m flyarray bench``.

A suite module in this package exposes ``cases(device, small) -> list[Case]``.
The runner checks each case's result against torch eager (relative error by
norm, in float64) *before* timing it, then times flyarray, torch eager and
torch.compile in the same process on the same inputs, and reports the
memory-bandwidth limit where the case declares the bytes it must move.

Columns (PERF.md, "Time the user's path first"):

- ``ours``: the headline. The case's ``ours`` closure is what a user writes:
  ``fa.asarray`` on the torch inputs, the ops, ``torch.from_dlpack`` on every
  result, every call, host cost included (no pre-recorded arrays).
- ``device``: the same closure's device time, from a CUDA-graph replay (or, where
  the closure cannot be captured, torch.profiler's kernel time per call). The gap
  ``ours / device`` is host cost.
- ``wall`` (GPU, do_bench rows only): ``ours`` timed back to back as the host
  rows are (below); above ``ours`` where do_bench's L2 flush hid host cost.
- ``eager`` / ``compile``: torch eager and torch.compile of the same work, with
  their ratios to eager (``ours/eag``, ``comp/eag``: below 1 is faster than eager).

Timing modes (``Case.timing``):

- ``"device"`` (the default): on a GPU ``triton.testing.do_bench(fn,
  return_mode="median")``. Right for work that is long next to its launch cost.
- ``"host"``: wall time of N back-to-back calls with one synchronize at the end,
  median of 5 repeats (N chosen so a repeat lasts about 0.2 s, at most 2000).
  For tiny, host-bound work do_bench is the wrong clock: between calls it zeroes
  a 256 MB buffer to flush L2, and while the GPU runs that kernel the host is
  already enqueueing the next call, so the CUDA events around the call see the
  device time and hide the host cost. Back-to-back calls with one sync measure
  max(host, device) per call -- what a user's loop gets.

On the CPU every case is timed with ``time.perf_counter`` (a wall clock over
repeated calls, the median of repeats), and host rows run with one intra-op
thread (``torch.set_num_threads(1)``, for all three columns, torch.compile's
kernels included): on tiny work more threads only add OpenMP barriers, and on a
shared machine a preempted thread made torch eager's 30-op chain 10x slower.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import platform
import sys
import time
from typing import Any, Callable, Optional

import torch

from flyarray import progress

SUITES = ["elementwise", "norms", "topk", "gemm", "attention", "mx", "overhead", "training", "torch"]
_MODULES = {"torch": "torch_models"}  # a module named torch.py would invite shadowing torch


@dataclasses.dataclass
class Case:
    """One row: three ways to compute the same thing on inputs made once.

    ``ours``/``eager``/``compilable`` take no arguments (they close over the
    inputs). ``ours`` is the user path (see the module docstring). ``compilable``
    is handed to ``torch.compile``; None skips that column. ``bytes_moved`` is the
    least traffic the work needs (each input read once, each output written once)
    and gives the limit column; ``flops`` gives TFLOP/s. ``check`` overrides the
    comparison (returns a relative error). ``timing`` is ``"device"`` or
    ``"host"`` (module docstring); ``device_column`` False leaves the device
    column out (rows that launch nothing). ``first_call`` True appends the seconds of the first call
    (flyarray's, and torch.compile's: both compile then) to the printed status.
    """
    name: str
    ours: Callable[[], Any]
    eager: Callable[[], Any]
    compilable: Optional[Callable[[], Any]] = None
    bytes_moved: Optional[int] = None
    flops: Optional[int] = None
    tol: float = 1e-2
    goal: str = ""
    check: Optional[Callable[[Any, Any], float]] = None
    timing: str = "device"
    device_column: bool = True
    first_call: bool = False


def rel_error(out, ref) -> float:
    """max over outputs of ||out - ref|| / ||ref||, computed in float64."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        return math.inf
    worst = 0.0
    for o, r in zip(outs, refs):
        o = torch.from_dlpack(o) if not isinstance(o, torch.Tensor) else o
        if tuple(o.shape) != tuple(r.shape):
            return math.inf
        o64, r64 = o.detach().double(), r.detach().double()
        if not torch.isfinite(o64).all() and torch.isfinite(r64).all():
            return math.inf
        num = torch.linalg.vector_norm(o64 - r64).item()
        den = torch.linalg.vector_norm(r64).item() or 1.0
        worst = max(worst, num / den)
    return worst


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def time_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Median milliseconds per call: Triton's do_bench on a GPU, a wall clock on the CPU."""
    if device.type == "cuda":
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return sorted(samples)[len(samples) // 2]


def time_host_ms(fn: Callable[[], Any], device: torch.device, iters: Optional[int] = None,
                 repeats: int = 5, target_s: float = 0.2, max_iters: int = 2000) -> float:
    """Median over ``repeats`` of (wall time of ``iters`` back-to-back calls + one sync) / iters, in ms.

    ``iters`` None: chosen so one repeat lasts about ``target_s`` (10 to ``max_iters`` calls).
    Why not do_bench for tiny work: see the module docstring.
    """
    sync = _sync(device)
    for _ in range(3):
        fn()
    sync()
    if iters is None:
        t0 = time.perf_counter()
        for _ in range(5):
            fn()
        sync()
        per_call = max((time.perf_counter() - t0) / 5, 1e-7)
        iters = int(min(max(target_s / per_call, 10), max_iters))
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / iters * 1e3)
    return sorted(samples)[len(samples) // 2]


def time_graph_ms(fn: Callable[[], Any], device: torch.device) -> Optional[float]:
    """Median ms of one CUDA-graph replay of ``fn``: device time without host launch overhead.

    For kernels shorter than their host-side launch cost, wall time measures the
    host; this column shows what the GPU spends. None where ``fn`` cannot be captured.
    """
    if device.type != "cuda":
        return None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return time_ms(graph.replay, device)
    except Exception:
        torch.cuda.synchronize()
        return None


def time_profiler_ms(fn: Callable[[], Any], device: torch.device, iters: int = 20) -> Optional[float]:
    """Device ms per call from torch.profiler: the summed duration of the GPU kernels ``fn`` launches
    (a fallback for closures a CUDA graph cannot capture). None on the CPU or on failure."""
    if device.type != "cuda":
        return None
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        total_us = 0.0
        for e in prof.events():
            if e.device_type == DeviceType.CUDA:
                total_us += getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) or 0.0
        return total_us / iters / 1e3 if total_us > 0 else None
    except Exception:
        torch.cuda.synchronize()
        return None


def device_ms(fn: Callable[[], Any], device: torch.device) -> tuple:
    """(ms, how): a CUDA-graph replay where ``fn`` can be captured, else torch.profiler kernel time."""
    ms = time_graph_ms(fn, device)
    if ms is not None:
        return ms, "graph"
    ms = time_profiler_ms(fn, device)
    return (ms, "profiler") if ms is not None else (None, None)


def copy_bandwidth(device: torch.device, small: bool) -> float:
    """Bytes/s of ``y.copy_(x)`` (read + write counted); 2 GiB on a GPU as PERF.md asks."""
    n = (1 << 20) if small else (1 << 29)  # float32 elements: 2 GiB on the GPU
    x = torch.randn(n, device=device)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), device)
    return 2 * x.numel() * x.element_size() / (ms * 1e-3)


def run_case(case: Case, device: torch.device, bandwidth: Optional[float] = None, *, compile: bool = True,
             host_iters: Optional[int] = None, repeats: int = 5) -> dict:
    """Check, then time one case; returns its row (a dict, also what bench.json holds).

    ``compile`` False skips the torch.compile column; ``host_iters``/``repeats`` fix the
    wall-clock loop of host-timed cases and of every case on the CPU (a quick test run).
    """
    single = device.type == "cpu" and case.timing == "host"
    threads = torch.get_num_threads()
    if single:
        torch.set_num_threads(1)
    try:
        row = _run_case(case, device, bandwidth, compile, host_iters, repeats)
    finally:
        torch.set_num_threads(threads)
    if single and "ours_ms" in row:
        row["cpu_threads"] = 1
    return row


def _run_case(case, device, bandwidth, compile, host_iters, repeats) -> dict:
    row: dict = {"name": case.name, "goal": case.goal, "timing": case.timing}
    try:
        ref = case.eager()
        start = time.perf_counter()
        out = case.ours()  # the first call: compiles (kept as ours_first_call_s)
        _sync(device)()
        row["ours_first_call_s"] = time.perf_counter() - start
        err = (case.check or rel_error)(out, ref)
    except Exception as exc:  # a broken case is reported, the suite goes on
        return {**row, "status": f"ERROR: {type(exc).__name__}: {exc}"}
    row["rel_error"] = err
    if not (err <= case.tol):
        return {**row, "status": f"WRONG (rel error {err:.3g} > {case.tol})"}
    row["status"] = "ok"
    row["show_first_call"] = case.first_call
    compiled = None
    if compile and case.compilable is not None:  # compile (and let its workers settle) before any timing
        try:
            compiled = torch.compile(case.compilable)
            start = time.perf_counter()
            compiled()
            _sync(device)()
            row["compile_first_call_s"] = time.perf_counter() - start
        except Exception as exc:
            row["compile_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            compiled = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        time.sleep(0.5)

    wall = lambda fn: time_host_ms(fn, device, iters=host_iters, repeats=repeats)  # noqa: E731
    if case.timing == "host" or host_iters is not None:
        clock = wall
    else:
        clock = lambda fn: time_ms(fn, device)  # noqa: E731
    row["ours_ms"] = clock(case.ours)
    if clock is not wall and device.type == "cuda":
        row["ours_wall_ms"] = wall(case.ours)  # back-to-back calls: what do_bench's L2 flush can hide
    row["eager_ms"] = clock(case.eager)
    row["compile_ms"] = clock(compiled) if compiled is not None else None
    if case.device_column:
        row["ours_device_ms"], row["device_method"] = device_ms(case.ours, device)
        row["eager_device_ms"], _ = device_ms(case.eager, device)
    if row["eager_ms"]:
        row["ours_over_eager"] = row["ours_ms"] / row["eager_ms"]
        if row["compile_ms"] is not None:
            row["compile_over_eager"] = row["compile_ms"] / row["eager_ms"]
    if row.get("ours_device_ms"):
        row["ours_over_device"] = row["ours_ms"] / row["ours_device_ms"]
    if case.bytes_moved and bandwidth:
        row["limit_ms"] = case.bytes_moved / bandwidth * 1e3
        row["ours_over_limit"] = row["ours_ms"] / row["limit_ms"]
        row["ours_TBps"] = case.bytes_moved / (row["ours_ms"] * 1e-3) / 1e12
        if row.get("ours_device_ms"):
            row["device_over_limit"] = row["ours_device_ms"] / row["limit_ms"]
    if case.flops:
        row["ours_TFLOPs"] = case.flops / (row["ours_ms"] * 1e-3) / 1e12
        row["eager_TFLOPs"] = case.flops / (row["eager_ms"] * 1e-3) / 1e12
    return row


def environment(device: torch.device) -> dict:
    import triton
    env = {
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    try:
        from flyarray import runtime
        env["backend"] = runtime.backend_for(device)
    except Exception:
        pass
    return env


# (header, row key, format, scale): times print in microseconds, ratios as x.xx; a missing value is "-".
COLUMNS = [
    ("ours us", "ours_ms", "10.1f", 1e3),
    ("wall us", "ours_wall_ms", "9.1f", 1e3),
    ("device", "ours_device_ms", "9.1f", 1e3),
    ("ours/dev", "ours_over_device", "8.2f", 1),
    ("eager us", "eager_ms", "10.1f", 1e3),
    ("compile", "compile_ms", "9.1f", 1e3),
    ("ours/eag", "ours_over_eager", "8.2f", 1),
    ("comp/eag", "compile_over_eager", "8.2f", 1),
    ("limit us", "limit_ms", "9.1f", 1e3),
    ("x limit", "ours_over_limit", "7.2f", 1),
    ("dev xlim", "device_over_limit", "8.2f", 1),
    ("TF/s", "ours_TFLOPs", "6.0f", 1),
]
NAME_WIDTH = 46


def _cell(value, spec: str, scale: float) -> str:
    width = int(spec.split(".")[0])
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        text = format(value * scale, spec)
        return text if len(text) <= width else format(value * scale, f"{width}.3g")
    return "-".rjust(width)


def format_table(rows: list) -> str:
    """Fixed-width table: every cell is padded to its column, a missing value is a padded ``-``."""
    head = f"{'case':{NAME_WIDTH}} " + " ".join(
        h.rjust(int(spec.split(".")[0])) for h, _, spec, _ in COLUMNS) + "  status / goal"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = " ".join(_cell(r.get(key), spec, scale) for _, key, spec, scale in COLUMNS)
        tail = r["status"] + (f"  [{r['goal']}]" if r.get("goal") and r["status"] == "ok" else "")
        if r.get("show_first_call") and r.get("ours_first_call_s") is not None:
            inductor = r.get("compile_first_call_s")
            tail += f"  first call {r['ours_first_call_s']:.1f} s" + \
                (f", torch.compile's {inductor:.1f} s" if inductor is not None else "")
        lines.append(f"{r['name'][:NAME_WIDTH]:{NAME_WIDTH}} {cells}  {tail}")
    return "\n".join(lines)


def suite_cases(suite: str, device: torch.device, small: bool) -> Optional[list]:
    """The suite's cases, or None where that suite module does not exist."""
    try:
        name = f"flyarray.bench.{_MODULES.get(suite, suite)}"
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None  # that suite has not been written yet
        raise
    return module.cases(device, small)


def run(suites=None, small: Optional[bool] = None, json_path: Optional[str] = None) -> list:
    """Run the suites, print the table; write the JSON report only where ``json_path`` is given."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = (device.type != "cuda") if small is None else small
    bandwidth = copy_bandwidth(device, small)
    rows = []
    report = {"environment": environment(device), "copy_GBps": bandwidth / 1e9, "small": small, "rows": rows}

    def save():  # after every row: a run cut short by a timeout still leaves what it measured
        if json_path:
            with open(json_path, "w") as f:
                json.dump(report, f, indent=1)
    print(format_table([]).splitlines()[0], file=sys.stderr, flush=True)
    for suite in suites or SUITES:
        cases = suite_cases(suite, device, small) or []
        with progress.bar(len(cases), f"bench {suite}") as bar:  # on a terminal only (flyarray/progress.py)
            for case in cases:
                row = run_case(case, device, bandwidth)
                row["suite"] = suite
                rows.append(row)
                save()
                bar.write(format_table([row]).splitlines()[-1])
                bar.update()
    save()
    print(format_table(rows))
    return rows


def summary(report: dict) -> str:
    """The short table a GPU run prints last: user path, device time, torch peers, ratios, goal."""
    env = report.get("environment", {})
    lines = [f"{env.get('gpu') or env.get('device')}  torch {env.get('torch')}  triton {env.get('triton')}  "
             f"backend {env.get('backend', '?')}  copy {report.get('copy_GBps', 0):.0f} GB/s  (times in us)"]
    head = (f"{'suite':11} {'case':44} {'ours':>9} {'wall':>8} {'device':>8} {'o/dev':>6} {'eager':>9} "
            f"{'compile':>9} {'o/eag':>6} {'c/eag':>6}  goal / status")
    lines += [head, "-" * len(head)]
    for r in report.get("rows", []):
        if r["name"].startswith(" "):
            continue  # config probes
        cells = [_cell(r.get("ours_ms"), "9.1f", 1e3), _cell(r.get("ours_wall_ms"), "8.1f", 1e3),
                 _cell(r.get("ours_device_ms"), "8.1f", 1e3),
                 _cell(r.get("ours_over_device"), "6.2f", 1), _cell(r.get("eager_ms"), "9.1f", 1e3),
                 _cell(r.get("compile_ms"), "9.1f", 1e3), _cell(r.get("ours_over_eager"), "6.2f", 1),
                 _cell(r.get("compile_over_eager"), "6.2f", 1)]
        tail = r.get("goal", "") if r["status"] == "ok" else r["status"][:60]
        lines.append(f"{r.get('suite', '')[:11]:11} {r['name'][:44]:44} {' '.join(cells)}  {tail}")
    return "\n".join(lines)


def _main(argv=None) -> int:
    """python -m flyarray.bench.harness REPORT.json ...: the short table of each saved run."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m flyarray.bench.harness",
                                     description="the short table of saved bench runs (python -m flyarray bench --json)")
    parser.add_argument("reports", nargs="+", metavar="REPORT.json")
    for path in parser.parse_args(argv).reports:
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError) as exc:
            parser.error(f"{path}: {exc}")
        if not isinstance(report, dict) or not isinstance(report.get("rows"), list) or not all(
                isinstance(r, dict) and "name" in r and "status" in r for r in report["rows"]):
            parser.error(f"{path}: not a bench report (a JSON object whose 'rows' each have a name and a status)")
        print(summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
