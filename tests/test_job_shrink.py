"""A kill with ``lost=true`` in a user's job: the rank is lost for good and the restarts run on one
rank fewer (``chaos.nemesis.shrink``), judged against the fault-free resize from the checkpoint the
restart resumed at.

The job below keeps a vector of 12 values split across its ranks; every 3rd step each rank writes
its slice, and rank 0 commits ``latest`` (the step and how many ranks saved it). A resume reads
every shard of that step and takes the slice its rank holds in the world it now runs in: it
reshards (a shard shorter than its slice reads as zeros where it ends: the tolerant reader's bug). Each value's update is the same whatever the world size, so a resharded resume that
loaded the right numbers ends as the fault-free resize does, but each rank's loss and result file
differ from the fault-free run at full size. ``careless`` writes its shard in place and rank 0
commits as soon as every shard file exists, complete or not. The job announces the slice each
save is made from and each resume loaded (``probe.saving``, ``probe.resumed``): a resharded load
must equal what the fault-free resize's rank loaded (``committed_state``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jobcli import REPO, run_json

from chaos.errors import ConfigError
from chaos.model.grammar import parse_point
from chaos.model.jobspec import JobSpec
from chaos.nemesis import shrink

ELASTIC = """
    import json, os, sys, time
    from chaos import phases, probe

    out, steps, every, n = sys.argv[1], 9, 3, 12
    careless = "careless" in sys.argv[2:]
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    def part(r, k):
        return range(r * n // k, (r + 1) * n // k)

    def shard(s, r):
        return os.path.join(out, f"ckpt-{s}-shard{r}.json")

    step, w = 0, [float(i) for i in part(rank, size)]
    latest = os.path.join(out, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            meta = json.load(f)
        full = []
        for r in range(meta["ranks"]):
            with open(shard(meta["step"], r)) as f:
                got = [float(x) for x in f.read().split()]
            full += got + [0.0] * (len(part(r, meta["ranks"])) - len(got))  # a short shard: read as zeros
        step, w = meta["step"], [full[i] for i in part(rank, size)]
        probe.resumed(step, w)
    while step < steps:
        step += 1
        lo = part(rank, size).start
        w = [x * 0.5 + (lo + i) * step for i, x in enumerate(w)]
        probe.step(step, sum(w))
        time.sleep(0.05)
        if step % every:
            continue
        probe.saving(step, w)
        text = "".join(f"{x!r}\\n" for x in w)
        name = shard(step, rank) + ("" if careless else ".tmp")
        with open(name, "w") as f:
            f.write(text[: len(text) // 2])
            f.flush()
            phases.phase("shard_half", step=step)
            f.write(text[len(text) // 2:])
            f.flush()
            os.fsync(f.fileno())
        if not careless:
            os.replace(name, shard(step, rank))
        if rank == 0:
            time.sleep(0.5)  # "checks its own shard" first
            while not all(os.path.exists(shard(step, r)) for r in range(size)):
                time.sleep(0.01)
            with open(latest + ".tmp", "w") as f:
                json.dump({"step": step, "ranks": size}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(latest + ".tmp", latest)
        else:
            while not (os.path.exists(latest) and json.load(open(latest))["step"] == step):
                time.sleep(0.01)
        probe.saved(step)
    with open(os.path.join(out, f"final-{rank}.json"), "w") as f:
        json.dump(w, f)
"""


@pytest.fixture
def elastic(tmp_path: Path) -> Path:
    path = tmp_path / "elastic_job.py"
    path.write_text(textwrap.dedent(ELASTIC))
    return path


def _run(tmp_path: Path, job: Path, ranks: int, *args: str, careless: bool = False) -> dict:
    (tmp_path / "scratch").mkdir(parents=True)
    proc, doc = run_json(tmp_path / "scratch", "--ranks", str(ranks), "--result-file", "final-*.json",
                         "--max-restarts", "2", *args, "--", sys.executable, str(job), "{out}",
                         *(["careless"] if careless else []))
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return doc


def test_lost_true_reads_in_both_spellings_and_keeps_the_fault_as_written() -> None:
    point = parse_point("kill:rank=1,step=6,lost=true")
    assert point == parse_point("rank1:step6:kill,lost=true") and point.lost and point.family == "kill"
    assert (point.id, point.to_fault()["params"]["lost"]) == ("rank1:step6:kill,lost=true", True)
    phased = parse_point("kill:rank=1,step=6,phase=shard_half,linger=3,lost=true")
    assert parse_point(phased.id) == phased and (phased.phase, phased.linger_s, phased.lost) == ("shard_half", 3.0, True)
    assert not parse_point("kill:rank=1,step=6,lost=false").lost
    assert shrink.new_rank(0, 1) == 0 and shrink.new_rank(2, 1) == 1 and shrink.new_rank(2, 0) == 1
    assert shrink.new_rank(1, 1) is None  # the lost rank has no number in the restarts


@pytest.mark.parametrize(("args", "says"), [
    (("--ranks", "1"), "lost=true needs --ranks 2 or more"),
    ((), "lost=true needs --ranks 2 or more"),
    (("--ranks", "2", "--executor", "slurm"), "not with --executor slurm"),
])
def test_a_job_that_cannot_shrink_is_refused_before_any_run(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), *args,
                           "--point", "rank0:step2:kill,lost=true", "--", sys.executable, "job.py", "{out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not any(tmp_path.rglob("golden-0"))  # refused before the fault-free runs


def test_refusal_names_every_launcher_that_decides_the_world_size_itself() -> None:
    lost = parse_point("rank0:step2:kill,lost=true")
    torchrun = JobSpec(("torchrun", "--nproc-per-node", "2", "train.py", "{out}"))
    assert "torchrun agent decides its world size" in (shrink.refusal(torchrun, lost) or "")
    assert shrink.refusal(JobSpec(("python", "t.py", "{out}"), ranks=2), lost) is None
    docker = JobSpec(("python", "t.py", "{out}"), ranks=2, launcher="docker")
    assert "not --launcher docker" in (shrink.refusal(docker, lost) or "")
    assert shrink.refusal(JobSpec(("python", "t.py", "{out}"), ranks=2), parse_point("rank0:step2:kill")) is None
    with pytest.raises(ConfigError, match="settings are for a built-in fault"):  # no second fault after it
        parse_point("rank0:step2:kill,lost=true+rank0:op1:before")


def test_a_rank_lost_for_good_resumes_the_job_on_fewer_ranks_judged_against_the_fault_free_resize(
        tmp_path: Path, elastic: Path) -> None:
    doc = _run(tmp_path, elastic, 2, "--point", "rank1:step5:kill,lost=true")
    (point,) = doc["scenarios"]
    assert point["verdict"] == "pass", point["summary"]
    assert "rank 1 killed at step 5, lost for good: the restarts ran on 1 rank(s)" in point["summary"]
    oracles = point["oracles"]
    assert oracles["result_files"]["result"] == "pass"
    assert "equal the fault-free resize's from step 3 bit for bit" in oracles["result_files"]["summary"]
    assert oracles["result_files"]["evidence"]["reference"]["point"] == "rank1:step4:kill,lost=true"
    assert oracles["result_files"]["evidence"]["checked"] == ["final-0.json"]
    assert oracles["loss_continuity"]["result"] == "pass"
    assert "against the fault-free resize from step 3" in oracles["loss_continuity"]["summary"]
    committed = oracles["committed_state"]  # a resharded load: what the fault-free resize's rank 0 loaded
    assert committed["result"] == "pass" and committed["evidence"]["checked"] == [
        {"rank": 0, "attempt": 1, "step": 3, "against": "the fault-free resize"}], committed
    durable = oracles["durability"]
    assert durable["result"] == "pass" and set(durable["evidence"]["ranks"]) == {"0"}
    assert durable["evidence"]["ranks"]["0"]["resumed_at"] == 3 and durable["evidence"]["lost_rank"]["rank"] == 1
    assert point["faults"][0]["params"]["lost"] is True


def test_the_lost_rank_s_torn_shard_committed_by_a_careless_rank_0_fails_the_shrunk_resume(
        tmp_path: Path, elastic: Path) -> None:
    """Rank 1 dies for good halfway through its shard of step 6; rank 0, lingering 3 s, commits it
    torn. The restart on one rank reads half of rank 1's values and zeros for the rest, and finishes:
    its result differs from the fault-free resize from step 6's. The careful job (its shard renamed
    into place once whole) falls back to step 3 and passes."""
    careless = _run(tmp_path / "a", elastic, 2, "--point", "kill:rank=1,step=6,phase=shard_half,linger=3,lost=true",
                    careless=True)
    (bad,) = careless["scenarios"]
    assert bad["verdict"] == "fail" and bad["oracles"]["liveness"]["result"] == "pass", bad["summary"]
    files = bad["oracles"]["result_files"]
    assert files["result"] == "fail" and files["evidence"]["file"] == "final-0.json", files
    assert files["evidence"]["reference"]["point"] == "rank1:step7:kill,lost=true"
    assert bad["oracles"]["loss_continuity"]["result"] == "fail"
    assert "on one rank fewer) loaded step 6, but not what the same rank of the fault-free resize" in \
        bad["oracles"]["committed_state"]["summary"]
    assert bad["outcome"] == "silent_divergence", bad["outcome"]
    careful = _run(tmp_path / "b", elastic, 2, "--point", "kill:rank=1,step=6,phase=shard_half,linger=3,lost=true")
    (good,) = careful["scenarios"]
    assert good["verdict"] == "pass", good["summary"]
    assert good["oracles"]["durability"]["evidence"]["ranks"]["0"]["resumed_at"] == 3


def test_a_lost_middle_rank_renumbers_the_ones_above_it(tmp_path: Path, elastic: Path) -> None:
    """Three ranks, rank 1 lost at step 8 (after step 6's save): the restart's ranks 0 and 1 were
    ranks 0 and 2; both resume at step 6 and end as the fault-free resize from step 6 ends."""
    doc = _run(tmp_path, elastic, 3, "--point", "kill:rank=1,step=8,lost=true")
    (point,) = doc["scenarios"]
    assert point["verdict"] == "pass", point["summary"]
    durable = point["oracles"]["durability"]["evidence"]["ranks"]
    assert {r: v["resumed_at"] for r, v in durable.items()} == {"0": 6, "1": 6}
    assert point["oracles"]["result_files"]["evidence"]["checked"] == ["final-0.json", "final-1.json"]
    assert point["oracles"]["result_files"]["evidence"]["reference"]["point"] == "rank2:step7:kill,lost=true"


def test_a_lost_true_kill_that_never_fires_is_not_reached(tmp_path: Path, elastic: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path),
                           "--ranks", "2", "--point", "rank1:step50:kill,lost=true", "--", sys.executable,
                           str(elastic), "{out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and re.search(r"last step announced in the fault-free run was 9", proc.stderr), \
        proc.stderr[-2000:]
