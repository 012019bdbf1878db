"""A failing property must shrink to a small schedule whose printed replay command fails again.

The stateful schedule machine (chaos.plan.strategies.schedule_machine) runs against a
known-broken checkpointer, ``tests/checkpointers/model_only.py`` (it saves the weights
only, so any restart loses Adam's moments, the schedule and the data position). With a
fixed seed and no example database, hypothesis must report a falsifying example, shrink
it to a single fault, print the ``chaos run`` replay command and its blob — and that
command, run again through the CLI, must exit 1 (a failing verdict).
"""

import re
import shlex

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from chaos.cli import main as cli
from chaos.plan.strategies import schedule_machine
from chaos.run.runner import RunOptions, run_scenario
from chaos.target.workload.config import WorkloadConfig

BROKEN = "tests/checkpointers/model_only.py:ModelOnlyCheckpointer"
TINY = WorkloadConfig(steps=8, save_every=2, d_model=32, n_layers=1)


@pytest.mark.chaos
def test_a_failing_schedule_shrinks_to_one_fault_and_its_replay_fails_again(tmp_path):
    options = RunOptions(scratch_base=str(tmp_path / "scratch"), cache_dir=tmp_path / "golden")
    cache, failures, report = {}, [], []

    def run(scenario):
        # Shrinking revisits schedules; a real run costs seconds, so each distinct one runs once.
        key = scenario.replay_command()
        if key not in cache:
            cache[key] = run_scenario(scenario, options)
        return cache[key]

    machine = schedule_machine(run, BROKEN, TINY, world_size=2, failures=failures)
    with with_reporter(report.append), pytest.raises(AssertionError, match="verdict fail") as failed:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=5, stateful_step_count=6, deadline=None, database=None, derandomize=True,
            print_blob=True, suppress_health_check=list(HealthCheck)))
    # What hypothesis prints: the steps, the notes (replay commands) and the blob, attached
    # to the error as notes (and, in older versions, reported).
    text = "\n".join(map(str, report + list(getattr(failed.value, "__notes__", []))))
    assert "state = ScheduleMachine()" in text and "@reproduce_failure(" in text, text
    shrunk = failures[-1]  # hypothesis replays the minimal example last
    assert len(shrunk.scenario.faults) == 1, [f.spec() for f in shrunk.scenario.faults]
    replays = re.findall(r"replay: (chaos run .*)", text)
    assert replays and replays[-1] == shrunk.replay, text
    print(f"shrunk to {shrunk.scenario.faults[0].spec()} after {len(cache)} distinct runs")
    argv = shlex.split(replays[-1])[1:] + ["--cache-dir", str(tmp_path / "golden"), "--scratch", str(tmp_path / "s2")]
    assert cli.main(argv) == 1  # the printed command fails again
