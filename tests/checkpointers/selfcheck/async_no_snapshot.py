"""Planted defect: an async save that does not snapshot the state first.

``save()`` hands the live state dict to the background writer and returns at once ("no
copy: saves memory and time"). The writer first lets training get ahead (a short sleep,
as in ``correct.py``'s async mode) and then serialises tensors that the optimizer has
updated in place since: the checkpoint of step N holds weights and moments of a later
step next to step N's counters. Otherwise this is ``correct.py`` with ``async_save=true``.
"""

from __future__ import annotations

from pathlib import Path

from chaos.target.protocol import load_checkpointer

# correct.py beside this file, through the harness's own by-path loader (cached per path).
Correct = load_checkpointer(f"{Path(__file__).with_name('correct.py')}:CorrectCheckpointer")


# The self-check counts this defect as caught only when one of these oracles fails in one of these
# probes (chaos.run.selfcheck): the checkpoint of step N holds tensors of a later step: not the state
# saved at step N.
EXPECTED_CATCH = {"kill-between-saves": ("committed_state",)}

# The self-check's job half runs it inside the built-in workload as a job, as `chaos run --as-job`
# does (chaos.run.jobselfcheck): JobSpec fields and max_points, a literal; and the job families and
# oracles that must catch the defect there.
CHAOS_AS_JOB = {"faults": ("kill",), "max_points": 4}
EXPECTED_JOB_CATCH = {"kill": ("committed_state",)}


class AsyncNoSnapshotCheckpointer(Correct):
    def __init__(self, root: str, rank: int, world_size: int, **options: object) -> None:
        super().__init__(root, rank, world_size, **{**options, "async_save": True})

    def _snapshot(self, state: dict) -> dict:
        return state  # the defect: the live tensors, not a copy
