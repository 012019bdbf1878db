"""RunRecord: the history of one run that every oracle reads, and nothing else.

Built after the run from the per-rank JSONL logs (one per rank per attempt) and the
supervisor's account of each attempt (exit codes, faults fired). Oracles take a
RunRecord and never look at processes or files themselves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.cluster import ClusterResult, log_path


TIMELINE_EVENTS = frozenset({"start", "pg_ready", "trainer_ready", "resume", "save_call", "save_return", "ack",
                             "fault_point", "phase", "io_fault", "warning", "error", "final", "exit"})


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """Parse a rank log; a line torn by a kill (the last one) is dropped, not fatal."""
    events = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


@dataclass
class RunRecord:
    world_size: int
    attempts: list[dict[str, Any]]
    events: dict[int, dict[int, list[dict[str, Any]]]] = field(default_factory=dict)  # attempt -> rank -> events

    @classmethod
    def collect(cls, result: ClusterResult, log_dir: str, world_size: int) -> RunRecord:
        events = {
            a.attempt: {r: read_events(log_path(log_dir, r, a.attempt)) for r in range(world_size)}
            for a in result.attempts
        }
        return cls(world_size, result.to_dict()["attempts"], events)

    # -- views the oracles use ------------------------------------------------------
    @property
    def completed(self) -> bool:
        return bool(self.attempts) and self.attempts[-1]["outcome"] == "ok"

    def rank_events(self, rank: int, ev: str) -> list[dict[str, Any]]:
        return [e for a in sorted(self.events) for e in self.events[a].get(rank, []) if e["ev"] == ev]

    def final_fingerprint(self, rank: int) -> dict[str, str] | None:
        if not self.completed:
            return None
        last = self.attempts[-1]["attempt"]
        finals = [e for e in self.events.get(last, {}).get(rank, []) if e["ev"] == "final"]
        return finals[-1]["fingerprint"] if finals else None

    def losses(self, rank: int) -> list[dict[str, Any]]:
        """Every executed step of every attempt: ``{attempt, step, loss, loss_hex}``."""
        return [
            {"attempt": e["attempt"], "step": e["step"], "loss": e["loss"], "loss_hex": e["loss_hex"], "lr": e["lr"],
             "t": e["t"]}
            for e in self.rank_events(rank, "step")
        ]

    def loss_by_step(self, rank: int) -> dict[int, str]:
        return {e["step"]: e["loss_hex"] for e in self.losses(rank)}

    def errors(self) -> list[dict[str, Any]]:
        return [e for a in sorted(self.events) for r in sorted(self.events[a]) for e in self.events[a][r] if e["ev"] == "error"]

    def fired_faults(self) -> list[dict[str, Any]]:
        return [f for a in self.attempts for f in a.get("fired", [])]

    def resumes(self, rank: int) -> list[dict[str, Any]]:
        return self.rank_events(rank, "resume")

    def timeline(self) -> list[dict[str, Any]]:
        """Every event but per-step ones and fingerprints, time-ordered: what a timeline draws."""
        out = []
        for a in sorted(self.events):
            for r in sorted(self.events[a]):
                for e in self.events[a][r]:
                    if e["ev"] in TIMELINE_EVENTS:
                        out.append({k: v for k, v in e.items() if k not in ("fingerprint", "traceback")})
        return sorted(out, key=lambda e: e["t"])

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "attempts": self.attempts,
                "events": {str(a): {str(r): ev for r, ev in ranks.items()} for a, ranks in self.events.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        events = {int(a): {int(r): ev for r, ev in ranks.items()} for a, ranks in data["events"].items()}
        return cls(int(data["world_size"]), data["attempts"], events)
