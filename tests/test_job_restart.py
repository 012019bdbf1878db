"""``restart``: the engine restarts a rank's container in place (``chaos.nemesis.restart``), the built-in
``restart:rank=R,step=S`` for a job run with ``--launcher docker``.

The grammar, the refusals and the family's points need no engine. On the session's private
``dockerd`` (``docker_engine``): a job whose command line starts afresh unless given ``--resume``
loses its checkpoint when the engine reruns that command line (its in-place restart traced as a
restart of its own, ``IN_PLACE_BASE``), and the job that always resumes passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaos.launch.drivers import engine
from chaos.model.contract import IN_PLACE_BASE
from chaos.model.grammar import parse_point
from chaos.model.jobspec import JobSpec
from chaos.nemesis import restart
from chaos.nemesis.family import families

REPO = Path(__file__).resolve().parent.parent

# Counts steps 1..5, its step in {out}/step.txt (a temp file renamed over it), "done" at the end. Started
# without --resume it is a fresh run and removes step.txt first, unless "careful" says always resume.
STEP_JOB = """
    import os, sys, time
    out = sys.argv[1]
    saved = os.path.join(out, "step.txt")
    if "--resume" not in sys.argv and "careful" not in sys.argv and os.path.exists(saved):
        os.remove(saved)  # a fresh run: what a restart policy rerunning this command line gets
    start = int(open(saved).read()) + 1 if os.path.exists(saved) else 1
    for step in range(start, 6):
        print(f"step {step}", flush=True)
        with open(saved + ".tmp", "w") as f:
            f.write(str(step))
            f.flush()
            os.fsync(f.fileno())
        os.replace(saved + ".tmp", saved)
        time.sleep(0.3)
    with open(os.path.join(out, "final.txt"), "w") as f:
        f.write("done")
"""


def test_a_restart_reads_in_both_spellings_with_its_settings() -> None:
    point = parse_point("restart:rank=1,step=4,timeout=2")
    assert point == parse_point("rank1:step4:restart,timeout=2") and point.family == "restart"
    assert (point.id, restart.timeout_s(point)) == ("rank1:step4:restart,timeout=2", 2.0)
    assert point.to_fault()["kind"] == "restart" and point.to_fault()["params"]["timeout"] == 2
    phased = parse_point("restart:rank=0,step=3,phase=vote")
    assert (phased.phase, restart.timeout_s(phased), parse_point(phased.id)) == ("vote", 0.0, phased)
    assert parse_point("rank0:step3:restart").id == "rank0:step3:restart"


def test_only_docker_jobs_take_or_offer_a_restart() -> None:
    point = parse_point("rank0:step3:restart")
    plain = JobSpec(("python", "job.py", "{out}"))
    docker = JobSpec(("python", "job.py", "{out}"), launcher="docker")
    assert "needs --launcher docker" in (restart.refusal(plain, point) or "")
    assert restart.refusal(docker, point) is None and restart.refusal(plain, parse_point("rank0:step3:kill")) is None
    traces = {(0, 0): [{"event": "phase", "name": "chaos.probe", "info": {"kind": "step", "n": n}} for n in (1, 2)]}
    fam = families()["restart"]
    assert [p.id for p in fam.points(docker, traces, None)] == ["rank0:step1:restart", "rank0:step2:restart"]
    assert fam.points(plain, traces, None) == []
    assert "needs --launcher docker" in fam.explains(plain, traces, None, [])[0]  # type: ignore[arg-type]


def test_a_restart_point_without_docker_is_refused_before_any_run(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--point",
                           "restart:rank=0,step=2", "--", sys.executable, "job.py", "{out}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "needs --launcher docker" in proc.stderr, proc.stderr
    assert not any(tmp_path.rglob("golden-0"))


def test_the_verdict_line_says_what_the_engine_did() -> None:
    line = restart.describe({"rank": 1, "step_n": 6, "timeout_s": 2.0})
    assert line.startswith("rank 1's container restarted in place by the engine at its step 6 (SIGTERM, SIGKILL "
                           "after 2 s"), line


def _restart_run(tmp_path: Path, job: Path, *extra: str) -> dict:
    tmp_path.mkdir()
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--launcher", "docker", "--point",
                           "restart:rank=0,step=3", "--step-regex", r"step (\d+)", "--result-file", "final.txt",
                           "--resume-cmd", f"{sys.executable} {job} {{out}} --resume", "--scratch", str(tmp_path),
                           "--keep", "--json", str(out), "--", sys.executable, str(job), "{out}", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_container_restarted_in_place_reruns_the_first_command_line_and_loses_the_checkpoint(
        docker_engine, tmp_path: Path) -> None:
    job = tmp_path / "step_job.py"
    job.write_text(textwrap.dedent(STEP_JOB))
    (fresh,) = _restart_run(tmp_path / "fresh", job)["scenarios"]
    assert fresh["verdict"] == "fail" and fresh["outcome"] == "lost_work", fresh["summary"]
    assert fresh["summary"].startswith("rank 0's container restarted in place by the engine at its step 3 (SIGKILL")
    first = fresh["oracles"]["liveness"]["evidence"]["attempts"][0]
    record = first["restart"]
    assert record["container"] == first["containers"][0] and record["started_at"] != record["started_at_before"]
    assert first["returncodes"] == [0]  # the client stayed attached to the restarted container, which finished
    live = fresh["oracles"]["liveness"]
    assert live["summary"] == "the job finished after 0 restart(s) and 1 in place (its container restarted by the engine)"
    durable = fresh["oracles"]["durability"]
    assert durable["evidence"]["ranks"]["0"]["newest_complete"] == 2, durable
    assert durable["evidence"]["ranks"]["0"]["resumed_at"] == 1, durable
    traces = sorted(p.name for p in (tmp_path / "fresh").glob("chaos-job-*/point-*/trace/trace-r0-a*.jsonl"))
    assert any(f"-a{IN_PLACE_BASE}-" in t for t in traces), traces  # the restarted process: a restart of its own
    (careful,) = _restart_run(tmp_path / "careful", job, "careful")["scenarios"]
    assert careful["verdict"] == "pass", careful["summary"]
    assert careful["oracles"]["durability"]["evidence"]["ranks"]["0"]["resumed_at"] >= 2
    assert _ours(docker_engine.client()) == []


def _ours(client) -> list[str]:
    """Job containers still on the engine (every one is removed with its attempt)."""
    return [c["Names"][0] for c in client.api.containers(all=True, filters={"label": f"{engine.LABEL}=job"})]


@pytest.mark.slow
def test_the_built_in_restart_fault_runs_as_a_job_in_containers(docker_engine, tmp_path: Path) -> None:
    """``chaos run --as-job --driver docker --fault restart:rank=1,step=6``: the workload's rank 1 comes back
    in its container while rank 0 trains on; rank 0's collective fails, the job restarts from step 5."""
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--as-job", "--driver", "docker",
                           "--fault", "restart:rank=1,step=6", "--scratch", str(tmp_path), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (point,) = json.loads(out.read_text())["scenarios"]
    assert point["id"] == "rank1:step6:restart" and point["verdict"] == "pass", point["summary"]
    first, *rest = point["oracles"]["liveness"]["evidence"]["attempts"]
    assert first["restart"]["rank"] == 1 and first["restart"]["pid"] != first["restart"]["pid_before"]
    assert first["returncodes"][0] not in (0, None) and rest and rest[-1]["returncodes"] == [0, 0]
    assert point["faults"][0]["kind"] == "restart"
    assert _ours(docker_engine.client()) == []


@pytest.mark.parametrize(("timeout", "engine_s"), [("0", 0.0), ("1", 1.0), ("0.5", 1.0)])
def test_the_engine_s_restart_record_carries_its_grace_in_whole_seconds(timeout: str, engine_s: float) -> None:
    point = parse_point(f"rank0:step3:restart,timeout={timeout}")
    assert families()["restart"].recorded(JobSpec(("x", "{out}"), launcher="docker"), point, 0) == \
        {"timeout_s": engine_s}
