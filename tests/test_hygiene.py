"""Hygiene is observed before the runner cleans up, so a process that outlived its scenario fails it."""

import os

from chaos.plan.scenario import Scenario, parse_fault
from chaos.run.runner import RunOptions, run_scenario
from chaos.target.workload.config import WorkloadConfig
from faults.process import alive

HERE = os.path.dirname(__file__)
SMALL = WorkloadConfig(steps=6, save_every=3, d_model=64)


def _scenario(checkpointer: str) -> Scenario:
    return Scenario(checkpointer=checkpointer, world_size=2, workload=SMALL,
                    faults=[parse_fault("kill:rank=1,step=5")], max_restarts=2)


def test_a_daemon_that_escaped_the_rank_group_fails_hygiene_and_is_then_killed(tmp_path):
    spec = os.path.join(HERE, "checkpointers", "leaky_daemon.py") + ":LeakyDaemonCheckpointer"
    result = run_scenario(_scenario(spec), RunOptions(cache_dir=tmp_path / "cache", scratch_base=str(tmp_path)))
    hygiene = result.oracles["hygiene"]
    assert not hygiene.passed, hygiene.summary
    left = hygiene.evidence["processes"]
    assert left, hygiene.evidence
    assert result.verdict == "fail"
    # The other oracles hold: only the leftover process is wrong with this checkpointer.
    assert all(o.passed for n, o in result.oracles.items() if n != "hygiene"), result.failing()
    assert not any(alive(p) for p in left), "the runner must kill what hygiene found"


def test_the_careful_checkpointer_leaves_nothing(tmp_path):
    spec = os.path.join(HERE, "checkpointers", "careful.py") + ":CarefulCheckpointer"
    result = run_scenario(_scenario(spec), RunOptions(cache_dir=tmp_path / "cache", scratch_base=str(tmp_path)))
    assert result.verdict == "pass", (result.error, [o.summary for o in result.failing()])
    assert result.oracles["hygiene"].evidence["processes"] == []


def test_an_unfired_io_fault_does_not_hide_a_real_failure(tmp_path):
    """Judged first: a fault that never fired turns only a pass into skipped."""
    spec = os.path.join(HERE, "checkpointers", "model_only.py") + ":ModelOnlyCheckpointer"
    scenario = Scenario(checkpointer=spec, world_size=2, workload=SMALL, max_restarts=2,
                        faults=[parse_fault("kill:rank=1,step=5"), parse_fault("crash:rank=0,op=rmdir,nth=99")])
    result = run_scenario(scenario, RunOptions(cache_dir=tmp_path / "cache", scratch_base=str(tmp_path)))
    assert result.verdict == "fail", (result.verdict, result.error)
    assert not result.oracles["bit_exact"].passed
