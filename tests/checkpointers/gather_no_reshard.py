"""A known-bad checkpointer for sharded state: rank 0 gathers it all, the load does not reshard.

The pattern of many hand-rolled FSDP checkpoints: every rank sends its state (each
DTensor as its local shard) to rank 0, which writes one ``torch.save`` file (temp file,
fsync, rename, fsync of the directory: durable and atomic). On load every rank reads
the file, takes the entry of its own rank number (rank 0's if the saving world had no
such rank) and copies each saved shard into its template's local shard — as many
leading rows as fit, the rest left as they were. At the world size it saved with that
is exactly right, and a kill+resume there is bit-exact; after a world-size change
(2 -> 1) rank 0 gets only its old half of every parameter and moment, the other rows
keep the fresh model's values, and training goes on from a state that was never saved:
the committed_state oracle must fail it, naming the first tensor that differs.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from chaos.reference.ckptformat.dtensor import is_dtensor


def _local(state: Any) -> Any:
    if is_dtensor(state):
        return state.to_local().clone()
    if isinstance(state, dict):
        return {k: _local(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_local(v) for v in state)
    return state


def _fit(template: Any, loaded: Any) -> Any:
    """The bug: the saved shard is poured into the template's shard, no resharding."""
    if is_dtensor(template):
        from torch.distributed.tensor import DTensor

        local = template.to_local().detach().clone()
        if local.dim() == 0:
            local.copy_(loaded)
        else:
            rows = min(local.shape[0], loaded.shape[0])
            local[:rows].copy_(loaded[:rows])
        return DTensor.from_local(local, template.device_mesh, template.placements, run_check=False,
                                  shape=template.shape, stride=template.stride())
    if isinstance(template, dict) and isinstance(loaded, dict):
        return {k: _fit(template.get(k), v) for k, v in loaded.items()}
    if isinstance(template, (list, tuple)) and isinstance(loaded, (list, tuple)) and len(template) == len(loaded):
        return type(loaded)(_fit(t, v) for t, v in zip(template, loaded, strict=True))
    return loaded


class GatherNoReshard:
    def __init__(self, root: str, rank: int, world_size: int) -> None:
        self.root, self.rank, self.world_size = os.path.abspath(root), rank, world_size
        os.makedirs(self.root, exist_ok=True)

    def _path(self) -> str:
        return os.path.join(self.root, "checkpoint.pt")

    def save(self, step: int, state: dict) -> None:
        mine = _local(state)
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        if self.world_size > 1:
            dist.gather_object(mine, gathered, dst=0)
        else:
            gathered = [mine]
        if self.rank == 0:
            tmp = self._path() + ".tmp"
            with open(tmp, "wb") as f:
                torch.save({"step": step, "world_size": self.world_size, "ranks": gathered}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path())
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if self.world_size > 1:
            dist.barrier()

    def wait(self) -> None:
        return None

    def load_latest(self, template: dict) -> tuple[int, dict] | None:
        if not os.path.exists(self._path()):
            return None
        with open(self._path(), "rb") as f:
            blob = torch.load(f, weights_only=True)
        ranks = blob["ranks"]
        mine = ranks[self.rank] if self.rank < len(ranks) else ranks[0]
        return int(blob["step"]), _fit(template, mine)

    def close(self) -> None:
        return None
