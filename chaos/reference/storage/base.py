"""The storage protocol the reference checkpointer saves and loads through, and URL parsing.

Why a protocol: the two-phase commit of a checkpoint needs one *commit point* that is
atomic on the backend. On POSIX that is a directory rename (plus fsyncs); on an object
store without rename it is a small commit object created with ``If-None-Match: *``; on
a filesystem that offers neither, no commit point exists and the backend says so
instead of pretending. Each backend implements the same small set of operations and
states its protocol in ``commit_protocol`` so reports can quote it.

Who calls what (see ``chaos/reference/checkpoint/saver.py``): every rank calls
:meth:`Storage.create_shard` / :meth:`Storage.durable` for its own shard; after the
vote, rank 0 alone calls :meth:`Storage.publish`; loaders call ``list_steps``,
``read_latest``, ``read_manifest`` and ``read_shard``.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol, runtime_checkable

from chaos.reference.ckptformat.errors import CheckpointConfigError

STEP_PREFIX = re.compile(r"^\.tmp-step-(\d{1,19})-([0-9a-f]{1,64})$")


class StorageError(Exception):
    """A backend operation failed; the message names the URL or key and the problem."""


class StorageConfigError(CheckpointConfigError):
    """A storage URL is malformed or names an unsupported backend (one line, names the URL)."""


class CommitConflict(StorageError):
    """Another writer already committed this checkpoint (the conditional create lost)."""


@dataclass(frozen=True)
class StorageURL:
    """A parsed backend URL: ``file:///p``, plain paths, ``s3://bucket/prefix?k=v``, fsspec URLs."""

    scheme: str
    location: str  # file: absolute path; s3: bucket; fsspec: the URL without query
    prefix: str = ""
    params: dict[str, str] = field(default_factory=dict)
    raw: str = ""


ACCEPTED = ("accepted: a plain path (/abs/dir or ./rel/dir), file:///abs/dir, s3://bucket/prefix?endpoint_url=..., "
            "or an fsspec URL <protocol>://... (local:///abs/dir, memory://name/dir)")
# What looks like a URL scheme at the start of a string (RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# fsspec protocols whose paths are local file paths: a relative one would be resolved against the cwd.
LOCAL_FSSPEC = ("local",)


def _refuse(url: str, problem: str) -> StorageConfigError:
    return StorageConfigError(f"storage URL {url!r}: {problem}; {ACCEPTED}")


def parse_url(url: str) -> StorageURL:
    """Parse a storage URL; bad input raises :class:`StorageConfigError` naming the URL.

    Strict on purpose: every ``scheme:`` form without ``//`` (``local:/x``, ``file:rel``,
    ``s3:b/x``, ``memory:/x``) is refused rather than read as a relative path, which is
    how such a URL once became a directory under the current one. So is a string that
    merely starts like one (``a:b/c``): write ``./a:b/c`` for a relative path with a colon.
    ``file:`` URLs need an absolute path and take no query; no URL may carry a
    ``#fragment`` (percent-encode ``#`` as ``%23``); ``local://`` needs an absolute path.
    A NUL byte, control characters in a URL (``urlsplit`` would silently delete tabs and
    newlines) and surrounding whitespace are refused, never dropped.
    """
    if not isinstance(url, str) or not url.strip():
        raise StorageConfigError(f"storage URL {url!r}: empty or not a string; {ACCEPTED}")
    if url != url.strip():
        # "/x/run " is a legal directory, but far more often a stray blank; never guess which.
        raise _refuse(url, "leading or trailing whitespace (a path that really ends in a blank cannot be given)")
    if "\x00" in url:
        raise _refuse(url, "a NUL byte cannot be part of a path")
    bad = next((c for c in url if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None and "://" in url:
        # urlsplit silently deletes tabs and newlines (file:///x/a<TAB>b would become /x/ab): in a
        # URL a control character is refused, never dropped. A plain path keeps it as written.
        raise _refuse(url, f"control character {bad!r} in the URL (percent-encode it if it is really meant)")
    scheme_like = _SCHEME.match(url)
    if "://" not in url:
        if scheme_like:
            raise _refuse(url, f"'{scheme_like.group(1)}:' without '//' is not a storage URL (nor a plain path)")
        return StorageURL("file", os.path.abspath(url), raw=url)
    if not scheme_like or not url.startswith(scheme_like.group(0) + "//"):
        raise _refuse(url, "'://' is not right after a scheme")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if parts.fragment or url.endswith("#"):
        raise _refuse(url, f"a '#' fragment ({parts.fragment!r}) is not part of any storage location (write '#' in paths as %23)")
    try:
        params = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)))
    except ValueError:
        raise _refuse(url, f"malformed query string {parts.query!r}") from None
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise _refuse(url, f"file URLs need an absolute path (file:///path), got host {parts.netloc!r}")
        if not parts.path.startswith("/"):
            raise _refuse(url, "file URLs need an absolute path (file:///path)")
        if parts.query or url.endswith("?"):
            raise _refuse(url, f"file URLs take no parameters, got ?{parts.query}")
        path = urllib.parse.unquote(parts.path)
        if "\x00" in path:
            raise _refuse(url, "%00 (a NUL byte) cannot be part of a path")
        return StorageURL("file", path, raw=url)
    if scheme == "s3":
        bucket = parts.netloc
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket or ""):
            raise StorageConfigError(f"storage URL {url!r}: {bucket!r} is not a valid S3 bucket name")
        prefix = parts.path.strip("/")
        known = {"endpoint_url", "region", "part_size", "multipart_threshold", "connect_timeout", "read_timeout", "retries", "create_bucket"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise StorageConfigError(f"storage URL {url!r}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return StorageURL("s3", bucket, prefix + "/" if prefix else "", params, raw=url)
    if scheme in LOCAL_FSSPEC and (parts.netloc or not parts.path.startswith("/")):
        raise _refuse(url, f"{scheme}:// needs an absolute path ({scheme}:///abs/dir); "
                           f"{scheme}://{parts.netloc}{parts.path} would be resolved against the current directory")
    if scheme.isidentifier():
        base = f"{parts.scheme}://{parts.netloc}{parts.path}"  # urlunsplit drops "//" for unknown schemes
        return StorageURL(scheme, base, params=params, raw=url)
    raise _refuse(url, f"unsupported scheme {scheme!r}")


@runtime_checkable
class Storage(Protocol):
    """What the reference checkpointer needs from a backend (see module docstring)."""

    url: str
    kind: str
    commit_protocol: str

    def create_shard(self, tmp_name: str, name: str) -> BinaryIO: ...
    def durable(self, f: Any) -> None: ...
    def publish(self, tmp_name: str, step: int, manifest: bytes) -> None: ...
    def roll_back(self, step: int, tmp_name: str, previous: int | None) -> None: ...
    def read_latest(self) -> int | None: ...
    def clean_stale(self) -> list[str]: ...
    def list_steps(self) -> list[int]: ...
    def read_manifest(self, step: int, max_bytes: int) -> tuple[dict[str, Any], str]: ...
    def read_shard(self, step: int, name: str, spec: Any, algorithm: str, verify: bool, targets: Any = None) -> Any: ...
    def hide_step(self, step: int) -> Any: ...
    def close(self) -> None: ...


def restore_latest(store: Any, step: int, previous: int | None) -> None:
    """After undoing the commit of ``step``: point ``latest`` back at ``previous`` if it names ``step``.

    Shared by backends whose ``latest`` is a separate object (``set_latest``); a pointer
    that cannot be read is treated as not naming ``step``.
    """
    try:
        current = store.read_latest()
    except Exception:  # noqa: BLE001 - a malformed pointer is simply left for loaders to ignore
        current = None
    if current == step and previous is not None and previous != step:
        store.set_latest(previous)
