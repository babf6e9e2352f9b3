"""The MLP's first GEMM (fp16 4096x4096 @ 4096x16384 + bias, exact GELU) on the warp-specialized kernel (GELU by
column halves: gemm_hopper._store_gelu_by_halves) beside the Triton GEMM's epilogue config and cuBLAS + torch's
GELU; then the whole MLP forward (Linear -> GELU -> Linear) under backend="flyarray" beside eager and Inductor.

    PYTHONPATH=$PWD python3 benchmarks/mlp_gelu_ws.py          (WS_GELU=0: the MLP rows without it)

CUDA-graph device time (20 calls, median of 5 rounds, alternating twice), each result checked against a float64
product first; the MLP by triton.testing.do_bench (host included).
"""
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import flyarray.interop.torch  # noqa: F401  (registers backend="flyarray" in a source checkout)
from flyarray.kernels import gemm
from gpu_timing import graph_us


ON_IN_MLP = os.environ.get("WS_GELU", "1") == "1"   # WS_GELU=0: the MLP rows with the Triton GEMM's gelu


def main():
    M, K, N = 4096, 4096, 16384
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
    w = (torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g) * 0.02)
    bias = torch.randn(N, device="cuda", dtype=torch.float16, generator=g) * 0.1
    gemm.WS_GELU_BY_HALVES = True   # (off by default: slower, twenty-ninth session)
    ws_cfg = gemm.default_config("sm_90", M, N, K, torch.float16)
    triton_cfg = {k: v for k, v in ws_cfg.items() if k != "WS"}
    assert ws_cfg.get("WS") is not None, "the default sm_90 config has no WS entry (FLYARRAY_GEMM_WS=0?)"
    runs = {"ws (gelu by halves)": lambda: gemm.matmul(x, w.t(), bias=bias, activation="gelu", config=ws_cfg),
            "triton epilogue": lambda: gemm.matmul(x, w.t(), bias=bias, activation="gelu", config=triton_cfg),
            "cublas + F.gelu": lambda: F.gelu(torch.addmm(bias, x, w.t()))}
    ref = F.gelu(torch.addmm(bias.double(), x.double(), w.t().double()))
    for name, fn in runs.items():
        out = fn()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        print(f"{name}: rel err {err:.2e}", flush=True)
        assert err < 2e-3, name
    for round_ in range(2):
        print("round", round_, {name: round(graph_us(fn), 1) for name, fn in runs.items()}, flush=True)
    gemm.WS_GELU_BY_HALVES = ON_IN_MLP
    mlp = torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU(), torch.nn.Linear(16384, 4096))
    mlp = mlp.to(device="cuda", dtype=torch.float16).eval()
    xin = torch.randn(2, 2048, 4096, device="cuda", dtype=torch.float16)
    ours, inductor = torch.compile(mlp, backend="flyarray"), torch.compile(mlp)
    with torch.no_grad():
        want = mlp(xin)
        for name, fn in (("flyarray", ours), ("inductor", inductor)):
            got = fn(xin)
            print(name, "rel err vs eager", ((got.float() - want.float()).norm() / want.float().norm()).item())
        for round_ in range(2):
            print("mlp round (do_bench us)", round_, {name: round(1000 * do_bench(lambda: fn(xin)), 1) for name, fn in
                                                       (("flyarray", ours), ("eager", mlp), ("inductor", inductor))},
                  flush=True)


if __name__ == "__main__":
    main()
