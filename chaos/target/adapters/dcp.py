"""PyTorch Distributed Checkpoint (DCP), used the way its tutorials and torchtitan use it.

One directory per step; ``dcp.save`` writes every rank's shards straight into it and
``.metadata`` last (temp + rename, no directory fsync) — that file is DCP's commit
marker, so "latest" is the newest directory that has one. DCP deduplicates tensors it
believes replicated (same key on every rank), which would hand rank 0's RNG state to
every rank; per-rank entries are therefore stored under rank-qualified keys, as careful
users do (``per_rank_keys``).

Sharded workloads (``--workload parallel=fsdp|hsdp|tp``) hand over what torch's
``get_state_dict(model, optimizer)`` gives — DTensor parameters and AdamW moments, the
optimizer keyed by parameter name — and load back through ``set_state_dict``. That is
torchtitan's arrangement (its ``ModelWrapper`` / ``OptimizersContainer`` are Stateful
wrappers around ``get_model_state_dict`` / ``get_optimizer_state_dict``, which ``dcp.save``
calls, and ``dcp.load`` fills their state dicts in place before their
``set_*_state_dict``): here the harness plays the wrappers' part. ``dcp.save`` writes each
rank's local shards with their global offsets; ``dcp.load`` into the template — DTensors
placed for the *loading* world — reads and reshards what each rank needs, so a resume
at another world size needs nothing extra from the adapter. (torchtitan also flattens
the optimizer state, ``flatten_optimizer_state_dict=True``, to merge several optimizers
and pipeline stages; with one optimizer the nested form loads the same.)
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from chaos.target.adapters.common import agree, committed_steps, step_dir

MARKER = ".metadata"


class DCPCheckpointer:
    def __init__(self, root: str, rank: int, world_size: int, per_rank_keys: str | list[str] = "rng") -> None:
        self.root, self.rank, self.world_size = root, rank, world_size
        keys = per_rank_keys.split("+") if isinstance(per_rank_keys, str) else list(per_rank_keys)
        self.per_rank_keys = [k for k in keys if k]

    def _to_dcp(self, state: dict[str, Any]) -> dict[str, Any]:
        out = dict(state)
        for key in self.per_rank_keys:
            if key in out:
                out[f"{key}@rank{self.rank}"] = out.pop(key)
        return out

    def _from_dcp(self, state: dict[str, Any]) -> dict[str, Any]:
        out = dict(state)
        for key in self.per_rank_keys:
            qualified = f"{key}@rank{self.rank}"
            if qualified in out:
                out[key] = out.pop(qualified)
        return out

    def save(self, step: int, state: dict[str, Any]) -> None:
        dcp.save(self._to_dcp(state), checkpoint_id=str(step_dir(self.root, step)))

    def wait(self) -> None:
        return None

    def load_latest(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        steps = committed_steps(self.root, MARKER)
        step = agree(steps[0] if steps else None)
        if step is None:
            return None
        state = self._to_dcp(template)
        dcp.load(state, checkpoint_id=str(step_dir(self.root, step)))
        return int(step), self._from_dcp(state)

    def close(self) -> None:
        return None


class AsyncDCPCheckpointer(DCPCheckpointer):
    """``dcp.async_save`` on its own gloo group (so it never races training collectives).

    At most one save in flight: the next ``save`` first waits for the previous one.
    """

    def __init__(self, root: str, rank: int, world_size: int, per_rank_keys: str | list[str] = "rng") -> None:
        super().__init__(root, rank, world_size, per_rank_keys)
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._future: Future | None = None

    def save(self, step: int, state: dict[str, Any]) -> None:
        self.wait()
        result = dcp.async_save(self._to_dcp(state), checkpoint_id=str(step_dir(self.root, step)),
                                process_group=self._group)
        self._future = getattr(result, "upload_completion", result)

    def wait(self) -> None:
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def close(self) -> None:
        self.wait()
