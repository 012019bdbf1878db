"""``chaos run --executor slurm`` (#33): a job's points run as a real Slurm job array.

A private one-node cluster (``chaos.launch.slurmcluster``: real ``munged``, ``slurmctld``,
``slurmd``) for the module. Each run submits its array with ``--executor-opt=--hold`` where the
test must act on a task before it runs: a watcher cancels chosen tasks (a task lost before
it ran its points, as a preempted or failed node loses it) and releases the rest, so the
retry and the lost points are reached the same way every time, never by timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chaos import scratch
from chaos.launch.slurmcluster import PrivateSlurm, can_start
from chaos.model.resultschema import check_results

CAN, WHY = can_start()
real = pytest.mark.skipif(not CAN, reason=f"a private Slurm cluster: {WHY}")

CARELESS = [sys.executable, "chaos/examples/careless_job.py", "--out", "{out}"]
OPTIONS = ["--max-points", "8", "--seed", "3", "--result-file", "final.json"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A running private cluster, its environment, and a check that nothing of it is queued."""
    claims = tmp_path_factory.mktemp("claims")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(scratch.CLAIMS_ENV, str(claims))
        root = scratch.make_root("chaos-slurm-")  # in the temp dir: munged's socket path must fit in 107 bytes
        scratch.claim_cleanup(root, "slurm")
        cluster = PrivateSlurm(root).start()
        try:
            yield cluster, {**os.environ, **cluster.env()}
        finally:
            cluster.stop()


def _chaos(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _queue(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(array job id, task id, reason) of every task Slurm still holds."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%A|%K|%r"], capture_output=True, text=True, env=env,
                         timeout=30).stdout
    return [tuple(line.split("|")) for line in out.split()]  # type: ignore[misc]


class _Watcher(threading.Thread):
    """Acts on each held array as it is submitted: cancels task ``task`` of the submissions numbered in
    ``cancel`` (0: the first array, 1: its retry), then releases it."""

    def __init__(self, env: dict[str, str], cancel: set[int], task: str = "3") -> None:
        super().__init__(daemon=True)
        self.env, self.cancel, self.task = env, cancel, task
        self.seen: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for array, _task, reason in _queue(self.env):
                if reason != "JobHeldUser" or array in self.seen:
                    continue
                self.seen.append(array)
                if len(self.seen) - 1 in self.cancel:
                    subprocess.run(["scancel", f"{array}_{self.task}"], env=self.env, check=True, timeout=30)
                subprocess.run(["scontrol", "release", array], env=self.env, check=True, timeout=30)
            time.sleep(0.2)


def _held_run(env: dict[str, str], tmp_path: Path, cancel: set[int]) -> subprocess.CompletedProcess[str]:
    """An array run whose submissions a :class:`_Watcher` holds, cancels task 3 of (``cancel``), and releases."""
    watcher = _Watcher(env, cancel=cancel)
    watcher.start()
    try:
        return _chaos(env, "--executor", "slurm", "--jobs", "4", "--executor-opt=--hold", *OPTIONS,
                      "--json", str(tmp_path / "slurm.json"), "--", *CARELESS)
    finally:
        watcher.done.set()
        watcher.join()


def _verdicts(doc: dict) -> list[tuple[str, str, str]]:
    return sorted((s["id"], s["verdict"], s["outcome"]) for s in doc["scenarios"])


@real
def test_an_array_run_gives_the_local_run_s_points_and_verdicts(slurm, tmp_path: Path) -> None:
    _cluster, env = slurm
    local = _chaos(env, "--jobs", "4", *OPTIONS, "--json", str(tmp_path / "local.json"), "--", *CARELESS)
    assert local.returncode == 1, local.stderr  # the careless job fails some points
    array = _chaos(env, "--executor", "slurm", "--jobs", "4", *OPTIONS, "--json", str(tmp_path / "slurm.json"),
                   "--", *CARELESS)
    assert array.returncode == 1, array.stderr
    ours, theirs = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("slurm", "local"))
    assert _verdicts(ours) == _verdicts(theirs)
    assert len(ours["scenarios"]) == 8 and {v for _i, v, _o in _verdicts(ours)} == {"pass", "fail"}
    check_results(ours, "slurm.json")  # the results schema, job.executor included
    executor = ours["job"]["executor"]
    assert executor["kind"] == "slurm" and executor["tasks"] == 4 and len(executor["arrays"]) == 1
    assert executor["retried"] == [] and executor["lost"] == []
    assert "0 pending, 0 running, 4 done; 8/8 point(s) judged" in array.stderr
    # the failing lines and replay commands are those of a local run
    assert [line for line in array.stdout.splitlines() if "replay:" in line] == \
        [line for line in local.stdout.splitlines() if "replay:" in line]
    assert _queue(env) == []


@real
def test_materialized_points_run_in_the_array_as_they_run_here(slurm, tmp_path: Path) -> None:
    """--materialize: each task rebuilds its points' first attempts from the fault-free run in the shared
    scratch root (plan.json's replay_from), and the verdicts are the local run's."""
    _cluster, env = slurm
    runs = {}
    for name, extra in (("local", []), ("slurm", ["--executor", "slurm", "--jobs", "2"])):
        done = _chaos(env, *extra, "--materialize", "--faults", "kill,corrupt", *OPTIONS,
                      "--json", str(tmp_path / f"{name}.json"), "--", *CARELESS)
        assert done.returncode == 1, done.stderr
        runs[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert _verdicts(runs["slurm"]) == _verdicts(runs["local"])
    rebuilt = [s["id"] for s in runs["slurm"]["scenarios"] if s["attempts"] and s["attempts"][0].get("materialized")]
    assert len(rebuilt) >= 4, rebuilt
    assert rebuilt == [s["id"] for s in runs["local"]["scenarios"]
                       if s["attempts"] and s["attempts"][0].get("materialized")]


@real
def test_a_task_lost_before_its_points_is_retried_once_and_the_run_is_the_same(slurm, tmp_path: Path) -> None:
    _cluster, env = slurm
    local = json.loads(_run_local(env, tmp_path))
    array = _held_run(env, tmp_path, cancel={0})
    assert array.returncode == 1, array.stderr
    doc = json.loads((tmp_path / "slurm.json").read_text())
    assert _verdicts(doc) == _verdicts(local)
    assert doc["job"]["executor"]["retried"] == [3] and len(doc["job"]["executor"]["arrays"]) == 2
    assert doc["job"]["executor"]["arrays"][1]["tasks"] == [3]
    assert "task(s) 3 of array job" in array.stderr and "resubmitted once" in array.stderr


@pytest.mark.slow  # per commit: a task lost once and retried
@real
def test_a_task_lost_twice_leaves_its_points_as_lost_errors_never_dropped(slurm, tmp_path: Path) -> None:
    _cluster, env = slurm
    array = _held_run(env, tmp_path, cancel={0, 1})
    assert array.returncode == 2, array.stderr  # an error verdict: the results are not complete
    doc = json.loads((tmp_path / "slurm.json").read_text())
    assert len(doc["scenarios"]) == 8  # every chosen point is in the results
    lost = [s for s in doc["scenarios"] if s["outcome"] == "lost"]
    assert len(lost) == 2  # task 3's share: points 3 and 7 of 8, dealt round-robin over 4 tasks
    assert all(s["verdict"] == "error" and "Slurm array task 3" in s["summary"] and "after a retry" in s["summary"]
               for s in lost)
    assert sorted(doc["job"]["executor"]["lost"]) == sorted(s["id"] for s in lost)
    assert _queue(env) == []


@real
def test_sigterm_cancels_the_array_and_leaves_nothing_queued(slurm, tmp_path: Path) -> None:
    _cluster, env = slurm
    base = tmp_path / "scratch"
    base.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "chaos.cli.main", "run", "--executor", "slurm", "--jobs", "2",
                             "--executor-opt=--hold", "--scratch", str(base), *OPTIONS, "--json",
                             str(tmp_path / "r.json"), "--", *CARELESS], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(reason == "JobHeldUser" for _a, _t, reason in _queue(env)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _queue(env), "the array was never submitted"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "slurm: submitted array job" in err
    assert _queue(env) == []  # the held array was cancelled, not left to run later
    assert list(base.iterdir()) == []  # the scratch root is gone
    assert "interrupted" in err


@pytest.mark.slow  # per commit: the local run's budget (test_job_sampling)
@real
def test_a_budget_spent_before_the_tasks_start_leaves_the_points_out_as_a_local_run_does(slurm, tmp_path: Path) -> None:
    """A point no task started before the --budget ran out is not run, as locally: left out of the
    results, never reported lost (an error) nor retried."""
    _cluster, env = slurm
    runs = {}
    for name, extra in (("local", []), ("slurm", ["--executor", "slurm", "--jobs", "2"])):
        done = _chaos(env, *extra, "--budget", "0.001", *OPTIONS, "--json", str(tmp_path / f"{name}.json"), "--",
                      *CARELESS)
        assert done.returncode == 0, done.stderr
        runs[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert runs["slurm"]["scenarios"] == runs["local"]["scenarios"] == []
    executor = runs["slurm"]["job"]["executor"]
    assert executor["retried"] == [] and executor["lost"] == [] and len(executor["arrays"]) == 1
    assert _queue(env) == []


def test_no_controller_is_one_line_before_any_run(tmp_path: Path) -> None:
    """A SLURM_CONF that names no file (Slurm's clients would retry it for a minute), and one whose
    controller does not answer: each one error line, before the job ran at all."""
    down = tmp_path / "down.conf"  # a controller on a port nothing listens on
    down.write_text("ClusterName=down\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
                    "NodeName=localhost CPUs=1\nPartitionName=p Nodes=localhost\n")
    for conf, said in ((tmp_path / "no-such-slurm.conf", "is not a file"), (down, "no Slurm controller answers")):
        done = _chaos({**os.environ, "SLURM_CONF": str(conf)}, "--executor", "slurm", *OPTIONS, "--", *CARELESS)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("chaos: error: --executor slurm: "), done.stderr
        assert "fault-free" not in done.stdout  # refused before the job ran at all
        assert said in lines[0] or "not on PATH" in lines[0], lines[0]


def test_the_executor_and_the_sbatch_launcher_together_are_one_line(tmp_path: Path) -> None:
    done = _chaos(dict(os.environ), "--executor", "slurm", "--launcher", "sbatch", *OPTIONS, "--", *CARELESS)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "chaos: error: --executor slurm with --launcher sbatch: each array task would submit the job's batch jobs "
        "and wait for them, holding a slot they may need; run one or the other"]
    done = _chaos(dict(os.environ), "--executor-opt=--hold", *OPTIONS, "--", *CARELESS)
    assert done.returncode == 2 and "--executor-opt is for --executor slurm" in done.stderr
    for opt in ("--array=0-99", "hold"):
        done = _chaos(dict(os.environ), "--executor", "slurm", f"--executor-opt={opt}", *OPTIONS, "--", *CARELESS)
        assert done.returncode == 2 and f"--executor-opt {opt!r}: give an sbatch option" in done.stderr


def test_a_task_record_that_is_not_one_is_named(tmp_path: Path) -> None:
    from chaos.run.slurmexec import SlurmError, _read_record

    bad = tmp_path / "00003.json"
    bad.write_text('{"attempts": 3}')
    with pytest.raises(SlurmError, match="00003.json: not a point record"):
        _read_record(bad)
    bad.write_text("{")
    with pytest.raises(SlurmError, match="00003.json: not a point record"):
        _read_record(bad)


def test_a_record_of_another_harness_version_is_named_not_a_traceback(tmp_path: Path) -> None:
    from chaos.model.jobspec import parse_point
    from chaos.run.slurmexec import SlurmError, rebuild

    point = parse_point("rank0:op3:after")
    good = {"attempts": [{"attempt": 0, "argv": ["python"], "returncodes": [-9]}], "applied": None}
    rec = rebuild(point, str(tmp_path), {}, good, tmp_path / "00001.json")
    assert rec.attempts[0].returncodes == [-9] and rec.point == point
    newer = {"attempts": [{"attempt": 0, "argv": ["python"], "returncodes": [0], "gpu_seconds": 3.0}]}
    with pytest.raises(SlurmError, match=r"00002.json: not a point record this harness writes \(TypeError"):
        rebuild(point, str(tmp_path), {}, newer, tmp_path / "00002.json")
    with pytest.raises(SlurmError, match="another version"):
        rebuild(point, str(tmp_path), {}, {"attempts": [{}]}, tmp_path / "00003.json")


def _run_local(env: dict[str, str], tmp_path: Path) -> str:
    done = _chaos(env, "--jobs", "4", *OPTIONS, "--json", str(tmp_path / "local.json"), "--", *CARELESS)
    assert done.returncode == 1, done.stderr
    return (tmp_path / "local.json").read_text()


def test_a_task_on_a_node_without_the_scratch_says_so(tmp_path: Path) -> None:
    """A task whose node does not mount the scratch root (a node-local --scratch) ends in one line that
    says why; the coordinator's 'lost' verdict quotes that line from the task's log."""
    plan = tmp_path / "elsewhere" / "array" / "plan.json"
    done = subprocess.run([sys.executable, "-m", "chaos.run.slurmexec", str(plan)], capture_output=True, text=True,
                          env={**os.environ, "SLURM_ARRAY_TASK_ID": "0"}, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"chaos: error: the plan {plan} cannot be read on {os.uname().nodename} (No such file or directory): "
        "--scratch must be a file system every node mounts at the same path"]


def test_a_task_that_ends_leaves_another_task_s_full_disk_mounted(tmp_path: Path) -> None:
    """Tasks on one node share its mount namespace: a task's cleanup unmounts under its own points
    only. Before, it unmounted the whole exploration root, so a task that finished first took
    another task's tmpfs from under a disk:full point, whose restart then ran on the empty real
    {out} and lost its work (a flaky lost_work through the array, pass locally)."""
    from chaos.run.slurmexec import PLAN, task_main
    from faults import disk

    ok, why = disk.can_mount_tmpfs()
    if not ok:
        pytest.skip(why)
    root = tmp_path / "root"
    other = root / "point-00001" / "out"
    other.mkdir(parents=True)
    (root / "array" / "done").mkdir(parents=True)
    plan = {"job": {"command": ["true", "{out}"]}, "preload_modules": [], "seed": 0, "netlab": False, "deadline": None,
            "points": [{"index": 1, "task": 1, "point": {"rank": 0, "mode": "kill", "step": 1}}]}
    (root / "array" / PLAN).write_text(json.dumps(plan))
    with disk.mounted_tmpfs(str(other), 1 << 20) as info:
        assert disk.mounts_under(str(root)) == [info["path"]]
        assert task_main(str(root / "array" / PLAN), 0) == 0  # task 0 has no point: it ends at once
        assert disk.mounts_under(str(root)) == [info["path"]]  # task 1's disk is still there
    assert disk.mounts_under(str(root)) == []
