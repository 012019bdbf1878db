"""The ``chaos`` fixture takes a job: ``chaos.job(COMMAND)`` runs it under chaos, ``chaos.check`` judges it.

A failing job fails the test with ``job_failed(outcome)`` and every failing point's
outcome, summary and replay command in the message (and the replay in JUnit XML); a
passing job passes; a run in which no point fired is not a pass. The end-to-end cases
run a real pytest session (pytester) over the shipped pure-Python examples.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chaos.cli.plugin import ChaosRunner, ChaosVerdictError, JobFailed, JobResult, job_failed

pytest_plugins = ["pytester"]
EXAMPLES = Path(__file__).resolve().parents[1] / "chaos" / "examples"

SUITE = f'''
import sys
import pytest
from chaos.cli.plugin import ChaosVerdictError, JobFailed, job_failed

CARELESS = [sys.executable, {str(EXAMPLES / "careless_job.py")!r}, "--out", "{{out}}"]
CAREFUL = [sys.executable, {str(EXAMPLES / "careful_job.py")!r}, "--out", "{{out}}"]

def test_careless_point_fails(chaos):
    result = chaos.job(CARELESS, result_files=["final.json"], point="rank0:op1:after")
    chaos.check(result)

def test_careful_passes(chaos):
    result = chaos.job(CAREFUL, result_files=["final.json"], max_points=4)
    chaos.check(result)
    assert result.verdict == "pass" and len(result.points) == 4

def test_nothing_fired(chaos):
    result = chaos.job(CAREFUL, result_files=["final.json"], point="rank0:op999:before")
    assert result.verdict == "skipped"
    chaos.check(result)
'''


def test_a_failing_job_fails_the_test_with_the_replay_and_a_passing_one_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_jobs=SUITE)
    junit = pytester.path / "junit.xml"
    run = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={junit}")
    run.assert_outcomes(passed=1, failed=2)
    out = run.stdout.str()
    # the careless point: the typed failure, its outcome, evidence and the command that replays it
    assert "JobHardFailure" in out
    assert "HARD_FAILURE rank0:op1:after (open ckpt.json)" in out and "JSONDecodeError" in out
    # anchored: the careless job's paths are the same in every run, so the replay names the event too
    assert "replay: chaos run --result-file final.json --point rank0:op1:after@open:ckpt.json:1 -- " in out
    # a run in which nothing fired is a plain verdict error, never a pass
    assert "verdict skipped" in out and "no point fired, so the job was not tested" in out
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_careless_point_fails"].iter("property")}
    assert props["chaos_verdict"] == "fail" and "--point rank0:op1:after" in props["chaos_replay"]
    assert {p.get("name"): p.get("value") for p in cases["test_careful_passes"].iter("property")}[
        "chaos_verdict"] == "pass"


# Pure unit tests of how a job run's points add up to one verdict and one error type.

@dataclass
class _V:
    verdict: str
    outcome: str
    summary: str = "x"


@dataclass
class _P:
    id: str = "rank0:op1:after"
    kind: str | None = "open"
    path: str | None = "ckpt.json"


@dataclass
class _R:
    verdict: _V
    point: _P = field(default_factory=_P)
    replay: str = "chaos run --point rank0:op1:after -- python train.py --out {out}"


@dataclass
class _Job:
    command: tuple[str, ...] = ("python", "train.py", "--out", "{out}")

    def replay_command(self) -> str:
        return "chaos run -- python train.py --out {out}"


@dataclass
class _Exploration:
    results: list[Any]
    found: int = 10


def _job(*outcomes: str) -> JobResult:
    verdict = {"pass": "pass", "not_reached": "skipped", "error": "error"}
    return JobResult(_Job(), _Exploration([_R(_V(verdict.get(o, "fail"), o)) for o in outcomes]), {})


def test_points_add_up_to_one_verdict() -> None:
    assert _job("pass", "not_reached").verdict == "pass"
    assert _job("not_reached", "not_reached").verdict == "skipped"
    assert _job().verdict == "skipped"
    assert _job("pass", "lost_work").verdict == "fail"
    assert _job("hard_failure", "error").verdict == "error"


def test_check_raises_the_failing_outcomes_type() -> None:
    chaos = ChaosRunner(None, lambda *a: None)
    chaos.check(_job("pass", "not_reached"))
    with pytest.raises(job_failed("hard_failure")) as both:
        chaos.check(_job("pass", "hard_failure", "lost_work"))
    assert isinstance(both.value, job_failed("lost_work")) and not isinstance(both.value, job_failed("silent_divergence"))
    assert "HARD_FAILURE rank0:op1:after (open ckpt.json): x" in str(both.value)
    assert "replay: chaos run --point rank0:op1:after" in str(both.value)
    for quiet in (_job("not_reached"), _job(), _job("error")):
        with pytest.raises(ChaosVerdictError) as exc:
            chaos.check(quiet)
        assert not isinstance(exc.value, JobFailed)
    with pytest.raises(ValueError, match="unknown outcome"):
        job_failed("pass")
