"""Golden (uninterrupted, checkpoint-free) runs, cached by everything that decides their numbers.

The key covers the workload configuration, world size, process-group backend, torch
version and the workload's own source code, so a change to any of them runs a new
golden instead of comparing against a stale one. A ``device=cuda`` workload adds the
device, its process group (``cpu:gloo,cuda:nccl``), the CUDA version and the GPUs' names
(other GPUs run other kernels); ``corpus=faker`` adds Faker's version (its generators
decide the text). Neither is added for the defaults, so every CPU key stays what it was.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from chaos import cluster, statehash
from chaos.errors import HarnessError
from chaos.jsonfile import write_json_atomic
from chaos.record import RunRecord
from chaos.workload import device
from chaos.workload.config import WorkloadConfig

WORKLOAD_DIR = Path(__file__).parent / "workload"


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
    base = os.environ.get("CHAOS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "chaos")
    return Path(base) / "golden"


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
