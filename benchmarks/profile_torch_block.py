"""Where a Llama-style block's forward+backward spends device time: under backend="flyarray" and under
torch.compile (Inductor), kernel by kernel (torch.profiler; GPU); then flyarray's own table of the same
step (fa.profile: each kernel's bytes and GB/s, so a slow fused kernel shows how far it is from the
memory bound).

    PYTHONPATH=$PWD python benchmarks/profile_torch_block.py [B S H heads intermediate]
"""
import sys

import torch

import flyarray as fa
import flyarray.interop.torch as fat
from flyarray.bench.torch_models import LlamaBlock

B, S, H, heads, inter = (int(a) for a in sys.argv[1:6]) if len(sys.argv) > 5 else (4, 2048, 4096, 32, 11008)


def profile(label, module, x, go):
    leaves = [x] + list(module.parameters())
    for _ in range(3):
        torch.autograd.grad(module(x), leaves, go)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        torch.autograd.grad(module(x), leaves, go)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0]
    total = sum(e.self_device_time_total for e in events)
    print(f"\n=== {label}: {total / 1000:.3f} ms of kernels", flush=True)
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=90))


def main():
    torch.manual_seed(1)
    block = LlamaBlock(H, heads, inter).to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(B, S, H, device="cuda", dtype=torch.bfloat16).requires_grad_()
    go = torch.randn_like(x)
    accelerated = fat.accelerate(block)
    profile("backend=flyarray", accelerated, x, go)
    with fa.profile() as prof:
        torch.autograd.grad(accelerated(x), [x] + list(block.parameters()), go)
    print("\n=== fa.profile of backend=flyarray's step\n", prof, flush=True)
    profile("torch.compile (inductor)", torch.compile(block), x, go)
    profile("torch eager", block, x, go)


if __name__ == "__main__":
    main()
