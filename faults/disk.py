"""Disk full: a real ENOSPC from the kernel, not a simulated one.

Three mechanisms, strongest first; each returns a record saying which was used:

``private_tmpfs(path, size)``  called *inside a rank child* right after fork: the
    child moves into its own mount namespace (``unshare(CLONE_NEWNS)``), makes every
    mount private so nothing propagates back, copies what is already in ``path``
    into memory, mounts a tmpfs of ``size`` bytes over ``path`` and copies it back.
    Writes beyond ``size`` fail with ENOSPC. Only that process (and its children)
    sees the tmpfs; it vanishes with the process, so nothing can leak, but neither
    the parent nor other ranks see what it wrote (read ``/proc/PID/root/...`` while
    it lives if needed).
``mounted_tmpfs(path, size)``  context manager for the harness: a tmpfs of ``size``
    bytes mounted over ``path`` in the *current* namespace, visible to every rank and
    to the oracles after a crash; always unmounted on exit (lazily if busy).
``prefill(path, leave_bytes)``  fallocate a filler file so exactly ``leave_bytes``
    remain free on ``path``'s file system (by default only on a tmpfs: filling a
    shared disk would hurt everyone on it). ``remove_fillers`` undoes it.

Without root none of these work; the interposer's ``enospc`` action is the
fallback (``IORule("enospc", byte=X)``) and the record says ``"mechanism":
"interposer"``. :func:`can_mount_tmpfs` probes the real thing in a throwaway child.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from faults import FaultError, OutsideScratchRoot, Unsupported

CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8  # never dereference the target if it is a symbolic link
FILLER_PREFIX = ".chaos-filler-"

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                ctypes.c_ulong, ctypes.c_char_p]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        _libc.unshare.argtypes = [ctypes.c_int]
    return _libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0,
          data: str | None = None) -> None:
    """mount(2) through libc."""
    _check(_lib().mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def umount(target: str, detach: bool = False) -> None:
    """umount2(2) that never follows a link at ``target``; ``detach`` makes it lazy (MNT_DETACH)."""
    _check(_lib().umount2(_b(target), UMOUNT_NOFOLLOW | (MNT_DETACH if detach else 0)), f"umount {target}")


def threads() -> int:
    """Threads of this process: namespaces change per thread, so helpers insist on one."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def unshare_mounts() -> None:
    """Enter a new mount namespace whose mounts never propagate to the parent's."""
    if threads() > 1:
        raise FaultError(f"unshare(CLONE_NEWNS) in a process with {threads()} threads moves "
                         "only the calling thread; call it right after fork")
    _check(_lib().unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # mount --make-rprivate /


def mountinfo(pid: int | str = "self") -> list[dict[str, str]]:
    """Mounts of a process from /proc/PID/mountinfo: mount point, fs type, source, and options (the
    per-mount ones then the file system's own, comma-separated, duplicates dropped)."""
    out = []
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            a, b = pre.split(), post.split()
            opts = a[5].split(",") + (b[2].split(",") if len(b) > 2 else [])
            out.append({"mount_point": a[4].replace("\\040", " "), "dev": a[2],
                        "fstype": b[0], "source": b[1] if len(b) > 1 else "",
                        "options": ",".join(dict.fromkeys(o for o in opts if o))})
    return out


def mounts_under(prefix: str | os.PathLike[str], pid: int | str = "self", *, resolve: bool = True) -> list[str]:
    """Mount points at or below ``prefix`` (a leak check for the hygiene oracle).

    ``resolve=False``: ``prefix`` is taken as the canonical path it already is (the sweep
    walked it without following links); resolving it again would follow a link swapped
    in meanwhile."""
    p = (os.path.realpath(os.fspath(prefix)) if resolve else os.fspath(prefix)).rstrip("/")
    return [m["mount_point"] for m in mountinfo(pid)
            if m["mount_point"] == p or m["mount_point"].startswith(p + "/")]


def mount_of(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """The mountinfo entry of the mount holding ``path`` (the longest matching mount point, the
    last one mounted there); None where /proc/self/mountinfo names none."""
    p = os.path.realpath(os.fspath(path))
    best: dict[str, str] | None = None
    for m in mountinfo():
        mp = m["mount_point"]
        if (p == mp or p.startswith(mp.rstrip("/") + "/")) and (best is None or len(mp) >= len(best["mount_point"])):
            best = m
    return best


def fs_type(path: str | os.PathLike[str]) -> str:
    """File-system type of the mount holding ``path`` (longest matching mount point)."""
    m = mount_of(path)
    return m["fstype"] if m is not None else "?"


# Kept in memory only: a node crash, a reboot or a power loss loses all of it. zram is a
# block device in RAM (without a backing device, what is written there is gone the same way).
MEMORY_FS = frozenset({"tmpfs", "ramfs"})


def memory_backed(m: dict[str, str]) -> bool:
    """Whether a mount (``mount_of``) keeps its files only in memory."""
    return m["fstype"] in MEMORY_FS or os.path.basename(m.get("source", "")).startswith("zram")


def _under(path: str, scratch_root: str | os.PathLike[str] | None) -> str:
    p = os.path.realpath(path)
    if scratch_root is not None:
        r = os.path.realpath(os.fspath(scratch_root))
        if not (p == r or p.startswith(r.rstrip("/") + "/")):
            raise OutsideScratchRoot(f"refusing disk fault on {p}: outside scratch root {r}")
    return p


def _slurp(path: str) -> list[tuple[str, bytes | None, int]]:
    """(relpath, contents or None for a directory, mode), parents before children."""
    items: list[tuple[str, bytes | None, int]] = []
    for dirpath, dirs, files in os.walk(path):
        dirs.sort()
        for d in dirs:
            p = os.path.join(dirpath, d)
            items.append((os.path.relpath(p, path), None, os.stat(p).st_mode & 0o7777))
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as fh:
                    items.append((os.path.relpath(p, path), fh.read(), os.stat(p).st_mode & 0o7777))
    return items


def _tmpfs_opts(size_bytes: int, mode: int) -> str:
    return f"size={int(size_bytes)},mode={mode:o}"


def private_tmpfs(path: str | os.PathLike[str], size_bytes: int, *, copy_existing: bool = True,
                  scratch_root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """In this (freshly forked, single-threaded) process: private mount namespace and a
    ``size_bytes`` tmpfs over ``path`` holding a copy of its current contents."""
    if os.geteuid() != 0:
        raise Unsupported("private tmpfs needs root (CAP_SYS_ADMIN); use IORule('enospc')")
    p = _under(os.fspath(path), scratch_root)
    items = _slurp(p) if copy_existing else []
    mode = os.stat(p).st_mode & 0o7777
    unshare_mounts()
    mount("tmpfs", p, "tmpfs", 0, _tmpfs_opts(size_bytes, mode))
    copied = _restore(p, items)
    st = os.statvfs(p)
    return {"mechanism": "tmpfs-private-ns", "path": p, "size_bytes": int(size_bytes),
            "capacity_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize,
            "copied_files": copied[0], "copied_bytes": copied[1], "pid": os.getpid(),
            "visible_to": "this process and its children only"}


def _restore(p: str, items: list[tuple[str, bytes | None, int]]) -> tuple[int, int]:
    nfiles = nbytes = 0
    for rel, data, mode in items:
        q = os.path.join(p, rel)
        try:
            if data is None:
                os.mkdir(q, mode)
            else:
                with open(q, "wb") as fh:
                    fh.write(data)
                os.chmod(q, mode)
                nfiles += 1
                nbytes += len(data)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise FaultError(f"tmpfs over {p} too small for its existing contents "
                                 f"(ENOSPC copying {rel})") from e
            raise
    return nfiles, nbytes


@contextlib.contextmanager
def mounted_tmpfs(path: str | os.PathLike[str], size_bytes: int, *, copy_existing: bool = True,
                  scratch_root: str | os.PathLike[str] | None = None) -> Iterator[dict[str, Any]]:
    """A ``size_bytes`` tmpfs over ``path`` in the current mount namespace, for the
    life of the ``with`` block; unmounted on exit whatever happened (lazily if busy).
    Contents written meanwhile are lost at unmount: read them inside the block."""
    if os.geteuid() != 0:
        raise Unsupported("mounting tmpfs needs root; use IORule('enospc')")
    p = _under(os.fspath(path), scratch_root)
    items = _slurp(p) if copy_existing else []
    mount("tmpfs", p, "tmpfs", 0, _tmpfs_opts(size_bytes, os.stat(p).st_mode & 0o7777))
    try:
        copied = _restore(p, items)
        st = os.statvfs(p)
        yield {"mechanism": "tmpfs-mount", "path": p, "size_bytes": int(size_bytes),
               "capacity_bytes": st.f_blocks * st.f_frsize,
               "free_bytes": st.f_bavail * st.f_frsize, "copied_files": copied[0],
               "copied_bytes": copied[1], "visible_to": "every process"}
    finally:
        unmount_all(p)


def unmount_all(path: str | os.PathLike[str], *, resolve: bool = True) -> list[str]:
    """Unmount every mount at or below ``path`` (deepest first); lazy if busy. Idempotent.
    ``resolve``: as for :func:`mounts_under`."""
    done = []
    for mp in sorted(mounts_under(path, resolve=resolve), key=len, reverse=True):
        try:
            umount(mp)
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            umount(mp, detach=True)
        done.append(mp)
    return done


# ---------------------------------------------------------------------- fillers
@dataclass
class FillRecord:
    """A filler that leaves ``leave_bytes`` free on the file system of ``path``."""

    mechanism: str
    path: str
    filler: str
    filler_bytes: int
    free_before: int
    free_after: int
    leave_bytes: int
    fstype: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes this process may still write there (root may use the reserved blocks)."""
    st = os.statvfs(os.fspath(path))
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def prefill(path: str | os.PathLike[str], leave_bytes: int, *,
            scratch_root: str | os.PathLike[str] | None = None,
            allow_fs: tuple[str, ...] = ("tmpfs",)) -> FillRecord:
    """Allocate a filler file in ``path`` so that ``leave_bytes`` stay free.

    Only on the file-system types in ``allow_fs`` (default tmpfs: a filler on a shared
    disk would fill it for everyone). Free space is rounded to blocks, so the exact
    remainder is ``free_after`` in the record, within one block of ``leave_bytes``.
    """
    p = _under(os.fspath(path), scratch_root)
    kind = fs_type(p)
    if allow_fs and kind not in allow_fs:
        raise FaultError(f"refusing to fill {p}: file system {kind!r} not in {allow_fs}")
    before = free_bytes(p)
    size = before - leave_bytes
    if size < 0:
        raise FaultError(f"only {before} bytes free on {p}; cannot leave {leave_bytes}")
    filler = os.path.join(p, FILLER_PREFIX + secrets.token_hex(4))
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if size:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                chunk = bytes(1 << 20)
                left = size
                while left:
                    left -= os.write(fd, chunk[: min(left, len(chunk))])
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(filler)
        raise
    os.close(fd)
    after = free_bytes(p)
    return FillRecord("prefill", p, filler, size, before, after, leave_bytes, kind)


def remove_fillers(path: str | os.PathLike[str]) -> list[str]:
    """Delete every filler this module made directly in ``path``. Idempotent."""
    p = os.fspath(path)
    gone = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(p):
            if name.startswith(FILLER_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(p, name))
                gone.append(os.path.join(p, name))
    return gone


@contextlib.contextmanager
def filled(path: str | os.PathLike[str], leave_bytes: int, **kw: Any) -> Iterator[FillRecord]:
    """``prefill`` for the life of a ``with`` block; fillers removed on any exit."""
    try:
        yield prefill(path, leave_bytes, **kw)
    finally:
        remove_fillers(path)


# ---------------------------------------------------------------------- choice
def plan_disk_full(size_bytes: int, *, path_glob: str | None = None) -> dict[str, Any]:
    """Which mechanism a scenario asking for "disk full after ``size_bytes``" gets here.

    ``{"mechanism": "tmpfs-private-ns", "size_bytes": N, "reason": ...}`` where the
    real thing works (the rank child then calls :func:`private_tmpfs`), else
    ``{"mechanism": "interposer", "rule": IORule(...).to_dict(), "reason": ...}``: an
    ENOSPC raised by the interposer on every write reaching past byte ``size_bytes`` of
    a file matching ``path_glob`` (per file, unlike a real file system's shared budget).
    """
    ok, why = can_mount_tmpfs()
    if ok:
        return {"mechanism": "tmpfs-private-ns", "size_bytes": int(size_bytes), "reason": why}
    from faults.interposer import IORule

    rule = IORule("enospc", byte=int(size_bytes), path_glob=path_glob, times=None, past=True)
    return {"mechanism": "interposer", "size_bytes": int(size_bytes), "rule": rule.to_dict(),
            "reason": why}


# ---------------------------------------------------------------------- probe
def can_mount_tmpfs() -> tuple[bool, str]:
    """Try the private-namespace tmpfs in a throwaway forked child; (ok, reason)."""
    if os.geteuid() != 0:
        return False, "not root: mounting tmpfs needs CAP_SYS_ADMIN"
    import tempfile

    d = tempfile.mkdtemp(prefix="chaos-probe-")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report one line, never return into the caller's code
        code = 0
        msg = b"ok"
        try:
            os.close(r)
            _check(_lib().unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            mount("tmpfs", d, "tmpfs", 0, "size=65536")
            try:
                with open(os.path.join(d, "x"), "wb") as fh:
                    fh.write(bytes(131072))
                msg, code = b"tmpfs size limit not enforced", 3
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        except BaseException as e:  # the child must exit whatever happens
            msg, code = str(e).encode()[:500], 2
        finally:
            os.write(w, msg)
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        msg = fh.read().decode(errors="replace")
    deadline = time.monotonic() + 10
    done, status = 0, 0
    while not done and time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            time.sleep(0.01)
    if not done:
        os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
    os.rmdir(d)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return True, "root; private mount namespace with a size-limited tmpfs gives ENOSPC"
    return False, f"tmpfs probe failed: {msg}"


__all__ = [
    "MEMORY_FS", "FillRecord", "can_mount_tmpfs", "filled", "free_bytes", "fs_type", "memory_backed", "mount",
    "mount_of",
    "mounted_tmpfs", "mounts_under", "mountinfo", "plan_disk_full", "prefill", "private_tmpfs",
    "remove_fillers", "umount", "unmount_all", "unshare_mounts",
]
