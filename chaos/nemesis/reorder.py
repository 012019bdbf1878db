"""``reorder``: a file's writes reaching the disk out of order, then the power goes.

Data a job writes and never fsyncs sits in the page cache until writeback flushes it, and
writeback keeps no promise about order: it flushes dirty pages by their place in the file,
and several flushers race. So after a power cut a file may hold a *later* write and not an
earlier one — the commit footer without the body it commits, the second half of a tensor
without the first. The power family's crash states (``faults.crashstate``) keep a prefix of
each file's pending writes, in write order; this family is the state that model leaves out.

Where (``points``): at the event that completed a checkpoint file (its close, or the rename
that put it in place), and at the first step announced after it (the job trusts the file),
when that file had two or more writes pending (since its last fsync) and dropping one of
them, the later ones kept, changes its bytes. What (``apply``): with
every copy stopped there, the file is rebuilt from the trace as the disk would hold it: its
bytes at its last fsync (nothing, for a file created since), every pending write but one
applied in order; which one is drawn with the point's seed among those whose loss changes
something. Everything else under {out} stays as it was (the flushers got to it). The file's
writes must all be in the trace with their bytes; a file that existed before it, or a write
whose bytes were not kept, makes the point skipped with the reason.

A job that writes its checkpoint to a temp file, fsyncs it and only then renames it into
place never has a pending write at completion: it is offered no point, and the run says
why. Example: ``rank0:op7:reorder`` on ``ckpt.bin`` written as a 4096-byte body and an
8-byte footer, never fsynced: the body is lost (zeros where it was) and the footer kept;
a loader that trusts the footer reads zeros. And ``torch.save(state, "ckpt.pt")`` with no
fsync: a 9,577-byte zip written in 3 writes lost its second (bytes 704-8703, the tensor's
data) while the zip's directory, written last, survived; ``torch.load(weights_only=True)``
read zeros without a word and the job finished with other weights (silent divergence,
2026-12-06, torch 2.13). The family's protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

from chaos.model.contract import SYNC_OPS
from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis import atrest
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import AtRestFamily
from chaos.nemesis.sites import Anchors, Facts, Traces, checkpoint_sites, op_records


@dataclass
class _File:
    """One file's data as the trace has it: its bytes at its last fsync, its writes since."""

    durable: bytes | None             # None: unknown (the file existed before the trace, or lost bytes)
    pending: list[dict[str, Any]] = field(default_factory=list)  # write records since the last fsync
    why: str = ""


def pending_writes(records: list[dict[str, Any]], upto: float | None = None) -> dict[str, _File]:
    """Path -> its durable bytes and pending writes after the ``op`` records (all ranks, time
    order) up to moment ``upto`` (None: all). A rename moves a file's state with it, a
    directory's files' too; a truncating open or a creation starts a file empty; an fsync of
    it makes everything so far durable. Called by :func:`points` (records without bytes: only
    which writes are pending) and :func:`apply` (with bytes, from ``atrest.merged_records``)."""
    return _Replay(records).advance(upto)


class _Replay:
    """:func:`pending_writes` done once, forward: ``advance(upto)`` applies the records up to moment
    ``upto`` that it has not applied yet, and returns the files as they then are. :func:`points`
    asks at each checkpoint site in time order, so a trace is replayed once, not once a site
    (that was quadratic in the events of a job with many saves)."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self._records = records
        self._next = 0
        self.files: dict[str, _File] = {}
        self._content: dict[str, bytearray | None] = {}

    def advance(self, upto: float | None = None) -> dict[str, _File]:
        while self._next < len(self._records):
            r = self._records[self._next]
            if upto is not None and r.get("ts", 0.0) > upto:
                break
            self._next += 1
            self._apply(r)
        return self.files

    def _apply(self, r: dict[str, Any]) -> None:
        files, content = self.files, self._content
        if r.get("event") != "op" or r.get("error") is not None:
            return
        op, p = r.get("op"), r.get("path")
        if not isinstance(p, str):
            return
        if op == "open" and not r.get("is_dir") and atrest.opens_for_writing(r):
            if r.get("trunc") or r.get("created"):
                files[p], content[p] = _File(b""), bytearray()
            elif p not in files:
                files[p], content[p] = _File(None, why="it existed before any traced event wrote it"), None
        elif op == "write" and p in files:
            f, buf, data, off = files[p], content.get(p), r.get("data"), r.get("offset")
            f.pending.append(r)
            if buf is not None and isinstance(data, bytes) and isinstance(off, int):
                buf.extend(bytes(max(0, off - len(buf))))
                buf[off:off + len(data)] = data
            elif buf is not None and "data" in r:
                content[p], f.why = None, "the trace kept no bytes of one of its writes"
        elif op == "truncate" and p in files:
            files[p].why = files[p].why or "it was truncated while writes were pending"
            buf, n = content.get(p), r.get("length")
            if buf is not None and isinstance(n, int):
                del buf[n:]
            files[p].durable = None
        elif op in SYNC_OPS and p in files:
            buf = content.get(p)
            files[p] = _File(None if buf is None else bytes(buf), why=files[p].why if buf is None else "")
        elif op == "rename":
            src, dst = r.get("src"), r.get("dst") or p
            if isinstance(src, str) and isinstance(dst, str):
                for k in [k for k in files if atrest.under(k, src)]:
                    new = dst + k[len(src):]
                    files[new], content[new] = files.pop(k), content.pop(k, None)
        elif op == "unlink":
            files.pop(p, None)
            content.pop(p, None)


def _effective(f: _File) -> list[int]:
    """Indexes of the pending writes (all but the last) whose loss, the later ones kept, changes
    some byte: a write entirely overwritten by later ones changes nothing when lost."""
    out = []
    for i, w in enumerate(f.pending[:-1]):
        off, n = w.get("offset"), w.get("length") or len(w.get("data") or b"")
        if not isinstance(off, int) or not n:
            continue
        covered = [(x.get("offset"), x.get("offset") + (x.get("length") or 0)) for x in f.pending[i + 1:]
                   if isinstance(x.get("offset"), int)]
        left = [(off, off + n)]
        for a, b in covered:
            left = [piece for s, e in left for piece in ((s, min(e, a)), (max(s, b), e)) if piece[0] < piece[1]]
        if left:
            out.append(i)
    return out


def points(job: JobSpec, traces: Traces, facts: Facts) -> list[Point]:
    """The checkpoint sites (``sites.checkpoint_sites``: each file's completing event, and each
    version's first step after, when the job trusts it) where the file had two or more writes
    pending at completion, one of which matters when lost. (At a later step they may have been
    fsynced since: that point is skipped with the reason when it runs.)"""
    anchors = Anchors(traces, facts.stable)
    records = op_records(traces)
    root = atrest.trace_root(records)
    sites = list(checkpoint_sites(job, traces, facts)) if root is not None else []
    replay = _Replay(records)
    found: dict[int, Point] = {}
    for i in sorted(range(len(sites)), key=lambda i: sites[i][0].get("ts", 0.0)):  # one pass, in time order
        ev, rel, step = sites[i]
        f = replay.advance(ev.get("ts", 0.0)).get(os.path.join(root, rel))  # type: ignore[arg-type]
        if f is not None and _effective(f):
            found[i] = anchors.at_completer(ev, "reorder", rel, step)
    return [found[i] for i in sorted(found)]


def _range(w: dict[str, Any]) -> str:
    off = w.get("offset") or 0
    return f"bytes {off}-{off + (w.get('length') or 0) - 1}"


def apply(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int, _prepared: Any = None) -> Applied:
    """Rebuild the file the point's event completed as the disk would hold it with one pending
    write lost and the later ones kept (the one drawn with the point's seed)."""
    site = atrest.site_file(point, halt, out, seed, "reorder the writes of")
    if isinstance(site, Applied):
        return site
    rel, base = site
    records = atrest.merged_records(scratch, 0, halt.get("ts"))
    root = atrest.trace_root(records) or os.path.realpath(out)
    f = pending_writes(records).get(os.path.join(root, rel))
    if f is None or len(f.pending) < 2:
        return Applied(f"reorder of {rel}", base, excluded=[rel],
                       skipped=f"{rel} had {0 if f is None else len(f.pending)} write(s) pending when the job stopped "
                               "(fsynced since, or written in one call): no order to lose")
    if f.durable is None:
        return Applied(f"reorder of {rel}", base, outcome="unsupported", excluded=[rel],
                       skipped=f"{rel}: its bytes cannot be rebuilt from the trace ({f.why or 'unknown bytes'})")
    choices = _effective(f)
    if not choices:
        return Applied(f"reorder of {rel}", base, excluded=[rel],
                       skipped=f"{rel}: every pending write but the last is overwritten by later ones: losing one "
                               "changes nothing")
    lost = random.Random(base["seed"]).choice(choices)
    buf = bytearray(f.durable)
    for i, w in enumerate(f.pending):
        if i == lost:
            continue
        data, off = w.get("data"), w.get("offset")
        if not isinstance(data, bytes) or not isinstance(off, int):
            return Applied(f"reorder of {rel}", base, outcome="unsupported", excluded=[rel],
                           skipped=f"{rel}: the trace kept no bytes of its write at event {w.get('ord')}")
        buf.extend(bytes(max(0, off - len(buf))))
        buf[off:off + len(data)] = data
    path = os.path.join(out, rel)
    with open(path, "rb") as fh:
        before = fh.read()
    if bytes(buf) == before:
        return Applied(f"reorder of {rel}", base, excluded=[rel],
                       skipped=f"{rel}: losing the write at event {f.pending[lost].get('ord')} leaves its bytes as they were")
    with open(path, "wb") as fh:
        fh.write(buf)
    w = f.pending[lost]
    later = f.pending[lost + 1:]
    record = {**base, "pending_writes": len(f.pending), "durable_bytes": len(f.durable),
              "lost": {"event": w.get("ord"), "rank": w.get("rank"), "offset": w.get("offset"), "length": w.get("length")},
              "kept_later": [{"event": x.get("ord"), "offset": x.get("offset"), "length": x.get("length")} for x in later],
              "size_before": len(before), "size_after": len(buf)}
    return Applied(f"{rel}: write {lost + 1} of {len(f.pending)} since its last fsync ({_range(w)}) lost while "
                   f"{len(later)} later one(s) reached the disk (writeback out of order, then a power cut) "
                   f"{atrest.when(point)}; {len(before)} -> {len(buf)} bytes", record, cut_ts=halt.get("ts"))


FAMILY = AtRestFamily(name="reorder", points=points, apply=apply,
                      not_offered="no checkpoint file had two or more writes pending (since its last fsync) when it "
                                  "was completed: writeback order cannot matter (each file fsynced before it is "
                                  "completed, or written in one call)")
