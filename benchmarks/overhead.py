"""Host overheads: recording cost per op, and evaluating a cached small graph (lazy and jit).

    PYTHONPATH=$PWD python benchmarks/overhead.py [--json out.json]
Goals (issue 2): recording <= 5 us per op; a cached small graph <= 30 us. The comparison with a raw
Triton launch of a hand-written kernel is `python -m flyarray bench --suite overhead` (its one home).
"""
import json
import sys
import time

import torch

import flyarray as fa


def _per_call_us(fn, n):
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t = torch.randn(64, 64, device=device)
    x, z = fa.asarray(t), fa.asarray(torch.randn(64, 64, device=device))

    def record():
        return fa.silu(x) * z + 0.5 * x  # 5 ops: silu, mul, mul, add (+ a scalar constant)

    n = 2000
    record_us = _per_call_us(record, n) / 4

    def lazy_eval():
        record().block_until_ready()

    jitted = fa.jit(lambda a, b: fa.silu(a) * b + 0.5 * a)

    def jit_eval():
        jitted(t, t)
        sync()

    def jit_launch_only():
        jitted(t, t)  # host cost of a replay: no synchronization, the GPU runs behind

    out = {
        "device": device,
        "backend": fa.runtime.backend_for(torch.device(device)) if hasattr(fa, "runtime") else None,
        "record_us_per_op": record_us,
        "lazy_record_schedule_launch_us": _per_call_us(lazy_eval, 300),
        "jit_cached_launch_us": _per_call_us(jit_eval, 300),
        "jit_replay_host_us": _per_call_us(jit_launch_only, 1000),
    }
    sync()
    for k, v in out.items():
        print(f"{k:34} {v if isinstance(v, str) or v is None else f'{v:.1f}'}")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
