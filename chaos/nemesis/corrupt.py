"""``corrupt``: bit rot in a file the job completed — a bit flipped, truncated, zeroed or deleted.

One seeded ``faults.corrupt`` edit of the file the point's event completed, right after it or
(``rankR:opN:MODE:stepS``) once rank R announced step S and trusts it. Example:
``rank0:op14:bitflip`` on a 71-byte ``ckpt.json`` with seed 3 might flip bit 5 of byte 40,
recorded as ``changes: [{"start": 40, "end": 41, "old": "36", "new": "16"}]``. The family's
protocol and who calls what: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import os
import random
from typing import Any

from chaos.model.jobspec import CORRUPT_FAMILIES, JobSpec, Point
from chaos.nemesis import atrest
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import AtRestFamily
from chaos.nemesis.sites import (
    Anchors,
    Facts,
    Traces,
    completer,
    completions,
    is_checkpoint,
    rot_sites,
)
from faults import FaultError
from faults import corrupt as C

ZERO_BYTES = 64  # a zero corruption blanks up to this many bytes


def points(job: JobSpec, traces: Traces, facts: Facts) -> list[Point]:
    """Each mode at every file the fault-free run left (at the event that completed it), then at
    every version of a file once the job trusted it (``sites.rot_sites``); with
    ``--checkpoint-glob``, its matches only."""
    anchors = Anchors(traces, facts.stable)
    out: list[Point] = []
    done = completions(traces)
    for rel in facts.files:
        if job.checkpoint_glob is not None and not is_checkpoint(job, rel):
            continue
        ev = completer(done, rel)
        if ev is not None:
            out += [anchors.at_completer(ev, mode, rel) for mode in CORRUPT_FAMILIES]
    for ev, rel, step in rot_sites(traces):
        if job.checkpoint_glob is None or is_checkpoint(job, rel):
            out += [anchors.at_completer(ev, mode, rel, at_step=step) for mode in CORRUPT_FAMILIES]
    return out


def apply(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int, _prepared: Any = None) -> Applied:
    """Corrupt the file rank ``point.rank``'s event ``point.op`` completed, with ``point.mode``'s family."""
    rel = atrest.target_file(point, halt, out)
    if rel is None:
        return Applied(f"{point.mode} of nothing", skipped=f"event {point.op} ({halt.get('op')}) completed no file "
                       "under {out}: nothing to corrupt")
    path = os.path.join(out, rel)
    s = atrest.point_seed(seed, point)
    base = {"family": point.mode, "file": rel, "seed": s}
    when = (f"event {point.op}" if point.at_step is None else
            f"rank {point.rank}'s step {point.at_step} (event {point.op} completed the file)")
    if not os.path.isfile(path):
        return Applied(f"{point.mode} of {rel}", base, skipped=f"{rel} was absent when the job stopped after {when}: "
                       "nothing to corrupt", excluded=[rel])
    size = os.path.getsize(path)
    rng = random.Random(s)
    try:
        if point.mode == "bitflip":
            rec = C.flip_bits(path, n=1, seed=s, scratch_root=scratch)
        elif point.mode == "truncate":
            rec = C.truncate(path, size=rng.randrange(size) if size else 0, scratch_root=scratch)
        elif point.mode == "zero":
            if not size:
                return Applied(f"zero of {rel}", base, skipped=f"{rel} is empty: no byte to zero", excluded=[rel])
            n = min(ZERO_BYTES, size)
            start = rng.randrange(size - n + 1)
            rec = C.zero_range(path, start, start + n, scratch_root=scratch)
        else:
            rec = C.delete(path, scratch_root=scratch)
    except FaultError as exc:  # e.g. a bit flip in an empty file
        return Applied(f"{point.mode} of {rel}", base, skipped=f"{rel}: {exc}", excluded=[rel])
    rec.seed = s
    record = {**base, "corruption": rec.to_dict()}
    record["corruption"]["path"] = rel
    if not rec.changed:
        return Applied(f"{point.mode} of {rel}", record, skipped=f"{rel}: {C.why_unchanged(rec)}", excluded=[rel])
    if point.at_step is not None:
        record["at_step"] = point.at_step
        return Applied(f"{rel}: {describe(point.mode, rec)} at rest, once rank {point.rank} announced step "
                       f"{point.at_step} (event {point.op} completed it)", record, excluded=[rel])
    return Applied(f"{rel}: {describe(point.mode, rec)} after event {point.op} completed it", record,
                   excluded=[rel])


def describe(family: str, rec: C.CorruptionRecord) -> str:
    """What a corruption did, in words (``bit 5 of byte 40 flipped``). Called by :func:`apply` and by
    ``chaos.nemesis.newest`` (the built-in ``ckpt:`` fault's edit)."""
    p = rec.params
    if family == "bitflip":
        said = [f"bit {b} of byte {o}" for o, b in p["bits"]]
        if len(said) > 4:  # (the built-in's bits=16: the record has every one)
            return f"{len(said)} bits flipped ({', '.join(said[:3])} and {len(said) - 3} more)"
        return ", ".join(f"{s} flipped" for s in said)
    if family == "truncate":
        return f"truncated from {rec.size_before} to {rec.size_after} bytes"
    if family == "zero":
        return f"bytes [{p['start']}, {p['end']}) zeroed"
    return f"deleted ({rec.size_before} bytes)"


def notes(job: JobSpec, traces: Traces, facts: Facts, points: list[Point]) -> list[str]:
    """The checkpoint files no traced event completed (with ``--checkpoint-glob``): none is corrupted."""
    done = completions(traces)
    orphans = [f for f in facts.files if is_checkpoint(job, f) and completer(done, f) is None]
    if job.checkpoint_glob is None or not orphans:
        return []
    return [f"{len(orphans)} checkpoint file(s) were completed by no traced event and are not corrupted: "
            f"{', '.join(orphans[:5])}"]


FAMILY = AtRestFamily(name="corrupt", points=points, apply=apply, notes=notes)
