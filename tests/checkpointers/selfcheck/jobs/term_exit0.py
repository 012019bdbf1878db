"""Planted defect: on SIGTERM the job saves and exits 0.

The job of ``correct.py``, but a preempted job reports success: a supervisor that restarts
failed jobs (torchelastic, a Kubernetes Job, a Slurm requeue) takes status 0 for "done" and
never restarts it, so the run ends at the preemption.
"""

import sys

from chaos.examples import careful_job as job

CHAOS_JOB = {"faults": ("term",), "result_globs": ("final.json",)}
EXPECTED_CATCH = {"term": ("preemption_exit",)}


class _Sys:
    @staticmethod
    def exit(_code: int) -> None:
        sys.exit(0)  # the defect: 143 (128 + SIGTERM) would say it was stopped


job.sys = _Sys

if __name__ == "__main__":
    job.main()
