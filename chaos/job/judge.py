"""One point's verdict, from its record only: pass, hard_failure, silent_divergence, lost_work.

Called by ``explore.py`` after a point's last attempt with the ``PointRecord`` (what
each attempt did, each rank's trace) and the ``Golden`` facts of the fault-free runs.
Five oracles, each with its evidence, named as the built-in workload's are:

- ``liveness``: the job finished (every copy of the last attempt exited 0) within its
  restarts. Otherwise *hard_failure*: the resume raised or never finished; the
  evidence is each attempt's outcome and the end of the last one's output.
- ``result_files``: each ``--result-file`` equals the fault-free run's (compare.py).
  Otherwise *silent_divergence*: it finished, and what it produced is different.
- ``durability``: the resume started at or after the newest checkpoint the job could
  rely on when it was killed — the newest ``chaos.probe.saved(n)`` in the killed
  attempt's trace, or the newest checkpoint matching ``--checkpoint-glob`` whose files
  and sizes equal the fault-free run's, seen between the kill and the restart.
  Where the resume started is ``chaos.probe.resumed(n)``, else the first
  ``probe.step(n)`` (or ``--loss-regex`` line) minus one, else the first ``--step-regex``
  match after the restart; none of them: from scratch (0). Otherwise *lost_work*.
- ``loss_continuity``: every step's loss, in every attempt (``probe.step(n, loss)`` or
  ``--loss-regex``), equals the fault-free run's — exactly when the two fault-free runs
  agreed, else within ``--loss-band`` — and does not spike after a resume
  (``losscurve``, judged by the built-in oracle). Otherwise *silent_divergence*: the
  job finished, but it trained on something other than what it saved.
- ``preemption_exit`` (term points): the SIGTERMed attempt exits non-zero unless it had
  finished; a job that exits 0 mid-run is never restarted by a supervisor that restarts
  failed jobs. Otherwise *hard_failure*: the job is down until someone notices.
  Each is judged only with what it needs; without it the summary says what is missing.

What the harness did besides the kill is evidence too, and bounds what the job could
rely on. A corrupted file (``atrest.corrupt``) is no checkpoint to rely on: a
``--checkpoint-glob`` match holding it does not count, nor does an acknowledgement the
rank made at or after the step it was saving when it stopped (a careful job that
detects the damage and resumes from the checkpoint before passes). After a power loss
only acknowledgements made before the cut count: the other ranks' later ones never
happened. Every verdict of such a point starts with what was done ("ckpt.json: bit 5 of
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

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.job import losscurve, nodes
from chaos.job.atrest import halt_record
from chaos.job.compare import first_difference
from chaos.job.launch import AttemptOutcome
from chaos.job.launch import cause as _cause
from chaos.job.spec import STEP_KINDS, TORCHRUN_STRIDE, JobSpec, Point

OUTCOMES = ("pass", "hard_failure", "silent_divergence", "lost_work")


@dataclass
class Oracle:
    """One oracle's result: ``result`` is pass, fail or not_judged (with the reason)."""

    name: str
    result: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.result == "fail"

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "summary": self.summary, "evidence": self.evidence}


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


@dataclass
class PointRecord:
    """Everything one point's run left: attempts, traces by (rank, attempt), checkpoints seen after the kill."""

    point: Point
    out: str
    attempts: list[AttemptOutcome]
    traces: dict[tuple[int, int], list[dict[str, Any]]]
    after_kill: dict[str, dict[str, int]] | None = None  # --checkpoint-glob matches between kill and restart
    applied: Any = None  # atrest.Applied: what the harness did to {out} (corruption, power loss, full disk)

    def fired(self) -> list[dict[str, Any]]:
        return [{**r, "attempt": a, "rank": rk} for (rk, a), recs in sorted(self.traces.items())
                for r in recs if r.get("event") == "fired"]

    def probes(self, attempt_filter: Any, kind: str, rank: int | None = None) -> list[dict[str, Any]]:
        """``chaos.probe`` announcements of one kind (step, saved, resumed, regex), in trace order."""
        out = []
        for (rk, a), recs in sorted(self.traces.items()):
            if not attempt_filter(a) or (rank is not None and rk != rank):
                continue
            out += [r["info"] for r in recs if r.get("event") == "phase" and r.get("name") == "chaos.probe"
                    and r.get("info", {}).get("kind") == kind]
        return out


def _liveness(job: JobSpec, rec: PointRecord) -> Oracle:
    last = rec.attempts[-1]
    # a torchrun worker's attempt: TORCHRUN_STRIDE x the harness's relaunches + torchelastic's restarts
    restarts = sorted({a for (_r, a) in rec.traces if a % TORCHRUN_STRIDE > 0})
    evidence: dict[str, Any] = {"attempts": [a.to_dict() for a in rec.attempts]}
    relaunched = f" (the harness relaunched torchrun {len(rec.attempts) - 1} time(s))" if len(rec.attempts) > 1 else ""
    if job.torchrun:
        evidence["torchelastic_restarts"] = len(restarts)
    if last.ok:
        how = (f"torchelastic restarted the workers {len(restarts)} time(s){relaunched} and the job finished"
               if job.torchrun else f"the job finished after {len(rec.attempts) - 1} restart(s)")
        return Oracle("liveness", "pass", how, evidence)
    evidence["output_tail"] = last.tail()
    if job.torchrun:
        why = (f"torchrun {last.describe} after torchelastic restarted the workers {len(restarts)} time(s)"
               if restarts else f"torchrun {last.describe} and its agent never restarted the workers")
    else:
        why = f"the resume {last.describe} ({len(rec.attempts) - 1} restart(s) of {job.max_restarts} allowed)"
    last_line = _cause(last.tail(12000))
    if last_line:
        why += f": {last_line.strip()[:200]}"
    return Oracle("liveness", "fail", why, evidence)


def _results(job: JobSpec, golden: Golden, rec: PointRecord) -> Oracle:
    if not job.result_globs:
        return Oracle("result_files", "not_judged", "no --result-file: silent divergence is not judged")
    if not golden.results:
        return Oracle("result_files", "not_judged",
                      f"--result-file {' '.join(job.result_globs)} matched no file of the fault-free run")
    rtol = job.rtol if golden.tolerance else None
    checked = []
    for rel in golden.results:
        got = Path(rec.out) / rel
        if not got.exists():
            return Oracle("result_files", "fail", f"{rel}: missing after the resumed run",
                          {"file": rel, "difference": "missing", "checked": checked})
        diff = first_difference(Path(golden.out) / rel, got, rtol)
        if diff:
            return Oracle("result_files", "fail", f"{rel}: {diff}", {"file": rel, "difference": diff,
                                                                      "checked": checked, "rtol": rtol})
        checked.append(rel)
    how = f"within rtol {rtol:g} (tolerance mode)" if rtol is not None else "bit for bit"
    return Oracle("result_files", "pass", f"{len(checked)} result file(s) equal the fault-free run's {how}",
                  {"checked": checked, "rtol": rtol})


def _step_of(name: str) -> int | None:
    nums = re.findall(r"\d+", name)
    return int(nums[-1]) if nums else None


def _resumed_at(rec: PointRecord, rank: int) -> tuple[int, str]:
    """Where rank ``rank``'s first restart started, and how that is known."""
    first = min((a for (r, a) in rec.traces if r == rank and a > 0), default=None)
    if first is None:
        return 0, "no trace of a restart"

    def only(a: int) -> bool:
        return a == first

    resumed = rec.probes(only, "resumed", rank)
    steps = rec.probes(only, "step", rank) or rec.probes(only, "loss", rank)
    regex = rec.probes(only, "regex", rank)
    if resumed:
        return min(i["n"] for i in resumed), "chaos.probe.resumed"
    if steps:
        return steps[0]["n"] - 1, "first chaos.probe.step after the restart, minus one"
    if regex:
        return regex[0]["n"], "first --step-regex match after the restart"
    return 0, "no resume seen (no probe call, no --step-regex match): from scratch"


def _saving_step(rec: PointRecord) -> int | None:
    """The step the halted rank was at when it completed the corrupted file (its last announced
    step before event N: for a corruption deferred to a later step, ``at_step``, not the halt's
    step), if it announced any."""
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


def _durability(job: JobSpec, golden: Golden, rec: PointRecord) -> Oracle:
    """Per rank: each rank's restart must start at or after the newest checkpoint *it* could rely on."""
    if not golden.acks and rec.after_kill is None:
        return Oracle("durability", "not_judged", "which checkpoints the job could rely on is unknown: "
                      "call chaos.probe.saved(n) or give --checkpoint-glob")
    applied = rec.applied
    cut = applied.cut_ts if applied is not None else None
    excluded = list(applied.excluded) if applied is not None else []
    saving = _saving_step(rec) if excluded else None
    evidence: dict[str, Any] = {}
    if cut is not None:
        evidence["acknowledged_before"] = {"cut_ts": cut, "why": "a power loss: later acknowledgements never happened"}
    if excluded:
        evidence["not_relied_on"] = {"files": excluded, "acknowledged_from_step": saving,
                                     "why": "corrupted by the harness after the job completed them"}
    newest: dict[int, tuple[int, str]] = {}
    for (rank, a), recs in rec.traces.items():
        if a != 0:
            continue
        acked = [r["info"]["n"] for r in recs if r.get("event") == "phase" and r.get("name") == "chaos.probe"
                 and r.get("info", {}).get("kind") == "saved" and (cut is None or r.get("ts", 0.0) <= cut)
                 and not (saving is not None and rank == rec.point.rank and r["info"]["n"] >= saving)]
        if acked:
            newest[rank] = (max(acked), "chaos.probe.saved")
    if rec.after_kill is not None:
        complete = sorted(s for name, files in rec.after_kill.items()
                          if golden.checkpoints.get(name) == files and not _holds(name, excluded)
                          and (s := _step_of(name)) is not None)
        evidence["complete_checkpoints_after_kill"] = complete
        if complete:  # a checkpoint on disk is every rank's to resume from
            for rank in {r for (r, _a) in rec.traces}:
                if rank not in newest or complete[-1] > newest[rank][0]:
                    newest[rank] = (complete[-1], "--checkpoint-glob")
    if not newest:
        return Oracle("durability", "pass", "no checkpoint was complete when the job was killed: nothing to lose",
                      evidence)
    restarted = len(rec.attempts) > 1 or any(a > 0 for (_r, a) in rec.traces)
    if not restarted:
        return Oracle("durability", "not_judged", "the job was never restarted", evidence)
    ranks = {}
    worst: tuple[int, int, int, str] | None = None
    for rank, (n, source) in sorted(newest.items()):
        at, how = _resumed_at(rec, rank)
        ranks[str(rank)] = {"newest_complete": n, "source": source, "resumed_at": at, "resumed_by": how}
        if at < n and (worst is None or n - at > worst[1] - worst[2]):
            worst = (rank, n, at, source)
    evidence["ranks"] = ranks
    if worst is not None:
        rank, n, at, source = worst
        lost = "from scratch" if at == 0 else f"from step {at}"
        return Oracle("durability", "fail", f"rank {rank} resumed {lost}, but its checkpoint of step {n} was "
                      f"complete ({source}): {n - at} step(s) of work lost", evidence)
    summary = ", ".join(f"rank {r} at step {v['resumed_at']} (newest complete: {v['newest_complete']})"
                        for r, v in ranks.items())
    return Oracle("durability", "pass", f"resumed at or after the newest complete checkpoint: {summary}", evidence)


def _loss(job: JobSpec, golden: Golden, rec: PointRecord) -> Oracle:
    """Every step's loss of every attempt against the fault-free curve (``losscurve``)."""
    if not golden.losses:
        why = (f"--loss-regex {job.loss_regex!r} matched no line of the fault-free run" if job.loss_regex else
               "no loss seen: call chaos.probe.step(n, loss) or give --loss-regex")
        return Oracle("loss_continuity", "not_judged", why)
    band = losscurve.band_for(job.loss_band, golden.tolerance)
    got = losscurve.continuity(golden.losses, job.world_size, rec.traces, band)
    summary = got.summary
    if band == 0.0:
        summary = summary.replace(f"within {band:.3%} of the golden loss", "equal to the fault-free loss")
    return Oracle("loss_continuity", "pass" if got.passed else "fail", summary, got.evidence)


def last_steps(traces: dict[tuple[int, int], list[dict[str, Any]]], attempt: int = 0) -> dict[int, int]:
    """Rank -> the last step it announced in ``attempt`` (probe.step, a --step-regex or --loss-regex line)."""
    out: dict[int, int] = {}
    for (rank, a), recs in traces.items():
        steps = [int(r["info"]["n"]) for r in recs if a == attempt and r.get("event") == "phase"
                 and r.get("name") == "chaos.probe" and r.get("info", {}).get("kind") in STEP_KINDS]
        if steps:
            out[rank] = max(steps)
    return out


def _preemption_exit(golden: Golden, rec: PointRecord) -> Oracle | None:
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
        return Oracle("preemption_exit", "pass", f"{first.describe}: a supervisor sees a stopped job and "
                      "restarts it", evidence)
    if end is None or reached is None or reached >= end:
        return Oracle("preemption_exit", "pass", "the SIGTERMed attempt exited 0 having reached the fault-free "
                      f"run's last step ({end})" if end is not None else "exited 0; the last step is unknown "
                      "(nothing announced steps)", evidence)
    return Oracle("preemption_exit", "fail", f"the SIGTERMed job exited with status 0 at step {reached} of {end}: "
                  "a supervisor that restarts failed jobs (torchelastic, a Kubernetes Job with restartPolicy "
                  "OnFailure, Slurm requeue) takes the preempted run for a finished one and never resumes it",
                  evidence)


@dataclass
class PointVerdict:
    verdict: str   # pass | fail | skipped | error (the results schema's)
    outcome: str   # pass | hard_failure | silent_divergence | lost_work | not_reached | no_effect | unsupported | error
    summary: str
    oracles: dict[str, Oracle]
    fault: dict[str, Any] | None = None  # what the harness did beyond the kill (corruption, crash state, ...)


def _fault(rec: PointRecord, fired: list[dict[str, Any]]) -> tuple[str | None, dict[str, Any] | None]:
    """One line and the record of what the point did beyond a plain kill (None, None for a kill)."""
    p = rec.point
    if rec.applied is not None:
        return rec.applied.what, rec.applied.to_dict()
    if p.mode == "term" and rec.attempts and rec.attempts[0].term is not None:
        return rec.attempts[0].describe, {"what": rec.attempts[0].describe, **rec.attempts[0].term}
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
    return None, None


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
        live = _liveness(job, rec)
        return PointVerdict("skipped" if traced else "error", "not_reached" if traced else "error", why,
                            {"liveness": live})
    what, fault = _fault(rec, fired)
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

    def verdict(v: str, outcome: str, summary: str) -> PointVerdict:
        return PointVerdict(v, outcome, f"{what}; then {summary}" if what else summary, oracles, fault)

    if oracles["liveness"].failed:
        oracles["result_files"] = Oracle("result_files", "not_judged", "the job did not finish")
        oracles["durability"] = _durability(job, golden, rec) if rec.attempts else Oracle(
            "durability", "not_judged", "the job did not finish")
        return verdict("fail", "hard_failure", oracles["liveness"].summary)
    oracles["result_files"] = _results(job, golden, rec)
    oracles["loss_continuity"] = _loss(job, golden, rec)
    oracles["durability"] = _durability(job, golden, rec)
    preempted = _preemption_exit(golden, rec)
    if preempted is not None:
        oracles["preemption_exit"] = preempted
    if oracles["result_files"].failed:
        return verdict("fail", "silent_divergence", oracles["result_files"].summary)
    if oracles["loss_continuity"].failed:
        return verdict("fail", "silent_divergence", oracles["loss_continuity"].summary)
    if oracles["durability"].failed:
        return verdict("fail", "lost_work", oracles["durability"].summary)
    if preempted is not None and preempted.failed:
        return verdict("fail", "hard_failure", preempted.summary)
    if p.family == "net" and rec.attempts[0].ok:
        return PointVerdict("skipped", "no_effect", f"{what}: every copy finished within the hold and every oracle "
                            "passed: the cut did nothing to judge", oracles, fault)
    if p.family == "node" and (idle := _node_no_effect(rec)):
        return PointVerdict("skipped", "no_effect", f"{what}: {idle}", oracles, fault)
    return verdict("pass", "pass", "; ".join(o.summary for o in oracles.values() if o.result == "pass"))
