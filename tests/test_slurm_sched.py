"""Scheduler faults (#33): ``chaos run --launcher sbatch --faults sched`` on a job Slurm launches.

The unit tests need nothing. The end-to-end ones run the example jobs as real batch jobs
of a private one-node Slurm cluster (``PrivateSlurm``: Debian's ``slurm-wlm`` and
``munge``, root), one cluster for the module under a claimed root, stopped after; they
skip with the reason where that cannot be. After each, Slurm's queue is empty and no
process of the job is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import live_holders

from chaos import scratch
from chaos.cli.main import main
from chaos.errors import ConfigError
from chaos.launch import job as launch
from chaos.launch import sbatch
from chaos.launch.slurmcluster import PrivateSlurm, can_start
from chaos.model.jobspec import JobSpec, Point, parse_point
from chaos.nemesis import family, sched

CAN, WHY = can_start()
real = pytest.mark.skipif(not CAN, reason=f"a private Slurm cluster: {WHY}")
EXAMPLES = Path(__file__).resolve().parents[1] / "chaos" / "examples"


def _job(**kw: Any) -> JobSpec:
    return JobSpec(command=("python", "train.py", "--out", "{out}"), **kw)


# -- the family's points and parameters -------------------------------------------------------

def test_sched_points_parse_and_belong_to_the_sched_family() -> None:
    for text in ("rank0:step5:requeue", "rank0:step5:preempt", "rank1:step3:node", "rank0:op1:requeue"):
        p = parse_point(text)
        assert p.id == text and p.family == "sched" and p.in_rank and p.node is None
    assert parse_point("rank0:step5:node").env() == {"rank": 0, "mode": "node", "op": None, "step": 5}
    fault = parse_point("rank0:step5:preempt").to_fault(grace_s=2.0)
    assert fault["kind"] == "sched" and fault["params"] == {"when": "preempt", "grace_s": 2.0}
    assert family.families()["sched"].scheduler_restarts  # Slurm restarts it: the harness never does


def _traces() -> dict[tuple[int, int], list[dict[str, Any]]]:
    def step(n: int) -> dict[str, Any]:
        return {"event": "phase", "name": "chaos.probe", "info": {"kind": "step", "n": n}}
    ops = [{"event": "op", "op": "open", "ord": 0, "path": "/o/ckpt.json", "rel": "ckpt.json", "mode": "w"},
           {"event": "op", "op": "write", "ord": 1, "path": "/o/ckpt.json", "rel": "ckpt.json"},
           {"event": "op", "op": "open", "ord": 2, "path": "/o/ckpt.json", "rel": "ckpt.json", "mode": "r"}]
    return {(0, 0): [step(1), ops[0], ops[1], step(2), ops[2]]}


def test_sched_points_are_each_step_times_three_modes_and_a_requeue_at_each_open_for_writing() -> None:
    fam = family.families()["sched"]
    ids = [p.id for p in fam.points(_job(launcher="sbatch"), _traces(), None)]
    assert ids == ["rank0:step1:requeue", "rank0:step1:preempt", "rank0:step1:node",
                   "rank0:step2:requeue", "rank0:step2:preempt", "rank0:step2:node", "rank0:op0:requeue"]
    assert fam.points(_job(), _traces(), None) == []  # not launched by Slurm: nothing to strike through it
    assert fam.unavailable(_job()) == "" and fam.unavailable(_job(launcher="sbatch")) is None
    job = _job(launcher="sbatch", grace_s=3.0)
    assert fam.recorded(job, parse_point("rank0:step1:preempt"), 0) == {"grace_s": 3.0}
    assert fam.recorded(job, parse_point("rank0:step1:requeue"), 0) == {}


def test_the_launcher_and_the_families_it_takes_are_checked_in_one_line() -> None:
    cases = [({"faults": ("sched",)}, "--faults sched needs --launcher sbatch"),
             ({"launcher": "sbatch", "faults": ("term",)}, "--faults term with --launcher sbatch: only kill,errno,sched"),
             ({"launcher": "sbatch", "ranks": 2}, "--launcher sbatch with --ranks"),
             ({"launcher": "srun"}, "--launcher 'srun': choose from subprocess, sbatch"),
             ({"sbatch_options": ("--signal=USR1@5",)}, "--sbatch-opt needs --launcher sbatch"),
             ({"launcher": "sbatch", "sbatch_options": ("--output=x",)}, "--sbatch-opt '--output=x'")]
    for kw, said in cases:
        with pytest.raises(ConfigError) as exc:
            _job(**kw)
        assert said in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_an_sbatch_job_replays_and_round_trips() -> None:
    job = _job(launcher="sbatch", faults=("sched", "kill"), sbatch_options=("--signal=B:USR1@30",))
    line = job.replay_command(Point(0, "requeue", step=5))
    assert "--launcher sbatch --sbatch-opt=--signal=B:USR1@30 --point rank0:step5:requeue" in line
    again = JobSpec.from_dict(json.loads(json.dumps(job.to_dict())))
    assert (again.launcher, again.sbatch_options, again.faults) == ("sbatch", job.sbatch_options, job.faults)
    assert "launcher" not in _job().to_dict()  # results of a subprocess run are as before


class _FakeSlurm:
    """The launcher's channel to Slurm, recording each command and refusing those named."""

    def __init__(self, refuse: str = "") -> None:
        self.calls: list[list[str]] = []
        self.refuse = refuse

    def __call__(self, *argv: str) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        bad = bool(self.refuse) and self.refuse in " ".join(argv)
        return subprocess.CompletedProcess(list(argv), 1 if bad else 0, "", "Invalid job id" if bad else "")


def test_each_mode_tells_slurm_what_its_docstring_says() -> None:
    req = {"rank": 0, "step": 5}
    s = _FakeSlurm()
    rec = sched.begin("requeue", "12", "n1", req, s)
    assert s.calls == [["scontrol", "requeue", "12"]] and "pending" not in rec and "error" not in rec
    sched.release(rec, "12", "2026-12-06T15:49:35", s)
    assert s.calls[-1] == ["scontrol", "update", "jobid=12", "StartTime=now"]
    rec["restarts"] = 1
    assert sched.describe(rec) == ("Slurm job 12 requeued at rank 0's step 5 (scontrol requeue 12), held by "
                                   "BeginTime 2026-12-06T15:49:35, moved to now, Restarts=1")
    s = _FakeSlurm()
    rec = sched.begin("preempt", "12", "n1", req, s)
    assert s.calls == [["scancel", "--signal=TERM", "--full", "12"]] and rec["pending"] == "requeue"
    sched.finish(rec, None, s)
    assert s.calls[-1] == ["scontrol", "requeue", "12"] and "pending" not in rec
    s = _FakeSlurm()
    rec = sched.begin("node", "12", "n1", {"rank": 0, "ord": 1, "op": "open", "path": "ckpt.json"}, s)
    assert s.calls == [["scontrol", "update", "nodename=n1", "state=down", "reason=chaos sched point: job 12"]]
    sched.finish(rec, "down*", s)
    assert s.calls[-1] == ["scontrol", "update", "nodename=n1", "state=resume"] and rec["node_resumed"] is True
    assert "at rank 0's event 1 (open of ckpt.json)" in sched.describe(rec)
    rec = sched.begin("requeue", "12", "n1", req, _FakeSlurm(refuse="requeue"))
    assert rec["error"] == "scontrol requeue 12 failed: Invalid job id"
    assert sched.describe(rec).endswith("not done: scontrol requeue 12 failed: Invalid job id")


def test_without_sbatch_on_path_the_launcher_refuses_in_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError) as exc:
        sbatch.check()
    assert str(exc.value).startswith("--launcher sbatch: sbatch, scontrol, scancel, sinfo not on PATH")


# -- end to end, on a private Slurm cluster ---------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSlurm]:
    """One private cluster for the module, its root claimed with the "slurm" clean-up; SLURM_CONF set."""
    if not CAN:
        pytest.skip(f"a private Slurm cluster: {WHY}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(scratch.CLAIMS_ENV, str(tmp_path_factory.mktemp("claims")))
        root = scratch.make_root("chaos-slurm-")
        scratch.claim_cleanup(root, "slurm")
        c = PrivateSlurm(root)
        try:
            c.start()
            mp.setenv("SLURM_CONF", str(c.conf))
            yield c
        finally:
            c.stop()


def _run(cluster: PrivateSlurm, tmp_path: Path, capsys, example: str, *points: str) -> dict[str, dict[str, Any]]:
    """``chaos run --launcher sbatch`` on an example job at ``points``; each point's results entry by id.
    Checks that Slurm's queue is empty afterwards and no process of the job is left."""
    results = tmp_path / "results.json"
    args = ["run", "--launcher", "sbatch", "--faults", "sched,kill", "--result-file", "final.json",
            "--scratch", str(tmp_path), "--json", str(results)]
    for p in points:
        args += ["--point", p]
    main([*args, "--", sys.executable, str(EXAMPLES / example), "--out", "{out}"])
    capsys.readouterr()
    queue = cluster.command("squeue", "-h", "-o", "%i %T").stdout.strip()
    assert queue == "", f"Slurm jobs left: {queue}"
    assert live_holders(str(tmp_path)) == []
    return {s["id"]: s for s in json.loads(results.read_text())["scenarios"]}


@real
@pytest.mark.slow  # nightly: the per-commit run keeps the requeue that catches the careless job
def test_a_careful_job_survives_a_slurm_requeue(cluster, tmp_path, capsys) -> None:
    got = _run(cluster, tmp_path, capsys, "careful_job.py", "rank0:step5:requeue")
    _careful_survives(got, "rank0:step5:requeue")
    assert "Restarts=1" in got["rank0:step5:requeue"]["summary"]


@real
@pytest.mark.slow  # nightly: 9 s more per commit for the same restart by another path
def test_a_careful_job_survives_a_slurm_preemption(cluster, tmp_path, capsys) -> None:
    got = _run(cluster, tmp_path, capsys, "careful_job.py", "rank0:step3:preempt")
    _careful_survives(got, "rank0:step3:preempt")
    preempt = got["rank0:step3:preempt"]["fault_applied"]
    assert [c["argv"][0] for c in preempt["commands"]][:2] == ["scancel", "scontrol"]


def _careful_survives(got: dict[str, dict[str, Any]], pid: str) -> None:
    s = got[pid]
    assert s["verdict"] == "pass", s["summary"]
    fault = s["fault_applied"]
    assert fault["job_id"].isdigit() and fault["restarts"] == 1 and fault["final_state"] == "COMPLETED"
    assert ["scontrol", "requeue", fault["job_id"]] in [c["argv"] for c in fault["commands"]]
    assert s["summary"].startswith(f"Slurm job {fault['job_id']} ")
    assert [a["attempt"] for a in s["attempts"]] == [0, 1]  # Slurm's rerun traced as attempt 1
    assert s["attempts"][0]["returncodes"] == [143]  # the careful job saved on SIGTERM and exited 143
    assert s["attempts"][1]["slurm"]["restart_count"] == 1


@real
def test_a_careless_job_fails_when_slurm_requeues_it_mid_save(cluster, tmp_path, capsys) -> None:
    """Its in-place save truncates ckpt.json first: a requeue right after that open (rank0:op1) leaves
    it empty and Slurm's rerun cannot load it. (A requeue at a step never catches it mid-save: the
    SIGTERM ends it before the save starts.)"""
    mid = _run(cluster, tmp_path, capsys, "careless_job.py", "rank0:op1:requeue")["rank0:op1:requeue"]
    assert mid["verdict"] == "fail" and mid["outcome"] == "hard_failure", mid["summary"]
    assert "JSONDecodeError" in mid["summary"] and "(open of ckpt.json)" in mid["summary"]
    assert mid["fault_applied"]["restarts"] == 1 and [a["attempt"] for a in mid["attempts"]] == [0, 1]


@real
@pytest.mark.slow  # nightly: 16 s more per commit
def test_a_careless_job_survives_a_node_loss_at_a_step_and_a_kill_is_a_new_batch_job(cluster, tmp_path,
                                                                                      capsys) -> None:
    """A node lost at a step, it survives; a kill at a step (the kill family under --launcher sbatch) is
    restarted by the harness as a second batch job."""
    got = _run(cluster, tmp_path, capsys, "careless_job.py", "rank0:step5:node", "rank0:step5:kill")
    node = got["rank0:step5:node"]
    assert node["verdict"] == "pass", node["summary"]
    assert any("state=down" in c["argv"] for c in node["fault_applied"]["commands"])
    assert node["fault_applied"]["restarts"] == 1
    kill = got["rank0:step5:kill"]
    assert kill["verdict"] == "pass", kill["summary"]
    assert [a["returncodes"] for a in kill["attempts"]] == [[-9], [0]]
    ids = [a["slurm"]["job_id"] for a in kill["attempts"]]
    assert len(ids) == 2 and ids[0] != ids[1]  # the harness's restart is a new batch job
    down = cluster.command("sinfo", "-h", "-o", "%T").stdout.split()
    assert down == ["idle"], down  # the node is back in service


@real
def test_an_interrupted_attempt_leaves_no_slurm_job_and_no_process(cluster, tmp_path) -> None:
    """Ctrl-C (``launch.cancel``) while the batch job runs: it is cancelled and waited for, nothing is left."""
    job = JobSpec(command=(sys.executable, "-c", "import time; time.sleep(300)", "{out}"), launcher="sbatch")
    point_dir = tmp_path / "point"
    (point_dir / "out").mkdir(parents=True)
    got: dict[str, Any] = {}

    def attempt() -> None:
        got["outcomes"] = sbatch.run_attempts(job, str(point_dir / "out"), str(point_dir), 0, None, str(point_dir))

    worker = threading.Thread(target=attempt)
    worker.start()
    try:
        started = point_dir / "slurm" / "run-a0.json"  # the batch script runs: Slurm started the job
        until = time.monotonic() + 60
        while not started.exists() and worker.is_alive() and time.monotonic() < until:
            time.sleep(0.05)
        assert started.exists(), "the batch job never started"
        launch.cancel()
        worker.join(timeout=120)
    finally:
        launch.uncancel()
    first = got["outcomes"][0]
    assert first.interrupted and first.slurm["state"] == "CANCELLED" and not first.ok
    assert cluster.command("squeue", "-h", "-o", "%i").stdout.strip() == ""
    assert live_holders(str(tmp_path)) == []
