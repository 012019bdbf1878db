"""Survivors run on: after a rank dies, the others go on until the launcher's monitor notices."""

import os

import pytest

from chaos.plan.scenario import Scenario, parse_fault
from chaos.run.runner import RunOptions, run_scenario
from chaos.target.workload.config import WorkloadConfig

HERE = os.path.dirname(__file__)
SMALL = WorkloadConfig(steps=12, save_every=4, d_model=64, collective_timeout_s=5.0)
KILL = "kill:rank=1,phase=save,step=8,linger=5"


def _run(tmp_path, checkpointer: str):
    scenario = Scenario(checkpointer=checkpointer, world_size=2, workload=SMALL, faults=[parse_fault(KILL)],
                        max_restarts=2)
    return run_scenario(scenario, RunOptions(cache_dir=tmp_path / "cache", scratch_base=str(tmp_path),
                                             hang_timeout_s=30))


def test_a_rank_that_commits_without_the_others_is_caught_when_survivors_run_on(tmp_path):
    result = _run(tmp_path, os.path.join(HERE, "checkpointers", "lone_commit.py") + ":LoneCommitCheckpointer")
    assert result.verdict == "fail", (result.error, {n: o.summary for n, o in result.oracles.items()})
    # Rank 0 ran on after rank 1's death and published step 8 without rank 1's file.
    events = result.record.events[0][0]
    assert any(e["ev"] == "save_return" and e["step"] == 8 for e in events)
    assert not result.oracles["bit_exact"].passed or not result.oracles["durability"].passed


@pytest.mark.parametrize("checkpointer", ["reference", os.path.join(HERE, "checkpointers", "careful.py")
                                          + ":CarefulCheckpointer"])
def test_a_checkpointer_with_a_vote_survives_the_same_fault(tmp_path, checkpointer):
    result = _run(tmp_path, checkpointer)
    assert result.verdict == "pass", (result.error, [(o.name, o.summary) for o in result.failing()])
    # the survivor really ran on: it reached the save's collective and failed there, not by our SIGKILL
    errors = [e for e in result.record.events[0][0] if e["ev"] == "error"]
    assert errors, "rank 0 should have failed in the save's collective after rank 1 died"
