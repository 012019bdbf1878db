"""``errno``: a traced file event raises EIO or ENOSPC instead of being performed.

The job's own tracer fires these inside the rank: ``rankR:opN:eio`` (an fsync's is a failed
fsync) at every event, ``rankR:opN:enospc`` at every event that can need space (a write, a
file created, mkdir, rename, link); after an ENOSPC the disk stays full for the rank's
later events that need space. The protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis.family import Family
from chaos.nemesis.sites import Anchors, Facts, Traces, event_keys

ENOSPC_EVENTS = ("write", "mkdir", "rename", "link")  # plus an open that creates its file


def points(job: JobSpec, traces: Traces, facts: Facts | None) -> list[Point]:
    anchors = Anchors(traces, facts.stable if facts is not None else None)
    out: list[Point] = []
    for rank, r, path, nth in event_keys(traces):
        out.append(anchors.at_event(rank, r, path, nth, "eio"))
        if r["op"] in ENOSPC_EVENTS or (r["op"] == "open" and r.get("created")):
            out.append(anchors.at_event(rank, r, path, nth, "enospc"))
    return out


FAMILY = Family(name="errno", points=points)
