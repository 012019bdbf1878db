"""Console output where there is no terminal (a CI log): one compact line per scenario, no table.

On a terminal rich's live view and closing table stay; piped, ``chaos run`` prints
``[i/n] VERDICT id seconds  oracle: summary`` per scenario, a ``replay:`` line under a
failure, and a short summary, none of it wrapped. A real run (one kill scenario against
a checkpointer that loses state, about 10 s) is checked end to end with ``CI=true``,
``--junit`` and ``--summary``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from rich.console import Console

from chaos.cli.console import LiveProgress, compact_lines, scenario_line, summary_table
from chaos.model.check import Check
from chaos.plan.scenario import Scenario, parse_fault
from chaos.run.runner import ScenarioResult

REPO = Path(__file__).resolve().parent.parent
BOX = set("┏┓┗┛┃━│─┡┩╇┳┻┼╭╮╰╯")
LONG = "tests/checkpointers/some_rather_long_directory_name/model_only_variant.py:ModelOnlyCheckpointer"


def _results() -> list[ScenarioResult]:
    ok = Check("bit_exact", "pass", "final state equals the golden run", {})
    bad = Check("bit_exact", "fail", "rank 0 final state: first differing tensor\n'data/position'", {})
    loss = Check("loss_continuity", "fail", "rank 0 step 4: -16.90% off the golden", {})
    kill = Scenario(checkpointer=LONG, faults=[parse_fault("kill:rank=1,step=5")])
    return [
        ScenarioResult(Scenario(checkpointer="reference", faults=[parse_fault("kill:rank=1,step=23")]), "pass",
                       {"bit_exact": ok}, seconds=3.21),
        ScenarioResult(kill, "fail", {"bit_exact": bad, "loss_continuity": loss, "durability": ok}, seconds=5.6),
        ScenarioResult(Scenario(checkpointer="dcp", faults=[parse_fault("term:rank=0,step=12,grace=2")]), "error",
                       {}, error="RuntimeError: [/__w/pytorch/gloo] Timed out\nwaiting", seconds=1.0),
        ScenarioResult(Scenario(checkpointer="reference", faults=[parse_fault("kill:rank=1,step=5,attempt=1")]),
                       "skipped", {"bit_exact": ok}, error="skipped: fault kill:rank=1,step=5,attempt=1 never fired",
                       seconds=2.0),
    ]


def test_compact_lines_say_verdict_id_time_and_the_failing_oracle():
    passed, failed, errored, skipped = _results()
    assert compact_lines(passed, "[1/4] ") == ["[1/4] PASS reference-rank1_step23_kill-seed0 3.2s"]
    head, replay = compact_lines(failed, "[2/4] ")
    assert head == (f"[2/4] FAIL {failed.scenario.id} 5.6s  bit_exact: rank 0 final state: first differing tensor "
                    "'data/position' (+1 more: loss_continuity)")
    assert replay == f"  replay: {failed.replay}"
    assert compact_lines(errored) == [f"ERROR {errored.scenario.id} 1.0s  RuntimeError: [/__w/pytorch/gloo] Timed out "
                                      "waiting", f"  replay: {errored.replay}"]
    assert compact_lines(skipped) == [f"SKIP {skipped.scenario.id} 2.0s  fault kill:rank=1,step=5,attempt=1 never fired"]


def test_without_a_terminal_each_scenario_is_one_line_and_the_end_is_short():
    out = io.StringIO()
    console = Console(file=out, width=80)  # what a CI log gets: not a terminal, 80 columns
    results = _results()
    for i, r in enumerate(results, 1):
        scenario_line(console, r, position=f"[{i}/4] ")
    summary_table(console, results)
    lines = out.getvalue().splitlines()
    assert not BOX & set(out.getvalue()) and "\x1b" not in out.getvalue()
    heads = [line for line in lines if line.startswith("[")]
    assert [h.split()[1] for h in heads] == ["PASS", "FAIL", "ERROR", "SKIP"]
    for r in results:  # the id whole on one line, the replay command whole on one line
        assert sum(1 for line in lines if r.scenario.id in line.split()) >= 1
        if r.verdict in ("fail", "error"):
            assert f"  replay: {r.replay}" in lines
    assert lines[-3:] == ["chaos results: 4 scenario(s): 1 pass, 1 fail, 1 error, 1 skipped in 11.8 s",
                          f"  FAIL {results[1].scenario.id}  replay: {results[1].replay}",
                          f"  ERROR {results[2].scenario.id}  replay: {results[2].replay}"]
    assert len(lines) == 4 + 2 + 3


def test_a_terminal_keeps_the_table_and_the_live_campaign_line():
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    summary_table(console, _results())
    assert "chaos results" in out.getvalue() and BOX & set(out.getvalue())

    live = LiveProgress(console, total=7, note="42 s of the 60 s budget left")
    live.start(_results()[0].scenario)
    live.finish(_results()[0])
    live.finish(_results()[1])
    with console.capture() as cap:
        console.print(live.progress)
    assert "2/7 done" in cap.get() and "42 s of the 60 s budget left" in cap.get()


def test_a_ci_run_prints_short_lines_and_writes_junit_and_summary(tmp_path):
    """One real kill scenario, stdout piped, CI=true: a handful of lines, the verdict and the replay command."""
    results, junit, summary = tmp_path / "r.json", tmp_path / "j.xml", tmp_path / "s.md"
    env = {**os.environ, "CI": "true", "COLUMNS": "80"}
    env.pop("FORCE_COLOR", None)
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--checkpointer",
                           "tests/checkpointers/model_only.py:ModelOnlyCheckpointer", "--steps", "8", "--save-every",
                           "3", "--fault", "kill:rank=1,step=5", "--json", str(results), "--junit", str(junit),
                           "--summary", str(summary), "--cache-dir", str(tmp_path / "cache"),
                           "--scratch", str(tmp_path / "scratch")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (sc,) = json.loads(results.read_text())["scenarios"]
    lines = proc.stdout.splitlines()
    assert len(lines) <= 12, proc.stdout
    assert not BOX & set(proc.stdout) and "\x1b" not in proc.stdout
    assert lines[0].startswith(f"[1/1] FAIL {sc['id']} ") and "bit_exact: " in lines[0]
    assert lines[1] == f"  replay: {sc['replay']}"
    assert lines[-1] == f"  FAIL {sc['id']}  replay: {sc['replay']}"

    case = ET.parse(junit).getroot().find("testsuite/testcase")
    assert sc["checkpointer"] == str(REPO / "tests/checkpointers/model_only.py") + ":ModelOnlyCheckpointer"
    assert case.get("name") == sc["id"]
    assert case.get("classname") == "tests.checkpointers.model_only.ModelOnlyCheckpointer", "dotted, relative to the run's cwd"
    assert sc["oracles"]["bit_exact"]["summary"] in case.find("failure").get("message")
    assert f"replay: {sc['replay']}" in case.find("failure").text

    text = summary.read_text()
    assert text.startswith("## ❌ chaos run: ") and "**1 scenario(s): fail 1**" in text
    assert f"| `{sc['id']}` |" in text and f"`{sc['replay']}`" in text
