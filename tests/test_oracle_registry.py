"""One oracle registry serves both targets (#28): chaos.judge.registry.

The built-in workload's oracle functions, the job judge's outcome order, both self-checks
and the docs' tables all read the one table; these checks fail when an oracle is added to a
judge without its row, or a row names an oracle no judge asks.
"""

from __future__ import annotations

from chaos.judge import job, oracles, registry
from chaos.run import jobselfcheck, selfcheck


def test_the_built_in_judge_asks_exactly_the_registry_workload_oracles() -> None:
    # the runner adds atomic_commit (the power-loss exploration) beside the functions
    assert {*oracles.ORACLES, selfcheck.POWERLOSS_ORACLE} == set(registry.of_workload())
    assert selfcheck.known_oracles() == registry.of_workload()


def test_the_job_judge_orders_its_outcomes_by_the_registry() -> None:
    assert job.VERDICT_ORDER is registry.VERDICT_ORDER and jobselfcheck.job_oracles() == registry.of_job()
    assert registry.of_job() == ["no_code_execution", "liveness", "committed_state", "result_files",
                                 "loss_continuity", "no_false_ack", "durability", "preemption_exit"]
    assert job.FAILURES == ("code_execution", "hard_failure", "silent_divergence", "lost_work")
    # a question both targets ask is one row, with one line saying what it checks
    both = {o.name for o in registry.ORACLES if o.workload and o.job}
    assert both == {"no_code_execution", "liveness", "committed_state", "loss_continuity", "no_false_ack",
                    "durability"}
    assert all(o.checks and (o.workload or o.job) for o in registry.ORACLES)
    assert len(registry.BY_NAME) == len(registry.ORACLES)
