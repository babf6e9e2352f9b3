"""The overhead suite's host goals as paired ratios, for a noisy shared machine.

    PYTHONPATH=$PWD python benchmarks/host_ratios.py [ROUNDS]

Each round times a batch of flyarray calls and then a batch of the same work in torch eager, back to
back, and keeps their ratio; the median over the rounds cancels the slow drifts of a shared host's
speed that make separately timed columns (``python -m flyarray bench --suite overhead``) disagree
between runs. One intra-op thread, as the bench harness uses for host rows. On a machine with a GPU
the tensors live there (one sync per batch) and the goals are the GPU ones: absolute microseconds,
with the ratio to torch eager beside them (this host's speed in the same breath).
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flyarray as fa
from flyarray.bench.overhead import chain30

torch.set_num_threads(1)
GPU = torch.cuda.is_available()
device = "cuda" if GPU else "cpu"
x, x4 = torch.randn(2048, device=device), torch.randn(4096, device=device)
rows, w = torch.randn(8, 1024, device=device), torch.randn(1024, device=device)
chain_jit = fa.jit(lambda a: chain30(a, fa))


def _eager_rms(a, weight, eps=1e-6):
    return a * torch.rsqrt((a * a).mean(-1, keepdim=True) + eps) * weight


def _f_rms(a, weight, eps=1e-6):  # what a torch user calls, where this torch has it
    return F.rms_norm(a, (a.shape[-1],), weight, eps) if hasattr(F, "rms_norm") else _eager_rms(a, weight, eps)


CASES = [  # (name, flyarray user path, torch eager, CPU goal as a ratio, GPU goal in us)
    ("exp(x)+1 2048, from_dlpack", lambda: torch.from_dlpack(fa.exp(fa.asarray(x)) + 1),
     lambda: torch.exp(x) + 1, 3.0, 15),
    ("exp(x)+1 2048, .torch()", lambda: (fa.exp(fa.asarray(x)) + 1).torch(), lambda: torch.exp(x) + 1, 3.0, 15),
    ("rms_norm 8x1024", lambda: torch.from_dlpack(fa.nn.rms_norm(fa.asarray(rows), fa.asarray(w), 1e-6)),
     lambda: _f_rms(rows, w) if GPU else _eager_rms(rows, w), 3.0, 30),
    ("30-op chain 4096, lazy", lambda: torch.from_dlpack(chain30(fa.asarray(x4), fa)),
     lambda: chain30(x4, torch), 1.5, None),
    ("30-op chain 4096, fa.jit", lambda: torch.from_dlpack(chain_jit(x4)), lambda: chain30(x4, torch), 1.2, None),
]


def _batch(fn, n):
    start = time.perf_counter()
    for _ in range(n):
        fn()
    if GPU:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n


def main(rounds: int = 21):
    print(f"{device}: {'case':30} {'ours us':>9} {'eager us':>9} {'ratio':>6} {'(IQR)':>13}  goal")
    for name, ours, eager, ratio_goal, us_goal in CASES:
        for _ in range(200):
            ours(), eager()
        n = 100 if "30-op" in name else 500
        pairs = [(_batch(ours, n), _batch(eager, n)) for _ in range(rounds)]
        ratios = sorted(a / b for a, b in pairs)
        q1, q3 = ratios[len(ratios) // 4], ratios[3 * len(ratios) // 4]
        mid, ours_us = statistics.median(ratios), statistics.median(a for a, _ in pairs) * 1e6
        if GPU:  # the GPU goals are microseconds (the chains' goal is the overhead suite's 3x eager)
            met = ours_us <= us_goal if us_goal else mid <= 1 / 3
            goal = f"<= {us_goal} us" if us_goal else "<= 1/3 of eager"
        else:
            met, goal = mid <= ratio_goal, f"<= {ratio_goal}x"
        print(f"{name:30} {ours_us:9.1f} {statistics.median(b for _, b in pairs) * 1e6:9.1f} {mid:6.2f} "
              f"({q1:.2f}-{q3:.2f})  {goal}: {'met' if met else 'missed'}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 21)
