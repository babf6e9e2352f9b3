"""Device-time helpers for the probe scripts in this folder (run as ``python3 benchmarks/<script>.py``, which puts
this folder on sys.path): CUDA-graph replays and torch.profiler per-kernel sums."""
import torch


def graph_us(fns, calls=20, rounds=5) -> float:
    """Device us per call: one CUDA graph of ``calls`` calls (captured after a warm-up on a side stream), replayed
    ``rounds`` times; the median round. ``fns``: one callable, or several that the calls cycle through (one per
    weight copy, so the weights come from memory rather than L2)."""
    fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    for f in fns:
        f()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fns[i % len(fns)]()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls * 1e3)
    return sorted(times)[len(times) // 2]


def profiled_us(fn, calls=10) -> dict:
    """Device us per call by kernel name (torch.profiler over ``calls`` back-to-back calls), largest first."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name[:40]] = per.get(e.name[:40], 0.0) + e.device_time_total / calls
    return {k: round(v, 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}
