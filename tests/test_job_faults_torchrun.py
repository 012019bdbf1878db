"""Fault families that stop a real ``torchrun`` job as a whole: the harness relaunches torchrun.

A SIGTERM goes to torchrun itself, which forwards it to its workers; a corruption
point halts every worker and the agent at once, so torchelastic cannot restart the
workers before the harness has corrupted the checkpoint. In both cases the record shows
the harness's relaunch of torchrun (attempt 1), not an agent restart; the careful
example falls back past the corrupted checkpoint and passes. Slow: each
torchrun launch of the DDP example takes seconds here.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from chaos.judge.job import judge
from chaos.model.jobspec import JobSpec, parse_point
from chaos.run.explore import new_run, reference, run_chain

TORCHRUN = Path(sys.executable).with_name("torchrun")
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun next to this Python")
def test_sigterm_and_a_corruption_stop_torchrun_and_the_harness_relaunches_it(tmp_path: Path) -> None:
    job = JobSpec(command=(str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                           "chaos/examples/ddp_job.py", "--out", "{out}", "--save", "careful"),
                  result_globs=("final.pt",), faults=("term", "corrupt"), grace_s=15.0, cwd=str(REPO), timeout_s=240)
    root = tempfile.mkdtemp(dir=tmp_path)
    try:
        ref, _ = reference(job, root, jobs=2)
        term = next(p for p in ref.points if p.id == "rank0:step4:term")
        # a checkpoint the careful job kept, truncated at rest once the job moved on (its SHA-256
        # file written, the save acknowledged)
        trunc = max((p for p in ref.points if p.mode == "truncate" and p.at_step is not None
                     and p.path.startswith("ckpt-") and p.path.endswith(".pt")), key=lambda p: p.op)
        rec_term = run_chain(job, new_run(root, "term"), term)
        v_term = judge(job, ref.golden, rec_term)
        rec_trunc = run_chain(job, new_run(root, "trunc"), trunc, seed=0)
        v_trunc = judge(job, ref.golden, rec_trunc)
        logs = "".join(open(log, errors="replace").read() for a in rec_trunc.attempts[1:] for log in a.logs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert parse_point(trunc.id) == type(trunc)(trunc.rank, "truncate", op=trunc.op, at_step=trunc.at_step)
    # SIGTERM: torchrun forwarded it and exited within the grace; the harness relaunched it
    assert rec_term.attempts[0].term["sent_to"] == [0] and rec_term.attempts[0].term["killed_after_grace"] == []
    assert len(rec_term.attempts) == 2 and {a for (_r, a) in rec_term.traces} == {0, 100}
    assert v_term.outcome == "pass", v_term.summary
    assert "the harness relaunched torchrun 1 time(s)" in v_term.summary
    # the truncated checkpoint: its SHA-256 no longer matches, every rank falls back to the one
    # before it; torchelastic never restarted attempt 0's workers, the harness relaunched torchrun
    assert rec_trunc.attempts[0].halted is not None and len(rec_trunc.attempts) == 2
    assert {a for (_r, a) in rec_trunc.traces} >= {0, 100} and not {1, 2} & {a for (_r, a) in rec_trunc.traces}
    assert v_trunc.outcome == "pass", v_trunc.summary
    assert v_trunc.summary.startswith(f"{trunc.path}: truncated from ")
    assert f"skipping checkpoint {trunc.path}: ValueError: SHA-256 mismatch" in logs
