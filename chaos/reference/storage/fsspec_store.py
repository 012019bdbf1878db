"""Any fsspec filesystem (``memory://``, ``local://``, ``gcs://``, ...): the commit protocol it can honestly support.

A generic fsspec filesystem promises neither an atomic rename nor a conditional create,
so the POSIX protocol (rename is the commit) and the S3 one (``If-None-Match: *``) are
both out of reach. What every fsspec filesystem does offer is writing one small object
with one call (``pipe``), which readers then see whole or not at all on object stores
and in-memory filesystems. So:

- shards and the manifest go under ``data/step-N-<nonce>/``; nothing there is ever read
  before a commit object names it;
- the commit point is ``commits/step-N.json``, written last (to a temp name, then
  moved into place, so it appears whole), carrying the manifest's size and SHA-256 so
  a torn or stale manifest is detected;
- ``latest`` is rewritten after the commit; loaders fall back to the listed commits.

What it does not give, and says in ``commit_protocol``: exclusion of a second writer to
the same step (the existence check before the put is not atomic: last writer wins), and
durability beyond what the filesystem's ``close()`` provides (no fsync in fsspec).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

from chaos.phases import phase
from chaos.reference.ckptformat import commit, manifest
from chaos.reference.ckptformat.errors import CorruptCheckpointError, ManifestError
from chaos.reference.ckptformat.safeio import ErrorType, open_regular, read_upto
from chaos.reference.storage.base import (
    CommitConflict,
    StorageConfigError,
    StorageError,
    StorageURL,
)
from chaos.reference.storage.objects import MAX_COMMIT, CommitObjectStore

# Always a fresh filesystem instance without a listing cache: a checkpoint store that read
# through fsspec's instance cache would see what this process wrote, not what the
# backend holds, and a lagging backend could pass read-after-write (issue 12, hole 5).
FRESH = {"skip_instance_cache": True, "use_listings_cache": False}

COMMIT_NAME = re.compile(r"^step-(\d{1,19})\.json\Z")


class FsspecShardWriter:
    """A shard being written through ``fs.open(..., "wb")``; durable once closed and its size read back."""

    def __init__(self, store: FsspecStorage, path: str) -> None:
        self.store, self.path = store, path
        self.f = store.fs.open(path, "wb")
        self.size = 0
        self.done = False

    def write(self, data: Any) -> int:
        n = self.f.write(data)
        self.size += len(memoryview(data).cast("B"))
        return n if n is not None else self.size

    def flush(self) -> None:
        self.f.flush()

    def tell(self) -> int:
        return self.size

    def finish(self) -> None:
        self.f.close()
        stored = self.store.fs.size(self.path)
        if stored != self.size:
            raise StorageError(f"{self.store.url_of(self.path)}: stored {stored} bytes, wrote {self.size}")
        self.done = True

    def close(self) -> None:
        if not self.done:
            try:
                self.f.close()
            except Exception:  # noqa: BLE001 - a failed shard is removed with its data prefix
                pass

    def __enter__(self) -> FsspecShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The fsspec protocols a checkpoint store may live on: local and in-memory trees, and the
# object stores and distributed file systems training checkpoints are kept in. Any other
# protocol fsspec ships (ftp, http, zip, github, the caching wrappers ...) is refused before
# anything is imported or reached (``ftp://x`` used to look up host x first): read-only
# sources, archives and wrappers cannot hold a checkpoint store. A protocol registered in
# this process (``fsspec.register_implementation``, a user's own file system) is theirs to use.
STORE_PROTOCOLS = ("memory", "local", "gs", "gcs", "az", "abfs", "abfss", "hdfs", "webhdfs")


def fsspec_class(u: StorageURL) -> Any:
    """The fsspec filesystem class for ``u``'s protocol (registered in-process too), or a one-line error."""
    try:
        import fsspec
        from fsspec.registry import known_implementations, registry
    except ImportError:  # pragma: no cover - fsspec is a dependency
        raise StorageConfigError(f"storage URL {u.raw!r}: needs the 'fsspec' package") from None
    if u.scheme not in STORE_PROTOCOLS and (u.scheme in known_implementations or u.scheme not in registry):
        kind = "fsspec knows no protocol" if u.scheme not in known_implementations else "not a checkpoint store:"
        raise StorageConfigError(f"storage URL {u.raw!r}: {kind} {u.scheme!r} (stores: file://, s3://, "
                                 f"{', '.join(p + '://' for p in STORE_PROTOCOLS)}, or a protocol registered "
                                 "in-process with fsspec.register_implementation)")
    try:
        return fsspec.get_filesystem_class(u.scheme)
    except ValueError:
        raise StorageConfigError(f"storage URL {u.raw!r}: fsspec knows no protocol {u.scheme!r}") from None
    except ImportError as exc:
        raise StorageConfigError(f"storage URL {u.raw!r}: protocol {u.scheme!r} needs a package that is missing: {exc}") from None


class FsspecStorage(CommitObjectStore):
    """A directory on an fsspec filesystem; see the module docstring for the protocol."""

    kind = "fsspec"
    exclusive_commit = False  # no conditional create in fsspec: a second writer is not refused
    commit_protocol = (
        "shards and manifest under data/step-N-<nonce>/ (size read back after close); commit point: "
        "commits/step-N.json written last (temp name, then move), naming the data and the manifest's SHA-256; "
        "latest rewritten after it. NOT provided by a generic fsspec filesystem: exclusive commit "
        "(check-then-put, last writer wins) and fsync (durability is whatever close() gives)"
    )

    def __init__(self, u: StorageURL, local_dir: str | None = None) -> None:
        """Open (and create) the directory; ``local_dir``: parent of shard download temp dirs."""
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        cls = fsspec_class(u)
        fixed = sorted(set(u.params) & set(FRESH))
        if fixed:
            raise StorageConfigError(f"storage URL {u.raw!r}: {', '.join(fixed)} cannot be set: a checkpoint store "
                                     "always opens a fresh filesystem instance without a listing cache")
        try:
            self.fs, path = fsspec.core.url_to_fs(u.location, **FRESH, **u.params)
        except (ImportError, ValueError, TypeError) as exc:
            raise StorageConfigError(f"storage URL {u.raw!r}: {type(exc).__name__}: {exc}") from None
        except OSError as exc:  # a host that does not resolve, a refused connection
            raise StorageConfigError(f"storage URL {u.raw!r}: cannot reach it: {exc}") from None
        if issubclass(cls, LocalFileSystem) and not u.location.split("://", 1)[1].startswith("/"):
            # fsspec would resolve it against the cwd (parse_url refuses local:// forms already).
            raise StorageConfigError(f"storage URL {u.raw!r}: a local filesystem URL needs an absolute path, "
                                     f"not one resolved against the current directory ({path})")
        super().__init__(local_dir)
        self.url = u.raw
        self.scheme = u.scheme
        self.base = path.rstrip("/")
        # A local filesystem is a directory tree like the POSIX backend's: read it the same
        # way, without following links below the base and only from regular files.
        self._local = issubclass(cls, LocalFileSystem) or isinstance(self.fs, LocalFileSystem)
        self.latest_key = f"{self.base}/{commit.LATEST}"
        self._seen: set[int] = set()  # steps this instance listed or committed
        self.fs.makedirs(self.base, exist_ok=True)

    def url_of(self, path: str) -> str:
        return f"{self.scheme}://{path.lstrip('/')}" if self.scheme != "local" else f"local://{path}"

    def _data_for_tmp(self, step: int, nonce: str) -> str:
        return f"{self.base}/data/step-{step:010d}-{nonce}"

    def _data_location(self, relative: str) -> str:
        return f"{self.base}/{relative}"

    def commit_key(self, step: int) -> str:
        return f"{self.base}/commits/step-{step:010d}.json"

    def _info(self, path: str, error: ErrorType) -> dict[str, Any] | None:
        """The object's ``info`` (its HEAD), or None when it does not exist; only a plain file passes."""
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        if info.get("islink"):
            raise error(self.url_of(path), "is a symbolic link; links inside a checkpoint are never followed")
        if info.get("type") != "file":
            raise error(self.url_of(path), f"is a {str(info.get('type'))[:40]}, not a regular file")
        return info

    def _read(self, path: str, limit: int) -> bytes | None:
        if self._local:
            try:
                f, _ = open_regular(path, self.base, ManifestError)
            except FileNotFoundError:
                return None
            with f:
                return read_upto(f, limit + 1)
        info = self._info(path, ManifestError)
        if info is None:
            return None
        size = info.get("size")
        end = min(size, limit + 1) if isinstance(size, int) else limit + 1
        try:
            return bytes(self.fs.cat_file(path, start=0, end=end))[: limit + 1]
        except FileNotFoundError:
            return None

    def _size(self, path: str) -> tuple[int | None, Any] | None:
        if self._local:
            try:
                f, st = open_regular(path, self.base, CorruptCheckpointError)
            except FileNotFoundError:
                return None
            f.close()
            return st.st_size, None
        info = self._info(path, CorruptCheckpointError)
        if info is None:
            return None
        size = info.get("size")
        return (size if isinstance(size, int) and not isinstance(size, bool) else None), None

    @contextlib.contextmanager
    def _open_range(self, path: str, size: int, version: Any) -> Iterator[Any]:
        """The file, opened for reading; the caller reads at most ``size + 1`` bytes of it."""
        if self._local:
            f, _ = open_regular(path, self.base, CorruptCheckpointError)
        else:
            f = self.fs.open(path, "rb")
        with f:
            yield f

    def _delete_commit(self, step: int, key: str) -> None:
        try:
            self.fs.rm_file(key)
        except FileNotFoundError:
            pass

    def _unpublish(self, published: Any) -> None:
        self.fs.rm_file(published[1])

    # -- save ---------------------------------------------------------------------
    def create_shard(self, tmp_name: str, name: str) -> FsspecShardWriter:
        d = self._tmp_data(tmp_name)
        self.fs.makedirs(d, exist_ok=True)
        return FsspecShardWriter(self, f"{d}/{name}")

    def durable(self, f: Any) -> None:
        f.finish()

    def publish(self, tmp_name: str, step: int, manifest_bytes: bytes) -> None:
        data = self._tmp_data(tmp_name)
        phase("write_manifest", step=step)
        self.fs.pipe_file(f"{data}/{manifest.MANIFEST_NAME}", manifest_bytes)
        phase("commit", step=step)
        key = self.commit_key(step)
        record = {"format": "chaos-commit", "step": step, "data": os.path.relpath(data, self.base),
                  "manifest_size": len(manifest_bytes), "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest()}
        if self.fs.exists(key) and step not in self._seen:
            # Best effort, not atomic: a re-save of a step this job listed replaces it;
            # any other existing commit means a second writer got there first.
            raise CommitConflict(f"{self.url_of(key)}: step {step} is already committed by another writer")
        self.fs.makedirs(f"{self.base}/commits", exist_ok=True)
        self._put_whole(key, json.dumps(record).encode())
        self._published = (step, key)
        self._seen.add(step)
        phase("update_latest", step=step)
        self.set_latest(step)

    def _remove_data(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def set_latest(self, step: int) -> None:
        self._put_whole(self.latest_key, (commit.step_dirname(step) + "\n").encode())

    def _put_whole(self, path: str, data: bytes) -> None:
        """Make ``path`` appear with all of ``data`` or not at all: write a temp name, then move.

        A plain ``pipe`` opens the target first, so a crash can leave it empty (seen on
        ``local://``); the move is a rename on local and in-memory filesystems and a
        single-object server-side copy on object stores.
        """
        head, name = path.rsplit("/", 1)
        tmp = f"{head}/.tmp-{name}-{uuid.uuid4().hex[:12]}"
        self.fs.pipe_file(tmp, data)
        self.fs.mv(tmp, path)

    def _referenced(self) -> set[str]:
        out = set()
        for step in self._commit_steps():
            try:
                got = self._read(self.commit_key(step), MAX_COMMIT)
            except ManifestError:  # not a plain file (local://): names no data, like a malformed one
                got = None
            data = self._data_named_by(got)
            if data is not None:
                out.add(os.path.relpath(data, self.base))
        return out

    def _data_dirs(self) -> list[tuple[str, str]]:
        try:
            entries = self.fs.ls(f"{self.base}/data", detail=False)
        except FileNotFoundError:
            return []
        return [(p, os.path.relpath("/" + p.strip("/"), "/" + self.base.strip("/"))) for p in entries]

    def unreferenced_data(self) -> list[str]:
        """Data directories no commit names: orphans of crashed or failed saves."""
        referenced = self._referenced()
        return sorted(rel for _, rel in self._data_dirs() if rel not in referenced)

    def clean_stale(self) -> list[str]:
        """Data directories no commit object names (only when no save of this job is in flight)."""
        referenced, removed = self._referenced(), []
        for path, rel in self._data_dirs():
            if rel not in referenced:
                self._remove_data(path)
                removed.append(rel)
        for d in (self.base, f"{self.base}/commits"):
            try:
                names = self.fs.ls(d, detail=False)
            except FileNotFoundError:
                continue
            for p in names:
                if os.path.basename(p.rstrip("/")).startswith(".tmp-"):
                    self._remove_data(p)
                    removed.append(os.path.basename(p.rstrip("/")))
        return removed

    # -- load ---------------------------------------------------------------------
    def _commit_steps(self) -> list[int]:
        try:
            names = [os.path.basename(p.rstrip("/")) for p in self.fs.ls(f"{self.base}/commits", detail=False)]
        except FileNotFoundError:
            return []
        return [int(m.group(1)) for n in names if (m := COMMIT_NAME.match(n))]

    def list_steps(self) -> list[int]:
        steps = sorted(self._commit_steps(), reverse=True)
        self._seen.update(steps)
        return steps
