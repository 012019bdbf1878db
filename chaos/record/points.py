"""Fault points from the trace: where a checkpointer really does I/O, and which faults fired there.

The generated campaign (``chaos.run.campaign``, ``chaos.plan.strategies.fault_schedules``) does not
guess where a fault could land. It runs the configuration once without faults, with
every rank's I/O traced (``faults.interposer``), and draws faults from what each rank
really did there:

- an **I/O point** is one traced operation: ``(rank, op, file role, phase, step, nth)`` —
  the ``nth`` operation of kind ``op`` after rank ``rank`` announced phase ``phase`` of
  the save at ``step``. That is exactly how an I/O rule with ``phase``, ``step``, ``op``
  and ``nth`` counts (the phase arms it, then it counts matching operations), so a fault
  drawn from a point fires in a run that repeats the traced one;
- a **phase point** is one ``(rank, phase, step)`` announcement, where a process fault
  with ``phase=`` lands.

Coverage is counted over distinct ``(rank, op, file role, phase)`` keys: how many of those
seen in the trace a campaign's fired faults have tried. The traced run is cached beside
the golden runs, keyed by the golden key plus the checkpointer and the harness sources
that shape its I/O.

``fired_io_faults`` is the other half, used by the runner as well: which of a
scenario's I/O faults fired, each matched by its own interposer rule (a schedule with
two I/O faults where one never fired tested less than it claims).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.scratch import make_root
from reports.jsonfile import write_json_atomic

if TYPE_CHECKING:
    from chaos.model.fault import Fault
    from chaos.plan.scenario import Scenario
    from chaos.record.history import RunRecord
    from chaos.run.runner import RunOptions, ScenarioResult

CHAOS_DIR = Path(__file__).resolve().parents[1]  # the chaos package: its sources key the cache
POINTS_FORMAT = 1
SHARD_SUFFIXES = (".safetensors", ".distcp", ".pt", ".pth", ".bin", ".npy", ".npz")


@dataclass(frozen=True, order=True)
class IOPoint:
    """One traced I/O operation, addressed as an I/O rule counts it."""

    rank: int
    op: str
    role: str
    phase: str
    step: int
    nth: int

    @property
    def key(self) -> tuple[int, str, str, str]:
        return (self.rank, self.op, self.role, self.phase)

    def spec(self, kind: str) -> str:
        return f"{kind}:rank={self.rank},step={self.step},phase={self.phase},op={self.op},nth={self.nth}"


@dataclass(frozen=True, order=True)
class PhasePoint:
    """One announcement of a save phase by one rank."""

    rank: int
    phase: str
    step: int


def key_text(key: tuple[int, str, str, str]) -> str:
    rank, op, role, phase = key
    return f"rank {rank} {op} {role} in {phase}"


def file_role(path: str | None, root: str, dirs: set[str] | frozenset[str] = frozenset()) -> str:
    """What a checkpoint path is, from its name relative to the checkpoint root.

    ``root`` (the root directory itself), ``metrics``, ``latest`` (the pointer or its temp
    file), ``tmp-dir`` / ``ckpt-dir`` (a checkpoint's directory before and after its
    commit rename), ``manifest``, ``shard``, else ``other``.
    """
    if not path:
        return "other"
    rel = os.path.relpath(path, root)
    if rel in (".", ""):
        return "root"
    name = os.path.basename(rel).lower()
    if "metrics" in name:
        return "metrics"
    if "latest" in name:
        return "latest"
    if path in dirs:
        return "tmp-dir" if "tmp" in name else "ckpt-dir"
    if name.startswith(("manifest", ".metadata")) or name.endswith(".json"):
        return "manifest"
    if name.endswith(SHARD_SUFFIXES) or "shard" in name:
        return "shard"
    return "other"


def _directories(records: Iterable[dict[str, Any]]) -> set[str]:
    dirs: set[str] = set()
    renames: list[tuple[str, str]] = []
    for rec in records:
        if rec.get("event") != "op":
            continue
        if rec.get("op") in ("mkdir", "rmdir") or rec.get("is_dir"):
            dirs.add(rec.get("path"))
        for key in ("path", "src", "dst"):
            if rec.get(key):
                dirs.add(os.path.dirname(rec[key]))
        if rec.get("op") == "rename" and rec.get("src") and rec.get("dst"):
            renames.append((rec["src"], rec["dst"]))
    for src, dst in renames:  # a renamed directory is a directory under its new name too
        if src in dirs:
            dirs.add(dst)
    dirs.discard(None)  # type: ignore[arg-type]
    return dirs


def points_of_trace(records: list[dict[str, Any]], rank: int, root: str) -> tuple[list[IOPoint], list[PhasePoint]]:
    """The I/O and phase points of one rank's trace (records as ``faults.interposer.read_trace`` gives them).

    Counting follows ``Interposer._match``: after a phase announcement with a step, every
    traced operation of a kind counts, failed ones included (a rule counts an operation
    before it is performed); operations before any such announcement are not
    addressable by phase and step, so they are no points.
    """
    root = os.path.realpath(root)
    dirs = _directories(records)
    io: list[IOPoint] = []
    phases: list[PhasePoint] = []
    phase: str | None = None
    step: int | None = None
    counts: dict[str, int] = {}
    for rec in records:
        event = rec.get("event")
        if event == "phase":
            info = rec.get("info") or {}
            phase, step, counts = rec.get("name"), info.get("step"), {}
            if phase is not None and isinstance(step, int):
                phases.append(PhasePoint(rank, phase, step))
            else:
                phase = None  # a rule's phase= with step= never arms on an announcement without a step
        elif event == "op" and phase is not None and step is not None:
            op = rec.get("op")
            counts[op] = counts.get(op, 0) + 1
            if rec.get("error") is None:
                io.append(IOPoint(rank, op, file_role(rec.get("path"), root, dirs), phase, step, counts[op]))
    return io, phases


@dataclass
class TracePoints:
    """Every fault point of one traced fault-free run, and how it was obtained."""

    io: list[IOPoint] = field(default_factory=list)
    phases: list[PhasePoint] = field(default_factory=list)
    key: str = ""
    cached: bool = False
    error: str | None = None  # why there are no points (the traced run failed)

    @property
    def seen(self) -> set[tuple[int, str, str, str]]:
        return {p.key for p in self.io}

    def point_of(self, fault: Fault) -> IOPoint | None:
        """The traced point an I/O fault addresses (None: a fault not drawn from this trace)."""
        if fault.family != "io":
            return None
        want = (fault.rank, fault.param("phase"), fault.step, fault.param("op"), fault.param("nth", 1))
        for p in self.io:
            if (p.rank, p.phase, p.step, p.op, p.nth) == want:
                return p
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"format": POINTS_FORMAT, "key": self.key, "error": self.error,
                "io": [asdict(p) for p in self.io], "phases": [asdict(p) for p in self.phases]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], cached: bool = False) -> TracePoints:
        if data.get("format") != POINTS_FORMAT:
            raise ValueError(f"fault-point cache format {data.get('format')!r}, expected {POINTS_FORMAT}")
        return cls([IOPoint(**p) for p in data["io"]], [PhasePoint(**p) for p in data["phases"]],
                   data.get("key", ""), cached, data.get("error"))


def _source_digest(checkpointer: str) -> str:
    """The sources that decide which I/O a traced run does: the harness package, the
    interposer, and a checkpointer given by file or module outside it."""
    import importlib.util

    h = hashlib.sha256()
    files = sorted(CHAOS_DIR.rglob("*.py")) + [CHAOS_DIR.parent / "faults" / "interposer.py"]
    where = checkpointer.rpartition(":")[0]
    extra: Path | None = None
    if where.endswith(".py") or "/" in where:
        extra = Path(where)
    elif where and not where.startswith("chaos."):
        try:
            found = importlib.util.find_spec(where)
        except (ImportError, ValueError):
            found = None
        extra = Path(found.origin) if found is not None and found.origin else None
    for src in files + ([extra] if extra is not None else []):
        try:
            h.update(str(src.name).encode() + b"\0" + src.read_bytes())
        except OSError:
            continue
    return h.hexdigest()


def points_key(scenario: Scenario) -> str:
    from chaos.record.golden import golden_key

    h = hashlib.sha256()
    h.update(json.dumps({"golden": golden_key(scenario.workload, scenario.world_size, "gloo"),
                         "checkpointer": scenario.checkpointer, "options": scenario.ckpt_options,
                         "backend": scenario.backend}, sort_keys=True, default=str).encode())
    h.update(_source_digest(scenario.checkpointer).encode())
    return h.hexdigest()[:24]


def trace_reference_run(scenario: Scenario, options: RunOptions) -> TracePoints:
    """Run ``scenario``'s configuration once without faults, every rank traced; return its points.

    The run lives in its own scratch root (under ``options.scratch_base``), removed
    afterwards. A run that does not complete gives no points and says why.
    """
    from chaos.launch import cluster
    from chaos.record.history import RunRecord
    from chaos.target.protocol import validate_spec
    from faults.interposer import read_trace

    if options.scratch_base:
        Path(options.scratch_base).mkdir(parents=True, exist_ok=True)
    scratch = Path(make_root("chaos-trace-", options.scratch_base))
    try:
        plan = cluster.LaunchPlan(
            world_size=scenario.world_size, workload=scenario.workload.to_dict(), log_dir=str(scratch / "logs"),
            checkpointer=validate_spec(scenario.checkpointer), ckpt_options=dict(scenario.ckpt_options),
            ckpt_root=str(scratch / "ckpt"), max_restarts=0, hang_timeout_s=options.hang_timeout_s,
            attempt_timeout_s=options.attempt_timeout_s, trace_io=True, scratch=str(scratch))
        cluster.warm_up()
        result = cluster.run(plan)
        record = RunRecord.collect(result, plan.log_dir, scenario.world_size)
        points = TracePoints()
        if not record.completed:
            errors = "; ".join(f"rank {e['rank']}: {e['type']}: {e['message'][:200]}" for e in record.errors())
            points.error = (f"the traced fault-free run did not finish ({result.attempts[-1].outcome}): "
                            f"{errors or 'no error logged'}")
            return points
        for rank in range(scenario.world_size):
            io, phases = points_of_trace(read_trace(cluster.trace_path(plan.log_dir, rank, 0)), rank,
                                         str(plan.ckpt_root))
            points.io += io
            points.phases += phases
        return points
    finally:
        cluster.kill_all()
        shutil.rmtree(scratch, ignore_errors=True)


def reference_points(scenario: Scenario, options: RunOptions) -> TracePoints:
    """The fault points of ``scenario``'s configuration: from the cache, else from a traced run.

    Cached in the golden-run cache directory (``options.cache_dir``), unless the
    options say not to use it; a damaged entry is traced again, not trusted.
    """
    from chaos.record.golden import default_cache_dir

    key = points_key(scenario)
    cache = (options.cache_dir or default_cache_dir()) / f"points-{key}.json"
    if options.use_golden_cache and cache.is_file():
        try:
            return TracePoints.from_dict(json.loads(cache.read_text()), cached=True)
        except (ValueError, KeyError, TypeError):
            pass
    points = trace_reference_run(scenario, options)
    points.key = key
    if options.use_golden_cache and points.error is None:
        write_json_atomic(cache, points.to_dict())
    return points


# -- which faults fired -----------------------------------------------------------------

def fired_io_faults(faults: list[Fault], record: RunRecord) -> set[int]:
    """Indices of the I/O faults whose own interposer rule fired.

    A rank's rules are the I/O faults of its attempt aimed at it, in schedule order (and,
    where the disk-full fallback runs in the interposer, the attempt's disk faults among
    them); each fired record names its rule's index in that list, its rank and its
    attempt. The rank's ``io_trace`` log event says how many rules it was given, which
    tells the two cases apart.
    """
    fired = {(rec.get("attempt"), rec.get("rank"), rec.get("rule")) for rec in record.io.get("fired", [])}
    out: set[int] = set()
    for attempt, rank in {(f.attempt, f.rank) for f in faults if f.family == "io"}:
        owners = [i for i, f in enumerate(faults) if f.attempt == attempt and f.family == "io" and f.rank == rank]
        events = record.events.get(attempt, {}).get(rank, [])
        given = next((e.get("rules") for e in events if e.get("ev") == "io_trace"), None)
        if given is not None and len(given) != len(owners):
            owners = [i for i, f in enumerate(faults) if f.attempt == attempt
                      and ((f.family == "io" and f.rank == rank) or f.family == "disk")]
        out |= {i for j, i in enumerate(owners) if faults[i].family == "io" and (attempt, rank, j) in fired}
    return out


def fired_faults(faults: list[Fault], record: RunRecord) -> set[int]:
    """Indices of every fault that fired: supervisor-side ones by their record, I/O ones by their rule."""
    done = {f.get("index") for a in record.attempts for f in a.get("fired", [])}
    return {i for i in range(len(faults)) if i in done} | fired_io_faults(faults, record)


# -- coverage ----------------------------------------------------------------------------

@dataclass
class Coverage:
    """Distinct (rank, op, file role, phase) points a campaign's fired I/O faults tried, of those seen."""

    points: TracePoints
    tried: set[tuple[int, str, str, str]] = field(default_factory=set)
    phases_tried: set[tuple[int, str]] = field(default_factory=set)
    io_drawn: int = 0
    io_fired: int = 0
    never_fired: list[str] = field(default_factory=list)  # drawn faults whose point never came

    def add(self, result: ScenarioResult) -> None:
        """Count one generated scenario's faults (those of a run with no record tried nothing)."""
        faults = result.scenario.faults
        fired = fired_faults(faults, result.record) if result.record is not None else set()
        for i, f in enumerate(faults):
            if f.family == "io":
                self.io_drawn += 1
                if i in fired:
                    self.io_fired += 1
                    point = self.points.point_of(f)
                    if point is not None:
                        self.tried.add(point.key)
                elif result.record is not None:
                    self.never_fired.append(f.spec())
            elif f.family == "process" and f.param("phase") and i in fired:
                self.phases_tried.add((f.rank, f.param("phase")))

    def to_dict(self) -> dict[str, Any]:
        seen = self.points.seen
        phase_seen = {(p.rank, p.phase) for p in self.points.phases}
        return {
            "points": "distinct (rank, operation, file role, phase) of the traced fault-free run",
            "seen": len(seen), "tried": len(self.tried & seen),
            "untried": sorted(key_text(k) for k in seen - self.tried),
            "io_faults_drawn": self.io_drawn, "io_faults_fired": self.io_fired,
            "io_faults_never_fired": list(self.never_fired),
            "phase_points_seen": len(phase_seen), "phase_points_tried": len(self.phases_tried & phase_seen),
            "trace_cached": self.points.cached, "trace_error": self.points.error,
        }

    def summary(self) -> str:
        if self.points.error:
            return f"fault-point coverage: none ({self.points.error})"
        seen = self.points.seen
        text = (f"fault-point coverage: {len(self.tried & seen)} of {len(seen)} (rank, operation, file role, phase) "
                f"points tried; {self.io_fired} of {self.io_drawn} drawn I/O fault(s) fired")
        phase_seen = {(p.rank, p.phase) for p in self.points.phases}
        if phase_seen:
            text += f"; {len(self.phases_tried & phase_seen)} of {len(phase_seen)} (rank, phase) kill points tried"
        return text
