"""Hypothesis strategies for fault schedules, composed from one small strategy per family.

A schedule is a list of fault specs (the same strings ``--fault`` takes), so a failing
example prints as a ready replay command and shrinks towards fewer, earlier, simpler
faults. The second fault of a schedule fires in the restart the first one caused
(``attempt=1``): restarts during restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from chaos.scenario import Scenario, parse_fault
from chaos.workload.config import WorkloadConfig

if TYPE_CHECKING:
    from chaos.runner import ScenarioResult

REFERENCE_PHASES = ("save", "write_shards", "fsync_shards", "vote", "write_manifest", "rename", "update_latest")


def fault_schedules(cfg: WorkloadConfig, world_size: int, *, max_faults: int = 2,
                    phases: tuple[str, ...] = ("save",)) -> st.SearchStrategy[list[str]]:
    saves = cfg.save_steps() or [cfg.steps]
    ranks = st.integers(0, world_size - 1)
    any_step = st.integers(2, cfg.steps)
    save_step = st.sampled_from(saves)
    process = st.builds(lambda kind, rank, step: f"{kind}:rank={rank},step={step}",
                        st.sampled_from(["kill", "term"]), ranks, any_step)
    at_phase = st.builds(lambda rank, step, phase: f"kill:rank={rank},phase={phase},step={step}",
                         ranks, save_step, st.sampled_from(phases))
    io = st.builds(lambda kind, rank, step, op, nth: f"{kind}:rank={rank},step={step},op={op},nth={nth}",
                   st.sampled_from(["crash", "eio", "enospc"]), ranks, save_step,
                   st.sampled_from(["write", "fsync", "rename"]), st.integers(1, 3))
    # Corruption lands once two saves exist, so a valid committed checkpoint is left to fall
    # back to: destroying the only one leaves nothing a correct checkpointer could resume
    # (the reference then refuses with NoValidCheckpointError on every restart).
    first_rest = saves[1] + 1 if len(saves) > 1 else saves[0] + 1
    rest = st.builds(lambda kind, step, seed: f"{kind}:step={step},seed={seed}",
                     st.sampled_from(["bitflip", "truncate", "delete"]),
                     st.integers(min(first_rest, cfg.steps), cfg.steps), st.integers(0, 2**16))
    one = st.one_of(process, at_phase, io, rest)
    return st.lists(one, min_size=1, max_size=max_faults).map(
        lambda faults: [f if i == 0 else f"{f},attempt={i}" for i, f in enumerate(faults)])


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
