"""The built-in ``disk:stepS:full,free=B`` (``diskfull:step=S,free=B``) as a user's job's point: {out}
fills up when rank 0 announces step S, leaving B bytes, so ``chaos run --as-job --fault
diskfull:step=9,free=4096`` (the default campaign's full disk) runs through the job pipeline
(issue #28).

{out} is a roomy tmpfs until the step; then the launcher shrinks it to what it holds plus B
bytes (``chaos.nemesis.diskfull.fill``: no filler file the job could see), and the rank waits
for that before it goes on. Unit tests for the grammar; then real one-process jobs through the
CLI (root and tmpfs), and the built-in workload through ``--as-job`` (slow).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from jobcli import CAREFUL, REPO, run_json

from chaos.errors import ConfigError
from chaos.model.grammar import parse_fault, parse_point
from chaos.nemesis import diskfull

needs_tmpfs = pytest.mark.skipif(not diskfull.available()[0], reason=f"no tmpfs here: {diskfull.available()[1]}")


def test_a_disk_filled_at_a_step_reads_in_both_spellings() -> None:
    point = parse_point("disk:step8:full,free=4096")
    assert point == parse_point("diskfull:step=8,free=4096")
    assert (point.family, point.step, point.size, point.in_rank, point.id) == ("diskfull", 8, 4096, True,
                                                                                "disk:step8:full,free=4096")
    assert parse_point(point.id) == point
    assert point.to_fault() == {**parse_fault("disk:step8:full,free=4096").to_dict(), "rank": None}
    assert parse_point("disk:step3:full").size == 0  # the built-in default: nothing left free
    assert not parse_point("disk:full:8192").in_rank  # a job's own full disk stays the harness's alone
    with pytest.raises(ConfigError, match="takes no second fault"):
        parse_point("disk:step8:full,free=0+rank0:op1:before")
    with pytest.raises(ConfigError, match="attempt= is the built-in workload's"):
        parse_point("diskfull:step=8,free=0,attempt=1")


def _mounted_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(path))]


@needs_tmpfs
def test_a_disk_filled_at_a_step_meets_the_job_s_next_write(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--point", "disk:step6:full,free=0", "--point", "diskfull:step=6,free=65536",
                         "--result-file", "final.json", "--", sys.executable, str(CAREFUL), "--out", "{out}")
    assert _mounted_under(tmp_path) == []  # observed before the fixture cleans: every tmpfs is gone
    got = {s["id"]: s for s in doc["scenarios"]}
    full = got["disk:step6:full,free=0"]
    assert (full["verdict"], full["outcome"]) == ("pass", "pass"), full["summary"]
    assert full["summary"].startswith("{out} filled at step 6, leaving 0 byte(s)")
    assert "rank 0's write of ckpt-000006.json.tmp" in full["summary"] and "got ENOSPC" in full["summary"]
    assert full["faults"][0] == {"kind": "diskfull", "rank": None, "step": 6, "attempt": 0, "params": {"free": 0},
                                 "spec": "disk:step6:full,free=0"}
    room = got["disk:step6:full,free=65536"]  # room for the rest of the run: it did nothing, skipped
    assert (room["verdict"], room["outcome"]) == ("skipped", "no_effect"), room["summary"]


@needs_tmpfs
def test_a_disk_filled_at_a_step_the_job_never_announces_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--point",
                           "disk:step99:full", "--result-file", "final.json", "--", sys.executable, str(CAREFUL),
                           "--out", "{out}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "--point disk:step99:full is not a point of this job: rank 0's last step announced" in proc.stderr


@needs_tmpfs
@pytest.mark.slow
def test_the_built_in_workload_s_full_disk_runs_as_a_job(tmp_path: Path) -> None:
    proc, doc = run_json(tmp_path, "--as-job", "--steps", "12", "--save-every", "5", "--fault",
                         "diskfull:step=9,free=4096")
    (result,) = doc["scenarios"]
    assert result["id"] == "disk:step9:full,free=4096", proc.stdout[-2000:]
    assert (result["verdict"], result["outcome"]) == ("pass", "pass"), result["summary"]
    assert re.search(r"rank [01]'s write of ckpt/\.tmp-step-0000000010-\w+/shard-r0000[01]\.safetensors \(event \d+\) "
                     "got ENOSPC", result["summary"]), result["summary"]  # (the ranks race to the full disk)
    assert _mounted_under(tmp_path) == []
