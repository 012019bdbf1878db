"""The protocol of a fault family, and the registry of them.

Jepsen's nemesis shape: a fault family is one module that says where it can strike, how
it strikes, and what it did. Each module of this package that defines ``FAMILY`` is one
(:func:`families` finds it; nothing else needs to know it exists):

- :class:`Family`, whose points the job's own tracer fires inside a rank (``kill``,
  ``term``, ``errno``: kill.py, term.py, ioerror.py) or the launcher carries out during an
  attempt (``diskfull``, ``net``, ``node``: diskfull.py, netcut.py, nodes.py) or, for a job
  Slurm launches, through Slurm (``sched``: sched.py, which Slurm restarts itself);
- :class:`AtRestFamily`, which strikes a file the job completed while every copy of the job
  is stopped (``corrupt``, ``stale``, ``swap``, ``payload``, ``reorder``, ``power``; the
  point grammar takes any mode the contract's ``HALT_FAMILIES`` table names, one line per
  family).

Who calls what, in the order of one ``chaos run -- COMMAND``:

0. *choose* — ``chaos.plan.pointset.kinds_to_explore`` asks each family's ``unavailable(job)``
   where ``--faults`` is not given: a family that cannot be made here (a full disk without
   root) is left out of the default kinds, with its note.
1. *plan* — after the fault-free runs, ``chaos.plan.pointset.gather`` calls ``gather(out,
   scratch, facts)`` where a family needs more than the traces (a payload: which files are
   pickles; a power loss: after which events something was pending; a full disk: the peak
   usage of {out}), then ``enumerate_points`` calls ``points(job, traces, facts)`` for each
   family the ``--faults`` kinds name, in :data:`ORDER`, and ``pointset.notes`` calls
   ``notes(job, traces, facts, points)`` with the family's own points: what the user should
   know about what it left out (an at-rest family that offers none says why in one line,
   ``not_offered``). An at-rest family's points are at an event that completed a file
   (``rankR:opN:MODE``) or at the first step the rank announced after it (``...:stepS``):
   where the job has finished the file, or trusts it.
2. *arm* — ``explore`` calls ``prepare(out)`` where an at-rest family needs {out} as it was
   before attempt 0 (a power loss: the base its crash states start from); the launcher hands
   the point to the job's tracer, which stops every copy right after the event (or once
   step S is announced): the mode is one of ``HALT_MODES``.
3. *apply* — ``chaos.run.explore`` calls ``apply(point, out, scratch, halt, seed, prepared)`` with every
   copy stopped (``halt``: the tracer's record of where it stopped) and gets an
   ``atrest.Applied``: what was done, in one line, with its exact record and seed; the
   files the job can no longer rely on; or why nothing was done (the point is skipped).
   A family the launcher carries out (a network cut, a node's loss) says what attempt 0 did
   with ``observe(job, point, attempts, traces)``, an ``Applied`` like the others'.
   ``restarts_torchrun`` and ``preempts`` say whether the harness restarts the job after the
   point (a torchrun COMMAND restarts its workers itself; a SIGTERM'd job that exited 0 was
   preempted, not finished), ``params`` what the results' fault entry records beyond the
   point (a hold, a grace; an at-rest family's seed).
4. *watch* — after each restart, ``watch(applied, attempt)``; after the last,
   ``settle(applied, traces)`` (a payload: did its marker appear, who read the file).
5. *judge* — ``chaos.judge.job`` reads the Applied like any point's: the line starts the
   verdict, ``excluded`` bounds what the job could rely on, ``idle`` makes a point whose
   fault may have done nothing *skipped* when every oracle passes.

There is nothing to heal: the point's {out} is thrown away with its scratch folder.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chaos.model.jobspec import FAULT_KINDS, HALT_FAMILIES, JobSpec, Point
from chaos.nemesis.atrest import Applied, point_seed
from chaos.nemesis.sites import Facts, Traces

# The order a job's points are enumerated in, family by family (and so the order a seeded
# sample draws from): the in-rank families, the halting ones in the contract's order, then
# those the launcher carries out.
ORDER = ("kill", "term", "errno", *HALT_FAMILIES, "diskfull", "net", "node", "sched", "stop", "restart")


@dataclass(frozen=True, kw_only=True)
class Family:
    """One family's hooks for planning (see the module docstring for when each is called)."""

    name: str                                                     # the --faults kind
    points: Callable[[JobSpec, Traces, Facts], list[Point]]       # the points it offers, in order
    gather: Callable[[str, str, Facts], None] | None = None       # (out, scratch, facts): what its points need
    # (job, traces, facts, its own points): what the user should know about what it left out
    notes: Callable[[JobSpec, Traces, Facts, list[Point]], list[str]] | None = None
    # (job): why it is not explored here unless asked for ('' leaves it out without a note), None if it is
    unavailable: Callable[[JobSpec], str | None] | None = None
    needs_facts: bool = False                                     # no points where the run left no Facts
    # (job, point): why a --point of this family cannot run on this job (None: it can); chaos.cli.job asks
    # before any run (a kill's lost=true without --ranks, a restart without --launcher docker)
    refusal: Callable[[JobSpec, Point], str | None] | None = None
    # -- running a point (chaos.run.explore) --
    # (job, point, seed): what the results' fault entry records beyond the point (a hold, a grace, a seed)
    params: Callable[[JobSpec, Point, int], dict[str, Any]] | None = None
    # (job, point, attempts, traces) after attempt 0, traces() reading every attempt's: what the launcher did
    observe: Callable[[JobSpec, Point, list[Any], Callable[[], Traces]], Applied | None] | None = None
    restarts_torchrun: bool = False   # the harness relaunches a torchrun COMMAND (its agent was stopped too)
    preempts: bool = False            # attempt 0 is restarted even when it exited 0 (preempted, not finished)
    scheduler_restarts: bool = False  # the scheduler restarts the job itself (sched: Slurm); the harness never does

    def recorded(self, job: JobSpec, point: Point, seed: int) -> dict[str, Any]:
        """What the results' fault entry records beyond the point (``explore.PointResult.to_dict``)."""
        return self.params(job, point, seed) if self.params is not None else {}

    def explains(self, job: JobSpec, traces: Traces, facts: Facts, points: list[Point]) -> list[str]:
        """The family's notes on this job (``pointset.notes``): ``notes`` given its own points."""
        return self.notes(job, traces, facts, points) if self.notes is not None else []


@dataclass(frozen=True, kw_only=True)
class AtRestFamily(Family):
    """A halting family's hooks: planning's, and how it strikes a stopped job."""

    # (point, out, scratch, halt, seed, prepared): what prepare() returned before attempt 0, or None
    apply: Callable[[Point, str, str, dict[str, Any], int, Any], Applied]
    not_offered: str = ""                                         # the note when it offers no point
    prepare: Callable[[str], Any] | None = None                   # (out) before attempt 0 (power: {out} as it was)
    watch: Callable[[Applied, int], None] | None = None           # (applied, attempt) after each restart
    settle: Callable[[Applied, Traces], None] | None = None       # (applied, every attempt's traces)
    quiet: Callable[[JobSpec], bool] | None = None                # no note for this job (swap: one process)
    # (point, out, scratch) once the point's rank halted: False while what the point strikes is not yet on
    # disk (swap: another rank's file of the checkpoint, complete in the fault-free run by then). The
    # launcher (launch.job.run_attempt) lets the other copies run on until it is True, for at most
    # launch.job.HALT_SETTLE_S; the halt record says how long it waited.
    halt_ready: Callable[[Point, str, str], bool] | None = None
    needs_facts: bool = True
    restarts_torchrun: bool = True

    def recorded(self, job: JobSpec, point: Point, seed: int) -> dict[str, Any]:
        """The seed the point's edit drew from (``atrest.point_seed``), whatever else the family records."""
        return {"seed": point_seed(seed, point), **super().recorded(job, point, seed)}

    @property
    def modes(self) -> tuple[str, ...]:
        """The point modes this family's points carry (``bitflip``... for corrupt, else its name)."""
        return HALT_FAMILIES[self.name]

    def explains(self, job: JobSpec, traces: Traces, facts: Facts, points: list[Point]) -> list[str]:
        said = super().explains(job, traces, facts, points)
        if self.not_offered and not points and not (self.quiet is not None and self.quiet(job)):
            said.append(f"{self.name} is not explored: {self.not_offered}")
        return said


_FOUND: dict[str, Family] | None = None


def families() -> dict[str, Family]:
    """Every module of ``chaos.nemesis`` that defines ``FAMILY``, by name, in :data:`ORDER`.

    A family the contract does not name (``FAULT_KINDS``), a halting one that is not an
    :class:`AtRestFamily`, a name twice or a kind no module defines is a programming error,
    raised here (the first caller is the fault-free run's planning).
    """
    global _FOUND
    if _FOUND is None:
        import chaos.nemesis as package

        found: dict[str, Family] = {}
        for info in pkgutil.iter_modules(package.__path__):
            fam = getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "FAMILY", None)
            if not isinstance(fam, Family):
                continue
            if (fam.name not in FAULT_KINDS or fam.name in found
                    or (fam.name in HALT_FAMILIES) != isinstance(fam, AtRestFamily)):
                raise RuntimeError(f"chaos.nemesis.{info.name}: family {fam.name!r} is not in the contract's "
                                   "FAULT_KINDS, is defined twice, or halts the job without being an AtRestFamily")
            found[fam.name] = fam
        missing = sorted(set(ORDER) - set(found))
        if missing or set(FAULT_KINDS) - set(ORDER):
            raise RuntimeError(f"no module of chaos.nemesis defines the family {', '.join(missing)} (or ORDER "
                               "leaves out a kind of FAULT_KINDS)")
        _FOUND = {k: found[k] for k in ORDER}
    return _FOUND


def halting() -> dict[str, AtRestFamily]:
    """The families that stop every copy and strike {out} (``HALT_FAMILIES``), in :data:`ORDER`."""
    return {k: f for k, f in families().items() if isinstance(f, AtRestFamily)}


def of_mode(mode: str) -> AtRestFamily | None:
    """The halting family whose points carry ``mode`` (None: a mode no family halts for, e.g. ``kill``)."""
    return next((f for f in halting().values() if mode in f.modes), None)


__all__ = ["ORDER", "AtRestFamily", "Family", "families", "halting", "of_mode"]
