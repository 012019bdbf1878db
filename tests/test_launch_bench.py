"""``chaos bench launch``'s breakdown: a scenario's wall time split into phases that add up to it.

Built here from a hand-made record (times in seconds on a made-up clock), so every
boundary is known: the runner's stages, each attempt's bounds, rank 0's events, the
moment the fault fired. A real scenario's breakdown is checked in test_launch_pipeline.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chaos.bench.launch import aggregate, group_of, scenario_phases


def _ev(ev: str, t: float, **fields) -> dict:
    return {"ev": ev, "t": t, "rank": 0, **fields}


def _result():
    attempt0 = [_ev("start", 10.05), _ev("pg_ready", 10.10), _ev("trainer_ready", 10.15), _ev("ckpt_ready", 10.16),
                _ev("resume", 10.20, step=0, seconds=0.01), _ev("step", 10.30, step=1),
                _ev("save_call", 10.35, step=1), _ev("save_return", 10.50, step=1, seconds=0.15),
                _ev("step", 10.60, step=2), _ev("error", 10.90)]  # the survivor fails after the kill
    attempt1 = [_ev("start", 11.10), _ev("pg_ready", 11.12), _ev("trainer_ready", 11.15), _ev("ckpt_ready", 11.16),
                _ev("resume", 11.30, step=1, seconds=0.10), _ev("step", 11.40, step=2), _ev("step", 11.50, step=3),
                _ev("final", 11.60, step=3), _ev("exit", 11.70)]
    verify = [_ev("start", 12.05), _ev("pg_ready", 12.06), _ev("trainer_ready", 12.08), _ev("ckpt_ready", 12.09),
              _ev("verify", 12.20, step=3, seconds=0.05), _ev("exit", 12.25)]
    record = SimpleNamespace(
        attempts=[{"attempt": 0, "outcome": "rank_failed", "started": 10.0, "ended": 11.0, "fired": [{"t": 10.8}]},
                  {"attempt": 1, "outcome": "ok", "started": 11.05, "ended": 11.8, "fired": []}],
        events={0: {0: attempt0}, 1: {0: attempt1}},
        verify={"outcome": "ok", "events": {0: verify}})
    spans = [("set-up", 9.90, 9.95), ("golden", 9.95, 9.96), ("run", 9.97, 11.82), ("final load", 12.00, 12.30),
             ("power-loss exploration", 12.30, 12.30), ("environment teardown", 12.30, 12.31),
             ("record", 12.31, 12.32), ("hygiene", 12.32, 12.33), ("judge", 12.33, 12.34), ("clean-up", 12.34, 12.40)]
    return SimpleNamespace(spans=spans, record=record)


def test_the_phases_partition_the_scenario_and_name_what_each_interval_was():
    segments = scenario_phases(_result())
    assert segments[0][1] == 9.90 and segments[-1][2] == 12.40
    for (_, _, end), (_, start, _) in zip(segments, segments[1:], strict=False):
        assert end == pytest.approx(start), "consecutive, no gap, no overlap"
    rows = aggregate(segments)
    assert sum(r["s"] for r in rows.values()) == pytest.approx(2.5)

    def s(name):
        return pytest.approx(rows[name]["s"])

    assert rows["train: steps"]["n"] == 5  # attempt 0: two steps and the one the fault cut; attempt 1: two
    assert s("train: steps") == (10.30 - 10.20) + (10.60 - 10.50) + (10.80 - 10.60) + (11.40 - 11.30) + (11.50 - 11.40)
    assert s("fault: fired -> every rank down") == 11.0 - 10.8  # the survivor's error event is after the fault fired
    assert s("resume: checkpointer load_latest()") == 0.01 + 0.10
    assert s("resume: template + state hash") == (10.20 - 10.16 - 0.01) + (11.30 - 11.16 - 0.10)
    assert s("save: checkpointer save()") == 0.15
    assert s("launch: fork, rank start") == (10.05 - 10.0) + (11.10 - 11.05)
    assert s("restart: between attempts") == 0.05
    assert s("end: exit noticed, ranks reaped") == 11.8 - 11.7
    assert s("run: after the last attempt") == 11.82 - 11.8
    assert s("final load: checkpointer load_latest()") == 0.05
    assert s("final load: end: exit noticed, ranks reaped") == 12.30 - 12.25
    assert s("harness: between stages") == (9.97 - 9.96) + (12.00 - 11.82)
    assert s("harness: clean-up") == 0.06


def test_every_phase_has_one_group_and_the_evidence_is_told_apart_from_the_job():
    names = {name for name, _, _ in scenario_phases(_result())}
    groups = {name: group_of(name) for name in names}
    assert groups["save: state_dict + state hash"].startswith("state hashes")
    assert groups["end: final state hash"].startswith("state hashes")
    assert groups["final load: launch: rendezvous (init_process_group)"].startswith("final load")
    assert groups["harness: judge"].startswith("harness")
    assert groups["restart: between attempts"].startswith("launch and teardown")
    assert groups["fault: fired -> every rank down"].startswith("launch and teardown")
    assert groups["train: steps"].startswith("the job's own work")
    assert groups["save: checkpointer save()"].startswith("the job's own work")
