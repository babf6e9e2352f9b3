"""Cross-compile scaled_matmul's dot_scaled kernel for gfx950 (MI350) over candidate tiles; print
config -> VGPRs, LDS, spills and MFMA instructions (names, and how many the K loop issues per step).

Runs on any machine (Triton cross-compiles; no GPU). Used to pick CONFIGS["gfx950"] in
flyarray/kernels/scaled_matmul.py: the largest tile with 0 spills that still issues the native
scaled MFMA (v_mfma_scale_f32_*_f8f6f4) for MX x MX.

    python benchmarks/sweep_gfx950_mx.py                 # the candidate sweep (slow: ~20 s a compile)
    python benchmarks/sweep_gfx950_mx.py --current       # only the configs CONFIGS["gfx950"] uses now
    python benchmarks/sweep_gfx950_mx.py --only e4m3xe2m1
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import warnings

from flyarray.kernels import scaled_matmul as sm
from flyarray.targets import compile_for

VARIANTS = {  # spec name -> (lhs format, rhs format, CONFIGS["gfx950"] entry it uses)
    "e4m3xe4m3": ("e4m3", "e4m3", "dot_scaled"),
    "e2m1xe2m1": ("e2m1", "e2m1", "dot_scaled_fp4"),
    "e4m3xe2m1": ("e4m3", "e2m1", "dot_scaled_fp4"),
    "bf16xe2m1": ("bf16", "e2m1", "dot_scaled_wonly"),
    "bf16xe4m3": ("bf16", "e4m3", "dot_scaled_wonly"),
}


def tile(bm, bn, bk, warps, stages, group_m=8, **amd):
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, num_warps=warps, num_stages=stages, **amd)


# Largest first: the first 0-spill row of each variant is the pick.
CANDIDATES = [
    tile(128, 128, 128, 8, 2), tile(128, 128, 256, 8, 2),
    tile(128, 128, 128, 8, 1), tile(128, 128, 256, 8, 1),
    # 4 waves: one wave per SIMD, so each may use all 512 VGPRs (256 arch + 256 acc) instead of 256
    tile(128, 128, 128, 4, 2), tile(128, 128, 256, 4, 2),
    tile(128, 128, 128, 4, 1), tile(128, 128, 256, 4, 1),
    tile(128, 128, 128, 8, 2, matrix_instr_nonkdim=16), tile(128, 128, 128, 4, 2, matrix_instr_nonkdim=16),
    tile(128, 128, 64, 8, 2), tile(128, 128, 64, 4, 2),
    tile(128, 64, 128, 4, 2), tile(128, 64, 256, 4, 2), tile(128, 64, 256, 8, 2),
    tile(64, 128, 128, 4, 2), tile(64, 128, 256, 4, 2),
    tile(64, 64, 128, 4, 2), tile(64, 64, 256, 4, 2),
]


# The decode path's dot_scaled candidate (bf16 activations, M <= 64: BLOCK_M = next_pow2(M) in 16..64);
# BLOCK_M=64 is the register-heaviest case.
DECODE_CANDIDATES = [
    dict(kernel="dot_scaled", BLOCK_N=64, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=2),
    dict(kernel="dot_scaled", BLOCK_N=64, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=1),
    dict(kernel="dot_scaled", BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=2),
    dict(kernel="dot_scaled", BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=2),
]


def mfma_per_k_step(asm: str) -> int:
    """Matrix instructions inside the kernel's loops (label ... backward branch to it): one K step of
    the pipelined main loop; 0 when the asm has no loop."""
    lines = asm.splitlines()
    labels = {}
    best = 0
    for i, line in enumerate(lines):
        m = re.match(r"^(\.LBB\w+):", line)
        if m:
            labels[m.group(1)] = i
            continue
        b = re.search(r"\bs_cbranch_\w+\s+(\.LBB\w+)|\bs_branch\s+(\.LBB\w+)", line)
        if b:
            target = b.group(1) or b.group(2)
            if target in labels and labels[target] < i:
                body = lines[labels[target]:i]
                best = max(best, sum(1 for l in body if re.search(r"\bv_mfma", l)))
    return best


def report_row(name, t, rep):
    cfg = " ".join(f"{k}={v}" for k, v in t.items() if k not in ("GROUP_M", "kernel"))
    mfma = ",".join(i.replace("v_mfma_", "") for i in rep.matrix_instructions) or "-"
    return (f"{name:<11} {cfg:<78} {rep.registers:>5} {rep.shared_bytes // 1024:>5} KiB {rep.spills:>6} "
            f"{mfma_per_k_step(rep.asm):>5}  {mfma}")


def current_configs():
    cfg = sm.CONFIGS["gfx950"]
    rows = [(name, fa, fb, dict(cfg[key])) for name, (fa, fb, key) in VARIANTS.items()]
    for c in cfg["decode_candidates"]:
        if c.get("kernel") == "dot_scaled":
            for m in (16, 64):  # the decode path uses BLOCK_M = next_pow2(M) in 16..64
                for fb in ("e2m1", "e4m3"):
                    rows.append((f"bf16x{fb}/m{m}", "bf16", fb, dict(c, BLOCK_M=m)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--current", action="store_true", help="only the configs in CONFIGS['gfx950']")
    ap.add_argument("--only", help="one variant, e.g. e4m3xe2m1")
    args = ap.parse_args()
    if args.current:
        rows = current_configs()
    else:
        rows = [(name, fa, fb, t) for name, (fa, fb, _) in VARIANTS.items() for t in CANDIDATES]
        rows += [(f"bf16x{fb}/m{m}", "bf16", fb, dict(c, BLOCK_M=m))
                 for c in DECODE_CANDIDATES for fb in ("e2m1", "e4m3") for m in (16, 64)]
    if args.only:
        rows = [r for r in rows if r[0].startswith(args.only)]
    print(f"{'variant':<11} {'config':<78} {'VGPRs':>5} {'LDS':>9} {'spills':>6} {'MFMA/K':>5}  matrix instructions")
    for name, fa, fb, t in rows:
        start = time.time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                rep = compile_for(sm._dot_scaled_spec("gfx950", fa, fb, t), "gfx950")
            except Exception as e:  # a tile the compiler rejects is a row too
                print(f"{name:<11} {t}  FAILED: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
                continue
        print(report_row(name, t, rep), f"({time.time() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
