"""``stop``: one process of the job hangs (SIGSTOP) at an announced step or in the middle of a save.

Why: a hung rank is not a dead one. A GPU that stops answering, a process stuck on a dead
NFS server or in uninterruptible I/O leaves its peers *running*: they go on with their own
part of the save, wait in a collective until their own timeout (gloo's and NCCL's default
is 30 minutes), run their error handlers, or commit a checkpoint the hung rank never
finished. A kill shows the launcher a dead process at once and every copy is stopped
together; a stop shows it nothing, so what the rest of the job does in the meantime is
what decides whether the checkpoint it left can be trusted. The built-in workload has had
this fault since the start (``stop:rank=R,step=S``, ``chaos.launch.cluster``); this is the
same fault for any job, and what ``chaos run --as-job`` turns the built-in spelling into.

Who does what, in the order of one point:

- the rank's tracer (``chaos.target.job.inproc``) fires it at an announced step
  (``rankR:stepS:stop``) or right after event N (``rankR:opN:stop``): it writes the
  ``fired`` record and a ``stop-request`` (:data:`~chaos.model.contract.STOP_REQUEST`),
  then sends itself SIGSTOP. Every thread of that process freezes where it is; its child
  processes, its other ranks and a torchrun agent go on;
- the launcher (``chaos.launch.job.run_attempt``) sees the request (:func:`begin`) and
  from then on ends the attempt, SIGKILLing every copy, at the first of: a copy failing by
  itself (its peers' own detection, as torchrun's agent stops the rest when one worker
  fails), nothing of the attempt left able to run (every process of it stopped or gone:
  :func:`frozen`, a one-process job at once), ``--hang-timeout`` seconds with no sign of
  life from the rest of the job (``chaos.launch.silence``; :data:`DEFAULT_STOP_SILENCE_S`
  without it), or the attempt's ``--timeout``. :func:`finish` records which, and how each
  copy ended;
- ``chaos.run.explore`` restarts the job (a torchrun COMMAND too: its agent never saw a
  failure) and asks :func:`observe` for the point's line; the judge then judges the
  restart as after any fault: did it resume from what the job could rely on, and finish
  with the fault-free run's result.

Points: where a hang inside a save matters (right after the first write to a file since it
was opened, and after each rename), then every announced step. The family is explored only
when asked for (``--faults stop`` or a ``--point``): each point waits out the silence of
the rest of the job, and for a one-process job without helpers a stop is a kill that comes
a moment later. Not with ``--launcher sbatch`` (Slurm runs the job; the harness cannot see
it hang) nor ``--nodes`` (each node's agent restarts its own workers). The protocol:
:mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from chaos.model.contract import DEFAULT_STOP_SILENCE_S, ENV_MARK
from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import Family
from chaos.nemesis.sites import Facts, Traces, mid_save_points
from faults.process import marked_with, state_and_session

FROZEN_STATES = frozenset("TtZX")  # /proc state letters of a process that cannot go on by itself


def begin(req: dict[str, Any], job: JobSpec) -> dict[str, Any]:
    """The attempt's record of the stop, from the rank's request: where, which process, the silence limit."""
    where = {k: req.get(k) for k in ("op", "ord", "path", "step_n", "phase") if req.get(k) is not None}
    limit = job.hang_timeout_s if job.hang_timeout_s is not None else DEFAULT_STOP_SILENCE_S
    return {"signal": "SIGSTOP", "rank": req.get("rank"), "pid": req.get("pid"), **where, "silence_s": limit}


def frozen(pid: Any, sessions: list[int], mark: str) -> bool:
    """Whether nothing of the attempt can run any more: the stopped process ``pid`` is stopped, and so is
    (or gone) every other process of the attempt: those in the copies' sessions (``sessions``: each copy
    leads its own) and those marked ``mark``. A copy's ``docker run`` client or a torchrun agent sleeps,
    waiting for what it started: such an attempt is ended by the silence instead."""
    if not isinstance(pid, int) or (state_and_session(pid) or ("X", 0))[0] not in ("T", "t"):
        return False
    own = set(sessions)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (st := state_and_session(entry.name)) is not None and st[1] in own:
            if st[0] not in FROZEN_STATES:
                return False
    return all((state_and_session(p) or ("X", 0))[0] in FROZEN_STATES for p in marked_with(ENV_MARK, mark))


def finish(stop: dict[str, Any], ended: str, returncodes: list[int | None], stopped: list[int],
           causes: dict[int, str]) -> None:
    """Record why the attempt ended (``ended``: frozen | silent | failed | timeout | exited) and how
    each copy did: exited by itself (its status and the cause its output gave) or SIGKILLed by the harness."""
    stop["ended"] = ended
    stop["copies"] = [{"copy": i, "ended": "killed" if i in stopped else "exited", "returncode": rc,
                       **({"cause": causes[i]} if i in causes else {})}
                      for i, rc in enumerate(returncodes)]


def where(stop: dict[str, Any]) -> str:
    """Where the process stopped, as the verdict says it."""
    if stop.get("op") == "step" or stop.get("step_n") is not None and stop.get("ord") is None:
        phase = f", in the {stop['phase']} phase of its save" if stop.get("phase") else ""
        return f"at its step {stop.get('step_n')}{phase}"
    on = f" of {os.path.basename(str(stop['path']))}" if stop.get("path") else ""
    return f"right after its event {stop.get('ord')} ({stop.get('op')}{on})"


def describe(stop: dict[str, Any]) -> str:
    """The fault line: which rank hung where, and how the attempt ended."""
    head = f"rank {stop.get('rank')} stopped (SIGSTOP) {where(stop)}"
    ended = stop.get("ended")
    if ended == "frozen":
        return head + ": nothing of the job could go on (every process stopped), SIGKILLed"
    if ended == "silent":
        return head + f": the rest of the job silent for {stop.get('silence_s', 0):g} s, every copy SIGKILLed"
    if ended == "timeout":
        return head + ": the rest of the job still running at the attempt's timeout, SIGKILLed"
    failed = [c for c in stop.get("copies", []) if c["ended"] == "exited" and c.get("returncode") not in (0, None)]
    if failed:
        said = []
        for c in failed:
            rc = c["returncode"]
            how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited {rc}"
            said.append(f"copy {c['copy']} {how}" + (f" ({c['cause']})" if c.get("cause") else ""))
        return head + ": " + "; ".join(said) + ", the rest SIGKILLed"
    return head


# -- the family's planning hooks (chaos.nemesis.family) ---------------------------------------

def _points(job: JobSpec, traces: Traces, facts: Facts | None) -> list[Point]:
    return mid_save_points(traces, facts, "stop")


def _notes(job: JobSpec, traces: Traces, facts: Facts, points: list[Point]) -> list[str]:
    return [] if points else ["hangs are not explored: the job announced no step and traced no save"]


def _observe(job: JobSpec, point: Point, attempts: list[Any], traces: Any) -> Applied:
    """What attempt 0 of a stop point did: where the process stopped and how the attempt ended."""
    stop = attempts[0].stop if attempts else None
    if stop is None:
        at = f"at its step {point.step}" if point.step is not None else f"at its event {point.op}"
        return Applied(f"no stop {at}", {}, outcome="not_reached",
                       skipped=f"rank {point.rank} never stopped {at}: the attempt ended before it got there")
    return Applied(describe(stop), stop)


FAMILY = Family(name="stop", points=_points, notes=_notes, unavailable=lambda job: "", observe=_observe,
                params=lambda job, point, seed: {"silence_s": job.hang_timeout_s if job.hang_timeout_s is not None
                                                 else DEFAULT_STOP_SILENCE_S},
                restarts_torchrun=True)
