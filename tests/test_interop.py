"""Zero-copy interop: torch and numpy in and out through DLPack keep the same memory."""
import ctypes

import numpy as np
import pytest
import torch

import flyarray as fa

from .conftest import assert_matches

from .interpreter_probe import INTERPRETER_PROBLEM  # noqa: E402

# Library kernels on CPU tensors run in Triton's interpreter, which Triton 3.6 + numpy >= 2.4 breaks
_NEEDS_INTERPRETER = pytest.mark.skipif(INTERPRETER_PROBLEM is not None, reason=str(INTERPRETER_PROBLEM))

DTYPES = [torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]


def np_ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_round_trip_keeps_the_pointer(backend, dtype):
    t = torch.arange(12).reshape(3, 4).to(dtype)
    out = torch.from_dlpack(fa.asarray(t))
    assert out.data_ptr() == t.data_ptr()
    assert out.dtype == dtype and out.shape == t.shape and out.stride() == t.stride()


@pytest.mark.parametrize("make", [
    lambda: torch.arange(24.0).reshape(4, 6).T,
    lambda: torch.arange(24.0)[3::2],
    lambda: torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1),
    lambda: torch.zeros(()),
    lambda: torch.zeros((0, 3)),
    lambda: torch.arange(3.0).expand(4, 3),
])
def test_torch_round_trip_of_strided_tensors(backend, make):
    t = make()
    out = torch.from_dlpack(fa.asarray(t))
    assert out.data_ptr() == t.data_ptr()
    assert out.shape == t.shape
    if t.numel() > 1:
        assert out.stride() == t.stride()
    assert torch.equal(out, t)


@pytest.mark.parametrize("dtype", ["bool", "int8", "int64", "uint8", "float16", "float32", "float64"])
def test_numpy_round_trip_keeps_the_pointer(backend, dtype):
    a = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    x = fa.asarray(a)
    via_array = np.asarray(x)
    via_dlpack = np.from_dlpack(x)
    assert np_ptr(via_array) == np_ptr(a)
    assert np_ptr(via_dlpack) == np_ptr(a)
    np.testing.assert_array_equal(via_dlpack, a)
    x2 = fa.from_dlpack(a)
    assert np_ptr(np.from_dlpack(x2)) == np_ptr(a)


def test_numpy_writes_are_visible(backend):
    a = np.zeros(4, np.float32)
    x = fa.asarray(a)
    a[2] = 5
    assert_matches(x + 1, np.array([1, 1, 6, 1], np.float32))


def test_computed_array_exports_the_same_buffer_twice(backend):
    x = fa.exp(fa.asarray(np.ones((3, 5), np.float32)))
    t1 = torch.from_dlpack(x)
    t2 = torch.from_dlpack(x)
    assert t1.data_ptr() == t2.data_ptr()
    n1, n2 = np.asarray(x), np.from_dlpack(x)
    assert np_ptr(n1) == np_ptr(n2) == t1.data_ptr()
    assert x.__dlpack_device__() == t1.__dlpack_device__()


def test_dlpack_device_does_not_evaluate_and_from_dlpack_evaluates_once(backend):
    t = torch.randn(6, 7)
    x = fa.exp(fa.asarray(t))
    row_sums = fa.sum(x * 2.0, axis=-1)  # a view (squeeze) of a reduction: the result is not a plain buffer
    fa.reset_stats()
    assert row_sums.__dlpack_device__() == t.__dlpack_device__()
    assert fa.stats()["evaluations"] == 0
    out = torch.from_dlpack(row_sums)
    assert fa.stats()["evaluations"] == 1
    torch.testing.assert_close(out, (torch.exp(t) * 2).sum(-1))


@pytest.mark.parametrize("key", [
    (slice(1, None), slice(None, None, 2)), (1,), (slice(None), 2), (None, Ellipsis, 1), (slice(0, 3, 2), None),
    (Ellipsis,), (slice(2, 2),),
])
def test_basic_index_views_export_without_copy(backend, key):
    t = torch.arange(30.0).reshape(5, 6)
    x = fa.asarray(t)
    out = torch.from_dlpack(x[key])
    want = t[key]
    assert torch.equal(out, want)
    if want.numel():
        assert out.data_ptr() == want.data_ptr()
        assert [s for s, n in zip(out.stride(), out.shape) if n > 1] == \
            [s for s, n in zip(want.stride(), want.shape) if n > 1]   # (a size-1 axis' stride is never used)


def test_views_of_computed_arrays_export_without_copy(backend):
    y = fa.asarray(np.arange(24, dtype=np.float32).reshape(4, 6)) * 2
    base = torch.from_dlpack(y)
    for v, want in [(y.T, base.T), (y[1:, ::3], base[1:, ::3]), (fa.reshape(y, (2, 12)), base.reshape(2, 12))]:
        out = torch.from_dlpack(v)
        assert out.data_ptr() == want.data_ptr()
        assert torch.equal(out, want)


def test_negative_step_views_export_correct_values(backend):
    t = torch.arange(12.0).reshape(3, 4)
    out = torch.from_dlpack(fa.asarray(t)[::-1, 1::2])  # torch cannot express negative strides: a copy is fine
    assert torch.equal(out, t.flip(0)[:, 1::2])


def test_dlpack_protocol_arguments(backend):
    x = fa.asarray(torch.arange(4.0)) + 1
    cap = x.__dlpack__(stream=None)
    assert torch.equal(torch.from_dlpack(cap), torch.arange(4.0) + 1)
    x.__dlpack__(max_version=(1, 0))
    copied = torch.from_dlpack(x.__dlpack__(copy=True))
    assert copied.data_ptr() != torch.from_dlpack(x).data_ptr()


def _capsule_flags(capsule) -> int:
    from flyarray import dlpack
    return ctypes.c_uint64.from_address(dlpack._capsule_pointer(capsule, b"dltensor_versioned") + 24).value


def test_versioned_capsules_say_whether_they_are_copies(backend):
    """DLPack 1.0's IS_COPIED flag (bit 1) tells the consumer the memory is its own to write: set on every
    export that copies (copy=True, a view with no strides of its own, a move to the CPU), never on a shared one."""
    t = torch.arange(12.0).reshape(3, 4)
    x = fa.eval(fa.asarray(t) * 2)
    shared = x.__dlpack__(max_version=(1, 0))
    assert _capsule_flags(shared) & 2 == 0
    assert torch.from_dlpack(shared).data_ptr() == x.torch().data_ptr()
    assert _capsule_flags(x.__dlpack__(max_version=(1, 0), copy=True)) & 2
    flipped = fa.flip(x, axis=0)
    capsule = flipped.__dlpack__(max_version=(1, 0))
    assert _capsule_flags(capsule) & 2
    assert torch.equal(torch.from_dlpack(capsule), (t * 2).flip(0))
    assert _capsule_flags(fa.asarray(t).__dlpack__(max_version=(1, 0), dl_device=(1, 0))) & 2 == 0
    if torch.cuda.is_available():
        on_gpu = fa.asarray(t.cuda())
        assert _capsule_flags(on_gpu.__dlpack__(max_version=(1, 0), dl_device=(1, 0))) & 2
        assert _capsule_flags(on_gpu.__dlpack__(max_version=(1, 0))) & 2 == 0


class _Producer:
    """A DLPack producer that is neither numpy nor torch nor fa (as JAX or CuPy would be)."""
    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_from_dlpack_hands_copy_to_other_producers(backend):
    """copy=False reaches a third-party producer, which refuses what it cannot export without copying (a flip):
    it used to be taken silently as a copy; copy=True gets memory of its own, copied once."""
    flipped = fa.flip(fa.asarray(torch.arange(4.0)) + 1, axis=0)
    with pytest.raises(BufferError):
        fa.from_dlpack(_Producer(flipped), copy=False)
    base = fa.eval(fa.asarray(torch.arange(4.0)) * 2)
    shared = fa.from_dlpack(_Producer(base), copy=False)
    assert shared.torch().data_ptr() == base.torch().data_ptr()
    own = fa.from_dlpack(_Producer(base), copy=True)
    assert own.torch().data_ptr() != base.torch().data_ptr() and own.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert fa.from_dlpack(_Producer(flipped)).tolist() == [4.0, 3.0, 2.0, 1.0]


def test_copy_false_refuses_every_export_and_import_that_must_copy(backend):
    """copy=False means no copy or an error (DLPack, __dlpack__ and from_dlpack: BufferError, as the array API
    says; numpy: ValueError), never a
    silent copy: a flip has no strides of its own, a dtype change and a device move make new memory."""
    y = fa.eval(fa.asarray(torch.arange(6, dtype=torch.float32)) * 2)
    flipped = fa.flip(y, axis=0)
    with pytest.raises(BufferError, match="copy=False"):
        flipped.__dlpack__(copy=False)
    with pytest.raises(ValueError, match="copy=False"):
        np.array(flipped, copy=False)
    with pytest.raises(ValueError, match="copy=False"):
        np.array(y, dtype=np.float64, copy=False)
    with pytest.raises(BufferError, match="from_dlpack: copy=False"):
        fa.from_dlpack(torch.arange(3.0), device="meta", copy=False)
    with pytest.raises(BufferError, match="from_dlpack: copy=False"):
        fa.from_dlpack(np.arange(3.0)[::-1], copy=False)
    # what needs no copy still shares, and the copies asked for still come
    base = y.torch().data_ptr()
    assert torch.from_dlpack(y[1:4].__dlpack__(copy=False)).data_ptr() == base + 4
    assert np_ptr(np.array(y[1:4], copy=False)) == base + 4
    assert np_ptr(np.array(y, dtype=np.float32, copy=False)) == base
    assert torch.from_dlpack(flipped.__dlpack__(copy=True)).tolist() == [10.0, 8.0, 6.0, 4.0, 2.0, 0.0]
    assert np.array(flipped, dtype=np.float64).tolist() == np.asarray(flipped).tolist() == [10, 8, 6, 4, 2, 0]
    assert fa.from_dlpack(torch.arange(3.0), device="meta").device.type == "meta"


def test_capsules_of_a_realized_array_are_its_buffer_in_every_protocol_form(backend):
    x = (fa.asarray(torch.arange(6.0)) * 2).block_until_ready()
    buffer = x.torch()
    for kwargs in ({}, {"stream": None}, {"stream": -1}, {"max_version": (1, 0)}, {"max_version": (0, 8)}):
        out = torch.from_dlpack(x.__dlpack__(**kwargs))
        assert out.data_ptr() == buffer.data_ptr() and torch.equal(out, torch.arange(6.0) * 2), kwargs
    assert x.__dlpack_device__() == buffer.__dlpack_device__()


def test_capsule_refusals_name_the_argument(backend):
    """What the DLPack protocol refuses (a stream on the CPU, a stream that is not an int, a max_version that is
    no (major, minor) pair) is refused by name before any export (torch's own: an AssertionError, or a
    TypeError from inside)."""
    x = (fa.asarray(torch.arange(3.0)) + 1).block_until_ready()
    with pytest.raises(BufferError, match="stream=5 for an array on the CPU"):
        x.__dlpack__(stream=5)
    with pytest.raises(TypeError, match="stream must be an int"):
        x.__dlpack__(stream="s")
    for bad in (1, (1,), (1, 0.0), [1, 0]):
        with pytest.raises(TypeError, match="max_version must be a"):
            x.__dlpack__(max_version=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_capsules_for_the_current_and_for_another_stream():
    x = (fa.asarray(torch.arange(1 << 20, dtype=torch.float32, device="cuda")) * 2).block_until_ready()
    want = torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 2
    assert torch.from_dlpack(x).data_ptr() == x.torch().data_ptr()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the consumer's stream is current: the direct capsule
        y = fa.asarray(want) + 1
        out = torch.from_dlpack(y)
        assert torch.equal(out, want + 1)
    other = torch.from_dlpack(y.__dlpack__(stream=torch.cuda.Stream().cuda_stream))  # torch's handshake
    torch.cuda.synchronize()
    assert torch.equal(other, want + 1)


def test_torch_writes_through_the_shared_buffer(backend):
    t = torch.zeros(3)
    x = fa.asarray(t)
    torch.from_dlpack(x).add_(2)
    assert_matches(x * 1, np.full(3, 2, np.float32))


@_NEEDS_INTERPRETER
def test_interop_torch_ops_are_differentiable_and_function_round_trips():
    import torch

    import flyarray.interop.torch as fat
    x = torch.randn(3, 40, dtype=torch.float32, requires_grad=True)
    w = torch.randn(40, requires_grad=True)
    fat.rms_norm(x, w).sum().backward()
    x2, w2 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (x2 * torch.rsqrt(x2.pow(2).mean(-1, keepdim=True) + 1e-6) * w2).sum().backward()
    torch.testing.assert_close(x.grad.double(), x2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w2.grad, rtol=1e-4, atol=1e-5)
    f = fat.function(lambda a, b: fa.silu(a) * b)
    a, b = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(f(a, b), torch.nn.functional.silu(a) * b)


def test_torch_conjugate_and_negative_views_keep_their_values_every_way_out(backend):
    """torch's conj()/neg views carry a bit that kernels (reading memory) and DLPack cannot see: flyarray takes
    their values (asarray and from_dlpack alike, a copy only for such views), so computations and exports agree."""
    im = torch.tensor([1 + 2j, 3 - 4j]).conj().imag          # a negative-bit view: [-2, 4]
    for take in (fa.from_dlpack, fa.asarray):
        a = take(im)
        assert a.tolist() == [-2.0, 4.0]
        assert (a + 1).tolist() == [-1.0, 5.0] and float(fa.sum(a * 2)) == 4.0
    neg = fa.asarray(torch._neg_view(torch.tensor([1.0, 2.0, 3.0])))
    for out in (torch.from_dlpack(neg), np.from_dlpack(neg), np.asarray(neg), (neg + 0).torch()):
        assert out.tolist() == [-1.0, -2.0, -3.0]
    conj = fa.asarray(torch.tensor([1 + 2j, 3 - 4j]).conj())
    want = [1 - 2j, 3 + 4j]
    for out in (np.asarray(conj), torch.from_dlpack(conj), np.from_dlpack(conj), (conj * 1).torch()):
        assert out.tolist() == want
    assert fa.from_dlpack(torch.tensor([1 + 2j]).conj()).tolist() == [1 - 2j]
    with pytest.raises(ValueError, match="conjugate/negative view"):
        fa.asarray(torch.tensor([1 + 2j]).conj(), copy=False)
    with pytest.raises(TypeError, match="dense"):
        fa.from_dlpack(torch.eye(2).to_sparse())


def test_negative_and_conjugate_bits_on_tensors_that_are_not_views_and_jit_arguments(backend):
    """The bits are not only on views: t.detach() of one (z.conj().imag.detach()) carries them too, and fa.jit /
    fat.function bind torch arguments themselves. Every way in takes the values, not the raw memory."""
    import flyarray.interop.torch as fat
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    t = z.conj().imag.detach()                       # [-2, 4]: the negative bit, not a view
    c = z.conj().detach()                            # [1-2j, 3+4j]: the conjugate bit, not a view
    assert t.is_neg() and not t._is_view() and c.is_conj() and not c._is_view()
    a = fa.asarray(t)
    for out in (torch.from_dlpack(a), np.from_dlpack(a), np.asarray(a), (a * 2).torch() / 2):
        assert out.tolist() == [-2.0, 4.0]
    assert float(fa.sum(a)) == 2.0
    ac = fa.asarray(c)
    for out in (torch.from_dlpack(ac), np.asarray(ac), (ac * 1).torch()):
        assert out.tolist() == [1 - 2j, 3 + 4j]
    nv = torch._neg_view(torch.tensor([1.0, -2.0]))  # [-1, 2]: a view
    for arg in (t, nv, torch._neg_view(torch.tensor([1.0, -2.0])).data):
        want = (arg * 2).tolist()
        assert fa.jit(lambda x: x * 2)(arg).tolist() == want
        assert fa.jit(lambda xs: xs[0] * 2)([arg]).tolist() == want
        assert fat.function(lambda x: x * 2)(arg).tolist() == want
    assert fa.jit(lambda x: x * 1)(c).tolist() == [1 - 2j, 3 + 4j]


def test_from_dlpack_copy_true_copies_every_source(backend):
    a = np.ones(3)
    snapshot = fa.from_dlpack(a, copy=True)
    shared = fa.from_dlpack(a)
    a[0] = 5
    assert snapshot.tolist() == [1.0, 1.0, 1.0] and shared.tolist() == [5.0, 1.0, 1.0]
    x = fa.asarray(torch.ones(3))
    copied = fa.from_dlpack(x, copy=True)
    assert copied is not x
    copied.torch()[0] = 5
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert fa.from_dlpack(x) is x


def test_in_place_shape_changes_on_either_side_leave_the_array_as_it_was(backend):
    """The array keeps a tensor object of its own over the caller's memory: the caller's t.t_(),
    set_() or resize_() change their tensor, not what the array reads (values still alias)."""
    t = torch.arange(6.0).reshape(2, 3)
    x = fa.asarray(t)
    t.t_()
    assert x.shape == (2, 3) and np.asarray(x).shape == (2, 3)
    assert (x * 1).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert torch.from_dlpack(x).data_ptr() == t.data_ptr()  # still no copy
    y = fa.eval(fa.arange(6, dtype=fa.float32).reshape((2, 3)) * 1)
    y.torch().t_()
    assert (y + 0).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert y.torch().data_ptr() == y.torch().data_ptr()


def test_sparse_and_meta_tensors_get_flyarrays_errors():
    sparse = torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse()
    with pytest.raises(TypeError, match="only dense"):
        fa.asarray(sparse)
    meta = fa.asarray(torch.ones(2, device="meta"))
    for read in (meta.__dlpack_device__, lambda: torch.from_dlpack(meta), lambda: np.asarray(meta), meta.tolist):
        with pytest.raises(RuntimeError, match="'meta' device"):
            read()


def test_interop_function_returns_any_pytree_and_matmul_checks_its_options():
    import flyarray.interop.torch as fat
    out = fat.function(lambda a: {"double": [a * 2], "same": a})(torch.ones(2))
    assert torch.equal(out["double"][0], torch.full((2,), 2.0)) and torch.equal(out["same"], torch.ones(2))
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with pytest.raises(TypeError, match="activation"):
        fat.matmul(a, b, activation=3)
    with pytest.raises(TypeError, match="out_dtype"):
        fat.matmul(a, b, out_dtype="float16")


def test_interop_function_takes_keyword_arguments_as_fa_jit_does():
    # fat.function's wrapper took *args only: a keyword raised "unexpected keyword argument"
    import flyarray.interop.torch as fat
    f = fat.function(lambda a, scale=2.0, bias=None: a * scale + (0 if bias is None else bias))
    assert torch.equal(f(torch.ones(2), scale=3.0), torch.full((2,), 3.0))
    assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
    assert torch.equal(f(torch.ones(2), bias=torch.arange(2.0), scale=1.0), torch.tensor([1.0, 2.0]))


def test_interop_function_replays_straight_to_tensors_as_from_dlpack_would_give_them(backend):
    """fat.function's later calls hand out the replayed plan's buffers as tensors (no Array, no DLPack round
    trip): each output a tensor object of its own over the memory torch.from_dlpack of the array would give,
    for computed outputs, an output returned twice, a passed-through argument, a view and a closed-over array."""
    import flyarray.interop.torch as fat
    kept = fa.asarray(torch.arange(3.0)) * 10   # closed over: a constant of the trace
    f = fat.function(lambda a, b: (a * b + 1, {"same": a, "twice": [a + b, a + b]}, (a * 2).T, kept))
    for call in range(3):   # the first call records, the later ones replay
        a, b = torch.randn(3, 3), torch.randn(3, 3)
        prod, tree, transposed, const = f(a, b)
        assert all(type(t) is torch.Tensor for t in (prod, tree["same"], transposed, const, *tree["twice"]))
        torch.testing.assert_close(prod, a * b + 1)
        torch.testing.assert_close(transposed, (a * 2).T)
        torch.testing.assert_close(tree["twice"][0], a + b)
        assert tree["same"] is not a and tree["same"].data_ptr() == a.data_ptr() and torch.equal(tree["same"], a)
        first, second = tree["twice"]
        if first.data_ptr() == second.data_ptr():   # one buffer: still two tensor objects
            assert first is not second
        assert const.tolist() == [0.0, 10.0, 20.0]
        const.t_() if const.dim() == 2 else const.unsqueeze_(0)   # a caller's shape change reaches no later call
    assert f(a, b)[3].shape == (3,)


def test_repr_shows_flyarrays_dtype_only_also_when_torch_wraps_the_line():
    text = repr(fa.asarray(np.array([np.inf, 0.5, 1 / 3, np.nan, 2.0, 3.0, 4.0, 5.0])))
    assert text.endswith(", dtype=float64)") and "torch" not in text


def test_interop_ops_refuse_what_they_cannot_do_at_the_call():
    """Found by the interop fuzz: CPU group sizes went unchecked (the backends then disagreed), mx_quantize of
    an input that requires grad failed only at backward in torch's words, and fat.function cut its outputs
    from the graph so the gradient through it was silently missing."""
    import flyarray.interop.torch as fat
    lhs, rhs = torch.randn(6, 4), torch.randn(3, 4, 5)
    with pytest.raises(ValueError, match="group_sizes must not be negative"):
        fat.ragged_dot(lhs, rhs, torch.tensor([-2, 4, 4]))
    with pytest.raises(ValueError, match="group_sizes sum to 12, past lhs's 6 rows"):
        fat.ragged_dot(lhs, rhs, torch.tensor([4, 4, 4]))
    torch.testing.assert_close(fat.ragged_dot(lhs, rhs, torch.tensor([2, 0, 3]))[5], torch.zeros(5))
    x = torch.randn(2, 32, requires_grad=True)
    with pytest.raises(RuntimeError, match="mx_quantize: x requires grad"):
        fat.mx_quantize(x, "e4m3")
    with torch.no_grad():
        assert not fat.mx_quantize(x, "e4m3")[0].requires_grad
    f = fat.function(lambda a, b: (fa.exp(a), fa.argmax(a, axis=-1), b * 2))
    y, i, z = f(x, torch.ones(2))
    assert y.requires_grad and not i.requires_grad
    torch.testing.assert_close(y, x.detach().exp())
    with pytest.raises(RuntimeError, match="fat.function has no derivative"):
        (y.sum() + x.sum()).backward()
    with torch.no_grad():
        assert not f(x, torch.ones(2))[0].requires_grad
    assert not f(x.detach(), torch.ones(2))[0].requires_grad


class _Producer:
    """A DLPack producer that is neither numpy nor torch (as JAX, CuPy or array_api_strict are to flyarray)."""

    def __init__(self, arr, device=(1, 0)):
        self.arr, self.device = arr, device

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device


def test_from_dlpack_of_another_producers_negative_strides_neither_aborts_nor_misreads():
    """torch.from_dlpack aborts the whole process on a capsule with negative strides (array_api_strict's flip
    killed the interpreter through fa.from_dlpack): a CPU producer now goes through numpy's consumer, and a
    device producer's strides are read from a capsule before torch sees one."""
    from flyarray import dlpack
    base = np.arange(12.0).reshape(3, 4)
    flipped = _Producer(base[::-1, ::2])
    assert dlpack.has_negative_strides(flipped) and not dlpack.has_negative_strides(_Producer(base))
    assert np.asarray(fa.from_dlpack(flipped)).tolist() == base[::-1, ::2].tolist()
    assert np.asarray(fa.asarray(flipped)).tolist() == base[::-1, ::2].tolist()
    with pytest.raises(BufferError, match="copy=False"):
        fa.from_dlpack(flipped, copy=False)
    shared = fa.from_dlpack(_Producer(base))   # contiguous: the producer's memory, no copy
    assert np.shares_memory(np.asarray(shared), base)
    with pytest.raises(BufferError, match="negative strides"):   # a device producer: refused before torch reads it
        fa.from_dlpack(_Producer(base[::-1], device=(2, 0)))


def test_copy_and_dl_device_arguments_are_checked_and_sparse_tensors_refused_by_name_everywhere():
    """copy="no" copied and copy=0.0 shared (taken by truth value); __dlpack__(dl_device=1) failed inside with
    "'int' object is not iterable"; a sparse tensor given to fa.jit or fat.function failed in torch's words."""
    import flyarray.interop.torch as fat
    t = torch.arange(4.0)
    a = fa.asarray(t)
    for bad in ("no", 0.0, 1):
        for call in (lambda: fa.asarray(t, copy=bad), lambda: fa.from_dlpack(t, copy=bad),
                     lambda: a.__dlpack__(copy=bad)):
            with pytest.raises(TypeError, match="copy must be True, False or None"):
                call()
    assert torch.from_dlpack(fa.asarray(t, copy=np.False_)).data_ptr() == t.data_ptr()
    with pytest.raises(TypeError, match="dl_device must be a"):
        a.__dlpack__(dl_device=1)
    sparse = torch.eye(3).to_sparse()
    for take in (fa.asarray, fa.jit(lambda x: x * 2), fat.function(lambda x: x * 2)):
        with pytest.raises(TypeError, match="only dense"):
            take(sparse)


def test_ragged_dot_checks_its_shapes_first_and_host_group_sizes_in_every_form():
    """A 3-D lhs with numpy sizes got the group-size error (its first dim taken as rows); a list of sizes
    raised a TypeError naming neither ragged_dot nor group_sizes; sizes in an evaluated CPU array went
    unchecked, and the backends then disagreed."""
    lhs, rhs = fa.asarray(np.ones((6, 4), np.float32)), fa.asarray(np.ones((3, 4, 5), np.float32))
    with pytest.raises(ValueError, match="expects lhs"):
        fa.ragged_dot(fa.asarray(np.ones((2, 6, 4), np.float32)), rhs, np.array([1, 1, 1]))
    assert np.asarray(fa.ragged_dot(lhs, rhs, [2, 0, 3])).tolist() == [[4.0] * 5] * 5 + [[0.0] * 5]
    for sizes in ([2, -1, 3], fa.asarray(np.array([2, -1, 3]))):
        with pytest.raises(ValueError, match="group_sizes must not be negative"):
            fa.ragged_dot(lhs, rhs, sizes)
    with pytest.raises(ValueError, match="sum to 12, past lhs's 6 rows"):
        fa.ragged_dot(lhs, rhs, fa.asarray(np.array([4, 4, 4])))
