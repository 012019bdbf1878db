"""RunRecord: the history of one run that every oracle reads, and nothing else.

Built after the run from the per-rank JSONL logs (one per rank per attempt) and the
supervisor's account of each attempt (exit codes, faults fired). Oracles take a
RunRecord and never look at processes or files themselves.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.launch.cluster import ClusterResult, log_path, trace_path
from chaos.record.savescope import SaveScope

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


def _io_summary(result: ClusterResult, log_dir: str, world_size: int, ckpt_root: str | None) -> dict[str, Any]:
    """What the I/O interposer saw: op counts, the rules that fired (exact points), the
    real ENOSPC errors (which save a full disk hit), and the checkpoint files no traced
    operation wrote (a C-level writer the tracer cannot see)."""
    ops: dict[str, int] = {}
    fired: list[dict[str, Any]] = []
    enospc: list[dict[str, Any]] = []  # real ENOSPC errors of traced ops (a full disk), with the save they hit
    written: set[str] = set()
    made: dict[tuple[Any, str], float] = {}  # (attempt, directory) -> when some rank first made it
    traced = False
    for a in result.attempts:
        for r in range(world_size):
            path = Path(trace_path(log_dir, r, a.attempt))
            if not path.exists():
                continue
            traced = True
            scope = SaveScope()
            for line in path.read_text(errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                scope.see(rec)
                if rec.get("event") == "fired":
                    fired.append({**rec, "attempt": a.attempt, **scope.injury(rec)})
                elif rec.get("event") == "op":
                    if rec.get("op") == "mkdir" and rec.get("error") is None and rec.get("path"):
                        key = (a.attempt, rec["path"])
                        made[key] = min(made.get(key, float("inf")), float(rec.get("ts", 0.0)))
                    if rec.get("error") == errno.ENOSPC:
                        enospc.append({"attempt": a.attempt, "rank": r, "step": scope.step, "op": rec["op"],
                                       "path": rec.get("path")})
                    ops[rec["op"]] = ops.get(rec["op"], 0) + 1
                    for key in ("path", "dst"):
                        if rec.get(key):
                            written.add(rec[key])
    if not traced:
        return {}
    for f in fired:
        # A failed mkdir of a directory another rank had already made (the shared temp dir of
        # a save): makedirs(exist_ok=True) rightly carries on, and nothing of the save is lost.
        if f.get("op") == "mkdir" and f.get("save_changes") and \
                made.get((f["attempt"], f.get("path")), float("inf")) < float(f.get("ts", 0.0)):
            f["save_changes"] = []
            f["existed"] = True
    untraced = []
    if ckpt_root and Path(ckpt_root).is_dir():
        root = Path(ckpt_root).resolve()
        untraced = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and str(p) not in written)
    return {"ops": ops, "fired": fired, "enospc": enospc, "untraced_files": untraced, "traced": not untraced}


@dataclass
class RunRecord:
    world_size: int
    attempts: list[dict[str, Any]]
    events: dict[int, dict[int, list[dict[str, Any]]]] = field(default_factory=dict)  # attempt -> rank -> events
    io: dict[str, Any] = field(default_factory=dict)  # I/O trace summary: ops, fired rules, untraced files
    verify: dict[str, Any] = field(default_factory=dict)  # the post-run load: outcome and each rank's events
    hygiene: dict[str, Any] = field(default_factory=dict)  # what outlived the scenario (filled by the runner)

    @classmethod
    def collect(cls, result: ClusterResult, log_dir: str, world_size: int, ckpt_root: str | None = None) -> RunRecord:
        events = {
            a.attempt: {r: read_events(log_path(log_dir, r, a.attempt)) for r in range(world_size)}
            for a in result.attempts
        }
        return cls(world_size, result.to_dict()["attempts"], events, _io_summary(result, log_dir, world_size, ckpt_root))

    # -- views the oracles use ------------------------------------------------------
    @property
    def completed(self) -> bool:
        return bool(self.attempts) and self.attempts[-1]["outcome"] == "ok"

    def attempt_world_size(self, attempt: int | str) -> int:
        """Ranks launched in ``attempt``: fewer than ``world_size`` after a rank was lost for good."""
        for a in self.attempts:
            if a["attempt"] == attempt:
                return int(a.get("world_size") or self.world_size)
        return self.world_size

    @property
    def elastic(self) -> bool:
        """True when some attempt ran at another world size than the first (a rank was lost for good)."""
        return any(int(a.get("world_size") or self.world_size) != self.world_size for a in self.attempts)

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

    def resumed_step(self, attempt: int) -> int | None:
        """The step ``attempt`` resumed from (0: from scratch), once every one of its ranks logged
        its resume; None when some rank never got that far (it died in the load)."""
        ws = self.attempt_world_size(attempt)
        steps = [e["step"] for r in range(ws) for e in self.events.get(attempt, {}).get(r, []) if e["ev"] == "resume"]
        return min(steps) if len(steps) == ws else None

    def errors(self) -> list[dict[str, Any]]:
        return [e for a in sorted(self.events) for r in sorted(self.events[a]) for e in self.events[a][r] if e["ev"] == "error"]

    def fired_faults(self) -> list[dict[str, Any]]:
        """Faults the supervisor carried out, then I/O rules that fired inside ranks."""
        return [f for a in self.attempts for f in a.get("fired", [])] + list(self.io.get("fired", []))

    def resumes(self, rank: int) -> list[dict[str, Any]]:
        return self.rank_events(rank, "resume")

    def acked_steps(self, attempt: int) -> list[int]:
        """Saves acknowledged (wait() returned) on any rank during ``attempt``, in order."""
        return sorted({s for r in range(self.world_size) for e in self.events.get(attempt, {}).get(r, [])
                       if e["ev"] == "ack" for s in e["steps"]})

    def saved_fingerprint(self, rank: int, step: int, before_attempt: int | None = None) -> dict[str, str] | None:
        """The state handed to save() at ``step`` by ``rank`` (newest such call, optionally before an attempt)."""
        found = None
        for a in sorted(self.events):
            if before_attempt is not None and a >= before_attempt:
                break
            for e in self.events[a].get(rank, []):
                if e["ev"] == "save_call" and e["step"] == step:
                    found = e["fingerprint"]
        return found

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
        return {"world_size": self.world_size, "attempts": self.attempts, "io": self.io, "verify": self.verify,
                "hygiene": self.hygiene,
                "events": {str(a): {str(r): ev for r, ev in ranks.items()} for a, ranks in self.events.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        events = {int(a): {int(r): ev for r, ev in ranks.items()} for a, ranks in data["events"].items()}
        return cls(int(data["world_size"]), data["attempts"], events, data.get("io", {}), data.get("verify", {}),
                   data.get("hygiene", {}))
