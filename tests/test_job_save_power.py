"""The built-in ``all:stepS:power`` (``powerloss:step=S``) as a user's job's points: the power cuts
of the whole save at step S, so ``chaos run --as-job --fault all:step8:power`` and the replay of a
built-in power-loss scenario run through the job pipeline (issue #28).

The stand-in is replaced, once the fault-free run is traced, by the ``power`` points of that
save (``chaos.plan.translate``; which events are the save's: ``chaos.nemesis.sites.save_events``).
Unit tests for the grammar and the window; then real one-process jobs through the CLI, and the
built-in workload through ``--as-job`` (slow).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from jobcli import CAREFUL, CARELESS, REPO, run_json

from chaos.errors import ConfigError
from chaos.model.grammar import parse_point


def test_a_whole_save_s_power_cuts_read_in_both_spellings_and_stand_for_points() -> None:
    point = parse_point("powerloss:step=8,seed=1,max_states=60")
    assert point == parse_point("all:step8:power,max_states=60,seed=1")
    assert (point.whole_save, point.family, point.step, point.id) == (True, "power", 8, "all:step8:power,max_states=60,seed=1")
    assert parse_point(point.id) == point and not parse_point("rank0:op9:power").whole_save
    with pytest.raises(ConfigError, match="take no second fault"):
        parse_point("all:step8:power+rank0:op1:before")
    with pytest.raises(ConfigError, match="rank= and attempt= are the built-in workload's"):
        parse_point("powerloss:step=8,attempt=1")


def test_a_save_s_events_follow_the_step_its_rank_last_announced() -> None:
    from chaos.nemesis.sites import save_events

    def phase(name: str, **info: object) -> dict:
        return {"event": "phase", "name": name, "info": info}

    def op(n: int) -> dict:
        return {"event": "op", "op": "write", "ord": n}

    traces = {
        # rank 0 announces its save's phases: its commit thread's events after step 9 began are step 8's
        (0, 0): [phase("chaos.probe", kind="step", n=8), op(0), phase("save", step=8), op(1),
                 phase("chaos.probe", kind="step", n=9), phase("commit", step=8), op(2), phase("save", step=10), op(3)],
        # rank 1 announces steps only: a save follows the step it saves
        (1, 0): [phase("chaos.probe", kind="step", n=8), op(0), op(1), phase("chaos.probe", kind="step", n=9), op(2)],
        (0, 1): [phase("save", step=8), op(0)],  # a restart's events are no save of the fault-free run
    }
    assert save_events(traces, 8) == {(0, 1), (0, 2), (1, 0), (1, 1)}
    assert save_events(traces, 9) == {(1, 2)} and save_events(traces, 7) == set()


def _ops(doc: dict) -> list[int]:
    return sorted({parse_point(s["id"]).op for s in doc["scenarios"]})


def test_a_whole_save_s_power_cuts_run_as_the_job_s_power_points_of_that_save(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    careless = ("--result-file", "final.json", "--", sys.executable, str(CARELESS), "--out", "{out}")
    _, third = run_json(tmp_path / "a", "--point", "all:step3:power", *careless)
    proc, sixth = run_json(tmp_path / "b", "--point", "all:step6:power", *careless)
    for doc in (third, sixth):
        assert doc["scenarios"] and all(parse_point(s["id"]).family == "power" for s in doc["scenarios"])
    assert max(_ops(third)) < min(_ops(sixth))  # each save's own events, in the order the job made them
    outcomes = {s["outcome"] for s in sixth["scenarios"]}
    assert {"hard_failure", "lost_work"} <= outcomes, proc.stdout[-2000:]  # in place, never fsynced

    (tmp_path / "c").mkdir()
    _, careful = run_json(tmp_path / "c", "--point", "all:step6:power", "--result-file", "final.json", "--",
                          sys.executable, str(CAREFUL), "--out", "{out}")
    assert careful["scenarios"] and {s["outcome"] for s in careful["scenarios"]} <= {"pass", "no_effect"}


def test_max_states_keeps_a_seeded_sample_of_the_save_s_cuts(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        _, doc = run_json(tmp_path / name, "--point", "powerloss:step=6,seed=3,max_states=2", "--result-file",
                          "final.json", "--", sys.executable, str(CARELESS), "--out", "{out}")
        runs.append([s["id"] for s in doc["scenarios"]])
    assert len(runs[0]) == 2 and runs[0] == runs[1]


def test_a_whole_save_without_a_point_is_a_usage_error_before_any_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--point",
                           "all:step7:power", "--result-file", "final.json", "--", sys.executable, str(CARELESS),
                           "--out", "{out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "--point all:step7:power is not a point of this job: no file event of the fault-free run belongs to a " \
           "save at step 7" in proc.stderr


@pytest.mark.slow
def test_the_built_in_workload_s_power_scenario_runs_as_a_job(tmp_path: Path) -> None:
    """The default campaign's power scenario, as ``chaos run --as-job`` takes it: each cut one job point."""
    proc, doc = run_json(tmp_path, "--as-job", "--steps", "12", "--save-every", "5", "--fault",
                         "powerloss:step=10,seed=0,max_states=2")
    assert len(doc["scenarios"]) == 2, proc.stdout[-2000:]
    for result in doc["scenarios"]:
        point = parse_point(result["id"])
        assert (point.family, point.op is not None) == ("power", True)
        assert (result["verdict"], result["outcome"]) == ("pass", "pass"), result["summary"]
        assert result["summary"].startswith(f"power loss right after rank {point.rank}'s event {point.op}")
