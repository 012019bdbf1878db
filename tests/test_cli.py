"""The command line: bad input gets one clear line and exit 2; results JSON has the contract's shape."""

import json
import subprocess
import sys

import pytest


def chaos(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--checkpointer", "nope"], "unknown checkpointer 'nope'"),
        (["--checkpointer", "missing/file.py:Cls"], "checkpointer file not found: missing/file.py"),
        (["--fault", "kill:rank=1"], "needs step"),
        (["--fault", "explode:rank=1,step=2"], "unknown fault kind 'explode'"),
        (["--fault", "kill:rank=9,step=2"], "rank 9 does not exist"),
        (["--workload", "colour=blue"], "unknown --workload key(s) colour"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, needle):
    proc = chaos("run", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_replay_rejects_a_file_that_is_not_results(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    proc = chaos("replay", str(bad))
    assert proc.returncode == 2 and "is not a chaos results JSON" in proc.stderr
    proc = chaos("replay", str(tmp_path / "absent.json"))
    assert proc.returncode == 2 and "results file not found" in proc.stderr


@pytest.mark.chaos
def test_run_writes_results_json_and_replay_reruns_it(tmp_path):
    out = tmp_path / "out.json"
    common = ["--cache-dir", str(tmp_path / "cache"), "--scratch", str(tmp_path / "scratch")]
    proc = chaos("run", "--checkpointer", "tests/checkpointers/model_only.py:ModelOnlyCheckpointer",
                 "--steps", "8", "--save-every", "3", "--fault", "kill:rank=1,step=5", "--json", str(out), *common)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr, "no control characters when output is not a terminal"
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1 and doc["summary"]["fail"] == 1
    (sc,) = doc["scenarios"]
    for key in ("id", "seed", "checkpointer", "backend", "world_size", "faults", "verdict", "oracles", "replay"):
        assert key in sc
    assert sc["verdict"] == "fail" and sc["oracles"]["bit_exact"]["result"] == "fail"
    assert sc["faults"][0]["spec"] == "rank1:step5:kill"  # the one grammar (--fault took the older spelling)
    assert sc["fired"][0]["signal"] == "SIGKILL" and sc["fired"][0]["rank"] == 1
    assert sc["replay"] in proc.stdout.replace("\n", "")
    assert list((tmp_path / "scratch").iterdir()) == [], "scratch roots must be removed"

    again = chaos("replay", str(out), "--json", str(tmp_path / "again.json"), *common)
    assert again.returncode == 1
    redo = json.loads((tmp_path / "again.json").read_text())["scenarios"][0]
    assert redo["id"] == sc["id"]
    assert redo["oracles"]["bit_exact"]["evidence"] == sc["oracles"]["bit_exact"]["evidence"]


def test_a_fault_that_never_fires_makes_the_scenario_skipped_not_passed(tmp_path):
    """attempt=1 never runs when the first attempt finishes: nothing was attacked."""
    out = tmp_path / "out.json"
    proc = chaos("run", "--steps", "6", "--save-every", "3", "--fault", "kill:rank=1,step=5,attempt=1",
                 "--json", str(out), "--cache-dir", str(tmp_path / "cache"), "--scratch", str(tmp_path / "scratch"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sc,) = json.loads(out.read_text())["scenarios"]
    assert sc["verdict"] == "skipped" and sc["fired"] == []
    assert "rank1:step5:kill,attempt=1 never fired" in sc["error"]
