"""What every hand-written kernel needs to launch: the right runner and its arch's config.

A kernel is decorated with ``@triton.jit`` at import time, so Triton has
already decided to compile it. Tensors on the CPU can only run through Triton's
interpreter, so ``runner`` wraps the plain Python function of the kernel in an
``InterpretedFunction`` when the tensors live on the CPU (DESIGN.md: the
``interpret`` backend).
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import inspect
import os
import threading
import types

import numpy as np
import torch
import triton
import triton.language as tl
from triton._C.libtriton import ir as _ir
from triton.runtime.interpreter import InterpretedFunction, InterpreterBuilder, TensorHandle, _patch_lang

from flyarray import precompile
from flyarray.diskcache import in_triton_cache, reregister_source


_INTERPRETED: dict = {}
# Interpreted clones of the @triton.jit helpers kernels call (triton.language's, ext's), shared by every
# kernel: a memo of its own per kernel re-made ~14 of them each time, ~340 KB a generated kernel, held for good
_INTERPRETED_HELPERS: dict = {}
_INTERPRETED_MARK = "_flyarray_real_tl"
# The interpreter patches triton.language's module globals for the length of a launch, and the
# snapshot/restore below is process-wide: two threads interleaving would restore each other's patches
# away mid-launch. One interpreted launch at a time (it runs on the CPU anyway).
_INTERPRETER_LOCK = threading.RLock()
# a forked child has only the forking thread: a lock another thread held at the fork would stay held for good
os.register_at_fork(after_in_child=_INTERPRETER_LOCK._at_fork_reinit)


def _interpreted(kernel) -> "_InterpretedLaunch":
    # Keyed by identity: hashing a JITFunction walks its dependencies (slow, and fragile mid-interpretation).
    found = _INTERPRETED.get(id(kernel))
    if found is None or found[0] is not kernel:
        fn = InterpretedFunction(_with_interpreted_globals(kernel.fn, _INTERPRETED_HELPERS))
        found = _INTERPRETED[id(kernel)] = (kernel, _InterpretedLaunch(fn))
    return found[1]


class _InterpretedLaunch:
    """``kernel[grid](...)`` through the interpreter, leaving triton.language as it found it.

    Nested calls patch triton.language and Triton never undoes that; a later
    real compile in the same process (a cross-compile, a GPU launch) would
    then fail. Each launch restores the namespaces from a snapshot.
    """

    def __init__(self, fn: InterpretedFunction):
        self.fn = fn

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            with _INTERPRETER_LOCK:
                _import_gluon_unpatched()
                # a generated kernel that outlived fa.clear_caches (a plan holds it) is rewritten again from
                # its text, which the clear took out of linecache
                reregister_source(self.fn.fn)
                args, kwargs = _one_storage_per_memory(args, kwargs)
                args, kwargs, write_back = _bf16_as_float32(args, kwargs)
                snapshot = [(space, dict(vars(space))) for space in _language_namespaces()]
                try:
                    _interpret_tensor_methods()
                    InterpreterBuilder.cast_impl = _cast_rounding_bf16_to_nearest_even
                    InterpreterBuilder.create_fp_to_fp = _fp_to_fp_exact_fp8
                    result = self.fn[grid](*args, **kwargs)
                finally:
                    _restore(snapshot)
                write_back()   # only after a launch that finished: a failed one leaves the bf16 data as it was
                return result
        return launch

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _one_storage_per_memory(args: tuple, kwargs: dict):
    """(args, kwargs) with CPU tensors whose storages overlap in memory rebuilt over one storage.

    Triton's interpreter copies each argument's storage to the host and back, keyed by its address:
    two storages over the same memory (numpy views through fa.asarray: ``x`` and ``x[0]`` come with a
    storage each, at one address) made it copy one into the other ("size does not match"), and
    partially overlapping ones could be written back over each other. One storage over the union of
    their bytes (no copy: a buffer over the same memory) makes them what they are, views of one array."""
    tensors = [t for t in (*args, *kwargs.values()) if _has_cpu_storage(t)]
    spans = sorted({(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors})
    if len(spans) < 2 or all(spans[i][0] + spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)):
        return args, kwargs   # each storage its own memory (the common case)
    unions = []   # [start, end) of the overlapping groups
    for start, nbytes in spans:
        if unions and start < unions[-1][1]:
            unions[-1][1] = max(unions[-1][1], start + nbytes)
        else:
            unions.append([start, start + nbytes])
    shared = {}

    def rebased(t):
        if not _has_cpu_storage(t):
            return t
        ptr = t.untyped_storage().data_ptr()
        start, end = next(u for u in unions if u[0] <= ptr < u[1])
        if start not in shared:
            shared[start] = torch.frombuffer((ctypes.c_char * (end - start)).from_address(start), dtype=torch.uint8)
        offset, rest = divmod(t.data_ptr() - start, t.element_size())
        if rest:   # not on an element boundary of the union: leave it (nothing aliases it elementwise)
            return t
        return torch.empty(0, dtype=t.dtype).set_(shared[start].untyped_storage(), offset, t.shape, t.stride())

    return tuple(rebased(a) for a in args), {k: rebased(v) for k, v in kwargs.items()}


def _has_cpu_storage(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.untyped_storage().nbytes() > 0


def _bf16_as_float32(args: tuple, kwargs: dict):
    """(args, kwargs, write_back) with every bfloat16 tensor replaced by a float32 one.

    Triton's interpreter keeps bfloat16 as raw uint16 bits and computes on the bits: a bf16 ``tl.dot``
    multiplies bit patterns (values ~1e10), and comparisons order them as unsigned integers (upstream:
    unsupported, cast to float32 first). So an interpreted kernel sees float32 copies instead, with the
    same sizes, strides and offsets, over one copy per storage span (arguments that alias still alias
    each other), and ``write_back`` rounds the elements the kernel changed back into the bfloat16
    storage (the rest, inputs included, keep their bits: NaN sign and payload too). The kernel computes
    in float32 where a GPU would round an intermediate value to bf16 (attention's probabilities): the
    CPU result is the more accurate one.
    """
    tensors = [t for t in (*args, *kwargs.values()) if _is_cpu_bf16(t)]
    if not tensors:
        return args, kwargs, lambda: None
    spans: dict = {}   # storage -> [first, end) of the elements the bf16 arguments reach
    for t in tensors:
        first, end = _element_span(t)
        key = t.untyped_storage().data_ptr()
        lo, hi, storage = spans.get(key, (first, end, t.untyped_storage()))
        spans[key] = (min(lo, first), max(hi, end), storage)
    copies = {}
    with torch.no_grad():
        for key, (lo, hi, storage) in spans.items():
            span = torch.empty(0, dtype=torch.bfloat16).set_(storage, lo, (hi - lo,), (1,))
            copies[key] = (lo, span, span.float())

        def widened(t):
            if not _is_cpu_bf16(t):
                return t
            lo, _, wide = copies[t.untyped_storage().data_ptr()]
            return wide.as_strided(t.shape, t.stride(), t.storage_offset() - lo)

    def write_back():
        for _, span, wide in copies.values():
            _store_changed_bf16(span, wide)

    return tuple(widened(a) for a in args), {k: widened(v) for k, v in kwargs.items()}, write_back


def _store_changed_bf16(span: torch.Tensor, wide: torch.Tensor):
    """Round into ``span`` (bf16) only the elements of its float32 stand-in ``wide`` the kernel changed.

    The launch does not know which arguments are outputs, but an element the kernel left alone still
    holds its bf16 bits shifted up 16: those keep their exact bits. Rewriting them all went through
    torch's float32 -> bf16 ``copy_``, which turns every NaN into 0xFFFF (negative): a read-only
    input's +NaN came back -NaN, and every stored NaN lost its sign and payload."""
    old = span.view(torch.int16).numpy()
    new = wide.numpy().view(np.uint32)
    changed = new != (old.view(np.uint16).astype(np.uint32) << 16)
    if changed.any():
        old.view(np.uint16)[changed] = _bf16_bits_keeping_nan_payload(new[changed])


def _bf16_bits_keeping_nan_payload(bits: np.ndarray) -> np.ndarray:
    """bf16 bits of float32 ``bits`` (uint32), to nearest even; a value bf16 holds exactly (its low 16
    bits zero: a NaN loaded from bf16 and stored back) moves as is, so a signalling NaN stays one."""
    exact = (bits & 0xFFFF) == 0
    return np.where(exact, bits >> 16, _bf16_bits_nearest_even(bits.view(np.float32))).astype(np.uint16)


def _is_cpu_bf16(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.device.type == "cpu" and t.numel() > 0


def _element_span(t: torch.Tensor) -> tuple:
    """[first, end): the storage elements a strided view can reach."""
    first = t.storage_offset()
    return first, first + 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))


_STDLIB_MEMO: dict = {}


def _interpret_tensor_methods():
    """Tensor methods that are @triton.jit functions (x.sum(), x.to(...) is not one) run interpreted."""
    for name, value in list(vars(tl.core.tensor).items()):
        if isinstance(value, triton.runtime.JITFunction):
            nested = _nested(value, _STDLIB_MEMO)
            setattr(tl.core.tensor, name, lambda self, *a, _f=nested, **k: _f(self, *a, **k))


def _import_gluon_unpatched():
    """Import Gluon now, while triton.language is whole. Triton 3.9's interpreter imports it lazily
    in the middle of a launch (``mangle_type``), while tl.math is patched, and Gluon's math module
    wraps tl.math's functions at import: every later Gluon compile in the process then calls the
    interpreter's stand-ins and fails (attention_hopper's kernel, cross-compiled after any
    interpreted launch)."""
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:  # a Triton without Gluon: nothing to protect
        pass


def _language_namespaces() -> list:
    spaces = [tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, InterpreterBuilder]
    return spaces + [getattr(tl.core, n) for n in ("tensor_descriptor_base",) if hasattr(tl.core, n)]


_INTERPRETER_CAST = InterpreterBuilder.cast_impl


def _cast_rounding_bf16_to_nearest_even(builder, src, dst_type):
    """The interpreter's cast, except between float32 and bfloat16 (both ways exact bit moves here):
    it truncates float32 -> bfloat16 (GPUs and torch round to nearest, ties to even: the interpreter
    differed from both by an ulp in a third of the values of a bf16 add), and its generic subnormal
    path turns bf16 subnormals into wrong float32 values."""
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        return TensorHandle(_bf16_bits_nearest_even(src.data), tl.bfloat16)
    if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:   # the same exponent range
        return TensorHandle((np.asarray(src.data).astype(np.uint32) << 16).view(np.float32), tl.float32)
    return _INTERPRETER_CAST(builder, src, dst_type)


_INTERPRETER_FP_TO_FP = InterpreterBuilder.create_fp_to_fp
# The fp8 formats torch knows, keyed by Triton's type: the interpreter stores their codes as uint8.
_TORCH_FP8 = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}


def _fp_to_fp_exact_fp8(builder, src, dst_type, rounding_mode):
    """The interpreter's float -> float conversion, except to and from float8_e4m3fn / float8_e5m2, which
    go through torch's own conversion (exact, to nearest even): the interpreter's bit arithmetic neither
    rounds a carry into the exponent nor saturates (464 -> e4m3 gave 480, 500 gave 256) and reads e4m3's
    NaN code and e5m2's Inf/NaN codes as finite numbers. As torch (the reference backend) and the GPU's
    ``cvt.rn.satfinite``: e4m3fn saturates out-of-range values and infinities to +-448, NaN stays NaN;
    e5m2 keeps infinities (torch; see docs/semantics.md). Round-toward-zero keeps the interpreter's path."""
    src_t, dst_t = src.dtype.scalar, dst_type.scalar
    if (src_t not in _TORCH_FP8 and dst_t not in _TORCH_FP8) or rounding_mode == _ir.ROUNDING_MODE.RTZ:
        return _INTERPRETER_FP_TO_FP(builder, src, dst_type, rounding_mode)
    data = np.asarray(src.data)
    if src_t in _TORCH_FP8:   # every fp8 value is exact in float32 (and in float16/bfloat16/float64)
        wide = torch.from_numpy(data.astype(np.uint8).copy()).view(_TORCH_FP8[src_t]).float()
    elif src_t == tl.bfloat16:   # raw 16-bit patterns in the interpreter
        wide = torch.from_numpy((data.astype(np.uint32) << 16).view(np.float32).copy())
    else:
        wide = torch.from_numpy(np.ascontiguousarray(data))
    if dst_t in _TORCH_FP8:
        out = wide.to(_TORCH_FP8[dst_t]).view(torch.uint8).numpy()
    elif dst_t == tl.bfloat16:
        out = _bf16_bits_nearest_even(wide.float().numpy())
    else:
        out = wide.numpy().astype(_np_float(dst_t))
    return TensorHandle(np.asarray(out).reshape(data.shape), dst_t)


def _np_float(t) -> np.dtype:
    return {tl.float16: np.float16, tl.float32: np.float32, tl.float64: np.float64}[t]


def _bf16_bits_nearest_even(values: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16, the interpreter's storage) of float32 ``values``, rounded to nearest
    even: add 0x7FFF plus the lowest kept bit, drop 16 bits (a carry moves into the exponent, up to inf);
    NaN stays NaN (quiet bit set)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(np.isnan(values), (bits >> 16) | 0x40, rounded).astype(np.uint16)


def _restore(snapshot):
    for space, attrs in snapshot:
        for name in [n for n in vars(space) if n not in attrs]:
            delattr(space, name)
        for name, value in attrs.items():
            if vars(space).get(name) is not value:
                setattr(space, name, value)


def _with_interpreted_globals(fn, memo: dict):
    """``fn`` re-bound to a copy of its globals where every @triton.jit helper is interpreted too.

    The interpreter only rewrites the kernel it is handed; a nested @triton.jit
    call (ours, or one of triton.language's own such as tl.sigmoid or tl.sort)
    would otherwise refuse to run outside a compiled kernel. Copying the globals
    (rather than patching modules) keeps the compiled path intact.
    """
    if fn in memo:
        return memo[fn]
    env = dict(fn.__globals__)
    clone = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__ = fn.__kwdefaults__
    memo[fn] = clone
    for name, value in list(env.items()):
        if isinstance(value, triton.runtime.JITFunction) and not _is_builtin_combine(name, value):
            env[name] = _nested(value, memo)
        elif value is tl:
            env[name] = _InterpretedLanguage(memo)
    env[_INTERPRETED_MARK] = tl  # the interpreter looks for triton.language among the globals (and it marks ours)
    return clone


def _is_builtin_combine(name, jit_fn) -> bool:
    """triton.language's private combine functions stay as they are: the interpreter recognizes
    them by identity (tl.reduce with _sum_combine becomes one numpy sum). tl.sort's private
    helpers (_bitonic_merge_hypercube, ...) are ordinary nested calls and must be interpreted."""
    return name.startswith("_") and not name.startswith(_SORT_HELPERS) \
        and jit_fn.fn.__module__.startswith("triton.language")


_SORT_HELPERS = ("_bitonic", "_compare_and_swap", "_indicator")


class _InterpretedLanguage(types.ModuleType):
    """triton.language as seen from interpreted code: its @jit functions come back interpreted.

    Attributes are looked up on every access, so the interpreter's patches to
    triton.language (made while a kernel runs) are seen.
    """

    def __init__(self, memo):
        super().__init__("triton.language")
        self._memo = memo

    def __getattr__(self, name):
        value = getattr(tl, name)
        if isinstance(value, triton.runtime.JITFunction):
            return _nested(value, self._memo)
        return value


class _NestedCall:
    """A @triton.jit helper called from interpreted code.

    It patches triton.language for its own globals, then calls the rewritten
    function; _InterpretedLaunch undoes the patches when the launch ends.
    ``fn`` is what the interpreter's generic reduce/scan call for a combine function.
    """

    def __init__(self, jit_fn, memo):
        self.original = jit_fn.fn
        self._memo = memo
        self._rewritten = None

    @property
    def fn(self):
        # rewritten when first called: a generated module's prelude has ~20 combine helpers a kernel
        # mostly does not use, and each rewrite cost ~15 KB (Triton keeps every one)
        if self._rewritten is None:
            self._rewritten = InterpretedFunction(_with_interpreted_globals(self.original, self._memo)).rewrite()
        return self._rewritten

    def __call__(self, *args, **kwargs):
        _patch_lang(self.original)  # e.g. tl.core's builtins, which the kernel's own patch may not cover
        return self.fn(*args, **kwargs)


def _nested(jit_fn, memo):
    key = ("nested", id(jit_fn))  # by identity: hashing a JITFunction walks its dependencies
    if key not in memo:
        memo[key] = _NestedCall(jit_fn, memo)
    return memo[key]


def runner(kernel, device: torch.device):
    """The launchable form of ``kernel`` for tensors on ``device`` (while ``warming_up``: one that
    compiles in the background and launches nothing)."""
    if _WARMING_UP.get():
        return WarmUpLaunch(kernel)
    if (device.type if isinstance(device, torch.device) else torch.device(device).type) == "cpu":
        return _interpreted(kernel)
    launch = _DIRECT.get(id(kernel))
    if launch is None or launch.kernel is not kernel:
        launch = _DIRECT[id(kernel)] = DirectLaunch(kernel)
    return launch


_DIRECT: dict = {}
_LAUNCH_CACHES: list = [_DIRECT]  # per-signature launch caches of the kernel modules (fa.clear_caches empties them)


def launch_cache() -> dict:
    """A dict a kernel module keeps launch plans in, emptied by ``fa.clear_caches()``."""
    cache: dict = {}
    _LAUNCH_CACHES.append(cache)
    return cache


def clear_launch_caches():
    for cache in _LAUNCH_CACHES:
        cache.clear()
    _INTERPRETED.clear()   # (fa.clear_caches: a generated kernel's interpreted form goes with its module)
    _INTERPRETED_HELPERS.clear()
    rewritten = getattr(InterpretedFunction, "rewritten_fn", None)  # Triton's cache of every rewrite, for good
    if isinstance(rewritten, dict):
        for fn in [f for f in rewritten if _INTERPRETED_MARK in getattr(f, "__globals__", ())]:
            del rewritten[fn]


class DirectLaunch:
    """``kernel[grid](*args, **kwargs)`` on a GPU, skipping Triton's per-call binding after the first.

    The first launch with a given *specialization* goes through Triton's JIT (which compiles or
    loads, inside flyarray's checked cache) and returns the ``CompiledKernel``; later launches with
    the same specialization call its launcher directly. The specialization key is at least as fine
    as Triton's own: for each tensor its dtype and 16-byte alignment; for each int whether it is 1,
    divisible by 16, and its width; the type of everything else and the value of every keyword
    (constexprs and launch options). Arguments of any other kind (descriptors, tuples) and callable
    grids always take the JIT path, as do launches while a launch hook (a profiler) is set.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.scoped = in_triton_cache(kernel)
        self.params = [p.name for p in kernel.params]
        self.defaults = {p.name: p.default for p in kernel.params if p.default is not inspect_empty}
        self.compiled = {}

    def __getattr__(self, name):  # arg_names, fn, ... of the kernel itself
        if name == "kernel":
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        if callable(grid):
            return self.scoped[grid]
        grid = tuple(grid) + (1,) * (3 - len(grid))

        def launch(*args, **kwargs):
            key = _specialization(args, kwargs)
            found = self.compiled.get(key) if key is not None else None
            if found is None or launch_hooks_set():
                if found is None and key is not None:
                    precompile.await_ahead(self.kernel, key)  # a plan's warm-up may be compiling it now
                compiled = precompile.compiled_kernel(self.scoped[grid](*args, **kwargs))
                if key is not None and hasattr(compiled, "packed_metadata"):
                    compiled.run  # noqa: B018  (load the binary and its launcher now)
                    self.compiled[key] = (compiled, self.tail(len(args), kwargs), _first_tensor(args))
                return compiled
            compiled, tail, first_tensor = found
            device = args[first_tensor].get_device() if first_tensor is not None else torch.cuda.current_device()
            compiled.run(grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(device), compiled.function,
                         compiled.packed_metadata, None, None, None, *args, *tail)
            return compiled
        return launch

    def tail(self, n_args, kwargs) -> tuple:
        """The values of the parameters after the positional ones: keywords (constexprs, which the key
        holds, so they are the same on every launch with it) or defaults."""
        return tuple(kwargs[name] if name in kwargs else self.defaults[name] for name in self.params[n_args:])


class FixedLaunch:
    """A launch whose specialization the caller keeps fixed (a planned GEMM: its key holds every shape,
    stride, dtype and alignment Triton specializes on, and its other buffers are fresh allocations):
    the first call goes through ``runner``, later calls straight to the compiled kernel's launcher,
    with no per-call specialization key. Under the interpreter, or with a launch hook set, every call
    takes the runner's path."""

    def __init__(self, kernel, device: torch.device, grid: tuple, kwargs: dict):
        if _WARMING_UP.get():  # it would keep a dry run's launcher (that launches nothing) for later calls
            raise NotWarmable("a fixed launch is made for the calls that follow, never in a dry run")
        self.runner = runner(kernel, device)
        self.launch = self.runner[grid]
        self.kwargs = kwargs
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.compiled = None

    def __call__(self, *args):
        compiled = self.compiled
        if compiled is None or launch_hooks_set():
            compiled = self.launch(*args, **self.kwargs)
            if self.compiled is None and hasattr(compiled, "packed_metadata"):
                self.tail = self.runner.tail(len(args), self.kwargs)
                self.device_index = args[_first_tensor(args)].get_device()
                self.compiled = compiled
            return
        g0, g1, g2 = self.grid
        compiled.run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(self.device_index), compiled.function,
                     compiled.packed_metadata, None, None, None, *args, *self.tail)


def _first_tensor(args):
    return next((i for i, a in enumerate(args) if type(a) is torch.Tensor), None)


def _specialization(args, kwargs):
    """What Triton specializes a launch on, as a key: per tensor its dtype and 16-byte alignment, per int
    whether it is 1, a multiple of 16, and its width; keywords by type and value. None: let the JIT decide."""
    key = []
    add = key.append
    for a in args:
        t = type(a)
        if t is torch.Tensor:
            add(a.dtype)
            add(not a.data_ptr() & 15)
        elif t is StandIn:  # a dry run's tensor (warming_up): the same two facts
            add(a.dtype)
            add(a.aligned)
        elif t is int:
            add((a == 1, not a & 15, -2147483648 <= a <= 2147483647, a >= 9223372036854775808))
        elif t is float:
            add(float)
        elif t is bool or a is None:
            add((t, a))
        else:
            return None  # a descriptor, a tuple, a dtype...: Triton's JIT decides
    for name, value in kwargs.items():
        t = type(value)
        if t is not int and t is not bool and t is not float and t is not str and value is not None \
                and not isinstance(value, tl.dtype):
            return None
        add((name, t, value.hex() if t is float else value))  # floats by their bits: 0.0 and -0.0 differ
    return tuple(key)


class NotWarmable(Exception):
    """Raised inside ``warming_up`` where the launch would decide something a dry run cannot (timing
    candidate configs): the warm-up of that call stops; the launch itself decides as always."""


# Whether this thread (context) is dry-running a library call for precompile.py: set in its background
# thread only, so the launches of every other thread are untouched.
_WARMING_UP = contextvars.ContextVar("flyarray_warming_up", default=False)


@contextlib.contextmanager
def warming_up():
    """Dry-run library calls: every ``runner`` launch compiles (precompile.compile_ahead) instead of
    launching. The caller passes tensors that hold no data (fake tensors): the host code reads only their
    shapes, strides, dtypes, devices and alignment."""
    token = _WARMING_UP.set(True)
    try:
        yield
    finally:
        _WARMING_UP.reset(token)


def is_warming_up() -> bool:
    return _WARMING_UP.get()


def aligned16(t: torch.Tensor) -> bool:
    """Whether ``t``'s first element sits on a 16-byte boundary. A fake tensor (a dry run) holds no
    memory: its storage is taken to start aligned, as every allocation does."""
    if type(t) is not torch.Tensor and getattr(t, "fake_mode", None) is not None:  # (a plain tensor: no lookup)
        return t.storage_offset() * t.element_size() % 16 == 0
    return t.data_ptr() % 16 == 0


class StandIn:
    """A tensor argument of a dry-run launch, as Triton specializes on it: its dtype and whether its
    pointer is 16-byte aligned (Triton reads ``dtype`` and ``data_ptr()``, as of its MockTensor)."""

    __slots__ = ("dtype", "aligned")

    def __init__(self, t: torch.Tensor):
        self.dtype, self.aligned = t.dtype, aligned16(t)

    def data_ptr(self) -> int:
        return 0 if self.aligned else 8


class WarmUpLaunch:
    """``kernel[grid](*args, **kwargs)`` inside ``warming_up``: hands the compile of exactly that
    specialization to precompile.compile_ahead (keyed as DirectLaunch keys it, so the real launch finds
    it) and launches nothing."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getattr__(self, name):
        if name == "kernel":
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            stand_ins = tuple(StandIn(a) if isinstance(a, torch.Tensor) else a for a in args)
            return precompile.compile_ahead(self.kernel, _specialization(stand_ins, kwargs), stand_ins, kwargs)
        return launch


def launch_hooks_set() -> bool:
    """A launch hook (a profiler such as proton) wants Triton's own launch path, which calls it: the
    direct launches here and in runtime.py step aside while one is set."""
    hook = getattr(getattr(triton, "knobs", None) and triton.knobs.runtime, "launch_enter_hook", None)
    return bool(getattr(hook, "calls", hook))


inspect_empty = inspect.Parameter.empty


@functools.lru_cache(maxsize=None)
def _arch_of(device_type: str, index: int) -> str:
    if torch.version.hip:  # ROCm reports e.g. 'gfx950:sramecc+:xnack-'
        return torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    # (CUDA builds of torch have a gcnArchName attribute too, holding no AMD arch: never read it there.)
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def current_arch(device: torch.device) -> str:
    """'sm_90', 'gfx950', 'gfx942', ... for a GPU device; 'cpu' for the interpreter (cached per device)."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type == "cpu":
        return "cpu"
    return _arch_of(device.type, device.index if device.index is not None else torch.cuda.current_device())


def pick_config(table: dict, arch: str) -> dict:
    """The tuned config for ``arch``: exact match, then its family, then 'default'."""
    if arch in table:
        return table[arch]
    family = "gfx9" if arch.startswith("gfx9") else arch[:4]
    for key, cfg in table.items():
        if key.startswith(family):
            return cfg
    return table["default"]


# Host-side sizes in plain Python: triton.cdiv and triton.next_power_of_2 are ConstexprFunctions, whose
# Python call costs ~2.5 us each (measured on this CPU and the H200 host): a launch computing its grid
# with a few of them paid more for that than for the launch itself.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


_EMPTY_TEMPLATES: dict = {}


def empty_template(dtype: torch.dtype, device: torch.device):
    """A kept zero-size tensor whose ``new_empty`` allocates like ``torch.empty(dtype=, device=)``
    without parsing the dtype and device (plans and launches allocate through it); None where the
    tensor made now is a fake or inference one, which is not kept for later calls."""
    template = _EMPTY_TEMPLATES.get((dtype, device))
    if template is None:
        template = torch.empty(0, dtype=dtype, device=device)
        if type(template) is not torch.Tensor or template.is_inference():
            return None
        _EMPTY_TEMPLATES[(dtype, device)] = template
    return template


def empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(shape, dtype=, device=)`` for a launch's steady state, through ``empty_template``
    (3.5 against 5 us a call on the H200 host, profiled; the allocation itself is the rest)."""
    template = empty_template(dtype, device)
    if template is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return template.new_empty(shape)


# Device-side TMA descriptors (tl.make_tensor_descriptor; gemm, ragged_dot, attention on sm_90).
HAS_TENSOR_DESCRIPTORS = hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")


def ensure_tma_allocator():
    """Device-side descriptors need a little global scratch; Triton asks for it here. Triton keeps
    its allocator in a ContextVar, which is per thread: checked on every call, because a kernel may
    run on a thread that has none yet (autograd's backward runs on its own device thread)."""
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_tma_scratch)


def _tma_scratch(size, align, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")
