"""The warp-specialized Gluon GEMM (flyarray/kernels/gemm_hopper.py) beside cuBLAS and the Triton GEMM's
default, on the GEMMs of a Llama block (benchmarks/tune_gemm_llama.py's 15 problems), after a check of
every layout and epilogue on ragged shapes. GPU (sm_90) only; CUDA-graph device time, interleaved rounds.

    PYTHONPATH=$PWD [CHECKS=0] python benchmarks/tune_gemm_ws.py [out.json]
"""
import json
import os
import sys

import torch
from tune_gemm_llama import graph_of, interleaved_ms, problems, rel_err  # benchmarks/

from flyarray.kernels import gemm

VARIANTS = {  # gemm_hopper's tile settings over its DEFAULT
    "ws": {},
    "ws_group16": dict(GROUP_M=16),
}  # (128x128 tiles with 4 stages lost on all 13 problems timed on the H100, 2026-12-06: 0.86-0.98x cuBLAS)
SQUARE = gemm.CONFIGS["sm_90"]["square"]["16"]


def ws(a, b, bias, act, res, variant):
    """gemm.matmul forced onto the warp-specialized kernel (a config with its ``WS`` entry); refuses a
    problem that would fall back to the Triton kernel, so that no row times the wrong kernel."""
    step = gemm._plan_views(a, b, torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device), bias, res, 0)
    if len(step) != 1 or not gemm._ws_fits(step[0], "sm_90", 0, 0):
        raise ValueError("not a warp-specialized problem")
    return gemm.matmul(a, b, bias=bias, activation=act, residual=res, config=dict(SQUARE, WS=variant))


def check_layouts() -> list:
    """Every (a, b) orientation, epilogue and tile variant on sizes off the tiles, against float64."""
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for M, N, K in ((1000, 1000, 1000), (200, 136, 72), (4096, 520, 264), (64, 8, 16)):
        for dtype in (torch.bfloat16, torch.float16):
            def rand(*shape):
                return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)
            for a_kmajor in (True, False):
                for b_kmajor in (True, False):
                    a = rand(M, K) if a_kmajor else rand(K, M).t()
                    b = rand(N, K).t() if b_kmajor else rand(K, N)
                    epilogues = [(None, None, None)]
                    if dtype == torch.bfloat16 and a_kmajor == b_kmajor:  # fewer compiles: 2 layouts, 1 dtype
                        epilogues += [(rand(N), "gelu", None), (None, None, rand(M, N)), (rand(N), "silu", rand(M, N)),
                                      (rand(N), "gelu_tanh", None)]
                    for bias, act, res in epilogues:
                        ref = gemm.reference_matmul(a.double(), b.double(), bias=None if bias is None else bias.double(),
                                                    activation=act, residual=None if res is None else res.double())
                        for vname, cfg in VARIANTS.items():
                            if (bias is not None or res is not None or act is not None) and vname != "ws":
                                continue
                            try:
                                err = rel_err(ws(a, b, bias, act, res, cfg), ref)
                            except Exception as exc:
                                err = f"{type(exc).__name__}: {str(exc)[:200]}"
                            ok = isinstance(err, float) and err < 1e-2
                            rows.append(dict(M=M, N=N, K=K, dtype=str(dtype), a_kmajor=a_kmajor, b_kmajor=b_kmajor,
                                             bias=bias is not None, act=act, res=res is not None, variant=vname,
                                             err=err, ok=ok))
                            if not ok:
                                print("CHECK FAILED", rows[-1], flush=True)
    print(f"checks: {sum(r['ok'] for r in rows)} of {len(rows)} passed", flush=True)
    return rows


def time_problem(name, a, b, bias, act, res) -> dict:
    M, K, N = a.shape[0], a.shape[1], b.shape[1]
    flops = 2 * M * N * K
    ref = gemm.reference_matmul(a, b, bias=bias, activation=act, residual=res)

    def cublas():
        if res is not None and bias is None and act is None:
            return torch.addmm(res, a, b)
        y = a @ b if bias is None else torch.addmm(bias, a, b)
        y = y if act is None else torch.nn.functional.gelu(y)
        return y if res is None else y + res
    calls = {"cublas": cublas, "triton": lambda: gemm.matmul(a, b, bias=bias, activation=act, residual=res)}
    for vname, cfg in VARIANTS.items():
        calls[vname] = lambda cfg=cfg: ws(a, b, bias, act, res, cfg)
    errors, graphs = {}, {}
    for cname, fn in calls.items():
        try:
            errors[cname] = rel_err(fn(), ref)
            graphs[cname] = graph_of(fn)
        except Exception as exc:
            print(f"    {cname:14s} FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    ms = interleaved_ms(graphs)
    t_ref = ms["cublas"]
    print(f"{name:22s} M{M} N{N} K{K}", flush=True)
    row = {"problem": name, "M": M, "N": N, "K": K, "us": {}}
    for cname, t in ms.items():
        print(f"    {cname:14s} {t * 1e3:8.1f} us {flops / t / 1e9:6.1f} TF/s  {t_ref / t:5.3f}x cuBLAS  "
              f"err {errors[cname]:.1e}{'' if errors[cname] < 2e-2 else '  WRONG'}", flush=True)
        row["us"][cname] = t * 1e3
        row.setdefault("err", {})[cname] = errors[cname]
    return row


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else None
    checks = check_layouts() if os.environ.get("CHECKS", "1") != "0" else []  # CHECKS=0: pytest did them
    rows = [time_problem(*p) for p in problems(8192, 4096, 11008)]
    totals = {c: round(sum(r["us"].get(c, float("nan")) for r in rows), 1) for c in rows[0]["us"]}
    print("totals (us):", json.dumps(totals), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"checks": checks, "rows": rows, "totals": totals}, f, indent=1)


if __name__ == "__main__":
    main()
