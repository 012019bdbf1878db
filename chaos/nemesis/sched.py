"""``sched``: Slurm requeues the job, preempts it, or loses its node (``chaos run --launcher sbatch``).

The faults a training job meets on a cluster come from its scheduler, with the scheduler's
own signals, grace and restart. A job Slurm launches (``chaos.launch.sbatch``: the command
as a batch job submitted with ``--requeue``) is struck through Slurm itself, and Slurm, not
the harness, starts it again: the same batch script reruns with ``SLURM_RESTART_COUNT`` one
higher, which the batch wrapper turns into the next attempt number.

Points (``rankR:stepS:MODE`` once rank R announces step S; ``rankR:opN:requeue`` right after
the rank's file event N, an open that may truncate a file: the middle of a save):

- ``requeue``: ``scontrol requeue JOBID``. What Slurm 22.05 does (seen here): slurmctld puts
  the job back to PENDING at once (``Restarts=`` one higher) and sends the node a terminate
  request; slurmd sends SIGCONT and SIGTERM to every process of every step of the job, the
  batch script and its children included, and SIGKILL to those left after ``KillWait``
  (5 s on the private cluster). The job may trap SIGTERM and save.
- ``preempt``: the preemption path of a partition with ``PreemptMode=REQUEUE`` and a
  ``GraceTime``: SIGTERM to every process of the job first (``scancel --signal=TERM --full
  JOBID``; ``--full`` reaches the batch script and its children), then, once the job has
  ended or ``--grace`` seconds have passed, the requeue itself (``scontrol requeue``:
  SIGTERM again to whatever still runs, SIGKILL after ``KillWait``). A real preemption
  needs a higher-priority job that wants the node; this makes the same two steps without
  one, so it needs no preemption configured.
- ``node``: ``scontrol update nodename=NODE state=down reason=...``. slurmctld logs
  "requeue job JOBID due to failure of node", requeues a ``--requeue`` job and sends the
  node its terminate request (SIGTERM, SIGKILL after KillWait); once the job has left
  RUNNING the harness sets the node back (``state=resume``) where it is still down. The
  private cluster's ``ReturnToService=2`` brings a node that answers back by itself in
  milliseconds (then there is nothing to resume, and the record says so).

A requeued job is held: Slurm 22.05 sets its ``BeginTime`` about two minutes ahead (121 s
here) before it may run again. The launcher moves it to now (``scontrol update jobid=JOBID
StartTime=now``) as soon as the job shows ``Reason=BeginTime``, so a point takes seconds;
the record says so (:func:`release`).

The in-rank side (``inproc.JobInterposer._sched``) leaves a ``sched-request`` and waits,
up to ``SCHED_WAIT_S``, until the SIGTERM Slurm sends has reached the job (its own handler
ran, or the default action killed it): the point lands exactly where it was asked for.

Who calls what: the sbatch launcher's watch loop calls :func:`begin` when the request comes,
:func:`finish` for the second step (preempt's requeue, node's resume), :func:`release` for a
job held by BeginTime; ``explore`` calls :func:`observe` (through ``FAMILY``) after the
Slurm job ended, and the judge reads its :class:`~chaos.nemesis.atrest.Applied`: the
evidence carries Slurm's job id, ``Restarts=`` and what was done. The family restarts
nothing itself (``scheduler_restarts``). The protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from chaos.model import jobspec as S
from chaos.nemesis.atrest import Applied, opens_for_writing
from chaos.nemesis.family import Family
from chaos.nemesis.sites import Anchors, Facts, Traces, announced_steps, event_keys

# The launcher's channel to Slurm: argv -> the finished command (stdout, stderr, status).
Slurm = Callable[..., "subprocess.CompletedProcess[str]"]

WHAT = {"requeue": "requeued", "preempt": "preempted (SIGTERM, then requeued)", "node": "lost its node (set DOWN)"}


def _step(slurm: Slurm, record: dict[str, Any], *argv: str, fault: bool = True) -> bool:
    """Run one Slurm command, note it in ``record["commands"]``; whether it succeeded. A failed
    ``fault`` command means the fault was not made (``record["error"]``); a failed helper (lifting a
    BeginTime hold, resuming a node) is noted on its own entry only: the fault itself was made."""
    done = slurm(*argv)
    entry: dict[str, Any] = {"argv": list(argv), "returncode": done.returncode, "ts": round(time.time(), 3)}
    if done.returncode != 0:
        entry["stderr"] = (done.stderr or done.stdout or "").strip()[-300:]
        if fault:
            record.setdefault("error", f"{' '.join(argv)} failed: {entry['stderr'] or f'status {done.returncode}'}")
    record.setdefault("commands", []).append(entry)
    return done.returncode == 0


def begin(mode: str, job_id: str, node: str | None, req: dict[str, Any], slurm: Slurm) -> dict[str, Any]:
    """The first (for requeue the only) Slurm action of a point, as rank ``req["rank"]`` asked for it.

    The record: ``mode``, ``job_id``, ``node``, where the rank was (``step`` or ``ord``/``op``/``path``),
    ``commands`` run, ``error`` if Slurm refused; ``pending`` names the second step still to come."""
    record: dict[str, Any] = {"mode": mode, "job_id": job_id, "node": node, "rank": req.get("rank"),
                              **{k: req.get(k) for k in ("step", "ord", "op", "path") if req.get(k) is not None}}
    if mode == "requeue":
        _step(slurm, record, "scontrol", "requeue", job_id)
    elif mode == "preempt":
        if _step(slurm, record, "scancel", "--signal=TERM", "--full", job_id):
            record["pending"] = "requeue"
    elif mode == "node":
        if not node:
            record["error"] = "Slurm named no node for the job"
        elif _step(slurm, record, "scontrol", "update", f"nodename={node}", "state=down",
                   f"reason=chaos sched point: job {job_id}"):
            record["pending"] = "resume"
    else:
        record["error"] = f"no Slurm action for mode {mode!r}"
    return record


def finish(record: dict[str, Any], node_state: str | None, slurm: Slurm) -> None:
    """The second step, once due: preempt's requeue (the job ended or the grace passed), node's resume
    (the job left RUNNING) where the node is still down or drained (``node_state``, sinfo's ``%T``)."""
    pending = record.pop("pending", None)
    if pending == "requeue":
        _step(slurm, record, "scontrol", "requeue", str(record["job_id"]))
    elif pending == "resume":
        state = (node_state or "").rstrip("*~#$@^-").lower()
        if state.startswith(("down", "drain", "fail")):
            record["node_resumed"] = _step(slurm, record, "scontrol", "update", f"nodename={record['node']}",
                                           "state=resume", fault=False) or "failed: see its command"
        else:
            record["node_resumed"] = f"not needed: the node was {state or 'unknown'} again by itself (ReturnToService)"


def release(record: dict[str, Any], job_id: str, begin_time: str | None, slurm: Slurm) -> None:
    """A requeued job held by its BeginTime (Slurm delays a requeued job): StartTime=now, noted."""
    held = record.setdefault("begin_time_moved", [])
    if _step(slurm, record, "scontrol", "update", f"jobid={job_id}", "StartTime=now", fault=False):
        held.append(begin_time)


def where(record: dict[str, Any]) -> str:
    if record.get("step") is not None:
        return f"at rank {record.get('rank')}'s step {record['step']}"
    what = f" ({record.get('op')} of {record.get('path')})" if record.get("op") and record.get("path") else ""
    return f"at rank {record.get('rank')}'s event {record.get('ord')}{what}"


def describe(record: dict[str, Any]) -> str:
    """One line: which Slurm job, what Slurm was told where, the restart count it reached."""
    head = f"Slurm job {record.get('job_id')} {WHAT.get(record.get('mode', ''), record.get('mode'))} {where(record)}"
    if record.get("error"):
        return f"{head}: not done: {record['error']}"
    said = "; ".join(" ".join(c["argv"]) for c in record.get("commands", []) if "StartTime=now" not in c["argv"])
    parts = [f"{head} ({said})"]
    if record.get("node_resumed") is True:
        parts.append(f"node {record.get('node')} resumed once the job had left it")
    elif str(record.get("node_resumed", "")).startswith("failed"):
        parts.append(f"node {record.get('node')} could not be resumed")
    elif record.get("node_resumed"):
        parts.append(f"node {record.get('node')} back in service by itself (ReturnToService)")
    if record.get("begin_time_moved"):
        parts.append(f"held by BeginTime {record['begin_time_moved'][0]}, moved to now")
    if record.get("restarts") is not None:
        parts.append(f"Restarts={record['restarts']}")
    return ", ".join(parts)


# -- the family's planning hooks (chaos.nemesis.family) ---------------------------------------

def points(job: S.JobSpec, traces: Traces, facts: Facts | None) -> list[S.Point]:
    """Each announced step x requeue, preempt, node; then a requeue right after each open of a file
    for writing (an in-place save's truncating open: where a careless job is caught mid-save)."""
    if job.launcher != "sbatch":
        return []
    anchors = Anchors(traces, facts.stable if facts is not None else None)
    ops = [anchors.at_event(rank, r, path, nth, "requeue") for rank, r, path, nth in event_keys(traces)
           if r["op"] == "open" and opens_for_writing(r)]
    steps = [S.Point(rank, mode, step=n) for rank, ns in announced_steps(traces) for n in ns for mode in S.SCHED_MODES]
    return steps + ops


def notes(job: S.JobSpec, traces: Traces, facts: Facts, points: list[S.Point]) -> list[str]:
    if points or job.launcher != "sbatch":
        return []
    return ["scheduler faults are not explored: the job announced no step and opened no file for writing"]


def unavailable(job: S.JobSpec) -> str | None:
    """Left out, without a note, unless Slurm launches the job (``--launcher sbatch``)."""
    return None if job.launcher == "sbatch" else ""


def observe(job: S.JobSpec, point: S.Point, attempts: list[Any], traces: Any) -> Applied:
    """What Slurm was told at the point, from attempt 0's ``slurm`` record; skipped where nothing was done."""
    slurm = getattr(attempts[0], "slurm", None) if attempts else None
    record = (slurm or {}).get("sched")
    where_ = f"at its step {point.step}" if point.step is not None else f"at its event {point.op}"
    if record is None:
        return Applied(f"no Slurm action {where_}", {"job_id": (slurm or {}).get("job_id")}, outcome="not_reached",
                       skipped=f"rank {point.rank} asked for a Slurm {point.mode} {where_}, but the attempt "
                               "ended before the launcher acted")
    line = describe(record)
    if record.get("error"):
        return Applied(line, record, outcome="unsupported", skipped=f"Slurm did not {point.mode} the job: "
                                                                    f"{record['error']}")
    runs = len(attempts)
    return Applied(f"{line}; Slurm ran it {runs} time(s)", record)


FAMILY = Family(name="sched", points=points, notes=notes, unavailable=unavailable, observe=observe,
                params=lambda job, point, seed: {"grace_s": job.grace_s} if point.mode == "preempt" else {},
                scheduler_restarts=True)
