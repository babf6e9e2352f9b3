"""fa.jacfwd / fa.jacrev / fa.hessian / fa.linearize against torch.func in float64: argnums, has_aux,
pytrees in and out, composition with jit and vmap, and the errors."""
import numpy as np
import pytest
import torch

import flyarray as fa

rng = np.random.default_rng(7)
A = rng.uniform(-1, 1, (3, 4))
B = rng.uniform(-1, 1, (4, 2))
V = rng.uniform(0.5, 1.5, (5,))

FUNCS = {  # name: (fa fn, torch fn, args) -- every function of all of its args
    "elementwise": (lambda a: fa.sin(a) * fa.exp(a), lambda a: torch.sin(a) * torch.exp(a), (A,)),
    "matmul": (lambda a, b: fa.tanh(a @ b) * fa.sum(a), lambda a, b: torch.tanh(a @ b) * a.sum(), (A, B)),
    "softmax": (lambda a: fa.nn.softmax(a * 2.0), lambda a: torch.softmax(a * 2.0, -1), (A,)),
    "reduce": (lambda a: fa.max(a, axis=0) + fa.log(fa.sum(fa.exp(a), axis=0)),
               lambda a: a.amax(0) + torch.logsumexp(a, 0), (A,)),
    "scalar out": (lambda v: fa.sum(fa.log(v) * v ** 3), lambda v: (torch.log(v) * v ** 3).sum(), (V,)),
    "rms_norm": (lambda a, w: fa.nn.rms_norm(a, w), lambda a, w: torch.nn.functional.rms_norm(a, (4,), w, 1e-6),
                 (A, V[:4])),
    "views": (lambda a: fa.concat([a[:, ::-1], a.T.reshape(3, 4) ** 2], axis=1),
              lambda a: torch.cat([a.flip(1), a.T.reshape(3, 4) ** 2], 1), (A,)),
}


def _fa(xs):
    return [fa.asarray(x) for x in xs]


def _t(xs):
    return [torch.from_numpy(x) for x in xs]


def _close(got, want, rtol=1e-10, atol=1e-12):
    got_leaves, want_leaves = fa.tree_util.tree_leaves(got), fa.tree_util.tree_leaves(want)  # dicts in sorted key order, both
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert g.shape == tuple(w.shape) and g.dtype == fa.float64
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("mode", ["jacfwd", "jacrev"])
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_jacobian_vs_torch(mode, name):
    f, tf, xs = FUNCS[name]
    argnums = tuple(range(len(xs)))
    if name == "rms_norm":  # torch's rms_norm eps default differs: pass ours
        f = lambda a, w: fa.nn.rms_norm(a, w, eps=1e-6)  # noqa: E731
    tol = {"rtol": 1e-6, "atol": 1e-7} if name == "rms_norm" else {}  # its statistics are fp32 by design
    got = getattr(fa, mode)(f, argnums=argnums)(*_fa(xs))
    want = getattr(torch.func, mode)(tf, argnums=argnums)(*_t(xs))
    _close(got, want, **tol)
    _close(getattr(fa, mode)(f)(*_fa(xs)), getattr(torch.func, mode)(tf)(*_t(xs)), **tol)  # argnums=0: no tuple


@pytest.mark.parametrize("name", ["scalar out", "matmul"])
def test_hessian_vs_torch(name):
    f, tf, xs = FUNCS[name]
    g, tg = (f, tf) if name == "scalar out" else (lambda a, b: fa.sum(f(a, b) ** 2), lambda a, b: (tf(a, b) ** 2).sum())
    argnums = tuple(range(len(xs)))
    _close(fa.hessian(g, argnums=argnums)(*_fa(xs)), torch.func.hessian(tg, argnums=argnums)(*_t(xs)), atol=1e-11)
    _close(fa.hessian(g)(*_fa(xs)), torch.func.hessian(tg)(*_t(xs)), atol=1e-11)


def test_pytrees_and_has_aux():
    params = {"w": B, "b": V[:2]}

    def f(p, x):
        h = x @ p["w"] + p["b"]
        return (fa.tanh(h), fa.sum(h)), {"h": h}

    def tf(p, x):
        h = x @ p["w"] + p["b"]
        return (torch.tanh(h), h.sum()), {"h": h}
    p_fa = {k: fa.asarray(v) for k, v in params.items()}
    p_t = {k: torch.from_numpy(v) for k, v in params.items()}
    for mode in ("jacfwd", "jacrev"):
        jac, aux = getattr(fa, mode)(f, has_aux=True)(p_fa, fa.asarray(A))
        tjac, taux = getattr(torch.func, mode)(tf, has_aux=True)(p_t, torch.from_numpy(A))
        assert isinstance(jac, tuple) and set(jac[0]) == {"w", "b"} and jac[1]["w"].shape == (4, 2)
        assert jac[0]["w"].shape == (3, 2, 4, 2)  # output shape + input shape
        _close(jac, tjac)
        _close(aux, taux)
        jac = getattr(fa, mode)(f, argnums=(0, 1), has_aux=True)(p_fa, fa.asarray(A))[0]
        _close(jac, getattr(torch.func, mode)(tf, argnums=(0, 1), has_aux=True)(p_t, torch.from_numpy(A))[0])
    h, aux = fa.hessian(lambda p: (fa.sum(fa.sin(p["w"]) ** 2), p["b"]), has_aux=True)(p_fa)
    th = torch.func.hessian(lambda p: (torch.sin(p["w"]) ** 2).sum())(p_t)
    _close(h, th)
    np.testing.assert_array_equal(np.asarray(aux), params["b"])


def test_non_float_args_outside_argnums_and_keywords():
    f = lambda x, n, scale=1.0: fa.sin(x) * n * scale  # noqa: E731
    n = fa.asarray(np.array(3, np.int64))
    got = fa.jacrev(f)(fa.asarray(V), n, scale=2.0)
    np.testing.assert_allclose(np.asarray(got), np.diag(np.cos(V) * 6.0), rtol=1e-12)
    got = fa.jacfwd(f)(fa.asarray(V), n, scale=2.0)
    np.testing.assert_allclose(np.asarray(got), np.diag(np.cos(V) * 6.0), rtol=1e-12)


def test_composes_with_jit_and_vmap():
    f, tf, xs = FUNCS["matmul"]
    want = torch.func.jacrev(tf)(*_t(xs))
    _close(fa.jit(fa.jacrev(f))(*_fa(xs)), want)
    _close(fa.jacfwd(fa.jit(f))(*_fa(xs)), torch.func.jacfwd(tf)(*_t(xs)))
    batch = rng.uniform(-1, 1, (6, 4))
    g = lambda x: fa.sin(x) * fa.sum(x ** 2)  # noqa: E731
    tg = lambda x: torch.sin(x) * (x ** 2).sum()  # noqa: E731
    _close(fa.vmap(fa.jacfwd(g))(fa.asarray(batch)), torch.func.vmap(torch.func.jacfwd(tg))(torch.from_numpy(batch)))
    _close(fa.jit(fa.vmap(fa.hessian(lambda x: fa.sum(g(x)))))(fa.asarray(batch)),
           torch.func.vmap(torch.func.hessian(lambda x: tg(x).sum()))(torch.from_numpy(batch)), atol=1e-11)


def test_linearize():
    f = lambda a, b: fa.tanh(a @ b)  # noqa: E731
    out, f_jvp = fa.linearize(f, fa.asarray(A), fa.asarray(B))
    np.testing.assert_allclose(np.asarray(out), np.tanh(A @ B), rtol=1e-12)
    for seed in range(2):
        ta, tb = np.random.default_rng(seed).uniform(-1, 1, A.shape), np.random.default_rng(seed + 9).uniform(-1, 1, B.shape)
        want = torch.func.jvp(lambda a, b: torch.tanh(a @ b), tuple(_t([A, B])), tuple(_t([ta, tb])))[1]
        np.testing.assert_allclose(np.asarray(f_jvp(fa.asarray(ta), fa.asarray(tb))), want.numpy(), rtol=1e-10)
    out, f_jvp, aux = fa.linearize(lambda a: (fa.sin(a), fa.cos(a)), fa.asarray(V), has_aux=True)
    np.testing.assert_allclose(np.asarray(f_jvp(fa.ones_like(out))), np.cos(V), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(aux), np.cos(V), rtol=1e-12)
    with pytest.raises(TypeError, match="one tangent per primal"):
        fa.linearize(f, fa.asarray(A), fa.asarray(B))[1](fa.asarray(A))


def test_errors():
    x = fa.asarray(V)
    for jac in (fa.jacfwd, fa.jacrev, fa.hessian):
        with pytest.raises(TypeError, match="real-valued.*inputs.*int64"):
            jac(lambda a: a * 2)(fa.asarray(np.arange(3)))
        with pytest.raises(ValueError, match="argnums 2 names argument 2.*1 positional"):
            jac(fa.sin, argnums=2)(x)
        with pytest.raises(TypeError, match="argnums must be an int or a non-empty tuple"):
            jac(fa.sin, argnums=())(x)
    with pytest.raises(TypeError, match="jacrev requires real-valued.*outputs"):
        fa.jacrev(lambda a: a > 1.0)(x)
    with pytest.raises(TypeError, match="has_aux=True.*pair"):
        fa.jacfwd(fa.sin, has_aux=True)(x)


def test_float64_gemm_epilogue_keeps_float64():
    """The reference GEMM with a fused bias computed float64 operands in float32 (an error near 1e-7 in
    every float64 Jacobian through a matmul)."""
    fa.set_backend("reference")
    try:
        got = fa.asarray(A) @ fa.asarray(B) + fa.asarray(V[:2])
        np.testing.assert_allclose(np.asarray(got), A @ B + V[:2], rtol=1e-14)
    finally:
        fa.set_backend(None)


@pytest.mark.parametrize("fn, tfn", [
    (lambda a: fa.sum(fa.abs(a)), lambda a: a.abs().sum()),                  # abs's rules use sign: zero tangent
    (lambda a: fa.sum(fa.abs(a) ** 3), lambda a: (a.abs() ** 3).sum()),
    (lambda a: fa.sum(fa.floor(a) * a ** 2), lambda a: (a.floor() * a ** 2).sum()),
])
def test_hessian_through_zero_derivative_ops(fn, tfn):
    v = np.array([-0.5, 1.5, 2.25])
    _close(fa.hessian(fn)(fa.asarray(v)), torch.func.hessian(tfn)(torch.from_numpy(v)))


def test_jvp_of_vmap_over_a_zero_tangent_op_on_an_unbatched_value():
    v = fa.asarray(V)
    out, tangent = fa.jvp(lambda a: fa.vmap(lambda c, a: fa.sign(a) * c, in_axes=(0, None))(
        fa.ones((2,), dtype=fa.float64), a), (v,), (v,))
    np.testing.assert_array_equal(np.asarray(out), np.ones((2, 5)))
    np.testing.assert_array_equal(np.asarray(tangent), np.zeros((2, 5)))


@pytest.mark.parametrize("transform", [fa.grad, fa.value_and_grad, fa.jacrev, fa.jacfwd])
def test_an_argument_named_twice_in_argnums_is_refused(transform):
    f = lambda a, b: fa.sum(a * b)  # noqa: E731
    with pytest.raises(ValueError, match=r"argnums \(1, 0, -1\) names an argument more than once"):
        transform(f, argnums=(1, 0, -1))(fa.asarray(V), fa.asarray(V))


@pytest.mark.parametrize("log", [False, True])
def test_forward_mode_through_long_row_softmax(log):
    """Rows past the long-row threshold (16384) record the softmax library op; its forward-mode formulation
    is written on primitives (it called fa.nn.softmax, which recorded the library op again: RecursionError)."""
    rng = np.random.default_rng(0)
    x, t = (rng.normal(size=(2, 20000)).astype(np.float32) for _ in range(2))
    f = fa.nn.log_softmax if log else fa.nn.softmax
    tf = (lambda a: torch.log_softmax(a, -1)) if log else (lambda a: torch.softmax(a, -1))
    _, tangent = fa.jvp(f, (fa.asarray(x),), (fa.asarray(t),))
    _, want = torch.func.jvp(tf, (torch.from_numpy(x).double(),), (torch.from_numpy(t).double(),))
    np.testing.assert_allclose(np.asarray(tangent), want.numpy(), rtol=1e-4, atol=1e-6 * np.abs(want.numpy()).max())
