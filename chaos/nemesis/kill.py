"""``kill``: SIGKILL, before or after a traced file event (or torn mid-write), or at an announced step.

The job's own tracer fires these inside the rank (``chaos.target.job.inproc``): at
``rankR:opN:before`` it kills the rank before event N is performed, at ``...:after`` right
after, at ``...:torn`` after writing part of a write of two bytes or more; at
``rankR:stepS:kill`` once the rank announces step S. Points: every traced file event of
every rank x each of ``--modes``, then every announced step. The protocol:
:mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis import shrink
from chaos.nemesis.family import Family
from chaos.nemesis.sites import Anchors, Facts, Traces, announced_steps, event_keys


def modes_at(r: dict[str, Any], modes: Iterable[str]) -> list[str]:
    """The kill ``modes`` a traced event ``r`` takes: ``torn`` only a write of two bytes or more (half of
    it reaches the file). Called by :func:`points` and ``chaos.plan.resumepoints`` (a kill in a resume)."""
    return [m for m in modes if not (m == "torn" and (r.get("op") != "write" or (r.get("length") or 0) < 2))]


def points(job: JobSpec, traces: Traces, facts: Facts | None) -> list[Point]:
    anchors = Anchors(traces, facts.stable if facts is not None else None)
    ops = [anchors.at_event(rank, r, path, nth, mode) for rank, r, path, nth in event_keys(traces)
           for mode in modes_at(r, job.modes)]
    return ops + [Point(rank, "kill", step=n) for rank, steps in announced_steps(traces) for n in steps]


FAMILY = Family(name="kill", points=points, refusal=shrink.refusal)
