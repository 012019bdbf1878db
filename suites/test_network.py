"""A rank's network link goes down in the middle of a run (network namespaces, root).

Collectives fail within the short collective timeout on every rank, nobody commits a
partial checkpoint, and the restarted job resumes bit-exactly.
"""

import os

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.root]


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.parametrize("fault", ["netdrop:rank=1,step=18",
                                   pytest.param("netdrop:rank=0,phase=save,step=20", marks=pytest.mark.slow)])
# A link drop tests the harness's lab more than any checkpointer: the reference per commit (7 s
# each), all four in the nightly.
@pytest.mark.parametrize("checkpointer", ["reference", pytest.param("dcp", marks=pytest.mark.slow),
                                          pytest.param("dcp-async", marks=pytest.mark.slow),
                                          pytest.param("torch-save", marks=pytest.mark.slow)])
def test_link_down_mid_run_resumes_bit_exact(chaos, run_fault, checkpointer, fault):
    from faults.network import leftovers

    result = run_fault(checkpointer, fault, collective_timeout_s=5.0)
    chaos.check(result)
    assert result.record.attempts[0]["outcome"] == "rank_failed", "the cut link must fail collectives, not hang"
    assert leftovers() == [], "namespaces and links must be torn down"
