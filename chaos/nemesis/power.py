"""``power``: a power loss right after one traced event — every pending change lost, or one of the cut's other states.

{out} is replaced by a crash state (``faults.crashstate.CrashModel``) of the merged attempt-0
traces of every rank up to the moment rank R halted, from {out} as it was before attempt 0:
the state where every pending change is lost (data written since its file's last fsync,
directory entries created, renamed or removed since their directory's last fsync) or, for
``rankR:opN:power:sK``, the k-th of the cut's other distinct states (some of it kept: a
file's data without its directory entry, an entry without its data, a write torn). Points:
every event after which something was pending in the fault-free run (a power loss there
differs from a kill), every event where the model cannot say; up to ``POWER_STATES`` mixed
states per cut beside the worst case. The state itself is built by ``atrest.power_loss``.
The family's protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis import atrest
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import AtRestFamily
from chaos.nemesis.sites import Anchors, Facts, Traces, event_keys
from faults.crashstate import Snapshot

POWER_STATES = 3  # mixed power-loss states per cut (``rankR:opN:power:sK``), beside everything-lost


def gather(out: str, scratch: str, facts: Facts) -> None:
    """After which events of the fault-free run something was pending (``Facts.pending``)."""
    facts.pending = atrest.pending_after(out, atrest.merged_records(scratch, 0))


def points(job: JobSpec, traces: Traces, facts: Facts) -> list[Point]:
    """The worst case at every event with something pending (every event where the model cannot
    say), then a few of the cut's mixed states, drawn by ``atrest.power_loss`` with the seed."""
    anchors = Anchors(traces, facts.stable)
    pending = facts.pending
    out: list[Point] = []
    for rank, r, path, nth in event_keys(traces):
        if isinstance(pending, dict) and (rank, r["ord"]) not in pending:
            continue
        worst = anchors.at_event(rank, r, path, nth, "power")
        mixed = pending.get((rank, r["ord"]), 0) - 2 if isinstance(pending, dict) else 0
        out += [worst, *(dataclasses.replace(worst, state=k) for k in range(1, min(POWER_STATES, mixed) + 1))]
    return out


def prepare(out: str) -> Snapshot:
    """{out} before attempt 0: the base every crash state starts from."""
    return Snapshot.capture(out)


def apply(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int, prepared: Any = None) -> Applied:
    return atrest.power_loss(point, out, scratch, halt, prepared if prepared is not None else Snapshot(), seed)


def notes(job: JobSpec, traces: Traces, facts: Facts, points: list[Point]) -> list[str]:
    if not isinstance(facts.pending, str):
        return []
    return [f"power loss: the crash-state model cannot represent the whole fault-free trace ({facts.pending}); "
            "every event gets a power point, skipped where its own cut cannot be modelled either"]


FAMILY = AtRestFamily(name="power", points=points, apply=apply, gather=gather, prepare=prepare, notes=notes)
