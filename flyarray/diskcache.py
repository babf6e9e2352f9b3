"""The trusted on-disk cache: what flyarray reads back from disk, and how it writes it.

Everything under ``config.cache_dir()`` is either executed (kernel sources,
Triton's binaries) or steers what is executed (tuning tables), so:

- the directories must be private: created 0700; one not owned by us, or
  writable by group/others (or below such a directory), is refused, as ssh
  refuses such a key file;
- an entry is read once, through a descriptor, only if it is a regular file of
  sane size, and only the bytes that were verified are ever used: a kernel is
  ``compile()``d from the verified text, never imported (no second read, no
  ``__pycache__`` bytecode);
- writes go to a fresh ``mkstemp`` file in the target directory, then
  ``os.replace`` (no predictable names a planted symlink could redirect);
- the cache is an optimisation: if it is unusable or unwritable, flyarray works
  from memory and says so once per process. Nothing is created at import.
"""
from __future__ import annotations

import atexit
import errno
import hashlib
import linecache
import os
import pathlib
import shutil
import stat
import sys
import tempfile
import threading
import time
import types
import warnings
from typing import Optional

from . import config

MAX_ENTRY_BYTES = 8 << 20  # kernel sources and tuning tables are kilobytes; a bigger "entry" is an attack

_lock = threading.RLock()
# CPython 3.11's compile() is not safe in two threads at once (SystemError: AST constructor recursion
# depth mismatch, seen in tests/test_plan.py's thread test): every compile of generated source takes it.
COMPILE_LOCK = threading.Lock()
# a forked child has only the forking thread: a lock another thread held at the fork would stay held for good
os.register_at_fork(after_in_child=lambda: (_lock._at_fork_reinit(), COMPILE_LOCK._at_fork_reinit()))
_dirs: dict = {}  # (root, name) -> verified directory, or None when it cannot be used
_warned = False
_unwritable: set = set()  # directories a write failed in: not retried this process


class UnsafeCacheDir(PermissionError):
    """A cache directory that others could write to; its contents cannot be trusted."""


class BadEntry(OSError):
    """An entry that is not a regular file of sane size (a FIFO, a symlink, a directory, ...)."""


def warn_once(message: str) -> None:
    """The one warning per process that the disk cache is (partly) off."""
    global _warned
    with _lock:
        if _warned:
            return
        _warned = True
    warnings.warn(f"flyarray: {message}; kernels are kept in memory only (this warning is shown once)",
                  RuntimeWarning, stacklevel=3)


def _reset_for_tests() -> None:
    global _warned
    with _lock:
        _dirs.clear()
        _unwritable.clear()
        _triton_state.pop("memo", None)
        _warned = False


# ---- directories ------------------------------------------------------------------------------------
def directory(name: str) -> Optional[pathlib.Path]:
    """``<cache>/<name>``, created 0700 and checked private; None (after one warning) if unusable."""
    try:
        root = config.cache_dir()
    except (RuntimeError, KeyError, OSError) as exc:  # no home directory
        warn_once(f"no kernel cache directory ({exc})")
        return None
    key = (str(root), name)
    with _lock:
        if key in _dirs:
            return _dirs[key]
        try:
            found = _private_dir(root, name)
        except UnsafeCacheDir as exc:
            found = None
            warn_once(str(exc))
        except OSError as exc:
            found = None
            warn_once(f"cannot create the kernel cache {root / name} ({exc.strerror or exc})")
        _dirs[key] = found
        return found


def _private_dir(root: pathlib.Path, name: str) -> pathlib.Path:
    """Create or check base/vN/name. The resolved path is used from here on, so no symlink can move it."""
    base = pathlib.Path(os.path.realpath(root.parent))
    for ancestor in reversed(base.parents):
        _mkdir(ancestor)  # e.g. a missing ~/.cache
        _check(ancestor, ancestor=True)
    target = base
    for part in (None, root.name, name):
        if part is not None:
            target = target / part
        _mkdir(target)
        _check(target, ancestor=False)
    return target


def _mkdir(path: pathlib.Path) -> None:
    """Create ``path`` 0700 if it is missing (only then: a read-only disk refuses even an existing one)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def _check(path: pathlib.Path, ancestor: bool) -> None:
    st = os.lstat(path)
    uid = os.geteuid()
    fix = "or set FLYARRAY_CACHE_DIR to a directory only you can write"
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheDir(f"refusing the kernel cache: {path} is not a directory (a symlink?); "
                             f"remove it {fix}")
    if st.st_uid != uid and not (ancestor and st.st_uid == 0):
        raise UnsafeCacheDir(f"refusing the kernel cache: {path} is owned by uid {st.st_uid}, not by you "
                             f"(uid {uid}); fix: remove it (it is recreated private) {fix}")
    if st.st_mode & 0o022 and not (ancestor and st.st_mode & stat.S_ISVTX):
        raise UnsafeCacheDir(f"refusing the kernel cache: {path} is writable by group/others "
                             f"(mode {stat.S_IMODE(st.st_mode):04o}); fix: chmod go-w {path} {fix}")


# ---- reading ----------------------------------------------------------------------------------------
def read_bytes(path: pathlib.Path) -> Optional[bytes]:
    """The bytes of ``path`` if it is a regular file of sane size, read once; None if absent.

    O_NOFOLLOW refuses a symlink (to /dev/zero, to another user's file);
    O_NONBLOCK keeps a FIFO from blocking the open; fstat checks what was opened.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadEntry(f"{path} is a symlink") from None
        raise BadEntry(f"{path} cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise BadEntry(f"{path} is {kind}")
        if st.st_size > MAX_ENTRY_BYTES:
            raise BadEntry(f"{path} is too large ({st.st_size} bytes)")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, MAX_ENTRY_BYTES + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_ENTRY_BYTES:  # it grew after fstat
                raise BadEntry(f"{path} is too large")
        return b"".join(chunks)
    except BadEntry:
        raise
    except OSError as exc:
        raise BadEntry(f"{path} cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)


def _header(body: str) -> str:
    return f"# flyarray kernel sha256={hashlib.sha256(body.encode()).hexdigest()}\n"


def read_source(name: str, key: str):
    """(verified text, reason) of the source entry ``<cache>/<name>/<key>.py``; text is None on a miss.

    The entry must be headed by the hash of its body, and ``key`` must be the
    body's hash: the text returned is exactly what was checked.
    """
    folder = directory(name)
    if folder is None:
        return None, "no disk cache"
    path = folder / f"{key}.py"
    try:
        data = read_bytes(path)
    except BadEntry as exc:
        warnings.warn(f"flyarray: kernel cache entry {exc}; rebuilding it", RuntimeWarning, stacklevel=2)
        return None, "not a regular file"
    if data is None:
        return None, "not in memory or on disk"
    try:
        head, body = data.decode("utf-8").split("\n", 1)
    except (UnicodeDecodeError, ValueError):
        body = None
    if body is None or head + "\n" != _header(body) or hashlib.sha256(body.encode()).hexdigest()[:32] != key:
        warnings.warn(f"flyarray: corrupt kernel cache entry {path}; rebuilding it", RuntimeWarning, stacklevel=2)
        return None, "corrupt"
    return body, "ok"


# ---- writing ----------------------------------------------------------------------------------------
def write_source(name: str, key: str, body: str) -> bool:
    """Store ``body`` as ``<cache>/<name>/<key>.py``, headed by its hash."""
    folder = directory(name)
    return folder is not None and write_atomic(folder, f"{key}.py", (_header(body) + body).encode())


_swept: set = set()
STALE_TEMP_SECONDS = 3600


def _sweep_stale_temp_files(folder: pathlib.Path):
    """Remove write_atomic's temp files an hour old (once per folder and process): a writer killed between
    writing and renaming (SIGKILL, power loss) left one for good. A live writer's is milliseconds old."""
    _swept.add(folder)
    cutoff = time.time() - STALE_TEMP_SECONDS
    try:
        with os.scandir(folder) as entries:
            stale = [e.path for e in entries if e.name.startswith(".") and e.name.endswith(".tmp")
                     and e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mtime < cutoff]
    except OSError:
        return
    for path in stale:
        try:
            os.unlink(path)
        except OSError:
            pass


def write_atomic(folder: pathlib.Path, filename: str, data: bytes) -> bool:
    """Replace ``folder/filename`` with ``data`` at once; False (one warning per process) if it cannot.

    The temp file is mkstemp's (O_EXCL, mode 0600, an unguessable name), so a
    symlink planted at a predictable name redirects nothing; it is removed if
    anything fails (a full disk leaves no debris).
    """
    if folder in _unwritable:
        return False
    if folder not in _swept:
        _sweep_stale_temp_files(folder)
    target = folder / filename
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            os.replace(tmp, target)
        except IsADirectoryError:  # a directory where the entry belongs: an empty one can go
            try:
                os.rmdir(target)
            except OSError as exc:  # a non-empty one stays (never removed recursively): only this entry is lost
                warn_once(f"cannot write the cache entry {target}: a directory is in its place "
                          f"({exc.strerror or exc}); remove it to cache this kernel on disk again")
                return False
            os.replace(tmp, target)
        tmp = None
        return True
    except OSError as exc:
        _unwritable.add(folder)
        warn_once(f"cannot write the kernel cache {folder} ({exc.strerror or exc})")
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


# ---- loading ----------------------------------------------------------------------------------------
def load_module(text: str, name: str) -> types.ModuleType:
    """A fresh module executed from ``text`` (already verified): no file is read, no bytecode cached.

    Triton's @triton.jit reads a kernel's source back (inspect.getsource), so
    the text is registered in linecache under a name in angle brackets: one
    linecache never looks up on disk, and which is unique to this text.
    """
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    filename = f"<flyarray {name} sha256={digest}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    with COMPILE_LOCK:
        code = compile(text, filename, "exec", dont_inherit=True)
    module = types.ModuleType(name)
    module.__flyarray_source__ = text  # keeps the text with the module, e.g. to re-register it in linecache
    sys.modules[name] = module  # Triton resolves a kernel's globals through its module
    exec(code, module.__dict__)
    return module


def forget_modules(suffix: str):
    """Drop the loaded kernel modules whose names end with ``suffix`` from sys.modules and their text from
    linecache (fa.clear_caches): nothing else holds them once the caches are empty, so they are freed; a
    kernel still held elsewhere keeps its module through its globals, and ``reregister_source`` gives the
    interpreter its text back."""
    names = [n for n in sys.modules if n.startswith("flyarray_kernel_") and n.endswith(suffix)]
    for name in names:
        del sys.modules[name]
    if not names:
        return
    prefixes = tuple(f"<flyarray {name} " for name in names)  # load_module's file names
    for filename in [f for f in linecache.cache if f.startswith(prefixes)]:
        del linecache.cache[filename]
    jit = sys.modules.get("triton.runtime.jit")   # Triton >= 3.7 registers every JITFunction by name, for good
    registry = getattr(jit, "_triton_jit_function_registry", None)
    if isinstance(registry, dict):
        owned = tuple(f"{name}:" for name in names)
        for key in [k for k in registry if isinstance(k, str) and k.startswith(owned)]:
            del registry[key]


def reregister_source(fn):
    """Put ``fn``'s module text back in linecache if forget_modules took it (Triton's interpreter reads a
    kernel's source again when it rewrites it)."""
    text = fn.__globals__.get("__flyarray_source__")
    filename = fn.__code__.co_filename
    if text is not None and filename not in linecache.cache:
        linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)


# ---- Triton's binary cache -------------------------------------------------------------------------
_triton_state = {"depth": 0, "saved": None, "dir": None, "private": None}
_NOTHING = object()


def _triton_dir() -> Optional[str]:
    """Where our compiles put Triton's binaries: <cache>/triton if private, else a private temp dir.

    None: leave Triton as configured (TRITON_CACHE_DIR set by the user, or no temp dir either).
    """
    if "TRITON_CACHE_DIR" in os.environ:
        return None
    env = os.environ.get("FLYARRAY_CACHE_DIR")
    if _triton_state.get("memo", (_NOTHING,))[0] == env:  # the launch hot path: no path work
        return _triton_state["memo"][1]
    folder = directory("triton")
    if folder is not None:
        _triton_state["memo"] = (env, str(folder))
        return str(folder)
    if _triton_state["private"] is None:
        try:
            _triton_state["private"] = tempfile.mkdtemp(prefix="flyarray-triton-")
            atexit.register(shutil.rmtree, _triton_state["private"], True)
        except OSError:
            _triton_state["private"] = ""
    found = _triton_state["private"] or None
    _triton_state["memo"] = (env, found)
    return found


class triton_cache_scope:
    """``with triton_cache_scope(): kernel[grid](...)``: Triton compiles land in our checked directory.

    Sets ``triton.knobs.cache.dir`` for the duration, without touching
    os.environ (which Triton's knob setter would). Thread-safe: scopes nest and
    overlap across threads; the first to enter sets the knob, the last to leave
    restores it. Triton compiles of other code that overlap a scope also land in
    our directory (harmless: it is private).
    """

    __slots__ = ()

    def __enter__(self):
        with _lock:
            state = _triton_state
            if state["depth"] == 0:
                target = _triton_dir()
                cache = _triton_knobs()
                if target is not None and cache is not None:
                    state["saved"] = cache.__dict__.get("dir", _NOTHING)
                    cache.__dict__["dir"] = target  # the knob's own value, bypassing its env-setting setter
                    state["dir"] = target
                else:
                    state["dir"] = None
            state["depth"] += 1
        return self

    def __exit__(self, *exc):
        with _lock:
            state = _triton_state
            state["depth"] -= 1
            if state["depth"] == 0 and state["dir"] is not None:
                cache = _triton_knobs()
                if state["saved"] is _NOTHING:
                    cache.__dict__.pop("dir", None)
                else:
                    cache.__dict__["dir"] = state["saved"]
                state["dir"] = state["saved"] = None
        return False


def _triton_knobs():
    try:
        from triton import knobs
        return knobs.cache
    except (ImportError, AttributeError):  # Triton < 3.4: no knobs (flyarray needs >= 3.6)
        return None


class in_triton_cache:
    """``kernel`` whose launches (``k[grid](...)``) run inside ``triton_cache_scope()``."""

    __slots__ = ("kernel",)

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launcher = self.kernel[grid]

        def launch(*args, **kwargs):
            with triton_cache_scope():
                return launcher(*args, **kwargs)
        return launch

    def __getattr__(self, name):  # arg_names, fn, ... of the kernel itself
        if name == "kernel":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.kernel, name)
