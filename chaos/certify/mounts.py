"""Real mounts to certify, made here: s3fs-fuse and rclone mount over the embedded S3, a tmpfs, loop images.

Why: certify's answers about FUSE clients and memory-backed mounts are only worth what
they were measured on. The storage suite (``suites/test_storage.py``) and the findings
table mount these exactly as a user would (Debian's ``s3fs`` with a password file and a
path-style endpoint; ``rclone mount --daemon`` with an ``s3`` remote configured by
environment variables and its VFS write cache on, as rclone's docs advise for programs
that write files; ``mount -t tmpfs``) and certify the mount point with nothing else on
the command line. Each context manager unmounts even on error, kills a daemon that a
crash test left behind, and says why it cannot run (not root, no ``/dev/fuse``, a tool
missing) with :class:`faults.errors.Unsupported`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

from faults.disk import mount_of
from faults.errors import FaultError, Unsupported
from faults.fusemount import find_daemon, is_fuse, kill


def fuse_ready(*tools: str) -> str | None:
    """Why FUSE mounts cannot be made here (None when they can): root, ``/dev/fuse`` and ``tools``."""
    if os.geteuid() != 0:
        return "needs root (mount)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    missing = [t for t in tools if shutil.which(t) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


@contextlib.contextmanager
def s3fs_mount(endpoint: str, bucket: str, workdir: str, timeout_s: float = 20.0) -> Iterator[str]:
    """Mount ``bucket`` of the S3 endpoint with s3fs-fuse at ``workdir/mnt``; yields the mount point.

    The password file (dummy keys: moto takes any) lives in ``workdir``, mode 0600 as s3fs
    demands. On exit the mount is taken off lazily and whatever daemon serves it then (the
    one started here, or one a client-crash test remounted) is killed.
    """
    why = fuse_ready("s3fs")
    if why:
        raise Unsupported(f"s3fs mount: {why}")
    mnt = os.path.join(workdir, "mnt")
    os.makedirs(mnt, exist_ok=True)
    passwd = os.path.join(workdir, "s3fs.passwd")
    fd = os.open(passwd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("chaos:chaos-secret\n")
    cmd = ["s3fs", bucket, mnt, "-o", f"url={endpoint},use_path_request_style,passwd_file={passwd}"]
    with _daemon_mount(cmd, mnt, f"s3fs mount of {bucket}", timeout_s) as mounted:
        yield mounted


@contextlib.contextmanager
def rclone_mount(endpoint: str, bucket: str, workdir: str, cache_mode: str = "writes",
                 timeout_s: float = 20.0) -> Iterator[str]:
    """Mount ``bucket`` of the S3 endpoint with ``rclone mount`` at ``workdir/rclone``; yields the mount point.

    The remote is defined by ``RCLONE_CONFIG_CHAOS_*`` environment variables (no config
    file to leave behind; the daemon keeps them, so a client-crash remount from its own
    command line and environment finds the remote again). ``cache_mode`` is
    ``--vfs-cache-mode`` (``writes``: what rclone advises for programs that write files;
    the cache lives in ``workdir``). The daemon detaches (``--daemon``).
    """
    why = fuse_ready("rclone")
    if why:
        raise Unsupported(f"rclone mount: {why}")
    mnt, cache = os.path.join(workdir, "rclone"), os.path.join(workdir, "rclone-cache")
    os.makedirs(mnt, exist_ok=True)
    os.makedirs(cache, exist_ok=True)
    # AWS_* (a CA bundle, a profile) would reach rclone's S3 client too: the remote is ours alone.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    env.update(RCLONE_CONFIG_CHAOS_TYPE="s3", RCLONE_CONFIG_CHAOS_PROVIDER="Other",
               RCLONE_CONFIG_CHAOS_ENDPOINT=endpoint, RCLONE_CONFIG_CHAOS_ACCESS_KEY_ID="chaos",
               RCLONE_CONFIG_CHAOS_SECRET_ACCESS_KEY="chaos-secret", RCLONE_CONFIG_CHAOS_FORCE_PATH_STYLE="true",
               RCLONE_CONFIG_CHAOS_REGION="us-east-1")
    cmd = ["rclone", "mount", f"chaos:{bucket}", mnt, "--daemon", "--vfs-cache-mode", cache_mode,
           "--cache-dir", cache, "--config", "/dev/null"]
    with _daemon_mount(cmd, mnt, f"rclone mount of {bucket}", timeout_s, env) as mounted:
        yield mounted


@contextlib.contextmanager
def _daemon_mount(cmd: list[str], mnt: str, what: str, timeout_s: float,
                  env: dict[str, str] | None = None) -> Iterator[str]:
    """Run a FUSE client's mount command (it detaches its daemon), wait for the mount, unmount on exit."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if done.returncode != 0:
        raise FaultError(f"{what} at {mnt} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    try:
        _wait_mounted(mnt, timeout_s)
        yield mnt
    finally:
        unmount(mnt)


def unmount(mnt: str) -> None:
    """Take every FUSE mount at ``mnt`` off and kill the daemon serving it, if any."""
    for _ in range(4):
        m = mount_of(mnt)
        if m is None or m["mount_point"] != os.path.realpath(mnt):
            return
        if is_fuse(m["fstype"]):
            with contextlib.suppress(Unsupported):
                daemon = find_daemon(mnt)
                subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=20)
                kill(daemon)
                continue
        subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=20)


@contextlib.contextmanager
def tmpfs_mount(workdir: str, size: str = "64m") -> Iterator[str]:
    """A tmpfs at ``workdir/tmpfs``: what certify must never call durable."""
    if os.geteuid() != 0:
        raise Unsupported("tmpfs mount: needs root")
    mnt = os.path.join(workdir, "tmpfs")
    os.makedirs(mnt, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mnt], check=True, capture_output=True,
                   timeout=20)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=20)


@contextlib.contextmanager
def loop_mount(workdir: str, fstype: str = "ext4", size_mb: int = 128, options: str = "") -> Iterator[str]:
    """A fresh ``fstype`` on a sparse loop image at ``workdir/<fstype>``, mounted with ``options``."""
    if os.geteuid() != 0:
        raise Unsupported("loop mount: needs root")
    mkfs = shutil.which(f"mkfs.{fstype}")
    if mkfs is None:
        raise Unsupported(f"loop mount: mkfs.{fstype} is not installed")
    image, mnt = os.path.join(workdir, f"{fstype}.img"), os.path.join(workdir, fstype)
    os.makedirs(mnt, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(max(size_mb, 300 if fstype == "xfs" else size_mb) << 20)
    quiet = {"ext4": ["-q", "-F"], "xfs": ["-q", "-f"], "btrfs": ["-q", "-f"]}.get(fstype, [])
    subprocess.run([mkfs, *quiet, image], check=True, capture_output=True, timeout=120)
    done = subprocess.run(["mount", "-o", ",".join(x for x in ("loop", options) if x), image, mnt],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise FaultError(f"mounting {image} ({fstype}, {options or 'defaults'}) at {mnt}: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", mnt], capture_output=True, timeout=60)  # the loop device goes with it
        os.unlink(image)


def _wait_mounted(mnt: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = mount_of(mnt)
        if m is not None and m["mount_point"] == os.path.realpath(mnt) and is_fuse(m["fstype"]):
            try:
                os.listdir(mnt)
                return
            except OSError:
                pass
        time.sleep(0.02)
    raise FaultError(f"no FUSE mount answered at {mnt} within {timeout_s:.0f} s")
