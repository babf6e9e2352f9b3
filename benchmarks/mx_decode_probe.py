"""What limits the MXFP4 weight-only decode (16x14336x4096, bf16 activations): device time of the decode
kernel beside what the same grid does with less work, so the gap to the bandwidth limit can be split up.

Rows (CUDA-graph replay, weights rotated through 4 copies so they come from HBM, not the 50 MB L2):
  decode <config>      the kernel as the library runs it, at a few tiles / K splits
  read <tile>          a kernel with the decode's grid and tile that only streams the same weight words
                       (and scale bytes) and XORs them: the memory system's rate at this grid
  flat <P>/<tile>      a persistent read of the weight words alone: P programs, each streaming one contiguous run
                       of (row tile, K step) iterations in one loop, loads issued two iterations ahead by hand
                       (the read kernel's loads are not pipelined: no cp.async, so it measures latency, not
                       the memory system): what another grid, with loads in flight, reads
  copy                 torch's copy of the packed weights (read + write)
  bf16 matmul          torch.matmul with bf16 weights (the format MXFP4 must beat by 2.5x)
With ``noscale`` as the first argument the decode's scale loads are replaced by a constant (a different
answer: for timing only), to see what the per-step synchronous scale load costs.

    [SHAPE=M,N,K] PYTHONPATH=$PWD python benchmarks/mx_decode_probe.py [noscale] [OUT.json]
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl
from gpu_timing import graph_us as _graph_us

from flyarray.kernels import mx, scaled_matmul as sm

M, N, K = (int(v) for v in os.environ.get("SHAPE", "16,14336,4096").split(","))   # SHAPE=16,4096,14336: down proj
COPIES = 4   # 4 x 31 MB of packed weights: more than the L2 holds

NOSCALE = len(sys.argv) > 1 and sys.argv[1] == "noscale"
if NOSCALE:
    @triton.jit
    def _constant_codes(s_ptrs, g, k0, k_end):
        return tl.full((s_ptrs.shape[0], g.shape[0]), 127, tl.int32)
    sm._scale_codes = _constant_codes   # before the first compile, so the kernel picks it up


@triton.jit
def _read_kernel(w_ptr, s_ptr, out_ptr, N, K, stride_words, stride_sn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr):
    """XOR of the weight words and scale bytes of BLOCK_N rows over this program's K range (16-byte loads:
    the row stride in words and K are multiples of 16, k0 of BLOCK_K)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_safe = tl.where(rn < N, rn, 0).to(tl.int64)
    jw = tl.arange(0, BLOCK_K // 8)
    g = tl.arange(0, BLOCK_K // 32)
    words = w_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + rn_safe[:, None] * stride_words + jw[None, :]
    scales = s_ptr + rn_safe[:, None] * stride_sn + g[None, :]
    per = K // SPLIT_K
    acc = tl.zeros((BLOCK_N, BLOCK_K // 8), tl.int32)
    sacc = tl.zeros((BLOCK_N, BLOCK_K // 32), tl.int32)
    for k0 in range(split * per, split * per + per, BLOCK_K):
        k0 = tl.multiple_of(k0, BLOCK_K)
        acc ^= tl.load(words + k0 // 8)
        sacc ^= tl.load(scales + k0 // 32).to(tl.int32)
    total = tl.sum(acc, axis=1) ^ tl.sum(sacc, axis=1)
    tl.store(out_ptr + split * N + rn, total, mask=rn < N)


@triton.jit
def _flat_tile(words, rows, jw, it, n_tiles, k_steps, stride_words, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The weight words of iteration ``it`` of the (row tile, K step) walk, K fastest (0 past the last tile)."""
    tile = it // k_steps
    k0 = tl.multiple_of((it - tile * k_steps) * (BLOCK_K // 8), BLOCK_K // 8)
    rn = (tile * BLOCK_N + rows).to(tl.int64)
    return tl.load(words + rn[:, None] * stride_words + k0 + jw[None, :], mask=(rn < n_tiles * BLOCK_N)[:, None], other=0)


@triton.jit
def _read_flat_kernel(w_ptr, out_ptr, n_tiles, k_steps, iters, stride_words, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """XOR of the weight words of iterations [pid * iters, +iters) of the walk. Triton's pipeliner leaves a
    load that feeds no dot synchronous (plain ld.global, no cp.async: the per-tile read kernel above is
    latency-bound for that reason), so each iteration's load is issued two iterations ahead by hand."""
    pid = tl.program_id(0)
    jw = tl.arange(0, BLOCK_K // 8)
    rows = tl.arange(0, BLOCK_N)
    words = w_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    first = pid * iters
    a = _flat_tile(words, rows, jw, first, n_tiles, k_steps, stride_words, BLOCK_N, BLOCK_K)
    b = _flat_tile(words, rows, jw, first + 1, n_tiles, k_steps, stride_words, BLOCK_N, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K // 8), tl.int32)
    for it in range(first + 2, first + iters + 2):
        c = _flat_tile(words, rows, jw, tl.where(it < first + iters, it, n_tiles * k_steps), n_tiles, k_steps,
                       stride_words, BLOCK_N, BLOCK_K)
        acc ^= a
        a = b
        b = c
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


def graph_us(fns, calls=20, rounds=7):
    """Median us per call of a CUDA graph cycling through ``fns`` (one per weight copy)."""
    return _graph_us(fns, calls, rounds)


_BASE = dict(kernel="decode", BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=2, num_stages=3)
DECODES = {
    "32/256/2 s3": _BASE,
    "32/256/2 s2 pair": dict(_BASE, num_stages=2, PAIR_STEPS=True),
    **{f"{bn}/{bk}/{w} s{st} split{sp}": dict(_BASE, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st, SPLIT_K=sp)
       for bn, bk, w, st, sp in [(32, 256, 2, 3, 2), (32, 256, 2, 3, 4), (32, 256, 2, 3, 8), (32, 256, 2, 2, 4),
                                 (32, 256, 2, 4, 4), (32, 128, 2, 4, 4), (64, 256, 4, 3, 4)]},
    "32/256/2 s2 split4 pair": dict(_BASE, num_stages=2, SPLIT_K=4, PAIR_STEPS=True),
    "32/256/2 s3 split4 aligned quad": dict(_BASE, SPLIT_K=4, ALIGNED_K=True, QUAD_SIGNS=True),
}
# persistent reads: (programs per SM, BLOCK_N, BLOCK_K, warps, stages); 0 programs per SM: one program per row
# tile, the decode's grid, with the loads in flight
FLAT_READS = [(0, 32, 256, 2, 3), (0, 32, 512, 2, 3), (1, 32, 256, 4, 4), (2, 32, 256, 4, 4), (4, 32, 256, 2, 4), (1, 64, 256, 8, 4), (2, 64, 256, 4, 4),
              (1, 32, 512, 4, 4), (2, 32, 512, 4, 3), (1, 64, 512, 8, 3), (4, 16, 512, 2, 4)]
READS = [(32, 256, 2, 3, 1), (32, 256, 2, 3, 2), (32, 256, 2, 3, 4), (64, 256, 4, 3, 4), (128, 256, 8, 4, 4),
         (64, 512, 4, 4, 4)]


def main():
    out_path = next((a for a in sys.argv[1:] if a.endswith(".json")), None)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    weights = [torch.randn(N, K, device="cuda", generator=g) for _ in range(COPIES)]
    packed = [mx.mx_quantize(w, "e2m1") for w in weights]
    codes = [(d, mx.scales_as_uint8(s).contiguous()) for d, s in packed]
    nbytes = codes[0][0].numel() + codes[0][1].numel()
    cfg = sm.pick_config(sm.CONFIGS, "sm_90")
    rows = {}
    ref = x.float() @ mx.mx_dequantize(*packed[0], "e2m1").float().T
    for name, c in DECODES.items():
        outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]
        fns = [lambda i=i, c=c: sm._decode_candidate(x, codes[i][0], codes[i][1], "bf16", "e2m1", outs[i], cfg, c)
               for i in range(COPIES)]
        fns[0]()
        err = ((outs[0].float() - ref).norm() / ref.norm()).item()
        us = graph_us(fns)
        rows["decode " + name] = dict(us=us, tbps=nbytes / us / 1e6, rel_err=err)
    us = graph_us([lambda i=i: sm.scaled_matmul(x, packed[i][0], None, packed[i][1]) for i in range(COPIES)])
    rows["scaled_matmul (the library's timed choice)"] = dict(us=us, tbps=nbytes / us / 1e6,
                                                               choice=str(sm.tuning_choices()))
    if NOSCALE:
        READS.clear()
    for bn, bk, warps, stages, split in READS:
        outs = [torch.empty(split, N, device="cuda", dtype=torch.int32) for _ in range(COPIES)]
        fns = [lambda i=i, bn=bn, bk=bk, warps=warps, stages=stages, split=split: _read_kernel[
            (triton.cdiv(N, bn), split)](codes[i][0], codes[i][1], outs[i], N, K, codes[i][0].stride(0) // 4,
                                         codes[i][1].stride(0), BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                                         num_warps=warps, num_stages=stages) for i in range(COPIES)]
        us = graph_us(fns)
        rows[f"read {bn}/{bk}/{warps} s{stages} split{split}"] = dict(us=us, tbps=nbytes / us / 1e6)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_sm, bn, bk, warps, stages in ([] if NOSCALE else FLAT_READS):
        n_tiles, k_steps = triton.cdiv(N, bn), K // bk
        programs = per_sm * sms or n_tiles
        iters = triton.cdiv(n_tiles * k_steps, programs)
        outs = [torch.empty(programs, device="cuda", dtype=torch.int32) for _ in range(COPIES)]
        fns = [lambda i=i, bn=bn, bk=bk, warps=warps, stages=stages, programs=programs, iters=iters, n_tiles=n_tiles,
               k_steps=k_steps: _read_flat_kernel[(programs,)](codes[i][0], outs[i], n_tiles, k_steps, iters,
                                                               codes[i][0].stride(0) // 4, BLOCK_N=bn, BLOCK_K=bk,
                                                               num_warps=warps, num_stages=stages)
               for i in range(COPIES)]
        us = graph_us(fns)
        rows[f"flat {programs}/{bn}/{bk}/{warps} s{stages}"] = dict(us=us, tbps=codes[0][0].numel() / us / 1e6)
    words = [codes[i][0].view(torch.int32) for i in range(COPIES)]
    us = graph_us([lambda i=i: words[i].sum(dim=1) for i in range(COPIES)])
    rows["torch row sums (reads all)"] = dict(us=us, tbps=codes[0][0].numel() / us / 1e6)
    dsts = [torch.empty_like(codes[i][0]) for i in range(COPIES)]
    us = graph_us([lambda i=i: dsts[i].copy_(codes[i][0]) for i in range(COPIES)])
    rows["copy (read+write)"] = dict(us=us, tbps=2 * codes[0][0].numel() / us / 1e6)
    bf16 = [w.to(torch.bfloat16) for w in weights]
    us = graph_us([lambda i=i: x @ bf16[i].T for i in range(COPIES)])
    rows["bf16 matmul"] = dict(us=us, tbps=bf16[0].numel() * 2 / us / 1e6)
    tag = "noscale " if NOSCALE else ""
    for name, r in rows.items():
        print(f"{tag}{name:28s} {r['us']:8.1f} us {r['tbps']:6.2f} TB/s", *(f"err {r['rel_err']:.2e}",)
              if "rel_err" in r else (), flush=True)
    if out_path:
        with open(out_path, "w") as f:
            json.dump({tag + k: v for k, v in rows.items()}, f, indent=1)


if __name__ == "__main__":
    main()
