"""What the S3 and the fsspec backends share: the read side of the "commit object" protocol.

Both keep a save's shards and manifest under ``data/step-N-<nonce>/`` where no loader
looks, make it visible with one small commit object ``commits/step-N.json`` naming that
data and the manifest's size and SHA-256, and point ``latest`` at the newest. So reading
a checkpoint — the ``latest`` pointer, the commit record, the manifest checked against
its SHA-256, a shard downloaded to a private temp file and verified like a POSIX one —
and hiding one (delete the commit object, remove the data later) are the same steps on
both; only the primitives below differ (a boto3 call or an fsspec call).

Every read is bounded, because what a bucket holds is whatever its writers made it: the
pointer, a commit object and a manifest are read with a byte limit (a ranged GET, never
the whole object: at most ``MAX_LATEST``, ``MAX_COMMIT`` bytes, and the manifest's size
as its commit object records it or else ``max_manifest_bytes``); a shard's size is
checked (HEAD) against the manifest and against this machine's memory before a byte is
downloaded, and the download stops at that size and is hashed as it streams, so a
damaged or oversized shard is refused before it is given any memory.

Who calls what: :class:`~chaos.reference.storage.s3.S3Storage` and
:class:`~chaos.reference.storage.fsspec_store.FsspecStorage` subclass :class:`CommitObjectStore`
and implement ``url_of``, ``_read``, ``_size``, ``_open_range``, ``_delete_commit``,
``_remove_data`` and ``_data_location``; the checkpointer's loader calls
``read_latest``, ``read_manifest`` and ``read_shard``; retention calls ``hide_step``.

Temp files: a shard is downloaded into a fresh directory under ``local_dir`` (the
checkpointer's own local root) or, when there is none, under
:func:`tempfile.gettempdir` — which inside rank processes is the scenario's scratch
root — and removed before ``read_shard`` returns, whatever happens. Nothing is created
when a backend is opened, so nothing is left to leak when it is never closed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from contextlib import AbstractContextManager
from typing import Any

from chaos.reference.ckptformat import commit, manifest
from chaos.reference.ckptformat.errors import CorruptCheckpointError, ManifestError
from chaos.reference.ckptformat.hashing import new_hasher
from chaos.reference.ckptformat.shard import CHUNK, LoadedShard, check_loadable, read_shard
from chaos.reference.storage.base import STEP_PREFIX, StorageError, restore_latest

MAX_LATEST = commit.MAX_LATEST
MAX_COMMIT = 64 * 1024  # a commit object is ~200 bytes of JSON


class CommitObjectStore:
    """Base of the backends whose commit point is a commit object (see the module docstring)."""

    url: str
    latest_key: str  # where the ``latest`` pointer lives
    shard_missing = "shard is missing"
    manifest_missing = "manifest is missing"

    def __init__(self, local_dir: str | None) -> None:
        self.local_dir = local_dir  # parent of download temp dirs; None: tempfile.gettempdir()
        self._data: dict[int, str] = {}  # step -> data location named by its commit object
        self._published: Any = None  # (step, key, ...) of the commit object this instance wrote last

    # -- primitives each backend implements -----------------------------------------
    def url_of(self, key: str) -> str:
        raise NotImplementedError

    def commit_key(self, step: int) -> str:
        raise NotImplementedError

    def _read(self, key: str, limit: int) -> bytes | None:
        """At most ``limit + 1`` of the object's first bytes, or None when it does not exist.

        One byte over the limit, so the caller can tell "too large" without reading it all.
        """
        raise NotImplementedError

    def _size(self, key: str) -> tuple[int | None, Any] | None:
        """``(size, version)`` of a shard object (a HEAD), or None when it does not exist.

        ``version`` (an ETag, or None) is handed to :meth:`_open_range` so the bytes
        downloaded are those of the object whose size was checked. Something that is not
        a plain object (a directory, a link on a local filesystem) raises
        :class:`CorruptCheckpointError`.
        """
        raise NotImplementedError

    def _open_range(self, key: str, size: int, version: Any) -> AbstractContextManager[Any]:
        """A readable (``read(n)``) of the object's first ``size`` bytes; FileNotFoundError when gone."""
        raise NotImplementedError

    def _delete_commit(self, step: int, key: str) -> None:
        """Delete a step's commit object unconditionally; one that is already gone is fine."""
        raise NotImplementedError

    def _unpublish(self, published: Any) -> None:
        """Delete the commit object this instance wrote (``self._published``), if still ours."""
        raise NotImplementedError

    def _remove_data(self, data: str) -> None:
        raise NotImplementedError

    def _data_location(self, relative: str) -> str:
        """The data location for a commit record's ``data`` field."""
        raise NotImplementedError

    def _data_for_tmp(self, step: int, nonce: str) -> str:
        """Where the shards of a save in progress (``.tmp-step-N-<nonce>``) go."""
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------
    def _tmp_data(self, tmp_name: str) -> str:
        m = STEP_PREFIX.match(tmp_name)
        if not m:
            raise StorageError(f"{self.url}: temp name {tmp_name!r} is not .tmp-step-N-<nonce>")
        return self._data_for_tmp(int(m.group(1)), m.group(2))

    def _member(self, data: str, name: str) -> str:
        return f"{data.rstrip('/')}/{name}"

    def read_latest(self) -> int | None:
        data = self._read(self.latest_key, MAX_LATEST)
        if data is None:
            return None
        m = commit.STEP_DIR.match(data[:MAX_LATEST].decode("utf-8", "replace").strip())
        if len(data) > MAX_LATEST or not m:
            raise ManifestError(self.url_of(self.latest_key), f"latest pointer {data[:60]!r} does not name a step")
        return int(m.group(1))

    def roll_back(self, step: int, tmp_name: str, previous: int | None) -> None:
        """After a failed publish: drop our commit object, restore ``latest``, remove the data."""
        try:
            if self._published and self._published[0] == step:
                self._unpublish(self._published)
                self._published = None
                restore_latest(self, step, previous)
            self._remove_data(self._tmp_data(tmp_name))
        except Exception:  # noqa: BLE001 - the failed save is reported by the caller; orphans go later
            pass

    def _commit_record(self, step: int) -> tuple[dict[str, Any], str]:
        key = self.commit_key(step)
        got = self._read(key, MAX_COMMIT)
        if got is None:
            raise ManifestError(self.url_of(key), "missing (the save never committed)")
        if len(got) > MAX_COMMIT:
            raise ManifestError(self.url_of(key), f"commit object is larger than {MAX_COMMIT} bytes")
        rec = manifest.safe_json_loads(got, self.url_of(key))
        if (not isinstance(rec, dict) or rec.get("step") != step or not isinstance(rec.get("data"), str)
                or ".." in rec["data"].split("/")):
            raise ManifestError(self.url_of(key), "commit object is malformed")
        return rec, key

    def _data_named_by(self, got: bytes | None) -> str | None:
        """The data location a raw commit object names; None when it is absent or malformed."""
        try:
            rel = manifest.safe_json_loads(got or b"", "commit")["data"]
        except (ManifestError, KeyError, TypeError):
            return None
        return self._data_location(rel) if isinstance(rel, str) and ".." not in rel.split("/") else None

    def read_manifest(self, step: int, max_bytes: int) -> tuple[dict[str, Any], str]:
        """The verified manifest of ``step``; never reads more than ``max_bytes + 1`` bytes of it.

        The bound is the manifest's size as its commit object records it (checked
        against ``max_bytes`` first) or, for a record without one, ``max_bytes`` itself.
        """
        rec, ckey = self._commit_record(step)
        data = self._data_location(rec["data"])
        key = self._member(data, manifest.MANIFEST_NAME)
        label = self.url_of(key)
        size = rec.get("manifest_size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise ManifestError(self.url_of(ckey), f"manifest_size {str(size)[:40]!r} is not a byte count")
        if size is not None and size > max_bytes:
            raise ManifestError(label, f"manifest of {size} bytes exceeds the {max_bytes}-byte limit")
        bound = max_bytes if size is None else size
        body = self._read(key, bound)
        if body is None:
            raise CorruptCheckpointError(label, self.manifest_missing)
        if len(body) > bound:
            if size is None:
                raise ManifestError(label, f"manifest exceeds the {max_bytes}-byte limit")
            raise CorruptCheckpointError(label, f"manifest is larger than the {size} bytes its commit object records")
        if hashlib.sha256(body).hexdigest() != rec.get("manifest_sha256"):
            raise CorruptCheckpointError(label, "manifest does not match the SHA-256 in its commit object")
        self._data[step] = data
        return manifest.validate(manifest.safe_json_loads(body, label), label, step), label

    def _data_of(self, step: int) -> str:
        """The data location the commit object of ``step`` names (cached by ``read_manifest``)."""
        if step not in self._data:
            rec, _ = self._commit_record(step)
            self._data[step] = self._data_location(rec["data"])
        return self._data[step]

    def read_shard(self, step: int, name: str, spec: Any, algorithm: str, verify: bool, targets: Any = None) -> LoadedShard:
        """Size checked first (HEAD), then a bounded download hashed as it streams, then the POSIX read.

        The download goes to a private temp dir (removed before returning) and stops at
        the manifest's size; with ``verify`` its checksum is compared before the shard
        is given a buffer, so a damaged object costs one chunk of memory. The local copy
        is private, so it is read without hashing it again.
        """
        key = self._member(self._data_of(step), name)
        label = self.url_of(key)
        size = spec["size"]
        check_loadable(label, size)
        found = self._size(key)
        if found is None:
            raise CorruptCheckpointError(label, self.shard_missing)
        actual, version = found
        if actual is not None and actual != size:  # None: the backend does not say (the download stays bounded)
            raise CorruptCheckpointError(label, f"size {actual} bytes, manifest says {size} (truncated or replaced)")
        if self.local_dir is not None:
            os.makedirs(self.local_dir, exist_ok=True)
        tmp_dir = tempfile.mkdtemp(prefix=".tmp-dl-", dir=self.local_dir)
        try:
            path = os.path.join(tmp_dir, os.path.basename(name))
            hasher = new_hasher(algorithm) if verify else None
            got, more = 0, b""
            try:
                with open(path, "xb") as out, self._open_range(key, size, version) as src:
                    while got < size:
                        chunk = src.read(min(CHUNK, size - got))
                        if not chunk:
                            break
                        out.write(chunk)
                        if hasher is not None:
                            hasher.update(chunk)
                        got += len(chunk)
                    if got == size:
                        more = src.read(1)
            except FileNotFoundError:
                raise CorruptCheckpointError(label, self.shard_missing) from None
            if got != size or more:
                raise CorruptCheckpointError(label, f"downloaded {'more than ' if more else ''}{got} of {size} bytes "
                                                    "(the object changed while downloading)")
            if hasher is not None:
                checksum = f"{algorithm}:{hasher.hexdigest()}"
                if checksum != spec["checksum"]:
                    raise CorruptCheckpointError(label, f"checksum mismatch: manifest {spec['checksum']}, file {checksum}")
            extra = (targets,) if targets is not None else ()
            try:
                loaded = read_shard(path, spec, algorithm, False, step, *extra)
            except (CorruptCheckpointError, ManifestError) as exc:
                raise type(exc)(label, exc.problem) from None
            loaded.path = label
            return loaded
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def hide_step(self, step: int) -> Any:
        """Delete the commit object (invisible at once); return the data removal to run later."""
        key = self.commit_key(step)
        try:
            got = self._read(key, MAX_COMMIT)
        except ManifestError:  # not a plain file (local://): names no data, like a malformed one
            got = None
        data = self._data_named_by(got)
        self._delete_commit(step, key)  # a missing one is no error: the step is hidden either way
        self._data.pop(step, None)
        return lambda: self._remove_data(data) if data else None

    def close(self) -> None:
        """Nothing to release: no local directory is kept between calls."""
