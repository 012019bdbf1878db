"""A real ``chaos run --max-points`` samples every class of point first (issue #34, items 14 and 15).

Pure-Python jobs, a fraction of a second a point. A job that saves two files in place
(optimizer state, then weights: a kill between them leaves a mixed-epoch checkpoint) is
sampled with ``--max-points 14``, as many as it has point classes: every family it offers
is tried, and so are the first and the last write of each checkpoint file and a kill after
its last save, which a uniform draw of 14 out of some 200 points almost never hits. A
``--checkpoint-glob`` that matched nothing the fault-free run left is a usage error.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CARELESS = [sys.executable, "chaos/examples/careless_job.py", "--out", "{out}"]

# Saves at steps 3, 6 and 9: opt.json then model.json, each truncated and written in two chunks.
TWO_FILES = """
    import argparse, json, os
    from chaos import probe
    ap = argparse.ArgumentParser(); ap.add_argument("--out"); out = ap.parse_args().out
    step, w = 0, 0.0
    if os.path.exists(os.path.join(out, "model.json")):
        with open(os.path.join(out, "model.json")) as f:
            step, w = json.load(f)["model"]
        with open(os.path.join(out, "opt.json")) as f:
            assert json.load(f)["opt"] == step, "optimizer state of another step"
        probe.resumed(step)
    while step < 9:
        step += 1
        w = w * 0.5 + step
        probe.step(step, w)
        if step % 3 == 0:
            for name, obj in (("opt.json", {"opt": step}), ("model.json", {"model": [step, w]})):
                text = json.dumps(obj)
                with open(os.path.join(out, name), "w") as f:
                    f.write(text[:5])
                    f.flush()
                    f.write(text[5:])
            probe.saved(step)
    with open(os.path.join(out, "final.json"), "w") as f:
        json.dump({"w": w}, f)
"""


def chaos_run(*args: str, scratch: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(scratch), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def fault(s: dict[str, Any]) -> dict[str, Any]:
    return {"kind": s["faults"][0]["kind"], **s["faults"][0].get("params", {})}


def test_a_small_sample_tries_every_family_each_file_s_first_and_last_write_and_after_the_last_save(
        tmp_path: Path) -> None:
    job = tmp_path / "two_files.py"
    job.write_text(textwrap.dedent(TWO_FILES))
    results = tmp_path / "r.json"
    proc = chaos_run("--result-file", "final.json", "--max-points", "14", "--seed", "0", "--json", str(results),
                     "--", sys.executable, str(job), "--out", "{out}", scratch=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    doc = json.loads(results.read_text())
    job_doc = doc["job"]
    assert job_doc["points_tried"] == 14
    assert set(job_doc["faults"]["tried"]) == set(job_doc["faults"]["found"])  # every family the job offers
    faults = [fault(s) for s in doc["scenarios"]]
    for name in ("opt.json", "model.json"):  # 3 saves x 2 writes: its first write is the 1st, its last the 6th
        assert any(f.get("event") == "write" and f.get("path") == name and f.get("nth") == 1 for f in faults), name
        assert any(f.get("event") == "write" and f.get("path") == name and f.get("nth") == 6 for f in faults), name
    # a kill once the last save is over: right after model.json's last close, or at a later event (final.json)
    assert any(f["kind"] == "crash" and (f.get("path") == "final.json" or f.get("path") == "model.json"
                                         and f.get("event") == "close" and f.get("nth") == 3 and f["when"] == "after")
               for f in faults), faults
    notes = job_doc["reference"]["notes"]
    assert any(n.startswith("sample: 14 of ") and "the moment after the last save" in n for n in notes), notes
    assert [n for n in notes if re.fullmatch(r"point classes tried: (\d+) of \1", n)], notes  # all of them
    assert "note: sample: 14 of " in proc.stdout


def test_a_checkpoint_glob_that_matched_nothing_at_the_end_is_a_usage_error(tmp_path: Path) -> None:
    proc = chaos_run("--result-file", "final.json", "--checkpoint-glob", "checkpoints/*.json", "--max-points", "4",
                     "--", *CARELESS, scratch=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "chaos: error: --checkpoint-glob 'checkpoints/*.json' matched no file the fault-free run left under {out} "
        "(it left ckpt.json, final.json): no checkpoint to judge lost work by or to corrupt; give a pattern "
        "relative to {out} (a directory that matches stands for every file in it)"]
    assert "HARD_FAILURE" not in proc.stdout  # no point ran
