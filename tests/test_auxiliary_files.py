"""The reference's metrics file is auxiliary: an error writing it neither fails the save nor the verdict.

The schedule is the one the default campaign drew at seed 1 (generated schedule 17): an
EIO on the third rename of the save at step 40 — the rename of the metrics textfile's temp
file (``metrics.prom.<pid>.<tid>``, prometheus_client's ``write_to_textfile``) after the
checkpoint had committed.
"""

from chaos.plan.scenario import Scenario, parse_fault
from chaos.run.runner import RunOptions, run_scenario
from chaos.target.workload.config import WorkloadConfig


def test_an_eio_on_the_metrics_rename_after_the_commit_is_set_aside(tmp_path):
    scenario = Scenario(checkpointer="reference", world_size=2, workload=WorkloadConfig(seed=1),
                        faults=[parse_fault("eio:rank=0,step=40,op=rename,nth=3")])
    result = run_scenario(scenario, RunOptions(cache_dir=tmp_path / "cache", scratch_base=str(tmp_path)))
    assert result.verdict == "pass", (result.error, [(o.name, o.summary) for o in result.failing()])
    aside = result.oracles["no_false_ack"].evidence["auxiliary"]
    assert [a["step"] for a in aside] == [40] and "metrics.prom." in aside[0]["what"]


def test_an_undirected_corruption_never_targets_an_auxiliary_file_or_the_pointer(tmp_path):
    """Default campaign seed 6: a seeded bitflip (no file=) drew `latest`, then metrics.prom;
    it must land on a file a load reads: the first one a traced fault-free load of the newest
    checkpoint read that a flip in its data region can change (its manifest; chaos.plan.loadtrace)."""
    scenario = Scenario(checkpointer="reference", world_size=2, workload=WorkloadConfig(seed=6),
                        faults=[parse_fault("bitflip:step=23,bits=16,region=data,seed=6")])
    result = run_scenario(scenario, RunOptions(cache_dir=tmp_path / "cache", scratch_base=str(tmp_path)))
    case = result.oracles["checksum_detection"].evidence["cases"][0]
    assert result.verdict == "pass" and case["changed"], (result.error, case)
    assert case["target"] != "latest" and "metrics" not in case["target"], case
    choice = result.record.fired_faults()[0]["detail"]["corruption"]["choice"]
    assert choice["by"] == "first read" and case["target"] in choice["trace"]["read"], choice
