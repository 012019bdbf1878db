"""One point's history: what its run left (attempts and every rank's trace), read back as data.

The plain record every later stage reads: ``explore`` (and ``nodes.run_chain`` for a
node point) builds a :class:`PointRecord` after a point's last attempt, from
:func:`read_traces`; ``judge`` decides the point's verdict from it alone; ``nodes``
describes what a node fault did from it. Nothing here runs or judges anything.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

from chaos.launch.job import AttemptOutcome
from chaos.model.jobspec import Point


def read_traces(scratch: str, out: str) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Each (rank, attempt)'s trace records, paths made relative to {out} (``rel``)."""
    found: dict[tuple[int, int], list[dict[str, Any]]] = {}
    root = os.path.realpath(out)
    for path in sorted(glob.glob(os.path.join(scratch, "trace", "trace-r*-a*-p*.jsonl"))):
        name = os.path.basename(path)
        rank, attempt = (int(x[1:]) for x in name.split("-")[1:3])
        recs = found.setdefault((rank, attempt), [])
        with open(path, "rb") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    break  # torn by the kill
                p = rec.get("path")
                if isinstance(p, str) and (p == root or p.startswith(root + os.sep)):
                    rec["rel"] = os.path.relpath(p, root)
                recs.append(rec)
    for recs in found.values():
        recs.sort(key=lambda r: r.get("ts", 0))
    return found



@dataclass
class PointRecord:
    """Everything one point's run left: attempts, traces by (rank, attempt), checkpoints seen after the kill."""

    point: Point
    out: str
    attempts: list[AttemptOutcome]
    traces: dict[tuple[int, int], list[dict[str, Any]]]
    after_kill: dict[str, dict[str, int]] | None = None  # --checkpoint-glob matches between kill and restart
    applied: Any = None  # atrest.Applied: what the harness did to {out} (corruption, power loss, full disk)
    # --checkpoint-glob matches when attempt 0 ended, before the harness edited {out} (a halted point)
    before_fault: dict[str, dict[str, int]] | None = None
    # files under {out} that attempt 0 changed and no traced event explains (atrest.untraced_changes)
    untraced: list[dict[str, Any]] = field(default_factory=list)
    second: Any = None  # atrest.Applied of a second fault the harness made in the restart (a power cut)
    # a rank lost for good (lost=true): the fault-free resize's judge.Golden the restart is compared with,
    # or why there is none (chaos.nemesis.shrink; built by chaos.run.explore)
    resized: Any = None

    def at_cut(self) -> dict[str, dict[str, int]] | None:
        """The --checkpoint-glob matches as the job left them, before any edit by the harness."""
        return self.before_fault if self.before_fault is not None else self.after_kill

    def fired(self) -> list[dict[str, Any]]:
        return [{**r, "attempt": a, "rank": rk} for (rk, a), recs in sorted(self.traces.items())
                for r in recs if r.get("event") == "fired"]

    def probes(self, attempt_filter: Any, kind: str, rank: int | None = None) -> list[dict[str, Any]]:
        """``chaos.probe`` announcements of one kind (step, saved, resumed, regex), in trace order."""
        out = []
        for (rk, a), recs in sorted(self.traces.items()):
            if not attempt_filter(a) or (rank is not None and rk != rank):
                continue
            out += [r["info"] for r in recs if r.get("event") == "phase" and r.get("name") == "chaos.probe"
                    and r.get("info", {}).get("kind") == kind]
        return out
