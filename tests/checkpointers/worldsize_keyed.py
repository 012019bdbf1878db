"""A known-bad checkpointer for sharded state: every rank's shard file is keyed by the world size.

"Each rank writes its own local shards, under a directory per cluster shape, so shards of
different layouts never mix": ``careful.py`` (durable, correct at a fixed world size)
under ``root/shards-of-<N>/``, each DTensor stored as this rank's local tensor and
re-wrapped with the template's mesh and placements on load. Every save is correct and a
resume on the same number of ranks is bit-exact; a job resumed on fewer ranks looks in
``shards-of-1/``, finds nothing and silently starts over from step 0 — the durability
oracle must fail it (resumed older than the newest acknowledged save).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from chaos.reference.ckptformat.dtensor import is_dtensor
from chaos.target.protocol import load_checkpointer

Careful = load_checkpointer(f"{Path(__file__).with_name('careful.py')}:CarefulCheckpointer")


def _local(state: Any) -> Any:
    if is_dtensor(state):
        return state.to_local().clone()
    if isinstance(state, dict):
        return {k: _local(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_local(v) for v in state)
    return state


def _wrap(template: Any, loaded: Any) -> Any:
    """Loaded local tensors back into DTensors placed like the template's."""
    if is_dtensor(template):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(loaded, template.device_mesh, template.placements, run_check=False,
                                  shape=template.shape, stride=template.stride())
    if isinstance(template, dict) and isinstance(loaded, dict):
        return {k: _wrap(template.get(k), v) for k, v in loaded.items()}
    if isinstance(template, (list, tuple)) and isinstance(loaded, (list, tuple)) and len(template) == len(loaded):
        return type(loaded)(_wrap(t, v) for t, v in zip(template, loaded, strict=True))
    return loaded


class WorldSizeKeyedShards(Careful):
    def __init__(self, root: str, rank: int, world_size: int, keep_last: int = 1) -> None:
        super().__init__(os.path.join(root, f"shards-of-{world_size}"), rank, world_size, keep_last)

    def save(self, step: int, state: dict) -> None:
        super().save(step, _local(state))

    def load_latest(self, template: dict) -> tuple[int, dict] | None:
        found = super().load_latest(template)
        if found is None:
            return None
        return found[0], _wrap(template, found[1])
