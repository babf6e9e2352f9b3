"""Seconds of the first call of the Llama block's forward and backward under the flyarray backend, with
and without background compiles (FLYARRAY_PRECOMPILE), each in a fresh process and a fresh empty cache
(flyarray's and Triton's), alternating: on, off, on, off.

    PYTHONPATH=$PWD python benchmarks/first_call.py [rounds] [out.json]

A child process per measurement: Triton's JIT keeps compiled kernels in memory for the process's life.
The child prints one JSON line: first call seconds, the second call's, and flyarray's compile counts.
"""
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, time, torch
import flyarray as fa
from flyarray.bench.torch_models import LlamaBlock
from flyarray.interop import torch as fat
torch.manual_seed(1)
B, S, H, heads, inter = 4, 2048, 4096, 32, 11008
block = LlamaBlock(H, heads, inter).to(device="cuda", dtype=torch.bfloat16)
ours = fat.accelerate(block)
x = torch.randn(B, S, H, device="cuda", dtype=torch.bfloat16).requires_grad_()
go = torch.randn_like(x)
leaves = [x] + list(block.parameters())
times = []
for _ in range(2):
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.autograd.grad(ours(x), leaves, go)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
print(json.dumps({"first_s": times[0], "second_s": times[1], **fa.stats()}))
"""


def measure(precompile: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FLYARRAY_CACHE_DIR=cache, FLYARRAY_PRECOMPILE="1" if precompile else "0")
        env.pop("TRITON_CACHE_DIR", None)
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rows = []
    for _ in range(rounds):
        for on in (True, False):
            row = {"precompile": on, **measure(on)}
            rows.append(row)
            print(f"precompile {'on ' if on else 'off'}  first call {row['first_s']:6.2f} s  "
                  f"second {row['second_s'] * 1e3:7.1f} ms  kernels compiled {row['kernels_compiled']}", flush=True)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
