"""A torch DDP job under a real ``torchrun --max-restarts 1``: a kill at a file event is
restarted by torchelastic's agent (not by the harness) and judged."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from chaos.judge.job import judge
from chaos.model.jobspec import JobSpec
from chaos.run.explore import new_run, reference, run_chain

TORCHRUN = Path(sys.executable).with_name("torchrun")
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun next to this Python")
def test_a_kill_after_the_truncating_open_is_restarted_by_torchelastic_and_judged(tmp_path: Path) -> None:
    job = JobSpec(command=(str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                           "chaos/examples/ddp_job.py", "--out", "{out}", "--save", "careless"),
                  result_globs=("final.pt",), modes=("after",), cwd=str(REPO), timeout_s=240)
    root = tempfile.mkdtemp(dir=tmp_path)
    try:
        ref, _ = reference(job, root, jobs=2)
        assert ref.golden.results == ["final.pt"] and not ref.golden.tolerance and ref.golden.acks
        point = next(p for p in ref.points if p.rank == 0 and p.kind == "open" and p.path == "ckpt.pt")
        rec = run_chain(job, new_run(root, "point"), point)
        verdict = judge(job, ref.golden, rec)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert len(rec.attempts) == 1  # the harness launched torchrun once: the restart is the agent's
    assert {a for (_r, a) in rec.traces} == {0, 1}
    assert verdict.outcome == "hard_failure", verdict.summary
    assert verdict.oracles["liveness"].evidence["torchelastic_restarts"] == 1
    assert "torchelastic restarted the workers 1 time(s)" in verdict.summary
    assert "ckpt.pt" in os.fspath(point.path) and rec.fired()[0]["when"] == "after"
