"""Shared by ``suites/test_framework_*.py``: the framework jobs' commands and their points.

Each framework suite puts one of ``chaos/examples/frameworks/``'s jobs under chaos
through the ``chaos.job(...)`` fixture. A test runs one point (a whole exploration of a
framework job takes minutes), recorded from an exploration listed in the suite's
docstring. A file-event point's id (``rank0:op87:after``) is an ordinal of the job's
traced events, and ordinals move when the tracer learns to see more (a temp file, a
native writer) or the framework writes one file more; so a test names its event by what
it is — :class:`At`: the Nth event of a kind on a path — and :func:`run_point` turns that
into the id from a fault-free run of this checkout (one per job and launch, cached for
the session). After the point ran it checks the point fired at that very event and
raises :class:`PointDrifted` (a plain assertion error, never the failure type a strict
xfail expects) when it did not: a test never passes or xfails for the wrong reason.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

FRAMEWORKS = Path(__file__).resolve().parents[1] / "chaos" / "examples" / "frameworks"
EXTRA = "pip install -e '.[frameworks]'"


def need(module: str) -> ModuleType:
    """The framework module, or the whole suite skipped with the reason (the extra is not installed)."""
    return pytest.importorskip(module, reason=f"{module} is not installed: the framework suites need the "
                                              f"frameworks extra ({EXTRA})")


def python_job(script: str, *args: str) -> list[str]:
    """``python chaos/examples/frameworks/SCRIPT --out {out} ARGS``: one plain process (or ``ranks=N`` copies)."""
    return [sys.executable, str(FRAMEWORKS / script), "--out", "{out}", *args]


class PointDrifted(AssertionError):
    """A point fired at another event than the one it names, or its event is not in the fault-free run."""


@dataclass(frozen=True)
class At:
    """A file-event point by what it is: rank ``rank``'s ``nth`` event of kind ``op`` on
    ``path`` (relative to {out}; None: any path outside {out}, e.g. a temp file in
    ``$TMPDIR`` whose name is random), broken with ``mode`` (before, after, torn, power,
    a corruption family, enospc, eio); a corruption with ``at_step`` strikes the file that
    event completed once the rank announced that step (at rest, ``rankR:opN:MODE:stepS``).
    ``recorded`` is the id the exploration found."""

    op: str
    path: str | None
    nth: int
    mode: str
    recorded: str
    rank: int = 0
    at_step: int | None = None

    def describe(self) -> str:
        where = self.path if self.path is not None else "a file outside {out}"
        later = f", at rest at step {self.at_step}" if self.at_step is not None else ""
        return f"{self.mode} at rank {self.rank}'s {_ordinal(self.nth)} {self.op} of {where}{later}"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


_EVENTS: dict[tuple[Any, ...], list[tuple[int, int, str, frozenset[str]]]] = {}


def _events(chaos: Any, command: list[str], ranks: int | None) -> list[tuple[int, int, str, frozenset[str]]]:
    """(rank, ordinal, op, the paths it names under {out}) of every traced event of a fault-free run."""
    key = (tuple(command), ranks)
    if key not in _EVENTS:
        from chaos.cli.job import build
        from chaos.record.jobhistory import read_traces
        from chaos.run import explore

        _args, job = build([*(["--ranks", str(ranks)] if ranks else []), "--", *command])
        scratch = chaos.session.options.scratch_base
        os.makedirs(scratch, exist_ok=True)
        root = tempfile.mkdtemp(prefix="events-", dir=scratch)
        try:
            _ref, run = explore.reference(job, root, 2)
            traces = read_traces(run.scratch, run.out)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        root_ = os.path.realpath(run.out)
        _EVENTS[key] = [(rank, r["ord"], r["op"], frozenset(_under(root_, r.get("path"), r.get("dst"))))
                        for (rank, attempt), recs in sorted(traces.items()) if attempt == 0
                        for r in recs if r.get("event") == "op" and r.get("ord") is not None]
    return _EVENTS[key]


def _under(root: str, *paths: Any) -> set[str]:
    """The paths (a rename names two) that lie under {out}, relative to it."""
    return {os.path.relpath(p, root) for p in paths if isinstance(p, str) and (p + os.sep).startswith(root + os.sep)}


def resolve(chaos: Any, command: list[str], at: At, ranks: int | None = None) -> str:
    """The point id of ``at`` in this checkout's fault-free run of ``command``."""
    matches = [o for (rank, o, op, rels) in _events(chaos, command, ranks)
               if rank == at.rank and op == at.op and (at.path in rels if at.path is not None else not rels)]
    if len(matches) < at.nth:
        raise PointDrifted(f"no {at.describe()} in the fault-free run ({len(matches)} such event(s)); "
                           f"the exploration recorded it as {at.recorded}")
    return f"rank{at.rank}:op{matches[at.nth - 1]}:{at.mode}" + (f":step{at.at_step}" if at.at_step else "")


def fired_event(result: Any) -> tuple[str | None, set[str], str]:
    """The event the point fired at in attempt 0: its kind, the paths it names under {out}
    (relative; a rename names its source and, in some records, its destination) and a
    description for messages."""
    point = result.points[0]
    fired = [f for f in point.record.fired() if f["attempt"] == 0]
    if not fired:
        return None, set(), "nothing"
    event = fired[0]
    root = os.path.realpath(point.record.out)
    named = [p for p in (event.get("path"), event.get("dst"), *(event.get("paths") or ())) if isinstance(p, str)]
    rels = _under(root, *named)
    return event.get("op"), rels, f"{event.get('op')} {', '.join(sorted(rels)) or (named[0] if named else '')}"


def _fired_at(result: Any, at: At) -> bool:
    op, rels, _ = fired_event(result)
    if op != at.op:
        return False
    if at.path in rels:
        return True
    # A record that names nothing under {out}: a temp file's event, or a rename's source only.
    return not rels and (at.path is None or at.op == "rename")


def run_point(chaos: Any, command: list[str], point: str | At, **options: Any) -> Any:
    """Run one point of a job (its fault-free runs side by side) and check where it fired.

    ``point`` is an id (a step or disk-full point: ``rank0:step6:kill``) or an :class:`At`.
    ``options`` are ``chaos.job``'s. Returns the fixture's ``JobResult``; ``chaos.check``
    then judges it.
    """
    options.setdefault("jobs", 2)
    pid = resolve(chaos, command, point, options.get("ranks")) if isinstance(point, At) else point
    result = chaos.job(command, point=pid, **options)
    if not result.points:
        raise PointDrifted(f"{pid}: no point was run")
    if isinstance(point, At) and not _fired_at(result, point):
        raise PointDrifted(f"{pid} ({point.describe()}) fired at {fired_event(result)[2]}\n{result.explain()}")
    return result


NET_HOLD_S = 3.0  # --net-hold of the net tests: longer than any collective here takes, far below gloo's timeout


class NotCut(AssertionError):
    """A net point ran but no link was cut (the point was skipped, or the cut failed): nothing was tested."""


def need_netns() -> None:
    """Skip unless network namespaces, veths and a bridge can be made here (root, iproute2)."""
    from chaos.nemesis import netcut

    ok, why = netcut.available()
    if not ok:
        pytest.skip(f"a network cut between ranks needs network namespaces: {why}")


def run_net_point(chaos: Any, command: list[str], point: str | At, **options: Any) -> Any:
    """Run one ``net`` point of ``command`` at 2 ranks (``--ranks 2``, every copy in a network
    namespace of its own, the link down for :data:`NET_HOLD_S`) and check the cut was made.

    Raises :class:`NotCut` (a plain assertion error, never the failure type a strict xfail
    expects) when the launcher cut no link. Returns the fixture's ``JobResult``; the record of
    the cut is ``result.points[0].record.applied.record`` (``down``, ``up``, ``copies``).
    """
    need_netns()
    options["options"] = [*options.get("options", ()), "--net-hold", f"{NET_HOLD_S:g}"]
    result = run_point(chaos, command, point, ranks=2, **options)
    applied = result.points[0].record.applied
    if applied is None or applied.skipped or "down" not in applied.record or "up" not in applied.record:
        why = applied.skipped if applied is not None and applied.skipped else "no link_down / link_up was recorded"
        raise NotCut(f"{result.points[0].point.id}: no network cut was made: {why}\n{result.explain()}")
    return result


def net_endings(result: Any) -> list[str]:
    """How each copy ended during the cut (``netcut.finish``): killed_after_hold, raised, exited_0, ..."""
    return [c["ended"] for c in result.points[0].record.applied.record["copies"]]
