"""The seed's block forward (fp16 B2 S2048 H4096) under backend="flyarray", kernel by kernel
(torch.profiler device time) and per call (wall, synchronized): to compare GEMM settings, run it once per
setting in fresh processes, e.g. FLYARRAY_GEMM_WS=1 and =0. GPU only.

    PYTHONPATH=$PWD python benchmarks/profile_seed_block.py [label]
"""
import sys
import time

import torch

import flyarray  # noqa: F401  (registers the backend)
from flyarray.bench.torch_models import Block


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "flyarray"
    torch.manual_seed(1)
    block = Block(4096, 32).to(device="cuda", dtype=torch.float16).eval()
    x = torch.randn(2, 2048, 4096, device="cuda", dtype=torch.float16)
    ours = torch.compile(block, backend="flyarray")
    with torch.no_grad():
        for _ in range(5):
            ours(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(30):
            start = time.perf_counter()
            ours(x)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            ours(x)
            torch.cuda.synchronize()
    times.sort()
    print(f"=== {label}: median {times[len(times) // 2] * 1e6:.1f} us per call (synchronized), "
          f"min {times[0] * 1e6:.1f}", flush=True)
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
