"""Hypothesis strategies for fault schedules, composed from one small strategy per family.

A schedule is a list of fault specs (the same strings ``--fault`` takes), so a failing
example prints as a ready replay command and shrinks towards fewer, earlier, simpler
faults. I/O faults and kills at a save phase are drawn from the points a traced
fault-free run of the same configuration really reached (``chaos.record.points``), never
guessed: a drawn point is one the job passes. A second fault fires in the restart the
first one caused (``attempt=1``), and is drawn only after a first fault that causes a
restart, at a step past it: restarts during restarts.

``Tally`` counts a property's examples by verdict, so a property whose every example was
skipped fails instead of passing on nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from chaos.model.grammar import parse_fault
from chaos.plan.scenario import Scenario
from chaos.target.workload.config import WorkloadConfig

if TYPE_CHECKING:
    from chaos.record.points import IOPoint, PhasePoint, TracePoints
    from chaos.run.runner import ScenarioResult

# Faults after which the job restarts for certain (the rank dies, or every rank is stopped
# for an at-rest corruption): only these are followed by a fault in the next attempt. An
# EIO or ENOSPC may be handled by the checkpointer without any restart.
RESTARTING_KINDS = frozenset({"kill", "term", "crash", "shortwrite", "bitflip", "truncate", "delete", "payload"})
REST_KINDS = ("bitflip", "truncate", "delete", "payload")
IO_KINDS = ("crash", "eio", "enospc")


@dataclass(frozen=True)
class Drawn:
    spec: str
    step: int
    restarts: bool


def _uniform_over_keys(points: list[IOPoint]) -> st.SearchStrategy[IOPoint]:
    """A point whose (rank, op, role, phase) key is uniform over the keys seen: 24 shard writes
    do not crowd out the one rename of the manifest."""
    by_key: dict[tuple, list[IOPoint]] = {}
    for p in sorted(points):
        by_key.setdefault(p.key, []).append(p)
    keys = sorted(by_key)
    return st.sampled_from(keys).flatmap(lambda k: st.sampled_from(by_key[k]))


def fault_schedules(cfg: WorkloadConfig, world_size: int, points: TracePoints, *,
                    max_faults: int = 2, read_kinds: Sequence[str] = ()) -> st.SearchStrategy[list[str]]:
    """Schedules of one to ``max_faults`` faults, each in the attempt after the one before.

    ``points`` (``chaos.record.points.reference_points``) gives the I/O operations and phase
    announcements each rank performed in a fault-free run of ``cfg``; I/O faults and
    phase kills come from those only. A process kill or an at-rest corruption lands at
    any step; an at-rest fault's ``file=`` is one of ``read_kinds`` (the kinds of file a
    traced fault-free load read, as ``chaos.plan.loadtrace.kind_of`` names them) or absent
    (the first file the load reads). A fault in attempt ``i > 0`` lies at a step past
    the fault of attempt ``i - 1`` (the restarted job resumes at or before it, so it
    passes that step again).
    """
    saves = cfg.save_steps() or [cfg.steps]
    ranks = st.integers(0, world_size - 1)
    # Corruption lands once two saves exist, so a valid committed checkpoint is left to fall
    # back to: destroying the only one leaves nothing a correct checkpointer could resume
    # (the reference then refuses with NoValidCheckpointError on every restart).
    first_rest = min(cfg.steps, saves[1] + 1 if len(saves) > 1 else saves[0] + 1)

    def process(after: int) -> st.SearchStrategy[Drawn] | None:
        low = max(2, after + 1)
        if low > cfg.steps:
            return None
        return st.builds(lambda kind, rank, step: Drawn(f"{kind}:rank={rank},step={step}", step, True),
                         st.sampled_from(["kill", "term"]), ranks, st.integers(low, cfg.steps))

    def at_phase(after: int) -> st.SearchStrategy[Drawn] | None:
        found: list[PhasePoint] = sorted({p for p in points.phases if p.step > after})
        if not found:
            return None
        # Half of them let the survivors run on for 2 s (linger), as a real launcher does until
        # its monitor notices: a rank that commits its part without the others is then caught.
        return st.builds(lambda p, linger: Drawn(f"kill:rank={p.rank},phase={p.phase},step={p.step}{linger}",
                                                 p.step, True),
                         st.sampled_from(found), st.sampled_from(["", ",linger=2"]))

    def io(after: int) -> st.SearchStrategy[Drawn] | None:
        found = [p for p in points.io if p.step > after]
        if not found:
            return None

        def kinds(p: IOPoint) -> st.SearchStrategy[Drawn]:
            choices = IO_KINDS + (("shortwrite",) if p.op == "write" else ())
            return st.sampled_from(choices).map(lambda k: Drawn(p.spec(k), p.step, k in RESTARTING_KINDS))

        return _uniform_over_keys(found).flatmap(kinds)

    def rest(after: int) -> st.SearchStrategy[Drawn] | None:
        low = max(first_rest, after + 1)
        if low > cfg.steps:
            return None
        where = st.sampled_from([None, *read_kinds])
        return st.builds(lambda kind, step, seed, file: Drawn(
            f"{kind}:step={step},seed={seed}" + (f",file={file}" if file else ""), step, True),
            st.sampled_from(REST_KINDS), st.integers(low, cfg.steps), st.integers(0, 2**16), where)

    cache: dict[int, st.SearchStrategy[Drawn] | None] = {}

    def one(after: int) -> st.SearchStrategy[Drawn] | None:
        if after not in cache:
            # I/O points are where saves differ most, so they get two shares of the draws.
            io_points = io(after)
            options = [s for s in (process(after), at_phase(after), io_points, io_points, rest(after)) if s is not None]
            cache[after] = st.one_of(options) if options else None
        return cache[after]

    @st.composite
    def schedule(draw: Callable[[st.SearchStrategy[Any]], Any]) -> list[str]:
        faults: list[str] = []
        after = 0
        for attempt in range(max_faults):
            strategy = one(after)
            if strategy is None:
                break
            fault = draw(strategy)
            faults.append(fault.spec if attempt == 0 else f"{fault.spec},attempt={attempt}")
            if not fault.restarts or attempt + 1 == max_faults or not draw(st.booleans()):
                break
            after = fault.step
        return faults

    return schedule()


@dataclass
class Tally:
    """A property's examples by verdict: a run whose every example was skipped tested nothing.

    A suite adds each example's result; ``require_tested`` (called after the property
    ran) fails the test when no example was judged, naming why each was skipped.
    Skipped examples stay legal one by one (a fault the machine cannot have, say), but
    not all of them.
    """

    verdicts: Counter[str] = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)

    def add(self, result: ScenarioResult) -> ScenarioResult:
        self.verdicts[result.verdict] += 1
        if result.verdict == "skipped":
            self.reasons.append(f"{' '.join(f.spec() for f in result.scenario.faults)}: {result.error}")
        return result

    @property
    def judged(self) -> int:
        return sum(n for v, n in self.verdicts.items() if v != "skipped")

    def require_tested(self) -> None:
        total = sum(self.verdicts.values())
        if total == 0:
            raise AssertionError("the property ran no scenario: it tested nothing")
        if self.judged == 0:
            shown = "\n  ".join(self.reasons[:5])
            raise AssertionError(f"all {total} example(s) were skipped, so the property tested nothing:\n  {shown}")


# -- stateful: train / save / fault / restart / verify ------------------------------------

def schedule_machine(run: Callable[[Scenario], ScenarioResult], checkpointer: str, workload: WorkloadConfig,
                     world_size: int = 2, max_faults: int = 3,
                     failures: list[ScenarioResult] | None = None) -> type[RuleBasedStateMachine]:
    """A hypothesis state machine whose rules write one fault schedule, run once on the real harness.

    Rules model the job as the harness will run it: ``train`` advances the step the
    current attempt has reached, ``save`` trains up to the next save, ``kill`` (a rank,
    before the next step) and ``corrupt`` (the newest checkpoint, at rest) end the
    attempt, ``restart`` begins the next one at the step it should resume from, and
    ``verify`` runs the whole schedule as one Scenario (each real run costs seconds, so
    one per example) and asserts its verdict. Shrinking therefore shrinks the schedule:
    fewer rules means fewer, earlier faults. Every verified run notes its ``chaos run``
    replay command, which hypothesis prints with the falsifying example; failing
    results are appended to ``failures`` (the last one is the shrunk example's).
    """
    every = workload.save_every or workload.steps
    last = workload.steps

    class ScheduleMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.step = 0  # the step the current attempt has trained through
            self.resume = 0  # where the current attempt started (the step it resumed from)
            self.attempt = 0
            self.up = True
            self.faults: list[str] = []
            self.verified = False
            self.result: ScenarioResult | None = None

        def _newest_save(self) -> int:
            return (self.step // every) * every

        @precondition(lambda self: self.up and not self.verified and self.step < last - 1)
        @rule(n=st.integers(1, 4))
        def train(self, n: int) -> None:
            self.step = min(last - 1, self.step + n)

        @precondition(lambda self: self.up and not self.verified and (self.step // every + 1) * every < last)
        @rule()
        def save(self) -> None:
            self.step = (self.step // every + 1) * every

        @precondition(lambda self: self.up and not self.verified and len(self.faults) < max_faults)
        @rule(rank=st.integers(0, world_size - 1))
        def kill(self, rank: int) -> None:
            self._fault(f"kill:rank={rank},step={self.step + 1}", resume=self._newest_save())

        @precondition(lambda self: self.up and not self.verified and len(self.faults) < max_faults
                      and self.step >= 2 * every)
        @rule(kind=st.sampled_from(["bitflip", "truncate"]), seed=st.integers(0, 3))
        def corrupt(self, kind: str, seed: int) -> None:
            # The newest checkpoint is damaged: a correct checkpointer falls back to the one before
            # (two saves exist by now, so there is one; destroying the only one tests nothing).
            self._fault(f"{kind}:step={self.step + 1},seed={seed}", resume=max(0, self._newest_save() - every))

        def _fault(self, spec: str, resume: int) -> None:
            self.faults.append(spec if self.attempt == 0 else f"{spec},attempt={self.attempt}")
            self.up, self.resume = False, resume

        @precondition(lambda self: not self.up)
        @rule()
        def restart(self) -> None:
            self.attempt += 1
            self.up, self.step = True, self.resume

        @precondition(lambda self: self.up and bool(self.faults))
        @rule()
        def verify(self) -> None:
            # Once verified the schedule is closed (no fault rule applies) and verify stays
            # available, judging the same run again, so the machine always has a rule to take.
            if self.verified:
                result = self.result
            else:
                self.verified = True
                scenario = Scenario(checkpointer=checkpointer, world_size=world_size, workload=workload,
                                    faults=[parse_fault(f) for f in self.faults], max_restarts=max_faults)
                result = self.result = run(scenario)
                note(f"replay: {result.replay}")
                if result.verdict not in ("pass", "skipped") and failures is not None:
                    failures.append(result)
            bad = {n: o.summary for n, o in result.oracles.items() if not o.passed}
            assert result.verdict in ("pass", "skipped"), (
                f"verdict {result.verdict} for {self.faults}: {bad or result.error}\nreplay: {result.replay}")

        def teardown(self) -> None:
            if self.faults and not self.verified:
                if not self.up:
                    self.restart()
                self.verify()

    ScheduleMachine.__name__ = ScheduleMachine.__qualname__ = "ScheduleMachine"
    return ScheduleMachine
