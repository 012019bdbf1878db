"""Planted defect: nothing is ever fsynced (files or directories).

Temp directory, rename into place, ``latest`` by temp + rename: exactly ``correct.py``,
so a process kill at any instant leaves a loadable checkpoint — every byte written
before a rename has reached the kernel. A power loss does not: the rename and the
removal of older checkpoints may persist while the new shards' data does not, and an
acknowledged save can vanish.
"""

from __future__ import annotations

from pathlib import Path

from chaos.target.protocol import load_checkpointer

# correct.py beside this file, through the harness's own by-path loader (cached per path).
Correct = load_checkpointer(f"{Path(__file__).with_name('correct.py')}:CorrectCheckpointer")


# The self-check counts this defect as caught only when one of these oracles fails in one of these
# probes (chaos.run.selfcheck): some crash state of the save loses the acknowledged checkpoint.
EXPECTED_CATCH = {"powerloss": ("atomic_commit",)}

# The self-check's job half runs it inside the built-in workload as a job, as `chaos run --as-job`
# does (chaos.run.jobselfcheck): JobSpec fields and max_points, a literal; and the job families and
# oracles that must catch the defect there.
CHAOS_AS_JOB = {"faults": ("power",), "max_points": 4}
EXPECTED_JOB_CATCH = {"power": ("durability",)}


class NoFsyncCheckpointer(Correct):
    def _fsync(self, fd: int) -> None:
        pass  # the defect: "fsync is slow, the page cache is fine"
