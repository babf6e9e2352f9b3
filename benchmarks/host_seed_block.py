"""Where the seed block's forward (fp16 B2 S2048 H4096) spends host time, beside torch eager and Inductor.
GPU only.

The bench row times ``block(x)`` with do_bench, which zeroes a 256 MB buffer (~85 us on an H100) before each
call: host work before a call's first kernel launch longer than that leaves the GPU idle inside the timed
interval. So for each of flyarray's backend, eager and Inductor this prints:

- host: wall time of one call with the GPU idle before it (a synchronize first, none after), median of 30;
- first launch: microseconds from the call's start to its first kernel launch, and the largest gap
  between two launches (torch.profiler's CPU events, one call);
- syncs: synchronizing CUDA calls in one call (``torch.cuda.set_sync_debug_mode("warn")``);
- do_bench with and without the L2 flush, and back-to-back calls (one sync at the end).

Then flyarray's call taken apart (host us, median of 30 calls, the GPU idle before each): the whole call,
the backend's CompiledGraph call, fa.jit's replay, the plan's run and each of its steps by label; then
cProfile's top functions of flyarray's call (50 calls), by cumulative and by own time.

    PYTHONPATH=$PWD python benchmarks/host_seed_block.py
"""
import cProfile
import io
import os
import pstats
import statistics
import time
import warnings

import torch
import triton.testing

import flyarray  # noqa: F401  (registers the backend)
from flyarray.bench.torch_models import Block


def _host_us(fn, n=30):
    samples = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def _launch_timeline(fn):
    """(us from the call's start to its first kernel launch, the largest gap between launches, launches)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        with torch.profiler.record_function("seed_call"):
            fn()
        torch.cuda.synchronize()
    events = prof.events()
    call = next(e for e in events if e.name == "seed_call")
    runtime_calls = {}
    for e in events:   # the CUDA runtime/driver calls of one call: a memcpy or synchronize here stalls the host
        if e.name.startswith(("cuda", "cu")) and e.device_type == torch.autograd.DeviceType.CPU:
            runtime_calls[e.name] = runtime_calls.get(e.name, 0) + 1
    print("  runtime calls:", runtime_calls)
    launches = sorted(e.time_range.start for e in events
                      if "LaunchKernel" in e.name or e.name in ("cuLaunchKernelEx", "cudaLaunchKernelExC"))
    if not launches:
        return None, None, 0
    gaps = [b - a for a, b in zip(launches, launches[1:])]
    return launches[0] - call.time_range.start, max(gaps, default=0.0), len(launches)


def _syncs(fn):
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return [str(w.message)[:120] for w in caught if "synchroniz" in str(w.message)]


def _back_to_back_us(fn, n=50):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


class _Timed:
    """Wraps a function, keeping the host microseconds of each call under ``name``."""

    def __init__(self, fn, name, into):
        self.fn, self.name, self.into = fn, name, into

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.into.setdefault(self.name, []).append((time.perf_counter() - t0) * 1e6)


def _breakdown(fn):
    """Host us of flyarray's call, layer by layer and step by step (see the module docstring)."""
    from flyarray import plan as fa_plan
    import importlib
    fa_jit = importlib.import_module("flyarray.transforms.jit")
    from flyarray.interop import torch_backend

    times = {}
    program = fa_plan._newest
    saved = (torch_backend.CompiledGraph.__call__, fa_jit._Trace.replay, program.steps)
    torch_backend.CompiledGraph.__call__ = lambda self, *a: _Timed(saved[0], "CompiledGraph", times)(self, *a)
    fa_jit._Trace.replay = lambda self, t: _Timed(saved[1], "jit replay", times)(self, t)
    program.steps = [_Timed(step, f"step {i} {label}", times)
                     for i, (step, label) in enumerate(zip(saved[2], program.labels))]
    run = program.run
    program_run = _Timed(run.__func__, "plan run", times)
    try:
        fa_plan.Plan.run = lambda self, *a: program_run(self, *a) if self is program else run.__func__(self, *a)
        _Timed(fn, "whole call", times)()
        times.clear()
        for _ in range(30):
            torch.cuda.synchronize()
            _Timed(fn, "whole call", times)()
        torch.cuda.synchronize()
    finally:
        torch_backend.CompiledGraph.__call__, fa_jit._Trace.replay, program.steps = saved
        fa_plan.Plan.run = run.__func__
    for name, samples in times.items():
        print(f"  {name:60s} {statistics.median(samples):8.1f} us  (x{len(samples) // 31 or 1})")


def main():
    torch.manual_seed(1)
    block = Block(4096, 32).to(device="cuda", dtype=torch.float16).eval()
    x = torch.randn(2, 2048, 4096, device="cuda", dtype=torch.float16)
    peers = {"flyarray": torch.compile(block, backend="flyarray"), "eager": block,
             "inductor": torch.compile(block)}
    with torch.no_grad():
        for name, model in peers.items():
            fn = lambda model=model: model(x)  # noqa: E731
            for _ in range(5):
                fn()
            first, gap, n = _launch_timeline(fn)
            row = dict(host_us=_host_us(fn), first_launch_us=first, max_gap_us=gap, launches=n,
                       syncs=_syncs(fn),
                       do_bench_us=1e3 * triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"),
                       back_to_back_us=_back_to_back_us(fn))
            print(name, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        fn = lambda: peers["flyarray"](x)  # noqa: E731
        fn()
        _breakdown(fn)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            fn()
        prof.disable()
        torch.cuda.synchronize()
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(70)
        text = out.getvalue()
        print(text[-4000:])
        out_dir = os.environ.get("OUT")
        if out_dir:
            with open(os.path.join(out_dir, f"cprofile_{key}.txt"), "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
