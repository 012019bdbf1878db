"""What a launcher offers, and who calls what, in which order.

The harness starts a target's processes six ways: ranks forked from the warm fork server
(``cluster``), ranks as containers (``drivers.docker``), a job's command as a subprocess or
N copies of it with torchrun's environment, a torchrun COMMAND (``job``), each of those copies
as a container (``job`` with ``containers``: ``--launcher docker``), and one torchrun agent
per node (``chaos.nemesis.nodes``). They stand behind two protocols, one per target,
and every process any of them starts is tracked by ``reaper`` until it is reaped.

**The built-in workload's ranks: a** :class:`Driver` (``drivers.open_driver``). The runner
(``chaos.run.runner``) calls, for one scenario:

1. ``open_driver(name, scratch, image)``: nothing starts yet;
2. ``__enter__``: what the driver needs is made (docker: the engine, the image, a network);
3. ``env_faults(faults)``: the faults the shared ``Environment`` is to prepare;
4. ``run(plan, env)``, once: every attempt, restarts and elastic shrink included;
5. ``verify(plan, env)``, only after a ``run`` that completed: a fresh launch that only
   loads the latest checkpoint;
6. ``__exit__``: what the driver made is gone, on success, failure or interrupt;
7. ``hygiene(found)``, when the scenario is judged: the runner's leftovers with the
   driver's own facts folded in.

Both drivers return ``cluster``'s result types and leave rank logs at the same paths, so
``RunRecord`` and the oracles never know which one ran. Inside ``run`` and ``verify`` every
launch is a ``cluster.Attempt`` (its docstring gives its own order and what a driver overrides).

**A user's job: an** :class:`AttemptLauncher`, ``job.run_attempt`` or ``nodes.run_attempt``
(``--nodes``), or, for ``--launcher sbatch``, ``sbatch.run_attempts``: the same call, returning
every attempt the Slurm job ran (Slurm's own reruns after a requeue follow attempt 0).
``chaos.run.explore`` calls, for one exploration:

1. ``job.prestart(...)``, optionally, while another attempt runs: the copies of an attempt
   likely to come next, held at their gate (``spares``);
2. the launcher, once per attempt of a run chain, in order (0, then the restarts): it returns
   once every process of the attempt is gone;
3. ``job.cancel()`` on an interrupt, from any thread: running attempts end at their next
   poll, and none starts;
4. ``job.kill_all()``, then ``job.uncancel()``, when the exploration ends, however it ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from chaos.launch.cluster import AttemptResult, ClusterResult, LaunchPlan
    from chaos.launch.job import AttemptOutcome
    from chaos.model.fault import Fault
    from chaos.model.jobspec import JobSpec, Point
    from chaos.nemesis.environment import Environment
    from faults.network import NetworkLab


@runtime_checkable
class Driver(Protocol):
    """Runs one scenario's ranks: a context manager around its faulted run and final load."""

    name: str  # as ``--driver`` spells it

    def __enter__(self) -> Driver: ...

    def __exit__(self, *exc: object) -> None: ...

    def env_faults(self, faults: list[Fault]) -> list[Fault]: ...

    def run(self, plan: LaunchPlan, env: Environment) -> ClusterResult: ...

    def verify(self, plan: LaunchPlan, env: Environment) -> AttemptResult: ...

    def hygiene(self, found: dict[str, list[Any]]) -> dict[str, list[Any]]: ...


class AttemptLauncher(Protocol):
    """Runs one attempt of a user's job to its end (or ``job.timeout_s``); nothing of it survives."""

    def __call__(self, job: JobSpec, out: str, scratch: str, attempt: int, point: Point | None, mark: str,
                 lab: NetworkLab | None) -> AttemptOutcome: ...
