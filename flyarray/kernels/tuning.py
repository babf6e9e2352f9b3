"""A small autotuner for the hand-written kernels.

For a key (kernel, arch, dtype, shape bucket) it times a short per-arch list of
candidate configs on the real device with ``triton.testing.do_bench``, keeps
the fastest, and remembers it in memory and on disk as plain JSON under
``flyarray.config.cache_dir() / "tuning" / "<kernel>.json"`` (never pickle; a
corrupt file is ignored with a warning and rewritten; read and written through
flyarray.diskcache, like the kernel cache).

Tuning runs only when asked for: env ``FLYARRAY_AUTOTUNE=1`` or an explicit
``tune=True`` from the caller; otherwise kernels use their default tables, so
a first call is never slow by surprise. It never runs on the CPU (the
interpreter's timings mean nothing).
"""
from __future__ import annotations

import json
import sys
import warnings
from typing import Callable, Iterable, Optional

import torch

from flyarray import config, diskcache, progress
from flyarray.kernels._triton import NotWarmable, is_warming_up

_memory: dict = {}  # (cache directory, kernel) -> {key: config}


def enabled(tune: Optional[bool] = None) -> bool:
    """An explicit argument wins; otherwise env FLYARRAY_AUTOTUNE=1."""
    if tune is not None:
        return bool(tune)
    return config.switch("FLYARRAY_AUTOTUNE", False)


def bucket(n: int) -> int:
    """Shapes within a power of two share a tuned config (bounded tuning work)."""
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


def make_key(kernel: str, arch: str, dtype: str, shape: Iterable[int], extra: Iterable = ()) -> str:
    dims = "x".join(str(bucket(d)) for d in shape)
    tail = ",".join(str(e) for e in extra)
    return f"{kernel}|{arch}|{dtype}|{dims}|{tail}"


def candidates_for(table: dict, arch: str, shape_class: str, default: dict) -> list:
    """The default config first, then the arch's candidates for the shape class (deduplicated)."""
    listed = table.get(arch) or next((v for k, v in table.items() if k[:4] == arch[:4]), {})
    out = [default]
    for cfg in listed.get(shape_class, []):
        if cfg not in out:
            out.append(cfg)
    return out


def load(kernel: str) -> dict:
    """The tuned configs of ``kernel`` on disk (the cache directory's of now: the memory is kept per
    directory); a corrupt file warns and counts as empty."""
    where = (str(config.cache_dir()), kernel)
    if where in _memory:
        return _memory[where]
    folder = diskcache.directory("tuning")
    table = {}
    if folder is not None:
        path = folder / f"{kernel}.json"
        try:
            data = diskcache.read_bytes(path)  # a regular file of sane size, or None
            if data is not None:
                table = json.loads(data)
                if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
                    raise ValueError("expected an object of objects")
        except (ValueError, OSError, RecursionError) as exc:  # BadEntry is an OSError; deep nesting recurses
            warnings.warn(f"flyarray: ignoring corrupt tuning file {path} ({exc}); it will be rewritten")
            table = {}
    _memory[where] = table
    return table


def save(kernel: str, key: str, cfg: dict) -> None:
    table = load(kernel)
    table[key] = cfg
    folder = diskcache.directory("tuning")
    if folder is not None:  # else: remembered in memory for this process
        diskcache.write_atomic(folder, f"{kernel}.json", json.dumps(table, indent=1, sort_keys=True).encode())


def time_config(run: Callable[[dict], None], cfg: dict) -> float:
    """Median ms of ``run(cfg)``; inf if the config fails (e.g. out of shared memory)."""
    import triton.testing
    try:
        run(cfg)  # compile outside the timed region
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(lambda: run(cfg), warmup=5, rep=25, return_mode="median"))
    except Exception as exc:  # a candidate that cannot compile or launch is skipped
        if config.log_level() >= 1:
            print(f"flyarray tuning: candidate {cfg} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return float("inf")


def tune(kernel: str, key: str, candidates: list, run: Callable[[dict], None], default: dict) -> dict:
    """The fastest of ``candidates`` for ``key`` (timed once, then remembered on disk).

    ``run(cfg)`` launches the kernel with ``cfg`` on the real inputs. Output
    buffers are overwritten by every candidate, so the caller's result is
    whatever the final launch (with the winning config) writes.
    """
    table = load(kernel)
    if key in table and (table[key] in candidates or table[key] == default):
        return table[key]   # a stored choice is used only if it is still one of the candidates (disk is untrusted)
    if not torch.cuda.is_available():
        return default  # never tune on the CPU / interpreter
    if is_warming_up():  # a dry run (precompile.py) cannot time anything: the launch will tune
        raise NotWarmable(f"{key} is not tuned yet")
    timings = []
    with progress.bar(len(candidates), f"tuning {key}", delay=1.0) as bar:  # a terminal only (progress.py)
        for cfg in candidates:
            timings.append(time_config(run, cfg))
            bar.update()
    best_ms, best = min(zip(timings, range(len(candidates))))
    chosen = candidates[best] if best_ms != float("inf") else default
    if config.log_level() >= 1:
        print(f"flyarray tuning: {key} -> {chosen} ({best_ms:.4f} ms)", file=sys.stderr)
    save(kernel, key, chosen)
    return chosen
