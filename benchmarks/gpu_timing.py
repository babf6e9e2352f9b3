"""Device-time helpers for the probe scripts in this folder (run as ``python3 benchmarks/<script>.py``, which puts
this folder on sys.path): CUDA-graph replays and torch.profiler per-kernel sums."""
import torch


def graph_us(fn, calls=20, rounds=5) -> float:
    """Device us per call of ``fn``: one CUDA graph of ``calls`` calls (captured after a warm-up on a side stream),
    replayed ``rounds`` times; the median round."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return round(sorted(times)[len(times) // 2], 1)


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
