"""Process faults: a rank killed (SIGKILL) or preempted (SIGTERM) between saves.

Every built-in checkpointer must resume bit-exactly from its last checkpoint.
"""

import pytest

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("fault", ["kill:rank=1,step=23", "term:rank=0,step=17,grace=1"])
def test_resume_is_bit_exact_after_rank_loss(chaos, checkpointer, fault):
    result = chaos.run(chaos.scenario(checkpointer, [fault]))
    chaos.check(result)
    assert len(result.record.attempts) == 2, "the fault must have forced exactly one restart"
    assert result.record.fired_faults()[0]["spec"] == fault
