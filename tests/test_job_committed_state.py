"""``committed_state`` for a job (#28: the built-in workload's oracle, asked of a job's probe).

A job that announces what each save is made from (``probe.saving(n, state)``) and what each
resume loaded (``probe.resumed(n, state)``) is held to the built-in workload's rule: a resume
loads exactly the state the same rank's save of that step was made from. Judged on traces
written here (no process runs); the planted defect of the job corpus
(``tests/checkpointers/selfcheck/jobs/float32_load.py``) and the workload's own fingerprints
run for real in ``test_selfcheck_jobs``.
"""

from __future__ import annotations

from typing import Any

import pytest

from chaos import probe
from chaos.judge.job import _committed_state
from chaos.launch.job import AttemptOutcome
from chaos.model.point import Point
from chaos.record.jobhistory import PointRecord


def _announce(kind: str, n: int, state: Any, ts: float) -> dict[str, Any]:
    return {"event": "phase", "name": "chaos.probe", "ts": ts, "info": {"kind": kind, "n": n,
                                                                         **probe.fingerprint(state)}}


def _record(traces: dict[tuple[int, int], list[dict[str, Any]]]) -> PointRecord:
    return PointRecord(Point(0, "kill", step=7), "/nonexistent", [AttemptOutcome(0, []), AttemptOutcome(1, [])], traces)


SAVED = {"step": 6, "weights": [0.1, 0.2], "rank": 0}


def test_a_resume_that_loads_the_state_saved_at_its_step_passes() -> None:
    traces = {(0, 0): [_announce("saving", 3, {**SAVED, "step": 3}, 1.0), _announce("saving", 6, SAVED, 2.0)],
              (0, 1): [_announce("resumed", 6, dict(SAVED), 5.0)]}
    got = _committed_state(_record(traces))
    assert got is not None and got.result == "pass", got
    assert got.evidence["checked"] == [{"rank": 0, "attempt": 1, "step": 6}]


def test_a_resume_that_loads_anything_else_fails_naming_the_key() -> None:
    traces = {(0, 0): [_announce("saving", 6, SAVED, 2.0)],
              (0, 1): [_announce("resumed", 6, {**SAVED, "weights": [0.1, 0.20000001]}, 5.0)]}
    got = _committed_state(_record(traces))
    assert got is not None and got.result == "fail"
    assert got.summary == ("rank 0 (attempt 1) loaded step 6, but not the state its save of step 6 (attempt 0) was "
                           "made from (first differing key: 'weights')")
    assert got.evidence["differing_keys"] == ["weights"]


@pytest.mark.parametrize(("saves", "says"), [
    ([_announce("saving", 3, SAVED, 1.0)], "loaded step 6, which no save of that rank announced before it"),
    ([_announce("saving", 6, SAVED, 9.0)], "loaded step 6, which no save of that rank announced before it"),
])
def test_a_step_no_earlier_save_made_fails(saves: list[dict[str, Any]], says: str) -> None:
    got = _committed_state(_record({(0, 0): saves, (0, 1): [_announce("resumed", 6, SAVED, 5.0)]}))
    assert got is not None and got.result == "fail" and says in got.summary, got


def test_another_rank_s_save_is_not_this_rank_s() -> None:
    traces = {(1, 0): [_announce("saving", 6, SAVED, 2.0)], (0, 1): [_announce("resumed", 6, SAVED, 5.0)]}
    got = _committed_state(_record(traces))
    assert got is not None and got.result == "fail"


def test_a_job_that_announces_no_state_is_not_asked_and_half_of_it_is_not_judged() -> None:
    plain = {(0, 0): [{"event": "phase", "name": "chaos.probe", "ts": 1.0, "info": {"kind": "saved", "n": 6}}]}
    assert _committed_state(_record(plain)) is None
    only_saves = _committed_state(_record({(0, 0): [_announce("saving", 6, SAVED, 2.0)]}))
    assert only_saves is not None and only_saves.result == "not_judged" and "no resume announced" in only_saves.summary
    only_loads = _committed_state(_record({(0, 1): [_announce("resumed", 6, SAVED, 5.0)]}))
    assert only_loads is not None and only_loads.result == "not_judged" and "probe.saving" in only_loads.summary


def test_a_fingerprint_is_canonical_and_names_each_key() -> None:
    a = probe.fingerprint({"b": [1.0, 2], "a": "x"})
    assert a == probe.fingerprint({"a": "x", "b": [1.0, 2]})  # key order does not matter
    assert set(a["keys"]) == {"a", "b"} and a["sha256"] != probe.fingerprint({"a": "x", "b": [1.0, 3]})["sha256"]
    assert probe.fingerprint(b"raw")["sha256"] == probe.fingerprint("raw")["sha256"]
    assert "keys" not in probe.fingerprint([1, 2]) and "keys" not in probe.fingerprint({1: "int key"})
    assert probe.fingerprint({1.5, 2.5})["sha256"] == probe._digest(repr({1.5, 2.5}))  # not JSON: its repr
