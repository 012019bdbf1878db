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


def _first_loss_mismatch(golden: GoldenRun, record: RunRecord) -> dict[str, Any] | None:
    for rank in range(record.world_size):
        gold = golden.losses.get(rank, {})
        for entry in record.losses(rank):
            want = gold.get(entry["step"])
            if want != entry["loss_hex"]:
                return {"rank": rank, "step": entry["step"], "attempt": entry["attempt"], "loss": entry["loss"],
                        "golden_loss": float.fromhex(want) if want else None}
        missing = sorted(set(gold) - set(record.loss_by_step(rank)))
        if missing:
            return {"rank": rank, "missing_steps": missing}
    return None


def _first_state_mismatch(golden: GoldenRun, record: RunRecord) -> dict[str, Any] | None:
    for rank in range(record.world_size):
        final = record.final_fingerprint(rank) or {}
        diff = first_difference(golden.finals[rank], final)
        if diff is not None:
            path = diff.rsplit(":", 1)[0]
            differing = sum(1 for p in golden.finals[rank] if final.get(p) != golden.finals[rank][p])
            return {"rank": rank, "tensor": path, "detail": diff, "differing_entries": differing,
                    "golden_digest": golden.finals[rank].get(path), "digest": final.get(path)}
    return None


def bit_exact(golden: GoldenRun, record: RunRecord) -> OracleResult:
    """Final state equal to the golden run's tensor by tensor, and every step's loss equal too.

    Losses are compared for *every* execution of a step, including steps re-run after a
    restart: a resumed run that diverges and later happens to converge is still caught.
    The evidence names both the first differing final-state entry and the first step
    whose loss differs, since either alone can hide where the damage came from.
    """
    name = "bit_exact"
    if not record.completed:
        return OracleResult(name, False, _unfinished(record), {"attempts": len(record.attempts)})
    state = _first_state_mismatch(golden, record)
    loss = _first_loss_mismatch(golden, record)
    if state is None and loss is None:
        leaves = sum(len(record.final_fingerprint(r) or {}) for r in range(record.world_size))
        steps = sum(len(record.losses(r)) for r in range(record.world_size))
        return OracleResult(name, True, f"{leaves} final state entries and {steps} step losses equal the golden run",
                            {"leaves": leaves, "steps": steps})
    parts = []
    if state is not None:
        parts.append(f"rank {state['rank']} final state: first differing tensor {state['tensor']!r} "
                     f"({state['differing_entries']} entries differ)")
    if loss is not None and "missing_steps" in loss:
        parts.append(f"rank {loss['rank']} never ran step(s) {loss['missing_steps'][:10]}")
    elif loss is not None:
        parts.append(f"rank {loss['rank']} step {loss['step']} (attempt {loss['attempt']}): loss {loss['loss']!r} "
                     f"!= golden {loss['golden_loss']!r}")
    return OracleResult(name, False, "; ".join(parts), {"first_state_difference": state, "first_loss_difference": loss})


ORACLES: dict[str, Callable[[GoldenRun, RunRecord], OracleResult]] = {"bit_exact": bit_exact}


def judge(golden: GoldenRun, record: RunRecord, names: list[str] | None = None) -> dict[str, OracleResult]:
    return {n: ORACLES[n](golden, record) for n in (names or list(ORACLES))}
