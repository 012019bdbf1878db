"""Planted defect: the loss the job logs draws on a random generator the checkpoint does not save.

The job of ``correct.py``, but each step's logged loss adds noise from a generator seeded
once at start and never saved (dropout, data augmentation): the weights and the result come
out the same, and the loss curve after a restart is not the one an uninterrupted run logs.
"""

import random

from chaos.examples import careful_job as job

CHAOS_JOB = {"faults": ("kill",), "result_globs": ("final.json",), "max_points": 16,
             "loss_regex": r"step (?P<step>\d+) loss (?P<loss>\S+)"}
EXPECTED_CATCH = {"kill": ("loss_continuity",)}

noise = random.Random(0)  # the defect: its state is not in the checkpoint
train_step = job.train_step


def noisy_step(weights: list[float], step: int) -> tuple[list[float], float]:
    new, loss = train_step(weights, step)
    return new, loss + noise.random()


job.train_step = noisy_step

if __name__ == "__main__":
    job.main()
