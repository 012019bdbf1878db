"""``chaos slurm start | status | stop`` (#33): a private one-node Slurm cluster that runs real jobs
and leaves nothing behind; without root or the daemons it refuses in one line.

Real ``munged``, ``slurmctld`` and ``slurmd`` (Debian's ``slurm-wlm`` and ``munge``); the
tests that need them skip with the reason where they are missing or not root.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import live_holders

from chaos import scratch
from chaos.cli.main import main
from chaos.launch.slurmcluster import BINARIES, DAEMONS, PrivateSlurm, can_start

CAN, WHY = can_start()
real = pytest.mark.skipif(not CAN, reason=f"a private Slurm cluster: {WHY}")


def _chaos(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """``chaos ARGS`` in this process (the CLI's own start-up costs seconds a call)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _claimed_root() -> Path:
    """A root of this test's own, claimed with the "slurm" clean-up: a killed session's cluster is swept.
    In the temp dir, not under ``tmp_path``: munged's socket path must fit in 107 bytes."""
    root = scratch.make_root("chaos-slurm-")
    scratch.claim_cleanup(root, "slurm")
    return Path(root)


@real
def test_start_runs_real_jobs_and_stop_leaves_no_daemon_job_or_file(tmp_path, capsys, claims):
    root = _claimed_root()
    code, out, err = _cli(capsys, "slurm", "start", "--root", str(root))
    try:
        assert code == 0, err
        assert out.splitlines()[0] == f"export SLURM_CONF={root / 'slurm.conf'}"
        cluster = PrivateSlurm(root)
        assert set(cluster.pids()) == set(DAEMONS) and cluster.running()
        marker = tmp_path / "ran"
        done = cluster.command("srun", "--chdir", str(tmp_path), "sh", "-c", f"echo $SLURM_JOB_ID > {marker}",
                               timeout_s=60)
        assert done.returncode == 0, done.stderr
        assert marker.read_text().strip().isdigit()  # the job ran, under Slurm
        held = cluster.command("sbatch", "--parsable", "--chdir", str(root), "--output", "/dev/null",
                               "--wrap", "sleep 300")
        assert held.returncode == 0, held.stderr
        deadline = time.monotonic() + 30
        while "R" not in cluster.command("squeue", "-h", "-o", "%t").stdout.split() and time.monotonic() < deadline:
            time.sleep(0.2)
        code, out, _ = _cli(capsys, "slurm", "status", "--root", str(root))
        assert code == 0 and "running: node" in out and "1 job(s)" in out, out
    finally:
        code, out, err = _cli(capsys, "slurm", "stop", "--root", str(root))
    assert code == 0 and "root removed" in out, out + err
    assert not root.exists()
    assert live_holders(root) == []  # no daemon, no slurmstepd, no job's sleep
    code, out, _ = _cli(capsys, "slurm", "status", "--root", str(root))
    assert code == 0 and "not running" in out


_KILLED_STARTER = """
import sys, time
from chaos import scratch
from chaos.launch.slurmcluster import PrivateSlurm
root = scratch.make_root("chaos-slurm-")
scratch.claim_cleanup(root, "slurm")
cluster = PrivateSlurm(root).start()
cluster.command("sbatch", "--output", "/dev/null", "--chdir", root, "--wrap", "sleep 300")
print(root, flush=True)
time.sleep(120)
"""


@real
def test_the_cluster_of_a_sigkilled_starter_is_swept(tmp_path, claims):
    """``chaos clean`` after a test session was SIGKILLed: its cluster (daemons, job, files) is gone."""
    p = subprocess.Popen([sys.executable, "-c", _KILLED_STARTER], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        root = Path(p.stdout.readline().strip())
        assert str(root) != ".", p.stderr.read() if p.stderr else ""
        assert set(PrivateSlurm(root).pids()) == set(DAEMONS)
        p.kill()
        p.wait(timeout=30)
        assert set(PrivateSlurm(root).pids()) == set(DAEMONS), "the daemons went with their starter: nothing to test"
        swept = scratch.sweep()
        assert [s.pid for s in swept] == [p.pid] and not swept[0].refused, swept
        assert swept[0].stopped == [f"slurm {root}"]
        assert not root.exists() and live_holders(root) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        PrivateSlurm(tmp_path / "never").stop()  # nothing there: a no-op


def test_without_the_daemons_start_refuses_in_one_line(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing of slurm-wlm or munge found
    done = _chaos("slurm", "start", "--root", str(tmp_path / "slurm"), env=env)
    assert done.returncode == 2 and done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith("chaos: error: cannot start a Slurm cluster: ")
    assert ("not installed: " + ", ".join(BINARIES)) in line or "needs root" in line, line
    assert not (tmp_path / "slurm").exists()


def test_a_root_too_long_for_the_munge_socket_is_refused_in_one_line(tmp_path, capsys):
    root = tmp_path / ("x" * 100)
    code, out, err = _cli(capsys, "slurm", "start", "--root", str(root))
    if not CAN:
        assert code == 2 and WHY in err
        return
    assert code == 2 and out == "" and "too long for munged's socket path" in err and "\n" not in err.strip()
    assert not root.exists()


def test_without_root_start_refuses(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ok, why = can_start()
    assert not ok and why == "starting slurmctld, slurmd and munged needs root"
