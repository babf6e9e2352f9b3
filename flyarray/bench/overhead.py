"""Host path: what a user pays per call on tiny work, next to torch eager and torch.compile.

Every ``ours`` here is the user path, every call: ``fa.asarray`` on the torch
inputs, the ops, ``torch.from_dlpack`` on the result -- nothing pre-recorded.
The work is tiny, so the host is the bottleneck and every row is timed as a
host row (harness docstring: N back-to-back calls, one sync, median of 5
repeats); the device column (a CUDA-graph replay of the same closure) shows how
little of that the GPU spends.

Rows and goals (GPU / CPU reference backend):

- ``exp(x) + 1`` on 2048 floats: <= 15 us / <= 3x eager; once out through ``torch.from_dlpack``
  and once through ``Array.torch()`` (the first includes torch's own from_dlpack Python, which
  the from_dlpack rows measure on a plain tensor).
- ``fa.nn.rms_norm(x, w, 1e-6)`` on 8x1024: <= 30 us / <= 3x eager; against rms_norm
  written out in torch and against ``F.rms_norm`` where this torch has it.
- ``torch.from_dlpack`` of an already-realized array: <= torch's own + 3 us.
- the fastest way out of a realized array (``Array.torch()`` where it exists, else
  ``flyarray.interop.torch.to_torch``): <= 3 us.
- ``fa.asarray(t)`` straight back through ``torch.from_dlpack`` (no op).
- an ``fa.jit`` replay of a 3-op chain against a plain ``kernel[grid](...)`` launch
  of the same hand-written Triton kernel (GPU; torch eager on the CPU): <= raw + 5 us; once out
  through ``torch.from_dlpack`` and once through ``Array.torch()`` (the raw launch has no
  from_dlpack to pay, so the second is the like-for-like replay cost).
- a 30-op elementwise chain on 4096 floats, under ``fa.jit`` and lazily (no jit),
  against torch eager (30 launches) and torch.compile: >= 3x faster than eager on the
  GPU; on the CPU lazy <= 1.5x eager, jit <= 1.2x eager.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import flyarray as fa
from flyarray.bench.harness import Case

EPS = 1e-6

try:  # the raw-launch baseline; Triton imports without a GPU, the row itself is GPU-only
    import triton
    import triton.language as tl

    @triton.jit
    def _chain3_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, tl.sin(x) * x + 1.0, mask=mask)
except Exception:  # pragma: no cover - a Triton without a usable jit
    triton = None


def _randn(shape, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32)


def chain3(x, m):
    """sin, mul, add: the same three ops in fa (``m=fa``) or torch (``m=torch``)."""
    return m.sin(x) * x + 1.0


def chain30(x, m):
    """30 elementwise ops (3 blocks of 10), bounded values: sin/exp/cos/tanh with muls and adds."""
    y = x
    for i in range(3):
        y = m.sin(y)                # 1
        y = y * x                   # 2
        y = y + 0.5                 # 3
        y = y * 0.25                # 4
        y = m.exp(y)                # 5
        y = y - x                   # 6
        y = m.cos(y)                # 7
        y = y * (1.5 + 0.1 * i)     # 8
        y = y + x                   # 9
        y = m.tanh(y)               # 10
    return y


def _eager_rms_norm(x, w, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _raw_triton_chain3(t):
    """``chain3`` as a hand-written Triton kernel, launched the plain way (``kernel[grid](...)``)
    with its output allocated per call, as any launch path must."""
    n, block = t.numel(), 1024
    grid = ((n + block - 1) // block,)  # plain Python: triton.cdiv's call costs ~2.5 us

    def launch():
        out = torch.empty_like(t)
        _chain3_kernel[grid](t, out, n, BLOCK=block)
        return out
    return launch


def _way_out():
    """(label, fn) for the fastest documented way from a realized array to a torch tensor, or None."""
    if hasattr(fa.Array, "torch"):
        return "Array.torch()", lambda a: a.torch()
    try:
        from flyarray.interop.torch import to_torch
    except ImportError:
        return None
    return "interop.torch.to_torch", to_torch


def cases(device, small=True):
    device = torch.device(device)
    gpu = device.type == "cuda"
    out = []

    # -- a tiny one-kernel graph through the user path
    t = _randn((2048,), device, 0)
    out.append(Case(
        name="exp(x)+1 2048 f32 [user path]",
        ours=lambda: torch.from_dlpack(fa.exp(fa.asarray(t)) + 1),
        eager=lambda: torch.exp(t) + 1,
        compilable=lambda: torch.exp(t) + 1,
        timing="host", tol=1e-5,
        goal="<= 15 us" if gpu else "<= 3x eager",
    ))

    # -- the same, out through the fastest way (Array.torch()): what is ours, without torch.from_dlpack's
    #    own Python (the from_dlpack row below measures that on a plain tensor)
    out.append(Case(
        name="exp(x)+1 2048 f32 [user path, .torch()]",
        ours=lambda: (fa.exp(fa.asarray(t)) + 1).torch(),
        eager=lambda: torch.exp(t) + 1,
        compilable=lambda: torch.exp(t) + 1,
        timing="host", tol=1e-5,
        goal="<= 15 us" if gpu else "<= 3x eager",
    ))

    # -- tiny rms_norm: fa.nn.rms_norm vs written out, vs F.rms_norm
    x, w = _randn((8, 1024), device, 1), _randn((1024,), device, 2)
    ours_rms = lambda: torch.from_dlpack(fa.nn.rms_norm(fa.asarray(x), fa.asarray(w), EPS))  # noqa: E731
    out.append(Case(
        name="rms_norm 8x1024 f32 [user path]",
        ours=ours_rms,
        eager=lambda: _eager_rms_norm(x, w),
        compilable=lambda: _eager_rms_norm(x, w),
        timing="host", tol=1e-5,
        goal="<= 30 us" if gpu else "<= 3x eager",
    ))
    if hasattr(F, "rms_norm"):
        out.append(Case(
            name="rms_norm 8x1024 f32 [user path] vs F.rms_norm",
            ours=ours_rms,
            eager=lambda: F.rms_norm(x, (1024,), w, EPS),
            compilable=lambda: F.rms_norm(x, (1024,), w, EPS),
            timing="host", tol=1e-5,
            goal="<= 30 us" if gpu else "<= 3x eager",
        ))

    # -- getting a result out: from_dlpack of a realized array vs of a plain tensor
    realized = (fa.exp(fa.asarray(t)) + 1).block_until_ready()
    plain = torch.exp(t) + 1
    out.append(Case(
        name="from_dlpack(realized array) vs of a tensor",
        ours=lambda: torch.from_dlpack(realized),
        eager=lambda: torch.from_dlpack(plain),
        timing="host", tol=1e-5, device_column=False,
        goal="<= torch's own + 3 us",
    ))
    way = _way_out()
    if way is not None:
        label, to_torch = way
        out.append(Case(
            name=f"{label} (realized) vs from_dlpack(tensor)",
            ours=lambda: to_torch(realized),
            eager=lambda: torch.from_dlpack(plain),
            timing="host", tol=1e-5, device_column=False,
            goal="<= 3 us",
        ))
    out.append(Case(
        name="from_dlpack(asarray(t)), no op",
        ours=lambda: torch.from_dlpack(fa.asarray(t)),
        eager=lambda: torch.from_dlpack(t),
        timing="host", tol=0.0, device_column=False,
        goal="<= torch's own + 3 us",
    ))

    # -- fa.jit replay of a 3-op chain vs the same kernel launched straight through Triton
    jit3 = fa.jit(lambda a: chain3(a, fa))
    if gpu and triton is not None:
        vs, baseline, goal = "raw Triton launch", _raw_triton_chain3(t), "<= raw launch + 5 us"
    else:
        vs, baseline, goal = "torch eager", (lambda: chain3(t, torch)), "replay cost; raw Triton row on GPU"
    out.append(Case(
        name=f"fa.jit sin*x+1 2048 [user path] vs {vs}",
        ours=lambda: torch.from_dlpack(jit3(fa.asarray(t))),
        eager=baseline,
        compilable=lambda: chain3(t, torch),
        timing="host", tol=1e-5, goal=goal,
    ))

    out.append(Case(
        name=f"fa.jit sin*x+1 2048 [.torch()] vs {vs}",
        ours=lambda: jit3(fa.asarray(t)).torch(),
        eager=baseline,
        compilable=lambda: chain3(t, torch),
        timing="host", tol=1e-5, goal=goal,
    ))

    # -- 30 elementwise ops on 4096 floats: jit, lazy (no jit), torch eager's 30 launches, torch.compile
    v = _randn((4096,), device, 3)
    jit30 = fa.jit(lambda a: chain30(a, fa))
    out.append(Case(
        name="30-op chain 4096 f32 fa.jit [user path]",
        ours=lambda: torch.from_dlpack(jit30(fa.asarray(v))),
        eager=lambda: chain30(v, torch),
        compilable=lambda: chain30(v, torch),
        timing="host", tol=1e-4,
        goal=">= 3x faster than eager" if gpu else "<= 1.2x eager",
    ))
    out.append(Case(
        name="30-op chain 4096 f32 lazy [user path]",
        ours=lambda: torch.from_dlpack(chain30(fa.asarray(v), fa)),
        eager=lambda: chain30(v, torch),
        compilable=lambda: chain30(v, torch),
        timing="host", tol=1e-4,
        goal=">= 3x faster than eager" if gpu else "<= 1.5x eager",
    ))

    # -- a 6-layer tanh MLP on 16 rows (12 launches: 6 GEMMs, 6 fused kernels) under fa.jit: one CUDA
    #    graph per call (graphs.py) against launching kernel by kernel, torch eager and torch.compile
    x16, w64 = _randn((16, 256), device, 4), _randn((256, 256), device, 5) / 16
    graphed, launched = fa.jit(_layers6), fa.jit(_layers6, cuda_graph=False)
    for name, fn, goal in (("[cuda graph]", graphed, "graph replay < plain replay (GPU)"),
                           ("[no graph]", launched, "replay cost")):
        out.append(Case(
            name=f"6-layer MLP 16x256 fa.jit {name}",
            ours=lambda fn=fn: fn(x16, w64).torch(),
            eager=lambda: _layers6(x16, w64, torch),
            compilable=lambda: _layers6(x16, w64, torch),
            timing="host", tol=1e-4, goal=goal,
        ))
    return out


def _layers6(x, w, xp=fa):
    for _ in range(6):
        x = xp.tanh(x @ w) * 0.5
    return x
