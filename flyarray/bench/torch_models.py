"""PyTorch models through ``torch.compile(model, backend="flyarray")`` (suite ``torch``).

The user path is one line: ``fat.accelerate(model)`` (the flyarray backend), then calling the module
on torch tensors. Beside it, the same module in torch eager and under torch.compile (Inductor).

- the transformer layer: RMSNorm -> QKV Linear -> causal SDPA -> out Linear + residual, forward
  (no grad) and forward + backward (``torch.autograd.grad`` of the output w.r.t. the input and
  the parameters);
- an MLP: Linear -> GELU -> Linear;
- a Llama-style block (the layer above, then RMSNorm -> SwiGLU MLP + residual), forward + backward,
  bf16 B4 S2048 H4096 on a GPU, with the seconds of the first call (ours and Inductor's).

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


class LlamaBlock(torch.nn.Module):
    """A Llama-style decoder block: the attention block above, then RMSNorm -> SwiGLU MLP
    (down(silu(gate(x)) * up(x))) with its residual; no biases, as Llama."""

    def __init__(self, hidden, heads, intermediate):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = torch.nn.RMSNorm(hidden, eps=1e-6), torch.nn.RMSNorm(hidden, eps=1e-6)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = torch.nn.Linear(hidden, hidden, bias=False)
        self.gate = torch.nn.Linear(hidden, intermediate, bias=False)
        self.up = torch.nn.Linear(hidden, intermediate, bias=False)
        self.down = torch.nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        m = self.mlp_norm(h)
        return h + self.down(torch.nn.functional.silu(self.gate(m)) * self.up(m))


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
    return [*_llama_cases(device, small), *[
        Case(name=f"block fwd {tag} [backend=flyarray]", ours=_no_grad(lambda: ours_block(x)),
             eager=_no_grad(lambda: block(x)), compilable=_no_grad(lambda: block(x)),
             flops=gemm_flops + attn_flops, tol=tol, device_column=False),
        Case(name=f"block fwd+bwd {tag} [backend=flyarray]", ours=_grads(ours_block, xg, go),
             eager=_grads(block, xg, go), compilable=_grads(block, xg, go),
             flops=3 * (gemm_flops + attn_flops), tol=tol, device_column=False),
        Case(name=f"mlp fwd {tag} [backend=flyarray]", ours=_no_grad(lambda: ours_mlp(x)),
             eager=_no_grad(lambda: mlp(x)), compilable=_no_grad(lambda: mlp(x)),
             flops=2 * B * S * H * 8 * H, tol=tol, device_column=False),
    ]]


def _llama_cases(device, small):
    """The issue's Llama-style block, forward and backward: bf16 B4 S2048 H4096 (intermediate 11008,
    32 heads) on a GPU; tiny fp32 on the CPU. The first call's seconds (ours and Inductor's) print."""
    if device.type == "cuda" and not small:
        B, S, H, heads, inter, dt = 4, 2048, 4096, 32, 11008, torch.bfloat16
    elif device.type == "cuda":
        B, S, H, heads, inter, dt = 1, 64, 256, 2, 688, torch.bfloat16
    else:
        B, S, H, heads, inter, dt = 1, 16, 64, 2, 176, torch.float32
    torch.manual_seed(1)
    block = LlamaBlock(H, heads, inter).to(device=device, dtype=dt)
    ours = fat.accelerate(block)
    x = torch.randn(B, S, H, device=device, dtype=dt).requires_grad_()
    go = torch.randn_like(x)
    flops = 3 * (2 * B * S * H * (4 * H + 3 * inter) + 2 * B * S * S * H)  # fwd + bwd (2x fwd)
    tag = f"{str(dt).split('.')[-1]} B{B} S{S} H{H}"
    return [Case(name=f"llama block fwd+bwd {tag} [backend=flyarray]", ours=_grads(ours, x, go),
                 eager=_grads(block, x, go), compilable=_grads(block, x, go), flops=flops,
                 tol=3e-2 if dt == torch.bfloat16 else 1e-4, device_column=False, first_call=True,
                 goal=">= torch.compile")]
