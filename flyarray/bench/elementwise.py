"""The core's memory-bound rows (PERF.md): code generated from primitives, fused by the scheduler.

Each ``ours`` is an ``fa.jit`` function over torch tensors: the first call traces
and compiles, later calls replay the kernels (what a user's hot loop does).
"""
from __future__ import annotations

import torch

import flyarray as fa
from flyarray.bench.harness import Case


def _randn(shape, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def _as_torch(a):
    return torch.from_dlpack(a) if not isinstance(a, tuple) else tuple(torch.from_dlpack(x) for x in a)


def _ours(fn):
    jitted = fa.jit(fn)
    return lambda *args: _as_torch(jitted(*args))


@_ours
def silu_mul_add(x, z):
    return fa.silu(x) * z + 0.5 * x


@_ours
def softmax_prims(x):
    return fa.nn.softmax(x, axis=-1)


@_ours
def rms_norm_prims(x, w):
    xf = x.astype(fa.float32)
    return (fa.nn.rms_norm(xf, eps=1e-6) * w).astype(x.dtype)


@_ours
def add_rms_norm_prims(x, r, w):
    h = x + r
    hf = h.astype(fa.float32)
    return h, (fa.nn.rms_norm(hf, eps=1e-6) * w).astype(x.dtype)


@_ours
def row_sum_f32(x):
    return fa.sum(x, axis=-1, dtype=fa.float32)


def _eager_silu(x, z):
    return torch.nn.functional.silu(x) * z + 0.5 * x


def _eager_rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)


def _eager_add_rms(x, r, w):
    h = x + r
    return h, _eager_rms(h, w)


def cases(device, small):
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = str(dt).split(".")[-1]
    size = torch.tensor([], dtype=dt).element_size()
    n = 256 if small else 8192
    x, z = _randn((n, n), dt, device, 0), _randn((n, n), dt, device, 1)
    sm_m, sm_n = (64, 512) if small else (16384, 8192)
    s = _randn((sm_m, sm_n), dt, device, 2)
    rm, rn = (64, 512) if small else (32768, 4096)
    rx, rr, rw = _randn((rm, rn), dt, device, 3), _randn((rm, rn), dt, device, 4), _randn((rn,), dt, device, 5)
    return [
        Case(f"silu(x)*z + 0.5*x {n}^2 {name}", lambda: silu_mul_add(x, z), lambda: _eager_silu(x, z),
             lambda: _eager_silu(x, z), bytes_moved=3 * n * n * size, goal="<= 1.02x limit"),
        Case(f"softmax (primitives) {sm_m}x{sm_n} {name}", lambda: softmax_prims(s),
             lambda: torch.softmax(s, -1), lambda: torch.softmax(s, -1),
             bytes_moved=2 * sm_m * sm_n * size, goal="<= 1.10x limit"),
        Case(f"rms_norm (primitives) {rm}x{rn} {name}", lambda: rms_norm_prims(rx, rw),
             lambda: _eager_rms(rx, rw), lambda: _eager_rms(rx, rw),
             bytes_moved=2 * rm * rn * size + rn * size, goal="<= 1.08x limit"),
        Case(f"add + rms_norm (primitives) {rm}x{rn} {name}", lambda: add_rms_norm_prims(rx, rr, rw),
             lambda: _eager_add_rms(rx, rr, rw), lambda: _eager_add_rms(rx, rr, rw),
             bytes_moved=4 * rm * rn * size + rn * size, goal="<= 1.06x limit"),
        Case(f"row sum fp32 acc {n}^2 {name}", lambda: row_sum_f32(x),
             lambda: x.sum(-1, dtype=torch.float32), lambda: x.sum(-1, dtype=torch.float32),
             bytes_moved=n * n * size + n * 4, goal="<= 1.15x limit", tol=1e-3),
    ]
