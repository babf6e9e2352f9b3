"""The benchmark harness behind ``python -m flyarray bench``.

A suite module in this package exposes ``cases(device, small) -> list[Case]``.
The runner checks each case's result against torch eager (relative error by
norm, in float64) *before* timing it, then times flyarray, torch eager and
torch.compile in the same process on the same inputs, and reports the
memory-bandwidth limit where the case declares the bytes it must move.
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

SUITES = ["elementwise", "norms", "topk", "gemm", "attention", "mx"]


@dataclasses.dataclass
class Case:
    """One row: three ways to compute the same thing on inputs made once.

    ``ours``/``eager``/``compilable`` take no arguments (they close over the
    inputs). ``compilable`` is handed to ``torch.compile``; None skips that
    column. ``bytes_moved`` is the least traffic the work needs (each input read
    once, each output written once) and gives the limit column; ``flops`` gives
    TFLOP/s. ``check`` overrides the comparison (returns a relative error).
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


def time_graph_ms(fn: Callable[[], Any], device: torch.device) -> Optional[float]:
    """Median ms of one CUDA-graph replay of ``fn``: device time without host launch overhead.

    For kernels shorter than their host-side launch cost, do_bench's wall time measures the
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


def copy_bandwidth(device: torch.device, small: bool) -> float:
    """Bytes/s of ``y.copy_(x)`` (read + write counted); 2 GiB on a GPU as PERF.md asks."""
    n = (1 << 20) if small else (1 << 29)  # float32 elements: 2 GiB on the GPU
    x = torch.randn(n, device=device)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), device)
    return 2 * x.numel() * x.element_size() / (ms * 1e-3)


def run_case(case: Case, device: torch.device, bandwidth: float) -> dict:
    row: dict = {"name": case.name, "goal": case.goal}
    try:
        ref = case.eager()
        out = case.ours()
        err = (case.check or rel_error)(out, ref)
    except Exception as exc:  # a broken case is reported, the suite goes on
        return {**row, "status": f"ERROR: {type(exc).__name__}: {exc}"}
    row["rel_error"] = err
    if not (err <= case.tol):
        return {**row, "status": f"WRONG (rel error {err:.3g} > {case.tol})"}
    row["status"] = "ok"
    compiled = None
    if case.compilable is not None:  # compile (and let its workers settle) before any timing
        try:
            compiled = torch.compile(case.compilable)
            compiled()
        except Exception as exc:
            row["compile_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            compiled = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        time.sleep(0.5)
    row["ours_ms"] = time_ms(case.ours, device)
    row["eager_ms"] = time_ms(case.eager, device)
    row["ours_graph_ms"] = time_graph_ms(case.ours, device)
    row["eager_graph_ms"] = time_graph_ms(case.eager, device)
    row["compile_ms"] = time_ms(compiled, device) if compiled is not None else None
    if case.bytes_moved:
        row["limit_ms"] = case.bytes_moved / bandwidth * 1e3
        row["ours_over_limit"] = row["ours_ms"] / row["limit_ms"]
        row["ours_TBps"] = case.bytes_moved / (row["ours_ms"] * 1e-3) / 1e12
        if row["ours_graph_ms"]:
            row["ours_graph_over_limit"] = row["ours_graph_ms"] / row["limit_ms"]
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
    return env


def format_table(rows: list) -> str:
    head = (f"{'case':44} {'ours ms':>9} {'graph':>8} {'eager ms':>9} {'graph':>8} {'compile':>9} {'limit':>8} "
            f"{'x limit':>7} {'g x lim':>7} {'TF/s':>7}  status")
    lines = [head, "-" * len(head)]
    fmt = lambda v, spec: (format(v, spec) if isinstance(v, (int, float)) else "-")
    for r in rows:
        lines.append(
            f"{r['name'][:44]:44} {fmt(r.get('ours_ms'), '9.4f')} {fmt(r.get('ours_graph_ms'), '8.4f')} "
            f"{fmt(r.get('eager_ms'), '9.4f')} {fmt(r.get('eager_graph_ms'), '8.4f')} "
            f"{fmt(r.get('compile_ms'), '9.4f')} {fmt(r.get('limit_ms'), '8.4f')} "
            f"{fmt(r.get('ours_over_limit'), '7.2f')} {fmt(r.get('ours_graph_over_limit'), '7.2f')} "
            f"{fmt(r.get('ours_TFLOPs'), '7.1f')}  {r['status']}"
        )
    return "\n".join(lines)


def run(suites=None, small: Optional[bool] = None, json_path: Optional[str] = None) -> list:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = (device.type != "cuda") if small is None else small
    bandwidth = copy_bandwidth(device, small)
    rows = []
    for suite in suites or SUITES:
        try:
            module = importlib.import_module(f"flyarray.bench.{suite}")
        except ModuleNotFoundError as exc:
            if exc.name == f"flyarray.bench.{suite}":
                continue  # that suite has not been written yet
            raise
        for case in module.cases(device, small):
            row = run_case(case, device, bandwidth)
            row["suite"] = suite
            rows.append(row)
            print(format_table([row]).splitlines()[-1], file=sys.stderr, flush=True)
    report = {"environment": environment(device), "copy_GBps": bandwidth / 1e9, "small": small, "rows": rows}
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    print(format_table(rows))
    return rows
