"""The default campaign: a bare ``chaos run`` is every family once; ``--budget`` adds generated schedules.

Most tests replace scenarios by a stand-in that validates the scenario (a generated
schedule the harness would reject fails here) and takes 50 ms, and the traced
fault-free run by fixed fault points, so the budget logic is tested in a second, not in
minutes of real runs. The bare command and ``--budget`` without hypothesis are run in a
subprocess where hypothesis cannot be imported. One real campaign (marked ``chaos``)
checks that no drawn point is skipped and that coverage is reported.
"""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaos.cli import main as cli
from chaos.plan.scenario import Fault
from chaos.record import points
from chaos.record.points import IOPoint, PhasePoint, TracePoints
from chaos.run import runner
from chaos.run.runner import ScenarioResult

FAMILIES = 9
REPO = Path(__file__).resolve().parents[1]
FAKE_POINTS = TracePoints(
    [IOPoint(r, "write", "shard", "write_shards", s, n) for r in (0, 1) for s in (5, 10, 20, 30) for n in (1, 3)]
    + [IOPoint(0, "rename", "latest", "update_latest", s, 1) for s in (5, 10, 20, 30)],
    [PhasePoint(r, "vote", s) for r in (0, 1) for s in (5, 10, 20)])


@pytest.fixture
def fake_runs(monkeypatch):
    ran = []

    def fake(scenario, options=None, progress=None):
        scenario.validate()
        time.sleep(0.05)
        ran.append(scenario)
        return ScenarioResult(scenario, "pass", seconds=0.05)

    monkeypatch.setattr(runner, "run_scenario", fake)  # generated schedules
    monkeypatch.setattr(runner, "ScenarioRun", _halves(fake))  # the family scenarios (chaos.run.campaign.run_pipelined)
    monkeypatch.setattr(points, "reference_points", lambda scenario, options: FAKE_POINTS)
    return ran


def _halves(fake):
    """A stand-in ``chaos.run.runner.ScenarioRun`` whose second half runs ``fake`` (the whole scenario)."""
    class Halves:
        def __init__(self, scenario, options=None, progress=None):
            self.args = (scenario, options, progress)

        def ranks(self):
            pass

        def finish(self):
            return fake(*self.args)

    return Halves


def _campaign(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    t0 = time.monotonic()
    code = cli.main(["run", "--seed", "3", "--json", str(out), *extra])
    return code, json.loads(out.read_text())["scenarios"], time.monotonic() - t0


def test_a_bare_run_is_one_scenario_per_family_and_nothing_generated(fake_runs, tmp_path, capsys):
    code, scenarios, _ = _campaign(tmp_path, "bare")
    assert code == 0 and len(scenarios) == FAMILIES
    assert {s["faults"][0]["kind"] for s in scenarios} == {
        "kill", "term", "crash", "bitflip", "payload", "diskfull", "netdrop", "powerloss"}
    assert any(s["faults"][0]["params"].get("linger") for s in scenarios), "no scenario lets the survivors run on"
    out = capsys.readouterr().out
    assert "campaign: 9 family scenario(s); --budget SECONDS adds generated schedules" in out
    assert "generated schedule 1:" not in out


def test_budget_adds_seeded_generated_schedules_after_the_families(fake_runs, tmp_path, capsys):
    code, scenarios, took = _campaign(tmp_path, "a", "--budget", "3")
    assert code == 0
    generated = scenarios[FAMILIES:]
    assert len(generated) >= 1, "the budget allowed generated schedules, yet none ran"
    out = capsys.readouterr().out
    assert "generated schedule 1:" in out and "replay: chaos run" in out
    assert f"{len(generated)} generated schedule(s) (seed 3), 0 skipped" in out
    assert "fault-point coverage: 0 of 3 (rank, operation, file role, phase) points tried" in out
    faults = [Fault.from_dict(f) for s in generated for f in s["faults"]]
    assert all(FAKE_POINTS.point_of(f) is not None for f in faults if f.family == "io"), "an I/O fault off the trace"
    # Seeded: the same seed draws the same schedules, in the same order.
    _, again, _ = _campaign(tmp_path, "b", "--budget", "3")
    n = min(len(generated), len(again) - FAMILIES)
    assert n >= 1 and [s["faults"] for s in generated[:n]] == [s["faults"] for s in again[FAMILIES:FAMILIES + n]]
    assert len({json.dumps(s["faults"]) for s in generated}) == len(generated), "a schedule ran twice"
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["campaign"]["coverage"]["seen"] == 3 and doc["campaign"]["generated"] == len(generated)
    bare = json.loads((tmp_path / "bare.json").read_text()) if (tmp_path / "bare.json").exists() else {}
    assert "campaign" not in bare


def test_no_schedule_starts_unless_its_estimated_cost_fits_before_the_deadline(monkeypatch):
    """The budget logic on a fake clock: each schedule 'takes' 1.5 s against an estimate of 1 s."""
    from chaos.plan.scenario import Scenario
    from chaos.run import campaign as campaign_mod
    from chaos.target.workload.config import WorkloadConfig

    clock = [100.0]
    monkeypatch.setattr(campaign_mod.time, "monotonic", lambda: clock[0])
    starts = []

    def run_one(schedule):
        starts.append(clock[0])
        clock[0] += 1.5
        return ScenarioResult(Scenario("reference"), "pass", seconds=1.5)

    cfg = WorkloadConfig(steps=40, save_every=5, seed=1)
    done = campaign_mod.fill_budget(cfg, 2, FAKE_POINTS, deadline=110.0, run_one=run_one, estimate_s=lambda: 1.0)
    assert len(done) == len(starts) == 7  # starts at 100, 101.5, ... 109 (109 + 1 fits); 110.5 does not
    assert all(t + 1.0 <= 110.0 for t in starts) and clock[0] + 1.0 > 110.0


def test_generated_returns_the_campaign_entry_with_coverage(fake_runs, tmp_path):
    args = cli.make_parser().parse_args(["run", "--budget", "1", "--seed", "2"])
    template = cli.build_scenarios(args)[0]
    from rich.console import Console

    families = [ScenarioResult(template, "pass", seconds=0.2)]  # what the estimate of a scenario's cost starts from
    with open(os.devnull, "w") as sink:
        campaign = cli._generated(args, template, runner.RunOptions(), Console(file=sink), time.monotonic(), families)
    doc = campaign.to_dict()
    assert doc["budget_s"] == 1 and doc["seed"] == 2 and doc["family_scenarios"] == 1
    assert doc["generated"] == len(list(campaign)) >= 1
    assert doc["generated_skipped"] == 0 and doc["coverage"]["seen"] == 3
    assert doc["coverage"]["io_faults_drawn"] >= 0 and "untried" in doc["coverage"]


def test_an_explicit_fault_runs_no_campaign(fake_runs, tmp_path):
    assert cli.main(["run", "--budget", "5", "--fault", "kill:rank=1,step=23", "--loss-band", "0.02"]) == 0
    assert len(fake_runs) == 1
    assert fake_runs[0].loss_band == 0.02 and "--loss-band 0.02" in fake_runs[0].replay_command()


def test_a_negative_budget_is_refused(fake_runs, capsys):
    assert cli.main(["run", "--budget", "-1"]) == 2
    assert "--budget must be a non-negative number of seconds, got -1" in capsys.readouterr().err
    assert not fake_runs


WITHOUT_HYPOTHESIS = textwrap.dedent("""
    import json, sys

    class NoHypothesis:
        def find_spec(self, name, path=None, target=None):
            if name == "hypothesis" or name.startswith("hypothesis."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, NoHypothesis())
    from chaos.cli import main as cli
    from chaos.run import runner
    from chaos.run.runner import ScenarioResult
    ran = []

    def fake(scenario, options=None, progress=None):
        scenario.validate()
        ran.append(scenario.id)
        return ScenarioResult(scenario, "pass")

    class Halves:
        def __init__(self, scenario, options=None, progress=None):
            self.scenario = scenario

        def ranks(self):
            pass

        def finish(self):
            return fake(self.scenario)

    runner.run_scenario, runner.ScenarioRun = fake, Halves
    code = cli.main(sys.argv[1:])
    print(json.dumps({"code": code, "ran": len(ran), "hypothesis": "hypothesis" in sys.modules}))
""")


def _without_hypothesis(tmp_path, *argv):
    proc = subprocess.run([sys.executable, "-c", WITHOUT_HYPOTHESIS, *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_bare_run_needs_no_hypothesis(tmp_path):
    got, err = _without_hypothesis(tmp_path, "run", "--json", str(tmp_path / "r.json"))
    assert got == {"code": 0, "ran": FAMILIES, "hypothesis": False}, err
    assert len(json.loads((tmp_path / "r.json").read_text())["scenarios"]) == FAMILIES


def test_budget_without_hypothesis_is_one_error_line_and_exit_2(tmp_path):
    got, err = _without_hypothesis(tmp_path, "run", "--budget", "30")
    assert got == {"code": 2, "ran": 0, "hypothesis": False}, err
    assert err.strip().splitlines() == [
        "chaos: error: --budget draws generated schedules with hypothesis, which is not installed "
        "(a development dependency: pip install 'chaos-ckpt[dev]'); without --budget, chaos run needs no hypothesis"]


@pytest.mark.chaos
@pytest.mark.slow  # 43 s of CI's 15 minutes; the fake-clock budget test above keeps the logic in the default run
def test_a_real_budget_campaign_skips_no_drawn_point_and_reports_coverage(tmp_path, capsys):
    """The reference, a tiny workload, 30 s of generated schedules after the nine families."""
    out = tmp_path / "campaign.json"
    code = cli.main(["run", "--steps", "12", "--save-every", "4", "--workload", "d_model=32",
                     "--workload", "n_layers=1", "--seed", "1", "--budget", "30", "--json", str(out),
                     "--scratch", str(tmp_path / "scratch"), "--cache-dir", str(tmp_path / "cache")])
    text = capsys.readouterr().out
    scenarios = json.loads(out.read_text())["scenarios"]
    generated = scenarios[FAMILIES:]
    assert generated, text
    skipped = [(s["replay"], s["error"]) for s in generated if s["verdict"] == "skipped"]
    assert not skipped, skipped
    assert code == 0, [(s["replay"], s["verdict"]) for s in scenarios if s["verdict"] != "pass"]
    assert "fault-point coverage: " in text and " points tried; " in text, text
    line = next(x for x in text.splitlines() if x.startswith("fault-point coverage: "))
    tried, seen = (int(n) for n in line.split(": ")[1].split(" (")[0].split(" of "))
    assert 0 < tried <= seen, line
