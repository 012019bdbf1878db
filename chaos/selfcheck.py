"""The self-check: a fixed battery of general fault scenarios run against a corpus of checkpointers.

The battery knows nothing about the checkpointers it attacks: every probe is an
ordinary scenario (a fault plan run through :func:`chaos.runner.run_scenario` and judged
by the general oracles), chosen so that together they expose what a checkpointer can
get wrong — lost or mixed state after a crash, a torn in-place write, an error that is
swallowed and acknowledged, corruption loaded silently, no fallback, writes that a
power loss takes back. A planted defect is *caught* when at least one probe fails it;
a correct checkpointer must pass (or be skipped by) every probe.

    report = run_selfcheck({"correct": "tests/checkpointers/selfcheck/correct.py:CorrectCheckpointer",
                            "no_fsync": "tests/checkpointers/selfcheck/no_fsync.py:NoFsyncCheckpointer"},
                           SelfCheckOptions(run=RunOptions(scratch_base="/tmp/x")), correct={"correct"})
    print(report.score_line())   # caught 1/1 planted defects (100%), 0 false positives

The workload is tiny (12 steps, a save every 4 at steps 4, 8 and 12, d_model 64), so a
probe takes a few seconds with the fork server warm.

The ``powerloss`` probe is an ordinary scenario too: the runner explores the crash states of
the traced save and judges them (``atomic_commit``).
"""

from __future__ import annotations

import ast
import dataclasses
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.errors import ConfigError
from chaos.protocol import validate_spec
from chaos.runner import RunOptions, ScenarioResult, run_scenario
from chaos.scenario import Fault, Scenario, parse_fault
from chaos.workload.config import WorkloadConfig

# Saves at steps 4, 8 and 12; the model is small enough that a probe takes seconds.
SELFCHECK_WORKLOAD = WorkloadConfig(
    steps=12, save_every=4, d_model=64, n_layers=1, n_heads=2, vocab=128, seq_len=16, batch_size=2,
    corpus_sequences=64, warmup_steps=2, collective_timeout_s=20.0,
)


@dataclass(frozen=True)
class Probe:
    """One general fault scenario of the battery."""

    name: str
    faults: tuple[str, ...]
    what: str


# Cheap and broad first: with fail_fast a broken checkpointer is usually caught by the
# first few probes (the power-loss probe, a few seconds, comes before the long tail of
# corruption probes); a correct one runs them all.
BATTERY: tuple[Probe, ...] = (
    Probe("kill-between-saves", ("kill:rank=1,step=10",),
          "SIGKILL a rank between two saves; resume must be exact and no older than the last acknowledged save"),
    Probe("kill-at-save", ("kill:rank=0,step=8,phase=save",),
          "SIGKILL a rank as a save begins, right after the previous one was acknowledged"),
    Probe("crash-mid-write", ("crash:rank=0,step=8,op=write,nth=2",),
          "the rank dies in the middle of writing the save at step 8 (a torn file)"),
    Probe("enospc-write", ("enospc:rank=1,step=8,op=write,nth=1",),
          "a write of the save at step 8 fails with ENOSPC: the save must fail, never be acknowledged"),
    Probe("powerloss", ("powerloss:step=8,max_states=40",),
          "power loss during (or right after) a save: every crash state must load a committed, "
          "acknowledged state"),
    Probe("fsync-fails", ("fsyncfail:rank=0,step=8,op=fsync,nth=1",),
          "an fsync of the save at step 8 fails with EIO: the save must fail, never be acknowledged"),
    Probe("crash-at-rename", ("crash:rank=0,step=8,op=rename,nth=1",),
          "the rank dies at the first rename of the save at step 8"),
    Probe("bitflip-newest-s0", ("bitflip:step=10,bits=4,region=data,seed=0,file=*",),
          "4 bits flipped in a file of the newest checkpoint: detect and fall back, never load it silently"),
    Probe("bitflip-newest-s1", ("bitflip:step=10,bits=4,region=data,seed=1,file=*",),
          "the same with another seed (another file of the checkpoint)"),
    Probe("bitflip-newest-s2", ("bitflip:step=10,bits=4,region=data,seed=2,file=*",),
          "the same with a third seed"),
    Probe("truncate-newest", ("truncate:step=10,fraction=0.5,seed=0,file=*",),
          "a file of the newest checkpoint cut in half: detect and fall back"),
    Probe("disk-full", ("diskfull:step=6,free=4096",),
          "the checkpoint file system fills up before the save at step 8"),
)
PROBES = {p.name: p for p in BATTERY}


@dataclass
class ProbeOutcome:
    """What one probe did to one checkpointer."""

    probe: str
    faults: tuple[str, ...]
    verdict: str  # pass | fail | skipped | error
    failing: list[str] = field(default_factory=list)  # oracle names that failed
    summary: str = ""
    seconds: float = 0.0
    replay: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class CheckpointerReport:
    name: str
    spec: str
    correct: bool
    outcomes: list[ProbeOutcome] = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return any(o.verdict == "fail" for o in self.outcomes)

    @property
    def caught_by(self) -> list[ProbeOutcome]:
        return [o for o in self.outcomes if o.verdict == "fail"]

    @property
    def errors(self) -> list[ProbeOutcome]:
        return [o for o in self.outcomes if o.verdict == "error"]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "correct": self.correct, "caught": self.caught,
                "outcomes": [o.to_dict() for o in self.outcomes]}


@dataclass
class SelfCheckReport:
    checkpointers: list[CheckpointerReport]
    seconds: float = 0.0

    @property
    def planted(self) -> list[CheckpointerReport]:
        return [c for c in self.checkpointers if not c.correct]

    @property
    def caught(self) -> list[CheckpointerReport]:
        return [c for c in self.planted if c.caught]

    @property
    def missed(self) -> list[CheckpointerReport]:
        return [c for c in self.planted if not c.caught]

    @property
    def false_positives(self) -> list[tuple[str, ProbeOutcome]]:
        return [(c.name, o) for c in self.checkpointers if c.correct for o in c.caught_by]

    @property
    def correct_errors(self) -> list[tuple[str, ProbeOutcome]]:
        """Harness errors on a correct checkpointer: the check is inconclusive there."""
        return [(c.name, o) for c in self.checkpointers if c.correct for o in c.errors]

    @property
    def score(self) -> float:
        return len(self.caught) / len(self.planted) if self.planted else 1.0

    @property
    def passed(self) -> bool:
        return not self.missed and not self.false_positives and not self.correct_errors

    def score_line(self) -> str:
        n, k = len(self.planted), len(self.caught)
        line = (f"self-check: caught {k}/{n} planted defects ({100 * self.score:.0f}%), "
                f"{len(self.false_positives)} false positive(s)")
        if self.correct_errors:
            line += f", {len(self.correct_errors)} harness error(s) on correct checkpointers"
        return line + f" in {self.seconds:.0f} s"

    def to_dict(self) -> dict[str, Any]:
        return {"planted": len(self.planted), "caught": len(self.caught), "score": self.score,
                "false_positives": [{"checkpointer": n, "probe": o.probe, "oracles": o.failing, "summary": o.summary}
                                    for n, o in self.false_positives],
                "missed": [c.name for c in self.missed], "passed": self.passed, "seconds": round(self.seconds, 1),
                "battery": [dataclasses.asdict(p) for p in BATTERY],
                "checkpointers": [c.to_dict() for c in self.checkpointers]}


@dataclass
class SelfCheckOptions:
    """``fail_fast``: stop probing a planted defect once a probe caught it (the score is
    the same, the run shorter). ``probes``: a subset of the battery by name.
    ``powerloss_states``: crash states the runner explores in each power-loss probe
    (its fault's ``max_states``)."""

    run: RunOptions = field(default_factory=RunOptions)
    workload: WorkloadConfig = SELFCHECK_WORKLOAD
    world_size: int = 2
    probes: tuple[str, ...] | None = None
    fail_fast: bool = False
    powerloss_states: int = 40
    progress: Callable[[str, ProbeOutcome], None] | None = None


# ---------------------------------------------------------------------- the corpus
def discover(directory: str | Path) -> dict[str, str]:
    """``{stem: "path/stem.py:Class"}`` for every module in ``directory`` defining a ``*Checkpointer`` class.

    Modules starting with ``_`` are helpers, not checkpointers.
    """
    out: dict[str, str] = {}
    for path in sorted(Path(directory).glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Checkpointer")]
        if classes:
            out[path.stem] = f"{path.resolve()}:{classes[-1]}"
    return out


# ---------------------------------------------------------------------- running
def _outcome(probe: Probe, faults: tuple[str, ...], result: ScenarioResult) -> ProbeOutcome:
    failing = [o for o in result.oracles.values() if not o.passed]
    if result.verdict == "fail":
        summary = "; ".join(f"{o.name}: {o.summary}" for o in failing)
    else:
        summary = result.error or "all oracles pass"
    note = ""
    if result.record is not None:
        for f in result.record.fired_faults():
            corruption = f.get("detail", {}).get("corruption")
            if corruption is not None:
                note = f"corrupted {corruption.get('target')}" if corruption.get("changed", True) else \
                    f"corruption changed nothing ({corruption.get('reason', 'no byte differs')})"
    return ProbeOutcome(probe.name, faults, result.verdict, [o.name for o in failing], summary[:600],
                        round(result.seconds, 2), result.replay, note)


def _with_options(fault: Fault, options: SelfCheckOptions) -> Fault:
    """A power-loss fault explores ``options.powerloss_states`` crash states; every other fault is as written."""
    if fault.kind != "powerloss":
        return fault
    params = {**dict(fault.params), "max_states": options.powerloss_states}
    return dataclasses.replace(fault, params=tuple(params.items()))


def run_probe(spec: str, probe: Probe, options: SelfCheckOptions) -> ProbeOutcome:
    """Run one probe of the battery against one checkpointer as an ordinary scenario."""
    faults = [_with_options(parse_fault(f), options) for f in probe.faults]
    scenario = Scenario(checkpointer=spec, world_size=options.world_size, workload=options.workload, faults=faults)
    return _outcome(probe, tuple(f.spec() for f in faults), run_scenario(scenario, options.run))


def run_selfcheck(checkpointers: dict[str, str], options: SelfCheckOptions | None = None,
                  correct: Collection[str] | None = None) -> SelfCheckReport:
    """Run every probe of the battery against every checkpointer.

    ``correct``: the names that are expected to pass (default: names starting with
    ``correct``); every other one carries a planted defect that must be caught.
    """
    options = options or SelfCheckOptions()
    probes = BATTERY if options.probes is None else tuple(PROBES[p] for p in options.probes)
    unknown = set(options.probes or ()) - set(PROBES)
    if unknown:
        raise ConfigError(f"unknown probe(s) {sorted(unknown)}; the battery has {', '.join(PROBES)}")
    good = set(correct) if correct is not None else {n for n in checkpointers if n.startswith("correct")}
    started = time.time()
    reports = []
    for name, spec in checkpointers.items():
        rep = CheckpointerReport(name, validate_spec(spec), name in good)
        for probe in probes:
            outcome = run_probe(rep.spec, probe, options)
            rep.outcomes.append(outcome)
            if options.progress is not None:
                options.progress(name, outcome)
            if options.fail_fast and not rep.correct and rep.caught:
                break
        reports.append(rep)
    return SelfCheckReport(reports, time.time() - started)


# ---------------------------------------------------------------------- rendering
MARKS = {"pass": ".", "fail": "X", "skipped": "s", "error": "E"}


def render(report: SelfCheckReport, console: Any = None) -> None:
    """A rich table (one row per checkpointer), what caught each defect, and the score line.

    The ``probes`` column has one mark per probe of the battery, in order: ``.`` pass,
    ``X`` fail, ``s`` skipped (the fault could not apply), ``E`` harness error, ``-`` not
    run (fail-fast stopped after the catch).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    order = [p.name for p in BATTERY if any(o.probe == p.name for c in report.checkpointers for o in c.outcomes)]
    table = Table(title="chaos self-check", caption="probes: " + " ".join(f"{i + 1}={n}" for i, n in enumerate(order)))
    for col in ("checkpointer", "expect", "probes", "caught by (probe: oracles)", "result"):
        table.add_column(col, overflow="fold")
    for c in report.checkpointers:
        by = {o.probe: o for o in c.outcomes}
        marks = "".join(MARKS.get(by[n].verdict, "?") if n in by else "-" for n in order)
        hits = "; ".join(f"{o.probe}: {','.join(o.failing)}" for o in c.caught_by) or "-"
        if c.correct:
            result = ("[red]FALSE POSITIVE[/]" if c.caught_by else "[yellow]inconclusive[/]" if c.errors
                      else "[green]passes[/]")
        else:
            result = "[green]caught[/]" if c.caught else "[red]MISSED[/]"
        table.add_row(c.name, "correct" if c.correct else "defect", marks, escape(hits), result)
    console.print(table)
    for c in report.checkpointers:
        first = c.caught_by[:1]
        for o in first:
            who = "FALSE POSITIVE" if c.correct else "caught"
            console.print(f"  {c.name}: {who} by {o.probe}: {o.summary[:300]}", highlight=False, markup=False)
        for o in c.errors:
            console.print(f"  {c.name}: harness error in {o.probe}: {o.summary[:300]}", highlight=False, markup=False)
    console.print(report.score_line(), style="bold green" if report.passed else "bold red", highlight=False)


__all__ = ["BATTERY", "PROBES", "SELFCHECK_WORKLOAD", "CheckpointerReport", "Probe", "ProbeOutcome",
           "SelfCheckOptions", "SelfCheckReport", "discover", "render", "run_probe",
           "run_selfcheck"]
