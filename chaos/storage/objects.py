"""What the S3 and the fsspec backends share: the read side of the "commit object" protocol.

Both keep a save's shards and manifest under ``data/step-N-<nonce>/`` where no loader
looks, make it visible with one small commit object ``commits/step-N.json`` naming that
data and the manifest's size and SHA-256, and point ``latest`` at the newest. So reading
a checkpoint — the ``latest`` pointer, the commit record, the manifest checked against
its SHA-256, a shard downloaded to a private temp file and verified like a POSIX one —
and hiding one (delete the commit object, remove the data later) are the same steps on
both; only the primitives below differ (a boto3 call or an fsspec call).

Who calls what: :class:`~chaos.storage.s3.S3Storage` and
:class:`~chaos.storage.fsspec_store.FsspecStorage` subclass :class:`CommitObjectStore`
and implement ``url_of``, ``_read``, ``_download``, ``_delete_commit``, ``_remove_data``
and ``_data_location``; the checkpointer's loader calls ``read_latest``,
``read_manifest`` and ``read_shard``; retention calls ``hide_step``.

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
from typing import Any

from chaos.ckptformat import commit, manifest
from chaos.ckptformat.errors import CorruptCheckpointError, ManifestError
from chaos.ckptformat.shard import LoadedShard, read_shard
from chaos.storage.base import STEP_PREFIX, StorageError, restore_latest


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

    def _read(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        raise NotImplementedError

    def _download(self, key: str, path: str) -> None:
        """Copy the object to the local ``path``; FileNotFoundError when it does not exist."""
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
        data = self._read(self.latest_key)
        if data is None:
            return None
        m = commit.STEP_DIR.match(data[:256].decode("utf-8", "replace").strip())
        if len(data) > 256 or not m:
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
        got = self._read(key)
        if got is None:
            raise ManifestError(self.url_of(key), "missing (the save never committed)")
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
        rec, _ = self._commit_record(step)
        data = self._data_location(rec["data"])
        key = self._member(data, manifest.MANIFEST_NAME)
        label = self.url_of(key)
        size = rec.get("manifest_size")
        if isinstance(size, int) and size > max_bytes:
            raise ManifestError(label, f"manifest of {size} bytes exceeds the {max_bytes}-byte limit")
        body = self._read(key)
        if body is None:
            raise CorruptCheckpointError(label, self.manifest_missing)
        if hashlib.sha256(body).hexdigest() != rec.get("manifest_sha256"):
            raise CorruptCheckpointError(label, "manifest does not match the SHA-256 in its commit object")
        self._data[step] = data
        return manifest.validate(manifest.safe_json_loads(body, label), label, step), label

    def read_shard(self, step: int, name: str, spec: Any, algorithm: str, verify: bool, targets: Any = None) -> LoadedShard:
        """Download to a private temp dir (removed before returning), then the same verified read as POSIX."""
        if step not in self._data:
            self.read_manifest(step, 1 << 62)
        key = self._member(self._data[step], name)
        label = self.url_of(key)
        if self.local_dir is not None:
            os.makedirs(self.local_dir, exist_ok=True)
        tmp_dir = tempfile.mkdtemp(prefix=".tmp-dl-", dir=self.local_dir)
        try:
            path = os.path.join(tmp_dir, os.path.basename(name))
            try:
                self._download(key, path)
            except FileNotFoundError:
                raise CorruptCheckpointError(label, self.shard_missing) from None
            extra = (targets,) if targets is not None else ()
            try:
                loaded = read_shard(path, spec, algorithm, verify, step, *extra)
            except CorruptCheckpointError as exc:
                raise CorruptCheckpointError(label, exc.problem) from None
            loaded.path = label
            return loaded
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def hide_step(self, step: int) -> Any:
        """Delete the commit object (invisible at once); return the data removal to run later."""
        key = self.commit_key(step)
        got = self._read(key)
        data = self._data_named_by(got)
        self._delete_commit(step, key)  # a missing one is no error: the step is hidden either way
        self._data.pop(step, None)
        return lambda: self._remove_data(data) if data else None

    def close(self) -> None:
        """Nothing to release: no local directory is kept between calls."""
