"""The distributed checks, run on every rank of a 2-process job (tests/test_distributed.py launches it).

    python -m torch.distributed.run --nproc-per-node 2 tests/distributed_checks.py --out DIR [--device cuda]

Every rank runs every ``check_*`` in the same order (collectives must match across ranks) and writes
``DIR/rank<r>.json``: check name -> "ok" or the traceback. Each check compares sharded results with
the same computation on the whole arrays on one device.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback

import numpy as np
import torch

import flyarray as fa
from flyarray.sharding import Mesh, NamedSharding, P

DEVICE = "cpu"
ATOL = 1e-5


def _randn(*shape, seed):
    g = torch.Generator().manual_seed(seed)  # the same data on every rank
    return fa.asarray(torch.randn(*shape, generator=g).to(DEVICE))


def _close(got, want, atol=ATOL, what=""):
    got, want = np.asarray(fa.device_get(got)), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, atol=atol, rtol=1e-4, err_msg=what)


def _prims(x) -> set:
    """The primitive names in the graph under ``x`` (a ShardedArray's local shard or an Array)."""
    node = (x.local if isinstance(x, fa.sharding.ShardedArray) else x)._node
    seen, todo, names = set(), [node], set()
    while todo:
        n = todo.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        names.add(n.prim.name)
        todo.extend(n.inputs)
    return names


COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ppermute"}


def _mesh():
    return Mesh(("x",), (2,))


# ---- meshes and placement -------------------------------------------------------------------------------
def check_mesh_validation():
    try:
        Mesh(("x",), (3,))
    except ValueError as e:
        assert "world size" in str(e) and "3" in str(e), str(e)
    else:
        raise AssertionError("a mesh of 3 ranks in a world of 2 was accepted")
    m = Mesh(("a", "b"), (1, 2))
    assert m.size("b") == 2 and m.size("a") == 1 and m.size(("a", "b")) == 2
    assert m.index("b") == torch.distributed.get_rank() and m.index("a") == 0
    for bad in (lambda: NamedSharding(m, P("z")), lambda: NamedSharding(m, P("b", "b"))):
        try:
            bad()
        except ValueError:
            pass
        else:
            raise AssertionError("a bad PartitionSpec was accepted")


def check_device_put_get():
    mesh, x = _mesh(), _randn(4, 6, seed=0)
    r = torch.distributed.get_rank()
    for spec, local in ((P("x"), (2, 6)), (P(None, "x"), (4, 3)), (P(), (4, 6))):
        s = fa.device_put(x, NamedSharding(mesh, spec))
        assert s.shape == (4, 6) and s.local.shape == local and s.sharding == NamedSharding(mesh, spec)
        _close(s, x, 0, f"device_get of {spec}")
    s = fa.device_put(x, NamedSharding(mesh, P("x")))
    np.testing.assert_array_equal(np.asarray(s.local), np.asarray(x)[2 * r:2 * r + 2])
    assert x.sharding is None
    try:
        fa.device_put(_randn(3, 2, seed=1), NamedSharding(mesh, P("x")))
    except ValueError as e:
        assert "evenly" in str(e)
    else:
        raise AssertionError("an uneven split was accepted")
    g = fa.grad(lambda t: (fa.device_put(t, NamedSharding(mesh, P("x"))) ** 2).sum())(x)  # through device_put
    _close(g, 2 * np.asarray(x), what="grad through device_put")
    two_d = Mesh(("a", "b"), (1, 2))
    s = fa.device_put(x, NamedSharding(two_d, P("a", "b")))
    assert s.local.shape == (4, 3)
    _close(s, x, 0, "2-D mesh round trip")
    loc = fa.sharding.from_local(s.local, s.sharding)
    _close(loc, x, 0, "from_local")


# ---- propagation -----------------------------------------------------------------------------------------
def check_elementwise_propagation():
    mesh = _mesh()
    a, b, row = _randn(4, 6, seed=2), _randn(4, 6, seed=3), _randn(6, seed=4)
    sa, sb = (fa.device_put(t, NamedSharding(mesh, P("x"))) for t in (a, b))
    y = (sa * sb + 2.0) / (abs(sb) + 1.0) - row  # same sharding, a scalar and a replicated plain Array
    assert y.sharding == NamedSharding(mesh, P("x")) and not (_prims(y) & COLLECTIVES), _prims(y)
    _close(y, (a * b + 2.0) / (abs(b) + 1.0) - row, what="elementwise")
    col = fa.device_put(_randn(4, 1, seed=5), NamedSharding(mesh, P()))  # replicated, sliced locally
    y = fa.sharding.elementwise(fa.exp, sa) * col
    assert not (_prims(y) & COLLECTIVES)
    _close(y, fa.exp(a) * np.asarray(col.local), what="replicated operand")
    sc = fa.device_put(b, NamedSharding(mesh, P(None, "x")))  # split differently: gathered first
    y = sa + sc
    assert "all_gather" in _prims(y) and y.sharding.is_replicated
    _close(y, a + b, what="conflicting shardings")


def check_reduction_propagation():
    mesh = _mesh()
    a = _randn(4, 6, seed=6)
    s = fa.device_put(a, NamedSharding(mesh, P("x")))
    local = s.sum(axis=1)
    assert not (_prims(local) & COLLECTIVES) and local.sharding == NamedSharding(mesh, P("x"))
    _close(local, a.sum(axis=1), what="sum over an unsplit axis")
    for name in ("sum", "mean", "max", "min"):
        y = getattr(s, name)(axis=0)
        assert "all_reduce" in _prims(y) and y.sharding.is_replicated, name
        _close(y, getattr(a, name)(axis=0), what=f"{name} over the split axis")
    total = s.sum()
    assert total.shape == () and "all_reduce" in _prims(total)
    _close(total, a.sum(), atol=1e-4, what="full sum")
    # a NaN on one rank only is the max/min, as on one device (gloo's MAX/MIN alone drop it)
    an = np.asarray(a)
    with_nan = an.copy()
    with_nan[0, 0] = np.nan  # rank 0's rows
    for name in ("max", "min"):
        got = np.asarray(getattr(fa.device_put(with_nan, NamedSharding(mesh, P("x"))), name)(axis=0).local)
        assert np.isnan(got[0]) and not np.isnan(got[1:]).any(), (name, got)
        np.testing.assert_allclose(got[1:], getattr(an, name)(axis=0)[1:], rtol=1e-6, err_msg=f"{name} beside a NaN")
        try:   # the tangent of a max is the argmax rank's, not the max of the tangents: refused, as grad is
            fa.jvp(lambda v, name=name: getattr(fa.device_put(v, NamedSharding(mesh, P("x"))), name)(axis=0).local,
                   (a,), (fa.ones((4, 6), device=DEVICE),))
        except TypeError as e:
            assert "not differentiable" in str(e), e
        else:
            raise AssertionError(f"jvp of a sharded {name} over the split axis was accepted")


def check_matmul_propagation():
    mesh = _mesh()
    x, w = _randn(4, 8, seed=7), _randn(8, 6, seed=8)
    want = x @ w
    cases = [  # (x spec, w spec, collective expected, result spec)
        (P(None, "x"), P("x"), "all_reduce", P()),  # row-parallel: split contraction
        (P(), P(None, "x"), None, P(None, "x")),  # column-parallel
        (P("x"), P(), None, P("x")),  # data-parallel
        (P(None, "x"), P(), "all_reduce", P()),  # K split on x only: w sliced locally
        (P("x"), P(None, "x"), "all_gather", P()),  # one mesh axis on M and N: gathered
    ]
    for xs, ws, coll, out in cases:
        y = fa.device_put(x, NamedSharding(mesh, xs)) @ fa.device_put(w, NamedSharding(mesh, ws))
        prims = _prims(y) & COLLECTIVES
        assert (coll in prims) if coll else not prims, (xs, ws, prims)
        assert y.sharding == NamedSharding(mesh, out), (xs, ws, y.sharding)
        _close(y, want, atol=1e-4, what=f"matmul {xs} @ {ws}")
    xb = _randn(2, 4, 8, seed=9)  # batched, split on the batch
    y = fa.device_put(xb, NamedSharding(mesh, P("x"))) @ fa.device_put(w, NamedSharding(mesh, P()))
    _close(y, xb @ w, atol=1e-4, what="batched data-parallel")


def check_apply_gathers():
    mesh = _mesh()
    a = _randn(4, 6, seed=10)
    s = fa.device_put(a, NamedSharding(mesh, P("x")))
    y = fa.sharding.apply(fa.flip, s, axis=0)
    assert isinstance(y, fa.Array) and "all_gather" in _prims(y)
    _close(y, fa.flip(a, axis=0), what="apply")


# ---- collectives under shard_map --------------------------------------------------------------------------
def check_shard_map_collectives():
    mesh, r = _mesh(), torch.distributed.get_rank()
    a = _randn(4, 6, seed=11)
    s = fa.device_put(a, NamedSharding(mesh, P("x")))
    an = np.asarray(a)
    blocks = [an[:2], an[2:]]

    def run(f, out_spec):
        return fa.shard_map(f, mesh, (P("x"),), out_spec)(s)
    _close(run(lambda b: fa.lax.psum(b, "x"), P()), blocks[0] + blocks[1], what="psum")
    _close(run(lambda b: fa.lax.pmean(b, "x"), P()), (blocks[0] + blocks[1]) / 2, what="pmean")
    _close(run(lambda b: fa.lax.all_gather(b, "x", tiled=True), P()), an, what="all_gather tiled")
    _close(run(lambda b: fa.lax.all_gather(b, "x", axis=1), P()), np.stack(blocks, 1), what="all_gather axis=1")
    y = run(lambda b: fa.lax.psum_scatter(b, "x", scatter_dimension=1, tiled=True), P(None, "x"))
    _close(y, blocks[0] + blocks[1], what="psum_scatter")
    y = run(lambda b: fa.lax.ppermute(b, "x", [(0, 1), (1, 0)]), P("x"))
    _close(y, np.concatenate([blocks[1], blocks[0]]), what="ppermute swap")
    y = run(lambda b: fa.lax.ppermute(b, "x", [(0, 1)]), P("x"))
    _close(y, np.concatenate([np.zeros_like(blocks[0]), blocks[0]]), what="ppermute shift (zeros)")
    y = run(lambda b: fa.lax.all_to_all(b, "x", 1, 0), P("x"))  # (2, 6) -> (4, 3) per rank
    want = np.concatenate([np.concatenate([blocks[0][:, 3 * i:3 * i + 3], blocks[1][:, 3 * i:3 * i + 3]])
                           for i in range(2)])
    _close(y, want, what="all_to_all")
    y = run(lambda b: b * 0 + fa.lax.axis_index("x").astype(fa.float32), P("x"))
    _close(y, np.repeat([[0.0], [1.0]], 2, axis=0) * np.ones((4, 6)), what="axis_index")
    try:
        fa.lax.psum(a, "x")
    except RuntimeError as e:
        assert "shard_map" in str(e)
    else:
        raise AssertionError("psum outside shard_map was accepted")
    assert r in (0, 1)



def check_narrow_float_reductions():
    """float16/bfloat16 sums and means accumulate in float32 across ranks (as fa.sum/fa.mean): a float16
    partial sum overflowed, so the mean of 60000s was inf and 6e4 + 6e4 - 6e4 - 6e4 was nan."""
    mesh = _mesh()
    for dtype in (fa.float16, fa.bfloat16):
        h = fa.asarray(np.full((4, 2), 60000, dtype=np.float32), device=DEVICE).astype(dtype)
        xs = fa.device_put(h, NamedSharding(mesh, P("x")))
        for got, want in ((xs.mean(axis=0), fa.mean(h, axis=0)), (xs.mean(axis=1), fa.mean(h, axis=1)),
                          (xs.mean(), fa.mean(h))):
            got = fa.device_get(got)
            assert got.dtype == dtype and np.isfinite(np.asarray(got.astype(fa.float32))).all(), (dtype, got)
            assert got.astype(fa.float32).tolist() == want.astype(fa.float32).tolist(), (dtype, got, want)
        k = fa.asarray(np.array([60000, 60000, -60000, -60000], dtype=np.float32), device=DEVICE).astype(dtype)
        total = fa.device_get(fa.device_put(k, NamedSharding(mesh, P("x"))).sum())
        assert total.dtype == dtype and total.astype(fa.float32).item() == 0.0, (dtype, total)


def check_integer_dtypes_cross_collectives():
    """int16 and uint16/32/64 arrays cross every collective (gloo has none of them: their bytes move, and
    reductions widen 16-bit integers or flip unsigned ones onto the signed type of their width)."""
    mesh = _mesh()
    for name in ("int16", "uint8", "uint16", "uint32", "uint64"):
        npd = getattr(np, name)
        top = np.iinfo(npd).max
        vals = np.array([[top, 1], [top // 2 + 1, 3], [5, top // 2], [0, top - 1]], dtype=npd)
        a = fa.asarray(vals, device=DEVICE)
        xs = fa.device_put(a, NamedSharding(mesh, P("x")))
        assert fa.device_get(xs).tolist() == vals.tolist(), name
        for red in ("max", "min"):   # over the split axis: an all-reduce of the unsigned order
            assert fa.device_get(getattr(xs, red)(axis=0)).tolist() == getattr(vals, red)(axis=0).tolist(), \
                (name, red)
        total = fa.device_get(xs.sum(axis=0))   # int64/uint64 (the array API rule), wrapping modulo 2^64
        assert total.dtype == fa.sum(a, axis=0).dtype and total.tolist() == fa.sum(a, axis=0).tolist(), name

        def run(f, out_spec):
            return fa.device_get(fa.shard_map(f, mesh, (P("x"),), out_spec)(xs))
        blocks = [vals[:2], vals[2:]]
        summed = (blocks[0] + blocks[1]).tolist()   # numpy wraps as the dtype does
        assert run(lambda b: fa.lax.psum(b, "x"), P()).tolist() == summed, name
        got = run(lambda b: fa.lax.psum_scatter(b, "x", scatter_dimension=1, tiled=True), P(None, "x"))
        assert got.tolist() == summed, name
        assert run(lambda b: fa.lax.all_gather(b, "x", axis=1), P()).tolist() == np.stack(blocks, 1).tolist()
        got = run(lambda b: fa.lax.ppermute(b, "x", [(0, 1), (1, 0)]), P("x"))
        assert got.tolist() == np.concatenate([blocks[1], blocks[0]]).tolist(), name
        got = run(lambda b: fa.lax.all_to_all(b, "x", 1, 0), P("x"))
        want = np.concatenate([np.concatenate([blocks[0][:, i:i + 1], blocks[1][:, i:i + 1]]) for i in range(2)])
        assert got.tolist() == want.tolist(), name
        assert got.dtype == a.dtype


def check_byte_moved_dtypes_with_size_one_and_empty_dims():
    """The dtypes that cross as bytes, in blocks with a size-1 or empty dim (torch keeps any stride there, and
    viewed such a block as bytes only with a last stride of 1: device_get, ppermute and all_to_all raised)."""
    mesh = _mesh()
    for name in ("int16", "uint16", "uint32", "uint64"):
        for shape, spec in (((1, 4), P(None, "x")), ((0, 4), P("x")), ((3, 2, 1), P(None, "x")), ((2, 1), P("x"))):
            want = np.arange(int(np.prod(shape))).reshape(shape).astype(name)
            xs = fa.device_put(fa.asarray(want, device=DEVICE), NamedSharding(mesh, spec))
            assert np.array_equal(np.asarray(fa.device_get(xs)), want), (name, shape)
            got = fa.device_get(fa.shard_map(lambda b: fa.lax.ppermute(b, "x", [(0, 1), (1, 0)]), mesh, (spec,),
                                             spec)(xs))
            halves = np.split(want, 2, axis=spec.index("x"))
            assert np.array_equal(np.asarray(got), np.concatenate(halves[::-1], axis=spec.index("x"))), (name, shape)
        empty = fa.device_put(fa.asarray(np.zeros((0, 4), np.int16), device=DEVICE), NamedSharding(mesh, P("x")))
        assert np.asarray(fa.device_get(empty.astype(name))).shape == (0, 4)


def check_sharding_elementwise_refuses_a_function_that_is_not():
    """fa.sharding.elementwise of a per-block reduction returned a 'global' array of the wrong shape (each
    rank's partial sums); now a ValueError names the block and result shapes."""
    mesh = _mesh()
    s = fa.device_put(fa.asarray(_randn(4, 6, seed=3), device=DEVICE), NamedSharding(mesh, P("x")))
    try:
        fa.sharding.elementwise(lambda t: t.sum(axis=0), s)
    except ValueError as e:
        assert "must be elementwise" in str(e) and "(2, 6)" in str(e) and "(6,)" in str(e), e
    else:
        raise AssertionError("a per-block sum was taken as elementwise")
    _close(fa.device_get(fa.sharding.elementwise(lambda t: fa.exp(t) * 2.0, s)),
           np.exp(np.asarray(fa.device_get(s))) * 2.0, atol=1e-5, what="an elementwise lambda")


def check_psum_of_bool_counts():
    """psum of a bool array counts, in int32 (jax.lax.psum; a backend's bool SUM is a logical OR)."""
    mesh = _mesh()
    b = fa.device_put(fa.asarray(np.array([True, False, True, True]), device=DEVICE), NamedSharding(mesh, P("x")))
    got = fa.device_get(fa.shard_map(lambda v: fa.lax.psum(v, "x"), mesh, P("x"), P())(b))
    assert got.dtype == fa.int32 and got.tolist() == [2, 1], got
    got = fa.device_get(fa.shard_map(lambda v: fa.lax.psum_scatter(v[None], "x", scatter_dimension=1, tiled=True),
                                     mesh, P("x"), P(None, "x"))(b))
    assert got.dtype == fa.int32 and got.tolist() == [[2, 1]], got


def check_vmap_of_collectives():
    """vmap over the rows of each rank's block inside shard_map: the same as the collective on the
    whole block (the batch axis rides along; gather/scatter/split axes move one right)."""
    mesh = _mesh()
    a = _randn(4, 6, seed=13)
    s = fa.device_put(a, NamedSharding(mesh, P("x")))
    an = np.asarray(a)
    blocks = [an[:2], an[2:]]

    def run(f, out_spec):
        return fa.shard_map(fa.vmap(f), mesh, (P("x"),), out_spec)(s)
    _close(run(lambda row: fa.lax.psum(row, "x"), P()), blocks[0] + blocks[1], what="vmap psum")
    _close(run(lambda row: fa.lax.all_gather(row, "x"), P()), np.stack(blocks, 1), what="vmap all_gather")
    y = run(lambda row: fa.lax.psum_scatter(row, "x", scatter_dimension=0, tiled=True), P(None, "x"))
    _close(y, blocks[0] + blocks[1], what="vmap psum_scatter")
    y = run(lambda row: fa.lax.ppermute(row, "x", [(0, 1), (1, 0)]), P("x"))
    _close(y, np.concatenate([blocks[1], blocks[0]]), what="vmap ppermute")
    y = run(lambda row: fa.lax.all_to_all(fa.reshape(row, (2, 3)), "x", 0, 1), P("x"))  # per row (2, 3) -> (1, 6)
    per_rank = fa.shard_map(lambda b: fa.lax.all_to_all(fa.reshape(b, (2, 2, 3)), "x", 1, 2), mesh,
                            (P("x"),), P("x"))(s)
    _close(y, fa.device_get(per_rank), what="vmap all_to_all")


def check_collective_fusion():
    """Elementwise work before and after a collective fuses into one kernel on each side."""
    mesh = _mesh()
    s = fa.device_put(_randn(4, 6, seed=12), NamedSharding(mesh, P("x")))
    y = fa.shard_map(lambda b: fa.exp(fa.lax.psum(b * 2.0 + 1.0, "x")) * 3.0 - 1.0, mesh, (P("x"),), P())(s)
    fa.eval(s.local)
    fa.reset_stats()
    fa.eval(y.local)
    st = fa.stats()
    assert st["library_calls"] == 1 and st["kernels_launched"] - st["library_calls"] == 2, st  # launches count both


# ---- derivatives ---------------------------------------------------------------------------------------
def _grads_close(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        _close(g, w, atol=1e-4, what=f"{what}: gradient {i}")


def _mlp(x, w1, w2):
    return (fa.nn.relu(x @ w1) @ w2 if isinstance(x, fa.Array) else _relu(x @ w1) @ w2)


def _relu(s):
    return fa.sharding.elementwise(fa.nn.relu, s)


def _loss(x, w1, w2):
    y = _mlp(x, w1, w2)
    return (y * y).mean()


def check_grad_data_parallel():
    mesh = _mesh()
    x, w1, w2 = _randn(8, 4, seed=13), _randn(4, 6, seed=14), _randn(6, 3, seed=15)
    want = fa.grad(_loss, argnums=(0, 1, 2))(x, w1, w2)
    args = [fa.device_put(t, NamedSharding(mesh, s)) for t, s in ((x, P("x")), (w1, P()), (w2, P()))]
    got = fa.grad(_loss, argnums=(0, 1, 2))(*args)
    assert got[1].sharding.is_replicated and got[0].sharding == args[0].sharding
    _grads_close(got, want, "data-parallel, propagation")

    def step(xb, w1, w2):  # the same written per shard
        y = fa.nn.relu(xb @ w1) @ w2
        return fa.lax.psum((y * y).sum(), "x") / (8 * 3)
    sm = fa.shard_map(step, mesh, (P("x"), P(), P()), P())
    _grads_close(fa.grad(lambda *a: sm(*a).local, argnums=(0, 1, 2))(*args), want, "data-parallel, shard_map")


def check_grad_tensor_parallel():
    mesh = _mesh()
    x, w1, w2 = _randn(8, 4, seed=16), _randn(4, 6, seed=17), _randn(6, 3, seed=18)
    want = fa.grad(_loss, argnums=(0, 1, 2))(x, w1, w2)
    args = [fa.device_put(t, NamedSharding(mesh, s)) for t, s in ((x, P()), (w1, P(None, "x")), (w2, P("x")))]
    h = _relu(args[0] @ args[1])
    assert h.sharding == NamedSharding(mesh, P(None, "x")) and not (_prims(h) & COLLECTIVES)
    got = fa.grad(_loss, argnums=(0, 1, 2))(*args)
    assert got[1].sharding == args[1].sharding and got[2].sharding == args[2].sharding
    _grads_close(got, want, "tensor-parallel, propagation")

    def step(x, w1, w2):  # Megatron MLP: column-parallel then row-parallel, one psum
        y = fa.lax.psum(fa.nn.relu(x @ w1) @ w2, "x")
        return (y * y).mean()
    sm = fa.shard_map(step, mesh, (P(), P(None, "x"), P("x")), P())
    _grads_close(fa.grad(lambda *a: sm(*a).local, argnums=(0, 1, 2))(*args), want, "tensor-parallel, shard_map")


def check_collective_vjps():
    """psum's VJP is psum; all_gather's is psum_scatter; psum_scatter's all_gather; ppermute's the inverse."""
    mesh = _mesh()
    s = fa.device_put(_randn(4, 6, seed=19), NamedSharding(mesh, P("x")))
    r = torch.distributed.get_rank()
    ct = fa.full((2, 6), float(r + 1), device=DEVICE)
    for f, want_prim in ((lambda b: fa.lax.psum(b, "x"), "all_reduce"),
                         (lambda b: fa.lax.all_gather(b, "x", tiled=True), "reduce_scatter"),
                         (lambda b: fa.lax.ppermute(b, "x", [(0, 1), (1, 0)]), "ppermute")):
        with _Inside(mesh):
            out, pull = fa.vjp(f, s.local)
            (g,) = pull(fa.ones(out.shape, device=DEVICE) * (r + 1))
        assert want_prim in _prims(g), (want_prim, _prims(g))
    with _Inside(mesh):
        out, pull = fa.vjp(lambda b: fa.lax.psum(b, "x"), s.local)
        _close(pull(ct)[0], np.full((2, 6), 3.0), what="psum vjp = psum")
        out, pull = fa.vjp(lambda b: fa.lax.all_gather(b, "x", tiled=True), s.local)
        _close(pull(fa.full((4, 6), float(r + 1), device=DEVICE))[0], np.full((2, 6), 3.0), what="all_gather vjp = psum_scatter")
        out, pull = fa.vjp(lambda b: fa.lax.psum_scatter(b, "x", tiled=True), s.local)
        (g,) = pull(fa.full((1, 6), float(r + 1), device=DEVICE))
        assert "all_gather" in _prims(g)
        _close(g, np.array([[1.0] * 6, [2.0] * 6]), what="psum_scatter vjp = all_gather")


class _Inside:
    """The named-axis context of a shard_map body, for calling fa.lax directly in a test."""

    def __init__(self, mesh):
        from flyarray.shard_map import _inside
        self.cm = _inside(mesh, torch.device(DEVICE))

    def __enter__(self):
        return self.cm.__enter__()

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def check_forward_mode():
    """Collectives are linear: the tangent of psum / all_gather is the same collective of the tangent."""
    mesh = _mesh()
    s = fa.device_put(_randn(4, 6, seed=22), NamedSharding(mesh, P("x")))
    with _Inside(mesh):
        _, t = fa.jvp(lambda b: fa.lax.psum(b * 2.0, "x"), (s.local,), (fa.ones((2, 6), device=DEVICE),))
        _close(t, np.full((2, 6), 4.0), what="psum jvp")
        _, t = fa.jvp(lambda b: fa.lax.all_gather(b, "x", tiled=True), (s.local,), (fa.ones((2, 6), device=DEVICE),))
        _close(t, np.ones((4, 6)), what="all_gather jvp")


def check_forward_mode_through_the_boundaries():
    """fa.jvp / jacfwd through device_put, a replicated operand meeting split work and shard_map's replicated
    inputs and outputs (identities and slices at the boundaries) equals the single-device tangent."""
    mesh = _mesh()
    x, w = _randn(4, 3, seed=40), _randn(3, seed=41)
    xn = np.asarray(x)
    xs = fa.device_put(x, NamedSharding(mesh, P("x")))
    ones3 = fa.ones(3, device=DEVICE)
    _, t = fa.jvp(lambda r: (xs * r).sum().local, (w,), (ones3,))
    _close(t, xn.sum(), atol=1e-4, what="jvp: replicated operand times a split one")
    _, t = fa.jvp(lambda a: fa.device_put(a, NamedSharding(mesh, P("x"))).sum().local, (x,),
                  (fa.ones((4, 3), device=DEVICE),))
    _close(t, 12.0, what="jvp through device_put")
    body = fa.shard_map(lambda b, r: fa.lax.psum((b * r).sum(), "x"), mesh, (P("x"), P()), P())
    _, t = fa.jvp(lambda r: body(xs, r).local, (w,), (ones3,))
    _close(t, xn.sum(), atol=1e-4, what="jvp through shard_map's replicated input and output")
    h = fa.hessian(lambda r: ((xs @ r[:, None]) ** 2).sum().local)(w)
    _close(h, 2 * xn.T @ xn, atol=1e-4, what="hessian through a sharded matmul")


def check_shard_map_closure_under_grad():
    """A value fa.grad differentiates, closed over by a shard_map body, would get each rank's partial
    gradient: refused with what to do; passed as an argument it is right; forward values may be closed over."""
    mesh = _mesh()
    x, w = _randn(4, 2, seed=42), _randn(2, seed=43)
    xs = fa.device_put(x, NamedSharding(mesh, P("x")))
    want = fa.grad(lambda r: ((x * r) ** 2).sum())(w)
    by_arg = fa.grad(lambda r: fa.shard_map(lambda b, rb: fa.lax.psum(((b * rb) ** 2).sum(), "x"), mesh,
                                            (P("x"), P()), P())(xs, r).local)(w)
    _close(by_arg, np.asarray(want), atol=1e-4, what="grad of a replicated argument")
    try:
        fa.grad(lambda r: fa.shard_map(lambda b: fa.lax.psum(((b * r) ** 2).sum(), "x"), mesh, P("x"), P())(xs)
                .local)(w)
    except ValueError as e:
        assert "closes over" in str(e) and "as an argument" in str(e), e
    else:
        raise AssertionError("a differentiated closure was accepted")
    y = fa.shard_map(lambda b: fa.lax.psum((b * w).sum(), "x"), mesh, P("x"), P())(xs)  # no grad: fine
    _close(y, (np.asarray(x) * np.asarray(w)).sum(), atol=1e-4, what="closure without grad")
    g = fa.grad(lambda b0: fa.shard_map(lambda b: fa.lax.psum((b * w).sum(), "x"), mesh, P("x"), P())(
        fa.device_put(b0, NamedSharding(mesh, P("x")))).local)(x)  # w closed over but not differentiated
    _close(g, np.broadcast_to(np.asarray(w), (4, 2)), atol=1e-5, what="grad with a constant closure")
    # closures no derivative flows through (stop_gradient, a mask) or whose boundary sums over the ranks
    # itself (a block of a split array) are allowed, and their gradients are the single-device ones
    for closure, loss in ((lambda r: fa.stop_gradient(r), lambda r, c: ((x * r) ** 2).sum() + (x * c).sum()),
                          (lambda r: r > 0, lambda r, c: ((x * r) ** 2).sum() + fa.where(c, x, 0.0).sum())):
        want = fa.grad(lambda r: loss(r, closure(r)))(w)

        def sharded(r, closure=closure):
            c = closure(r)
            body = fa.shard_map(lambda b, rb: fa.lax.psum(((b * rb) ** 2).sum() + fa.where(c, b, 0.0).sum()
                                                          if c.dtype == fa.bool else
                                                          ((b * rb) ** 2).sum() + (b * c).sum(), "x"),
                                mesh, (P("x"), P()), P())
            return body(xs, r).local
        _close(fa.grad(sharded)(w), np.asarray(want), atol=1e-4, what="grad with a closure no derivative crosses")
    want = fa.grad(lambda v: (x * v * 3.0).sum())(x)

    def through_block(v):
        block = fa.device_put(v * 3.0, NamedSharding(mesh, P("x"))).local  # made outside the body
        return fa.shard_map(lambda b: fa.lax.psum((b * block).sum(), "x"), mesh, P("x"), P())(xs).local
    got = fa.grad(through_block)(x)
    _close(got, np.asarray(want), atol=1e-4, what="grad through a closed-over block of a split array")
    # a replicated value between the closure and what is differentiated: each rank's cotangent would be a part
    # nothing adds up (a sharded reduction's result; another shard_map's replicated output; a block other
    # ranks share, over one axis of a 2-D mesh): refused, not a wrong gradient
    mesh2 = Mesh(("a", "b"), (1, 2))
    xs2 = fa.device_put(x, NamedSharding(mesh2, P("b")))
    for what, body_mesh, data, axis, closure in (
            ("a sharded sum", mesh, xs, "x", lambda r: fa.device_put(x * r, NamedSharding(mesh, P("x"))).sum().local),
            ("a replicated shard_map output", mesh, xs, "x",
             lambda r: fa.shard_map(lambda u: u * 2.0, mesh, P(), P())(r).local),
            ("a block shared along another axis", mesh2, xs2, "b",
             lambda r: fa.device_put(r, NamedSharding(mesh2, P("a"))).local)):
        def closing(r, body_mesh=body_mesh, data=data, axis=axis, closure=closure):
            c = closure(r)
            return fa.shard_map(lambda b: fa.lax.psum((b * c).sum(), axis), body_mesh, P(axis), P())(data).local
        try:
            fa.grad(closing)(w)
        except ValueError as e:
            assert "closes over" in str(e), e
        else:
            raise AssertionError(f"a closure over {what} was accepted")
    # the same closures without a derivative are fine
    _close(fa.shard_map(lambda b: fa.lax.psum((b * fa.device_put(w, NamedSharding(mesh2, P("a"))).local).sum(),
                                              "b"), mesh2, P("b"), P())(xs2),
           (np.asarray(x) * np.asarray(w)).sum(), atol=1e-4, what="a shared block closed over without grad")


def check_sharded_operands_and_errors():
    """Global shapes broadcast (or fail with numpy's message); numpy operands are whole arrays; vmap refuses
    ShardedArrays; shard_map takes one bare spec and dict out_specs; psum over no axes is the identity;
    bad axis names and 0-d tiled gathers fail at the call."""
    mesh = _mesh()
    a = _randn(4, 6, seed=44)
    an = np.asarray(a)
    s = fa.device_put(a, NamedSharding(mesh, P("x")))
    for bad in (fa.ones((2, 6), device=DEVICE), fa.ones((2, 1), device=DEVICE), fa.ones(3, device=DEVICE)):
        try:
            s + bad
        except ValueError as e:
            assert "do not broadcast" in str(e), e
        else:
            raise AssertionError(f"(4, 6) + {bad.shape} was accepted")
    row = np.arange(6, dtype=np.float32)
    _close(s + row, an + row, what="numpy row operand")
    _close(s * an, an * an, what="numpy operand of the global shape")
    _close(fa.sharding.elementwise(fa.exp, a), np.exp(an), atol=1e-5, what="elementwise of plain arrays")
    _close(+s, an, what="+s")
    for call in (lambda: fa.vmap(lambda r: r.sum())(s), lambda: fa.vmap(lambda c: s * c)(fa.arange(4.0))):
        try:
            call()
        except NotImplementedError as e:
            assert "ShardedArray" in str(e), e
        else:
            raise AssertionError("vmap batched a ShardedArray")
    try:
        np.asarray(s)
    except TypeError as e:
        assert "device_get" in str(e)
    else:
        raise AssertionError("np.asarray of a ShardedArray")
    try:
        torch.from_dlpack(s)
    except TypeError as e:   # ours, not torch's "invalid capsule"
        assert "device_get" in str(e), e
    else:
        raise AssertionError("torch.from_dlpack of a ShardedArray")
    rep = fa.device_put(a, NamedSharding(mesh, P(None)))  # replicated, spelled with an entry: vmap takes it
    _close(fa.vmap(lambda r: r.sum())(rep).local, an.sum(axis=1), atol=1e-5, what="vmap over a replicated array")
    y = fa.shard_map(lambda b: b * 2.0, mesh, P("x"), P("x"))(s)
    _close(y, 2 * an, what="a bare in_specs spec")
    out = fa.shard_map(lambda b: {"m": b.sum(axis=0)[None], "t": b}, mesh, P("x"), {"m": P("x"), "t": P("x")})(s)
    _close(out["t"], an, what="dict out_specs")
    with _Inside(mesh):
        b = s.local
        _close(fa.lax.psum(b, ()), np.asarray(b), what="psum over no axes")
        _close(fa.lax.all_gather(b, (), tiled=True), np.asarray(b), what="all_gather over no axes")
        for axes in (0, None, ("x", 1)):
            try:
                fa.lax.psum(b, axes)
            except TypeError as e:
                assert "mesh axes must be" in str(e), e
            else:
                raise AssertionError(f"psum over {axes!r} was accepted")
        try:
            fa.lax.all_gather(fa.ones((), device=DEVICE), "x", tiled=True)
        except ValueError as e:
            assert "0-d" in str(e), e
        else:
            raise AssertionError("a tiled all_gather of a 0-d array was accepted")



def check_sharded_operators_as_arrays():
    """ShardedArray has fa.Array's shifts, and an operand arrays do not take gets Python's own answer:
    ``xs == None`` is False (as ``a == None``), ``xs + "a"`` the usual TypeError (NotImplemented was passed
    on as a shard: "local must be an fa.Array")."""
    mesh = _mesh()
    vals = np.arange(8, dtype=np.int32).reshape(4, 2)
    a = fa.asarray(vals, device=DEVICE)
    xs = fa.device_put(a, NamedSharding(mesh, P("x")))
    assert fa.device_get(xs << 1).tolist() == (vals << 1).tolist()
    assert fa.device_get(xs >> 1).tolist() == (vals >> 1).tolist()
    assert fa.device_get(1 << xs).tolist() == (1 << vals).tolist()
    assert fa.device_get(64 >> xs).tolist() == (64 >> vals).tolist()
    assert (xs == None) is False and (xs != None) is True and (a == None) is False  # noqa: E711
    for bad in ("a", None, [1, 2]):
        for op in (lambda: xs + bad, lambda: bad * xs, lambda: xs < bad, lambda: xs << bad, lambda: xs @ bad):
            try:
                op()
            except TypeError as e:
                assert "ShardedArray: local" not in str(e), e   # Python's message, not a shard's
            else:
                raise AssertionError(f"an operation with {bad!r} was accepted")


def check_two_d_mesh():
    """A (1, 2) mesh: collectives over one axis, the other (one rank per group), and both; DP x TP grads."""
    mesh = Mesh(("dp", "tp"), (1, 2))
    a = _randn(4, 6, seed=23)
    s = fa.device_put(a, NamedSharding(mesh, P("dp", "tp")))
    an = np.asarray(a)
    for axes, want in (("tp", an[:, :3] + an[:, 3:]), ("dp", None), (("dp", "tp"), an[:, :3] + an[:, 3:])):
        y = fa.shard_map(lambda b: fa.lax.psum(b, axes), mesh, (P("dp", "tp"),), P("dp", "tp"))(s)
        if want is None:  # a group of one rank: psum is the identity
            _close(y, an, what="psum over a size-1 axis")
        else:
            _close(fa.device_get(y)[:, :3], want, what=f"psum over {axes}")
    with _Inside(mesh):
        local = s.local + 0
        gathered = fa.lax.all_gather(local, "dp", tiled=True)
        assert gathered.torch().data_ptr() != local.torch().data_ptr(), "a one-rank all_gather aliased its input"
    try:
        NamedSharding(mesh, P(("tp", "dp")))
    except ValueError as e:
        assert "mesh's order" in str(e)
    else:
        raise AssertionError("axes out of the mesh's order were accepted")
    x, w1, w2 = _randn(8, 4, seed=24), _randn(4, 6, seed=25), _randn(6, 3, seed=26)
    want = fa.grad(_loss, argnums=(0, 1, 2))(x, w1, w2)
    args = [fa.device_put(t, NamedSharding(mesh, sp)) for t, sp in ((x, P("dp")), (w1, P(None, "tp")), (w2, P("tp")))]
    _grads_close(fa.grad(_loss, argnums=(0, 1, 2))(*args), want, "2-D mesh, DP x TP")


class Skip(Exception):
    """A check that does not apply to this job (recorded as "skip: why")."""


def check_mesh_2x2():
    """A 2 x 2 mesh (4 processes: its own job): row and column groups, DP x TP gradients."""
    if torch.distributed.get_world_size() != 4:
        raise Skip("needs 4 processes (test_distributed.py runs it as its own job)")
    mesh = Mesh(("dp", "tp"), (2, 2))
    a = _randn(4, 6, seed=27)
    an = np.asarray(a)
    s = fa.device_put(a, NamedSharding(mesh, P("dp", "tp")))
    y = fa.shard_map(lambda b: fa.lax.psum(b, "tp"), mesh, (P("dp", "tp"),), P("dp"))(s)
    _close(y, an[:, :3] + an[:, 3:], what="psum over tp")
    y = fa.shard_map(lambda b: fa.lax.all_gather(b, "dp", tiled=True), mesh, (P("dp", "tp"),), P(None, "tp"))(s)
    _close(y, an, what="all_gather over dp")
    y = fa.shard_map(lambda b: fa.lax.psum(b, ("dp", "tp")), mesh, (P("dp", "tp"),), P())(s)
    _close(y, an[:2, :3] + an[:2, 3:] + an[2:, :3] + an[2:, 3:], what="psum over both")
    _close(s.sum(axis=0), an.sum(axis=0), atol=1e-4, what="sum over dp")
    rank = float(torch.distributed.get_rank())

    def tp_major(b):  # collectives over ("tp", "dp"), out of the mesh's order: indexed as axis_index is
        idx = fa.lax.axis_index(("tp", "dp")).astype(fa.float32)
        mine = fa.full((1,), rank, device=DEVICE)
        gathered = fa.lax.all_gather(mine, ("tp", "dp"), tiled=True)
        blocks = fa.lax.psum_scatter(fa.arange(4.0, device=DEVICE) * 10 + rank, ("tp", "dp"), tiled=True)
        swapped = fa.lax.all_to_all(fa.arange(4.0, device=DEVICE) + 10 * rank, ("tp", "dp"), 0, 0)
        return fa.concat([gathered, fa.reshape(idx, (1,)), blocks, swapped])[None]
    out = np.asarray(fa.device_get(fa.shard_map(tp_major, mesh, P(), P(("dp", "tp")))(fa.zeros(1, device=DEVICE))))
    index_of = {r: int(out[r, 4]) for r in range(4)}
    rank_at = {i: r for r, i in index_of.items()}
    assert sorted(index_of.values()) == [0, 1, 2, 3], out
    for r in range(4):
        i = index_of[r]
        assert list(out[r, :4]) == [rank_at[k] for k in range(4)], ("all_gather order", out)
        assert out[r, 5] == 10 * i * 4 + 6, ("psum_scatter keeps the block of the index", out)
        assert list(out[r, 6:]) == [i + 10 * rank_at[k] for k in range(4)], ("all_to_all order", out)
    x, w1, w2 = _randn(8, 4, seed=28), _randn(4, 6, seed=29), _randn(6, 3, seed=30)
    want = fa.grad(_loss, argnums=(0, 1, 2))(x, w1, w2)
    args = [fa.device_put(t, NamedSharding(mesh, sp)) for t, sp in ((x, P("dp")), (w1, P(None, "tp")), (w2, P("tp")))]
    _grads_close(fa.grad(_loss, argnums=(0, 1, 2))(*args), want, "2 x 2 mesh, DP x TP")


# ---- fa.jit ----------------------------------------------------------------------------------------------
def check_jit():
    mesh = _mesh()
    sh = NamedSharding(mesh, P("x"))

    @fa.jit
    def f(a, b):
        return (a * b + 1.0).sum(axis=0)  # local work and an all-reduce, replayed

    sm = fa.jit(fa.shard_map(lambda b: fa.lax.all_gather(fa.exp(b), "x", tiled=True), mesh, (P("x"),), P()))
    for seed in (20, 21):
        a, b = _randn(4, 6, seed=seed), _randn(4, 6, seed=seed + 10)
        y = f(fa.device_put(a, sh), fa.device_put(b, sh))
        assert isinstance(y, fa.sharding.ShardedArray) and y.sharding.is_replicated
        _close(y, (a * b + 1.0).sum(axis=0), what="jit propagation")
        _close(sm(fa.device_put(a, sh)), fa.exp(a), what="jit shard_map")


def check_jit_grad():
    mesh = _mesh()
    step = fa.jit(fa.grad(_loss, argnums=(1, 2)))
    for seed in (30, 31):
        x, w1, w2 = _randn(8, 4, seed=seed), _randn(4, 6, seed=seed + 1), _randn(6, 3, seed=seed + 2)
        want = fa.grad(_loss, argnums=(1, 2))(x, w1, w2)
        args = [fa.device_put(t, NamedSharding(mesh, s)) for t, s in ((x, P("x")), (w1, P(None, "x")), (w2, P("x")))]
        _grads_close(step(*args), want, "jit(grad) through a gather (one mesh axis on M and N)")


CHECKS = [name for name in list(globals()) if name.startswith("check_")]


def main():
    global DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default="", help="comma-separated check names (default: all)")
    args = ap.parse_args()
    DEVICE = args.device
    rank = int(os.environ["RANK"])
    cuda = DEVICE == "cuda"
    if cuda:  # one GPU per rank; arrays made here name it (fa's default device "cuda" is another device)
        DEVICE = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(DEVICE)
    torch.distributed.init_process_group("nccl" if cuda else "gloo",
                                         timeout=datetime.timedelta(seconds=60))
    results = {}
    for name in CHECKS:
        if args.only and name not in args.only.split(","):
            continue
        try:
            globals()[name]()
            results[name] = "ok"
        except Skip as why:
            results[name] = f"skip: {why}"
        except Exception:
            results[name] = traceback.format_exc()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    torch.distributed.destroy_process_group()
    return 0 if all(v == "ok" or v.startswith("skip: ") for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
