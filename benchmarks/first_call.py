"""Seconds of the first call of the Llama block's forward and backward: under the flyarray backend with
and without background compiles (FLYARRAY_PRECOMPILE), and under torch.compile's default (Inductor),
each in a fresh process with fresh empty caches (flyarray's, Triton's, Inductor's), in rounds of the
three.

    PYTHONPATH=$PWD python benchmarks/first_call.py [rounds] [out.json]

A child process per measurement: Triton's JIT keeps compiled kernels in memory for the process's life.
The child prints one JSON line: first call seconds, the second call's, flyarray's compile counts, and
Triton's compiles by thread (main: at a launch; pool: precompile.py's warm-ups) with their seconds, and
the kernels compiled more than once (by name: a kernel's specializations count separately). Inductor
compiles in worker processes of its own, so its rows count no compiles. Without a GPU: tiny shapes on the
CPU, a smoke test of the script only.
"""
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, threading, time, torch
import triton.compiler
compiles = []  # (kernel name, thread: main or pool, seconds) of every Triton compile, cache hits included
_compile = triton.compiler.compile
def _timed_compile(src, *args, **kwargs):
    start = time.perf_counter()
    try:
        return _compile(src, *args, **kwargs)
    finally:
        where = "main" if threading.current_thread() is threading.main_thread() else "pool"
        compiles.append((getattr(src, "name", "?"), where, time.perf_counter() - start))
triton.compiler.compile = _timed_compile  # before any kernel's first launch: the JIT binds it then
import flyarray as fa
from flyarray.bench.torch_models import LlamaBlock
from flyarray.interop import torch as fat
torch.manual_seed(1)
device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a smoke test of this script, tiny shapes
B, S, H, heads, inter = (4, 2048, 4096, 32, 11008) if device == "cuda" else (1, 16, 64, 4, 96)
dtype = torch.bfloat16 if device == "cuda" else torch.float32
block = LlamaBlock(H, heads, inter).to(device=device, dtype=dtype)
ours = torch.compile(block) if os.environ["FIRST_CALL_BACKEND"] == "inductor" else fat.accelerate(block)
x = torch.randn(B, S, H, device=device, dtype=dtype).requires_grad_()
go = torch.randn_like(x)
leaves = [x] + list(block.parameters())
times = []
for _ in range(2):
    torch.cuda.synchronize() if device == "cuda" else None
    start = time.perf_counter()
    torch.autograd.grad(ours(x), leaves, go)
    torch.cuda.synchronize() if device == "cuda" else None
    times.append(time.perf_counter() - start)
def summary(where):
    mine = [c for c in compiles if c[1] == where]
    names = [c[0] for c in mine]
    return {f"{where}_compiles": len(mine), f"{where}_compile_s": round(sum(c[2] for c in mine), 2),
            f"{where}_kernels": sorted(set(names))}
twice = sorted({c[0] for c in compiles if [d[0] for d in compiles].count(c[0]) > 1})
print(json.dumps({"first_s": times[0], "second_s": times[1], **summary("main"), **summary("pool"),
                  "compiled_more_than_once": twice, **fa.stats()}))
"""


CASES = {"flyarray, precompile on": ("flyarray", "1"), "flyarray, precompile off": ("flyarray", "0"),
         "inductor": ("inductor", "0")}


def measure(backend: str, precompile: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FLYARRAY_CACHE_DIR=cache, FLYARRAY_PRECOMPILE=precompile, FIRST_CALL_BACKEND=backend,
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"), TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        if backend == "flyarray":
            env.pop("TRITON_CACHE_DIR")  # flyarray compiles into its private cache under FLYARRAY_CACHE_DIR
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rows = []
    for _ in range(rounds):
        for case, (backend, precompile) in CASES.items():
            row = {"case": case, **measure(backend, precompile)}
            rows.append(row)
            print(f"{case:26s} first call {row['first_s']:6.2f} s  second {row['second_s'] * 1e3:7.1f} ms  "
                  f"Triton compiles: main thread {row['main_compiles']} ({row['main_compile_s']} s), "
                  f"pool {row['pool_compiles']} ({row['pool_compile_s']} s)", flush=True)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
