"""Verified loading with collective fallback and resharding.

Ranks agree on one candidate order (rank 0's view: the step ``latest`` names first,
then older steps newest first, then steps newer than ``latest``, which are either
published-but-unacknowledged saves or an abandoned timeline). For each candidate every
rank verifies what it reads (manifest schema, step agreement, template structure,
shard sizes and checksums, safetensors headers) plus its share of the remaining shards,
and the verdicts are exchanged: the first step valid on *every* rank is loaded
everywhere. Rejections are logged and recorded as events, never deleted.

Resharding: replicated entries load from whichever shard holds them, so any world size
reads them. Per-rank values (RNG states, data positions) load this rank's copy when the
saving world had this rank; otherwise the template's value is kept and logged
(``kept_from_template``), because inventing another rank's RNG stream would be worse.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from chaos.checkpoint import commit, manifest, tree
from chaos.checkpoint.errors import CheckpointError, IncompatibleCheckpointError, ManifestError
from chaos.checkpoint.saver import optimizer_structure
from chaos.checkpoint.shard import LoadedShard, entry_tensor, read_shard

log = logging.getLogger("chaos.checkpoint")


def candidate_order(root: str) -> list[int]:
    """Steps to try, best first (see module docstring)."""
    steps = commit.list_steps(root)
    try:
        latest = commit.read_latest(root)
    except ManifestError as exc:
        log.warning("ignoring the latest pointer: %s", exc)
        latest = None
    if latest is None or latest not in steps:
        return steps
    return [latest] + [s for s in steps if s < latest] + [s for s in steps if s > latest]


def _first_difference(expected: dict, actual: dict) -> str:
    for key in sorted(set(expected) | set(actual), key=str):
        if key not in actual:
            return f"{key} missing from the template"
        if key not in expected:
            return f"{key} not in the checkpoint"
        if expected[key] != actual[key]:
            return f"{key}: checkpoint {expected[key]}, template {actual[key]}"
    return "no difference"


def check_template(m: dict[str, Any], template: Any, file: str) -> None:
    """Model structure must match exactly; optimizer structure where the template has one.

    An optimizer template without tensors (a fresh optimizer before its first step)
    matches any saved optimizer state of the same parameter groups.
    """
    if not isinstance(template, dict):
        return
    if "model" in template and "model_structure" in m:
        want = manifest.structure_of(template["model"])
        if want != m["model_structure"]:
            raise IncompatibleCheckpointError(f"{file}: model structure differs: {_first_difference(m['model_structure'], want)}")
    if "optimizer" in template and isinstance(m.get("optimizer_structure"), dict):
        saved = m["optimizer_structure"]
        have = optimizer_structure(template["optimizer"]) or {}
        if have.get("param_groups") is not None and saved.get("param_groups") is not None and have["param_groups"] != saved["param_groups"]:
            raise IncompatibleCheckpointError(f"{file}: optimizer param groups differ: checkpoint {saved['param_groups']}, template {have['param_groups']}")
        if have.get("tensors") and have["tensors"] != saved.get("tensors"):
            raise IncompatibleCheckpointError(f"{file}: optimizer state differs: {_first_difference(saved.get('tensors') or {}, have['tensors'])}")


@dataclass
class Loaded:
    step: int
    state: Any
    bytes_read: int = 0
    kept_from_template: list[str] = field(default_factory=list)


def load_step(root: str, step: int, template: Any, rank: int, world_size: int, verify: bool, max_manifest_bytes: int) -> Loaded:
    """Verify and load one checkpoint for this rank; raise a CheckpointError saying why not."""
    directory = os.path.join(root, commit.step_dirname(step))
    m = manifest.read_manifest(directory, expect_step=step, max_bytes=max_manifest_bytes)
    file = os.path.join(directory, manifest.MANIFEST_NAME)
    check_template(m, template, file)
    algorithm = m["hash"]
    if verify and algorithm not in ("xxh3", "sha256", "crc32c"):
        raise ManifestError(file, f"unknown hash algorithm {algorithm[:40]!r}")
    shards: dict[str, LoadedShard] = {}

    def shard(name: str) -> LoadedShard:
        if name not in shards:
            shards[name] = read_shard(os.path.join(directory, name), m["shards"][name], algorithm, verify, step)
        return shards[name]

    index = tree.template_index(template)

    def load(entry: str) -> torch.Tensor:
        if entry not in m["entries"]:
            raise ManifestError(file, f"tree references undefined entry {entry[:120]!r}")
        e = m["entries"][entry]
        # The whole-shard checksum already covered these bytes when verify is on.
        return entry_tensor(shard(e["shard"]), entry, e, algorithm, verify=False)

    decoder = tree.Decoder(file, rank, load, fallback=lambda path: (path in index, index.get(path)))
    state = decoder.decode(m["tree"])
    # This rank's share of verifying shards nobody else necessarily reads.
    if verify:
        for i, name in enumerate(sorted(m["shards"])):
            if i % world_size == rank:
                shard(name)
    state = _place(state, index, "")
    if decoder.kept_from_template:
        log.info(
            "step %d was saved by %d rank(s); rank %d kept its template value for %d per-rank path(s): %s",
            step, m["world_size"], rank, len(decoder.kept_from_template), ", ".join(decoder.kept_from_template[:5]),
        )
    nbytes = sum(s.buffer.numel() for s in shards.values())
    return Loaded(step=step, state=state, bytes_read=nbytes, kept_from_template=decoder.kept_from_template)


def _place(value: Any, index: dict[str, Any], path: str) -> Any:
    """Move tensors to the device of the template's tensor at the same path."""
    if isinstance(value, torch.Tensor):
        ref = index.get(path)
        if isinstance(ref, torch.Tensor) and ref.device != value.device:
            return value.to(ref.device)
        return value
    if isinstance(value, dict):
        for k in list(value):
            value[k] = _place(value[k], index, tree.join(path, tree.render_key(k)))
        return value
    if isinstance(value, list):
        return [_place(v, index, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(_place(v, index, f"{path}[{i}]") for i, v in enumerate(value))
    return value


def describe(exc: BaseException) -> str:
    if isinstance(exc, CheckpointError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
