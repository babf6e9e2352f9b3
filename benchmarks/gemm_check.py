import torch
import triton.testing
from flyarray.kernels import gemm, tuning
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
def t(f): return triton.testing.do_bench(f, return_mode="median")
print("torch", t(lambda: a @ b))
print("default", t(lambda: gemm.matmul(a, b)))
for k, (shape, p) in list(gemm._plans.items())[:1]:
    print("plan", p.grid, {kk: vv for kk, vv in p.kwargs.items()})
print("tuned", t(lambda: gemm.matmul(a, b, tune=True)))
print("tuning file", tuning.load("gemm"))
for k, (shape, p) in list(gemm._plans.items()):
    print("plan", p.grid, p.kwargs)
