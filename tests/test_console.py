"""The live console: phases, steps and saves of the running scenario reach the screen."""

import io

from rich.console import Console

from chaos.cli.console import LiveProgress
from chaos.plan.scenario import Scenario
from chaos.target.workload.config import WorkloadConfig


def _render(events):
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160, color_system=None)
    live = LiveProgress(console, total=1)
    live.start(Scenario("dcp", workload=WorkloadConfig(steps=40)))
    for event, info in events:
        live.update(event, info)
    return live, console


def test_phase_step_and_save_are_shown():
    live, console = _render([("phase", {"phase": "golden run"}), ("attempt", {"attempt": 1}),
                             ("step", {"attempt": 1, "step": 23}),
                             ("save", {"attempt": 1, "step": 25, "seconds": 0.125, "mb_s": 80.0})])
    with console.capture() as cap:
        console.print(live.progress)
    text = cap.get()
    assert "restart 1" in text and "save @25: 125 ms, 80 MB/s" in text


def test_progress_is_off_when_not_a_terminal():
    console = Console(file=io.StringIO(), force_terminal=False)
    assert LiveProgress(console, total=1).progress.disable
