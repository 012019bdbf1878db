"""Results files from someone else (a CI artifact): each attack on a reader of them, one test each.

The readers are ``chaos report``, ``chaos replay``, ``chaos findings`` and ``chaos repro``; the
harness runs as root on shared CI runners, so a results file is input, never a program:

* ``chaos repro`` writes a script whose every value from the results is a Python literal;
* ``chaos replay`` prints what it will run and runs a file not provably written by this
  user on this host only with ``--yes`` (``--dry-run`` prints only);
* a FIFO, a device, a directory, a 200 MB file, deep nesting or a wrong-shaped document
  is one ``chaos: error:`` line naming the file (and the JSON path of the wrong field),
  exit status 2, at once;
* text from a results file or a job's output reaches the terminal and the Markdown with
  its control characters escaped, and results and reports are written with the umask's mode.

The property-based sweep over many hostile documents is ``test_hostile_results_fuzz.py``.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from chaos.cli import main as cli

REPO = Path(__file__).resolve().parent.parent
BUILTIN = REPO / "tests" / "fixtures" / "report" / "results-fail.json"
READERS = ("report", "replay", "findings", "repro")
# What a terminal acts on rather than shows: ESC, BEL, CR, the C1 CSI, a bidi override.
CONTROLS = ("\x1b", "\x07", "\r", "\x9b", "\u202e")
HOSTILE_TEXT = "\x1b]0;pwned\x07\x1b[2J\r\u202eall points passed\x9b"


@pytest.fixture(autouse=True)
def _own_origin_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chaos run writes an origin record with this user's key: here (and in the subprocesses,
    which inherit the environment) a key of the test's own, not the one in the real home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def job_doc(cwd: Path, point: str = "rank0:op10:after", outcome: str = "hard_failure",
            summary: str = "the resume exited 1 (1 restart(s) of 1 allowed): ValueError: bad checkpoint",
            command: list[str] | None = None) -> dict[str, Any]:
    """A job's results document in the shape ``chaos.run.results.job_results_document`` writes (one failing point, one
    passing), trimmed from a real ``chaos run -- python careless_job.py`` run."""
    command = command or ["python", "train.py", "--out", "{out}"]
    spec = {"command": command, "resume_command": None, "ranks": None, "world_size": 1, "torchrun": False,
            "result_files": ["final.json"], "step_regex": None, "loss_regex": None, "loss_band": None,
            "checkpoint_glob": None, "max_restarts": 1, "timeout_s": 300.0, "rtol": 0.001,
            "modes": ["before", "after", "torn"], "faults": None, "grace_s": 5.0, "net_hold_s": 5.0,
            "cwd": str(cwd), "nodes": None, "node_hold_s": 5.0}
    failing = {
        "id": point, "seed": 0, "checkpointer": "job", "backend": "file", "world_size": 1,
        "faults": [{"kind": "crash", "rank": 0, "step": None, "attempt": 0,
                    "params": {"op": 10, "when": "after", "event": "open", "path": "ckpt.json", "seq": 25, "nth": 4},
                    "spec": point}],
        "fired": [{"event": "fired", "action": "kill", "op": "open", "when": "after", "ord": 10, "rank": 0}],
        "fault_applied": None, "verdict": "fail", "outcome": outcome, "summary": summary,
        "oracles": {"liveness": {"result": "fail", "summary": summary,
                                 "evidence": {"output_tail": "Traceback (most recent call last):\nValueError: bad"}},
                    "durability": {"result": "pass", "summary": "resumed from its newest checkpoint", "evidence": {}}},
        "replay": f"chaos run --point {point} -- {shlex.join(command)}", "error": None, "seconds": 0.17,
        "attempts": [{"attempt": 0, "outcome": "killed by SIGKILL", "returncodes": [-9], "timed_out": False,
                      "seconds": 0.056, "leftovers": []},
                     {"attempt": 1, "outcome": "exited 1", "returncodes": [1], "timed_out": False, "seconds": 0.11,
                      "leftovers": []}],
        "drift": None, "scenario": {"kind": "job", "job": spec, "point": f"{point}@open:ckpt.json:4"},
    }
    passing = {**copy.deepcopy(failing), "id": "rank0:op1:before", "verdict": "pass", "outcome": "pass",
               "summary": "the job finished after 1 restart(s)", "scenario": {"kind": "job", "job": spec,
                                                                                "point": "rank0:op1:before"}}
    passing["oracles"] = {"liveness": {"result": "pass", "summary": "finished", "evidence": {}}}
    doc = {"schema_version": 1, "summary": {"pass": 1, "fail": 1, "error": 0, "skipped": 0, "total": 2},
           "environment": {"chaos": "0.1.0", "torch": "2.13.0+cpu", "python": "3.11.7", "platform": "Linux",
                           "packages": {}},
           "job": {"spec": spec, "outcomes": {"hard_failure": 1, "pass": 1}, "points_found": 163,
                   "points_chosen": 2, "points_tried": 2, "coverage": 0.0123, "budget_s": None, "seconds": 1.8,
                   "faults": {"asked": "all that apply", "explored": ["kill"], "found": {"kill": 49},
                              "tried": {"kill": 2}},
                   "reference": {"tolerance_mode": False, "notes": [], "untraced_files": []}},
           "scenarios": [failing, passing]}
    return json.loads(json.dumps(doc))  # as read from a file: no part shared with another


def write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def chaos_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def reader_argv(command: str, path: Path, tmp: Path, dry: bool = True) -> list[str]:
    """Each reader as a user runs it on one results file (nothing is ever run or written elsewhere;
    ``dry=False``: a replay as a user types it, for files that are refused before it could run)."""
    return {"report": ["report", str(path), "-o", str(tmp / "r.html")],
            "replay": ["replay", str(path), *(["--dry-run"] if dry else [])],
            "findings": ["findings", str(path)],
            "repro": ["repro", str(path), "--out", str(tmp / "repro-out")]}[command]


def one_error_line(code: int, out: str, err: str, *needles: str) -> str:
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chaos: error: "), err
    assert "Traceback" not in out + err and "harness error" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# -- 4: chaos repro writes code from data -------------------------------------------------

INJECTED = '""";__import__("os").system("touch PWNED");"""'


@pytest.mark.parametrize("field", ["point", "outcome"])
def test_repro_script_keeps_a_hostile_point_id_or_outcome_a_string(tmp_path, capsys, field):
    """An id or outcome that closes the script's docstring: the script still parses to the same
    constants, and running it (``--help``) runs nothing of it."""
    value = f"rank0:op22:torn{INJECTED}" if field == "point" else f"hard_failure{INJECTED}"
    doc = job_doc(tmp_path, **{field: value})
    results = write(tmp_path / "R.json", doc)
    code, out, err = chaos_main(["repro", str(results), "--out", str(tmp_path / "d")], capsys)
    assert code == 0, err
    script = (tmp_path / "d" / "repro.py").read_text()
    tree = ast.parse(script)
    constants = {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)}
    assert constants["POINT" if field == "point" else "EXPECTED"] == value
    assert value not in (ast.get_docstring(tree) or "")
    proc = subprocess.run([sys.executable, str(tmp_path / "d" / "repro.py"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (tmp_path / "PWNED").exists(), "the results file's text ran as code"


def test_every_value_of_the_repro_template_is_a_python_literal():
    """No format field of the template is pasted in as text: each is ``{name!r}``."""
    import string

    from chaos.cli.repro import REPRO_TEMPLATE

    fields = [(name, conv) for _, name, _, conv in string.Formatter().parse(REPRO_TEMPLATE) if name]
    assert fields and all(conv == "r" for _, conv in fields), fields


# -- 5: chaos replay runs what a results file says ----------------------------------------

def _marking_job(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """A job results file whose COMMAND, if anything ran it, would leave MARK behind."""
    mark = tmp_path / "MARK"
    command = [sys.executable, "-c", f"open({str(mark)!r}, 'w').close()", "{out}"]
    return job_doc(tmp_path, command=command), mark


def _replay(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", "replay", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, env=env)


def test_replay_of_a_results_file_from_elsewhere_prints_the_command_and_runs_nothing_without_yes(tmp_path):
    doc, mark = _marking_job(tmp_path)
    results = write(tmp_path / "artifact.json", doc)
    proc = _replay(str(results), cwd=tmp_path)
    assert not mark.exists(), "a results file nobody vouched for ran its COMMAND"
    line = one_error_line(proc.returncode, proc.stdout, proc.stderr, str(results), "--yes",
                          "records no origin")
    assert "not provably yours" in line
    shown = proc.stdout.strip().splitlines()
    assert len(shown) == 1 and shown[0].startswith(f"chaos replay: in {tmp_path}: chaos run ")
    assert shlex.split(shown[0].split(": ", 2)[2])[-4:] == doc["job"]["spec"]["command"]


def test_replay_dry_run_only_prints_and_yes_runs_it(tmp_path):
    doc, mark = _marking_job(tmp_path)
    results = write(tmp_path / "artifact.json", doc)
    dry = _replay(str(results), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "chaos replay: in " in dry.stdout and "--point=rank0:op10:after@open:ckpt.json:4" in dry.stdout
    assert not mark.exists()
    _replay(str(results), "--yes", "--scratch", str(tmp_path), cwd=tmp_path)
    assert mark.exists(), "--yes runs the recorded COMMAND"


def test_replay_of_a_built_in_results_file_does_not_import_its_checkpointer_file_unasked(tmp_path):
    mark = tmp_path / "MARK"
    (tmp_path / "evil.py").write_text(f"open({str(mark)!r}, 'w').close()\nEvil = None\n")
    doc = json.loads(BUILTIN.read_text())
    for sc in doc["scenarios"]:
        sc["checkpointer"] = sc["scenario"]["checkpointer"] = f"{tmp_path / 'evil.py'}:Evil"
    results = write(tmp_path / "artifact.json", doc)
    proc = _replay(str(results), "--scratch", str(tmp_path), cwd=tmp_path)
    assert not mark.exists(), "the recorded checkpointer file was imported"
    one_error_line(proc.returncode, proc.stdout, proc.stderr, "--yes")
    assert f"chaos replay: chaos run --checkpointer {tmp_path / 'evil.py'}:Evil " in proc.stdout


def test_only_results_this_user_wrote_on_this_host_and_left_unchanged_are_ours(tmp_path, monkeypatch):
    from chaos.model import resultschema

    doc = job_doc(tmp_path)
    doc["origin"] = resultschema.origin_record(doc)
    key = resultschema.origin_key_path()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_text().strip() not in json.dumps(doc)
    assert resultschema.not_ours(doc) is None
    edited = copy.deepcopy(doc)
    edited["job"]["spec"]["command"] = ["sh", "-c", "id", "{out}"]
    assert "does not match what it would run" in resultschema.not_ours(edited)
    moved = copy.deepcopy(doc)
    moved["scenarios"][0]["scenario"]["point"] = "rank0:op10:after@open:other:1"
    assert "does not match" in resultschema.not_ours(moved)
    older = {k: v for k, v in doc.items() if k != "origin"}
    assert "records no origin" in resultschema.not_ours(older)
    monkeypatch.setattr(socket, "gethostname", lambda: "another-host")
    assert "written on host" in resultschema.not_ours(doc)


# -- 7: files that are not results, documents of the wrong shape ---------------------------

def _special(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{kind}.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "real-fifo")
        path.symlink_to(tmp_path / "real-fifo")
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    return path


def _limit_memory() -> None:
    """In the child: at most 2 GiB of address space (torch takes ~0.7), so that a reader that reads
    /dev/zero for ever fails with a MemoryError instead of taking the machine's memory."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


# Runs every reader in turn in one interpreter, each printing one JSON line when it returns, so a
# reader that blocks is named by the last line before the timeout (a child per reader cost 2 s each).
_READ_ALL = """
import contextlib, io, json, sys
from chaos.cli.main import main
for argv in json.loads(sys.argv[1]):
    print(json.dumps({"start": argv[0]}), flush=True)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    print(json.dumps({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue()}), flush=True)
"""


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "link-to-dev-zero", "directory"])
def test_a_reader_refuses_what_is_not_a_regular_file_at_once(tmp_path, kind):
    """Each reader, in a child with 2 GiB of address space and 30 s: one error line, never a hang."""
    path = _special(kind, tmp_path)
    argvs = [reader_argv(command, path, tmp_path, dry=False) for command in READERS]
    try:
        proc = subprocess.run([sys.executable, "-c", _READ_ALL, json.dumps(argvs)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired as exc:
        started = [json.loads(ln)["start"] for ln in (exc.stdout or b"").decode().splitlines() if '"start"' in ln]
        pytest.fail(f"chaos {started[-1] if started else '?'} hung on a {kind}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith('{"argv"')]
    assert [d["argv"][0] for d in done] == list(READERS)
    for d in done:
        one_error_line(d["code"], d["out"], d["err"], str(path), "not a regular file")


@pytest.mark.parametrize("command", READERS)
def test_a_200_mb_results_file_is_refused_at_once_in_little_memory(tmp_path, capsys, command):
    path = tmp_path / "huge.json"
    with path.open("wb") as f:  # sparse: no disk used
        f.write(b'{"scenarios": [')
        f.truncate(200 * 2**20)
    tracemalloc.start()
    started = time.monotonic()
    try:
        code, out, err = chaos_main(reader_argv(command, path, tmp_path, dry=False), capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 10
    assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MiB to refuse a 200 MB file"
    one_error_line(code, out, err, str(path), "MiB", "MAX_JSON_BYTES")


@pytest.mark.parametrize("command", READERS)
def test_nesting_too_deep_for_python_is_one_line(tmp_path, capsys, command):
    path = tmp_path / "deep.json"
    path.write_text('{"scenarios": [{"id": "rank0:op1:after", "verdict": "fail", "oracles": {"liveness": '
                    '{"result": "fail", "evidence": ' + "[" * 100_000 + "]" * 100_000 + "}}}]}")
    code, out, err = chaos_main(reader_argv(command, path, tmp_path, dry=False), capsys)
    one_error_line(code, out, err, str(path), "deep")


def _deep_evidence(tmp_path: Path, levels: int) -> Path:
    """A job's results whose failing oracle's evidence is ``levels`` lists deep (``chaos repro`` dumps
    the evidence of a failed oracle into the issue draft, with an indent: a recursive encoder)."""
    doc = job_doc(tmp_path)
    doc["scenarios"][0]["oracles"]["durability"] = {"result": "fail", "summary": "x", "evidence": {"d": "DEEP"}}
    doc["scenarios"][0]["oracles"]["liveness"]["evidence"] = {}
    text = json.dumps(doc).replace('"DEEP"', "[" * levels + "]" * levels)
    path = tmp_path / "R.json"
    path.write_text(text)
    return path


def test_nesting_deeper_than_any_results_is_refused_naming_where(tmp_path, capsys):
    """Python parses 100 levels, and today's readers survive them; but no results file is deeper
    than ~12, and a reader further on that recursed (an encoder, a repr) would not: refused at the
    door, naming where (MAX_JSON_DEPTH)."""
    results = _deep_evidence(tmp_path, 100)
    code, out, err = chaos_main(["repro", str(results), "--out", str(tmp_path / "d")], capsys)
    one_error_line(code, out, err, str(results), "MAX_JSON_DEPTH", "$.scenarios[0].oracles.durability.evidence.d[0]")


def _timeline_not_a_number(doc: dict) -> None:
    doc["scenarios"][0]["timeline"][0]["t"] = "soon"


def _losses_step_a_list(doc: dict) -> None:
    doc["scenarios"][0]["losses"]["0"][0]["step"] = [1]


def _oracles_a_list(doc: dict) -> None:
    doc["scenarios"][0]["oracles"] = ["bit_exact"]


def _scenario_not_an_object(doc: dict) -> None:
    doc["scenarios"][0] = "kill"


def _timeline_event_a_string(doc: dict) -> None:
    doc["scenarios"][0]["timeline"][0] = "start"


# (edit of the built-in fixture, the JSON path the error line must name)
BUILTIN_SHAPES = [
    (_timeline_not_a_number, "$.scenarios[0].timeline[0].t"),
    (_losses_step_a_list, "$.scenarios[0].losses['0'][0].step"),
    (_oracles_a_list, "$.scenarios[0].oracles"),
    (_scenario_not_an_object, "$.scenarios[0]"),
    (_timeline_event_a_string, "$.scenarios[0].timeline[0]"),
]


@pytest.mark.parametrize(("edit", "where"), BUILTIN_SHAPES, ids=[e.__name__ for e, _ in BUILTIN_SHAPES])
@pytest.mark.parametrize("command", ["report", "replay"])
def test_a_wrong_shaped_built_in_document_names_its_wrong_field(tmp_path, capsys, command, edit, where):
    doc = json.loads(BUILTIN.read_text())
    edit(doc)
    path = write(tmp_path / "R.json", doc)
    code, out, err = chaos_main(reader_argv(command, path, tmp_path), capsys)
    one_error_line(code, out, err, f"{path} is not a chaos results JSON: {where} ")


def _command_a_string(doc: dict) -> None:
    doc["job"]["spec"]["command"] = "python train.py --out {out}"


def _id_a_number(doc: dict) -> None:
    doc["scenarios"][0]["id"] = 7


def _applied_what_a_number(doc: dict) -> None:
    doc["scenarios"][0]["faults"][0]["kind"] = "powerloss"
    doc["scenarios"][0]["fault_applied"] = {"what": 7}


def _grace_a_string(doc: dict) -> None:
    doc["scenarios"][0]["faults"][0].update(kind="term", step=3)
    doc["scenarios"][0]["faults"][0]["params"]["grace_s"] = "five"


def _evidence_a_list(doc: dict) -> None:
    doc["scenarios"][0]["oracles"]["liveness"]["evidence"] = ["output_tail"]


def _job_a_list(doc: dict) -> None:
    doc["job"] = ["spec"]


JOB_SHAPES = [
    (_command_a_string, "$.job.spec.command"),
    (_id_a_number, "$.scenarios[0].id"),
    (_applied_what_a_number, "$.scenarios[0].fault_applied.what"),
    (_grace_a_string, "$.scenarios[0].faults[0].params.grace_s"),
    (_evidence_a_list, "$.scenarios[0].oracles.liveness.evidence"),
    (_job_a_list, "$.job"),
]


@pytest.mark.parametrize(("edit", "where"), JOB_SHAPES, ids=[e.__name__ for e, _ in JOB_SHAPES])
@pytest.mark.parametrize("command", READERS)
def test_a_wrong_shaped_job_document_names_its_wrong_field(tmp_path, capsys, command, edit, where):
    doc = job_doc(tmp_path)
    edit(doc)
    path = write(tmp_path / "R.json", doc)
    code, out, err = chaos_main(reader_argv(command, path, tmp_path), capsys)
    one_error_line(code, out, err, f"{path} is not a chaos results JSON: {where} ")


def test_both_writers_documents_pass_the_schema(tmp_path):
    """What the readers accept includes what the harness writes: a real built-in campaign's
    results (the fixture) and a job's, before and after the origin record."""
    from chaos.model.jobspec import JobSpec
    from chaos.model.resultschema import check_results
    from chaos.run.results import job_results_document

    check_results(json.loads(BUILTIN.read_text()), "builtin")
    check_results(json.loads((REPO / "tests" / "fixtures" / "findings_results.json").read_text()), "findings")
    spec = JobSpec(command=("python", "train.py", "--out", "{out}"), cwd=str(tmp_path))
    written = json.loads(json.dumps(job_results_document(spec, None, []), default=str))
    assert check_results(written, "job") == written


# -- 8: control characters, file modes ----------------------------------------------------

def _no_controls(text: str) -> None:
    found = [c for c in CONTROLS if c in text]
    assert not found, f"control characters {found!r} reached the output: {text[:400]!r}"


def test_repro_and_findings_show_a_hostile_summary_escaped(tmp_path, capsys):
    doc = job_doc(tmp_path, summary=f"the resume exited 1: {HOSTILE_TEXT}")
    doc["job"]["spec"]["command"][1] = "trainer.py"
    results = write(tmp_path / "R.json", doc)
    code, out, err = chaos_main(["repro", str(results), "--out", str(tmp_path / "d")], capsys)
    assert code == 0, err
    _no_controls(out + err)
    assert "\\u001b]0;pwned\\u0007" in out  # shown, not acted on
    _no_controls((tmp_path / "d" / "issue.md").read_text())
    code, out, err = chaos_main(["findings", str(results), "--out", str(tmp_path / "f.md")], capsys)
    assert code == 0, err
    _no_controls((tmp_path / "f.md").read_text() + out + err)


def test_replay_prints_a_hostile_command_escaped(tmp_path, capsys):
    doc = job_doc(tmp_path, command=["python", f"train.py{HOSTILE_TEXT}", "--out", "{out}"])
    results = write(tmp_path / "R.json", doc)
    code, out, err = chaos_main(["replay", str(results), "--dry-run"], capsys)
    assert code == 0, err
    _no_controls(out + err)


def test_an_error_line_quoting_a_hostile_value_is_escaped(tmp_path, capsys):
    doc = job_doc(tmp_path)
    path = write(tmp_path / "R.json", doc)
    code, out, err = chaos_main(["repro", str(path), "--point", HOSTILE_TEXT], capsys)
    one_error_line(code, out, err, "has no point")
    _no_controls(err)


def test_the_ci_summary_markdown_escapes_control_characters(tmp_path):
    from reports.summary import append_summary

    doc = job_doc(tmp_path, point=f"rank0:op10:after{HOSTILE_TEXT}", summary=HOSTILE_TEXT)
    append_summary(doc, tmp_path / "summary.md")
    text = (tmp_path / "summary.md").read_text()
    _no_controls(text)
    assert "all points passed" in text  # still there, as text


def test_a_jobs_own_output_reaches_the_terminal_escaped(tmp_path):
    """``chaos run -- COMMAND``: the failing point's line quotes the job's traceback."""
    job = tmp_path / "job.py"
    job.write_text(
        "import json, os, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "p = os.path.join(out, 'ckpt.json')\n"
        "if os.path.exists(p):\n"
        f"    sys.exit({HOSTILE_TEXT!r})\n"
        "for step in range(3):\n"
        "    with open(p, 'w') as f:\n"
        "        f.write(json.dumps({'step': step}))\n")
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--faults", "kill", "--modes", "after",
                           "--scratch", str(tmp_path), "--", sys.executable, str(job), "--out", "{out}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "all points passed" in proc.stdout  # the job's text is shown...
    _no_controls(proc.stdout + proc.stderr)    # ...but not acted on


def test_results_and_reports_are_written_with_the_umasks_mode(tmp_path):
    from reports.html import render_report
    from reports.jsonfile import write_json_atomic
    from reports.junit import write_junit

    doc = json.loads(BUILTIN.read_text())
    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "r.json", doc, indent=1)
        write_junit(doc, tmp_path / "r.xml")
        render_report(doc, tmp_path / "r.html")
        os.umask(0o077)
        write_json_atomic(tmp_path / "private.json", doc)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"r.json": 0o644, "r.xml": 0o644, "r.html": 0o644, "private.json": 0o600}
