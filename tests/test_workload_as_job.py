"""The built-in workload as one job among others (#28): ``python -m chaos.target.workload OUT``.

The same training loop the fork server runs (model, AdamW, LR schedule, data position, every
RNG), started as an unmodified program under ``chaos run --ranks 2 -- COMMAND``: the job
pipeline plans, kills, restarts and judges it like a user's script, and its result files
(the final state's fingerprint, leaf by leaf) make a resume that lost state a silent
divergence that names the leaf.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = [sys.executable, "-m", "chaos.target.workload", "{out}", "--steps", "4", "--save-every", "2"]
MODEL_ONLY = "tests/checkpointers/model_only.py:ModelOnlyCheckpointer"


def explore(tmp: Path, *workload_args: str, point: str = "rank0:step3:kill") -> dict[str, Any]:
    """One point of the workload on two ranks, judged by the job pipeline; the results document."""
    tmp.mkdir()
    results = tmp / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp), "--json", str(results),
                           "--ranks", "2", "--result-file", "final-rank*.json", "--point", point, "--",
                           *WORKLOAD, *workload_args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return json.loads(results.read_text())


def test_the_workload_runs_alone_and_resumes_to_the_same_final_state(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "chaos.target.workload", str(tmp_path / "out"), "--steps", "4", "--save-every", "2"]
    first = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    final = json.loads((tmp_path / "out" / "final-rank0.json").read_text())
    assert final["step"] == 4 and {"model", "optimizer", "data", "rng"} <= {k.split("/")[0] for k in final["fingerprint"]}
    assert sorted(p.name for p in (tmp_path / "out" / "ckpt").glob("step-*")) == ["step-0000000002", "step-0000000004"]
    bad = subprocess.run([*run, "--workload", "no_such_key=1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--workload" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow  # 15 s; the model-only test below keeps the job path in the per-commit run
def test_the_reference_checkpointer_passes_as_a_job(tmp_path: Path) -> None:
    ok = explore(tmp_path / "reference")
    [point] = ok["scenarios"]
    assert (point["id"], point["verdict"]) == ("rank0:step3:kill", "pass"), point["summary"]
    assert point["oracles"]["result_files"]["result"] == "pass"
    assert point["oracles"]["durability"]["result"] == "pass"  # resumed at the acknowledged step 2


def test_a_model_only_checkpointer_diverges_as_a_job_naming_the_leaf_it_lost(tmp_path: Path) -> None:
    bad = explore(tmp_path / "model-only", "--checkpointer", MODEL_ONLY)
    [point] = bad["scenarios"]
    assert (point["verdict"], point["outcome"]) == ("fail", "silent_divergence"), point["summary"]
    # the first leaf the resume lost, named by what it loaded (committed_state, the workload's own
    # fingerprints through the probe) and by the final state it left (result_files)
    assert "loaded step" in point["summary"] and "first differing key: 'data/position'" in point["summary"]
    assert point["oracles"]["committed_state"]["result"] == "fail"
    assert "fingerprint.data/position" in point["oracles"]["result_files"]["summary"]


def test_the_reference_checkpointers_own_root_survives_a_power_loss(tmp_path: Path) -> None:
    """The reference made its root (OUT/ckpt) with ``os.makedirs`` and never fsynced the parent:
    every commit inside it was durable, the root's own entry was not, and a power loss after an
    acknowledged save took the whole tree (the job resumed from scratch: lost work). The built-in
    pipeline's power-loss exploration cuts only inside a save, so only the job pipeline, cutting at
    every file event of the whole run, found it. The cut: right after the checkpointer's metrics
    file is replaced for the third time (at its start, after each save), so during the save of
    step 4, with step 2's acknowledged (step 3 ran after it)."""
    doc = explore(tmp_path / "power", point="rank0:op1:power@rename:ckpt/metrics.prom:3")
    [point] = doc["scenarios"]
    assert point["fault_applied"]["cut"]["op"] == "rename", point["fault_applied"]
    assert (point["verdict"], point["outcome"]) == ("pass", "pass"), point["summary"]
    lost = [(x["what"], x.get("op"), x["path"]) for x in point["fault_applied"]["lost"]]
    assert ("dir_entry", "mkdir", "ckpt") not in lost, lost
    assert "newest complete: " in point["oracles"]["durability"]["summary"], point["oracles"]["durability"]
