"""Movement ops and basic indexing against numpy, over lazy values, realized values and views of views."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flyarray as fa

from .conftest import LAYOUTS, assert_matches, make_array, promote, sample, scaled

seeds = st.integers(0, 2 ** 32 - 1)


def lazy(values):
    """A lazy (unevaluated) array equal to ``values``: an elementwise node over a realized buffer."""
    return fa.asarray(values) * 1 if values.dtype != np.bool_ else fa.logical_not(fa.asarray(~values))


def sources(values):
    """The same values as a realized buffer, a lazy expression and a non-contiguous view."""
    yield "realized", make_array(values)
    yield "lazy", lazy(values)
    yield "stepped", make_array(values, "stepped")
    yield "negative", make_array(values, "negative_step")


@st.composite
def index_keys(draw, shape):
    """A basic index: ints (+/-), slices with any step, None and at most one Ellipsis."""
    key, dims = [], list(shape)
    use_ellipsis = draw(st.booleans())
    ellipsis_at = draw(st.integers(0, len(dims))) if use_ellipsis else -1
    for i, size in enumerate(dims):
        if i == ellipsis_at:
            key.append(Ellipsis)
        if draw(st.integers(0, 9)) == 0:
            key.append(None)
        if use_ellipsis and i >= ellipsis_at and draw(st.booleans()):
            continue  # let the ellipsis cover the tail (it takes the dims it needs)
        choice = draw(st.integers(0, 2)) if size else 1
        if choice == 0:
            key.append(draw(st.integers(-size, size - 1)))
        else:
            start = draw(st.none() | st.integers(-size - 2, size + 2))
            stop = draw(st.none() | st.integers(-size - 2, size + 2))
            step = draw(st.none() | st.sampled_from([1, 2, 3, -1, -2, -3]))
            key.append(slice(start, stop, step))
    if ellipsis_at == len(dims):
        key.append(Ellipsis)
    if use_ellipsis and Ellipsis not in key:
        key.append(Ellipsis)
    return tuple(key)  # numpy judges the meaning below (keys it rejects are skipped)


@settings(max_examples=scaled(25))
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5), data=st.data(), seed=seeds)
def test_basic_indexing(backend, shape, data, seed):
    values = sample(np.random.default_rng(seed), shape, "int32", -50, 50)
    key = data.draw(index_keys(shape))
    try:
        want = values[key]
    except IndexError:
        return
    for label, x in sources(values):
        got = x[key]
        assert got.shape == want.shape, (label, key)
        assert_matches(got, want)
        assert_matches(got * 2, want * 2)  # the view feeding a kernel, not only exported


def test_indexing_with_every_kind_of_key(backend):
    v = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    for label, x in sources(v):
        for key in [0, -1, (1, 2), (slice(None), -2), (Ellipsis, 1), (None, 0, Ellipsis, None),
                    (slice(None, None, -1), slice(1, None, 2)), (Ellipsis, slice(4, 0, -2)),
                    (0, None, slice(None), -3, slice(None, None, -2)), (), Ellipsis, (slice(5, 1),)]:
            assert_matches(x[key], v[key])


@settings(max_examples=scaled(25))
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4), data=st.data(), seed=seeds,
       layout=st.sampled_from(LAYOUTS))
def test_reshape(backend, shape, data, seed, layout):
    values = sample(np.random.default_rng(seed), shape, "float32")
    size = values.size
    # a random factorization of the size, maybe with one -1
    new = data.draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), max_size=3))
    rest = size // int(np.prod(new)) if size and size % int(np.prod(new)) == 0 else None
    target = tuple(new) + (rest,) if rest is not None else (size,)
    if size == 0:
        target = data.draw(st.sampled_from([(0,), (2, 0), (0, 5)]))
    if data.draw(st.booleans()) and size:
        i = data.draw(st.integers(0, len(target) - 1))
        target = target[:i] + (-1,) + target[i + 1:]
    want = values.reshape(target)
    for x in (make_array(values, layout), lazy(values), make_array(values, layout) + 0):
        got = fa.reshape(x, target)
        assert got.shape == want.shape
        assert_matches(got, want)
        assert_matches(got + 1, want + 1)


def test_reshape_of_transposed_needs_a_copy_and_gets_it(backend):
    v = np.arange(24, dtype=np.float32).reshape(4, 6)
    for x in (make_array(v), lazy(v)):
        t = fa.permute_dims(x, (1, 0))
        assert_matches(fa.reshape(t, (3, 8)), v.T.reshape(3, 8))
        assert_matches(fa.reshape(t, (-1,)) * 2, v.T.reshape(-1) * 2)
        assert_matches(t.flatten(), v.T.flatten())


@settings(max_examples=scaled(20))
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4), data=st.data(), seed=seeds)
def test_permute_moveaxis_flip_squeeze_expand(backend, shape, data, seed):
    v = sample(np.random.default_rng(seed), shape, "int16")
    nd = len(shape)
    perm = tuple(data.draw(st.permutations(range(nd))))
    src = data.draw(st.integers(-nd, nd - 1))
    dst = data.draw(st.integers(-nd, nd - 1))
    flip_axes = tuple(data.draw(st.lists(st.integers(0, nd - 1), unique=True, max_size=nd)))
    new_axis = data.draw(st.integers(-nd - 1, nd))
    for label, x in sources(v):
        assert_matches(fa.permute_dims(x, perm), np.transpose(v, perm))
        assert_matches(fa.moveaxis(x, src, dst), np.moveaxis(v, src, dst))
        assert_matches(fa.flip(x, axis=flip_axes or None), np.flip(v, axis=flip_axes or None))
        assert_matches(fa.expand_dims(x, axis=new_axis), np.expand_dims(v, new_axis))
        ones = tuple(i for i, s in enumerate(shape) if s == 1)
        assert_matches(fa.squeeze(x), np.squeeze(v))
        if ones:
            assert_matches(fa.squeeze(x, axis=ones[-1]), np.squeeze(v, axis=ones[-1]))
        if nd >= 2:
            assert_matches(x.mT, np.swapaxes(v, -1, -2))


@settings(max_examples=scaled(20))
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=1, min_dims=0, max_dims=3, min_side=0, max_side=4),
       seed=seeds)
def test_broadcast_to(backend, shapes, seed):
    (shape,), target = shapes.input_shapes, shapes.result_shape
    v = sample(np.random.default_rng(seed), shape, "float16")
    for label, x in sources(v):
        got = fa.broadcast_to(x, target)
        assert_matches(got, np.broadcast_to(v, target))
        assert_matches(got + 1, np.broadcast_to(v, target) + np.float16(1))


def test_broadcast_arrays(backend):
    a, b = np.arange(3, dtype=np.int8), np.arange(4, dtype=np.int8).reshape(4, 1)
    ga, gb = fa.broadcast_arrays(make_array(a), make_array(b))
    wa, wb = np.broadcast_arrays(a, b)
    assert_matches(ga, wa)
    assert_matches(gb, wb)


def test_chains_of_views(backend):
    v = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    for label, x in sources(v):
        got = fa.flip(fa.permute_dims(x[1:, ::2, ::-1], (2, 0, 1)), axis=1)[None, 1:5, ..., 0]
        want = np.flip(np.transpose(v[1:, ::2, ::-1], (2, 0, 1)), axis=1)[None, 1:5, ..., 0]
        assert_matches(got, want)
        assert_matches(fa.exp(got * 0.01), np.exp(want * np.float32(0.01)), rtol=1e-6)
        # a view of a view of a realized view
        mid = fa.eval(x[::-1, 1:4] + 0)
        assert_matches(fa.reshape(fa.moveaxis(mid, 0, -1)[..., ::3], (-1,)),
                       np.moveaxis(v[::-1, 1:4], 0, -1)[..., ::3].reshape(-1))


def test_a_step_past_the_axis_selects_one_element(backend):
    """numpy: a step longer than the axis picks its first element; huge steps (and a step applied over and
    over to a length-1 axis) must not overflow a stride."""
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    keys = [np.s_[::2**62], np.s_[::-2**62], np.s_[1::2**61], np.s_[-2**70:2**70:2**65], np.s_[5::2**70],
            np.s_[[0, 2], ::2**65]]
    for label, x in sources(v):
        for key in keys:
            assert_matches(x[key], v[key])
        a, w = x, v
        for _ in range(64):
            a, w = a[::2], w[::2]
        assert_matches(a, w)
        assert_matches(x.at[[2, 0], ::2**65].add(1.0), v + np.float32([[1, 0, 0, 0], [0] * 4, [1, 0, 0, 0]]))


def test_view_of_realized_lazy_value(backend):
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = lazy(v) * 2
    t = y.T
    fa.eval(y)  # y is realized now; t still sees it through the view
    assert_matches(t, (v * 2).T)
    assert_matches(t[::-1, 1] + y[0, 0], (v * 2).T[::-1, 1] + v[0, 0] * 2)


def test_iteration_len_and_T(backend):
    v = np.arange(6, dtype=np.int32).reshape(2, 3)
    x = make_array(v)
    assert len(x) == 2
    rows = list(x)
    assert_matches(rows[1], v[1])
    assert_matches(x.T, v.T)


@settings(max_examples=scaled(20))
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4), data=st.data(), seed=seeds,
       dtypes=st.lists(st.sampled_from(["int8", "int32", "float16", "float32", "bool"]), min_size=1, max_size=3))
def test_concat(backend, shape, data, seed, dtypes):
    rng = np.random.default_rng(seed)
    nd = len(shape)
    axis = data.draw(st.integers(-nd, nd - 1))
    parts = []
    for d in dtypes:
        s = list(shape)
        s[axis] = data.draw(st.integers(0, 3))
        parts.append(sample(rng, tuple(s), d, 0, 9))
    layouts = [data.draw(st.sampled_from(LAYOUTS)) for _ in parts]
    arrays = [make_array(p, lay) if i % 2 == 0 else lazy(p) for i, (p, lay) in enumerate(zip(parts, layouts))]
    got = fa.concat(arrays, axis=axis)
    common = dtypes[0]
    for d in dtypes[1:]:
        common = promote(common, d)
    want = np.concatenate([p.astype(common) for p in parts], axis=axis)
    assert str(got.dtype) == f"fa.{common}"
    assert_matches(got, want)
    assert_matches(fa.concat(arrays, axis=None), np.concatenate([p.astype(common).reshape(-1) for p in parts]))


@settings(max_examples=scaled(15))
@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4), n=st.integers(1, 3),
       data=st.data(), seed=seeds)
def test_stack(backend, shape, n, data, seed):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    parts = [sample(rng, shape, "float32") for _ in range(n)]
    arrays = [make_array(p) if i % 2 else lazy(p) for i, p in enumerate(parts)]
    assert_matches(fa.stack(arrays, axis=axis), np.stack(parts, axis=axis))


def test_concat_result_feeds_a_kernel(backend):
    a, b = np.ones((2, 3), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    got = fa.sum(fa.concat([make_array(a), make_array(b) * 2], axis=0) + 1, axis=0)
    assert_matches(got, (np.concatenate([a, b * 2]) + 1).sum(axis=0))


def test_views_do_not_copy_realized_buffers(backend):
    import torch
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    x = fa.asarray(t)
    views = (x[1:, ::2], x.T, fa.reshape(x, (2, 12)), fa.expand_dims(x, 0), x[..., None, 2])
    outs = [torch.from_dlpack(v) for v in views]
    base, nbytes = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
    for out in outs:
        assert base <= out.data_ptr() < base + nbytes
    t.add_(1000)  # the exported views see a write to the original memory
    for out, want in zip(outs, (t[1:, ::2], t.T, t.reshape(2, 12), t[None], t[..., None, 2])):
        assert torch.equal(out, want)


@pytest.mark.parametrize("key", [(slice(None), None, 1), (Ellipsis, None), (None,), (0, None, 0)])
def test_none_inserts_axes(backend, key):
    v = np.arange(6, dtype=np.float64).reshape(2, 3)
    assert_matches(make_array(v)[key], v[key])


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_pulled_back_writes_land_where_the_moved_array_goes(data):
    """views.pulled_back(shape, ops, target): writing an array through the returned view puts each element
    where writing ``apply(ops)`` of it through ``target`` would (permutes and size-1 axes added or
    dropped), checked on index arrays; ops that do not move every element once give None."""
    from flyarray.views import View, apply_all, contiguous_strides, pulled_back
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    moved_shape = tuple(shape[p] for p in perm)
    at = data.draw(st.integers(0, len(moved_shape)))
    grown = moved_shape[:at] + (1,) + moved_shape[at:]
    ops = (("permute", perm), ("reshape", grown))
    buffer_shape = tuple(n + data.draw(st.integers(0, 2)) for n in grown)   # the target: a corner of a bigger buffer
    target = View(grown, contiguous_strides(buffer_shape), data.draw(st.integers(0, 3)))
    where = pulled_back(shape, ops, target)
    assert where is not None
    values = np.arange(int(np.prod(shape))).reshape(shape)
    size = target.offset + sum((n - 1) * s for n, s in zip(buffer_shape, target.strides)) + 1
    direct, through = np.full(size, -1), np.full(size, -1)
    for index in np.ndindex(*shape):
        direct[where.offset + int(np.dot(index, where.strides))] = values[index]
    moved = values.transpose(perm).reshape(grown)
    for index in np.ndindex(*grown):
        through[target.offset + int(np.dot(index, target.strides))] = moved[index]
    assert (direct == through).all()
    assert apply_all(View.contiguous(shape), ops) is not None
    if len(shape) > 1 and shape[0] > 1 and shape[1] > 1:   # merging axes is not a move of whole axes
        assert pulled_back(shape, (("reshape", (shape[0] * shape[1],) + shape[2:]),),
                           View.contiguous((shape[0] * shape[1],) + shape[2:])) is None


def test_a_held_value_read_through_a_view_its_inputs_allow_but_its_buffer_does_not(backend):
    """b's only input is all zero strides, so the flattened broadcast of b is a strided view of that input;
    but b is requested too, so it gets a contiguous buffer, through which that chain is no view: the
    scheduler once pushed the chain anyway and built a load with no view."""
    x = fa.asarray(np.array([1.0, 2.0], dtype=np.float32))
    b = fa.broadcast_to(x[:1], (2,)) * 3
    y = fa.reshape(fa.broadcast_to(b, (2, 2)), (-1,)) * 2
    fa.eval(y, b)
    np.testing.assert_array_equal(np.asarray(y), np.full(4, 6.0, np.float32))
    np.testing.assert_array_equal(np.asarray(b), np.full(2, 3.0, np.float32))


def test_remembered_movement_gives_the_op_chains_view_for_every_layout():
    """runtime.Movement makes a library input's view with one as_strided per remembered input layout: the
    same sizes, strides and storage offset as the op chain, for a new storage offset too; a chain torch must
    copy (a reshape of a transposed tensor) is never remembered and still gives the chain's values."""
    import torch

    from flyarray import runtime

    ops = (("reshape", (2, 3, 3, 4)), ("permute", (2, 0, 3, 1)), ("slice", (1, 0, 0, 0), (1, 1, 2, 1), (1, 2, 2, 3)))
    move = runtime.Movement(ops)
    base = torch.arange(200.0)
    for start in (0, 5, 5, 17):   # a layout seen before, at new offsets
        t = base[start:start + 72].view(6, 12)
        want, got = runtime.apply_movement(t, ops), move(t)
        assert (got.shape, got.stride(), got.storage_offset()) == (want.shape, want.stride(), want.storage_offset())
        assert torch.equal(got, want)
    assert len(move.views) == 1
    copying = runtime.Movement((("reshape", (72,)),))
    t = torch.arange(72.0).view(6, 12).t()
    for _ in range(2):
        assert torch.equal(copying(t), t.reshape(72))
    assert not copying.views


def test_flipping_length_one_axes_is_no_copy():
    """Reversing one element is the identity: copy=False takes it (it raised as 'a view no strides describe')."""
    t = torch.arange(12.0).reshape(3, 4)
    a = fa.asarray(t)
    for v in (fa.flip(a[:1], axis=0), fa.flip(a[:, :1], axis=1), fa.flip(a[:1, :1])):
        out = np.array(v, copy=False)
        assert np.shares_memory(out, t.numpy())
    np.testing.assert_array_equal(np.asarray(fa.flip(a[:, :1])), np.flip(t.numpy()[:, :1]))


# ---- simplifying movement chains (views.prepend) ---------------------------------------------------------------
@st.composite
def movement_ops(draw, shape, max_ops):
    """Up to ``max_ops`` random movement ops starting from ``shape``: (ops, the shape they make)."""
    from flyarray import views
    ops = []
    for _ in range(draw(st.integers(0, max_ops))):
        kind = draw(st.sampled_from(["reshape", "permute", "expand", "slice", "flip"]))
        rank = len(shape)
        if kind == "reshape":
            n = int(np.prod(shape))
            dims = []
            for _ in range(draw(st.integers(0, 3))):
                d = draw(st.sampled_from([k for k in (1, 2, 3, 4, 6) if n % k == 0] or [1]))
                dims.append(d)
                n //= d
            dims.append(n)
            op = ("reshape", tuple(draw(st.permutations(dims))))
        elif kind == "permute":
            op = ("permute", tuple(draw(st.permutations(range(rank)))))
        elif kind == "expand":
            op = ("expand", tuple(draw(st.sampled_from([1, 3])) if s == 1 else s for s in shape))
        elif kind == "slice":
            starts, steps, out = [], [], []
            for s in shape:
                start = draw(st.integers(0, max(s - 1, 0)))
                step = draw(st.integers(1, 3))
                size = draw(st.integers(0, len(range(start, s, step)))) if s else 0
                starts.append(start if s else 0)
                steps.append(step)
                out.append(size)
            op = ("slice", tuple(starts), tuple(steps), tuple(out))
        else:
            op = ("flip", tuple(sorted(draw(st.sets(st.integers(0, rank - 1))) if rank else ())))
        ops.append(op)
        shape = views.output_shape(op, shape)
    return tuple(ops), shape


def _numpy_move(a, ops):
    """The movement ``ops`` applied to numpy array ``a`` by their meaning."""
    for op in ops:
        kind = op[0]
        if kind == "reshape":
            a = a.reshape(op[1])
        elif kind == "permute":
            a = a.transpose(op[1])
        elif kind == "expand":
            a = np.broadcast_to(a, op[1])
        elif kind == "slice":
            a = a[tuple(slice(s, s + t * n, t) for s, t, n in zip(op[1], op[2], op[3]))]
        else:
            a = np.flip(a, op[1]) if op[1] else a
    return a


def _addresses(view):
    """Each element's address under ``view``, as an array of its shape."""
    index = np.indices(view.shape, dtype=np.int64) if view.shape else np.zeros((0,), np.int64)
    return view.offset + sum((index[k] * st for k, st in enumerate(view.strides)), np.zeros(view.shape, np.int64))


@settings(max_examples=300, deadline=None)
@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4), data=st.data())
def test_prepended_chains_address_what_the_raw_chain_does(shape, data):
    """views.prepend merges a view's ops into the chain below it (cancelling, composing): from any strided base
    (contiguous, transposed, stepped, flipped, broadcast) it must address the elements the raw chain does."""
    from flyarray import views
    from flyarray.views import View
    ops, mid = data.draw(movement_ops(shape, 4))
    rest, _ = data.draw(movement_ops(mid, 6))
    chain = views.prepend(mid, rest, ())
    combined = views.prepend(shape, ops, chain)
    assert len(combined) <= len(ops) + len(rest)
    contiguous = View.contiguous(shape)
    bases = [contiguous, View(shape, tuple(0 for _ in shape), 7),
             View(shape, tuple(s * 3 for s in contiguous.strides), 2),
             views.apply(View.contiguous(shape[::-1]), ("permute", tuple(range(len(shape)))[::-1])),
             views.apply(contiguous, ("flip", tuple(range(len(shape)))))]
    for base in bases:
        want = _numpy_move(_addresses(base), ops + rest)
        raw = views.apply_all(base, ops + rest)
        got = views.apply_all(base, combined)
        if raw is not None:
            assert got is not None, (base, ops + rest, combined)
        if got is not None:
            np.testing.assert_array_equal(_addresses(got), want)


def test_a_chain_that_undoes_itself_vanishes():
    from flyarray import views
    step = (("reshape", (2, 2)), ("permute", (1, 0)), ("reshape", (4,)))
    assert views.prepend((4,), step, step) == ()
    assert views.prepend((2, 3), (("permute", (1, 0)),), (("permute", (1, 0)),)) == ()
    assert views.prepend((5,), (("slice", (1,), (2,), (2,)),), (("slice", (1,), (1,), (1,)),)) == \
        (("slice", (3,), (2,), (1,)),)
