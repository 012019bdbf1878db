"""``payload``: code planted in a file the job completed, in the file's own format.

``faults.payload``'s pickle or torch zip replaces the file the point's event completed
(a pickle, or ``torch.save``'s zip); unpickling it creates a marker file under the point's
scratch folder. The marker is looked for after every restart; the judge's
``no_code_execution`` oracle fails where it appeared (``torch.load(weights_only=False)``,
``pickle.load``), and a payload no process read again tested nothing (skipped). The
family's protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import os
import re
from typing import Any

from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis import atrest
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import AtRestFamily
from chaos.nemesis.sites import Anchors, Facts, Traces, checkpoint_sites
from faults import FaultError

MARKERS = "payload-markers"  # in a point's scratch folder: where a planted payload's marker would appear


def gather(out: str, _scratch: str, facts: Facts) -> None:
    """Which files the fault-free run left speak a payload format (``Facts.formats``)."""
    facts.formats = {rel: fmt for rel in facts.files if (fmt := payload_format(os.path.join(out, rel)))}


def points(job: JobSpec, traces: Traces, facts: Facts) -> list[Point]:
    """The checkpoint sites whose file is a pickle or a torch zip at the end of the fault-free run
    (or, rotated away by then, a file of its name but for its numbers is)."""
    anchors = Anchors(traces, facts.stable)
    by_key: dict[str, str] = {}
    for rel, fmt in facts.formats.items():
        by_key.setdefault(atrest.digit_key(rel), fmt)
    return [anchors.at_completer(ev, "payload", rel, step) for ev, rel, step in checkpoint_sites(job, traces, facts)
            if rel in facts.formats or atrest.digit_key(rel) in by_key]


def payload_format(path: str) -> str | None:
    """The payload format a file speaks: ``torchzip`` for a zip (``torch.save``'s format), ``pickle``
    for a pickle or a DCP data file with byte items; None for anything else (JSON, safetensors...:
    its loader unpickles nothing). Called by :func:`payload` and ``pointset.gather``."""
    from faults.payload import speaks

    if not speaks(path, "pickle"):
        return None
    with open(path, "rb") as f:
        return "torchzip" if f.read(4) == b"PK\x03\x04" else "pickle"


def apply(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int, _prepared: Any = None) -> Applied:
    """Plant ``faults.payload``'s payload in the file the point's event completed, in the file's own
    format (:func:`payload_format`): loading it creates a marker under ``scratch``/``MARKERS``, which
    ``explore`` looks for after every restart (:func:`check_marker`) and the judge's
    ``no_code_execution`` oracle reads. A file that is no pickle and no torch zip is skipped."""
    site = atrest.site_file(point, halt, out, seed, "plant a payload in")
    if isinstance(site, Applied):
        return site
    rel, base = site
    return plant_in(point, out, scratch, rel, base["seed"])


def plant_in(point: Point, out: str, scratch: str, rel: str, s: int, fmt: str | None = None,
             variant: str | None = None) -> Applied:
    """Plant the payload in ``rel`` with seed ``s``: in ``fmt`` where the caller says (the built-in
    ``ckpt:stepS:payload,format=...``, ``chaos.nemesis.newest``), else in the file's own format, and
    skipped where it has none. Its marker goes under ``scratch``/``MARKERS``."""
    from faults import payload as P

    base = {"family": "payload", "file": rel, "seed": s}
    path = os.path.join(out, rel)
    fmt = fmt or payload_format(path)
    if fmt is None:
        with open(path, "rb") as f:
            head = f.read(8)
        return Applied(f"payload in {rel}", base, outcome="unsupported", excluded=[rel],
                       skipped=f"{rel} is neither a pickle nor a torch zip (it starts {head!r}): its loader "
                               "unpickles nothing, so no payload can be planted in its own format")
    marker_dir = os.path.join(scratch, MARKERS)
    os.makedirs(marker_dir, exist_ok=True)
    marker = os.path.join(marker_dir, re.sub(r"[^\w.-]", "_", point.id))
    size = os.path.getsize(path)
    try:
        rec = P.plant(path, fmt, marker, seed=s, scratch_root=out, marker_root=scratch, variant=variant)
    except FaultError as exc:
        return Applied(f"payload in {rel}", base, skipped=f"{rel}: {exc}", outcome="unsupported", excluded=[rel])
    record = {**base, "format": fmt, "corruption": atrest.relative(rec.to_dict(), out),
              "marker": {"path": marker, "exists": os.path.exists(marker), "checks": [], "first_seen": None}}
    if not rec.changed:
        return Applied(f"payload in {rel}", record, skipped=f"{rel}: the payload is byte for byte what was there",
                       excluded=[rel])
    return Applied(f"{rel}: a {fmt} payload planted in place of its {size} bytes {atrest.when(point)} (loading it "
                   f"runs code that creates the marker {os.path.basename(marker)})", record, excluded=[rel])


def check_marker(applied: Applied, when: str) -> None:
    """Whether a planted payload has run so far (its marker exists), recorded in ``applied.record``'s
    ``marker`` (``checks``, ``exists``, ``first_seen``). Called by ``explore`` after every attempt
    that follows the planting, and once more after the last."""
    m = applied.record.get("marker")
    if not isinstance(m, dict):
        return
    exists = os.path.exists(m["path"])
    m["checks"].append({"after": when, "exists": exists})
    if exists and m.get("first_seen") is None:
        m["first_seen"] = when
    m["exists"] = bool(m.get("exists")) or exists


def _reads(r: dict[str, Any]) -> bool:
    mode = r.get("mode")
    if isinstance(mode, str):
        return "r" in mode or "+" in mode
    return "wronly" not in (r.get("flags") or ())


def payload_reads(applied: Applied, traces: dict[tuple[int, int], list[dict[str, Any]]], since: int) -> None:
    """Record which traced processes opened the planted file to read it in attempts ``since`` and later
    (the restarts), and make the point *idle* (``Applied.idle``: skipped as no_effect if every other
    oracle passes) where none did and the marker never appeared: the resume never read the file, so
    the payload tested nothing. Called by ``explore`` after a payload point's last attempt."""
    rel = applied.record.get("file")
    opened = [{"rank": rk, "attempt": a, "event": r.get("ord"), "via": r.get("via")}
              for (rk, a), recs in sorted(traces.items()) if a >= since for r in recs
              if r.get("rel") == rel and (r.get("event") == "read" or r.get("event") == "op" and r.get("op") == "open"
                                          and r.get("error") is None and not r.get("is_dir") and _reads(r))]
    applied.record["opened_after_planting"] = opened[:20]
    marker = applied.record.get("marker") or {}
    if not opened and not marker.get("exists"):
        applied.idle = (f"no traced process opened {rel} after the payload was planted, and its marker never "
                        "appeared: the resume never read the file (it loaded another checkpoint, or started "
                        "over), so the payload tested nothing")


def _watch(applied: Applied, attempt: int) -> None:
    check_marker(applied, f"attempt {attempt}")


def _settle(applied: Applied, traces: Traces) -> None:
    payload_reads(applied, traces, since=1)


FAMILY = AtRestFamily(name="payload", points=points, apply=apply, gather=gather, watch=_watch, settle=_settle,
                      not_offered="no checkpoint file the job left is a pickle or a torch zip (torch.save), so "
                                  "nothing it loads unpickles")
