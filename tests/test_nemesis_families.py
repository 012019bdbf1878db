"""Every ``--faults`` kind of a job is one module of chaos.nemesis (``FAMILY``), found by the registry.

Pure: hand-made traces, no process. What is checked is the protocol's promise: the planner
(``chaos.plan.pointset``) knows no family by name, so the points, their order, the default
kinds and the notes all come from the family modules.
"""

from __future__ import annotations

from typing import Any

import pytest

from chaos.model.jobspec import DEFAULT_STOP_SILENCE_S, FAULT_KINDS, HALT_FAMILIES, JobSpec
from chaos.nemesis import diskfull, family, ioerror, kill, netcut, nodes, term
from chaos.plan import pointset


def _op(ord_: int, op: str, rel: str, ts: float, **extra: Any) -> dict[str, Any]:
    return {"event": "op", "op": op, "ord": ord_, "path": f"/o/{rel}", "rel": rel, "ts": ts, "seq": ord_, **extra}


def _step(n: int, ts: float) -> dict[str, Any]:
    return {"event": "phase", "name": "chaos.probe", "info": {"kind": "step", "n": n}, "ts": ts}


TRACES = {
    (0, 0): [_step(1, 1.0), _op(0, "open", "c.tmp", 1.1, created=True), _op(1, "write", "c.tmp", 1.2, length=8),
             _op(2, "fsync", "c.tmp", 1.3), _op(3, "close", "c.tmp", 1.4),
             _op(4, "rename", "c.pt", 1.5, src="/o/c.tmp", dst="/o/c.pt"), _step(2, 2.0)],
    (1, 0): [_step(1, 1.0), _step(2, 2.0)],
    (0, 1): [_step(3, 9.0)],  # a restart: never a fault-free run's point
}


def test_every_fault_kind_is_one_module_and_the_halting_ones_strike_at_rest() -> None:
    found = family.families()
    assert list(found) == list(family.ORDER) and set(found) == set(FAULT_KINDS)
    assert {k for k, f in found.items() if isinstance(f, family.AtRestFamily)} == set(HALT_FAMILIES)
    for module in (kill, term, ioerror, diskfull, netcut, nodes):
        assert found[module.FAMILY.name] is module.FAMILY
        assert module.FAMILY.points.__module__ == module.__name__  # the module's own hooks, not the planner's
    assert family.of_mode("bitflip") is found["corrupt"] and family.of_mode("kill") is None


def test_points_come_family_by_family_in_the_registry_order() -> None:
    job = JobSpec(command=("python", "t.py", "{out}"), ranks=2)
    points = pointset.enumerate_points(job, TRACES, None, ("net", "errno", "term", "kill"))
    assert [p.id for p in points] == [
        # kill: every event x --modes (torn only for a write of two bytes or more), then every step
        "rank0:op0:before", "rank0:op0:after", "rank0:op1:before", "rank0:op1:after", "rank0:op1:torn",
        "rank0:op2:before", "rank0:op2:after", "rank0:op3:before", "rank0:op3:after",
        "rank0:op4:before", "rank0:op4:after",
        "rank0:step1:kill", "rank0:step2:kill", "rank1:step1:kill", "rank1:step2:kill",
        "rank0:step1:term", "rank0:step2:term", "rank1:step1:term", "rank1:step2:term",
        # errno: eio everywhere, enospc where space is needed (a created file, a write, a rename)
        "rank0:op0:eio", "rank0:op0:enospc", "rank0:op1:eio", "rank0:op1:enospc", "rank0:op2:eio",
        "rank0:op3:eio", "rank0:op4:eio", "rank0:op4:enospc",
        # net: mid-save (the first write since the open, each rename), then each step
        "rank0:op1:net", "rank0:op4:net", "rank0:step1:net", "rank0:step2:net", "rank1:step1:net",
        "rank1:step2:net"]
    assert [p.family for p in points] == sorted((p.family for p in points), key=family.ORDER.index)
    # families that need the run's Facts (at rest, power, a full disk) offer nothing without them
    assert pointset.enumerate_points(job, TRACES, None, ("corrupt", "power", "diskfull")) == []


def test_default_kinds_and_notes_come_from_each_family(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diskfull, "_available", (False, "not root: mounting tmpfs needs CAP_SYS_ADMIN"))
    monkeypatch.setattr(netcut, "_available", (True, "root"))
    one = JobSpec(command=("python", "t.py", "{out}"))
    kinds, notes = pointset.kinds_to_explore(one)
    assert "diskfull" not in kinds and "node" not in kinds and "net" not in kinds  # one copy: nothing to cut
    assert notes == ["a real full disk is not explored: not root: mounting tmpfs needs CAP_SYS_ADMIN"]
    two = JobSpec(command=("python", "t.py", "{out}"), ranks=2)
    assert "net" in pointset.kinds_to_explore(two)[0]
    silent = [_op(0, "open", "log", 0.5, created=True)]  # no step, no save: term and net offer nothing
    facts = pointset.Facts(files=["log"])
    said = pointset.notes(two, {(0, 0): silent}, facts, ("term", "net", "diskfull"), [])
    assert said == ["SIGTERM is not explored: the job announced no step (chaos.probe.step or --step-regex)",
                    "a real full disk is not explored: {out} never held more than 0 byte(s) of tmpfs pages, too "
                    "little to fill a smaller one",
                    "network cuts are not explored: the job announced no step and traced no save"]


def test_what_a_point_records_and_whether_the_harness_restarts_torchrun_come_from_its_family() -> None:
    from chaos.model.jobspec import parse_point
    from chaos.nemesis.atrest import point_seed

    job = JobSpec(command=("python", "t.py", "{out}"), ranks=2, grace_s=7.0, net_hold_s=3.0)
    found = family.families()

    def recorded(text: str) -> dict[str, Any]:
        point = parse_point(text)
        return found[point.family].recorded(job, point, 5)

    assert recorded("rank0:step2:term") == {"grace_s": 7.0}
    assert recorded("rank1:op4:net") == {"hold_s": 3.0}
    assert recorded("node1:step2:link") == {"hold_s": job.node_hold_s} and recorded("node1:step2:loss") == {}
    bitflip = parse_point("rank0:op3:bitflip")
    assert recorded("rank0:op3:bitflip") == {"seed": point_seed(5, bitflip)}
    assert recorded("rank0:op3:after") == {} and recorded("rank0:op3:eio") == {}
    assert recorded("rank1:step2:stop") == {"silence_s": DEFAULT_STOP_SILENCE_S}
    assert found["stop"].recorded(JobSpec(command=job.command, hang_timeout_s=4.0), parse_point("rank1:step2:stop"),
                                  5) == {"silence_s": 4.0}
    # a torchrun agent restarts its workers itself after a kill, an I/O error or a cut; the harness
    # relaunches it where the agent was stopped too, or gave up (a full disk, a lost node), or where
    # every copy was SIGKILLed once a hung worker's peers had nothing left to do (stop)
    assert {k for k, f in found.items() if f.restarts_torchrun} == {*HALT_FAMILIES, "term", "diskfull", "node", "stop"}
    assert [k for k, f in found.items() if f.preempts] == ["term"]
