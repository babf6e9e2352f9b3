"""Sweep GEMM configs on the GPU (prints TFLOP/s per config; not part of the suite).

    PYTHONPATH=$PWD python benchmarks/tune_gemm.py
"""
import json
import os

import torch
import triton.testing

from flyarray.kernels import gemm


def _cfg(bm, bn, bk, group, warps, stages, split_k=1, tma=True):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "SPLIT_K": split_k,
            "num_warps": warps, "num_stages": stages, "TMA": tma}


SQUARE = [_cfg(128, 256, 64, 8, 8, 3), _cfg(128, 256, 64, 8, 8, 4), _cfg(128, 128, 64, 8, 8, 4),
          _cfg(128, 128, 64, 8, 4, 4), _cfg(128, 128, 64, 8, 4, 3), _cfg(256, 128, 64, 8, 8, 3),
          _cfg(128, 256, 64, 8, 8, 3, tma=False), _cfg(128, 128, 64, 8, 4, 4, tma=False),
          _cfg(128, 128, 64, 8, 8, 3, tma=False), _cfg(64, 256, 64, 8, 4, 4), _cfg(128, 128, 128, 8, 8, 3)]
DECODE = [_cfg(16, 64, 128, 1, 4, 5), _cfg(16, 64, 256, 1, 4, 4), _cfg(16, 128, 128, 1, 4, 4),
          _cfg(16, 64, 128, 1, 4, 4, split_k=2), _cfg(16, 128, 128, 1, 4, 4, split_k=4),
          _cfg(16, 32, 256, 1, 4, 4), _cfg(16, 64, 64, 1, 4, 6), _cfg(16, 64, 128, 1, 4, 5, tma=False),
          _cfg(16, 128, 64, 1, 4, 6, tma=False), _cfg(16, 256, 64, 1, 8, 4, tma=False)]


def main():
    print("HAS_TENSOR_DESCRIPTORS", gemm.HAS_TENSOR_DESCRIPTORS, flush=True)
    results = []
    for (m, n, k), configs in [((8192, 8192, 8192), SQUARE), ((4096, 12288, 4096), SQUARE[:6]),
                               ((16, 14336, 4096), DECODE)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a @ b
        torch_ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
        print(f"{m}x{n}x{k} torch {torch_ms:.4f} ms {2 * m * n * k / torch_ms / 1e9:.1f} TF", flush=True)
        for cfg in configs:
            try:
                out = gemm.matmul(a, b, config=cfg)
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                ms = triton.testing.do_bench(lambda: gemm.matmul(a, b, config=cfg), return_mode="median")
            except Exception as exc:
                print(f"  {cfg} FAILED {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                continue
            tf = 2 * m * n * k / ms / 1e9
            results.append({"shape": [m, n, k], "cfg": cfg, "ms": ms, "tflops": tf, "err": err,
                            "torch_ms": torch_ms})
            print(f"  {json.dumps(cfg)} {ms:.4f} ms {tf:.1f} TF err {err:.1e} ({torch_ms / ms:.2f}x torch)",
                  flush=True)
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "tune_gemm.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
