"""Rich console output: a line per finished scenario and a table at the end.

Rich turns colour and control characters off by itself when stdout is not a terminal
(CI logs stay plain text).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from chaos.runner import ScenarioResult

STYLE = {"pass": "green", "fail": "bold red", "error": "bold yellow", "skipped": "dim"}


def scenario_line(console: Console, result: ScenarioResult) -> None:
    style = STYLE.get(result.verdict, "")
    golden = "golden cached" if result.golden_cached else "golden run"
    console.print(f"[{style}]{result.verdict.upper():7}[/] {result.scenario.id}  ({result.seconds:.1f} s, {golden})")
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
        table.add_row(r.scenario.id, r.scenario.checkpointer, " ".join(f.spec() for f in r.scenario.faults) or "-",
                      f"[{STYLE.get(r.verdict, '')}]{r.verdict}[/]", evidence, f"{r.seconds:.1f}")
    console.print(table)
    counts = {v: sum(1 for r in results if r.verdict == v) for v in STYLE}
    console.print("  ".join(f"[{STYLE[v]}]{v}: {n}[/]" for v, n in counts.items() if n) or "no scenarios")
