"""Planted defect: the newest checkpoint is loaded without verifying it or falling back.

The job of ``correct.py``, but its loader trusts the newest file: a truncated, zeroed or
deleted-then-half-written checkpoint raises on every restart, and the job never comes back.
"""

import json

from chaos.examples import careful_job as job

CHAOS_JOB = {"faults": ("corrupt",), "result_globs": ("final.json",)}
# The self-check counts this defect as caught only when one of these oracles fails at a point of
# one of these families (chaos.run.jobselfcheck).
EXPECTED_CATCH = {"corrupt": ("liveness",)}


def load_latest(out: str, prefix: str, rank: int | None = None) -> dict | None:
    for _step, path in job.checkpoints(out, prefix)[:1]:
        with open(path) as f:
            return json.load(f)["state"]  # the defect: no checksum, no try, no older one
    return None


job.load_latest = load_latest

if __name__ == "__main__":
    job.main()
