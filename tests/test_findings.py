"""``chaos findings RESULTS.json...``: the findings table is made from job results, not by hand.

Hand-made results documents (``tests/fixtures/findings_results.json`` and variants built
here) check the grouping, the counts, the held and not-tested rows, the annotations (and
their absence), the versions the results recorded, and that bad input is one line and
exit status 2; one real ``chaos run --json`` of the careless example job feeds the command
end to end.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.cli import findings
from chaos.cli import main as cli
from chaos.errors import ConfigError
from chaos.model.jobspec import JobSpec
from chaos.run import results as job_results

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ANNOTATIONS = FIXTURES / "findings_annotations.json"
RESULTS = FIXTURES / "findings_results.json"


@pytest.fixture
def annotations() -> findings.Annotations:
    return findings.load_annotations(ANNOTATIONS)


def _doc() -> dict:
    return json.loads(RESULTS.read_text())


def _point(pid: str, outcome: str, summary: str = "what happened; then what came back") -> dict:
    verdict = {"pass": "pass", "no_effect": "skipped", "error": "error"}.get(outcome, "fail")
    return {"id": pid, "verdict": verdict, "outcome": outcome, "summary": summary, "replay": f"chaos run --point {pid}"}


def _variant(points: list[dict], command: list[str] | None = None, ranks: int = 1, packages: dict | None = None) -> dict:
    doc = _doc()
    doc["scenarios"] = points
    if command is not None:
        doc["job"]["spec"]["command"] = command
    doc["job"]["spec"]["world_size"] = ranks
    if packages is None:
        doc["environment"].pop("packages")
    else:
        doc["environment"]["packages"] = packages
    return doc


def _rows(annotations: findings.Annotations, *docs: dict) -> findings.Findings:
    runs = [findings.read_run(d, f"r{i}.json", annotations) for i, d in enumerate(docs)]
    return findings.build(runs, annotations)


def _table(f: findings.Findings) -> list[tuple[str, int, str, str, str]]:
    return [(r.framework, r.ranks, r.family, r.key, r.verdict()) for r in f.rows]


def test_points_are_grouped_by_family_with_counts_held_rows_and_skips(annotations):
    found = _rows(annotations, _doc())
    assert _table(found) == [
        ("Trainer X", 1, "kill", "hard_failure", "hard failure (2 of 3 kill points)"),
        ("Trainer X", 1, "corrupt", "pass", "held (1 of 1 corrupt point)"),
        ("Trainer X", 1, "power", "lost_work", "lost work (1 of 1 power point; 1 more skipped)"),
        ("Trainer X", 1, "term", "pass", "held (2 of 2 term points)"),
    ]
    kill = found.rows[0]
    assert kill.example.id == "rank0:op10:after" and kill.versions == "trainerx 5.24.0"
    assert (kill.note.meaning, kill.note.issue) == ("auto-resume picks an incomplete `ckpt-N`", "trainerx #1")
    assert [r.peer for r in found.rows] == ["yes", "no", "partly", "yes"]


def test_the_markdown_shows_each_row_its_evidence_annotations_and_replays(annotations):
    text = findings.render(_rows(annotations, _doc()))
    lines = text.splitlines()
    header = lines[0]
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "framework", "version", "ranks", "fault family", "verdict", "example point: evidence",
        "what it means for a user", "public issue", "peer 0.1 can test"]
    kill = next(line for line in lines if "kill points" in line)
    assert "**hard failure (2 of 3 kill points)**" in kill and "`rank0:op10:after`" in kill
    # The evidence is what came back, without the scratch root's path.
    assert "resume: FileNotFoundError" in kill and "{out}/ckpt-4/state.json" in kill and "chaos-job" not in kill
    assert "auto-resume picks an incomplete `ckpt-N`" in kill and "trainerx #1" in kill
    corrupt = next(line for line in lines if "corrupt point" in line)
    assert corrupt.count("no annotation") == 2  # held, but nobody annotated it: said so, nothing invented
    assert "- Trainer X, 1 rank(s), kill, hard failure: `chaos run --point rank0:op10:after -- python " in text
    assert "- Trainer X: corruption at rest" not in text  # held there: not a finding
    assert "- Trainer X: power loss: lost work (1 of 1, 1 rank(s))" in text
    assert "r0.json: Trainer X, 1 rank(s)" in text and "120 points found (80 kill, 30 power, 10 term)" in text
    assert "a real full disk is not explored: not root" in text


def test_runs_of_one_framework_and_ranks_merge_and_a_point_counts_once(annotations):
    first = _variant([_point("rank0:op1:before", "hard_failure"), _point("rank0:op2:before", "pass")],
                     packages={"trainerx": "5.24.0"})
    second = _variant([_point("rank0:op2:before", "hard_failure"), _point("rank0:op3:before", "pass"),
                       _point("rank0:op9:eio", "pass")], packages={"trainerx": "5.25.0"})
    found = _rows(annotations, first, second)
    assert _table(found) == [
        ("Trainer X", 1, "kill", "hard_failure", "hard failure (1 of 3 kill points)"),
        ("Trainer X", 1, "errno", "pass", "held (1 of 1 errno point)"),
    ]
    assert found.rows[0].versions == "trainerx 5.24.0 / 5.25.0"
    assert found.conflicts == ["Trainer X, 1 rank(s), rank0:op2:before: pass in r0.json, hard_failure in r1.json"]
    assert "Points whose outcome differed between runs" in findings.render(found)


def test_ranks_variants_and_unknown_jobs_make_their_own_rows(annotations):
    one = _variant([_point("rank0:op1:before", "hard_failure")], packages={})
    two = _variant([_point("rank1:op1:before", "hard_failure"), _point("rank1:step3:net", "pass")], ranks=2,
                   packages={})
    shuffled = _variant([_point("rank0:step3:kill", "silent_divergence")],
                        command=["python", "trainer.py", "--out", "{out}", "--shuffle"], packages={})
    other = _variant([_point("rank0:op1:after", "pass")], command=["python", "mine.py", "--out", "{out}"],
                     packages={})
    found = _rows(annotations, other, two, shuffled, one)
    assert [(r.framework, r.ranks, r.family, r.key) for r in found.rows] == [
        ("Trainer X", 1, "kill", "hard_failure"),
        ("Trainer X", 2, "kill", "hard_failure"),
        ("Trainer X", 2, "net", "pass"),
        ("Trainer X, shuffled", 1, "kill", "silent_divergence"),
        ("mine.py", 1, "kill", "pass"),  # not in the annotations' jobs: last, named after its script
    ]
    notes = [(r.note.meaning if r.note else None) for r in found.rows]
    # The 2-rank note wins at 2 ranks; "*" answers for any framework; no note for the rest.
    assert notes == ["auto-resume picks an incomplete `ckpt-N`", "at 2 ranks too", "a cut link did not break recovery",
                     None, None]
    assert found.rows[0].versions == "trainerx not recorded"  # recorded, but without the framework's package


def test_a_family_of_skipped_points_is_not_tested_and_errors_are_their_own_row(annotations):
    doc = _variant([_point("disk:full:4096", "no_effect"), _point("rank0:op4:enospc", "error"),
                    _point("rank0:op5:eio", "pass")], packages={"trainerx": "1"})
    found = _rows(annotations, doc)
    assert _table(found) == [
        ("Trainer X", 1, "errno", "error", "harness error (1 of 2 errno points)"),
        ("Trainer X", 1, "diskfull", "skipped", "not tested (1 diskfull point, every one skipped: no_effect)"),
    ]


def test_results_without_recorded_versions_say_so(annotations):
    doc = _variant([_point("rank0:op1:before", "pass")], command=["python", "loop.py", "--out", "{out}"])
    found = _rows(annotations, doc)
    assert found.rows[0].versions == "torch 2.13.0+cpu"  # torch is in every results' environment
    assert "do not record the job's package versions" in findings.render(found)
    doc = _variant([_point("rank0:op1:before", "pass")])
    assert _rows(annotations, doc).rows[0].versions == "trainerx not recorded"


def test_a_framework_that_held_where_the_peer_cannot_test_says_so(annotations):
    doc = _variant([_point("rank0:op1:bitflip", "pass"), _point("rank0:op2:before", "hard_failure")], packages={})
    text = findings.render(_rows(annotations, doc))
    assert "- Trainer X: held in every such family tried: corruption at rest (1 point(s), 1 rank(s))" in text
    assert "- peer 0.1, power loss: rolls back `unsynced` file data only" in text


def test_scrub_replaces_scratch_paths():
    text = ("'/tmp/chaos-job-x1/point-00002/out/a/b.json' and /var/t/chaos-job-q/golden-0/tmp/rank0/tmpab "
            "and /tmp/chaos-job-zz/trace/0.jsonl")
    assert findings.scrub(text) == "'{out}/a/b.json' and {tmp}/rank0/tmpab and <scratch>"


def test_evidence_is_what_came_back_for_a_failure_and_the_fault_for_a_pass():
    def point(key: str, summary: str) -> findings.PointOutcome:
        verdict = "pass" if key == "pass" else "fail"
        return findings.PointOutcome("rank0:op1:before", "kill", verdict, key, summary, "", "r.json")

    failed = point("hard_failure", "rank 1's link down; then the resume copy 0 exited 1 (1 restart(s) of 1 "
                                   "allowed): [rank0]: ValueError: x at /tmp/chaos-job-a/point-00001/out/ckpt-8")
    assert findings.evidence(failed) == "resume: [rank0]: ValueError: x at {out}/ckpt-8"
    assert findings.evidence(point("pass", "SIGTERM at step 4; then the job finished")) == "SIGTERM at step 4"
    cut = findings.evidence(point("lost_work", "x; then " + "y" * 400), limit=20)
    assert cut == "y" * 19 + "…"


def _cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["findings", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _bad(tmp_path: Path, name: str, content: object) -> Path:
    p = tmp_path / name
    p.write_text(content if isinstance(content, str) else json.dumps(content))
    return p


@pytest.mark.parametrize(("content", "says"), [
    (None, "results file not found"),
    ("{not json", "is not valid JSON (results)"),
    ([1, 2], "is not a chaos results JSON: expected an object with a 'scenarios' list"),
    ({"scenarios": []}, "is not the results of a job run"),
    ("no-id", "scenarios[0] has no 'id'"),
    ("bad-verdict", "$.scenarios[0].verdict is 'maybe', not one of pass, fail, error, skipped"),
    ("bad-outcome", "failed with outcome 'exploded'"),
    ("bad-point", "scenario 'op9' is not a point id chaos run writes"),
    ("bad-ranks", "$.job.spec.world_size must be an integer, not a string"),
])
def test_bad_results_are_one_line_naming_the_file_and_exit_2(tmp_path, capsys, content, says):
    doc = _doc()
    if content == "no-id":
        del doc["scenarios"][0]["id"]
    elif content == "bad-verdict":
        doc["scenarios"][0]["verdict"] = "maybe"
    elif content == "bad-outcome":
        doc["scenarios"][0]["outcome"] = "exploded"
    elif content == "bad-point":
        doc["scenarios"][0]["id"] = "op9"
    elif content == "bad-ranks":
        doc["job"]["spec"]["world_size"] = "two"
    path = tmp_path / "R.json"
    if content is not None:
        edited = isinstance(content, str) and not content.startswith("{")  # a named edit of the fixture
        _bad(tmp_path, "R.json", doc if edited else content)
    code, out, err = _cli(str(RESULTS), str(path), "--annotations", str(ANNOTATIONS), capsys=capsys)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("chaos: error: ") and str(path) in err and says in err, err


@pytest.mark.parametrize(("content", "says"), [
    ({"notes": [{"framework": "X", "family": "bitrot", "verdict": "held", "meaning": "m", "issue": "i"}]},
     "notes[0].family 'bitrot'"),
    ({"notes": [{"framework": "X", "family": "kill", "verdict": "flaky", "meaning": "m", "issue": "i"}]},
     "notes[0].verdict 'flaky'"),
    ({"notes": [{"framework": "X", "family": "kill", "verdict": "held", "meaning": "", "issue": "i"}]},
     "notes[0].meaning must be a non-empty string"),
    ({"jobs": [{"script": "a.py"}]}, "jobs[0].framework must be a non-empty string"),
    ({"peer": {"families": {"kill": "sometimes"}}}, "peer.families['kill'] = 'sometimes'"),
    ("[]", "an annotations file is a JSON object"),
])
def test_a_bad_annotations_file_is_one_line_and_exit_2(tmp_path, capsys, content, says):
    path = _bad(tmp_path, "A.json", content)
    code, out, err = _cli(str(RESULTS), "--annotations", str(path), capsys=capsys)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and str(path) in err and says in err, err


def test_the_checked_in_annotations_load_and_name_every_framework_job():
    ann = findings.load_annotations()
    scripts = {e.script for e in ann.jobs}
    on_disk = {p.name for p in (REPO / "chaos" / "examples" / "frameworks").glob("*.py")} - {"__init__.py"}
    assert scripts == on_disk
    frameworks = {e.framework for e in ann.jobs} | {"*"}
    assert {n.framework for n in ann.notes} <= frameworks  # no note for a framework no job is
    assert {ann.peer_families.get(f) for f in ("power", "corrupt", "diskfull", "net")} <= {"no", "partly"}


def test_out_writes_the_markdown_to_a_file(tmp_path, capsys):
    target = tmp_path / "findings.md"
    code, out, err = _cli(str(RESULTS), "--annotations", str(ANNOTATIONS), "--out", str(target), capsys=capsys)
    assert code == 0 and out == "" and "written to" in err
    assert target.read_text().startswith("| framework | version |")


def test_results_record_the_versions_of_the_packages_the_job_imports(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import os\nimport json\nfrom rich import print\nimport chaos\n\ndef f():\n    import jinja2\n")
    spec = JobSpec(command=("python", "job.py", "--out", "{out}"), cwd=str(tmp_path))
    from importlib import metadata

    assert job_results.job_packages(spec) == {"rich": metadata.version("rich"), "jinja2": metadata.version("jinja2")}
    no_script = JobSpec(command=("python", "-m", "somewhere", "--out", "{out}"), cwd=str(tmp_path))
    assert set(job_results.job_packages(no_script)) <= {"transformers", "lightning", "pytorch-lightning",
                                                        "accelerate", "torchdata"}


def test_a_real_exploration_feeds_the_table(tmp_path):
    """``chaos run --json`` on the careless example job (6 points over its families), then
    ``chaos findings`` on what it wrote: every family tried has its row, the counts add up to
    the points tried, and every failing outcome is a row with a replay command."""
    results = tmp_path / "careless.json"
    run = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--json", str(results), "--result-file",
                          "final.json", "--max-points", "6", "--seed", "0", "--scratch", str(tmp_path), "--",
                          sys.executable, "chaos/examples/careless_job.py", "--out", "{out}"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    doc = json.loads(results.read_text())
    assert doc["environment"]["packages"] == {}  # careless_job.py imports only the standard library and chaos
    table = subprocess.run([sys.executable, "-m", "chaos.cli.main", "findings", str(results)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    ann = findings.load_annotations()
    built = findings.build([findings.read_run(doc, str(results), ann)], ann)
    tried = {findings.point_family(s["id"], "x") for s in doc["scenarios"]}
    assert {r.family for r in built.rows} == tried
    for family in tried:
        rows = [r for r in built.rows if r.family == family]
        assert rows[0].total == sum(1 for s in doc["scenarios"] if findings.point_family(s["id"], "x") == family)
    failing = {(findings.point_family(s["id"], "x"), s["outcome"]) for s in doc["scenarios"] if s["verdict"] == "fail"}
    assert {(r.family, r.key) for r in built.rows if r.key in findings.FAILURES} == failing
    rows = [line for line in table.stdout.splitlines() if line.startswith("| careless\\_job.py |")]
    assert len(rows) == len(built.rows)
    for family, outcome in failing:
        head = f"- careless\\_job.py, 1 rank(s), {findings.FAMILY_WORDS[family]}, {findings.VERDICT_WORDS[outcome]}: "
        assert any(line.startswith(head) and "--point " in line and "careless_job.py" in line
                   for line in table.stdout.splitlines()), (head, table.stdout)


def test_bad_input_never_reaches_the_renderer_as_a_partial_table(annotations):
    doc = copy.deepcopy(_doc())
    doc["scenarios"].append("not a point")
    with pytest.raises(ConfigError, match=r"r0.json: scenarios\[8\] is not an object"):
        _rows(annotations, doc)
