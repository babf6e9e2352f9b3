"""Sweep GEMM configs on the GPU (prints TFLOP/s per config, CUDA-graph device time; not part of the suite).

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

# A wider decode sweep (SHAPES=decode): narrow and wide column tiles, deep K stages, 2-8 warps, split K
DECODE_WIDE = DECODE + [
    _cfg(16, bn, bk, 1, warps, stages, split_k=split)
    for bn, bk, warps, stages, split in [
        (32, 128, 2, 6, 1), (32, 256, 4, 5, 1), (32, 512, 4, 3, 1), (64, 256, 4, 5, 1), (64, 512, 4, 3, 1),
        (64, 256, 8, 4, 1), (128, 64, 4, 8, 1), (128, 128, 8, 5, 1), (128, 256, 8, 3, 1), (16, 256, 2, 6, 1),
        (16, 512, 4, 4, 1), (64, 128, 4, 5, 4), (32, 128, 4, 5, 2), (64, 256, 4, 4, 2), (128, 128, 4, 4, 8)]]


def _graph_of(fn):
    """A CUDA graph of one call of ``fn``, after one plain call (compiles, allocates)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _graph_ms(fn) -> float:
    """Device time: a CUDA-graph replay of fn (a call with config= takes the JIT's Python launch path,
    slower than the kernel at decode shapes, so timing the call itself would time the host)."""
    return triton.testing.do_bench(_graph_of(fn).replay, return_mode="median")


def main():
    print("HAS_TENSOR_DESCRIPTORS", gemm.HAS_TENSOR_DESCRIPTORS, flush=True)
    results = []
    shapes = [((8192, 8192, 8192), SQUARE), ((4096, 12288, 4096), SQUARE[:6]), ((16, 14336, 4096), DECODE)]
    if os.environ.get("SHAPES") == "decode":  # x @ w.T as the bench's decode row (w: [N, K]), and x @ w
        shapes = [((16, 14336, 4096), DECODE_WIDE), ((16, 14336, 4096, "w.T"), DECODE_WIDE)]
    for shape, configs in shapes:
        m, n, k = shape[:3]
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        if len(shape) > 3:
            b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).T
        ref = a @ b
        torch_ms = _graph_ms(lambda: a @ b)
        print(f"{shape} torch {torch_ms:.4f} ms {2 * m * n * k / torch_ms / 1e9:.1f} TF "
              f"{2 * n * k / torch_ms / 1e9:.2f} TB/s of b", flush=True)
        for cfg in configs:
            try:
                out = gemm.matmul(a, b, config=cfg)
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                ms = _graph_ms(lambda: gemm.matmul(a, b, config=cfg))
            except Exception as exc:
                print(f"  {cfg} FAILED {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                continue
            tf = 2 * m * n * k / ms / 1e9
            results.append({"shape": list(shape), "cfg": cfg, "b_tbs": 2 * n * k / ms / 1e9, "ms": ms, "tflops": tf, "err": err,
                            "torch_ms": torch_ms})
            print(f"  {json.dumps(cfg)} {ms:.4f} ms {tf:.1f} TF err {err:.1e} ({torch_ms / ms:.2f}x torch)",
                  flush=True)
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "tune_gemm.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
