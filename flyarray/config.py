"""Settings read from the environment, in one place.

FLYARRAY_BACKEND    gpu | reference | interpret (default: gpu when torch sees one, else reference)
FLYARRAY_CACHE_DIR  where compiled kernels and tuning results live on disk
FLYARRAY_LOG        1: print each compile (with its cache-miss reason) and launch; 2: also the Triton source
FLYARRAY_CHECK      1: re-run every fused kernel on the reference backend and raise on mismatch
FLYARRAY_EAGER_ROUNDING  1: round fused intermediates to their dtype as eager torch would
FLYARRAY_PLAN_CHECK 1: on every plan-cache hit, also build the plan from scratch and compare
FLYARRAY_PRECOMPILE 0: compile a new GPU plan's generated kernels at their launches only, not also ahead
                    in a background thread pool (flyarray/precompile.py)
FLYARRAY_GEMM_WS    0: sm_90's 16-bit square GEMMs keep the Triton GEMM instead of the warp-specialized
                    Gluon kernel (kernels/gemm_hopper.py; on by default)

The switches an evaluation consults on its hot path (CHECK, EAGER_ROUNDING, PLAN_CHECK) are read
at import and again by ``fa.clear_caches()``. ``eager_rounding_scope()`` turns eager rounding on (or
off) for the evaluations made inside it, whatever the environment says: the torch.compile backend
runs its regions so (a torch program's values are eager torch's).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import pathlib

CACHE_VERSION = "1"


def cache_dir() -> pathlib.Path:
    """The versioned on-disk cache: plain text and JSON only, never pickle.

    Only the path: flyarray.diskcache creates and checks it at first use (never at import).
    """
    root = os.environ.get("FLYARRAY_CACHE_DIR")
    base = pathlib.Path(root).expanduser() if root else pathlib.Path.home() / ".cache" / "flyarray"
    return base / f"v{CACHE_VERSION}"


_OFF, _ON = ("", "0", "false", "off", "no"), ("1", "true", "on", "yes")


def switch(name: str, default: bool) -> bool:
    """An on/off environment variable: 1/true/on/yes or 0/false/off/no (any case; empty: off), ``default``
    when unset. Anything else is a ValueError naming it: "false" used to read as on."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _OFF or value in _ON:
        return value in _ON
    raise ValueError(f"{name}={raw!r}: expected 1/true/on/yes or 0/false/off/no")


def log_level() -> int:
    """FLYARRAY_LOG: 0 (default), 1 or 2."""
    raw = os.environ.get("FLYARRAY_LOG", "").strip()
    if raw in ("", "0", "1", "2"):
        return int(raw or 0)
    raise ValueError(f"FLYARRAY_LOG={raw!r}: expected 0, 1 (each compile and launch) or 2 (also the Triton source)")


def check_mode() -> bool:
    return switch("FLYARRAY_CHECK", False)


def eager_rounding() -> bool:
    """FLYARRAY_EAGER_ROUNDING: the process-wide default (off), which ``eager_rounding_scope`` overrides."""
    return switch("FLYARRAY_EAGER_ROUNDING", False)


_forced_eager_rounding = contextvars.ContextVar("flyarray_eager_rounding", default=None)


def forced_eager_rounding():
    """None, or the eager rounding an enclosing ``eager_rounding_scope`` sets (this thread / context)."""
    return _forced_eager_rounding.get()


# The environment's choice as plans are keyed on it (plan.settings): read at import and by
# refresh_eager_rounding (fa.clear_caches), never live -- a kernel generated after the variable changed would
# otherwise round one way and be cached under the key of the other.
_env_eager_rounding = eager_rounding()


def refresh_eager_rounding() -> bool:
    global _env_eager_rounding
    _env_eager_rounding = eager_rounding()
    return _env_eager_rounding


def env_eager_rounding() -> bool:
    """FLYARRAY_EAGER_ROUNDING as last read (at import or by fa.clear_caches)."""
    return _env_eager_rounding


def eager_rounding_in_effect() -> bool:
    """Whether a kernel generated now rounds its fp16/bf16 intermediates: the scope's choice, else the
    environment's as last read."""
    forced = _forced_eager_rounding.get()
    return _env_eager_rounding if forced is None else forced


@contextlib.contextmanager
def eager_rounding_scope(on: bool = True):
    """Evaluations inside round fused fp16/bf16 intermediates to their dtype (``on``) or keep them in
    float32 (not ``on``), whatever FLYARRAY_EAGER_ROUNDING says. The choice is part of every plan's key
    (plan.settings) and of fa.jit's trace key, so plans built inside and outside never mix; a context
    variable, so other threads keep their own."""
    if not isinstance(on, (bool, int)):   # bool("off") is True
        raise TypeError(f"eager_rounding_scope: on must be a bool, got {on!r}")
    token = _forced_eager_rounding.set(bool(on))
    try:
        yield
    finally:
        _forced_eager_rounding.reset(token)


def plan_check() -> bool:
    return switch("FLYARRAY_PLAN_CHECK", False)


def cuda_graphs() -> bool:
    """FLYARRAY_CUDA_GRAPHS=0 turns fa.jit's graph replay off process-wide (on by default)."""
    return switch("FLYARRAY_CUDA_GRAPHS", True)


def gemm_warp_specialized() -> bool:
    """16-bit square GEMMs on sm_90 take gemm_hopper's warp-specialized kernel (on by default since the
    twenty-first session's H100 run, docs/benchmarks.md); FLYARRAY_GEMM_WS=0 keeps the Triton GEMM."""
    return switch("FLYARRAY_GEMM_WS", True)


def precompile() -> bool:
    """FLYARRAY_PRECOMPILE=0 turns the background compiles of a new plan's kernels off (on by default)."""
    return switch("FLYARRAY_PRECOMPILE", True)
