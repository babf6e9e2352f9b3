"""fa.lax loops on the user path beside torch eager and torch.compile: what recording a loop and fusing across
its iterations buys (or costs). Each case is checked against torch in float64 first, then timed per call
(triton.testing.do_bench median, host cost included: fa.asarray on the torch inputs, the loop, torch.from_dlpack).

  fori   : 64 steps of v = v * 0.99 + sin(v) * 0.01 over 4M fp32 (flyarray: one fused kernel; eager: 4 kernels a step)
  ema    : a scan keeping every step's EMA of 64 rows of 65536 fp32 (ys stacked: a kernel a step)
  window : fori_loop summing 32 dynamic_slice windows of a 4M vector

    PYTHONPATH=$PWD python3 benchmarks/control_flow.py [OUT.json]      (a CUDA GPU; CPU: small sizes, no timing)
"""
import json
import sys

import torch

import flyarray as fa

GPU = torch.cuda.is_available()
dev = torch.device("cuda" if GPU else "cpu")
N, STEPS, ROWS, COLS = (1 << 22, 64, 64, 65536) if GPU else (1 << 10, 8, 8, 64)


def fori_fa(v):
    return fa.lax.fori_loop(0, STEPS, lambda i, a: a * 0.99 + fa.sin(a) * 0.01, v)


def fori_torch(v):
    for _ in range(STEPS):
        v = v * 0.99 + torch.sin(v) * 0.01
    return v


def ema_fa(xs):
    return fa.lax.scan(lambda c, x: (c * 0.9 + x * 0.1, c), fa.zeros(xs.shape[1:], device=xs.device), xs)[1]


def ema_torch(xs):
    c, ys = torch.zeros_like(xs[0]), []
    for x in xs:
        ys.append(c)
        c = c * 0.9 + x * 0.1
    return torch.stack(ys)


def window_fa(v):
    return fa.lax.fori_loop(0, 32, lambda i, c: c + fa.lax.dynamic_slice_in_dim(v, i * (N // 64), N // 2).sum(),
                            fa.zeros((), device=v.device))


def window_torch(v):
    total = torch.zeros((), device=v.device)
    for i in range(32):
        total = total + v[i * (N // 64): i * (N // 64) + N // 2].sum()
    return total


def main(path=None):
    torch.manual_seed(0)
    v = torch.randn(N, device=dev)
    xs = torch.randn(ROWS, COLS, device=dev)
    cases = {"fori": (fori_fa, fori_torch, v), "ema": (ema_fa, ema_torch, xs), "window": (window_fa, window_torch, v)}
    rows = {}
    for name, (ours, eager, arg) in cases.items():
        jitted = fa.jit(ours)
        user = lambda t: torch.from_dlpack(ours(fa.asarray(t)))           # noqa: E731  (the headline path)
        user_jit = lambda t: torch.from_dlpack(jitted(fa.asarray(t)))     # noqa: E731
        want = eager(arg.double())
        got = user(arg)
        err = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
        assert err < 1e-5, (name, err)
        row = {"rel_err": err}
        if GPU:
            import triton
            compiled = torch.compile(eager)
            compiled(arg)
            for label, fn in (("flyarray", user), ("flyarray jit", user_jit), ("torch eager", eager),
                              ("torch.compile", compiled)):
                fn(arg)
                row[label + " us"] = triton.testing.do_bench(lambda: fn(arg), warmup=10, rep=100,
                                                             return_mode="median") * 1e3
        rows[name] = row
        print(name, " ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    if path:
        with open(path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name() if GPU else None, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
