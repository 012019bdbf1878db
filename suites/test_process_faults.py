"""Process faults: a rank killed (SIGKILL), preempted (SIGTERM) or frozen (SIGSTOP).

Every built-in checkpointer must resume bit-exactly from its last checkpoint.
"""

import pytest

from chaos.plan.scenario import parse_fault

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("fault", [
    "kill:rank=1,step=19",
    "term:rank=0,step=14,grace=1",
    "kill:rank=0,phase=save,step=20",
])
def test_resume_is_bit_exact_after_rank_loss(chaos, run_fault, checkpointer, fault):
    result = run_fault(checkpointer, fault)
    chaos.check(result)
    assert len(result.record.attempts) == 2, "the fault must have forced exactly one restart"
    assert result.record.fired_faults()[0]["spec"] == parse_fault(fault).spec()


def test_a_frozen_rank_is_detected_and_the_job_recovers(chaos, run_fault):
    result = run_fault("reference", "stop:rank=1,step=10", collective_timeout_s=4.0)
    chaos.check(result)
    first = result.record.attempts[0]
    assert first["outcome"] in ("rank_failed", "hang"), first
    assert result.record.fired_faults()[0]["signal"] == "SIGSTOP"
