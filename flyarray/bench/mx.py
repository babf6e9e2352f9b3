"""MX benchmark cases: weight-only decode and MXFP8/MXFP4 GEMMs against bf16 (and fp8) torch.

Every case checks flyarray's result against dequantize-then-matmul (the MX
operands decoded to float, multiplied in float32), not against the eager
column, whose quantization may differ (per-tensor fp8).
"""
from __future__ import annotations

import sys

import torch

from flyarray.bench.harness import Case, rel_error
from flyarray.kernels.mx import mx_dequantize, mx_quantize
from flyarray.kernels.scaled_matmul import scaled_matmul, tuning_choices


def _activation_dtype(device: torch.device) -> torch.dtype:
    # the CPU interpreter has no bf16 arithmetic
    return torch.bfloat16 if device.type == "cuda" else torch.float16


def _dequantized(data, scales, fmt, dtype):
    return mx_dequantize(data, scales, fmt, dtype=dtype)


def _against(reference: torch.Tensor):
    """Check against dequantize-then-matmul; also log the configs on-device timing picked."""
    def check(out, _eager):
        for key, choice in tuning_choices().items():
            if key not in _LOGGED:
                _LOGGED.add(key)
                print(f"[mx bench] tuned {key}: {choice}", file=sys.stderr, flush=True)
        return rel_error(out, reference)
    return check


_LOGGED: set = set()


def _decode_case(device, small, weight_fmt: str, shape=(16, 14336, 4096)) -> Case:
    """Weight-only decode: ``shape`` (M, N, K) is 16x14336x4096 (a Llama-8B MLP's up projection) or
    16x4096x14336 (its down projection: few weight rows, long K)."""
    m, n, k = (16, 64, 256) if small else shape
    act = _activation_dtype(device)
    x = torch.randn(m, k, device=device).to(act)
    w_data, w_scales = mx_quantize(torch.randn(n, k, device=device), weight_fmt)
    w = _dequantized(w_data, w_scales, weight_fmt, act)        # exact: MX values fit bf16/fp16
    reference = x.float() @ _dequantized(w_data, w_scales, weight_fmt, torch.float32).t()
    weight_bytes = w_data.numel() * w_data.element_size() + w_scales.numel()
    return Case(
        name=f"{'mxfp4' if weight_fmt == 'e2m1' else 'mxfp8'} weight-only decode {m}x{n}x{k}",
        ours=lambda: scaled_matmul(x, w_data, None, w_scales, preferred_element_type=act),
        eager=lambda: x @ w.t(),
        bytes_moved=x.numel() * x.element_size() + weight_bytes + m * n * x.element_size(),
        flops=2 * m * n * k, tol=1e-2, check=_against(reference),
        goal=">= 2.5x faster than bf16 torch.matmul" if weight_fmt == "e2m1" else ">= 1.6x bf16 matmul",
    )


def _gemm_inputs(device, small, a_fmt, b_fmt):
    m = n = k = 64 if small else 8192
    a, sa = mx_quantize(torch.randn(m, k, device=device), a_fmt)
    b, sb = mx_quantize(torch.randn(n, k, device=device), b_fmt)
    return (m, n, k), a, sa, b, sb


def _gemm_cases(device, small) -> list:
    act = _activation_dtype(device)
    (m, n, k), a, sa, b, sb = _gemm_inputs(device, small, "e4m3", "e4m3")
    a_f32, b_f32 = _dequantized(a, sa, "e4m3", torch.float32), _dequantized(b, sb, "e4m3", torch.float32)
    reference = a_f32 @ b_f32.t()
    a_bf16, b_bf16 = a_f32.to(act), b_f32.to(act)      # exact: e4m3 values times powers of two
    shape = f"{m}x{n}x{k}"
    flops = 2 * m * n * k
    # (label, method, goal): the automatic choice, then each way scaled_matmul has, named
    variants = [("vs bf16 matmul", None, ">= 1.0x bf16 torch.matmul"),
                ("tl.dot_scaled", "dot_scaled", "reference point: Triton's upcasting path on Hopper"),
                ("fp8_blocks", "fp8_blocks", "reference point: fp8 tensor cores, per-block fp32 rescale"),
                ("upcast", "upcast", "reference point: decode to bf16, then the bf16 GEMM")]
    cases = [
        Case(name=f"mxfp8 x mxfp8 {shape} {label}",
             ours=lambda method=method: scaled_matmul(a, b, sa, sb, preferred_element_type=act, method=method),
             eager=lambda: a_bf16 @ b_bf16.t(), flops=flops, tol=1e-2, check=_against(reference), goal=goal)
        for label, method, goal in variants]
    if device.type == "cuda":
        cases.append(_scaled_mm_case(a, b, sa, sb, a_f32, b_f32, reference, shape, flops))
    (m4, n4, k4), a4, sa4, b4, sb4 = _gemm_inputs(device, small, "e2m1", "e2m1")
    a4_f32, b4_f32 = _dequantized(a4, sa4, "e2m1", torch.float32), _dequantized(b4, sb4, "e2m1", torch.float32)
    a4_bf16, b4_bf16 = a4_f32.to(act), b4_f32.to(act)
    cases.append(Case(
        name=f"mxfp4 x mxfp4 {shape} vs bf16 matmul",
        ours=lambda: scaled_matmul(a4, b4, sa4, sb4, preferred_element_type=act),
        eager=lambda: a4_bf16 @ b4_bf16.t(), flops=flops, tol=1e-2, check=_against(a4_f32 @ b4_f32.t()),
        goal="native on gfx950; emulated (bf16 upcast) on Hopper"))
    return cases


def _scaled_mm_case(a, b, sa, sb, a_f32, b_f32, reference, shape, flops) -> Case:
    """torch._scaled_mm on the same values, fp8 e4m3 with one scale per tensor."""
    def per_tensor(t):
        scale = t.abs().max().clamp_min(1e-12) / 448.0
        return (t / scale).to(torch.float8_e4m3fn), scale.float()
    a8, a_scale = per_tensor(a_f32)
    b8, b_scale = per_tensor(b_f32)
    return Case(
        name=f"mxfp8 x mxfp8 {shape} vs torch._scaled_mm fp8",
        ours=lambda: scaled_matmul(a, b, sa, sb, preferred_element_type=torch.bfloat16),
        eager=lambda: torch._scaled_mm(a8, b8.t(), scale_a=a_scale, scale_b=b_scale, out_dtype=torch.bfloat16),
        flops=flops, tol=1e-2, check=_against(reference),
        goal="per-tensor fp8 is the speed ceiling (no block scales)")


def cases(device, small) -> list:
    device = torch.device(device)
    return [_decode_case(device, small, "e2m1"), _decode_case(device, small, "e4m3"),
            *([] if small else [_decode_case(device, small, "e2m1", (16, 4096, 14336))])] + _gemm_cases(device, small)
