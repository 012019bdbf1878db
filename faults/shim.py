"""The native tracer (``chaosio.c``): built here, loaded into a job by ``LD_PRELOAD``, bound here.

The Python interposer sees what Python code writes; a job's native writers (HDF5 through
h5py, a C++ or Rust data writer, a ``dd`` it starts, an ``msync`` of a memmap) go round
it. ``chaosio.c`` sits beneath them, over libc's file calls, and either hands each call
to the rank's Python interposer (``register``: one trace, one ordinal sequence, one set
of point rules) or, in a process the interposer does not run in, writes the same records
and fires the point itself. Its header says what it cannot see.

Who calls what: ``chaos.launch.job.job_env`` calls :func:`build` (the library from the
user's chaos cache, compiled there once per source) and puts it in every attempt's
``LD_PRELOAD``; the rank's boot path
(``chaos.target.job.native.attach``) calls :func:`loaded`, :func:`register` and
:func:`configure`, and :func:`off` at exit.
"""

from __future__ import annotations

import ctypes
import functools
import os
import stat
from collections.abc import Callable
from typing import Any

from faults.errors import Unsupported

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chaosio.c")
PASS = -(1 << 40)  # the handler's answer "not mine: perform it untraced"
ENV_CONF = "CHAOS_SHIM"  # a process the rank starts reads its configuration here (standalone mode)
# What the library hands the handler, by ``kind`` (chaosio.c's enum).
KINDS = {1: "open", 2: "write", 3: "pwrite", 4: "fsync", 5: "fdatasync", 6: "truncate", 7: "rename",
         8: "unlink", 9: "mkdir", 10: "rmdir", 11: "close", 12: "msync"}
HANDLER = ctypes.CFUNCTYPE(ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_char_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_longlong,
                           ctypes.c_int, ctypes.c_int)


def build(dest: str, cache: str | None = None) -> str:
    """The library compiled from ``chaosio.c`` (once per source: named by its hash).

    Taken from ``cache`` (built there if missing) where that folder and the file are this
    user's alone, neither a link nor writable by anyone else: a library loaded into every
    rank is code, so one another user could have placed there is never used. Anywhere
    else it is built in ``dest`` (an exploration's own scratch root).

    Raises :class:`Unsupported` naming the reason where no C compiler works here; the
    job is then traced by the Python interposer alone, and its results say so.
    """
    name = _library_name()
    if cache is not None:
        try:
            os.makedirs(cache, mode=0o700, exist_ok=True)
            if _private(os.path.dirname(os.path.abspath(cache))) and _private(cache):
                lib = os.path.join(cache, name)
                if not os.path.lexists(lib):
                    _compile(lib)
                if _private(lib):
                    return lib
        except OSError:
            pass  # an unwritable cache: build in dest
    lib = os.path.join(dest, name)
    if not os.path.exists(lib):
        os.makedirs(dest, exist_ok=True)
        _compile(lib)
    return lib


@functools.lru_cache(maxsize=1)
def _library_name() -> str:
    """``chaosio-<hash of the source>.so``: read and hashed once per process, not once per attempt."""
    import hashlib  # here, not at the top: a rank imports this module to bind, never to build

    with open(SOURCE, "rb") as f:
        return f"chaosio-{hashlib.sha256(f.read()).hexdigest()[:16]}.so"


def _private(path: str) -> bool:
    """Whether ``path`` is this user's own directory or file, no link, writable by no one else."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind_ok = stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
    return kind_ok and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _compile(lib: str) -> None:
    """Compile ``chaosio.c`` to ``lib``: into a temp name beside it, then renamed (atomic: attempts
    and explorations building at once each get a whole library)."""
    import shutil
    import subprocess
    import tempfile

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unsupported("the native tracer needs a C compiler (cc or gcc on PATH, or $CC); none was found")
    fd, tmp = tempfile.mkstemp(prefix=".chaosio-", suffix=".tmp", dir=os.path.dirname(lib))
    os.close(fd)
    try:
        done = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", tmp, SOURCE, "-ldl", "-lpthread"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        _unlink(tmp)
        raise Unsupported(f"the native tracer did not build with {cc}: {e}") from e
    if done.returncode != 0:
        _unlink(tmp)
        raise Unsupported(f"the native tracer did not build with {cc}: {done.stderr.strip()[-400:]}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, lib)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def loaded() -> Any:
    """The library's functions if this process has it preloaded; None otherwise."""
    try:
        me = ctypes.CDLL(None, use_errno=True)
        me.chaos_shim_register  # noqa: B018 - present only where the library is loaded
    except (OSError, AttributeError):
        return None
    me.chaos_shim_configure.argtypes = [ctypes.c_char_p]
    me.chaos_shim_configure.restype = ctypes.c_int
    me.chaos_shim_register.argtypes = [HANDLER]
    me.chaos_shim_register.restype = None
    me.chaos_shim_off.argtypes = []
    me.chaos_shim_off.restype = None
    me.chaos_shim_next_ord.argtypes = []
    me.chaos_shim_next_ord.restype = ctypes.c_longlong
    me.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    me.msync.restype = ctypes.c_int
    return me


def conf(rank: int, attempt: int, trace_dir: str, roots: list[str], ord_file: str,
         point: tuple[str, int] | None) -> str:
    """The configuration string ``chaosio.c`` parses (``rank=R;attempt=A;trace=..;roots=..;ord=..``)."""
    for value in (trace_dir, ord_file, *roots):
        if any(c in value for c in ";:\n"):
            raise Unsupported(f"the native tracer cannot name the path {value!r} (it has ';' or ':')")
    text = f"rank={rank};attempt={attempt};trace={trace_dir};roots={':'.join(roots)};ord={ord_file}"
    return text + (f";point={point[0]}:{point[1]}" if point is not None else "")


def register(lib: Any, handle: Callable[..., int]) -> Any:
    """Hand every traced call to ``handle``; returns the callback object, which must be kept alive."""
    cb = HANDLER(handle)
    lib.chaos_shim_register(cb)
    return cb


__all__ = ["ENV_CONF", "KINDS", "PASS", "build", "conf", "loaded", "register"]
