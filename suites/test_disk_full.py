"""The checkpoint file system fills up mid-run (a real ENOSPC from a tmpfs as root).

The save that runs out of space must fail on every rank without being acknowledged;
once space is back the job resumes from the previous checkpoint, bit-exactly.
"""

import pytest

pytestmark = pytest.mark.chaos


def test_disk_full_save_fails_and_the_job_resumes(chaos, run_fault, checkpointer):
    result = run_fault(checkpointer, "diskfull:step=18,free=4096")
    chaos.check(result)
    fired = result.record.fired_faults()[0]
    assert fired["kind"] == "diskfull"
    assert result.record.attempts[0]["outcome"] == "rank_failed", "the save into a full disk must fail"
    acked = [s for e in result.record.rank_events(0, "ack") if e["attempt"] == 0 for s in e["steps"]]
    assert 20 not in acked, "the save at step 20 ran out of space and must not be acknowledged"
