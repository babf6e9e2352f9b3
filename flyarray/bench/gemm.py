"""GEMM suite: dense bf16, decode, ragged (MoE) GEMM, fused epilogue, fp8 (PERF.md's rows).

Compute-bound cases set ``flops`` (TFLOP/s column); the decode case is memory
bound and sets ``bytes_moved`` (the weights dominate). Configs come from the
per-arch tables; run with FLYARRAY_AUTOTUNE=1 to time the candidate lists once
(the check call before timing pays for it) and keep the winners on disk.

``ours`` is the user path, every call (``fa.asarray`` in, ``torch.from_dlpack``
out) for the dense, decode (``x @ w.T`` of an nn.Linear weight), ragged and
fused-epilogue rows (``fa.silu(fa.matmul(x, w) + bias)``: the scheduler folds the
bias and activation into the GEMM). The fp8 row calls the kernel directly.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import flyarray as fa
from flyarray.bench.harness import Case
from flyarray.kernels.gemm import matmul


def _randn(shape, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def _half(device):
    """bf16 on a GPU; fp16 on the CPU (the interpreter has no bf16 arithmetic)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float16


def _tag(dtype):
    return str(dtype).split(".")[-1]


def dense_cases(device, small):
    dt = _half(device)
    shapes = [(64, 64, 64), (32, 96, 64)] if small else [(8192, 8192, 8192), (4096, 12288, 4096)]
    cases = []
    for i, (M, N, K) in enumerate(shapes):
        a, b = _randn((M, K), dt, device, 10 + i), _randn((K, N), dt, device, 20 + i)
        cases.append(Case(
            name=f"gemm {M}x{N}x{K} {_tag(dt)}",
            ours=lambda a=a, b=b: torch.from_dlpack(fa.matmul(fa.asarray(a), fa.asarray(b))),
            eager=lambda a=a, b=b: torch.matmul(a, b),
            flops=2 * M * N * K,
            goal=">= 1.0x torch",
        ))
    return cases


def decode_case(device, small):
    dt = _half(device)
    M, N, K = (16, 96, 64) if small else (16, 14336, 4096)
    x = _randn((M, K), dt, device, 30)
    w = _randn((N, K), dt, device, 31)  # an nn.Linear weight: the GEMM reads w.t() in place
    size = x.element_size()
    return Case(
        name=f"gemm decode {M}x{N}x{K} {_tag(dt)}",
        ours=lambda: torch.from_dlpack(fa.matmul(fa.asarray(x), fa.asarray(w).T)),
        eager=lambda: torch.matmul(x, w.t()),
        bytes_moved=(N * K + M * K + M * N) * size,
        flops=2 * M * N * K,
        goal=">= 3.9 TB/s",
    )


def random_group_sizes(total_rows: int, groups: int, seed: int) -> torch.Tensor:
    """Uneven (not uniform) sizes that add up to total_rows, some near zero."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(groups, generator=g) ** 2 + 0.05
    sizes = (weights / weights.sum() * total_rows).floor().long()
    sizes[torch.argmax(sizes)] += total_rows - int(sizes.sum())
    return sizes


def _grouped_mm_eager(lhs, rhs, sizes_host, offsets, device):
    """torch._grouped_mm (offsets: int32 cumulative ends) where it exists and accepts
    these operands (it may want a K-major rhs), else a loop over the groups."""
    if device.type == "cuda" and hasattr(torch, "_grouped_mm"):
        rhs_kmajor = rhs.transpose(-2, -1).contiguous().transpose(-2, -1)  # same values, other layout
        for b, label in ((rhs, "torch._grouped_mm"), (rhs_kmajor, "torch._grouped_mm (K-major rhs)")):
            try:
                torch._grouped_mm(lhs, b, offs=offsets)
                torch.cuda.synchronize()
                return (lambda b=b: torch._grouped_mm(lhs, b, offs=offsets)), label
            except Exception:
                continue
    bounds = [0] + torch.cumsum(sizes_host, 0).tolist()

    def loop():
        out = torch.zeros(lhs.shape[0], rhs.shape[-1], device=lhs.device, dtype=lhs.dtype)
        for gi in range(rhs.shape[0]):
            if bounds[gi + 1] > bounds[gi]:
                out[bounds[gi]:bounds[gi + 1]] = lhs[bounds[gi]:bounds[gi + 1]] @ rhs[gi]
        return out
    return loop, "per-group loop"


def ragged_case(device, small):
    dt = _half(device)
    G, M, K, N = (4, 50, 32, 48) if small else (64, 18382, 4096, 1536)
    sizes_host = random_group_sizes(M, G, seed=40)
    sizes = sizes_host.to(device=device, dtype=torch.int32)
    offsets = torch.cumsum(sizes, 0, dtype=torch.int32)
    lhs = _randn((M, K), dt, device, 41)
    rhs = _randn((G, K, N), dt, device, 42)
    eager, label = _grouped_mm_eager(lhs, rhs, sizes_host, offsets, device)
    return Case(
        name=f"ragged_dot {G}g {M}x{N}x{K} {_tag(dt)} vs {label}",
        ours=lambda: torch.from_dlpack(fa.ragged_dot(fa.asarray(lhs), fa.asarray(rhs), fa.asarray(sizes))),
        eager=eager,
        flops=2 * M * N * K,
        goal="<= 0.45 ms",
    )


def fused_epilogue_case(device, small):
    dt = _half(device)
    M, N, K = (48, 64, 32) if small else (4096, 14336, 4096)
    x, w = _randn((M, K), dt, device, 50), _randn((K, N), dt, device, 51)
    bias = _randn((N,), dt, device, 52)
    return Case(
        name=f"matmul+bias+silu {M}x{N}x{K} {_tag(dt)}",
        ours=lambda: torch.from_dlpack(fa.silu(fa.matmul(fa.asarray(x), fa.asarray(w)) + fa.asarray(bias))),
        eager=lambda: F.silu(torch.matmul(x, w) + bias),
        compilable=lambda: F.silu(torch.matmul(x, w) + bias),
        flops=2 * M * N * K,
        goal="> eager (one pass over the output)",
    )


def fp8_case(device, small):
    M = N = K = 64 if small else 8192
    fp8 = torch.float8_e4m3fn
    a = (_randn((M, K), torch.float32, device, 60)).to(fp8)
    w = (_randn((N, K), torch.float32, device, 61)).to(fp8)
    b = w.t()  # column-major, as torch._scaled_mm requires
    sa = torch.tensor(0.7, device=device)
    sb = torch.tensor(1.3, device=device)
    out_dt = torch.bfloat16 if device.type == "cuda" else torch.float32

    def dequantized():
        return ((a.float() @ b.float()) * (sa * sb)).to(out_dt)

    eager, label = dequantized, "dequantized"
    if device.type == "cuda" and hasattr(torch, "_scaled_mm"):
        eager, label = (lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dt)), "_scaled_mm"
    return Case(
        name=f"gemm fp8e4m3 {M}^3 vs {label}",
        ours=lambda: matmul(a, b, a_scale=sa, b_scale=sb, out_dtype=out_dt),
        eager=eager,
        flops=2 * M * N * K,
        goal=">= 1.0x torch._scaled_mm",
    )


def cases(device, small):
    device = torch.device(device)
    return [*dense_cases(device, small), decode_case(device, small), ragged_case(device, small),
            fused_epilogue_case(device, small), fp8_case(device, small)]
