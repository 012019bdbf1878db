"""JobSpec and Point: parsing, validation, replay commands (pure data, no processes)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from chaos.errors import ConfigError
from chaos.model.jobspec import JobSpec, Point, parse_point


@pytest.mark.parametrize("text", ["rank0:op17:before", "rank1:op3:after", "rank2:op0:torn", "rank0:step5:kill"])
def test_point_ids_round_trip(text: str) -> None:
    assert parse_point(text).id == text


@pytest.mark.parametrize("text", ["rank0:op17", "op17:before", "rank0:op1:sideways", "rank0:step5:before"])
def test_a_malformed_point_is_a_config_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError, match="malformed --point"):
        parse_point(text)


def test_a_command_without_out_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"has no \{out\}"):
        JobSpec(command=("python", "train.py"))


def test_a_step_regex_needs_a_group() -> None:
    with pytest.raises(ConfigError, match="one group"):
        JobSpec(command=("python", "t.py", "{out}"), step_regex=r"step \d+")


def test_ranks_with_a_torchrun_command_is_refused() -> None:
    with pytest.raises(ConfigError, match="torchrun launches the ranks"):
        JobSpec(command=("torchrun", "--nproc-per-node", "2", "t.py", "{out}"), ranks=2)


def test_torchrun_commands_are_recognised_with_their_world_size() -> None:
    assert JobSpec(command=("/venv/bin/torchrun", "--nproc-per-node", "3", "t.py", "{out}")).world_size == 3
    assert JobSpec(command=("python", "-m", "torch.distributed.run", "--nproc_per_node=2", "t.py", "{out}")).torchrun
    assert not JobSpec(command=("python", "t.py", "{out}")).torchrun


def test_the_replay_command_names_the_point_and_rebuilds_the_spec() -> None:
    job = JobSpec(command=("python", "t.py", "--out", "{out}"), resume_command=("python", "t.py", "--resume", "{out}"),
                  ranks=2, result_globs=("final*.json",), step_regex=r"step (\d+)")
    cmd = shlex.split(job.replay_command(Point(1, "after", op=4)))
    cut = cmd.index("--")
    assert cmd[cut + 1:] == ["python", "t.py", "--out", "{out}"]
    assert cmd[cmd.index("--point") + 1] == "rank1:op4:after"
    from chaos.cli.job import build

    args, again = build(cmd[2:])
    assert again == job and args.point == ["rank1:op4:after"]


def test_bad_job_options_exit_2_with_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--jobs", "0", "--", "python", "t.py", "{out}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["chaos: error: --jobs must be at least 1, got 0"]
