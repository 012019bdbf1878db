"""The fault families of ``chaos run -- COMMAND`` beyond kills: at-rest corruption, power loss,
injected ENOSPC / EIO, SIGTERM with a grace period, and a real full disk.

Real processes throughout, on the pure-Python examples (a fraction of a second per point):
for each family the careless variant is caught with the right outcome and its evidence,
the careful one passes, a replay reruns exactly the point, and a fault that did nothing
or cannot be made is *skipped* with the reason. The tmpfs tests need root.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from chaos.errors import ConfigError
from chaos.model.jobspec import JobSpec, Point, parse_point
from faults.disk import can_mount_tmpfs

REPO = Path(__file__).resolve().parent.parent
CARELESS = [sys.executable, "chaos/examples/careless_job.py", "--out", "{out}"]
CAREFUL = [sys.executable, "chaos/examples/careful_job.py", "--out", "{out}"]
TMPFS, TMPFS_WHY = can_mount_tmpfs()
needs_tmpfs = pytest.mark.skipif(not TMPFS, reason=TMPFS_WHY)


def chaos_run(*args: str, scratch: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(scratch), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def run_json(tmp: Path, *args: str, name: str = "r.json") -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    results = tmp / name
    proc = chaos_run("--json", str(results), *args, scratch=tmp)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc, json.loads(results.read_text())


def only(doc: dict[str, Any]) -> dict[str, Any]:
    [scenario] = doc["scenarios"]
    return scenario


def script(tmp: Path, name: str, body: str) -> list[str]:
    path = tmp / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path), "--out", "{out}"]


def mounts_under(path: Path) -> list[str]:
    root = str(path.resolve())
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(root)]


# ---------------------------------------------------------------------- point ids
@pytest.mark.parametrize("text", ["rank0:op12:bitflip", "rank1:op3:truncate", "rank0:op4:zero", "rank2:op9:delete",
                                  "rank0:op9:power", "rank0:op4:enospc", "rank1:op2:eio", "rank0:step5:term",
                                  "disk:full:8192", "rank1:op3:truncate:step5", "rank0:op12:bitflip:step13"])
def test_new_point_ids_round_trip(text: str) -> None:
    assert parse_point(text).id == text


@pytest.mark.parametrize("text", ["rank0:op1:power2", "disk:full:", "disk:full:0", "rank0:step5:bitflip",
                                  "rank0:op3:term", "rank0:op3:after:step4", "rank0:op3:power:step4",
                                  "rank0:op3:bitflip:s1", "rank0:op3:bitflip:step"])
def test_a_malformed_new_point_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="malformed --point"):
        parse_point(text)


def test_each_point_names_its_family_and_its_fault_kind() -> None:
    cases = {"rank0:op1:after": ("kill", "crash"), "rank0:step2:kill": ("kill", "kill"),
             "rank0:op3:zero": ("corrupt", "corrupt"), "rank0:op3:power": ("power", "powerloss"),
             "rank0:op3:eio": ("errno", "ioerror"), "rank0:step2:term": ("term", "term"),
             "disk:full:4096": ("diskfull", "diskfull")}
    for text, (family, kind) in cases.items():
        p = parse_point(text)
        assert (p.family, p.to_fault()["kind"]) == (family, kind), text
    assert parse_point("disk:full:4096").to_fault()["params"] == {"size_bytes": 4096}
    assert parse_point("rank0:op3:bitflip").to_fault(seed=7)["params"] == {"op": 3, "when": "bitflip", "seed": 7}


def test_faults_and_grace_are_validated_and_replayed() -> None:
    with pytest.raises(ConfigError, match="--faults 'kill,nap'"):
        JobSpec(command=("python", "t.py", "{out}"), faults=("kill", "nap"))
    with pytest.raises(ConfigError, match="--grace"):
        JobSpec(command=("python", "t.py", "{out}"), grace_s=-1)
    from chaos.cli.job import build

    job = JobSpec(command=("python", "t.py", "{out}"), faults=("corrupt", "term"), grace_s=1.5)
    cmd = shlex.split(job.replay_command(Point(0, "term", step=3)))
    args, again = build(cmd[2:])
    assert again == job and args.point == ["rank0:step3:term"]


def test_run_help_shows_the_job_options() -> None:
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    tail = proc.stdout[proc.stdout.index("job options:"):]
    assert "--faults K,..." in tail and "--grace S" in tail and "--ranks N" in tail


# ---------------------------------------------------------------------- corruption at rest
def test_a_truncated_checkpoint_the_careless_job_loads_is_a_hard_failure(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", "rank0:op12:truncate", "--", *CARELESS)
    assert proc.returncode == 1
    s = only(doc)
    assert s["outcome"] == "hard_failure"
    assert s["summary"].startswith("ckpt.json: truncated from 102 to ") and "after event 12 completed it" in s["summary"]
    assert "JSONDecodeError" in s["summary"]
    applied = s["fault_applied"]
    assert applied["family"] == "truncate" and applied["file"] == "ckpt.json"
    change = applied["corruption"]
    assert change["changed"] and change["size_before"] == 102 and change["seed"] == applied["seed"]
    assert s["faults"][0]["params"]["seed"] == applied["seed"] and s["faults"][0]["kind"] == "corrupt"
    assert s["oracles"]["liveness"]["evidence"]["fault"]["corruption"]["size_after"] == change["size_after"]


def test_flipped_data_the_careless_job_loads_is_silent_divergence_and_replays(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--faults", "corrupt", "--", *CARELESS)
    assert proc.returncode == 1
    by_id = {s["id"]: s for s in doc["scenarios"]}
    flip = by_id["rank0:op12:bitflip"]
    assert flip["outcome"] == "silent_divergence", flip["summary"]
    assert " flipped after event 12 completed it; then final.json: weights" in flip["summary"]
    assert by_id["rank0:op12:zero"]["outcome"] == "hard_failure"
    assert by_id["rank0:op12:delete"]["outcome"] == "lost_work"  # its only checkpoint gone: from scratch
    assert doc["job"]["faults"]["explored"] == ["corrupt"] and doc["job"]["faults"]["found"] == {"corrupt": 20}

    replay = shlex.split(flip["replay"])
    assert replay[:2] == ["chaos", "run"] and "--point" in replay
    _, again = run_json(tmp_path, *replay[2:], name="again.json")
    s = only(again)
    assert s["outcome"] == "silent_divergence" and s["summary"] == flip["summary"]
    assert s["fault_applied"]["corruption"]["changes"] == flip["fault_applied"]["corruption"]["changes"]


def test_the_careful_job_detects_each_corruption_and_falls_back(tmp_path: Path) -> None:
    # With --checkpoint-glob the corrupted checkpoint still has the fault-free size: it must not count.
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--checkpoint-glob", "ckpt-*.json",
                         "--faults", "corrupt", "--", *CAREFUL)
    assert proc.returncode == 0, proc.stdout
    # the 2 checkpoints left x 4 families, right after each was completed; and every checkpoint
    # the job trusted at its next step, at rest: ckpt-000003/6/9.json at steps 4, 7 and 10
    # (ckpt-000012.json is the last save: no step after it)
    assert doc["summary"]["pass"] == doc["summary"]["total"] == 20
    assert sorted(s["id"] for s in doc["scenarios"] if ":step" in s["id"]) == sorted(
        f"rank0:op{op}:{fam}:step{step}" for op, step in ((5, 4), (13, 7), (21, 10))
        for fam in ("bitflip", "truncate", "zero", "delete"))
    flip = next(s for s in doc["scenarios"] if s["id"].endswith(":bitflip") and "000012" in s["summary"])
    durable = flip["oracles"]["durability"]["evidence"]
    assert durable["not_relied_on"]["files"] == ["ckpt-000012.json"]
    assert durable["ranks"]["0"]["resumed_at"] == durable["ranks"]["0"]["newest_complete"] == 9
    # at rest, after its save was acknowledged: the acknowledgement of step 9 no longer counts
    rot = next(s for s in doc["scenarios"] if s["id"] == "rank0:op21:truncate:step10")
    assert "at rest, once rank 0 announced step 10 (event 21 completed it)" in rot["summary"]
    durable = rot["oracles"]["durability"]["evidence"]
    assert durable["not_relied_on"] == {"files": ["ckpt-000009.json"], "acknowledged_from_step": 9, "ranks": [0],
                                        "why": "corrupted by the harness after the job completed them"}
    assert durable["ranks"]["0"]["resumed_at"] == durable["ranks"]["0"]["newest_complete"] == 6


# A job that marks each checkpoint complete with a second file, and trusts any marked one:
# no checksum. Corrupting the data file right after its rename finds no marker yet (the
# job rightly skips it); the same corruption once the job moved on is loaded as good.
MARKED = """
    import argparse, glob, json, os
    from chaos import probe
    ap = argparse.ArgumentParser(); ap.add_argument("--out"); out = ap.parse_args().out
    def put(path, text):
        with open(path + ".tmp", "w") as f:
            f.write(text); f.flush(); os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        fd = os.open(out, os.O_RDONLY); os.fsync(fd); os.close(fd)
    marked = sorted(int(p[len(out) + 6:-5]) for p in glob.glob(os.path.join(out, "ckpt-*.done")))
    step, w = 0, 1.0
    if marked:
        state = json.load(open(os.path.join(out, f"ckpt-{marked[-1]}.json")))
        step, w = state["step"], state["w"]
        probe.resumed(step)
    while step < 8:
        step += 1
        w = w * 0.5 + step
        probe.step(step, w)
        if step % 3 == 0:
            put(os.path.join(out, f"ckpt-{step}.json"), json.dumps({"step": step, "w": w}))
            put(os.path.join(out, f"ckpt-{step}.done"), "")
            probe.saved(step)
    put(os.path.join(out, "final.json"), json.dumps({"w": w}))
"""


def test_rot_at_rest_after_the_save_is_what_a_commit_marker_without_a_checksum_misses(tmp_path: Path) -> None:
    marked = script(tmp_path, "marked.py", MARKED)
    _, doc = run_json(tmp_path, "--result-file", "final.json", "--faults", "corrupt", "--seed", "1", "--", *marked)
    by_id = {s["id"]: s for s in doc["scenarios"]}
    [rot_id] = [i for i, s in by_id.items() if i.endswith(":zero:step4") and s["faults"][0]["params"]["path"]
                == "ckpt-3.json"]
    now_id = rot_id.removesuffix(":step4")
    assert by_id[now_id]["fault_applied"]["file"] == by_id[rot_id]["fault_applied"]["file"] == "ckpt-3.json"
    # right after the rename: no marker yet, the job resumes from scratch, as it should
    assert by_id[now_id]["outcome"] == "pass", by_id[now_id]["summary"]
    # at rest, marker written and the save acknowledged: the zeroed bytes are loaded and fail the resume
    rot = by_id[rot_id]
    assert rot["outcome"] == "hard_failure", rot["summary"]
    assert "JSONDecodeError" in rot["summary"] and rot["faults"][0]["params"]["at_step"] == 4
    halt = rot["attempts"][0]["halted"]
    assert halt["rank"] == 0


def test_a_corruption_that_changes_nothing_is_skipped_with_the_reason(tmp_path: Path) -> None:
    zeros = script(tmp_path, "zeros.py", """
        import argparse, os
        ap = argparse.ArgumentParser(); ap.add_argument("--out"); out = ap.parse_args().out
        with open(os.path.join(out, "ckpt.bin"), "wb") as f:
            f.write(bytes(100))
    """)
    proc, doc = run_json(tmp_path, "--faults", "corrupt", "--", *zeros)
    assert proc.returncode == 0, proc.stdout
    zero = next(s for s in doc["scenarios"] if s["id"].endswith(":zero"))
    assert zero["verdict"] == "skipped" and zero["outcome"] == "no_effect"
    assert zero["summary"].startswith("ckpt.bin: bytes [") and zero["summary"].endswith(" were already zero")
    assert not zero["fault_applied"]["corruption"]["changed"]
    assert {s["verdict"] for s in doc["scenarios"] if s is not zero} == {"pass"}


# ---------------------------------------------------------------------- power loss
def test_a_power_loss_loses_the_careless_jobs_unsynced_checkpoint(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", "rank0:op12:power", "--", *CARELESS)
    assert proc.returncode == 1
    s = only(doc)
    assert s["outcome"] == "lost_work"
    assert s["summary"].startswith("power loss right after rank 0's event 12: create of ckpt.json lost "
                                   "(directory not fsynced)")
    assert "rank 0 resumed from scratch, but its checkpoint of step 9 was complete" in s["summary"]
    applied = s["fault_applied"]
    assert applied["choice"] == "all-pending-lost" and applied["files_after"] == [] and applied["cut"]["event"] == 12
    assert {x["what"] for x in applied["lost"]} == {"dir_entry", "data"}


def test_the_careful_job_survives_power_loss_everywhere_sampled(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--faults", "power", "--max-points", "10",
                         "--seed", "3", "--", *CAREFUL)
    assert proc.returncode == 0, proc.stdout
    assert doc["job"]["faults"]["tried"] == {"power": 10}
    judged = [s for s in doc["scenarios"] if s["verdict"] != "skipped"]
    assert len(judged) >= 7 and {s["verdict"] for s in judged} == {"pass"}
    assert all(s["fault_applied"]["lost"] for s in judged)  # each lost something: never a plain kill
    # a skip is a mixed-state point whose cut had fewer distinct states than its number
    assert all(":s" in s["id"] and "this point asks for state" in s["fault_applied"]["skipped"]
               for s in doc["scenarios"] if s["verdict"] == "skipped")


def test_power_loss_on_a_trace_the_model_refuses_is_skipped(tmp_path: Path) -> None:
    # A directory built outside {out} (and outside TMPDIR), untraced, then renamed in: its contents are unknown.
    staged = script(tmp_path, "staged.py", """
        import argparse, os
        ap = argparse.ArgumentParser(); ap.add_argument("--out"); out = ap.parse_args().out
        if not os.path.exists(os.path.join(out, "ckpt")):
            stage = os.path.join(os.path.dirname(out), "stage")
            os.makedirs(stage, exist_ok=True)
            with open(os.path.join(stage, "weights"), "wb") as f:
                f.write(b"w" * 64)
            os.rename(stage, os.path.join(out, "ckpt"))
    """)
    proc, doc = run_json(tmp_path, "--point", "rank0:op0:power", "--", *staged)
    assert proc.returncode == 0, proc.stdout
    s = only(doc)
    assert s["verdict"] == "skipped" and s["outcome"] == "unsupported"
    assert s["summary"].startswith("the crash-state model cannot represent this trace: ")
    assert any("power loss: the crash-state model cannot represent" in n for n in doc["job"]["reference"]["notes"])


# ---------------------------------------------------------------------- injected ENOSPC / EIO
def test_an_enospc_in_the_careless_jobs_overwrite_is_a_hard_failure(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", "rank0:op5:enospc", "--", *CARELESS)
    assert proc.returncode == 1
    s = only(doc)
    assert s["outcome"] == "hard_failure"
    # the data Python's close() retries to write fails too: the disk is still full, the file left empty
    assert s["summary"].startswith("rank 0's write of ckpt.json (event 5) raised ENOSPC; the disk staying full, "
                                   "1 later event(s) failed too (write); then the resume exited 1")
    assert "JSONDecodeError" in s["summary"]
    assert s["fired"][0]["action"] == "enospc" and s["faults"][0]["kind"] == "ioerror"


SWALLOWS = """
    import argparse, os
    from chaos import probe
    ap = argparse.ArgumentParser(); ap.add_argument("--out"); out = ap.parse_args().out
    ckpt = os.path.join(out, "ckpt.txt")
    step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    if step:
        probe.resumed(step)
    while step < 8:
        step += 1
        probe.step(step)
        if step % 2 == 0:
            try:  # a careful save, but its errors are only logged: the save is acknowledged anyway
                with open(ckpt + ".tmp", "w") as f:
                    f.write(str(step)); f.flush(); os.fsync(f.fileno())
                os.replace(ckpt + ".tmp", ckpt)
            except OSError as exc:
                print("save failed, carrying on:", exc, flush=True)
            probe.saved(step)
    open(os.path.join(out, "final.txt"), "w").write(str(step))
"""


def test_a_save_acknowledged_after_its_write_failed_is_lost_work(tmp_path: Path) -> None:
    swallows = script(tmp_path, "swallows.py", SWALLOWS)
    # events 0-4: open, write, fsync, close, rename of the step-2 save; 6: the write of the step-4 one
    proc, doc = run_json(tmp_path, "--point", "rank0:op6:enospc", "--", *swallows)
    s = only(doc)
    assert s["outcome"] == "lost_work", s["summary"]
    assert s["summary"].startswith("rank 0's write of ckpt.txt.tmp (event 6) raised ENOSPC")
    assert "; the job carried on and was killed at its next step (5); then" in s["summary"]
    assert "resumed from step 2, but its checkpoint of step 4 was complete (chaos.probe.saved)" in s["summary"]


def test_the_careful_job_stops_on_every_sampled_io_error_and_resumes(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--faults", "errno", "--max-points", "12",
                         "--seed", "5", "--", *CAREFUL)
    assert proc.returncode == 0, proc.stdout
    assert doc["summary"]["pass"] == 12
    assert {s["fired"][0]["action"] for s in doc["scenarios"]} <= {"enospc", "eio", "fsync_fail"}


# ---------------------------------------------------------------------- SIGTERM with a grace period
def test_the_careful_job_saves_on_sigterm_and_loses_nothing(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", "rank0:step4:term", "--", *CAREFUL)
    assert proc.returncode == 0, proc.stdout
    s = only(doc)
    assert s["outcome"] == "pass"
    term = s["attempts"][0]["term"]
    assert term["exited_within_grace"] == [0] and term["killed_after_grace"] == [] and term["grace_s"] == 5.0
    assert s["attempts"][0]["returncodes"] == [143] and len(s["attempts"]) == 2  # preempted, then restarted
    assert s["summary"].startswith("SIGTERM at rank 0's step 4: exited 143 within the 5 s grace; then")
    assert s["oracles"]["preemption_exit"]["result"] == "pass"
    assert s["oracles"]["durability"]["evidence"]["ranks"]["0"]["resumed_at"] == 4


IGNORES = """
    import argparse, os, signal, time
    from chaos import probe
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ap = argparse.ArgumentParser(); ap.add_argument("--out"); out = ap.parse_args().out
    ckpt = os.path.join(out, "ckpt.txt")
    step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    while step < 10:
        step += 1
        probe.step(step)
        time.sleep(0.15)  # 8 steps still to go after the SIGTERM at step 2: far longer than the grace
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(step)); f.flush(); os.fsync(f.fileno())
        os.replace(ckpt + ".tmp", ckpt)
    open(os.path.join(out, "final.txt"), "w").write(str(step))
"""


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    ignores = script(tmp_path, "ignores.py", IGNORES)
    proc, doc = run_json(tmp_path, "--grace", "0.5", "--result-file", "final.txt", "--point", "rank0:step2:term",
                         "--", *ignores)
    s = only(doc)
    term = s["attempts"][0]["term"]
    assert term["killed_after_grace"] == [0] and term["exited_within_grace"] == [] and term["grace_s"] == 0.5
    assert s["attempts"][0]["returncodes"] == [-9]
    assert s["summary"].startswith("SIGTERM at rank 0's step 2: still running after the 0.5 s grace, SIGKILLed")
    assert s["outcome"] == "pass" and s["faults"][0]["params"]["grace_s"] == 0.5


ACKS_AND_EXITS = """
    import argparse, json, os, signal, sys
    from chaos import probe
    ap = argparse.ArgumentParser(); ap.add_argument("--out"); out = ap.parse_args().out
    ckpt = os.path.join(out, "ckpt.json")
    state = {"step": 0}
    def on_term(*_):  # "the async save will finish": acknowledged, never written
        probe.saved(state["step"])
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    if os.path.exists(ckpt):
        state = json.load(open(ckpt))
        probe.resumed(state["step"])
    while state["step"] < 9:
        state["step"] += 1
        probe.step(state["step"])
        if state["step"] % 3 == 0:
            with open(ckpt + ".tmp", "w") as f:
                json.dump(state, f); f.flush(); os.fsync(f.fileno())
            os.replace(ckpt + ".tmp", ckpt)
            probe.saved(state["step"])
    json.dump(state, open(os.path.join(out, "final.json"), "w"))
"""


def test_a_job_that_acknowledges_a_save_on_sigterm_it_never_made_is_lost_work(tmp_path: Path) -> None:
    acks = script(tmp_path, "acks.py", ACKS_AND_EXITS)
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", "rank0:step5:term", "--", *acks)
    assert proc.returncode == 1
    s = only(doc)
    assert s["outcome"] == "lost_work", s["summary"]  # a CI run once judged it hard_failure, summary unknown
    assert s["summary"] == ("SIGTERM at rank 0's step 5: exited 0 within the 5 s grace; then rank 0 resumed from "
                            "step 3, but its checkpoint of step 5 was complete (chaos.probe.saved): 2 step(s) of "
                            "work lost")
    assert s["oracles"]["preemption_exit"]["result"] == "fail"  # exiting 0 at step 5 of 9 is a defect too


EXITS_ZERO = """
    import argparse, json, os, signal, sys
    from chaos import probe
    ap = argparse.ArgumentParser(); ap.add_argument("--out"); ap.add_argument("--steps", type=int)
    args = ap.parse_args(); out = args.out
    ckpt = os.path.join(out, "ckpt.json")
    state = {"step": 0, "term": False}
    signal.signal(signal.SIGTERM, lambda *_: state.update(term=True))
    if os.path.exists(ckpt):
        state = json.load(open(ckpt))
        probe.resumed(state["step"])
    def save():
        with open(ckpt + ".tmp", "w") as f:
            json.dump({"step": state["step"]}, f); f.flush(); os.fsync(f.fileno())
        os.replace(ckpt + ".tmp", ckpt)
        fd = os.open(out, os.O_RDONLY); os.fsync(fd); os.close(fd)
        probe.saved(state["step"])
    while state["step"] < args.steps:
        state["step"] += 1
        probe.step(state["step"])
        save()
        if state.get("term"):
            sys.exit(0)  # "preempted, saved, bye": status 0 says the job is done
    json.dump({"step": state["step"]}, open(os.path.join(out, "final.json"), "w"))
"""


@pytest.mark.parametrize("steps, outcome", [(9, "hard_failure"), (5, "pass")])
def test_exiting_0_on_sigterm_before_the_end_is_a_hard_failure(tmp_path: Path, steps: int, outcome: str) -> None:
    job = script(tmp_path, "exits0.py", EXITS_ZERO)
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", "rank0:step5:term", "--", *job,
                         "--steps", str(steps))
    s = only(doc)
    assert s["outcome"] == outcome, s["summary"]
    exit_oracle = s["oracles"]["preemption_exit"]
    assert exit_oracle["evidence"] == {"returncodes": [0], "last_step": 5, "fault_free_last_step": steps}
    if outcome == "hard_failure":  # everything else held: the resume was exact and lost nothing
        assert proc.returncode == 1
        assert "exited with status 0 at step 5 of 9" in s["summary"] and "never resumes it" in s["summary"]
        assert s["oracles"]["durability"]["result"] == "pass" and s["oracles"]["result_files"]["result"] == "pass"
    else:  # SIGTERM at the last step: exiting 0 is right, the job was done
        assert proc.returncode == 0 and exit_oracle["result"] == "pass"


# ---------------------------------------------------------------------- a real full disk
PILES_UP = """
    import argparse, glob, json, os
    from chaos import probe
    ap = argparse.ArgumentParser(); ap.add_argument("--out"); out = ap.parse_args().out
    found = sorted(glob.glob(os.path.join(out, "ckpt-*.json")))
    state = {"step": 0, "pad": "x" * 3000}  # a checkpoint of one tmpfs page
    if found:  # the newest by name, unverified: a partial one raises here
        state = json.load(open(found[-1]))
        probe.resumed(state["step"])
    while state["step"] < 12:
        state["step"] += 1
        probe.step(state["step"])
        if state["step"] % 2 == 0:  # written straight under its final name, every one kept
            with open(os.path.join(out, f"ckpt-{state['step']:04d}.json"), "w") as f:
                json.dump(state, f)
            probe.saved(state["step"])
    json.dump({"step": state["step"]}, open(os.path.join(out, "final.json"), "w"))
"""


@needs_tmpfs
def test_a_full_disk_leaves_the_careless_job_a_partial_newest_checkpoint(tmp_path: Path) -> None:
    piles = script(tmp_path, "piles.py", PILES_UP)
    # three pages: ckpt-0002..0006 fit, ckpt-0008 is created and its write fails
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--point", "disk:full:12288", "--", *piles)
    assert proc.returncode == 1
    s = only(doc)
    assert s["outcome"] == "hard_failure" and "JSONDecodeError" in s["summary"]
    assert s["summary"].startswith("{out} on a 12288-byte tmpfs: rank 0's write of ckpt-0008.json (event ")
    assert " got ENOSPC; remounted at " in s["summary"]
    applied = s["fault_applied"]
    assert applied["mount"]["mechanism"] == "tmpfs-mount" and applied["mount"]["capacity_bytes"] == 12288
    assert applied["remounted_to"] > 12288 and applied["first_enospc"]["rel"] == "ckpt-0008.json"
    assert s["faults"][0] == {"kind": "diskfull", "rank": None, "step": None, "attempt": 0,
                              "params": {"size_bytes": 12288}, "spec": "disk:full:12288"}
    assert mounts_under(tmp_path) == []


@needs_tmpfs
def test_the_careful_job_survives_a_full_disk_and_nothing_stays_mounted(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--ranks", "2", "--result-file", "final-rank*.json", "--point", "disk:full:4096",
                         "--", *CAREFUL)
    assert proc.returncode == 0, proc.stdout
    assert only(doc)["outcome"] == "pass" and "got ENOSPC" in only(doc)["summary"]
    proc, doc = run_json(tmp_path, "--result-file", "final.json", "--faults", "diskfull", "--", *CAREFUL,
                         name="found.json")
    assert proc.returncode == 0, proc.stdout
    s = only(doc)
    assert s["id"].startswith("disk:full:") and s["outcome"] == "pass"
    assert 0 < s["faults"][0]["params"]["size_bytes"] < doc["job"]["reference"]["peak_out_bytes"]
    assert mounts_under(tmp_path) == []


def test_a_full_disk_where_no_tmpfs_can_be_mounted_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos.nemesis import diskfull
    from chaos.run.explore import explore

    monkeypatch.setattr(diskfull, "_available", (False, "not root: mounting tmpfs needs CAP_SYS_ADMIN"))
    job = JobSpec(command=tuple(CAREFUL), result_globs=("final.json",), cwd=str(REPO))
    assert "diskfull" not in explore(job, max_points=1, scratch_base=str(tmp_path)).reference.kinds
    [res] = explore(job, only=parse_point("disk:full:8192"), scratch_base=str(tmp_path)).results
    assert (res.verdict.verdict, res.verdict.outcome) == ("skipped", "unsupported")
    assert res.verdict.summary == "a real full disk cannot be made here: not root: mounting tmpfs needs CAP_SYS_ADMIN"
    assert res.record.attempts == []


# ---------------------------------------------------------------------- the exploration as a whole
def test_points_are_enumerated_deterministically_and_counted_by_kind(tmp_path: Path) -> None:
    from chaos.run.explore import reference

    job = JobSpec(command=tuple(CAREFUL), result_globs=("final.json",), cwd=str(REPO))
    first, _ = reference(job, str(tmp_path / "a"), jobs=1, seed=4)
    again, _ = reference(job, str(tmp_path / "b"), jobs=1, seed=4)
    assert [p.id for p in first.points] == [p.id for p in again.points]
    families = [p.family for p in first.points]
    assert families == sorted(families, key=["kill", "term", "errno", "corrupt", "power", "diskfull"].index)
    assert {"kill", "term", "errno", "corrupt", "power"} <= set(families)


def test_the_sample_is_spread_over_the_kinds() -> None:
    from chaos.plan.pointset import sample

    points = [Point(0, "after", op=i) for i in range(40)] + [Point(0, "power", op=i) for i in range(3)] + [
        Point(0, "term", step=i) for i in range(10)]
    chosen = sample(points, 9, seed=1)
    assert sorted(p.family for p in chosen) == ["kill"] * 3 + ["power"] * 3 + ["term"] * 3
    assert [p.id for p in sample(points, 9, seed=1)] == [p.id for p in chosen]
    kills = [p for p in points if p.family == "kill"]
    assert len(sample(kills, 5, seed=2)) == 5  # one family: a plain seeded sample, as before
