"""Crashes and errors at exact I/O points of a save (the in-rank interposer).

A correct checkpointer fails the save everywhere, keeps the previous checkpoint and
resumes bit-exactly. Each case names one kind of point; a checkpointer that has no
such point (torch-save writes on rank 0 only, never fsyncs and never renames) gets
its nearest one from ``POINTS``. Known defects are strict xfails naming the oracle
that catches them, with the evidence seen, so a fix upstream turns them red.

``torch.save`` to a path (C++) and safetensors ``save_file`` (Rust) are traced through
``faults.native``; a checkpointer whose I/O still cannot be seen is skipped with that
reason rather than reported as passing.
"""

import os

import pytest

from chaos.cli.plugin import oracle_failed

pytestmark = pytest.mark.chaos

# case -> checkpointer -> fault ("*": every checkpointer without its own entry).
POINTS = {
    "kill-mid-file": {
        "*": "crash:rank=1,step=20,op=write,nth=2",
        "torch-save": "crash:rank=0,step=20,op=write,nth=2",  # the second write of ckpt_00000020.pt
    },
    "kill-at-commit": {
        "*": "crash:rank=0,step=20,op=rename,nth=1",
        # torch-save commits by rewriting `latest` in place: killed after open("w") emptied it
        "torch-save": "crash:rank=0,step=20,op=write,path=latest",
    },
    "eio-making-durable": {
        "*": "eio:rank=0,step=20,op=fsync,nth=1",
        # torch-save never fsyncs: the checkpoint file's close (its last flush) fails instead
        "torch-save": "eio:rank=0,step=20,op=close,path=*.pt",
    },
    "enospc-mid-file": {
        "*": "enospc:rank=1,step=20,op=write,nth=1",
        "torch-save": "enospc:rank=0,step=20,op=write,nth=1",
    },
}
KNOWN = {
    ("torch-save", "kill-at-commit"): (
        "liveness",
        "torch-save rewrites `latest` in place: killed between its truncation and its write, `latest` is "
        "empty and every restart fails in load_latest (ValueError: invalid literal for int() with base 10: '')"),
}


def _op(fault: str) -> str:
    return fault.split("op=")[1].split(",")[0]


@pytest.mark.parametrize("case", sorted(POINTS))
def test_save_failing_at_an_io_point_resumes_bit_exact(request, chaos, run_fault, checkpointer, case):
    known = KNOWN.get((checkpointer, case))
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, raises=oracle_failed(known[0]), reason=known[1]))
    fault = POINTS[case].get(checkpointer, POINTS[case]["*"])
    result = run_fault(checkpointer, fault)
    fired = result.record.io["fired"]
    assert fired and fired[0]["op"] == _op(fault), fired
    chaos.check(result)


def test_torch_save_writes_are_traced_through_the_native_wrapper(run_fault):
    """The C++ writer's bytes reach the trace: a kill at byte 4096 of the checkpoint file fires there."""
    result = run_fault("torch-save", "crash:rank=0,step=20,byte=4096,path=ckpt_00000020.pt")
    fired = result.record.io["fired"][0]
    assert fired["path"].endswith("ckpt_00000020.pt") and fired["offset"] + fired["written"] == 4096, fired
    assert not result.record.io["untraced_files"], result.record.io["untraced_files"]
    assert result.verdict == "pass", result.error  # `latest` still names step 16: a clean resume


LIGHTNING = "tests/checkpointers/lightning_atomic.py:LightningAtomicCheckpointer"


def test_a_torn_temp_file_outside_the_root_is_never_loaded(chaos, run_fault):
    """Lightning's temp file lives in the rank's temp dir, outside the checkpoint root, and is
    traced from its creation: a kill halfway through its write leaves it torn there, unmoved."""
    result = run_fault(LIGHTNING, "shortwrite:rank=0,step=20,op=write,path=tmp*")
    fired = result.record.io["fired"]
    assert fired and fired[0]["action"] == "short_write" and 0 < fired[0]["written"] < fired[0]["length"], fired
    path = fired[0]["path"]
    assert os.path.basename(os.path.dirname(path)) == "tmp" and "/ckpt/" not in path, path
    chaos.check(result)


def test_in_place_writer_is_caught_by_a_kill_mid_save(run_fault):
    """Known bad: overwrites its only checkpoint in place; a torn write leaves nothing loadable."""
    result = run_fault("tests/checkpointers/in_place.py:InPlaceCheckpointer",
                       "crash:rank=0,step=20,byte=4096,path=state_r0.pt")
    assert result.verdict == "fail"
    assert "did not finish" in result.oracles["bit_exact"].summary


def test_in_place_writer_survives_an_ordinary_kill(chaos, run_fault):
    """The same checkpointer passes a kill between saves: only the mid-save point exposes it."""
    chaos.check(run_fault("tests/checkpointers/in_place.py:InPlaceCheckpointer", "kill:rank=1,step=19"))
