"""Host overheads: recording cost per op, and evaluating a cached small graph (lazy and jit).

    PYTHONPATH=$PWD python benchmarks/overhead.py [--json out.json]
Goals (issue 2): recording <= 5 us per op; a cached small graph <= 30 us.
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


def _bare_triton_launch(t):
    """Host cost of launching the same generated kernel straight through Triton (our floor)."""
    from flyarray import codegen, runtime
    from flyarray.schedule import schedule
    if runtime.backend_for(t.device) != "gpu":
        return None
    a = fa.asarray(t)
    (kernel,) = schedule([(fa.silu(a) * a + 0.5 * a)._node])
    plan = codegen.plan(kernel)
    fn = runtime._compiled(plan, "gpu")[plan.grid]
    out = torch.empty_like(t)
    args = [t] + [out] + list(plan.args)
    return lambda: fn(*args, num_warps=plan.num_warps, **plan.constexprs)


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

    bare = _bare_triton_launch(t)
    out = {
        "device": device,
        "backend": fa.runtime.backend_for(torch.device(device)) if hasattr(fa, "runtime") else None,
        "record_us_per_op": record_us,
        "lazy_record_schedule_launch_us": _per_call_us(lazy_eval, 300),
        "jit_cached_launch_us": _per_call_us(jit_eval, 300),
        "jit_replay_host_us": _per_call_us(jit_launch_only, 1000),
        "bare_triton_launch_host_us": _per_call_us(bare, 1000) if bare else None,
    }
    sync()
    for k, v in out.items():
        print(f"{k:34} {v if isinstance(v, str) or v is None else f'{v:.1f}'}")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
