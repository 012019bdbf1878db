"""Loss continuity for a user's own job: ``--loss-regex`` on its output, or ``chaos.probe.step(n, loss)``.

End to end, a job that checkpoints its weights atomically and durably but forgets its
momentum: no file it writes differs after a resume that the harness could compare
(there is no result file), the resume starts at the newest checkpoint (durability
passes), and only the loss curve shows the damage. The unit tests pin the judging on
hand-made traces: exact when the fault-free runs agreed, within the band otherwise,
rank 0 alone logging, a spike after the resume.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.errors import ConfigError
from chaos.judge import losscurve
from chaos.model.jobspec import JobSpec, loss_groups

REPO = Path(__file__).resolve().parent.parent

FORGETFUL = '''
import json, os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
ckpt = os.path.join(out, "ckpt.json")
step, w, momentum = 0, 4.0, 0.0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        saved = json.load(f)
    step, w = saved["step"], saved["w"]   # the momentum is not in the checkpoint: it restarts at 0
    print(f"resumed at {step}", flush=True)
while step < 10:
    step += 1
    momentum = 0.9 * momentum + 0.2 * w
    w -= momentum
    print(f"it {step} loss={w * w:.9f}", flush=True)
    if step % 4 == 0:
        tmp = ckpt + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step, "w": w}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ckpt)
        fd = os.open(out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
'''
LOSS_RX = r"it (?P<step>\d+) loss=(?P<loss>\S+)"


def _run(tmp_path: Path, *options: str) -> tuple[int, dict, str]:
    job = tmp_path / "forgetful.py"
    job.write_text(FORGETFUL)
    results = tmp_path / "r.json"
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(scratch), "--faults", "kill",
                           "--point", "rank0:step6:kill", *options,
                           "--json", str(results), "--", sys.executable, str(job), "{out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    return proc.returncode, json.loads(results.read_text()), proc.stdout + proc.stderr


def test_a_resume_that_forgets_momentum_is_caught_by_the_loss_curve_alone(tmp_path: Path) -> None:
    rc, doc, out = _run(tmp_path, "--loss-regex", LOSS_RX)  # its loss lines also say which step ran
    assert rc == 1, out
    point = doc["scenarios"][0]
    assert point["outcome"] == "silent_divergence", point["summary"]
    loss = point["oracles"]["loss_continuity"]
    assert loss["result"] == "fail"
    first = loss["evidence"]["first_outside_band"]
    assert (first["attempt"], first["rank"], first["step"]) == (1, 0, 5), first  # the first re-run step after 4
    assert loss["evidence"]["band"] == 0.0  # the fault-free runs agreed bit for bit: exact mode
    assert point["oracles"]["durability"]["result"] != "fail"  # it resumed at the newest checkpoint
    assert doc["job"]["reference"]["loss_steps"] == {"0": 10}
    assert "--loss-regex" in point["replay"]

    # The same point without --loss-regex: nothing else can see the damage, and it says why.
    rc, doc, out = _run(tmp_path, "--step-regex", r"it (\d+) ")
    assert rc == 0, out
    point = doc["scenarios"][0]
    assert point["outcome"] == "pass"
    assert point["oracles"]["loss_continuity"]["result"] == "not_judged"
    assert "--loss-regex" in point["oracles"]["loss_continuity"]["summary"]


def _trace(*infos: dict) -> list[dict]:
    return [{"event": "phase", "name": "chaos.probe", "info": i} for i in infos]


GOLD = {0: {1: 1.0, 2: 0.8, 3: 0.6, 4: 0.5, 5: 0.4}}


def _resumed(at: int, losses: dict[int, float]) -> dict[tuple[int, int], list[dict]]:
    return {(0, 0): _trace(*({"kind": "step", "n": s, "loss": GOLD[0][s]} for s in range(1, at + 2))),
            (0, 1): _trace({"kind": "resumed", "n": at}, *({"kind": "loss", "n": s, "loss": v}
                                                            for s, v in sorted(losses.items())))}


def test_an_exact_resume_passes_and_one_ulp_off_fails_in_exact_mode() -> None:
    same = losscurve.continuity(GOLD, 1, _resumed(2, {3: 0.6, 4: 0.5, 5: 0.4}), 0.0)
    assert same.passed, same.summary
    off = losscurve.continuity(GOLD, 1, _resumed(2, {3: 0.6, 4: 0.5000000000000001, 5: 0.4}), 0.0)
    assert not off.passed and off.evidence["first_outside_band"]["step"] == 4


def test_within_the_band_passes_a_spike_after_the_resume_fails() -> None:
    near = losscurve.continuity(GOLD, 1, _resumed(2, {3: 0.601, 4: 0.5, 5: 0.4}), 0.005)
    assert near.passed, near.summary
    spike = losscurve.continuity(GOLD, 1, _resumed(2, {3: 0.6 * 1.004, 4: 0.5 * 1.004, 5: 0.4 * 1.004}), 0.005)
    assert not spike.passed and spike.evidence["spikes"][0]["resumed_at"] == 2, spike.summary


def test_only_rank_0_logging_still_anchors_the_resume_for_the_spike_window() -> None:
    traces = _resumed(2, {3: 0.6 * 1.004, 4: 0.5 * 1.004})
    traces[(1, 0)], traces[(1, 1)] = [], []  # rank 1 logs nothing
    got = losscurve.continuity(GOLD, 2, traces, 0.005)
    assert not got.passed and got.evidence["resumes"][0]["rank"] == 0


def test_loss_regex_groups_named_or_positional_and_typed_errors() -> None:
    assert loss_groups(LOSS_RX) == ("step", "loss")
    assert loss_groups(r"step (\d+) loss ([\d.]+)") == (1, 2)
    for bad, why in ((r"loss ([\d.]+)", "needs the step and the loss"), (r"(?P<step>\d+) (\S+)", "needs"),
                     (r"step (\d+", "not a regular expression")):
        with pytest.raises(ConfigError, match=why):
            JobSpec(command=("python", "x.py", "{out}"), loss_regex=bad)
    with pytest.raises(ConfigError, match="--loss-band"):
        JobSpec(command=("python", "x.py", "{out}"), loss_band=1.5)


def test_a_recorded_spec_with_loss_options_rebuilds_the_same_spec() -> None:
    job = JobSpec(command=("python", "x.py", "{out}"), loss_regex=LOSS_RX, loss_band=0.01, step_regex=r"s (\d+)")
    again = JobSpec.from_dict(json.loads(json.dumps(job.to_dict())))
    assert again == job and again.replay_args() == job.replay_args()
    assert "--loss-band" in again.replay_args() and "0.01" in again.replay_args()


def test_the_fixture_takes_loss_regex_and_band(chaos, tmp_path: Path) -> None:
    job = tmp_path / "forgetful.py"
    job.write_text(FORGETFUL)
    result = chaos.job([sys.executable, str(job), "{out}"], point="rank0:step6:kill", loss_regex=LOSS_RX,
                       loss_band=0.5, options=["--faults", "kill"])
    (point,) = result.points
    assert result.job.loss_band == 0.5
    # Forgetting the momentum moves the next loss by 82 %: outside even this wide band.
    assert point.verdict.outcome == "silent_divergence", point.verdict.summary
    assert point.verdict.oracles["loss_continuity"].evidence["band"] == 0.5
    assert "(band 50.00%)" in point.verdict.summary


def test_a_replay_of_a_seeded_run_carries_its_seed() -> None:
    from chaos.cli.job import replay_argv
    from chaos.model.jobspec import Point

    job = JobSpec(command=("python", "x.py", "{out}"))
    assert "--seed 3 --point rank0:op4:bitflip" in job.replay_command(Point(0, "bitflip", op=4), 3)
    assert "--seed" not in job.replay_command(Point(0, "bitflip", op=4), 0)
    doc = {"job": {"spec": job.to_dict()}, "scenarios": [{"id": "rank0:op4:bitflip", "verdict": "fail", "seed": 3}]}
    argv, _cwd = replay_argv(doc, [], "r.json")
    assert argv[argv.index("--seed") + 1] == "3" and "--point=rank0:op4:bitflip" in argv  # = keeps an id a value
    doc["job"]["spec"]["command"] = ["python", "x.py"]  # no {out}: the recorded spec is broken
    with pytest.raises(ConfigError, match=r"^r\.json: the recorded job spec: .*\{out\}"):
        replay_argv(doc, [], "r.json")
