"""Top-k for sampling (wide vocabulary rows) and the MoE router (softmax + top-k), PERF.md's rows.

bytes_moved = input read once + values and int32 indices written once. The
check compares values exactly (softmax probabilities to 1e-5) and indices up to
ties: torch.topk does not promise which of equal values it returns, so an index
counts as right when the input at that index equals the value torch reports in
that position and no index repeats in a row.

``ours`` is the user path, every call: ``fa.top_k`` / ``fa.nn.softmax_top_k`` on
``fa.asarray`` of the torch input, both outputs handed back with
``torch.from_dlpack``. A few extra rows time other configs of the same kernels
("cfg ...", called directly on torch tensors), so one GPU run also says which
tuning to keep.
"""
from __future__ import annotations

import math

import torch

import flyarray as fa
from flyarray.bench.harness import Case
from flyarray.kernels.top_k import softmax_top_k, top_k


def _randn(shape, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().nan_to_num(0.0), b.double().nan_to_num(0.0)
    return (torch.linalg.vector_norm(a - b) / (torch.linalg.vector_norm(b) or 1.0)).item()


def _indices_ok(indices: torch.Tensor) -> bool:
    """No repeated index within a row."""
    s = indices.long().sort(-1).values
    return bool((s[..., 1:] != s[..., :-1]).all())


def top_k_check(x: torch.Tensor):
    """0.0 when values match torch.topk bit for bit and every index points at its value."""
    def check(out, ref) -> float:
        values, indices = out
        ref_values = ref[0]
        if values.shape != ref_values.shape or not _indices_ok(indices):
            return math.inf
        at_indices = torch.gather(x, -1, indices.long())
        if _same_bits(values, ref_values) and _same_bits(at_indices, ref_values):
            return 0.0
        return max(_rel(values, ref_values), _rel(at_indices, ref_values), 1e-30)  # any miss fails
    return check


def softmax_top_k_check(x: torch.Tensor):
    """Probabilities to fp32 rounding (summation order differs), indices up to ties."""
    probs_full = torch.softmax(x, dim=-1)

    def check(out, ref) -> float:
        probs, indices = out
        ref_probs = ref[0]
        if probs.shape != ref_probs.shape or not _indices_ok(indices):
            return math.inf
        at_indices = torch.gather(probs_full, -1, indices.long())
        return max(_rel(probs, ref_probs), _rel(at_indices, ref_probs))
    return check


def _user_top_k(x, k):
    values, indices = fa.top_k(fa.asarray(x), k)
    return torch.from_dlpack(values), torch.from_dlpack(indices)


def _user_router(x, k):
    probs, indices = fa.nn.softmax_top_k(fa.asarray(x), k)
    return torch.from_dlpack(probs), torch.from_dlpack(indices)


def _eager_router(x, k):
    return torch.topk(torch.softmax(x, dim=-1), k, dim=-1)


def cases(device, small):
    device = torch.device(device)
    wide = (4, 2048) if small else (64, 131072)
    narrow = (64, 256) if small else (16384, 256)
    out = []

    for k in (50, 1024):
        m, n = wide
        k = min(k, n)
        x = _randn((m, n), device, 10 + k)
        bytes_moved = m * n * 4 + m * k * (4 + 4)
        variants = [("", None)]
        if k == 50 and not small:  # other chunk sizes and threshold searches, for tuning
            variants += [(" cfg chunk8192", {"chunk": 8192}),
                         (" cfg chunk2048", {"chunk": 2048}),
                         (" cfg search16", {"search_bits": 16}),
                         (" cfg groups2048", {"min_groups": 2048})]
        for tag, cfg in variants:
            out.append(Case(
                name=f"top_k k={k} {m}x{n} fp32{tag}",
                ours=((lambda x=x, k=k: _user_top_k(x, k)) if cfg is None
                      else (lambda x=x, k=k, cfg=cfg: top_k(x, k, config=cfg))),
                eager=(lambda x=x, k=k: torch.topk(x, k, dim=-1)),
                compilable=(lambda x=x, k=k: torch.topk(x, k, dim=-1)) if not tag else None,
                bytes_moved=bytes_moved,
                goal="<= 0.030 ms" if k == 50 else "works; beat torch",
                check=top_k_check(x),
                tol=0.0,
            ))

    m, n = narrow
    k = 8
    x = _randn((m, n), device, 20)
    bytes_moved = m * n * 4 + m * k * (4 + 4)
    out.append(Case(
        name=f"top_k k={k} {m}x{n} fp32",
        ours=lambda: _user_top_k(x, k),
        eager=lambda: torch.topk(x, k, dim=-1),
        compilable=lambda: torch.topk(x, k, dim=-1),
        bytes_moved=bytes_moved,
        goal="memory-bound",
        check=top_k_check(x),
        tol=0.0,
    ))
    variants = [("", None)] + ([(" cfg tile4096", {"narrow_tile": 4096}),
                                (" cfg tile1024", {"narrow_tile": 1024})] if not small else [])
    for tag, cfg in variants:
        out.append(Case(
            name=f"softmax+top_k k={k} {m}x{n} fp32{tag}",
            ours=((lambda: _user_router(x, k)) if cfg is None
                  else (lambda cfg=cfg: softmax_top_k(x, k, config=cfg))),
            eager=lambda: _eager_router(x, k),
            compilable=(lambda: _eager_router(x, k)) if not tag else None,
            bytes_moved=bytes_moved,
            goal="<= 0.020 ms",
            check=softmax_top_k_check(x),
            tol=1e-5,
        ))
    return out
