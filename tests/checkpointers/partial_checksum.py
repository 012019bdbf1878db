"""A known-bad checkpointer: ``careful.py`` plus a checksum that covers only each shard's head.

Every ``rank<r>.pt`` gets a sidecar ``rank<r>.head`` holding the SHA-256 of the file's
first ``head_bytes`` (64 KiB by default): the zip header and pickled structure of a
``torch.save`` file, none of the ~19 MB of tensor data after it. The loader checks the
sidecar and falls back to an older step on a mismatch, so a bit flip near the header
is detected and survived — while a flip drawn anywhere in the file (almost always deep
inside a tensor) loads silently. The at-rest corruption suite must catch it with flips
over the whole length (``region=any`` or ``at=0.5``) and pass it with header flips.

It loads with ``torch.load(weights_only=True)``, unlike ``careful.py``, so that the only
defect is the partial checksum.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from chaos.target.protocol import load_checkpointer

CarefulCheckpointer = load_checkpointer(f"{Path(__file__).with_name('careful.py')}:CarefulCheckpointer")


class PartialChecksumCheckpointer(CarefulCheckpointer):
    def __init__(self, root: str, rank: int, world_size: int, keep_last: int = 2, head_bytes: int = 65536) -> None:
        super().__init__(root, rank, world_size, keep_last=keep_last)
        self.head_bytes = int(head_bytes)

    def _head(self, data: bytes) -> str:
        return hashlib.sha256(data[: self.head_bytes]).hexdigest()  # the defect: the rest is not covered

    def save(self, step: int, state: dict) -> None:
        tmp = os.path.join(self.root, f"step-{step}.tmp")
        if self.rank == 0:
            os.makedirs(tmp, exist_ok=True)
        self._barrier()
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        for name, body in ((f"rank{self.rank}.pt", data), (f"rank{self.rank}.head", self._head(data).encode())):
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(body)
                f.flush()
                self._sync(f.fileno())
        self._barrier()
        if self.rank == 0:
            final = os.path.join(self.root, f"step-{step}")
            if os.path.isdir(final):  # a re-save after the loader rejected this step: replace it
                shutil.rmtree(final)
            self._publish(step, tmp, final)
        self._barrier()

    def _try(self, step: int) -> Any:
        d = os.path.join(self.root, f"step-{step}")
        try:
            with open(os.path.join(d, f"rank{self.rank}.pt"), "rb") as f:
                data = f.read()
            with open(os.path.join(d, f"rank{self.rank}.head"), "rb") as f:
                want = f.read().decode()
            if self._head(data) != want:
                return None  # detected
            return torch.load(io.BytesIO(data), weights_only=True)
        except Exception:  # noqa: BLE001 - unreadable
            return None

    def load_latest(self, template: dict) -> tuple[int, dict] | None:
        """Newest step whose shard every rank can load (one vote per step, same order on every rank)."""
        order = self._steps()
        named = self._latest()
        if named is not None and named in order:
            order.remove(named)
            order.insert(0, named)
        for step in order:
            state = self._try(step)
            ok = torch.tensor([0 if state is None else 1])
            if self.world_size > 1:
                dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if ok.item():
                return step, state
        return None
