"""Ctrl-C and SIGTERM to ``chaos run -- COMMAND`` (#34, items 3 and 4): a clean stop, never a verdict.

A real ``chaos run`` runs a pure-Python job whose resume takes ten minutes; once a
point's resume is running, the harness gets SIGINT (or SIGTERM, what ``timeout``, a
cancelled CI job and ``kill`` send). It must exit 130 (143) once no process of the job
is left and the scratch root is gone, and the results must record the point it cut
short as interrupted, not judged: before, that point was saved as a HARD_FAILURE ("the
resume killed by SIGKILL"), and a SIGTERM left the job running as PID 1's child.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from faults.process import alive, marked_under

REPO = Path(__file__).resolve().parent.parent

# Fast from scratch (the fault-free runs, a kill before the first checkpoint), ten minutes
# to resume from a checkpoint: the run is interrupted while such a resume runs.
SLOW_RESUME = """
import json, os, sys, time
try:
    from chaos import probe
except ImportError:
    probe = None
out = sys.argv[1]
p = os.path.join(out, "ckpt.json")
start = json.load(open(p))["step"] if os.path.exists(p) else 0
if start:
    print("resuming from", start, flush=True)
    time.sleep(600)
for step in range(start, 6):
    if probe:
        probe.step(step)
    with open(p + ".tmp", "w") as f:
        json.dump({"step": step + 1}, f)
    os.replace(p + ".tmp", p)
with open(os.path.join(out, "final.json"), "w") as f:
    json.dump({"step": 6}, f)
"""

# Slow from the start: the run is interrupted during its fault-free runs.
SLOW = """
import sys, time
print("started", flush=True)
time.sleep(600)
"""


def _sigint_default() -> None:
    """In the child before exec: SIGINT at its default, as at a terminal (a test run started in the
    background inherits it ignored, and Python then never raises KeyboardInterrupt: commit ac9c28f)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, script: str, *options: str) -> tuple[subprocess.Popen[str], Path]:
    job = tmp_path / "job.py"
    job.write_text(script)
    base = tmp_path / "scratch"
    base.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(base), *options, "--",
                             sys.executable, str(job), "{out}"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)
    return proc, base


def _wait_for(proc: subprocess.Popen[str], base: Path, log_glob: str, text: str) -> tuple[Path, list[int]]:
    """The scratch root once a log under it matching ``log_glob`` says ``text``, and the job's processes then."""
    deadline = time.monotonic() + 120  # a hang guard, not a timing
    while time.monotonic() < deadline and proc.poll() is None:
        for log in base.glob(f"chaos-job-*/{log_glob}"):
            if text in log.read_text(errors="replace"):
                root = next(p for p in log.parents if p.parent == base)
                pids = marked_under(str(root))
                if pids:
                    return root, pids
        time.sleep(0.05)
    proc.kill()
    out, err = proc.communicate(timeout=60)
    raise AssertionError(f"never saw {text!r} in {log_glob} (exit {proc.returncode}):\n{out}\n{err}")


def _stopped(proc: subprocess.Popen[str], sig: int, root: Path, pids: list[int]) -> tuple[str, str]:
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)  # a hang guard: the harness must not wait for the job
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=60)
        raise AssertionError(f"chaos run did not exit after {signal.Signals(sig).name}:\n{out}\n{err}") from None
    survivors = sorted({p for p in pids if alive(p)} | set(marked_under(str(root))))
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, f"processes of the job outlived the harness: {survivors}\n{out}\n{err}"
    assert not root.exists(), "the scratch root must be removed before the harness exits"
    return out, err


def _points(doc: dict) -> dict[str, dict]:
    return {s["id"]: s for s in doc["scenarios"]}


def test_ctrl_c_during_a_resume_records_the_point_as_interrupted_not_a_hard_failure(tmp_path: Path) -> None:
    results, summary = tmp_path / "r.json", tmp_path / "summary.md"
    proc, base = _start(tmp_path, SLOW_RESUME, "--result-file", "final.json", "--json", str(results),
                        "--summary", str(summary), "--point", "rank0:step0:kill", "--point", "rank0:step3:kill")
    root, pids = _wait_for(proc, base, "point-*/logs/attempt1-copy0.log", "resuming from 3")
    out, err = _stopped(proc, signal.SIGINT, root, pids)
    assert proc.returncode == 130, out + err
    assert "HARD_FAILURE" not in out, out  # the resume the harness killed is no failure of the job
    assert "INTERRUPTED rank0:step3:kill: interrupted while this point ran" in out
    assert "interrupted after 1 of 2 points (SIGINT)" in out
    assert err.strip().splitlines()[-1] == ("chaos: interrupted (SIGINT); every process of the job was stopped "
                                            "and its scratch root removed")
    doc = json.loads(results.read_text())
    points = _points(doc)
    assert points["rank0:step0:kill"]["outcome"] == "pass"
    cut = points["rank0:step3:kill"]
    assert (cut["verdict"], cut["outcome"], cut["oracles"]) == ("skipped", "interrupted", {})
    assert "not judged" in cut["summary"]
    assert not [s for s in doc["scenarios"] if s["outcome"] == "hard_failure"]
    assert doc["summary"] == {"pass": 1, "fail": 0, "error": 0, "skipped": 1, "total": 2, "interrupted": 1}
    assert doc["job"]["interrupted"] == {"signal": "SIGINT", "after": 1, "of": 2, "points": ["rank0:step3:kill"]}
    assert doc["job"]["points_tried"] == 1 and doc["job"]["points_found"] > 2  # no "? tried of ? found"
    assert doc["job"]["reference"]["notes"][0].startswith("interrupted after 1 of 2 points (SIGINT)")
    assert "rank0:step3:kill" in summary.read_text()  # the CI summary is written too
    from chaos.model.resultschema import load_results

    load_results(results)  # what chaos report / replay / findings read


def test_sigterm_stops_the_run_as_ctrl_c_does_and_writes_every_report(tmp_path: Path) -> None:
    results, junit = tmp_path / "r.json", tmp_path / "junit.xml"
    proc, base = _start(tmp_path, SLOW_RESUME, "--result-file", "final.json", "--json", str(results),
                        "--junit", str(junit), "--point", "rank0:step3:kill")
    root, pids = _wait_for(proc, base, "point-*/logs/attempt1-copy0.log", "resuming from 3")
    out, err = _stopped(proc, signal.SIGTERM, root, pids)
    assert proc.returncode == 143, out + err
    assert "interrupted after 0 of 1 points (SIGTERM)" in out
    assert out.strip().splitlines()[-1] == f"written: results JSON {results}; JUnit XML {junit}"
    doc = json.loads(results.read_text())
    assert [(s["id"], s["verdict"], s["outcome"]) for s in doc["scenarios"]] == [
        ("rank0:step3:kill", "skipped", "interrupted")]
    assert doc["job"]["interrupted"]["signal"] == "SIGTERM"
    assert "<skipped" in junit.read_text() and 'name="rank0:step3:kill"' in junit.read_text()


def test_sigterm_during_the_fault_free_runs_leaves_nothing_and_says_so(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    proc, base = _start(tmp_path, SLOW, "--json", str(results))
    root, pids = _wait_for(proc, base, "golden-*/logs/attempt0-copy0.log", "started")
    out, err = _stopped(proc, signal.SIGTERM, root, pids)
    assert proc.returncode == 143, out + err
    assert "interrupted during the fault-free runs (SIGTERM), before any point ran" in out
    doc = json.loads(results.read_text())
    assert doc["scenarios"] == [] and doc["job"]["interrupted"]["during"] == "the fault-free runs"
