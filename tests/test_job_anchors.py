"""Anchored points: a point whose event had the same path in both fault-free runs fires at the
nth event of its kind on that path, so a job whose ordinals move from run to run (ranks racing
to create one directory) is still broken exactly where its replay command says.

The job here moves its own ordinals on purpose: before its checkpoint it calls
``os.makedirs(DIR, exist_ok=True)`` three, two or one times, by how many times it was
launched before (a counter in the test's own directory): launches 0, 1, 2, 3, 4 make 3, 2, 1,
3, 2 mkdir events, as a rank that loses a race to create a directory makes one traced ``mkdir``
more or less than the one that wins.
"""

from __future__ import annotations

import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from chaos.errors import ConfigError
from chaos.model.jobspec import JobSpec, Point, parse_point, replay_point
from chaos.run import explore

JOB = textwrap.dedent('''
    import json, os, sys
    out, counter = sys.argv[1], sys.argv[2]
    n = int(open(counter).read()) if os.path.exists(counter) else 0
    with open(counter, "w") as f:
        f.write(str(n + 1))
    ckpt = os.path.join(out, "ckpt.json")
    step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
    for _ in range(3 - n % 3):  # three, two, one traced mkdir events, by launch
        os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    while step < 4:
        step += 1
        with open(ckpt, "w") as f:  # in place, no fsync: a kill after the open leaves it empty
            f.write(json.dumps({"step": step}))
    with open(os.path.join(out, "final.json"), "w") as f:
        f.write(json.dumps({"step": step}))
''')


@pytest.fixture
def racy(tmp_path: Path) -> JobSpec:
    script = tmp_path / "racy_job.py"
    script.write_text(JOB)
    return JobSpec(command=(sys.executable, str(script), "{out}", str(tmp_path / "launches")),
                   result_globs=("final.json",), faults=("kill",))


def _scratch(tmp_path: Path) -> str:
    d = tmp_path / "scratch"
    d.mkdir(exist_ok=True)
    return str(d)


def test_an_anchor_round_trips_through_the_replay_command_and_only_an_event_point_takes_one():
    p = Point(0, "power", op=17, kind="write", path="ckpt/a:b.pt", nth=3, state=2, anchored=True)
    assert p.replay_id == "rank0:op17:power:s2@write:ckpt/a:b.pt:3" and p.id == "rank0:op17:power:s2"
    assert parse_point(p.replay_id) == p
    assert p.env()["anchor"] == ["write", "ckpt/a:b.pt", 3]
    cmd = JobSpec(command=("python", "t.py", "{out}")).replay_command(p)
    assert shlex.split(cmd)[-6:] == ["--point", p.replay_id, "--", "python", "t.py", "{out}"]
    assert f"--point {p.replay_id} --" in cmd  # no quoting needed for a plain path
    unanchored = Point(0, "after", op=4, kind="write", path="tmpab12.pt", nth=1)
    assert unanchored.replay_id == unanchored.id and "anchor" not in unanchored.env()
    for bad, why in (("rank0:step3:kill@write:a:1", "only an event point"),
                     ("rank0:op1:after@write:/etc/x:1", "relative to {out}"),
                     ("rank0:op1:after@write:../x:1", "relative to {out}"),
                     ("rank0:op1:after@write:a:0", "an anchor is"),
                     ("rank0:op1:after@write:a", "an anchor is"),
                     ("rank0:op1:after@Write!:a:1", "an anchor is")):
        with pytest.raises(ConfigError, match="malformed --point") as info:
            parse_point(bad)
        assert why in str(info.value)


def test_a_replay_point_is_the_recorded_anchor_or_the_bare_id_of_older_results():
    entry = {"id": "rank0:op3:after", "scenario": {"point": "rank0:op3:after@write:ckpt.json:2"}}
    assert replay_point(entry) == "rank0:op3:after@write:ckpt.json:2"
    assert replay_point({"id": "rank0:op3:after", "scenario": {"point": "rank0:op3:after"}}) == "rank0:op3:after"
    assert replay_point({"id": "rank0:op3:after"}) == "rank0:op3:after"
    # a scenario point that is not this entry's is never used
    assert replay_point({"id": "rank0:op3:after", "scenario": {"point": "rank0:op9:after@write:x:1"}}) \
        == "rank0:op3:after"


def test_points_are_anchored_only_where_both_fault_free_runs_had_the_same_event(racy, tmp_path):
    ref, _run = explore.reference(racy, _scratch(tmp_path), jobs=1)
    by_path: dict[str, list[Point]] = {}
    for p in ref.points:
        if p.op is not None:
            by_path.setdefault(p.path or "", []).append(p)
    # ckpt.json and final.json: the same events in every run, whatever their ordinals
    assert by_path["ckpt.json"] and all(p.anchored for p in by_path["ckpt.json"])
    assert by_path["final.json"] and all(p.anchored for p in by_path["final.json"])
    # the first fault-free run made three mkdirs of logs/, the second two: the third is in one run only
    logs = {p.nth: p.anchored for p in by_path["logs"]}
    assert logs == {1: True, 2: True, 3: False}
    assert ref.events != {} and "different numbers of file events" in " ".join(ref.notes)


def test_an_anchored_point_fires_at_its_event_where_the_ordinals_moved(racy, tmp_path):
    ref, _run = explore.reference(racy, _scratch(tmp_path), jobs=1)
    point = next(p for p in ref.points if p.mode == "after" and p.kind == "open" and p.path == "ckpt.json")
    # the point is the first fault-free run's (3 mkdirs); explore's own fault-free runs make 1 and 3,
    # the point's run 2: its open of ckpt.json comes one event earlier
    e = explore.explore(racy, jobs=1, only=parse_point(point.replay_id), scratch_base=_scratch(tmp_path))
    (r,) = e.results
    fired = r.record.fired()
    assert fired and fired[0]["op"] == "open" and fired[0]["path"].endswith("/ckpt.json")
    assert fired[0]["ord"] == point.op - 1
    d = r.to_dict()
    assert d["id"] == point.id and d["scenario"]["point"] == point.replay_id
    assert "ordinals moved, the event did not" in d["drift"]
    # killed right after the truncating open: the restart finds an empty checkpoint and dies
    assert d["verdict"] == "fail" and d["outcome"] == "hard_failure", d["summary"]


def test_the_bare_ordinal_lands_elsewhere_in_the_same_run(racy, tmp_path):
    """What the anchor prevents: the same id without it, given to a run whose ordinals moved,
    names another event (here the close of ckpt.json: explore's own first fault-free run made
    two mkdirs fewer than the one the id came from)."""
    ref, _run = explore.reference(racy, _scratch(tmp_path), jobs=1)
    point = next(p for p in ref.points if p.mode == "after" and p.kind == "open" and p.path == "ckpt.json")
    bare = Point(point.rank, point.mode, op=point.op)  # as a hand-written --point rankR:opN:after gives it
    e = explore.explore(racy, jobs=1, only=bare, scratch_base=_scratch(tmp_path))
    (r,) = e.results
    fired = r.record.fired()
    assert fired and (fired[0]["op"], fired[0]["path"].endswith("/ckpt.json")) != ("open", True)


def test_an_anchored_point_does_not_fire_at_its_ordinal_before_its_event_comes(racy, tmp_path):
    """The recorded ordinal is a name, never a trigger: here it comes first (launch 2 makes one
    mkdir, event 0) and the point still waits for the open of ckpt.json (event 1)."""
    e = explore.explore(racy, jobs=1, only=parse_point("rank0:op0:after@open:ckpt.json:1"),
                        scratch_base=_scratch(tmp_path))
    (r,) = e.results
    fired = r.record.fired()
    assert fired and (fired[0]["op"], fired[0]["ord"]) == ("open", 1) and fired[0]["path"].endswith("/ckpt.json")
    assert r.to_dict()["outcome"] == "hard_failure"
