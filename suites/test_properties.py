"""Property-based chaos: hypothesis draws fault schedules; the reference must survive them all.

Schedules mix kills at steps and at the save phases each rank really announces, I/O
crashes and errors at operations each rank really performs (both from a traced
fault-free run of the same configuration, ``chaos.record.points``), and at-rest corruption,
with a second fault inside the restart the first one caused. A failure shrinks to a
minimal schedule and prints the `chaos run` command that replays it (and a hypothesis
blob). A skipped example (a fault that never fired) is legal, but a run whose every
example was skipped tested nothing and fails. `--chaos-budget SECONDS` buys more
examples (about 15 s each).
"""

import pytest
from hypothesis import HealthCheck, event, given, note, settings

from chaos.plan.strategies import Tally, fault_schedules
from chaos.record import points
from chaos.target.workload.config import WorkloadConfig

pytestmark = pytest.mark.chaos

SMALL = {"steps": 16, "save_every": 4, "d_model": 64, "n_layers": 1}


def test_reference_recovers_from_any_fault_schedule(chaos, request):
    budget = request.config.getoption("--chaos-budget")
    examples = 3 if not budget else max(3, int(budget // 15))
    cfg = WorkloadConfig(seed=chaos.session.seed, **SMALL)
    found = points.reference_points(chaos.scenario("reference", [], **SMALL), chaos.session.options)
    assert found.io and found.phases, f"the traced fault-free run showed no fault points: {found.error}"
    tally = Tally()

    @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(schedule=fault_schedules(cfg, chaos.session.world_size, found))
    def survives(schedule):
        result = tally.add(chaos.run(chaos.scenario("reference", schedule, max_restarts=3, **SMALL)))
        event(f"verdict {result.verdict}")
        note(f"replay: {result.replay}")
        assert result.verdict in ("pass", "skipped"), chaos.explain(result)

    survives()
    tally.require_tested()
