"""A failing campaign keeps its evidence: foreign text is never markup, results are written
before anything is rendered, and a crash of the harness itself exits 2 with the file intact."""

import io
import json

from rich.console import Console

from chaos.cli import main as cli
from chaos.cli.console import scenario_line, summary_table
from chaos.model.check import Check
from chaos.plan.scenario import Scenario, parse_fault
from chaos.run.runner import ScenarioResult

GLOO = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
        "Timed out waiting 5000ms for recv operation to complete [bold]x[/]")


def _failed(scenario: Scenario) -> ScenarioResult:
    return ScenarioResult(scenario, "fail", {"liveness": Check("liveness", "fail", GLOO, {})}, error=GLOO)


def test_a_ranks_error_text_prints_verbatim_in_the_line_and_the_table():
    out = io.StringIO()
    console = Console(file=out, width=400, color_system=None)
    result = _failed(Scenario(checkpointer="reference", faults=[parse_fault("kill:rank=1,step=5")]))
    scenario_line(console, result)
    summary_table(console, [result])
    text = out.getvalue()
    assert "[/__w/pytorch/pytorch/third_party/gloo" in text
    assert "[bold]x[/]" in text  # not interpreted either


def test_a_harness_crash_mid_campaign_exits_2_and_keeps_the_finished_results(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(scenario, options=None, progress=None):
        calls.append(scenario)
        if len(calls) == 2:
            raise RuntimeError("the harness broke")
        return _failed(scenario)

    class Halves:  # chaos.run.runner.ScenarioRun as chaos.run.campaign.run_pipelined drives it
        def __init__(self, scenario, options=None, progress=None):
            self.scenario = scenario

        def ranks(self):
            pass

        def finish(self):
            return fake_run(self.scenario)

    monkeypatch.setattr("chaos.run.runner.ScenarioRun", Halves)
    monkeypatch.setattr(cli, "_generated", lambda *a, **k: [])
    out = tmp_path / "results.json"
    rc = cli.main(["run", "--json", str(out)])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"chaos: harness error: RuntimeError: the harness broke; results of the finished scenarios "
                   f"are in {out}"]
    doc = json.loads(out.read_text())
    assert [s["verdict"] for s in doc["scenarios"]] == ["fail"]
    assert GLOO in doc["scenarios"][0]["oracles"]["liveness"]["summary"]
