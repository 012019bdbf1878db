"""A built-in workload's fault that names no single place in a job: the job's points it stands for.

Most built-in faults are one job point as written (``chaos.model.grammar.parse_point``: a kill,
SIGTERM, hang or cut at a step or phase; an I/O fault, whose interposer rule the job's tracer
fires). ``all:stepS:power`` is not: the built-in workload explores every crash state of the save
at step S in one scenario. For a job (``chaos run --as-job --fault all:step8:power``, or the
replay of a built-in result) it stands for the ``power`` points of that save: a power cut
right after each file event of the save at which something was pending, the worst case and
the mixed states the cut allows (``chaos.nemesis.power``). Which events are that save's is read
from the fault-free run's traces (``chaos.nemesis.sites.save_events``); ``max_states=K`` keeps
K of them, drawn with the fault's ``seed``, in trace order.

Called by ``chaos.run.explore.Reference.expand`` (the points a ``--point`` runs) and
``chaos.cli.job.unreachable`` (a stand-in with no point is a usage error before anything runs).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from chaos.model.grammar import parse_fault
from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis.sites import Facts, Traces, save_events
from chaos.plan import pointset


def points_for(job: JobSpec, point: Point, traces: Traces, facts: Facts, planned: Iterable[Point],
               kinds: Iterable[str]) -> list[Point]:
    """The job points ``point`` stands for: itself, or for a whole save's power cuts (``Point.whole_save``)
    its save's ``power`` points, from ``planned`` where the power family was planned (``kinds``), else
    enumerated here."""
    if not point.whole_save:
        return [point]
    assert point.step is not None and point.builtin is not None
    fault = parse_fault(point.builtin)
    pool = ([p for p in planned if p.family == "power"] if "power" in kinds
            else pointset.enumerate_points(job, traces, facts, ("power",)))
    window = save_events(traces, point.step)
    found = [p for p in pool if p.then is None and (p.rank, p.op) in window]
    cap = fault.param("max_states")
    if isinstance(cap, int) and len(found) > cap:
        keep = random.Random(f"{fault.param('seed', 0)}:{point.builtin}").sample(range(len(found)), cap)
        found = [found[i] for i in sorted(keep)]
    return found


def empty_why(point: Point, traces: Traces) -> str:
    """Why a whole save's stand-in stands for no point: the save's events, or their absence, in words."""
    window = save_events(traces, point.step if point.step is not None else -1)
    if not window:
        return (f"no file event of the fault-free run belongs to a save at step {point.step} (no rank announced "
                "that step before a file event: a checkpointer's chaos.phases phase with step=S, or chaos.probe.step)")
    return (f"none of the {len(window)} file event(s) of the save at step {point.step} left anything pending for a "
            "power cut to lose")


__all__ = ["empty_why", "points_for"]
