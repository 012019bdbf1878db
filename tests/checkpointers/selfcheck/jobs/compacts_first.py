"""Planted defect: every restart compacts the checkpoints by removing them all before rewriting the one it loaded.

The job of ``correct.py``, but its loader, once it has the newest checkpoint that verifies,
"compacts" the directory: it removes every checkpoint file, then writes the loaded state
back the careful way (temp file, fsync, rename, directory fsync). Every single fault passes:
the restart always finishes its compaction. A kill inside that recovery, after a removal and
before the rename, leaves no checkpoint at all, and the next restart starts over: lost work
that only a second fault in the resume shows (``--resume-points``, ``chaos.plan.resumepoints``).
"""

import os

from chaos.examples import careful_job as job

CHAOS_JOB = {"faults": ("kill",), "result_globs": ("final.json",), "max_points": 4, "resume_points": 3}
# The self-check counts this defect as caught only when one of these oracles fails at a point of
# one of these families (chaos.run.jobselfcheck); a point struck again in its resume is its first
# fault's family.
EXPECTED_CATCH = {"kill": ("durability",)}

_load_latest = job.load_latest


def load_latest(out: str, prefix: str, rank: int | None = None) -> dict | None:
    state = _load_latest(out, prefix, rank)
    if state is not None:  # the defect: the old files go before the rewrite is in place
        for _step, path in job.checkpoints(out, prefix):
            os.unlink(path)
        job.save(out, prefix, state, keep=2)
    return state


job.load_latest = load_latest

if __name__ == "__main__":
    job.main()
