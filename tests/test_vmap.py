"""fa.vmap against the stacked Python loop (np.stack of f(x[i])), torch.func, and kernel counts."""
import collections

import numpy as np
import pytest
import torch

import flyarray as fa

rng = np.random.default_rng(0)
X = rng.uniform(-2, 2, (5, 3, 4)).astype(np.float32)
Y = rng.uniform(-2, 2, (5, 3, 4)).astype(np.float32)
W = rng.uniform(-1, 1, (4, 6)).astype(np.float32)


def _loop(f, *xs, in_axes=0):
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(xs)
    n = next(x.shape[a] for x, a in zip(xs, axes) if a is not None)
    outs = [f(*[fa.asarray(x if a is None else np.take(x, i, axis=a)) for x, a in zip(xs, axes)]) for i in range(n)]
    return np.stack([np.asarray(o) for o in outs])


def _check(f, *xs, in_axes=0, rtol=2e-5, atol=1e-5):
    got = fa.vmap(f, in_axes=in_axes)(*[fa.asarray(x) for x in xs])
    np.testing.assert_allclose(np.asarray(got), _loop(f, *xs, in_axes=in_axes), rtol=rtol, atol=atol)


@pytest.mark.parametrize("f", [
    lambda a: fa.exp(fa.sin(a) * 2.0 + 1.0),
    lambda a: fa.where(a > 0, a, -a * 0.5).astype(fa.float64),
    # made where the batched input lives (numpy inputs are CPU arrays; creation defaults to the GPU on one)
    lambda a: a * fa.arange(4, dtype=fa.float32, device=a.device) + fa.ones((3, 4), device=a.device),
    lambda a: fa.maximum(a, 0.25) - fa.asarray(W[:, :4][:3]),
], ids=["unary_chain", "where_astype", "iota_constant", "closed_over"])
def test_elementwise(f):
    _check(f, X)


def test_binary_and_in_axes():
    _check(lambda a, b: fa.atan2(a, b) + a * b, X, Y)
    _check(lambda a, b: a * b, X, Y[0], in_axes=(0, None))
    _check(lambda a, b: a - b, X, np.moveaxis(Y, 0, 2), in_axes=(0, 2))
    _check(lambda a, b: a - b, X, np.moveaxis(Y, 0, 2), in_axes=(0, -1))


@pytest.mark.parametrize("f", [
    lambda a: fa.sum(a), lambda a: fa.sum(a, axis=1), lambda a: fa.max(a, axis=0, keepdims=True),
    lambda a: fa.mean(a, axis=-1), lambda a: fa.prod(a * 0.5, axis=(0, 1)), lambda a: fa.argmax(a, axis=1),
    lambda a: fa.var(a, axis=0), lambda a: fa.any(a > 1.5, axis=1),
], ids=["sum", "sum1", "max_keep", "mean", "prod", "argmax", "var", "any"])
def test_reductions(f):
    _check(f, X)


@pytest.mark.parametrize("f", [
    lambda a: a.reshape(12), lambda a: a.reshape(2, 6).T, lambda a: a.T[1:, ::-2],
    lambda a: fa.broadcast_to(a[:, None, :], (3, 2, 4)), lambda a: fa.flip(a, axis=1),
    lambda a: fa.moveaxis(a[None], 0, 2), lambda a: fa.squeeze(a[1:2]), lambda a: a[..., 2],
    lambda a: fa.concat([a, a[:1] * 2.0, fa.zeros((2, 4), device=a.device)], axis=0),
    lambda a: fa.stack([a, fa.ones((3, 4), device=a.device)], axis=-1),
], ids=["reshape", "reshape_T", "slices", "broadcast", "flip", "moveaxis", "squeeze", "index", "concat", "stack"])
def test_views_and_concat(f):
    _check(f, X)


def test_matmul():
    w = fa.asarray(W)
    _check(lambda v: v @ w, X[:, 0])  # vector @ matrix per example
    _check(lambda v: fa.relu((v[None] @ w)[0, ::-1] + 1.0), X[:, 0])
    _check(lambda v: (v[None] @ w) * 2.0, X[:, 0])
    _check(lambda m: m @ w, X)
    _check(lambda v, m: v @ m, X[:, 0], rng.uniform(-1, 1, (5, 4, 2)).astype(np.float32))
    _check(lambda m, v: m @ v, X, X[:, 1])
    _check(lambda a, b: fa.matmul(a, b), X, W, in_axes=(0, None))


def test_nn():
    wt = fa.asarray(W[:, 0])
    _check(fa.nn.softmax, X)
    _check(lambda a: fa.nn.log_softmax(a, axis=0), X)
    _check(lambda a: fa.nn.rms_norm(a, wt), X, rtol=1e-4)
    _check(lambda a: fa.nn.layer_norm(a), X, rtol=1e-4, atol=1e-4)
    _check(lambda a: fa.top_k(a, 2)[0], X)
    _check(lambda a: fa.nn.long_row_softmax(a, axis=0), X)


def test_attention():
    q = rng.uniform(-1, 1, (3, 2, 5, 2, 4)).astype(np.float32)
    k = rng.uniform(-1, 1, (3, 2, 6, 1, 4)).astype(np.float32)
    bias = rng.uniform(-1, 1, (3, 2, 1, 5, 6)).astype(np.float32)
    kk, vv = fa.asarray(k[0]), fa.asarray(k[1])
    _check(lambda a: fa.nn.dot_product_attention(a, kk, vv, is_causal=True), q, rtol=1e-4, atol=1e-5)
    _check(lambda a, b, c: fa.nn.dot_product_attention(a, b, b, bias=c), q, k, bias, rtol=1e-4, atol=1e-5)
    _check(lambda a, b, c: fa.nn.dot_product_attention(a, b, b, bias=c), q, k, bias[0], in_axes=(0, 0, None),
           rtol=1e-4, atol=1e-5)


def test_more_library_ops_and_random():
    x = fa.asarray(X)
    _, idx = fa.vmap(lambda a: fa.top_k(a, 2))(x)
    np.testing.assert_array_equal(np.asarray(idx), torch.topk(torch.from_numpy(X), 2).indices.numpy())
    _check(lambda a: fa.nn.softmax_top_k(a, 2, renormalize=True)[0], X)
    keys = fa.random.split(fa.random.key(0), 4)  # batched keys: each example its own numbers
    got = fa.vmap(lambda k: fa.random.uniform(k, (3,)))(keys)
    want = np.stack([np.asarray(fa.random.uniform(keys[i], (3,))) for i in range(4)])
    np.testing.assert_array_equal(np.asarray(got), want)
    assert fa.vmap(fa.sin)(fa.zeros((0, 3))).shape == (0, 3)


def test_per_example_gradients_of_library_ops():
    q = rng.uniform(-1, 1, (2, 1, 4, 2, 8)).astype(np.float32)
    loss = fa.grad(lambda a: fa.sum(fa.nn.dot_product_attention(a, a, a) ** 2))  # attention_bwd
    _check(loss, q, rtol=1e-4, atol=1e-5)
    got = fa.vmap(fa.grad(lambda a: fa.sum(fa.nn.long_row_softmax(a) * a)))(fa.asarray(X))  # softmax_bwd
    want = torch.func.vmap(torch.func.grad(lambda a: (torch.softmax(a, -1) * a).sum()))(torch.from_numpy(X))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-5)
    got = fa.vmap(lambda a: fa.jvp(fa.sin, (a,), (fa.ones_like(a),))[1])(fa.asarray(X))
    np.testing.assert_allclose(np.asarray(got), np.cos(X), rtol=1e-5, atol=1e-6)


def test_out_axes_and_pytrees():
    x, y = fa.asarray(X), fa.asarray(Y)
    got = fa.vmap(lambda a: fa.sum(a, axis=0), out_axes=1)(x)
    np.testing.assert_allclose(np.asarray(got), X.sum(1).T, rtol=1e-5)
    P = collections.namedtuple("P", "w b")
    f = fa.vmap(lambda d, p: {"out": d["x"] * p.w + p.b, "w": p.w},
                in_axes=({"x": 0}, P(w=None, b=1)), out_axes={"out": -1, "w": None})
    got = f({"x": x}, P(w=fa.asarray(W[:, 0]), b=fa.asarray(np.moveaxis(Y[:, 0], 0, 1))))
    np.testing.assert_allclose(np.asarray(got["out"]), np.moveaxis(X * W[:, 0] + Y[:, 0][:, None], 0, -1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got["w"]), W[:, 0])
    a, b = fa.vmap(lambda a: (a, 2.0 * fa.ones(())), in_axes=[0], out_axes=(0, 0))(x)  # unbatched out: broadcast
    np.testing.assert_allclose(np.asarray(a), X)
    np.testing.assert_allclose(np.asarray(b), np.full(5, 2.0))
    got = fa.vmap(lambda a, n: a * n, in_axes=(0, None))(x, 3)  # a Python number passes as it is
    np.testing.assert_allclose(np.asarray(got), X * 3, rtol=1e-6)
    got = fa.vmap(lambda a, *, b: a * b, in_axes=None)(2.0, b=y)  # keywords: batched at axis 0
    np.testing.assert_allclose(np.asarray(got), 2.0 * Y, rtol=1e-6)
    got = fa.vmap(lambda a: a + 1.0)(torch.from_numpy(X))
    np.testing.assert_allclose(np.asarray(got), X + 1.0, rtol=1e-6)


def test_nested():
    x = fa.asarray(X)
    got = fa.vmap(fa.vmap(lambda v: fa.sum(v * v)))(x)
    np.testing.assert_allclose(np.asarray(got), (X * X).sum(-1), rtol=1e-5)
    outer = fa.vmap(fa.vmap(lambda a, b: fa.sum(a * b), in_axes=(None, 0)), in_axes=(0, None))  # all pairs
    got = outer(fa.asarray(X[:, 0]), fa.asarray(Y[:, 1]))
    np.testing.assert_allclose(np.asarray(got), X[:, 0] @ Y[:, 1].T, rtol=1e-5)
    got = fa.vmap(fa.vmap(fa.nn.softmax, in_axes=1, out_axes=1))(x)
    np.testing.assert_allclose(np.asarray(got), torch.softmax(torch.from_numpy(X), 1).numpy(), rtol=1e-5)


def _loss(w, x, y):
    return fa.sum((fa.tanh(x @ w) - y) ** 2)


def _torch_loss(w, x, y):
    return ((torch.tanh(x @ w) - y) ** 2).sum()


def test_per_example_gradients():
    xs, ys = X[:, 0], rng.uniform(-1, 1, (5, 6)).astype(np.float32)
    got = fa.vmap(fa.grad(_loss), in_axes=(None, 0, 0))(fa.asarray(W), fa.asarray(xs), fa.asarray(ys))
    want = torch.func.vmap(torch.func.grad(_torch_loss), in_dims=(None, 0, 0))(
        torch.from_numpy(W), torch.from_numpy(xs), torch.from_numpy(ys))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-5)
    got = fa.vmap(fa.grad(lambda a: fa.sum(fa.nn.softmax(a) * a)))(fa.asarray(X))
    want = torch.func.vmap(torch.func.grad(lambda a: (torch.softmax(a, -1) * a).sum()))(torch.from_numpy(X))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-5)


def test_grad_of_vmap():
    xs, ys = X[:, 0], rng.uniform(-1, 1, (5, 6)).astype(np.float32)

    def total(w, x, y):
        return fa.sum(fa.vmap(_loss, in_axes=(None, 0, 0))(w, x, y))
    got = fa.grad(total)(fa.asarray(W), fa.asarray(xs), fa.asarray(ys))
    w = torch.from_numpy(W).requires_grad_(True)
    _torch_loss(w, torch.from_numpy(xs), torch.from_numpy(ys)).backward()
    np.testing.assert_allclose(np.asarray(got), w.grad.numpy(), rtol=1e-4, atol=1e-5)
    # stop_gradient inside the vectorized function still stops the gradient
    got = fa.grad(lambda a: fa.sum(fa.vmap(lambda r: r * fa.stop_gradient(r))(a)))(fa.asarray(X))
    np.testing.assert_allclose(np.asarray(got), X, rtol=1e-6)


def test_custom_rules_survive_vmap():
    @fa.custom_vjp
    def f(x, s):
        return fa.sin(x) * s
    f.defvjp(lambda x, s: (fa.sin(x) * s, (x, s)), lambda r, g: (g * 100.0 * r[1], None))

    @fa.custom_jvp
    def h(x):
        return fa.exp(x)
    h.defjvp(lambda p, t: (fa.exp(p[0]), t[0] * 7.0))
    x, s = fa.asarray(X[:, 0]), fa.asarray(W[:, 0])
    np.testing.assert_allclose(np.asarray(fa.vmap(f, in_axes=(0, None))(x, s)), np.sin(X[:, 0]) * W[:, 0], rtol=1e-6)
    got = fa.grad(lambda a: fa.sum(fa.vmap(f, in_axes=(0, None))(a, s)))(x)
    np.testing.assert_allclose(np.asarray(got), np.broadcast_to(100.0 * W[:, 0], (5, 4)), rtol=1e-6)
    got = fa.grad(lambda a: fa.sum(fa.vmap(h)(a)))(x)
    np.testing.assert_allclose(np.asarray(got), np.full((5, 4), 7.0))
    got = fa.grad(lambda w: fa.sum(fa.vmap(lambda r: h(r * w))(x)))(s)  # unbatched w: per-example sums
    np.testing.assert_allclose(np.asarray(got), 7.0 * X[:, 0].sum(0), rtol=1e-5)
    _, t = fa.jvp(fa.vmap(h), (x,), (fa.ones_like(x),))
    np.testing.assert_allclose(np.asarray(t), np.full((5, 4), 7.0))


def test_jit_of_vmap():
    f = fa.jit(fa.vmap(lambda a, b: fa.nn.softmax(a * b), in_axes=(0, None)))
    for seed in range(2):
        x = np.random.default_rng(seed).uniform(-1, 1, (5, 3, 4)).astype(np.float32)
        got = f(fa.asarray(x), fa.asarray(W[:, 0]))
        np.testing.assert_allclose(np.asarray(got), torch.softmax(torch.from_numpy(x * W[:, 0]), -1).numpy(), rtol=1e-5)
    g = fa.jit(fa.vmap(fa.grad(_loss), in_axes=(None, 0, 0)))
    ys = rng.uniform(-1, 1, (5, 6)).astype(np.float32)
    got = g(fa.asarray(W), fa.asarray(X[:, 0]), fa.asarray(ys))
    want = torch.func.vmap(torch.func.grad(_torch_loss), in_dims=(None, 0, 0))(
        torch.from_numpy(W), torch.from_numpy(X[:, 0]), torch.from_numpy(ys))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-5)


def _kernels(fn, *args):
    out = fn(*args)
    fa.reset_stats()
    fa.eval(*(out if isinstance(out, tuple) else (out,)))
    return fa.stats()["kernels_launched"]


def test_kernel_counts_match_hand_batched():
    x, w = fa.asarray(X[:4, 0]), fa.asarray(W)
    assert _kernels(fa.vmap(fa.nn.softmax), x) == 1 == _kernels(fa.nn.softmax, x)
    assert _kernels(fa.vmap(lambda a, b: fa.sum(a * b)), x, x) == 1  # per-example dot product
    assert _kernels(fa.vmap(lambda a, b: a @ b), x, x) == 1  # the same through matmul: one batched GEMM
    assert _kernels(fa.vmap(lambda v: fa.relu(v @ w) * 2.0), x) == _kernels(lambda a: fa.relu(a @ w) * 2.0, x)
    bias = fa.asarray(W[0])  # matmul + bias + activation: one GEMM with its epilogue, by hand and under vmap
    assert _kernels(fa.vmap(lambda v: fa.relu(v @ w + bias)), x) == _kernels(lambda a: fa.relu(a @ w + bias), x) == 1
    chain = lambda a: fa.sum(fa.exp(fa.sin(a) * 2.0 + 1.0) * a, axis=-1)  # noqa: E731
    assert _kernels(fa.vmap(chain), fa.asarray(X)) == _kernels(chain, fa.asarray(X)) == 1
    g = fa.grad(lambda a: fa.sum(fa.exp(fa.sin(a) * 2.0 + 1.0) * a))
    assert _kernels(fa.vmap(g), fa.asarray(X)) == 1


RMS_W = W[0, :4]
HAND_BATCHED = {  # name: (per-example f, the batched function written by hand), both over X (5, 3, 4)
    "elementwise_chain": (lambda a: fa.exp(fa.sin(a) * 2.0 + 1.0) * a, lambda a: fa.exp(fa.sin(a) * 2.0 + 1.0) * a),
    "softmax": (fa.nn.softmax, fa.nn.softmax),
    "matmul": (lambda a: fa.relu(a @ fa.asarray(W)), lambda a: fa.relu(a @ fa.asarray(W))),
    "batched_matmul": (lambda a: a @ a.mT, lambda a: a @ a.mT),
    "rms_norm": (lambda a: fa.nn.rms_norm(a, fa.asarray(RMS_W)), lambda a: fa.nn.rms_norm(a, fa.asarray(RMS_W))),
    "reduction": (lambda a: fa.max(a, axis=0) + fa.var(a), lambda a: fa.max(a, axis=1) + fa.var(a, axis=(1, 2))[:, None]),
    "per_example_grad": (fa.grad(lambda a: fa.sum(fa.tanh(a) ** 2)), lambda a: 2 * fa.tanh(a) * (1 - fa.tanh(a) ** 2)),
}


@pytest.mark.parametrize("name", sorted(HAND_BATCHED))
def test_vmap_launches_what_the_hand_batched_function_launches(name):
    """On the reference backend: vmap records the hand-batched graph, so it costs the same kernels (and
    gives the same values)."""
    f, hand = HAND_BATCHED[name]
    fa.set_backend("reference")
    try:
        x = fa.asarray(X)
        assert _kernels(fa.vmap(f), x) == _kernels(hand, x) >= 1
        np.testing.assert_allclose(np.asarray(fa.vmap(f)(x)), np.asarray(hand(x)), rtol=1e-5, atol=1e-6)
    finally:
        fa.set_backend(None)


def test_errors():
    x = fa.asarray(X)
    with pytest.raises(ValueError, match=r"different sizes.*\(5, 3, 4\).*\(3, 4\)"):
        fa.vmap(lambda a, b: a + b)(x, fa.asarray(X[0]))
    with pytest.raises(ValueError, match="in_axes 3 is out of range.*rank 3"):
        fa.vmap(fa.sin, in_axes=3)(x)
    with pytest.raises(ValueError, match="in_axes .* 1 entries.* 2 positional"):
        fa.vmap(lambda a, b: a + b, in_axes=(0,))(x, x)
    with pytest.raises(ValueError, match="not a pytree prefix of the arguments"):
        fa.vmap(lambda a, b: a + b, in_axes=({"x": 0}, 0))(x, x)
    with pytest.raises(ValueError, match="at least one"):
        fa.vmap(fa.sin, in_axes=None)(x)
    with pytest.raises(ValueError, match="out_axes is None"):
        fa.vmap(fa.sin, out_axes=None)(x)
    with pytest.raises(ValueError, match="out_axes 4 is out of range"):
        fa.vmap(fa.sin, out_axes=4)(x)
    with pytest.raises(TypeError, match="ints or None"):
        fa.vmap(fa.sin, in_axes=1.0)(x)
    with pytest.raises(TypeError, match="vmap: output leaf 1 of the function is a str, which is not an array"):
        fa.vmap(lambda a: (a * 2, "label"))(x)
    with pytest.raises(NotImplementedError, match="ragged_dot"):
        fa.vmap(lambda a: fa.ragged_dot(a, fa.asarray(W[None]), fa.asarray(np.array([3], np.int32))))(x)
    def evaluates(a):
        s = fa.sin(a) * 2.0
        fa.eval(s)
        return s + 1.0
    with pytest.raises(fa.ConcretizationError, match=r"fa.vmap: the line .*test_vmap\.py.*fa\.eval\(s\)"):
        fa.vmap(evaluates)(x)


def test_values_of_closed_over_arrays_may_be_evaluated_inside():
    """A value computed only from closed-over arrays does not depend on the batch: printing or converting it
    inside the vectorized function is fine, and it is a constant there (evaluating a batched one raises)."""
    w = fa.asarray(np.ones((4, 2)))

    def f(a):
        d = w * 2 + 1
        np.asarray(d)
        return a @ d
    np.testing.assert_array_equal(np.asarray(fa.vmap(f)(fa.asarray(np.ones((3, 4))))), np.full((3, 2), 12.0))


def test_python_values_of_batched_arrays_are_refused():
    """float()/bool() of a per-example value has no single answer; it used to be example 0's for all."""
    x = fa.asarray(X)
    with pytest.raises(fa.ConcretizationError, match=r"fa.vmap: .*float\(fa.sum\(a\)\)"):
        fa.vmap(lambda a: a * float(fa.sum(a)))(x)
    with pytest.raises(fa.ConcretizationError, match="batched arguments"):
        fa.vmap(lambda a: a if fa.sum(a) > 0 else -a)(x)
    w = fa.asarray(W)   # not batched: its value is one value, and may be used
    got = fa.vmap(lambda a: a * float(fa.sum(w)))(x)
    np.testing.assert_allclose(np.asarray(got), X * W.sum(), rtol=1e-5)


def test_custom_vjp_whose_fwd_calls_itself_under_vmap():
    """JAX's idiom (fwd returns f(x), residuals) batched: the batched fwd's call of f is the plain f
    (it recursed without end)."""
    @fa.custom_vjp
    def f(a, b):
        return a * b
    f.defvjp(lambda a, b: (f(a, b), (a, b)), lambda r, g: (g * r[1] * 3.0, g * r[0]))
    x = fa.asarray(X[:, 0])
    np.testing.assert_allclose(np.asarray(fa.vmap(f)(x, x)), X[:, 0] ** 2, rtol=1e-6)
    got = fa.grad(lambda a: fa.sum(fa.vmap(f)(a, x)))(x)
    np.testing.assert_allclose(np.asarray(got), 3.0 * X[:, 0], rtol=1e-6)   # the custom bwd, batched


def test_interpret_backend(interpret):
    x = rng.uniform(-1, 1, (3, 8)).astype(np.float32)
    _check(lambda a: fa.nn.softmax(a * 2.0) + fa.sum(a[::-1] ** 2), x)
    _check(lambda a: fa.concat([a[:2], fa.max(a, axis=0, keepdims=True)]).reshape(3, 1), x[:, :2])
    got = fa.vmap(fa.grad(lambda a: fa.sum(fa.nn.softmax(a) * a)))(fa.asarray(x))
    want = torch.func.vmap(torch.func.grad(lambda a: (torch.softmax(a, -1) * a).sum()))(torch.from_numpy(x))
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-5)


def _spd(rng, shape):
    s = rng.normal(size=shape + (3, 3))
    return s @ np.swapaxes(s, -1, -2) + 3 * np.eye(3)


@pytest.mark.parametrize("a_shape, b_shape, in_axes", [
    ((2, 2), (2, 3), (0, 0)),          # a stack of two matrices per example, one vector: batch 2 == stack 2
    ((3, 2), (3, 3), (0, 0)),          # batch 3 != stack 2 (this raised a broadcast error)
    ((2,), (2, 2, 3, 1), (0, 0)),      # one matrix, a stack of columns per example
    ((2,), (2, 3, 2), (0, 0)),
    ((2,), (5, 3, 2), (None, 0)),      # an unbatched stack against batched right-hand sides
    ((2,), (5, 3), (None, 0)),
    ((5, 2), (3, 2), (0, None)),
])
def test_vmap_of_solve_lines_the_batch_up_with_the_batch(a_shape, b_shape, in_axes):
    """torch broadcasts stack axes from the right: the operand with fewer of them gets size-1 axes after
    the batch axis, or the batch lines up against a stack axis (silently wrong when the sizes agreed)."""
    rng = np.random.default_rng(0)
    a, b = _spd(rng, a_shape), rng.normal(size=b_shape)
    got = np.asarray(fa.vmap(fa.linalg.solve, in_axes=in_axes)(fa.asarray(a), fa.asarray(b)))
    n = (a if in_axes[0] == 0 else b).shape[0]
    loop = np.stack([np.asarray(fa.linalg.solve(fa.asarray(a[i] if in_axes[0] == 0 else a),
                                                fa.asarray(b[i] if in_axes[1] == 0 else b))) for i in range(n)])
    np.testing.assert_allclose(got, loop, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call, exc, match", [
    (lambda x: fa.vmap(lambda a, mode: a)(x, "relu"), TypeError,
     r"vmap: argument 1 is batched at axis 0, but cannot make an array from str.*give it in_axes None"),
    (lambda x: fa.vmap(lambda a, s=1.0: a * s, in_axes=(0,))(x, s=2.0), ValueError,
     r"vmap: keyword 's' is batched at axis 0, but in_axes 0 is out of range .*pass it positionally"),
    (lambda x: fa.vmap(lambda a: a, in_axes=2)(x), ValueError,
     r"vmap: argument 0: in_axes 2 is out of range for an argument of shape \(3, 2\)"),
])
def test_an_argument_that_cannot_be_batched_is_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call(fa.ones((3, 2)))


def test_vmap_over_an_attention_cotangent_matches_the_loop(backend):
    """q, k, v unbatched, the cotangent batched: attention_bwd gets the forward's lse broadcast (stride 0
    over the batch); the kernel once read it as dense rows and returned NaN/inf."""
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2, 1, 2), (1, 3, 1, 2), (1, 3, 1, 2)))
    cots = rng.standard_normal((3, 1, 2, 1, 2)).astype(np.float32)
    g = fa.grad(lambda q, k, v, c: fa.sum(fa.nn.dot_product_attention(q, k, v) * c), argnums=(0, 1, 2))
    batched = fa.vmap(g, in_axes=(None, None, None, 0))(*map(fa.asarray, (q, k, v, cots)))
    for i, got in enumerate(batched):
        want = np.stack([np.asarray(g(*map(fa.asarray, (q, k, v, c)))[i]) for c in cots])
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_a_size_mismatch_names_each_batched_leaf():
    """Found by a fuzzing helper: the message listed sizes and shapes without saying whose (ambiguous where two
    leaves share a shape); it names each argument and its key path now, as JAX does."""
    a, c = fa.ones((3, 2)), fa.ones((2, 5))
    with pytest.raises(ValueError, match=r"argument 0 has size 3 at axis 0 \(shape \(3, 2\)\), argument 1 has size 3 "
                                         r"at axis 0 \(shape \(3, 2\)\), argument 2 has size 5 at axis 1"):
        fa.vmap(lambda x, y, z: x + y + z, in_axes=(0, 0, 1))(a, a, c)
    with pytest.raises(ValueError, match=r"argument 0\['a'\] has size 3 at axis 0 \(shape \(3, 2\)\), "
                                         r"argument 0\['b'\] has size 2 at axis 1"):
        fa.vmap(lambda d: d["a"] + d["b"], in_axes=({"a": 0, "b": 1},))({"a": a, "b": fa.ones((3, 2))})
    with pytest.raises(ValueError, match=r"keyword 'w'\[1\] has size 4"):
        fa.vmap(lambda x, w: x + w[0] + w[1])(fa.ones((3,)), w=[fa.ones((3,)), fa.ones((4,))])
