"""Stateful chaos: hypothesis writes a schedule rule by rule — train, save, kill a rank,
corrupt the newest checkpoint, restart, verify — and the real harness runs it.

Each example becomes one Scenario (its faults in the attempts the restarts made) run
by chaos.run.runner.run_scenario, because a real run costs seconds. A failure shrinks to
the fewest rules that still fail and prints the steps, the ``chaos run`` replay command
and hypothesis's ``@reproduce_failure`` blob. A skipped example is legal, a run whose
every example was skipped fails. The default run draws 3 examples;
``--chaos-budget SECONDS`` buys one more per ~5 s.
"""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from chaos.plan.strategies import Tally, schedule_machine
from chaos.target.workload.config import WorkloadConfig

pytestmark = pytest.mark.chaos

TINY = {"steps": 8, "save_every": 2, "d_model": 32, "n_layers": 1}


def test_reference_survives_any_train_save_fault_restart_program(chaos, request):
    budget = request.config.getoption("--chaos-budget")
    tally = Tally()

    def run(scenario):
        return tally.add(chaos.run(scenario))

    machine = schedule_machine(run, "reference", WorkloadConfig(seed=chaos.session.seed, **TINY),
                               world_size=chaos.session.world_size)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=3 if not budget else max(3, int(budget // 5)), stateful_step_count=8, deadline=None,
        database=None, derandomize=not budget, print_blob=True, suppress_health_check=list(HealthCheck)))
    tally.require_tested()
