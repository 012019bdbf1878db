"""Planted defect: files are fsynced but directories never are.

Shards, checksum files and ``latest.tmp`` reach stable storage, but the renames that
commit them (``step-N.tmp`` -> ``step-N``, ``latest.tmp`` -> ``latest``) live only in the
directory's page cache. After a power loss right after ``wait()`` returned, the newest
checkpoint (already acknowledged) may not exist. Otherwise this is ``correct.py``.
"""

from __future__ import annotations

from pathlib import Path

from chaos.target.protocol import load_checkpointer

# correct.py beside this file, through the harness's own by-path loader (cached per path).
Correct = load_checkpointer(f"{Path(__file__).with_name('correct.py')}:CorrectCheckpointer")


# The self-check counts this defect as caught only when one of these oracles fails in one of these
# probes (chaos.run.selfcheck): some crash state loses the rename that committed the acknowledged
# checkpoint.
EXPECTED_CATCH = {"powerloss": ("atomic_commit",)}

# The self-check's job half runs it inside the built-in workload as a job, as `chaos run --as-job`
# does (chaos.run.jobselfcheck): JobSpec fields and max_points, a literal; and the job families and
# oracles that must catch the defect there.
CHAOS_AS_JOB = {"faults": ("power",), "max_points": 4}
EXPECTED_JOB_CATCH = {"power": ("durability",)}


class NoDirFsyncCheckpointer(Correct):
    def _fsync_dir(self, path: str) -> None:
        pass  # the defect: fsync(file) is believed to persist its name too
