"""Regression tests for inputs that used to be accepted and fail (or give garbage) later.

Every bad input must raise at record time, before any work, with a message naming the problem.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import flyarray as fa
import flyarray.interop.torch as fat

from .conftest import assert_matches, lazy

from .interpreter_probe import INTERPRETER_PROBLEM  # noqa: E402

# Library kernels on CPU tensors run in Triton's interpreter, which Triton 3.6 + numpy >= 2.4 breaks
_NEEDS_INTERPRETER = pytest.mark.skipif(INTERPRETER_PROBLEM is not None, reason=str(INTERPRETER_PROBLEM))






# ---- 1. float8 is storage only ----------------------------------------------------------------
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("op", [
    lambda x: x + x, lambda x: x * 2.0, lambda x: fa.exp(x), lambda x: x == x, lambda x: -x,
    lambda x: fa.sum(x), lambda x: fa.max(x), lambda x: fa.any(x), lambda x: fa.mean(x), lambda x: fa.var(x),
    lambda x: fa.nn.softmax(x), lambda x: fa.nn.rms_norm(x), lambda x: x + fa.ones((4,), device=x.device),
])
def test_float8_arithmetic_is_refused_at_record_time(no_evaluation, dtype, op):
    x = fa.asarray(torch.ones(4, dtype=dtype))
    with pytest.raises(TypeError, match=r"float8.*astype"):
        op(x)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("op", [
    lambda x, d: fa.sum(x, dtype=d), lambda x, d: fa.prod(x, dtype=d), lambda x, d: fa.sum(x, axis=0, dtype=d),
    lambda x, d: fa.linalg.trace(x[None] * x[:, None], dtype=d),
    lambda x, d: fa.cumulative_sum(x, dtype=d), lambda x, d: fa.cumulative_prod(x, dtype=d),
])
def test_float8_reduction_dtype_is_refused_at_record_time(no_evaluation, dtype, op):
    """sum/prod(dtype=float8) were recorded, then failed inside torch (reference) or summed wrongly in the
    interpreter (sum of arange(6) gave 7): the requested dtype is what the reduction computes in."""
    x = fa.asarray(np.arange(6.0, dtype=np.float32))
    with pytest.raises(TypeError, match=r"float8.*astype"):
        op(x, getattr(fa, str(dtype).removeprefix("torch.")))


@pytest.mark.parametrize("dtype", FP8)
def test_float8_cumulative_sum_with_a_compute_dtype(dtype):
    """As sum(x8, dtype=float32): an explicit accumulation dtype casts the float8 input first."""
    t = torch.arange(4, dtype=torch.float32).to(dtype)
    assert_matches(fa.cumulative_sum(fa.asarray(t), dtype=fa.float32), np.float32([0, 1, 3, 6]))


@pytest.mark.parametrize("dtype", FP8)
def test_float8_casts_and_views_still_work(dtype):  # reference backend: the interpreter cannot load fp8
    t = torch.arange(8, dtype=torch.float32).to(dtype)
    x = fa.asarray(t)
    assert_matches(x.astype(fa.float32), t.float().numpy())
    assert_matches(x.reshape(2, 4).T[:, ::2].astype(fa.float32), t.float().reshape(2, 4).T[:, ::2].numpy())
    assert_matches(fa.sum(x, dtype=fa.float32), np.float32(28))  # an explicit accumulation dtype casts first
    back = torch.from_dlpack(fa.asarray(np.arange(4, dtype=np.float32)).astype(dtype))
    assert back.dtype == dtype and back.float().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("dtype", FP8)
def test_float8_constants_stored_by_a_generated_kernel(backend, dtype):
    """A float8 constant broadcast into a store (pad, concat with zeros, at[].set): no float8 arithmetic in
    the generated Triton code (fp8 + int32 is a Triton TypeError)."""
    t = torch.tensor([1.0, 2.0, 3.0, 4.0]).to(dtype)
    x = fa.asarray(t).astype(fa.float32).astype(dtype)  # lazy: one generated kernel per case
    w = t.float().numpy()
    cases = [(fa.pad(x, (1, 1)), np.pad(w, (1, 1))),
             (fa.concat([x, fa.zeros((2,), dtype=dtype)]), np.concatenate([w, np.zeros(2, np.float32)])),
             (x.at[[0, 3]].set(2.0), np.array([2, 2, 3, 2], np.float32)),
             (x.at[1:3].set(fa.asarray([5.0, 6.0]).astype(dtype)), np.array([1, 5, 6, 4], np.float32))]
    for got, want in cases:
        assert got.dtype == x.dtype
        assert_matches(got.astype(fa.float32), want)


# ---- 2. shapes and axes -----------------------------------------------------------------------------
@pytest.mark.parametrize("make, err, words", [
    (lambda: fa.broadcast_to(lazy((1,)), (-5,)), ValueError, r"broadcast_to.*\(-5,\).*non-negative"),
    (lambda: fa.zeros((2**64,)), ValueError, r"shape.*int64"),
    (lambda: fa.ones((2**40, 2**40)), ValueError, r"shape.*int64"),
    (lambda: fa.full((0, 2**64), 1.0), ValueError, r"shape.*int64"),
    (lambda: fa.zeros((2.0, 3)), TypeError, r"sizes must be ints.*2\.0"),
    (lambda: fa.zeros("abc"), TypeError, r"sizes must be ints"),
    (lambda: fa.zeros(-1), ValueError, r"non-negative"),
    (lambda: fa.empty(None), TypeError, r"shape must be an int or a sequence"),
    (lambda: fa.arange(2**70), ValueError, r"arange.*int64"),
    (lambda: fa.arange(-5, 5, 3, dtype=fa.uint8), OverflowError, r"arange: values from -5 to 4 do not fit fa.uint8"),
    (lambda: fa.arange(0, 300, 100, dtype=fa.int8), OverflowError, r"arange: values from 0 to 200 do not fit fa.int8"),
    (lambda: fa.arange(float("inf")), ValueError, r"arange.*finite"),
    (lambda: fa.arange("3"), TypeError, r"arange.*real number"),
    (lambda: fa.linspace(0, 1, 2.5), TypeError, r"linspace: num must be an int"),
    (lambda: fa.eye(-1), ValueError, r"eye.*non-negative"),
    (lambda: fa.eye(2.0), TypeError, r"eye.*ints"),
    (lambda: fa.eye(3, k=0.5), TypeError, r"eye: k must be an int"),
    (lambda: fa.reshape(lazy((2, 3)), (2.0, 3)), TypeError, r"reshape.*must be an int.*2\.0"),
    (lambda: fa.reshape(lazy((0,)), (2**64, -1)), ValueError, r"reshape.*int64"),
    (lambda: fa.sum(lazy((2, 3)), axis=1.0), TypeError, r"axis must be an int.*1\.0"),
    (lambda: fa.sum(lazy((2, 3)), axis=(0, 1.0)), TypeError, r"axis must be an int.*1\.0"),
    (lambda: fa.mean(lazy((2, 3)), axis="0"), TypeError, r"axis must be an int"),
    (lambda: fa.max(lazy((2, 3)), axis=True), TypeError, r"axis must be an int"),
    (lambda: fa.flip(lazy((2, 3)), axis=1.0), TypeError, r"axis must be an int"),
    (lambda: fa.squeeze(lazy((1, 3)), axis=0.0), TypeError, r"axis must be an int"),
    (lambda: fa.expand_dims(lazy((2, 3)), axis=1.0), TypeError, r"expand_dims: axis must be an int"),
    (lambda: fa.expand_dims(lazy((2, 3)), axis=(0, 0)), ValueError, r"expand_dims: repeated axis"),
    (lambda: fa.permute_dims(lazy((2, 3)), (0, 1.0)), TypeError, r"permute_dims: axis must be an int"),
    (lambda: fa.moveaxis(lazy((2, 3)), 0.0, 1), TypeError, r"moveaxis: source must be an int"),
    (lambda: fa.moveaxis(lazy((2, 3)), (0, 1), 1), ValueError, r"moveaxis: source"),
    (lambda: fa.concat([lazy((2,)), lazy((2,))], axis=0.0), TypeError, r"axis must be an int"),
    (lambda: fa.stack([lazy((2,)), lazy((2,))], axis=0.5), TypeError, r"axis must be an int"),
    (lambda: fa.nn.softmax(lazy((2, 3)), axis=1.0), TypeError, r"softmax: axis must be an int"),
])
def test_bad_shapes_and_axes_raise_at_record_time(no_evaluation, make, err, words):
    with pytest.raises(err, match=words):
        make()


def test_numpy_ints_are_good_sizes_and_axes(backend):
    x = fa.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert_matches(fa.sum(x, axis=np.int64(1)), np.array([3, 12], np.float32))
    assert fa.zeros((np.int32(2), np.int64(3))).shape == (2, 3)
    assert fa.reshape(x, (np.int64(3), -1)).shape == (3, 2)


# ---- 3. empty in, empty out ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis", [((3, 0), -1), ((0, 4), -1), ((0, 4), 0), ((2, 0, 3), 1)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_over_empty_arrays(backend, shape, axis, log):
    x = np.zeros(shape, np.float32)
    fn = fa.nn.log_softmax if log else fa.nn.softmax
    want = (torch.log_softmax if log else torch.softmax)(torch.from_numpy(x), axis).numpy()
    assert_matches(fn(fa.asarray(x), axis=axis), want)


@pytest.mark.parametrize("shape", [(3, 0), (0, 4), (2, 0, 5)])
def test_norms_over_empty_arrays(backend, shape):
    x = torch.zeros(shape)
    w = torch.ones(shape[-1])
    assert_matches(fa.nn.rms_norm(fa.asarray(x), fa.asarray(w)),
                   torch.nn.functional.rms_norm(x, (shape[-1],), w, eps=1e-6).numpy())
    assert_matches(fa.nn.layer_norm(fa.asarray(x), fa.asarray(w), fa.asarray(w)),
                   torch.nn.functional.layer_norm(x, (shape[-1],), w, w).numpy())


@pytest.mark.parametrize("sq, sk", [(3, 0), (0, 3), (0, 0), (20, 0)])
@_NEEDS_INTERPRETER
def test_attention_with_empty_sequences(backend, sq, sk):
    q, k = torch.randn(1, sq, 2, 16), torch.randn(1, sk, 2, 16)
    got = fa.nn.dot_product_attention(fa.asarray(q), fa.asarray(k), fa.asarray(k))
    # torch's math: a row that sees no key gives 0 (its flash path gives NaN for Sk == 0)
    assert_matches(got, np.zeros((1, sq, 2, 16), np.float32))


@_NEEDS_INTERPRETER
def test_interop_ops_on_empty_tensors():
    x = torch.zeros(3, 0, requires_grad=True)
    y = fat.rms_norm(x, torch.ones(0))
    y.sum().backward()
    assert y.shape == (3, 0) and x.grad.shape == (3, 0)
    assert fat.softmax(torch.zeros(3, 0), dim=-1).shape == (3, 0)
    assert fat.softmax(torch.zeros(0, 3), dim=0, log=True).shape == (0, 3)
    q, k = torch.randn(1, 3, 2, 16), torch.randn(1, 0, 2, 16)
    assert torch.equal(fat.dot_product_attention(q, k, k), torch.zeros(1, 3, 2, 16))


# ---- 4. float16/bfloat16 reductions accumulate in float32 on every backend ----------------------------
@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_half_precision_reductions_accumulate_in_float32(backend, dtype):
    t = torch.full((8,), 6e4).to(torch.float16 if dtype is np.float16 else torch.bfloat16)
    x = fa.asarray(t)
    assert float(fa.mean(x)) == pytest.approx(6e4, rel=1e-2)
    assert fa.mean(x).dtype == x.dtype
    assert float(fa.var(x)) == 0.0 and float(fa.std(x)) == 0.0
    small = fa.asarray(torch.full((4096,), 0.1).to(t.dtype))
    want = 4096 * torch.full((1,), 0.1).to(t.dtype).double().item()  # an fp16 running sum stalls at 256
    assert float(fa.sum(small)) == pytest.approx(want, rel=1e-2)
    assert float(fa.mean(small)) == pytest.approx(0.1, rel=1e-2)
    assert float(fa.prod(fa.asarray(torch.full((20,), 2.0).to(t.dtype)) * 0.5)) == 1.0


# ---- 5. a torch tensor that requires grad: accepted and detached by both entry points -----------------
def test_tensors_requiring_grad_are_taken_detached(backend):
    t = torch.arange(3.0, requires_grad=True)
    for x in (fa.asarray(t), fa.from_dlpack(t)):
        out = torch.from_dlpack(x)
        assert out.data_ptr() == t.data_ptr() and not out.requires_grad
        assert_matches(x * 2, np.array([0, 2, 4], np.float32))


# ---- 7. recording a chain of views is linear ------------------------------------------------------------
def test_long_view_chains_record_in_linear_time():
    # in a subprocess: a fresh interpreter, and a generous bound (8000 transposes took 51 s, now ~0.1 s)
    code = textwrap.dedent("""
        import time, numpy as np, flyarray as fa
        x = fa.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
        y, t0 = x, time.perf_counter()
        for i in range(8000):
            y = y.T if i % 3 else fa.flip(y, axis=0)
        for i in range(2000):
            y = y[::-1, :][:, ::-1]
        print(time.perf_counter() - t0)
        want = np.arange(12, dtype=np.float32).reshape(3, 4)
        for i in range(8000):
            want = want.T if i % 3 else want[::-1]
        assert np.array_equal(np.asarray(y), want)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) < 15.0


def test_view_chain_cache_follows_the_base(backend):
    x = fa.exp(fa.asarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    y = x.T[::-1]
    fa.eval(x)  # the base is realized now; the view still reads the right elements
    z = y.reshape(-1)
    assert_matches(z, np.exp(np.arange(6, dtype=np.float32).reshape(2, 3)).T[::-1].reshape(-1))
    assert_matches(x.T.T, np.exp(np.arange(6, dtype=np.float32).reshape(2, 3)))


# ---- 8. flyarray.interop.torch validates before launching ----------------------------------------------
X = torch.randn(4, 8)
Q = torch.randn(1, 4, 2, 16)


def _mx_operands():
    data, scales = fat.mx_quantize(torch.randn(4, 32), "e4m3")
    return data, data, scales, scales


@pytest.mark.parametrize("call, err, words", [
    (lambda: fat.rms_norm(X, torch.ones(4)), ValueError, r"rms_norm: weight shape \(4,\).*\(4, 8\)"),
    (lambda: fat.rms_norm(X, residual=torch.ones(4, 7)), ValueError, r"rms_norm: residual shape \(4, 7\)"),
    (lambda: fat.rms_norm(X, torch.ones(8, dtype=torch.int64)), TypeError, r"rms_norm: weight has dtype fa.int64"),
    # float64 is accepted since fat.rms_norm runs fa.nn.rms_norm (torch.ops.flyarray.rms_norm), as fa.nn is
    (lambda: fat.rms_norm(X.to(torch.float8_e4m3fn)), TypeError, r"rms_norm: x has dtype fa.float8"),
    (lambda: fat.rms_norm(torch.ones(())), ValueError, r"rms_norm: x must have at least one dimension"),
    (lambda: fat.rms_norm(X, eps="1e-6"), TypeError, r"rms_norm: eps must be a real number"),
    (lambda: fat.rms_norm(X, eps=-1.0), ValueError, r"rms_norm: eps must be >= 0"),
    (lambda: fat.rms_norm(X, eps=float("nan")), ValueError, r"rms_norm: eps must be >= 0, got nan"),
    (lambda: fat.rms_norm(X, residual=X, eps=float("nan")), ValueError, r"rms_norm: eps must be >= 0, got nan"),
    (lambda: fat.rms_norm(X.numpy()), TypeError, r"rms_norm: x must be a torch.Tensor"),
    (lambda: fat.rms_norm(X, torch.ones(8, device="meta")), ValueError, r"rms_norm: .*different devices"),
    (lambda: fat.softmax(X, dim=5), ValueError, r"softmax: dim 5 is out of range .* rank 2"),
    (lambda: fat.softmax(X, dim=1.0), TypeError, r"softmax: dim must be an int"),
    (lambda: fat.softmax(X.int()), TypeError, r"softmax: x has dtype fa.int32"),
    (lambda: fat.softmax(X, log="yes"), TypeError, r"softmax: log must be a bool"),
    (lambda: fat.softmax(X, dim=-3, log=True), ValueError, r"log_softmax: dim -3 is out of range"),
    (lambda: fat.dot_product_attention(Q, torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)), ValueError,
     r"query \(1, 4, 2, 16\) and key \(1, 4, 2, 8\) differ in batch or head_dim"),
    (lambda: fat.dot_product_attention(Q, Q, torch.randn(1, 4, 2, 8)), ValueError, r"key .* and value .* differ"),
    (lambda: fat.dot_product_attention(Q, torch.randn(1, 4, 3, 16), torch.randn(1, 4, 3, 16)), ValueError,
     r"heads \(3\) must divide query heads \(2\)"),
    (lambda: fat.dot_product_attention(Q[0], Q, Q), ValueError, r"query must be \(batch, seq, heads, head_dim\)"),
    (lambda: fat.dot_product_attention(Q, Q.half(), Q), TypeError, r"dtypes differ"),
    (lambda: fat.dot_product_attention(Q, Q, Q, mask=torch.ones(4, 4, dtype=torch.int32)), TypeError,
     r"mask must be bool"),
    (lambda: fat.dot_product_attention(Q, Q, Q, mask=torch.ones(3, 4, dtype=torch.bool)), ValueError,
     r"mask of shape \(3, 4\) does not broadcast"),
    (lambda: fat.dot_product_attention(Q, Q, Q, bias=torch.ones(4, 4, dtype=torch.int64)), TypeError,
     r"bias has dtype fa.int64"),
    (lambda: fat.dot_product_attention(Q, Q, Q, scale="x"), TypeError, r"scale must be a real number"),
    (lambda: fat.dot_product_attention(Q, Q, Q, is_causal="False"), TypeError,
     r"dot_product_attention: is_causal must be a bool, got 'False'"),
    (lambda: fat.matmul(X, X.T, bias=torch.ones(8)), ValueError,
     r"matmul: bias of shape \(8,\) does not broadcast to the product's shape \(4, 4\)"),
    (lambda: fat.matmul(X, X.T, residual=torch.ones(2, 4, 4)), ValueError,
     r"matmul: residual of shape \(2, 4, 4\) does not broadcast to the product's shape \(4, 4\)"),
    (lambda: fat.matmul(torch.ones(2, 4, 8), torch.ones(3, 8, 4)), ValueError,
     r"matmul: the batch dims of a \(2, 4, 8\) and b \(3, 8, 4\) do not broadcast"),
    (lambda: fat.scaled_matmul(*_mx_operands(), out_dtype=torch.int32), TypeError,
     r"scaled_matmul: out_dtype must be a floating torch.dtype, got torch.int32"),
    (lambda: fat.dot_product_attention(Q, Q, torch.randn(1, 4, 2, 16, device="meta")), ValueError,
     r"different devices"),
])
def test_interop_ops_check_their_arguments(call, err, words):
    with pytest.raises(err, match=words):
        call()


def _fa(t):
    return fa.asarray(t.detach().numpy())


@pytest.mark.parametrize("args, kwargs", [
    ((X, torch.ones(4)), {}),
    ((X,), {"residual": torch.ones(4, 7)}),
    ((X, torch.ones(8, dtype=torch.int64)), {}),
    ((X,), {"eps": "1e-6"}),
    ((X.int(),), {}),
])
def test_fa_nn_and_interop_give_the_same_rms_norm_messages(no_evaluation, args, kwargs):
    """fa.nn and flyarray.interop.torch share one set of checks (flyarray/ops/checks.py)."""
    with pytest.raises((ValueError, TypeError)) as from_torch:
        fat.rms_norm(*args, **kwargs)
    with pytest.raises(type(from_torch.value)) as from_fa:
        fa.nn.rms_norm(*[_fa(a) for a in args], **{k: _fa(v) if isinstance(v, torch.Tensor) else v
                                                   for k, v in kwargs.items()})
    assert str(from_fa.value).split(";")[0] == str(from_torch.value).split(";")[0]


def test_fa_nn_and_interop_give_the_same_softmax_and_attention_messages(no_evaluation):
    with pytest.raises(ValueError) as a:
        fat.softmax(X, dim=5)
    with pytest.raises(ValueError) as b:
        fa.nn.softmax(_fa(X), axis=5)
    assert str(a.value).replace("dim", "axis") == str(b.value)
    k = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError) as a:
        fat.dot_product_attention(Q, k, k)
    with pytest.raises(ValueError) as b:
        fa.nn.dot_product_attention(_fa(Q), _fa(k), _fa(k))
    assert str(a.value) == str(b.value)


@_NEEDS_INTERPRETER
def test_interop_ops_still_work():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    y = fat.rms_norm(x, w)
    y.sum().backward()
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (8,), w, eps=1e-6), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fat.softmax(x, dim=0), torch.softmax(x, 0))
    torch.testing.assert_close(fat.dot_product_attention(Q, Q, Q),
                               torch.nn.functional.scaled_dot_product_attention(
                                   *[t.transpose(1, 2) for t in (Q, Q, Q)]).transpose(1, 2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_reference_ops_trusted_to_keep_a_float_dtype_do(dtype):
    """The reference backend skips the dtype check after these ops (backends/reference.py): each torch
    reference returns its same-dtype float arguments' dtype, and writes the same values into ``out=``
    (the backend reuses a dead argument's tensor that way)."""
    from flyarray import dtypes as dt
    from flyarray.backends.reference import _KEEPS_FLOAT_DTYPE
    from flyarray.primitives import ELEMENTWISE
    d = dt.dtype(dtype)
    x = torch.rand(5, dtype=d.torch) * 0.5 + 0.25  # inside every domain here (asin, atanh, log, ...)
    for name in _KEEPS_FLOAT_DTYPE:
        fn = ELEMENTWISE[name].reference_for(d)
        args = (x, x) if ELEMENTWISE[name].arity == 2 else (x,)
        out = fn(*args)
        assert out.dtype == d.torch, (name, out.dtype)
        into = torch.empty_like(x)
        assert fn(*args, out=into) is into and torch.equal(into, out), name


def test_int64_scalars_between_2_31_and_2_32_keep_their_width(backend):
    """A Python int in [2^31, 2^32) meeting int64 arrays: Triton's interpreter held it as uint32 data (its cast
    to int64 only relabelled it), so 3e9 + 3e9 wrapped at 2^32 and powers by 2^31 went wrong."""
    s = 3_000_000_000
    x = fa.asarray(np.array([7, 2], dtype=np.int64))
    assert np.asarray(fa.full((2,), s, dtype=fa.int64) + fa.full((2,), s, dtype=fa.int64)).tolist() == [2 * s] * 2
    assert np.asarray(2147483649 ** x).tolist() == [int(np.int64(2147483649) ** np.int64(k)) for k in (7, 2)]
    assert np.asarray(fa.arange(s, s + 3, dtype=fa.int64) + x[:1]).tolist() == [s + 7, s + 8, s + 9]


def _in_a_forked_child(target):
    """What ``target(queue)`` puts in the queue, run in a forked child: an assertion error if it never finishes."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=(queue,))
    child.start()
    child.join(60)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    assert not hung, f"the forked child's {target.__name__} never finished"
    return queue.get(timeout=5)


def _evaluate_in_child(queue):
    x = fa.asarray(np.arange(8, dtype=np.float32))
    queue.put(float(np.asarray((fa.sin(x) * 3 + 1.0).sum())))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_process_forked_while_another_thread_evaluates_can_evaluate():
    """The child inherited flyarray's locks held by a thread it does not have (multiprocessing's default 'fork'
    on Linux): its first evaluation waited forever (a fuzzing helper, thirty-sixth session)."""
    import threading
    stop = threading.Event()

    def busy():
        i = 0
        while not stop.is_set():
            float(np.asarray((fa.sin(fa.asarray(np.arange(8, dtype=np.float32))) * i).sum()))
            i += 1
    _evaluate_in_child(type("Sink", (), {"put": staticmethod(lambda value: None)}))
    # (evaluated once first: a thread importing a module at the fork leaves the child Python's own import lock,
    # which no library can release; torch imports torch._refs on the first broadcast_shapes)
    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        for _ in range(3):
            assert _in_a_forked_child(_evaluate_in_child) == pytest.approx(
                float((np.sin(np.arange(8)) * 3 + 1).sum()), rel=1e-5)
    finally:
        stop.set()
        thread.join()


def _slow_double(x):
    import time
    time.sleep(1.0)   # the parent's thread is tracing, holding the function's trace lock, during the fork
    return x * 2


_slow_jit = fa.jit(_slow_double)


def _call_slow_jit_in_child(queue):
    queue.put(np.asarray(_slow_jit(fa.ones(5))).tolist())   # a new signature: takes the trace lock


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_process_forked_while_another_thread_traces_can_trace():
    """The per-function trace lock of fa.jit stayed held in the child (found by the re-fuzz of the fork fix)."""
    import threading
    _slow_jit(fa.ones(3))
    tracer = threading.Thread(target=lambda: _slow_jit(fa.ones(4)))
    tracer.start()
    try:
        import time
        time.sleep(0.3)
        assert _in_a_forked_child(_call_slow_jit_in_child) == [2.0] * 5
    finally:
        tracer.join()
