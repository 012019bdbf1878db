"""Spare interpreters (chaos/launch/spares.py): started ahead of their attempt, held at the boot
path's gate, used only when the attempt is exactly the one they were started for; never run
the job at the wrong time; change no verdict."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from chaos.launch import job as launch
from chaos.launch import spares
from chaos.model.jobspec import JobSpec
from chaos.run import explore
from faults.process import alive

EXAMPLES = Path(__file__).resolve().parents[1] / "chaos" / "examples"
JOB = """\
import os, sys
print("gate variable seen by the job:", os.environ.get("CHAOS_JOB_GATE"))
out = sys.argv[sys.argv.index("--out") + 1]
with open(os.path.join(out, "ran.txt"), "a") as f:
    f.write(f"{os.getpid()}\\n")
"""


def _job(tmp_path: Path) -> JobSpec:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return JobSpec(command=(sys.executable, str(script), "--out", "{out}"), cwd=str(tmp_path))


def _run_dir(tmp_path: Path) -> tuple[str, str]:
    scratch = tmp_path / "point-00000"
    (scratch / "out").mkdir(parents=True)
    return str(scratch / "out"), str(scratch)


def _spare_pids(scratch: str, attempt: int) -> list[int]:
    spare = spares._spares[(scratch, attempt)]
    return [p.pid for p in spare.procs]


def test_a_spare_that_is_never_taken_never_runs_the_job(tmp_path: Path) -> None:
    job = _job(tmp_path)
    out, scratch = _run_dir(tmp_path)
    assert launch.prestart(job, out, scratch, 0, None, scratch)
    pids = _spare_pids(scratch, 0)
    time.sleep(1.0)  # long enough for the interpreter to reach its gate and, were it not held, the job to run
    assert not os.listdir(out)
    spares.drop(scratch)
    assert not any(alive(p) for p in pids) and not os.listdir(out)
    assert (scratch, 0) not in spares._spares


def test_a_taken_spare_runs_the_job_once_with_the_environment_of_a_plain_launch(tmp_path: Path) -> None:
    job = _job(tmp_path)
    out, scratch = _run_dir(tmp_path)
    assert launch.prestart(job, out, scratch, 0, None, scratch)
    pid = _spare_pids(scratch, 0)[0]
    outcome = launch.run_attempt(job, out, scratch, 0, None, scratch)
    assert outcome.ok and outcome.prestarted
    assert (Path(out) / "ran.txt").read_text().split() == [str(pid)]  # the spare itself ran it, once
    assert "gate variable seen by the job: None" in Path(outcome.logs[0]).read_text()


def test_a_spare_started_for_another_attempt_is_dropped_and_the_attempt_starts_its_own(tmp_path: Path) -> None:
    job = _job(tmp_path)
    out, scratch = _run_dir(tmp_path)
    other = JobSpec(command=(*job.command, "--extra"), cwd=job.cwd)  # another command line: another plan
    assert launch.prestart(other, out, scratch, 0, None, scratch)
    pid = _spare_pids(scratch, 0)[0]
    outcome = launch.run_attempt(job, out, scratch, 0, None, scratch)
    assert outcome.ok and not outcome.prestarted
    ran = (Path(out) / "ran.txt").read_text().split()
    assert len(ran) == 1 and ran[0] != str(pid) and not alive(pid)


def test_no_spare_where_something_other_than_python_would_start_first(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho hi > \"$1/ran.txt\"\n")
    script.chmod(0o755)
    job = JobSpec(command=(str(script), "{out}"), cwd=str(tmp_path))
    out, scratch = _run_dir(tmp_path)
    assert not launch.can_prestart(job)
    assert not launch.prestart(job, out, scratch, 0, None, scratch) and (scratch, 0) not in spares._spares


def test_an_exploration_with_spares_gives_every_point_the_verdict_it_gets_without(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    job = JobSpec(command=(sys.executable, str(EXAMPLES / "careless_job.py"), "--out", "{out}"))
    warm = explore.explore(job, max_points=24, jobs=1, seed=3, scratch_base=str(tmp_path))
    monkeypatch.setattr(launch, "can_prestart", lambda job, lab=None: False)
    cold = explore.explore(job, max_points=24, jobs=1, seed=3, scratch_base=str(tmp_path))
    verdicts = [{r.point.id: (r.verdict.outcome, r.verdict.summary) for r in e.results} for e in (warm, cold)]
    assert len(verdicts[0]) == 24 and verdicts[0] == verdicts[1]
    assert any(v[0] != "pass" for v in verdicts[0].values())  # the careless job's defect, found both ways
    prestarted = [a.prestarted for r in warm.results for a in r.record.attempts if not a.materialized]
    assert len(prestarted) >= 24 and sum(prestarted) >= len(prestarted) - 2  # nearly every attempt that ran was a spare
    assert not any(a.prestarted for r in cold.results for a in r.record.attempts)
    assert not spares._spares and not os.listdir(tmp_path)  # nothing left behind
