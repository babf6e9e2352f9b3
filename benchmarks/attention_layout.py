"""Does the input layout or the cache state explain the seed block's attention (~209 us in the block against
~170-176 us in the attention tuner and bench, which feed per-head contiguous q/k/v)?

    PYTHONPATH=$PWD python3 benchmarks/attention_layout.py [OUT.json]

B2 H32 S2048 D128 causal, fp16 and bf16; device time of CUDA-graph replays (20 calls, median of 5), ours
(`attention_fwd`, the library's default choice) beside SDPA on the same tensors, for three layouts:
  heads    -- (B, H, S, D) memory viewed as (B, S, H, D): what the bench and the tuner time;
  tokens   -- (B, S, H, D) contiguous: one projection's output viewed per head;
  qkv      -- q, k, v views of one (B, S, 3, H, D) buffer: the seed block's fused QKV projection;
and each once more with a 96 MiB buffer written between calls ("flushed": the K/V of the call before are
out of L2, as after the block's GEMM), that write's own time subtracted. Each result is checked
against SDPA first.
"""
import json
import sys

import torch
import torch.nn.functional as F

from flyarray.kernels import attention
from gpu_timing import graph_us

B, H, S, D = 2, 32, 2048, 128
FLUSH = torch.empty(96 * 2**20 // 4, device="cuda", dtype=torch.float32)


def layouts(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)
    heads = [randn(B, H, S, D).transpose(1, 2) for _ in range(3)]
    tokens = [randn(B, S, H, D) for _ in range(3)]
    qkv = randn(B, S, 3, H, D)
    return {"heads": heads, "tokens": tokens, "qkv": [qkv[:, :, i] for i in range(3)]}


def main():
    rows = []
    flush = graph_us(lambda: FLUSH.fill_(1.0))
    for dtype in (torch.float16, torch.bfloat16):
        for name, (q, k, v) in layouts(dtype).items():
            ours = lambda: attention.attention_fwd(q, k, v, is_causal=True)[0]
            sdpa = lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                          is_causal=True)
            err = ((ours().float() - sdpa().transpose(1, 2).float()).norm() / sdpa().float().norm()).item()
            row = dict(dtype=str(dtype).split(".")[-1], layout=name, rel_err_vs_sdpa=err,
                       ours=graph_us(ours), sdpa=graph_us(sdpa),
                       ours_flushed=graph_us(lambda: (FLUSH.fill_(1.0), ours())) - flush,
                       sdpa_flushed=graph_us(lambda: (FLUSH.fill_(1.0), sdpa())) - flush)
            rows.append(row)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) and k != "rel_err_vs_sdpa" else f"{k}={v}"
                           for k, v in row.items()), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(dict(flush_us=flush, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
