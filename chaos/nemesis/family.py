"""The protocol of a fault family that edits a stopped job's {out}, and the registry of them.

Jepsen's nemesis shape: a fault family is one module that says where it can strike, how
it strikes, and what it did. The families here (``corrupt``, ``stale``, ``swap``,
``payload``, ``reorder``) strike a file the job completed while every copy of the job is
stopped; each module defines one ``FAMILY = AtRestFamily(...)`` and nothing else needs to
know it exists: :func:`families` finds it. (The point grammar takes any mode the
contract's ``AT_REST_FAMILIES`` table names, one line per family.)

Who calls what, in the order of one ``chaos run -- COMMAND``:

1. *plan* — after the fault-free runs, ``chaos.plan.pointset.gather`` calls ``gather(out,
   scratch, facts)`` where a family needs more than the traces (a payload: which files are
   pickles; a power loss: after which events something was pending),
   then ``enumerate_points`` calls ``points(job, traces, facts)`` for each family the
   ``--faults`` kinds name, in ``FAULT_KINDS`` order. Every point is at an event that
   completed a file (``rankR:opN:MODE``) or at the first step the rank announced after it
   (``...:stepS``): where the job has finished the file, or trusts it. A family that offers
   none says why in one line (``not_offered``), shown with the fault-free runs' notes.
2. *arm* — ``explore`` calls ``prepare(out)`` where a family needs {out} as it was before
   attempt 0 (a power loss: the base its crash states start from); the launcher hands the
   point to the job's tracer, which stops every copy right after the event (or once step S
   is announced): the mode is one of ``HALT_MODES``.
3. *apply* — ``chaos.run.explore`` calls ``apply(point, out, scratch, halt, seed, prepared)`` with every
   copy stopped (``halt``: the tracer's record of where it stopped) and gets an
   ``atrest.Applied``: what was done, in one line, with its exact record and seed; the
   files the job can no longer rely on; or why nothing was done (the point is skipped).
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
from chaos.nemesis.atrest import Applied
from chaos.nemesis.sites import Facts, Traces


@dataclass(frozen=True)
class AtRestFamily:
    """One family's hooks (see the module docstring for when each is called)."""

    name: str                                                     # the --faults kind
    points: Callable[[JobSpec, Traces, Facts], list[Point]]       # the points it offers, in order
    # (point, out, scratch, halt, seed, prepared): what prepare() returned before attempt 0, or None
    apply: Callable[[Point, str, str, dict[str, Any], int, Any], Applied]
    not_offered: str = ""                                         # the note when it offers no point
    gather: Callable[[str, str, Facts], None] | None = None       # (out, scratch, facts): what its points need
    prepare: Callable[[str], Any] | None = None                   # (out) before attempt 0 (power: {out} as it was)
    watch: Callable[[Applied, int], None] | None = None           # (applied, attempt) after each restart
    settle: Callable[[Applied, Traces], None] | None = None       # (applied, every attempt's traces)
    quiet: Callable[[JobSpec], bool] | None = None                # no note for this job (swap: one process)

    @property
    def modes(self) -> tuple[str, ...]:
        """The point modes this family's points carry (``bitflip``... for corrupt, else its name)."""
        return HALT_FAMILIES[self.name]


_FOUND: dict[str, AtRestFamily] | None = None


def families() -> dict[str, AtRestFamily]:
    """Every module of ``chaos.nemesis`` that defines ``FAMILY``, by name, in ``FAULT_KINDS`` order.

    A module whose family the contract's ``AT_REST_FAMILIES`` does not name, or a name twice,
    is a programming error, raised here (the first caller is the fault-free run's planning).
    """
    global _FOUND
    if _FOUND is None:
        import chaos.nemesis as package

        found: dict[str, AtRestFamily] = {}
        for info in pkgutil.iter_modules(package.__path__):
            fam = getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "FAMILY", None)
            if not isinstance(fam, AtRestFamily):
                continue
            if fam.name not in HALT_FAMILIES or fam.name in found:
                raise RuntimeError(f"chaos.nemesis.{info.name}: family {fam.name!r} is not in the contract's "
                                   "HALT_FAMILIES, or is defined twice")
            found[fam.name] = fam
        missing = sorted(set(HALT_FAMILIES) - set(found))
        if missing:
            raise RuntimeError(f"no module of chaos.nemesis defines the at-rest family {', '.join(missing)}")
        _FOUND = {k: found[k] for k in FAULT_KINDS if k in found}
    return _FOUND


def of_mode(mode: str) -> AtRestFamily | None:
    """The family whose points carry ``mode`` (None: not an at-rest mode, e.g. ``power``)."""
    return next((f for f in families().values() if mode in f.modes), None)


__all__ = ["AtRestFamily", "families", "of_mode"]
