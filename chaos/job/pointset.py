"""The points of a job: which fault families apply, where each can strike, and the sample run.

Called by ``explore.reference`` with the first fault-free run's traces and the facts
this module gathers from that run (:func:`gather`). Everything here is a pure function
of those, so the same run and seed always give the same points in the same order:

- ``kill``: every traced file event of every rank x each of ``--modes`` (before,
  after; torn for writes of two bytes or more), then a SIGKILL at every announced step;
- ``term``: a SIGTERM (then SIGKILL after ``--grace``) at every announced step;
- ``errno``: ``eio`` at every event (an fsync's is a failed fsync), ``enospc`` at every
  event that can need space (writes, file creation, mkdir, rename, link);
- ``corrupt``: for each checkpoint file the job left under {out} — matching
  ``--checkpoint-glob`` when given, else every file a traced event completed — each
  family of ``spec.CORRUPT_FAMILIES`` at the event that completed it (its last close,
  or the rename that put it, or its directory, in place), and again at the first step
  the rank announced after that event (``rankR:opN:MODE:stepS``): by then the save is
  over (its commit marker, checksum file or ``probe.saved`` written) and the job trusts
  the file, which is when bit rot at rest strikes;
- ``power``: every event after which something was pending (unsynced data, an
  un-fsynced directory entry), so a power loss there differs from a kill; every event
  when the crash-state model cannot say (each point then finds out at its own cut).
  Each is the worst case (every pending change lost), and where the cut allows more
  than that and the all-kept state (a kill), up to ``POWER_STATES`` mixed ones too
  (``rankR:opN:power:sK``: some data or entries kept, a write torn);
- ``diskfull``: one ``disk:full:<BYTES>``, a seeded size below the run's peak usage of
  {out}, where a tmpfs can be mounted (asked for explicitly elsewhere: one point, which
  is skipped with the reason);
- ``net`` (``--ranks N``, N >= 2, where network namespaces can be made): a rank's link
  cut at each of its announced steps, and in the middle of its saves: right after the
  first write to a file since it was opened, and after each rename;
- ``node`` (``--nodes N`` only, ``nodes.points``): each node's loss (node 0's is the
  rendezvous host's) and each node's link cut, at each step its first local rank announced.

:func:`sample` then draws ``--max-points`` of them, spread over the families.
"""

from __future__ import annotations

import bisect
import dataclasses
import fnmatch
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chaos.job import atrest, diskfull, netcut, nodes
from chaos.job.spec import CORRUPT_FAMILIES, FAULT_KINDS, STEP_KINDS, JobSpec, Point

ENOSPC_EVENTS = ("write", "mkdir", "rename", "link")  # plus an open that creates its file
POWER_STATES = 3  # mixed power-loss states per cut (``rankR:opN:power:sK``), beside everything-lost
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


def kinds_to_explore(job: JobSpec) -> tuple[tuple[str, ...], list[str]]:
    """The ``--faults`` kinds explored and notes on those left out (default: all that apply here)."""
    if job.nodes is not None:
        return nodes.kinds_to_explore(job)
    if job.faults is not None:
        return tuple(k for k in FAULT_KINDS if k in job.faults), []
    kinds, notes = [k for k in FAULT_KINDS if k != "node"], []  # node: only with --nodes
    ok, why = diskfull.available()
    if not ok:
        kinds.remove("diskfull")
        notes.append(f"a real full disk is not explored: {why}")
    ok, why = netcut.usable(job)
    if not ok:
        kinds.remove("net")
        if job.torchrun or job.ranks is not None and job.ranks >= 2:  # a single process has no ranks to cut apart
            notes.append(f"network cuts between ranks are not explored: {why}")
    return tuple(kinds), notes


def gather(job: JobSpec, out: str, scratch: str, kinds: Iterable[str], seed: int) -> Facts:
    """Facts of the fault-free run in ``scratch`` (its {out} is ``out``) the asked kinds need."""
    kinds = set(kinds)
    facts = Facts(seed=seed)
    facts.files = sorted(os.path.relpath(os.path.join(d, f), out) for d, _s, names in os.walk(out) for f in names)
    if kinds & {"power", "diskfull"}:
        records = atrest.merged_records(scratch, 0)
        if "power" in kinds:
            facts.pending = atrest.pending_after(out, records)
        if "diskfull" in kinds:
            facts.peak = diskfull.peak_usage(out, records)
    return facts


def _is_checkpoint(job: JobSpec, rel: str) -> bool:
    """``rel`` matches ``--checkpoint-glob``, or lies in a directory that does."""
    pattern = (job.checkpoint_glob or "").replace("{out}/", "").replace("{out}", "")
    parts = rel.split(os.sep)
    return any(fnmatch.fnmatchcase(os.sep.join(parts[:i]), pattern) for i in range(1, len(parts) + 1))


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


def _step_announcements(traces: Traces) -> dict[int, tuple[list[float], list[int]]]:
    """Rank -> (moments, steps) of every step it announced in attempt 0, in time order (for bisection)."""
    out: dict[int, tuple[list[float], list[int]]] = {}
    for (rank, a), recs in traces.items():
        if a != 0:
            continue
        found = sorted((r.get("ts", 0.0), int(r["info"]["n"])) for r in recs if r.get("event") == "phase"
                       and r.get("name") == "chaos.probe" and r.get("info", {}).get("kind") in STEP_KINDS)
        out[rank] = ([t for t, _ in found], [n for _, n in found])
    return out


def rot_sites(traces: Traces) -> list[tuple[dict[str, Any], str, int]]:
    """Where corruption at rest can strike mid-run: (completing event, file, step) for each file
    under {out} a close or a rename put in place (from {out} or from outside it), at the first
    step its rank announced after, when the file was still there then (not removed, renamed
    away or rewritten in between; of several completions before the same step, the last). A
    file written again later (a ``last.ckpt``, a rotated ``checkpoint-N``) gets a site per
    version the job trusted, which is how a restart meets an older checkpoint corrupted. A
    directory renamed into place is not a file to corrupt (its files were completed under
    their temporary names)."""
    events = sorted(({**r, "rank": rank} for (rank, a), recs in traces.items() if a == 0 for r in recs
                     if r.get("event") == "op" and r.get("ord") is not None and r.get("error") is None),
                    key=lambda r: r.get("ts", 0.0))
    root = next((r["path"][: len(r["path"]) - len(r["rel"])] for r in events
                 if r.get("rel") and isinstance(r.get("path"), str) and r["path"].endswith(r["rel"])), None)

    def rel_of(path: Any) -> str | None:
        return path[len(root):] if root and isinstance(path, str) and path.startswith(root) else None

    steps = _step_announcements(traces)
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


def _completer(done: dict[str, dict[str, Any]], rel: str) -> dict[str, Any] | None:
    parts = rel.split(os.sep)
    cands = [done[p] for p in (os.sep.join(parts[:i]) for i in range(len(parts), 0, -1)) if p in done
             and (p == rel or done[p]["op"] == "rename")]
    return max(cands, key=lambda r: r.get("ts", 0)) if cands else None


def enumerate_points(job: JobSpec, traces: Traces, facts: Facts | None = None,
                     kinds: Iterable[str] = ("kill",)) -> list[Point]:
    """Every point of the asked ``kinds``, in a fixed order (family by family, rank by rank, event by event)."""
    kinds = set(kinds)
    kill_ops: list[Point] = []
    kill_steps: list[Point] = []
    terms: list[Point] = []
    net_ops: list[Point] = []
    net_steps: list[Point] = []
    cuts = "net" in kinds and job.net_unavailable is None
    mid_save: set[tuple[int, int]] = set()  # (rank, ord) of a net point at an event
    errnos: list[Point] = []
    power: list[Point] = []
    events = event_keys(traces)
    opened: set[tuple[int, str]] = set()  # (rank, path) opened and not yet written since
    for rank, r, path, _nth in events:
        if r["op"] == "open":
            opened.add((rank, path))
        elif r["op"] == "rename" or r["op"] == "write" and (rank, path) in opened:
            opened.discard((rank, path))
            mid_save.add((rank, r["ord"]))
    stable = facts.stable if facts is not None else None

    def anchored(rank: int, kind: str, path: str, nth: int) -> bool:
        return stable is not None and bool(path) and not os.path.isabs(path) and (rank, kind, path, nth) in stable

    nth_of = {(rank, r["ord"]): (path, nth) for rank, r, path, nth in events}
    for (rank, attempt), recs in sorted(traces.items()):
        if attempt != 0:
            continue
        announced = sorted({r["info"]["n"] for r in recs if r.get("event") == "phase"
                            and r.get("name") == "chaos.probe" and r.get("info", {}).get("kind") in STEP_KINDS})
        if "kill" in kinds:
            kill_steps += [Point(rank, "kill", step=n) for n in announced]
        if "term" in kinds:
            terms += [Point(rank, "term", step=n) for n in announced]
        if cuts:
            net_steps += [Point(rank, "net", step=n) for n in announced]
    pending = facts.pending if facts is not None else None
    for rank, r, path, nth in events:
        def at(mode: str, rank: int = rank, r: dict[str, Any] = r, path: str = path, nth: int = nth) -> Point:
            return Point(rank, mode, op=r["ord"], kind=r["op"], path=path, seq=r.get("seq"), nth=nth,
                         anchored=anchored(rank, r["op"], path, nth))

        if "kill" in kinds:
            for mode in job.modes:
                if mode == "torn" and (r["op"] != "write" or (r.get("length") or 0) < 2):
                    continue
                kill_ops.append(at(mode))
        if "errno" in kinds:
            errnos.append(at("eio"))
            if r["op"] in ENOSPC_EVENTS or (r["op"] == "open" and r.get("created")):
                errnos.append(at("enospc"))
        if "power" in kinds and facts is not None and (not isinstance(pending, dict) or (rank, r["ord"]) in pending):
            power.append(at("power"))
            # Beyond "everything lost": the cut's mixed states (some pending data or entries
            # kept, a write torn), a few per cut; atrest.power_loss draws which with the seed.
            mixed = pending.get((rank, r["ord"]), 0) - 2 if isinstance(pending, dict) else 0
            power += [dataclasses.replace(at("power"), state=k) for k in range(1, min(POWER_STATES, mixed) + 1)]
        if cuts and (rank, r["ord"]) in mid_save:
            net_ops.append(at("net"))

    def at_completer(ev: dict[str, Any], fam: str, rel: str, **more: Any) -> Point:
        """A corruption of ``rel`` at the event ``ev`` that completed it, anchored where that event is
        on ``rel`` itself (a close of it, a rename onto it) and the same in both fault-free runs."""
        key, nth = nth_of.get((ev["rank"], ev["ord"]), ("", 0))
        on_it = key == rel
        return Point(ev["rank"], fam, op=ev["ord"], kind=ev["op"], path=rel, seq=ev.get("seq"),
                     nth=nth if on_it else None, anchored=on_it and anchored(ev["rank"], ev["op"], rel, nth), **more)

    corrupt: list[Point] = []
    if "corrupt" in kinds and facts is not None:
        done = completions(traces)
        for rel in facts.files:
            if job.checkpoint_glob is not None and not _is_checkpoint(job, rel):
                continue
            ev = _completer(done, rel)
            if ev is None:
                continue
            corrupt += [at_completer(ev, fam, rel) for fam in CORRUPT_FAMILIES]
        # the same files, and every earlier version of a checkpoint file, once the job trusts them
        for ev, rel, step in rot_sites(traces):
            if job.checkpoint_glob is None or _is_checkpoint(job, rel):
                corrupt += [at_completer(ev, fam, rel, at_step=step) for fam in CORRUPT_FAMILIES]
    disk: list[Point] = []
    if "diskfull" in kinds and facts is not None:
        size = diskfull.choose_size(facts.peak, facts.seed)
        if size is not None:
            disk.append(Point(0, "diskfull", size=size))
    node = nodes.points(job, traces) if "node" in kinds else []
    return kill_ops + kill_steps + terms + errnos + corrupt + power + disk + net_ops + net_steps + node


def notes(job: JobSpec, traces: Traces, facts: Facts, kinds: Iterable[str], points: list[Point]) -> list[str]:
    """What the user should know about the kinds asked for but (partly) not found."""
    kinds = set(kinds)
    out: list[str] = []
    if "power" in kinds and isinstance(facts.pending, str):
        out.append(f"power loss: the crash-state model cannot represent the whole fault-free trace ({facts.pending}); "
                   "every event gets a power point, skipped where its own cut cannot be modelled either")
    if "corrupt" in kinds:
        done = completions(traces)
        ckpts = [f for f in facts.files if job.checkpoint_glob is None or _is_checkpoint(job, f)]
        orphans = [f for f in ckpts if _completer(done, f) is None]
        if job.checkpoint_glob is not None and orphans:
            out.append(f"{len(orphans)} checkpoint file(s) were completed by no traced event and are not corrupted: "
                       f"{', '.join(orphans[:5])}")
        if job.checkpoint_glob is not None and not ckpts:
            out.append(f"--checkpoint-glob {job.checkpoint_glob} matched no file the fault-free run left: "
                       "nothing to corrupt")
    if "diskfull" in kinds and not any(p.family == "diskfull" for p in points):
        out.append(f"a real full disk is not explored: {{out}} never held more than {facts.peak} byte(s) of tmpfs "
                   "pages, too little to fill a smaller one")
    if "net" in kinds and job.net_unavailable is None and not any(p.family == "net" for p in points):
        out.append("network cuts are not explored: the job announced no step and traced no save")
    if "term" in kinds and not any(p.family == "term" for p in points):
        out.append("SIGTERM is not explored: the job announced no step (chaos.probe.step or --step-regex)")
    return out


def by_kind(points: Iterable[Point]) -> dict[str, int]:
    """Points per ``--faults`` kind, in FAULT_KINDS order (kinds with none left out)."""
    counts: dict[str, int] = {}
    for p in points:
        counts[p.family] = counts.get(p.family, 0) + 1
    return {k: counts[k] for k in FAULT_KINDS if k in counts}


def sample(points: list[Point], max_points: int | None, seed: int) -> list[Point]:
    """A seeded sample of at most ``max_points``, in a seeded order (so a budget cut is spread out).

    With several families the sample is spread over them: each gets an equal share (a
    family with fewer points gives the rest to the others), drawn uniformly within it.
    """
    rng = random.Random(seed)
    chosen = list(points)
    if max_points is not None and len(chosen) > max_points:
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(points):
            groups.setdefault(p.family, []).append(i)
        if len(groups) == 1:
            chosen = [points[i] for i in sorted(rng.sample(range(len(points)), max_points))]
        else:
            quota = dict.fromkeys(groups, 0)
            left = max_points
            while left:
                for k, members in groups.items():
                    if left and quota[k] < len(members):
                        quota[k] += 1
                        left -= 1
            picked = sorted(i for k, members in groups.items() for i in rng.sample(members, quota[k]))
            chosen = [points[i] for i in picked]
    rng.shuffle(chosen)
    return chosen
