"""``chaos run --hang-timeout S -- COMMAND``: a job silent for S seconds is stopped as hung.

The watcher is checked on real files with the clock passed in (no sleeping); then a real
job with a classic deadlock, a lock file a killed run leaves behind that its resume waits
on forever, is judged through the CLI: its liveness fails as a hang long before the
attempt's ``--timeout``, while the same job with room between its outputs passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaos.errors import ConfigError
from chaos.launch.silence import POLL_S, Silence
from chaos.model.jobspec import JobSpec

REPO = Path(__file__).resolve().parent.parent

# Takes {out}/lock with O_EXCL and waits (silently) while another run holds it; prints "step N"
# a step; saves its step in place; removes the lock at the end. A run killed mid-way leaves
# the lock, and its resume waits forever: the bug --hang-timeout exists to name.
STALE_LOCK = """
    import os, sys, time
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    lock = os.path.join(out, "lock")
    while True:
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            time.sleep(0.05)
    ckpt = os.path.join(out, "step")
    start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    for step in range(start + 1, 6):
        time.sleep(float(sys.argv[2]))
        print(f"step {step}", flush=True)
        with open(ckpt, "w") as f:
            f.write(str(step))
    with open(os.path.join(out, "final.txt"), "w") as f:
        f.write("done")
    os.unlink(lock)
"""


def _op(f, **rec: object) -> None:
    f.write(json.dumps({"event": "op", **rec}, separators=(",", ":")) + "\n")
    f.flush()


def test_signs_of_life_reset_the_count_and_silence_trips_at_the_limit(tmp_path: Path) -> None:
    trace, log = tmp_path / "trace", tmp_path / "copy0.log"
    trace.mkdir()
    log.write_bytes(b"")
    quiet = Silence(2.0, str(trace), [str(log)], now=100.0)
    assert quiet.hung(100.0 + POLL_S) is None
    with open(trace / "trace-r0-a0-p1.jsonl", "w") as f:
        _op(f, op="write", path="/o/ckpt", length=4)  # a file event that changed something
        assert quiet.hung(101.9) is None  # seen: silence counts from 101.9
        assert quiet.hung(103.8) is None  # 1.9 s of silence
        log.write_bytes(b"step 1\n")  # a line of output
        assert quiet.hung(103.9) is None  # looked at less than POLL_S ago: not looked at again
        assert quiet.hung(104.1) is None  # seen: silence counts from 104.1
        assert quiet.hung(106.0) is None
        assert quiet.hung(106.3) == pytest.approx(2.2)
        quiet.resume(106.4)  # a harness hold ended: its stillness is not the job's
        assert quiet.hung(107.0) is None
        assert quiet.hung(108.5) == pytest.approx(2.1)
        f.write('{"event":"phase","name":"chaos.probe","info":{"kind":"step","n":2}}\n')
        f.flush()
        assert quiet.hung(108.8) is None  # a phase (here the probe's) is progress


def test_polling_that_fails_or_only_reads_is_no_sign_of_life(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    trace.mkdir()
    quiet = Silence(1.0, str(trace), [], now=0.0)
    with open(trace / "trace-r0-a1-p2.jsonl", "w") as f:
        for i in range(1, 5):  # a resume waiting on a lock the killed run left, and on a status file
            _op(f, op="open", path="/o/lock", flags=["wronly", "creat", "excl"], error=17)
            _op(f, op="open", path="/o/status", created=False, trunc=False)
            f.write('{"event":"read","path":"/o/status"}\n')
            _op(f, op="close", path="/o/status")
            f.write('{"event":"op","op":"wri')  # a line still being written is not read yet
            f.flush()
            result = quiet.hung(i * 0.3)
        assert result == pytest.approx(1.2)
        f.write('te","path":"/o/x"}\n')  # the line completed: a write
        f.flush()
        assert quiet.hung(1.5) is None


def test_a_look_more_often_than_the_poll_interval_reads_nothing(tmp_path: Path) -> None:
    quiet = Silence(0.1, str(tmp_path / "absent"), [], now=0.0)
    assert quiet.hung(POLL_S / 2) is None  # not looked at yet, though past the limit
    assert quiet.hung(POLL_S) == pytest.approx(POLL_S)  # nothing to see anywhere: silent since the start


def test_a_hang_timeout_that_is_not_positive_or_given_to_slurm_is_refused() -> None:
    with pytest.raises(ConfigError, match="--hang-timeout must be a positive number of seconds, got 0"):
        JobSpec(command=("python", "j.py", "{out}"), hang_timeout_s=0.0)
    with pytest.raises(ConfigError, match="--hang-timeout with --launcher sbatch"):
        JobSpec(command=("python", "j.py", "{out}"), hang_timeout_s=5.0, launcher="sbatch")


def test_the_hang_timeout_is_recorded_and_replayed() -> None:
    job = JobSpec(command=("python", "j.py", "{out}"), hang_timeout_s=7.5)
    assert "--hang-timeout 7.5" in job.replay_command()
    assert JobSpec.from_dict(json.loads(json.dumps(job.to_dict()))).hang_timeout_s == 7.5
    assert "hang_timeout_s" not in JobSpec(command=("python", "j.py", "{out}")).to_dict()


def _run(tmp_path: Path, pause: str, *options: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    script = tmp_path / "stale_lock.py"
    script.write_text(textwrap.dedent(STALE_LOCK))
    results = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--json",
                           str(results), "--result-file", "final.txt", "--step-regex", r"step (\d+)",
                           "--timeout", "120", *options, "--", sys.executable, str(script), "{out}", pause],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(results.read_text())


def test_a_resume_stuck_on_a_lock_the_killed_run_left_is_judged_hung(tmp_path: Path) -> None:
    proc, doc = _run(tmp_path, "0.05", "--hang-timeout", "2", "--point", "rank0:step2:kill")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    [point] = doc["scenarios"]
    assert point["verdict"] == "fail"
    liveness = point["oracles"]["liveness"]
    assert liveness["result"] == "fail"
    assert "hung: no output, traced file event or probe call for 2 s" in liveness["summary"]
    resume = point["attempts"][-1]
    assert resume["attempt"] == 1 and resume["hung_s"] == 2.0 and resume["timed_out"] is False
    assert "--hang-timeout 2.0" in point["replay"]


def test_a_job_whose_outputs_come_closer_together_than_the_limit_is_not_hung(tmp_path: Path) -> None:
    # 3 s of steps 0.6 s apart under a 2 s limit: the two fault-free runs must finish (a false hang there
    # is a harness error, exit 2, no results), and the point's attempt ends by its kill, not as a hang
    proc, doc = _run(tmp_path, "0.6", "--hang-timeout", "2", "--point", "rank0:step4:kill", "--max-restarts", "0")
    [point] = doc["scenarios"]
    [first] = point["attempts"]
    assert "hung_s" not in first and "killed by SIGKILL" in first["outcome"], first
    assert point["fired"] and point["fired"][0]["op"] == "step", point["fired"]
