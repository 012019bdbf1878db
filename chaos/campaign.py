"""The default campaign's second half: hypothesis-generated fault schedules until the budget is spent.

``chaos run`` without ``--fault`` first runs one scenario per fault family (always,
whatever the budget), then spends what is left of ``--budget SECONDS`` on schedules
drawn from ``chaos.strategies.fault_schedules``: seeded by ``--seed`` (the same seed
draws the same schedules), each printed with its replay command, and none started
once the time left is less than a scenario has taken on average so far — a campaign
stops before its budget runs out rather than after.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chaos.runner import ScenarioResult
    from chaos.workload.config import WorkloadConfig

DEFAULT_BUDGET_S = 300.0


class _BudgetSpent(Exception):
    """Raised inside the generator loop to end it: hypothesis has no 'stop now' of its own."""


def fill_budget(cfg: WorkloadConfig, world_size: int, checkpointer: str, deadline: float,
                run_one: Callable[[list[str]], ScenarioResult], estimate_s: Callable[[], float],
                max_schedules: int = 1000) -> list[ScenarioResult]:
    """Run generated schedules while ``estimate_s()`` seconds still fit before ``deadline`` (monotonic).

    Draws are seeded by ``cfg.seed`` and never shrunk (a failure is kept and reported,
    the campaign goes on); the reference's own save phases are targeted when it is the
    checkpointer under test, the harness's ``save`` phase otherwise.
    """
    results: list[ScenarioResult] = []
    if deadline - time.monotonic() < estimate_s():
        return results
    # Imported here: `chaos` starts without hypothesis unless a campaign has time for it.
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from chaos.strategies import REFERENCE_PHASES, fault_schedules

    phases = REFERENCE_PHASES if checkpointer == "reference" else ("save",)

    @hypothesis_seed(cfg.seed)
    @settings(max_examples=max_schedules, phases=[Phase.generate], database=None, deadline=None,
              derandomize=False, suppress_health_check=list(HealthCheck), print_blob=False)
    @given(schedule=fault_schedules(cfg, world_size, phases=phases))
    def explore(schedule: list[str]) -> None:
        if deadline - time.monotonic() < estimate_s():
            raise _BudgetSpent
        results.append(run_one(schedule))

    try:
        explore()
    except _BudgetSpent:
        pass
    return results
