"""What a library dry run (flyarray/precompile.py) costs on the host: the GEMM and attention calls of a
Llama block's graphs (tiny shapes: the host code does not depend on them), run on fake tensors with
``_triton.warming_up`` set and the compiles they would start recorded, not run. Prints the first dry run
(FakeTensorMode's first use) and the best of later ones, in ms. Runs anywhere (CPU: the interpreter's
configs; the host path is the same code).

    PYTHONPATH=$PWD python benchmarks/dry_run_cost.py
"""
import time

import torch

from flyarray import precompile
from flyarray.kernels import attention, gemm


def calls(mode):
    def fake(*shape):
        return mode.from_tensor(torch.randn(*shape))
    a, b = fake(64, 32), fake(32, 48)
    gemm.matmul(a, b)
    gemm.matmul(a, b, bias=fake(48), residual=fake(64, 48), activation="gelu")
    gemm.matmul(fake(32, 64).t(), b)
    q, k, v = fake(1, 16, 4, 32), fake(1, 16, 2, 32), fake(1, 16, 2, 32)
    out, lse = attention.attention_fwd(q, k, v, is_causal=True)
    attention.attention_bwd(fake(1, 16, 4, 32), q, k, v, out, lse, is_causal=True)


def main():
    asked = []
    precompile.compile_ahead = lambda kernel, key, args, kwargs: asked.append(kernel)
    start = time.perf_counter()
    precompile.dry_run(calls)
    first = time.perf_counter() - start
    later = []
    for _ in range(10):
        start = time.perf_counter()
        precompile.dry_run(calls)
        later.append(time.perf_counter() - start)
    print(f"{len(asked) // 11} kernel launches a dry run (3 GEMMs, attention forward and backward): "
          f"first {first * 1e3:.1f} ms, then best {min(later) * 1e3:.1f} ms, median "
          f"{sorted(later)[len(later) // 2] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
