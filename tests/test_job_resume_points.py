"""A second fault inside a job's resume (``--resume-points N``, ``--point A+rankR:opN:MODE``).

The grammar, the choice of second faults and the refusals are checked on their own; then
real jobs through the CLI: a job whose recovery "migrates" its checkpoint by deleting it
before rewriting it passes every single fault, and is caught losing work only by a kill
inside its resume, given by name or sampled; the careful example passes its second
faults, on one process and on two ranks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from chaos.cli import job as cli_job
from chaos.cli.repro import describe_fault, find
from chaos.errors import ConfigError
from chaos.model.grammar import parse_point
from chaos.model.jobspec import JobSpec
from chaos.model.point import Point
from chaos.nemesis.atrest import point_seed
from chaos.plan.resumepoints import Resumed, choose, why_not

REPO = Path(__file__).resolve().parent.parent
CAREFUL = [sys.executable, "chaos/examples/careful_job.py", "--out", "{out}"]

# Saves durably (temp file, fsync, rename, directory fsync) every 2 of 6 steps and prints "step N".
# On a restart it "migrates" the checkpoint it loaded: deletes it, then writes the new format
# durably. Every single fault passes; a kill between the delete and the rename of that
# migration leaves no checkpoint, and the next restart starts over: the bug of a recovery.
MIGRATING = """
    import json, os, sys
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "ckpt.json")

    def durable_write(path, obj):
        with open(path + ".tmp", "w") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        fd = os.open(out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    state = {"step": 0, "w": 1.0}
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            state = json.load(f)
        os.unlink(ckpt)
        state["format"] = 2
        durable_write(ckpt, state)
    for step in range(state["step"] + 1, 7):
        state["w"] = state["w"] * 1.5 + step
        state["step"] = step
        print(f"step {step}", flush=True)
        if step % 2 == 0:
            durable_write(ckpt, {**state, "format": 2})
    durable_write(os.path.join(out, "final.json"), {"w": state["w"]})
"""


def test_a_second_fault_is_written_after_a_plus_and_reads_back() -> None:
    p = parse_point("rank0:op17:after@write:ckpt/a+b.pt:3+rank1:op4:torn")
    assert (p.rank, p.op, p.mode, p.anchored, p.path) == (0, 17, "after", True, "ckpt/a+b.pt")
    assert p.then == Point(1, "torn", op=4, attempt=1)
    assert p.id == "rank0:op17:after+rank1:op4:torn" and p.own_id == "rank0:op17:after"
    assert p.replay_id == "rank0:op17:after@write:ckpt/a+b.pt:3+rank1:op4:torn"
    assert parse_point(p.replay_id) == p
    assert p.then.env() == {"rank": 1, "mode": "torn", "op": 4, "step": None, "attempt": 1}
    assert [f["attempt"] for f in (p.to_fault(), p.then.to_fault())] == [0, 1]
    assert p.to_fault()["spec"] == "rank0:op17:after"
    assert parse_point("rank0:op9:power:s2+rank0:op1:before").then == Point(0, "before", op=1, attempt=1)
    # a file name with a plus is no second fault
    assert parse_point("rank0:op9:payload=ckpt/a+b.pkl").then is None


@pytest.mark.parametrize("text", ["disk:full:4096+rank0:op1:after", "rank0:step3:net+rank0:op1:after",
                                  "node1:step3:loss+rank0:op1:after"])
def test_a_second_fault_after_a_fault_with_a_chain_of_its_own_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="a second fault .* follows a point of"):
        parse_point(text)


def test_the_first_fault_does_the_same_with_or_without_a_second() -> None:
    alone, both = parse_point("rank0:op21:truncate"), parse_point("rank0:op21:truncate+rank0:op1:after")
    assert point_seed(3, alone) == point_seed(3, both) != point_seed(3, parse_point("rank0:op22:truncate"))


def _op(ord_: int, op: str, path: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"event": "op", "op": op, "ord": ord_, "seq": ord_, "rel": path, **extra}


def test_second_faults_come_from_the_resume_up_to_its_first_save() -> None:
    resume = [_op(0, "mkdir", error=17), _op(1, "unlink", "ckpt.json"), _op(2, "open", "ckpt.json.tmp"),
              _op(3, "write", "ckpt.json.tmp", length=40), _op(4, "rename"), _op(5, "open", "late.tmp"),
              _op(6, "write", length=9)]
    saved = [_op(0, "open", "a"), {"event": "phase", "name": "chaos.probe", "info": {"kind": "saved", "n": 2}},
             _op(1, "write", "b")]
    done = [Resumed(parse_point(f"rank0:op{i}:after"), True, True, {0: resume}, from_checkpoint=True)
            for i in range(6)]
    done += [Resumed(parse_point("rank0:op9:power"), True, True, {0: saved}, from_checkpoint=False),
             Resumed(parse_point("rank0:op8:bitflip"), True, True, {0: resume}, from_checkpoint=True),
             Resumed(parse_point("rank0:op7:before"), False, True, {0: resume}, from_checkpoint=True),  # failed
             Resumed(parse_point("rank0:op6:truncate"), True, False, {0: resume}, from_checkpoint=True)]  # died
    picked = choose(done, 3, seed=0)
    assert [p.family for p in picked] == ["corrupt", "kill", "kill"]  # from a checkpoint first, a family each
    assert choose(done, 3, seed=0) == picked  # seeded
    for p in picked:
        assert p.then is not None and p.then.attempt == 1 and p.then.rank == 0
        assert 1 <= p.then.op <= 4  # never the failed mkdir, nothing after the first rename
        assert p.then.mode in (("before", "after", "torn") if p.then.kind == "write" else ("before", "after"))
    last = choose(done, 10, seed=0)
    assert len(last) == 8 and last[-1].own_id == "rank0:op9:power"  # no checkpoint to resume from: last
    assert last[-1].then is not None and last[-1].then.op == 0  # only what came before its first "saved"
    assert choose([d for d in done if not d.passed or not d.resumed], 3, seed=0) == []
    # torn only where the kill family tears too (nemesis.kill.modes_at): a write of two bytes or more
    one_byte = [_op(0, "open", "a", created=True), _op(1, "write", "a", length=1), _op(2, "rename")]
    modes = {p.then.mode for seed in range(40) for p in choose(
        [Resumed(parse_point("rank0:op1:after"), True, True, {0: one_byte})], 1, seed) if p.then is not None}
    assert modes == {"before", "after"}


def test_every_second_sampled_fault_is_a_power_cut_drawn_on_to_the_fsync_after_the_first_rename() -> None:
    resume = [_op(0, "unlink", "ckpt.json"), _op(1, "open", "ckpt.json.tmp"), _op(2, "write", "ckpt.json.tmp", length=8),
              _op(3, "rename"), _op(4, "open", "."), _op(5, "fsync", "."), _op(6, "write", "late", length=3)]
    done = [Resumed(parse_point(f"rank0:op{i}:after"), True, True, {0: resume}, from_checkpoint=True)
            for i in range(8)]
    kills, mixed = choose(done, 6, seed=3), choose(done, 6, seed=3, power=True)
    assert [p.own_id for p in kills] == [p.own_id for p in mixed]  # the same points struck again
    for i, (k, m) in enumerate(zip(kills, mixed, strict=True)):
        assert k.then is not None and m.then is not None
        if i % 2 == 0:
            assert m.then == k.then  # the kills drawn as without power cuts
        else:
            assert m.then.mode == "power" and m.then.attempt == 1 and m.then.op <= 5
    cut_at = {p.then.op for seed in range(30) for p in choose(done, 6, seed, power=True)[1::2] if p.then}
    assert cut_at == {0, 1, 2, 3, 4, 5}  # on past the rename (3) to the directory's fsync (5), never beyond
    kill_at = {p.then.op for seed in range(30) for p in choose(done, 6, seed)[::2] if p.then}
    assert kill_at == {0, 1, 2, 3}  # a kill's window still ends at the first rename


@pytest.mark.parametrize(("kw", "says"), [({"max_restarts": 0}, "--max-restarts 0"),
                                          ({"launcher": "sbatch"}, "--launcher sbatch")])
def test_a_job_whose_resume_the_harness_does_not_start_takes_no_second_fault(kw: dict[str, Any], says: str) -> None:
    job = JobSpec(command=("python", "j.py", "{out}"), **kw)
    assert says in (why_not(job) or "")
    with pytest.raises(ConfigError, match=f"a second fault in a resume.*{says}"):
        cli_job.build([*(["--max-restarts", "0"] if "max_restarts" in kw else ["--launcher", "sbatch"]),
                       "--resume-points", "2", "--", "python", "j.py", "{out}"])
    torchrun = JobSpec(command=("torchrun", "--nproc-per-node", "2", "--max-restarts", "1", "j.py", "{out}"))
    assert "torchrun --max-restarts 1: its agent must restart the workers" in (why_not(torchrun) or "")
    assert why_not(JobSpec(command=("torchrun", "--max-restarts=2", "j.py", "{out}"))) is None


def test_resume_points_and_named_points_are_not_mixed_nor_sent_to_a_slurm_array() -> None:
    with pytest.raises(ConfigError, match="--point runs exactly the points given"):
        cli_job.build(["--resume-points", "2", "--point", "rank0:op1:after", "--", "python", "j.py", "{out}"])
    for given in (["--resume-points", "1"], ["--point", "rank0:op3:after+rank0:op1:before"]):
        with pytest.raises(ConfigError, match="a second fault in a resume with --executor slurm"):
            cli_job.build([*given, "--executor", "slurm", "--", "python", "j.py", "{out}"])
    _args, job = cli_job.build(["--point", "rank0:op9:payload=a+rank0:op1:x.pkl", "--executor", "slurm", "--",
                                "python", "j.py", "{out}"])  # a '+' in a file name is no second fault
    assert job.command == ("python", "j.py", "{out}")


def _run(tmp_path: Path, *args: str, command: list[str] | None = None,
         result: str = "final.json") -> tuple[int, dict[str, Any], str]:
    script = tmp_path / "migrating_job.py"
    script.write_text(textwrap.dedent(MIGRATING))
    results = tmp_path / "r.json"
    command = command or [sys.executable, str(script), "{out}"]
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--json",
                           str(results), "--result-file", result, *args, "--", *command],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(results.read_text()), proc.stdout


def test_a_recovery_that_deletes_its_checkpoint_first_loses_work_only_when_struck_inside(tmp_path: Path) -> None:
    regex = ("--step-regex", r"step (\d+)")
    rc, doc, _ = _run(tmp_path, *regex, "--point", "rank0:step5:kill")
    assert rc == 0 and doc["scenarios"][0]["verdict"] == "pass"  # one fault: the migration always completes
    rc, doc, out = _run(tmp_path, *regex, "--point", "rank0:step5:kill+rank0:op1:after")
    assert rc == 1, out
    [point] = doc["scenarios"]
    assert (point["id"], point["verdict"], point["outcome"]) == ("rank0:step5:kill+rank0:op1:after", "fail",
                                                                 "lost_work")
    assert "in the restart, rank 0 killed after its event 1 (unlink of ckpt.json)" in point["summary"]
    assert "its checkpoint of step 4 was complete" in point["summary"]
    assert [(f["spec"], f["attempt"]) for f in point["faults"]] == [("rank0:step5:kill", 0), ("rank0:op1:after", 1)]
    assert [a["outcome"] for a in point["attempts"]] == ["killed by SIGKILL", "killed by SIGKILL", "exited 0"]
    assert point["replay"].endswith("--point rank0:step5:kill+rank0:op1:after -- " + point["replay"].split(" -- ")[1])
    assert "coverage 0/" in out and "1 struck again in their resume" in out
    said = describe_fault(find(doc, "R.json"))  # the issue draft's "What was done" (chaos repro)
    assert said.startswith("the job was killed (SIGKILL) at training step 5; then the harness restarted the job "
                           "(at most 2 restart(s)); inside that restart (its recovery), the job was killed (SIGKILL) "
                           "right after its `unlink` of `"), said
    assert said.endswith("ckpt.json` (traced file event 1) of the restart's own trace; then restarted once more")


def test_sampled_second_faults_find_the_recovery_bug(tmp_path: Path) -> None:
    rc, doc, out = _run(tmp_path, "--step-regex", r"step (\d+)", "--faults", "kill,term,errno",
                        "--max-points", "8", "--resume-points", "3", "--seed", "1")
    assert rc == 1, out
    firsts = [s for s in doc["scenarios"] if "+" not in s["id"]]
    seconds = [s for s in doc["scenarios"] if "+" in s["id"]]
    assert len(firsts) == 8 and all(s["verdict"] == "pass" for s in firsts)
    assert len(seconds) == 3 and doc["job"]["resume_points_tried"] == 3 and doc["job"]["points_tried"] == 11
    assert doc["job"]["coverage"] == round(8 / doc["job"]["points_found"], 4)
    assert any(s["outcome"] == "lost_work" for s in seconds), [s["summary"] for s in seconds]
    assert all(s["outcome"] != "not_reached" for s in seconds)


@pytest.mark.parametrize("ranks", [None, 2])
def test_the_careful_job_survives_a_kill_inside_its_resume(tmp_path: Path, ranks: int | None) -> None:
    extra = ["--ranks", str(ranks)] if ranks else []
    rc, doc, out = _run(tmp_path, *extra, "--faults", "kill,power,corrupt", "--max-points", "6",
                        "--resume-points", "3", "--seed", "2", command=CAREFUL,
                        result="final-rank*.json" if ranks else "final.json")
    assert rc == 0, out
    seconds = [s for s in doc["scenarios"] if "+" in s["id"]]
    # the kills pass; the power cut passes, or did nothing where nothing was pending at its event (which event
    # it is follows the ranks' race, on two ranks): skipped as no_effect, never passed
    assert len(seconds) == 3 and all(s["verdict"] == "pass" or s["id"].endswith(":power") and
                                     (s["verdict"], s["outcome"]) == ("skipped", "no_effect") for s in seconds), \
        [s["summary"] for s in seconds]
    # the second fault fired in the restart (every second one a power cut: a halt, then the cut), and a third
    # attempt finished the job
    assert sorted(s["id"].rsplit(":", 1)[1] == "power" for s in seconds) == [False, False, True]
    for s in seconds:
        action = "halt" if s["id"].endswith(":power") else "kill"
        assert any(f["attempt"] == 1 and f.get("action") == action for f in s["fired"]), s["fired"]
        assert len(s["attempts"]) == 3 and s["attempts"][-1]["outcome"] == "exited 0"


def test_a_point_struck_again_in_its_resume_is_a_findings_row_of_its_own_the_peer_cannot_test() -> None:
    from chaos.cli import findings

    assert findings.point_family("rank0:step5:kill+rank0:op1:after", "r.json") == "resume"
    assert findings.point_family("rank0:step5:kill", "r.json") == "kill"
    assert findings.load_annotations(findings.DEFAULT_ANNOTATIONS).peer_families["resume"] == "no"


TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun next to this Python")
def test_a_torchrun_job_is_struck_in_its_agents_restart_and_in_the_harness_relaunch(tmp_path: Path) -> None:
    """After a kill the agent restarts the workers: the second fault rides in the launch's environment
    (ENV_POINT_THEN) and fires in restart 1. After a power loss the harness relaunches torchrun with it
    armed (its workers' attempt TORCHRUN_STRIDE). Either way the agent's next restart finishes the job."""
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
               "chaos/examples/ddp_job.py", "--out", "{out}", "--save", "careful", "--steps", "6"]
    rc, doc, out = _run(tmp_path, "--faults", "kill,power", "--max-points", "4", "--resume-points", "2",
                        "--seed", "0", "--timeout", "240", command=command, result="final.pt")
    assert rc == 0, out
    seconds = [s for s in doc["scenarios"] if "+" in s["id"]]
    assert sorted(s["faults"][0]["kind"] for s in seconds) == ["crash", "powerloss"], [s["id"] for s in seconds]
    for s in seconds:
        assert s["verdict"] == "pass", s["summary"]
        struck = {f["attempt"] for f in s["fired"] if f.get("action") == "kill" and f["attempt"] > 0}
        relaunched = s["faults"][0]["kind"] == "powerloss"
        assert struck == ({100} if relaunched else {1}), s["fired"]  # TORCHRUN_STRIDE x the relaunch, or restart 1
        assert len(s["attempts"]) == (2 if relaunched else 1)  # torchrun launched by the harness
        assert "torchelastic restarted the workers" in s["oracles"]["liveness"]["summary"]
