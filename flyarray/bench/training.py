"""Training: one SGD step of an MLP, as a user's training loop runs it.

The model is ``layers`` x (Linear(width, width) + GELU) (erf form, torch's default), the loss the
mean squared error against a target, the update plain SGD (``p - lr * grad``). On a GPU: width
4096, batch 8192, 4 layers, bfloat16 parameters and data (``small``: the CPU sizes in bfloat16). On
the CPU: width 64, batch 32, 4 layers, float32 -- seconds for the whole suite.

Rows, each a real training loop (every call is one step from the parameters the previous call left):

- ``fa.jit [user path]``: ``step(params, x, y) -> (loss, new_params)`` written with
  ``fa.value_and_grad`` and a functional update (``fa.tree_util.tree_map``), under ``fa.jit``;
  params are a list of ``Linear(w, b)`` namedtuples. Every call passes the params and the data as
  torch tensors, takes the loss out with ``.torch()`` and the new params out with ``.torch()``,
  which the next call passes back in.
- torch eager: ``nn.Sequential`` of ``nn.Linear`` + ``nn.GELU``, ``F.mse_loss``,
  ``loss.backward()``, ``torch.optim.SGD.step()`` (the eager column).
- torch.compile of that same eager step function, on its own copy of the model (compile column).

Before timing, the harness calls the eager and the flyarray closure once each: both take their
first step from the same initial parameters and data, and ``check`` compares the losses and the
updated parameters (float32: also the updates ``new - init``, which is where a wrong gradient would
show; bfloat16: an update below half an ulp of its weight rounds away in both, so parameters and
loss only). A suite's cases are therefore single use: ``cases()`` builds fresh state.

FLOPs per step: ``6 * batch * width^2 * layers`` (forward 2, backward 4 per multiply-add of the
GEMMs; the elementwise work is not counted). GPU rows use the do_bench clock (``timing="device"``:
a step is milliseconds of GEMMs), CPU rows the host clock. There is no device column: CUDA-graph
capture of an autograd + optimizer step says nothing the ``ours`` column does not, here.
"""
from __future__ import annotations

import collections
import math

import torch
import torch.nn.functional as F

import flyarray as fa
from flyarray.bench.harness import Case, rel_error

Linear = collections.namedtuple("Linear", "w b")

GPU_SIZES = dict(width=4096, batch=8192, layers=4)
CPU_SIZES = dict(width=64, batch=32, layers=4)
LR = 0.1


def flops(width, batch, layers) -> int:
    return 6 * batch * width * width * layers


def init(width, batch, layers, dtype, device, seed=0):
    """(params as a list of Linear(w, b) torch tensors, x, y): the same for every row."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)
    params = [Linear(randn(width, width, scale=1 / math.sqrt(width)), randn(width, scale=0.1))
              for _ in range(layers)]
    return params, randn(batch, width), randn(batch, width)


# ---- flyarray -----------------------------------------------------------------------------------
def mlp(params, x):
    h = x
    for layer in params:
        h = fa.gelu(h @ layer.w.T + layer.b)  # nn.Linear: x W^T + b
    return h


def mse(params, x, y):
    return fa.mean((mlp(params, x) - y) ** 2)


def make_fa_step(lr=LR):
    """``step(params, x, y) -> (loss, new_params)`` under fa.jit: forward, backward and update traced
    once and replayed as one plan."""
    @fa.jit
    def step(params, x, y):
        loss, grads = fa.value_and_grad(mse)(params, x, y)
        return loss, fa.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
    return step


def fa_loop(params, x, y, lr=LR):
    """The user path's closure: one step per call, the new params kept for the next call (as torch
    tensors, as a loop that hands them to torch code would); returns (loss, *params) as torch tensors."""
    step = make_fa_step(lr)
    state = {"params": [Linear(w.clone(), b.clone()) for w, b in params]}

    def ours():
        loss, new = step(state["params"], x, y)
        new = fa.tree_util.tree_map(lambda a: a.torch(), new)
        state["params"] = new
        return (loss.torch(), *fa.tree_util.tree_leaves(new))
    return ours


# ---- torch ----------------------------------------------------------------------------------------
def torch_model(params):
    width = params[0].w.shape[0]
    layers = []
    for w, b in params:
        linear = torch.nn.Linear(width, width, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            linear.weight.copy_(w)
            linear.bias.copy_(b)
        layers += [linear, torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def torch_step(model, opt, x, y):
    """The eager training step (and what torch.compile compiles)."""
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def torch_loop(params, x, y, lr=LR):
    """One eager step per call on a model and optimizer of its own; returns (loss, *params) like
    ``fa_loop``'s closure. The compile row is a second such loop: the harness wraps it in
    ``torch.compile``, which compiles ``torch_step`` (forward, backward and ``opt.step``)."""
    model = torch_model(params)
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def run():
        loss = torch_step(model, opt, x, y)
        return (loss, *(p.detach() for p in model.parameters()))
    return run


def make_check(init_params, fp32: bool):
    """Relative error of one flyarray step against one torch step from the same start."""
    start = [t.detach().clone() for t in fa.tree_util.tree_leaves(init_params)]

    def check(out, ref):
        if len(out) != len(ref):
            return math.inf
        err = rel_error(out, ref)  # loss and every updated parameter, by norm
        if fp32:
            updates = [torch.from_dlpack(o).double() - s.double() for o, s in zip(out[1:], start)]
            ref_updates = [r.double() - s.double() for r, s in zip(ref[1:], start)]
            err = max(err, rel_error(updates, ref_updates))
        return err
    return check


def cases(device, small=True):
    device = torch.device(device)
    gpu = device.type == "cuda"
    sizes = CPU_SIZES if small else GPU_SIZES
    dtype = torch.bfloat16 if gpu else torch.float32
    width, batch, layers = sizes["width"], sizes["batch"], sizes["layers"]
    params, x, y = init(width, batch, layers, dtype, device)
    fp32 = dtype == torch.float32
    label = f"MLP train step {layers}x{width} b{batch} {'bf16' if not fp32 else 'f32'}"
    return [Case(
        name=f"{label} fa.jit [user path]",
        ours=fa_loop(params, x, y),
        eager=torch_loop(params, x, y),
        compilable=torch_loop(params, x, y),
        flops=flops(width, batch, layers),
        tol=1e-3 if fp32 else 2e-2,
        check=make_check(params, fp32),
        timing="device" if gpu else "host",
        device_column=False,
        goal=">= torch eager TFLOP/s" if gpu else "correctness (CPU)",
    )]
