"""Explore a job: two fault-free runs, the points their traces show, then each point run and judged.

Called by ``cli_job.py``. All of it happens inside one scratch root (``--scratch`` or
the system temp directory), removed at the end unless ``--keep``: per run a folder with
``out/`` (the job's {out}), ``trace/`` (each traced process's trace and probe file),
``logs/`` (each copy's output) and ``tmp/`` (the job's TMPDIR).

1. Fault-free runs, twice. If their result files differ the job is nondeterministic:
   *tolerance mode* (results compared within ``--rtol``), and the caller says so.
2. Points, from the first fault-free run's traces: every traced file event of every
   rank x each of ``--modes`` (before, after, torn: torn only for writes), then a kill
   at every step the job announced (``chaos.probe.step`` or ``--step-regex``).
3. A seeded sample of them (``--max-points``), run ``--jobs`` at a time while
   ``--budget`` seconds allow; coverage = points tried / points found.
4. Each point: attempt 0 with the point armed; then (unless torchrun restarts by itself)
   up to ``--max-restarts`` resumes with ``--resume-cmd``; then ``judge.judge``.
"""

from __future__ import annotations

import concurrent.futures as cf
import glob
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.errors import ChaosError
from chaos.job import launch
from chaos.job.compare import first_difference
from chaos.job.judge import Golden, PointRecord, PointVerdict, judge
from chaos.job.spec import JobSpec, Point


class JobError(ChaosError):
    """The job cannot be explored (its fault-free run failed, nothing was traced): exit 2."""


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


def checkpoint_state(out: str, pattern: str | None) -> dict[str, dict[str, int]] | None:
    """``--checkpoint-glob`` matches under {out}: name -> {file: size} (a directory: every file in it)."""
    if pattern is None:
        return None
    rel = pattern.replace("{out}/", "").replace("{out}", "")
    state: dict[str, dict[str, int]] = {}
    for match in sorted(glob.glob(os.path.join(out, rel))):
        name = os.path.relpath(match, out)
        if os.path.isdir(match):
            state[name] = {os.path.relpath(os.path.join(d, f), match): os.path.getsize(os.path.join(d, f))
                           for d, _s, files in os.walk(match) for f in files}
        elif os.path.isfile(match):
            state[name] = {"": os.path.getsize(match)}
    return state


def result_files(job: JobSpec, out: str) -> list[str]:
    rels: set[str] = set()
    for g in job.relative_globs(job.result_globs):
        rels |= {os.path.relpath(p, out) for p in glob.glob(os.path.join(out, g), recursive=True)
                 if os.path.isfile(p)}
    return sorted(rels)


@dataclass
class Run:
    """One attempt chain in its own folder."""

    scratch: str
    out: str
    mark: str
    attempts: list[launch.AttemptOutcome] = field(default_factory=list)


def _new_run(root: str, name: str) -> Run:
    scratch = os.path.join(root, name)
    out = os.path.join(scratch, "out")
    os.makedirs(out)
    return Run(scratch, out, scratch)


def run_chain(job: JobSpec, run: Run, point: Point | None) -> PointRecord:
    """Attempt 0 (the point armed), then the harness's restarts unless torchrun's agent does them."""
    first = launch.run_attempt(job, run.out, run.scratch, 0, point, run.mark)
    run.attempts.append(first)
    after_kill = checkpoint_state(run.out, job.checkpoint_glob) if point is not None else None
    if point is not None and not job.torchrun:
        for attempt in range(1, job.max_restarts + 1):
            if run.attempts[-1].ok:
                break
            run.attempts.append(launch.run_attempt(job, run.out, run.scratch, attempt, None, run.mark))
    return PointRecord(point or Point(0, "none"), run.out, run.attempts, read_traces(run.scratch, run.out),
                       after_kill)


@dataclass
class Reference:
    """The fault-free runs and what they show: the judge's golden facts, the points found."""

    golden: Golden
    points: list[Point]
    notes: list[str]
    seconds: float
    untraced: list[str]
    events: dict[int, int]  # rank -> traced file events in the first fault-free run

    def to_dict(self) -> dict[str, Any]:
        return {"tolerance_mode": self.golden.tolerance, "result_files": self.golden.results,
                "checkpoints": sorted(self.golden.checkpoints), "acknowledged_saves": self.golden.acks,
                "notes": self.notes, "seconds": round(self.seconds, 3), "untraced_files": self.untraced,
                "file_events": {str(r): n for r, n in sorted(self.events.items())}}


def enumerate_points(job: JobSpec, traces: dict[tuple[int, int], list[dict[str, Any]]]) -> list[Point]:
    """Every file event of every rank x each mode (torn: writes only), then a kill at every announced step."""
    points: list[Point] = []
    steps: list[Point] = []
    for (rank, attempt), recs in sorted(traces.items()):
        if attempt != 0:
            continue
        seen: dict[tuple[str, str], int] = {}
        for r in recs:
            if r.get("event") == "op" and r.get("ord") is not None:
                key = (r["op"], r.get("rel") or r.get("path") or "")
                seen[key] = seen.get(key, 0) + 1
                for mode in job.modes:
                    if mode == "torn" and (r["op"] != "write" or (r.get("length") or 0) < 2):
                        continue
                    points.append(Point(rank, mode, op=r["ord"], kind=r["op"], path=key[1], seq=r.get("seq"),
                                        nth=seen[key]))
        announced = sorted({r["info"]["n"] for r in recs if r.get("event") == "phase"
                            and r.get("name") == "chaos.probe" and r.get("info", {}).get("kind") in ("step", "regex")})
        steps += [Point(rank, "kill", step=n) for n in announced]
    return points + steps


def reference(job: JobSpec, root: str, jobs: int) -> tuple[Reference, Run]:
    """Two fault-free runs (concurrently when ``jobs`` > 1); JobError if either fails or nothing is traced."""
    started = time.monotonic()
    runs = [_new_run(root, "golden-0"), _new_run(root, "golden-1")]
    with cf.ThreadPoolExecutor(max_workers=min(2, max(1, jobs))) as pool:
        recs = list(pool.map(lambda r: run_chain(job, r, None), runs))
    for run in runs:
        a = run.attempts[0]
        if not a.ok:
            tail = a.tail(600).strip().splitlines()
            raise JobError(f"the fault-free run {a.describe}: {tail[-1] if tail else '(no output)'} "
                           f"(command: {' '.join(a.argv)})")
    traces = recs[0].traces
    notes: list[str] = []
    if not any(a == 0 for (_r, a) in traces):
        raise JobError("the fault-free run left no trace: the boot path did not run in the job's Python "
                       "(is COMMAND a Python program, or a launcher that drops PYTHONPATH?)")
    results = result_files(job, runs[0].out)
    tolerance = False
    for rel in results:
        other = Path(runs[1].out) / rel
        diff = "missing" if not other.exists() else first_difference(Path(runs[0].out) / rel, other, None)
        if diff:
            tolerance = True
            notes.append(f"the two fault-free runs differ ({rel}: {diff}): tolerance mode, result files "
                         f"compared within rtol {job.rtol:g}, never bit for bit")
            break
    events = {r: sum(1 for x in recs_ if x.get("event") == "op") for (r, a), recs_ in traces.items() if a == 0}
    events1 = {r: sum(1 for x in recs_ if x.get("event") == "op") for (r, a), recs_ in recs[1].traces.items()
               if a == 0}
    if events != events1:
        notes.append(f"the two fault-free runs traced different numbers of file events ({events} and {events1}): "
                     "points are numbered by event and one that lands on another event is reported as drifted")
    written = {x.get("rel") for recs_ in traces.values() for x in recs_ if x.get("event") == "op"}
    written |= {os.path.relpath(x["dst"], os.path.realpath(runs[0].out)) for recs_ in traces.values()
                for x in recs_ if x.get("event") == "op" and x.get("dst")}
    untraced = sorted(os.path.relpath(os.path.join(d, f), runs[0].out) for d, _s, files in os.walk(runs[0].out)
                      for f in files if os.path.relpath(os.path.join(d, f), runs[0].out) not in written)
    if untraced:
        notes.append(f"{len(untraced)} file(s) under {{out}} were written by no traced event (a C-level writer?): "
                     f"{', '.join(untraced[:5])}")
    acks = any(x.get("name") == "chaos.probe" and x.get("info", {}).get("kind") == "saved"
               for recs_ in traces.values() for x in recs_)
    golden = Golden(out=runs[0].out, results=results, tolerance=tolerance,
                    checkpoints=checkpoint_state(runs[0].out, job.checkpoint_glob) or {}, acks=acks)
    points = enumerate_points(job, traces)
    return Reference(golden, points, notes, time.monotonic() - started, untraced, events), runs[0]


@dataclass
class PointResult:
    """One point run and judged; ``to_dict`` is a ``scenarios`` entry of the results JSON."""

    job: JobSpec
    point: Point
    verdict: PointVerdict
    record: PointRecord
    seed: int
    seconds: float

    @property
    def replay(self) -> str:
        return self.job.replay_command(self.point)

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        fired = self.record.fired()
        drift = None
        if fired and self.point.kind and fired[0].get("op") not in (self.point.kind, "step"):
            drift = f"the fault-free run's event {self.point.op} was {self.point.kind}, this run's {fired[0].get('op')}"
        return {
            "id": self.point.id, "seed": self.seed, "checkpointer": "job", "backend": "file",
            "world_size": self.job.world_size, "faults": [self.point.to_fault()], "fired": fired,
            "verdict": v.verdict, "outcome": v.outcome, "summary": v.summary,
            "oracles": {n: o.to_dict() for n, o in v.oracles.items()}, "replay": self.replay,
            "error": v.summary if v.verdict == "error" else None, "seconds": round(self.seconds, 3),
            "attempts": [a.to_dict() for a in self.record.attempts], "drift": drift,
            "scenario": {"kind": "job", "job": self.job.to_dict(), "point": self.point.id},
        }


def sample(points: list[Point], max_points: int | None, seed: int) -> list[Point]:
    """A seeded sample of at most ``max_points``, in a seeded order (so a budget cut is spread out)."""
    rng = random.Random(seed)
    chosen = list(points)
    if max_points is not None and len(chosen) > max_points:
        chosen = [points[i] for i in sorted(rng.sample(range(len(points)), max_points))]
    rng.shuffle(chosen)
    return chosen


@dataclass
class Exploration:
    reference: Reference
    results: list[PointResult]
    found: int
    chosen: int
    budget_s: float | None
    seconds: float

    @property
    def coverage(self) -> float:
        return len(self.results) / self.found if self.found else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"points_found": self.found, "points_chosen": self.chosen, "points_tried": len(self.results),
                "coverage": round(self.coverage, 4), "budget_s": self.budget_s, "seconds": round(self.seconds, 3),
                "reference": self.reference.to_dict()}


def explore(job: JobSpec, *, seed: int = 0, max_points: int | None = None, budget_s: float | None = None,
            jobs: int = 1, only: Point | None = None, scratch_base: str | None = None, keep: bool = False,
            on_reference: Callable[[Reference], None] | None = None,
            on_result: Callable[[PointResult], None] | None = None) -> Exploration:
    """The whole exploration in one scratch root (removed afterwards unless ``keep``)."""
    root = tempfile.mkdtemp(prefix="chaos-job-", dir=scratch_base)
    started = time.monotonic()
    try:
        ref, _golden_run = reference(job, root, jobs)
        if on_reference:
            on_reference(ref)
        if only is not None:
            known = {p.id: p for p in ref.points}
            chosen = [known.get(only.id, only)]
        else:
            if not ref.points:
                raise JobError("the fault-free run showed no point to break: no file event under {out} was "
                               "traced and no step was announced")
            chosen = sample(ref.points, max_points, seed)
        results: list[PointResult] = []
        lock = threading.Lock()
        durations: list[float] = []

        def estimate() -> float:
            return sum(durations) / len(durations) if durations else ref.seconds

        def one(i: int, point: Point) -> PointResult | None:
            if budget_s is not None and time.monotonic() - started + estimate() > budget_s:
                return None
            t0 = time.monotonic()
            rec = run_chain(job, _new_run(root, f"point-{i:05d}"), point)
            res = PointResult(job, point, judge(job, ref.golden, rec), rec, seed, time.monotonic() - t0)
            with lock:
                durations.append(res.seconds)
                results.append(res)
                if on_result:
                    on_result(res)
            if not keep:
                shutil.rmtree(os.path.join(root, f"point-{i:05d}"), ignore_errors=True)
            return res

        with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(one, i, p) for i, p in enumerate(chosen)]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                for f in futures:
                    f.cancel()
                launch.kill_all()
                raise
        order = {p.id: i for i, p in enumerate(ref.points)}
        results.sort(key=lambda r: order.get(r.point.id, len(order)))
        return Exploration(ref, results, len(ref.points), len(chosen), budget_s, time.monotonic() - started)
    finally:
        launch.kill_all()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
