"""The self-check: a fixed battery of general fault scenarios run against a corpus of checkpointers.

The battery knows nothing about the checkpointers it attacks: every probe is an
ordinary scenario (a fault plan run through :func:`chaos.run.runner.run_scenario` and judged
by the general oracles — the ``powerloss`` probe too, whose crash states the runner
explores and judges as ``atomic_commit``), chosen so that together they expose what a
checkpointer can get wrong — lost or mixed state after a crash, a torn in-place write,
an error that is swallowed and acknowledged, corruption loaded silently, no fallback,
writes that a power loss takes back, code planted in a file the load unpickles. A
correct checkpointer must pass (or be skipped by) every probe. At-rest probes land in
files a traced fault-free load really reads (``chaos.plan.loadtrace``): without ``file=``
the first one read, with ``file=*`` one of them drawn with the seed.

A planted defect says which check is meant to catch it: its module declares
``EXPECTED_CATCH``, a literal mapping of probe name to the oracle names any one of
which must fail in that probe (read with :mod:`ast`, nothing imported)::

    EXPECTED_CATCH = {"powerloss": ("atomic_commit",)}

The defect is *caught* only when one of those oracles failed in one of those probes.
A defect that failed other probes or other oracles instead is *caught by the wrong
oracle* — a miss, reported with what did fail — so a harness bug that fails some
oracle everywhere (liveness, say) cannot make the score look perfect.

    report = run_selfcheck({"correct": "tests/checkpointers/selfcheck/correct.py:CorrectCheckpointer",
                            "no_fsync": "tests/checkpointers/selfcheck/no_fsync.py:NoFsyncCheckpointer"},
                           SelfCheckOptions(run=RunOptions(scratch_base="/tmp/x")), correct={"correct"})
    print(report.score_line())   # caught 1/1 planted defects by the intended oracle (100%), 0 false positives

The workload is tiny (12 steps, a save every 4 at steps 4, 8 and 12, d_model 64), so a
probe takes a few seconds with the fork server warm. ``chaos selfcheck``
(:mod:`chaos.cli.commands.selfcheck`) and ``tests/test_selfcheck.py`` call
:func:`run_selfcheck` and :func:`render`.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.errors import ConfigError
from chaos.judge.registry import of_workload
from chaos.model.fault import Fault
from chaos.model.grammar import parse_fault
from chaos.model.jobspec import FAULT_KINDS
from chaos.plan.scenario import Scenario
from chaos.run.runner import RunOptions, ScenarioResult, run_scenario
from chaos.target.protocol import BUILTIN_CHECKPOINTERS, validate_spec
from chaos.target.workload.config import WorkloadConfig

# Saves at steps 4, 8 and 12; the model is small enough that a probe takes seconds.
SELFCHECK_WORKLOAD = WorkloadConfig(
    steps=12, save_every=4, d_model=64, n_layers=1, n_heads=2, vocab=128, seq_len=16, batch_size=2,
    corpus_sequences=64, warmup_steps=2, collective_timeout_s=20.0,
)

# The module-level name a planted defect declares its intended catch under.
EXPECTED_NAME = "EXPECTED_CATCH"
# The runner adds the power-loss verdict under this name next to chaos.judge.oracles.ORACLES.
POWERLOSS_ORACLE = "atomic_commit"


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
    Probe("payload-newest", ("payload:step=10,format=pickle,seed=0",),
          "a pickle whose loading runs code, planted in the first file the load reads that is a pickle or a "
          "torch zip (a manifest, an index, a shard): loading must refuse it, never run it"),
    Probe("disk-full", ("diskfull:step=6,free=4096",),
          "the checkpoint file system fills up before the save at step 8"),
)
PROBES = {p.name: p for p in BATTERY}


def known_oracles() -> list[str]:
    """Every oracle name a probe's verdict can carry (an intended catch must name one of them):
    the registry's built-in workload oracles (``chaos.judge.registry``)."""
    return of_workload()


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
    oracle_summaries: dict[str, str] = field(default_factory=dict)  # failing oracle -> its summary

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# What a checkpointer's record says, in the table and the JSON.
CAUGHT, WRONG_ORACLE, MISSED, NOT_PROBED = "caught", "caught by the wrong oracle", "missed", "not probed"
PASSES, FALSE_POSITIVE, INCONCLUSIVE = "passes", "false positive", "inconclusive"


@dataclass
class CheckpointerReport:
    """One checkpointer's outcomes; ``expected`` is its intended catch (empty for a correct one)."""

    name: str
    spec: str
    correct: bool
    outcomes: list[ProbeOutcome] = field(default_factory=list)
    expected: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def failures(self) -> list[ProbeOutcome]:
        """Every probe that failed, whichever oracle failed it."""
        return [o for o in self.outcomes if o.verdict == "fail"]

    def intended(self, outcome: ProbeOutcome) -> list[str]:
        """The oracles that failed ``outcome`` and were meant to (empty: not the intended catch)."""
        meant = self.expected.get(outcome.probe, ())
        return [n for n in outcome.failing if n in meant] if outcome.verdict == "fail" else []

    @property
    def caught_by(self) -> list[ProbeOutcome]:
        """The probes whose failure is the intended catch: an intended oracle failed in an intended probe."""
        return [o for o in self.failures if self.intended(o)]

    @property
    def caught(self) -> bool:
        return not self.correct and bool(self.caught_by)

    @property
    def errors(self) -> list[ProbeOutcome]:
        return [o for o in self.outcomes if o.verdict == "error"]

    @property
    def result(self) -> str:
        if self.correct:
            return FALSE_POSITIVE if self.failures else INCONCLUSIVE if self.errors else PASSES
        if self.caught_by:
            return CAUGHT
        if self.failures:
            return WRONG_ORACLE
        return MISSED if any(o.probe in self.expected for o in self.outcomes) else NOT_PROBED

    def explain(self) -> str:
        """One line: what caught it, what failed instead, or what the intended probe did."""
        if self.correct:  # its harness errors are listed one by one by render
            return "; ".join(f"{o.probe} failed {', '.join(o.failing)}: {o.summary}" for o in self.failures)
        if self.caught_by:
            o = self.caught_by[0]
            return "; ".join(f"{o.probe}: {n}: {o.oracle_summaries.get(n, o.summary)}" for n in self.intended(o))
        if self.failures:
            return ("failed only checks not meant for it: " + "; ".join(f"{o.probe}: {', '.join(o.failing)}"
                                                                        for o in self.failures)
                    + f" (intended: {_format_expected(self.expected)}); first: {self.failures[0].summary}")
        ran = [o for o in self.outcomes if o.probe in self.expected]
        if not ran:
            return f"the intended probe(s) were not run ({_format_expected(self.expected)})"
        return "; ".join(f"{o.probe}: {o.verdict} ({o.summary})" for o in ran)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "correct": self.correct, "caught": self.caught,
                "result": self.result,
                "intended": [{"probe": p, "oracles": list(ns)} for p, ns in self.expected.items()],
                "caught_by": [{"probe": o.probe, "oracles": self.intended(o)} for o in self.caught_by],
                "failed": [{"probe": o.probe, "oracles": o.failing, "intended": self.intended(o),
                            "summary": o.summary} for o in self.failures],
                "explanation": self.explain(),
                "outcomes": [o.to_dict() for o in self.outcomes]}


def _format_expected(expected: dict[str, tuple[str, ...]]) -> str:
    return "; ".join(f"{p}: {' or '.join(ns)}" for p, ns in expected.items()) or "-"


@dataclass
class SelfCheckReport:
    checkpointers: list[CheckpointerReport]
    seconds: float = 0.0

    @property
    def planted(self) -> list[CheckpointerReport]:
        return [c for c in self.checkpointers if not c.correct]

    @property
    def caught(self) -> list[CheckpointerReport]:
        """Planted defects caught by the intended oracle in the intended probe."""
        return [c for c in self.planted if c.caught]

    @property
    def missed(self) -> list[CheckpointerReport]:
        """Every planted defect not caught as intended, those caught by the wrong oracle included."""
        return [c for c in self.planted if not c.caught]

    @property
    def wrong_oracle(self) -> list[CheckpointerReport]:
        return [c for c in self.planted if c.result == WRONG_ORACLE]

    @property
    def false_positives(self) -> list[tuple[str, ProbeOutcome]]:
        return [(c.name, o) for c in self.checkpointers if c.correct for o in c.failures]

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
        line = f"self-check: caught {k}/{n} planted defects by the intended oracle ({100 * self.score:.0f}%)"
        if self.wrong_oracle:
            line += f", {len(self.wrong_oracle)} caught only by the wrong oracle"
        line += f", {len(self.false_positives)} false positive(s)"
        if self.correct_errors:
            line += f", {len(self.correct_errors)} harness error(s) on correct checkpointers"
        return line + f" in {self.seconds:.0f} s"

    def to_dict(self) -> dict[str, Any]:
        return {"planted": len(self.planted), "caught": len(self.caught), "score": self.score,
                "false_positives": [{"checkpointer": n, "probe": o.probe, "oracles": o.failing, "summary": o.summary}
                                    for n, o in self.false_positives],
                "missed": [c.name for c in self.missed], "wrong_oracle": [c.name for c in self.wrong_oracle],
                "passed": self.passed, "seconds": round(self.seconds, 1),
                "battery": [dataclasses.asdict(p) for p in BATTERY],
                "checkpointers": [c.to_dict() for c in self.checkpointers]}


@dataclass
class SelfCheckOptions:
    """``fail_fast``: stop probing a planted defect once its intended catch happened (the
    score is the same, the run shorter). ``probes``: a subset of the battery by name.
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
        cls = checkpointer_class(path)
        if cls is not None:
            out[path.stem] = f"{path.resolve()}:{cls}"
    return out


def checkpointer_class(path: Path) -> str | None:
    """The last ``*Checkpointer`` class a corpus module defines (read with :mod:`ast`), or None.
    Called by :func:`discover` and ``jobselfcheck`` (a checkpointer run as the workload's job)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Checkpointer")]
    return classes[-1] if classes else None


def _module_file(spec: str) -> Path:
    """The source file of the module a (validated) spec names; a built-in name is its module."""
    where = BUILTIN_CHECKPOINTERS.get(spec, spec).rpartition(":")[0]
    if where.endswith(".py") or "/" in where:
        return Path(where)
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise ConfigError(f"checkpointer {spec}: cannot find the source file of module {where!r} "
                          f"to read its {EXPECTED_NAME}")
    return Path(found.origin)


def expected_catch(spec: str) -> dict[str, tuple[str, ...]]:
    """The intended catch a planted defect's module declares: ``{probe: (oracle, ...)}``.

    Read from the source with :func:`ast.literal_eval` (nothing is imported), checked
    against the battery and the oracles; a missing or malformed declaration is a
    ConfigError naming the file, since a defect without one cannot be judged.
    """
    return read_expected(_module_file(validate_spec(spec)), PROBES, known_oracles(),
                         example={"powerloss": (POWERLOSS_ORACLE,)})


def module_literal(path: Path, name: str) -> tuple[bool, Any]:
    """(declared, value) of the module-level ``name = <literal>`` in the source at ``path``, read
    with :mod:`ast` (nothing imported). ConfigError naming the file where the value is no literal.
    Called by :func:`read_expected` and ``jobselfcheck`` (a job's ``CHAOS_JOB``)."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    nodes = [n.value for n in tree.body if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    nodes += [n.value for n in tree.body if isinstance(n, ast.AnnAssign) and n.value is not None
              and isinstance(n.target, ast.Name) and n.target.id == name]
    if not nodes:
        return False, None
    try:
        return True, ast.literal_eval(nodes[-1])
    except ValueError:
        raise ConfigError(f"{path}: {name} is not a literal") from None


def read_expected(path: Path, probes: Collection[str], oracles: Collection[str],
                  example: dict[str, tuple[str, ...]], name: str = EXPECTED_NAME) -> dict[str, tuple[str, ...]]:
    """A planted defect's ``EXPECTED_CATCH = {probe: (oracle, ...)}`` (or the literal ``name``) in the
    source at ``path``, checked against ``probes`` (the battery's, or a job's fault families) and
    ``oracles``. Called by :func:`expected_catch` and ``jobselfcheck``."""
    where = f"{path}: {name}"
    form = f"expected {name} = {{probe: (oracle, ...)}}, e.g. {example!r}"
    declared, raw = module_literal(path, name)
    if not declared:
        raise ConfigError(f"{path}: a planted defect must declare the probe(s) and oracle(s) meant to catch it "
                          f"({form})")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where} must be a non-empty dict ({form})")
    out: dict[str, tuple[str, ...]] = {}
    for probe, names in raw.items():
        if probe not in probes:
            raise ConfigError(f"{where}: unknown probe {probe!r}; known: {', '.join(probes)}")
        names = (names,) if isinstance(names, str) else names
        if not isinstance(names, (tuple, list)) or not names or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{where}[{probe!r}] must be a non-empty tuple of oracle names ({form})")
        unknown = [n for n in names if n not in oracles]
        if unknown:
            raise ConfigError(f"{where}[{probe!r}]: unknown oracle(s) {', '.join(unknown)}; "
                              f"known: {', '.join(oracles)}")
        out[probe] = tuple(names)
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
                        round(result.seconds, 2), result.replay, note, {o.name: o.summary[:400] for o in failing})


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
    ``correct``); every other one carries a planted defect whose module declares its
    intended catch (``EXPECTED_CATCH``), read before anything runs.
    """
    options = options or SelfCheckOptions()
    unknown = set(options.probes or ()) - set(PROBES)
    if unknown:
        raise ConfigError(f"unknown probe(s) {sorted(unknown)}; the battery has {', '.join(PROBES)}")
    probes = BATTERY if options.probes is None else tuple(PROBES[p] for p in options.probes)
    good = set(correct) if correct is not None else {n for n in checkpointers if n.startswith("correct")}
    reports = []
    for name, spec in checkpointers.items():
        spec = validate_spec(spec)
        reports.append(CheckpointerReport(name, spec, name in good,
                                          expected={} if name in good else expected_catch(spec)))
    started = time.time()
    for rep in reports:
        for probe in probes:
            outcome = run_probe(rep.spec, probe, options)
            rep.outcomes.append(outcome)
            if options.progress is not None:
                options.progress(rep.name, outcome)
            if options.fail_fast and rep.caught:
                break
    return SelfCheckReport(reports, time.time() - started)


# ---------------------------------------------------------------------- rendering
MARKS = {"pass": ".", "fail": "X", "skipped": "s", "error": "E"}
STYLES = {CAUGHT: "green", PASSES: "green", INCONCLUSIVE: "yellow"}


def render(report: SelfCheckReport, console: Any = None) -> None:
    """A rich table (one row per checkpointer), what caught or failed each one, and the score line.

    The ``probes`` column has one mark per probe of the battery (then per fault family of a
    job corpus, :mod:`chaos.run.jobselfcheck`), in order: ``.`` pass,
    ``X`` fail, ``s`` skipped (the fault could not apply), ``E`` harness error, ``-`` not
    run (fail-fast stopped after the intended catch). ``intended`` is the defect's
    declared catch; ``failed`` lists every failing probe with its oracles, the intended
    ones marked ``*``.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    ran = {o.probe for c in report.checkpointers for o in c.outcomes}
    # the battery's probes, then a job corpus's fault families (chaos.run.jobselfcheck), in their order
    order = [p.name for p in BATTERY if p.name in ran] + [f for f in FAULT_KINDS if f in ran]
    table = Table(title="chaos self-check", caption="probes: " + " ".join(f"{i + 1}={n}" for i, n in enumerate(order)))
    for col in ("checkpointer", "expect", "probes", "intended (probe: oracle)", "failed (probe: oracles)", "result"):
        table.add_column(col, overflow="fold")
    for c in report.checkpointers:
        by = {o.probe: o for o in c.outcomes}
        marks = "".join(MARKS.get(by[n].verdict, "?") if n in by else "-" for n in order)
        failed = "; ".join(f"{o.probe}: {','.join(n + '*' if n in c.intended(o) else n for n in o.failing)}"
                           for o in c.failures) or "-"
        style = STYLES.get(c.result, "red")
        table.add_row(escape(c.name), "correct" if c.correct else "defect", marks,
                      escape(_format_expected(c.expected)) if not c.correct else "-", escape(failed),
                      f"[{style}]{escape(c.result.upper() if style == 'red' else c.result)}[/]")
    console.print(table)
    for c in report.checkpointers:
        why = c.explain()
        if why:
            console.print(f"  {c.name}: {c.result}: {why[:400]}", highlight=False, markup=False)
        for o in c.errors if c.correct else ():
            console.print(f"  {c.name}: harness error in {o.probe}: {o.summary[:300]}", highlight=False, markup=False)
    console.print(report.score_line(), style="bold green" if report.passed else "bold red", highlight=False,
                  markup=False)


__all__ = ["BATTERY", "EXPECTED_NAME", "PROBES", "SELFCHECK_WORKLOAD", "CheckpointerReport", "Probe", "ProbeOutcome",
           "SelfCheckOptions", "SelfCheckReport", "discover", "expected_catch", "known_oracles", "render",
           "run_probe", "run_selfcheck"]
