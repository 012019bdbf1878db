"""Rich console output: a line per finished scenario and a table at the end.

Rich turns colour and control characters off by itself when stdout is not a terminal
(CI logs stay plain text). Every string that came from outside the harness — scenario
ids, fault specs, oracle evidence, a rank's error text such as gloo's
``[/__w/pytorch/...] Timed out`` — is printed as plain text (``Text`` or ``escape``),
never parsed as rich markup: one stray bracket must not take the closing table down.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from chaos.runner import ScenarioResult

STYLE = {"pass": "green", "fail": "bold red", "error": "bold yellow", "skipped": "dim"}


def scenario_line(console: Console, result: ScenarioResult) -> None:
    style = STYLE.get(result.verdict, "")
    golden = "golden cached" if result.golden_cached else "golden run"
    console.print(f"[{style}]{result.verdict.upper():7}[/] {escape(result.scenario.id)}  "
                  f"({result.seconds:.1f} s, {golden})")
    for oracle in result.failing():
        console.print(f"        {oracle.name}: {oracle.summary}", markup=False)
    if result.error:
        console.print(f"        {result.error}", markup=False)
    if result.verdict in ("fail", "error"):
        console.print(f"        replay: {result.replay}", markup=False, soft_wrap=True)


def summary_table(console: Console, results: list[ScenarioResult]) -> None:
    table = Table(title="chaos results", show_lines=False)
    for col in ("scenario", "checkpointer", "faults", "verdict", "evidence", "s"):
        table.add_column(col, overflow="fold")
    for r in results:
        evidence = "; ".join(f"{o.name}: {o.summary}" for o in r.failing()) or r.error or next(
            (o.summary for o in r.oracles.values()), "")
        table.add_row(Text(r.scenario.id), Text(r.scenario.checkpointer),
                      Text(" ".join(f.spec() for f in r.scenario.faults) or "-"),
                      Text(r.verdict, style=STYLE.get(r.verdict, "")), Text(evidence), f"{r.seconds:.1f}")
    console.print(table)
    counts = {v: sum(1 for r in results if r.verdict == v) for v in STYLE}
    console.print("  ".join(f"[{STYLE[v]}]{v}: {n}[/]" for v, n in counts.items() if n) or "no scenarios")


class LiveProgress:
    """A live line per running scenario: its phase, the step, the last save's latency and
    throughput. Off when stdout is not a terminal, so CI logs get only the final lines."""

    def __init__(self, console: Console, total: int) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
            TextColumn("{task.fields[phase]}"), TextColumn("[dim]{task.fields[detail]}"), TimeElapsedColumn(),
            console=console, disable=not console.is_terminal, transient=False,
        )
        self.campaign = self.progress.add_task("campaign", total=total, phase="", detail="")
        self.task = None
        self.steps = 1

    def __enter__(self) -> LiveProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def start(self, scenario) -> None:  # noqa: ANN001 - a chaos.scenario.Scenario
        self.steps = scenario.workload.steps
        self.task = self.progress.add_task(escape(scenario.id[:48]), total=self.steps, phase="starting", detail="")

    def update(self, event: str, info: dict) -> None:
        if self.task is None:
            return
        if event == "phase":
            self.progress.update(self.task, phase=escape(str(info["phase"])))
        elif event == "attempt":
            phase = "faulted run" if info["attempt"] == 0 else f"restart {info['attempt']}"
            self.progress.update(self.task, phase=phase)
        elif event == "step":
            self.progress.update(self.task, completed=info["step"], detail=f"step {info['step']}/{self.steps}")
        elif event == "save":
            rate = f", {info['mb_s']:.0f} MB/s" if info.get("mb_s") else ""
            self.progress.update(self.task, detail=f"save @{info['step']}: {info['seconds'] * 1e3:.0f} ms{rate}")

    def finish(self, result: ScenarioResult) -> None:
        if self.task is not None:
            self.progress.update(self.task, phase=result.verdict, completed=self.steps)
            self.progress.remove_task(self.task)
            self.task = None
        self.progress.advance(self.campaign)
