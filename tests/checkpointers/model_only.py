"""A known-bad checkpointer: saves only ``state["model"]`` (a common first attempt).

Resuming restores the weights but restarts Adam's moments, the LR schedule, the data
position and the RNGs — the bit-exact oracle must fail it and name the first
differing tensor.
"""

from pathlib import Path

import torch
import torch.distributed as dist


class ModelOnlyCheckpointer:
    def __init__(self, root, rank, world_size):
        self.root, self.rank = Path(root), rank
        self.root.mkdir(parents=True, exist_ok=True)

    def save(self, step, state):
        if self.rank == 0:
            tmp = self.root / f"model_{step}.pt.tmp"
            torch.save(state["model"], tmp)
            tmp.replace(self.root / f"model_{step}.pt")
        dist.barrier()

    def wait(self):
        pass

    def load_latest(self, template):
        steps = sorted(int(p.stem.split("_")[1]) for p in self.root.glob("model_*.pt"))
        if not steps:
            return None
        state = dict(template)
        state["model"] = torch.load(self.root / f"model_{steps[-1]}.pt", weights_only=True)
        state["progress"] = {"step": steps[-1], "tokens": 0}
        return steps[-1], state

    def close(self):
        pass
