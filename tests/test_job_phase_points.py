"""A job's kill at a named phase of a save (``--point rank0:step4:kill,phase=commit``).

A checkpointer that announces its phases through ``chaos.phases`` (the reference does:
snapshot, write_manifest, commit, update_latest ...) can be struck at one of them, as the
built-in workload's ``--fault rank1:step23:kill,phase=vote`` always could; ``chaos run
--as-job`` now passes such a fault on. Checked: the grammar, the refusal of a phase the
fault-free run never announced, and a real job killed at its phase, through the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaos.cli.asjob import job_argv
from chaos.cli.main import make_parser
from chaos.errors import ConfigError
from chaos.model.grammar import parse_point
from chaos.model.point import Point

REPO = Path(__file__).resolve().parent.parent

# Six steps; every second one saved as: phase "write" (temp file, fsync), phase "commit" (rename,
# directory fsync), each announced with its step through chaos.phases, as a checkpointer would.
PHASED = """
    import json, os, sys
    from chaos.phases import phase
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "ckpt.json")
    state = {"step": 0, "w": 1.0}
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            state = json.load(f)
    for step in range(state["step"] + 1, 7):
        state = {"step": step, "w": state["w"] * 1.5 + step}
        print(f"step {step}", flush=True)
        if step % 2 == 0:
            phase("write", step=step)
            with open(ckpt + ".tmp", "w") as f:
                json.dump(state, f)
                f.flush()
                os.fsync(f.fileno())
            phase("commit", step=step)
            os.replace(ckpt + ".tmp", ckpt)
            fd = os.open(out, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    with open(os.path.join(out, "final.json"), "w") as f:
        json.dump(state, f)
"""


@pytest.mark.parametrize("text", ["rank1:step23:kill,phase=vote", "kill:rank=1,step=23,phase=vote"])
def test_a_phase_kill_reads_in_both_spellings_and_keeps_its_phase(text: str) -> None:
    p = parse_point(text)
    assert p == Point(1, "kill", step=23, phase="vote")
    assert p.id == p.replay_id == "rank1:step23:kill,phase=vote" and parse_point(p.id) == p
    assert p.env() == {"rank": 1, "mode": "kill", "op": None, "step": 23, "phase": "vote"}
    assert p.to_fault()["params"] == {"when": "kill", "phase": "vote"} and p.family == "kill"


@pytest.mark.parametrize(("text", "says"), [("rank1:step23:term,phase=vote", "a job's term is .* with at most grace, linger"),
                                            ("kill:rank=1,step=3,phase=2x", "is no phase name"),
                                            ("kill:rank=1,step=3,lost=yes", "lost must be true or false")])
def test_other_settings_and_bad_phase_names_are_refused(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_point(text)


def test_the_built_in_fault_at_a_phase_passes_through_as_job() -> None:
    args, rest = make_parser().parse_known_args(["run", "--as-job", "--fault", "rank1:step4:kill,phase=commit"])
    argv = job_argv(args, rest)
    given = argv[argv.index("--point") + 1]
    assert parse_point(given) == Point(1, "kill", step=4, phase="commit")


def _run(tmp_path: Path, point: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "phased_job.py"
    script.write_text(textwrap.dedent(PHASED))
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--json",
                           str(tmp_path / "r.json"), "--result-file", "final.json", "--step-regex", r"step (\d+)",
                           "--point", point, "--", sys.executable, str(script), "{out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_a_job_is_killed_at_the_phase_it_announced(tmp_path: Path) -> None:
    proc = _run(tmp_path, "rank0:step4:kill,phase=commit")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [point] = json.loads((tmp_path / "r.json").read_text())["scenarios"]
    assert (point["id"], point["verdict"]) == ("rank0:step4:kill,phase=commit", "pass")
    [fired] = [f for f in point["fired"] if f["attempt"] == 0]
    assert (fired["action"], fired["op"], fired["phase"], fired["info"]) == ("kill", "phase", "commit", {"step": 4})
    # killed between the two phases: step 4's temp file written, never renamed into place, so the newest
    # complete checkpoint is step 2's (at "write" it would be the same; at step 6's "commit", step 4's)
    assert point["oracles"]["durability"]["summary"].endswith("(newest complete: 2)"), point["summary"]
    assert "--point rank0:step4:kill,phase=commit -- " in point["replay"]


def test_a_phase_the_fault_free_run_never_announced_is_refused_naming_those_it_did(tmp_path: Path) -> None:
    proc = _run(tmp_path, "rank0:step4:kill,phase=vote")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("--point rank0:step4:kill,phase=vote is not a point of this job: rank 0 announced no phase 'vote' of "
            "step 4 in the fault-free run (its phases of that step: commit, write)") in proc.stderr
    assert "Traceback" not in proc.stderr
