"""Explore launch shapes of generated kernels on the GPU (prints a table; not part of the suite).

    PYTHONPATH=$PWD python benchmarks/tune_fused.py
"""
import itertools
import json
import os
import sys

import torch
import triton.testing

import flyarray as fa
from flyarray import codegen


def _bench(fn):
    fn()
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    dev = "cuda"
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    z = torch.randn_like(x)
    s = torch.randn(16384, 8192, device=dev, dtype=torch.bfloat16)
    results = []
    default = dict(codegen.TUNING)

    def run(label, fn, **tuning):
        codegen.TUNING.clear()
        codegen.TUNING.update(default, **tuning)
        codegen._SOURCES.clear()
        jitted = fa.jit(fn)
        call = lambda: jitted(*args)
        ms = _bench(call)
        results.append({"case": label, "tuning": tuning, "ms": ms})
        print(f"{label:28} {json.dumps(tuning):60} {ms:.4f} ms", flush=True)

    args = (x, z)
    for block, warps in itertools.product([1024, 2048, 4096], [4, 8]):
        run("silu 8192^2 bf16", lambda a, b: fa.silu(a) * b + 0.5 * a, ew_block=block, ew_warps=warps)
    args = (x,)
    for chunk, tile, warps in [(None, 4096, None), (1024, 4096, 4), (2048, 4096, 8), (2048, 8192, 8),
                               (1024, 8192, 8), (4096, 8192, 8), (512, 4096, 4), (2048, 16384, 16)]:
        run("row sum 8192^2 bf16->f32", lambda a: fa.sum(a, axis=-1, dtype=fa.float32),
            reduce_block_n=chunk, row_tile=tile, row_warps=warps)
    args = (s,)
    for tile, warps in [(4096, None), (8192, 8), (8192, 16), (16384, 16), (8192, 4)]:
        run("softmax 16384x8192 bf16", lambda a: fa.nn.softmax(a), row_tile=tile, row_warps=warps)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "tune_fused.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
