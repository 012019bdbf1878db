"""One point's verdict, from its record only: pass, code_execution, hard_failure, silent_divergence, lost_work.

Called by ``explore.py`` after a point's last attempt with the ``PointRecord`` (what
each attempt did, each rank's trace) and the ``Golden`` facts of the fault-free runs.
Up to eight oracles, each with its evidence, named as the built-in workload's are:

- ``liveness``: the job finished (every copy of the last attempt exited 0) within its
  restarts. Otherwise *hard_failure*: the resume raised or never finished; the
  evidence is each attempt's outcome and the end of the last one's output.
- ``committed_state``, only where the job announces its state (``probe.saving(n, state)``,
  ``probe.resumed(n, state)``; the built-in workload run as a job does, tensor by tensor):
  each resume loaded exactly what the same rank's save of that step was made from.
  Otherwise *silent_divergence*, naming the first differing key.
- ``no_false_ack``, only where an I/O error was injected: a save the error hurt (data that
  save had made and not yet made durable, ``chaos.record.savescope``) is not acknowledged by
  ``probe.saved(n)`` after it, unless a later resume loaded that step; after a failed fsync of
  its data, never. Otherwise *lost_work*: the job relied on a checkpoint that is not there.
- ``result_files``: each ``--result-file`` equals the fault-free run's (compare.py).
  Otherwise *silent_divergence*: it finished, and what it produced is different.
- ``durability``: the resume started at or after the newest checkpoint the job could
  rely on when it was killed — the newest ``chaos.probe.saved(n)`` in the killed
  attempt's trace; the newest checkpoint matching ``--checkpoint-glob`` whose files
  and sizes equal the fault-free run's, seen between the kill and the restart; or the
  newest checkpoint the trace shows the job *relied on* before the fault (``relied_on``,
  no probe needed): a file it finished writing (closed, or renamed into place) and then
  went on training past (a later step announced; where the rank announces no step at
  all, a later file event outside that checkpoint), holding the last step announced
  before it was written, or the number in its ``--checkpoint-glob`` match's name. With
  ``--checkpoint-glob`` only its matches count, every file of a match relied on; without
  it every such file but result files and files appended to (logs). A power loss is
  judged on what the job relied on *before* the cut, whatever the crash state left.
  Where the resume started is ``chaos.probe.resumed(n)``, else the first
  ``--step-regex`` match after the restart (minus one where it matched a step line that
  ``--loss-regex`` or ``probe.step`` announced too), else the first ``probe.step(n)`` (or
  ``--loss-regex`` line) minus one; a restart that announced no step where the job does
  had none left to train (the fault-free run's last step); none of them: from scratch
  (0). Where the sources disagree, the evidence shows each. Otherwise *lost_work*. Where
  no step can be known (the job announced none, a checkpoint's name carries none, a
  file changed that no traced event explains), the oracle is *not judged* and says why
  in one line ("lost work not judged: ..."), which the verdict line of a pass carries.
- ``loss_continuity``: every step's loss, in every attempt (``probe.step(n, loss)`` or
  ``--loss-regex``), equals the fault-free run's — exactly when the two fault-free runs
  agreed, else within ``--loss-band`` — and does not spike after a resume
  (``losscurve``, judged by the built-in oracle). Otherwise *silent_divergence*: the
  job finished, but it trained on something other than what it saved.
- ``preemption_exit`` (term points): the SIGTERMed attempt exits non-zero unless it had
  finished; a job that exits 0 mid-run is never restarted by a supervisor that restarts
  failed jobs. Otherwise *hard_failure*: the job is down until someone notices.
- ``no_code_execution`` (payload points): loading the checkpoint never ran the code planted
  in it. Otherwise *code_execution*, named before every other outcome: the job unpickles its
  checkpoint with code execution allowed (``torch.load(weights_only=False)``, ``pickle.load``).
  Each is judged only with what it needs; without it the summary says what is missing.
  When several fail, the first in ``VERDICT_ORDER`` names the outcome.

What the harness did besides the kill is evidence too, and bounds what the job could
rely on. A corrupted file (``chaos.nemesis.corrupt``) is no checkpoint to rely on: a
``--checkpoint-glob`` match holding it does not count, nor does any file its rank wrote
for the same step (its checksum file, a pointer to it), nor an acknowledgement the
rank made at or after the step it was saving when it stopped (a careful job that
detects the damage and resumes from the checkpoint before passes). After a power loss
only acknowledgements made before the cut count: the other ranks' later ones never
happened. A file under {out} that attempt 0 changed and no traced event explains (a
native writer the tracer does not see) is named in the liveness evidence and on a
failing verdict's line, with its sizes (``PointRecord.untraced``). Every verdict of such a point starts with what was done ("ckpt.json: bit 5 of
byte 40 flipped ...", "SIGTERM at rank 0's step 8: exited 0 within the 5 s grace"), and
the liveness evidence carries the full record (``fault``). A point whose fault changed
nothing, or could not be made here, is *skipped* with the reason, never passed.

A network cut (``net``) is judged as the others, its fault line saying where the link
went down, for how long a hold, and how each copy ended ("rank 1's link down at its
step 6 for a 3 s hold: copies 0 and 1 raised (RuntimeError: ...)", or "...: still
running after the hold, SIGKILLed"). A cut the launcher never made is *not_reached*;
one after which every copy finished by itself and every oracle passed did nothing to
judge: *no_effect*.

A node point (``--nodes``, ``nodes.py``) is judged the same way; its fault line says
what was done to which node and how every agent ended, then whether the job survived it
without a relaunch by the harness or died and had every agent relaunched. A link cut
during which every rank kept announcing steps, after which the job finished without a
restart, did nothing to judge: *no_effect*.
"""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.judge import losscurve
from chaos.judge.compare import first_difference
from chaos.judge.registry import FAILURES, VERDICT_ORDER
from chaos.launch.output import cause as _cause
from chaos.launch.output import clip
from chaos.model.check import Check
from chaos.model.contract import IN_PLACE_BASE, SYNC_OPS
from chaos.model.jobspec import STEP_KINDS, TORCHRUN_STRIDE, JobSpec
from chaos.model.point import Point
from chaos.nemesis import nodes, shrink
from chaos.nemesis.atrest import halt_record, opens_for_writing, under, untraced_line
from chaos.record.jobhistory import PointRecord
from chaos.record.savescope import INJURIES, SaveScope

# Which outcome a failing point gets: that of the first failing oracle in the registry's order
# (chaos.judge.registry, where each oracle's one line and outcome live).
OUTCOMES = ("pass", *FAILURES)




@dataclass
class Golden:
    """What the fault-free runs showed: the judge's reference."""

    out: str                                # the first fault-free run's {out}, kept for comparison
    results: list[str]                      # result files (relative to {out})
    tolerance: bool                         # the two fault-free runs differed
    checkpoints: dict[str, dict[str, int]]  # --checkpoint-glob match -> {file: size} at the end
    acks: bool                              # the fault-free run called chaos.probe.saved
    losses: dict[int, dict[int, float]] = field(default_factory=dict)  # rank -> step -> loss, fault-free run
    last_steps: dict[int, int] = field(default_factory=dict)  # rank -> the last step it announced, fault-free
    loss_source: str | None = None  # which announcements carry the losses (losscurve.source): step | loss
    # a fault-free resize (chaos.nemesis.shrink): the step its restart resumed at, and the point that made it;
    # and what each rank of that restart announced it loaded (probe.resumed(n, state): its fingerprint)
    resized_from: tuple[int, str] | None = None
    loaded: dict[int, dict[str, Any]] = field(default_factory=dict)


def _first_restart(rec: PointRecord, rank: int) -> int | None:
    """The attempt number of rank ``rank``'s first restart (1; a relaunched torchrun's, TORCHRUN_STRIDE)."""
    return min((a for (r, a) in rec.traces if r == rank and a > 0), default=None)


def _struck(rec: PointRecord) -> tuple[int, ...]:
    """The attempts a fault struck: attempt 0, and the first restart where a second fault (``point.then``)
    fired in it. What those relied on is what the last restart must resume from."""
    then = rec.point.then
    first = _first_restart(rec, then.rank) if then is not None else None
    if then is not None and first is not None and any(r.get("event") == "fired"
                                                      for r in rec.traces.get((then.rank, first), [])):
        return (0, first)
    return (0,)


def _liveness(job: JobSpec, rec: PointRecord) -> Check:
    last = rec.attempts[-1]
    # a torchrun worker's attempt: TORCHRUN_STRIDE x the harness's relaunches + torchelastic's restarts
    restarts = sorted({a for (_r, a) in rec.traces if a % TORCHRUN_STRIDE > 0})
    evidence: dict[str, Any] = {"attempts": [a.to_dict() for a in rec.attempts]}
    relaunched = f" (the harness relaunched torchrun {len(rec.attempts) - 1} time(s))" if len(rec.attempts) > 1 else ""
    if job.torchrun:
        evidence["torchelastic_restarts"] = len(restarts)
    in_place = sorted({a for (_r, a) in rec.traces if a >= IN_PLACE_BASE})  # a container the engine restarted
    if in_place:
        evidence["restarted_in_place"] = len(in_place)
    if last.ok:
        how = (f"torchelastic restarted the workers {len(restarts)} time(s){relaunched} and the job finished"
               if job.torchrun else f"the job finished after {len(rec.attempts) - 1} restart(s)"
               + (f" and {len(in_place)} in place (its container restarted by the engine)" if in_place else ""))
        return Check("liveness", "pass", how, evidence)
    evidence["output_tail"] = last.tail()
    if job.torchrun:
        why = (f"torchrun {last.describe} after torchelastic restarted the workers {len(restarts)} time(s)"
               if restarts else f"torchrun {last.describe} and its agent never restarted the workers")
    else:
        allowed = job.max_restarts + (1 if rec.point.then is not None else 0)  # one more for a second fault
        why = f"the resume {last.describe} ({len(rec.attempts) - 1} restart(s) of {allowed} allowed)"
    last_line = _cause(last.tail(12000))
    if last_line:
        why += f": {clip(last_line)}"
    return Check("liveness", "fail", why, evidence)


def _committed_state(rec: PointRecord) -> Check | None:
    """Each resume that announced what it loaded (``probe.resumed(n, state)``) loaded exactly the state the
    same rank's save of step n was made from (``probe.saving(n, state)``), the newest such save announced
    before it; None where the job announces no state at all (not asked).

    The built-in workload asks it of its fingerprints (``chaos.judge.oracles.committed_state``); run as a
    job, it announces the same fingerprints through the probe, and so does any job that calls it. After
    a rank was lost for good (``chaos.nemesis.shrink``) a restart's rank holds a resharded state, no
    rank's save: it must load what the same rank of the fault-free resize loaded (``rec.resized``)."""
    saves: dict[tuple[int, int], list[tuple[float, int, dict[str, Any]]]] = {}
    loads: list[tuple[float, int, int, dict[str, Any]]] = []
    for (rank, a), recs in rec.traces.items():
        for r in recs:
            info = _probe(r)
            if info is None or not isinstance(info.get("sha256"), str) or not isinstance(info.get("n"), int):
                continue
            if info.get("kind") == "saving":
                saves.setdefault((rank, info["n"]), []).append((float(r.get("ts") or 0.0), a, info))
            elif info.get("kind") == "resumed":
                loads.append((float(r.get("ts") or 0.0), rank, a, info))
    if not saves and not loads:
        return None
    if not loads:
        return Check("committed_state", "not_judged", "no resume announced the state it loaded "
                     "(probe.resumed(n, state)): nothing loaded to compare")
    if not saves:
        return Check("committed_state", "not_judged", "the job announces the state it loads but not the state it "
                     "saves (probe.saving(n, state)): nothing to compare it with")
    checked: list[dict[str, Any]] = []
    lost = shrink.lost_rank(rec.point, rec.traces)
    resized = _resized(rec, "committed_state")[0]
    unjudged: list[dict[str, Any]] = []
    for ts, rank, a, info in sorted(loads, key=lambda x: x[0]):
        n = info["n"]
        where = {"rank": rank, "attempt": a, "step": n}
        if lost is not None and a > 0:  # a resharded load: the fault-free resize's is the one to equal
            want_load = resized.loaded.get(rank) if resized is not None else None
            if want_load is None or want_load.get("n") != n:
                unjudged.append(where)
                continue
            if want_load.get("sha256") != info["sha256"]:
                return Check("committed_state", "fail", f"rank {rank} (attempt {a}, on one rank fewer) loaded step "
                             f"{n}, but not what the same rank of the fault-free resize from step {n} loaded",
                             {**where, "reference": resized.resized_from if resized else None, "checked": checked})
            checked.append({**where, "against": "the fault-free resize"})
            continue
        before = [s for s in saves.get((rank, n), []) if s[0] <= ts]
        if not before:
            return Check("committed_state", "fail", f"rank {rank} (attempt {a}) loaded step {n}, which no save of "
                         "that rank announced before it", {**where, "checked": checked})
        _ts, saved_in, want = before[-1]
        if want["sha256"] != info["sha256"]:
            mine, theirs = info.get("keys") or {}, want.get("keys") or {}
            keys = sorted(set(mine) | set(theirs))
            differ = [k for k in keys if mine.get(k) != theirs.get(k)]
            which = f" (first differing key: {differ[0]!r})" if differ else ""
            return Check("committed_state", "fail", f"rank {rank} (attempt {a}) loaded step {n}, but not the state "
                         f"its save of step {n} (attempt {saved_in}) was made from{which}",
                         {**where, "saved_in_attempt": saved_in, "differing_keys": differ[:20], "loaded": info["sha256"],
                          "saved": want["sha256"], "checked": checked})
        checked.append(where)
    if not checked:
        return Check("committed_state", "not_judged", "every load was on one rank fewer, and no fault-free resize "
                     "announced what it loaded at that step", {"not_judged": unjudged})
    note = f"; {len(unjudged)} load(s) on one rank fewer not judged (no fault-free resize's to equal)" if unjudged else ""
    return Check("committed_state", "pass", f"{len(checked)} load(s) each exactly the state saved at its step{note}",
                 {"checked": checked, **({"not_judged": unjudged} if unjudged else {})})


def _no_false_ack(rec: PointRecord) -> Check | None:
    """A save an injected error hurt is not acknowledged (``probe.saved(n)``) by the attempt it hit, unless a
    later resume loaded that step (a retry that worked); never after a failed fsync of its data. None where
    no error was injected (not asked).

    The built-in workload's ``no_false_ack`` with the same reader of the trace (``SaveScope``): an error
    hurts the save in progress (``probe.saving(n, state)``, or a ``save`` phase) only where it hit data
    that save made and had not yet made durable. Asked of an errno point only: a kill's torn write
    fires the same ``short_write`` record, and no process acknowledges anything after its death."""
    if rec.point.family != "errno":
        return None
    injured: list[dict[str, Any]] = []
    aside: list[dict[str, Any]] = []
    acked: set[tuple[int, int, int]] = set()  # (rank, attempt, step) acknowledged after an injury of that save
    announced = False
    for (rank, a), recs in sorted(rec.traces.items()):
        scope = SaveScope()
        hurt_here: set[int] = set()  # the steps of this trace's injured saves so far
        for r in recs:
            scope.see(r)
            announced = announced or scope.step is not None
            if r.get("event") == "fired" and r.get("action") in INJURIES:
                hit = scope.injury(r).get("save_changes") or []
                entry = {"rank": rank, "attempt": a, "step": scope.step, "failed_sync": r.get("op") in SYNC_OPS,
                         "what": f"{r['action']} at the {r.get('op')} of {_short(r.get('path'), rec.out)}"}
                if hit and scope.step is not None:
                    injured.append({**entry, "save_changes": [_short(h, rec.out) for h in hit]})
                    hurt_here.add(scope.step)
                else:
                    aside.append(entry)
            elif ((info := _probe(r)) is not None and info.get("kind") == "saved" and isinstance(info.get("n"), int)
                  and info["n"] in hurt_here):  # (an acknowledgement before the error is no lie)
                acked.add((rank, a, info["n"]))
    if not injured and not aside:
        return None
    if not announced:
        return Check("no_false_ack", "not_judged", "which save an injected error hit is unknown: the job announces "
                     "no save as it begins (probe.saving(n, state), or a chaos.phases 'save' phase)", {"aside": aside})
    loaded = {info["n"] for info in rec.probes(lambda a: a > 0, "resumed")}
    for hurt in injured:
        if (hurt["rank"], hurt["attempt"], hurt["step"]) not in acked:
            continue
        said = f"rank {hurt['rank']} acknowledged its save of step {hurt['step']} (probe.saved)"
        if hurt["failed_sync"]:
            return Check("no_false_ack", "fail", f"{said} although an fsync of its data failed ({hurt['what']}): "
                         "after a failed fsync the data may be gone", hurt)
        if hurt["step"] not in loaded:
            return Check("no_false_ack", "fail", f"{said} although it failed: {hurt['what']}", hurt)
    note = f"; {len(aside)} injur(ies) of nothing the save in progress made" if aside else ""
    return Check("no_false_ack", "pass", f"{len(injured)} injured save(s), none acknowledged falsely{note}",
                 {"injured": injured, "aside": aside})


def _results(job: JobSpec, golden: Golden, rec: PointRecord) -> Check:
    if not job.result_globs:
        return Check("result_files", "not_judged", "no --result-file: silent divergence is not judged")
    if not golden.results:
        return Check("result_files", "not_judged",
                      f"--result-file {' '.join(job.result_globs)} matched no file of the fault-free run")
    rtol = job.rtol if golden.tolerance else None
    checked = []
    for rel in golden.results:
        got = Path(rec.out) / rel
        if not got.exists():
            return Check("result_files", "fail", f"{rel}: missing after the resumed run",
                          {"file": rel, "difference": "missing", "checked": checked})
        diff = first_difference(Path(golden.out) / rel, got, rtol)
        if diff:
            return Check("result_files", "fail", f"{rel}: {diff}", {"file": rel, "difference": diff,
                                                                      "checked": checked, "rtol": rtol})
        checked.append(rel)
    how = f"within rtol {rtol:g} (tolerance mode)" if rtol is not None else "bit for bit"
    return Check("result_files", "pass", f"{len(checked)} result file(s) equal the fault-free run's {how}",
                  {"checked": checked, "rtol": rtol})


def step_of(name: str) -> int | None:
    """The step a ``--checkpoint-glob`` match names: the last number in it (None: it has none)."""
    nums = re.findall(r"\d+", name)
    return int(nums[-1]) if nums else None


def _probe(r: dict[str, Any]) -> dict[str, Any] | None:
    """A ``chaos.probe`` announcement's info (probe call, --step-regex or --loss-regex line), else None."""
    if r.get("event") == "phase" and r.get("name") == "chaos.probe" and isinstance(r.get("info"), dict):
        return r["info"]
    return None


def resumed_at(rec: PointRecord, rank: int, golden: Golden | None = None) -> tuple[int | None, str, dict[str, Any]]:
    """Where rank ``rank``'s first restart started (None: unknown), how that is known, and each source
    seen where they disagree (evidence: ``--step-regex`` is never silently overruled by ``--loss-regex``)."""
    struck = max(_struck(rec))  # after a second fault, the restart after it
    first = min((a for (r, a) in rec.traces if r == rank and a > struck), default=None)
    if first is None:
        return 0, "no trace of a restart", {}
    recs = rec.traces[(rank, first)]
    infos = [(i, info) for i, r in enumerate(recs) if (info := _probe(r)) is not None]
    resumed = [info["n"] for _i, info in infos if info.get("kind") == "resumed"]
    if resumed:
        return min(resumed), "chaos.probe.resumed", {}
    stepped = next((info for _i, info in infos if info.get("kind") in ("step", "loss")), None)
    regex = next(((i, info) for i, info in infos if info.get("kind") == "regex"), None)
    seen: dict[str, int] = {}
    if stepped is not None:
        seen["first chaos.probe.step or --loss-regex line, minus one"] = stepped["n"] - 1
    if regex is not None:
        i, info = regex
        # the same output line announced as a step (a loss line, or probe.step next to it): a step ran
        near = [_probe(recs[j]) for j in (i - 1, i + 1) if 0 <= j < len(recs)]
        step_line = any(x is not None and x.get("kind") in ("step", "loss") and x.get("n") == info["n"] for x in near)
        at = info["n"] - 1 if step_line else info["n"]
        how = ("first --step-regex match after the restart, a step line: minus one" if step_line
               else "first --step-regex match after the restart")
        seen[how] = at
        return at, how, {"resume_sources": seen} if len(set(seen.values())) > 1 else {}
    if stepped is not None:
        return stepped["n"] - 1, "first chaos.probe.step (or --loss-regex line) after the restart, minus one", {}
    end = golden.last_steps.get(rank) if golden is not None else None
    if end is not None and rec.attempts and rec.attempts[-1].ok:
        return end, (f"the restart finished announcing no step, where the fault-free run announced steps up to "
                     f"{end}: it had none left to train"), {}
    if golden is not None and end is None:
        return None, "unknown: the job announces no step (no probe call, no --step-regex or --loss-regex match)", {}
    return 0, "no resume seen (no probe call, no --step-regex match): from scratch", {}


def _saving_step(rec: PointRecord) -> int | None:
    """The step the halted rank was at when it completed the corrupted file (its last announced
    step before event N: for a corruption deferred to a later step, ``at_step``, not the halt's
    step), if it announced any. The built-in ``ckpt:stepS:KIND`` strikes the newest checkpoint, whose
    step ``chaos.nemesis.newest`` recorded (``checkpoint_step``)."""
    known = rec.applied.record.get("checkpoint_step") if rec.applied is not None else None
    if rec.point.strikes_newest and isinstance(known, int):
        return known
    n = None
    halt = halt_record(rec.traces, rec.point.rank)
    event = halt.get("ord") if halt is not None else rec.point.op  # an anchored point's ordinal may have moved
    for r in rec.traces.get((rec.point.rank, 0), []):
        if r.get("event") == "op" and event is not None and r.get("ord") == event:
            return n
        if r.get("event") == "fired" and r.get("action") == "halt":
            return n
        if r.get("event") == "phase" and r.get("name") == "chaos.probe" and r.get("info", {}).get("kind") in STEP_KINDS:
            n = r["info"]["n"]
    return n


def _holds(name: str, files: list[str]) -> bool:
    return any(f == name or f.startswith(name.rstrip(os.sep) + os.sep) for f in files)


# -- what the job relied on, from its trace alone (no probe): see ``relied_on``

@dataclass
class _Version:
    """One version of one file as a rank wrote it (``_track``): from the event that began it to
    the one that finished it, and what then made the job rely on it."""

    rank: int
    path: str                    # relative to {out}; absolute outside it (a temp file)
    step: int | None             # the last step the rank announced before it began writing it
    done: int | None = None      # the event that finished it: its close, or the rename that put it in place
    done_ts: float = 0.0
    since: str | None = None     # what made the job rely on it (None: nothing yet)
    append: bool = False         # written in append mode: a log, never a checkpoint
    failed: bool = False         # a write, a close or an fsync of it failed
    moved_in: str | None = None  # put in place by a rename from a file no traced event wrote


def _track(rank: int, recs: list[dict[str, Any]], root: str, cut: float | None, announces: bool,
           unit: Any) -> list[_Version]:
    """Every file version rank ``rank`` had left when it stopped (or at ``cut``), from its trace.

    A version is begun by a truncating or creating open (or a write to a finished one) and
    finished by its close, or by the rename that puts it in place (a version renamed is
    finished anew there: the job relies on the name it loads). The job relies on it once it
    went on: the rank announced a step after it was finished, or, for a rank that announces
    no step at all, did any file event outside the checkpoint it belongs to (``unit``: its
    ``--checkpoint-glob`` match, else the file itself; events on directories do not count).
    The job's own truncation, rewrite, unlink or rename over it ends it."""
    vers: dict[str, _Version] = {}
    waiting: list[_Version] = []  # finished, not relied on yet
    step: int | None = None

    def key(p: Any) -> str | None:
        if not isinstance(p, str) or p == root:
            return None
        return os.path.relpath(p, root) if p.startswith(root + os.sep) else p

    for r in recs:
        ts = r.get("ts", 0.0)
        if cut is not None and ts > cut:
            break
        info = _probe(r)
        if info is not None:
            if info.get("kind") in STEP_KINDS:
                step = int(info["n"])
                for v in waiting:
                    v.since = f"step {step} announced after it"
                waiting.clear()
            continue
        if r.get("event") != "op":
            continue
        op, p = r.get("op"), key(r.get("path"))
        if r.get("error") is not None:
            v = vers.get(p) if p is not None else None
            if v is not None and v.done is None and op in ("write", "truncate", "fsync", "fdatasync", "close"):
                v.failed = True
            continue
        if p is None or r.get("is_dir"):
            continue
        if not announces:
            here = unit(p) if not os.path.isabs(p) else p
            for v in waiting:
                if v.path != p and (os.path.isabs(v.path) or unit(v.path) != here):
                    v.since = f"a later file event ({op} of {p}, event {r.get('ord')})"
            waiting[:] = [v for v in waiting if v.since is None]
        if op == "open":
            if opens_for_writing(r) and (r.get("trunc") or r.get("created") or p not in vers):
                vers[p] = _Version(rank, p, step, append="a" in str(r.get("mode") or "")
                                   or "append" in (r.get("flags") or ()))
        elif op in ("write", "truncate"):
            v = vers.get(p)
            if v is None or v.done is not None:
                vers[p] = _Version(rank, p, step, append=v.append if v is not None else False)
        elif op == "close":
            v = vers.get(p)
            if v is not None and v.done is None:
                v.done, v.done_ts = r.get("ord"), ts
                waiting.append(v)
        elif op in ("rename", "link"):
            src, dst = key(r.get("src")), key(r.get("dst")) or p
            for k in [k for k in vers if under(k, dst)]:
                del vers[k]  # replaced
            moved = {k: v for k, v in vers.items() if src is not None and under(k, src)}
            for k, v in moved.items():
                if op == "rename":
                    del vers[k]
                new = dataclasses.replace(v, path=dst + k[len(src):])  # type: ignore[arg-type]
                if new.done is not None:
                    new.done, new.done_ts, new.since = r.get("ord"), ts, None
                    waiting.append(new)
                vers[new.path] = new
            if not moved and r.get("src_kind") != "dir":
                vers[dst] = _Version(rank, dst, step, r.get("ord"), ts,
                                     moved_in=str(r.get("src_untraced") or r.get("src")))
                waiting.append(vers[dst])
        elif op in ("unlink", "rmdir"):
            for k in [k for k in vers if under(k, p)]:
                del vers[k]
    return list(vers.values())


@dataclass
class Relied:
    """A checkpoint the job relied on when it was stopped (``relied_on``), with how each part is known."""

    name: str                # the file, or its --checkpoint-glob match (relative to {out})
    rank: int | None         # the rank that wrote it, whose resume it bounds; None: every rank's (a glob match)
    step: int | None         # the step it holds; None: unknown
    step_from: str           # how the step is known, or why it is not
    since: str               # what made the job rely on it
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "step": self.step, "step_from": self.step_from,
                "since": self.since, "files": self.files[:8]}


def _glob_unit(pattern: str | None, rel: str) -> str | None:
    """The ``--checkpoint-glob`` match holding ``rel`` (glob's rules, as ``explore.checkpoint_state``
    matches: ``*`` stays within a name and skips hidden ones), or None."""
    if pattern is None:
        return rel
    pat = [x for x in pattern.replace("{out}/", "").replace("{out}", "").split("/") if x]
    parts = rel.split(os.sep)
    if not pat or len(parts) < len(pat):
        return None
    for x, y in zip(pat, parts, strict=False):
        if (y.startswith(".") and not x.startswith(".")) or not fnmatch.fnmatchcase(y, x):
            return None
    return os.sep.join(parts[:len(pat)])


def relied_on(job: JobSpec, golden: Golden, rec: PointRecord) -> list[Relied]:
    """The checkpoints the killed attempt relied on when it stopped — before the cut of a power loss,
    not counting what the harness corrupted — inferred from its trace (``_track``).

    With ``--checkpoint-glob``, each match that held files when attempt 0 ended, every one of
    them a version the job relied on; its step is the number in its name, else the last step
    announced before its files were written. Without, each file the job relied on that is no
    result file and was not appended to; its step comes from the trace only."""
    applied = rec.applied
    cuts = _cuts(rec)
    excluded = list(applied.excluded) if applied is not None else []
    root = os.path.realpath(rec.out)
    pattern = job.checkpoint_glob

    def unit(rel: str) -> str:
        return _glob_unit(pattern, rel) or rel

    versions: list[_Version] = []
    struck = _struck(rec)
    for (rank, a), recs in sorted(rec.traces.items()):
        if a in struck:  # up to a power cut's moment where one cut that attempt (_cuts)
            announces = any((i := _probe(r)) is not None and i.get("kind") in STEP_KINDS for r in recs)
            versions += _track(rank, recs, root, cuts.get(a), announces, unit)
    # A corrupted file spoils its whole save: every file its rank wrote for the same step
    # (ckpt-6.pt corrupted, ckpt-6.pt.sha256 beside it is no checkpoint to rely on either).
    spoiled = {(v.rank, v.step) for v in versions if v.step is not None and _holds(v.path, excluded)}
    if rec.point.strikes_newest and applied is not None and applied.excluded and applied.ranks:
        spoiled |= {(r, _saving_step(rec)) for r in applied.ranks}  # the built-in ckpt:: every rank's newest
    usable = {v.path: v for v in versions if v.done is not None and v.since is not None and not v.append
              and not v.failed and not os.path.isabs(v.path) and not _holds(v.path, excluded)
              and (v.rank, v.step) not in spoiled}
    out: list[Relied] = []
    if pattern is None:
        results = set(golden.results)
        globs = job.relative_globs(job.result_globs)
        for v in usable.values():
            if v.path in results or any(fnmatch.fnmatchcase(v.path, g) for g in globs):
                continue
            how = "the last step announced before it was written" if v.step is not None else (
                "unknown: no step was announced before it was written")
            out.append(Relied(v.path, v.rank, v.step, how, _finished(v), [v.path]))
        return out
    for name, files in sorted((rec.at_cut() or {}).items()):
        paths = [name if sub == "" else os.path.join(name, sub) for sub in files]
        mine = [usable.get(p) for p in paths]
        if not paths or _holds(name, excluded) or any(v is None for v in mine):
            continue
        vs = [v for v in mine if v is not None]
        last = max(vs, key=lambda v: v.done_ts)
        named = step_of(name)
        steps = [v.step for v in vs]
        if named is not None:
            step, how = named, "the number in its name"
        elif all(s is not None for s in steps):
            step, how = max(s for s in steps if s is not None), "the last step announced before it was written"
        else:
            step, how = None, "unknown: its name carries no number and no step was announced before it was written"
        out.append(Relied(name, None, step, how, _finished(last), paths))
    return out


def _finished(v: _Version) -> str:
    made = f"moved into place from {v.moved_in}, written by no traced event, " if v.moved_in else ""
    return f"{made}finished at rank {v.rank}'s event {v.done}, then {v.since}"


def _durability(job: JobSpec, golden: Golden, rec: PointRecord) -> Check:
    """Per rank: each rank's restart must start at or after the newest checkpoint *it* could rely on."""
    applied = rec.applied
    cuts = _cuts(rec)
    excluded = list(applied.excluded) if applied is not None else []
    saving = _saving_step(rec) if excluded else None
    damaged = set(applied.ranks) if applied is not None and applied.ranks else {rec.point.rank}
    evidence: dict[str, Any] = {}
    if cuts:
        evidence["acknowledged_before"] = {"cut_ts": cuts.get(0, max(cuts.values())),
                                           **({"cut_ts_by_attempt": {str(a): t for a, t in sorted(cuts.items())}}
                                              if set(cuts) != {0} else {}),
                                           "why": "a power loss: later acknowledgements never happened"}
    if excluded:
        evidence["not_relied_on"] = {"files": excluded, "acknowledged_from_step": saving,
                                     "ranks": sorted(damaged),
                                     "why": "corrupted by the harness after the job completed them"}
    ranks_seen = {r for (r, _a) in rec.traces}  # (after a lost rank: attempt 0's numbers, as offered below)
    lost = shrink.lost_rank(rec.point, rec.traces)
    if lost is not None:  # the restarts ran on one rank fewer, those above the lost one numbered down
        ranks_seen = {r for (r, a) in rec.traces if a == 0}
        evidence["lost_rank"] = {"rank": lost, "why": "killed with lost=true: the restarts ran without it, rank "
                                 f"k > {lost} of a restart being rank k + 1 of attempt 0"}
    newest: dict[int, tuple[int, str]] = {}

    def offer(rank: int, n: int, source: str) -> None:
        """What attempt-0 rank ``rank`` could rely on, kept under the number its restart runs as."""
        mine = rank if lost is None else shrink.new_rank(rank, lost)
        if mine is not None and (mine not in newest or n > newest[mine][0]):
            newest[mine] = (n, source)

    struck = _struck(rec)
    for (rank, a), recs in rec.traces.items():
        if a not in struck:
            continue
        acked = [r["info"]["n"] for r in recs if r.get("event") == "phase" and r.get("name") == "chaos.probe"
                 and r.get("info", {}).get("kind") == "saved"
                 and (a not in cuts or r.get("ts", 0.0) <= cuts[a])
                 and not (a == 0 and saving is not None and rank in damaged and r["info"]["n"] >= saving)]
        if acked:
            offer(rank, max(acked), "chaos.probe.saved")
    if rec.after_kill is not None:
        complete = sorted(s for name, files in rec.after_kill.items()
                          if golden.checkpoints.get(name) == files and not _holds(name, excluded)
                          and (s := step_of(name)) is not None)
        evidence["complete_checkpoints_after_kill"] = complete
        if complete:  # a checkpoint on disk is every rank's to resume from
            for rank in ranks_seen:
                offer(rank, complete[-1], "--checkpoint-glob")
    relied = relied_on(job, golden, rec)
    if relied:
        evidence["relied_on"] = [r.to_dict() for r in relied[-20:]]
    for r in relied:
        if r.step is not None:
            what = "relied on " + ("before the power loss" if cuts else "when it was stopped")
            for rank in (ranks_seen if r.rank is None else {r.rank}):
                offer(rank, r.step, f"{r.name} {what}: {r.since}; step {r.step}: {r.step_from}")
    if rec.untraced:
        evidence["untraced_changes"] = rec.untraced[:20]
    if not newest:
        why = _unjudged(job, golden, rec, relied)
        if why:
            return Check("durability", "not_judged", f"lost work not judged: {why}", evidence)
        return Check("durability", "pass", "no checkpoint the job relied on when it was stopped: nothing to lose",
                      evidence)
    restarted = len(rec.attempts) > len(struck) or any(a > max(struck) for (_r, a) in rec.traces)
    if not restarted:
        return Check("durability", "not_judged", "lost work not judged: the job was never restarted", evidence)
    ranks = {}
    worst: tuple[int, int, int, str] | None = None
    unknown: list[int] = []
    for rank, (n, source) in sorted(newest.items()):
        at, how, seen = resumed_at(rec, rank, golden)
        ranks[str(rank)] = {"newest_complete": n, "source": source, "resumed_at": at, "resumed_by": how, **seen}
        if at is None:
            unknown.append(rank)
        elif at < n and (worst is None or n - at > worst[1] - worst[2]):
            worst = (rank, n, at, source)
    evidence["ranks"] = ranks
    unjudged = ""
    if worst is None and unknown:
        rank = unknown[0]
        why = (f"rank {rank} relied on its checkpoint of step {newest[rank][0]}, but where its restart resumed is "
               "unknown: it announces no step (give --step-regex or --loss-regex, or call chaos.probe.resumed / "
               "chaos.probe.step)")
        if len(unknown) == len(ranks):
            return Check("durability", "not_judged", f"lost work not judged: {why}", evidence)
        unjudged = f"; lost work not judged for rank(s) {', '.join(map(str, unknown))}: {why}"
    if worst is not None:
        rank, n, at, source = worst
        lost = "from scratch" if at == 0 else f"from step {at}"
        return Check("durability", "fail", f"rank {rank} resumed {lost}, but its checkpoint of step {n} was "
                      f"complete ({source}): {n - at} step(s) of work lost", evidence)
    summary = ", ".join(f"rank {r} at step {v['resumed_at']} (newest complete: {v['newest_complete']})"
                        for r, v in ranks.items() if v["resumed_at"] is not None)
    return Check("durability", "pass", f"resumed at or after the newest complete checkpoint: {summary}{unjudged}",
                  evidence)


def _unjudged(job: JobSpec, golden: Golden, rec: PointRecord, relied: list[Relied]) -> str | None:
    """Why lost work cannot be judged at a point where no checkpoint's step is known (None: it can:
    the job announces steps, and nothing it finished was trained past — nothing to lose)."""
    if job.checkpoint_glob is not None and not golden.checkpoints:
        return (f"--checkpoint-glob {job.checkpoint_glob} matched no file the fault-free run left, so no "
                "checkpoint of it can be judged complete")
    unknown = [r for r in relied if r.step is None]
    if unknown:
        r = unknown[-1]
        return (f"the job relied on {r.name} ({r.since}), but the step it holds is {r.step_from} (give "
                "--step-regex or --loss-regex, or call chaos.probe.step / chaos.probe.saved)")
    if rec.untraced:
        names = ", ".join(str(u.get("file")) for u in rec.untraced[:3])
        return (f"{len(rec.untraced)} file(s) under {{out}} changed that no traced event explains ({names}): "
                "what the job relied on there cannot be seen")
    announced = any(a == 0 and any((i := _probe(r)) is not None and i.get("kind") in STEP_KINDS for r in recs)
                    for (_rk, a), recs in rec.traces.items())
    if not announced and not golden.acks:
        return ("no step is known: the job announced none (give --step-regex or --loss-regex, or call "
                "chaos.probe.step / chaos.probe.saved)")
    return None


def _loss(job: JobSpec, golden: Golden, rec: PointRecord) -> Check:
    """Every step's loss of every attempt against the fault-free curve (``losscurve``)."""
    if not golden.losses:
        why = (f"--loss-regex {job.loss_regex!r} matched no line of the fault-free run" if job.loss_regex else
               "no loss seen: call chaos.probe.step(n, loss) or give --loss-regex")
        return Check("loss_continuity", "not_judged", why)
    band = losscurve.band_for(job.loss_band, golden.tolerance)
    got = losscurve.continuity(golden.losses, job.world_size, rec.traces, band, golden.loss_source)
    summary = got.summary
    if band == 0.0:
        summary = summary.replace(f"within {band:.3%} of the golden loss", "equal to the fault-free loss")
    return Check("loss_continuity", "pass" if got.passed else "fail", summary, got.evidence)


def last_steps(traces: dict[tuple[int, int], list[dict[str, Any]]], attempt: int = 0) -> dict[int, int]:
    """Rank -> the last step it announced in ``attempt`` (probe.step, a --step-regex or --loss-regex line)."""
    out: dict[int, int] = {}
    for (rank, a), recs in traces.items():
        steps = [int(r["info"]["n"]) for r in recs if a == attempt and r.get("event") == "phase"
                 and r.get("name") == "chaos.probe" and r.get("info", {}).get("kind") in STEP_KINDS]
        if steps:
            out[rank] = max(steps)
    return out


def _no_code_execution(rec: PointRecord) -> Check:
    """A payload point: loading the checkpoint never ran the code planted in it.

    ``chaos.nemesis.payload`` planted, in the file's own format (a pickle, a ``torch.save`` zip), data
    whose unpickling creates a marker file; ``explore`` looked for it after every restart
    (``marker.checks``) and recorded which traced processes opened the file again. The marker
    existing fails: the job unpickles its checkpoint with code execution allowed
    (``torch.load(weights_only=False)``, ``pickle.load``), so whoever can write the file can
    run code as the job. A marker never looked for is not judged, never passed.
    """
    record = rec.applied.record if rec.applied is not None else {}
    marker = record.get("marker") if isinstance(record.get("marker"), dict) else None
    rel = record.get("file")
    evidence = {"file": rel, "format": record.get("format"), "marker": marker,
                "opened_after_planting": record.get("opened_after_planting", [])}
    if marker is None or not marker.get("checks"):
        return Check("no_code_execution", "not_judged", f"the payload's marker in {rel} was never looked for "
                      "(no restart ran after the planting)", evidence)
    readers = sorted({f"rank {o['rank']}" for o in evidence["opened_after_planting"] if isinstance(o, dict)})
    if marker.get("exists"):
        who = f" ({', '.join(readers)} opened it)" if readers else ""
        return Check("no_code_execution", "fail", f"loading {rel} ran the code planted in it{who}: its marker "
                      f"appeared after {marker.get('first_seen')}; the job unpickles its checkpoint with code "
                      "execution allowed (torch.load(weights_only=False) or pickle.load): whoever can write the "
                      "file runs code as the job", evidence)
    how = (f"{' and '.join(readers)} opened it again and the loader refused it" if readers else
           "no traced process opened it again")
    return Check("no_code_execution", "pass", f"the payload planted in {rel} never ran ({how})", evidence)


def _preemption_exit(golden: Golden, rec: PointRecord) -> Check | None:
    """A term point: the SIGTERMed attempt must not exit 0 unless it had finished.

    A supervisor restarts what failed: torchelastic, a Kubernetes Job's ``OnFailure``, a
    Slurm requeue on failure all take status 0 for "done". A preempted job that saved and
    exits 0 mid-run is never restarted there; the harness restarts it regardless (to judge
    the resume), so this oracle is what notices. None: not a term point, or no SIGTERM sent.
    """
    first = rec.attempts[0] if rec.attempts else None
    if rec.point.mode != "term" or first is None or first.term is None:
        return None
    codes = first.returncodes
    end = golden.last_steps.get(rec.point.rank)
    reached = last_steps(rec.traces).get(rec.point.rank)
    evidence = {"returncodes": codes, "last_step": reached, "fault_free_last_step": end}
    if not codes or any(rc != 0 for rc in codes):
        return Check("preemption_exit", "pass", f"{first.describe}: a supervisor sees a stopped job and "
                      "restarts it", evidence)
    if end is None or reached is None or reached >= end:
        return Check("preemption_exit", "pass", "the SIGTERMed attempt exited 0 having reached the fault-free "
                      f"run's last step ({end})" if end is not None else "exited 0; the last step is unknown "
                      "(nothing announced steps)", evidence)
    return Check("preemption_exit", "fail", f"the SIGTERMed job exited with status 0 at step {reached} of {end}: "
                  "a supervisor that restarts failed jobs (torchelastic, a Kubernetes Job with restartPolicy "
                  "OnFailure, Slurm requeue) takes the preempted run for a finished one and never resumes it",
                  evidence)


@dataclass
class PointVerdict:
    verdict: str   # pass | fail | skipped | error (the results schema's)
    outcome: str   # pass | code_execution | hard_failure | silent_divergence | lost_work | not_reached | no_effect | unsupported | error
    summary: str
    oracles: dict[str, Check]
    fault: dict[str, Any] | None = None  # what the harness did beyond the kill (corruption, crash state, ...)


def _fault(rec: PointRecord, fired: list[dict[str, Any]]) -> tuple[str | None, dict[str, Any] | None]:
    """One line and the record of what the point did beyond a plain kill (None, None for a kill)."""
    p = rec.point
    if rec.applied is not None:
        return rec.applied.what, rec.applied.to_dict()
    if p.mode == "term" and rec.attempts and rec.attempts[0].term is not None:
        return rec.attempts[0].describe, {"what": rec.attempts[0].describe, **rec.attempts[0].term}
    if p.rule is not None and fired:  # a built-in I/O fault (its rule); not any built-in spelling
        what = _io_line(p, fired, rec.out)
        return what, {"what": what, "fired": fired}
    if p.family == "errno" and fired:
        f = fired[0]
        code = {"enospc": errno.ENOSPC, "eio": errno.EIO, "fsync_fail": errno.EIO}.get(f.get("action"), errno.EIO)
        what = (f"rank {p.rank}'s {f.get('op')} of {_short(f.get('path'), rec.out)} (event {f.get('ord')}) raised "
                f"{errno.errorcode[code]}{' (a failed fsync)' if f.get('action') == 'fsync_fail' else ''}")
        later = [x for x in fired[1:] if x.get("action") == "enospc"]
        if later:
            what += (f"; the disk staying full, {len(later)} later event(s) failed too "
                     f"({', '.join(sorted({str(x.get('op')) for x in later}))})")
        after = next((x for x in fired[1:] if x.get("when") == "after_error"), None)
        if after is not None:
            what += f"; the job carried on and was killed at its next step ({after.get('step_n')})"
        return what, {"what": what, "fired": fired}
    if p.lost and fired and rec.attempts:
        size = len(rec.attempts[-1].logs) if len(rec.attempts) > 1 else None
        ran = f"the restarts ran on {size} rank(s)" if size is not None else "the job was not restarted"
        what = f"{_kill_line(p, fired)}{f' (phase {p.phase})' if p.phase else ''}, lost for good: {ran}"
        return what, {"what": what, "fired": fired, "lost_rank": p.rank, "restart_ranks": size}
    return None, None


def _io_line(p: Point, fired: list[dict[str, Any]], out: str) -> str:
    """What a built-in I/O fault's rule did in the job (``Point.rule``), in the words of the errno points'."""
    f = fired[0]
    spec = f.get("spec") if isinstance(f.get("spec"), dict) else {}
    at = f"{f.get('op')} of {_short(f.get('path'), out)} (event {f.get('ord')})"
    action = f.get("action")
    if action == "kill":
        did = (f"rank {p.rank} killed in its {at}, having written {f.get('written')} of its {f.get('length')} bytes"
               if spec.get("byte") is not None else f"rank {p.rank} killed before its {at}")
    elif action == "short_write":
        did = f"rank {p.rank}'s {at} stored {f.get('written')} of its {f.get('length')} bytes, then the rank was killed"
    elif action == "delay":
        did = f"rank {p.rank}'s {at} was delayed {spec.get('delay_s')} s"
    else:
        did = f"rank {p.rank}'s {at} raised {'ENOSPC' if action == 'enospc' else 'EIO'}" + (
            " (a failed fsync)" if action == "fsync_fail" else "")
    after = next((x for x in fired[1:] if x.get("when") == "after_error"), None)
    if after is not None:
        did += f"; the job carried on and was killed at its next step ({after.get('step_n')})"
    return did


def _resized(rec: PointRecord, name: str) -> tuple[Golden | None, Check | None]:
    """The fault-free resize a point whose rank was lost for good is judged against (``rec.resized``), or
    the ``name`` check's not-judged line where there is none."""
    if isinstance(rec.resized, Golden) and rec.resized.resized_from is not None:
        return rec.resized, None
    why = rec.resized if isinstance(rec.resized, str) else "no fault-free resize was run for this point"
    return None, Check(name, "not_judged", f"the job resumed on one rank fewer, and {why}")


def _resized_results(job: JobSpec, rec: PointRecord) -> Check:
    """After a rank lost for good: the result files against the fault-free resize's, not the golden run's
    (each rank of a smaller world trains on other batches)."""
    ref, unjudged = _resized(rec, "result_files")
    if ref is None or ref.resized_from is None:
        return unjudged or Check("result_files", "not_judged", "no fault-free resize")
    step, made_by = ref.resized_from
    got = _results(job, ref, rec)
    got.summary = got.summary.replace("the fault-free run's", f"the fault-free resize's from step {step}")
    if got.result == "fail":
        got.summary += f" (against the fault-free resize from step {step}, {made_by})"
    if isinstance(got.evidence, dict):
        got.evidence["reference"] = {"resumed_at": step, "point": made_by, "out": ref.out,
                                     "why": "the same job shrunk after a clean stop right after that save"}
    return got


def _resized_loss(job: JobSpec, golden: Golden, rec: PointRecord, lost: int) -> Check:
    """After a rank lost for good: attempt 0's losses against the golden run, the restarts' against the
    fault-free resize's restart."""
    ref, unjudged = _resized(rec, "loss_continuity")
    before = _loss(job, golden, dataclasses.replace(rec, traces={k: v for k, v in rec.traces.items() if k[1] == 0}))
    if before.failed or ref is None or ref.resized_from is None:
        return before if before.failed or unjudged is None else unjudged
    size = job.world_size - 1
    # the restarts alone, after an empty attempt 0: the first of them is a resume (its spike window judged)
    restarts = {(0, 0): [], **{k: v for k, v in rec.traces.items() if k[1] > 0}}
    after = _loss(dataclasses.replace(job, ranks=size), ref, dataclasses.replace(rec, traces=restarts))
    evidence = {"before_the_loss": before.evidence, "after_the_loss": after.evidence,
                "reference": {"resumed_at": ref.resized_from[0], "point": ref.resized_from[1]}}
    where = f"on {size} rank(s) after rank {lost} was lost, against the fault-free resize from step {ref.resized_from[0]}"
    if after.result != "pass":
        return Check("loss_continuity", after.result, f"{where}: {after.summary}", evidence)
    return Check("loss_continuity", before.result, f"before the loss, {before.summary}; {where}, {after.summary}",
                 evidence)


def _kill_line(p: Point, fired: list[dict[str, Any]]) -> str:
    """A plain kill's line, where a second fault follows it (a lone kill's verdict needs none)."""
    f = fired[0] if fired else {}
    return (f"rank {p.rank} killed at step {p.step}" if p.step is not None else
            f"rank {p.rank} killed {p.mode} its event {f.get('ord', p.op)} ({f.get('op', p.kind)})")


def _second(rec: PointRecord) -> str | None:
    """What the second fault did in the restart, or None where it never fired."""
    then = rec.point.then
    assert then is not None
    struck = _struck(rec)
    if len(struck) < 2:
        return None
    f = next(r for r in rec.traces[(then.rank, struck[-1])] if r.get("event") == "fired")  # (_struck saw it)
    on = _short(f.get("path"), rec.out) if f.get("path") else "?"
    if then.mode == "power":  # the harness's own cut, made once the restart halted (power.in_restart)
        did = rec.second.what if rec.second is not None and not rec.second.skipped else "no power loss made"
        return f"in the restart, after rank {then.rank}'s event {f.get('ord')} ({f.get('op')} of {on}): {did}"
    return f"in the restart, rank {then.rank} killed {then.mode} its event {f.get('ord')} ({f.get('op')} of {on})"


def _cuts(rec: PointRecord) -> dict[int, float]:
    """The moment of each power cut, by the attempt it cut: attempt 0's own (a power point), the
    restart's (a second fault's, ``+rankR:opN:power``). Later acknowledgements never happened."""
    out: dict[int, float] = {}
    if rec.applied is not None and rec.applied.cut_ts is not None:
        out[0] = rec.applied.cut_ts
    struck = _struck(rec)
    if rec.second is not None and rec.second.cut_ts is not None and len(struck) > 1:
        out[struck[-1]] = rec.second.cut_ts
    return out


def _short(path: Any, out: str) -> str:
    root = os.path.realpath(out)
    if path == root:
        return "{out}"
    if isinstance(path, str) and path.startswith(root + os.sep):
        return os.path.relpath(path, root)
    return str(path)


def _node_no_effect(rec: PointRecord) -> str | None:
    return nodes.no_effect(rec)


def judge(job: JobSpec, golden: Golden, rec: PointRecord) -> PointVerdict:
    """The verdict of one point. A point that never fired, or whose fault did nothing, is *skipped*, never a pass."""
    p = rec.point
    fired = [f for f in rec.fired() if f["attempt"] == 0 and f["rank"] == p.rank]
    applied = rec.applied
    if p.family == "diskfull":
        if applied is None:
            return PointVerdict("error", "error", "the full-disk point left no record", {})
        fired = [{"action": "diskfull", **applied.record}]
    if p.family == "net" and applied is not None and applied.skipped and not rec.attempts:
        return PointVerdict("skipped", applied.outcome, applied.skipped, {}, applied.to_dict())
    if not fired:
        traced = any(a == 0 for (_r, a) in rec.traces)
        why = ("the point was not reached: the job's file events differed from the fault-free run's" if traced
               else "no trace from the killed attempt: the tracer was not installed (see the job's output)")
        if traced and p.step is not None:
            why = f"the point was not reached: rank {p.rank} announced no step {p.step} in the armed attempt"
        if traced and p.rule is not None:
            why = f"the point was not reached: no file event of rank {p.rank} matched {p.builtin}"
        live = _liveness(job, rec)
        return PointVerdict("skipped" if traced else "error", "not_reached" if traced else "error", why,
                            {"liveness": live})
    what, fault = _fault(rec, fired)
    if p.then is not None:
        second = _second(rec)
        if second is None:
            return PointVerdict("skipped", "not_reached", f"{what or 'the first fault fired'}; then the restart "
                                f"never reached its event {p.then.op} on rank {p.then.rank}, where the second fault "
                                "waited (the restart made fewer file events, or exited early)",
                                {"liveness": _liveness(job, rec)}, fault)
        what = f"{what}; {second}" if what else f"{_kill_line(p, fired)}; {second}"
        if rec.second is not None and rec.second.skipped:  # the restart's power cut would have done nothing
            return PointVerdict("skipped", rec.second.outcome, f"{what}: {rec.second.skipped}",
                                {"liveness": _liveness(job, rec)}, fault)
    if p.family == "node" and what and not (applied is not None and applied.skipped):
        what = f"{what}; {nodes.outcome_phrase(rec)}"  # survived, or died and was relaunched
    if applied is not None and applied.skipped:
        oracles = {"liveness": _liveness(job, rec)} if rec.attempts else {}
        return PointVerdict("skipped", applied.outcome, applied.skipped, oracles, fault)
    if p.mode == "term" and rec.attempts and rec.attempts[0].term is None:
        return PointVerdict("skipped", "not_reached", f"rank {p.rank} asked for SIGTERM at step {p.step}, but the "
                            "launcher never sent it", {"liveness": _liveness(job, rec)})
    oracles = {"liveness": _liveness(job, rec)}
    if fault is not None:
        oracles["liveness"].evidence["fault"] = fault
    if rec.second is not None:  # the power cut the harness made in the restart: what it lost
        oracles["liveness"].evidence["second_fault"] = rec.second.to_dict()
    if rec.untraced:
        oracles["liveness"].evidence["untraced_changes"] = rec.untraced[:20]
    if p.mode == "payload":
        oracles["no_code_execution"] = _no_code_execution(rec)

    def verdict(v: str, outcome: str, summary: str) -> PointVerdict:
        line = f"{what}; then {summary}" if what else summary
        if v == "fail" and rec.untraced and "no traced event" not in line:
            line += f" ({untraced_line(rec.untraced)})"  # what the failure may come from, that no event shows
        return PointVerdict(v, outcome, line, oracles, fault)

    for name, asked in (("committed_state", _committed_state(rec)), ("no_false_ack", _no_false_ack(rec))):
        if asked is not None:  # (only where the job announces what they need, or an error was injected)
            oracles[name] = asked
    if oracles["liveness"].failed:
        oracles["result_files"] = Check("result_files", "not_judged", "the job did not finish")
        oracles["durability"] = _durability(job, golden, rec) if rec.attempts else Check(
            "durability", "not_judged", "the job did not finish")
    elif (lost := shrink.lost_rank(p, rec.traces)) is not None:  # the restarts ran on one rank fewer
        oracles["result_files"] = _resized_results(job, rec)
        oracles["loss_continuity"] = _resized_loss(job, golden, rec, lost)
        oracles["durability"] = _durability(job, golden, rec)
    else:
        oracles["result_files"] = _results(job, golden, rec)
        oracles["loss_continuity"] = _loss(job, golden, rec)
        oracles["durability"] = _durability(job, golden, rec)
        preempted = _preemption_exit(golden, rec)
        if preempted is not None:
            oracles["preemption_exit"] = preempted
    failing = next(((name, outcome) for name, outcome in VERDICT_ORDER
                    if name in oracles and oracles[name].failed), None)
    if failing is not None:
        return verdict("fail", failing[1], oracles[failing[0]].summary)
    if p.family == "net" and rec.attempts[0].ok:
        return PointVerdict("skipped", "no_effect", f"{what}: every copy finished within the hold and every oracle "
                            "passed: the cut did nothing to judge", oracles, fault)
    if p.family == "node" and (idle := _node_no_effect(rec)):
        return PointVerdict("skipped", "no_effect", f"{what}: {idle}", oracles, fault)
    if applied is not None and applied.idle:  # a fault that may have done nothing, and every oracle passed
        return PointVerdict("skipped", "no_effect", applied.idle, oracles, fault)
    said = [o.summary for o in oracles.values() if o.result == "pass"]
    durable = oracles["durability"]
    if durable.result == "not_judged":  # never a silent pass: the line says what was not judged, and why
        said.append(durable.summary)
    return verdict("pass", "pass", "; ".join(said))
