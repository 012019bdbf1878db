"""``chaos replay RESULTS.json`` of a job run reruns exactly its failing points, where the job ran."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "chaos" / "examples" / "careless_job.py"


def _chaos(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_replay_of_a_job_reruns_its_failing_points_in_the_recorded_directory(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(EXAMPLE, work / "train.py")  # a relative COMMAND: only right in the recorded cwd
    first = _chaos("run", "--faults", "kill", "--max-points", "8", "--seed", "1", "--result-file", "final.json",
                   "--json", str(tmp_path / "a.json"), "--scratch", str(tmp_path), "--",
                   sys.executable, "train.py", "--out", "{out}", cwd=work)
    assert first.returncode == 1, first.stdout + first.stderr
    a = json.loads((tmp_path / "a.json").read_text())
    failing = sorted((s["id"], s["outcome"]) for s in a["scenarios"] if s["verdict"] == "fail")
    assert failing and a["job"]["spec"]["cwd"] == str(work)
    again = _chaos("replay", str(tmp_path / "a.json"), "--json", str(tmp_path / "b.json"), "--scratch", str(tmp_path),
                   "--html", str(tmp_path / "b.html"), cwd=tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr
    b = json.loads((tmp_path / "b.json").read_text())
    assert sorted((s["id"], s["outcome"]) for s in b["scenarios"]) == failing
    assert b["job"]["points_tried"] == len(failing)
    html = (tmp_path / "b.html").read_text()
    assert all(point in html for point, _outcome in failing)  # the replay's own report, as job mode writes it


def test_replay_of_a_job_refuses_an_unknown_point_in_one_line(tmp_path):
    doc = {"schema_version": 1, "scenarios": [{"id": "rank0:op1:before", "verdict": "fail"}],
           "job": {"spec": {"command": ["python", "x.py", "{out}"], "cwd": str(tmp_path)}}}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    unknown = _chaos("replay", str(tmp_path / "r.json"), "--scenario", "rank0:op9:after", cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stderr.strip() == \
        f"chaos: error: {tmp_path / 'r.json'} has no point rank0:op9:after"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
