"""Paths a harness running as root may act on without another user leading it elsewhere.

The scratch sweep (``chaos.scratch``) removes directories, unmounts file systems and
reads claim files on shared machines, often as root. A path string is only safe to act
on when nobody but this user (and root) can change what it names between the check and
the act. So a path is *trusted* when, walked from ``/`` one component at a time with
``O_NOFOLLOW`` (a symbolic link anywhere is refused, never followed):

- every component is a directory owned by root or by this user, and
- every component but the last is writable by nobody else, or is sticky like ``/tmp``
  (where only an entry's owner may rename or delete it, and the next component must
  itself be owned by root or this user, which the first rule already demands).

Examples (as root): ``/tmp/pytest-of-root/x/chaos-ab12`` is trusted; ``/tmp/alice/chaos-ab12``
is not when ``/tmp/alice`` belongs to alice (she could swap ``chaos-ab12`` for a link to
``/etc``); ``/tmp/lnk/chaos-t`` with ``lnk -> /elsewhere`` is refused at ``lnk``.

Who calls what: ``chaos.scratch`` walks its claims directory and every claimed root with
:func:`open_dir` and removes a root with :func:`remove_tree` under the parent's descriptor;
``chaos.launch.drivers.engine`` checks its private engine's root with :func:`private_dir`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Untrusted(Exception):
    """A path another user could redirect; the message is one line naming the path and why."""


def _owner_ok(st: os.stat_result, uid: int) -> bool:
    return st.st_uid in (0, uid)


def _why_open_failed(path: str, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        kind = "a symbolic link" if os.path.islink(path) else "not a directory"
        return f"{path} is {kind}"
    return f"{path}: {exc.strerror or exc}"


def open_dir(path: str, *, uid: int | None = None, own_last: bool = True, private: bool = False) -> int:
    """A descriptor of directory ``path``, walked from ``/`` without following any link.

    Raises :class:`Untrusted` unless every component is owned by root or ``uid`` (default:
    this process's effective uid) and every component before the last is writable by no
    one else or is sticky. ``own_last``: the last is owned by ``uid`` itself (a root the
    harness made), else it follows the rule of the others (a parent such as ``/tmp``);
    ``private``: the last is also writable by no one else (a claims directory).
    ``FileNotFoundError`` when a component is missing. The caller closes the descriptor.
    """
    uid = os.geteuid() if uid is None else uid
    if not os.path.isabs(path) or os.path.normpath(path) != path or path.startswith("//"):
        raise Untrusted(f"{path!r} is not a normalised absolute path")
    parts = [p for p in path.split("/") if p]
    fd = os.open("/", _DIR_FLAGS)
    walked = ""
    try:
        for i, part in enumerate(parts):
            st = os.fstat(fd)
            if not _owner_ok(st, uid):
                raise Untrusted(f"{walked or '/'} belongs to uid {st.st_uid}, not to root or uid {uid}")
            if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                raise Untrusted(f"{walked or '/'} is writable by other users and not sticky")
            walked = f"{walked}/{part}"
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise FileNotFoundError(errno.ENOENT, "no such directory", walked) from None
            except OSError as exc:
                raise Untrusted(_why_open_failed(walked, exc)) from None
            os.close(fd)
            fd = nfd
            if i == len(parts) - 1:
                last = os.fstat(fd)
                if not _owner_ok(last, uid) or (own_last and last.st_uid != uid):
                    raise Untrusted(f"{walked} belongs to uid {last.st_uid}, not to uid {uid}")
                if not own_last and last.st_mode & 0o022 and not last.st_mode & stat.S_ISVTX:
                    raise Untrusted(f"{walked} is writable by other users and not sticky")
                if private and last.st_mode & 0o022:
                    raise Untrusted(f"{walked} is writable by group or others (mode {stat.S_IMODE(last.st_mode):o})")
        return fd
    except BaseException:
        os.close(fd)
        raise


def private_dir(path: str, *, create: bool = True) -> None:
    """Make ``path`` (mode 0700) if missing, then check it is trusted and private.

    Raises :class:`Untrusted` (one line) when it exists as something another user made
    or could change: a link, a directory of another owner, group/world writable.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    os.close(open_dir(path, private=True))


def child_identity(parent_fd: int, name: str) -> os.stat_result | None:
    """The ``lstat`` of ``name`` in the directory ``parent_fd``; None when it is gone."""
    try:
        return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove directory ``name`` of ``parent_fd`` and all below it, never following a link.

    ``shutil.rmtree`` walks by descriptors on Linux; from Python 3.11 it also starts from
    ``parent_fd``, so no path string is resolved again. Errors are left to the caller's
    next sweep (a busy mount point, a file re-created meanwhile).
    """
    if sys.version_info >= (3, 11):
        shutil.rmtree(name, dir_fd=parent_fd, ignore_errors=True)
    else:  # pragma: no cover - 3.10: the parent was verified trusted just before
        shutil.rmtree(os.path.join(f"/proc/self/fd/{parent_fd}", name), ignore_errors=True)
