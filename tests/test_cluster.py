"""The cluster: real rank processes, restarts, warm launches, and nothing left behind."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from chaos.launch import cluster
from chaos.plan.scenario import parse_fault
from chaos.record.history import RunRecord
from chaos.target.workload.config import WorkloadConfig

SMALL = WorkloadConfig(steps=6, save_every=3, d_model=64).to_dict()


def _pids(record):
    return [e["pid"] for a in record.events.values() for evs in a.values() for e in evs if e["ev"] == "start"]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_uninterrupted_runs_are_identical_bit_for_bit(tmp_path):
    records = []
    for name in ("a", "b", "c"):
        seed_cfg = dict(SMALL, seed=1 if name == "c" else 0)
        res = cluster.run(cluster.LaunchPlan(world_size=2, workload=seed_cfg, log_dir=str(tmp_path / name)))
        assert res.completed
        records.append(RunRecord.collect(res, str(tmp_path / name), 2))
    a, b, c = records
    for rank in (0, 1):
        assert a.loss_by_step(rank) == b.loss_by_step(rank)
        assert a.final_fingerprint(rank) == b.final_fingerprint(rank)
        assert a.loss_by_step(rank) != c.loss_by_step(rank), "another seed must give other numbers"
    assert a.final_fingerprint(0)["rng/torch"] != a.final_fingerprint(1)["rng/torch"], "RNG is per rank"


@pytest.fixture
def cluster_forkserver():
    """The cluster's own fork server, its preload included. A process has one fork server, started
    with the preload set when it started: where another test file's helper started it first
    (tests/ckpt_dist.py, in the same xdist worker), ranks fork without the workload preloaded."""
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # the next start (cluster._context) preloads the workload again
    cluster._ctx = None


def test_kill_restarts_from_checkpoint_with_preloaded_torch_and_no_survivors(tmp_path, cluster_forkserver):
    plan = cluster.LaunchPlan(world_size=2, workload=SMALL, log_dir=str(tmp_path / "logs"), checkpointer="torch-save",
                              ckpt_root=str(tmp_path / "ckpt"), faults=[parse_fault("kill:rank=1,step=5")],
                              max_restarts=2)
    res = cluster.run(plan)
    record = RunRecord.collect(res, plan.log_dir, 2)
    assert [a["outcome"] for a in record.attempts] == ["rank_failed", "ok"]
    assert record.attempts[0]["exit_codes"][1] == -signal.SIGKILL
    assert [r["step"] for r in record.resumes(0)] == [0, 3]
    starts = [e for a in record.events.values() for evs in a.values() for e in evs if e["ev"] == "start"]
    assert len(starts) == 4 and all(e["preloaded_torch"] for e in starts), "ranks must not import torch themselves"
    assert not any(_alive(p) for p in _pids(record))


def test_a_stopped_rank_is_detected_and_the_job_still_finishes(tmp_path):
    plan = cluster.LaunchPlan(world_size=2, workload=dict(SMALL, collective_timeout_s=3.0),
                              log_dir=str(tmp_path / "logs"), checkpointer="torch-save",
                              ckpt_root=str(tmp_path / "ckpt"), faults=[parse_fault("stop:rank=0,step=4")],
                              max_restarts=1, hang_timeout_s=6.0)
    res = cluster.run(plan)
    record = RunRecord.collect(res, plan.log_dir, 2)
    assert record.attempts[0]["outcome"] in ("rank_failed", "hang")
    assert record.completed
    assert not any(_alive(p) for p in _pids(record))


def test_restarts_are_bounded(tmp_path):
    faults = [parse_fault(f"kill:rank=0,step=2,attempt={a}") for a in range(3)]
    plan = cluster.LaunchPlan(world_size=2, workload=SMALL, log_dir=str(tmp_path / "logs"), faults=faults,
                              max_restarts=1)
    res = cluster.run(plan)
    assert [a.outcome for a in res.attempts] == ["rank_failed", "rank_failed"]
    assert not res.completed


def _sigint_default() -> None:
    """In the child before exec: SIGINT back to its default, as in a shell at a terminal.

    A test run started in the background by a non-interactive shell (``.ci/run ... &``)
    inherits SIGINT ignored, the child would too, and Python then never turns it into
    KeyboardInterrupt: the run would go on to exit 0, and the test would fail for a
    reason that has nothing to do with the harness.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.chaos
def test_ctrl_c_leaves_no_rank_process(tmp_path):
    """SIGINT to `chaos run` mid-scenario: every rank is gone and the scratch root too."""
    scratch = tmp_path / "scratch"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.cli.main", "run", "--checkpointer", "torch-save", "--steps", "400",
         "--save-every", "50", "--fault", "kill:rank=1,step=399", "--scratch", str(scratch),
         "--cache-dir", str(tmp_path / "cache"), "--no-cache"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    pids: list[int] = []
    deadline = time.time() + 120
    while time.time() < deadline and not pids:
        for log in scratch.glob("chaos-*/golden-logs/*.jsonl"):
            for line in log.read_text().splitlines():
                ev = json.loads(line)
                if ev["ev"] == "step":
                    pids = sorted({json.loads(x)["pid"] for p in scratch.glob("chaos-*/golden-logs/*.jsonl")
                                   for x in p.read_text().splitlines() if '"start"' in x})
                    break
        time.sleep(0.2)
    assert pids, "ranks never started"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], f"rank processes survived Ctrl-C: {pids}"
    assert list(scratch.iterdir()) == [], "scratch root must be removed on Ctrl-C"


def test_a_deep_temp_dir_still_starts_the_fork_server(tmp_path):
    """multiprocessing puts the fork server's Unix socket under TMPDIR; a deep TMPDIR (a CI
    workspace, pytest-xdist's per-worker temp dirs) once failed every launch with "AF_UNIX
    path too long". The socket's folder now goes to a short system temp dir instead, and is
    gone when the harness exits; nothing is left in the deep one but the run's own scratch."""
    deep = tmp_path / ("d" * max(1, 100 - len(str(tmp_path))))
    scratch = deep / "scratch"
    scratch.mkdir(parents=True)
    assert len(str(deep)) + 32 > 107  # the socket's path would not fit under it
    results = tmp_path / "r.json"
    env = dict(os.environ, TMPDIR=str(deep))
    done = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--checkpointer", "reference",
                           "--fault", "rank1:step11:kill", "--scratch", str(scratch), "--json", str(results)],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [scenario] = json.loads(results.read_text())["scenarios"]
    assert scenario["verdict"] == "pass", scenario["error"]
    assert sorted(p.name for p in deep.iterdir()) == ["scratch"]
