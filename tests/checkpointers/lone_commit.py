"""A known-bad checkpointer: rank 0 commits without waiting for the others.

``careful.py`` without its barriers: every rank writes its own ``rank<r>.pt`` into
``step-<N>.tmp/`` and rank 0 renames the directory into place and points ``latest``
at it as soon as *its own* file is durable, never asking whether the other ranks'
files are there. While every rank lives it looks correct; when one dies during a
save, rank 0 publishes a checkpoint that lacks that rank's state. Caught only if the
survivors get to run on after the death (``kill:...,linger=S``), as they do under a
real launcher until its monitor notices.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from chaos.target.protocol import load_checkpointer

Careful = load_checkpointer(f"{Path(__file__).with_name('careful.py')}:CarefulCheckpointer")


class LoneCommitCheckpointer(Careful):
    def save(self, step: int, state: dict) -> None:
        tmp = os.path.join(self.root, f"step-{step}.tmp")
        os.makedirs(tmp, exist_ok=True)
        with open(os.path.join(tmp, f"rank{self.rank}.pt"), "wb") as f:
            torch.save(state, f)
            f.flush()
            self._sync(f.fileno())
        if self.rank == 0:  # no vote: the others' files are assumed
            self._publish(step, tmp, os.path.join(self.root, f"step-{step}"))
