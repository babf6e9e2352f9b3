"""The disk cache runs only what it verified, in directories only we can write, and is never required.

Each test names the attack or failure it rules out. We run as root here and in
CI, where permissions mean nothing: those cases use ownership, non-directories,
rlimits or a failing os function instead of chmod.
"""
import errno
import importlib.util
import inspect
import json
import linecache
import os
import py_compile
import resource
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import flyarray as fa
from flyarray import plan, runtime
from flyarray.kernels import tuning

from .conftest import assert_matches

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IS_ROOT = os.geteuid() == 0


def _diskcache():
    try:
        from flyarray import diskcache
    except ImportError:  # the code before flyarray/diskcache.py: the tests must fail, not error at import
        return None
    return diskcache


def _reset():
    dc = _diskcache()
    if dc is not None:
        dc._reset_for_tests()


def _forget_kernels_in_memory():
    """As a new process would: no loaded kernel, and no plan holding one."""
    runtime._memory.clear()
    plan.clear()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache dir (not created yet), empty memory caches, the interpret backend."""
    root = tmp_path / "cache"
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(root))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setattr(runtime, "_memory", {})
    monkeypatch.setattr(plan, "_plans", type(plan._plans)())
    monkeypatch.setattr(tuning, "_memory", {})
    _reset()
    fa.set_backend("interpret")
    yield root
    fa.set_backend(None)
    _reset()


def evaluate(op=fa.exp, ref=np.exp, scale=2.0):
    a = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    y = op(fa.asarray(a)) * scale + 1.0
    fa.eval(y)
    assert_matches(y, (ref(a.astype(np.float64)) * scale + 1.0).astype(np.float32), rtol=1e-5, atol=1e-6)


def entries(root):
    return sorted((root / "v1" / "kernels").glob("*.py"))


def flyarray_warnings(caught):
    return [str(w.message) for w in caught if str(w.message).startswith("flyarray")]


# ---- unverified code ------------------------------------------------------------------------------
def test_a_planted_pyc_is_never_run(cache, tmp_path):
    evaluate()
    [entry] = entries(cache)
    assert not (entry.parent / "__pycache__").exists(), "bytecode was written into the cache"
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n")
    pyc = importlib.util.cache_from_source(str(entry))  # what importlib would prefer to the checked .py
    os.makedirs(os.path.dirname(pyc), exist_ok=True)
    py_compile.compile(str(evil), cfile=pyc, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    _forget_kernels_in_memory()
    evaluate()
    assert runtime.stats()["disk_cache_hits"] >= 1
    assert not marker.exists(), "a planted .pyc ran"


_AUDIT = {"path": None, "opens": 0, "evil": None}


def _audit(event, args):
    if event == "open" and _AUDIT["path"] is not None and args and str(args[0]) == _AUDIT["path"]:
        _AUDIT["opens"] += 1
        if _AUDIT["opens"] == 2:  # swap the file after it was checked, before it is read again
            os.replace(_AUDIT["evil"], _AUDIT["path"])


def test_an_entry_swapped_after_its_check_is_not_run(cache, tmp_path):
    if not getattr(sys, "_flyarray_audit", False):
        sys.addaudithook(_audit)
        sys._flyarray_audit = True
    evaluate()
    [entry] = entries(cache)
    shutil.rmtree(entry.parent / "__pycache__", ignore_errors=True)  # as if filled with PYTHONDONTWRITEBYTECODE
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.py"
    evil.write_text(entry.read_text().split("\n", 1)[0] + f"\nopen({str(marker)!r}, 'w').close()\n")
    _forget_kernels_in_memory()
    _AUDIT.update(path=str(entry), opens=0, evil=str(evil))
    try:
        evaluate()
    finally:
        opens, _AUDIT["path"] = _AUDIT["opens"], None
    assert not marker.exists(), "the entry was read again after its check, and the swapped file ran"
    assert opens == 1, f"the entry was opened {opens} times; once is the rule"


def test_a_kernel_loaded_from_verified_text_runs_under_the_interpreter():
    from flyarray.diskcache import load_module
    from flyarray.kernels._triton import runner
    text = textwrap.dedent("""
        import triton
        import triton.language as tl


        @triton.jit
        def kernel(x, y, N, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + i, tl.load(x + i, mask=i < N) * 3.0 + 1.0, mask=i < N)
    """)
    module = load_module(text, "flyarray_test_verified_interpret")
    filename = module.kernel.fn.__code__.co_filename
    assert not os.path.exists(filename)  # no file behind it: the source can only come from the text
    linecache.checkcache()  # what a traceback does; it must not drop the text
    assert inspect.getsource(module.kernel.fn) in text
    x = torch.arange(10, dtype=torch.float32)
    y = torch.empty_like(x)
    runner(module.kernel, "cpu")[(1,)](x, y, 10, BLOCK=16)
    assert torch.equal(y, x * 3.0 + 1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_kernel_loaded_from_verified_text_compiles_for_the_gpu_into_our_cache(cache):
    from flyarray.diskcache import in_triton_cache, load_module
    text = textwrap.dedent("""
        import triton
        import triton.language as tl


        @triton.jit
        def kernel(x, y, N, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + i, tl.load(x + i, mask=i < N) * 3.0 + 1.0, mask=i < N)
    """)
    module = load_module(text, "flyarray_test_verified_gpu")
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    env = dict(os.environ)
    in_triton_cache(module.kernel)[(8,)](x, y, 1000, BLOCK=128)
    torch.cuda.synchronize()
    assert torch.equal(y, x * 3.0 + 1.0)
    assert dict(os.environ) == env
    assert any(p.is_file() for p in (cache / "v1" / "triton").rglob("*"))


# ---- the directory rule ------------------------------------------------------------------------------
def test_cache_directories_are_created_private(cache):
    old = os.umask(0o022)
    try:
        evaluate()
    finally:
        os.umask(old)
    for d in (cache, cache / "v1", cache / "v1" / "kernels"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    [entry] = entries(cache)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "someone else's", "below a world-writable dir"])
def test_an_unsafe_cache_dir_is_refused(cache, how, monkeypatch, tmp_path):
    unsafe = cache
    if how == "world-writable":  # e.g. another user pre-created it, 0777
        (cache / "v1").mkdir(parents=True)
        os.chmod(cache, 0o777)
    elif how == "group-writable":
        (cache / "v1").mkdir(parents=True)
        os.chmod(cache / "v1", 0o770)
        unsafe = cache / "v1"
    elif how == "someone else's":
        if not IS_ROOT:
            pytest.skip("only root can give a directory away")
        (cache / "v1").mkdir(parents=True, mode=0o700)
        os.chmod(cache, 0o700)
        os.chown(cache, 4242, 4242)
    else:
        shared = tmp_path / "shared"
        shared.mkdir()
        os.chmod(shared, 0o777)  # not sticky: anyone may rename our directory away and plant theirs
        unsafe, cache = shared, shared / "cache"
        monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(cache))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate()
        evaluate(fa.tanh, np.tanh)  # a second kernel: still one warning
    messages = flyarray_warnings(caught)
    assert len(messages) == 1, messages
    assert os.path.realpath(unsafe) in messages[0]
    assert "fix:" in messages[0]
    assert not (cache / "v1" / "kernels").exists(), "the refused directory was written to"


def test_importing_flyarray_leaves_tritons_environment_and_the_disk_alone(tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, FLYARRAY_CACHE_DIR=str(cache), PYTHONPATH=REPO, PYTHONDONTWRITEBYTECODE="1")
    env.pop("TRITON_CACHE_DIR", None)
    script = "import os, flyarray; print('TRITON_CACHE_DIR' in os.environ)"
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "False", "import set TRITON_CACHE_DIR for every Triton user of the process"
    assert not cache.exists(), "import created the cache directory"


def test_triton_cache_scope_uses_the_checked_dir_and_restores_the_knob(cache):
    import triton
    from flyarray.diskcache import triton_cache_scope
    env, before = dict(os.environ), triton.knobs.cache.dir
    with triton_cache_scope():
        with triton_cache_scope():  # nested
            inside = triton.knobs.cache.dir
        assert triton.knobs.cache.dir == inside
        assert dict(os.environ) == env
    assert inside == os.path.realpath(cache / "v1" / "triton")
    assert stat.S_IMODE(os.stat(inside).st_mode) == 0o700
    assert triton.knobs.cache.dir == before and dict(os.environ) == env


def test_triton_cache_scope_refuses_an_unsafe_dir(cache):
    import triton
    from flyarray.diskcache import triton_cache_scope
    (cache / "v1" / "triton").mkdir(parents=True, mode=0o700)
    os.chmod(cache, 0o700)
    os.chmod(cache / "v1", 0o700)
    os.chmod(cache / "v1" / "triton", 0o777)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with triton_cache_scope():
            inside = triton.knobs.cache.dir
    assert inside != str(cache / "v1" / "triton") and not inside.startswith(str(cache))
    assert stat.S_IMODE(os.stat(inside).st_mode) == 0o700  # a private temp dir instead
    assert len(flyarray_warnings(caught)) == 1


def test_triton_cache_scope_is_thread_safe(cache):
    import triton
    from flyarray.diskcache import triton_cache_scope
    before = triton.knobs.cache.dir
    ours = os.path.realpath(cache / "v1" / "triton")
    seen, start = set(), threading.Barrier(8)

    def work():
        start.wait()
        for _ in range(300):
            with triton_cache_scope():
                seen.add(triton.knobs.cache.dir)
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {ours}
    assert triton.knobs.cache.dir == before


def test_a_cross_compile_puts_tritons_binaries_in_our_cache(cache):
    import triton
    import triton.language as tl
    from flyarray.targets import KernelSpec, compile_for

    @triton.jit
    def add_one(x, y, N, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < N) + 1.0, mask=i < N)

    env = dict(os.environ)
    spec = KernelSpec("add_one", add_one, {"x": "*fp32", "y": "*fp32", "N": "i32", "BLOCK": "constexpr"}, {"BLOCK": 64})
    try:
        compile_for(spec, "sm_90")
    except Exception as exc:  # a Triton build without the NVIDIA backend's tools
        pytest.skip(f"cannot cross-compile here: {exc}")
    assert any(p.name.endswith(".json") for p in (cache / "v1" / "triton").rglob("*"))
    assert dict(os.environ) == env


# ---- temp files ------------------------------------------------------------------------------------
def test_temp_files_do_not_follow_planted_symlinks(cache, tmp_path):
    evaluate()
    [entry] = entries(cache)
    entry.unlink()
    _forget_kernels_in_memory()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    pid = os.getpid()
    (cache / "v1" / "tuning").mkdir(mode=0o700)
    for planted in (entry.parent / f"{entry.stem}.tmp{pid}", cache / "v1" / "tuning" / f"gemm.{pid}.tmp"):
        os.symlink(victim, planted)  # the names the writers used to pick
    evaluate()
    tuning.save("gemm", "key", {"BLOCK_M": 64})
    assert victim.read_text() == "precious", "a write followed a planted symlink"
    assert stat.S_ISREG(os.lstat(entry).st_mode)
    table = cache / "v1" / "tuning" / "gemm.json"
    assert stat.S_ISREG(os.lstat(table).st_mode) and json.loads(table.read_text()) == {"key": {"BLOCK_M": 64}}


def test_a_killed_writers_temp_file_is_swept_once_an_hour_old(tmp_path, monkeypatch):
    """A writer killed between writing and renaming left `.<entry>.XXXX.tmp` for good: the next process's
    first write to that folder removes such files an hour old; fresh ones (a live writer's) and planted
    symlinks' targets stay."""
    from flyarray import diskcache
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    old, fresh = folder / ".abc.py.k1l2.tmp", folder / ".def.py.m3n4.tmp"
    old.write_text("half")
    fresh.write_text("half")
    hour_ago = time.time() - 2 * diskcache.STALE_TEMP_SECONDS
    os.utime(old, (hour_ago, hour_ago))
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = folder / ".ghi.py.o5p6.tmp"
    os.symlink(victim, link)
    os.utime(link, (hour_ago, hour_ago), follow_symlinks=False)
    monkeypatch.setattr(diskcache, "_swept", set())
    assert diskcache.write_atomic(folder, "xyz.py", b"body")
    assert not old.exists() and fresh.exists() and victim.read_text() == "precious"
    assert (folder / "xyz.py").read_bytes() == b"body"


# ---- entries that are not regular files --------------------------------------------------------------
class Hung(Exception):
    """Not an OSError: a reader that catches those must not mistake this for a bad entry."""


class _Guard:
    """Bounds what the old code did with such entries (hang on a FIFO, read /dev/zero forever)."""

    def __enter__(self):
        def expire(*_):
            raise Hung("reading a cache entry hung")
        self.handler = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, 10)
        self.limit = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), self.limit[1]))
        return self

    def __exit__(self, *exc):
        resource.setrlimit(resource.RLIMIT_AS, self.limit)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.handler)


@pytest.mark.parametrize("kind", ["fifo", "symlink to /dev/zero", "directory"])
def test_an_entry_that_is_not_a_regular_file_is_rebuilt(cache, kind):
    evaluate()
    [entry] = entries(cache)
    good = entry.read_bytes()
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "directory":
        entry.mkdir()
    else:
        os.symlink("/dev/zero", entry)
    _forget_kernels_in_memory()
    with warnings.catch_warnings(record=True) as caught, _Guard():
        warnings.simplefilter("always")
        evaluate()
    messages = flyarray_warnings(caught)
    assert len(messages) == 1 and str(entry) in messages[0], messages
    assert stat.S_ISREG(os.lstat(entry).st_mode) and entry.read_bytes() == good


def test_an_oversized_entry_is_not_read(tmp_path):
    dc = _diskcache()
    assert dc is not None
    path = tmp_path / "big"
    with open(path, "wb") as f:
        f.truncate(dc.MAX_ENTRY_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(dc.BadEntry, match="too large"):
        dc.read_bytes(path)


# ---- a read-only or full disk ----------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import json, warnings
    import numpy as np
    import flyarray as fa
    from flyarray.kernels import tuning
    fa.set_backend("interpret")
    a = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y, z = fa.exp(fa.asarray(a)) * 2.0 + 1.0, fa.tanh(fa.asarray(a)) - 1.0
        fa.eval(y)
        fa.eval(z)
        tuning.save("gemm", "key", {"BLOCK_M": 64})
    ok = (np.allclose(np.asarray(y), np.exp(a.astype(np.float64)) * 2 + 1, rtol=1e-5)
          and np.allclose(np.asarray(z), np.tanh(a.astype(np.float64)) - 1, rtol=1e-5, atol=1e-6))
    print(json.dumps({"ok": bool(ok), "warnings": [str(w.message) for w in caught
                                                  if str(w.message).startswith("flyarray")]}))
""")


def run_child(env, preexec_fn=None):
    env = dict(env, PYTHONPATH=REPO, PYTHONDONTWRITEBYTECODE="1")
    env.pop("FLYARRAY_BACKEND", None)
    env.pop("TRITON_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=preexec_fn)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_and_evaluation_work_without_a_usable_home(tmp_path):
    home = tmp_path / "home"
    home.write_text("")  # not a directory: nothing can be created below it, even by root
    env = dict(os.environ, HOME=str(home))
    env.pop("FLYARRAY_CACHE_DIR", None)
    out = run_child(env)
    assert out["ok"] and len(out["warnings"]) == 1, out


def _full_disk():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))  # writes past 2 KiB fail (EFBIG), root or not


def test_a_full_disk_loses_only_the_cache(tmp_path):
    cache = tmp_path / "cache"
    out = run_child(dict(os.environ, FLYARRAY_CACHE_DIR=str(cache)), preexec_fn=_full_disk)
    assert out["ok"] and len(out["warnings"]) == 1, out
    leftovers = [p for p in (cache / "v1" / "kernels").iterdir()]
    assert leftovers == [], f"debris after a full disk: {leftovers}"


@pytest.mark.parametrize("how", ["read-only file system", "cache dir below a file", "chmod"])
def test_a_read_only_cache_loses_only_the_cache(cache, how, monkeypatch, tmp_path):
    if how == "read-only file system":
        real_replace = os.replace

        def replace(src, dst, **kw):
            if str(cache) in str(dst):
                raise OSError(errno.EROFS, "Read-only file system", str(dst))
            return real_replace(src, dst, **kw)
        monkeypatch.setattr(os, "replace", replace)
    elif how == "cache dir below a file":
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("FLYARRAY_CACHE_DIR", str(tmp_path / "file" / "cache"))
    else:
        if IS_ROOT:
            pytest.skip("root writes to read-only directories")
        (cache / "v1" / "kernels").mkdir(parents=True, mode=0o700)
        os.chmod(cache / "v1" / "kernels", 0o500)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate()
        evaluate(fa.tanh, np.tanh)
    assert len(flyarray_warnings(caught)) == 1, flyarray_warnings(caught)
    kernels = cache / "v1" / "kernels"
    assert not kernels.exists() or list(kernels.iterdir()) == [], "temp files left behind"


# ---- an attacker in another process -------------------------------------------------------------------
ATTACKER = textwrap.dedent("""
    import importlib.util, os, py_compile, random, string, sys, time
    kernels, tuning_dir, victim, marker, pid, seconds = sys.argv[1:7]
    pid, end = int(pid), time.time() + float(seconds)
    evil = os.path.join(os.path.dirname(victim), "evil_source.py")
    payload = f"open({marker!r}, 'w').close()\\n"
    with open(evil, "w") as f:
        f.write(payload)
    good = {}
    alphabet = string.ascii_lowercase + string.digits + "_"

    def plant_symlink(path):
        try:
            os.symlink(victim, path)
        except OSError:
            pass

    def put(path, text):
        tmp = path + ".attacker"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    while time.time() < end:
        for name in sorted(os.listdir(kernels)):
            path = os.path.join(kernels, name)
            if not name.endswith(".py") or os.path.islink(path) or not os.path.isfile(path):
                continue
            key = name[:-3]
            try:  # a .pyc importlib would prefer, unchecked
                pyc = importlib.util.cache_from_source(path)
                os.makedirs(os.path.dirname(pyc), exist_ok=True)
                py_compile.compile(evil, cfile=pyc, doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            except Exception:
                pass
            try:  # swap the entry for evil code (under the real header), then back
                text = open(path).read()
                if payload not in text:
                    good[name] = text
                put(path, text.split("\\n", 1)[0] + "\\n" + payload)
                time.sleep(0.002)
                put(path, good.get(name, text))
            except OSError:
                pass
            for p in (pid - 1, pid, pid + 1):
                plant_symlink(os.path.join(kernels, f"{key}.tmp{p}"))
            for _ in range(5):  # guesses at random temp names
                plant_symlink(os.path.join(kernels, f".{name}." + "".join(random.choices(alphabet, k=8)) + ".tmp"))
        if os.path.isdir(tuning_dir):
            plant_symlink(os.path.join(tuning_dir, f"gemm.{pid}.tmp"))
            plant_symlink(os.path.join(tuning_dir, ".gemm.json." + "".join(random.choices(alphabet, k=8)) + ".tmp"))
        time.sleep(0.001)
""")


def test_an_attacker_in_another_process_runs_nothing_and_writes_nothing_outside(cache, tmp_path):
    evaluate()  # a first entry to attack
    outside = tmp_path / "outside"
    outside.mkdir()
    victim, marker = outside / "victim", outside / "pwned"
    victim.write_text("precious")
    kernels, tuning_dir = cache / "v1" / "kernels", cache / "v1" / "tuning"
    seconds = 3.0
    attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, str(kernels), str(tuning_dir), str(victim),
                                 str(marker), str(os.getpid()), str(seconds)],
                                env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    try:
        end, rounds = time.time() + seconds, 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # corrupt entries are expected, and rebuilt
            while time.time() < end:
                _forget_kernels_in_memory()
                tuning._memory.clear()
                if rounds % 3 == 2:
                    for entry in entries(cache):
                        entry.unlink(missing_ok=True)  # a write, too
                evaluate(scale=1.0 + rounds)
                tuning.save("gemm", "key", {"round": rounds})
                rounds += 1
                assert not marker.exists(), "foreign code ran"
    finally:
        attacker.wait(timeout=30)
    assert rounds >= 3
    assert not marker.exists(), "foreign code ran"
    assert victim.read_text() == "precious", "a file outside the cache was written"
    assert sorted(p.name for p in outside.iterdir()) == ["evil_source.py", "victim"]


# ---- the tuning table ------------------------------------------------------------------------------------
def test_a_deeply_nested_tuning_table_is_ignored_with_a_warning(cache):
    (cache / "v1" / "tuning").mkdir(mode=0o700, parents=True)
    (cache / "v1" / "tuning" / "gemm.json").write_bytes(b"[" * 200_000)
    with pytest.warns(UserWarning, match="ignoring corrupt tuning file"):
        assert tuning.load("gemm") == {}


def test_a_stored_tuning_choice_is_used_only_while_it_is_a_candidate(cache, monkeypatch):
    """The table on disk picks among the configs the code offers; anything else (a tampered or stale entry)
    is ignored: timed again on a GPU, the default without one."""
    default, other = {"BLOCK_M": 64}, {"BLOCK_M": 128}
    tuning.save("gemm", "key", other)
    assert tuning.tune("gemm", "key", [default, other], run=None, default=default) == other
    monkeypatch.setattr(tuning.torch.cuda, "is_available", lambda: False)   # no timing: the default
    for stored in ({}, {"BLOCK_M": 4096}, {"BLOCK_M": 64, "num_warps": 64}):
        tuning.save("gemm", "key", stored)
        assert tuning.tune("gemm", "key", [default, other], run=None, default=default) == default


def test_a_directory_in_one_entrys_place_costs_that_entry_only(cache):
    """A non-empty directory where an entry belongs is left alone (never removed recursively) and that
    kernel is not cached; an empty one is replaced; the other entries are still written."""
    evaluate(fa.exp, np.exp)
    evaluate(fa.sin, np.sin)
    first, second = entries(cache)
    first.unlink()
    (first / "sub").mkdir(parents=True)
    second.unlink()
    second.mkdir()
    _forget_kernels_in_memory()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate(fa.exp, np.exp)
        evaluate(fa.sin, np.sin)
        evaluate(fa.cos, np.cos)
    assert (first / "sub").is_dir()
    assert second.is_file()
    assert len([e for e in entries(cache) if e.is_file()]) == 2  # second rewritten, and cos's new entry
    messages = flyarray_warnings(caught)
    assert any(str(first) in m and "a directory is in its place" in m for m in messages), messages


def test_the_cache_dir_setting_expands_the_home_directory(monkeypatch, tmp_path):
    from flyarray import config
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLYARRAY_CACHE_DIR", "~/flyarray-cache")
    assert config.cache_dir() == tmp_path / "flyarray-cache" / f"v{config.CACHE_VERSION}"
