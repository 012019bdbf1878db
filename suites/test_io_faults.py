"""Crashes and errors at exact I/O points of a save (the in-rank interposer).

A correct checkpointer fails the save everywhere, keeps the previous checkpoint and
resumes bit-exactly. A checkpointer whose I/O the interposer cannot see (torch.save
to a path is C++) is skipped with that reason rather than reported as passing.
"""

import pytest

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("fault", [
    "crash:rank=1,step=20,op=write,nth=2",
    "crash:rank=0,step=20,op=rename,nth=1",
    "eio:rank=0,step=20,op=fsync,nth=1",
    "enospc:rank=1,step=20,op=write,nth=1",
])
def test_save_failing_at_an_io_point_resumes_bit_exact(chaos, run_fault, checkpointer, fault):
    result = run_fault(checkpointer, fault)
    chaos.check(result)
    fired = result.record.io["fired"]
    assert fired and fired[0]["op"] == fault.split("op=")[1].split(",")[0]


def test_in_place_writer_is_caught_by_a_kill_mid_save(run_fault):
    """Known bad: overwrites its only checkpoint in place; a torn write leaves nothing loadable."""
    result = run_fault("tests/checkpointers/in_place.py:InPlaceCheckpointer",
                       "crash:rank=0,step=20,byte=4096,path=state_r0.pt")
    assert result.verdict == "fail"
    assert "did not finish" in result.oracles["bit_exact"].summary


def test_in_place_writer_survives_an_ordinary_kill(chaos, run_fault):
    """The same checkpointer passes a kill between saves: only the mid-save point exposes it."""
    chaos.check(run_fault("tests/checkpointers/in_place.py:InPlaceCheckpointer", "kill:rank=1,step=19"))
