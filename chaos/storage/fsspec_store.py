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

import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from typing import Any

from chaos.ckptformat import commit, manifest
from chaos.ckptformat.errors import CorruptCheckpointError, ManifestError
from chaos.ckptformat.shard import LoadedShard, read_shard
from chaos.phases import phase
from chaos.storage.base import (
    STEP_PREFIX,
    CommitConflict,
    StorageConfigError,
    StorageError,
    StorageURL,
    restore_latest,
)

COMMIT_NAME = re.compile(r"^step-(\d{1,19})\.json$")


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


class FsspecStorage:
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
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec is a dependency
            raise StorageConfigError(f"storage URL {u.raw!r}: needs the 'fsspec' package") from None
        if u.scheme not in fsspec.available_protocols():
            raise StorageConfigError(f"storage URL {u.raw!r}: fsspec knows no protocol {u.scheme!r}")
        try:
            self.fs, path = fsspec.core.url_to_fs(u.location, **u.params)
        except (ImportError, ValueError, TypeError) as exc:
            raise StorageConfigError(f"storage URL {u.raw!r}: {type(exc).__name__}: {exc}") from None
        self.url = u.raw
        self.scheme = u.scheme
        self.base = path.rstrip("/")
        self._own_local = local_dir is None
        self.local_dir = local_dir or tempfile.mkdtemp(prefix="chaos-fsspec-")
        self._published: tuple[int, str] | None = None
        self._data: dict[int, str] = {}
        self._seen: set[int] = set()  # steps this instance listed or committed
        self.fs.makedirs(self.base, exist_ok=True)

    def url_of(self, path: str) -> str:
        return f"{self.scheme}://{path.lstrip('/')}" if self.scheme != "local" else f"local://{path}"

    def _data_dir(self, tmp_name: str) -> str:
        m = STEP_PREFIX.match(tmp_name)
        if not m:
            raise StorageError(f"{self.url}: temp name {tmp_name!r} is not .tmp-step-N-<nonce>")
        return f"{self.base}/data/step-{int(m.group(1)):010d}-{m.group(2)}"

    def commit_path(self, step: int) -> str:
        return f"{self.base}/commits/step-{step:010d}.json"

    def _cat(self, path: str) -> bytes | None:
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            return None

    # -- save ---------------------------------------------------------------------
    def create_shard(self, tmp_name: str, name: str) -> FsspecShardWriter:
        d = self._data_dir(tmp_name)
        self.fs.makedirs(d, exist_ok=True)
        return FsspecShardWriter(self, f"{d}/{name}")

    def durable(self, f: Any) -> None:
        f.finish()

    def publish(self, tmp_name: str, step: int, manifest_bytes: bytes) -> None:
        data = self._data_dir(tmp_name)
        phase("write_manifest", step=step)
        self.fs.pipe_file(f"{data}/{manifest.MANIFEST_NAME}", manifest_bytes)
        phase("commit", step=step)
        key = self.commit_path(step)
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

    def roll_back(self, step: int, tmp_name: str, previous: int | None) -> None:
        """After a failed publish: drop our commit object, restore ``latest``, remove the data."""
        try:
            if self._published and self._published[0] == step:
                self.fs.rm_file(self._published[1])
                self._published = None
                restore_latest(self, step, previous)
            self._remove(self._data_dir(tmp_name))
        except Exception:  # noqa: BLE001 - the failed save is reported by the caller; orphans go later
            pass

    def _remove(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def set_latest(self, step: int) -> None:
        self._put_whole(f"{self.base}/{commit.LATEST}", (commit.step_dirname(step) + "\n").encode())

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
                out.add(json.loads(self._cat(self.commit_path(step)) or b"")["data"])
            except (ValueError, KeyError, TypeError):
                pass
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
                self._remove(path)
                removed.append(rel)
        for d in (self.base, f"{self.base}/commits"):
            try:
                names = self.fs.ls(d, detail=False)
            except FileNotFoundError:
                continue
            for p in names:
                if os.path.basename(p.rstrip("/")).startswith(".tmp-"):
                    self._remove(p)
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

    def read_latest(self) -> int | None:
        data = self._cat(f"{self.base}/{commit.LATEST}")
        if data is None:
            return None
        m = commit.STEP_DIR.match(data[:256].decode("utf-8", "replace").strip())
        if len(data) > 256 or not m:
            raise ManifestError(self.url_of(f"{self.base}/{commit.LATEST}"), f"latest pointer {data[:60]!r} does not name a step")
        return int(m.group(1))

    def read_manifest(self, step: int, max_bytes: int) -> tuple[dict[str, Any], str]:
        key = self.commit_path(step)
        got = self._cat(key)
        if got is None:
            raise ManifestError(self.url_of(key), "missing (the save never committed)")
        rec = manifest.safe_json_loads(got, self.url_of(key))
        if not isinstance(rec, dict) or rec.get("step") != step or not isinstance(rec.get("data"), str) or ".." in rec["data"].split("/"):
            raise ManifestError(self.url_of(key), "commit object is malformed")
        data = f"{self.base}/{rec['data']}"
        path = f"{data}/{manifest.MANIFEST_NAME}"
        label = self.url_of(path)
        size = rec.get("manifest_size")
        if isinstance(size, int) and size > max_bytes:
            raise ManifestError(label, f"manifest of {size} bytes exceeds the {max_bytes}-byte limit")
        body = self._cat(path)
        if body is None:
            raise CorruptCheckpointError(label, "manifest is missing")
        if hashlib.sha256(body).hexdigest() != rec.get("manifest_sha256"):
            raise CorruptCheckpointError(label, "manifest does not match the SHA-256 in its commit object")
        self._data[step] = data
        return manifest.validate(manifest.safe_json_loads(body, label), label, step), label

    def read_shard(self, step: int, name: str, spec: Any, algorithm: str, verify: bool, targets: Any = None) -> LoadedShard:
        """Copy to a private local file, then the same verified read as POSIX."""
        if step not in self._data:
            self.read_manifest(step, 1 << 62)
        remote = f"{self._data[step]}/{name}"
        tmp_dir = os.path.join(self.local_dir, f".tmp-dl-{uuid.uuid4().hex[:12]}")
        os.makedirs(tmp_dir, exist_ok=True)
        try:
            local = os.path.join(tmp_dir, name)
            try:
                self.fs.get_file(remote, local)
            except FileNotFoundError:
                raise CorruptCheckpointError(self.url_of(remote), "shard is missing") from None
            extra = (targets,) if targets is not None else ()
            try:
                loaded = read_shard(local, spec, algorithm, verify, step, *extra)
            except CorruptCheckpointError as exc:
                raise CorruptCheckpointError(self.url_of(remote), exc.problem) from None
            loaded.path = self.url_of(remote)
            return loaded
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def hide_step(self, step: int) -> Any:
        """Delete the commit object (invisible at once); return the data removal for later."""
        key = self.commit_path(step)
        got = self._cat(key)
        data = None
        try:
            data = f"{self.base}/{json.loads(got or b'')['data']}"
        except (ValueError, KeyError, TypeError):
            pass
        if got is not None:
            self.fs.rm_file(key)
        self._data.pop(step, None)
        return lambda: self._remove(data) if data else None

    def close(self) -> None:
        if self._own_local:
            shutil.rmtree(self.local_dir, ignore_errors=True)
