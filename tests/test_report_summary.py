"""The Markdown summary (``--summary FILE``) and the reports of a job run.

The summary is appended (GitHub's ``$GITHUB_STEP_SUMMARY``: earlier steps' text stays),
its table cells survive ``|`` and newlines, and it says coverage for jobs and campaigns
and certified or not for ``chaos certify``. A real job run (``chaos run -- COMMAND`` on
the careless example) writes JSON, JUnit and summary from one document, and
``chaos report`` renders that JSON with its points, outcomes and replay commands.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from reports.causes import group
from reports.summary import append_summary, cell, code, markdown_summary

REPO = Path(__file__).resolve().parent.parent
CARELESS = [sys.executable, "chaos/examples/careless_job.py", "--out", "{out}"]


def _doc(scenarios: list[dict], **extra) -> dict:
    return {"schema_version": 1, "summary": {}, "environment": {}, "scenarios": scenarios, **extra}


def _sc(sid: str, verdict: str, summary: str = "", replay: str = "chaos run --fault kill:rank=1,step=5",
        error: str | None = None) -> dict:
    return {"id": sid, "checkpointer": "reference", "verdict": verdict, "seconds": 1.5, "error": error,
            "oracles": {"bit_exact": {"result": "fail" if verdict == "fail" else "pass", "summary": summary}},
            "replay": replay, "faults": [{"spec": "kill:rank=1,step=5"}]}


def _unescaped_pipes(row: str) -> int:
    return len(re.findall(r"(?<!\\)\|", row))


def _table_rows(text: str, header: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(header) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_append_keeps_what_is_there_and_adds_a_heading_per_run(tmp_path):
    path = tmp_path / "step_summary.md"
    path.write_text("# earlier step\nits text\n")
    doc = _doc([_sc("a", "pass"), _sc("b", "fail", "differs")])
    append_summary(doc, path)
    append_summary(doc, path)
    text = path.read_text()
    assert text.startswith("# earlier step\nits text\n\n## ")
    assert text.count("## ❌ chaos run: reference") == 2
    assert "**2 scenario(s): pass 1, fail 1** in 3.0 s" in text


def test_cells_escape_pipes_and_newlines_and_replays_are_code():
    summary = "loss | 4.57 != golden\nsecond line <b>x</b>"
    replay = "chaos run --fault 'kill:rank=1,step=5' | tee log"
    text = markdown_summary(_doc([_sc("kill|1", "fail", summary, replay), _sc("ok", "pass")]))
    header = "| id | target | outcome | summary | replay |"
    (row,) = _table_rows(text, header)
    assert _unescaped_pipes(row) == _unescaped_pipes(header)  # the row has exactly the header's cells
    assert "\n" not in row and "<b>" not in row and "&lt;b&gt;" in row
    assert "`chaos run --fault 'kill:rank=1,step=5' \\| tee log`" in row
    assert "bit\\_exact: loss \\| 4.57 != golden second line" in row
    assert cell("a\nb|c") == "a b\\|c" and code("x `y` z") == "`` x `y` z ``"
    passing = _table_rows(text, "| id | target | outcome | time |")
    assert passing == ["| `ok` | reference | ✅ pass | 1.5 s |"]


def test_errors_and_skips_are_listed_with_their_reasons():
    text = markdown_summary(_doc([_sc("e", "error", error="RuntimeError: the fork server died"),
                                  _sc("s", "skipped", error="skipped: fault kill:rank=1,step=5 never fired")]))
    rows = _table_rows(text, "| id | target | outcome | summary | replay |")
    assert rows[0].startswith("| `e` | reference | ⚠️ error | RuntimeError: the fork server died | `chaos run")
    assert rows[1] == "| `s` | reference | ⏭️ skipped | fault kill:rank=1,step=5 never fired | - |"


def test_campaign_coverage_and_certification_verdict():
    doc = _doc([_sc("a", "pass")], campaign={"family_scenarios": 7, "generated": 2, "generated_skipped": 0,
                                            "budget_s": 30, "coverage": {"seen": 12, "tried": 5,
                                                                         "io_faults_drawn": 2,
                                                                         "io_faults_fired": 2}})
    text = markdown_summary(doc)
    assert "- campaign: 7 family scenario(s), 2 generated schedule(s), 0 skipped within a 30 s budget" in text
    assert "- fault-point coverage: 5 of 12 (rank, operation, file role, phase) points tried" in text

    cert = {"kind": "certification", "backend": "s3-local", "certified": True, "failing": [], "partial": None,
            "properties": [{"name": "read_after_write", "status": "pass", "summary": "ok", "seconds": 0.1}],
            "campaign": [], "seconds": 61.0}
    text = markdown_summary(cert)
    assert text.startswith("## ✅ chaos certify s3-local\n") and "- CERTIFIED" in text
    cert.update(certified=False, partial="partial run (--quick): never certified")
    text = markdown_summary(cert)
    assert text.startswith("## ❌ chaos certify s3-local\n") and "- NOT CERTIFIED" in text
    assert "- partial run (--quick): never certified" in text


def test_a_job_run_writes_json_junit_summary_and_its_html_report_shows_the_points(tmp_path):
    """The careless example (about 2 s): 6 points, at least one hard failure; every report agrees, each
    grouping the failing points by cause (one JUnit testcase, one summary row per cause)."""
    results, junit, summary, page = (tmp_path / n for n in ("r.json", "j.xml", "s.md", "r.html"))
    summary.write_text("kept\n")
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--result-file",
                           "final.json", "--max-points", "6", "--seed", "0", "--json", str(results), "--junit",
                           str(junit), "--summary", str(summary), "--", *CARELESS],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(results.read_text())
    failed = [s for s in doc["scenarios"] if s["verdict"] == "fail"]
    assert failed and doc["summary"]["total"] == 6

    # failing points are grouped by cause (reports.causes): a testcase per cause, its points as properties
    causes = group(doc)
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    assert (int(suite.get("tests")), int(suite.get("failures"))) == (6 - len(failed) + len(causes), len(causes))
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {c.id for c in causes} | {s["id"] for s in doc["scenarios"] if s["verdict"] != "fail"}
    assert {c.get("classname") for c in cases.values()} == {"job"}
    first = next(c for c in causes if c.outcome == "hard_failure")
    rep = first.representative.scenario
    failure = cases[first.id].find("failure")
    assert failure.get("type") == rep["outcome"] == "hard_failure"
    assert failure.get("message") == f"{first.headline()}: {first.fix_text}"
    assert rep["oracles"]["liveness"]["summary"] in failure.text
    assert f"replay: {rep['replay']}" in failure.text
    points = {p.get("name"): p.get("value") for p in cases[first.id].iter("property")}
    assert {p.id: p.replay for p in first.points}.items() <= points.items()
    found = doc["job"]["points_found"]  # what the trace showed (depends on the interposer, not on reports)
    assert f"coverage: 6 of {found} point(s) tried" in suite.find("system-out").text

    text = summary.read_text()
    assert text.startswith("kept\n\n## ❌ chaos run -- ")
    assert f"**6 point(s): pass {6 - len(failed)}, fail {len(failed)}**" in text
    assert f"- coverage: 6 of {found} point(s) tried ({6 / found:.0%})" in text
    assert f"| {cell(first.title, None)} | hard\\_failure | {first.count} |" in text
    assert code(rep["replay"]) in text

    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "report", str(results), "-o", str(page)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    body = html.unescape(page.read_text())
    for s in doc["scenarios"]:
        assert 'id="replay-' in body and s["id"] in body
    assert rep["replay"] in body and "hard_failure" in body and "Failures by cause" in body
    assert f"6 tried of {found} found" in body and f"coverage: 6 of {found} point(s) tried" in body
    assert "result_files: not_judged" not in body  # a check that did not run is no failure callout
