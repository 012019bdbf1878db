"""Verified loading with collective fallback and resharding.

Ranks agree on one candidate order (rank 0's view: the step ``latest`` names first,
then older steps newest first, then steps newer than ``latest``, which are either
published-but-unacknowledged saves or an abandoned timeline). For each candidate every
rank verifies what it reads (manifest schema, step agreement, template structure,
shard sizes and checksums, safetensors headers) plus its share of the remaining shards,
and the verdicts are exchanged: the first step valid on *every* rank is loaded
everywhere. Rejections are logged and recorded as events, never deleted.

Resharding: replicated entries load from whichever shard holds them, so any world size
reads them. Sharded tensors (a manifest with a ``dtensors`` section) load through
``chaos.reference.checkpoint.reshard``: each rank reads only the byte ranges its template's boxes
need, verified per entry and per block. Per-rank values (RNG states, data positions) load this rank's copy when the
saving world had this rank; otherwise the template's value is kept and logged
(``kept_from_template``), because inventing another rank's RNG stream would be worse.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from chaos.reference.checkpoint.saver import optimizer_structure
from chaos.reference.ckptformat import manifest, tree
from chaos.reference.ckptformat.errors import (
    CheckpointError,
    IncompatibleCheckpointError,
    ManifestError,
)
from chaos.reference.ckptformat.shard import LoadedShard, entry_tensor

log = logging.getLogger("chaos.reference.checkpoint")


def candidate_order(root: Any) -> list[int]:
    """Steps to try, best first (see module docstring)."""
    from chaos.reference.storage import as_storage  # a path string is the POSIX backend

    store = as_storage(root)
    steps = store.list_steps()
    try:
        latest = store.read_latest()
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
    bytes_needed: int | None = None  # sharded loads: the bytes of the slices decoded (the rest is block rounding)


# Below this, a separate read per tensor costs more than the page faults it saves.
IN_PLACE_MIN_BYTES = 256 * 1024


def _in_place_targets(m: dict[str, Any], index: dict[str, Any]) -> dict[str, dict[str, tuple[int, int, torch.Tensor]]]:
    """Per shard: replicated entries whose template tensor can receive the bytes directly.

    Only replicated entries (named by their path; per-rank ones carry ``@r<rank>``):
    every checkpoint that passes the structure check holds all of them, so if this
    candidate fails verification after writing into the template, the one finally
    loaded overwrites each of them again. Per-rank values may be kept from the template
    when resharding and so are never written into it. A tensor sharing storage with
    another candidate (tied weights) is left out, and so are small ones.
    """
    out: dict[str, dict[str, tuple[int, int, torch.Tensor]]] = {}
    seen: dict[int, int] = {}
    chosen: list[tuple[str, dict[str, Any], torch.Tensor]] = []
    for name, e in m["entries"].items():
        offsets = e.get("offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and isinstance(offsets[0], int)
                and isinstance(offsets[1], int) and offsets[1] - offsets[0] >= IN_PLACE_MIN_BYTES):
            continue
        t = index.get(name)
        if "@r" in name or not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous():
            continue
        if t.dtype != manifest.DTYPES.get(e.get("dtype")) or list(t.shape) != e.get("shape") or t.numel() == 0:
            continue
        ptr = t.untyped_storage().data_ptr()
        seen[ptr] = seen.get(ptr, 0) + 1
        chosen.append((name, e, t))
    for name, e, t in chosen:
        if seen[t.untyped_storage().data_ptr()] == 1:
            out.setdefault(e["shard"], {})[name] = (e["offsets"][0], e["offsets"][1], t.detach())
    return out


def load_step(root: Any, step: int, template: Any, rank: int, world_size: int, verify: bool, max_manifest_bytes: int,
              in_place: bool = False) -> Loaded:
    """Verify and load one checkpoint for this rank; raise a CheckpointError saying why not."""
    from chaos.reference.storage import as_storage  # a path string is the POSIX backend

    store = as_storage(root)
    m, file = store.read_manifest(step, max_manifest_bytes)
    check_template(m, template, file)
    algorithm = m["hash"]
    if verify and algorithm not in ("xxh3", "sha256", "crc32c"):
        raise ManifestError(file, f"unknown hash algorithm {algorithm[:40]!r}")
    if "dtensors" in m:
        from chaos.reference.checkpoint.reshard import load_sharded

        state, reader, decoder = load_sharded(store, step, m, file, template, rank, verify)
        if decoder.kept_from_template:
            log.info("step %d was saved by %d rank(s); rank %d kept its template value for %d per-rank path(s): %s",
                     step, m["world_size"], rank, len(decoder.kept_from_template), ", ".join(decoder.kept_from_template[:5]))
        return Loaded(step=step, state=state, bytes_read=reader.bytes_read, kept_from_template=decoder.kept_from_template,
                      bytes_needed=reader.bytes_needed)
    shards: dict[str, LoadedShard] = {}
    index = tree.template_index(template)
    targets = _in_place_targets(m, index) if in_place else {}

    def shard(name: str) -> LoadedShard:
        if name not in shards:
            shards[name] = store.read_shard(step, name, m["shards"][name], algorithm, verify, targets.get(name))
        return shards[name]


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
    if any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in index.values()):
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
