"""A built-in workload's I/O fault (``crash``, ``shortwrite``, ``eio``, ``enospc``, ``fsyncfail``,
``slowio``) as a point of a user's job, so ``chaos run --as-job --fault rank0:step4:crash,...``
runs through the job pipeline (issue #28).

The point carries the interposer rule the built-in rank would fire (``Fault.io_rule``), and the
job's tracer fires that very rule: the same op kind, count, path glob, byte, phase and step.
Unit tests for the grammar (both spellings, the round trip of the id a replay prints, the
results entry the built-in fault has); then real one-process jobs through the CLI, each
judged by the job's oracles, and one ``--as-job`` run of the built-in workload (slow).
"""

from __future__ import annotations

import shlex
import sys
import textwrap
from pathlib import Path

import pytest
from jobcli import CARELESS, run_json

from chaos.errors import ConfigError
from chaos.model.grammar import parse_fault, parse_point
from chaos.model.point import Point

# Saves every 3rd step with a temp file renamed over; an OSError while saving is printed and
# swallowed, and the save is acknowledged all the same: the bug an injected error shows once the
# job is killed at its next step and resumed from what is really on disk.
SWALLOWS = """
    import json, os, sys
    from chaos import probe

    out = sys.argv[1]
    ckpt = os.path.join(out, "ckpt.json")
    step, w = 0, 1.0
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            saved = json.load(f)
        step, w = saved["step"], saved["w"]
        probe.resumed(step)
    while step < 12:
        step += 1
        w = w * 0.9 + 0.1 * step
        probe.step(step, w)
        if step % 3 == 0:
            try:
                with open(ckpt + ".tmp", "w") as f:
                    json.dump({"step": step, "w": w}, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(ckpt + ".tmp", ckpt)
            except OSError as exc:
                print("save failed, carrying on:", exc, flush=True)
            probe.saved(step)
    with open(os.path.join(out, "final.json"), "w") as f:
        json.dump({"w": w}, f)
"""


@pytest.mark.parametrize(("place", "older", "family"), [
    ("rank0:step4:crash,op=write,nth=1", "crash:rank=0,step=4,op=write,nth=1", "kill"),
    ("rank1:shortwrite,op=write,nth=3,keep=2", "shortwrite:rank=1,op=write,nth=3,keep=2", "kill"),
    ("rank0:eio,op=fsync", "eio:rank=0,op=fsync", "errno"),
    ("rank0:step8:enospc,phase=write_shards,op=write", "enospc:rank=0,step=8,phase=write_shards,op=write", "errno"),
    ("rank0:step4:fsyncfail,path=*.json", "fsyncfail:rank=0,step=4,path=*.json", "errno"),
    ("rank2:step6:slowio,op=rename,delay=0.5", "slowio:rank=2,step=6,op=rename,delay=0.5", "errno"),
    ("rank0:step6:crash,byte=20,path=ckpt.json", "crash:rank=0,step=6,byte=20,path=ckpt.json", "kill"),
])
def test_a_built_in_io_fault_is_a_job_point_in_either_spelling(place: str, older: str, family: str) -> None:
    fault = parse_fault(place)
    point = parse_point(place)
    assert parse_point(older) == point
    assert (point.rank, point.mode, point.family, point.op, point.step) == (fault.rank, fault.kind, family, None, None)
    assert point.id == fault.spec() and parse_point(point.id) == point  # what a replay prints reads back
    assert point.env()["rule"] == fault.io_rule()  # the very rule the built-in rank fires
    entry, builtin = point.to_fault(), fault.to_dict()
    assert {k: entry[k] for k in ("kind", "rank", "step", "spec")} == {k: builtin[k] for k in ("kind", "rank", "step",
                                                                                              "spec")}
    assert builtin["params"].items() <= entry["params"].items()
    assert all(isinstance(v, str | int | float | bool) for v in entry["params"].values())  # the schema's scalars


def test_the_built_in_environment_and_the_job_fire_one_rule() -> None:
    from chaos.nemesis.environment import Environment

    fault = parse_fault("rank0:step4:shortwrite,op=write,nth=2,keep=5")
    env = Environment.__new__(Environment)  # io_rules reads nothing of the environment for an I/O fault
    assert env.io_rules(fault) == [parse_point(fault.spec()).env()["rule"]]
    assert fault.io_rule()["action"] == "short_write" and fault.io_rule()["keep"] == 5


def test_a_job_s_own_errno_point_at_an_event_stays_one() -> None:
    for text in ("rank0:op3:eio", "rank0:op3:enospc+rank0:op1:before"):
        point = parse_point(text)
        assert (point.builtin, point.rule, point.op, point.family) == (None, None, 3, "errno") and point.id == text


def test_an_io_point_takes_a_second_fault_in_its_resume() -> None:
    point = parse_point("rank0:step4:crash,op=write,nth=1+rank0:op3:before")
    assert point.then == Point(0, "before", op=3, attempt=1)
    assert point.id == "rank0:step4:crash,nth=1,op=write+rank0:op3:before" and parse_point(point.id) == point


@pytest.mark.parametrize(("text", "says"), [
    ("rank0:step2:crash,op=fsync,byte=3", "a byte rule matches writes only"),
    ("rank0:step2:shortwrite,op=rename", "short_write applies to writes only"),
    ("crash:rank=0,op=write,attempt=1", "fires in the first attempt"),
    ("rank0:crash", "needs a point: op=KIND"),
    ("rank0:crash,op=frob", "unknown op kind"),
])
def test_an_impossible_io_point_is_refused_naming_it(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_point(text)


def _by_id(doc: dict) -> dict[str, dict]:
    return {s["id"]: s for s in doc["scenarios"]}


def test_io_points_strike_a_job_where_the_built_in_rule_says(tmp_path: Path) -> None:
    points = ["rank0:step6:crash,byte=20,path=ckpt.json", "rank0:shortwrite,op=write,nth=3,keep=2",
              "rank0:slowio,op=write,nth=1,delay=0.2"]
    proc, doc = run_json(tmp_path, "--result-file", "final.json", *(a for p in points for a in ("--point", p)), "--",
                       sys.executable, str(CARELESS), "--out", "{out}")
    got = _by_id(doc)
    assert set(got) == {parse_point(p).id for p in points}, proc.stdout[-2000:]
    byte = got["rank0:step6:crash,byte=20,path=ckpt.json"]
    assert byte["outcome"] == "hard_failure", byte["summary"]
    assert "killed in its write of ckpt.json" in byte["summary"] and "having written 20 of its" in byte["summary"]
    assert byte["faults"][0]["kind"] == "crash" and byte["faults"][0]["params"]["byte"] == 20
    torn = got["rank0:shortwrite,keep=2,nth=3,op=write"]
    assert torn["outcome"] == "hard_failure" and "stored 2 of its" in torn["summary"], torn["summary"]
    slow = got["rank0:slowio,delay=0.2,nth=1,op=write"]
    assert (slow["verdict"], slow["outcome"]) == ("pass", "pass") and "was delayed 0.2 s" in slow["summary"]
    replay = shlex.split(byte["replay"])
    assert replay[:2] == ["chaos", "run"] and "rank0:step6:crash,byte=20,path=ckpt.json" in replay
    (tmp_path / "replay").mkdir()
    _, again = run_json(tmp_path / "replay", *replay[2:])  # the replay command strikes the same byte again
    (same,) = again["scenarios"]
    assert (same["id"], same["outcome"], same["summary"]) == (byte["id"], "hard_failure", byte["summary"])


def test_an_io_error_the_job_swallows_is_lost_work_once_it_is_killed_at_its_next_step(tmp_path: Path) -> None:
    job = tmp_path / "swallows.py"
    job.write_text(textwrap.dedent(SWALLOWS))
    point = "rank0:step6:eio,op=fsync,nth=1"
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", point, "--", sys.executable, str(job),
                       "{out}")
    (result,) = doc["scenarios"]
    assert result["outcome"] == "lost_work", result["summary"]
    assert "fsync of ckpt.json.tmp" in result["summary"] and "raised EIO;" in result["summary"]
    assert "killed at its next step (7)" in result["summary"]
    assert result["faults"][0]["kind"] == "eio"


def test_an_io_point_no_event_matches_is_refused_once_the_run_shows_it(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", "rank0:fsyncfail,op=fsync", "--",
                       sys.executable, str(CARELESS), "--out", "{out}")
    assert proc.returncode == 2
    assert "no file event of rank 0 matched rank0:fsyncfail,op=fsync" in proc.stderr  # the careless job never fsyncs
    (result,) = doc["scenarios"]
    assert (result["verdict"], result["outcome"]) == ("skipped", "not_reached")


@pytest.mark.slow
def test_the_built_in_workload_takes_its_io_faults_as_a_job(tmp_path: Path) -> None:
    """``chaos run --as-job --fault`` with I/O faults: once refused, now the rule fires in the workload's rank."""
    proc, doc = run_json(tmp_path, "--as-job", "--steps", "12", "--save-every", "5",
                       "--fault", "rank0:step10:fsyncfail,op=fsync", "--fault", "crash:rank=1,step=10,op=write,nth=2")
    got = _by_id(doc)
    assert set(got) == {"rank0:step10:fsyncfail,op=fsync", "rank1:step10:crash,nth=2,op=write"}, proc.stdout[-2000:]
    for result in got.values():
        assert (result["verdict"], result["outcome"]) == ("pass", "pass"), result["summary"]
    assert "raised EIO (a failed fsync)" in got["rank0:step10:fsyncfail,op=fsync"]["summary"]
    assert "rank 1 killed before its write of ckpt/" in got["rank1:step10:crash,nth=2,op=write"]["summary"]

