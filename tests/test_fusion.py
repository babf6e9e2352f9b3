"""How many kernels a program launches: the fusion rules of schedule.py, counted with fa.stats().

Counts are the same on the reference backend (it runs the scheduled kernels op by op) and on the
interpret backend (it runs the generated Triton); values are checked too, so a count cannot be met
by dropping work.
"""
import numpy as np
import pytest
import torch

import flyarray as fa

from .conftest import assert_matches, sample


def launched(*arrays):
    """Evaluate ``arrays`` together from a clean counter; return the kernels launched."""
    fa.reset_stats()
    fa.eval(*arrays)
    return fa.stats()["kernels_launched"]


def rng():
    return np.random.default_rng(0)


def test_six_op_elementwise_chain_with_broadcast_is_one_kernel(backend):
    a, b = sample(rng(), (5, 7), "float32", -1, 1), sample(rng(), (7,), "float32", 0.5, 2)
    x, y = fa.asarray(a), fa.asarray(b)
    out = fa.sqrt(fa.abs(fa.exp(x) * y - 1.0) + 0.5) / y
    assert launched(out) == 1
    want = np.sqrt(np.abs(np.exp(a.astype(np.float64)) * b - 1) + 0.5) / b
    assert_matches(out, want.astype(np.float32), rtol=1e-5)


def test_sum_of_exp_times_y_is_one_kernel(backend):
    a, b = sample(rng(), (4, 9), "float32", -1, 1), sample(rng(), (4, 9), "float32", -1, 1)
    out = fa.sum(fa.exp(fa.asarray(a)) * fa.asarray(b), axis=1)
    assert launched(out) == 1
    assert_matches(out, (np.exp(a.astype(np.float64)) * b).sum(axis=1).astype(np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(3, 10), (2, 3, 17), (1, 1)])
def test_softmax_is_one_kernel(backend, shape):
    a = sample(rng(), shape, "float32", -3, 3)
    out = fa.nn.softmax(fa.asarray(a))
    assert launched(out) == 1
    e = np.exp(a.astype(np.float64) - a.max(axis=-1, keepdims=True))
    assert_matches(out, (e / e.sum(axis=-1, keepdims=True)).astype(np.float32), rtol=1e-5, atol=1e-7)


def test_log_softmax_is_one_kernel(backend):
    a = sample(rng(), (3, 12), "float32", -3, 3)
    out = fa.nn.log_softmax(fa.asarray(a))
    assert launched(out) == 1
    s = a.astype(np.float64) - a.max(axis=-1, keepdims=True)
    assert_matches(out, (s - np.log(np.exp(s).sum(axis=-1, keepdims=True))).astype(np.float32), rtol=1e-5, atol=1e-6)


def rms_norm_np(h, w=None, eps=1e-6):
    h = h.astype(np.float64)
    y = h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def test_rms_norm_times_weight_is_one_kernel(backend):
    a, w = sample(rng(), (6, 16), "float32", -2, 2), sample(rng(), (16,), "float32", 0.5, 1.5)
    out = fa.nn.rms_norm(fa.asarray(a)) * fa.asarray(w)
    assert launched(out) == 1
    assert_matches(out, rms_norm_np(a, w).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_add_then_rms_norm_stores_both_in_one_kernel(backend):
    a, r = sample(rng(), (5, 16), "float32", -2, 2), sample(rng(), (5, 16), "float32", -2, 2)
    w = sample(rng(), (16,), "float32", 0.5, 1.5)
    h = fa.asarray(a) + fa.asarray(r)
    y = fa.nn.rms_norm(h, fa.asarray(w))
    assert launched(h, y) == 1
    assert_matches(h, a + r)
    assert_matches(y, rms_norm_np(a + r, w).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_rms_norm_with_residual_argument_is_one_kernel(backend):
    a, r = sample(rng(), (3, 8), "float16", -2, 2), sample(rng(), (3, 8), "float16", -2, 2)
    y, h = fa.nn.rms_norm(fa.asarray(a), residual=fa.asarray(r))
    assert launched(y, h) == 1
    assert_matches(h, a + r)
    assert_matches(y, rms_norm_np((a + r).astype(np.float32)).astype(np.float16), rtol=3e-3, atol=3e-3)


def test_reduction_used_on_another_domain_is_two_kernels(backend):
    a, b = sample(rng(), (4, 6), "float32", -1, 1), sample(rng(), (3, 5), "float32", -1, 1)
    total = fa.sum(fa.asarray(a))  # a scalar, then broadcast over an unrelated shape
    out = fa.asarray(b) * total
    assert launched(out) == 2
    assert_matches(out, (b.astype(np.float64) * a.astype(np.float64).sum()).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_column_reduction_feeding_a_row_op_is_two_kernels(backend):
    a = sample(rng(), (4, 6), "float32", -1, 1)
    x = fa.asarray(a)
    out = fa.sum(x - fa.mean(x, axis=0), axis=1)  # a reduction over axis 0 used by one over axis 1
    assert launched(out) == 2
    assert_matches(out, (a - a.mean(axis=0)).sum(axis=1), rtol=1e-5, atol=1e-6)


def test_views_never_launch_kernels_on_their_own(backend):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = fa.asarray(a)
    fa.reset_stats()
    views = [x[1], x[:, ::-1], fa.permute_dims(x, (2, 0, 1)), fa.reshape(x, (6, 4)), fa.broadcast_to(x, (5, 2, 3, 4)),
             fa.expand_dims(x, 1), fa.flip(x), fa.squeeze(x[:, :1]), fa.moveaxis(x, 0, -1), x[None, ..., 2]]
    for v in views:
        np.asarray(v)
    assert fa.stats()["kernels_launched"] == 0
    # and a view of a lazy value runs only the value's kernel
    y = fa.exp(x)
    assert launched(fa.permute_dims(y, (2, 1, 0))[::2]) == 1


def test_views_inside_a_chain_stay_fused(backend):
    a = sample(rng(), (4, 6), "float32", -1, 1)
    x = fa.asarray(a)
    out = fa.exp(x.T[::-1] * 2)[1:, None] + fa.flip(x, axis=0).T[::-1][1:, None]
    assert launched(out) == 1
    want = np.exp(a.T[::-1].astype(np.float64) * 2)[1:, None] + np.flip(a, axis=0).T[::-1][1:, None]
    assert_matches(out, want.astype(np.float32), rtol=1e-5)


def test_shared_subexpression_is_computed_once_per_kernel(backend):
    a = sample(rng(), (3, 5), "float32", -1, 1)
    e = fa.exp(fa.asarray(a))
    out = e * e + e
    assert launched(out) == 1
    ea = np.exp(a.astype(np.float64))
    assert_matches(out, (ea * ea + ea).astype(np.float32), rtol=1e-5)


def test_realized_values_are_not_recomputed(backend):
    a = sample(rng(), (3, 5), "float32", -1, 1)
    y = fa.exp(fa.asarray(a))
    assert launched(y) == 1
    assert launched(y) == 0  # already held
    z = y + 1
    assert launched(z) == 1
    assert_matches(z, (np.exp(a.astype(np.float64)) + 1).astype(np.float32), rtol=1e-6)


def test_evaluation_happens_only_on_triggers(backend):
    x = fa.asarray(np.ones((2, 2), np.float32))
    fa.reset_stats()
    y = fa.sum(fa.exp(x) * 3, axis=0) + fa.mean(x)
    _ = (y.shape, y.dtype, y.ndim, y.size, y.device)
    assert fa.stats()["evaluations"] == 0 and fa.stats()["kernels_launched"] == 0
    float(y[0])
    assert fa.stats()["evaluations"] == 1


def _softmax_np(b, axis=-1):
    e = np.exp(b - b.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# Programs that mix reductions, views and elementwise ops across kernel boundaries.
COMPOSITES = {
    "reshape of a transposed lazy value, reduced": (
        lambda x: fa.sum(fa.reshape(fa.exp(x).T, (-1, 8)), axis=1),
        lambda a: np.exp(a).T.reshape(-1, 8).sum(1)),
    "concat of views, reduced": (
        lambda x: fa.sum(fa.concat([x[:, ::-2], fa.exp(x)[:, 1::2]], axis=1), axis=1),
        lambda a: np.concatenate([a[:, ::-2], np.exp(a)[:, 1::2]], 1).sum(1)),
    "stack then mean over two axes": (
        lambda x: fa.mean(fa.stack([x, x * 2, x[::-1]], axis=1), axis=(0, 2)),
        lambda a: np.stack([a, a * 2, a[::-1]], 1).mean((0, 2))),
    "row max subtracted, then a reversed transpose": (
        lambda x: (x - fa.max(x, axis=1, keepdims=True)).T[::-1],
        lambda a: (a - a.max(1, keepdims=True)).T[::-1]),
    "softmax of a transposed view": (lambda x: fa.nn.softmax(x.T), lambda a: _softmax_np(a.T)),
    "softmax over axis 0": (lambda x: fa.nn.softmax(x, axis=0), lambda a: _softmax_np(a, axis=0)),
    "layer_norm": (lambda x: fa.nn.layer_norm(x),
                   lambda a: (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)),
    "reduction of a broadcast column": (
        lambda x: fa.sum(fa.broadcast_to(x[:, :1], (4, 6)) * x, axis=0),
        lambda a: (np.broadcast_to(a[:, :1], (4, 6)) * a).sum(0)),
    "two full reductions combined": (lambda x: fa.sum(x) / fa.max(x), lambda a: np.asarray(a.sum() / a.max())),
    "argmax over axis 0 of an expression": (lambda x: fa.argmax(fa.sin(x), axis=0),
                                            lambda a: np.argmax(np.sin(a), axis=0)),
    "row sums as a column": (lambda x: fa.sum(x, axis=1)[:, None] * x, lambda a: a.sum(1)[:, None] * a),
    "column means broadcast back": (lambda x: x - fa.mean(x, axis=0, keepdims=True),
                                    lambda a: a - a.mean(0, keepdims=True)),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composite_programs_match_numpy(backend, name):
    fn, ref = COMPOSITES[name]
    a = sample(rng(), (4, 6), "float32", -2, 2)
    got = np.asarray(fn(fa.asarray(a)))
    want = ref(a.astype(np.float64))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_jit_traces_once_per_signature_and_rejects_unhashable_statics():
    import torch
    import flyarray as fa
    calls = []

    def f(a, scale):
        calls.append(1)
        return fa.exp(a) * scale

    g = fa.jit(f)
    x = torch.randn(4, 5)
    first = torch.from_dlpack(g(x, 2.0)).clone()
    second = torch.from_dlpack(g(torch.randn(4, 5), 2.0))
    assert len(calls) == 1 and second.shape == first.shape
    g(torch.randn(7, 3), 2.0)
    assert len(calls) == 2  # a new shape is a new trace
    torch.testing.assert_close(first, x.exp() * 2.0)
    with pytest.raises(TypeError, match="neither an array nor hashable"):
        g(x, {1, 2})  # a set: neither an array, a container of arrays, nor hashable


def test_a_value_stored_along_the_way_is_not_read_before_its_kernel_runs():
    """A Llama block's backward once scheduled a kernel reading the residual sum h before the kernel
    that stores h along the way had run (KeyError in the plan). Values a kernel stores as it goes
    become available only when that kernel is finished."""
    import torch
    from flyarray.bench import torch_models
    (case,) = torch_models._llama_cases(torch.device("cpu"), small=True)
    torch.testing.assert_close(case.ours(), case.eager(), rtol=1e-4, atol=1e-4)


def test_siblings_reading_the_same_inputs_are_one_kernel(backend):
    """Two values evaluated together that read the same arrays: one kernel reads each input once and
    stores both (horizontal fusion), inside fa.jit too."""
    a, b = sample(rng(), (6, 9), "float32", -1, 1), sample(rng(), (6, 9), "float32", -1, 1)
    x, y = fa.asarray(a), fa.asarray(b)
    first, second = x * y + 1.0, fa.sin(x) * y
    assert launched(first, second) == 1
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert_matches(first, (a64 * b64 + 1).astype(np.float32), rtol=1e-6)
    assert_matches(second, (np.sin(a64) * b64).astype(np.float32), rtol=1e-5)
    both = fa.jit(lambda p, q: (p * q + 1.0, fa.sin(p) * q))
    fa.reset_stats()
    outs = both(x, y)
    fa.eval(*outs)
    assert fa.stats()["kernels_launched"] == 1
    assert_matches(outs[1], (np.sin(a64) * b64).astype(np.float32), rtol=1e-5)


def test_a_sibling_that_needs_this_kernels_result_is_not_fused(backend):
    """``second`` reads a matmul of ``first``: it cannot be computed by the kernel that makes ``first``
    (the matmul runs between), so it gets a kernel of its own, and both are right."""
    a, w = sample(rng(), (4, 4), "float32", -1, 1), sample(rng(), (4, 4), "float32", -1, 1)
    x = fa.asarray(a)
    first = x * 2.0
    second = fa.sin(x) * (first @ fa.asarray(w))
    assert launched(first, second) == 3    # first; the matmul; second
    a64 = a.astype(np.float64)
    assert_matches(second, (np.sin(a64) * ((2 * a64) @ w)).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_sibling_fusion_follows_reshapes_of_shared_inputs(backend):
    """Torch graphs reshape to the batch shape around every op: siblings reached through such views of
    a shared input still share one kernel (the SwiGLU backward's two gradients)."""
    g, u, d = (sample(rng(), (8, 16), "float32", -2, 2) for _ in range(3))
    gate, up, dy = (fa.asarray(t).reshape(1, 8, 16) for t in (g, u, d))
    sig = 1.0 / (1.0 + fa.exp(-gate))
    d_up = dy * gate * sig
    d_gate = dy * up * sig * (1.0 + gate * (1.0 - sig))
    assert launched(d_up, d_gate) == 1
    g64, u64, d64 = (t.astype(np.float64) for t in (g, u, d))
    s64 = 1 / (1 + np.exp(-g64))
    assert_matches(d_gate, (d64 * u64 * s64 * (1 + g64 * (1 - s64))).reshape(1, 8, 16).astype(np.float32),
                   rtol=1e-5, atol=1e-6)


def _attention_grads_stacked(q, k, v, ct, also=None):
    out, vjp = fa.vjp(lambda a, b, c: fa.nn.dot_product_attention(a, b, c, is_causal=True),
                      *(fa.asarray(t) for t in (q, k, v)))
    grads = vjp(fa.asarray(ct))
    return fa.stack(grads, axis=2), (grads[0] * 2.0 if also else None)


def _torch_attention_grads(q, k, v, ct):
    import torch
    ts = [t.clone().requires_grad_() for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in ts), is_causal=True)
    out.transpose(1, 2).backward(ct)
    return [t.grad for t in ts]


def test_a_stack_of_library_outputs_is_written_by_the_library_call(backend):
    """dq, dk, dv stacked (a qkv gradient): the attention backward writes each straight into its slice of
    the stack (``Library.writes_into``), so no kernel copies them there; the values are torch's."""
    import torch
    torch.manual_seed(0)
    q, k, v, ct = (torch.randn(2, 9, 2, 16) for _ in range(4))
    fa.eval(_attention_grads_stacked(q, k, v, ct)[0])
    with fa.profile() as profile:
        stacked, _ = _attention_grads_stacked(q, k, v, ct)
        fa.eval(stacked)
    assert [r.name for r in profile.rows if r.name.startswith("fused")] == [], [r.name for r in profile.rows]
    torch.testing.assert_close(stacked.torch(), torch.stack(_torch_attention_grads(q, k, v, ct), 2),
                               rtol=1e-5, atol=1e-5)


def test_a_library_output_read_elsewhere_is_still_copied_into_the_stack(backend):
    """dq also feeds another value: it keeps a buffer of its own, and the call, planned for that value
    before the stack is, writes every output to a buffer of its own: kernels copy them into the stack.
    Both results are right."""
    import torch
    torch.manual_seed(1)
    q, k, v, ct = (torch.randn(1, 7, 2, 16) for _ in range(4))
    with fa.profile() as profile:
        stacked, doubled = _attention_grads_stacked(q, k, v, ct, also=True)
        fa.eval(stacked, doubled)
    calls = {}
    for r in profile.rows:
        calls[r.name] = calls.get(r.name, 0) + r.calls
    assert {name: n for name, n in calls.items() if name.startswith("fused")} == {"fused: copy": 3,
                                                                                  "fused: multiply": 1}, calls
    want = _torch_attention_grads(q, k, v, ct)
    torch.testing.assert_close(stacked.torch(), torch.stack(want, 2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(doubled.torch(), 2 * want[0], rtol=1e-5, atol=1e-5)


def test_a_value_read_through_a_leading_slice_is_stored_whole(backend):
    """``t`` is wanted and the kernel of ``t[0] + 1`` reads it through a slice that starts at 0: that
    kernel must not store ``t`` along the way (it covers half of it; ``fa.jit(fa.grad)`` of a shared stack
    once returned garbage or raised this way)."""
    a = sample(rng(), (2, 3, 4), "float32", -1, 1)
    t = fa.asarray(a) * 2.0
    u = t[0] + 1.0
    fa.eval(t, u)
    assert_matches(t, (a.astype(np.float64) * 2).astype(np.float32), rtol=1e-6)
    assert_matches(u, (a[0].astype(np.float64) * 2 + 1).astype(np.float32), rtol=1e-6)

    def loss(x, d):
        s = fa.stack([d, x], axis=0)
        return fa.sum(d * 0.5) + fa.sum(s[1] - s[0])
    ones = fa.asarray(np.ones((2, 2), np.float32))
    gx, gd = fa.jit(fa.grad(loss, argnums=(0, 1)))(ones, ones)
    assert_matches(gx, np.ones((2, 2), np.float32))
    assert_matches(gd, np.full((2, 2), -0.5, np.float32))


def test_a_concat_part_evaluated_after_recording_is_copied_in(backend):
    """``a`` is recorded into a concat while lazy, then evaluated alone: the concat copies its buffer
    (it once tried to recompute it from inputs the evaluation had dropped: IndexError)."""
    x = fa.asarray(np.arange(4, dtype=np.float32))
    a = x + 1.0
    c = fa.concat([x, a])
    assert_matches(a, np.arange(1, 5, dtype=np.float32))
    assert_matches(c, np.array([0, 1, 2, 3, 1, 2, 3, 4], np.float32))


def test_equal_expressions_evaluated_together_get_buffers_of_their_own(backend):
    """``x + y`` twice, evaluated together, is one op in one kernel stored twice: the two arrays still
    have separate buffers (a write through one array's torch tensor does not change the other)."""
    x, y = (fa.asarray(np.ones((2, 2), np.float32)) for _ in range(2))
    a, b = x + y, x + y
    assert launched(a, b) == 1
    a.torch()[0, 0] = 100.0
    assert_matches(b, np.full((2, 2), 2, np.float32))


def test_a_row_statistic_another_kernel_needs_is_stored_not_recomputed(backend):
    """An RMSNorm-style backward: ``y = dy * r`` (a row kernel computing r = rsqrt(mean(x*x))) and the weight
    gradient ``sum(dy * x * r, axis=0)`` (a column reduction, another kernel). The row kernel stores r's
    reduction for the column kernel (one value a row) instead of a third kernel reading x again to
    recompute it: 2 kernels, not 3."""
    a, d = sample(rng(), (16, 64), "float32", -1, 1), sample(rng(), (16, 64), "float32", -1, 1)
    x, dy = fa.asarray(a), fa.asarray(d)
    r = fa.rsqrt(fa.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    w = fa.sum(dy * x * r, axis=0)
    y = dy * r
    assert launched(w, y) == 2
    r64 = 1 / np.sqrt((a.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    assert_matches(w, (d * a * r64).sum(0).astype(np.float32), rtol=1e-4, atol=1e-5)
    assert_matches(y, (d * r64).astype(np.float32), rtol=1e-5, atol=1e-6)


def test_a_half_precision_reduction_recomputed_in_a_later_kernel_agrees_with_its_stored_copy(backend):
    """softmax(prod(exp(x))) in bfloat16: the max and sum kernels read prod's stored (rounded) copy while
    the last kernel recomputes prod inline; rounded there too, the largest entry is exactly 1."""
    x = fa.asarray(torch.tensor([[3.0, 4.5], [-2.0, -2.0]], dtype=torch.bfloat16))
    y = fa.nn.softmax(fa.prod(fa.exp(x), axis=-1), axis=-1)
    assert y.torch().float().tolist() == [1.0, 0.0]
