"""PyTorch models through ``torch.compile(model, backend="flyarray")`` (suite ``torch``).

The user path is one line: ``fat.accelerate(model)`` (the flyarray backend), then calling the module
on torch tensors. Beside it, the same module in torch eager and under torch.compile (Inductor).

- the transformer layer: RMSNorm -> QKV Linear -> causal SDPA -> out Linear + residual, forward
  (no grad) and forward + backward (``torch.autograd.grad`` of the output w.r.t. the input and
  the parameters);
- an MLP: Linear -> GELU -> Linear.

GPU: fp16, batch 2, sequence 2048, hidden 4096 (32 heads of 128). CPU: fp32 and tiny sizes (the
reference backend), so the rows run end to end anywhere.
"""
from __future__ import annotations

import torch

import flyarray.interop.torch as fat
from flyarray.bench.harness import Case


class Block(torch.nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.norm = heads, torch.nn.RMSNorm(hidden, eps=1e-6)
        self.qkv, self.out = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(a.transpose(1, 2).reshape(b, s, d))


def _no_grad(fn):
    def run():
        with torch.no_grad():
            return fn()
    return run


def _grads(module, x, go):
    leaves = [x] + list(module.parameters())

    def run():
        return torch.autograd.grad(module(x), leaves, go)
    return run


def _sizes(device, small):
    if device.type != "cuda":  # the reference backend: fp32, tiny
        return {"B": 1, "S": 16, "H": 64, "heads": 2, "dtype": torch.float32}
    if small:
        return {"B": 1, "S": 64, "H": 256, "heads": 2, "dtype": torch.float16}
    return {"B": 2, "S": 2048, "H": 4096, "heads": 32, "dtype": torch.float16}


def cases(device, small):
    device = torch.device(device)
    z = _sizes(device, small)
    B, S, H, heads, dt = z["B"], z["S"], z["H"], z["heads"], z["dtype"]
    tag = f"{str(dt).split('.')[-1]} B{B} S{S} H{H}"
    torch.manual_seed(0)
    block = Block(H, heads).to(device=device, dtype=dt)
    ours_block = fat.accelerate(block)
    x = torch.randn(B, S, H, device=device, dtype=dt)
    xg = x.clone().requires_grad_()
    go = torch.randn_like(x)
    gemm_flops = 2 * B * S * H * 4 * H  # qkv (3H) and out (H)
    attn_flops = 2 * B * S * S * H  # causal: half of 4 B S^2 H
    mlp = torch.nn.Sequential(torch.nn.Linear(H, 4 * H), torch.nn.GELU(), torch.nn.Linear(4 * H, H))
    mlp = mlp.to(device=device, dtype=dt)
    ours_mlp = fat.accelerate(mlp)
    tol = 2e-2 if dt == torch.float16 else 1e-4
    return [
        Case(name=f"block fwd {tag} [backend=flyarray]", ours=_no_grad(lambda: ours_block(x)),
             eager=_no_grad(lambda: block(x)), compilable=_no_grad(lambda: block(x)),
             flops=gemm_flops + attn_flops, tol=tol, device_column=False),
        Case(name=f"block fwd+bwd {tag} [backend=flyarray]", ours=_grads(ours_block, xg, go),
             eager=_grads(block, xg, go), compilable=_grads(block, xg, go),
             flops=3 * (gemm_flops + attn_flops), tol=tol, device_column=False),
        Case(name=f"mlp fwd {tag} [backend=flyarray]", ours=_no_grad(lambda: ours_mlp(x)),
             eager=_no_grad(lambda: mlp(x)), compilable=_no_grad(lambda: mlp(x)),
             flops=2 * B * S * H * 8 * H, tol=tol, device_column=False),
    ]
