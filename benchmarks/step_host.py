"""Is the MLP training step host-bound on this machine? Host seconds per step (no sync) against the
step's wall time and its device time, with and without a CUDA graph (GPU; not in the suite).

    PYTHONPATH=$PWD python benchmarks/step_host.py
"""
import json
import time

import torch

import flyarray as fa
from flyarray.bench import training


def measure(cuda_graph, n=20):
    params, x, y = training.init(4096, 8192, 4, torch.bfloat16, "cuda")

    @fa.jit(cuda_graph=cuda_graph)
    def step(params, x, y):
        loss, grads = fa.value_and_grad(training.mse)(params, x, y)
        return loss, fa.tree_util.tree_map(lambda p, g: p - training.LR * g, params, grads)
    for _ in range(3):
        loss, params = step(params, x, y)
    torch.cuda.synchronize()
    host = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        t0 = time.perf_counter()
        loss, params = step(params, x, y)
        host.append(time.perf_counter() - t0)
    end.record()
    torch.cuda.synchronize()
    return dict(cuda_graph=cuda_graph, host_ms_per_step=1e3 * sum(host) / n, host_ms_min=1e3 * min(host),
                wall_ms_per_step=start.elapsed_time(end) / n, graph_replays=fa.stats().get("graph_replays", 0))


if __name__ == "__main__":
    for mode in (None, True):
        fa.reset_stats()
        print(json.dumps(measure(mode)), flush=True)
