"""A power cut inside a job's restart: ``--point A+rankR:opN:power``.

A job that saves carefully (temp file, fsync, rename, directory fsync) rewrites the
checkpoint it loaded when it restarts, in a "normal form", without fsyncing the new file
before the rename. Every single fault passes, and so does a kill anywhere in that restart:
the page cache keeps what the rewrite wrote. Only a power cut inside the restart, right
after the rewrite's directory fsync, loses the checkpoint (the entry durable, its data
not), and the next restart fails on an empty file (``hard_failure``), or, tolerating it,
starts over (``lost_work``). The same rewrite with the file fsynced passes, and a cut
where nothing is pending is skipped. The points are given by name, several in one run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaos.errors import ConfigError
from chaos.model.grammar import parse_point, replay_point

REPO = Path(__file__).resolve().parent.parent

# argv: {out} and how the restart rewrites the loaded checkpoint: "nosync" (no fsync of the new
# file before its rename; a checkpoint it cannot read fails the job), "tolerant" (the same, but
# an unreadable checkpoint is started over from) or "fsync" (the file fsynced first); then, if
# given, the directory it keeps its checkpoint in (default {out}; tests/test_job_docker.py gives
# a container's own /ckpt). Its events in a restart, in {out}: 0 mkdir, 1 open of ckpt.json.tmp,
# 2 write, [fsync,] close, rename, open of {out}, fsync of {out} (6 without the file's fsync, 7
# with it), close.
RENORMALIZING = """
    import json, os, sys
    from chaos import probe
    out, mode = sys.argv[1], sys.argv[2]
    keep = sys.argv[3] if len(sys.argv) > 3 else out
    os.makedirs(out, exist_ok=True)
    if keep != out:
        os.makedirs(keep, exist_ok=True)
    path = os.path.join(keep, "ckpt.json")

    def save(state, sync_file=True):
        with open(path + ".tmp", "w") as f:
            json.dump(state, f, sort_keys=True)
            f.flush()
            if sync_file:
                os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        fd = os.open(keep, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    start, w, state = 0, 1.0, None
    if os.path.exists(path):
        try:
            with open(path) as f:
                state = json.load(f)
        except ValueError:
            if mode != "tolerant":
                raise
            print("checkpoint unreadable: starting over", flush=True)
    if state is not None:
        start, w = state["step"], state["w"]
        probe.resumed(start)
        save(state, sync_file=(mode == "fsync"))  # the normal form
    for step in range(start + 1, 11):
        w = w * 0.5 + step
        probe.step(step, loss=w)
        if step % 2 == 0:
            save({"step": step, "w": w})
            probe.saved(step)
    with open(os.path.join(out, "final.json"), "w") as f:
        json.dump({"w": w}, f)
"""


def _run(tmp_path: Path, mode: str, *points: str, status: int, options: tuple[str, ...] = ()
         ) -> tuple[dict[str, dict], str]:
    """The points of the run by id, and its console output followed by its notes (results JSON)."""
    job = tmp_path / "renorm.py"
    job.write_text(textwrap.dedent(RENORMALIZING))
    results = tmp_path / f"{mode}.json"
    argv = [sys.executable, "-m", "chaos.cli.main", "run", "--result-file", "final.json", "--scratch", str(tmp_path),
            "--json", str(results), *options]
    for p in points:
        argv += ["--point", p]
    proc = subprocess.run([*argv, "--", sys.executable, str(job), "{out}", mode], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(results.read_text())
    return {s["id"]: s for s in doc["scenarios"]}, "\n".join([proc.stdout, *doc["job"]["reference"]["notes"]])


def test_only_a_power_cut_in_the_restart_finds_a_rewrite_that_is_not_durable(tmp_path: Path) -> None:
    points, out = _run(tmp_path, "nosync", "rank0:step5:kill", "rank0:step5:kill+rank0:op6:after",
                       "rank0:step5:kill+rank0:op6:power", status=1)
    assert points["rank0:step5:kill"]["outcome"] == "pass"
    assert points["rank0:step5:kill+rank0:op6:after"]["outcome"] == "pass"  # the page cache kept the rewrite
    cut = points["rank0:step5:kill+rank0:op6:power"]
    assert cut["outcome"] == "hard_failure", cut["summary"]
    assert ("in the restart, after rank 0's event 6 (fsync of {out}): power loss right after rank 0's event 6: "
            "ckpt.json: 24 unsynced byte(s) lost" in cut["summary"]), cut["summary"]
    assert "(2 restart(s) of 2 allowed)" in cut["summary"] and "JSONDecodeError" in cut["summary"]
    second = cut["oracles"]["liveness"]["evidence"]["second_fault"]
    assert [x["path"] for x in second["lost"]] == ["ckpt.json"] and second["cut"]["event"] == 6
    assert second["base_files"] == []  # a kill first: {out} before attempt 0, both attempts' events replayed
    assert [f["kind"] for f in cut["faults"]] == ["kill", "powerloss"] and cut["faults"][1]["attempt"] == 1
    assert ("a power cut inside the resume's own recovery loses ckpt.json, which the first crash left intact"
            in out), out
    assert "at: kill between saves; then a power cut inside its restart" in out


def test_sampled_second_faults_cut_the_power_in_every_second_resume_and_find_the_rewrite(tmp_path: Path) -> None:
    # --resume-points 2: the first a kill in its resume, the second a power cut, drawn up to the fsync
    # after the resume's first rename; seed 5 draws event 6 (the directory fsync) of the rewrite
    points, out = _run(tmp_path, "nosync", status=1, options=("--faults", "kill", "--max-points", "4",
                                                                "--resume-points", "2", "--seed", "5"))
    seconds = {i: p for i, p in points.items() if "+" in i}
    assert len(seconds) == 2 and sum(i.endswith(":power") for i in seconds) == 1, sorted(seconds)
    [cut] = [p for i, p in seconds.items() if i.endswith("+rank0:op6:power")]
    assert cut["outcome"] == "hard_failure", cut["summary"]
    assert "power loss right after rank 0's event 6: ckpt.json: " in cut["summary"], cut["summary"]
    assert all(p["outcome"] == "pass" for i, p in points.items() if i not in seconds)  # every single fault passes
    assert "a power cut inside the resume's own recovery loses ckpt.json" in out
    assert "2 point(s) tried again with a kill or (1 of them) a power cut inside their resume" in out


def test_a_restart_that_starts_over_after_the_cut_loses_the_work_it_had_acknowledged(tmp_path: Path) -> None:
    points, _ = _run(tmp_path, "tolerant", "rank0:step5:kill+rank0:op6:power", "rank0:op13:power+rank0:op6:power",
                     status=1)
    cut = points["rank0:step5:kill+rank0:op6:power"]
    assert cut["outcome"] == "lost_work", cut["summary"]
    assert ("rank 0 resumed from scratch, but its checkpoint of step 4 was complete (chaos.probe.saved)"
            in cut["summary"]), cut["summary"]
    assert "cut_ts_by_attempt" in cut["oracles"]["durability"]["evidence"]["acknowledged_before"]
    # a power loss first: the restart's cut starts from {out} as the harness left it, its events alone
    both = points["rank0:op13:power+rank0:op6:power"]
    assert both["outcome"] == "lost_work", both["summary"]
    second = both["oracles"]["liveness"]["evidence"]["second_fault"]
    assert second["base_files"] == ["ckpt.json"] and second["ops_replayed"] < 10, second
    assert "checkpoint of step 2 was complete" in both["summary"], both["summary"]


def test_a_rewrite_made_durable_survives_and_a_cut_with_nothing_pending_is_skipped(tmp_path: Path) -> None:
    points, _ = _run(tmp_path, "fsync", "rank0:step5:kill+rank0:op5:power", "rank0:step5:kill+rank0:op7:power",
                     status=0)
    assert points["rank0:step5:kill+rank0:op5:power"]["outcome"] == "pass"  # the rename lost, the old file whole
    idle = points["rank0:step5:kill+rank0:op7:power"]
    assert (idle["verdict"], idle["outcome"]) == ("skipped", "no_effect"), idle["summary"]
    assert "nothing was pending after rank 0's event 7" in idle["summary"]


def test_the_grammar_reads_and_replays_a_power_cut_in_a_restart() -> None:
    point = parse_point("rank0:step5:kill+rank0:op6:power")
    assert point.id == "rank0:step5:kill+rank0:op6:power"
    assert (point.then.mode, point.then.family, point.then.op, point.then.attempt) == ("power", "power", 6, 1)
    assert replay_point({"id": point.id}) == point.id


def test_a_torchrun_command_is_refused_a_power_cut_in_its_restart(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--point",
                           "rank0:step5:kill+rank0:op6:power", "--", "torchrun", "--standalone", "--nproc-per-node",
                           "1", "--max-restarts", "2", "job.py", "{out}"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "a power cut in a resume (+rankR:opN:power) with a torchrun COMMAND" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text", ["rank0:step5:kill+rank0:op6:stale", "rank0:step5:kill+rank0:op6:power:s1"])
def test_only_a_kill_or_a_power_cut_of_every_pending_change_follows_in_a_restart(text: str) -> None:
    with pytest.raises(ConfigError, match="malformed --point"):
        parse_point(text)
