"""The ``stop`` family of ``chaos run -- COMMAND``: one process of the job hangs (SIGSTOP).

Unit tests for the points (both spellings, where the family offers them, when it is
explored) and for the launcher's test that nothing of an attempt can run any more, on
real stopped processes. Then real jobs through the CLI:

- two pure-Python ranks, rank 0 committing a checkpoint once rank 1's shard file merely
  *exists*: rank 1 hung right after the first write of its shard lets rank 0 commit a
  torn shard (the restart fails), where a kill at the same event passes — the launcher
  stops every copy the moment rank 1 dies, before rank 0 gets there. This is what a stop
  finds and a kill cannot;
- one process hung at a step: the attempt ends at once (every process of it is stopped,
  nothing is waited for) and the restart resumes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from jobcli import CAREFUL, EAGER, REPO, run_json

from chaos.errors import ConfigError
from chaos.model.contract import DEFAULT_STOP_SILENCE_S
from chaos.model.jobspec import JobSpec, parse_point
from chaos.nemesis import stop
from chaos.nemesis.family import families
from chaos.plan.pointset import kinds_to_explore
from faults import network


def test_a_stop_point_reads_in_both_spellings_and_is_its_own_family() -> None:
    at_step = parse_point("rank1:step6:stop")
    assert (at_step.family, at_step.rank, at_step.step, at_step.id) == ("stop", 1, 6, "rank1:step6:stop")
    assert parse_point("stop:rank=1,step=6") == at_step  # the built-in fault's spelling (chaos run --as-job)
    at_event = parse_point("rank0:op17:stop")
    assert (at_event.family, at_event.op) == ("stop", 17)
    assert at_event.to_fault()["kind"] == "stop" and "when" not in at_event.to_fault()["params"]
    with pytest.raises(ConfigError, match="not 'grace'"):
        parse_point("stop:rank=1,step=6,grace=2")  # a hang has no grace
    at_phase = parse_point("rank1:step6:stop,phase=write_shards")
    assert (at_phase.mode, at_phase.phase, at_phase.id) == ("stop", "write_shards", "rank1:step6:stop,phase=write_shards")
    assert parse_point("stop:rank=1,step=6,phase=write_shards") == at_phase
    assert parse_point("netdrop:rank=1,step=6,phase=write_shards").id == "rank1:step6:net,phase=write_shards"
    with pytest.raises(ConfigError, match="with at most grace, linger"):
        parse_point("rank1:step6:term,phase=write_shards")  # a SIGTERM is the launcher's, not at a phase


def test_hangs_are_explored_only_when_asked_for_and_never_on_simulated_nodes() -> None:
    job = JobSpec(command=(sys.executable, "job.py", "{out}"))
    assert "stop" not in kinds_to_explore(job)[0]
    assert not any("stop" in note or "hang" in note for note in kinds_to_explore(job)[1])
    assert "stop" in kinds_to_explore(JobSpec(command=job.command, faults=("stop",)))[0]
    with pytest.raises(ConfigError, match="--faults stop with --nodes"):
        JobSpec(command=("torchrun", "--nproc-per-node=1", "job.py", "{out}"), nodes=2, faults=("stop",))
    with pytest.raises(ConfigError, match="--launcher sbatch"):
        JobSpec(command=job.command, launcher="sbatch", faults=("stop",))


def _op(rank: int, ord_: int, op: str, rel: str) -> dict:
    return {"event": "op", "op": op, "ord": ord_, "rel": rel, "path": f"/o/{rel}", "rank": rank}


def _step(n: int) -> dict:
    return {"event": "phase", "name": "chaos.probe", "info": {"kind": "step", "n": n}}


def test_the_points_are_a_hang_in_the_middle_of_each_save_and_at_each_step() -> None:
    traces = {(0, 0): [_step(1), _op(0, 0, "open", "ckpt.tmp"), _op(0, 1, "write", "ckpt.tmp"),
                       _op(0, 2, "write", "ckpt.tmp"), _op(0, 3, "close", "ckpt.tmp"),
                       _op(0, 4, "rename", "ckpt"), _step(2)]}
    job = JobSpec(command=(sys.executable, "job.py", "{out}"), faults=("stop",))
    points = families()["stop"].points(job, traces, None)
    assert [p.id for p in points] == ["rank0:op1:stop", "rank0:op4:stop", "rank0:step1:stop", "rank0:step2:stop"]
    assert families()["stop"].recorded(job, points[0], 0) == {"silence_s": DEFAULT_STOP_SILENCE_S}


def test_frozen_means_the_stopped_process_and_everything_else_of_the_attempt_is_stopped() -> None:
    # a session of two: the shell (the copy, its session's leader) and a sleep it started
    copy = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (children := _children(copy.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        [child] = children
        os.kill(child, signal.SIGSTOP)
        _wait_state(child, "T")
        assert not stop.frozen(child, [copy.pid], "no-such-mark"), "the copy itself can still run"
        os.kill(copy.pid, signal.SIGSTOP)
        _wait_state(copy.pid, "T")
        assert stop.frozen(child, [copy.pid], "no-such-mark")
        assert not stop.frozen(None, [copy.pid], "no-such-mark")  # no stopped process named: never frozen
        os.kill(child, signal.SIGCONT)
        _wait_state(child, "S")
        assert not stop.frozen(child, [copy.pid], "no-such-mark")  # the named process runs again
    finally:
        os.killpg(copy.pid, signal.SIGKILL)
        copy.wait()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rfind(b")") + 2:].split()[1]) == pid:
                found.append(int(entry))
    return found


def _wait_state(pid: int, state: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        if stat[stat.rfind(b")") + 2:][:1].decode() == state:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached state {state}")


def test_a_hung_rank_lets_its_peer_commit_a_torn_shard_where_a_kill_is_caught(tmp_path: Path) -> None:
    script = tmp_path / "eager.py"
    script.write_text(textwrap.dedent(EAGER))
    at = "@write:ckpt-6-shard1.json:1"  # rank 1's first write of its shard of step 6
    proc, doc = run_json(tmp_path, "--ranks", "2", "--hang-timeout", "2", "--result-file", "final-*.json",
                       "--point", f"rank1:op0:stop{at}", "--point", f"rank1:op0:after{at}", "--",
                       sys.executable, str(script), "{out}")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    by_id = {s["id"]: s for s in doc["scenarios"]}
    hung, killed = by_id["rank1:op0:stop"], by_id["rank1:op0:after"]
    assert killed["outcome"] == "pass", killed["summary"]
    assert hung["outcome"] == "hard_failure", hung["summary"]
    assert "JSONDecodeError" in hung["summary"]
    first = hung["attempts"][0]["stop"]
    assert first["rank"] == 1 and first["op"] == "write" and first["ended"] == "silent" and first["silence_s"] == 2.0
    assert {c["copy"]: c["ended"] for c in first["copies"]} == {0: "killed", 1: "killed"}
    assert hung["summary"].startswith("rank 1 stopped (SIGSTOP) right after its event ")
    assert hung["faults"][0]["kind"] == "stop" and hung["fired"][0]["action"] == "stop"
    assert "the checkpoint is committed while a hung rank's ckpt-*-shard*.json is unfinished" in proc.stdout
    assert f"--point rank1:op0:stop{at}" in hung["replay"]


def test_a_hang_at_a_phase_the_job_announces_lands_there_and_an_unknown_phase_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "eager.py"
    script.write_text(textwrap.dedent(EAGER))
    common = ("--ranks", "2", "--hang-timeout", "2", "--result-file", "final-*.json")
    proc, doc = run_json(tmp_path, *common, "--point", "rank1:step6:stop,phase=shard_half", "--", sys.executable,
                       str(script), "{out}")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    [point] = doc["scenarios"]
    assert point["id"] == "rank1:step6:stop,phase=shard_half" and point["outcome"] == "hard_failure", point["summary"]
    assert point["summary"].startswith("rank 1 stopped (SIGSTOP) at its step 6, in the shard_half phase of its save: ")
    assert point["attempts"][0]["stop"]["phase"] == "shard_half"
    assert "--point 'rank1:step6:stop,phase=shard_half'" in point["replay"] or \
        "--point rank1:step6:stop,phase=shard_half" in point["replay"], point["replay"]
    refused = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), *common,
                              "--point", "rank1:step6:stop,phase=nope", "--", sys.executable, str(script), "{out}"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "announced no phase 'nope' of step 6" in refused.stderr, refused.stderr
    assert "shard_half" in refused.stderr and "Traceback" not in refused.stderr


def test_one_hung_process_ends_its_attempt_at_once_and_the_job_resumes(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", "rank0:step5:stop", "--",
                       sys.executable, str(CAREFUL), "--out", "{out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [point] = doc["scenarios"]
    assert point["outcome"] == "pass" and len(point["attempts"]) == 2, point["summary"]
    first = point["attempts"][0]
    assert first["stop"]["ended"] == "frozen", first  # nothing was left to run: no silence waited out
    assert first["stop"]["step_n"] == 5 and first["returncodes"] == [-signal.SIGKILL]
    assert "nothing of the job could go on (every process stopped)" in point["summary"]


@pytest.mark.slow  # two torch ranks, three runs: 25 s
def test_the_built_in_hung_rank_runs_as_a_job_and_its_peer_refuses_to_acknowledge(tmp_path: Path) -> None:
    # the built-in spelling through the job pipeline (chaos run --as-job): rank 1 frozen at step 10, rank 0's
    # save times out in its collective, and the reference checkpointer acknowledges nothing of step 10
    proc, doc = run_json(tmp_path, "--as-job", "--fault", "stop:rank=1,step=10", "--workload",
                       "collective_timeout_s=4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [point] = doc["scenarios"]
    assert point["id"] == "rank1:step10:stop" and point["outcome"] == "pass", point["summary"]
    first = point["attempts"][0]["stop"]
    assert first["ended"] == "failed", first  # rank 0 gave up by itself, long before the 60 s silence
    copy0 = first["copies"][0]
    assert copy0["ended"] == "exited" and copy0["returncode"] == 1 and "nothing acknowledged" in copy0["cause"]
    assert "resumed at or after the newest complete checkpoint: rank 0 at step 5" in point["summary"]


@pytest.mark.slow  # two torch ranks, two points: 50 s
def test_the_built_in_faults_at_a_phase_of_the_reference_s_save_run_as_a_job(tmp_path: Path) -> None:
    # the built-in docs' spellings through --as-job: a hang in write_shards, a network cut in the vote
    proc, doc = run_json(tmp_path, "--as-job", "--fault", "rank1:step10:stop,phase=write_shards", "--fault",
                       "rank1:step15:net,phase=vote", "--workload", "collective_timeout_s=4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    by_id = {s["id"]: s for s in doc["scenarios"]}
    hung = by_id["rank1:step10:stop,phase=write_shards"]
    assert hung["outcome"] == "pass" and "in the write_shards phase of its save" in hung["summary"], hung["summary"]
    assert "nothing acknowledged" in hung["attempts"][0]["stop"]["copies"][0]["cause"]
    cut = by_id["rank1:step15:net,phase=vote"]
    if os.geteuid() == 0 and network.can_use_netns()[0]:
        assert cut["outcome"] in ("pass", "no_effect"), cut["summary"]
        assert cut["summary"].startswith("rank 1's link down at its step 15, in the vote phase of its save, ")
    else:  # without network namespaces the cut cannot be made: skipped with the reason, never passed
        assert cut["outcome"] == "unsupported", cut["summary"]
