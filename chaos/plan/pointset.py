"""The points of a job: which fault families apply, where each can strike, and the sample run.

Called by ``explore.reference`` with the first fault-free run's traces and the facts
this module gathers from that run (:func:`gather`). Everything here is a pure function
of those, so the same run and seed always give the same points in the same order:

every module of ``chaos.nemesis`` that defines a ``FAMILY`` (:mod:`chaos.nemesis.family`)
says which ``--faults`` kind it is, whether it can be made here (:func:`kinds_to_explore`),
what it needs from the run (:func:`gather`), its points, in ``family.ORDER`` (kill, term,
errno, the at-rest families and power, diskfull, net, node: :func:`enumerate_points`), and
what it left out (:func:`notes`). Where each strikes, and why it may offer none, its
module's docstring says.

:func:`point_classes` and :func:`plan` then put them in the order ``explore`` runs them
(``--max-points`` of them, while ``--budget`` lasts): one point of every class first (every
family, each save's end, each checkpoint file's first and last write, the moment after the
last save), then seeded draws spread over the families.
"""

from __future__ import annotations

import bisect
import fnmatch
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chaos.errors import ConfigError
from chaos.model.jobspec import (
    ERRNO_MODES,
    FAULT_KINDS,
    KINDS_WITH_SBATCH,
    STEP_KINDS,
    JobSpec,
    Point,
)
from chaos.nemesis import nodes
from chaos.nemesis.family import families
from chaos.nemesis.sites import (  # noqa: F401 - Facts, stable_events, rot_sites: re-exported
    Facts,
    Traces,
    is_checkpoint,
    op_records,
    rot_sites,
    stable_events,
    step_announcements,
)


def kinds_to_explore(job: JobSpec) -> tuple[tuple[str, ...], list[str]]:
    """The ``--faults`` kinds explored and notes on those left out (default: every family that can
    be made here, each family's ``unavailable``)."""
    if job.nodes is not None:
        return nodes.kinds_to_explore(job)
    if job.faults is not None:
        return tuple(k for k in FAULT_KINDS if k in job.faults), []
    kinds, notes = [], []
    for kind in FAULT_KINDS:
        if job.launcher == "sbatch" and kind not in KINDS_WITH_SBATCH:
            continue  # the families that need the harness's own hands on the copies (JobSpec refuses them)
        fam = families()[kind]
        why = fam.unavailable(job) if fam.unavailable is not None else None
        if why is None:
            kinds.append(kind)
        elif why:
            notes.append(why)
    return tuple(kinds), notes


def gather(job: JobSpec, out: str, scratch: str, kinds: Iterable[str], seed: int) -> Facts:
    """Facts of the fault-free run in ``scratch`` (its {out} is ``out``) the asked kinds need."""
    kinds = set(kinds)
    facts = Facts(seed=seed)
    facts.files = sorted(os.path.relpath(os.path.join(d, f), out) for d, _s, names in os.walk(out) for f in names)
    check_checkpoint_glob(job, facts.files)
    for fam in families().values():
        if fam.name in kinds and fam.gather is not None:
            fam.gather(out, scratch, facts)
    return facts


def check_checkpoint_glob(job: JobSpec, files: Iterable[str]) -> None:
    """ConfigError (exit 2) where ``--checkpoint-glob`` matches no file the fault-free run left.

    Called by :func:`gather` with the files under {out} at the end of the first fault-free
    run. Such a glob is a usage mistake, never a fact about the job: the lost-work oracle
    compares what it matches after a fault with what it matched at the end of the
    fault-free run (nothing, so no checkpoint ever counts), and the corruption points it
    would drive (files it matched only mid-run, before they were rotated away) would
    corrupt files no oracle looks at.
    """
    if job.checkpoint_glob is None:
        return
    files = sorted(files)
    if any(is_checkpoint(job, f) for f in files):
        return
    left = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "") if files else "nothing"
    raise ConfigError(f"--checkpoint-glob {job.checkpoint_glob!r} matched no file the fault-free run left under "
                      f"{{out}} (it left {left}): no checkpoint to judge lost work by or to corrupt; give a pattern "
                      "relative to {out} (a directory that matches stands for every file in it)")


def enumerate_points(job: JobSpec, traces: Traces, facts: Facts | None = None,
                     kinds: Iterable[str] = ("kill",)) -> list[Point]:
    """Every point of the asked ``kinds``, in a fixed order: family by family (``family.ORDER``), each
    family's own (rank by rank, event by event). Families that need the run's Facts offer none without."""
    kinds = set(kinds)
    return [p for fam in families().values() if fam.name in kinds and (facts is not None or not fam.needs_facts)
            for p in fam.points(job, traces, facts)]


def notes(job: JobSpec, traces: Traces, facts: Facts, kinds: Iterable[str], points: list[Point]) -> list[str]:
    """What the user should know about the kinds asked for but (partly) not found: each family's notes."""
    kinds = set(kinds)
    return [line for fam in families().values() if fam.name in kinds
            for line in fam.explains(job, traces, facts, [p for p in points if p.family == fam.name])]


def by_kind(points: Iterable[Point]) -> dict[str, int]:
    """Points per ``--faults`` kind, in FAULT_KINDS order (kinds with none left out)."""
    counts: dict[str, int] = {}
    for p in points:
        counts[p.family] = counts.get(p.family, 0) + 1
    return {k: counts[k] for k in FAULT_KINDS if k in counts}


# ------------------------------------------------------------------ the sample: classes first
# What a sample must not miss, in the order it is covered (``plan``). A uniform draw of a few
# dozen out of hundreds of points (most of them kills and power cuts at events no checkpoint
# depends on) can leave out a whole family, the end of every save, or the moment after the
# last save, where real jobs broke (issue #34, item 14).
FAMILY = "family"                    # every point of one --faults kind
AFTER_LAST_SAVE = "after-last-save"  # a kill once the last save is over (a finished run restarted)
SAVE_END = "save-end"                # the event that completed a save (rename into place, close)
FIRST_WRITE = "first-write"          # a checkpoint file's first write (the first save begins)
LAST_WRITE = "last-write"            # a checkpoint file's last write (mid-save of the last save)
_SITE_KINDS = (SAVE_END, FIRST_WRITE, LAST_WRITE)  # covered in turn, after the families and AFTER_LAST_SAVE
_LISTED = 8  # class names a note lists before "and N more"


@dataclass(frozen=True)
class PointClass:
    """A set of points of which a sample takes one before its seeded draws (:func:`plan`).

    ``members`` index the point list the classes were made for (:func:`point_classes`);
    a point can belong to several classes (a kill right after the last save's rename is
    in its family, that save's end and after the last save), and covers them all.
    """

    key: str       # unique: "family:corrupt", "after-last-save", "save-end:rank0:op12", "first-write:ckpt.json"
    kind: str      # FAMILY, AFTER_LAST_SAVE, SAVE_END, FIRST_WRITE or LAST_WRITE
    what: str      # in words, for the notes
    members: tuple[int, ...]


def _writable(ev: dict[str, Any]) -> bool:
    """An open that can change its file: created, truncated, or opened for writing."""
    mode = ev.get("mode") if isinstance(ev.get("mode"), str) else ""
    flags = set(ev.get("flags") or ())
    return bool(ev.get("created") or ev.get("trunc") or set("wax+") & set(mode)
                or {"wronly", "rdwr", "creat", "trunc", "append"} & flags)


def _save_sites(job: JobSpec, traces: Traces) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """(the save ends in time order, checkpoint file -> its writes in time order) of attempt 0.

    A write belongs to the file its data ends up as: the name the next rename of it (or of
    a directory above it) gives it, else its own name (``ckpt.tmp`` written, then renamed
    to ``ckpt``: a write of ``ckpt``; a file written in $TMPDIR and moved in: one of the
    name it was moved to). A name something was renamed onto keeps its data when it is
    later moved to a name that is only removed afterwards (retention moving
    ``step-2`` aside to ``.del-step-2-<nonce>`` and deleting it there): the write is one of
    ``step-2/...``, not of a random name no other run has, and that move ends no save. The checkpoint files are those under {out} matching
    ``--checkpoint-glob``, else every file so written or put in place except the
    ``--result-file`` ones (rotated-away checkpoints included). A save's end is the last
    event that completed a checkpoint file (a close after a change, where the file is not
    renamed later, or a rename onto it or a directory holding it) before the rank
    announced its next step or acknowledged a save; a rank that announces neither has a
    save per completion.
    """
    events = op_records(traces)
    root = next((r["path"][: len(r["path"]) - len(r["rel"])] for r in events
                 if r.get("rel") and isinstance(r.get("path"), str) and r["path"].endswith(r["rel"])), None)

    def name(path: Any) -> str | None:
        if not isinstance(path, str):
            return None
        return path[len(root):] if root and path.startswith(root) else path

    nxt: dict[str, str] = {}  # scanning backwards: name -> what the next rename (in time) calls it

    def becomes(n: str) -> str:
        if n in nxt:
            return nxt[n]
        parts = n.split(os.sep)
        for i in range(len(parts) - 1, 0, -1):
            top = os.sep.join(parts[:i])
            if top in nxt:
                return nxt[top] + n[len(top):]
        return n

    final: dict[int, str] = {}  # id(event) -> the name its data or directory entry ends up under
    placed = {ev.get("rel") or name(ev.get("path")) for ev in events if ev["op"] == "rename"}  # renamed onto
    gone: set[str] = set()  # scanning backwards: names removed later
    aside: set[int] = set()  # id(rename) of a put-in-place name moved aside to be removed: no completion
    for ev in reversed(events):
        here = ev.get("rel") or name(ev.get("path")) or ""
        op = ev["op"]
        if op == "rename":
            src = name(ev.get("src"))
            if src and here in gone and src in placed:
                aside.add(id(ev))
            elif src:
                nxt[src] = becomes(here)
        elif op in ("unlink", "rmdir"):
            gone.add(here)
            nxt.pop(here, None)
        elif op in ("write", "truncate", "close"):
            final[id(ev)] = becomes(here)
    results = job.relative_globs(job.result_globs)

    def is_ckpt(n: str) -> bool:
        if not n or os.path.isabs(n):
            return False
        if job.checkpoint_glob is not None:
            return is_checkpoint(job, n)
        return not any(fnmatch.fnmatchcase(n, g) for g in results)

    writes: dict[str, list[dict[str, Any]]] = {}
    completions: list[dict[str, Any]] = []
    dirty: set[tuple[int, str]] = set()  # (rank, name) changed since it was opened
    named = {n for n in final.values() if is_ckpt(n)}
    for ev in events:
        here = ev.get("rel") or name(ev.get("path")) or ""
        op = ev["op"]
        if op == "open" and not ev.get("is_dir") and _writable(ev):
            dirty.add((ev["rank"], here))
        elif op in ("write", "truncate"):
            dirty.add((ev["rank"], here))
            if op == "write" and is_ckpt(final[id(ev)]):
                writes.setdefault(final[id(ev)], []).append(ev)
        elif op == "close" and not ev.get("is_dir") and (ev["rank"], here) in dirty:
            dirty.discard((ev["rank"], here))
            if final[id(ev)] == here and is_ckpt(here):
                completions.append(ev)
        elif op == "rename" and id(ev) not in aside and (is_ckpt(here) or any(n.startswith(here + os.sep)
                                                                              for n in named)):
            completions.append(ev)
    bounds: dict[int, list[float]] = {}
    for (rank, a), recs in traces.items():
        if a == 0:
            bounds[rank] = sorted(r.get("ts", 0.0) for r in recs if r.get("event") == "phase"
                                  and r.get("name") == "chaos.probe"
                                  and r.get("info", {}).get("kind") in (*STEP_KINDS, "saved"))
    ends: dict[tuple[int, int], dict[str, Any]] = {}
    for ev in completions:
        moments = bounds.get(ev["rank"], [])
        save = bisect.bisect_right(moments, ev.get("ts", 0.0)) if moments else ev["ord"]
        ends[(ev["rank"], save)] = ev  # the last completion of that save wins
    return sorted(ends.values(), key=lambda r: r.get("ts", 0.0)), writes


def point_classes(job: JobSpec, traces: Traces, points: list[Point]) -> list[PointClass]:
    """The classes :func:`plan` covers first, for ``points`` enumerated from ``traces``.

    Called by ``explore.explore`` before it samples. Every family with a point is a class;
    so is each save's end (the points at the event that completed it), each checkpoint
    file's first write and last write (the points at that write) and the moment after the
    last save (its kills: after the last save's end, or before or after any later event or
    step; any family's points there where no kill is explored). A class with no point
    (its event offers none of the kinds explored) is left out.
    """
    at: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(points):
        if p.op is not None and p.step is None and p.at_step is None and p.node is None:
            at.setdefault((p.rank, p.op), []).append(i)
    out: list[PointClass] = []
    for fam in FAULT_KINDS:
        members = tuple(i for i, p in enumerate(points) if p.family == fam)
        if members:
            out.append(PointClass(f"{FAMILY}:{fam}", FAMILY, f"the {fam} family ({len(members)} point(s))", members))
    ends, writes = _save_sites(job, traces)

    def where(ev: dict[str, Any]) -> str:
        return f"rank {ev['rank']}'s event {ev['ord']}, {ev['op']} of {ev.get('rel') or ev.get('path')}"

    if ends:
        last = ends[-1]
        t_last = last.get("ts", 0.0)
        ts_of = {(rank, r["ord"]): r.get("ts", 0.0) for (rank, a), recs in traces.items() if a == 0 for r in recs
                 if r.get("event") == "op" and r.get("ord") is not None}
        steps = step_announcements(traces)

        def moment(p: Point) -> tuple[float, bool] | None:
            """When ``p`` strikes: the time of its event or step, and whether it is after that event."""
            if p.step is not None or p.at_step is not None:
                moments, numbers = steps.get(p.rank, ([], []))
                n = p.step if p.step is not None else p.at_step
                return (moments[numbers.index(n)], True) if n in numbers else None
            if p.op is None or (p.rank, p.op) not in ts_of:
                return None
            return ts_of[(p.rank, p.op)], p.mode not in ("before", "torn", *ERRNO_MODES)

        def later(p: Point) -> bool:
            m = moment(p)
            return m is not None and (m[0] > t_last or (p.rank, p.op) == (last["rank"], last["ord"]) and m[1])

        after = [i for i, p in enumerate(points) if p.family == "kill" and later(p)]
        after = after or [i for i, p in enumerate(points) if later(p)]
        if after:
            out.append(PointClass(AFTER_LAST_SAVE, AFTER_LAST_SAVE, f"the moment after the last save (it ended at "
                                  f"{where(last)})", tuple(after)))
    for ev in ends:
        if at.get((ev["rank"], ev["ord"])):
            out.append(PointClass(f"{SAVE_END}:rank{ev['rank']}:op{ev['ord']}", SAVE_END,
                                  f"the end of a save ({where(ev)})", tuple(at[(ev["rank"], ev["ord"])])))
    for f, evs in sorted(writes.items()):
        first, last_w = evs[0], evs[-1]
        only = first is last_w
        if at.get((first["rank"], first["ord"])):
            out.append(PointClass(f"{FIRST_WRITE}:{f}", FIRST_WRITE, f"the {'only' if only else 'first'} write of "
                                  f"checkpoint file {f} ({where(first)})", tuple(at[(first["rank"], first["ord"])])))
        if not only and at.get((last_w["rank"], last_w["ord"])):
            out.append(PointClass(f"{LAST_WRITE}:{f}", LAST_WRITE, f"the last write of checkpoint file {f} "
                                  f"({where(last_w)})", tuple(at[(last_w["rank"], last_w["ord"])])))
    return out


@dataclass
class Plan:
    """The points to run, in the order to run them, and the classes they were chosen to cover.

    ``points``: a representative of every class first (``reps`` of them; fewer classes are
    covered where ``--max-points`` is smaller than that), then seeded draws spread over the
    families. ``explore.explore`` runs them in this order while ``--budget`` allows, so a
    budget that runs out early has still tried every family and every class it reached.
    """

    points: list[Point]
    classes: list[PointClass]
    reps: int    # the first ``reps`` of ``points`` are the classes' representatives
    needed: int  # representatives that cover every class (more than ``reps`` where --max-points cut them)
    found: int
    ids: list[str] = field(default_factory=list, repr=False)  # id of every point the classes index

    def covered(self, tried: Iterable[Point]) -> tuple[list[PointClass], list[PointClass]]:
        """(classes with a point among ``tried``, classes without one)."""
        seen = {p.id for p in tried}
        yes = [c for c in self.classes if any(self.ids[i] in seen for i in c.members)]
        return yes, [c for c in self.classes if c not in yes]

    def planned_notes(self, max_points: int | None, budget_s: float | None) -> list[str]:
        """Before any point runs: what the sample covers, and the classes ``--max-points`` leaves out."""
        if max_points is None and budget_s is None:
            return []
        _, left = self.covered(self.points)
        if max_points is None and budget_s is not None:
            return [f"run order under --budget {budget_s:g} s: the first {self.reps} of the {self.found} point(s) "
                    f"cover all {len(self.classes)} point classes ({_kinds(self.classes)}), then seeded draws "
                    "spread over the families"]
        if not left:
            rest = ", the rest are seeded draws spread over the families" if len(self.points) > self.reps else ""
            return [f"sample: {len(self.points)} of {self.found} point(s); the first {self.reps} cover all "
                    f"{len(self.classes)} point classes ({_kinds(self.classes)}){rest}"]
        return [f"sample: --max-points {max_points} is fewer than the {self.needed} point(s) that cover every point "
                f"class; {len(left)} of {len(self.classes)} class(es) get no point: {_names(left)}"]

    def tried_notes(self, tried: list[Point], max_points: int | None, budget_s: float | None) -> list[str]:
        """After the run: the classes tried, and those the ``--budget`` ran out before (chosen, never run)."""
        if max_points is None and budget_s is None:
            return []
        yes, no = self.covered(tried)
        _, unplanned = self.covered(self.points)
        unreached = [c for c in no if c not in unplanned]
        line = f"point classes tried: {len(yes)} of {len(self.classes)}"
        if unreached:
            line += (f"; not reached before the --budget of {budget_s:g} s ran out" if budget_s is not None
                     else "; not reached") + f": {_names(unreached)}"
        if unplanned:
            line += f"; left out by --max-points: {_names(unplanned)}"
        return [line]


def _kinds(classes: list[PointClass]) -> str:
    """``6 families, the moment after the last save, 4 save ends, ...`` of ``classes``."""
    words = {FAMILY: ("family", "families"), AFTER_LAST_SAVE: ("the moment after the last save",) * 2,
             SAVE_END: ("save end", "save ends"), FIRST_WRITE: ("first write of a checkpoint file",
                                                                "first writes of checkpoint files"),
             LAST_WRITE: ("last write of a checkpoint file", "last writes of checkpoint files")}
    out = []
    for kind, (one, many) in words.items():
        n = sum(1 for c in classes if c.kind == kind)
        if n:
            out.append(one if kind == AFTER_LAST_SAVE else f"{n} {one if n == 1 else many}")
    return ", ".join(out)


def _names(classes: list[PointClass]) -> str:
    shown = "; ".join(c.what for c in classes[:_LISTED])
    return shown + (f"; and {len(classes) - _LISTED} more" if len(classes) > _LISTED else "")


def plan(points: list[Point], max_points: int | None, seed: int,
         classes: list[PointClass] | None = None) -> Plan:
    """The run order of ``points``, classes first: at most ``max_points`` of them (None: all).

    Called by ``explore.explore`` (``--max-points``, ``--budget``) with the classes of
    :func:`point_classes`; without ``classes``, the families alone. The same points, classes
    and seed always give the same order:

    1. the families, in a seeded order, each with one of its points: the one in the most
       classes not yet covered, a power cut's worst case before its mixed states (which a
       cut with fewer states skips), then of the mode taken least so far (kills before,
       after and in writes alternate), ties drawn with the seed; so a sample as small as
       the number of families still has one point of each;
    2. then the moment after the last save, then the save ends, first writes and last
       writes in turn (each kind in a seeded order), each class not covered yet with one
       point: of its family with the fewest points so far (so the families interleave),
       chosen as in 1;
    3. then the rest, one at a time from the family with the fewest points so far (an
       equal share each, as the old sample gave), drawn uniformly within it.
    """
    rng = random.Random(seed)
    if classes is None:
        classes = [PointClass(f"{FAMILY}:{fam}", FAMILY, f"the {fam} family", tuple(i for i, p in enumerate(points)
                                                                                    if p.family == fam))
                   for fam in FAULT_KINDS if any(p.family == fam for p in points)]
    families = [k for k in FAULT_KINDS if any(p.family == k for p in points)]
    rng.shuffle(families)
    rank_of = {f: n for n, f in enumerate(families)}
    by_kind: dict[str, list[PointClass]] = {}
    for c in classes:
        by_kind.setdefault(c.kind, []).append(c)
    ordered = sorted(by_kind.get(FAMILY, []), key=lambda c: rank_of.get(c.key.split(":", 1)[1], len(rank_of)))
    ordered += by_kind.get(AFTER_LAST_SAVE, [])
    queues = [list(by_kind.get(k, [])) for k in _SITE_KINDS]
    for q in queues:
        rng.shuffle(q)
    while any(queues):
        ordered += [q.pop(0) for q in queues if q]
    member_of: dict[int, list[str]] = {}
    for c in classes:
        for i in c.members:
            member_of.setdefault(i, []).append(c.key)
    chosen: list[int] = []
    taken: set[int] = set()
    covered: set[str] = set()
    count = dict.fromkeys(families, 0)
    modes: dict[str, int] = {}

    def take(i: int) -> None:
        chosen.append(i)
        taken.add(i)
        covered.update(member_of.get(i, ()))
        count[points[i].family] += 1
        modes[points[i].mode] = modes.get(points[i].mode, 0) + 1

    for c in ordered:
        cands = [i for i in c.members if i not in taken]
        if c.key in covered or not cands:
            continue
        if c.kind != FAMILY:
            fam = min({points[i].family for i in cands}, key=lambda f: (count[f], rank_of[f]))
            cands = [i for i in cands if points[i].family == fam]
        # the most classes not yet covered; then a point that surely fires: a cut's worst case over
        # one of its mixed power states (``:sK``), which is skipped where the cut has fewer states;
        # then the mode taken least so far (a kill before, after or in a write; each corruption)
        gain = {i: (sum(1 for k in member_of.get(i, ()) if k not in covered), points[i].state is None,
                    -modes.get(points[i].mode, 0)) for i in cands}
        best = max(gain.values())
        cands = [i for i in cands if gain[i] == best]
        take(cands[rng.randrange(len(cands))])
    needed = len(chosen)
    limit = len(points) if max_points is None else max_points
    del chosen[limit:]
    reps = len(chosen)
    pools = {f: [i for i, p in enumerate(points) if p.family == f and i not in taken] for f in families}
    for pool in pools.values():
        rng.shuffle(pool)
    while len(chosen) < limit and any(pools.values()):
        fam = min((f for f in families if pools[f]), key=lambda f: (count[f], rank_of[f]))
        take(pools[fam].pop())
    return Plan([points[i] for i in chosen], classes, reps, needed, len(points), [p.id for p in points])


def sample(points: list[Point], max_points: int | None, seed: int,
           classes: list[PointClass] | None = None) -> list[Point]:
    """At most ``max_points`` of ``points`` in the order to run them (:func:`plan`'s ``points``)."""
    return plan(points, max_points, seed, classes).points
