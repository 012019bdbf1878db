"""What the supervisor hands one rank process: plain data, no torch import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 3


@dataclass
class RankSpec:
    rank: int
    world_size: int
    attempt: int
    master_addr: str
    master_port: int
    workload: dict[str, Any]
    log_path: str
    checkpointer: str | None = None
    ckpt_options: dict[str, Any] = field(default_factory=dict)
    ckpt_root: str | None = None
    backend: str = "gloo"
    # Faults this rank triggers itself at a point of its program (step N), as dicts
    # {"index": i, "kind": ..., "step": N}; the supervisor carries them out.
    step_faults: list[dict[str, Any]] = field(default_factory=list)
    # In-rank hooks (I/O interposer rules and the like), installed before training.
    rank_hooks: list[dict[str, Any]] = field(default_factory=list)
