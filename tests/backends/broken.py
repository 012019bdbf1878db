"""Deliberately broken storage wrappers: certification must refuse each, naming the property.

Each is ``Class(inner_storage)`` (the ``storage_wrapper`` checkpointer option) and breaks
exactly one guarantee the way real systems do:

- :class:`CopyThenDeleteRename` (POSIX): "rename" of the temp directory done as copy
  then delete (object-store-backed and some FUSE file systems): a crash mid-copy leaves a
  listed, incomplete checkpoint. Expected: ``commit_atomicity`` fails.
- :class:`LaggingList` (any backend): listings trail writes by seconds (eventually
  consistent listing). Expected: ``read_after_write`` fails (list-after-write).
  ``lagfs.py`` has the fsspec filesystem whose listing lags only for other clients.
- :class:`AckBeforeStored` (S3): the shard upload is acknowledged before the data is
  stored (write-back cache). Expected: ``read_after_write`` fails.
- :class:`IgnoresIfNoneMatch` (S3): the store ignores ``If-None-Match``/``If-Match``
  (last writer wins). Expected: ``concurrent_writers`` fails.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from typing import Any

from chaos.reference.ckptformat import commit
from chaos.reference.ckptformat.manifest import MANIFEST_NAME


class _Wrapper:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CopyThenDeleteRename(_Wrapper):
    def publish(self, tmp_name: str, step: int, manifest_bytes: bytes) -> None:
        root = self.inner.root
        tmp, final = os.path.join(root, tmp_name), os.path.join(root, commit.step_dirname(step))
        commit.write_durably(os.path.join(tmp, MANIFEST_NAME), manifest_bytes)
        os.mkdir(final)
        for name in sorted(os.listdir(tmp)):  # the "rename": copy every file, then delete the source
            with open(os.path.join(tmp, name), "rb") as src, open(os.path.join(final, name), "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        shutil.rmtree(tmp)
        commit.update_latest(root, step)


class RefusesPublish(_Wrapper):
    """Every commit fails: nothing is ever published (read_after_write must refuse it)."""

    def publish(self, tmp_name: str, step: int, manifest_bytes: bytes) -> None:
        raise OSError(5, "publish refused by the RefusesPublish wrapper")


class LaggingList(_Wrapper):
    LAG_S = 2.0

    def list_steps(self) -> list[int]:
        now = time.time()
        return [s for s in self.inner.list_steps() if now - self._committed_at(s) > self.LAG_S]

    def _committed_at(self, step: int) -> float:
        """When the step's commit point was written, on any of the three backend kinds."""
        inner = self.inner
        if inner.kind == "posix":
            return os.stat(inner.step_location(step)).st_mtime
        if inner.kind == "fsspec":
            info = inner.fs.info(inner.commit_key(step))
            return float(info.get("mtime") or info["created"])
        head = inner.client.head_object(Bucket=inner.bucket, Key=inner.commit_key(step))
        return head["LastModified"].timestamp()


class AckBeforeStored(_Wrapper):
    DELAY_S = 1.5

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self._pending: list[threading.Thread] = []

    def durable(self, f: Any) -> None:
        real_finish = f.finish

        def later() -> None:
            time.sleep(self.DELAY_S)
            real_finish()

        t = threading.Thread(target=later, daemon=True)
        t.start()
        self._pending.append(t)
        f.finish = lambda: None  # the writer's own completion is now the background one
        f.done = True

    def close(self) -> None:
        for t in self._pending:
            t.join()
        self.inner.close()


class _NoConditions:
    def __init__(self, client: Any) -> None:
        self._c = client

    def put_object(self, **kw: Any) -> Any:
        kw.pop("IfNoneMatch", None)
        kw.pop("IfMatch", None)
        return self._c.put_object(**kw)

    def delete_object(self, **kw: Any) -> Any:
        kw.pop("IfMatch", None)
        return self._c.delete_object(**kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


class IgnoresIfNoneMatch(_Wrapper):
    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        inner.client = _NoConditions(inner.client)
