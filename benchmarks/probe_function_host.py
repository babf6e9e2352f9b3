"""Host cost of torch-in/torch-out calls (fat.function, fa.jit, the asarray/from_dlpack user path) beside torch
eager, back to back: N calls, one synchronize, us a call (the kernels are tiny: the host is what is timed).

    PYTHONPATH=$PWD python3 benchmarks/probe_function_host.py [N]
Run it once per tree (PYTHONPATH=old_tree_dir for the other) to compare them on one host.
"""
import sys
import time

import torch

import flyarray as fa
import flyarray.interop.torch as fat

device = "cuda" if torch.cuda.is_available() else "cpu"
n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
t, u = torch.randn(2048, device=device), torch.randn(2048, device=device)
one = fat.function(lambda a: fa.exp(a) + 1)
two = fat.function(lambda a, b: (fa.sin(a) * b, a + b))
jitted = fa.jit(lambda a: fa.exp(a) + 1)
cases = {
    "fat.function exp+1": lambda: one(t),
    "fat.function 2 outputs": lambda: two(t, u),
    "fa.jit exp+1 .torch()": lambda: jitted(t).torch(),
    "user exp+1 from_dlpack": lambda: torch.from_dlpack(fa.exp(fa.asarray(t)) + 1),
    "torch eager exp+1": lambda: torch.exp(t) + 1,
    "torch eager 2 outputs": lambda: (torch.sin(t) * u, t + u),
}


def wall(fn):
    for _ in range(200):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


print(fa.__file__, device)
for round_ in range(2):
    print(f"round {round_}: " + "  ".join(f"{name} {wall(fn):.1f}" for name, fn in cases.items()), flush=True)
