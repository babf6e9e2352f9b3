"""Where the host time of a tiny evaluation goes, on whatever device this machine has (cProfile).

    PYTHONPATH=$PWD python benchmarks/profile_host.py [OUT_FILE]
"""
import cProfile
import io
import pstats
import sys
import time

import torch

import flyarray as fa

device = "cuda" if torch.cuda.is_available() else "cpu"
t = torch.randn(2048, device=device)
w = torch.randn(64, device=device)
x2 = torch.randn(8, 64, device=device)
xb = torch.randn(64, 64, device=device, dtype=torch.bfloat16)
xd = torch.randn(16, 4096, device=device, dtype=torch.bfloat16)
wd = torch.randn(4096, 14336, device=device, dtype=torch.bfloat16) if device == "cuda" else torch.randn(64, 32)
xd = xd if device == "cuda" else torch.randn(16, 64)
xk = torch.randn(64, 131072, device=device) if device == "cuda" else torch.randn(4, 4096)
chain = fa.jit(lambda a: fa.sin(a) * 2.0 + 1.0)
if device == "cuda":  # MXFP4 weight-only decode, called at the kernel level as the mx suite does
    from flyarray.kernels.mx import mx_quantize
    from flyarray.kernels.scaled_matmul import scaled_matmul
    wq, ws = mx_quantize(torch.randn(14336, 4096, device=device), "e2m1")
    mx_decode = lambda: scaled_matmul(xd, wq, None, ws, preferred_element_type=torch.bfloat16)  # noqa: E731
else:
    mx_decode = lambda: None  # noqa: E731 - the interpreter's time says nothing of the host path
cases = {
    "user exp+1": lambda: torch.from_dlpack(fa.exp(fa.asarray(t)) + 1),
    "user exp+1 .torch()": lambda: (fa.exp(fa.asarray(t)) + 1).torch(),
    "user rms_norm": lambda: torch.from_dlpack(fa.nn.rms_norm(fa.asarray(x2), fa.asarray(w), 1e-6)),
    "user row sum f32 acc": lambda: torch.from_dlpack(fa.sum(fa.asarray(xb), axis=-1, dtype=fa.float32)),
    "user top_k k=50": lambda: [torch.from_dlpack(a) for a in fa.top_k(fa.asarray(xk), 50)],
    "user matmul decode": lambda: torch.from_dlpack(fa.matmul(fa.asarray(xd), fa.asarray(wd))),
    "torch matmul decode": lambda: torch.matmul(xd, wd),
    "kernel mx decode fp4": mx_decode,
    "jit replay .torch()": lambda: chain(t).torch(),
    "torch exp+1": lambda: torch.exp(t) + 1,
    "torch.from_dlpack(tensor)": lambda: torch.from_dlpack(t),
}
out = io.StringIO()
for name, fn in cases.items():
    for _ in range(300):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    n = 3000
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"{name:28} {(time.perf_counter() - t0) / n * 1e6:8.1f} us/call", file=out)
for name in ("user exp+1 .torch()", "user row sum f32 acc", "user rms_norm", "user top_k k=50", "user matmul decode", "kernel mx decode fp4",
             "jit replay .torch()"):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        cases[name]()
    pr.disable()
    print(f"\n---- {name}", file=out)
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(25)
text = out.getvalue()
print(text)
if len(sys.argv) > 1:
    open(sys.argv[1], "w").write(text)
