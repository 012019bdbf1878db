"""A pipelined campaign (``chaos.run.campaign.run_pipelined``): each scenario is judged while the next one's ranks run.

The real test makes the overlap certain rather than likely: the first scenario's
hygiene check waits until the next scenario's rank 0 has logged a training step, so
its hygiene, oracles and clean-up run while those ranks are alive. Every scenario must
still pass with clean hygiene and exactly the attempts its fault makes (a clean-up that
killed the next scenario's ranks would add a failed attempt), the scenarios' core-bound
halves must never overlap, and the callbacks must arrive one scenario at a time.
"""

from __future__ import annotations

import glob
import time

import pytest

from chaos.bench.launch import aggregate, scenario_phases
from chaos.errors import ConfigError
from chaos.plan.scenario import Scenario, parse_fault
from chaos.run import campaign, runner
from chaos.run.runner import RunOptions, ScenarioResult
from chaos.target.workload.config import WorkloadConfig

TINY = WorkloadConfig(steps=8, save_every=2, d_model=32, n_layers=1)
CORE = ("golden", "run", "final load", "power-loss exploration")
FAULTS = ["kill:rank=1,step=5", "crash:rank=1,step=4,op=write,nth=2", "kill:rank=0,step=3"]


def _stepping_elsewhere(base: str, mine: str) -> bool:
    """Whether another scenario's rank 0 (not ``mine``'s) has logged a training step."""
    for path in glob.glob(f"{base}/chaos-*/logs/rank0.attempt0.jsonl"):
        if not path.startswith(mine + "/"):
            try:
                with open(path) as f:
                    if '"ev":"step"' in f.read():
                        return True
            except OSError:
                continue
    return False


def test_each_scenario_is_judged_while_the_next_ones_ranks_run_and_nothing_is_shared(tmp_path, monkeypatch):
    base = str(tmp_path / "scratch")
    scenarios = [Scenario("reference", 2, TINY, [parse_fault(f)]) for f in FAULTS]
    real_leftovers = runner._leftovers
    waited: list[bool] = []

    def leftovers_once_the_next_one_trains(record, scratch, suffix):
        if len(waited) < len(scenarios) - 1:  # the last one has no next scenario to wait for
            deadline = time.monotonic() + 120
            while not _stepping_elsewhere(base, str(scratch)) and time.monotonic() < deadline:
                time.sleep(0.01)
            waited.append(_stepping_elsewhere(base, str(scratch)))
        return real_leftovers(record, scratch, suffix)

    monkeypatch.setattr(runner, "_leftovers", leftovers_once_the_next_one_trains)
    calls: list[tuple[str, str]] = []
    results = campaign.run_pipelined(
        scenarios, RunOptions(scratch_base=base, cache_dir=tmp_path / "cache"),
        on_start=lambda s: calls.append(("start", s.id)),
        progress=lambda event, info: calls.append(("progress", event)),
        on_result=lambda r: calls.append(("result", r.scenario.id)))

    assert waited == [True, True], "each hygiene check ran while the next scenario's ranks trained"
    assert [r.scenario.id for r in results] == [s.id for s in scenarios]
    for r in results:
        assert r.verdict == "pass", (r.scenario.id, r.error, [o.summary for o in r.failing()])
        assert r.record.hygiene["processes"] == [] and r.record.hygiene["mounts"] == []
        assert [a["outcome"] for a in r.record.attempts] == ["rank_failed", "ok"], r.scenario.id
    # The overlap happened, and only outside the core-bound halves.
    for before, after in zip(results, results[1:], strict=False):
        judged = [(a, b) for n, a, b in before.spans if n in ("hygiene", "judge", "clean-up")]
        run = next((a, b) for n, a, b in after.spans if n == "run")
        assert min(a for a, _ in judged) < run[1] and max(b for _, b in judged) > run[0]
    cores = sorted((a, b) for r in results for n, a, b in r.spans if n in CORE)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(cores, cores[1:], strict=False)), "core-bound halves overlapped"
    # Callbacks one scenario at a time: start, its progress, its result, then the next start.
    owners = []
    for kind, what in calls:
        if kind == "start":
            owners.append(what)
        assert kind != "result" or what == owners[-1]
    assert owners == [s.id for s in scenarios]
    assert [k for k, _ in calls].count("result") == len(scenarios)
    # The bench's breakdown partitions a real scenario's wall time and counts its steps.
    segments = scenario_phases(results[0])
    assert all(b1 == pytest.approx(a2) for (_, _, b1), (_, a2, _) in zip(segments, segments[1:], strict=False))
    rows = aggregate(segments)
    steps = sum(1 for a in results[0].record.events.values() for e in a.get(0, []) if e["ev"] == "step")
    assert rows["train: steps"]["n"] >= steps
    assert sum(r["s"] for r in rows.values()) == pytest.approx(segments[-1][2] - segments[0][1])


class _Halves:
    """A stand-in ScenarioRun: ``ranks`` validates (a ConfigError there, as the real one), ``finish`` passes."""

    ran: list[str] = []

    def __init__(self, scenario, options=None, progress=None):
        self.scenario, self.raised = scenario, None

    def ranks(self):
        self.ran.append(self.scenario.id)
        try:
            self.scenario.validate()
        except ConfigError as exc:
            self.raised = exc
            raise

    def finish(self):
        if self.raised is not None:
            raise self.raised
        return ScenarioResult(self.scenario, "pass")


def test_a_config_error_stops_the_campaign_after_reporting_the_scenario_before_it(monkeypatch):
    monkeypatch.setattr(runner, "ScenarioRun", _Halves)
    _Halves.ran = []
    good = Scenario("reference", 2, TINY, [parse_fault("kill:rank=1,step=5")])
    bad = Scenario("reference", 2, TINY, [parse_fault("kill:rank=1,step=5,attempt=9")])  # past --max-restarts
    reported = []
    with pytest.raises(ConfigError, match="exceeds --max-restarts"):
        campaign.run_pipelined([good, bad, good], on_result=reported.append)
    assert [r.scenario.id for r in reported] == [good.id]
    assert _Halves.ran == [good.id, bad.id], "nothing starts after the bad scenario"
