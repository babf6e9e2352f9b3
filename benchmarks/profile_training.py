"""Which kernels a flyarray MLP training step runs, and how long each takes (torch.profiler, GPU).

    PYTHONPATH=$PWD python benchmarks/profile_training.py [WIDTH BATCH]
"""
import sys

import torch

import flyarray as fa
from flyarray.bench import training

width, batch = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (4096, 8192)
params, x, y = training.init(width, batch, 4, torch.bfloat16, "cuda")
step = training.make_fa_step()
for _ in range(3):
    loss, params = step(params, x, y)
torch.cuda.synchronize()
fa.reset_stats()
acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]  # CPU: the fa:: step labels
with torch.profiler.profile(activities=acts) as prof:
    loss, params = step(params, x, y)
    torch.cuda.synchronize()
print(fa.stats())
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70))
