"""A known-bad checkpointer: every rank overwrites one file in place, then bumps `latest`.

It survives a kill between saves, but a kill in the middle of a save leaves a torn
file where the only checkpoint was: nothing loads afterwards.
"""

from pathlib import Path

import torch
import torch.distributed as dist


class InPlaceCheckpointer:
    def __init__(self, root, rank, world_size):
        self.root, self.rank = Path(root), rank
        self.root.mkdir(parents=True, exist_ok=True)

    def save(self, step, state):
        with open(self.root / f"state_r{self.rank}.pt", "wb") as f:
            torch.save(state, f)
        dist.barrier()
        if self.rank == 0:
            (self.root / "latest").write_text(str(step))
        dist.barrier()

    def wait(self):
        pass

    def load_latest(self, template):
        latest = self.root / "latest"
        if not latest.exists():
            return None
        with open(self.root / f"state_r{self.rank}.pt", "rb") as f:
            state = torch.load(f, weights_only=True)
        return int(latest.read_text()), state

    def close(self):
        pass
