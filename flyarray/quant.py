"""Quantize a torch model's nn.Linear weights to OCP MX formats.

``quantize_linear_weights(model, sample_input)`` swaps every eligible
``nn.Linear`` (in place, like torch.ao's module swaps) for an ``MXLinear``
holding MX-quantized weights, and reports how much the model's output moved.
The forward runs ``scaled_matmul``: weight-only (bf16/fp16 activations times
MX weights; the small-M decode kernel on Hopper), or with ``activation_format``
the activations are MX-quantized on the fly too (MXFP8 x MXFP{8,4}; the native
scaled MFMA on MI350).
"""
from __future__ import annotations

import torch
from torch import nn

from flyarray.kernels.mx import BLOCK_SIZE, mx_format, mx_quantize
from flyarray.kernels.scaled_matmul import scaled_matmul


class MXLinear(nn.Module):
    """y = x @ dequant(W)^T + b, with W stored as MX data [out, in(/2)] and E8M0 scales [out, in/32]."""

    def __init__(self, linear: nn.Linear, weight_format: str = "e2m1", activation_format=None):
        super().__init__()
        if linear.in_features % BLOCK_SIZE:
            raise ValueError(f"linear: in_features={linear.in_features} is not a multiple of {BLOCK_SIZE}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_format = mx_format(weight_format).name
        self.activation_format = None if activation_format is None else mx_format(activation_format).name
        data, scales = mx_quantize(linear.weight.detach().float(), self.weight_format)
        self.register_buffer("weight_data", data)
        self.register_buffer("weight_scales", scales)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(),
                                                                   requires_grad=False)

    def _compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        if x.dtype in (torch.bfloat16, torch.float16):
            return x.dtype
        # the CPU runs kernels through Triton's interpreter, which has no bf16 arithmetic
        return torch.bfloat16 if x.is_cuda else torch.float16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32
        if self.activation_format is None:
            lhs, lhs_scales = rows.to(self._compute_dtype(x)), None
        else:
            lhs, lhs_scales = mx_quantize(rows.contiguous(), self.activation_format)
        y = scaled_matmul(lhs, self.weight_data, lhs_scales, self.weight_scales,
                          preferred_element_type=out_dtype, rhs_format=self.weight_format)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"weight_format={self.weight_format}, activation_format={self.activation_format}")


def _relative_error(after, before) -> float:
    before64, after64 = before.detach().double(), after.detach().double()
    return ((after64 - before64).norm() / before64.norm().clamp_min(1e-300)).item()


def quantize_linear_weights(model: nn.Module, sample_input=None, weight_format: str = "mxfp4",
                            activation_format=None) -> dict:
    """Replace each nn.Linear in ``model`` (in place) by an MXLinear; return a report.

    Layers whose in_features is not a multiple of 32 are left alone and listed
    under 'skipped'. With ``sample_input`` (a tensor, or a tuple of positional
    arguments), the model runs before and after, and 'rel_error' is
    ||after - before|| / ||before|| of its output (first output if a tuple).
    """
    mx_format(weight_format)  # fail early on a bad name
    before = _run(model, sample_input) if sample_input is not None else None
    replaced, skipped, bytes_before, bytes_after = [], [], 0, 0
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if child.in_features % BLOCK_SIZE:
                skipped.append(full)
                continue
            new = MXLinear(child, weight_format, activation_format)
            setattr(parent, child_name, new)
            replaced.append(full)
            bytes_before += child.weight.numel() * child.weight.element_size()
            bytes_after += new.weight_data.numel() * new.weight_data.element_size() + new.weight_scales.numel()
    report = {"replaced": replaced, "skipped": skipped, "weight_format": mx_format(weight_format).name,
              "activation_format": activation_format, "weight_bytes_before": bytes_before,
              "weight_bytes_after": bytes_after, "rel_error": None}
    if sample_input is not None:
        report["rel_error"] = _relative_error(_run(model, sample_input), before)
    return report


@torch.no_grad()
def _run(model: nn.Module, sample_input):
    args = sample_input if isinstance(sample_input, tuple) else (sample_input,)
    out = model(*args)
    return out[0] if isinstance(out, (tuple, list)) else out
