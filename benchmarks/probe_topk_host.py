"""Where a user-path top_k call's wall time goes on a GPU host: implicit synchronizations (torch's sync debug
mode), and back-to-back wall times of the pieces (kernel-level top_k, the user path, from_dlpack alone).

    PYTHONPATH=$PWD python benchmarks/probe_topk_host.py
"""
import warnings

import torch

import flyarray as fa
from flyarray.bench.harness import time_host_ms
from flyarray.kernels.top_k import top_k

x = torch.randn(64, 131072, device="cuda")
user = lambda: [torch.from_dlpack(a) for a in fa.top_k(fa.asarray(x), 50)]  # noqa: E731
kernel = lambda: top_k(x, 50)  # noqa: E731
record = lambda: fa.top_k(fa.asarray(x), 50)  # noqa: E731
evaluate = lambda: [a.torch() for a in fa.top_k(fa.asarray(x), 50)]  # noqa: E731
for fn in (user, kernel, record, evaluate):
    fn()
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        user()
torch.cuda.set_sync_debug_mode("default")
print("synchronizing calls in 3 user calls:", len(caught), [str(w.message)[:120] for w in caught[:3]])


def wall(fn, n=2000):
    """us a call over n back-to-back calls and one synchronize (the bench's wall column, one repeat)."""
    return time_host_ms(fn, torch.device("cuda"), iters=n, repeats=1) * 1e3


for rnd in range(2):
    for name, fn in (("user", user), ("kernel-level", kernel), ("record only", record), ("record+.torch()", evaluate)):
        print(f"round {rnd} {name:16} {wall(fn):7.1f} us/call")
