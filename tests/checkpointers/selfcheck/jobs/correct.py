"""A correct job: ``chaos/examples/careful_job.py`` as it is.

Checksummed checkpoints written to a temp file, fsynced, renamed into place and the
directory fsynced before the save is acknowledged; the newest that verifies is loaded,
every damaged one skipped; an I/O error stops the job; on SIGTERM it saves and exits 143.
Every point of the families below must pass (or be skipped with its reason): a failure
here is a false positive of the job oracles. The planted defects beside it each change
one thing of this job (``chaos.run.jobselfcheck``).
"""

from chaos.examples import careful_job as job

# How the self-check runs it (chaos.run.jobselfcheck): JobSpec fields, a literal.
CHAOS_JOB = {"faults": ("kill", "corrupt", "term", "payload", "stale"), "result_globs": ("final.json",),
             "max_points": 40,
             "loss_regex": r"step (?P<step>\d+) loss (?P<loss>\S+)"}

if __name__ == "__main__":
    job.main()
