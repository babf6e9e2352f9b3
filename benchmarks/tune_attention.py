"""Attention tile configs on the GPU: each candidate checked against the current config's result, then
timed (do_bench, median), beside torch SDPA. Not part of the suite; prints JSON lines.

    PYTHONPATH=$PWD python benchmarks/tune_attention.py [OUT.json]
"""
import json
import sys

import torch
import torch.nn.functional as F
import triton.testing

from flyarray.kernels import attention

FWD = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3), (64, 128, 4, 2),
       (128, 64, 4, 3), (64, 64, 4, 4)]
DKDV = [(32, 128, 8, 2), (32, 128, 8, 1), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 1), (32, 64, 4, 2),
        (64, 64, 4, 2), (64, 64, 8, 2), (32, 128, 4, 2), (16, 128, 8, 2), (64, 128, 4, 1), (16, 64, 4, 3)]
DQ = [(128, 64, 8, 2), (128, 64, 8, 1), (128, 64, 8, 3), (128, 32, 8, 2), (64, 64, 4, 2), (64, 128, 8, 2),
      (128, 128, 8, 2), (64, 64, 8, 2), (128, 64, 4, 2), (64, 32, 4, 3)]
SHAPES = [(2, 32, 2048, 128), (4, 32, 2048, 128)]  # the seed block's and the Llama block's attention


def cfg(t):
    return dict(BLOCK_M=t[0], BLOCK_N=t[1], num_warps=t[2], num_stages=t[3])


def bench(fn):
    fn()
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def main():
    table = attention._table(torch.device("cuda"))
    table["fwd_tma_enabled"] = False  # this script tunes the pointer-load kernel (tune_attention_fwd.py: the TMA one)
    table["bwd_gluon_head_dims"] = ()  # and the Triton dk/dv kernel (tune_attention_gluon.py: the Gluon one)
    default = {k: dict(table[k][128]) for k in ("fwd_causal", "bwd_dkdv", "bwd_dq")}
    rows = []
    for B, H, S, D in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        sdpa_f = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
        leaves = [t.detach().clone().requires_grad_() for t in (qt, kt, vt)]
        ref = F.scaled_dot_product_attention(*leaves, is_causal=True)
        sdpa_b = bench(lambda: torch.autograd.grad(ref, leaves, do.transpose(1, 2), retain_graph=True))
        print(json.dumps(dict(shape=[B, H, S, D], sdpa_fwd_ms=sdpa_f, sdpa_bwd_ms=sdpa_b)), flush=True)
        out0, lse0 = attention.attention_fwd(q, k, v, is_causal=True)
        grads0 = attention.attention_bwd(do, q, k, v, out0, lse0, is_causal=True)
        for kind, cands in (("fwd_causal", FWD), ("bwd_dkdv", DKDV), ("bwd_dq", DQ)):
            for c in cands:
                table[kind][128] = cfg(c)
                try:
                    if kind == "fwd_causal":
                        fn = lambda: attention.attention_fwd(q, k, v, is_causal=True)  # noqa: E731
                        got = [fn()[0]]
                        want = [out0]
                    else:
                        fn = lambda: attention.attention_bwd(do, q, k, v, out0, lse0, is_causal=True)  # noqa: E731
                        got, want = list(fn()), list(grads0)
                    err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(got, want))
                    ms = bench(fn) if err < 2e-2 else None
                except Exception as exc:  # noqa: BLE001 - out of shared memory and the like: skip it
                    err, ms = None, f"{type(exc).__name__}: {str(exc)[:80]}"
                table[kind][128] = dict(default[kind])
                row = dict(shape=[B, H, S, D], kind=kind, config=c, ms=ms, rel_err=err)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
