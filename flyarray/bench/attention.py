"""Attention rows of PERF.md: flash forward (causal, long, GQA), backward, decode.

Inputs live in torch's (B, H, S, D) layout; ours sees them as (B, S, H, D)
views (no copy) and its outputs are transposed back (a view) for the check.
Eager is torch SDPA on the same tensors, GQA through ``enable_gqa`` when this
torch has it (otherwise kv heads are repeated once, outside the timed call).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flyarray.bench.harness import Case
from flyarray.kernels.attention import attention_bwd, attention_decode, attention_fwd


def _inputs(B, Hq, Hkv, Sq, Sk, D, dtype, device):
    q = torch.randn(B, Hq, Sq, D, device=device, dtype=dtype)
    k = torch.randn(B, Hkv, Sk, D, device=device, dtype=dtype)
    v = torch.randn(B, Hkv, Sk, D, device=device, dtype=dtype)
    return q, k, v


def _sdpa(q, k, v, causal):
    """SDPA on (B, H, S, D), GQA-aware; returns a zero-argument callable (setup done here)."""
    if q.shape[1] != k.shape[1]:
        try:
            F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], enable_gqa=True)
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except TypeError:  # older torch: repeat kv heads once, outside the timed call
            G = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _bshd(*ts):
    return [t.transpose(1, 2) for t in ts]


def _fwd_case(name, B, Hq, Hkv, S, D, causal, dtype, device, config=None, goal=">= 1.0x torch SDPA"):
    q, k, v = _inputs(B, Hq, Hkv, S, S, D, dtype, device)
    qs, ks, vs = _bshd(q, k, v)
    flops = 4 * B * Hq * S * S * D // (2 if causal else 1)
    ours = lambda: attention_fwd(qs, ks, vs, is_causal=causal, config=config)[0].transpose(1, 2)
    return Case(name=name, ours=ours, eager=_sdpa(q, k, v, causal), flops=flops, goal=goal)


def _bwd_case(name, B, Hq, Hkv, S, D, causal, dtype, device):
    q, k, v = _inputs(B, Hq, Hkv, S, S, D, dtype, device)
    do = torch.randn_like(q)
    qs, ks, vs, dos = _bshd(q, k, v, do)
    out, lse = attention_fwd(qs, ks, vs, is_causal=causal)

    def ours():
        grads = attention_bwd(dos, qs, ks, vs, out, lse, is_causal=causal)
        return tuple(g.transpose(1, 2) for g in grads)

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref_out = _sdpa(*leaves, causal)()

    def eager():
        return torch.autograd.grad(ref_out, leaves, do, retain_graph=True)

    flops = int(2.5 * 4 * B * Hq * S * S * D // (2 if causal else 1))
    return Case(name=name, ours=ours, eager=eager, flops=flops, tol=2e-2, goal=">= 1.0x torch SDPA backward")


def _decode_case(name, B, Hq, Hkv, Sk, D, dtype, device):
    q, k, v = _inputs(B, Hq, Hkv, 1, Sk, D, dtype, device)
    qs, ks, vs = _bshd(q, k, v)
    ours = lambda: attention_decode(qs, ks, vs)[0].transpose(1, 2)
    bytes_moved = 2 * k.numel() * k.element_size()  # K and V read once
    return Case(name=name, ours=ours, eager=_sdpa(q, k, v, False), bytes_moved=bytes_moved,
                flops=4 * B * Hq * Sk * D, goal="near the K+V bandwidth limit")


def cases(device, small):
    device = torch.device(device)
    if small:  # the interpreter: fp32 (no bf16 arithmetic there), tiny shapes
        dt, S, D = torch.float32, 48, 32
        return [
            _fwd_case(f"attn fwd B1 H4 S{S} D{D} causal", 1, 4, 4, S, D, True, dt, device),
            _fwd_case(f"attn fwd GQA 4q/2kv B1 S{S} D{D} causal", 1, 4, 2, S, D, True, dt, device),
            _bwd_case(f"attn bwd B1 H2 S{S} D{D} causal", 1, 2, 2, S, D, True, dt, device),
            _decode_case(f"attn decode B2 4q/2kv Sk{4 * S} D{D}", 2, 4, 2, 4 * S, D, dt, device),
        ]
    bf16 = torch.bfloat16
    rows = [
        _fwd_case("attn fwd B2 H32 S2048 D128 causal", 2, 32, 32, 2048, 128, True, bf16, device),
        _fwd_case("attn fwd B1 H32 S8192 D128", 1, 32, 32, 8192, 128, False, bf16, device),
        _fwd_case("attn fwd B8 H32 S4096 D128 causal", 8, 32, 32, 4096, 128, True, bf16, device),
        _fwd_case("attn fwd GQA 32q/8kv B4 S4096 D128 causal", 4, 32, 8, 4096, 128, True, bf16, device),
        _bwd_case("attn bwd B2 H32 S2048 D128 causal", 2, 32, 32, 2048, 128, True, bf16, device),
        _decode_case("attn decode B8 32q/8kv Sk8192 D128", 8, 32, 8, 8192, 128, bf16, device),
    ]
    # Tile variants on two rows, to pick the sm_90 config from one run (same check first).
    for bn, stages in ((128, 2), (128, 3), (64, 4)):
        cfg = dict(BLOCK_M=128, BLOCK_N=bn, num_warps=8, num_stages=stages)
        rows.append(_fwd_case(f"attn fwd S8192 D128 [BN{bn} st{stages}]", 1, 32, 32, 8192, 128, False,
                              bf16, device, config=cfg, goal="tuning row"))
    cfg = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)
    rows.append(_fwd_case("attn fwd B8 S4096 causal [BN128 st2]", 8, 32, 32, 4096, 128, True,
                          bf16, device, config=cfg, goal="tuning row"))
    return rows
