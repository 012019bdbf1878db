"""Small pieces the adapters share: step directories and agreeing on one step."""

from __future__ import annotations

import re
from pathlib import Path

import torch.distributed as dist

STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def committed_steps(root: str | Path, marker: str) -> list[int]:
    """Steps whose directory holds ``marker`` (the adapter's idea of "complete"), newest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    steps = []
    for child in base.iterdir():
        m = STEP_DIR.match(child.name)
        if m and (child / marker).exists():
            steps.append(int(m.group(1)))
    return sorted(steps, reverse=True)


def agree(value: object, src: int = 0) -> object:
    """Every rank takes rank ``src``'s value, so all ranks load the same step."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]
