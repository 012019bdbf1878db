"""``stale``: an older version of a file the job completed put back in its place.

The file the point's event completed is replaced by the newest older version of it the same
run completed that differs (saved before under its name, or the file of its name in an older
checkpoint directory: ``checkpoint-4/model.pt`` for ``checkpoint-8/model.pt``), from {out}
where it is still there, else rebuilt from the trace. A job that takes a checkpoint's step
from its name, or trusts a manifest that does not pin each file's hash, resumes from a
mixture. The family's protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import os
from typing import Any

from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis import atrest
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import AtRestFamily
from chaos.nemesis.sites import Anchors, Facts, Traces, checkpoint_sites, op_records
from faults import corrupt as C


def points(job: JobSpec, traces: Traces, facts: Facts) -> list[Point]:
    """The checkpoint sites (``sites.checkpoint_sites``) whose file had an older version completed
    before it in the fault-free run."""
    anchors = Anchors(traces, facts.stable)
    records = op_records(traces)
    versions = atrest.file_versions(records, atrest.trace_root(records))
    return [anchors.at_completer(ev, "stale", rel, step) for ev, rel, step in checkpoint_sites(job, traces, facts)
            if older_versions(rel, versions, ev.get("ts", 0.0))]


def older_versions(rel: str, versions: dict[str, list[atrest.Version]], before: float) -> list[atrest.Version]:
    """The versions of ``rel`` completed before ``before``, newest first: of ``rel`` itself (a file
    saved again under its name), then of the file of its name in another checkpoint directory of
    the same pattern (``checkpoint-4/model.pt`` for ``checkpoint-8/model.pt``, as the built-in's
    stale copy takes the older sibling directory's file). Called by :func:`stale` and ``pointset``."""
    same = [v for v in versions.get(rel, []) if v.ts < before]
    parent, name = os.path.split(rel)
    siblings = [v for other, vs in versions.items() if other != rel and parent
                and os.path.basename(other) == name and os.path.dirname(other) != parent
                and atrest.digit_key(os.path.dirname(other)) == atrest.digit_key(parent) for v in vs if v.ts < before]
    return sorted(same, key=lambda v: -v.ts) + sorted(siblings, key=lambda v: -v.ts)


def apply(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int, _prepared: Any = None) -> Applied:
    """Replace the file the point's event completed by an older version of it from the same run
    (:func:`older_versions`): the newest whose bytes differ, taken from {out} where it is still
    there (another checkpoint directory's file), else rebuilt from attempt 0's trace up to the halt
    (:func:`atrest.file_versions`). Skipped where the run completed no older version, where every older one
    is byte for byte the same, or where the trace cannot rebuild the file (a writer it does not see)."""
    site = atrest.site_file(point, halt, out, seed, "replace by an older version")
    if isinstance(site, Applied):
        return site
    rel, base = site
    s = base["seed"]
    path = os.path.join(out, rel)
    cut = halt.get("ts")
    records = atrest.merged_records(scratch, 0, cut)
    versions = atrest.file_versions(records, atrest.trace_root(records) or os.path.realpath(out))
    with open(path, "rb") as f:
        current = f.read()
    mine = versions.get(rel, [])
    if not mine:
        return Applied(f"stale {rel}", base, outcome="unsupported", excluded=[rel],
                       skipped=f"no traced event completed {rel} before the halt: its versions cannot be known")
    latest = mine[-1]
    olders = older_versions(rel, versions, latest.ts)
    if not olders:
        return Applied(f"stale {rel}", base, excluded=[rel],
                       skipped=f"{rel} has no older version in this run: it was completed once, and no other "
                               "checkpoint directory holds a file of its name")
    unknown: list[str] = []
    for v in olders:
        src_path = os.path.join(out, v.rel)
        if v.rel != rel and os.path.isfile(src_path):
            with open(src_path, "rb") as f:
                data, source = f.read(), "on disk"
        elif v.data is not None and (v.rel != rel or latest.data == current):
            data, source = v.data, "rebuilt from the trace"
        else:
            unknown.append(f"{v.rel} of rank {v.rank}'s event {v.ord}: "
                           + (v.why or "the trace does not explain the file's bytes now (a writer it does not see)"))
            continue
        if data == current:
            continue
        aside = os.path.join(scratch, "stale-source", v.rel)
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        with open(aside, "wb") as f:
            f.write(data)
        rec = C.stale_copy(path, aside, scratch_root=scratch)
        rec.seed = s
        record = {**base, "corruption": atrest.relative(rec.to_dict(), out),
                  "source": {"file": v.rel, "rank": v.rank, "event": v.ord, "bytes": len(data), "from": source}}
        record["corruption"]["params"]["source"] = v.rel
        older = "its older version" if v.rel == rel else f"the older {v.rel}"
        return Applied(f"{rel}: replaced by {older} (completed at rank {v.rank}'s event {v.ord}; {len(data)} bytes, "
                       f"{source}, where it held {len(current)}) {atrest.when(point)}", record, excluded=[rel])
    if unknown:
        return Applied(f"stale {rel}", base, outcome="unsupported", excluded=[rel],
                       skipped=f"{rel}: no older version's bytes are known: {'; '.join(unknown[:3])}")
    return Applied(f"stale {rel}", base, excluded=[rel],
                   skipped=f"{rel}: every older version ({len(olders)}) is byte for byte what it holds now")


FAMILY = AtRestFamily(name="stale", points=points, apply=apply,
                      not_offered="no checkpoint file was completed again after an earlier version of it (saved "
                                  "again under its name, or in another checkpoint directory of the same name)")
