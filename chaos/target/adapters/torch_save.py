"""The most common hand-rolled pattern: rank 0 gathers everything and ``torch.save``s it.

Written straight to the final path, then a ``latest`` file is rewritten in place with
the step number — no temp file, no fsync, no checksum. ``torch.save(path)`` writes in
C++; while the harness's I/O interposer is installed, ``faults.native`` hands it a traced
Python file instead, so its writes are fault points like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


class TorchSaveCheckpointer:
    def __init__(self, root: str, rank: int, world_size: int) -> None:
        self.root, self.rank, self.world_size = Path(root), rank, world_size
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, step: int) -> Path:
        return self.root / f"ckpt_{step:08d}.pt"

    def save(self, step: int, state: dict[str, Any]) -> None:
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        if dist.is_initialized() and self.world_size > 1:
            dist.gather_object(state, gathered, dst=0)
        else:
            gathered = [state]
        if self.rank == 0:
            torch.save({"step": step, "ranks": gathered}, self._path(step))
            with open(self.root / "latest", "w") as f:
                f.write(str(step))
        if dist.is_initialized():
            dist.barrier()

    def wait(self) -> None:
        return None

    def load_latest(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        latest = self.root / "latest"
        if not latest.exists():
            return None
        step = int(latest.read_text().strip())
        blob = torch.load(self._path(step), map_location="cpu", weights_only=True)
        ranks = blob["ranks"]
        return int(blob["step"]), ranks[self.rank] if self.rank < len(ranks) else ranks[0]

    def close(self) -> None:
        return None
