"""Planted defect: the restart resumes from the oldest checkpoint it kept, not the newest.

The job of ``correct.py``, but its loader walks the checkpoints oldest first (a sort in the
wrong direction): every restart repeats the steps since the save before the last, and the
result comes out the same, so only the step it resumed from shows the lost work.
"""

from chaos.examples import careful_job as job

CHAOS_JOB = {"faults": ("kill",), "result_globs": ("final.json",), "max_points": 16}
EXPECTED_CATCH = {"kill": ("durability",)}

newest_first = job.checkpoints
job.checkpoints = lambda out, prefix: newest_first(out, prefix)[::-1]  # the defect

if __name__ == "__main__":
    job.main()
