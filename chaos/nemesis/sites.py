"""Where a fault at rest can strike in a fault-free run's traces: completed files, the steps after.

A job's at-rest faults (corruption, stale copies, swaps, payloads) strike a file the job
completed — at the event that completed it, or once the job announced a later step and
trusts it. This module reads those sites from the fault-free run's traces (each rank's
attempt-0 records, paths relative to {out} as ``record.jobhistory.read_traces`` makes
them) and from what the run left (:class:`Facts`). Called by ``chaos.plan.pointset`` (which
enumerates the points of every family) and by the family modules of this package that
offer points at those sites.
"""

from __future__ import annotations

import bisect
import fnmatch
import os
from dataclasses import dataclass, field
from typing import Any

from chaos.model.jobspec import STEP_KINDS, JobSpec, Point
from chaos.probe import PHASE as PROBE_PHASE

Traces = dict[tuple[int, int], list[dict[str, Any]]]


@dataclass
class Facts:
    """What the fault-free run shows beyond its traces' events (for corrupt, power, diskfull)."""

    files: list[str] = field(default_factory=list)  # files left under {out}, relative, sorted
    # (rank, ord) with something pending -> the crash states the model counts at that cut, or why unknown
    pending: dict[tuple[int, int], int] | str | None = None
    peak: int = 0                                   # tmpfs bytes {out} needed at its fullest
    seed: int = 0
    # (rank, kind, path key, nth) of every attempt-0 event of the second fault-free run
    # (:func:`stable_events`); a point there is ``anchored``. None: no second run to compare.
    stable: frozenset[tuple[int, str, str, int]] | None = None
    # file -> the payload format it speaks (``nemesis.payload.payload_format``), for the files of ``files`` that do
    formats: dict[str, str] = field(default_factory=dict)


def event_keys(traces: Traces) -> list[tuple[int, dict[str, Any], str, int]]:
    """``(rank, record, path key, nth)`` of every attempt-0 file event, rank by rank, in trace order.

    The path key is the record's path relative to {out} (``rel``), else its absolute path;
    ``nth`` counts this rank's events of the same kind on the same key, from 1. The
    rank's tracer counts the same way when it looks for an anchored point's event
    (``inproc.JobInterposer._count``).
    """
    out: list[tuple[int, dict[str, Any], str, int]] = []
    for (rank, attempt), recs in sorted(traces.items()):
        if attempt != 0:
            continue
        seen: dict[tuple[str, str], int] = {}
        for r in recs:
            if r.get("event") == "op" and r.get("ord") is not None:
                key = (r["op"], r.get("rel") or r.get("path") or "")
                seen[key] = seen.get(key, 0) + 1
                out.append((rank, r, key[1], seen[key]))
    return out


def stable_events(traces: Traces) -> frozenset[tuple[int, str, str, int]]:
    """The events of another fault-free run as ``(rank, kind, path key, nth)`` (``Facts.stable``).

    A point whose event has the same identity in both runs names a path the job chooses
    the same way every time (no random temp name), so it can fire by that identity
    (``Point.anchored``) where ranks racing each other move ordinals between runs.
    """
    return frozenset((rank, r["op"], key, nth) for rank, r, key, nth in event_keys(traces))


def is_checkpoint(job: JobSpec, rel: str) -> bool:
    """``rel`` matches ``--checkpoint-glob``, or lies in a directory that does.

    Matched as ``glob.glob`` matches (``explore.checkpoint_state``, whose matches the
    lost-work oracle compares): component by component, a ``*`` never crossing a ``/``
    and never matching a leading dot the pattern does not spell. So the files corrupted
    are the files the oracle counts as checkpoints, no more.
    """
    pattern = (job.checkpoint_glob or "").replace("{out}/", "").replace("{out}", "")
    want = [c for c in pattern.split("/") if c]
    parts = rel.split(os.sep)
    if not want or len(want) > len(parts):
        return False
    return all(fnmatch.fnmatchcase(name, pat) and (pat.startswith(".") or not name.startswith("."))
               for name, pat in zip(parts, want, strict=False))


def completions(traces: Traces) -> dict[str, dict[str, Any]]:
    """file (relative to {out}) -> the attempt-0 event that last completed it: a close of it, or a
    rename whose destination is it or a directory holding it (``rank`` added to the record)."""
    events = sorted(({**r, "rank": rank} for (rank, a), recs in traces.items() if a == 0 for r in recs
                     if r.get("event") == "op" and r.get("ord") is not None and r.get("error") is None
                     and r.get("op") in ("close", "rename") and r.get("rel")), key=lambda r: r.get("ts", 0))
    done: dict[str, dict[str, Any]] = {}
    for r in events:
        done[r["rel"]] = r  # for a rename, rel is its destination
    return done


def step_announcements(traces: Traces) -> dict[int, tuple[list[float], list[int]]]:
    """Rank -> (moments, steps) of every step it announced in attempt 0, in time order (for bisection)."""
    out: dict[int, tuple[list[float], list[int]]] = {}
    for (rank, a), recs in traces.items():
        if a != 0:
            continue
        found = sorted((r.get("ts", 0.0), int(r["info"]["n"])) for r in recs if r.get("event") == "phase"
                       and r.get("name") == "chaos.probe" and r.get("info", {}).get("kind") in STEP_KINDS)
        out[rank] = ([t for t, _ in found], [n for _, n in found])
    return out


def mid_save_points(traces: Traces, facts: Facts | None, mode: str) -> list[Point]:
    """``mode`` points in the middle of every save, then at every announced step: right after the first
    write to a file since it was opened, and after each rename. Where a fault that leaves the rest of
    the job running strikes (``net``: a rank's link cut, ``stop``: a rank hung)."""
    anchors = Anchors(traces, facts.stable if facts is not None else None)
    opened: set[tuple[int, str]] = set()  # (rank, path) opened and not yet written since
    ops: list[Point] = []
    for rank, r, path, nth in event_keys(traces):
        if r["op"] == "open":
            opened.add((rank, path))
        elif r["op"] == "rename" or r["op"] == "write" and (rank, path) in opened:
            opened.discard((rank, path))
            ops.append(anchors.at_event(rank, r, path, nth, mode))
    return ops + [Point(rank, mode, step=n) for rank, steps in announced_steps(traces) for n in steps]


def save_steps(traces: Traces) -> dict[tuple[int, int], int]:
    """(rank, ordinal) -> the step whose save an attempt-0 file event belongs to: the step its rank last
    announced before it, by a ``chaos.phases`` phase that names a step (a checkpointer's ``write_shards``,
    ``commit``, ``retention``; the built-in workload's ``save``: its commit thread's work after training
    moved on included) or, for a rank that announces no such phase, by ``chaos.probe.step`` (a job that
    saves right after it announced the step). Events before any announcement belong to none."""
    out: dict[tuple[int, int], int] = {}
    for (rank, attempt), recs in traces.items():
        if attempt != 0:
            continue
        phased = any(r.get("event") == "phase" and r.get("name") != PROBE_PHASE
                     and isinstance(r.get("info", {}).get("step"), int) for r in recs)
        current: int | None = None
        for r in recs:
            info = r.get("info") if isinstance(r.get("info"), dict) else {}
            if r.get("event") == "phase" and phased and r.get("name") != PROBE_PHASE and isinstance(info.get("step"), int):
                current = info["step"]
            elif (r.get("event") == "phase" and not phased and r.get("name") == PROBE_PHASE
                  and info.get("kind") in STEP_KINDS and isinstance(info.get("n"), int)):
                current = info["n"]
            elif r.get("event") == "op" and current is not None and isinstance(r.get("ord"), int):
                out[(rank, r["ord"])] = current
    return out


def save_events(traces: Traces, step: int) -> set[tuple[int, int]]:
    """(rank, ordinal) of every attempt-0 file event of the save at ``step`` (:func:`save_steps`): what
    the built-in ``all:stepS:power`` cuts at (``chaos.plan.translate``)."""
    return {key for key, s in save_steps(traces).items() if s == step}


def announced_steps(traces: Traces) -> list[tuple[int, list[int]]]:
    """(rank, the steps it announced in attempt 0, sorted) for each rank in order: where the
    step points of ``kill``, ``term`` and ``net`` strike."""
    return [(rank, sorted({r["info"]["n"] for r in recs if r.get("event") == "phase" and r.get("name") == "chaos.probe"
                           and r.get("info", {}).get("kind") in STEP_KINDS}))
            for (rank, attempt), recs in sorted(traces.items()) if attempt == 0]


def rot_sites(traces: Traces) -> list[tuple[dict[str, Any], str, int]]:
    """Where corruption at rest can strike mid-run: (completing event, file, step) for each file
    under {out} a close or a rename put in place (from {out} or from outside it), at the first
    step its rank announced after, when the file was still there then (not removed, renamed
    away or rewritten in between; of several completions before the same step, the last). A
    file written again later (a ``last.ckpt``, a rotated ``checkpoint-N``) gets a site per
    version the job trusted, which is how a restart meets an older checkpoint corrupted. A
    directory renamed into place is not a file to corrupt (its files were completed under
    their temporary names)."""
    events = op_records(traces)
    root = next((r["path"][: len(r["path"]) - len(r["rel"])] for r in events
                 if r.get("rel") and isinstance(r.get("path"), str) and r["path"].endswith(r["rel"])), None)

    def rel_of(path: Any) -> str | None:
        return path[len(root):] if root and isinstance(path, str) and path.startswith(root) else None

    steps = step_announcements(traces)
    closed: set[str] = set()  # files (not directories) completed so far
    dirs: set[str] = set()
    sites: dict[tuple[str, int, int], tuple[dict[str, Any], float]] = {}
    # what ends a version of a file: removed, renamed away (it or a directory above it), opened to be rewritten
    unlinked: dict[str, list[float]] = {}
    renamed_away: list[tuple[float, str]] = []
    rewritten: dict[str, list[float]] = {}
    for ev in events:
        rel, op, ts = ev.get("rel"), ev.get("op"), ev.get("ts", 0.0)
        src = rel_of(ev.get("src")) if op == "rename" else None
        if op == "unlink" and rel:
            unlinked.setdefault(rel, []).append(ts)
        if src is not None:
            renamed_away.append((ts, src))
        if op == "open" and rel and (ev.get("trunc") or {"wronly", "rdwr"} & set(ev.get("flags") or ())):
            rewritten.setdefault(rel, []).append(ts)
        if op == "open" and ev.get("is_dir") and rel:
            dirs.add(rel)
        # a rename completes a file written under another name in {out}, or moved in from outside
        # (Lightning's _atomic_save writes in $TMPDIR, then moves the file into place)
        moved_in = op == "rename" and (src in closed or src is None)
        if not rel or rel in dirs or not (op == "close" or moved_in):
            continue
        closed.add(rel)
        moments, numbers = steps.get(ev["rank"], ([], []))
        i = bisect.bisect_right(moments, ts)
        if i < len(moments):
            sites[(rel, ev["rank"], numbers[i])] = (ev, moments[i])

    def between(times: list[float], since: float, until: float) -> bool:
        return bisect.bisect_right(times, since) < bisect.bisect_left(times, until)

    def gone(rel: str, since: float, until: float) -> bool:
        return (between(unlinked.get(rel, []), since, until) or between(rewritten.get(rel, []), since, until)
                or any(since < t < until and (src == rel or rel.startswith(src.rstrip(os.sep) + os.sep))
                       for t, src in renamed_away))

    out = [(ev, rel, step) for (rel, _rank, step), (ev, until) in sites.items()
           if not gone(rel, ev.get("ts", 0.0), until)]
    return sorted(out, key=lambda x: (x[0].get("ts", 0.0), x[1]))


def completer(done: dict[str, dict[str, Any]], rel: str) -> dict[str, Any] | None:
    parts = rel.split(os.sep)
    cands = [done[p] for p in (os.sep.join(parts[:i]) for i in range(len(parts), 0, -1)) if p in done
             and (p == rel or done[p]["op"] == "rename")]
    return max(cands, key=lambda r: r.get("ts", 0)) if cands else None


def op_records(traces: Traces) -> list[dict[str, Any]]:
    """Every rank's attempt-0 file events, in time order, each with its ``rank``."""
    return sorted(({**r, "rank": rank} for (rank, a), recs in traces.items() if a == 0 for r in recs
                   if r.get("event") == "op" and r.get("ord") is not None and r.get("error") is None),
                  key=lambda r: r.get("ts", 0.0))


def checkpoint_sites(job: JobSpec, traces: Traces, facts: Facts) -> list[tuple[dict[str, Any], str, int | None]]:
    """Where a ``stale``, ``swap`` or ``payload`` point can strike: (completing event, file, step or None)
    for each checkpoint file the fault-free run left, at the event that completed it, then each
    :func:`rot_sites` site; checkpoint files as for corruption but never a ``--result-file``."""
    results = job.relative_globs(job.result_globs)

    def wanted(rel: str) -> bool:
        if job.checkpoint_glob is not None:
            return is_checkpoint(job, rel)
        return not any(fnmatch.fnmatchcase(rel, g) for g in results)

    done = completions(traces)
    out: list[tuple[dict[str, Any], str, int | None]] = []
    for rel in facts.files:
        ev = completer(done, rel) if wanted(rel) else None
        if ev is not None:
            out.append((ev, rel, None))
    out += [(ev, rel, step) for ev, rel, step in rot_sites(traces) if wanted(rel)]
    return out


class Anchors:
    """Points at the fault-free run's file events, each anchored where its event has the same
    identity (kind, path, count on it) in both fault-free runs (``Facts.stable``).

    Built once per enumeration from the first run's traces; used by ``pointset`` for every
    point at an event and by the at-rest families for the event that completed a file.
    """

    def __init__(self, traces: Traces, stable: frozenset[tuple[int, str, str, int]] | None) -> None:
        self.stable = stable
        self.nth_of = {(rank, r["ord"]): (path, nth) for rank, r, path, nth in event_keys(traces)}

    def anchored(self, rank: int, kind: str, path: str, nth: int) -> bool:
        return (self.stable is not None and bool(path) and not os.path.isabs(path)
                and (rank, kind, path, nth) in self.stable)

    def at_event(self, rank: int, r: dict[str, Any], path: str, nth: int, mode: str) -> Point:
        """A point of ``mode`` at event ``r`` of ``rank`` (an ``event_keys`` row: its path key, its count)."""
        return Point(rank, mode, op=r["ord"], kind=r["op"], path=path, seq=r.get("seq"), nth=nth,
                     anchored=self.anchored(rank, r["op"], path, nth))

    def at_completer(self, ev: dict[str, Any], mode: str, rel: str, at_step: int | None = None) -> Point:
        """A point of ``mode`` striking ``rel`` at the event ``ev`` that completed it (or at ``at_step``),
        anchored where that event is on ``rel`` itself (a close of it, a rename onto it); else (one
        event, a directory's rename into place, completed every file in it) ``rel`` is named in the
        point's id (``Point.file``)."""
        key, nth = self.nth_of.get((ev["rank"], ev["ord"]), ("", 0))
        on_it = key == rel
        return Point(ev["rank"], mode, op=ev["ord"], kind=ev["op"], path=rel, seq=ev.get("seq"),
                     nth=nth if on_it else None, anchored=on_it and self.anchored(ev["rank"], ev["op"], rel, nth),
                     at_step=at_step, file=None if on_it else rel)  # (a directory's rename: the file in the id)
