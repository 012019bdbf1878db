"""What the harness does to a job's {out} between a halted attempt and its restart.

Called by ``explore.run_chain`` after attempt 0 of a corruption or power-loss point
stopped every copy right after rank R's event N (``inproc.JobInterposer._halt``).
Each function edits {out} in place and returns an :class:`Applied` record (what was
done, exactly, with the seed), or a reason why the fault would change nothing or
cannot be made, which makes the point *skipped*, never passed.

- :func:`corrupt` — one seeded ``faults.corrupt`` family on the file event N completed
  (right after it, or for ``rankR:opN:MODE:stepS`` once rank R announced step S):
  ``bitflip`` (one bit, anywhere in the file), ``truncate`` (to a seeded length shorter
  than the file), ``zero`` (up to 64 bytes from a seeded offset), ``delete``. Example:
  ``rank0:op14:bitflip`` on a 71-byte ``ckpt.json`` with seed 3 might flip bit 5 of
  byte 40, recorded as ``changes: [{"start": 40, "end": 41, "old": "36", "new": "16"}]``.
- :func:`power_loss` — {out} replaced by a power-loss crash state
  (``faults.crashstate.CrashModel``) of the merged attempt-0 traces of every rank up to
  the moment rank R halted: the state where every pending change is lost (data written
  since its file's last fsync, directory entries created, renamed or removed since
  their directory's last fsync) or, for ``rankR:opN:power:sK``, the k-th of the cut's
  other distinct states (some of it kept: a file's data without its directory entry, an
  entry without its data, a write torn), in an order drawn with the point's seed; a cut
  with fewer makes that point skipped. The base is {out} as it was before attempt 0. A trace
  the model cannot represent (``FaultError``) is a skip with the model's reason; so is
  a moment when nothing was pending (the state is what a kill leaves: the ``after``
  point of the same event covers it). The job's TMPDIR is emptied too, as a reboot
  empties /tmp. A file under {out} whose bytes at the cut no traced event explains
  (a native writer the tracer does not see) is no part of the model: it is left as it
  was at the cut (a state a power loss can leave whether or not its writer synced it),
  never dropped in silence, and the record (``untraced``) and the line name it.
- :func:`pending_after` — for the enumeration: after which events of the fault-free
  run a power loss would lose anything at all.
- :func:`untraced_changes` — for every point's record (``explore``): the files an
  attempt changed under {out} that no traced event explains, by name and size.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from chaos.model.jobspec import Point
from faults import FaultError
from faults import corrupt as C
from faults.crashstate import CrashModel, Snapshot, clear, merge_traces
from faults.interposer import read_trace

ZERO_BYTES = 64  # a zero corruption blanks up to this many bytes
MIXED_EXHAUSTIVE = 4096  # a power point's mixed state: every crash state looked at up to this many in all,
MIXED_SAMPLES = 256      # else this many drawn with the point's seed


@dataclass
class Applied:
    """What a harness-side fault did (``record``), or why it was not done (``skipped``)."""

    what: str                                   # one line for the verdict's summary
    record: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None                  # the reason the point is skipped
    outcome: str = "no_effect"                  # the skipped point's outcome: no_effect | unsupported
    excluded: list[str] = field(default_factory=list)  # files (under {out}) no longer to be relied on
    cut_ts: float | None = None                 # power loss: acknowledgements after this never happened
    # a fault that may have done nothing (a full disk no traced event hit, the job unharmed): judged
    # as any point, and *skipped* with this reason (no_effect) only if every oracle passes
    idle: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"what": self.what, **self.record}
        if self.skipped:
            d["skipped"] = self.skipped
        if self.excluded:
            d["excluded"] = self.excluded
        return d


def point_seed(seed: int, point: Point) -> int:
    """The seed of one point's fault: the run's ``--seed`` and the point's id, nothing else."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{point.id}".encode()).digest()[:4], "big")


def halt_record(traces: dict[tuple[int, int], list[dict[str, Any]]], rank: int) -> dict[str, Any] | None:
    """The ``halt`` record of rank ``rank`` in attempt 0 (the moment and event it stopped at)."""
    return next((r for r in traces.get((rank, 0), []) if r.get("event") == "fired" and r.get("action") == "halt"),
                None)


def _target(point: Point, halt: dict[str, Any], out: str) -> str | None:
    """The file to corrupt: the point's file, else what the halted event completed."""
    if point.path:
        return point.path
    path = halt.get("dst") or halt.get("path")
    root = os.path.realpath(out)
    if isinstance(path, str) and path.startswith(root + os.sep):
        return os.path.relpath(path, root)
    return None


def corrupt(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int) -> Applied:
    """Corrupt the file rank ``point.rank``'s event ``point.op`` completed, with ``point.mode``'s family."""
    rel = _target(point, halt, out)
    if rel is None:
        return Applied(f"{point.mode} of nothing", skipped=f"event {point.op} ({halt.get('op')}) completed no file "
                       "under {out}: nothing to corrupt")
    path = os.path.join(out, rel)
    s = point_seed(seed, point)
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
        return Applied(f"{rel}: {_describe(point.mode, rec)} at rest, once rank {point.rank} announced step "
                       f"{point.at_step} (event {point.op} completed it)", record, excluded=[rel])
    return Applied(f"{rel}: {_describe(point.mode, rec)} after event {point.op} completed it", record,
                   excluded=[rel])


def _describe(family: str, rec: C.CorruptionRecord) -> str:
    p = rec.params
    if family == "bitflip":
        return ", ".join(f"bit {b} of byte {o} flipped" for o, b in p["bits"])
    if family == "truncate":
        return f"truncated from {rec.size_before} to {rec.size_after} bytes"
    if family == "zero":
        return f"bytes [{p['start']}, {p['end']}) zeroed"
    return f"deleted ({rec.size_before} bytes)"


# -- stale, swap, payload: at-rest faults of a completed file, each its own --faults kind

MARKERS = "payload-markers"  # in a point's scratch folder: where a planted payload's marker would appear
_DIGITS = re.compile(r"\d+")


def digit_key(rel: str) -> str:
    """``rel`` with every run of digits as ``*``: ``ckpt-rank1-6.pt`` -> ``ckpt-rank*-*.pt`` (the same
    file of another save or another rank)."""
    return _DIGITS.sub("*", rel)


def _when(point: Point) -> str:
    if point.at_step is None:
        return f"after event {point.op} completed it"
    return f"at rest, once rank {point.rank} announced step {point.at_step} (event {point.op} completed it)"


@dataclass
class Version:
    """One completed version of a file under {out} (:func:`file_versions`): who completed it, when,
    and its bytes as the trace rebuilds them (None: the trace cannot, ``why`` says why)."""

    rel: str
    rank: int
    ord: int | None
    ts: float
    data: bytes | None = None
    why: str | None = None


def trace_root(records: Iterable[dict[str, Any]]) -> str | None:
    """{out} as the records' absolute paths spell it (the prefix ``read_traces`` cut off as ``rel``)."""
    for r in records:
        rel, path = r.get("rel"), r.get("path")
        if rel and isinstance(path, str) and path.endswith(os.sep + rel):
            return path[: len(path) - len(rel) - 1]
    return None


def file_versions(records: list[dict[str, Any]], root: str | None) -> dict[str, list[Version]]:
    """Every version of every file under ``root`` ({out}) that the traced events completed, in time
    order: a close after the file changed, or a rename (or link) that put it, or a directory holding
    it, in place. Each version's bytes are rebuilt by replaying the writes, truncations and moves of
    ``records`` (all ranks, one attempt, in time order, each with ``rank``): exact where every write
    kept its data (``merged_records``), None where one did not or the file existed before any traced
    event (``why``). Called by :func:`stale` and :func:`swap` on a point's attempt 0 up to its halt,
    and by ``pointset`` (records without data) to know which files had an older version, and which
    rank completed each, in the fault-free run.
    """
    bufs: dict[str, bytearray | None] = {}
    why: dict[str, str] = {}
    dirty: set[str] = set()
    found: dict[str, list[Version]] = {}

    def rel_of(path: Any) -> str | None:
        if root and isinstance(path, str) and path.startswith(root + os.sep):
            return path[len(root) + 1:]
        return None

    def under(k: str, top: str) -> bool:
        return k == top or k.startswith(top.rstrip(os.sep) + os.sep)

    def done(path: str, r: dict[str, Any]) -> None:
        rel = rel_of(path)
        if rel is None:
            return
        b = bufs.get(path)
        found.setdefault(rel, []).append(Version(rel, int(r.get("rank") or 0), r.get("ord"), float(r.get("ts") or 0.0),
                                                 None if b is None else bytes(b),
                                                 None if b is not None else why.get(path, "unknown bytes")))

    def lose(path: str, reason: str) -> None:
        bufs[path] = None
        why[path] = reason

    for r in records:
        if r.get("event") != "op" or r.get("error") is not None:
            continue
        op, p = r.get("op"), r.get("path")
        if not isinstance(p, str):
            continue
        if op == "open" and not r.get("is_dir"):
            if opens_for_writing(r):
                if r.get("trunc") or r.get("created"):
                    bufs[p] = bytearray()
                    dirty.add(p)
                elif p not in bufs:
                    lose(p, "it existed before any traced event wrote it")
        elif op == "write":
            b, data, off = bufs.get(p), r.get("data"), r.get("offset")
            if p not in bufs:
                lose(p, "it existed before any traced event wrote it")
            elif b is not None and (data is None or off is None):
                lose(p, "the trace kept no data of one of its writes")
            elif b is not None:
                if len(b) < off:
                    b.extend(bytes(off - len(b)))
                b[off:off + len(data)] = data
            dirty.add(p)
        elif op == "truncate":
            b, n = bufs.get(p), r.get("length")
            if b is not None and isinstance(n, int):
                del b[n:]
                b.extend(bytes(max(0, n - len(b))))
            dirty.add(p)
        elif op == "close":
            if p in dirty:
                dirty.discard(p)
                done(p, r)
        elif op in ("rename", "link"):
            src, dst = r.get("src"), r.get("dst") or p
            if not isinstance(dst, str):
                continue
            moved = {k: v for k, v in bufs.items() if isinstance(src, str) and under(k, src)}
            for k in [k for k in bufs if under(k, dst)]:
                del bufs[k]
            for k, v in moved.items():
                new = dst + k[len(src):]  # type: ignore[arg-type]
                if op == "rename":
                    bufs.pop(k, None)
                bufs[new] = None if v is None else bytearray(v)
                if v is None:
                    why[new] = why.get(k, "unknown bytes")
                done(new, r)
            if not moved and r.get("src_kind") != "dir":
                data = r.get("data")
                if isinstance(data, bytes):
                    bufs[dst] = bytearray(data)
                else:
                    lose(dst, "it was moved into place from a file no traced event wrote")
                done(dst, r)
        elif op in ("unlink", "rmdir"):
            for k in [k for k in bufs if under(k, p)]:
                del bufs[k]
            dirty.discard(p)
    return found


def older_versions(rel: str, versions: dict[str, list[Version]], before: float) -> list[Version]:
    """The versions of ``rel`` completed before ``before``, newest first: of ``rel`` itself (a file
    saved again under its name), then of the file of its name in another checkpoint directory of
    the same pattern (``checkpoint-4/model.pt`` for ``checkpoint-8/model.pt``, as the built-in's
    stale copy takes the older sibling directory's file). Called by :func:`stale` and ``pointset``."""
    same = [v for v in versions.get(rel, []) if v.ts < before]
    parent, name = os.path.split(rel)
    siblings = [v for other, vs in versions.items() if other != rel and parent
                and os.path.basename(other) == name and os.path.dirname(other) != parent
                and digit_key(os.path.dirname(other)) == digit_key(parent) for v in vs if v.ts < before]
    return sorted(same, key=lambda v: -v.ts) + sorted(siblings, key=lambda v: -v.ts)


def swap_partners(rel: str, rank: int, completers: dict[str, int], files: Iterable[str]) -> list[str]:
    """Files of ``files`` that are another rank's file of the same checkpoint as ``rel`` (completed by
    ``rank``): the same name but for one run of digits, last completed by another rank
    (``completers``); those whose differing number is each file's own rank first (``rank0.pt`` and
    ``rank1.pt``), when any are. Never two saves of one rank (``ckpt-3.pt``, ``ckpt-6.pt``).
    Called by :func:`swap` (the files under {out} at the halt) and ``pointset`` (the fault-free run)."""
    mine = _DIGITS.findall(rel)
    found: list[tuple[bool, str]] = []
    for f in sorted(set(files)):
        other = completers.get(f)
        if f == rel or other is None or other == rank or digit_key(f) != digit_key(rel):
            continue
        theirs = _DIGITS.findall(f)
        diff = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if int(a) != int(b)]
        if len(diff) != 1:
            continue
        i = diff[0]
        found.append((int(mine[i]) == rank and int(theirs[i]) == other, f))
    best = [f for ok, f in found if ok]
    return best or [f for _ok, f in found]


def _site_file(point: Point, halt: dict[str, Any], out: str, seed: int,
               what: str) -> tuple[str, dict[str, Any]] | Applied:
    """The file the point strikes and the start of its record (family, file, the point's seed), or
    the Applied that skips it (no file, or none there now). Called by :func:`stale`, :func:`swap`
    and :func:`payload`."""
    rel = _target(point, halt, out)
    if rel is None:
        return Applied(f"{point.mode} of nothing", skipped=f"event {point.op} ({halt.get('op')}) completed no "
                       f"file under {{out}}: nothing to {what}")
    if not os.path.isfile(os.path.join(out, rel)):
        return Applied(f"{point.mode} of {rel}", {"family": point.mode, "file": rel},
                       skipped=f"{rel} was absent when the job stopped {_when(point)}: nothing to {what}",
                       excluded=[rel])
    return rel, {"family": point.mode, "file": rel, "seed": point_seed(seed, point)}


def _relative(record: dict[str, Any], out: str) -> dict[str, Any]:
    """A corruption record with its absolute paths (under {out}) made relative to {out}."""
    root = os.path.realpath(out)

    def rel(x: Any) -> Any:
        return os.path.relpath(x, root) if isinstance(x, str) and x.startswith(root + os.sep) else x

    record["path"] = rel(record.get("path"))
    record["params"] = {k: rel(v) for k, v in (record.get("params") or {}).items()}
    if isinstance(record.get("other"), dict):
        record["other"] = _relative(record["other"], out)
    return record


def payload_format(path: str) -> str | None:
    """The payload format a file speaks: ``torchzip`` for a zip (``torch.save``'s format), ``pickle``
    for a pickle or a DCP data file with byte items; None for anything else (JSON, safetensors...:
    its loader unpickles nothing). Called by :func:`payload` and ``pointset.gather``."""
    from faults.payload import speaks

    if not speaks(path, "pickle"):
        return None
    with open(path, "rb") as f:
        return "torchzip" if f.read(4) == b"PK\x03\x04" else "pickle"


def payload(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int) -> Applied:
    """Plant ``faults.payload``'s payload in the file the point's event completed, in the file's own
    format (:func:`payload_format`): loading it creates a marker under ``scratch``/``MARKERS``, which
    ``explore`` looks for after every restart (:func:`check_marker`) and the judge's
    ``no_code_execution`` oracle reads. A file that is no pickle and no torch zip is skipped."""
    from faults import payload as P

    site = _site_file(point, halt, out, seed, "plant a payload in")
    if isinstance(site, Applied):
        return site
    rel, base = site
    s = base["seed"]
    path = os.path.join(out, rel)
    fmt = payload_format(path)
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
        rec = P.plant(path, fmt, marker, seed=s, scratch_root=out, marker_root=scratch)
    except FaultError as exc:
        return Applied(f"payload in {rel}", base, skipped=f"{rel}: {exc}", outcome="unsupported", excluded=[rel])
    record = {**base, "format": fmt, "corruption": _relative(rec.to_dict(), out),
              "marker": {"path": marker, "exists": os.path.exists(marker), "checks": [], "first_seen": None}}
    if not rec.changed:
        return Applied(f"payload in {rel}", record, skipped=f"{rel}: the payload is byte for byte what was there",
                       excluded=[rel])
    return Applied(f"{rel}: a {fmt} payload planted in place of its {size} bytes {_when(point)} (loading it "
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


def stale(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int) -> Applied:
    """Replace the file the point's event completed by an older version of it from the same run
    (:func:`older_versions`): the newest whose bytes differ, taken from {out} where it is still
    there (another checkpoint directory's file), else rebuilt from attempt 0's trace up to the halt
    (:func:`file_versions`). Skipped where the run completed no older version, where every older one
    is byte for byte the same, or where the trace cannot rebuild the file (a writer it does not see)."""
    site = _site_file(point, halt, out, seed, "replace by an older version")
    if isinstance(site, Applied):
        return site
    rel, base = site
    s = base["seed"]
    path = os.path.join(out, rel)
    cut = halt.get("ts")
    records = merged_records(scratch, 0, cut)
    versions = file_versions(records, trace_root(records) or os.path.realpath(out))
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
        record = {**base, "corruption": _relative(rec.to_dict(), out),
                  "source": {"file": v.rel, "rank": v.rank, "event": v.ord, "bytes": len(data), "from": source}}
        record["corruption"]["params"]["source"] = v.rel
        older = "its older version" if v.rel == rel else f"the older {v.rel}"
        return Applied(f"{rel}: replaced by {older} (completed at rank {v.rank}'s event {v.ord}; {len(data)} bytes, "
                       f"{source}, where it held {len(current)}) {_when(point)}", record, excluded=[rel])
    if unknown:
        return Applied(f"stale {rel}", base, outcome="unsupported", excluded=[rel],
                       skipped=f"{rel}: no older version's bytes are known: {'; '.join(unknown[:3])}")
    return Applied(f"stale {rel}", base, excluded=[rel],
                   skipped=f"{rel}: every older version ({len(olders)}) is byte for byte what it holds now")


def swap(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int) -> Applied:
    """Swap the file the point's event completed with another rank's file of the same checkpoint
    (:func:`swap_partners`: ``rank0.pt`` <-> ``rank1.pt``), chosen with the point's seed among the
    files under {out} at the halt. Skipped where there is none (one rank, or ranks that share one
    file) or the two are byte for byte the same."""
    site = _site_file(point, halt, out, seed, "swap")
    if isinstance(site, Applied):
        return site
    rel, base = site
    s = base["seed"]
    records = merged_records(scratch, 0, halt.get("ts"))
    versions = file_versions(records, trace_root(records) or os.path.realpath(out))
    completers = {f: vs[-1].rank for f, vs in versions.items()}
    completers.setdefault(rel, point.rank)
    on_disk = [os.path.relpath(p, out) for p in _files(out) if os.path.isfile(p) and not os.path.islink(p)]
    partners = swap_partners(rel, completers[rel], completers, on_disk)
    if not partners:
        return Applied(f"swap of {rel}", base, excluded=[rel],
                       skipped=f"no other rank's file of the same checkpoint as {rel} is under {{out}} to swap it "
                               "with (a file of the same name but for its rank's number, completed by that rank)")
    other = random.Random(s).choice(partners)
    rec = C.swap(os.path.join(out, rel), os.path.join(out, other), scratch_root=out)
    rec.seed = s
    record = {**base, "other": other, "other_rank": completers[other], "candidates": partners[:8],
              "corruption": _relative(rec.to_dict(), out)}
    if not rec.changed:
        return Applied(f"swap of {rel} and {other}", record, excluded=[rel, other],
                       skipped=f"{rel} and {other} are byte for byte the same: swapping them changes nothing")
    return Applied(f"{rel} (rank {completers[rel]}) and {other} (rank {completers[other]}) swapped {_when(point)}",
                   record, excluded=[rel, other])


def _trace_files(scratch: str, attempt: int) -> list[str]:
    return sorted(glob.glob(os.path.join(scratch, "trace", f"trace-r*-a{attempt}-p*.jsonl")))


def merged_records(scratch: str, attempt: int = 0, cut_ts: float | None = None) -> list[dict[str, Any]]:
    """Every rank's records of one attempt, with write data, in one order (up to ``cut_ts``)."""
    traces = [read_trace(p, with_data=True) for p in _trace_files(scratch, attempt)]
    merged = merge_traces(traces)
    if cut_ts is not None:
        merged = [r for r in merged if r.get("ts", 0.0) <= cut_ts]
    return merged


def _all_lost(model: CrashModel, seed: int) -> Any:
    """The crash state after the whole trace in which every pending change is lost."""
    last = model.n_prefixes - 1
    states = model.generate(seed=seed, exhaustive_limit=0, samples=2).states
    for st in states:
        if st.prefix == last and all(v == 0 for v in st.dirs.values()) and all(
                tuple(v) == (0, 0) for v in st.data.values()):
            return st
    raise FaultError("the crash model offered no all-pending-lost state of the last prefix")


def power_loss(point: Point, out: str, scratch: str, halt: dict[str, Any], base: Snapshot, seed: int) -> Applied:
    """Replace {out} by the all-pending-lost crash state at rank R's halt; skip if the model cannot.

    A file under {out} that changed in a way no traced event explains (written by a native
    writer the tracer does not see, moved into place from such a file: ``_untraced_at_cut``)
    is no part of the model, whose state would silently drop it. It is left as it was at the
    cut — a state a power loss can leave whether or not its writer synced it — and named in
    the record (``untraced``) and in the line; where the crash state lost its directory, or
    the traced entry that named it, it is gone with them, and the record says so."""
    cut = halt.get("ts")
    s = point_seed(seed, point)
    record: dict[str, Any] = {"seed": s, "cut": {"rank": point.rank, "event": point.op, "op": halt.get("op"),
                                                "ts": cut}, "choice": "all-pending-lost",
                              "base_files": sorted(base.files)}
    try:
        every = merged_records(scratch, 0)
        upto = [r for r in every if cut is None or r.get("ts", 0.0) <= cut]
        model = CrashModel(out, base, upto, seed=s)
        last = model.n_prefixes - 1
        record["combinations_at_cut"] = model.count(last)
        record["ops_replayed"] = len(model.ops)
        if model.count(last) == 1:
            return Applied("power loss with nothing pending", record, cut_ts=cut,
                           skipped=f"nothing was pending after rank {point.rank}'s event {point.op}: a power loss "
                                   f"there leaves what a kill does (point rank{point.rank}:op{point.op}:after)")
        if point.state is not None:
            record["choice"] = f"mixed state {point.state}"
        state = _all_lost(model, s) if point.state is None else _mixed(model, s, point.state)
        if isinstance(state, str):
            return Applied("power loss", record, skipped=state, outcome="no_effect", cut_ts=cut)
        untraced, expected = _untraced_at_cut(out, base, every, upto, model, s)
        if isinstance(untraced, str):
            record["untraced_not_checked"] = untraced
            untraced = []
        before = {os.path.relpath(p, out) for p in _files(out)}
        aside = os.path.join(scratch, "untraced-at-cut")
        for u in untraced:
            if u["size_after"] is not None:
                os.makedirs(os.path.dirname(os.path.join(aside, u["file"])), exist_ok=True)
                shutil.copy2(os.path.join(out, u["file"]), os.path.join(aside, u["file"]))
        clear(out)
        model.materialize(state, out)
        for u in untraced:
            u["kept"] = _restore(out, aside, u, expected)
        shutil.rmtree(aside, ignore_errors=True)
    except FaultError as exc:
        return Applied("power loss", record, skipped=f"the crash-state model cannot represent this trace: {exc}",
                       outcome="unsupported", cut_ts=cut)
    tmp = os.path.join(scratch, "tmp")
    if os.path.isdir(tmp):
        clear(tmp)
    after = {os.path.relpath(p, out) for p in _files(out)}
    record.update(state=state.id, lost=state.lost, files_before=sorted(before), files_after=sorted(after))
    lost = "; ".join(_lost_line(x) for x in state.lost[:4]) + (" ..." if len(state.lost) > 4 else "")
    what = f"power loss right after rank {point.rank}'s event {point.op}: {lost}"
    if untraced:
        record["untraced"] = untraced
        what += "; " + "; ".join(f"{_untraced_one(u)}: {u['kept']}" for u in untraced[:3]) + (
            " ..." if len(untraced) > 3 else "")
    return Applied(what, record, cut_ts=cut)


def _digest_file(path: str) -> bytes:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.digest()


def _untraced_at_cut(out: str, base: Snapshot, every: list[dict[str, Any]], upto: list[dict[str, Any]],
                     model: CrashModel, seed: int) -> tuple[list[dict[str, Any]] | str, set[str]]:
    """The files under {out} at the cut whose bytes differ from what every traced event of the attempt
    (all ranks, the cut's later events too: they happened before every copy stopped) leaves there, and
    the files those events leave. A string instead: why it could not be checked."""
    try:
        full = model if len(upto) == len(every) else CrashModel(out, base, every, seed=seed)
    except FaultError as exc:
        return f"the whole attempt's trace cannot be modelled: {exc}", set()
    last = full.n_prefixes - 1
    kept = full.state(last, *full.extreme_choices(last)[1])  # every traced change made: what the trace explains
    expected = full.file_digests(kept)
    actual = {os.path.relpath(p, out): p for p in _files(out) if os.path.isfile(p) and not os.path.islink(p)}
    odd = sorted(rel for rel in set(actual) | set(expected)
                 if rel not in actual or rel not in expected or _digest_file(actual[rel]) != expected[rel])
    if not odd:
        return [], set(expected)
    _dirs, files = full.contents(kept)
    found = []
    for rel in odd:
        now = os.path.getsize(actual[rel]) if rel in actual else None
        traced = len(files[rel]) if rel in files else None
        how = ("written by no traced event" if traced is None else "removed by no traced event" if now is None
               else "changed by no traced event")
        found.append({"file": rel, "size_before": traced, "size_after": now, "how": how})
    return found, set(expected)


def _restore(out: str, aside: str, u: dict[str, Any], traced: set[str]) -> str:
    """Put an untraced file back as it was at the cut, where the crash state lets it be; what was done."""
    path = os.path.join(out, u["file"])
    if u["size_after"] is None:
        if os.path.lexists(path):
            os.unlink(path)
        return "absent, as it was at the cut"
    if not os.path.isdir(os.path.dirname(path)):
        return "lost with its directory, which the crash state lost"
    if u["file"] in traced and not os.path.lexists(path):
        return "lost with the traced directory entry that named it, which the crash state lost"
    shutil.copy2(os.path.join(aside, u["file"]), path)
    return "kept as it was at the cut (its durability unknown)"


def _size(n: Any) -> str:
    return "absent" if n is None else f"{n} bytes"


def _untraced_one(u: dict[str, Any]) -> str:
    return f"{u['file']} ({_size(u.get('size_before'))} -> {_size(u.get('size_after'))}, {u.get('how')})"


def untraced_line(untraced: list[dict[str, Any]]) -> str:
    """One phrase naming the files no traced event explains (``untraced_changes``), for a verdict line."""
    shown = ", ".join(_untraced_one(u) for u in untraced[:3]) + (" ..." if len(untraced) > 3 else "")
    return f"{len(untraced)} file(s) under {{out}} changed that no traced event explains: {shown}"


def opens_for_writing(r: dict[str, Any]) -> bool:
    """A traced ``open`` record that can change its file (``mode`` with w/a/x/+, or O_WRONLY/O_RDWR).
    Here for ``untraced_changes`` and the judge's ``_track``."""
    mode = r.get("mode")
    if isinstance(mode, str):
        return bool(set(mode) & set("wax+"))
    return bool({"wronly", "rdwr"} & set(r.get("flags") or ()))


def untraced_changes(out: str, records: list[dict[str, Any]], before: dict[str, int]) -> list[dict[str, Any]]:
    """Files under {out} whose size after an attempt no traced event explains, and how each differs.

    Called by ``explore`` on the fault-free run and right after attempt 0 of every point,
    before the harness edits {out}: the record then names a file a native writer the
    tracer does not see changed (HDF5 through h5py, numpy's ``tofile``, a child process),
    with its size before and after, instead of blaming a traced file in its place.
    ``records``: every traced process's records of the attempt (any rank, any order);
    ``before``: {out}'s files before it (relative path -> size). The traced sizes are
    replayed (opens that create or truncate, writes, truncates, renames, unlinks) and
    compared with {out}: a file no traced event wrote or moved in, one whose size differs
    from the traced one, one moved into place from a file no traced event wrote, one gone
    that the trace leaves there. Each entry: ``file``, ``size_before`` (what the trace, or
    the tree before the attempt, leaves; None: absent), ``size_after`` (None: absent), ``how``.
    Sizes, not bytes: a rewrite of the same length by an untraced writer goes unseen here
    (a power loss compares bytes: ``_untraced_at_cut``).
    """
    root = os.path.realpath(out)
    sizes: dict[str, int] = {os.path.join(root, k): v for k, v in before.items()}
    unknown: dict[str, str] = {}  # path -> how it got bytes no traced event wrote

    def drop(top: str) -> None:
        for k in [k for k in sizes if k == top or k.startswith(top + os.sep)]:
            del sizes[k]
        for k in [k for k in unknown if k == top or k.startswith(top + os.sep)]:
            del unknown[k]

    ops = sorted((r for r in records if r.get("event") == "op" and r.get("error") is None), key=lambda r: r.get("ts", 0))
    for r in ops:
        kind, path = r.get("op"), r.get("path")
        if not isinstance(path, str):
            continue
        if kind == "open" and not r.get("is_dir") and opens_for_writing(r):
            if r.get("trunc") or r.get("created"):
                sizes[path] = 0
                unknown.pop(path, None)
        elif kind == "write":
            sizes[path] = max(sizes.get(path, 0), (r.get("offset") or 0) + (r.get("length") or 0))
        elif kind == "truncate":
            sizes[path] = r.get("length") or 0
        elif kind in ("unlink", "rmdir"):
            drop(path)
        elif kind in ("rename", "link"):
            src, dst = r.get("src"), r.get("dst") or path
            if not isinstance(dst, str):
                continue
            moved = {k: v for k, v in sizes.items() if isinstance(src, str) and (k == src or k.startswith(src + os.sep))}
            odd = {k: v for k, v in unknown.items() if isinstance(src, str) and (k == src or k.startswith(src + os.sep))}
            drop(dst)
            if kind == "rename" and isinstance(src, str):
                drop(src)
            for k, v in moved.items():
                sizes[dst + k[len(src):]] = v  # type: ignore[arg-type]
            for k, v in odd.items():
                unknown[dst + k[len(src):]] = v  # type: ignore[arg-type]
            if not moved and not odd:
                if isinstance(r.get("src_size"), int):
                    sizes[dst] = r["src_size"]  # moved in from outside, its bytes kept by the tracer
                elif r.get("src_kind") != "dir":
                    unknown[dst] = (f"moved into place from {_short(src or r.get('src_untraced'), root)}, "
                                    "which no traced event wrote")
    found: list[dict[str, Any]] = []
    on_disk: set[str] = set()
    for p in sorted(_files(root)):
        if not os.path.isfile(p) or os.path.islink(p):
            continue
        on_disk.add(p)
        rel, now = os.path.relpath(p, root), os.path.getsize(p)
        if p in unknown:
            found.append({"file": rel, "size_before": None, "size_after": now, "how": unknown[p]})
        elif p not in sizes:
            found.append({"file": rel, "size_before": before.get(rel), "size_after": now,
                          "how": "written by no traced event"})
        elif sizes[p] != now:
            found.append({"file": rel, "size_before": sizes[p], "size_after": now, "how": "changed by no traced event"})
    for p, n in sorted(sizes.items()):
        if p.startswith(root + os.sep) and p not in on_disk and not os.path.isdir(p):
            found.append({"file": os.path.relpath(p, root), "size_before": n, "size_after": None,
                          "how": "removed by no traced event"})
    return found


def _short(path: Any, root: str) -> str:
    if isinstance(path, str) and path.startswith(root + os.sep):
        return os.path.relpath(path, root)
    return str(path)


def _mixed(model: CrashModel, seed: int, k: int) -> Any:
    """The k-th of the cut's other distinct states (neither everything lost nor nothing lost), in
    an order drawn with ``seed``; a string saying why there is none when the cut has fewer.

    Only states of the cut itself (every traced op issued, then the power goes): all of them
    up to ``MIXED_EXHAUSTIVE`` combinations, else ``MIXED_SAMPLES`` drawn with the seed."""
    last = model.n_prefixes - 1
    total = model.count(last)
    if total <= MIXED_EXHAUSTIVE:
        choices: Iterable[Any] = model.all_choices(last)
    else:
        rng = random.Random(seed)
        choices = (model.random_choice(last, rng) for _ in range(MIXED_SAMPLES))
    worst, kept = (model.fingerprint_choice(last, *ch) for ch in model.extreme_choices(last))
    distinct: dict[str, Any] = {}
    for ch in choices:
        fp = model.fingerprint_choice(last, *ch)
        if fp not in (worst, kept):
            distinct.setdefault(fp, ch)
    mixed = sorted((model.state(last, *ch) for ch in distinct.values()), key=_stable_key)
    mixed = [st for st in mixed if st.lost]
    random.Random(seed).shuffle(mixed)
    if k > len(mixed):
        drawn = "" if total <= MIXED_EXHAUSTIVE else f" ({MIXED_SAMPLES} of them drawn)"
        return (f"the cut's {total} combinations of pending changes{drawn} leave only {len(mixed)} distinct "
                f"crash state(s) besides everything lost and nothing lost (the others leave the same files: "
                f"a change kept or lost there makes no difference to what is on disk); this point asks for "
                f"state {k}")
    return mixed[k - 1]


def _stable_key(st: Any) -> str:
    """An order of crash states that does not depend on inode numbers or on the random names of
    temp files outside {out} (both differ between runs of the same job), only on what each loses."""
    def one(x: dict[str, Any]) -> tuple[str, ...]:
        where = [str(x.get(k)) if not os.path.isabs(str(x.get(k) or "")) else "<outside>" for k in ("path", "src")]
        return (str(x.get("what")), str(x.get("op")), *where, str(x.get("persisted")), str(x.get("pending")),
                str(x.get("torn")))
    return json.dumps(sorted(one(x) for x in st.lost))


def _lost_line(x: dict[str, Any]) -> str:
    if x.get("what") == "data":
        pending, kept = x.get("pending", 0), x.get("persisted", 0)
        if x.get("torn"):
            return f"{x.get('path')}: {kept} of {pending} unsynced byte(s) kept, a write torn"
        ops, ops_kept = x.get("ops_pending"), x.get("ops_persisted")
        if ops is not None and ops_kept is not None and ops_kept > 0:  # some of its changes made it, not all
            return (f"{x.get('path')}: the last {ops - ops_kept} of {ops} unsynced change(s) lost "
                    f"({pending - kept} byte(s))")
        return f"{x.get('path')}: {pending - kept} unsynced byte(s) lost"
    op = x.get("op")
    if op == "rename":
        return f"rename {x.get('src')} -> {x.get('path')} lost (directory not fsynced)"
    return f"{op} of {x.get('path')} lost (directory not fsynced)"


def _files(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _s, files in os.walk(root) for f in files]


def pending_after(out: str, records: list[dict[str, Any]]) -> dict[tuple[int, int], int] | str:
    """(rank, ord) of every event after which a power loss would lose something (fault-free run),
    with how many crash states (combinations) the model counts right after it.

    A string instead: the model's reason why it cannot represent the trace (every event
    then gets a power point, and each is judged, or skipped, at its own cut).
    """
    try:
        model = CrashModel(out, Snapshot(), records)
    except FaultError as exc:
        return str(exc)
    if model.n_prefixes != len(model.ops) + 1:  # some op made no prefix: events cannot be matched to them
        return "the crash-state model skipped some events of the trace"
    found = {}
    for i, rec in enumerate(model.ops):
        if rec.get("ord") is not None and model.count(i + 1) > 1:
            found[(rec.get("rank", 0), rec["ord"])] = model.count(i + 1)
    return found


def empty_out(out: str) -> None:
    """Empty {out} (keeping the directory); used before a restart on a fresh tmpfs copy-back."""
    for name in os.listdir(out):
        p = os.path.join(out, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)
