"""Console output of ``chaos run``: rich's live view on a terminal, compact plain lines elsewhere.

``chaos.cli.main._run`` makes the console with :func:`make_console` and calls
:func:`scenario_line` as each scenario finishes and :func:`summary_table` at the end;
:class:`LiveProgress` draws the running scenario (phase, step, last save) and the
campaign's done / planned count on a terminal.

Where stdout is not a terminal (a CI log, a pipe), a table that folds every name over
five lines is unreadable, so there each scenario is one line —
``[3/7] FAIL reference-kill_rank=1_step=23-seed0 5.6s bit_exact: ...`` — followed, for a
failure or error, by one ``replay:`` line, and the end is a count line plus the failing
ids with their replay commands. Plain mode never wraps a line (a replay command stays
copy-pasteable) and never prints control characters.

Every string that came from outside the harness — scenario ids, fault specs, oracle
evidence, a rank's error text such as gloo's ``[/__w/pytorch/...] Timed out`` — is
printed as plain text (``Text``, ``escape`` or ``markup=False``), never parsed as rich
markup: one stray bracket must not take the closing table down; and with its control
characters shown as escapes (``reports.cases.printable``), never sent to the terminal
raw (an ``ESC]0;...BEL`` retitles it, an ``ESC[2J`` clears it).
"""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from chaos.run.runner import ScenarioResult
from reports.cases import one_line, printable

STYLE = {"pass": "green", "fail": "bold red", "error": "bold yellow", "skipped": "dim"}
WORD = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "skipped": "SKIP"}
SUMMARY_CHARS = 240  # of one oracle summary or error in a plain line (the JSON keeps all of it)


def make_console() -> Console:
    """The console of a run: off a terminal, prints never wrap (long replay commands stay one line)."""
    console = Console(stderr=False)
    console.soft_wrap = not console.is_terminal
    return console


def _label(result: ScenarioResult) -> str:
    """The scenario's id, and its checkpointer in front when the id does not already name it
    (a generated id always does: ``reference-kill_rank=1_step=23-seed0``)."""
    sc = result.scenario
    name = re.split(r"[/:]", sc.checkpointer.rstrip("/:"))[-1] or sc.checkpointer
    return sc.id if name in sc.id else f"{sc.checkpointer} {sc.id}"


def compact_lines(result: ScenarioResult, position: str = "") -> list[str]:
    """One line for the scenario (verdict, id, seconds, the first failing oracle or the reason), and
    ``  replay: ...`` under a failure or an error."""
    head = f"{position}{WORD.get(result.verdict, result.verdict.upper())} {printable(_label(result))} {result.seconds:.1f}s"
    failing = result.failing()
    if result.verdict == "fail" and failing:
        first = failing[0]
        head += f"  {first.name}: {one_line(first.summary, SUMMARY_CHARS)}"
        if len(failing) > 1:
            head += f" (+{len(failing) - 1} more: {', '.join(o.name for o in failing[1:])})"
    elif result.error:
        reason = one_line(result.error, SUMMARY_CHARS)
        head += f"  {reason[len('skipped: '):] if reason.startswith('skipped: ') else reason}"
    lines = [head]
    if result.verdict in ("fail", "error"):
        lines.append(f"  replay: {printable(result.replay)}")
    return lines


def _plain(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)


def scenario_line(console: Console, result: ScenarioResult, position: str = "") -> None:
    """What a finished scenario prints; ``position`` (e.g. ``[3/7] ``) says how far the run is."""
    if not console.is_terminal:
        for line in compact_lines(result, position):
            _plain(console, line)
        return
    style = STYLE.get(result.verdict, "")
    golden = "golden cached" if result.golden_cached else "golden run"
    console.print(f"{escape(position)}[{style}]{result.verdict.upper():7}[/] {escape(printable(result.scenario.id))}  "
                  f"({result.seconds:.1f} s, {golden})")
    for oracle in result.failing():
        console.print(printable(f"        {oracle.name}: {oracle.summary}", newlines=True), markup=False)
    if result.error:
        console.print(printable(f"        {result.error}", newlines=True), markup=False)
    if result.verdict in ("fail", "error"):
        console.print(f"        replay: {printable(result.replay)}", markup=False, soft_wrap=True)


def count_line(results: list[ScenarioResult]) -> str:
    counts = {v: sum(1 for r in results if r.verdict == v) for v in STYLE}
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "nothing run"
    return f"{len(results)} scenario(s): {tally} in {sum(r.seconds for r in results):.1f} s"


def summary_table(console: Console, results: list[ScenarioResult]) -> None:
    """The end of a run: a table on a terminal; off it, the counts and each failing scenario's replay."""
    if not console.is_terminal:
        _plain(console, f"chaos results: {count_line(results)}")
        for r in results:
            if r.verdict in ("fail", "error"):
                _plain(console, f"  {WORD[r.verdict]} {printable(r.scenario.id)}  replay: {printable(r.replay)}")
        return
    table = Table(title="chaos results", show_lines=False)
    for col in ("scenario", "checkpointer", "faults", "verdict", "evidence", "s"):
        table.add_column(col, overflow="fold")
    for r in results:
        evidence = "; ".join(f"{o.name}: {o.summary}" for o in r.failing()) or r.error or next(
            (o.summary for o in r.oracles.values()), "")
        table.add_row(Text(printable(r.scenario.id)), Text(printable(r.scenario.checkpointer)),
                      Text(printable(" ".join(f.spec() for f in r.scenario.faults) or "-")),
                      Text(r.verdict, style=STYLE.get(r.verdict, "")), Text(printable(evidence, newlines=True)),
                      f"{r.seconds:.1f}")
    console.print(table)
    counts = {v: sum(1 for r in results if r.verdict == v) for v in STYLE}
    console.print("  ".join(f"[{STYLE[v]}]{v}: {n}[/]" for v, n in counts.items() if n) or "no scenarios")


class LiveProgress:
    """A live line per running scenario (its phase, the step, the last save's latency and
    throughput) under a campaign line (scenarios done / planned, and ``note``: e.g. the time
    left in the budget). Off when stdout is not a terminal: there the position prefix of
    :func:`scenario_line` says how far the run is."""

    def __init__(self, console: Console, total: int, title: str = "campaign", note: str = "") -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
            TextColumn("{task.fields[phase]}"), TextColumn("[dim]{task.fields[detail]}"), TimeElapsedColumn(),
            console=console, disable=not console.is_terminal, transient=False,
        )
        self.total, self.done, self.note = total, 0, note
        self.campaign = self.progress.add_task(escape(title), total=total, phase=self._done_text(), detail=escape(note))
        self.task = None
        self.steps = 1

    def _done_text(self) -> str:
        return f"{self.done}/{self.total} done"

    def __enter__(self) -> LiveProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def start(self, scenario) -> None:  # noqa: ANN001 - a chaos.plan.scenario.Scenario
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
        self.done += 1
        self.progress.update(self.campaign, advance=1, phase=self._done_text())
