"""How a campaign runs its scenarios, and its optional second half: generated fault schedules.

``run_pipelined`` runs a list of scenarios (``chaos run``'s family scenarios, ``chaos
replay``) one after another, each one's record, hygiene check, oracles and clean-up in a
helper thread while the next one's ranks already run; no two scenarios ever share a
core-bound phase (see its docstring).

Generated fault schedules run until ``--budget`` is spent.

A bare ``chaos run`` runs one scenario per fault family and nothing else (about a
minute on two cores), and needs nothing beyond the runtime dependencies.
``--budget SECONDS`` then adds, within that many more seconds, schedules drawn from
``chaos.plan.strategies.fault_schedules`` (hypothesis, a development dependency):

1. a fault-free run of the same configuration is traced, once (cached beside the golden
   runs), and its I/O operations and phase announcements become the fault points
   (``chaos.record.points``) — a drawn fault is one the job really reaches;
2. schedules are drawn seeded by ``--seed`` (the same seed draws the same schedules),
   each printed with its replay command, and none started once the time left is less
   than a scenario has taken on average so far — a campaign stops before its budget
   runs out rather than after;
3. the campaign reports which distinct (rank, operation, file role, phase) points its
   fired I/O faults tried, of those the trace showed (``Campaign.to_dict()``, the
   results document's ``campaign`` entry).

Before the drawn schedules, the budget goes to at-rest faults over every kind of file
the checkpointer's load reads (``read_sweep``): an at-rest fault lands in the file a
traced fault-free load read first (``chaos.plan.loadtrace``), and its record names every
kind that load read (``step-*/manifest.pkl``, ``step-*/rank*.pt``, ``latest``...). The
first sweep scenario learns the kinds; then a payload goes to each kind and a corruption
to each kind (``file=KIND``), so a pickled manifest is attacked whatever a shard's
checksum does, and the drawn schedules aim their at-rest faults at those kinds too.
``ReadCoverage`` counts which kinds payloads and corruptions reached.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chaos.errors import ConfigError

if TYPE_CHECKING:
    from concurrent.futures import Future

    from chaos.plan.scenario import Scenario
    from chaos.record.points import Coverage, TracePoints
    from chaos.run.runner import RunOptions, ScenarioResult
    from chaos.target.workload.config import WorkloadConfig

DEFAULT_BUDGET_S: float | None = None  # bare `chaos run`: the family scenarios only, no generated schedules


class _BudgetSpent(Exception):
    """Raised inside the generator loop to end it: hypothesis has no 'stop now' of its own."""


def require_hypothesis() -> None:
    """``--budget`` draws schedules with hypothesis, a development dependency: say so, up front."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise ConfigError("--budget draws generated schedules with hypothesis, which is not installed "
                          "(a development dependency: pip install 'chaos-ckpt[dev]'); "
                          "without --budget, chaos run needs no hypothesis") from None


CORRUPTIONS = ("truncate", "bitflip", "delete", "zero")  # what the sweep does to each kind, in turn


@dataclass
class ReadCoverage:
    """Which kinds of file the load reads were hit by a payload and by a corruption.

    Fed every result (``add``): an at-rest fault's record says the kinds the traced
    fault-free load read (``choice.kinds``) and the kind it hit (``choice.kind``).
    ``kinds`` keeps the read order of the first record that had them.
    """

    kinds: list[str] = field(default_factory=list)
    payload: set[str] = field(default_factory=set)
    corruption: set[str] = field(default_factory=set)
    untraced: str | None = None  # why a record had no kinds (the last such reason)

    def add(self, result: ScenarioResult) -> None:
        if result.record is None:
            return
        for f in result.record.fired_faults():
            c = (f.get("detail") or {}).get("corruption") or {}
            choice = c.get("choice") or {}
            if not choice:
                continue
            if choice.get("kinds") and not self.kinds:
                self.kinds = list(choice["kinds"])
            elif not choice.get("kinds"):
                self.untraced = choice.get("why")
            if c.get("changed") and choice.get("kind"):
                (self.payload if c.get("kind") == "payload" else self.corruption).add(choice["kind"])

    def to_dict(self) -> dict[str, Any]:
        return {"kinds": list(self.kinds), "payload": [k for k in self.kinds if k in self.payload],
                "corruption": [k for k in self.kinds if k in self.corruption],
                "payload_untried": [k for k in self.kinds if k not in self.payload],
                "corruption_untried": [k for k in self.kinds if k not in self.corruption],
                "untraced": self.untraced if not self.kinds else None}

    def summary(self) -> str:
        if not self.kinds:
            return f"at-rest targets: no load traced ({self.untraced or 'no at-rest fault ran'})"
        n = len(self.kinds)
        return (f"at-rest targets: the load reads {n} kind(s) of file ({', '.join(self.kinds)}); "
                f"payloads reached {len(self.payload & set(self.kinds))} of {n}, "
                f"corruptions {len(self.corruption & set(self.kinds))} of {n}")


def read_sweep(cfg: WorkloadConfig, reads: ReadCoverage) -> Iterator[list[str]]:
    """At-rest schedules that reach every kind of file the load reads; ``reads`` is read as it fills.

    First one corruption with no ``file=`` (it lands in the first file read, and its
    record names every kind the load read); then a payload (pickle) in each kind and a
    corruption of each kind not yet corrupted, ``file=KIND``. Steps and fault kinds are
    drawn from ``cfg.seed``, so the same seed sweeps the same way. Nothing more once no
    record names the kinds (no load could be traced).
    """
    saves = cfg.save_steps() or [cfg.steps]
    low = min(cfg.steps, saves[1] + 1 if len(saves) > 1 else saves[0] + 1)
    rng = random.Random(f"{cfg.seed}:read-sweep")

    def step() -> int:
        return rng.randint(low, cfg.steps)

    yield [f"truncate:step={step()},seed={cfg.seed}"]
    if not reads.kinds:
        return
    for kind in list(reads.kinds):
        yield [f"payload:step={step()},format=pickle,seed={cfg.seed},file={kind}"]
    for i, kind in enumerate(k for k in list(reads.kinds) if k not in reads.corruption):
        yield [f"{CORRUPTIONS[i % len(CORRUPTIONS)]}:step={step()},seed={cfg.seed},file={kind}"]


@dataclass
class Campaign:
    """What the generated half of a campaign ran, and what it covered.

    Iterating gives the generated results (``results += campaign`` works), ``to_dict``
    the ``campaign`` entry of the results document.
    """

    results: list[ScenarioResult] = field(default_factory=list)
    coverage: Coverage | None = None
    budget_s: float | None = None
    seed: int | None = None
    family_scenarios: int = 0
    reads: ReadCoverage = field(default_factory=ReadCoverage)

    def __iter__(self) -> Iterator[ScenarioResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    @property
    def skipped(self) -> list[ScenarioResult]:
        return [r for r in self.results if r.verdict == "skipped"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "family_scenarios": self.family_scenarios, "budget_s": self.budget_s, "seed": self.seed,
            "generated": len(self.results), "generated_skipped": len(self.skipped),
            "skipped": [{"id": r.scenario.id, "faults": [f.spec() for f in r.scenario.faults], "reason": r.error}
                        for r in self.skipped],
            "coverage": self.coverage.to_dict() if self.coverage is not None else None,
            "read_kinds": self.reads.to_dict() if self.budget_s is not None else None,
        }

    def summary(self) -> str:
        if self.budget_s is None:
            return (f"campaign: {self.family_scenarios} family scenario(s); "
                    f"--budget SECONDS adds generated schedules")
        text = (f"campaign: {self.family_scenarios} family scenario(s), {len(self.results)} generated "
                f"schedule(s) (seed {self.seed}), {len(self.skipped)} skipped")
        if self.coverage is not None:
            text += f"\n{self.coverage.summary()}"
        if self.reads.kinds or self.reads.untraced:
            text += f"\n{self.reads.summary()}"
        return text


def fill_budget(cfg: WorkloadConfig, world_size: int, points: TracePoints, deadline: float,
                run_one: Callable[[list[str]], ScenarioResult], estimate_s: Callable[[], float],
                max_schedules: int = 1000, max_faults: int = 2) -> Campaign:
    """Run generated schedules while ``estimate_s()`` seconds still fit before ``deadline`` (monotonic).

    First ``read_sweep`` (at-rest faults over every kind of file the load reads), then
    draws seeded by ``cfg.seed``, never shrunk (a failure is kept and reported, the
    campaign goes on); their I/O and phase faults come from ``points``, their at-rest
    faults aim at the kinds the sweep learned. Every result is counted into the
    campaign's coverage. Called by ``chaos run --budget`` (``chaos.cli.main._generated``).
    """
    from chaos.record.points import Coverage

    campaign = Campaign(coverage=Coverage(points), seed=cfg.seed)
    if deadline - time.monotonic() < estimate_s():
        return campaign
    require_hypothesis()
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from chaos.plan.strategies import fault_schedules

    ran: set[tuple[str, ...]] = set()

    def run(schedule: list[str]) -> None:
        if deadline - time.monotonic() < estimate_s():
            raise _BudgetSpent
        ran.add(tuple(schedule))
        result = run_one(schedule)
        campaign.results.append(result)
        campaign.coverage.add(result)
        campaign.reads.add(result)

    try:
        for schedule in read_sweep(cfg, campaign.reads):
            run(schedule)
    except _BudgetSpent:
        return campaign

    @hypothesis_seed(cfg.seed)
    @settings(max_examples=max_schedules, phases=[Phase.generate], database=None, deadline=None,
              derandomize=False, suppress_health_check=list(HealthCheck), print_blob=False)
    @given(schedule=fault_schedules(cfg, world_size, points, max_faults=max_faults,
                                    read_kinds=tuple(campaign.reads.kinds)))
    def explore(schedule: list[str]) -> None:
        if tuple(schedule) in ran:
            return  # hypothesis may draw one schedule from two different choice sequences
        run(schedule)

    try:
        explore()
    except _BudgetSpent:
        pass
    return campaign


Progress = Callable[[str, dict[str, Any]], None]


class _Gate:
    """One scenario's callbacks, delivered in campaign order.

    Its ranks may start while the scenario before it is still being judged; its
    ``on_start`` and progress events must not reach a display that still shows the
    other one. Until ``open()`` (called once the previous result was reported), events
    are kept; then ``on_start`` runs and the kept events follow, all under the
    campaign's lock.
    """

    def __init__(self, lock: threading.RLock, scenario: Scenario, on_start: Callable[[Scenario], None] | None,
                 progress: Progress | None) -> None:
        self.lock, self.scenario, self.on_start, self.progress = lock, scenario, on_start, progress
        self.opened = False
        self.kept: list[tuple[str, dict[str, Any]]] = []

    def open(self) -> None:
        with self.lock:
            if self.opened:
                return
            self.opened = True
            if self.on_start is not None:
                self.on_start(self.scenario)
            kept, self.kept = self.kept, []
            for event, info in kept:
                self._forward(event, info)

    def emit(self, event: str, info: dict[str, Any]) -> None:
        with self.lock:
            if self.opened:
                self._forward(event, info)
            else:
                self.kept.append((event, info))

    def _forward(self, event: str, info: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress(event, info)


def run_pipelined(scenarios: Sequence[Scenario], options: RunOptions | None = None, *,
                  on_start: Callable[[Scenario], None] | None = None, progress: Progress | None = None,
                  on_result: Callable[[ScenarioResult], None] | None = None) -> list[ScenarioResult]:
    """Run scenarios one after another, each judged while the next one's ranks already run.

    A scenario is two halves (``chaos.run.runner.ScenarioRun``): ``ranks()`` holds the cores
    (golden run, faulted run, final load, power-loss exploration) and always runs here,
    in the calling thread, one scenario at a time; ``finish()`` (record, hygiene,
    oracles, clean-up of its own scratch root and processes only) reads files and runs
    in a helper thread while the next scenario's ``ranks()`` starts. No two
    scenarios are ever in a core-bound half at once, and at most one is being finished.

    The callbacks arrive in scenario order, never interleaved, under one lock:
    ``on_start(scenario)``, that scenario's ``progress(event, info)`` events, then
    ``on_result(result)``, before the next scenario's ``on_start``. Returns the results
    in order. A ConfigError or an interrupt stops the campaign after the scenario in
    flight is cleaned up (the one before it is reported first), as ``run_scenario``
    one by one would.
    """
    from concurrent.futures import ThreadPoolExecutor

    from chaos.run import runner

    results: list[ScenarioResult] = []
    lock = threading.RLock()

    def report(result: ScenarioResult) -> None:
        with lock:
            results.append(result)
            if on_result is not None:
                on_result(result)

    def finish(run: runner.ScenarioRun) -> None:
        report(run.finish())

    def settle(future: Future | None) -> None:
        if future is not None:
            future.result()  # re-raises what that scenario's finish() raised (a ConfigError)

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chaos-judge")
    behind: Future | None = None  # the previous scenario's finish(), in the helper thread
    unjudged: runner.ScenarioRun | None = None  # ranks() done, finish() not yet handed over
    try:
        for scenario in scenarios:
            gate = _Gate(lock, scenario, on_start, progress)
            if behind is None:
                gate.open()
            run = runner.ScenarioRun(scenario, options, gate.emit)
            try:
                run.ranks()
            except BaseException:  # noqa: BLE001 - finish() turns it into the verdict or raises it again
                settle(behind)
                behind = None
                gate.open()
                report(run.finish())
                continue
            unjudged = run
            settle(behind)
            gate.open()
            behind, unjudged = executor.submit(finish, run), None
        settle(behind)
    except BaseException:
        if unjudged is not None:  # interrupted while waiting for the one before: still clean this one up
            try:
                unjudged.finish()
            except BaseException:  # noqa: BLE001, S110 - the first interrupt or error is the one raised
                pass
        raise
    finally:
        executor.shutdown(wait=True)
    return results
