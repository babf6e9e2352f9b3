"""Decode GEMM (16 x 14336 x 4096 bf16, memory bound) beside cuBLAS: a non-persistent kernel whose
K split reduces inside the same launch (the last split of a column tile to finish sums the fp32 partials
in split order: deterministic, no second kernel), swept over tiles, warps, stages and splits.

    PYTHONPATH=$PWD python3 benchmarks/probe_decode_gemm.py [OUT_JSON]     # GPU: the sweep
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/probe_decode_gemm.py check   # CPU: small shapes

Device time: CUDA graphs of 20 calls cycling over 3 weight copies (352 MB, past L2), median of 5 replays.
Why: the library's decode tile (16x128x64, persistent) gives 112 programs for 132 SMs, and its split-K
pays a second kernel; this asks whether more, smaller programs with an in-launch reduction read the
weights nearer the copy bandwidth (4.27 TB/s measured, PERF.md).
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def decode_gemm_kernel(x_ptr, w_ptr, out_ptr, ws_ptr, lock_ptr, M, N, K,
                       sxm, sxk, swk, swn, som, son,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                       STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    k_span = tl.cdiv(tl.cdiv(K, BK), SPLIT) * BK
    k_begin = split * k_span
    k_end = tl.minimum(k_begin + k_span, K)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros([BM, BN], tl.float32)
    for k in tl.range(k_begin, k_end, BK, num_stages=STAGES):
        ks = k + offs_k
        mask_k = ks < k_end
        x = tl.load(x_ptr + offs_m[:, None] * sxm + ks[None, :] * sxk, mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0)
        w = tl.load(w_ptr + ks[:, None] * swk + offs_n[None, :] * swn, mask=mask_k[:, None] & mask_n[None, :],
                    other=0.0)
        acc = tl.dot(x, w, acc)
    out_ptrs = out_ptr + offs_m[:, None] * som + offs_n[None, :] * son
    out_mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tile = offs_m[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + split * M * N + tile, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is stored before the count says so (release below)
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:  # the last split of this column tile: sum in split order, reset the count
            total = tl.zeros([BM, BN], tl.float32)
            for s in range(SPLIT):
                total += tl.load(ws_ptr + s * M * N + tile, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(lock_ptr + pid_n, 0)


_scratch = {}


def decode_gemm(x, w, cfg, out=None):
    """x [M, K] @ w [K, N] (any strides) with the candidate kernel."""
    M, K = x.shape
    N = w.shape[1]
    BN, BK, split = cfg["BN"], cfg["BK"], cfg["SPLIT"]
    out = torch.empty(M, N, device=x.device, dtype=x.dtype) if out is None else out
    key = (x.device, M, N, split, triton.cdiv(N, BN))
    if key not in _scratch:   # the count returns to 0 after each call, so the scratch persists
        _scratch[key] = (torch.empty(max(split, 1) * M * N, device=x.device, dtype=torch.float32),
                         torch.zeros(triton.cdiv(N, BN), device=x.device, dtype=torch.int32))
    ws, lock = _scratch[key]
    grid = (triton.cdiv(N, BN), split)
    decode_gemm_kernel[grid](x, w, out, ws, lock, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                             out.stride(0), out.stride(1), BM=max(16, triton.next_power_of_2(M)), BN=BN, BK=BK,
                             SPLIT=split, STAGES=cfg["STAGES"], num_warps=cfg["WARPS"])
    return out


def _configs():
    out = []
    for bn, bk, warps, stages, split in [
            (128, 64, 4, 6, 1), (64, 128, 4, 5, 1), (32, 256, 4, 4, 1), (64, 64, 4, 6, 1), (32, 128, 4, 6, 1),
            (128, 64, 4, 6, 2), (128, 128, 4, 4, 2), (64, 128, 4, 5, 2), (64, 64, 4, 6, 2), (128, 64, 4, 4, 4),
            (128, 128, 4, 4, 4), (64, 128, 4, 4, 4), (128, 128, 8, 4, 4), (256, 64, 8, 4, 4), (128, 64, 4, 6, 8),
            (128, 128, 4, 3, 8), (256, 128, 8, 3, 8), (64, 256, 4, 3, 2), (128, 256, 8, 3, 2), (128, 256, 8, 3, 4),
            (32, 512, 4, 3, 1), (64, 512, 4, 2, 2), (128, 64, 4, 8, 2), (128, 64, 2, 6, 2), (64, 128, 2, 5, 4),
            (64, 64, 4, 4, 4), (32, 128, 4, 4, 4), (64, 128, 4, 3, 8), (32, 64, 2, 6, 4), (64, 64, 2, 4, 8)]:
        out.append({"BN": bn, "BK": bk, "WARPS": warps, "STAGES": stages, "SPLIT": split})
    return out


def check_cpu():
    """The interpreter: every split and masking path against a float64 reference, on small shapes."""
    torch.manual_seed(0)
    for M, N, K in [(3, 40, 100), (16, 64, 256), (5, 33, 64)]:
        x = torch.randn(M, K)
        for layout in ("w", "w.T"):
            w = torch.randn(K, N) if layout == "w" else torch.randn(N, K).T
            ref = x.double() @ w.double()
            for cfg in [{"BN": 16, "BK": 16, "WARPS": 1, "STAGES": 1, "SPLIT": s} for s in (1, 2, 3)]:
                got = decode_gemm(x, w, cfg)
                err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
                assert err < 1e-5, (M, N, K, layout, cfg, err)
                again = decode_gemm(x, w, cfg)
                assert torch.equal(got, again), "not deterministic"
    print("cpu check ok")


def main():
    if sys.argv[1:] == ["check"]:
        check_cpu()
        return
    sys.path.insert(0, os.path.dirname(__file__))
    from gpu_timing import graph_us

    from flyarray.kernels import gemm
    M, N, K = 16, 14336, 4096
    bytes_w = N * K * 2
    results = []
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    copies = {"w.T": [torch.randn(N, K, device="cuda", dtype=torch.bfloat16).T for _ in range(3)],
              "w": [torch.randn(K, N, device="cuda", dtype=torch.bfloat16) for _ in range(3)]}
    src = torch.empty(N * K, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_us = graph_us(lambda: dst.copy_(src))
    print(f"copy {bytes_w / 1e6:.0f} MB: {copy_us:.1f} us, {2 * bytes_w / copy_us / 1e6:.2f} TB/s (read + write)",
          flush=True)
    results.append({"kind": "copy", "us": copy_us})
    for layout, ws in copies.items():
        ref = (x.double() @ ws[0].double())
        torch_us = graph_us([lambda w=w: x @ w for w in ws])
        lib_us = graph_us([lambda w=w: gemm.matmul(x, w) for w in ws])
        print(f"{layout}: cuBLAS {torch_us:.1f} us ({bytes_w / torch_us / 1e6:.2f} TB/s), library {lib_us:.1f} us "
              f"({bytes_w / lib_us / 1e6:.2f} TB/s)", flush=True)
        results.append({"kind": "peers", "layout": layout, "torch_us": torch_us, "library_us": lib_us})
        for cfg in _configs():
            try:
                got = decode_gemm(x, ws[0], cfg)
                err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
                same = torch.equal(got, decode_gemm(x, ws[0], cfg))
                us = graph_us([lambda w=w: decode_gemm(x, w, cfg) for w in ws])
            except Exception as exc:  # a config that does not compile: say so, go on
                print(f"  {cfg} FAILED {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                continue
            results.append({"kind": "candidate", "layout": layout, "cfg": cfg, "us": us, "err": err,
                            "deterministic": same})
            print(f"  {json.dumps(cfg)} {us:.1f} us {bytes_w / us / 1e6:.2f} TB/s err {err:.1e} "
                  f"{'' if same else 'NOT DETERMINISTIC '}({torch_us / us:.2f}x cuBLAS)", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
