"""How many values of a Linear-like pattern differ between eager torch and torch.compile(backend="flyarray")
(whose regions round as eager does), per pattern and dtype, on this machine's device. The thirty-third session
measured the CPU (gelu/residual/silu after a biased Linear: 95/57/44 of 512 differ); the GPU's addmm (cuBLASLt's
bias epilogue: one rounding) may want another rule (docs/benchmarks.md, thirty-fourth session).

    PYTHONPATH=$PWD python3 benchmarks/probe_eager_rounding.py
"""
import torch
import torch.nn.functional as F

import flyarray.interop.torch  # noqa: F401 - registers backend="flyarray"

device = "cuda" if torch.cuda.is_available() else "cpu"
PATTERNS = {
    "relu(linear)": lambda x, w, b, r: torch.relu(F.linear(x, w, b)),
    "gelu(linear)": lambda x, w, b, r: F.gelu(F.linear(x, w, b)),
    "linear + r": lambda x, w, b, r: F.linear(x, w, b) + r,
    "silu(linear) + r": lambda x, w, b, r: F.silu(F.linear(x, w, b)) + r,
    "relu(linear) + r": lambda x, w, b, r: torch.relu(F.linear(x, w, b)) + r,
    "x @ w.T + b": lambda x, w, b, r: x @ w.T + b,
    "relu(x @ w.T + b) + r": lambda x, w, b, r: torch.relu(x @ w.T + b) + r,
    "linear (no act)": lambda x, w, b, r: F.linear(x, w, b),
    "x @ w.T": lambda x, w, b, r: x @ w.T,
}


def main():
    print("device", device, torch.cuda.get_device_name() if device == "cuda" else "")
    for dtype in (torch.float16, torch.bfloat16):
        for rows, features in ((8, 64), (256, 512)):
            torch.manual_seed(0)
            x = torch.randn(rows, features, device=device, dtype=dtype)
            w = torch.randn(features, features, device=device, dtype=dtype) / features ** 0.5
            b = torch.randn(features, device=device, dtype=dtype)
            r = torch.randn(rows, features, device=device, dtype=dtype)
            for name, fn in PATTERNS.items():
                torch._dynamo.reset()
                compiled = torch.compile(fn, backend="flyarray")
                want, got = fn(x, w, b, r), compiled(x, w, b, r)
                differ = int((want != got).sum())
                print(f"{str(dtype)[6:]:9} {rows}x{features}  {name:24} differ {differ:6} of {want.numel()}",
                      flush=True)


def gelu_accuracy():
    """gelu alone: ours and torch's against float64's gelu rounded to the dtype (where compile and eager differ
    after an otherwise exact Linear, which of the two is right)."""
    import flyarray as fa
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(256, 512, device=device, dtype=dtype) * 3
        exact = F.gelu(x.double()).to(dtype)
        ours, theirs = fa.nn.gelu(fa.asarray(x)).torch(), F.gelu(x)
        print(f"gelu {str(dtype)[6:]:9} not correctly rounded: ours {int((ours != exact).sum())}, torch "
              f"{int((theirs != exact).sum())} of {x.numel()}", flush=True)


if __name__ == "__main__":
    main()
    gelu_accuracy()
