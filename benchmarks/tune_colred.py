"""Column-reduction launch shapes, timed where they matter: the MLP training step (GPU, not in the suite).

The backward of every ``gelu(x @ W.T + b)`` layer has one column-major kernel: it writes dh and
sums it over the batch (the bias gradient). This sweeps that kernel's tile (kept columns per
program, reduced rows per step, warps) and how many programs the split aims for, and prints the
whole step's time and the column kernels' share (torch.profiler) per setting.

    PYTHONPATH=$PWD python benchmarks/tune_colred.py [OUT.json]
"""
import json
import sys

import torch

import flyarray as fa
from flyarray import codegen
from flyarray.bench import training
from flyarray.ops import core

# (kept columns per program, reduced rows per loop step, warps, programs the split aims for)
SETTINGS = [(32, 128, 4, 1024), (64, 64, 4, 1024), (64, 128, 4, 1024), (64, 128, 8, 1024), (128, 32, 4, 1024),
            (128, 64, 8, 1024), (128, 64, 4, 2048), (64, 64, 4, 2048), (256, 32, 8, 1024), (32, 128, 4, 2048),
            (128, 128, 8, 1024), (64, 256, 8, 1024)]


def step_time(step, params, x, y, n=20):
    for _ in range(3):
        loss, params = step(params, x, y)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        loss, params = step(params, x, y)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n, params


def colred_time(step, params, x, y):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(params, x, y)
        torch.cuda.synchronize()
    total, calls = 0.0, 0
    for e in prof.key_averages():
        if e.key.startswith("fa_colred"):
            total += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            calls += e.count
    return total / 1000, calls


def main():
    default = dict(codegen.TUNING)
    results = []
    for block_m, block_n, warps, programs in SETTINGS:
        codegen.TUNING.clear()
        codegen.TUNING.update(default, col_block_m=block_m, col_block_n=block_n, col_warps=warps)
        core._COLUMN_STRIP, core.COLUMN_PROGRAMS = block_m, programs
        codegen._SOURCES.clear()
        fa.clear_caches()
        params, x, y = training.init(4096, 8192, 4, torch.bfloat16, "cuda")
        step = training.make_fa_step()
        ms, params = step_time(step, params, x, y)
        col_ms, calls = colred_time(step, params, x, y)
        row = dict(block_m=block_m, block_n=block_n, warps=warps, programs=programs, step_ms=ms,
                   colred_ms=col_ms, colred_calls=calls)
        results.append(row)
        print(json.dumps(row), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
