"""Lightning's ``_atomic_save`` as a checkpointer: ``torch.save`` to memory, then an fsspec transaction.

``lightning.fabric.utilities.cloud_io._atomic_save`` (Lightning 2.x) saves every
checkpoint like this, and so does this class (without importing Lightning)::

    bytesbuffer = io.BytesIO()
    torch.save(checkpoint, bytesbuffer)
    fs, urlpath = fsspec.core.url_to_fs(str(filepath))
    with fs.transaction, fs.open(urlpath, "wb") as f:
        f.write(bytesbuffer.getvalue())

With fsspec's local file system, ``fs.open`` inside a transaction writes a temp file
made by ``tempfile.mkstemp()`` in the *system temp directory* (``LocalFileOpener._open``),
and the end of the transaction ``shutil.move``s it onto ``filepath``
(``LocalFileOpener.commit``): one rename when both are on one file system, a copy and
an unlink when not. Nothing is fsynced, neither the file nor a directory. So a process
kill at any instant leaves every older checkpoint and either no new file or the whole
of it; a power loss may keep the rename and lose the data it moved.

As Lightning does under DDP, only global rank 0 writes; every rank's state is gathered
to it first (the harness checks each rank's own state). ``load_latest`` loads the file
with the highest step, as ``ckpt_path="last"`` does with the newest checkpoint, with no
fallback when it does not load.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import fsspec
import torch
import torch.distributed as dist

_NAME = re.compile(r"^step=(\d+)\.ckpt$")


def _atomic_save(checkpoint: dict[str, Any], filepath: str | Path) -> None:
    """Lightning's function, line for line (its PermissionError branch aside)."""
    bytesbuffer = io.BytesIO()
    torch.save(checkpoint, bytesbuffer)
    fs, urlpath = fsspec.core.url_to_fs(str(filepath))
    with fs.transaction, fs.open(urlpath, "wb") as f:
        f.write(bytesbuffer.getvalue())


class LightningAtomicCheckpointer:
    def __init__(self, root: str, rank: int, world_size: int) -> None:
        self.root, self.rank, self.world_size = Path(root), rank, world_size
        if rank == 0:
            fs, path = fsspec.core.url_to_fs(str(self.root))
            fs.makedirs(path, exist_ok=True)

    def _path(self, step: int) -> Path:
        return self.root / f"step={step}.ckpt"

    def save(self, step: int, state: dict[str, Any]) -> None:
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        if dist.is_initialized() and self.world_size > 1:
            dist.gather_object(state, gathered, dst=0)
        else:
            gathered = [state]
        if self.rank == 0:
            _atomic_save({"step": step, "ranks": gathered}, self._path(step))
        if dist.is_initialized():
            dist.barrier()

    def wait(self) -> None:
        return None

    def load_latest(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        steps = sorted(int(m.group(1)) for p in self.root.glob("step=*.ckpt") if (m := _NAME.match(p.name)))
        if not steps:
            return None
        fs, path = fsspec.core.url_to_fs(str(self._path(steps[-1])))
        with fs.open(path, "rb") as f:
            blob = torch.load(f, map_location="cpu", weights_only=True)
        ranks = blob["ranks"]
        return int(blob["step"]), ranks[self.rank] if self.rank < len(ranks) else ranks[0]

    def close(self) -> None:
        return None
