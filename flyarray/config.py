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


def log_level() -> int:
    try:
        return int(os.environ.get("FLYARRAY_LOG", "0") or 0)
    except ValueError:
        return 0


def check_mode() -> bool:
    return os.environ.get("FLYARRAY_CHECK", "") not in ("", "0")


def eager_rounding() -> bool:
    """FLYARRAY_EAGER_ROUNDING: the process-wide default (off), which ``eager_rounding_scope`` overrides."""
    return os.environ.get("FLYARRAY_EAGER_ROUNDING", "") not in ("", "0")


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
    token = _forced_eager_rounding.set(bool(on))
    try:
        yield
    finally:
        _forced_eager_rounding.reset(token)


def plan_check() -> bool:
    return os.environ.get("FLYARRAY_PLAN_CHECK", "") not in ("", "0")


def cuda_graphs() -> bool:
    """FLYARRAY_CUDA_GRAPHS=0 turns fa.jit's graph replay off process-wide (on by default)."""
    return os.environ.get("FLYARRAY_CUDA_GRAPHS", "1") not in ("", "0")


def gemm_warp_specialized() -> bool:
    """16-bit square GEMMs on sm_90 take gemm_hopper's warp-specialized kernel (on by default since the
    twenty-first session's H100 run, docs/benchmarks.md); FLYARRAY_GEMM_WS=0 keeps the Triton GEMM."""
    return os.environ.get("FLYARRAY_GEMM_WS", "1") not in ("", "0")


def precompile() -> bool:
    """FLYARRAY_PRECOMPILE=0 turns the background compiles of a new plan's kernels off (on by default)."""
    return os.environ.get("FLYARRAY_PRECOMPILE", "1") not in ("", "0")
