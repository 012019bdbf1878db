"""A kill point's first attempt from the fault-free trace, not from a run to the point (#30).

Why: a kill right before or after file event N of a one-process job leaves exactly what the
fault-free run had done up to that event, and its trace says what that is: every write's
bytes, every rename and unlink, in order. Running the job from step 0 to the point, one
interpreter start and ``import torch`` included, only to be killed there, costs as much as
the resume that is the point's real test. So wherever the trace says it all (the default;
``--no-materialize`` turns it off), ``explore`` calls :func:`attempt_zero` instead of
launching attempt 0:

1. {out} and the job's temp dir become the crash model's state at the cut with every
   change kept (a process kill loses nothing the kernel was handed:
   ``faults.crashstate.CrashModel``, base: the empty folders every run starts from);
2. the point's attempt-0 trace is the fault-free trace up to that event (its ``.data``
   companion as is), and then the ``fired`` record the rank's tracer writes as it kills;
3. the attempt is recorded as killed by SIGKILL, ``materialized`` in the results.

A torn point (``rank0:op2:torn``: a write stores the first half of its bytes, then SIGKILL)
is rebuilt the same way when event N is a write of more than one byte: the trace up to
it, the write record cut to its first half (its bytes are a prefix of the fault-free
write's, already in the ``.data`` file), and the ``fired`` record of the interposer's
``short_write`` rule. On any other event the tracer kills before it instead, which runs.

A corruption or power-loss point right after event N (``rank0:op9:bitflip``,
``rank0:op9:power:s2``) stops every copy there: the same state as a kill after it. A
corruption that waits for a step (``rank0:op9:bitflip:step12``) stops them at the job's
announcement of that step instead, which the trace records too. Its attempt is rebuilt the
same way up to that moment, recorded as *halted* with the tracer's ``halt`` record (with
``step_n`` and ``last_ord`` for a deferred one), and then the file is corrupted, or {out}
replaced by the cut's crash state (from the rebuilt trace, with its ``.data``), as after a
real halt.

Then the restart runs for real and the point is judged as any other. Only where the trace
can say it all (:func:`why_not`): a kill before, after or in the middle of an event (not at a step), a
corruption or a power loss right after one (or a corruption at the step it waits for),
one process (no ``--ranks``, torchrun or ``--nodes``) that the harness launches itself (not
``--launcher sbatch``), every event of it under {out} or the
job's temp dir, no change under {out} that no event explains, both fault-free runs tracing
the same file events (a job whose events vary from run to run is not one trace), and a
trace the crash model represents; any other point runs to the point as before.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

from chaos.launch.job import AttemptOutcome
from chaos.model.contract import STEP_KINDS
from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis.atrest import merged_records
from faults import FaultError
from faults.crashstate import CrashModel, Snapshot, clear
from faults.interposer import IORule


def job_shape(job: JobSpec) -> str | None:
    """Why none of this job's points is materialized, whatever the trace (None: some may be).
    Called by :func:`why_not`, and by ``explore.reference`` before it notes varying events."""
    if not job.materialize:
        return "--no-materialize"
    if job.ranks is not None or job.torchrun or job.nodes is not None:
        return "only a one-process job's attempt is materialized"
    if job.launcher != "subprocess":
        return "a job Slurm launches (--launcher sbatch) runs each attempt as a batch job"
    return None


def why_not(job: JobSpec, point: Point, untraced: bool, varies: bool = False) -> str | None:
    """Why this point's first attempt must run to the point (None: it can be materialized).

    ``untraced``: the fault-free run changed files no event explains; ``varies``: the two
    fault-free runs traced different file events, so the trace of one is not what every
    run does up to the point (a job whose saves race a thread, say)."""
    kill = point.family == "kill" and point.mode in ("before", "after", "torn")
    rot = point.family in ("corrupt", "power")  # halted right after the event, or at the step it waits for
    if point.op is None or not (kill or rot):
        return ("only a kill before, after or in the middle of a file event, or a corruption or power loss right "
                "after one, is materialized")
    shape = job_shape(job)
    if shape is not None:
        return shape
    if untraced:
        return "the fault-free run changed files under {out} that no traced event explains"
    if varies:
        return "the two fault-free runs traced different file events: one trace cannot stand for every run"
    return None


def _records_until(trace: str, stop: Callable[[dict[str, Any]], str | None]) -> list[dict[str, Any]] | None:
    """The records of a trace file in file order, up to the first one ``stop`` names: ``"at"`` (that
    record kept, the last) or ``"before"`` (left out); None where the file ends or tears first."""
    out: list[dict[str, Any]] = []
    with open(trace, "rb") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                return None  # a torn line: the trace ends early
            where = stop(rec)
            if where == "before":
                return out
            out.append(rec)
            if where == "at":
                return out
    return None


def _records_up_to(trace: str, ord_: int, inclusive: bool) -> list[dict[str, Any]] | None:
    """The records of a trace file up to event ``ord_`` (that event's included or not)."""
    return _records_until(trace, lambda rec: ("at" if inclusive else "before")
                          if rec.get("event") == "op" and rec.get("ord") == ord_ else None)


def _moved(rec: dict[str, Any], roots: dict[str, str]) -> dict[str, Any] | None:
    """An event of the fault-free run as if it had happened in this point's folders (``roots``:
    the fault-free run's {out} and temp dir -> this point's); None for an event on a path in
    neither."""
    if rec.get("event") not in ("op", "fired", "read"):
        return rec
    moved = dict(rec)
    for key in ("path", "src", "dst"):
        p = rec.get(key)
        if not isinstance(p, str):
            continue
        to = next(((src, dest) for src, dest in roots.items() if p == src or p.startswith(src + os.sep)), None)
        if to is None:
            return None
        moved[key] = to[1] + p[len(to[0]):]
    return moved


# The rule a torn point arms in the job's tracer (``chaos.target.job.inproc._rules``): keep the first half.
TORN_RULE = IORule("short_write", op="write", keep=None, then="kill", times=None)


def _torn(rec: dict[str, Any]) -> dict[str, Any] | None:
    """Event N's write record as the torn point leaves it (its first half stored), or None where the
    tracer would not tear it (not a write, one byte, or its bytes not kept in the trace)."""
    length = rec.get("length")
    if rec.get("op") != "write" or not isinstance(length, int) or length < 2 or rec.get("data_off") is None:
        return None
    kept = length // 2
    torn = {**rec, "length": kept, "partial_of": length, "data_len": kept}
    if isinstance(rec.get("data"), bytes):  # read with its data (merged_records): the crash model's copy
        torn["data"] = rec["data"][:kept]
    return torn


def _is_step(rec: dict[str, Any], n: int) -> bool:
    """Whether a trace record is the job's announcement of step ``n`` (what a deferred corruption waits for)."""
    info = rec.get("info")
    return (rec.get("event") == "phase" and rec.get("name") == "chaos.probe" and isinstance(info, dict)
            and info.get("kind") in STEP_KINDS and info.get("n") == n)


def _records_to_step(trace: str, ord_: int, step: int) -> list[dict[str, Any]] | None:
    """The records of a trace file up to the first announcement of ``step`` after event ``ord_``, included."""
    seen = False

    def stop(rec: dict[str, Any]) -> str | None:
        nonlocal seen
        if rec.get("event") == "op" and rec.get("ord") == ord_:
            seen = True
        elif seen and _is_step(rec, step):
            return "at"
        return None

    return _records_until(trace, stop)


def attempt_zero(job: JobSpec, point: Point, golden_scratch: str, out: str, scratch: str) -> AttemptOutcome | None:
    """Attempt 0 of ``point`` rebuilt from the fault-free run in ``golden_scratch``; None (nothing
    changed) where the trace cannot say what the disk held there."""
    traces = sorted(glob.glob(os.path.join(glob.escape(golden_scratch), "trace", "trace-r0-a0-p*.jsonl")))
    if len(traces) != 1:
        return None  # a child process traced too: more than one timeline
    halt = point.family in ("corrupt", "power")  # the copies are stopped right after the event, as a kill after it
    after = point.mode == "after" or halt
    deferred = point.at_step is not None  # halted at the job's announcement of that step, after the event
    lines = (_records_to_step(traces[0], int(point.op), int(point.at_step)) if deferred  # type: ignore[arg-type]
             else _records_up_to(traces[0], int(point.op), after))  # type: ignore[arg-type]
    if lines is None:
        return None
    records = merged_records(golden_scratch, 0)
    at = next((i for i, r in enumerate(records) if r.get("event") == "op" and r.get("ord") == point.op), None)
    cut = at
    if deferred and at is not None:
        cut = next((i for i in range(at + 1, len(records)) if _is_step(records[i], point.at_step)), None)
    if at is None or cut is None:
        return None
    torn = _torn(records[at]) if point.mode == "torn" else None
    if point.mode == "torn" and torn is None:
        return None  # not a write of two bytes or more: the tracer kills before it, with a note (it runs)
    tmp = os.path.join(scratch, "tmp")
    roots = {os.path.join(golden_scratch, "out"): out, os.path.join(golden_scratch, "tmp"): tmp}
    upto = [_moved(r, roots) for r in records[: cut + 1 if after else cut] + ([torn] if torn else [])]
    if any(r is None for r in upto):
        return None  # an event outside {out} and the job's temp dir: nothing to rebuild it from
    os.makedirs(tmp, exist_ok=True)
    try:
        # Each tree as the kill left it: every change kept, a kill loses nothing. What was there before
        # the trace began: an empty {out}, and in the temp dir the rank's own folder, which the boot
        # path makes before the tracer is installed (inproc: TMPDIR is <tmp>/rank0).
        for root, before in ((out, Snapshot()), (tmp, Snapshot(dirs=("rank0",)))):
            model = CrashModel(root, before, upto)  # type: ignore[arg-type]
            last = model.n_prefixes - 1
            state = model.state(last, *model.extreme_choices(last)[1])
            clear(root)
            model.materialize(state, root)
    except FaultError:
        clear(out)
        clear(tmp)
        return None
    event, last = records[at], records[cut]
    fired: dict[str, Any] = {"event": "fired", "action": "halt" if halt else "kill", "op": event.get("op"),
                             "when": point.mode, "ord": point.op, "path": event.get("path"), "materialized": True,
                             "rank": 0, "pid": last.get("pid"), "ts": last.get("ts", 0.0),
                             "seq": (last.get("seq") or 0) + (1 if after else 0)}
    if torn is not None:  # as the interposer's short_write rule records it (faults.interposer._do_write)
        fired = {"event": "fired", "rule": 0, "action": "short_write", "op": "write", "path": event.get("path"),
                 "paths": [event.get("path")], "spec": TORN_RULE.to_dict(), "step": None,
                 "offset": event.get("offset"), "length": event.get("length"), "written": torn["length"],
                 "op_seq": event.get("seq"), "byte": None, "ord": point.op, "when": "torn", "materialized": True,
                 "seq": (event.get("seq") or 0) + 1, "rank": 0, "pid": event.get("pid"), "ts": event.get("ts", 0.0)}
        lines = [*lines, {k: v for k, v in torn.items() if k != "data"}]  # its bytes: in the .data file already
    if halt:
        fired["dst"] = event.get("dst")
    last_ord = point.op
    if deferred:  # as the tracer's deferred halt says it: the step, and the last event before it
        last_ord = max((r.get("ord") for r in records[: cut + 1] if r.get("event") == "op"
                        and r.get("pid") == last.get("pid") and isinstance(r.get("ord"), int)), default=point.op)
        fired.update(step_n=point.at_step, last_ord=last_ord)
    tdir = os.path.join(scratch, "trace")
    os.makedirs(tdir, exist_ok=True)
    name = os.path.basename(traces[0])
    with open(os.path.join(tdir, name), "wb") as f:  # the same records, their paths in this point's {out}
        for rec in lines:
            moved = _moved(rec, roots)
            f.write((json.dumps(moved if moved is not None else rec, separators=(",", ":")) + "\n").encode())
        f.write((json.dumps(_moved(fired, roots) or fired, separators=(",", ":")) + "\n").encode())
    if os.path.exists(traces[0] + ".data"):
        shutil.copyfile(traces[0] + ".data", os.path.join(tdir, name + ".data"))
    halted = {"rank": 0, "ord": last_ord, "ts": fired["ts"]} if halt else None
    return AttemptOutcome(0, job.argv(out, resume=False), [-9], materialized=True, halted=halted)


__all__ = ["attempt_zero", "why_not"]
