"""``python -m flyarray bench --suite distributed``: collectives and sharded training steps vs torch.distributed.

Launch on N processes: ``torchrun --nproc-per-node 2 -m flyarray bench --suite distributed``
(``python -m torch.distributed.run ...`` where the ``torchrun`` script is missing). Started without
torchrun it runs as a world of one process, which proves the path but measures no communication.
Only rank 0 prints and writes the JSON.

Rows (each checked against torch before it is timed):
- all_reduce / all_gather of 1 MiB..1 GiB (GPU; 64 KiB..4 MiB on the CPU with gloo): the flyarray
  collective node (``flyarray.collectives``, what ``fa.lax.psum`` records) on ``fa.asarray`` of the
  tensor, out through ``.torch()``, beside ``torch.distributed``'s own call; bus bandwidth as
  nccl-tests reports it (all_reduce: bytes/t * 2(n-1)/n; all_gather: output bytes/t * (n-1)/n);
- one all_reduce through ``fa.shard_map`` + ``fa.lax.psum`` (includes shard_map's boundary copies);
- a data-parallel and a tensor-parallel (column then row) MLP training step (forward and the weights'
  gradients) through ``fa.jit(fa.grad(...))`` on sharded arrays, beside the same step written by
  hand with torch autograd and torch.distributed.

Timing: every rank runs the same fixed number of calls (do_bench would pick its own count per rank and
the collectives would no longer pair up); a barrier starts each repeat; a repeat's time is the slowest
rank's; the median of 5 repeats is reported.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import socket
import sys
import time

import torch

import flyarray as fa
from flyarray import collectives as C
from flyarray.sharding import Mesh, NamedSharding, P

MiB = 1 << 20


def _init():
    """torch.distributed from torchrun's environment, or a world of one process; and whether we began it."""
    dist = torch.distributed
    began = not dist.is_initialized()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=120))
    return (torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")), began


def _time_ms(fn, device, iters) -> float:
    dist = torch.distributed
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        fn()
    samples = []
    for _ in range(5):
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        elapsed = torch.tensor([(time.perf_counter() - t0) * 1e3 / iters], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time (gloo-safe: a CPU tensor)
        samples.append(elapsed.item())
    return sorted(samples)[2]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (torch.linalg.vector_norm(a - b) / (torch.linalg.vector_norm(b) or 1.0)).item()


def _row(name, ours, theirs, device, iters, bus_factor=None, nbytes=None, tol=1e-5):
    err = max(_rel(o, t) for o, t in zip(_tuple(ours()), _tuple(theirs())))
    row = {"name": name, "rel_err": err, "status": "ok" if err <= tol else f"MISMATCH rel err {err:.2e}"}
    if row["status"] == "ok":
        row["ours_ms"], row["torch_ms"] = _time_ms(ours, device, iters), _time_ms(theirs, device, iters)
        if bus_factor is not None:
            row["ours_busbw_GBps"] = nbytes / (row["ours_ms"] * 1e-3) * bus_factor / 1e9
            row["torch_busbw_GBps"] = nbytes / (row["torch_ms"] * 1e-3) * bus_factor / 1e9
    return row


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _collective_rows(mesh, device, sizes):
    dist, n = torch.distributed, mesh.size("x")
    rows = []
    for nbytes in sizes:
        t = torch.randn(nbytes // 4, device=device)
        iters = max(3, min(50, (256 * MiB) // nbytes))

        def torch_all_reduce():
            out = t.clone()  # both sides leave the input as it was and return a new tensor
            dist.all_reduce(out)
            return out
        rows.append(_row(f"all_reduce {_size(nbytes)}", lambda: C.psum(fa.asarray(t), mesh, "x").torch(),
                         torch_all_reduce, device, iters, 2 * (n - 1) / n, nbytes))
        part = torch.randn(nbytes // 4 // n, device=device)

        def torch_all_gather():
            out = torch.empty(nbytes // 4 // n * n, device=device)
            dist.all_gather_into_tensor(out, part)
            return out
        rows.append(_row(f"all_gather {_size(nbytes)} (output)",
                         lambda: C.all_gather(fa.asarray(part), mesh, "x", tiled=True).torch(),
                         torch_all_gather, device, iters, (n - 1) / n, part.numel() * 4 * n))
    t = torch.randn(sizes[0] // 4, device=device)
    psum = fa.shard_map(lambda b: fa.lax.psum(b, "x"), mesh, (P(),), P())

    def torch_all_reduce_small():
        out = t.clone()
        dist.all_reduce(out)
        return out
    rows.append(_row(f"shard_map psum {_size(sizes[0])}", lambda: psum(t).local.torch(), torch_all_reduce_small,
                     device, 20, 2 * (n - 1) / n, sizes[0]))
    return rows


def _size(nbytes):
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // 1024} KiB"


def _mlp_loss(x, w1, w2):
    h = x @ w1
    h = fa.sharding.elementwise(fa.nn.relu, h) if isinstance(h, fa.sharding.ShardedArray) else fa.nn.relu(h)
    y = h @ w2
    return (y * y).mean()


def _step_rows(mesh, device, B, D, H):
    dist, n, r = torch.distributed, mesh.size("x"), mesh.index("x")
    g = torch.Generator(device="cpu").manual_seed(0)  # the same whole arrays on every rank
    x, w1, w2 = (torch.randn(*s, generator=g).to(device) * 0.05 for s in ((B, D), (D, H), (H, D)))
    step = fa.jit(fa.grad(_mlp_loss, argnums=(1, 2)))
    rows = []

    # data parallel: x split by rows, weights replicated; the weights' gradients are all-reduced
    xs = x.chunk(n)[r].contiguous()
    sx = fa.sharding.from_local(xs, NamedSharding(mesh, P("x")))
    rep = NamedSharding(mesh, P())

    def ours_dp():
        gw1, gw2 = step(sx, fa.sharding.from_local(w1, rep), fa.sharding.from_local(w2, rep))
        return gw1.local.torch(), gw2.local.torch()

    def torch_dp():
        a, b = w1.detach().requires_grad_(), w2.detach().requires_grad_()
        y = torch.relu(xs @ a) @ b
        ((y * y).sum() / (B * D)).backward()
        for p in (a, b):
            dist.all_reduce(p.grad)
        return a.grad, b.grad
    rows.append(_row(f"DP MLP step B={B} D={D} H={H}", ours_dp, torch_dp, device, 5, tol=2e-2))

    # tensor parallel: w1 split by columns, w2 by rows, x replicated; one all-reduce forward
    w1s, w2s = w1.chunk(n, 1)[r].contiguous(), w2.chunk(n, 0)[r].contiguous()

    def ours_tp():
        gw1, gw2 = step(fa.sharding.from_local(x, rep), fa.sharding.from_local(w1s, NamedSharding(mesh, P(None, "x"))),
                        fa.sharding.from_local(w2s, NamedSharding(mesh, P("x"))))
        return gw1.local.torch(), gw2.local.torch()

    def torch_tp():
        a, b = w1s.detach().requires_grad_(), w2s.detach().requires_grad_()
        z = torch.relu(x @ a) @ b
        total = z.detach().clone()
        dist.all_reduce(total)
        y = z + (total - z.detach())  # the all-reduced value, with an identity gradient into this rank's part
        ((y * y).sum() / (B * D)).backward()
        return a.grad, b.grad
    rows.append(_row(f"TP MLP step B={B} D={D} H={H}", ours_tp, torch_tp, device, 5, tol=2e-2))
    return rows


def _format(rows, world, device):
    head = (f"{'case':34} {'ours ms':>10} {'torch ms':>10} {'ours/torch':>10} {'ours GB/s':>10} "
            f"{'torch GB/s':>10}  status   (world {world}, {device}; GB/s = bus bandwidth)")
    lines = [head, "-" * len(head)]
    for r in rows:
        def cell(key, spec="10.3f"):
            v = r.get(key)
            return format(v, spec) if isinstance(v, float) and math.isfinite(v) else "-".rjust(10)
        ratio = r["ours_ms"] / r["torch_ms"] if "ours_ms" in r else float("nan")
        lines.append(f"{r['name'][:34]:34} {cell('ours_ms')} {cell('torch_ms')} {format(ratio, '10.2f')} "
                     f"{cell('ours_busbw_GBps', '10.1f')} {cell('torch_busbw_GBps', '10.1f')}  {r['status']}")
    return "\n".join(lines)


def run(small=None, json_path=None) -> list:
    """Every rank runs every row; rank 0 prints the table and writes ``json_path``."""
    device, began = _init()
    dist = torch.distributed
    small = device.type != "cuda" if small is None else small
    mesh = Mesh(("x",), (dist.get_world_size(),))
    sizes = [64 * 1024, MiB, 4 * MiB] if small else [MiB, 16 * MiB, 256 * MiB, 1024 * MiB]
    rows = []
    env = {"torch": torch.__version__, "world": dist.get_world_size(), "device": str(device),
           "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None, "backend": dist.get_backend()}
    steps = (64, 64, 128) if small else (4096, 2048, 8192)
    for section in (lambda: _collective_rows(mesh, device, sizes), lambda: _step_rows(mesh, device, *steps)):
        rows += section()
        if dist.get_rank() == 0 and json_path:  # after each section: a run cut short keeps what it measured
            with open(json_path, "w") as f:
                json.dump({"environment": env, "small": small, "rows": rows}, f, indent=1)
    if dist.get_rank() == 0:
        print(_format(rows, dist.get_world_size(), device), flush=True)
    dist.barrier()
    if began:  # a process group left open at exit can abort the process in its teardown
        dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    sys.exit(0 if all(r["status"] == "ok" for r in run()) else 1)
