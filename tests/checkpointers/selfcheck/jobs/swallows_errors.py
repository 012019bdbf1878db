"""Planted defect: an I/O error while writing a checkpoint is printed and ignored, and the save acknowledged.

The job of ``correct.py``, but its atomic write catches ``OSError`` (a full disk, an EIO, a
failed fsync), says so and carries on to the rename and ``probe.saved``: the job relies on a
checkpoint that never made it to disk whole. The next load finds it damaged (the checksum
catches it) and falls back, but the acknowledgement was a lie the crash exposed.
"""

import json
import os

from chaos.examples import careful_job as job

CHAOS_JOB = {"faults": ("errno",), "result_globs": ("final.json",), "max_points": 40}
EXPECTED_CATCH = {"errno": ("no_false_ack",)}


def atomic_write_json(path: str, obj: object) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:  # the defect: the error is swallowed, the save goes on to be acknowledged
        print(f"warning: {exc}; carrying on", flush=True)
    os.replace(tmp, path)
    job.fsync_dir(os.path.dirname(path))


job.atomic_write_json = atomic_write_json

if __name__ == "__main__":
    job.main()
