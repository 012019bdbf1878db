"""Coordination between ranks on a private gloo group, exchanging JSON (never pickle).

The checkpointer talks over its own gloo group, created at construction, for two
reasons: the training group may be NCCL (which cannot move the small CPU messages
used here), and async saves run their collectives from a background thread, which
must not interleave with the training loop's collectives on the main group.
With ``world_size == 1`` and no process group, every collective is local.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from chaos.reference.ckptformat.errors import CheckpointConfigError


def _default_timeout() -> timedelta:
    """The job's own collective timeout: a lost rank must fail a save as fast as it fails training."""
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        return backend.options._timeout
    except (AttributeError, RuntimeError):
        return timedelta(seconds=600)


# Private groups no live checkpointer holds, by (world size, timeout): creating and
# destroying a gloo group costs ~8 ms per checkpointer, which dominates a recovery
# loop that constructs one per crash state. A group is reused only once its previous
# owner closed, so two live checkpointers never share one.
_idle: dict[tuple[int, float, int], list[Any]] = {}


def _take_group(world_size: int, timeout: timedelta) -> Any:
    key = (world_size, timeout.total_seconds(), id(dist.distributed_c10d._get_default_group()))
    live = dist.distributed_c10d._world.pg_map
    pool = _idle.setdefault(key, [])
    while pool:
        group = pool.pop()
        if group in live:
            return key, group
    return key, dist.new_group(backend="gloo", timeout=timeout)


class Comm:
    def __init__(self, rank: int, world_size: int, timeout_s: float | None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.group: Any = None
        self.failed = False
        if dist.is_available() and dist.is_initialized():
            if dist.get_world_size() != world_size or dist.get_rank() != rank:
                raise CheckpointConfigError(
                    f"rank/world_size ({rank}/{world_size}) disagree with the process group "
                    f"({dist.get_rank()}/{dist.get_world_size()})"
                )
            timeout = timedelta(seconds=timeout_s) if timeout_s is not None else _default_timeout()
            self._key, self.group = _take_group(world_size, timeout)
        elif world_size != 1:
            raise CheckpointConfigError(
                f"world_size={world_size} needs torch.distributed to be initialised before the checkpointer"
            )

    def all_gather_json(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order (JSON-encoded bytes over gloo)."""
        try:
            return self._all_gather_json(obj)
        except BaseException:
            self.failed = True  # a group that saw a failed collective is never reused
            raise

    def _all_gather_json(self, obj: Any) -> list[Any]:
        data = json.dumps(obj, separators=(",", ":")).encode()
        if self.group is None:
            return [json.loads(data)]
        n = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, n, group=self.group)
        longest = max(int(s.item()) for s in sizes)
        buf = torch.zeros(longest, dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        outs = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        dist.all_gather(outs, buf, group=self.group)
        return [json.loads(o[: int(s.item())].numpy().tobytes()) for o, s in zip(outs, sizes, strict=True)]

    def close(self, broken: bool = False) -> None:
        """Give the group back for the next checkpointer, or destroy it if it may be broken."""
        if self.group is None:
            return
        group, self.group = self.group, None
        if not (broken or self.failed):
            _idle.setdefault(self._key, []).append(group)
            return
        try:
            dist.destroy_process_group(group)
        except Exception:  # noqa: BLE001 - teardown of a possibly broken group
            pass
