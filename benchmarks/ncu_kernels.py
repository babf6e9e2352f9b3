"""One workload's kernels, ours beside the peer's, for Nsight Compute (hardware counters).

The Llama step's two gaps to the vendor libraries on the H100 (docs/benchmarks.md, seventeenth session):
attention (our forward 351 us vs cuDNN 265; dk/dv + dq + pre 1110 vs 880) and the widest GEMMs (0.90-0.93x
cuBLAS). Timing variants did not explain them; this runs each kernel once under the profiler so that
ncu's sections (speed of light, occupancy, warp stalls, scheduler, memory) can say what limits it.

    ncu --clock-control none --profile-from-start off --csv --page details \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \\
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats \\
        --log-file $OUT/ncu_attn_fwd.csv python3 benchmarks/ncu_kernels.py attn_fwd

Workloads: attn_fwd, attn_bwd (B2 H32 S2048 D128 causal bf16, ours then SDPA/cuDNN), gemm_qkv (x @ w.T,
M8192 N12288 K4096 bf16, ours then cuBLAS), mx_decode (MXFP4 weights, 16x14336x4096: the default tile, then split in two, then
bf16 cuBLAS). Everything runs (and compiles) twice before the profiler starts;
the profiled pass launches each side once. `--clock-control none` leaves the clocks alone (the device
tool's METHOD.md); ncu reads counters on the Firecracker machines only (KINDS.md).
"""
import sys

import torch
import torch.nn.functional as F

from flyarray.kernels import gemm
from flyarray.kernels.attention import attention_bwd, attention_fwd


def attention_inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(2, 32, 2048, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    return q, k, v, do


def attn_fwd():
    q, k, v, _ = attention_inputs()
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
    return [lambda: attention_fwd(qs, ks, vs, is_causal=True),
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)]


def attn_bwd():
    q, k, v, do = attention_inputs()
    qs, ks, vs, dos = (t.transpose(1, 2) for t in (q, k, v, do))
    out, lse = attention_fwd(qs, ks, vs, is_causal=True)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, is_causal=True)
    return [lambda: attention_bwd(dos, qs, ks, vs, out, lse, is_causal=True),
            lambda: torch.autograd.grad(ref, leaves, do, retain_graph=True)]


def gemm_qkv():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(12288, 4096, device="cuda", dtype=torch.bfloat16, generator=g) / 64
    return [lambda: gemm.matmul(x, w.T), lambda: x @ w.T]


def mx_decode():
    """MXFP4 weight-only decode 16x14336x4096: the default tile, the same split in two, then bf16 cuBLAS."""
    from flyarray.kernels import mx, scaled_matmul as sm
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(16, 4096, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(14336, 4096, device="cuda", generator=g)
    data, scales = mx.mx_quantize(w, "e2m1")
    s8 = mx.scales_as_uint8(scales).contiguous()
    cfg = sm.pick_config(sm.CONFIGS, "sm_90")
    out = torch.empty(16, 14336, device="cuda", dtype=torch.bfloat16)
    tiles = [dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=2, num_stages=3),
             dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=2, num_warps=2, num_stages=3)]
    bf16 = w.to(torch.bfloat16)
    return [*(lambda c=c: sm._decode_candidate(x, data, s8, "bf16", "e2m1", out, cfg, c) for c in tiles),
            lambda: x @ bf16.T]


WORKLOADS = {"attn_fwd": attn_fwd, "attn_bwd": attn_bwd, "gemm_qkv": gemm_qkv, "mx_decode": mx_decode}


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "attn_fwd"
    if name not in WORKLOADS:
        raise SystemExit(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}")
    sides = WORKLOADS[name]()
    for _ in range(2):   # compile, tune and warm up outside the profiled range
        for run in sides:
            run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for run in sides:
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"{name}: profiled one pass of ours and the peer", flush=True)


if __name__ == "__main__":
    main()
