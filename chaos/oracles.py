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


def _restarts(record: RunRecord) -> list[int]:
    return [a["attempt"] for a in record.attempts[1:] if isinstance(a["attempt"], int)]


def _corrupted_before(record: RunRecord, attempt: int) -> bool:
    return any(f.get("detail", {}).get("corruption") for f in record.fired_faults() if f.get("attempt") == attempt - 1)


def _resumed_step(record: RunRecord, attempt: int) -> int | None:
    steps = [e["step"] for r in range(record.world_size) for e in record.events.get(attempt, {}).get(r, [])
             if e["ev"] == "resume"]
    return min(steps) if len(steps) == record.world_size else None


def _last_step(record: RunRecord, attempt: int) -> tuple[int | None, float | None]:
    steps = [(e["step"], e["t"]) for r in range(record.world_size) for e in record.events.get(attempt, {}).get(r, [])
             if e["ev"] == "step"]
    return max(steps) if steps else (None, None)


def _step_time(record: RunRecord, attempt: int, step: int) -> float | None:
    times = [e["t"] for r in range(record.world_size) for e in record.events.get(attempt, {}).get(r, [])
             if e["ev"] == "step" and e["step"] == step]
    return min(times) if times else None


def durability(golden: GoldenRun, record: RunRecord) -> OracleResult:
    """After every crash the job resumes at or after the newest acknowledged save (RPO).

    The work lost is reported in steps and seconds next to the save interval. A restart
    right after a deliberate at-rest corruption is exempt: falling back past a destroyed
    checkpoint is the correct outcome there (the checksum oracle judges it).
    """
    name = "durability"
    restarts = []
    for attempt in _restarts(record):
        acked = [s for a in range(attempt) for s in record.acked_steps(a)]
        acked_before = max(acked) if acked else None
        resumed = _resumed_step(record, attempt)
        last, t_last = _last_step(record, attempt - 1)
        t_resumed = _step_time(record, attempt - 1, resumed + 1) if resumed is not None else None
        entry = {"attempt": attempt, "acked_before": acked_before, "resumed": resumed, "last_step_before_crash": last,
                 "lost_steps": None if resumed is None or last is None else max(0, last - resumed),
                 "lost_seconds": None if t_last is None or t_resumed is None else round(max(0.0, t_last - t_resumed), 3)}
        if _corrupted_before(record, attempt):
            entry["exempt"] = "the newest checkpoint was corrupted on purpose before this restart"
        elif acked_before is not None and resumed is not None and resumed < acked_before:
            restarts.append(entry)
            return OracleResult(name, False, f"attempt {attempt} resumed from step {resumed}, older than the save at "
                                f"step {acked_before} that had been acknowledged", {"restarts": restarts})
        restarts.append(entry)
    lost = [r["lost_steps"] for r in restarts if r["lost_steps"] is not None]
    summary = (f"{len(restarts)} restart(s) resumed at or after the newest acknowledged save; "
               f"at most {max(lost)} step(s) of work lost" if lost else "no restart resumed (nothing to check)")
    saves = sorted({e["step"] for e in record.rank_events(0, "save_call")})
    interval = min((b - a for a, b in zip(saves, saves[1:], strict=False)), default=None)
    return OracleResult(name, True, summary, {"restarts": restarts, "save_interval_steps": interval})


def committed_state(golden: GoldenRun, record: RunRecord) -> OracleResult:
    """Whatever a restart (or the final check) loaded is exactly a state that was saved.

    Step by step and rank by rank, the loaded fingerprint must equal the one taken at the
    save() call for that step: a mixture of checkpoints, a dropped value or a snapshot
    that changed after save() returned all show up here as the first differing entry.
    """
    name = "committed_state"
    checked = 0
    loads = [(a, r, e) for a in sorted(record.events) for r in range(record.world_size)
             for e in record.events[a].get(r, []) if e["ev"] == "resume" and e.get("step")]
    loads += [(None, int(r), e) for r, evs in record.verify.get("events", {}).items() for e in evs
              if e["ev"] == "verify" and e.get("step") is not None]
    for attempt, rank, ev in loads:
        where = f"rank {rank} {'final check' if attempt is None else f'attempt {attempt}'}"
        saved = record.saved_fingerprint(rank, ev["step"], before_attempt=attempt)
        if saved is None:
            return OracleResult(name, False, f"{where} loaded step {ev['step']}, which was never saved",
                                {"rank": rank, "attempt": attempt, "step": ev["step"]})
        diff = first_difference(saved, ev["fingerprint"] or {})
        if diff is not None:
            return OracleResult(name, False, f"{where} loaded step {ev['step']} but not the state saved then: {diff}",
                                {"rank": rank, "attempt": attempt, "step": ev["step"], "first_difference": diff})
        checked += 1
    return OracleResult(name, True, f"{checked} load(s) returned exactly the state saved at their step",
                        {"loads": checked})


def final_durability(golden: GoldenRun, record: RunRecord) -> OracleResult:
    """At the end, a fresh launch loads the newest acknowledged save, exactly."""
    name = "final_durability"
    if not record.completed:
        return OracleResult(name, True, "not applicable: the job did not finish (liveness says why)", {})
    acked = record.acked_steps(record.attempts[-1]["attempt"])
    if not acked:
        return OracleResult(name, True, "not applicable: nothing was acknowledged", {})
    want = max(acked)
    verify = record.verify
    if not verify:
        return OracleResult(name, True, "not applicable: no final load was run", {})
    if verify.get("outcome") != "ok":
        return OracleResult(name, False, f"the final load failed ({verify.get('outcome')}: {verify.get('detail', '')})",
                            {"expected_step": want, "errors": verify.get("errors", [])})
    for rank in range(record.world_size):
        evs = [e for e in verify.get("events", {}).get(rank, verify.get("events", {}).get(str(rank), []))
               if e["ev"] == "verify"]
        got = evs[-1]["step"] if evs else None
        if got != want:
            return OracleResult(name, False, f"rank {rank}: the final load returned step {got}, not the newest "
                                f"acknowledged save {want}", {"rank": rank, "expected_step": want, "loaded_step": got})
        saved = record.saved_fingerprint(rank, want)
        diff = first_difference(saved or {}, evs[-1]["fingerprint"] or {})
        if diff is not None:
            return OracleResult(name, False, f"rank {rank}: step {want} loads, but differs from what was saved: {diff}",
                                {"rank": rank, "step": want, "first_difference": diff})
    return OracleResult(name, True, f"the newest acknowledged save (step {want}) loads exactly on every rank",
                        {"step": want})


def _injured_saves(record: RunRecord) -> list[tuple[int, int, str]]:
    """(attempt, save step, what) for every save an injected error or a full disk hit."""
    out = []
    for f in record.io.get("fired", []):
        if f.get("action") in ("enospc", "eio", "fsync_fail", "short_write") and f.get("step") is not None:
            out.append((f["attempt"], int(f["step"]), f"{f['action']} at {f.get('op')} of {f.get('path')}"))
    for f in record.fired_faults():
        if f.get("kind") == "diskfull" and f.get("step") is not None:
            saves = [e["step"] for e in record.rank_events(0, "save_call") if e["attempt"] == f["attempt"]
                     and e["step"] >= f["step"]]
            if saves:
                out.append((f["attempt"], min(saves), f"disk full ({f.get('detail', {}).get('leave_bytes')} bytes left)"))
    return out


def no_false_ack(golden: GoldenRun, record: RunRecord) -> OracleResult:
    """A save that an injected error or a full disk hit is not acknowledged.

    Unless the very state of that save later loads intact (a checkpointer may retry and
    succeed), acknowledging it is a lie the next crash would expose.
    """
    name = "no_false_ack"
    injured = _injured_saves(record)
    loaded = {(e["step"], r) for r in range(record.world_size) for e in record.resumes(r) if e.get("step")}
    for attempt, step, what in injured:
        if step in record.acked_steps(attempt) and not all((step, r) in loaded for r in range(record.world_size)):
            return OracleResult(name, False, f"the save at step {step} was acknowledged although it failed: {what}",
                                {"attempt": attempt, "step": step, "injury": what})
    return OracleResult(name, True, f"{len(injured)} injured save(s), none acknowledged falsely",
                        {"injured": [{"attempt": a, "step": s, "what": w} for a, s, w in injured]})


def checksum_detection(golden: GoldenRun, record: RunRecord) -> OracleResult:
    """Classify each at-rest corruption by what the next load did.

    detected (a clear error), fell back (an older committed state loaded), no effect (the
    same step loaded intact: the bytes changed nothing that loads), or silent corruption
    (a state never saved loaded) — only the last fails.
    """
    name = "checksum_detection"
    cases = []
    for f in record.fired_faults():
        corruption = f.get("detail", {}).get("corruption")
        if not corruption:
            continue
        nxt = f["attempt"] + 1
        case = {"fault": f["spec"], "target": corruption.get("target"), "changed": corruption.get("changed", True)}
        resumes = {r: e for r in range(record.world_size) for e in record.events.get(nxt, {}).get(r, [])
                   if e["ev"] == "resume"}
        errors = [e for r in range(record.world_size) for e in record.events.get(nxt, {}).get(r, []) if e["ev"] == "error"]
        # The newest save that returned on every rank before the corruption: its files were the target.
        returned = [e["step"] for e in record.rank_events(0, "save_return") if e["attempt"] < nxt
                    and all(any(x["step"] == e["step"] and x["attempt"] == e["attempt"]
                                for x in record.rank_events(r, "save_return")) for r in range(record.world_size))]
        newest = max(returned) if returned else None
        if not case["changed"]:
            case["class"] = "no change"
        elif len(resumes) < record.world_size:
            case["class"] = "detected" if errors else "no restart"
            case["error"] = errors[0]["message"][:300] if errors else None
        else:
            bad = [r for r, e in resumes.items() if e.get("step") and
                   record.saved_fingerprint(r, e["step"], before_attempt=nxt) != e["fingerprint"]]
            step = min(e["step"] for e in resumes.values())
            case["loaded_step"] = step
            case["class"] = ("silent corruption" if bad else
                             "no effect" if step == newest else "fell back")
        cases.append(case)
    if not cases:
        return OracleResult(name, True, "not applicable: no at-rest corruption", {})
    silent = [c for c in cases if c["class"] == "silent corruption"]
    summary = "; ".join(f"{c['fault']}: {c['class']}" for c in cases)
    return OracleResult(name, not silent, summary, {"cases": cases})


def liveness(golden: GoldenRun, record: RunRecord) -> OracleResult:
    """The job finishes within its restarts; when it cannot, the evidence says which load or save broke."""
    if record.completed:
        return OracleResult("liveness", True, f"finished after {len(record.attempts)} attempt(s)",
                            {"attempts": len(record.attempts)})
    errors = record.errors()
    return OracleResult("liveness", False, _unfinished(record) + " - a failure of the checkpointer under test",
                        {"outcomes": [a["outcome"] for a in record.attempts],
                         "errors": [{"rank": e["rank"], "attempt": e["attempt"], "type": e["type"],
                                     "message": e["message"][:500]} for e in errors[-4:]]})


def hygiene(golden: GoldenRun, record: RunRecord) -> OracleResult:
    """No rank process, mount or network namespace outlived the scenario."""
    left = {k: v for k, v in record.hygiene.items() if v}
    if left:
        return OracleResult("hygiene", False, "left behind: " + "; ".join(f"{k}: {v}" for k, v in left.items()), left)
    return OracleResult("hygiene", True, "no process, mount or namespace outlived the scenario",
                        {k: v for k, v in record.hygiene.items()})


ORACLES: dict[str, Callable[[GoldenRun, RunRecord], OracleResult]] = {
    "bit_exact": bit_exact,
    "liveness": liveness,
    "committed_state": committed_state,
    "durability": durability,
    "no_false_ack": no_false_ack,
    "final_durability": final_durability,
    "checksum_detection": checksum_detection,
    "hygiene": hygiene,
}


def judge(golden: GoldenRun, record: RunRecord, names: list[str] | None = None) -> dict[str, OracleResult]:
    return {n: ORACLES[n](golden, record) for n in (names or list(ORACLES))}
