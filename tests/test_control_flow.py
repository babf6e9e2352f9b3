"""fa.lax.cond / switch / fori_loop / while_loop / scan / map against Python loops in float64, under fa.jit,
fa.vmap and fa.grad, with the type checks JAX makes, and the scheduler's work on a recorded loop."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import flyarray as fa
from flyarray import plan, schedule

from .conftest import scaled

L = fa.lax
rng = np.random.default_rng(7)
X = rng.uniform(-1, 1, (6,)).astype(np.float32)



def _close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


# --- cond and switch ---

@pytest.mark.parametrize("p", [True, False])
def test_cond_picks_a_branch_with_a_value_and_under_jit_and_vmap(backend, p):
    x = fa.asarray(X)
    branches = (lambda a, s: a * s, lambda a, s: a - s)
    want = X * 2.0 if p else X - 2.0
    _close(L.cond(p, *branches, x, 2.0), want)
    _close(L.cond(fa.asarray(p), *branches, x, 2.0), want)
    traced = fa.jit(lambda q, a: L.cond(q, *branches, a, 2.0))
    _close(traced(fa.asarray(p), x), want)
    _close(traced(fa.asarray(not p), x), X * 2.0 if not p else X - 2.0)   # the same trace, the other branch
    ps = fa.asarray([p, not p, p])
    got = fa.vmap(lambda q, a: L.cond(q, *branches, a, 2.0))(ps, fa.stack([x, x, x]))
    _close(got, np.stack([want, X * 2.0 if not p else X - 2.0, want]))


def test_cond_records_both_branches_but_computes_one_with_a_value():
    fa.set_backend("reference")
    try:
        x = fa.asarray(X)
        fa.reset_stats()
        y = L.cond(x.sum() > 100, lambda a: fa.exp(a) * 3, lambda a: a + 1, x)
        launched = fa.stats()["kernels_launched"]   # the predicate's own evaluation
        _close(y, X + 1.0)
        assert fa.stats()["kernels_launched"] == launched + 1   # the taken branch: one kernel
    finally:
        fa.set_backend(None)


def test_cond_grad_with_a_value_and_under_vmap():
    def f(q, a):
        return L.cond(q > 0, lambda v: (v * v).sum(), lambda v: fa.sin(v).sum(), a)
    x = fa.asarray(X)
    _close(fa.grad(f, argnums=1)(fa.asarray(1.0), x), 2.0 * X)
    _close(fa.grad(f, argnums=1)(fa.asarray(-1.0), x), np.cos(X))
    got = fa.vmap(fa.grad(f, argnums=1))(fa.asarray([1.0, -1.0]), fa.stack([x, x]))
    _close(got, np.stack([2.0 * X, np.cos(X)]))


@pytest.mark.parametrize("index", [-3, 0, 1, 2, 7])
def test_switch_clamps_the_index_as_jax_does(backend, index):
    x = fa.asarray(X)
    branches = [lambda a: a + 1, lambda a: a * 10, lambda a: -a]
    want = [X + 1.0, X * 10.0, -X][min(max(index, 0), 2)]
    _close(L.switch(index, branches, x), want)
    _close(L.switch(fa.asarray(index), branches, x), want)
    _close(fa.jit(lambda i, a: L.switch(i, branches, a))(fa.asarray(index), x), want)
    got = fa.vmap(lambda i, a: L.switch(i, branches, a), in_axes=(0, None))(fa.asarray([index, 1]), x)
    _close(got, np.stack([want, X * 10.0]))


def test_branches_must_return_the_same_types():
    x = fa.asarray(X)
    with pytest.raises(TypeError, match="false_fun's output, leaf 0, is fa.float64\\[6\\] where true_fun's output "
                                        "has fa.float32\\[6\\]"):
        L.cond(True, lambda a: a, lambda a: a.astype(fa.float64), x)
    with pytest.raises(TypeError, match="false_fun's output has the structure"):
        L.cond(True, lambda a: (a, a), lambda a: a, x)
    with pytest.raises(TypeError, match="branches\\[1\\]'s output, leaf 0, is fa.float32\\[3\\]"):
        L.switch(0, [lambda a: a, lambda a: a[:3]], x)
    with pytest.raises(TypeError, match="pred must be a bool or real scalar \\(a Python number or an array of shape "
                                        "\\(\\)\\), got fa.float32 of shape \\(6,\\)"):
        L.cond(x, lambda: 1, lambda: 2)
    with pytest.raises(TypeError, match="index must be an integer scalar"):
        L.switch(fa.asarray(1.0), [lambda: 1], )
    with pytest.raises(TypeError, match="true_fun must be a function"):
        L.cond(True, 1, lambda: 2)
    with pytest.raises(TypeError, match="branches must be a non-empty list"):
        L.switch(0, [])


# --- loops ---

def test_fori_loop_matches_the_python_loop_and_passes_i_as_an_int(backend):
    xs = fa.asarray(np.arange(12, dtype=np.float32).reshape(4, 3))
    seen = []

    def body(i, carry):
        seen.append(type(i))
        return carry * 0.5 + xs[i]          # xs[i]: a static slice

    got = L.fori_loop(1, 4, body, fa.zeros(3))
    want = np.zeros(3)
    for i in range(1, 4):
        want = want * 0.5 + np.arange(12.0).reshape(4, 3)[i]
    _close(got, want)
    assert set(seen) == {int}
    _close(L.fori_loop(3, 1, body, fa.ones(3)), np.ones(3))       # no iteration
    _close(L.fori_loop(fa.asarray(0), fa.asarray(2), lambda i, c: c + i, 0.0), 1.0)   # bounds with values
    _close(fa.jit(lambda a: L.fori_loop(0, 5, lambda i, c: c * a, fa.ones(3)))(fa.asarray(X[:3])), X[:3] ** 5)


def test_while_loop_runs_until_the_predicate_fails(backend):
    got = L.while_loop(lambda c: c[1] < 10, lambda c: (c[0] * 2.0, c[1] + 1), (fa.asarray(1.0), 0))
    _close(got[0], 1024.0)
    assert int(got[1]) == 10 and got[1].dtype == fa.int64
    _close(L.while_loop(lambda c: False, lambda c: c + 1, fa.asarray(X)), X)


def test_loops_differentiate_through_their_iterations():
    x = fa.asarray(X)
    g = fa.grad(lambda a: L.fori_loop(0, 3, lambda i, v: fa.sin(v), a).sum())(x)
    _close(g, np.cos(np.sin(np.sin(X.astype(np.float64)))) * np.cos(np.sin(X.astype(np.float64))) * np.cos(X))
    g = fa.grad(lambda a: L.while_loop(lambda c: c[1] < 4, lambda c: (c[0] * a, c[1] + 1), (1.0, 0))[0])(
        fa.asarray(1.5))
    _close(g, 4 * 1.5 ** 3)
    _, tangent = fa.jvp(lambda a: L.fori_loop(0, 4, lambda i, v: v * v, a), (x,), (fa.ones(6),))
    _close(tangent, 16.0 * X.astype(np.float64) ** 15, rtol=1e-4)


def test_a_loop_without_a_trip_count_while_tracing_is_refused_by_name():
    x = fa.asarray(X)
    with pytest.raises(fa.ConcretizationError, match="fa.lax.while_loop: cond_fun's result depends on fa.jit's"):
        fa.jit(lambda a: L.while_loop(lambda v: v.sum() < 10, lambda v: v + 1, a))(x)
    with pytest.raises(fa.ConcretizationError, match="fa.lax.while_loop"):
        fa.vmap(lambda a: L.while_loop(lambda v: v < 10, lambda v: v + 1, a))(x)
    with pytest.raises(fa.ConcretizationError, match="fa.lax.fori_loop: upper depends on"):
        fa.jit(lambda n, a: L.fori_loop(0, n, lambda i, v: v + 1, a))(fa.asarray(3), x)
    # a static bound is fine
    _close(fa.jit(lambda n, a: L.fori_loop(0, n, lambda i, v: v + 1, a), static_argnums=0)(3, x), X + 3.0)


def test_the_carry_keeps_its_types():
    x = fa.asarray(X)
    with pytest.raises(TypeError, match="body_fun's output, leaf 0, is fa.float64\\[6\\] where the carry has "
                                        "fa.float32\\[6\\]"):
        L.fori_loop(0, 2, lambda i, v: v.astype(fa.float64), x)
    with pytest.raises(TypeError, match="body_fun returned the structure"):
        L.fori_loop(0, 2, lambda i, v: (v, v), x)
    with pytest.raises(TypeError, match="body_fun's output, leaf 0, is fa.float32\\[\\] where the carry has "
                                        "fa.int64\\[\\]"):
        L.fori_loop(0, 2, lambda i, v: v * 0.5, 1)
    # Python numbers take the carry's dtype (JAX's weak types)
    assert L.fori_loop(0, 2, lambda i, v: 0.0, fa.asarray(1.0)).dtype == fa.float32
    with pytest.raises(TypeError, match="cond_fun must return a bool or a bool array of shape \\(\\), got fa.bool of "
                                        "shape \\(6,\\)"):
        L.while_loop(lambda v: v > 0, lambda v: v - 1, x)
    with pytest.raises(ValueError, match="unroll must be a positive int"):
        L.fori_loop(0, 2, lambda i, v: v, x, unroll=0)


# --- scan and map ---

def _scan_numpy(xs, init, reverse):
    carry, ys = init, [None] * len(xs)
    for i in (reversed(range(len(xs))) if reverse else range(len(xs))):
        ys[i] = carry * xs[i]
        carry = carry * 0.9 + xs[i]
    return carry, np.stack(ys) if len(xs) else np.zeros((0,) + np.shape(init))


def _body(carry, x):
    return carry * 0.9 + x, carry * x


@settings(max_examples=scaled(15))
@given(n=st.integers(0, 7), width=st.integers(1, 4), reverse=st.booleans())
def test_scan_matches_the_python_loop(n, width, reverse):
    xs = np.random.default_rng(n * 10 + width).uniform(-1, 1, (n, width)).astype(np.float32)
    init = np.linspace(-1, 1, width).astype(np.float32)
    carry, ys = L.scan(_body, fa.asarray(init), fa.asarray(xs), reverse=reverse)
    want_carry, want_ys = _scan_numpy(xs.astype(np.float64), init.astype(np.float64), reverse)
    _close(carry, want_carry)
    assert ys.shape == (n, width) and ys.dtype == fa.float32
    _close(ys, want_ys)


def test_scan_over_pytrees_with_no_xs_and_no_ys(backend):
    xs = {"a": fa.asarray(X.reshape(3, 2)), "b": fa.asarray(np.arange(3, dtype=np.int64))}
    carry, ys = L.scan(lambda c, x: ((c[0] + x["a"].sum(), c[1] + x["b"]), {"s": x["a"] * c[0], "n": None}),
                       (fa.asarray(0.0), 0), xs)
    _close(carry[0], X.astype(np.float64).sum(), rtol=1e-5)
    assert int(carry[1]) == 3
    assert ys["n"] is None and ys["s"].shape == (3, 2)
    carry, ys = L.scan(lambda c, _: (c * 2.0, c), fa.asarray(1.0), None, length=4)
    _close(carry, 16.0)
    _close(ys, [1.0, 2.0, 4.0, 8.0])
    _close(L.map(lambda r: r.sum(), fa.asarray(X.reshape(3, 2))), X.astype(np.float64).reshape(3, 2).sum(1))


def test_scan_under_jit_vmap_and_grad():
    xs = fa.asarray(X.reshape(3, 2))
    f = fa.jit(lambda init, xs: L.scan(_body, init, xs))
    for scale in (1.0, -2.0):
        carry, ys = f(fa.asarray([scale, 1.0]), xs * scale)
        want_carry, want_ys = _scan_numpy(X.reshape(3, 2).astype(np.float64) * scale, np.array([scale, 1.0]), False)
        _close(carry, want_carry)
        _close(ys, want_ys)
    inits = fa.asarray(np.array([[1.0, 2.0], [3.0, -1.0]], dtype=np.float32))
    carries, ys = fa.vmap(lambda i: L.scan(_body, i, xs))(inits)
    for k in range(2):
        want_carry, want_ys = _scan_numpy(X.reshape(3, 2).astype(np.float64), np.asarray(inits)[k].astype(np.float64),
                                          False)
        _close(carries[k], want_carry)
        _close(ys[k], want_ys)
    # d/dx of the product of x's entries, scanned: prod / x
    v = fa.asarray(np.array([1.5, -2.0, 0.5, 3.0], dtype=np.float32))
    g = fa.grad(lambda a: L.scan(lambda c, e: (c * e, None), 1.0, a)[0])(v)
    _close(g, np.prod(np.asarray(v, dtype=np.float64)) / np.asarray(v, dtype=np.float64))


def test_scan_checks_its_arguments():
    x = fa.asarray(X)
    with pytest.raises(ValueError, match="one leading length \\(leaf 0: \\(6,\\), leaf 1: \\(2,\\)\\)"):
        L.scan(lambda c, a: (c, a), 0.0, [x, x[:2]])
    with pytest.raises(ValueError, match="one leading length \\(leaf 0: \\(6,\\); length=4\\)"):
        L.scan(lambda c, a: (c, a), 0.0, x, length=4)
    with pytest.raises(ValueError, match="with no xs, pass length"):
        L.scan(lambda c, a: (c, a), 0.0, None)
    with pytest.raises(ValueError, match="xs leaf 0 is a scalar"):
        L.scan(lambda c, a: (c, a), 0.0, fa.asarray(1.0))
    with pytest.raises(TypeError, match="f must return a pair \\(carry, y\\), got Array"):
        L.scan(lambda c, a: c, 0.0, x)
    with pytest.raises(TypeError, match="step 1's y, leaf 0, is fa.float32\\[2\\] where the first step's y has "
                                        "fa.float32\\[1\\]"):
        L.scan(lambda c, a: (c + 1, x[: int(c) + 1]), 0, None, length=2)
    with pytest.raises(TypeError, match="xs leaf 0 must be an array"):
        L.scan(lambda c, a: (c, a), 0.0, ["no"])
    with pytest.raises(TypeError, match="reverse must be True or False"):
        L.scan(lambda c, a: (c, a), 0.0, x, reverse="yes")


def test_an_empty_scan_still_gives_typed_ys():
    carry, ys = L.scan(lambda c, a: (c + a.sum(), (a * 2, a.sum().astype(fa.int32))), fa.asarray(1.0), fa.zeros((0, 3)))
    _close(carry, 1.0)
    assert ys[0].shape == (0, 3) and ys[0].dtype == fa.float32
    assert ys[1].shape == (0,) and ys[1].dtype == fa.int32


def test_a_recorded_loop_schedules_in_linear_work():
    """A scan's carry feeds the next step and that step's y, so the kernel writing y_i recomputed every step
    before it: a 1000-step scan made 1000 distinct kernels, 500,000 ops, 203 s in the interpreter. A value read
    twice that lies deeper than schedule.MAX_RECOMPUTED_DEPTH fused ops is stored instead: the ops grow
    linearly with the steps, and the kernels stay few distinct ones."""
    ops = {}
    for n in (100, 400):
        carry, ys = L.scan(lambda c, a: (c * 0.5 + a, c), fa.zeros(4), fa.ones((n, 4)))
        steps = schedule.schedule(plan.unrealized_bases([carry, ys]))
        kernels = [s.kernel for s in steps if isinstance(s, schedule.KernelStep)]
        ops[n] = sum(len(k.ops) for k in kernels)
        assert max(len(k.ops) for k in kernels) <= 3 * schedule.MAX_RECOMPUTED_DEPTH
    assert ops[400] < 4.5 * ops[100], ops
    fa.set_backend("reference")
    try:
        carry, ys = L.scan(lambda c, a: (c * 0.5 + a, c), fa.zeros(4), fa.ones((300, 4)))
        _close(ys[-1], np.full(4, 2.0 - 2.0 ** -298))
        _close(carry, np.full(4, 2.0))
    finally:
        fa.set_backend(None)


# --- dynamic slicing ---

def _clamped(starts, shape, sizes):
    """JAX's rule (allow_negative_indices=True): a negative start counts from the end, then clamps."""
    return [min(max(s + n if s < 0 else s, 0), n - k) for s, n, k in zip(starts, shape, sizes)]


@settings(max_examples=scaled(15))
@given(starts=st.tuples(st.integers(-7, 9), st.integers(-7, 9)), sizes=st.tuples(st.integers(0, 5), st.integers(0, 6)),
       arrays=st.sampled_from(["ints", "arrays", "mixed"]))
def test_dynamic_slice_and_update_clamp_their_starts_as_jax(starts, sizes, arrays):
    a = np.arange(30.0).reshape(5, 6)
    given_starts = [fa.asarray(s) if arrays == "arrays" or (arrays == "mixed" and i == 0) else s
                    for i, s in enumerate(starts)]
    at = _clamped(starts, a.shape, sizes)
    window = tuple(slice(s, s + k) for s, k in zip(at, sizes))
    got = L.dynamic_slice(fa.asarray(a), given_starts, sizes)
    np.testing.assert_array_equal(np.asarray(got), a[window])
    update = -1.0 - np.arange(np.prod(sizes)).reshape(sizes)
    want = a.copy()
    want[window] = update
    np.testing.assert_array_equal(np.asarray(L.dynamic_update_slice(fa.asarray(a), fa.asarray(update), given_starts)),
                                  want)


def test_dynamic_slices_under_jit_vmap_and_grad():
    a = np.arange(30.0).reshape(5, 6)
    x = fa.asarray(a)
    f = fa.jit(lambda i, v: L.dynamic_slice(v, (i, 1), (2, 3)))
    for i in (0, 2, 7, -1, -2, -9):           # one trace, every start (wrapped, clamped) at replay
        at = _clamped([i], (5,), (2,))[0]
        np.testing.assert_array_equal(np.asarray(f(fa.asarray(i), x)), a[at:at + 2, 1:4])
    rows = fa.vmap(lambda i: L.dynamic_index_in_dim(x, i, keepdims=False))(fa.asarray([4, 0, 9]))
    np.testing.assert_array_equal(np.asarray(rows), a[[4, 0, 4]])
    g = fa.grad(lambda v: (L.dynamic_slice(v, (fa.asarray(1), 2), (2, 2)) ** 2).sum())(x)
    want = np.zeros_like(a)
    want[1:3, 2:4] = 2 * a[1:3, 2:4]
    np.testing.assert_array_equal(np.asarray(g), want)
    np.testing.assert_array_equal(np.asarray(L.dynamic_update_index_in_dim(x, fa.zeros(6, dtype=fa.float64), 7, 0))[4],
                                  np.zeros(6))
    np.testing.assert_array_equal(np.asarray(L.dynamic_slice_in_dim(x, fa.asarray(5), 2, axis=1)), a[:, 4:6])
    # a window moved along a fori_loop: its sum over every start
    total = L.fori_loop(0, 4, lambda i, c: c + L.dynamic_slice_in_dim(x, i, 2).sum(), fa.asarray(0.0, dtype=fa.float64))
    assert float(total) == sum(a[i:i + 2].sum() for i in range(4))


def test_dynamic_slicing_checks_its_arguments():
    x = fa.ones((5, 6))
    with pytest.raises(ValueError, match="dynamic_slice: start_indices has 1 entries; operand has rank 2"):
        L.dynamic_slice(x, (0,), (2, 3))
    with pytest.raises(ValueError, match="slice_sizes\\[0\\] = 6 is outside \\[0, 5\\]"):
        L.dynamic_slice(x, (0, 0), (6, 3))
    with pytest.raises(TypeError, match="start_indices\\[0\\] must be an int or an integer scalar array, got "
                                        "fa.float32 of shape \\(\\)"):
        L.dynamic_slice(x, (fa.asarray(0.5), 0), (2, 3))
    with pytest.raises(ValueError, match="update of shape \\(6, 1\\) does not fit in operand of shape \\(5, 6\\)"):
        L.dynamic_update_slice(x, fa.zeros((6, 1)), (0, 0))
    with pytest.raises(TypeError, match="slice_sizes\\[1\\] must be an int, got 3.0 of type float"):
        L.dynamic_slice(x, (0, 0), (2, 3.0))
    with pytest.raises(TypeError, match="update is fa.float32 and operand fa.int64; cast the update first"):
        L.dynamic_update_slice(fa.zeros((3,), dtype=fa.int64), fa.asarray([2.7]), (0,))


def test_dynamic_starts_of_every_integer_kind():
    """Found by fuzzing against jax.lax: negative starts clamped to 0 where JAX (allow_negative_indices) counts
    them from the end, and a uint64 start past 2^63 wrapped to a negative int64 (so to 0)."""
    x = fa.asarray(np.arange(4.0, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(L.dynamic_slice(x, [-1], [2])), [2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(L.dynamic_slice(x, [fa.asarray(-3, dtype=fa.int32)], [2])), [1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(L.dynamic_index_in_dim(x, -1)), [3.0])
    np.testing.assert_array_equal(np.asarray(L.dynamic_update_slice(x, fa.asarray([9.0]), [-1])), [0, 1, 2, 9])
    np.testing.assert_array_equal(np.asarray(L.dynamic_slice(x, [fa.asarray(2**63 + 5, dtype=fa.uint64)], [2])),
                                  [2.0, 3.0])
    np.testing.assert_array_equal(np.asarray(L.dynamic_slice(x, np.array([1]), [2])), [1.0, 2.0])


# --- found by fuzzing against jax.lax (each test names what was wrong) ---

def test_loops_that_read_a_value_each_step_start_from_the_last_step(monkeypatch):
    """while_loop's predicate, and a valued cond's inside a scan, were evaluated alone: each step recomputed the
    carry's whole history (600 steps: 8.3 s, 4x per doubling). The carry is now computed with the predicate, so
    each step runs the same small plan (the scan's reads another slice of xs a step: a plan of its own, as small)."""
    from flyarray import plan as plan_module
    sizes = []
    original = plan_module.schedule
    monkeypatch.setattr(plan_module, "schedule", lambda roots: sizes.append(len(list(plan_module.upstream(roots))))
                        or original(roots))
    fa.set_backend("reference")
    try:
        for n in (40, 80):
            fa.reset_stats()
            k, v = L.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 0.5 + 1.0), (fa.asarray(0), fa.ones(4)))
            assert int(k) == n
            assert fa.stats()["plan_misses"] <= 3, fa.stats()
            fa.reset_stats()
            c, _ = L.scan(lambda c, x: (L.cond(c.sum() > 0, lambda u: u * 0.5 + x, lambda u: u + 1.0, c), None),
                          fa.ones(4), fa.ones((n, 4)))
            _close(c, np.full(4, 2.0 - 0.5 ** n))
            assert max(sizes) < 20, max(sizes)   # the nodes one evaluation walks: not the history
            sizes.clear()
    finally:
        fa.set_backend(None)


def test_a_loop_body_is_checked_even_when_no_iteration_runs():
    x = fa.asarray(X[:3])
    with pytest.raises(TypeError, match="body_fun returned the structure"):
        L.while_loop(lambda c: False, lambda c: {"b": c["a"]}, {"a": x})
    with pytest.raises(TypeError, match="body_fun's output, leaf 0, is fa.float32\\[2\\]"):
        L.fori_loop(0, 0, lambda i, c: c[:2], x)
    with pytest.raises(TypeError, match="is fa.float64\\[3\\] where the carry has fa.float32\\[3\\]"):
        L.fori_loop(3, 1, lambda i, c: c.astype(fa.float64), x)
    fa.set_backend("reference")
    try:   # and before the first predicate is evaluated
        fa.reset_stats()
        with pytest.raises(TypeError, match="body_fun returned the structure"):
            L.while_loop(lambda c: c["a"].sum() > 0, lambda c: {"b": c["a"]}, {"a": x})
        assert fa.stats()["kernels_launched"] == 0
    finally:
        fa.set_backend(None)


def test_predicates_indices_and_carries_take_jax_types():
    with pytest.raises(TypeError, match="cond_fun must return a bool or a bool array of shape \\(\\), got fa.int64"):
        L.while_loop(lambda c: c, lambda c: c - 1, 3)
    with pytest.raises(TypeError, match="cond_fun must return a bool or a bool array of shape \\(\\), got float"):
        L.while_loop(lambda c: 0.5, lambda c: c, 3)
    with pytest.raises(TypeError, match="switch: index must be an integer scalar .*, got fa.bool"):
        L.switch(fa.asarray(True), [lambda: 10, lambda: 20])
    with pytest.raises(TypeError, match="switch: index must be an integer scalar .*, got a bool"):
        L.switch(True, [lambda: 10, lambda: 20])
    with pytest.raises(TypeError, match="lower must be an integer scalar .*, got float 0.0"):
        L.fori_loop(0.0, 3, lambda i, c: c, 1)
    with pytest.raises(TypeError, match="cond: pred must be a bool or real scalar .*, got NoneType"):
        L.cond(None, lambda: 1, lambda: 2)
    with pytest.raises(TypeError, match="f's output, leaf 0, is fa.bool\\[\\] where the carry has fa.float32\\[\\]"):
        L.scan(lambda c, x: (True, None), fa.asarray(1.0), None, length=2)
    with pytest.raises(OverflowError, match="fa.lax.fori_loop: body_fun's output does not fit the carry"):
        L.fori_loop(0, 1, lambda i, c: -1, fa.asarray(3, dtype=fa.uint8))
    with pytest.raises(ValueError, match="fa.lax.map: xs holds no arrays"):
        L.map(lambda x: x, None)
    carry, ys = L.scan(lambda c, x: [c + x, c], fa.asarray(0.0), fa.ones(3), length=np.int64(3))
    _close(carry, 3.0)
    _close(ys, [0.0, 1.0, 2.0])


def test_select_neither_broadcasts_nor_promotes():
    a, b = fa.asarray(X), fa.asarray(-X)
    mask = fa.asarray(X > 0)
    _close(L.select(mask, a, b), np.abs(X))
    _close(L.select(fa.asarray(False), a, b), -X)
    with pytest.raises(TypeError, match="on_true is fa.float32\\[6\\] and on_false fa.float64\\[6\\]"):
        L.select(mask, a, b.astype(fa.float64))
    with pytest.raises(TypeError, match="pred must be a bool array of shape \\(\\) or \\(6,\\), got fa.float32\\[6\\]"):
        L.select(a, a, b)
    g = fa.grad(lambda v: (L.select(mask, v, L.stop_gradient(v)) * v).sum())(a)
    _close(g, np.where(X > 0, 2 * X, X))
