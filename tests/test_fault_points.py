"""Fault points come from a trace, fire where the trace says, and each I/O fault's firing is its own.

The points of a traced save (``chaos.record.points.points_of_trace``) must address operations
exactly as the interposer counts them: every point, turned into a fault spec and run
through the harness's own rule builder against the same save, fires once, at an
operation of the point's kind and file role. A schedule of two I/O faults of which one
fired is not "fired" (the runner skipped it only when *no* I/O fault fired). Drawn
schedules use traced points only, and put a fault in the next attempt only after one
that restarts the job, at a later step.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from chaos import phases
from chaos.nemesis.environment import Environment
from chaos.plan.scenario import Scenario, parse_fault
from chaos.plan.strategies import RESTARTING_KINDS, fault_schedules
from chaos.record.history import RunRecord
from chaos.record.points import (
    Coverage,
    IOPoint,
    PhasePoint,
    TracePoints,
    file_role,
    fired_io_faults,
    points_of_trace,
)
from chaos.run.runner import ScenarioResult, _unfired_io_faults
from chaos.target.workload.config import WorkloadConfig
from faults.interposer import Interposer, IORule


def _save(root: Path, step: int, rank: int = 0) -> None:
    """A save shaped like the reference's: shards in a temp dir, manifest, rename, latest pointer."""
    phases.phase("save", step=step)
    phases.phase("write_shards", step=step)
    tmp = root / f".tmp-step-{step:04d}"
    os.mkdir(tmp)
    with open(tmp / f"shard-r{rank}.safetensors", "wb", buffering=0) as f:
        for _ in range(3):
            f.write(b"x" * 100)
        phases.phase("fsync_shards", step=step)
        os.fsync(f.fileno())
    phases.phase("write_manifest", step=step)
    with open(tmp / "manifest.json", "w") as f:
        f.write("{}")
        f.flush()
        os.fsync(f.fileno())
    phases.phase("rename", step=step)
    os.replace(tmp, root / f"step-{step:04d}")
    fd = os.open(root / f"step-{step:04d}", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    phases.phase("update_latest", step=step)
    with open(root / ".tmp-latest", "w") as f:
        f.write(str(step))
    os.replace(root / ".tmp-latest", root / "latest")
    with open(root / "metrics.prom", "w") as f:
        f.write("saves 1\n")


def _job(root: Path) -> None:
    with open(root / "metrics.prom", "w") as f:  # before any save phase: no point
        f.write("saves 0\n")
    for step in (4, 8):
        _save(root, step)


def _traced(root: Path, rules: list[IORule] = ()) -> Interposer:
    root.mkdir(parents=True, exist_ok=True)
    ix = Interposer(root, rank=0, rules=rules)
    with ix:
        try:
            _job(root)
        except OSError:
            pass  # an injected EIO ends the job, as it would end a rank's save
    return ix


def test_points_of_a_traced_save_name_op_role_phase_step_and_nth(tmp_path):
    ix = _traced(tmp_path / "ref")
    io, found = points_of_trace(ix.records, 0, str(tmp_path / "ref"))
    assert {p.step for p in io} == {4, 8}, "the metrics write before the first save phase is no point"
    writes = [p for p in io if p.step == 4 and p.op == "write" and p.phase == "write_shards"]
    assert [(p.role, p.nth) for p in writes] == [("shard", 1), ("shard", 2), ("shard", 3)]
    keys = {p.key for p in io}
    assert {(0, "mkdir", "tmp-dir", "write_shards"), (0, "fsync", "shard", "fsync_shards"),
            (0, "write", "manifest", "write_manifest"), (0, "rename", "ckpt-dir", "rename"),
            (0, "fsync", "ckpt-dir", "rename"), (0, "rename", "latest", "update_latest"),
            (0, "write", "metrics", "update_latest")} <= keys
    assert PhasePoint(0, "write_manifest", 8) in found and len(found) == 2 * 6


def test_every_traced_point_fires_once_where_the_trace_says(tmp_path):
    ix = _traced(tmp_path / "ref")
    io, _ = points_of_trace(ix.records, 0, str(tmp_path / "ref"))
    env = Environment([], 1, None, str(tmp_path), 4)
    assert len(io) > 20
    for i, point in enumerate(io):
        root = tmp_path / f"run{i}"
        rules = [IORule.from_dict(r) for r in env.io_rules(parse_fault(point.spec("eio")))]
        run = _traced(root, rules)
        fired = run.fired
        assert len(fired) == 1, (point, fired)
        dirs = {os.path.realpath(root / f"step-{s:04d}") for s in (4, 8)} | {
            os.path.realpath(root / f".tmp-step-{s:04d}") for s in (4, 8)}
        assert (fired[0]["op"], fired[0]["step"]) == (point.op, point.step), point
        where = fired[0]["paths"][-1]  # a rename's role is its destination's, as in the trace
        assert file_role(where, os.path.realpath(root), dirs) == point.role, (point, fired[0])


def test_file_roles_follow_the_names_under_the_root():
    root = "/r"
    dirs = {"/r/.tmp-step-1", "/r/step-1", "/r/step_2"}
    assert file_role("/r", root) == "root"
    assert file_role("/r/.tmp-step-1", root, dirs) == "tmp-dir"
    assert file_role("/r/step-1", root, dirs) == "ckpt-dir"
    assert file_role("/r/.tmp-step-1/shard-r00001.safetensors", root, dirs) == "shard"
    assert file_role("/r/step_2/__0_0.distcp", root, dirs) == "shard"
    assert file_role("/r/step_2/.metadata", root, dirs) == "manifest"
    assert file_role("/r/.tmp-step-1/manifest.json", root, dirs) == "manifest"
    assert file_role("/r/.tmp-latest-ab12", root, dirs) == "latest"
    assert file_role("/r/.tmp-metrics-7.prom", root, dirs) == "metrics"
    assert file_role("/r/notes.txt", root, dirs) == "other"


def _record(faults, fired, rules_given=None) -> RunRecord:
    """A record of one attempt on two ranks whose interposer rules in ``fired`` (rank, rule) fired."""
    events = {0: {r: [{"ev": "io_trace", "rules": [{}] * (rules_given or {}).get(r, 0)}] for r in (0, 1)}}
    io = {"ops": {"write": 10, "rename": 2}, "fired": [{"event": "fired", "rank": r, "rule": i, "attempt": 0}
                                                       for r, i in fired]}
    return RunRecord(2, [{"attempt": 0, "outcome": "ok", "fired": []}], events, io)


TWO_IO = ["crash:rank=0,step=4,op=write,nth=1", "eio:rank=0,step=8,op=rename,nth=9"]


def test_each_io_fault_fires_by_its_own_rule():
    faults = [parse_fault(f) for f in TWO_IO + ["kill:rank=1,step=3", "eio:rank=1,step=8,op=write,nth=1"]]
    given = {0: 2, 1: 1}
    assert fired_io_faults(faults, _record(faults, [(0, 0)], given)) == {0}
    assert fired_io_faults(faults, _record(faults, [(0, 1), (1, 0)], given)) == {1, 3}
    # Disk full without root runs in the interposer: each rank gets the disk fault's rule too, in order.
    faults = [parse_fault("diskfull:step=3,free=10"), parse_fault(TWO_IO[1])]
    assert fired_io_faults(faults, _record(faults, [(0, 0)], {0: 2, 1: 1})) == set()
    assert fired_io_faults(faults, _record(faults, [(0, 1)], {0: 2, 1: 1})) == {1}


def test_a_schedule_of_two_io_faults_where_one_never_fired_is_skipped():
    scenario = Scenario("reference", faults=[parse_fault(f) for f in TWO_IO])
    why = _unfired_io_faults(scenario, _record(scenario.faults, [(0, 0)], {0: 2}))
    assert why is not None and why.startswith("skipped: I/O fault rank0:step8:eio")
    assert "1 of the 2 I/O faults fired" in why
    assert _unfired_io_faults(scenario, _record(scenario.faults, [(0, 0), (0, 1)], {0: 2})) is None


def test_coverage_counts_distinct_points_tried_by_fired_faults():
    points = TracePoints([IOPoint(0, "write", "shard", "write_shards", 4, 1),
                          IOPoint(0, "write", "shard", "write_shards", 4, 2),
                          IOPoint(0, "rename", "latest", "update_latest", 4, 1)], [PhasePoint(0, "vote", 4)])
    coverage = Coverage(points)
    scenario = Scenario("reference", faults=[parse_fault(points.io[1].spec("crash"))])
    coverage.add(ScenarioResult(scenario, "pass", record=_record(scenario.faults, [(0, 0)], {0: 1})))
    unfired = Scenario("reference", faults=[parse_fault(points.io[2].spec("eio"))])
    coverage.add(ScenarioResult(unfired, "skipped", record=_record(unfired.faults, [], {0: 1})))
    doc = coverage.to_dict()
    assert (doc["seen"], doc["tried"], doc["io_faults_drawn"], doc["io_faults_fired"]) == (2, 1, 2, 1)
    assert doc["untried"] == ["rank 0 rename latest in update_latest"]
    assert doc["io_faults_never_fired"] == [unfired.faults[0].spec()]
    assert "1 of 2 (rank, operation, file role, phase) points tried" in coverage.summary()


CFG = WorkloadConfig(steps=12, save_every=4)
POINTS = TracePoints(
    [IOPoint(r, op, role, ph, s, n) for r in (0, 1) for s in (4, 8, 12) for op, role, ph, n in
     (("write", "shard", "write_shards", 1), ("write", "shard", "write_shards", 7), ("fsync", "shard", "fsync_shards", 1))]
    + [IOPoint(0, "rename", "latest", "update_latest", s, 1) for s in (4, 8, 12)],
    [PhasePoint(r, ph, s) for r in (0, 1) for s in (4, 8, 12) for ph in ("save", "vote")]
    + [PhasePoint(0, "rename", s) for s in (4, 8, 12)])


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(schedule=fault_schedules(CFG, 2, POINTS))
def test_drawn_schedules_use_traced_points_and_restart_before_a_next_attempt(schedule):
    faults = [parse_fault(f) for f in schedule]
    Scenario("reference", workload=CFG, faults=faults).validate()
    assert 1 <= len(faults) <= 2 and [f.attempt for f in faults] == list(range(len(faults)))
    phase_points = set(POINTS.phases)
    for f in faults:
        if f.family == "io":
            assert POINTS.point_of(f) is not None, f.spec()
        elif f.param("phase"):
            assert PhasePoint(f.rank, f.param("phase"), f.step) in phase_points, f.spec()
    if len(faults) == 2:
        assert faults[0].kind in RESTARTING_KINDS, schedule
        assert faults[1].step > faults[0].step, schedule


def test_phase_kills_are_drawn_with_and_without_survivors_running_on():
    seen: set[bool] = set()

    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(schedule=fault_schedules(CFG, 2, POINTS))
    def collect(schedule):
        for f in map(parse_fault, schedule):
            if f.kind == "kill" and f.param("phase"):
                seen.add(f.param("linger", None) is not None)

    collect()
    assert seen == {True, False}


def test_without_io_points_no_io_fault_is_drawn():
    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(schedule=fault_schedules(CFG, 2, TracePoints([], [PhasePoint(0, "save", 4)])))
    def check(schedule):
        assert all(parse_fault(f).family != "io" for f in schedule)

    check()


@pytest.mark.parametrize("bad", [{"format": 99, "io": [], "phases": []}, {"io": []}])
def test_a_points_cache_entry_of_another_format_is_refused(bad):
    with pytest.raises((ValueError, KeyError)):
        TracePoints.from_dict(bad)
