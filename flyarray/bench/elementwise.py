"""The core's memory-bound rows (PERF.md): code generated from primitives, fused by the scheduler.

Each ``ours`` is the user path, every call: ``fa.asarray`` on the torch inputs,
the ops, ``torch.from_dlpack`` on every result (host cost included; the device
column beside it is the same closure's CUDA-graph replay). The rows named
``[fa.jit]`` time a jitted function's replay instead (torch tensors in, traced
once): a second way in, named as such. ``add + rms_norm`` converts both of its
outputs (y first, as ``y, h = fa.nn.rms_norm(..., residual=r)`` reads); its
``[fa.eval]`` row evaluates both together first (one schedule).
"""
from __future__ import annotations

import torch

import flyarray as fa
from flyarray.bench.harness import Case

EPS = 1e-6


def _randn(shape, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def _as_torch(a):
    return torch.from_dlpack(a) if not isinstance(a, tuple) else tuple(torch.from_dlpack(x) for x in a)


# ---- the work, written once on fa arrays -------------------------------------------------------------
def silu_mul_add(x, z):
    return fa.silu(x) * z + 0.5 * x


def softmax(x):
    return fa.nn.softmax(x, axis=-1)


def rms_norm(x, w):
    return fa.nn.rms_norm(x, w, EPS)


def add_rms_norm(x, r, w):
    """(h, y): the residual stream and its norm, in the order eager returns them."""
    y, h = fa.nn.rms_norm(x, w, EPS, residual=r)
    return h, y


def row_sum_f32(x):
    return fa.sum(x, axis=-1, dtype=fa.float32)


def user_path(fn):
    """What a user writes around ``fn``: asarray on the way in, from_dlpack on every result, each call."""
    def call(*tensors):
        return _as_torch(fn(*(fa.asarray(t) for t in tensors)))
    return call


def jit_path(fn):
    jitted = fa.jit(fn)
    return lambda *tensors: _as_torch(jitted(*tensors))


def _add_rms_norm_user(x, r, w):
    """As a user writes it: y first, then the residual h; both handed out with from_dlpack."""
    y, h = fa.nn.rms_norm(fa.asarray(x), fa.asarray(w), EPS, residual=fa.asarray(r))
    y = torch.from_dlpack(y)
    return torch.from_dlpack(h), y


def _add_rms_norm_eval(x, r, w):
    """Both outputs evaluated in one schedule (``fa.eval``) before they are handed out."""
    h, y = add_rms_norm(fa.asarray(x), fa.asarray(r), fa.asarray(w))
    fa.eval(h, y)
    return torch.from_dlpack(h), torch.from_dlpack(y)


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
    name = {torch.bfloat16: "bf16", torch.float32: "f32"}[dt]
    size = torch.tensor([], dtype=dt).element_size()
    n = 256 if small else 8192
    x, z = _randn((n, n), dt, device, 0), _randn((n, n), dt, device, 1)
    sm_m, sm_n = (64, 512) if small else (16384, 8192)
    s = _randn((sm_m, sm_n), dt, device, 2)
    rm, rn = (64, 512) if small else (32768, 4096)
    rx, rr, rw = _randn((rm, rn), dt, device, 3), _randn((rm, rn), dt, device, 4), _randn((rn,), dt, device, 5)
    rows = [  # (name, fa function, its torch inputs, eager, bytes, goal, tol)
        (f"silu(x)*z + 0.5*x {n}^2 {name}", silu_mul_add, (x, z), lambda: _eager_silu(x, z),
         3 * n * n * size, "<= 1.02x limit", 1e-2),
        (f"softmax (prims) {sm_m}x{sm_n} {name}", softmax, (s,), lambda: torch.softmax(s, -1),
         2 * sm_m * sm_n * size, "<= 1.10x limit", 1e-2),
        (f"rms_norm (prims) {rm}x{rn} {name}", rms_norm, (rx, rw), lambda: _eager_rms(rx, rw),
         2 * rm * rn * size + rn * size, "<= 1.08x limit", 1e-2),
        (f"add+rms_norm (prims) {rm}x{rn} {name}", add_rms_norm, (rx, rr, rw), lambda: _eager_add_rms(rx, rr, rw),
         4 * rm * rn * size + rn * size, "<= 1.06x limit", 1e-2),
        (f"row sum fp32 acc {n}^2 {name}", row_sum_f32, (x,), lambda: x.sum(-1, dtype=torch.float32),
         n * n * size + n * 4, "<= 1.15x limit", 1e-3),
    ]
    out = []
    for label, fn, inputs, eager, bytes_moved, goal, tol in rows:
        ours = _add_rms_norm_user if fn is add_rms_norm else user_path(fn)
        out.append(Case(label, lambda ours=ours, inputs=inputs: ours(*inputs), eager, eager,
                        bytes_moved=bytes_moved, goal=goal, tol=tol))
    add_rms = rows[3]
    out.append(Case(f"{add_rms[0]} [fa.eval]", lambda: _add_rms_norm_eval(rx, rr, rw), add_rms[3],
                    bytes_moved=add_rms[4], goal=add_rms[5]))
    for label, fn, inputs, eager, bytes_moved, goal, tol in rows:
        jitted = jit_path(fn)
        out.append(Case(f"{label} [fa.jit]", lambda jitted=jitted, inputs=inputs: jitted(*inputs), eager,
                        bytes_moved=bytes_moved, goal=goal, tol=tol))
    return out
