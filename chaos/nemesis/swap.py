"""``swap``: two ranks' files of one checkpoint swapped.

The file the point's event completed trades places with another rank's file of the same
checkpoint (``rank0.pt`` and ``rank1.pt``: the same name but for one number, completed by
another rank), chosen with the point's seed among the files under {out} at the halt. A job
that does not check which rank a shard belongs to loads another rank's state. The family's
protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from typing import Any

from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis import atrest
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import AtRestFamily
from chaos.nemesis.sites import (
    Anchors,
    Facts,
    Traces,
    checkpoint_sites,
    op_records,
    step_announcements,
)
from faults import corrupt as C


def points(job: JobSpec, traces: Traces, facts: Facts) -> list[Point]:
    """The checkpoint sites whose file had, by the moment the point strikes, another rank's file of
    the same checkpoint completed beside it in the fault-free run."""
    anchors = Anchors(traces, facts.stable)
    records = op_records(traces)
    versions = atrest.file_versions(records, atrest.trace_root(records))
    steps = step_announcements(traces)
    out: list[Point] = []
    for ev, rel, step in checkpoint_sites(job, traces, facts):
        when = ev.get("ts", 0.0)
        if step is not None:
            moments, numbers = steps.get(ev["rank"], ([], []))
            when = moments[numbers.index(step)] if step in numbers else when
        completers = {f: [v for v in vs if v.ts <= when][-1].rank for f, vs in versions.items()
                      if any(v.ts <= when for v in vs)}
        completers.setdefault(rel, ev["rank"])
        if swap_partners(rel, completers[rel], completers, completers):
            out.append(anchors.at_completer(ev, "swap", rel, step))
    return out


def swap_partners(rel: str, rank: int, completers: dict[str, int], files: Iterable[str]) -> list[str]:
    """Files of ``files`` that are another rank's file of the same checkpoint as ``rel`` (completed by
    ``rank``): the same name but for one run of digits, last completed by another rank
    (``completers``); those whose differing number is each file's own rank first (``rank0.pt`` and
    ``rank1.pt``), when any are. Never two saves of one rank (``ckpt-3.pt``, ``ckpt-6.pt``).
    Called by :func:`swap` (the files under {out} at the halt) and ``pointset`` (the fault-free run)."""
    mine = atrest.DIGITS.findall(rel)
    found: list[tuple[bool, str]] = []
    for f in sorted(set(files)):
        other = completers.get(f)
        if f == rel or other is None or other == rank or atrest.digit_key(f) != atrest.digit_key(rel):
            continue
        theirs = atrest.DIGITS.findall(f)
        diff = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if int(a) != int(b)]
        if len(diff) != 1:
            continue
        i = diff[0]
        found.append((int(mine[i]) == rank and int(theirs[i]) == other, f))
    best = [f for ok, f in found if ok]
    return best or [f for _ok, f in found]


def _partners(point: Point, rel: str, out: str, records: list[dict[str, Any]]) -> tuple[dict[str, int], list[str]]:
    """Which rank last completed each file under {out} by the end of ``records``, and the files on disk
    now that ``rel`` can be swapped with (:func:`swap_partners`)."""
    versions = atrest.file_versions(records, atrest.trace_root(records) or os.path.realpath(out))
    completers = {f: vs[-1].rank for f, vs in versions.items()}
    completers.setdefault(rel, point.rank)
    on_disk = [os.path.relpath(p, out) for p in atrest.files_under(out) if os.path.isfile(p) and not os.path.islink(p)]
    return completers, swap_partners(rel, completers[rel], completers, on_disk)


def ready(point: Point, out: str, scratch: str) -> bool:
    """Once the point's rank has halted: whether another rank's file of the same checkpoint is complete
    under {out} yet. The plan offered the point because one was by then in the fault-free run, but
    ranks that do not wait for each other race: the other rank may lag this time. The launcher lets
    the other copies run on until it is (``AtRestFamily.halt_ready``). True where there is nothing to
    wait for (the halt completed no file under {out}, or the other rank's file was completed and is
    gone again): :func:`apply` says why it is skipped."""
    records = atrest.merged_records(scratch, 0, with_data=False)
    halt = next((r for r in records if r.get("event") == "fired" and r.get("action") == "halt"
                 and r.get("rank") == point.rank), None)
    rel = atrest.target_file(point, halt, out) if halt is not None else None
    if rel is None or not os.path.isfile(os.path.join(out, rel)):
        return True
    completers, partners = _partners(point, rel, out, records)
    if partners:
        return True
    # one that came and went (its rank ran ahead and rotated it away) will not come back: no use waiting
    removed = [f for f in completers if not os.path.isfile(os.path.join(out, f))]
    return bool(swap_partners(rel, completers[rel], completers, removed))


def apply(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int, _prepared: Any = None) -> Applied:
    """Swap the file the point's event completed with another rank's file of the same checkpoint
    (:func:`swap_partners`: ``rank0.pt`` <-> ``rank1.pt``), chosen with the point's seed among the
    files under {out} once every copy was stopped. Which rank completed each is read from every
    record of attempt 0: the other copies may have run on after the halt (:func:`ready`). Skipped
    where there is none (one rank, ranks that share one file, or the other rank's file was still not
    complete when the launcher stopped waiting) or the two are byte for byte the same."""
    site = atrest.site_file(point, halt, out, seed, "swap")
    if isinstance(site, Applied):
        return site
    rel, base = site
    s = base["seed"]
    completers, partners = _partners(point, rel, out, atrest.merged_records(scratch, 0))
    if not partners:
        return Applied(f"swap of {rel}", base, excluded=[rel],
                       skipped=f"no other rank's file of the same checkpoint as {rel} is under {{out}} to swap it "
                               "with (a file of the same name but for its rank's number, completed by that rank)")
    other = random.Random(s).choice(partners)
    rec = C.swap(os.path.join(out, rel), os.path.join(out, other), scratch_root=out)
    rec.seed = s
    record = {**base, "other": other, "other_rank": completers[other], "candidates": partners[:8],
              "corruption": atrest.relative(rec.to_dict(), out)}
    if not rec.changed:
        return Applied(f"swap of {rel} and {other}", record, excluded=[rel, other],
                       skipped=f"{rel} and {other} are byte for byte the same: swapping them changes nothing")
    return Applied(f"{rel} (rank {completers[rel]}) and {other} (rank {completers[other]}) swapped {atrest.when(point)}",
                   record, excluded=[rel, other], ranks=sorted({point.rank, completers[rel], completers[other]}))


def _one_process(job: JobSpec) -> bool:
    return not job.torchrun and (job.ranks or 1) < 2 and job.nodes is None


FAMILY = AtRestFamily(name="swap", points=points, apply=apply, quiet=_one_process, halt_ready=ready,
                      not_offered="no two ranks each completed their own file of one checkpoint (rank0.pt / "
                                  "rank1.pt)")
