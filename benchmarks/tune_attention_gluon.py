"""The Gluon Hopper attention kernels (kernels/attention_hopper.py) on an H200: checked, then timed.

    PYTHONPATH=$PWD python benchmarks/tune_attention_gluon.py $OUT/gluon.json

1. Every tile config against float32 math (torch, on the GPU) on edge cases: causal with Sq != Sk
   (both ways, including rows that see no key), lengths that are not multiples of any tile, GQA,
   head_dim 64 and 128, fp16 and bf16, inputs as torch users make them ((B, H, S, D) transposed).
   A config that fails any case is not timed.
2. The issue-15 shapes: torch SDPA, the pointer kernel (flyarray's default), each Gluon config,
   as CUDA-graph replays of 20 calls (device time per call, median of 5 interleaved rounds).
3. The Gluon dk/dv kernel the same way: checked against the Triton backward, then the whole backward
   timed with it beside the Triton one and SDPA's backward (multi-head shapes).
Rows are JSON lines on stdout and all of them go to argv[1] as they are made (a hang keeps the rest).
GLUON_ONLY=ws keeps only the warp-specialized forward configs (and the best plain one, 128x128), GLUON_ONLY=pws
the persistent ones beside the WS default, GLUON_ONLY=pingpong the ping-pong ones; GLUON_BWD=0
skips part 3: a short call for the forward alone.
"""
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton.testing
from gpu_timing import graph_us

from flyarray.kernels import attention

OUT = sys.argv[1] if len(sys.argv) > 1 else None
ROWS = []

CONFIGS = [
    dict(GLUON=True, BLOCK_M=128, BLOCK_N=64, num_warps=8, STAGES=3),
    dict(GLUON=True, BLOCK_M=128, BLOCK_N=64, num_warps=8, STAGES=4),
    dict(GLUON=True, BLOCK_M=128, BLOCK_N=128, num_warps=8, STAGES=3),
    dict(GLUON=True, BLOCK_M=64, BLOCK_N=64, num_warps=4, STAGES=3),
    dict(GLUON=True, BLOCK_M=64, BLOCK_N=128, num_warps=4, STAGES=3),
    # warp-specialized (a TMA producer warp, a consumer warpgroup per 64 rows): untimed until this runs
    dict(GLUON=True, WS=True, BLOCK_M=128, BLOCK_N=128, num_warps=4, STAGES=3, CONSUMER_REGS=240, PRODUCER_REGS=40),
    dict(GLUON=True, WS=True, BLOCK_M=128, BLOCK_N=64, num_warps=4, STAGES=3, CONSUMER_REGS=240, PRODUCER_REGS=40),
    dict(GLUON=True, WS=True, BLOCK_M=128, BLOCK_N=64, num_warps=4, STAGES=4, CONSUMER_REGS=240, PRODUCER_REGS=40),
    dict(GLUON=True, WS=True, BLOCK_M=128, BLOCK_N=128, num_warps=4, STAGES=3, CONSUMER_REGS=232, PRODUCER_REGS=24),
]
# persistent (one program per SM looping over query blocks; the producer runs into the next block while the
# consumers store the current one): untimed until this runs
PERSISTENT = [
    dict(GLUON=True, WS=True, PERSISTENT=True, BLOCK_M=128, BLOCK_N=128, num_warps=4, STAGES=3,
         CONSUMER_REGS=240, PRODUCER_REGS=40),
    dict(GLUON=True, WS=True, PERSISTENT=True, BLOCK_M=128, BLOCK_N=128, num_warps=4, STAGES=3,
         CONSUMER_REGS=232, PRODUCER_REGS=24),
    dict(GLUON=True, WS=True, PERSISTENT=True, BLOCK_M=128, BLOCK_N=64, num_warps=4, STAGES=5,
         CONSUMER_REGS=240, PRODUCER_REGS=40),
    # FlashAttention-3's ping-pong: the consumers take turns issuing their matmuls (128 x 128 spills 25-225
    # bytes under Triton 3.6 at 240 registers, 65-169 at 248; 128 x 64 does not)
    dict(GLUON=True, WS=True, PERSISTENT=True, PINGPONG=True, BLOCK_M=128, BLOCK_N=64, num_warps=4, STAGES=5,
         CONSUMER_REGS=240, PRODUCER_REGS=40),
    dict(GLUON=True, WS=True, PERSISTENT=True, PINGPONG=True, BLOCK_M=128, BLOCK_N=128, num_warps=4, STAGES=3,
         CONSUMER_REGS=240, PRODUCER_REGS=40),
    dict(GLUON=True, WS=True, PERSISTENT=True, PINGPONG=True, BLOCK_M=128, BLOCK_N=128, num_warps=4, STAGES=3,
         CONSUMER_REGS=248, PRODUCER_REGS=24),
]
CONFIGS += PERSISTENT
if os.environ.get("GLUON_ONLY") == "ws":
    CONFIGS = [c for c in CONFIGS if c.get("WS") or (c["BLOCK_M"], c["BLOCK_N"]) == (128, 128)]
if os.environ.get("GLUON_ONLY") == "pws":   # the persistent configs beside the WS default
    CONFIGS = [c for c in CONFIGS if (c.get("PERSISTENT") and not c.get("PINGPONG"))
               or c == attention._SM90["fwd_gluon_ws"][128]]
if os.environ.get("GLUON_ONLY") == "pingpong":   # the ping-pong configs beside the WS default
    CONFIGS = [c for c in CONFIGS if c.get("PINGPONG") or c == attention._SM90["fwd_gluon_ws"][128]]
# (name, B, Hq, Hkv, Sq, Sk, D, causal)
CHECKS = [
    ("causal_square", 2, 4, 4, 384, 384, 128, True),
    ("causal_ragged", 1, 4, 2, 333, 333, 128, True),
    ("causal_sq_lt_sk", 1, 2, 2, 100, 515, 128, True),
    ("causal_sq_gt_sk", 1, 2, 2, 300, 77, 128, True),      # the first 223 rows see no key
    ("full_ragged", 2, 4, 1, 257, 1000, 128, False),
    ("full_d64", 1, 4, 4, 512, 700, 64, False),
    ("causal_d64", 1, 4, 4, 640, 640, 64, True),
    # more query blocks than SMs: a persistent program runs several, its ring and barriers carried over
    ("multi_tile_causal_gqa", 3, 24, 8, 777, 777, 128, True),
    ("multi_tile_full_d64", 2, 40, 40, 300, 1200, 64, False),
    ("multi_tile_sq_gt_sk", 2, 48, 48, 600, 200, 128, True),
]
SHAPES = [
    ("B2_H32_S2048_D128_causal", 2, 32, 32, 2048, 2048, 128, True),
    ("B1_H32_S8192_D128", 1, 32, 32, 8192, 8192, 128, False),
    ("B8_H32_S4096_D128_causal", 8, 32, 32, 4096, 4096, 128, True),
    ("B4_H32q8kv_S4096_D128_causal", 4, 32, 8, 4096, 4096, 128, True),
]


def emit(row):
    ROWS.append(row)
    print(json.dumps(row), flush=True)
    if OUT:
        with open(OUT, "w") as f:
            json.dump(ROWS, f, indent=1)


def inputs(B, Hq, Hkv, Sq, Sk, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(B, Hkv, Sk, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, Hkv, Sk, D, device="cuda", generator=g).to(dtype)
    return q, k, v


def reference(q, k, v, causal):
    """float32 attention in (B, H, S, D) with bottom-right causal alignment; rows seeing no key -> 0, lse -inf."""
    Hq, Hkv = q.shape[1], k.shape[1]
    kf = k.float().repeat_interleave(Hq // Hkv, 1)
    vf = v.float().repeat_interleave(Hq // Hkv, 1)
    s = q.float() @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        Sq, Sk = s.shape[-2:]
        keep = torch.arange(Sk, device="cuda")[None, :] <= torch.arange(Sq, device="cuda")[:, None] + (Sk - Sq)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.where(torch.isfinite(lse)[..., None], torch.exp(s - lse[..., None]), torch.zeros_like(s))
    return p @ vf, lse


def run(q, k, v, causal, config):
    out, lse = attention.attention_fwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=causal, config=config)
    return out.transpose(1, 2), lse


def check(config):
    worst = 0.0
    for name, B, Hq, Hkv, Sq, Sk, D, causal in CHECKS:
        for dtype in (torch.bfloat16, torch.float16):
            q, k, v = inputs(B, Hq, Hkv, Sq, Sk, D, dtype)
            ref, ref_lse = reference(q, k, v, causal)
            out, lse = run(q, k, v, causal, config)
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            finite = torch.isfinite(ref_lse)
            lse_err = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
            lse_ok = bool((lse[~finite] == float("-inf")).all()) and bool(torch.isfinite(out).all())
            ok = err < 2e-2 and lse_err < 1e-2 and lse_ok
            emit(dict(kind="check", config=config, case=name, dtype=str(dtype), rel_err=err, lse_err=lse_err,
                      empty_rows_ok=lse_ok, ok=ok))
            worst = max(worst, err if ok else float("inf"))
    return worst


def graph_time(fn, calls=20, rounds=5):
    """Device ms per call (CUDA-graph replays: gpu_timing.graph_us)."""
    return graph_us(fn, calls, rounds) / 1e3


def flops(B, Hq, Sq, Sk, D, causal):
    f = 4.0 * B * Hq * Sq * Sk * D
    return f / 2 if causal else f


def main():
    t0 = time.time()
    good = []
    for config in CONFIGS:
        try:
            worst = check(config)
        except Exception as e:  # a config that does not compile or launch is recorded, not fatal
            emit(dict(kind="check", config=config, error=repr(e)[:400]))
            continue
        if worst < float("inf"):
            good.append(config)
    emit(dict(kind="checked", good=good, seconds=time.time() - t0))
    for name, B, Hq, Hkv, Sq, Sk, D, causal in SHAPES:
        q, k, v = inputs(B, Hq, Hkv, Sq, Sk, D, torch.bfloat16)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        cands = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv),
                 "pointer": lambda: attention.attention_fwd(qt, kt, vt, is_causal=causal)}
        for i, c in enumerate(good):
            cands[f"gluon{i}"] = lambda c=c: attention.attention_fwd(qt, kt, vt, is_causal=causal, config=c)
        ref = cands["sdpa"]().float()
        times = {}
        for label, fn in cands.items():
            if label != "sdpa":
                out = fn()[0].transpose(1, 2).float()
                err = ((out - ref).norm() / ref.norm()).item()
                if err > 2e-2:
                    emit(dict(kind="time", shape=name, label=label, error=f"rel_err {err}"))
                    continue
            times[label] = []
        for _ in range(3):   # interleaved rounds: a shared GPU drifts
            for label in times:
                times[label].append(graph_time(cands[label], calls=10, rounds=3))
        median = {label: sorted(ts)[len(ts) // 2] for label, ts in times.items()}
        for label, ms in median.items():
            emit(dict(kind="time", shape=name, label=label, ms=ms,
                      tflops=flops(B, Hq, Sq, Sk, D, causal) / ms / 1e9,
                      vs_sdpa=median["sdpa"] / ms,
                      config=good[int(label[5:])] if label.startswith("gluon") else None))
    if os.environ.get("GLUON_BWD", "1") != "0":
        backward(t0)
    emit(dict(kind="done", seconds=time.time() - t0))


TRITON = dict(GLUON=False)   # the Triton dk/dv kernel, where the table would take the Gluon one
BWD_CONFIGS = [
    dict(GLUON=True, BLOCK_M=32, BLOCK_N=128, num_warps=8, STAGES=3),
    dict(GLUON=True, BLOCK_M=32, BLOCK_N=128, num_warps=8, STAGES=2),
    dict(GLUON=True, BLOCK_M=32, BLOCK_N=64, num_warps=4, STAGES=3),
]
BWD_SHAPES = [("B2_H32_S2048_D128_causal", 2, 32, 2048, 128, True), ("B4_H32_S4096_D128_causal", 4, 32, 4096, 128, True),
              ("B1_H32_S8192_D128", 1, 32, 8192, 128, False)]


def backward(t0):
    """The Gluon dk/dv kernel: each config against the Triton backward on the CHECKS cases (multi-head
    ones), then the whole backward (pre, dk/dv, dq) timed with each, beside SDPA's backward."""
    good = []
    for config in BWD_CONFIGS:
        ok = True
        try:
            for name, B, Hq, Hkv, Sq, Sk, D, causal in CHECKS:
                for dtype in (torch.bfloat16, torch.float16):
                    q, k, v = (t.transpose(1, 2) for t in inputs(B, Hq, Hq, Sq, Sk, D, dtype))
                    do = torch.randn_like(q)
                    out, lse = attention.attention_fwd(q, k, v, is_causal=causal)
                    _, dk, dv = attention.attention_bwd(do, q, k, v, out, lse, is_causal=causal, config=config)
                    _, dk_ref, dv_ref = attention.attention_bwd(do, q, k, v, out, lse, is_causal=causal, config=TRITON)
                    err = max(((dk.float() - dk_ref.float()).norm() / dk_ref.float().norm()).item(),
                              ((dv.float() - dv_ref.float()).norm() / dv_ref.float().norm()).item())
                    emit(dict(kind="check_bwd", config=config, case=name, dtype=str(dtype), rel_err=err,
                              ok=err < 1e-2))
                    ok = ok and err < 1e-2
        except Exception as e:
            emit(dict(kind="check_bwd", config=config, error=repr(e)[:400]))
            ok = False
        if ok:
            good.append(config)
    emit(dict(kind="checked_bwd", good=good, seconds=time.time() - t0))
    for name, B, H, S, D, causal in BWD_SHAPES:
        q, k, v = inputs(B, H, H, S, S, D, torch.bfloat16)
        do = torch.randn_like(q)
        qt, kt, vt, dot = (t.transpose(1, 2) for t in (q, k, v, do))
        out, lse = attention.attention_fwd(qt, kt, vt, is_causal=causal)
        qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
        o_ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        cands = {"sdpa_bwd": lambda: torch.autograd.grad(o_ref, (qr, kr, vr), do, retain_graph=True),
                 "triton": lambda: attention.attention_bwd(dot, qt, kt, vt, out, lse, is_causal=causal, config=TRITON)}
        for i, c in enumerate(good):
            cands[f"gluon{i}"] = lambda c=c: attention.attention_bwd(dot, qt, kt, vt, out, lse, is_causal=causal,
                                                                     config=c)
        times = {label: [] for label in cands}
        for _ in range(3):   # do_bench, not graphs (autograd inside a capture is not worth the risk): ms-long calls
            for label, fn in cands.items():
                times[label].append(triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median"))
        median = {label: sorted(ts)[len(ts) // 2] for label, ts in times.items()}
        for label, ms in median.items():
            emit(dict(kind="time_bwd", shape=name, label=label, ms=ms,
                      tflops=2.5 * flops(B, H, S, S, D, causal) / ms / 1e9, vs_sdpa=median["sdpa_bwd"] / ms,
                      config=good[int(label[5:])] if label.startswith("gluon") else None))


if __name__ == "__main__":
    main()
