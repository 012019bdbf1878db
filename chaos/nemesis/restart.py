"""``restart``: the engine restarts one rank's container in place (``--launcher docker``).

Why: a container comes back by itself. A restart policy (``on-failure``), a liveness probe or a
node agent restarts one rank's container with the same command while its peers still run the
job it belonged to: the rank returns as a fresh process of the same attempt, with nothing of
the others' progress. The peers' collectives with the old process fail, and the job must
restart from what its checkpoint holds. This is the built-in workload's
``restart:rank=R,step=S[,phase=P][,timeout=T]`` (``chaos.launch.drivers.docker``) for any job
run as containers; ``rankR:stepS:restart,timeout=T`` is the same point.

Who does what, in the order of one point:

- the rank's tracer (``chaos.target.job.inproc``) fires it when the rank announces step S (or
  at a ``phase=`` of that step's save): it leaves a marker (``contract.restart_marker``), the ``fired``
  record and a ``restart-request`` (:data:`~chaos.model.contract.RESTART_REQUEST`), then waits;
- the launcher (``chaos.launch.job.run_attempt``) calls :func:`carry_out`: ``docker restart
  -t T`` of that copy's container through the engine (SIGTERM, SIGKILL after T seconds; at once
  with T 0, the default), then answers (:data:`~chaos.model.contract.RESTART_DONE`). The copy's
  ``docker run`` client stays attached to the restarted container;
- the restarted process is the same rank of the same attempt with the same point: the marker
  tells its tracer the point fired already, so it runs on and traces as attempt
  ``contract.IN_PLACE_BASE`` + N, a restart of its own. When a copy then fails (the peers, whose collectives
  lost the old process) the launcher stops the rest, as after any death, and
  ``chaos.run.explore`` restarts the job;
- the family's ``observe`` hook says what the engine did, and the judge judges the restart as after
  a kill.

Only with ``--launcher docker`` (:func:`refusal`); explored only when asked for (``--faults
restart`` or a ``--point``). The protocol: :mod:`chaos.nemesis.family`.
"""

from __future__ import annotations

import math
from typing import Any

from chaos.launch import containers
from chaos.launch.answers import answer
from chaos.model import contract as S
from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis.atrest import Applied
from chaos.nemesis.family import Family
from chaos.nemesis.sites import Facts, Traces, announced_steps


def timeout_s(point: Point) -> float:
    """How long the engine waits after SIGTERM before SIGKILL (the built-in ``timeout=T``; 0: SIGKILL at once),
    in whole seconds as the engine takes it (a fraction rounds up)."""
    return float(math.ceil(float(dict(point.settings).get("timeout", 0))))


def refusal(job: JobSpec, point: Point) -> str | None:
    """Why ``point`` (a restart) cannot run on ``job``: only an engine restarts a container in place."""
    if point.mode != "restart" or job.launcher == "docker":
        return None
    return "a restart is the container engine's (docker restart): it needs --launcher docker (--driver docker with --as-job)"


def carry_out(req: dict[str, Any], names: list[str], point: Point, trace_dir: str) -> dict[str, Any]:
    """Restart the requesting rank's container (``names``: the attempt's containers, one per copy) and
    answer the rank; the attempt's record of it. Called by ``chaos.launch.job.run_attempt``."""
    rank = req.get("rank")
    grace = timeout_s(point)
    record: dict[str, Any] = {"rank": rank, "timeout_s": grace, "signal": "SIGTERM" if grace else "SIGKILL",
                              **{k: req[k] for k in ("step_n", "phase") if req.get(k) is not None}}
    if not isinstance(rank, int) or not 0 <= rank < len(names):
        record["error"] = f"no container of copy {rank} in this attempt"
    else:
        record["container"] = names[rank]
        record.update(containers.restart(names[rank], grace))
    answer(trace_dir, S.RESTART_DONE, record)
    return record


def describe(restart: dict[str, Any]) -> str:
    """The fault line: which rank's container the engine restarted, and where."""
    where = f"at its step {restart.get('step_n')}" + (f", in the {restart['phase']} phase of its save"
                                                      if restart.get("phase") else "")
    how = (f"SIGTERM, SIGKILL after {restart['timeout_s']:g} s" if restart.get("timeout_s") else "SIGKILL")
    return (f"rank {restart.get('rank')}'s container restarted in place by the engine {where} ({how}; "
            "the same command started again, its peers still running)")


# -- the family's hooks (chaos.nemesis.family) --------------------------------------------------

def _points(job: JobSpec, traces: Traces, facts: Facts | None) -> list[Point]:
    if job.launcher != "docker":
        return []
    return [Point(rank, "restart", step=n) for rank, steps in announced_steps(traces) for n in steps]


def _notes(job: JobSpec, traces: Traces, facts: Facts, points: list[Point]) -> list[str]:
    if job.launcher != "docker":
        return ["restart is not explored: a container restarted in place needs --launcher docker"]
    return [] if points else ["restart is not explored: the job announced no step (chaos.probe.step or --step-regex)"]


def _observe(job: JobSpec, point: Point, attempts: list[Any], traces: Any) -> Applied:
    """What attempt 0 of a restart point did: the engine's restart, or why there was none."""
    restart = attempts[0].restart if attempts else None
    if restart is None:
        return Applied(f"no restart at step {point.step}", {}, outcome="not_reached",
                       skipped=f"rank {point.rank} never asked for its restart at step {point.step}: the attempt "
                               "ended before it got there")
    if restart.get("error"):
        return Applied(f"no restart of rank {point.rank}'s container", restart, outcome="unsupported",
                       skipped=f"the engine did not restart rank {point.rank}'s container: {restart['error']}")
    return Applied(describe(restart), restart)


def _params(job: JobSpec, point: Point, seed: int) -> dict[str, float]:
    return {"timeout_s": timeout_s(point)}


FAMILY = Family(name="restart", points=_points, notes=_notes, unavailable=lambda job: "", observe=_observe,
                params=_params, refusal=refusal)
