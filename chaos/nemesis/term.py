"""``term``: SIGTERM at an announced step, then SIGKILL once ``--grace`` has passed.

A preemption as schedulers deliver it: the rank asks the launcher for the signal when it
announces step S (``rankR:stepS:term``); the launcher sends SIGTERM to every copy and
SIGKILL to those still running after the grace. The job is restarted even when it exited
0 (it was preempted, not finished), and the ``preemption_exit`` oracle judges that exit.
The protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis.family import Family
from chaos.nemesis.sites import Facts, Traces, announced_steps


def points(job: JobSpec, traces: Traces, facts: Facts | None) -> list[Point]:
    return [Point(rank, "term", step=n) for rank, steps in announced_steps(traces) for n in steps]


def notes(job: JobSpec, traces: Traces, facts: Facts, points: list[Point]) -> list[str]:
    return [] if points else ["SIGTERM is not explored: the job announced no step (chaos.probe.step or --step-regex)"]


def _params(job: JobSpec, point: Point, seed: int) -> dict[str, float]:
    return {"grace_s": point.grace_s if point.grace_s is not None else job.grace_s}


FAMILY = Family(name="term", points=points, notes=notes, params=_params,
                restarts_torchrun=True, preempts=True)
