"""Why the seed block's attention takes ~209 us in the block (torch.profiler, seed_block_state.py) and ~169 us
alone (CUDA-graph replays, attention_layout.py), same shape and layout (B2 H32 S2048 D128 causal fp16):

    PYTHONPATH=$PWD python3 benchmarks/attention_in_block.py

1. the attention alone, q/k/v views of one (B, S, 3, H, D) buffer: torch.profiler over 10 back-to-back calls
   (the state probe's measure) and CUDA-graph replays;
2. the block's QKV GEMM (torch.matmul, fp16 4096x4096 @ 4096x12288) then the attention, CUDA-graph replays,
   less the GEMM alone: the attention's cost right after a GEMM (clocks, caches);
3. the seed block under backend="flyarray", torch.profiler per kernel (as seed_block_state.py);
each beside SDPA on the same tensors.
"""
import torch
import torch.nn.functional as F

from flyarray.kernels import attention
from gpu_timing import graph_us, profiled_us

B, H, S, D = 2, 32, 2048, 128


def main():
    qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.float16)
    q, k, v = (qkv[:, :, i] for i in range(3))
    ours = lambda: attention.attention_fwd(q, k, v, is_causal=True)[0]
    sdpa = lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True)
    print("1. alone, profiler:", "ours", profiled_us(ours), "sdpa", profiled_us(sdpa), flush=True)
    print("1. alone, graph: ours", round(graph_us(ours), 1), "sdpa", round(graph_us(sdpa), 1), flush=True)
    x = torch.randn(B * S, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, 3 * 4096, device="cuda", dtype=torch.float16) * 0.02
    out = torch.empty(B * S, 3 * 4096, device="cuda", dtype=torch.float16)
    gemm = lambda: torch.matmul(x, w, out=out)
    alone = graph_us(gemm)
    print(f"2. gemm alone {alone:.1f}; after it: ours {graph_us(lambda: (gemm(), ours())) - alone:.1f} "
          f"sdpa {graph_us(lambda: (gemm(), sdpa())) - alone:.1f}", flush=True)
    from flyarray.bench import torch_models
    block = torch_models.Block(4096, 32).to(device="cuda", dtype=torch.float16).eval()
    xin = torch.randn(B, S, 4096, device="cuda", dtype=torch.float16)
    compiled = torch.compile(block, backend="flyarray")
    with torch.no_grad():
        compiled(xin)
        print("3. block, profiler: ours", profiled_us(lambda: compiled(xin)), flush=True)
        print("3. block, profiler: eager", profiled_us(lambda: block(xin)), flush=True)
        print("3. block, profiler: ours again", profiled_us(lambda: compiled(xin)), flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main()
