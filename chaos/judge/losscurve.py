"""A job's loss curve, from what its ranks announced, judged by the built-in ``loss_continuity``.

A job tells its loss through ``chaos.probe.step(n, loss)`` or through its own log lines
(``--loss-regex``, scanned in the rank by ``inproc._OutputScanner``); both arrive in the
rank's trace as ``chaos.probe`` phases. ``explore.reference`` calls :func:`curves` on the
fault-free runs (their curves are the golden curve, and whether the two agree bit for bit
decides exact or tolerance mode); ``judge`` calls :func:`continuity` on each point's
traces. The judging is not a second oracle: the traces become a ``GoldenRun`` and a
``RunRecord`` of the shape the built-in workload's are, and ``chaos.judge.oracles.loss_continuity``
judges them — every step's loss within the band of the golden loss at that rank and step,
re-run steps included, and no spike over the golden curve right after a resume.
"""

from __future__ import annotations

from typing import Any

from chaos.judge.oracles import DEFAULT_LOSS_BAND, loss_continuity
from chaos.model.check import Check
from chaos.record.golden import GoldenRun
from chaos.record.history import RunRecord

Traces = dict[tuple[int, int], list[dict[str, Any]]]


def _probes(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["info"] for r in recs if r.get("event") == "phase" and r.get("name") == "chaos.probe"]


def source(traces: Traces) -> str | None:
    """Which announcements carry the job's losses, for every curve of one run: ``step``
    (``chaos.probe.step(n, loss)``, the exact float) where the fault-free run made any, else
    ``loss`` (``--loss-regex`` lines, as printed); None: neither. A job that does both says
    each step's loss twice, and the two differ by the printed rounding: a halted attempt that
    announced its last step only by its printed line would otherwise be compared, rounded,
    against the exact golden value. Called by ``explore.reference`` (``Golden.loss_source``)."""
    kinds = {i.get("kind") for recs in traces.values() for i in _probes(recs) if i.get("loss") is not None}
    return "step" if "step" in kinds else "loss" if "loss" in kinds else None


def curve(recs: list[dict[str, Any]], kind: str | None = None) -> dict[int, float]:
    """Step -> loss of one rank's attempt, from ``kind``'s announcements (None: both); a step
    announced twice keeps its last loss."""
    kinds = ("step", "loss") if kind is None else (kind,)
    out: dict[int, float] = {}
    for info in _probes(recs):
        if info.get("kind") in kinds and info.get("loss") is not None:
            out[int(info["n"])] = float(info["loss"])
    return out


def curves(traces: Traces, attempt: int = 0, kind: str | None = None) -> dict[int, dict[int, float]]:
    """Rank -> step -> loss of one attempt (the fault-free runs have only attempt 0)."""
    return {rank: c for (rank, a), recs in sorted(traces.items()) if a == attempt and (c := curve(recs, kind))}


def band_for(explicit: float | None, tolerance: bool) -> float:
    """``--loss-band`` if given; else exact (0) when the fault-free runs agreed, else the default band."""
    if explicit is not None:
        return explicit
    return DEFAULT_LOSS_BAND if tolerance else 0.0


def _resume_step(recs: list[dict[str, Any]]) -> int | None:
    """Where an attempt started: ``probe.resumed(n)``, else its first loss step minus one."""
    infos = _probes(recs)
    resumed = [int(i["n"]) for i in infos if i.get("kind") == "resumed"]
    if resumed:
        return min(resumed)
    steps = [int(i["n"]) for i in infos if i.get("kind") in ("step", "loss")]
    return steps[0] - 1 if steps else None


def continuity(golden: dict[int, dict[int, float]], world_size: int, traces: Traces, band: float,
               kind: str | None = None) -> Check:
    """Judge every attempt's loss curve of a point against ``golden`` (rank -> step -> loss),
    each read from ``kind``'s announcements, as the golden curve was (:func:`source`)."""
    gold = GoldenRun("job", world_size, {r: {s: float(v).hex() for s, v in c.items()} for r, c in golden.items()},
                     {}, {})
    attempts = sorted({a for (_r, a) in traces})
    events: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for a in attempts:
        ranks = {rank: recs for (rank, at), recs in traces.items() if at == a}
        # Often only rank 0 logs its loss: the attempt resumed where the ranks that say so did.
        starts = [s for recs in ranks.values() if (s := _resume_step(recs)) is not None]
        for rank in range(world_size):
            evs = [{"ev": "resume", "step": min(starts)}] if starts and a != attempts[0] else []
            evs += [{"ev": "step", "step": s, "loss": v, "loss_hex": float(v).hex()}
                    for s, v in sorted(curve(ranks.get(rank, []), kind).items())]
            events.setdefault(a, {})[rank] = evs
    record = RunRecord(world_size, [{"attempt": a, "world_size": world_size} for a in attempts], events)
    return loss_continuity(gold, record, band)
