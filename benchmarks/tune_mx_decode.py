"""Weight-only MX decode configs on the GPU (bf16 activations x MXFP4 / MXFP8 weights, 16x14336x4096):
each candidate checked against dequantise-then-matmul in fp32, then timed (do_bench, median, L2 flushed
between runs) in three interleaved rounds (the best round counts: a shared GPU drifts), beside bf16
torch.matmul. Not part of the suite; prints a table and writes JSON (after the checks and after every
round). Configs are compiled in order (the table's candidates and untried variants first) until
COMPILE_BUDGET_S seconds (default 300) have passed.

    PYTHONPATH=$PWD python benchmarks/tune_mx_decode.py [OUT.json]
"""
import itertools
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl
import triton.testing

from flyarray.kernels import mx, scaled_matmul as sm

M, N, K = 16, 14336, 4096
ROUNDS = 3
FORMATS = tuple(os.environ.get("FORMATS", "e2m1,e4m3,e5m2").split(","))  # FORMATS=e2m1: MXFP4 only


@triton.jit
def _bf16_gemv_t(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Reference point for the plain bf16 decode GEMM: out^T = W x^T with W the MMA's left operand."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + tl.where(rn < N, rn, 0)[:, None].to(tl.int64) * stride_wn + rk[None, :]
    x_ptrs = x_ptr + rm[None, :] * stride_xm + rk[:, None]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        acc = tl.dot(tl.load(w_ptrs + k0), tl.load(x_ptrs + k0, mask=(rm < M)[None, :], other=0.0), acc)
    tl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], acc.to(tl.bfloat16), mask=(rm < M)[None, :] & (rn < N)[:, None])


def bf16_rows(x, w, ref, runs, rows):
    for bn, bk, warps, stages in itertools.product((64, 128), (64, 128, 256), (4, 8), (3, 4, 5)):
        if bn * bk > 128 * 128:
            continue
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        run = lambda out=out, bn=bn, bk=bk, warps=warps, stages=stages: _bf16_gemv_t[(triton.cdiv(N, bn),)](  # noqa: E731
            x, w, out, M, N, K, x.stride(0), w.stride(0), out.stride(0), BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk,
            num_warps=warps, num_stages=stages)
        run()
        key = f"bf16 {bn} {bk} {warps} {stages}"
        rows[key] = dict(name="bf16 gemv_t", config=[bn, bk, warps, stages],
                         err=((out.float() - ref).norm() / ref.norm()).item(), bytes=w.numel() * 2)
        runs[key] = run


def candidates(w_fmt):
    """The configs the table holds, the PTX decodes on a grid of tiles, Triton-only decodes for reference, and
    the decode variants (SPLIT_WORDS, QUAD_SIGNS, ALIGNED_K, PAIR_STEPS) on the tiles that compiled clean."""
    t = dict(kernel="decode", num_stages=3)
    found = list(sm.CONFIGS["sm_90"]["decode_candidates"]) + list(sm.CONFIGS["sm_90"]["decode_untried"])
    found += [dict(t, ASM_DECODE=False, BLOCK_N=64, BLOCK_K=256, SPLIT_K=1, num_warps=8),
              dict(t, ASM_DECODE=False, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4)]
    for bn, bk, warps, split in itertools.product((32, 64, 128), (128, 256), (2, 4, 8), (1, 2)):
        if warps * 16 > bn or bn * bk > 128 * 128 and warps == 2:
            continue
        c = dict(t, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps)
        if c not in found:
            found.append(c)
    # more loads in flight: K split 4 or 8 ways (1792-3584 programs at 16x14336x4096) and deeper pipelines
    for bn, bk, warps, split, stages in itertools.product((32, 64), (128, 256), (2, 4), (4, 8), (3, 5)):
        if warps * 16 > bn or bn * bk > 64 * 128 and warps == 2:
            continue
        c = dict(t, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps, num_stages=stages)
        if c not in found:
            found.append(c)
    # the decode-side variants (sm_90 PTX decodes; docs in _mx_decode_kernel): SPLIT_WORDS (1, 2, 4, 8 dots a
    # step, x split to match), QUAD_SIGNS (fp4: 4 codes signed a prmt + lop3), ALIGNED_K (16-byte word loads)
    variants = [dict(ALIGNED_K=True), dict(QUAD_SIGNS=True, ALIGNED_K=True),
                dict(SPLIT_WORDS=2, QUAD_SIGNS=True, ALIGNED_K=True), dict(SPLIT_WORDS=4, QUAD_SIGNS=True, ALIGNED_K=True),
                dict(SPLIT_WORDS=8, ALIGNED_K=True), dict(SPLIT_WORDS=4, QUAD_SIGNS=True), dict(SPLIT_WORDS=8)]
    tiles = [(32, 256, 2, 1, 3), (32, 256, 2, 1, 5), (32, 256, 2, 2, 3), (32, 128, 2, 1, 3), (64, 256, 4, 1, 3),
             (64, 128, 4, 1, 3), (64, 128, 4, 2, 3), (128, 128, 8, 1, 3)]
    for (bn, bk, warps, split, stages), v in itertools.product(tiles, variants):
        c = dict(t, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps, num_stages=stages, **v)
        if c not in found:
            found.append(c)
    # PAIR_STEPS (two K steps an iteration, both steps' scales loaded first) on the K-split tiles and the variants
    for (bn, bk, warps, split, stages), v in itertools.product(tiles[:3] + [(32, 256, 2, 4, 3), (64, 256, 4, 2, 3)],
                                                              [{}, *variants[1:5]]):
        c = dict(t, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps, num_stages=stages, PAIR_STEPS=True, **v)
        if c not in found:
            found.append(c)
    return found


def main():
    deadline = time.monotonic() + float(os.environ.get("COMPILE_BUDGET_S", "300"))
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(N, K, device="cuda", generator=g)
    bf16_w = w.to(torch.bfloat16)
    runs = {"torch.matmul bf16": lambda: x @ bf16_w.T}
    rows = {"torch.matmul bf16": dict(name="torch.matmul bf16")}
    import flyarray as fa
    fa.set_backend("gpu")
    runs["fa.matmul bf16 (user path)"] = lambda: torch.from_dlpack(fa.asarray(x) @ fa.asarray(bf16_w).T)
    rows["fa.matmul bf16 (user path)"] = dict(name="fa.matmul bf16")
    bf16_rows(x, bf16_w, x.float() @ bf16_w.float().T, runs, rows)
    for w_fmt in FORMATS:
        data, scales = mx.mx_quantize(w, w_fmt)
        s8 = mx.scales_as_uint8(scales).contiguous()
        ref = x.float() @ mx.mx_dequantize(data, scales, w_fmt).float().T
        nbytes = data.numel() * data.element_size() + scales.numel() + x.numel() * 2 + M * N * 2
        cfg = sm.pick_config(sm.CONFIGS, "sm_90")
        for i, c in enumerate(candidates(w_fmt)):
            if time.monotonic() > deadline:   # the table's configs come first; the sweep's tail may not fit
                print(f"DEADLINE: {w_fmt} configs from {i} on not compiled", flush=True)
                break
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            run = lambda c=c, out=out, data=data, s8=s8, w_fmt=w_fmt: sm._decode_candidate(  # noqa: E731
                x, data, s8, "bf16", w_fmt, out, cfg, c)
            key = f"{w_fmt} {i}"
            try:
                run()
                err = ((out.float() - ref).norm() / ref.norm()).item()
            except Exception as e:  # noqa: BLE001
                err = repr(e)[:160]
            rows[key] = dict(name=w_fmt, config=c, err=err, bytes=nbytes)
            if isinstance(err, float) and err < 1e-2:
                runs[key] = run
            else:
                print("REJECTED", json.dumps(rows[key]), flush=True)
    _save(rows)
    for _ in range(ROUNDS):
        for key, run in runs.items():
            ms = triton.testing.do_bench(run, warmup=5, rep=20, return_mode="median")
            rows[key]["ms"] = min(ms, rows[key].get("ms", float("inf")))
            if "bytes" in rows[key]:
                rows[key]["tbps"] = rows[key]["bytes"] / rows[key]["ms"] / 1e9
        _save(rows)   # after every round: a run cut short by its time limit keeps what it measured
    print(f"torch.matmul bf16 {M}x{N}x{K}: {rows['torch.matmul bf16']['ms'] * 1e3:.1f} us")
    print(f"fa.matmul bf16 (user path): {rows['fa.matmul bf16 (user path)']['ms'] * 1e3:.1f} us")
    for w_fmt in FORMATS + ("bf16 gemv_t",):
        best = sorted((r for r in rows.values() if r.get("name") == w_fmt and "ms" in r), key=lambda r: r["ms"])
        print(f"--- {w_fmt} ({len(best)} configs) best:", *(f"{r['ms'] * 1e3:.1f} us {r['config']}" for r in best[:8]),
              sep="\n  ")


def _save(rows):
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(list(rows.values()), f, indent=1)


if __name__ == "__main__":
    main()
