"""Elastic restarts as plain data: a ``lost=true`` kill shrinks the next attempt's world, nothing else does."""

import pytest

from chaos.errors import ConfigError
from chaos.launch import cluster
from chaos.plan.scenario import Scenario, parse_fault

LOST = parse_fault("kill:rank=1,step=11,lost=true")


def _fired(plan, index, rank):
    fault = plan.faults[index]
    return cluster.AttemptResult(0, "rank_failed", {}, 0.0, 1.0, [cluster.FiredFault(
        index, fault.spec(), fault.kind, 0, rank, fault.step, "SIGKILL", 1, 0.0)], "", plan.world_size)


def test_lost_round_trips_and_needs_a_rank_to_remain():
    assert LOST.param("lost") is True and parse_fault(LOST.spec()) == LOST
    Scenario("reference", world_size=2, faults=[LOST]).validate()
    with pytest.raises(ConfigError, match="lost=true needs --world-size 2"):
        Scenario("reference", world_size=1, faults=[parse_fault("kill:rank=0,step=3,lost=true")]).validate()
    with pytest.raises(ConfigError, match="lost=true"):
        Scenario("reference", world_size=2, faults=[parse_fault("kill:rank=1,step=3,lost=false")]).validate()


def test_only_a_fired_lost_kill_shrinks_the_next_attempt():
    plan = cluster.LaunchPlan(world_size=2, workload={}, log_dir="/nonexistent",
                              faults=[LOST, parse_fault("kill:rank=0,step=5")])
    assert cluster._shrink(plan, _fired(plan, 0, 1)).world_size == 1
    assert cluster._shrink(plan, _fired(plan, 1, 0)) is plan  # a plain kill: the rank comes back
    no_fault = cluster.AttemptResult(0, "rank_failed", {}, 0.0, 1.0, [], "", 2)
    assert cluster._shrink(plan, no_fault) is plan
