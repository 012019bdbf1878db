"""Second faults: a kill or a power cut inside the resume of a point the job survived (``--resume-points N``).

Why: a checkpointer's recovery is code that runs right after a crash, on the leftovers of
one: it loads, cleans up temp files and half-written checkpoints, applies retention, writes
its first save. A crash *there* is a different fault from any the fault-free run can
offer, and the bugs behind it are real: a cleanup that deletes the only good checkpoint
before the next one is complete, a ``latest`` pointer rewritten in place, a lock the
recovery takes and never releases. The built-in workload's generated schedules have had a
second fault in the restart from the start (``chaos.plan.strategies``, ``attempt=1``);
this gives a job the same.

Such a point is only known once the first one has run: its resume's trace says which
events the recovery made. After the first points are judged, ``explore`` hands over what
each one's resume did (:class:`Resumed`) and :func:`choose` picks up to N of them (passing
points whose resume started from a checkpoint first, one of every family before a second
of any), and for each a seeded kill at one event of its resume, among those up to the end
of the resume's first save (its first rename, or its first ``chaos.probe.saved``), where
recovery and its first save happen; among all its events where neither is seen. Every
second one of them (the 2nd, 4th ... chosen) is a power cut instead (``+rankR:opN:power``,
``chaos.nemesis.power.in_restart``), where the job can take one (not a torchrun COMMAND): a
recovery can survive a kill anywhere and still not be durable, and a kill's page cache
hides that. Its event is drawn on past the first rename, up to the fsync after it, where
a rewrite whose directory is synced before its data loses the file. The chain is then the first point's, the second fault armed
in its restart (``Point.then``), and one restart more.

A torchrun COMMAND takes them too: its agent restarts the workers
(``TORCHELASTIC_RESTART_COUNT``), so the second fault rides in the launch's environment
(``ENV_POINT_THEN``) and fires in the workers of the first restart; after a fault that stops
torchrun itself (SIGTERM, at rest, power) the harness relaunches it with the second fault
armed. Either way torchrun needs ``--max-restarts 2`` or more.

Called by ``chaos.run.explore.explore``; :func:`why_not` by the command line, before anything runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from chaos.model.grammar import THEN_FAMILIES
from chaos.model.jobspec import MODES, JobSpec, torchrun_option
from chaos.model.point import Point
from chaos.nemesis.kill import modes_at


@dataclass(frozen=True)
class Resumed:
    """What one judged point's first restart did: ``events`` per rank, the trace of that restart
    (attempt 1; a relaunched torchrun's workers, TORCHRUN_STRIDE)."""

    point: Point
    passed: bool  # every oracle passed: the job survived the first fault
    resumed: bool  # the first restart ran (not rebuilt), and the chain ended well
    events: dict[int, list[dict[str, Any]]]
    from_checkpoint: bool = False  # the lost-work oracle saw the resume start from a checkpoint it relied on


def why_not(job: JobSpec) -> str | None:
    """Why this job's points cannot take a second fault (None: they can)."""
    if job.nodes is not None:
        return "--nodes: a node's agent restarts its workers, and a node point has a chain of its own"
    if job.torchrun:
        given = torchrun_option(job.command, "--max-restarts", "--max_restarts")
        restarts = int(given[1]) if given is not None and given[1].isdigit() else 0
        if restarts < 2:
            return (f"torchrun --max-restarts {restarts}: its agent must restart the workers after the first fault "
                    "and again after the second (--max-restarts 2 or more)")
    if job.launcher not in ("subprocess", "docker"):  # (docker: the harness restarts the containers)
        return f"--launcher {job.launcher} restarts the job itself"
    if job.max_restarts < 1:
        return "--max-restarts 0: a point is never resumed, so there is no resume to strike"
    return None


def _window(recs: list[dict[str, Any]], durable: bool = False) -> list[dict[str, Any]]:
    """The resume's events up to the end of its first save (see the module docstring); with ``durable``
    (a power cut's), on past its first rename up to the fsync after it, where the save becomes durable."""
    ops: list[dict[str, Any]] = []
    renamed = False
    for r in recs:
        if r.get("event") == "phase" and r.get("name") == "chaos.probe" and (r.get("info") or {}).get("kind") == "saved":
            if ops:
                return ops
        if r.get("event") != "op" or r.get("ord") is None or r.get("error"):
            continue
        ops.append(r)
        if r.get("op") == "rename" and not durable or renamed and r.get("op") == "fsync":
            return ops
        renamed = renamed or r.get("op") == "rename"
    return ops


def choose(done: list[Resumed], n: int, seed: int, power: bool = False) -> list[Point]:
    """Up to ``n`` points with a second fault: passing points whose resume ran, those that resumed
    from a checkpoint first, one of each family before a second of any, each with a seeded kill at
    one event of its resume's first save; with ``power`` (the job can take a power cut in its
    resume), every second one a power cut instead, at an event drawn with a generator of its own on
    the longer window of a cut: the points chosen and the kills' draws are the same either way."""
    rng = random.Random(f"resume-points:{seed}")
    windows = {id(d): {r: w for r, recs in d.events.items() if (w := _window(recs))} for d in done}
    able = [d for d in done if d.passed and d.resumed and d.point.then is None and d.point.family in THEN_FAMILIES
            and windows[id(d)]]
    rng.shuffle(able)
    order: list[Resumed] = []
    for tier in (True, False):  # a resume from a checkpoint first: there recovery has something to lose
        by_family: dict[str, list[Resumed]] = {}
        for d in able:
            if d.from_checkpoint is tier:
                by_family.setdefault(d.point.family, []).append(d)
        while any(by_family.values()):
            for fam in sorted(by_family):
                if by_family[fam]:
                    order.append(by_family[fam].pop(0))
    out = []
    for i, d in enumerate(order[:n]):
        rank = rng.choice(sorted(windows[id(d)]))
        event = rng.choice(windows[id(d)][rank])
        mode = rng.choice(modes_at(event, MODES))
        if power and i % 2 == 1:  # drawn apart, so that the kills' draws stay what they were
            mode = "power"
            event = random.Random(f"resume-power:{seed}:{d.point.id}").choice(_window(d.events[rank], durable=True))
        then = Point(rank, mode, op=int(event["ord"]), kind=event.get("op"), path=event.get("rel"),
                     seq=event.get("seq"), attempt=1)
        out.append(replace(d.point, then=then))
    return out


__all__ = ["Resumed", "choose", "why_not"]
