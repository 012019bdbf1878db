"""A small correct checkpointer: the power-loss exploration must find nothing wrong with it.

Layout under ``root``: ``step-<N>/rank<r>.pt`` (one ``torch.save`` per rank) and
``latest`` (the text ``step-<N>``). A save is made durable in the order a power loss
cannot break:

1. rank 0 creates ``step-<N>.tmp/``; barrier;
2. every rank writes ``rank<r>.pt`` through a Python file object (so the in-rank
   interposer sees every byte) and ``fsync``s it; barrier;
3. rank 0 fsyncs ``step-<N>.tmp/`` (the rank files' names), renames it to ``step-<N>``
   and fsyncs ``root`` (the rename);
4. rank 0 writes ``latest.tmp``, fsyncs it, renames it over ``latest``, fsyncs ``root``;
5. rank 0 removes checkpoints beyond ``keep_last`` (only after 4 is durable); barrier.

``load_latest`` needs no collective: every rank reads the same ``latest`` and tries
the named step, then every other complete ``step-*`` newest first, and takes the first
its own shard of loads. With the order above ``step-<N>`` only ever exists complete,
so every rank lands on the same step.

All ``fsync`` calls go through :meth:`_sync` / :meth:`_sync_dir` so that
``no_fsync.py`` can be the very same code with those two made no-ops.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
import torch.distributed as dist


class CarefulCheckpointer:
    def __init__(self, root: str, rank: int, world_size: int, keep_last: int = 1) -> None:
        self.root, self.rank, self.world_size = os.path.abspath(root), rank, world_size
        self.keep_last = int(keep_last)
        os.makedirs(self.root, exist_ok=True)

    # -- durability primitives (no_fsync.py turns these off) ----------------------
    def _sync(self, fd: int) -> None:
        os.fsync(fd)

    def _sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._sync(fd)
        finally:
            os.close(fd)

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    # -- protocol -----------------------------------------------------------------
    def save(self, step: int, state: dict) -> None:
        tmp = os.path.join(self.root, f"step-{step}.tmp")
        final = os.path.join(self.root, f"step-{step}")
        if self.rank == 0:
            os.makedirs(tmp, exist_ok=True)
        self._barrier()
        with open(os.path.join(tmp, f"rank{self.rank}.pt"), "wb") as f:
            torch.save(state, f)
            f.flush()
            self._sync(f.fileno())
        self._barrier()
        if self.rank == 0:
            self._publish(step, tmp, final)
        self._barrier()

    def _publish(self, step: int, tmp: str, final: str) -> None:
        """Rank 0, once every rank's file is durable: steps 3-5 of the module docstring."""
        self._sync_dir(tmp)
        os.rename(tmp, final)
        self._sync_dir(self.root)
        with open(os.path.join(self.root, "latest.tmp"), "w") as f:
            f.write(f"step-{step}")
            f.flush()
            self._sync(f.fileno())
        os.replace(os.path.join(self.root, "latest.tmp"), os.path.join(self.root, "latest"))
        self._sync_dir(self.root)
        for old in self._steps()[self.keep_last:]:
            shutil.rmtree(os.path.join(self.root, f"step-{old}"), ignore_errors=True)

    def wait(self) -> None:
        pass

    def _steps(self) -> list[int]:
        """Complete step directories (no ``.tmp``), newest first."""
        out = []
        for name in os.listdir(self.root):
            if name.startswith("step-") and name[5:].isdigit():
                out.append(int(name[5:]))
        return sorted(out, reverse=True)

    def _latest(self) -> int | None:
        try:
            with open(os.path.join(self.root, "latest")) as f:
                text = f.read().strip()
        except OSError:
            return None
        return int(text[5:]) if text.startswith("step-") and text[5:].isdigit() else None

    def load_latest(self, template: dict) -> tuple[int, dict] | None:
        order = self._steps()
        named = self._latest()
        if named is not None and named in order:
            order.remove(named)
            order.insert(0, named)
        for step in order:
            path = os.path.join(self.root, f"step-{step}", f"rank{self.rank}.pt")
            try:
                with open(path, "rb") as f:
                    state: Any = torch.load(f, weights_only=False)
            except Exception:  # noqa: BLE001 - incomplete: try the next one
                continue
            return step, state
        return None

    def close(self) -> None:
        pass
