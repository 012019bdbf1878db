"""Snapshots of what whole runs decide: a restructuring of the harness must not change them.

Four real runs — the default ``chaos run`` campaign, the careless and careful example jobs
at a fixed seed, and one ``torchrun`` job — are reduced to what they decided (each
scenario's or point's id, faults, verdict, outcome, every oracle's result and its summary,
the replay command) with what varies between machines and runs masked (timings, pids,
scratch paths, floats), and compared with ``tests/snapshots/*.json``. Moves and renames
(issue #28: one pipeline, folders that show the stages) are checked by these before and
after; a change of behaviour shows up as a diff here and updates the snapshot in its own
commit (``CHAOS_UPDATE_SNAPSHOTS=1 pytest tests/test_snapshots.py -m slow``).

They take about two minutes, so they are ``slow``: run with ``-m slow`` (the nightly does).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE = os.environ.get("CHAOS_UPDATE_SNAPSHOTS") == "1"

pytestmark = pytest.mark.slow

_MASKS = [
    (re.compile(re.escape(sys.executable)), "<python>"),  # first: a CI venv lives under /tmp
    (re.compile(r"/(?:tmp|var/tmp|run)/[^\s'\",;)]*"), "<path>"),
    (re.compile(re.escape(str(REPO))), "<repo>"),
    (re.compile(r"\b\d+\.\d+(?:[eE][+-]?\d+)?\b"), "<f>"),
    (re.compile(r"\bpid \d+\b"), "pid <n>"),
    # how many combinations a power cut's pending operations make depends on how many writes
    # the OS split a save into; the distinct states checked do not
    (re.compile(r"\b\d+ combinations\b"), "<n> combinations"),
    (re.compile(r"\b\d+ states generated, \d+ pruned\b"), "<n> states generated, <n> pruned"),
    (re.compile(r"\b[0-9a-f]{12,}\b"), "<hex>"),
]


def mask(text: Any) -> Any:
    """``text`` with what differs between machines and runs replaced by placeholders."""
    if not isinstance(text, str):
        return text
    for pattern, repl in _MASKS:
        text = pattern.sub(repl, text)
    return text


def _oracles(oracles: Any) -> dict[str, Any]:
    if not isinstance(oracles, dict):
        return {}
    return {name: {"result": o.get("result"), "summary": mask(o.get("summary"))}
            for name, o in sorted(oracles.items()) if isinstance(o, dict)}


def project(doc: dict[str, Any]) -> dict[str, Any]:
    """What a results document decided, in a stable order, without timings and machine facts."""
    summary = {k: v for k, v in doc.get("summary", {}).items() if not k.startswith("second")}
    rows = []
    for sc in sorted(doc["scenarios"], key=lambda s: s["id"]):
        row = {"id": mask(sc["id"]), "verdict": sc["verdict"], "outcome": sc.get("outcome"),
               "faults": [mask(f.get("spec") if isinstance(f, dict) else f) for f in sc.get("faults") or []],
               "oracles": _oracles(sc.get("oracles")), "summary": mask(sc.get("summary")),
               "replay": mask(sc.get("replay"))}
        rows.append({k: v for k, v in row.items() if v not in (None, [], {})})
    out: dict[str, Any] = {"summary": summary, "scenarios": rows}
    job = doc.get("job")
    if isinstance(job, dict):
        out["job"] = {k: job.get(k) for k in ("points_found", "points_chosen", "points_tried", "by_kind", "outcomes")
                      if k in job}
    return out


def _run(tmp_path: Path, name: str, args: list[str]) -> dict[str, Any]:
    results = tmp_path / f"{name}.json"
    env = dict(os.environ, CHAOS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--json", str(results), "--scratch", str(tmp_path),
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(results.read_text())


RUNS = {
    "builtin_default": [],
    "careless_job": ["--seed", "0", "--max-points", "16", "--jobs", "2", "--result-file", "final.json", "--",
                     sys.executable, "chaos/examples/careless_job.py", "--out", "{out}"],
    "careful_job": ["--seed", "0", "--max-points", "16", "--jobs", "2", "--result-file", "final.json", "--",
                    sys.executable, "chaos/examples/careful_job.py", "--out", "{out}"],
    "torchrun_job": ["--seed", "0", "--faults", "kill", "--max-points", "3", "--result-file", "final.pt", "--",
                     sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                     "--max-restarts", "1", "chaos/examples/ddp_job.py", "--out", "{out}", "--save", "careful"],
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_decides_what_its_snapshot_says(name: str, tmp_path: Path) -> None:
    got = project(_run(tmp_path, name, RUNS[name]))
    path = SNAPSHOTS / f"{name}.json"
    text = json.dumps(got, indent=1, sort_keys=True) + "\n"
    if UPDATE or not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        if not UPDATE:
            pytest.fail(f"no snapshot {path.name} yet: written; commit it and rerun")
        return
    want = path.read_text()
    if want != text:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), f"{name} (snapshot)",
                                            f"{name} (this run)", n=2))
        pytest.fail(f"{name} decided differently from its snapshot:\n{diff[:12000]}")


def test_masking_keeps_decisions_and_drops_what_varies() -> None:
    line = "rank 1 resumed at step 20 after 3.25 s (pid 4242) in /tmp/chaos-abc/x; sha 0123456789abcdef0"
    assert mask(line) == "rank 1 resumed at step 20 after <f> s (pid <n>) in <path>; sha <hex>"


BEFORE = SNAPSHOTS / "before-28"  # results files written before the restructuring (issue #28)


def _replay(tmp_path: Path, doc: dict[str, Any], *args: str) -> dict[str, Any]:
    src, out = tmp_path / "old.json", tmp_path / "new.json"
    src.write_text(json.dumps(doc))
    env = dict(os.environ, CHAOS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "replay", str(src), "--yes", "--json", str(out),
                           "--scratch", str(tmp_path), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_job_results_file_written_before_the_restructuring_still_replays(tmp_path: Path) -> None:
    old = json.loads((BEFORE / "job.json").read_text())
    old["job"]["spec"]["cwd"] = str(REPO)  # where this checkout is: its relative COMMAND runs from there
    again = _replay(tmp_path, old)
    failing = sorted((s["id"], s["outcome"]) for s in old["scenarios"] if s["verdict"] == "fail")
    assert failing and sorted((s["id"], s["outcome"]) for s in again["scenarios"]) == failing


def test_a_builtin_results_file_written_before_the_restructuring_still_replays(tmp_path: Path) -> None:
    old = json.loads((BEFORE / "builtin.json").read_text())
    [scenario] = old["scenarios"]
    again = _replay(tmp_path, old, "--scenario", scenario["id"])
    assert [(s["id"], s["verdict"]) for s in again["scenarios"]] == [(scenario["id"], scenario["verdict"])]
    # The same faults; their spec now prints the one grammar (rank1:step11:kill), which reads back
    # to the fault the older spelling (kill:rank=1,step=11) names.
    from chaos.model.grammar import parse_fault

    now, then = again["scenarios"][0]["faults"], scenario["faults"]
    assert [{k: v for k, v in f.items() if k != "spec"} for f in now] == \
        [{k: v for k, v in f.items() if k != "spec"} for f in then]
    assert [parse_fault(f["spec"]) for f in now] == [parse_fault(f["spec"]) for f in then]
