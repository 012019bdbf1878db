"""Planted defect: the checksum is written but never compared on load.

The job of ``correct.py``, but a checkpoint that still parses is taken as it is: a flipped
bit in a number loads silently, and the job trains on, from a state nobody saved.
"""

import json

from chaos.examples import careful_job as job

CHAOS_JOB = {"faults": ("corrupt",), "result_globs": ("final.json",)}
EXPECTED_CATCH = {"corrupt": ("result_files",)}


def load_latest(out: str, prefix: str, rank: int | None = None) -> dict | None:
    for _step, path in job.checkpoints(out, prefix):
        try:
            with open(path) as f:
                return json.load(f)["state"]  # the defect: saved["sha256"] is never compared
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


job.load_latest = load_latest

if __name__ == "__main__":
    job.main()
