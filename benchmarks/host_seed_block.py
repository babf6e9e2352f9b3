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

Then cProfile's top functions of flyarray's call (50 calls), by cumulative and by own time.

    PYTHONPATH=$PWD python benchmarks/host_seed_block.py
"""
import cProfile
import io
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
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            fn()
        prof.disable()
        torch.cuda.synchronize()
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(28)
        print(out.getvalue()[-6000:])


if __name__ == "__main__":
    main()
