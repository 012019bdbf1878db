"""Options of the reference checkpointer, coerced from CLI strings.

Options arrive as keyword arguments that were often typed on a command line
(``-o keep_last=3 -o async_save=true``), so each is coerced to its declared type here
and anything unknown or malformed fails loudly at construction rather than at the
first save.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from chaos.reference.ckptformat.errors import CheckpointConfigError

HASHES = ("xxh3", "sha256", "crc32c")
SERIALIZERS = ("native", "safetensors")
REPLICAS = ("verify", "verify-sync", "trust")


@dataclasses.dataclass(frozen=True)
class Milestones:
    """Steps kept forever by retention: an explicit set and/or every N-th step."""

    steps: frozenset[int] = frozenset()
    every: int | None = None

    def __contains__(self, step: object) -> bool:
        if not isinstance(step, int):
            return False
        return step in self.steps or (self.every is not None and step % self.every == 0)


@dataclasses.dataclass(frozen=True)
class Options:
    keep_last: int = 3
    milestones: Milestones = Milestones()
    async_save: bool = False
    async_dedup: bool = True
    hash: str = "xxh3"
    throttle_mb_s: float | None = None
    verify: bool = True
    timeout_s: float | None = None  # None: the default process group's timeout
    metrics: bool = True
    metrics_port: int = 0  # > 0: rank r serves its metrics over HTTP on metrics_port + r
    serializer: str = "native"
    latency_alert_factor: float = 3.0
    disk_alert_free_fraction: float = 0.05
    max_manifest_bytes: int = 256 * 1024 * 1024
    # Backend URL (chaos.reference.storage): file:///path, s3://bucket/prefix?endpoint_url=...;
    # None: the checkpointer's root directory.
    storage: str | None = None
    # ``module:Class`` / ``file.py:Class`` wrapping the backend (certification of variants).
    storage_wrapper: str | None = None
    # Off-site copy: every committed checkpoint ("all") or milestones only, copied by rank 0
    # in the background to this backend URL and verified there by checksum.
    replicate_to: str | None = None
    replicate: str = "all"
    # Read replicated tensors straight into the template's CPU tensors (as DCP does)
    # instead of new memory; off keeps the template untouched by a failed load.
    load_in_place: bool = True
    # Async saves skip copying replicated tensors another rank writes, and hash them so
    # that one that stopped being identical across ranks is caught (the save aborts on
    # every rank and the next one copies all). "verify" hashes those an optimizer owns on
    # the commit thread while optimizer steps wait at a fence (the rest before save()
    # returns; contract in chaos.reference.checkpoint.engine); "verify-sync" hashes all of them
    # before save() returns; "trust" takes the DDP invariant for granted, as DCP's dedup
    # does, and touches them not at all.
    replicas: str = "verify"


def _bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise CheckpointConfigError(f"option {name}: expected a boolean, got {v!r}")


def _int(name: str, v: Any, minimum: int) -> int:
    try:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError
        out = int(v)
    except (TypeError, ValueError):
        raise CheckpointConfigError(f"option {name}: expected an integer, got {v!r}") from None
    if out < minimum:
        raise CheckpointConfigError(f"option {name}: must be >= {minimum}, got {out}")
    return out


def _float(name: str, v: Any, optional: bool = False) -> float | None:
    if optional and (v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "0"))):
        return None
    try:
        if isinstance(v, bool):
            raise ValueError
        out = float(v)
    except (TypeError, ValueError):
        raise CheckpointConfigError(f"option {name}: expected a number, got {v!r}") from None
    if not math.isfinite(out) or out <= 0:
        raise CheckpointConfigError(f"option {name}: must be a positive number, got {v!r}")
    return out


def parse_milestones(v: Any) -> Milestones:
    """Accept ``[100, 200]``, ``"100,200"``, ``"every-1000"``, ``1000`` (= every 1000) or None."""
    if v is None or v == "" or v == []:
        return Milestones()
    if isinstance(v, Milestones):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return Milestones(every=_int("milestones", v, 1))
    if isinstance(v, str):
        text = v.strip().lower()
        for prefix in ("every-", "every:", "every="):
            if text.startswith(prefix):
                return Milestones(every=_int("milestones", text[len(prefix):], 1))
        if text.isdigit() and "," not in text:
            return Milestones(every=_int("milestones", text, 1))
        v = [p for p in text.split(",") if p.strip()]
    if isinstance(v, (list, tuple, set, frozenset)):
        return Milestones(steps=frozenset(_int("milestones", s, 0) for s in v))
    raise CheckpointConfigError(f"option milestones: expected steps or 'every-N', got {v!r}")


def parse_options(**raw: Any) -> Options:
    """Coerce keyword options; unknown names raise :class:`CheckpointConfigError`."""
    fields = {f.name for f in dataclasses.fields(Options)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise CheckpointConfigError(
            f"unknown option(s) for the reference checkpointer: {', '.join(unknown)}; "
            f"known: {', '.join(sorted(fields))}"
        )
    out: dict[str, Any] = {}
    for name, v in raw.items():
        if name in ("keep_last",):
            out[name] = _int(name, v, 1)
        elif name == "max_manifest_bytes":
            out[name] = _int(name, v, 1024)
        elif name == "metrics_port":
            out[name] = _int(name, v, 0)
        elif name == "milestones":
            out[name] = parse_milestones(v)
        elif name in ("async_save", "async_dedup", "verify", "metrics", "load_in_place"):
            out[name] = _bool(name, v)
        elif name == "throttle_mb_s":
            out[name] = _float(name, v, optional=True)
        elif name == "timeout_s":
            out[name] = _float(name, v, optional=True)
        elif name == "latency_alert_factor":
            out[name] = _float(name, v)
        elif name == "disk_alert_free_fraction":
            f = _float(name, v)
            if f is None or f >= 1:
                raise CheckpointConfigError(f"option {name}: must be in (0, 1), got {v!r}")
            out[name] = f
        elif name == "storage":
            if v is not None and str(v).strip() not in ("", "none"):
                from chaos.reference.storage import (
                    parse_url,  # raises a one-line error naming the URL
                )

                parse_url(str(v))
                out[name] = str(v).strip()
        elif name == "replicate_to":
            if v is not None and str(v).strip() not in ("", "none"):
                from chaos.reference.storage import parse_url

                parse_url(str(v))
                out[name] = str(v).strip()
        elif name == "replicate":
            if str(v) not in ("all", "milestones"):
                raise CheckpointConfigError(f"option replicate: one of all, milestones, got {v!r}")
            out[name] = str(v)
        elif name == "storage_wrapper":
            if v is not None and str(v).strip() not in ("", "none"):
                if ":" not in str(v):
                    raise CheckpointConfigError(f"option storage_wrapper: expected module:Class or file.py:Class, got {v!r}")
                out[name] = str(v).strip()
        elif name == "hash":
            if str(v) not in HASHES:
                raise CheckpointConfigError(f"option hash: one of {', '.join(HASHES)}, got {v!r}")
            out[name] = str(v)
        elif name == "replicas":
            if str(v) not in REPLICAS:
                raise CheckpointConfigError(f"option replicas: one of {', '.join(REPLICAS)}, got {v!r}")
            out[name] = str(v)
        elif name == "serializer":
            if str(v) not in SERIALIZERS:
                raise CheckpointConfigError(f"option serializer: one of {', '.join(SERIALIZERS)}, got {v!r}")
            out[name] = str(v)
    return Options(**out)
