"""A FUSE mount's storage client: find its daemon, crash it, mount it again.

Why: a checkpoint written to an s3fs, rclone, gcsfuse or JuiceFS mount passes through a
user-space daemon that keeps its own promises (s3fs renames a directory by copying each
object and deleting the old one; it uploads a file only on flush). The checkpointer's
crash points never stop that daemon half-way; a storage-client crash does. This module
is the mechanism, used by ``chaos.certify.clientcrash``:

1. :func:`find_daemon` reads the mount from ``/proc/self/mountinfo`` and finds the process
   that serves it: it holds ``/dev/fuse`` open and names the mount point on its command
   line (resolved against its own working directory). Its command line, environment and
   working directory are kept, so it can be started again exactly as it was.
2. :func:`kill` SIGKILLs it between two operations of the checkpointer; :class:`SendWatch`
   right after its k-th upstream request inside one (a rename that copies objects, an
   fsync that uploads), counted by ``strace``.
3. :func:`remount` lazily unmounts the dead mount and starts the daemon's command line again
   (or the user's ``--remount`` command), then waits until the mount is back.

Nothing here knows about checkpoints; the caller decides where to crash and judges.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from faults.disk import mount_of, mountinfo
from faults.errors import FaultError, Unsupported


@dataclass(frozen=True)
class FuseDaemon:
    """The process serving one FUSE mount, and what it takes to start it again."""

    pid: int
    argv: tuple[str, ...]
    environ: dict[str, str]
    cwd: str
    mount_point: str
    fstype: str
    dev: str  # the mount's device number, 0:N: N names its connection in /sys/fs/fuse/connections

    def describe(self) -> str:
        return f"{self.fstype} daemon pid {self.pid} ({' '.join(self.argv)[:200]}) serving {self.mount_point}"


def is_fuse(fstype: str) -> bool:
    """Whether a mountinfo file-system type is served by a FUSE daemon (``fuse``, ``fuse.s3fs``, ``fuseblk``)."""
    return fstype == "fuse" or fstype == "fuseblk" or fstype.startswith("fuse.")


def _holds_dev_fuse(pid: int) -> bool:
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for n in names:
        try:
            if os.readlink(os.path.join(fd_dir, n)) == "/dev/fuse":
                return True
        except OSError:
            continue
    return False


def _read_proc(pid: int) -> tuple[tuple[str, ...], dict[str, str], str] | None:
    """(argv, environ, cwd) of a process; None when it is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = tuple(a.decode(errors="surrogateescape") for a in f.read().split(b"\0") if a)
        with open(f"/proc/{pid}/environ", "rb") as f:
            env_items = [e.decode(errors="surrogateescape") for e in f.read().split(b"\0") if e]
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    environ = dict(e.partition("=")[::2] for e in env_items if "=" in e)
    return argv, environ, cwd


def find_daemon(path: str) -> FuseDaemon:
    """The daemon serving the FUSE mount that holds ``path``.

    Raises :class:`Unsupported` (with the reason) where ``path`` is not on a FUSE mount, or
    no single process holding ``/dev/fuse`` names the mount point on its command line.
    """
    m = mount_of(path)
    if m is None:
        raise Unsupported(f"no mount in /proc/self/mountinfo holds {path}")
    if not is_fuse(m["fstype"]):
        raise Unsupported(f"{path} is on {m['fstype']} ({m['source']} at {m['mount_point']}), not a FUSE mount")
    mp = m["mount_point"]
    found: list[FuseDaemon] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        info = _read_proc(pid)
        if info is None:
            continue
        argv, environ, cwd = info
        if not any(os.path.realpath(os.path.join(cwd, a)) == mp for a in argv[1:] if a and not a.startswith("-")):
            continue
        if _holds_dev_fuse(pid):
            found.append(FuseDaemon(pid, argv, environ, cwd, mp, m["fstype"], m["dev"]))
    if len(found) != 1:
        what = "no process" if not found else f"{len(found)} processes ({', '.join(str(d.pid) for d in found)})"
        raise Unsupported(f"{what} holding /dev/fuse name{'s' if len(found) == 1 else ''} {mp} on the command "
                          f"line: the daemon of the {m['fstype']} mount cannot be told apart")
    return found[0]


def kill(daemon: FuseDaemon, timeout_s: float = 10.0) -> None:
    """SIGKILL the daemon and wait until it is gone (its mount then answers ENOTCONN)."""
    try:
        os.kill(daemon.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while alive(daemon.pid) and time.monotonic() < deadline:
        try:  # our own child (a daemon we remounted in the foreground): reap it
            if os.waitpid(daemon.pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            pass
        time.sleep(0.005)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# "[pid N] 1796557422.971982 sendto(8, "PUT /bucket/key HTTP/1.1\r\n"..., ...)" (strace -f -ttt -s 160)
_SEND = re.compile(r'(\d+\.\d+) send(?:to|msg)\(\d+, (?:\[\{iov_base=)?"(?:(PUT|POST|DELETE|PATCH|COPY|MOVE) (\S*))?')


class SendWatch:
    """Watch a daemon's upstream traffic through ``strace``; kill it at a counted request.

    What it counts: where the daemon speaks plain HTTP to its store (s3fs and rclone over
    an ``http://`` endpoint), its *mutating requests* (PUT, POST, DELETE ...: the only
    ones that change what a fresh mount will show), read from the start of each send;
    where nothing is readable (TLS, a binary protocol), every send. The unfaulted run that
    plans the points says which (``requests`` non-empty: requests).

    Once armed (:meth:`arm`) with ``after``, it SIGKILLs the daemon as the ``after``-th
    such request (or send) since arming leaves: every request before it has had its
    answer, this one may or may not be carried out by the store (a copy or a delete, sent
    whole, will be; an upload whose body never follows will not), and the daemon never
    learns which. That is a crash *inside* one operation of the checkpointer (a rename
    that s3fs turns into a copy and a delete per object, an fsync that uploads) at a
    counted request, not at a guessed time. ``fired_at`` is the count since arming when
    it fired, ``fired_request`` the request (None if stopped first).

    Who calls it: ``chaos.certify.clientcrash``, from the process doing the I/O, at the
    first operation of a save (:meth:`start` returns once ``strace`` is attached), and
    :meth:`arm` right before the operation to crash in. The unfaulted run and every
    faulted run attach at the same moment, so their counts line up.
    """

    def __init__(self, daemon: FuseDaemon) -> None:
        self.daemon = daemon
        self.sent: list[float] = []  # every send, wall-clock seconds
        self.requests: list[tuple[float, str]] = []  # mutating HTTP requests: (when, "PUT /bucket/key")
        self.by_request = True  # count requests (False: count sends)
        self._target: int | None = None
        self._armed_at = 0
        self.fired_at: int | None = None
        self.fired_request: str | None = None
        self.fired_time: float | None = None  # wall clock at the kill: which operation it landed in
        self._proc: subprocess.Popen[str] | None = None
        self._attached = threading.Event()
        self._thread = threading.Thread(target=self._read, name="fuse-send-watch", daemon=True)

    def start(self, timeout_s: float = 10.0) -> SendWatch:
        strace = shutil.which("strace")
        if strace is None:
            raise Unsupported("strace is not installed: a storage client cannot be stopped inside an operation")
        self._proc = subprocess.Popen([strace, "-f", "-ttt", "-s", "160", "-e", "trace=sendto,sendmsg",
                                       "-p", str(self.daemon.pid)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, errors="replace")
        self._thread.start()
        if not self._attached.wait(timeout_s):
            self.stop()
            raise FaultError(f"strace did not attach to the {self.daemon.fstype} daemon (pid {self.daemon.pid}) "
                             f"in {timeout_s:.0f} s")
        return self

    def _count(self) -> int:
        return len(self.requests) if self.by_request else len(self.sent)

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            if " attached" in line:
                self._attached.set()
                continue
            m = _SEND.search(line)
            if m is None:
                continue
            stamp = float(m.group(1))
            self.sent.append(stamp)
            if m.group(2):
                self.requests.append((stamp, f"{m.group(2)} {m.group(3)}"))
            target = self._target
            if target is not None and self.fired_at is None and self._count() >= target \
                    and (m.group(2) or not self.by_request):
                try:
                    os.kill(self.daemon.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.fired_at, self.fired_time = self._count() - self._armed_at, time.time()
                self.fired_request = f"{m.group(2)} {m.group(3)}" if m.group(2) else None
        self._attached.set()  # strace ended (the daemon died): nobody waits for an attach any more

    def arm(self, after: int, by_request: bool = True) -> None:
        """Kill the daemon as the ``after``-th request (or send) from now leaves (``after`` >= 1)."""
        self.by_request = by_request
        self._armed_at = self._count()
        self._target = self._armed_at + after

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # strace detaches on SIGTERM; the daemon goes on untraced
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def remount(daemon: FuseDaemon, command: list[str] | None = None, timeout_s: float = 30.0) -> FuseDaemon:
    """Mount ``daemon.mount_point`` again after its daemon died; returns the new daemon.

    The dead mount is detached lazily (``umount -l``), then ``command`` (the user's
    ``--remount``) or the daemon's own command line runs with its environment and working
    directory, in a session of its own so it outlives the caller (a daemon that stays in
    the foreground keeps serving the mount, as the one it replaces did). Raises
    :class:`FaultError` naming the command when no FUSE mount comes back in time.
    """
    mp = daemon.mount_point
    for _ in range(3):  # a lazily detached mount can stack; take every dead one off
        m = mount_of(mp)
        if m is None or m["mount_point"] != mp or not is_fuse(m["fstype"]):
            break
        subprocess.run(["umount", "-l", mp], capture_output=True, timeout=20)
    argv = list(command or daemon.argv)
    # Its errors go to an unlinked temp file, not a pipe: a daemon that stays in the
    # foreground would block once a pipe nobody reads filled up, or die of SIGPIPE (Go's
    # rclone) once it was closed.
    errors = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen(argv, env=daemon.environ, cwd=daemon.cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)
    except OSError as exc:
        errors.close()
        raise FaultError(f"remounting {mp}: cannot run {argv[0]!r}: {exc}") from exc
    with errors:
        return _wait_remounted(daemon, proc, argv, errors, timeout_s)


def _wait_remounted(daemon: FuseDaemon, proc: subprocess.Popen[bytes], argv: list[str], errors: Any,
                    timeout_s: float) -> FuseDaemon:
    mp = daemon.mount_point
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = next((x for x in mountinfo() if x["mount_point"] == mp and is_fuse(x["fstype"])), None)
        if m is not None:
            try:
                fresh = find_daemon(mp)
            except Unsupported:
                fresh = None
            if fresh is not None and _answers(mp):
                if proc.poll() is None and proc.pid != fresh.pid:
                    proc.wait(timeout=timeout_s)
                return fresh
        if proc.poll() not in (None, 0):
            errors.seek(0)
            err = errors.read().decode(errors="replace")[-300:]
            raise FaultError(f"remounting {mp}: {' '.join(argv)[:200]} exited {proc.returncode}: {err.strip()}")
        time.sleep(0.02)
    raise FaultError(f"remounting {mp}: no FUSE mount there {timeout_s:.0f} s after {' '.join(argv)[:200]}")


def _answers(mount_point: str) -> bool:
    try:
        os.listdir(mount_point)
    except OSError:
        return False
    return True
