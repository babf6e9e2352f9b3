"""Where the user path of a decode GEMM spends its time (issue 15's "gemm decode" row: 183 us on the user path
against 57 us of device time in the thirty-first session). Per call, us: back to back (one sync after all),
do_bench (its L2 flush between calls), CUDA-graph device time; then torch's sync debug mode (a hidden host sync
prints a warning) and cProfile of the x @ w.T call.

    PYTHONPATH=$PWD python3 benchmarks/probe_decode_user.py [OUT_FILE]
"""
import cProfile
import io
import pstats
import sys
import time
import warnings

import torch
import triton

import flyarray as fa
from flyarray.bench.harness import time_graph_ms

dev = torch.device("cuda")
x = torch.randn(16, 4096, device=dev, dtype=torch.bfloat16)
w = torch.randn(14336, 4096, device=dev, dtype=torch.bfloat16)   # nn.Linear's weight: x @ w.T
wk = w.t().contiguous()                                           # [K, N]: x @ w
cases = {
    "user x @ w.T": lambda: torch.from_dlpack(fa.matmul(fa.asarray(x), fa.asarray(w).T)),
    "user x @ w": lambda: torch.from_dlpack(fa.matmul(fa.asarray(x), fa.asarray(wk))),
    "user x @ w.T .torch()": lambda: fa.matmul(fa.asarray(x), fa.asarray(w).T).torch(),
    "torch x @ w.T": lambda: torch.matmul(x, w.t()),
    "torch x @ w": lambda: torch.matmul(x, wk),
}
out = io.StringIO()
for name, fn in cases.items():
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    n = 500
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    b2b = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(200):
        fn()
        torch.cuda.synchronize()
    synced = (time.perf_counter() - t0) / 200 * 1e6
    bench = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    graph = (time_graph_ms(fn, dev) or float("nan")) * 1e3
    print(f"{name:24} back to back {b2b:7.1f}  synced each {synced:7.1f}  do_bench {bench:7.1f}  graph {graph:7.1f}",
          file=out, flush=True)
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for name in ("user x @ w.T", "user x @ w"):
        cases[name]()
torch.cuda.set_sync_debug_mode(0)
print(f"sync warnings: {len(caught)}", file=out)
for c in caught[:5]:
    print("  ", str(c.message)[:300], file=out)
pr = cProfile.Profile()
pr.enable()
for _ in range(1000):
    cases["user x @ w.T"]()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(25)
text = out.getvalue()
print(text)
if len(sys.argv) > 1:
    open(sys.argv[1], "w").write(text)
