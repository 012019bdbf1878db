"""When to save and what to keep.

Retention: keep the newest ``keep_last`` committed checkpoints of the current timeline
plus milestones forever. It runs only after a commit and only with the just-committed
step as ``current``, so it can never delete before the new checkpoint exists nor delete
the newest valid one. Directories *newer* than ``current`` belong to an abandoned
timeline (the job resumed from an older step, e.g. because they failed verification);
they are left alone: loaders try them last, and re-saving that step replaces them.

Cadence: Young's optimal interval ``sqrt(2 C M)`` for save cost ``C`` and mean time
between failures ``M``, Daly's higher-order correction, the expected work lost per
failure and the overhead, a denser schedule early in training (when a restart loses
the most relative progress and runs fail most), and a stall budget (default 2% of
training time) that stretches the interval when saves cost more than allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from chaos.reference.checkpoint.options import Milestones


def select_for_deletion(steps: Iterable[int], current: int, keep_last: int, milestones: Milestones | None = None) -> list[int]:
    """Committed steps that retention may delete after ``current`` was committed.

    Returns nothing if ``current`` is not among ``steps`` (not committed yet).
    """
    steps = sorted(set(steps), reverse=True)
    if current not in steps:
        return []
    milestones = milestones or Milestones()
    timeline = [s for s in steps if s <= current]
    keep = set(timeline[: max(1, keep_last)]) | {current}
    keep |= {s for s in steps if s in milestones or s > current}
    return sorted(s for s in steps if s not in keep)


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young (1974): the compute time between saves that minimises expected waste."""
    _check(save_s, mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order optimum; equals the MTBF once saves cost over M/2."""
    _check(save_s, mtbf_s)
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_s


def expected_lost_work(interval_s: float, save_s: float) -> float:
    """Work lost per failure on average: half of a compute-plus-save segment."""
    return (interval_s + save_s) / 2.0


def overhead_fraction(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Daly's expected wall time per unit of useful work, minus one (exponential failures)."""
    _check(save_s, mtbf_s)
    if interval_s <= 0:
        raise ValueError("interval must be positive")
    m = mtbf_s
    wall = m * math.exp(restart_s / m) * math.expm1((interval_s + save_s) / m) / interval_s
    return wall - 1.0


def budget_interval(save_s: float, budget: float = 0.02) -> float:
    """The shortest interval whose save stall stays within ``budget`` of training time."""
    if not 0 < budget < 1:
        raise ValueError("budget must be in (0, 1)")
    return save_s / budget


def _check(save_s: float, mtbf_s: float) -> None:
    if not (save_s > 0 and mtbf_s > 0 and math.isfinite(save_s) and math.isfinite(mtbf_s)):
        raise ValueError(f"save cost and MTBF must be positive and finite (got {save_s}, {mtbf_s})")


@dataclass
class Cadence:
    """A step schedule: dense early, sparser later, stretched to respect the stall budget.

    Feed it measured step times and save stalls; ``interval_steps(step)`` is the
    current recommendation and ``due(step, last_saved)`` says whether to save now.
    With an MTBF, the late interval is Daly's optimum in steps (never below
    ``early_every``).
    """

    early_every: int = 500
    late_every: int = 2000
    early_until: int = 10_000
    budget: float = 0.02
    mtbf_s: float | None = None
    train_s: float = 0.0
    steps: int = 0
    stall_s: float = 0.0
    saves: int = 0

    def record_step(self, seconds: float) -> None:
        self.train_s += seconds
        self.steps += 1

    def record_save(self, stall_s: float) -> None:
        self.stall_s += stall_s
        self.saves += 1

    def stall_fraction(self) -> float:
        return self.stall_s / self.train_s if self.train_s > 0 else 0.0

    def interval_steps(self, step: int) -> int:
        base = self.early_every if step < self.early_until else self.late_every
        if not (self.steps and self.saves):
            return base
        step_s = self.train_s / self.steps
        save_s = self.stall_s / self.saves
        if self.mtbf_s and step >= self.early_until and save_s > 0:
            base = max(self.early_every, round(daly_interval(save_s, self.mtbf_s) / step_s))
        need = math.ceil(budget_interval(save_s, self.budget) / step_s) if save_s > 0 else 0
        if self.stall_fraction() > self.budget:
            need = max(need, math.ceil(base * self.stall_fraction() / self.budget))
        return max(base, need, 1)

    def due(self, step: int, last_saved: int | None) -> bool:
        return last_saved is None or step - last_saved >= self.interval_steps(step)
