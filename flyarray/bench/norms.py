"""Row normalizations: rms_norm, add + rms_norm, softmax, log_softmax (PERF.md's rows).

Every case is memory-bound; bytes_moved counts each input read once and each
output written once, so the harness's limit column is the copy-bandwidth floor.
``ours`` is the way a torch user gets them: the torch-facing ops of
``flyarray.interop.torch`` (``torch.ops.flyarray.rms_norm`` / ``softmax``: torch tensors in
and out, autograd-aware), which run fa.nn.rms_norm / fa.nn.softmax (the fused generated
kernels; fa.nn.softmax dispatches long rows to the segmented kernel of kernels/softmax.py), and
``torch.from_dlpack(fa.nn.softmax(fa.asarray(x)))`` for the long rows. The
primitive-built fa.nn rows are in the elementwise suite. The config probes
(indented names, not in the default tables) call the kernels directly.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import flyarray as fa
import flyarray.interop.torch as fat
from flyarray.bench.harness import Case
from flyarray.kernels.rms_norm import rms_norm_fwd
from flyarray.kernels.softmax import softmax

EPS = 1e-6


def _randn(shape, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def _eager_rms_norm(x, w, eps=EPS):
    """How a model writes it in torch: fp32 statistics, cast back to x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _eager_add_rms_norm(x, r, w, eps=EPS):
    h = x + r
    return h, _eager_rms_norm(h, w, eps)


def _ours_add_rms_norm(x, r, w, eps=EPS):
    y, h = fat.rms_norm(x, w, eps, residual=r)
    return h, y


def rms_norm_cases(device, small):
    m, n = (64, 512) if small else (32768, 4096)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32  # the interpreter has no bf16 math
    x, r, w = _randn((m, n), dt, device, 0), _randn((m, n), dt, device, 1), _randn((n,), dt, device, 2)
    size = x.element_size()
    tag = f"{m}x{n} {str(dt).split('.')[-1]}"
    cases = [Case(
        name=f"rms_norm {tag}",
        ours=lambda: fat.rms_norm(x, w, EPS),
        eager=lambda: _eager_rms_norm(x, w),
        compilable=lambda: _eager_rms_norm(x, w),
        bytes_moved=2 * m * n * size + n * size,
        goal="<= 1.08x limit",
    )]
    if hasattr(F, "rms_norm"):
        cases.append(Case(
            name=f"rms_norm {tag} vs F.rms_norm",
            ours=lambda: fat.rms_norm(x, w, EPS),
            eager=lambda: F.rms_norm(x, (n,), w, EPS),
            compilable=lambda: F.rms_norm(x, (n,), w, EPS),
            bytes_moved=2 * m * n * size + n * size,
            goal="<= 1.08x limit",
        ))
    cases.append(Case(
        name=f"add + rms_norm (h, y) {tag}",
        ours=lambda: _ours_add_rms_norm(x, r, w),
        eager=lambda: _eager_add_rms_norm(x, r, w),
        compilable=lambda: _eager_add_rms_norm(x, r, w),
        bytes_moved=4 * m * n * size + n * size,  # read x, residual, w; write h, y
        goal="<= 1.06x limit",
    ))
    return cases


def softmax_cases(device, small):
    cases = []
    m, n = (64, 1024) if small else (16384, 8192)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = _randn((m, n), dt, device, 3)
    tag = f"{m}x{n} {str(dt).split('.')[-1]}"
    for log in (False, True):
        eager = (lambda: torch.log_softmax(x, -1)) if log else (lambda: torch.softmax(x, -1))
        cases.append(Case(
            name=f"{'log_softmax' if log else 'softmax'} {tag}",
            ours=(lambda log=log: fat.softmax(x, -1, log)),
            eager=eager,
            compilable=eager,
            bytes_moved=2 * m * n * x.element_size(),
            goal="<= 1.10x limit",
        ))
    lm, ln = (2, 40000) if small else (64, 1 << 20)  # few long rows: the segmented online kernels
    xl = _randn((lm, ln), torch.float32, device, 4)
    cases.append(Case(
        name=f"softmax long rows {lm}x{ln} float32",
        ours=lambda: torch.from_dlpack(fa.nn.softmax(fa.asarray(xl), axis=-1)),
        eager=lambda: torch.softmax(xl, -1),
        compilable=lambda: torch.softmax(xl, -1),
        bytes_moved=2 * lm * ln * 4,
        goal="<= 1.10x limit (re-read of x from HBM makes ~1.3x likely)",
    ))
    return cases


PROBE_SIZES = {"rms": (32768, 4096), "softmax": (16384, 8192), "long": (64, 1 << 20)}


def config_variants(device, small, sizes=PROBE_SIZES):
    """The same rows with other configs (no torch.compile column): one GPU run then says
    which config the tables should hold. Real sizes only (`sizes` lets a CPU test shrink them)."""
    if small:
        return []
    out = []
    m, n = sizes["rms"]
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    x, r, w = _randn((m, n), dt, device, 0), _randn((m, n), dt, device, 1), _randn((n,), dt, device, 2)
    size = x.element_size()
    for cfg in ({"num_warps": 4}, {"num_warps": 16}, {"BLOCK_M": 2, "num_warps": 8}, {"BLOCK_M": 2, "num_warps": 16}):
        out.append(Case(
            name=f"  rms_norm {cfg}", ours=lambda cfg=cfg: rms_norm_fwd(x, w, EPS, config=cfg)[0],
            eager=lambda: _eager_rms_norm(x, w), bytes_moved=(2 * m * n + n) * size, goal="config probe"))
    for cfg in ({"num_warps": 4}, {"num_warps": 16}):
        out.append(Case(
            name=f"  add+rms_norm {cfg}",
            ours=lambda cfg=cfg: (lambda y, h, _: (h, y))(*rms_norm_fwd(x, w, EPS, r, config=cfg)),
            eager=lambda: _eager_add_rms_norm(x, r, w), bytes_moved=(4 * m * n + n) * size, goal="config probe"))
    xs = _randn(sizes["softmax"], dt, device, 3)
    for cfg in ({"num_warps": 4}, {"num_warps": 8}, {"num_warps": 32}):
        out.append(Case(
            name=f"  softmax {xs.shape[0]}x{xs.shape[1]} {cfg}", ours=lambda cfg=cfg: softmax(xs, -1, config=cfg),
            eager=lambda: torch.softmax(xs, -1), bytes_moved=2 * xs.numel() * xs.element_size(), goal="config probe"))
    xl = _randn(sizes["long"], torch.float32, device, 4)
    for label, kw in (("one program per row", {"num_segments": 1}), ("8 segments", {"num_segments": 8}),
                      ("128 segments", {"num_segments": 128}),
                      ("chunk 8192 x16 warps", {"block_n": 8192, "config": {"num_warps": 16}}),
                      ("chunk 2048 x4 warps", {"block_n": 2048, "config": {"num_warps": 4}})):
        out.append(Case(
            name=f"  softmax {xl.shape[0]}x{xl.shape[1]} {label}", ours=lambda kw=kw: softmax(xl, -1, **kw),
            eager=lambda: torch.softmax(xl, -1), bytes_moved=8 * xl.numel(), goal="config probe"))
    return out


def cases(device, small):
    device = torch.device(device)
    return rms_norm_cases(device, small) + softmax_cases(device, small) + config_variants(device, small)
