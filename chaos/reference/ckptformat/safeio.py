"""Opening the files of a checkpoint tree that someone else may have written.

A checkpoint directory is input, not a place this process controls: between two runs
anyone with write access to it can swap a step directory, a shard or the ``latest``
pointer for a symbolic link (to another user's file, or to a copy of an older step),
a FIFO (an ``open`` for reading then blocks until some writer shows up: forever), a
directory, or a sparse file that claims gigabytes. So every file the loader reads
below the root is opened here, one component at a time with ``O_NOFOLLOW`` and
relative to the descriptor of the directory above it (``dir_fd``), with
``O_NONBLOCK`` so a FIFO cannot block the open, and its kind is checked on the open
descriptor (``fstat``) before a single byte is read. The root itself is what the user
named, so a link there is followed as they asked; nothing below it ever is.

Who calls what: :func:`chaos.reference.ckptformat.commit.read_latest` opens ``latest``,
:func:`chaos.reference.ckptformat.manifest.read_manifest` the manifest,
:func:`chaos.reference.ckptformat.shard.read_shard` and ``chaos.reference.checkpoint.reshard`` the shards,
``chaos.reference.storage.fsspec_store`` everything it reads on a ``local://`` filesystem. Each
passes the error type that fits what it reads (:class:`ManifestError` for the pointer
and the manifest, :class:`CorruptCheckpointError` for shards), so a refusal is one
typed error naming the path and the problem. A missing file stays a
:class:`FileNotFoundError`, because each caller words "missing" its own way.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import BinaryIO

from chaos.reference.ckptformat.errors import CorruptCheckpointError, ManifestError

ErrorType = type[ManifestError] | type[CorruptCheckpointError]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
FILE_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC
DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words for an error message."""
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return words
    return f"a file of unknown kind (mode {mode:o})"


def _refusal(exc: OSError, name: str, dir_fd: int, where: str, error: ErrorType, want_dir: bool) -> Exception:
    """The error for a failed ``open`` of ``name`` (shown as ``where``) under ``dir_fd``."""
    if exc.errno == errno.ENOENT:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", where)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except OSError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=dir_fd)
            except OSError:
                target = "?"
            return error(where, f"is a symbolic link (to {target[:120]!r}); links inside a checkpoint are never "
                                "followed, so none can lead out of the checkpoint root")
        if st is not None and want_dir:
            return error(where, f"is {kind_of(st.st_mode)}, not a directory")
    return error(where, f"cannot be opened: {exc.strerror or exc}")


def open_regular(path: str, root: str, error: ErrorType) -> tuple[BinaryIO, os.stat_result]:
    """Open ``path`` for reading, refusing links below ``root`` and anything but a regular file.

    ``path`` must lie below ``root`` (``root/a/b/file``). Returns an unbuffered binary
    file (the caller closes it) and the ``fstat`` of the open descriptor, so sizes are
    checked on the very file that is read. Raises ``error(path_of_the_culprit,
    problem)`` for a symbolic link, a non-directory in the middle, a FIFO, socket,
    device or directory at the end, or an open that fails for another reason, and
    :class:`FileNotFoundError` when a component does not exist.
    """
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if rel in (".", "") or os.path.isabs(rel) or ".." in parts:
        raise ValueError(f"{path!r} does not lie below {root!r}")
    dfd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    where = root
    try:
        for part in parts[:-1]:
            where = os.path.join(where, part)
            try:
                nfd = os.open(part, DIR_FLAGS, dir_fd=dfd)
            except OSError as exc:
                raise _refusal(exc, part, dfd, where, error, want_dir=True) from None
            os.close(dfd)
            dfd = nfd
        where = os.path.join(where, parts[-1])
        try:
            fd = os.open(parts[-1], FILE_FLAGS, dir_fd=dfd)
        except OSError as exc:
            raise _refusal(exc, parts[-1], dfd, where, error, want_dir=False) from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(where, f"is {kind_of(st.st_mode)}, not a regular file")
        # O_NONBLOCK only kept the open from blocking on a FIFO; reads of a regular file
        # should block as usual (some network and FUSE file systems honour the flag).
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if flags & os.O_NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb", buffering=0), st
    except BaseException:
        os.close(fd)
        raise


def read_upto(f: BinaryIO, limit: int) -> bytes:
    """At most ``limit`` bytes from ``f`` (fewer only at end of file), in bounded reads.

    Callers ask for one byte more than they accept, so a file that is longer than it
    claimed shows up without ever being read whole.
    """
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = f.read(min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
