"""Golden (uninterrupted, checkpoint-free) runs, cached by everything that decides their numbers.

The key covers the workload configuration, world size, process-group backend, torch
version and the workload's own source code, so a change to any of them runs a new
golden instead of comparing against a stale one. A ``device=cuda`` workload adds the
device, its process group (``cpu:gloo,cuda:nccl``), the CUDA version and the GPUs' names
(other GPUs run other kernels); ``corpus=faker`` adds Faker's version (its generators
decide the text). Neither is added for the defaults, so every CPU key stays what it was.

A job that lost a rank for good trains on at the smaller world size, on other batches:
its losses after the resize have no golden run to equal. ``get_resized_references``
gives it one: a fault-free run that reaches the same committed checkpoint at the old
world size and resumes from it at the new one (``ResizedReference``), cached like a
golden run. ``chaos.run.runner`` builds them after the faulted run; ``chaos.judge.oracles``
compares with them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from chaos.errors import HarnessError
from chaos.launch import cluster
from chaos.model import statehash
from chaos.model.grammar import parse_fault
from chaos.record.history import RunRecord
from chaos.scratch import cache_root
from chaos.target.workload import device
from chaos.target.workload.config import WorkloadConfig
from reports.jsonfile import write_json_atomic

WORKLOAD_DIR = Path(__file__).resolve().parents[1] / "target" / "workload"


@dataclass
class GoldenRun:
    key: str
    world_size: int
    losses: dict[int, dict[int, str]]  # rank -> step -> loss (float.hex)
    curves: dict[int, list[float]]  # rank -> loss per step, for plots
    finals: dict[int, dict[str, str]]  # rank -> final fingerprint
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "world_size": self.world_size,
                "losses": {str(r): {str(s): v for s, v in d.items()} for r, d in self.losses.items()},
                "curves": {str(r): c for r, c in self.curves.items()},
                "finals": {str(r): f for r, f in self.finals.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], cached: bool = False) -> GoldenRun:
        return cls(data["key"], int(data["world_size"]),
                   {int(r): {int(s): v for s, v in d.items()} for r, d in data["losses"].items()},
                   {int(r): c for r, c in data["curves"].items()},
                   {int(r): f for r, f in data["finals"].items()}, cached)


def default_cache_dir() -> Path:
    return Path(cache_root()) / "golden"


def golden_sources() -> list[Path]:
    """The code a golden run's result depends on: the workload, and the fingerprints it logs."""
    return sorted(WORKLOAD_DIR.glob("*.py")) + [Path(statehash.__file__)]


def _faker_version() -> str | None:
    try:
        return metadata.version("faker")
    except metadata.PackageNotFoundError:
        return None


def golden_key(workload: WorkloadConfig, world_size: int, backend: str) -> str:
    facts: dict[str, Any] = {"workload": workload.to_dict(), "world_size": world_size, "backend": backend,
                             "torch": metadata.version("torch")}
    facts.update(device.golden_facts(workload.device, world_size))
    if workload.corpus == "faker":
        facts["faker"] = _faker_version()
    h = hashlib.sha256()
    h.update(json.dumps(facts, sort_keys=True).encode())
    for src in golden_sources():
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:24]


def _from_record(key: str, record: RunRecord) -> GoldenRun:
    losses, curves, finals = {}, {}, {}
    for rank in range(record.world_size):
        steps = record.losses(rank)
        losses[rank] = {e["step"]: e["loss_hex"] for e in steps}
        curves[rank] = [e["loss"] for e in steps]
        final = record.final_fingerprint(rank)
        if final is None:
            raise HarnessError(f"golden run produced no final state on rank {rank}")
        finals[rank] = final
    return GoldenRun(key, record.world_size, losses, curves, finals)


def get_golden(workload: WorkloadConfig, world_size: int, scratch: Path, backend: str = "gloo",
               cache_dir: Path | None = None, use_cache: bool = True) -> GoldenRun:
    """Return the cached golden run for this configuration, running it first if needed."""
    key = golden_key(workload, world_size, backend)
    cache = (cache_dir or default_cache_dir()) / f"{key}.json"
    if use_cache and cache.is_file():
        try:
            return GoldenRun.from_dict(json.loads(cache.read_text()), cached=True)
        except (ValueError, KeyError):
            pass  # a damaged cache entry is rerun, not trusted
    log_dir = scratch / "golden-logs"
    result = cluster.run(cluster.LaunchPlan(world_size=world_size, workload=workload.to_dict(),
                                            log_dir=str(log_dir), backend=backend))
    record = RunRecord.collect(result, str(log_dir), world_size)
    if not record.completed:
        errors = "; ".join(f"rank {e['rank']}: {e['type']}: {e['message']}" for e in record.errors())
        raise HarnessError(f"golden run failed ({result.attempts[-1].outcome}): {errors or 'no error logged'}")
    golden = _from_record(key, record)
    if use_cache:
        write_json_atomic(cache, golden.to_dict())
    return golden


# The checkpointer that carries a fault-free run across a resize. Whatever it loads is
# checked against what it saved (and, by the oracle, against what the faulted run
# committed), so its correctness is evidence, not an assumption.
RESIZE_CHECKPOINTER = "reference"


@dataclass
class ResizedReference:
    """A fault-free run that ends at a smaller world size, resumed from one committed checkpoint.

    It trains at ``from_world_size`` exactly as the golden run does, and at each entry
    ``(step, world_size)`` of ``chain`` loses ranks for good right after step ``step``'s save
    and resumes on ``world_size`` ranks from that checkpoint: the fault-free continuation of
    a faulted job that resized at the same steps. ``losses`` are the steps after the last
    resume, rank by rank; ``resumed`` is, per rank, the fingerprint of the state that resume
    loaded (None: it started from scratch), equal to the state the run saved at that step
    (checked when it is built), so ``chaos.judge.oracles.loss_continuity`` can check it is the
    state the faulted job committed there too.
    """

    key: str
    world_size: int
    from_world_size: int
    chain: list[tuple[int, int]]
    losses: dict[int, dict[int, str]]  # rank -> step -> loss (float.hex), after the last resume
    resumed: dict[int, dict[str, str] | None]  # rank -> fingerprint of the state the last resume loaded
    cached: bool = False

    @property
    def step(self) -> int:
        """The step of the checkpoint the last resume loaded."""
        return self.chain[-1][0]

    def describe(self) -> str:
        """The run in words, for oracle evidence: "fault-free run: 2 rank(s) to step 10, then 1 rank(s)
        from its step-10 checkpoint"."""
        segments = [f"{self.from_world_size} rank(s)"]
        for step, ws in self.chain:
            segments[-1] += f" to step {step}" if step else " stopped before step 1"
            segments.append(f"{ws} rank(s) " + (f"from its step-{step} checkpoint" if step else "from scratch"))
        return "fault-free run: " + ", then ".join(segments)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "world_size": self.world_size, "from_world_size": self.from_world_size,
                "chain": [list(c) for c in self.chain],
                "losses": {str(r): {str(s): v for s, v in d.items()} for r, d in self.losses.items()},
                "resumed": {str(r): f for r, f in self.resumed.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], cached: bool = False) -> ResizedReference:
        return cls(data["key"], int(data["world_size"]), int(data["from_world_size"]),
                   [(int(s), int(w)) for s, w in data["chain"]],
                   {int(r): {int(s): v for s, v in d.items()} for r, d in data["losses"].items()},
                   {int(r): f for r, f in data["resumed"].items()}, cached)


def resize_chains(record: RunRecord) -> dict[int, list[tuple[int, int]]]:
    """For each smaller world size a faulted run trained at: the resizes that led there.

    A rank lost for good never comes back, so world sizes only shrink and each one names
    its chain: ``(step resumed from, world size)`` of every resize up to the first attempt
    at that size that resumed on all its ranks. An attempt that died in its load trained
    nothing and is passed over (the next one at that size counts).
    """
    chains: dict[int, list[tuple[int, int]]] = {}
    chain: list[tuple[int, int]] = []
    current = record.world_size
    for a in record.attempts:
        ws = record.attempt_world_size(a["attempt"])
        if ws >= current or not isinstance(a["attempt"], int):
            continue
        step = record.resumed_step(a["attempt"])
        if step is None:
            continue
        chain = [*chain, (step, ws)]
        chains[ws] = chain
        current = ws
    return chains


def resized_key(workload: WorkloadConfig, world_size: int, chain: list[tuple[int, int]], backend: str) -> str:
    """The golden run's key and the chain: all that decides a ResizedReference's numbers (what its
    resumes load is checked by fingerprint whenever it is used, so the checkpointer is not in it)."""
    h = hashlib.sha256()
    h.update(golden_key(workload, world_size, backend).encode())
    h.update(json.dumps([list(c) for c in chain]).encode())
    return "resized-" + h.hexdigest()[:24]


class ResizeUnavailable(HarnessError):
    """The fault-free run cannot take the faulted run's path (it resumed elsewhere): not judged."""


def _resized_plan(workload: WorkloadConfig, world_size: int, chain: list[tuple[int, int]], log_dir: Path,
                  ckpt_root: Path, backend: str, scratch: Path | None = None) -> cluster.LaunchPlan:
    """Attempt k loses ranks for good before step ``chain[k][0] + 1`` (the save at that step has
    returned, and the checkpointer saves synchronously): attempt k + 1 resumes from it."""
    faults = []
    before = world_size
    for attempt, (step, ws) in enumerate(chain):
        faults += [parse_fault(f"kill:rank={r},step={step + 1},attempt={attempt},lost=true")
                   for r in range(before - 1, ws - 1, -1)]
        before = ws
    return cluster.LaunchPlan(world_size=world_size, workload=workload.to_dict(), log_dir=str(log_dir),
                              checkpointer=RESIZE_CHECKPOINTER, ckpt_root=str(ckpt_root), faults=faults,
                              max_restarts=len(chain), backend=backend, scratch=str(scratch) if scratch else None)


def get_resized(workload: WorkloadConfig, world_size: int, chain: list[tuple[int, int]], scratch: Path,
                backend: str = "gloo", cache_dir: Path | None = None, use_cache: bool = True) -> ResizedReference:
    """The cached fault-free run for this chain of resizes, running it first if needed.

    Raises ResizeUnavailable when no fault-free run resumes where the chain says (a step
    it never saves, a later resize from a checkpoint older than an earlier resume: the
    faulted run's own oracles say what went wrong there), HarnessError when it fails.
    """
    key = resized_key(workload, world_size, chain, backend)
    cache = (cache_dir or default_cache_dir()) / f"{key}.json"
    if use_cache and cache.is_file():
        try:
            return ResizedReference.from_dict(json.loads(cache.read_text()), cached=True)
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache entry is rerun, not trusted
    for (earlier, _), (later, _) in zip(chain, chain[1:], strict=False):
        if later < earlier:
            raise ResizeUnavailable(f"the resize to {chain[-1][1]} rank(s) resumed from step {later}, older than the "
                                    f"step-{earlier} resume before it: no fault-free run takes that path")
    if chain[-1][0] >= workload.steps:
        raise ResizeUnavailable(f"the resize to {chain[-1][1]} rank(s) resumed at the last step: nothing ran after it")
    for step, ws in chain:
        if step and not (workload.save_every and step % workload.save_every == 0):
            raise ResizeUnavailable(f"the resize to {ws} rank(s) resumed from step {step}, which no save of a "
                                    "fault-free run makes")
    tag = "-".join(f"{s}x{w}" for s, w in chain)
    log_dir, ckpt_root = scratch / f"resized-{tag}-logs", scratch / f"resized-{tag}-ckpt"
    plan = _resized_plan(workload, world_size, chain, log_dir, ckpt_root, backend, scratch)
    result = cluster.run(plan)
    record = RunRecord.collect(result, str(log_dir), world_size)
    last = len(chain)
    if not record.completed or len(record.attempts) != last + 1:
        errors = "; ".join(f"rank {e['rank']}: {e['type']}: {e['message'][:300]}" for e in record.errors())
        raise HarnessError(f"the fault-free run at {chain[-1][1]} rank(s) from step {chain[-1][0]} failed "
                           f"({result.attempts[-1].outcome}): {errors or 'no error logged'}")
    for attempt, (step, ws) in enumerate(chain, start=1):
        got = record.resumed_step(attempt)
        if got != step or record.attempt_world_size(attempt) != ws:
            raise ResizeUnavailable(f"the fault-free run's attempt {attempt} resumed at step {got} on "
                                    f"{record.attempt_world_size(attempt)} rank(s), not step {step} on {ws} as "
                                    "the job did")
    step, ws = chain[-1]
    resumed: dict[int, dict[str, str] | None] = {}
    for rank in range(ws):
        loaded = [e for e in record.events[last].get(rank, []) if e["ev"] == "resume"][-1]["fingerprint"]
        saved = record.saved_fingerprint(rank, step, before_attempt=last) if step else None
        diff = statehash.first_difference(saved or {}, loaded or {})
        if diff is not None:
            raise HarnessError(f"the {RESIZE_CHECKPOINTER} checkpointer did not load at {ws} rank(s) what it saved at "
                               f"step {step} (rank {rank}: {diff}): no trusted fault-free run at that size")
        resumed[rank] = loaded
    losses = {r: {e["step"]: e["loss_hex"] for e in record.losses(r) if e["attempt"] == last} for r in range(ws)}
    ref = ResizedReference(key, ws, world_size, list(chain), losses, resumed)
    if use_cache:
        write_json_atomic(cache, ref.to_dict())
    return ref


def get_resized_references(workload: WorkloadConfig, world_size: int, record: RunRecord, scratch: Path,
                           backend: str = "gloo", cache_dir: Path | None = None,
                           use_cache: bool = True) -> dict[int, ResizedReference | str]:
    """World size -> its fault-free reference, or why there is none, for every resize in ``record``.

    Called by ``chaos.run.runner`` after a faulted run whose world shrank (before its record is
    judged), so that ``chaos.judge.oracles.loss_continuity`` compares each resized attempt with
    a run at its own world size from the checkpoint it resumed from.
    """
    out: dict[int, ResizedReference | str] = {}
    for ws, chain in resize_chains(record).items():
        try:
            out[ws] = get_resized(workload, world_size, chain, scratch, backend, cache_dir, use_cache)
        except ResizeUnavailable as exc:
            out[ws] = str(exc)
    return out
