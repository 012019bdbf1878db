"""``chaos bench job``: our job mode and the peer ckpt-chaos, side by side on the same script.

Real runs of both tools on the shipped careless example. No timing is asserted: the
tests check the report's structure, that both tools really ran (points and fault
kinds from their own output files), that ours reports the careless job's defect, and
that nothing is left outside the files asked for.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.bench import job as jobbench
from chaos.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
pytest.importorskip("ckpt_chaos", reason="ckpt-chaos (the dev extra) is the peer tool bench-job runs")


def bench(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", "bench-job", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow  # 9 s: both tools end to end; the nightly runs it, the bench's unit tests stay per commit
def test_both_tools_run_the_careless_example_and_ours_reports_its_defect(tmp_path: Path) -> None:
    out_json, out_md, scratch = tmp_path / "bench.json", tmp_path / "bench.md", tmp_path / "scratch"
    scratch.mkdir()
    proc = bench("--script", "chaos/examples/careless_job.py", "--repeat", "2", "--max-points", "16",
                 "--json", str(out_json), "--markdown", str(out_md), "--scratch", str(scratch))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out_json.read_text())
    assert doc["tools"]["ckpt-chaos"] == "0.1.8" and doc["settings"]["repeat"] == 2
    [script] = doc["scripts"]
    assert script["name"] == "careless_job.py" and "{out}" in script["command"]
    for tool in ("chaos", "ckpt-chaos"):
        runs = script["runs"][tool]
        assert len(runs) == 2 and all(r["error"] is None for r in runs)
        assert all(r["points"] > 0 and r["kinds"] and r["events"] for r in runs)
        assert [r["first"] for r in runs] in ([True, False], [False, True])  # the order alternates
        s = script["summary"][tool]
        assert s["completed"] == 2 and set(s["wall_s"]) == {"min", "median", "max"}
        assert sum(s["outcomes"].values()) == sum(r["points"] for r in runs)
    ours, theirs = script["summary"]["chaos"], script["summary"]["ckpt-chaos"]
    assert any(k.startswith("crash:") for k in ours["kinds"]) and "before" in theirs["kinds"]
    assert set(theirs["verdicts"]) <= set(jobbench.PEER_VERDICTS)
    # ours finds the in-place overwrite: a hard failure with the job's JSONDecodeError as evidence
    assert ours["found_defect"] and ours["outcomes"].get("hard_failure", 0) > 0
    assert "ckpt.json" in ours["example_failure"] and "JSONDecodeError" in ours["example_evidence"]
    assert script["defect_found"]["chaos"] is True
    r = script["ratios_ours_over_theirs"]
    assert len(r["total"]) == 2 and len(r["per_point"]) == 2 and set(r["total_spread"]) == {"min", "median", "max"}
    table = out_md.read_text()
    assert "| careless_job.py | chaos |" in table and "| careless_job.py | ckpt-chaos |" in table
    assert table in proc.stdout
    assert not list(scratch.iterdir())  # both tools' work folders are gone


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = bench("--repeat", "0")
    assert proc.returncode == 2 and proc.stderr.strip() == "chaos: error: --repeat must be at least 1, got 0"
    proc = bench("--script", str(tmp_path / "nope.py"))
    assert proc.returncode == 2 and "nope.py: no such file" in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_peer_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobbench.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"ckpt-chaos is not installed .*pip install ckpt-chaos==0.1.8"):
        jobbench.require_peer()


def test_a_peer_that_could_not_run_is_an_error_not_zero_points(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text('<?xml version="1.0"?>\n<testsuite name="ckpt-chaos" tests="1" errors="1"><testcase '
                     'name="ckpt-chaos could not run"><error message="could not run">your command failed on its '
                     'own (exit 1)</error></testcase></testsuite>\n')
    run = jobbench.read_peer(tmp_path / "work", junit, "", jobbench.ToolRun("ckpt-chaos", 0, True, 1.0, 1))
    assert run.error == "ckpt-chaos could not run: your command failed on its own (exit 1)" and run.points == 0
    assert jobbench.summarize([run])["completed"] == 0


def test_default_scripts_are_the_shipped_examples() -> None:
    parser = argparse.ArgumentParser()
    jobbench.add_arguments(parser)
    args = parser.parse_args([])
    assert args.repeat == 3 and [p.name for p in jobbench.DEFAULT_SCRIPTS] == ["careless_job.py", "careful_job.py"]
    assert all(p.is_file() for p in jobbench.DEFAULT_SCRIPTS)
