"""Block-level write log of a real file system: a loop device over a logging FUSE file.

Why: the ALICE model of :mod:`faults.crashstate` is a worst case for an abstract POSIX
file system. A real one (ext4 ``data=ordered``, xfs, btrfs) keeps more or less than that,
and its mount options change what. The CrashMonkey / xfstests ``dm-log-writes`` method
records the block writes and cache flushes *beneath* the file system and replays crash
states from them. Device-mapper is not available here, so the log is taken one level
lower: the file system lives on a loop device whose backing file sits on a small FUSE
pass-through (this module's daemon), and the loop driver turns the block layer's
requests into file operations on it:

- a write bio -> ``write(offset, data)`` on the backing file (``--direct-io=off``: the
  loop driver writes into the FUSE file, which without a writeback cache sends every
  write to the daemon before it completes, in the order the loop worker issued them);
- a ``REQ_PREFLUSH`` / flush request -> ``vfs_fsync`` of the backing file -> the daemon's
  ``fsync``. The loop queue has a volatile write cache and no FUA, so the block layer
  splits a FUA write into the write and a flush after it;
- a discard / write-zeroes -> ``fallocate(PUNCH_HOLE | ZERO_RANGE)``: logged as zeroes.

The daemon is single-threaded, so the log is one total order: everything logged before
a flush record was acknowledged to the file system before that flush was issued. That
gives dm-log-writes' epochs: after a power cut every write before the last flush
survives and any subset of the writes since may (:mod:`faults.blockstates`).

The log is an append-only binary file in the caller's scratch directory; write payloads
go there, never into memory, so a long run costs disk, not RAM. Named markers ("save
acknowledged") are put into the same ordered stream through a control file of the FUSE
mount (:meth:`LoggedFs.mark`), so a marker sits exactly between the block writes issued
before and after it.

Who calls what: :func:`logged_fs` is the context manager (``chaos.certify.blockcrash``
uses it); it starts ``python -m faults.blocklog serve`` as the daemon in its own session
(a Ctrl-C to the terminal's process group must not kill the daemon before the file
system above it is unmounted), attaches the loop device, mounts the file system, and on
exit -- also on an exception, Ctrl-C or SIGTERM -- unmounts, detaches and unmounts the
FUSE file system. Only a SIGKILL of the caller can leave them; :func:`leftovers` finds
them. Needs root, ``/dev/fuse``, ``losetup`` and the ``mkfs`` of the file-system type.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from faults import FaultError, Unsupported

IMAGE = "disk.img"          # the image's name in the backing dir and in the FUSE mount
CONTROL = ".blocklog-ctl"  # write-only control file of the FUSE mount: start / mark / stop
# One record: kind (1 byte), offset, length (8 bytes each), name length (2 bytes); then the
# payload: the written bytes for a write, the name for a mark, nothing otherwise.
HEADER = struct.Struct("<cQQH")
WRITE, ZERO, FLUSH, MARK = b"W", b"Z", b"F", b"M"
KINDS = {WRITE: "write", ZERO: "zero", FLUSH: "flush", MARK: "mark"}
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 0x01, 0x02, 0x10
MOUNT_TIMEOUT_S = 15.0


class BlockLogError(FaultError):
    """The block log could not be set up, read or torn down; the message names the file."""


@dataclass(frozen=True)
class Record:
    """One logged block-level event, in log order.

    ``kind``: ``write`` (``length`` bytes at ``offset``; the bytes are at ``pos`` in the log
    file), ``zero`` (a discard or write-zeroes of ``length`` bytes at ``offset``), ``flush``
    (an fsync / fdatasync of the backing file: the loop device's cache flush) or ``mark``
    (a caller's named marker, ``name``).
    """

    kind: str
    offset: int = 0
    length: int = 0
    pos: int = 0
    name: str = ""

    @property
    def is_write(self) -> bool:
        """A record that changes the device's contents (a write or a zeroing)."""
        return self.kind in ("write", "zero")


def append_record(fd: int, kind: bytes, offset: int = 0, length: int = 0, name: bytes = b"", data: bytes = b"") -> None:
    """Append one record to an open log (``O_APPEND``): the daemon's writer, and tests' logs."""
    if kind not in KINDS:
        raise BlockLogError(f"unknown record kind {kind!r}")
    os.write(fd, HEADER.pack(kind, offset, length, len(name)) + name + data)


def read_log(path: str | os.PathLike[str]) -> list[Record]:
    """Every record of a log file, in order; payloads stay in the file (``Record.pos``).

    A truncated last record (the daemon killed mid-append) raises :class:`BlockLogError`
    naming the file and the offset: a log cut short must not pass for a complete one.
    """
    out: list[Record] = []
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise BlockLogError(f"block log {p}: cannot open: {e.strerror}") from e
    try:
        size = os.fstat(fd).st_size
        at = 0
        while at < size:
            head = os.pread(fd, HEADER.size, at)
            if len(head) < HEADER.size:
                raise BlockLogError(f"block log {p}: truncated record header at byte {at}")
            kind, offset, length, nlen = HEADER.unpack(head)
            if kind not in KINDS:
                raise BlockLogError(f"block log {p}: unknown record kind {kind!r} at byte {at}")
            body = at + HEADER.size
            name = os.pread(fd, nlen, body).decode("utf-8", "replace") if nlen else ""
            body += nlen
            payload = length if kind == WRITE else 0
            if body + payload > size:
                raise BlockLogError(f"block log {p}: truncated record at byte {at}")
            out.append(Record(KINDS[kind], offset, length, body, name))
            at = body + payload
    finally:
        os.close(fd)
    return out


# ------------------------------------------------------------------------ the daemon

def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    lib.syncfs.argtypes = [ctypes.c_int]
    return lib


def sparse_copy(src: str, dst: str) -> int:
    """Copy ``src`` to a new file ``dst`` keeping its holes; returns the data bytes copied.

    Only the data extents (``SEEK_DATA`` / ``SEEK_HOLE``) are copied, with
    ``copy_file_range`` (a reflink where the file system can), so a 300 MB image with a
    few MB written costs a few MB. ``dst`` must not exist (``O_EXCL``, never a link).
    """
    copied = 0
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fin).st_size
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fout, size)
            at = 0
            while at < size:
                try:
                    start = os.lseek(fin, at, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:  # only a hole is left
                        break
                    raise
                end = os.lseek(fin, start, os.SEEK_HOLE)
                pos = start
                while pos < end:
                    n = os.copy_file_range(fin, fout, end - pos, pos, pos)
                    if n <= 0:
                        raise BlockLogError(f"sparse copy {src} -> {dst}: copy_file_range returned {n} at {pos}")
                    pos += n
                copied += end - start
                at = end
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return copied


def _operations(backing: str, log_path: str) -> Any:
    """The FUSE pass-through: one image file and the control file; every write logged.

    Built inside the daemon (``serve``) only, where ``mfusepy`` is imported.
    """
    import mfusepy as fuse

    libc = _libc()
    image = os.path.join(backing, IMAGE)

    class Passthrough(fuse.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self) -> None:
            self.log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            self.logging = False
            self.fds: dict[int, int] = {}

        # -- the log
        def _append(self, kind: bytes, offset: int = 0, length: int = 0, name: bytes = b"", data: bytes = b"") -> None:
            append_record(self.log_fd, kind, offset, length, name, data)

        def _control(self, text: str) -> None:
            cmd, _, arg = text.strip().partition(" ")
            if cmd == "start":  # snapshot the image as the base, then log from here on
                sparse_copy(image, arg)
                self.logging = True
            elif cmd == "mark" and arg and len(arg.encode()) < 1024:
                if self.logging:
                    self._append(MARK, name=arg.encode())
            elif cmd == "stop":
                self.logging = False
            else:
                raise fuse.FuseOSError(errno.EINVAL)

        # -- the file system
        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            if path == "/":
                st = os.stat(backing)
            elif path == "/" + IMAGE:
                st = os.stat(image)
            elif path == "/" + CONTROL:
                return {"st_mode": 0o100200, "st_nlink": 1, "st_size": 0}
            else:
                raise fuse.FuseOSError(errno.ENOENT)
            return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid",
                                                "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_blocks")} | {
                "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

        def readdir(self, path: str, fh: Any) -> list[str]:
            return [".", "..", IMAGE, CONTROL]

        def open(self, path: str, flags: int) -> int:
            if path == "/" + CONTROL:
                return 0
            if path != "/" + IMAGE:
                raise fuse.FuseOSError(errno.ENOENT)
            fd = os.open(image, (flags & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR)) | os.O_NOFOLLOW)
            self.fds[fd] = fd
            return fd

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            if fh not in self.fds:
                raise fuse.FuseOSError(errno.EBADF)
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            if path == "/" + CONTROL:
                try:
                    self._control(data.decode())
                except OSError as e:
                    raise fuse.FuseOSError(e.errno or errno.EIO) from e
                return len(data)
            if fh not in self.fds:
                raise fuse.FuseOSError(errno.EBADF)
            n = os.pwrite(fh, data, offset)
            if self.logging:
                self._append(WRITE, offset, n, data=data[:n])
            return n

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            # The backing file's own durability does not matter (the log is the record), so
            # the flush is logged, not passed on: a real fsync would only cost time.
            if self.logging:
                self._append(FLUSH, 0, 0, name=b"fdatasync" if datasync else b"fsync")
            return 0

        def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
            if fh not in self.fds:
                raise fuse.FuseOSError(errno.EBADF)
            if libc.fallocate(fh, mode, offset, size) != 0:
                raise fuse.FuseOSError(ctypes.get_errno())
            if self.logging and mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
                self._append(ZERO, offset, size)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            if self.fds.pop(fh, None) is not None:
                os.close(fh)
            return 0

        def truncate(self, path: str, length: int, fh: Any = None) -> int:
            if path == "/" + CONTROL:
                return 0
            raise fuse.FuseOSError(errno.EPERM)  # the device's size is fixed while it is attached

        def statfs(self, path: str) -> dict[str, Any]:
            st = os.statvfs(backing)
            return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                "f_files", "f_ffree", "f_favail", "f_namemax")}

        def destroy(self, path: str) -> None:
            os.close(self.log_fd)

    return Passthrough()


def serve(backing: str, mountpoint: str, log_path: str) -> None:
    """The daemon's body: mount the pass-through at ``mountpoint`` and serve until unmounted.

    Single-threaded (``nothreads``): requests are handled, and logged, one at a time in
    the order the kernel sends them. libfuse 3 where it is installed (128 KiB writes).
    """
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3" if ctypes.util.find_library("fuse3") else "fuse")
    import mfusepy as fuse

    fuse.FUSE(_operations(backing, log_path), mountpoint, foreground=True, nothreads=True,
              fsname="blocklog", default_permissions=True)


# ---------------------------------------------------------------- the context manager

def _run(cmd: list[str], what: str, timeout: float = 60.0) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise Unsupported(f"{what}: {cmd[0]} is not installed") from e
    except subprocess.TimeoutExpired as e:
        raise BlockLogError(f"{what}: {' '.join(cmd)} took over {timeout:.0f} s") from e
    if out.returncode != 0:
        raise BlockLogError(f"{what}: {' '.join(cmd)} exited {out.returncode}: {(out.stderr or out.stdout).strip()[:400]}")
    return out.stdout


def can_log() -> tuple[bool, str]:
    """Whether this machine can run :func:`logged_fs` (root, /dev/fuse, losetup, mfusepy), with the reason."""
    if os.geteuid() != 0:
        return False, "needs root (loop devices, mount)"
    if not os.path.exists("/dev/fuse"):
        return False, "no /dev/fuse"
    for tool in ("losetup", "mount", "umount"):
        if shutil.which(tool) is None:
            return False, f"no {tool}"
    if not (ctypes.util.find_library("fuse3") or ctypes.util.find_library("fuse")):
        return False, "no libfuse (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        return False, f"mfusepy does not load: {e}"
    return True, ""


def _mounted(path: str) -> bool:
    from faults.disk import mountinfo

    return any(m["mount_point"] == path for m in mountinfo())


def loop_attach(image: str, direct_io: bool = False) -> str:
    """Attach ``image`` to a free loop device (buffered unless ``direct_io``); its path."""
    dev = _run(["losetup", "--find", "--show", f"--direct-io={'on' if direct_io else 'off'}", image],
               f"attach {image} to a loop device").strip()
    if not dev.startswith("/dev/loop"):
        raise BlockLogError(f"attach {image}: losetup printed {dev!r}, not a loop device")
    return dev


def loop_detach(dev: str) -> None:
    """Detach a loop device (retried briefly: udev may still hold it just after an unmount)."""
    for attempt in range(20):
        try:
            _run(["losetup", "-d", dev], f"detach {dev}", timeout=30)
            return
        except BlockLogError:
            if attempt == 19:
                raise
            time.sleep(0.05)


def loops_of(path: str) -> list[str]:
    """Loop devices whose backing file is ``path`` or lies below it (a leak check)."""
    out = subprocess.run(["losetup", "-a", "-O", "NAME,BACK-FILE", "-n", "--raw"], capture_output=True, text=True,
                         timeout=30).stdout if shutil.which("losetup") else ""
    p = os.path.realpath(path).rstrip("/")
    found = []
    for line in out.splitlines():
        name, _, back = line.partition(" ")
        back = back.replace("\\x20", " ").removesuffix(" (deleted)")
        if back == p or back.startswith(p + "/"):
            found.append(name)
    return found


def leftovers(root: str) -> dict[str, list[str]]:
    """Mounts at or below ``root`` and loop devices backed by files below it: what a clean
    exit of :func:`logged_fs` (and of the explorer) leaves none of."""
    from faults.disk import mounts_under

    return {"mounts": mounts_under(root), "loops": loops_of(root)}


def fs_mount(dev: str, mountpoint: str, fstype: str, options: str = "") -> None:
    """``mount -t fstype [-o options] dev mountpoint``: mount(8) parses the fs-specific options."""
    cmd = ["mount", "-t", fstype] + (["-o", options] if options else []) + [dev, mountpoint]
    _run(cmd, f"mount {fstype} on {mountpoint}")


def fs_unmount(mountpoint: str) -> None:
    """Unmount ``mountpoint`` (never following a link there), lazily if still busy after retries."""
    from faults.disk import umount

    for attempt in range(40):
        try:
            umount(mountpoint)
            return
        except OSError as e:
            if e.errno == errno.EINVAL and not _mounted(mountpoint):
                return
            if e.errno != errno.EBUSY or attempt == 39:
                if e.errno == errno.EBUSY:
                    umount(mountpoint, detach=True)
                    return
                raise BlockLogError(f"unmount {mountpoint}: {e.strerror}") from e
            time.sleep(0.05)


def syncfs(path: str) -> None:
    """syncfs(2) of the file system holding ``path``: its dirty data and a cache flush."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if _libc().syncfs(fd) != 0:
            raise BlockLogError(f"syncfs {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def mkfs(fstype: str, image: str, args: tuple[str, ...] | list[str] = ()) -> None:
    """``mkfs.<fstype> [args] image`` on an image file (quiet, forced where the tool asks)."""
    tool = shutil.which(f"mkfs.{fstype}")
    if tool is None:
        raise Unsupported(f"mkfs.{fstype} is not installed")
    force = {"ext4": ["-F", "-q"], "ext3": ["-F", "-q"], "ext2": ["-F", "-q"], "xfs": ["-f", "-q"],
             "btrfs": ["-f", "-q"]}.get(fstype, [])
    _run([tool, *force, *args, image], f"mkfs.{fstype} on {image}", timeout=120)


def dig_holes(image: str) -> None:
    """Turn the image's all-zero blocks into holes (``fallocate --dig-holes``, best effort):
    mkfs.xfs writes out a zeroed log, and every crash state copies the base image."""
    if shutil.which("fallocate"):
        subprocess.run(["fallocate", "--dig-holes", image], capture_output=True, timeout=60)


def mount_options_of(path: str) -> tuple[str, list[str]] | None:
    """(fs type, mount options) of the mount holding ``path`` (:func:`faults.disk.mount_of`): the
    per-mount options and the file system's own ones, in that order; None where no mount holds it."""
    from faults.disk import mount_of

    m = mount_of(path)
    return None if m is None else (m["fstype"], m["options"].split(",") if m["options"] else [])


@dataclass
class LoggedFs:
    """A mounted file system on a logged loop device (yielded by :func:`logged_fs`).

    ``mount_point``: where the file system is mounted; ``log_path``: the block log;
    ``base_path``: the image as it was when :meth:`start` was called (what the log's
    writes apply to); ``image``: the live image in the backing directory.
    """

    fstype: str
    mount_options: str
    workdir: str
    image: str
    mount_point: str
    log_path: str
    base_path: str
    size: int
    device: str = ""
    fuse_dir: str = ""
    started: bool = False
    _marks: list[str] = field(default_factory=list)

    def _control(self, text: str) -> None:
        path = os.path.join(self.fuse_dir, CONTROL)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        except OSError as e:
            raise BlockLogError(f"block log control {path}: {text.split()[0]!r} refused: {e.strerror}") from e

    def start(self) -> None:
        """Sync the file system, snapshot the image as the base and log from here on.

        The snapshot is taken by the daemon between two requests, so no write falls between
        the base and the first logged record.
        """
        syncfs(self.mount_point)
        self._control(f"start {self.base_path}")
        self.started = True

    def mark(self, name: str) -> None:
        """A named marker in the log, ordered exactly against the block writes around it."""
        if not self.started:
            raise BlockLogError(f"block log {self.log_path}: mark {name!r} before start()")
        self._control(f"mark {name}")
        self._marks.append(name)

    def sync(self) -> None:
        """syncfs of the mounted file system: everything it holds reaches the device, then a flush."""
        syncfs(self.mount_point)

    def stop(self) -> None:
        """Stop logging (the unmount's own writes then stay out of the log)."""
        if self.started:
            self._control("stop")

    def records(self) -> list[Record]:
        return read_log(self.log_path)


class _Terminated(BaseException):
    """SIGTERM while a logged file system is mounted: unwinds so the clean-up runs."""


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Turn SIGTERM into an exception (main thread only), so ``finally`` blocks unmount; once
    they ran, the signal is raised again under the caller's own handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Terminated:
        # Cleaned up: now the caller's own SIGTERM disposition (by default: die with 143).
        signal.signal(signal.SIGTERM, old)
        signal.raise_signal(signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, old)


def _start_daemon(backing: str, fuse_dir: str, log_path: str, err_path: str) -> subprocess.Popen[bytes]:
    """Start the FUSE daemon, marked with its mount point: if the harness is SIGKILLed, the sweep of
    its scratch root (``chaos.scratch``) finds the daemon by that mark and stops it."""
    from faults.process import DAEMON_MARK

    env = dict(os.environ)
    env[DAEMON_MARK] = os.path.abspath(fuse_dir)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "faults.blocklog", "serve", backing, fuse_dir, log_path],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env, start_new_session=True)
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while not _mounted(fuse_dir):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_daemon(proc, fuse_dir)
            with open(err_path, errors="replace") as f:
                why = f.read()[-600:].strip()
            raise BlockLogError(f"block log daemon for {fuse_dir} did not mount "
                                f"(exit {proc.returncode}): {why or 'no output'}")
        time.sleep(0.02)
    return proc


def _stop_daemon(proc: subprocess.Popen[bytes], fuse_dir: str) -> None:
    if _mounted(fuse_dir):
        fs_unmount(fuse_dir)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.contextmanager
def logged_fs(scratch: str, fstype: str, size: int, mkfs_args: tuple[str, ...] | list[str] = (),
              mount_options: str = "") -> Iterator[LoggedFs]:
    """A fresh ``fstype`` of ``size`` bytes, mounted on a logged loop device, for the ``with`` body.

    Makes a private work dir under ``scratch`` (kept: the log and the base image are read
    after the body; the caller removes it), a sparse image, runs mkfs on it *before* any
    logging, starts the FUSE daemon over the backing dir, attaches a loop device to the
    image through FUSE (``--direct-io=off``) and mounts the file system with
    ``mount_options``. Logging begins at :meth:`LoggedFs.start`. On exit, whatever
    happened (an exception, Ctrl-C, SIGTERM): the file system is unmounted, the loop
    device detached, the FUSE mount unmounted and the daemon gone.
    """
    ok, why = can_log()
    if not ok:
        raise Unsupported(f"block log: {why}")
    workdir = tempfile.mkdtemp(prefix=f"blocklog-{fstype}-", dir=scratch)
    backing, fuse_dir, mnt = (os.path.join(workdir, d) for d in ("backing", "fuse", "mnt"))
    for d in (backing, fuse_dir, mnt):
        os.mkdir(d, 0o700)
    image = os.path.join(backing, IMAGE)
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    mkfs(fstype, image, mkfs_args)
    dig_holes(image)
    lf = LoggedFs(fstype, mount_options, workdir, image, mnt, os.path.join(workdir, "blocks.log"),
                  os.path.join(workdir, "base.img"), size, fuse_dir=fuse_dir)
    proc: subprocess.Popen[bytes] | None = None
    with _sigterm_unwinds():
        try:
            proc = _start_daemon(backing, fuse_dir, lf.log_path, os.path.join(workdir, "daemon.err"))
            lf.device = loop_attach(os.path.join(fuse_dir, IMAGE))
            fs_mount(lf.device, mnt, fstype, mount_options)
            yield lf
        finally:
            errors = []
            for what, step in (("unmount the file system", lambda: _mounted(mnt) and fs_unmount(mnt)),
                               ("detach the loop device", lambda: lf.device and loop_detach(lf.device)),
                               ("stop the FUSE daemon", lambda: proc is not None and _stop_daemon(proc, fuse_dir))):
                try:
                    step()
                except Exception as e:  # noqa: BLE001 - every step is tried; the first error is raised after
                    errors.append(f"{what}: {e}")
            if errors and sys.exc_info()[0] is None:
                raise BlockLogError(f"clean-up of {workdir}: " + "; ".join(errors))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 4 and args[0] == "serve":
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the unmount ends the daemon
        serve(args[1], args[2], args[3])
        return 0
    print("usage: python -m faults.blocklog serve BACKING_DIR MOUNTPOINT LOG", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
