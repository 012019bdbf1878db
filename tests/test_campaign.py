"""The default campaign: every family once, then seeded generated schedules until --budget is spent.

Scenarios are replaced by a stand-in that validates the scenario (a generated schedule
the harness would reject fails here) and takes 50 ms, so the budget logic is tested in
a second, not in minutes of real runs.
"""

import json
import time

import pytest

from chaos import cli, runner
from chaos.runner import ScenarioResult

FAMILIES = 7


@pytest.fixture
def fake_runs(monkeypatch):
    ran = []

    def fake(scenario, options=None, progress=None):
        scenario.validate()
        time.sleep(0.05)
        ran.append(scenario)
        return ScenarioResult(scenario, "pass", seconds=0.05)

    monkeypatch.setattr(runner, "run_scenario", fake)
    return ran


def _campaign(tmp_path, budget, name):
    out = tmp_path / f"{name}.json"
    t0 = time.monotonic()
    code = cli.main(["run", "--budget", str(budget), "--seed", "3", "--json", str(out)])
    return code, json.loads(out.read_text())["scenarios"], time.monotonic() - t0


def test_campaign_fills_the_budget_with_seeded_generated_schedules(fake_runs, tmp_path, capsys):
    code, scenarios, took = _campaign(tmp_path, 3, "a")
    assert code == 0
    generated = scenarios[FAMILIES:]
    assert len(generated) >= 1, "the budget allowed generated schedules, yet none ran"
    assert took < 3 + 2.0  # it stops before the budget runs out (plus start-up), not long after
    out = capsys.readouterr().out
    assert "generated schedule 1:" in out and "replay: chaos run" in out
    assert f"{len(generated)} generated schedule(s) (seed 3)" in out
    # Seeded: the same seed draws the same schedules, in the same order.
    _, again, _ = _campaign(tmp_path, 3, "b")
    n = min(len(generated), len(again) - FAMILIES)
    assert n >= 1 and [s["faults"] for s in generated[:n]] == [s["faults"] for s in again[FAMILIES:FAMILIES + n]]


def test_a_spent_budget_runs_every_family_and_no_generated_schedule(fake_runs, tmp_path, capsys):
    code, scenarios, _ = _campaign(tmp_path, 0, "c")
    assert code == 0 and len(scenarios) == FAMILIES
    assert {s["faults"][0]["kind"] for s in scenarios} >= {"kill", "term", "crash", "bitflip", "diskfull"}
    assert "0 generated schedule(s)" in capsys.readouterr().out


def test_an_explicit_fault_runs_no_campaign(fake_runs, tmp_path):
    assert cli.main(["run", "--budget", "5", "--fault", "kill:rank=1,step=23", "--loss-band", "0.02"]) == 0
    assert len(fake_runs) == 1
    assert fake_runs[0].loss_band == 0.02 and "--loss-band 0.02" in fake_runs[0].replay_command()
