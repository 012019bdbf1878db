"""Inside a job's rank: hand the native tracer's calls to the rank's Python interposer.

``faults/chaosio.c`` is in the rank's ``LD_PRELOAD`` (``launch.job.job_env``). Called by
``inproc.install`` once the interposer is installed, :func:`attach` registers a handler
with it, so a call from native code (HDF5's ``pwrite``, an ``msync``) is performed
through the interposer's own wrappers: it gets the next ordinal, its record (bytes kept
for the crash model) and the point's rules, exactly as the same call from Python. A call
the interposer makes itself comes back here while it is busy and is passed through.

It also exports the library's configuration (``faults.shim.ENV_CONF``) to the processes
the rank starts: there no interposer runs, and the library writes the records and fires
the point itself, numbering events from the same per-rank counter (an 8-byte file in the
trace directory) as this process does.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import os

from chaos.model import contract as S
from faults import shim
from faults.interposer import Interposer, _Fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_keep: list[Any] = []  # the ctypes callback: freed while the library still calls it would crash


def attach(ix: Interposer, rank: int, attempt: int, trace_dir: str, point: dict[str, Any] | None) -> str | None:
    """Bind the preloaded native tracer to ``ix``: None once bound, else why not. Called by
    ``inproc.install``, which writes the reason into the rank's trace, so that the results do
    not claim a native trace that never ran (``explore.reference`` reads it)."""
    lib = shim.loaded()
    if lib is None:
        return "the library in LD_PRELOAD was not loaded into this process"
    roots = [ix.root, *ix.extra_roots]
    for given in (os.environ.get(S.ENV_OUT), os.environ.get("TMPDIR")):  # as the job may spell them
        if given and os.path.abspath(given) not in roots and os.path.realpath(given) in roots:
            roots.append(os.path.abspath(given))
    ord_file = os.path.join(trace_dir, f"ord-r{rank}-a{attempt}")
    target = None
    if point is not None and point.get("op") is not None:
        # By ordinal only: a child counts no (kind, path) anchors; the fault-free runs gave its events
        # the same ordinals (an anchored point's op), and this process fires an anchor's itself.
        target = (str(point["mode"]), int(point["op"]))
    try:
        text = shim.conf(rank, attempt, trace_dir, roots, ord_file, target)
    except Exception as exc:  # a path the library cannot carry: the Python interposer alone, as before
        return str(exc)
    handler = _handler(ix, lib)
    _keep.append(shim.register(lib, handler))
    lib.chaos_shim_configure(text.encode())
    os.environ[shim.ENV_CONF] = text  # the rank's own children trace standalone with it
    ix.next_ord = lib.chaos_shim_next_ord  # type: ignore[attr-defined]
    atexit.register(lib.chaos_shim_off)  # no call into an interpreter being torn down
    if os.environ.get(S.ENV_CHILDREN) == "1":
        # A forked child keeps its interposer (inproc): its native calls go to it, not standalone.
        os.register_at_fork(after_in_child=lambda: lib.chaos_shim_register(_keep[-1]))
    return None


def _handler(ix: Interposer, lib: Any) -> Any:
    def handle(kind: int, fd: int, dirfd: int, path: bytes | None, path2: bytes | None, buf: int | None,
               n: int, off: int, flags: int, mode: int) -> int:
        if ix._busy():
            return shim.PASS
        ix._tls.native = True  # its records say so (JobInterposer._op)
        try:
            return _perform(ix, lib, shim.KINDS.get(kind, ""), fd, None if dirfd < 0 else dirfd,
                            os.fsdecode(path) if path is not None else None,
                            os.fsdecode(path2) if path2 is not None else None, buf, n, off, flags, mode)
        except OSError as e:
            return -(e.errno or errno.EIO)
        except BaseException:  # noqa: BLE001 - nothing may unwind into C
            return -errno.EIO
        finally:
            ix._tls.native = False
    return handle


def _dir_fd(d: int | None) -> int | None:
    return None if d is None or d == -100 else d  # -100: AT_FDCWD


def _perform(ix: Interposer, lib: Any, kind: str, fd: int, dirfd: int | None, path: str | None,
             path2: str | None, buf: int | None, n: int, off: int, flags: int, mode: int) -> int:
    """Do one native call through the interposer's wrappers; its result (or OSError)."""
    if kind == "open":
        return ix._os_open(path, flags, mode, dir_fd=_dir_fd(dirfd))
    if kind in ("write", "pwrite"):
        if fd not in ix._fds:
            return shim.PASS
        data = ctypes.string_at(buf, n) if n else b""
        return ix._os_write(fd, data) if kind == "write" else ix._os_pwrite(fd, data, off)
    if kind in ("fsync", "fdatasync", "truncate", "close"):
        if fd not in ix._fds:
            return shim.PASS
        if kind == "truncate":
            ix._os_ftruncate(fd, off)
        elif kind == "close":
            ix._os_close(fd)
        else:
            ix._sync(kind, fd)
        return 0
    if kind == "rename":
        ix._os_replace(path, path2, src_dir_fd=_dir_fd(dirfd), dst_dir_fd=_dir_fd(off))
        return 0
    if kind in ("unlink", "rmdir"):
        ix._entry(kind, kind, path, _dir_fd(dirfd))
        return 0
    if kind == "mkdir":
        ix._os_mkdir(path, mode, dir_fd=_dir_fd(dirfd))
        return 0
    if kind == "msync":
        return _msync(ix, lib, path, buf, n, off, flags)  # type: ignore[arg-type]
    return shim.PASS


def _msync(ix: Interposer, lib: Any, path: str, addr: int, n: int, off: int, flags: int) -> int:
    """An msync of a shared mapping of ``path``: a write of the synced bytes at their file offset,
    then an fdatasync, each an event with its ordinal (the stores themselves no one sees)."""
    ix._enter()
    try:
        ix._do_write(_Fd(path), -1, ctypes.string_at(addr, n), off, len, "msync")
        ix._act_before("fdatasync", (path,), fd=None)
        if lib.msync(addr, n, flags) != 0:
            e = ctypes.get_errno()
            ix._op("fdatasync", path=path, fd=None, is_dir=False, via="msync", error=e)
            raise OSError(e, os.strerror(e), path)
        ix._op("fdatasync", path=path, fd=None, is_dir=False, via="msync")
        return 0
    finally:
        ix._leave()
