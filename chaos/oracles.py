"""Oracles: judge a run from its record alone, and say why with evidence.

Each oracle is a function ``(golden, record) -> OracleResult``. A verdict never rests
on a guess: a failure names the first tensor or step that differs, the rank and the
attempt where it was seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.golden import GoldenRun
from chaos.record import RunRecord
from chaos.statehash import first_difference


@dataclass
class OracleResult:
    name: str
    passed: bool
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"result": "pass" if self.passed else "fail", "summary": self.summary, "evidence": self.evidence}


def _unfinished(record: RunRecord) -> str:
    last = record.attempts[-1] if record.attempts else {}
    errors = record.errors()
    why = f"; last error: rank {errors[-1]['rank']}: {errors[-1]['type']}: {errors[-1]['message'][:300]}" if errors else ""
    return (f"the job did not finish after {len(record.attempts)} attempt(s) "
            f"(last: {last.get('outcome')} {last.get('detail', '')}){why}")


def bit_exact(golden: GoldenRun, record: RunRecord) -> OracleResult:
    """Final state equal to the golden run's tensor by tensor, and every step's loss equal too.

    Losses are compared for *every* execution of a step, including steps re-run after a
    restart: a resumed run that diverges and later happens to converge is still caught.
    """
    name = "bit_exact"
    if not record.completed:
        return OracleResult(name, False, _unfinished(record), {"attempts": len(record.attempts)})
    checked_leaves = checked_steps = 0
    for rank in range(record.world_size):
        gold_losses = golden.losses.get(rank, {})
        for entry in record.losses(rank):
            checked_steps += 1
            want = gold_losses.get(entry["step"])
            if want != entry["loss_hex"]:
                return OracleResult(
                    name, False,
                    f"rank {rank} step {entry['step']} (attempt {entry['attempt']}): loss {entry['loss']!r} "
                    f"differs from the golden run's {float.fromhex(want) if want else None!r}",
                    {"rank": rank, "step": entry["step"], "attempt": entry["attempt"],
                     "loss": entry["loss"], "golden_loss": float.fromhex(want) if want else None},
                )
        covered = set(record.loss_by_step(rank))
        missing = sorted(set(gold_losses) - covered)
        if missing:
            return OracleResult(name, False, f"rank {rank} never ran step(s) {missing[:10]}",
                                {"rank": rank, "missing_steps": missing})
        final = record.final_fingerprint(rank) or {}
        diff = first_difference(golden.finals[rank], final)
        if diff is not None:
            path = diff.rsplit(":", 1)[0]
            return OracleResult(name, False, f"rank {rank} final state: {diff} (first of the final state)",
                                {"rank": rank, "first_difference": path, "detail": diff,
                                 "golden_digest": golden.finals[rank].get(path), "digest": final.get(path)})
        checked_leaves += len(final)
    return OracleResult(name, True,
                        f"{checked_leaves} final state entries and {checked_steps} step losses equal the golden run",
                        {"leaves": checked_leaves, "steps": checked_steps})


ORACLES: dict[str, Callable[[GoldenRun, RunRecord], OracleResult]] = {"bit_exact": bit_exact}


def judge(golden: GoldenRun, record: RunRecord, names: list[str] | None = None) -> dict[str, OracleResult]:
    return {n: ORACLES[n](golden, record) for n in (names or list(ORACLES))}
