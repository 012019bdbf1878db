"""``chaos run -- COMMAND`` end to end on the pure-Python examples: the careless job fails
with the point and its evidence, the careful one passes, a replay reruns exactly one point."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CARELESS = [sys.executable, "chaos/examples/careless_job.py", "--out", "{out}"]
CAREFUL = [sys.executable, "chaos/examples/careful_job.py", "--out", "{out}"]


def chaos_run(*args: str, scratch: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(scratch), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_careless_job_fails_with_the_point_evidence_and_a_replay(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    proc = chaos_run("--result-file", "final.json", "--faults", "kill", "--max-points", "12", "--seed", "0",
                     "--json", str(results), "--", *CARELESS, scratch=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(results.read_text())
    assert doc["schema_version"] == 1 and doc["summary"]["total"] == 12
    assert doc["job"]["points_found"] == 49 and doc["job"]["points_tried"] == 12
    assert doc["job"]["faults"] == {"asked": ["kill"], "explored": ["kill"], "found": {"kill": 49},
                                    "tried": {"kill": 12}}
    failed = [s for s in doc["scenarios"] if s["verdict"] == "fail"]
    assert failed and all(s["outcome"] == "hard_failure" for s in failed)
    first = failed[0]
    assert first["faults"][0]["params"]["path"] == "ckpt.json"
    assert set(first["faults"][0]["params"]) >= {"op", "when", "event", "path", "seq", "nth"}
    assert "JSONDecodeError" in first["oracles"]["liveness"]["summary"]
    assert f"replay: {first['replay']}" in proc.stdout
    assert not [p for p in tmp_path.iterdir() if p.name != "r.json"]  # the scratch root is gone

    replay = shlex.split(first["replay"])
    assert replay[:2] == ["chaos", "run"]
    again = chaos_run(*replay[2:], scratch=tmp_path)
    assert again.returncode == 1
    assert f"HARD_FAILURE {first['id']}" in again.stdout and "coverage 1/49" in again.stdout


def test_the_kill_after_the_truncating_open_is_a_hard_failure(tmp_path: Path) -> None:
    proc = chaos_run("--point", "rank0:op1:after", "--", *CARELESS, scratch=tmp_path)
    assert proc.returncode == 1
    assert "HARD_FAILURE rank0:op1:after (open ckpt.json)" in proc.stdout


def test_careful_job_passes_every_sampled_point(tmp_path: Path) -> None:
    proc = chaos_run("--result-file", "final.json", "--max-points", "16", "--jobs", "2", "--seed", "1",
                     "--", *CAREFUL, scratch=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "16 pass; coverage 16/" in proc.stdout


def test_a_resume_from_an_older_checkpoint_is_lost_work(tmp_path: Path) -> None:
    # The resume command ignores the checkpoint the killed run acknowledged: it starts over.
    resume = shlex.join([sys.executable, "-c", "import runpy, sys, shutil; shutil.rmtree(sys.argv[2]); "
                         "sys.argv = ['careful', '--out', sys.argv[2]]; "
                         "runpy.run_path('chaos/examples/careful_job.py', run_name='__main__')", "--out", "{out}"])
    proc = chaos_run("--resume-cmd", resume, "--point", "rank0:step8:kill", "--", *CAREFUL, scratch=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "LOST_WORK rank0:step8:kill: rank 0 resumed from scratch, but its checkpoint of step 6" in proc.stdout


def test_a_result_that_differs_is_silent_divergence(tmp_path: Path) -> None:
    resume = shlex.join([sys.executable, "-c", "import json, sys; json.dump({'step': 12, 'weights': [0, 0, 0, 0]}, "
                         "open(sys.argv[1] + '/final.json', 'w'))", "{out}"])
    proc = chaos_run("--result-file", "final.json", "--resume-cmd", resume, "--point", "rank0:step4:kill",
                     "--", *CAREFUL, scratch=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "SILENT_DIVERGENCE rank0:step4:kill: final.json: weights[0]: 0, fault-free run" in proc.stdout


def test_a_failing_fault_free_run_is_a_harness_error(tmp_path: Path) -> None:
    proc = chaos_run("--", sys.executable, "-c", "import sys; sys.exit('no data here')", "{out}", scratch=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chaos: harness error: the fault-free run exited 1: no data here")


def test_one_builder_makes_both_targets_documents_and_a_job_run_never_imports_torch(tmp_path: Path) -> None:
    """chaos.run.results builds the built-in's and the job's documents through one function (no
    second module to keep equal), and importing it loads neither the built-in's runner nor torch."""
    from chaos.model.jobspec import JobSpec
    from chaos.run import results

    spec = JobSpec(command=("python", "train.py", "--out", "{out}"), cwd=str(tmp_path))
    job_doc, builtin_doc = results.job_results_document(spec, None, []), results.results_document([])
    assert job_doc["schema_version"] == builtin_doc["schema_version"] == results.SCHEMA_VERSION
    assert job_doc["summary"] == builtin_doc["summary"] == {"pass": 0, "fail": 0, "error": 0, "skipped": 0,
                                                             "total": 0}
    assert set(builtin_doc["environment"]) <= set(job_doc["environment"])
    assert (results.exit_status([]), results.exit_status(["pass", "skipped"]), results.exit_status(["pass", "fail"]),
            results.exit_status(["fail", "error"])) == (0, 0, 1, 2)
    probe = subprocess.run([sys.executable, "-c", "import sys, chaos.run.results; "
                            "print(sorted(m for m in ('torch', 'chaos.run.runner') if m in sys.modules))"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr


def test_a_scratch_directory_that_does_not_exist_is_one_error_line(tmp_path, capsys):
    from chaos.cli import job as cli_job

    code = cli_job.main(["--scratch", str(tmp_path / "nope"), "--", "python", "x.py", "{out}"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"chaos: error: --scratch {tmp_path / 'nope'}: not an existing directory"
    assert not (tmp_path / "nope").exists()
