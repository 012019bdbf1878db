"""One attempt of a job: torchrun's environment for --ranks, nothing survives a timeout."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from chaos.launch.job import run_attempt
from chaos.model.jobspec import JobSpec
from faults.process import alive


def test_ranks_get_torchruns_environment(tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT"]
        json.dump({k: os.environ.get(k) for k in keys}, open(os.path.join(sys.argv[1], os.environ["RANK"]), "w"))
    """))
    out = tmp_path / "out"
    out.mkdir()
    job = JobSpec(command=(sys.executable, str(script), "{out}"), ranks=2)
    outcome = run_attempt(job, str(out), str(tmp_path / "s"), 1, None, str(tmp_path))
    assert outcome.ok, outcome.tail()
    envs = [json.loads((out / str(r)).read_text()) for r in range(2)]
    assert [e["RANK"] for e in envs] == ["0", "1"] and [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"} == {e["LOCAL_WORLD_SIZE"] for e in envs}
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] and envs[0]["MASTER_ADDR"] == "127.0.0.1"
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in envs} == {"1"}


def test_a_timeout_kills_the_job_and_what_left_its_session(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        open(os.path.join(sys.argv[1], "child"), "w").write(str(child.pid))
        time.sleep(120)
    """))
    out = tmp_path / "out"
    out.mkdir()
    job = JobSpec(command=(sys.executable, str(script), "{out}"), timeout_s=3.0)
    outcome = run_attempt(job, str(out), str(tmp_path / "s"), 0, None, str(tmp_path))
    assert outcome.timed_out and not outcome.ok and outcome.describe == "timed out"
    child = int((out / "child").read_text())
    assert child in outcome.leftovers and not alive(child)
