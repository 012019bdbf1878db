"""``chaos run --as-job``: the built-in run's options, sent through the job pipeline (#28).

The translation is checked on its own (no process started), then once end to end: a
checkpointer that saves only the model, run as the built-in workload's job, diverges and
the verdict names the leaf the resume lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.cli.asjob import DEFAULT_POINTS, job_argv
from chaos.cli.main import make_parser
from chaos.errors import ConfigError
from chaos.target.workload.job import RESULT_FILES

REPO = Path(__file__).resolve().parent.parent
MODEL_ONLY = "tests/checkpointers/model_only.py:ModelOnlyCheckpointer"


def translate(*argv: str) -> list[str]:
    args, rest = make_parser().parse_known_args(["run", "--as-job", *argv])
    return job_argv(args, rest)


def test_the_built_in_options_become_the_job_and_its_command() -> None:
    argv = translate("--world-size", "3", "--steps", "6", "--save-every", "3", "--seed", "7", "--workload",
                     "d_model=32", "--ckpt-opt", "hash=sha256", "--checkpointer", MODEL_ONLY, "--json", "r.json",
                     "--faults", "kill,power", "--jobs", "2")
    options, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    assert options[:10] == ["--ranks", "3", "--result-file", RESULT_FILES, "--max-restarts", "3", "--seed", "7",
                            "--hang-timeout", "60.0"]  # the built-in default, with its meaning (chaos.launch.silence)
    assert ["--json", "r.json"] == options[10:12]
    assert options[-6:] == ["--max-points", str(DEFAULT_POINTS), "--faults", "kill,power", "--jobs", "2"]
    assert command[:4] == [sys.executable, "-m", "chaos.target.workload", "{out}"]
    # a checkpointer file is made absolute: the ranks run in another directory
    assert command[4:6] == ["--checkpointer", f"{REPO / 'tests/checkpointers/model_only.py'}:ModelOnlyCheckpointer"]
    assert command[6:] == ["--steps", "6", "--save-every", "3", "--seed", "7", "--workload", "d_model=32",
                           "--ckpt-opt", "hash=sha256"]


@pytest.mark.parametrize("chosen", [("--max-points", "3"), ("--max-points=3",), ("--budget", "30"),
                                    ("--fault", "rank0:step3:kill")])
def test_a_run_that_says_how_much_to_explore_gets_no_default_sample(chosen: tuple[str, ...]) -> None:
    argv = translate(*chosen)
    assert "--max-points" not in argv or argv[argv.index("--max-points") + 1] == "3"
    if chosen[0] == "--fault":
        assert argv[argv.index("--point") + 1] == "rank0:step3:kill"


def test_the_docker_driver_becomes_the_docker_launcher() -> None:
    argv = translate("--driver", "docker")
    options, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    assert options[options.index("--launcher") + 1] == "docker" and "--image" not in options
    assert command[0] == sys.executable  # the host-mounted empty image runs this Python
    assert "--launcher" not in translate()  # the process driver: the job mode's own default
    argv = translate("--driver", "docker", "--image", "mine:1")
    options, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    assert options[options.index("--image") + 1] == "mine:1" and command[:3] == ["python3", "-m", "chaos.target.workload"]


@pytest.mark.parametrize(("given", "named"), [(("--device", "cuda"), "--device cuda"),
                                              (("--no-cache",), "--no-cache")])
def test_a_built_in_option_the_job_pipeline_cannot_honour_is_refused(given: tuple[str, ...], named: str) -> None:
    with pytest.raises(ConfigError, match=f"--as-job cannot take {named}"):
        translate(*given)


def test_bad_input_is_one_line_naming_it() -> None:
    for argv, said in ((["--checkpointer", "no/such.py:X"], "checkpointer file not found: no/such.py"),
                       (["--workload", "no_such_key=1"], "--workload"),
                       (["stray"], "unrecognized arguments: stray")):
        proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--as-job", *argv], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow  # 23 s: the translation is checked above, and test_workload_as_job runs the same job per commit
def test_a_model_only_checkpointer_run_as_a_job_diverges_naming_the_leaf(tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--as-job", "--scratch", str(tmp_path),
                           "--json", str(results), "--checkpointer", MODEL_ONLY, "--steps", "4", "--save-every", "2",
                           "--fault", "rank0:step3:kill"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(results.read_text())
    [point] = doc["scenarios"]
    assert (point["id"], point["verdict"], point["outcome"]) == ("rank0:step3:kill", "fail", "silent_divergence")
    assert "first differing key: 'data/position'" in point["summary"]  # committed_state names the lost leaf
    assert "fingerprint.data/position" in point["oracles"]["result_files"]["summary"]
    assert "--point rank0:step3:kill -- " in point["replay"] and " -m chaos.target.workload " in point["replay"]


@pytest.mark.slow  # 30 s: two ranks importing torch in fresh containers at every attempt
def test_the_workload_runs_as_a_job_in_containers_with_the_docker_driver(docker_engine, tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--as-job", "--driver", "docker", "--scratch",
                           str(tmp_path), "--json", str(results), "--checkpointer", MODEL_ONLY, "--steps", "4",
                           "--save-every", "2", "--fault", "rank0:step3:kill"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(results.read_text())
    [point] = doc["scenarios"]
    assert (point["id"], point["outcome"]) == ("rank0:step3:kill", "silent_divergence")  # as with processes
    attempts = point["oracles"]["liveness"]["evidence"]["attempts"]
    assert all(len(a["containers"]) == 2 for a in attempts)  # each rank a container
    assert doc["job"]["spec"]["launcher"] == "docker" and doc["environment"]["docker"]["host_mounted"] is True
