"""What the harness does to a job's {out} between a halted attempt and its restart.

Called by ``explore.run_chain`` after attempt 0 of a corruption or power-loss point
stopped every copy right after rank R's event N (``inproc.JobInterposer._halt``).
Each function edits {out} in place and returns an :class:`Applied` record (what was
done, exactly, with the seed), or a reason why the fault would change nothing or
cannot be made, which makes the point *skipped*, never passed.

- the at-rest families (``corrupt.py``, ``stale.py``, ``swap.py``, ``payload.py``, each one
  module following :mod:`chaos.nemesis.family`) strike the file event N completed; what
  they share is here: :class:`Applied`, :func:`point_seed`, :func:`site_file` (the file a
  point strikes, or why none), :func:`file_versions` (every version of every file the trace
  completed, with its bytes where the trace kept them);
- the ``power`` and ``reorder`` families (``power.py``, ``reorder.py``) build crash states from
  the merged traces this module reads (:func:`merged_records`);
- :func:`untraced_changes` — for every point's record (``explore``): the files an
  attempt changed under {out} that no traced event explains, by name and size.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chaos.model.jobspec import Point
from faults.crashstate import merge_traces
from faults.interposer import read_trace


@dataclass
class Applied:
    """What a harness-side fault did (``record``), or why it was not done (``skipped``)."""

    what: str                                   # one line for the verdict's summary
    record: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None                  # the reason the point is skipped
    outcome: str = "no_effect"                  # the skipped point's outcome: no_effect | unsupported
    excluded: list[str] = field(default_factory=list)  # files (under {out}) no longer to be relied on
    # ranks whose checkpoint of the step being saved those files belong to (empty: the point's rank):
    # their acknowledgements from that step on no longer count (a swap damages two ranks' files)
    ranks: list[int] = field(default_factory=list)
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
    """The seed of one point's fault: the run's ``--seed`` and the point's own id (a second fault in
    its resume changes nothing of the first), nothing else."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{point.own_id}".encode()).digest()[:4], "big")


def halt_record(traces: dict[tuple[int, int], list[dict[str, Any]]], rank: int,
                attempt: int = 0) -> dict[str, Any] | None:
    """The ``halt`` record of rank ``rank`` in ``attempt`` (the moment and event it stopped at): attempt 0,
    or the restart a second fault halted (``power.in_restart``)."""
    return next((r for r in traces.get((rank, attempt), []) if r.get("event") == "fired"
                 and r.get("action") == "halt"), None)


def target_file(point: Point, halt: dict[str, Any], out: str) -> str | None:
    """The file to corrupt: the one the point's id names (``Point.file``), else the point's file, else
    what the halted event completed."""
    if point.file:
        return point.file
    if point.path:
        return point.path
    path = halt.get("dst") or halt.get("path")
    root = os.path.realpath(out)
    if isinstance(path, str) and path.startswith(root + os.sep):
        return os.path.relpath(path, root)
    return None


# -- what the at-rest families share: the file a point strikes, and the versions the trace shows

DIGITS = re.compile(r"\d+")


def digit_key(rel: str) -> str:
    """``rel`` with every run of digits as ``*``: ``ckpt-rank1-6.pt`` -> ``ckpt-rank*-*.pt`` (the same
    file of another save or another rank)."""
    return DIGITS.sub("*", rel)


def when(point: Point) -> str:
    if point.at_step is None:
        return f"after event {point.op} completed it"
    if point.op is None:  # the built-in ckpt:stepS:KIND: the newest checkpoint's file (chaos.nemesis.newest)
        return f"at rest, once rank {point.rank} announced step {point.at_step}"
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


def under(path: str, top: str) -> bool:
    """``path`` is ``top`` or lies below it (a rename of ``top`` moves it). Called by
    :func:`file_versions`, ``reorder.pending_writes`` and the judge's ``_track``."""
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


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


def site_file(point: Point, halt: dict[str, Any], out: str, seed: int,
               what: str) -> tuple[str, dict[str, Any]] | Applied:
    """The file the point strikes and the start of its record (family, file, the point's seed), or
    the Applied that skips it (no file, or none there now). Called by :func:`stale`, :func:`swap`
    and :func:`payload`."""
    rel = target_file(point, halt, out)
    if rel is None:
        return Applied(f"{point.mode} of nothing", skipped=f"event {point.op} ({halt.get('op')}) completed no "
                       f"file under {{out}}: nothing to {what}")
    if not os.path.isfile(os.path.join(out, rel)):
        return Applied(f"{point.mode} of {rel}", {"family": point.mode, "file": rel},
                       skipped=f"{rel} was absent when the job stopped {when(point)}: nothing to {what}",
                       excluded=[rel])
    return rel, {"family": point.mode, "file": rel, "seed": point_seed(seed, point)}


def relative(record: dict[str, Any], out: str) -> dict[str, Any]:
    """A corruption record with its absolute paths (under {out}) made relative to {out}."""
    root = os.path.realpath(out)

    def rel(x: Any) -> Any:
        return os.path.relpath(x, root) if isinstance(x, str) and x.startswith(root + os.sep) else x

    record["path"] = rel(record.get("path"))
    record["params"] = {k: rel(v) for k, v in (record.get("params") or {}).items()}
    if isinstance(record.get("other"), dict):
        record["other"] = relative(record["other"], out)
    return record


def _trace_files(scratch: str, attempt: int) -> list[str]:
    return sorted(glob.glob(os.path.join(scratch, "trace", f"trace-r*-a{attempt}-p*.jsonl")))


def merged_records(scratch: str, attempt: int = 0, cut_ts: float | None = None,
                   with_data: bool = True) -> list[dict[str, Any]]:
    """Every rank's records of one attempt, with write data (unless not ``with_data``), in one order
    (up to ``cut_ts``)."""
    traces = [read_trace(p, with_data=with_data) for p in _trace_files(scratch, attempt)]
    merged = merge_traces(traces)
    if cut_ts is not None:
        merged = [r for r in merged if r.get("ts", 0.0) <= cut_ts]
    return merged


def _size(n: Any) -> str:
    return "absent" if n is None else f"{n} bytes"


def untraced_one(u: dict[str, Any]) -> str:
    return f"{u['file']} ({_size(u.get('size_before'))} -> {_size(u.get('size_after'))}, {u.get('how')})"


def untraced_line(untraced: list[dict[str, Any]]) -> str:
    """One phrase naming the files no traced event explains (``untraced_changes``), for a verdict line."""
    shown = ", ".join(untraced_one(u) for u in untraced[:3]) + (" ..." if len(untraced) > 3 else "")
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
    for p in sorted(files_under(root)):
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


def files_under(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _s, files in os.walk(root) for f in files]
