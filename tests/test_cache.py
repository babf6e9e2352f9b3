"""The kernel caches: one source per program (not per shape), a disk cache a second process reuses,
and corrupt entries rebuilt with a warning, never trusted."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import flyarray as fa

from .conftest import assert_matches, sample

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def program(x, y):
    """An elementwise chain with a broadcast, and a fused reduction over it."""
    z = fa.exp(x) * y + 1.0
    return z, fa.sum(z * z, axis=-1)


def program_np(a, b):
    z = np.exp(a.astype(np.float64)) * b + 1.0
    return z.astype(np.float32), (z * z).sum(axis=-1).astype(np.float32)


def run_program(shape, seed=0):
    rng = np.random.default_rng(seed)
    a, b = sample(rng, shape, "float32", -1, 1), sample(rng, shape[-1:], "float32", -1, 1)
    z, s = program(fa.asarray(a), fa.asarray(b))
    fa.eval(z, s)
    wz, ws = program_np(a, b)
    assert_matches(z, wz, rtol=1e-5, atol=1e-6)
    assert_matches(s, ws, rtol=1e-5, atol=1e-5)


def test_new_shapes_compile_nothing_new(interpret):
    run_program((3, 5))
    for shape in [(7, 11), (4, 33), (2, 3), (16, 17), (5, 1000)]:
        fa.reset_stats()
        run_program(shape)
        st = fa.stats()
        assert st["kernels_compiled"] == 0, (shape, st)
        assert st["kernels_launched"] >= 1 and st["cache_hits"] >= 1


def test_many_shapes_compile_a_handful_of_kernels(interpret):
    rng = np.random.default_rng(1)
    fa.reset_stats()
    seen_shapes = set()
    for _ in range(40):
        nd = int(rng.integers(1, 4))
        shape = tuple(int(s) for s in rng.integers(1, 9, size=nd))
        seen_shapes.add(shape)
        a = sample(rng, shape, "float32", -1, 1)
        b = sample(rng, shape[-1:], "float32", -1, 1)
        got = fa.tanh(fa.asarray(a) * fa.asarray(b) - 0.5)
        want = np.tanh(a.astype(np.float64) * b - 0.5).astype(np.float32)
        assert_matches(got, want, rtol=1e-5, atol=1e-6)
    compiled = fa.stats()["kernels_compiled"]
    assert len(seen_shapes) > 20
    assert compiled <= 6, f"{compiled} kernels compiled for {len(seen_shapes)} shapes"


SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import flyarray as fa
    fa.set_backend("interpret")
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (6, 10)).astype(np.float32)
    b = rng.uniform(-1, 1, (10,)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        z = fa.exp(fa.asarray(a)) * fa.asarray(b) + 1.0
        s = fa.sum(z * z, axis=-1)
        sm = fa.nn.softmax(fa.asarray(a))
        fa.eval(z, s, sm)
    zz = np.exp(a.astype(np.float64)) * b + 1.0
    e = np.exp(a.astype(np.float64) - a.max(axis=-1, keepdims=True))
    ok = (np.allclose(np.asarray(z), zz, rtol=1e-5) and np.allclose(np.asarray(s), (zz * zz).sum(-1), rtol=1e-5)
          and np.allclose(np.asarray(sm), e / e.sum(-1, keepdims=True), rtol=1e-5))
    corrupt = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "corrupt" in str(w.message)]
    print(json.dumps({"stats": fa.stats(), "ok": bool(ok), "corrupt_warnings": corrupt}))
""")


def run_child(cache_dir):
    env = dict(os.environ, FLYARRAY_CACHE_DIR=str(cache_dir), PYTHONPATH=REPO, TRITON_DEFAULT_FP_FUSION="1")
    env.pop("FLYARRAY_BACKEND", None)
    env.pop("TRITON_CACHE_DIR", None)  # the child puts Triton's cache under its own FLYARRAY_CACHE_DIR
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache dir that one child process filled."""
    cache = tmp_path_factory.mktemp("flyarray-cache")
    first = run_child(cache)
    assert first["ok"]
    assert first["stats"]["kernels_compiled"] >= 2
    assert first["stats"]["disk_cache_hits"] == 0
    return cache


def test_a_second_process_compiles_nothing(warm_cache):
    second = run_child(warm_cache)
    assert second["ok"]
    assert second["stats"]["kernels_compiled"] == 0, second["stats"]
    assert second["stats"]["disk_cache_hits"] > 0


def test_cache_is_versioned_plain_text(warm_cache):
    kernels = list((warm_cache / "v1" / "kernels").glob("*.py"))
    assert kernels
    for path in (warm_cache / "v1").rglob("*"):
        if path.is_file() and path.parent.name == "kernels":
            head = path.read_text().split("\n", 1)[0]
            assert head.startswith("# flyarray kernel sha256=")
    assert not list(warm_cache.rglob("*.pkl")) and not list(warm_cache.rglob("*.pickle"))


def test_a_corrupt_entry_is_rebuilt_with_a_warning(warm_cache):
    kernels = sorted((warm_cache / "v1" / "kernels").glob("*.py"))
    victim = kernels[0]
    text = victim.read_text()
    victim.write_text(text.replace("tl.", "tl .", 1) + "\nraise SystemExit('a corrupt entry was executed')\n")
    third = run_child(warm_cache)
    assert third["ok"]
    assert len(third["corrupt_warnings"]) == 1, third
    assert third["stats"]["kernels_compiled"] == 1
    assert victim.read_text() == text  # rebuilt as it was
    fourth = run_child(warm_cache)
    assert fourth["ok"] and fourth["stats"]["kernels_compiled"] == 0 and not fourth["corrupt_warnings"]


def test_a_truncated_entry_is_rebuilt(warm_cache):
    victim = sorted((warm_cache / "v1" / "kernels").glob("*.py"))[-1]
    victim.write_bytes(b"\xff\xfe")  # not even text
    out = run_child(warm_cache)
    assert out["ok"] and len(out["corrupt_warnings"]) == 1


def test_clear_caches_frees_the_interpreters_kernels(interpret):
    """A generated kernel's module, its interpreted form and Triton's registrations of it go with
    fa.clear_caches (each held ~170-350 KB for good); a kernel that outlives the clear (a fa.jit trace holds
    it) still runs, and a kernel loaded again after the clear too."""
    import gc
    import weakref

    x = fa.asarray(np.linspace(-1, 1, 6, dtype=np.float32))
    traced = fa.jit(lambda v: fa.cos(v) * 3 + 1)
    assert_matches(traced(x), np.cos(np.asarray(x)) * 3 + 1)
    fa.eval(fa.tanh(x) - 2)
    modules = [m for n, m in sys.modules.items() if n.startswith("flyarray_kernel_") and n.endswith("_interpret")]
    assert modules
    alive = [weakref.ref(m) for m in modules]
    del modules
    fa.clear_caches()
    gc.collect()
    assert not [n for n in sys.modules if n.startswith("flyarray_kernel_") and n.endswith("_interpret")]
    assert sum(r() is not None for r in alive) <= 1   # only the fa.jit trace's kernel is still held
    assert_matches(traced(x), np.cos(np.asarray(x)) * 3 + 1)
    assert_matches(fa.tanh(x) - 2, np.tanh(np.asarray(x)) - 2)
