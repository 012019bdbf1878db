"""A kill point's first attempt rebuilt from the fault-free trace gives the verdict running to it gives (#30).

``--materialize`` writes {out} (and the job's temp dir) as the fault-free trace says they
were at the event, and the trace up to it, instead of running the job to the point; the
restart then runs for real. Point by point, the verdict, the outcome and the summary must be
the ones a run to the point gets.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from chaos.model.jobspec import JobSpec, parse_point
from chaos.run import explore
from chaos.run.materialize import why_not

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "chaos" / "examples"

TORCH_JOB = """
import os, sys
import torch
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
w = torch.zeros(4)
ckpt = os.path.join(out, "ckpt.pt")
start = torch.load(ckpt)["step"] if os.path.exists(ckpt) else 0
if start:
    w = torch.load(ckpt)["w"]
for step in range(start, 6):
    w = w + torch.arange(4.0) * (step + 1)
    if (step + 1) % 2 == 0:
        torch.save({"w": w, "step": step + 1}, ckpt)
torch.save(w, os.path.join(out, "final.pt"))
"""


def _both_ways(job: JobSpec, tmp: Path, max_points: int, seed: int) -> tuple[dict, dict, int]:
    ran = explore.explore(dataclasses.replace(job, materialize=False), max_points=max_points, jobs=1, seed=seed,
                          scratch_base=str(tmp))
    rebuilt = explore.explore(dataclasses.replace(job, materialize=True), max_points=max_points, jobs=1, seed=seed,
                              scratch_base=str(tmp))
    verdicts = [{r.point.id: (r.verdict.verdict, r.verdict.outcome, r.verdict.summary) for r in e.results}
                for e in (ran, rebuilt)]
    materialized = sum(1 for r in rebuilt.results if r.record.attempts and r.record.attempts[0].materialized)
    return verdicts[0], verdicts[1], materialized


@pytest.mark.parametrize("example", ["careless_job.py", "careful_job.py"])
def test_every_materialized_point_gets_the_verdict_of_running_to_it(example: str, tmp_path: Path) -> None:
    job = JobSpec(command=(sys.executable, str(EXAMPLES / example), "--out", "{out}"), faults=("kill",),
                  result_globs=("final.json",), cwd=str(REPO))
    ran, rebuilt, materialized = _both_ways(job, tmp_path, 16, seed=1)
    assert len(ran) == 16 and rebuilt == ran
    assert materialized >= 8  # the kills at events; step kills still run
    if example == "careless_job.py":
        assert any(v[1] == "hard_failure" for v in ran.values())  # its defect, found both ways


@pytest.mark.parametrize("example", ["careless_job.py", "careful_job.py"])
def test_every_materialized_torn_write_gets_the_verdict_of_running_to_it(example: str, tmp_path: Path) -> None:
    """A torn point on a write: the trace up to it, the write cut to its first half, the short_write
    rule's fired record; on any other event (the tracer kills before it) the point still runs."""
    job = JobSpec(command=(sys.executable, str(EXAMPLES / example), "--out", "{out}"), faults=("kill",),
                  modes=("torn",), result_globs=("final.json",), cwd=str(REPO))
    ran, rebuilt, materialized = _both_ways(job, tmp_path, 12, seed=2)
    assert len(ran) == 12 and rebuilt == ran
    assert materialized >= 4, materialized
    if example == "careless_job.py":
        assert any(v[1] == "hard_failure" and "JSONDecodeError" in v[2] for v in ran.values())  # the torn ckpt.json


@pytest.mark.parametrize("example", ["careless_job.py", "careful_job.py"])
@pytest.mark.parametrize(("family", "least"), [("corrupt", 16), ("power", 16)])
def test_every_materialized_halt_gets_the_verdict_of_running_to_it(example: str, family: str, least: int,
                                                                   tmp_path: Path) -> None:
    """A corruption or a power loss right after event N: attempt 0 rebuilt and marked halted, then the
    file corrupted (or {out} replaced by the cut's crash state, mixed ones included) and the job
    restarted, exactly as after a real halt."""
    job = JobSpec(command=(sys.executable, str(EXAMPLES / example), "--out", "{out}"), faults=(family,),
                  result_globs=("final.json",), cwd=str(REPO))
    ran, rebuilt, materialized = _both_ways(job, tmp_path, 16, seed=3)
    assert len(ran) == 16 and rebuilt == ran
    assert materialized >= least, materialized  # a corruption waiting for a step (:stepN) too
    if example == "careless_job.py":
        assert any(v[0] == "fail" for v in ran.values())  # its defect, found both ways


STAGED_JOB = """
import json, os, sys, tempfile
out = sys.argv[1]
ckpt = os.path.join(out, "ckpt.json")
start = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
for step in range(start, 4):
    # Lightning Fabric's _atomic_save: the new file staged in the system temp dir, then moved in
    fd, tmp = tempfile.mkstemp(suffix=".ckpt")
    with os.fdopen(fd, "w") as f:
        json.dump({"step": step + 1}, f)
    os.replace(tmp, ckpt)
json.dump({"done": 4}, open(os.path.join(out, "final.json"), "w"))
"""


def test_a_job_that_stages_its_saves_in_the_temp_dir_is_materialized(tmp_path: Path) -> None:
    """Its temp file lies in the rank's folder of the temp dir, which the boot path made before the
    tracer ran: the rebuilt temp tree has that folder, and the kills at its events are materialized
    with the verdicts of running to them."""
    script = tmp_path / "staged_job.py"
    script.write_text(STAGED_JOB)
    job = JobSpec(command=(sys.executable, str(script), "{out}"), faults=("kill",), result_globs=("final.json",),
                  cwd=str(tmp_path))
    ran, rebuilt, materialized = _both_ways(job, tmp_path, 10, seed=0)

    def masked(verdicts: dict) -> dict:  # the scratch root's and mkstemp's random names
        return {k: re.sub(r"chaos-job-\w+|tmp\w{8}\.ckpt", "X", str(v)) for k, v in verdicts.items()}

    assert len(ran) == 10 and masked(rebuilt) == masked(ran)
    assert materialized >= 8, materialized


@pytest.mark.slow  # two explorations of a torch script: about 25 s
def test_a_torch_script_gets_the_same_verdicts_materialized(tmp_path: Path) -> None:
    script = tmp_path / "torch_job.py"
    script.write_text(TORCH_JOB)
    job = JobSpec(command=(sys.executable, str(script), "{out}"), faults=("kill",),
                  modes=("before", "after", "torn"), result_globs=("final.pt",), cwd=str(tmp_path))
    ran, rebuilt, materialized = _both_ways(job, tmp_path, 9, seed=0)
    assert rebuilt == ran and materialized >= 8, materialized  # torn on a write of one byte still runs


VARYING_JOB = """
import json, os, sys, uuid
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
runs = os.path.join(os.getcwd(), "runs")  # outside {out}: counts this job's runs, untraced
n = (int(open(runs).read()) if os.path.exists(runs) else 0) + 1
open(runs, "w").write(str(n))
p = os.path.join(out, "ckpt.json")
start = json.load(open(p))["step"] if os.path.exists(p) else 0
for step in range(start, 4):
    tmp = os.path.join(out, f"ckpt-{uuid.uuid4().hex}.tmp")  # a new name each run: that alone is no variation
    with open(tmp, "w") as f:
        json.dump({"step": step + 1}, f)
        if n % 2 and sys.argv[2] == "vary":  # but an fsync every other run makes is: the two fault-free runs differ
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, p)
with open(os.path.join(out, "final.json"), "w") as f:
    json.dump({"done": True}, f)
"""


@pytest.mark.parametrize("vary", [True, False])
def test_a_job_whose_events_vary_between_runs_is_never_materialized(tmp_path: Path, vary: bool) -> None:
    """Accelerate's traced events vary from run to run (docs/benchmarks.md): one fault-free trace
    cannot stand for every run, so every point runs to the point, and the notes say why. A temp
    file's random name alone is no such variation."""
    script = tmp_path / "varying_job.py"
    script.write_text(VARYING_JOB)
    job = JobSpec(command=(sys.executable, str(script), "{out}", "vary" if vary else "same"), faults=("kill",),
                  modes=("before", "after"), result_globs=("final.json",), cwd=str(tmp_path), materialize=True)
    e = explore.explore(job, max_points=4, seed=0, scratch_base=str(tmp_path))
    materialized = [r for r in e.results if r.record.attempts and r.record.attempts[0].materialized]
    said = any("materialize: the two fault-free runs traced different file events" in n for n in e.reference.notes)
    assert len(e.results) == 4 and e.reference.same_events is not vary and said is vary
    assert len(materialized) == (0 if vary else 4)


def test_only_what_the_trace_can_say_is_materialized() -> None:
    one = JobSpec(command=("python", "t.py", "{out}"))
    assert why_not(one, parse_point("rank0:op3:after"), untraced=False) is None
    assert why_not(one, parse_point("rank0:op3:before"), untraced=False) is None
    assert why_not(one, parse_point("rank0:op3:torn"), untraced=False) is None  # a write's first half, then a kill
    assert "in the middle of a file event" in why_not(one, parse_point("rank0:step3:kill"), untraced=False)
    assert why_not(one, parse_point("rank0:op3:bitflip"), untraced=False) is None  # halted right after event 3
    assert why_not(one, parse_point("rank0:op3:delete"), untraced=False) is None
    assert why_not(one, parse_point("rank0:op3:bitflip:step4"), untraced=False) is None  # halted at step 4
    assert why_not(one, parse_point("rank0:op3:power"), untraced=False) is None
    assert why_not(one, parse_point("rank0:op3:power:s2"), untraced=False) is None
    assert "in the middle of a file event" in why_not(one, parse_point("rank0:op3:stale"), untraced=False)
    two = JobSpec(command=("python", "t.py", "{out}"), ranks=2)
    assert "one-process" in why_not(two, parse_point("rank0:op3:after"), untraced=False)
    assert "no traced event explains" in why_not(one, parse_point("rank0:op3:after"), untraced=True)
    assert "traced different file events" in why_not(one, parse_point("rank0:op3:after"), untraced=False, varies=True)
    assert "--no-materialize" in why_not(dataclasses.replace(one, materialize=False), parse_point("rank0:op3:after"),
                                         untraced=False)
    sbatch = dataclasses.replace(one, launcher="sbatch")
    assert "--launcher sbatch" in why_not(sbatch, parse_point("rank0:op3:after"), untraced=False)


def test_materializing_is_the_default_and_older_results_replay_as_they_ran() -> None:
    """On by default since 2026-12-06: a results file records it either way, and one written
    before (no ``materialize`` key) ran every point to the point, so it replays that way."""
    one = JobSpec(command=("python", "t.py", "{out}"))
    assert one.materialize and "materialize" not in " ".join(one.replay_args())
    off = dataclasses.replace(one, materialize=False)
    assert "--no-materialize" in off.replay_args()
    assert JobSpec.from_dict(one.to_dict()).materialize is True
    assert JobSpec.from_dict(off.to_dict()).materialize is False
    older = {k: v for k, v in one.to_dict().items() if k != "materialize"}
    assert JobSpec.from_dict(older).materialize is False
