"""Two checkpointers that reshard FSDP state on load; one of them puts the shards back in the wrong order.

Both save like ``gather_no_reshard.py`` (rank 0 gathers every rank's local shards and
writes one durable ``torch.save`` file). ``GatheredReshard`` loads correctly at any world
size: at the one it saved with, each rank takes its own saved shard; at another, each
sharded tensor (``Shard(0)``, as FSDP2 places it) is rebuilt from the saved shards in
rank order and the rank takes its rows of it. Per-rank plain values (RNG states, data
position) come from the saved rank of the same number.

``ReversedShards`` rebuilds the tensor from the shards in *reverse* rank order (a loader
that sorts shard files newest first, or by a name that does not sort like the rank):
invisible at a fixed world size, where no tensor is rebuilt, so a kill and resume there
is bit-exact; after a resize every rank trains on rows of the wrong shard. The harness
must fail it (``tests/test_reshard_loss.py``): committed_state sees a global value that
was never saved, and loss_continuity a loss curve that is not the fault-free run's at the
new world size. ``GatheredReshard`` is the control: the same code without the defect passes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from chaos.reference.ckptformat.dtensor import is_dtensor, local_box
from chaos.target.protocol import load_checkpointer

Gather = load_checkpointer(f"{Path(__file__).with_name('gather_no_reshard.py')}:GatherNoReshard")


def _wrap(template: Any, local: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, template.device_mesh, template.placements, run_check=False,
                              shape=template.shape, stride=template.stride())


class GatheredReshard(Gather):
    """Correct: reshards ``Shard(0)`` tensors from the saved shards in rank order."""

    def _order(self, saved: list[Any]) -> list[Any]:
        return saved

    def _rebuild(self, template: Any, saved: list[Any], mine: Any) -> Any:
        if is_dtensor(template):
            if any(not isinstance(p, torch.Tensor) for p in saved):
                raise ValueError("a sharded tensor is missing from some rank's saved state")
            full = torch.cat(self._order(saved), dim=0) if template.dim() else saved[0]
            offset, shape = local_box(template)
            local = full[offset[0]:offset[0] + shape[0]] if template.dim() else full
            return _wrap(template, local.clone())
        if isinstance(template, dict) and isinstance(mine, dict):
            return {k: self._rebuild(template.get(k), [p[k] for p in saved], v) for k, v in mine.items()}
        if isinstance(template, (list, tuple)) and isinstance(mine, (list, tuple)) and len(template) == len(mine):
            return type(mine)(self._rebuild(t, [p[i] for p in saved], v)
                              for i, (t, v) in enumerate(zip(template, mine, strict=True)))
        return mine

    def load_latest(self, template: dict) -> tuple[int, dict] | None:
        if not os.path.exists(self._path()):
            return None
        with open(self._path(), "rb") as f:
            blob = torch.load(f, weights_only=True)
        ranks = blob["ranks"]
        mine = ranks[self.rank] if self.rank < len(ranks) else ranks[0]
        if int(blob["world_size"]) == self.world_size:
            return int(blob["step"]), self._rebuild_same(template, mine)
        return int(blob["step"]), self._rebuild(template, ranks, mine)

    def _rebuild_same(self, template: Any, mine: Any) -> Any:
        """The world it saved with: every rank's own shard, as it was."""
        if is_dtensor(template):
            return _wrap(template, mine)
        if isinstance(template, dict) and isinstance(mine, dict):
            return {k: self._rebuild_same(template.get(k), v) for k, v in mine.items()}
        if isinstance(template, (list, tuple)) and isinstance(mine, (list, tuple)) and len(template) == len(mine):
            return type(mine)(self._rebuild_same(t, v) for t, v in zip(template, mine, strict=True))
        return mine


class ReversedShards(GatheredReshard):
    """The planted defect: a resharded tensor is rebuilt from the saved shards in reverse rank order."""

    def _order(self, saved: list[Any]) -> list[Any]:
        return list(reversed(saved))
