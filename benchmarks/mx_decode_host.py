"""Host cost of the weight-only MX decode as a loop sees it: scaled_matmul called back to back (one sync at the
end), and one call's host time with the GPU idle before it, beside bf16 torch.matmul. GPU only. Run it with
PYTHONPATH pointing at two trees to compare them (as gpu_run.sh's host_ab does for the seed block).

    PYTHONPATH=$PWD python benchmarks/mx_decode_host.py
"""
import statistics
import time

import torch
from host_seed_block import _host_us as host_us  # one call's host time, the GPU idle before it

from flyarray.kernels import mx, scaled_matmul as sm

SHAPES = [(16, 14336, 4096), (16, 4096, 14336)]


def back_to_back_us(fn, calls=300, repeats=5):
    per = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        w = torch.randn(n, k, device="cuda", generator=g)
        data, scales = mx.mx_quantize(w, "e2m1")
        bf16 = w.to(torch.bfloat16)
        ours = lambda: sm.scaled_matmul(x, data, None, scales)  # noqa: E731
        eager = lambda: x @ bf16.T  # noqa: E731
        ours(), eager()   # the first call times the candidates
        print(f"{m}x{n}x{k} MXFP4: back to back ours {back_to_back_us(ours):6.1f} us, bf16 matmul "
              f"{back_to_back_us(eager):6.1f} us; host of one call ours {host_us(ours):6.1f} us, bf16 "
              f"{host_us(eager):6.1f} us; choice {list(sm.tuning_choices().values())[-1]}", flush=True)


if __name__ == "__main__":
    main()
