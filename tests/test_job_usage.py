"""Mistakes that exited 0, and what a long job run says as it goes and at its end (#34, items 5 and 7).

A ``--result-file`` the fault-free run never wrote, and a ``--point`` the job does not
have or that was never reached, are usage errors: one line on stderr, exit 2 (before,
``2 pass, rc=0`` and ``1 not_reached, rc 0``). A run prints progress lines with the time
left on stderr, writes ``--html`` as ``chaos report`` renders it, and ends with one line
saying where its results and reports were written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CAREFUL = [sys.executable, "chaos/examples/careful_job.py", "--out", "{out}"]
CARELESS = [sys.executable, "chaos/examples/careless_job.py", "--out", "{out}"]

# Ten files in the two fault-free runs, one in every later run: a point among the ten
# exists in the traces but is never reached when it runs. MARKS counts the runs.
SHRINKING = """
import os, sys
out, marks = sys.argv[1], sys.argv[2]
n = len(os.listdir(marks))
os.close(os.open(os.path.join(marks, "run%d-%d" % (n, os.getpid())), os.O_CREAT | os.O_WRONLY))
for i in range(10 if n < 2 else 1):
    with open(os.path.join(out, "f%d.txt" % i), "w") as f:
        f.write("x")
"""


def chaos_run(*args: str, scratch: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(scratch), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    return lines[0]


def test_a_result_file_the_fault_free_run_never_wrote_is_a_usage_error(tmp_path: Path) -> None:
    proc = chaos_run("--result-file", "final.pth", "--max-points", "2", "--", *CAREFUL, scratch=tmp_path)
    line = _one_error_line(proc)
    assert line.startswith("chaos: error: --result-file 'final.pth' matched no file the fault-free run left under "
                           "{out} (it left "), line
    assert "final.json" in line  # what the job did write
    assert "coverage" not in proc.stdout  # no point ran
    assert list(tmp_path.iterdir()) == []  # nor is the scratch root left


def test_each_result_file_must_match(tmp_path: Path) -> None:
    proc = chaos_run("--result-file", "final.json", "--result-file", "{out}/model.bin", "--max-points", "1",
                     "--", *CAREFUL, scratch=tmp_path)
    assert "--result-file '{out}/model.bin' matched no file" in _one_error_line(proc)


@pytest.mark.parametrize(("point", "why"), [
    ("rank0:op999:after", "rank 0's fault-free run traced 49 file event(s), op0 to op48"),
    ("rank0:step99:kill", "rank 0's last step announced in the fault-free run was 12"),
    ("rank2:op1:after", "the fault-free run traced no rank 2 (rank(s) traced: 0)"),
])
def test_a_point_the_job_does_not_have_is_a_usage_error_before_any_point_runs(tmp_path: Path, point: str,
                                                                              why: str) -> None:
    proc = chaos_run("--result-file", "final.json", "--point", point, "--", *CAREFUL, scratch=tmp_path)
    assert _one_error_line(proc) == f"chaos: error: --point {point} is not a point of this job: {why}"
    assert "coverage" not in proc.stdout


def test_a_point_never_reached_when_it_ran_is_a_usage_error_after_its_results(tmp_path: Path) -> None:
    job, marks, results = tmp_path / "shrinking.py", tmp_path / "marks", tmp_path / "r.json"
    job.write_text(SHRINKING)
    marks.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # run to the point: materialized from the fault-free trace (where event 20 is) it would be reached
    proc = chaos_run("--json", str(results), "--no-materialize", "--point", "rank0:op20:after", "--", sys.executable,
                     str(job), "{out}", str(marks), scratch=scratch)
    line = _one_error_line(proc)
    assert line.startswith("chaos: error: --point rank0:op20:after was never reached: the point was not reached"), line
    assert "1 not_reached" in proc.stdout  # the run's own record stays
    [s] = json.loads(results.read_text())["scenarios"]
    assert (s["id"], s["outcome"]) == ("rank0:op20:after", "not_reached")


def test_progress_lines_say_the_points_done_and_the_time_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from chaos.cli import job as cli_job

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(cli_job, "PROGRESS_EVERY_S", 0.0)  # a line after every point but the last
    code = cli_job.main(["--scratch", str(tmp_path), "--result-file", "final.json", "--faults", "kill",
                         "--max-points", "3", "--", *CAREFUL])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("progress: ")]
    assert [ln.split(" point(s)")[0] for ln in lines] == ["progress: 1/3", "progress: 2/3"]
    assert all(" left (" in ln and " s a point, 1 at a time)" in ln for ln in lines), lines
    assert "progress:" not in captured.out  # stdout keeps the verdicts


def test_the_time_left_is_the_mean_point_time_over_the_rounds_left_within_the_budget() -> None:
    from chaos.cli.job import progress_line

    assert progress_line(4, 10, [3.0, 5.0], 2, 20.0, None) == (
        "progress: 4/10 point(s) done in 20 s, about 12 s left (4.0 s a point, 2 at a time)")
    assert progress_line(5, 100, [60.0], 1, 300.0, None) == (
        "progress: 5/100 point(s) done in 5 min 0 s, about 1 h 35 min left (60.0 s a point, 1 at a time)")
    assert progress_line(1, 50, [10.0], 1, 30.0, 60.0) == (
        "progress: 1/50 point(s) done in 30 s, about 30 s left (10.0 s a point, 1 at a time); "
        "30 s of the 60 s budget left")


def test_a_long_run_says_its_cost_before_the_first_point_and_what_the_options_would_make_of_it() -> None:
    from chaos.cli.job import cost_line

    # the torch script: 182 points at about 7 s each, one at a time, on 2 cores
    assert cost_line(182, 7.3, 1, None, None, cores=2) == (
        "estimate: about 22 min 9 s for 182 point(s) at about 7.3 s a point, 1 at a time; "
        "--max-points 41 about 4 min 59 s, --jobs 2 about 11 min 4 s")
    assert cost_line(40, 7.3, 1, None, None, cores=2) is None  # under five minutes: nothing to say
    # --max-points already given: not suggested again; no core left for more --jobs: not suggested either
    assert cost_line(100, 7.3, 2, None, 100, cores=2) == (
        "estimate: about 6 min 5 s for 100 point(s) at about 7.3 s a point, 2 at a time")
    assert cost_line(182, 7.3, 1, 600.0, None, cores=4).endswith("(within the --budget)")


def test_html_and_the_last_line_says_where_each_output_was_written(tmp_path: Path) -> None:
    results, junit, summary, html = (tmp_path / n for n in ("r.json", "j.xml", "s.md", "r.html"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = chaos_run("--json", str(results), "--junit", str(junit), "--summary", str(summary), "--html", str(html),
                     "--point", "rank0:op1:after", "--", *CARELESS, scratch=scratch)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        f"written: results JSON {results}; JUnit XML {junit}; Markdown summary appended to {summary}; "
        f"HTML report {html}")
    page = html.read_text()
    assert page.lstrip().lower().startswith("<!doctype html") and "rank0:op1:after" in page
    only_json = chaos_run("--json", str(results), "--point", "rank0:op1:after", "--", *CARELESS, scratch=scratch)
    assert only_json.stdout.strip().splitlines()[-1] == f"written: results JSON {results}"
    nothing = chaos_run("--point", "rank0:op1:after", "--", *CARELESS, scratch=scratch)
    assert not nothing.stdout.strip().splitlines()[-1].startswith("written:")


def test_an_html_path_that_is_a_directory_is_refused_before_the_run(tmp_path: Path) -> None:
    proc = chaos_run("--html", str(tmp_path), "--", *CAREFUL, scratch=tmp_path)
    assert _one_error_line(proc) == f"chaos: error: --html {tmp_path}: is a directory, expected a file path"
