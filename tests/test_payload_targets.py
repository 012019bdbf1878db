"""At-rest faults land in the files the loader reads, the first one read first (issue #34, item 16).

A checkpointer that verifies every shard's SHA-256 but unpickles ``manifest.pkl`` on load
(``tests/checkpointers/selfcheck/pickled_manifest.py``) passed the default campaign: its
payload scenario planted into one file of the newest checkpoint drawn at random with the
seed, at seed 5 a shard, whose checksum rejected it. Now the environment traces one
fault-free load of the checkpoint it attacks (``chaos.plan.loadtrace``) and plants in the first
file that load read in the payload's format (the manifest). Real ranks under
``torch.distributed`` show that

- the default campaign's payload scenario (``chaos run`` with no ``--fault``) fails that
  checkpointer on ``no_code_execution`` with the manifest named in the evidence, and the
  reference still runs nothing;
- ``chaos selfcheck`` has a payload probe that catches it and passes ``correct.py``;
- the campaign's read sweep (``--budget``) reaches every kind of file the load reads with a
  payload and with a corruption, and only the manifest's payload runs.

The choice itself, on fabricated trees and traces, is tested in
``tests/test_payload_targets_choice.py``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos.cli import main as cli
from chaos.plan.scenario import Scenario, parse_fault
from chaos.run.runner import RunOptions, ScenarioResult, run_scenario
from chaos.run.selfcheck import (
    SELFCHECK_WORKLOAD,
    SelfCheckOptions,
    discover,
    expected_catch,
    run_selfcheck,
)
from chaos.target.workload.config import WorkloadConfig

CORPUS = Path(__file__).resolve().parent / "checkpointers" / "selfcheck"
PICKLED = f"{CORPUS / 'pickled_manifest.py'}:PickledManifestCheckpointer"
MANIFEST_KIND = "step-*/manifest.pkl"


@pytest.fixture(scope="module")
def options(tmp_path_factory: pytest.TempPathFactory) -> RunOptions:
    base = tmp_path_factory.mktemp("payload-targets")
    return RunOptions(scratch_base=str(base / "scratch"), cache_dir=base / "cache")


def _default_payload(spec: str, seed: int, options: RunOptions) -> ScenarioResult:
    """The default campaign's payload scenario (``chaos run`` with no --fault) at ``seed``."""
    cfg = WorkloadConfig(seed=seed)
    [specs] = [p for p in cli.default_campaign(cfg, 2) if p[0].startswith("payload:")]
    scenario = Scenario(checkpointer=spec, world_size=2, workload=cfg, faults=[parse_fault(f) for f in specs])
    return run_scenario(scenario, options)


@pytest.mark.parametrize("seed", [0, 5, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3, 4))])
def test_the_default_payload_scenario_runs_the_pickled_manifest_and_names_it(seed: int, options: RunOptions) -> None:
    result = _default_payload(PICKLED, seed, options)
    oracle = result.oracles["no_code_execution"]
    assert result.verdict == "fail" and not oracle.passed, (result.error, oracle.summary)
    [case] = oracle.evidence["cases"]
    assert case["class"] == "code ran" and case["target"].endswith("/manifest.pkl"), case
    [fired] = [f for f in result.record.fired_faults() if f["kind"] == "payload"]
    choice = fired["detail"]["corruption"]["choice"]
    assert choice["by"] == "first read" and choice["kind"] == MANIFEST_KIND
    assert choice["kinds"] == ["latest", MANIFEST_KIND, "step-*/rank*.pt"] and choice["trace"]["error"] is None
    assert random.Random(choice["rng"]).choice(choice["among"]) == case["target"]


@pytest.mark.parametrize("seed", [5, 0])
def test_the_reference_runs_no_payload_in_the_default_payload_scenario(seed: int, options: RunOptions) -> None:
    result = _default_payload("reference", seed, options)
    oracle = result.oracles["no_code_execution"]
    assert oracle.passed and result.verdict == "pass", (result.error, oracle.summary)
    [case] = oracle.evidence["cases"]
    assert case["class"] == "refused or fell back"
    choice = result.record.fired_faults()[0]["detail"]["corruption"]["choice"]
    assert choice["by"] == "first read" and "step-*/manifest.json" in choice["kinds"]


def test_selfcheck_catches_the_pickled_manifest_with_its_payload_probe(options: RunOptions) -> None:
    corpus = discover(CORPUS)
    assert corpus["pickled_manifest"] == PICKLED
    assert expected_catch(PICKLED) == {"payload-newest": ("no_code_execution",)}  # a probe of the battery
    report = run_selfcheck({"pickled_manifest": corpus["pickled_manifest"], "correct": corpus["correct"]},
                           SelfCheckOptions(run=options, probes=("payload-newest",)), correct={"correct"})
    bad, good = report.checkpointers
    assert bad.caught and [o.probe for o in bad.caught_by] == ["payload-newest"], bad.explain()
    assert bad.caught_by[0].note == "corrupted step-00000008/manifest.pkl"
    assert good.result == "passes" and good.outcomes[0].verdict == "pass", good.outcomes[0].summary
    assert good.outcomes[0].note.startswith("corrupted step-00000008/rank"), good.outcomes[0].note
    assert report.passed and report.score == 1.0


def test_a_real_sweep_reaches_every_kind_the_pickled_manifest_loader_reads(options: RunOptions) -> None:
    from chaos.run.campaign import ReadCoverage, read_sweep

    reads = ReadCoverage()
    ran_code: dict[str, bool] = {}
    for schedule in read_sweep(SELFCHECK_WORKLOAD, reads):
        scenario = Scenario(checkpointer=PICKLED, world_size=2, workload=SELFCHECK_WORKLOAD,
                            faults=[parse_fault(f) for f in schedule])
        result = run_scenario(scenario, options)
        assert result.verdict != "error", (schedule, result.error)
        reads.add(result)
        fault = scenario.faults[0]
        if fault.kind == "payload":
            ran_code[fault.param("file")] = not result.oracles["no_code_execution"].passed
    kinds = ["latest", MANIFEST_KIND, "step-*/rank*.pt"]
    assert reads.kinds == kinds, reads.to_dict()
    assert sorted(reads.payload) == sorted(kinds) and sorted(reads.corruption) == sorted(kinds), reads.to_dict()
    # Only the manifest's payload runs: the shards' checksums refuse theirs, the pointer is no pickle.
    assert ran_code == {"latest": False, MANIFEST_KIND: True, "step-*/rank*.pt": False}, ran_code
