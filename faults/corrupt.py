"""At-rest corruption of committed checkpoint files, each an exact, replayable record.

A corruption is data before it is an action: :func:`plan_corruption` picks, from a
checkpoint directory and a seed, which file and which bytes; :func:`apply` edits the
file and returns a :class:`CorruptionRecord` saying exactly which bytes changed
(their old and new values inline when short, SHA-256 of both otherwise), so the
checksum-detection oracle can tell "detected" from "changed nothing".

Worked examples, for a 1000-byte ``model.safetensors`` whose header (8-byte length
plus JSON) is 120 bytes:

- ``truncate size=512``       bytes [512, 1000) removed; the file is 512 bytes long.
- ``truncate fraction=0.25``  keeps floor(0.25 * 1000) = 250 bytes.
- ``bitflip n=2 region=data`` two distinct bits at seeded offsets in [120, 1000)
  inverted, e.g. ranges [[517, 518], [903, 904]], old ``"3f"`` new ``"bf"``.
- ``bitflip`` (``region=any``, the default) draws uniformly over the whole length, so
  most flips in a large shard land deep inside tensor data, far from any header.
- ``bitflip offset=700`` / ``at=0.7``   a seeded bit of byte 700 = floor(0.7 * 1000):
  placed exactly (``offset`` is absolute, ``at`` a fraction of the file's length).
- ``zero start=200 end=264``  bytes [200, 264) set to 0x00 (already-zero bytes are
  reported as unchanged); with ``offset=``/``at=`` the range starts there.
- ``delete``                  the file is unlinked; the record keeps its size and hash.
- ``stale source=P``          the file's contents are replaced by P's (a file of an
  older step): a misdirected or lost write that a per-file checksum misses when the
  checksum travelled with the stale copy.
- ``swap other=Q``            the two files exchange contents (swapped rank shards).

Every path is checked against ``scratch_root`` (realpath) first: a corruption aimed
outside it raises :class:`faults.OutsideScratchRoot` and touches nothing.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from faults import FaultError, OutsideScratchRoot
from faults.errors import ConfigError

KINDS = ("truncate", "bitflip", "zero", "delete", "stale", "swap")
REGIONS = ("header", "data", "any")
INLINE_BYTES = 64  # ranges up to this long carry their bytes inline (hex)


@dataclass
class CorruptionPlan:
    """What to corrupt: a kind, a target file and kind-specific parameters.

    ``params`` by kind: truncate ``{"size": int}``; bitflip ``{"bits": [[offset, bit],
    ...], "region": str, "region_range": [start, end]}``; zero ``{"start", "end"}``;
    delete ``{}``; stale ``{"source": path}``; swap ``{"other": path}``.
    """

    kind: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    scratch_root: str = "/"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CorruptionPlan:
        return cls(**d)


@dataclass
class CorruptionRecord:
    """What was done. ``ranges``: [start, end) byte ranges examined; ``changes``: per
    range ``{"start", "end", "old", "new"}`` with hex bytes (or ``old_sha256`` /
    ``new_sha256`` when longer than 64 bytes); ``changed``: whether any byte (or the
    file's existence) differs afterwards."""

    kind: str
    path: str
    seed: int | None
    params: dict[str, Any]
    size_before: int | None
    size_after: int | None
    sha256_before: str | None
    sha256_after: str | None
    ranges: list[list[int]]
    changes: list[dict[str, Any]]
    changed: bool
    other: dict[str, Any] | None = None  # the second file of a swap (its own before/after)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------- helpers
def _check(path: str | os.PathLike[str], scratch_root: str | os.PathLike[str]) -> str:
    root = os.path.realpath(os.fspath(scratch_root))
    p = os.path.realpath(os.fspath(path))
    if not (p == root or p.startswith(root.rstrip(os.sep) + os.sep)):
        raise OutsideScratchRoot(f"refusing to corrupt {p}: outside scratch root {root}")
    return p


def _read(p: str) -> bytes:
    with open(p, "rb") as f:
        return f.read()


def _write(p: str, data: bytes) -> None:
    with open(p, "r+b" if os.path.exists(p) else "wb") as f:
        f.write(data)
        f.truncate(len(data))
        f.flush()
        os.fsync(f.fileno())


def _sha(b: bytes | None) -> str | None:
    return None if b is None else hashlib.sha256(b).hexdigest()


def _change(start: int, old: bytes, new: bytes) -> dict[str, Any]:
    c: dict[str, Any] = {"start": start, "end": start + max(len(old), len(new))}
    if max(len(old), len(new)) <= INLINE_BYTES:
        c.update(old=old.hex(), new=new.hex())
    else:
        c.update(old_sha256=_sha(old), new_sha256=_sha(new), old_len=len(old), new_len=len(new))
    return c


def _record(kind: str, p: str, seed: int | None, params: dict[str, Any], before: bytes | None,
            after: bytes | None, ranges: list[list[int]], changes: list[dict[str, Any]]) -> CorruptionRecord:
    return CorruptionRecord(
        kind, p, seed, params, None if before is None else len(before),
        None if after is None else len(after), _sha(before), _sha(after), ranges, changes,
        before != after)


def header_length(data: bytes, default: int = 64) -> int:
    """Length of a file's header region: 8 + N for safetensors (an 8-byte
    little-endian N then N bytes of JSON), else ``default`` bytes (capped at the size)."""
    if len(data) >= 8:
        (n,) = struct.unpack("<Q", data[:8])
        if 0 < n <= len(data) - 8 and data[8:9] == b"{":
            return 8 + n
    return min(default, len(data))


def region_range(data: bytes, region: str, header_bytes: int | None = None) -> tuple[int, int]:
    """[start, end) of ``region`` ("header", "data" or "any") in ``data``."""
    if region not in REGIONS:
        raise ConfigError(f"unknown region {region!r}; expected one of {REGIONS}")
    h = header_length(data) if header_bytes is None else min(header_bytes, len(data))
    return {"header": (0, h), "data": (h, len(data)), "any": (0, len(data))}[region]


# ---------------------------------------------------------------------- primitives
def truncate(path: str | os.PathLike[str], *, size: int | None = None,
             fraction: float | None = None, scratch_root: str | os.PathLike[str]) -> CorruptionRecord:
    """Cut the file to ``size`` bytes (0 allowed) or to ``floor(fraction * size)``."""
    p = _check(path, scratch_root)
    before = _read(p)
    if (size is None) == (fraction is None):
        raise ConfigError("truncate needs exactly one of size= or fraction=")
    n = int(len(before) * fraction) if fraction is not None else int(size)  # type: ignore[arg-type]
    if not 0 <= n:
        raise ConfigError(f"truncate size must be >= 0, got {n}")
    n = min(n, len(before))
    os.truncate(p, n)
    after = _read(p)
    ranges = [[n, len(before)]] if n < len(before) else []
    changes = [_change(n, before[n:], b"")] if ranges else []
    return _record("truncate", p, None, {"size": n, "fraction": fraction}, before, after, ranges, changes)


def flip_bits(path: str | os.PathLike[str], *, bits: Sequence[Sequence[int]] | None = None,
              n: int = 1, seed: int = 0, region: str = "any", header_bytes: int | None = None,
              scratch_root: str | os.PathLike[str]) -> CorruptionRecord:
    """Invert ``n`` distinct bits chosen with ``seed`` in ``region`` (or exactly ``bits``,
    a list of ``[byte_offset, bit_index]``)."""
    p = _check(path, scratch_root)
    before = _read(p)
    lo, hi = region_range(before, region, header_bytes)
    if bits is None:
        bits = choose_bits(before, n=n, seed=seed, region=region, header_bytes=header_bytes)
    buf = bytearray(before)
    for off, bit in bits:
        if not lo <= off < hi or not 0 <= bit < 8:
            raise ConfigError(f"bit ({off}, {bit}) outside region {region} [{lo}, {hi})")
        buf[off] ^= 1 << bit
    _write(p, bytes(buf))
    after = _read(p)
    offs = sorted({off for off, _b in bits})
    changes = [_change(o, before[o:o + 1], after[o:o + 1]) for o in offs]
    return _record("bitflip", p, seed, {"bits": [list(b) for b in bits], "region": region,
                                        "region_range": [lo, hi]},
                   before, after, [[o, o + 1] for o in offs], changes)


def placed_offset(size: int, *, offset: int | None = None, at: float | None = None) -> int | None:
    """The byte a placed corruption starts at: ``offset`` as given, or ``floor(at * size)``
    (``at`` in [0, 1], clamped to the last byte); None when neither is given.

    Why both: ``offset`` replays an exact byte from a record; ``at`` says "the middle of
    whatever shard this is" without knowing its size, e.g. deep inside the tensors.
    """
    if offset is not None and at is not None:
        raise ConfigError("give offset= or at=, not both")
    if at is not None:
        if not 0.0 <= float(at) <= 1.0:
            raise ConfigError(f"at= must be a fraction in [0, 1], got {at}")
        return max(0, min(int(float(at) * size), size - 1))
    if offset is not None:
        if int(offset) < 0:
            raise ConfigError(f"offset= must be >= 0, got {offset}")
        return int(offset)
    return None


def choose_bits(data: bytes, *, n: int, seed: int, region: str = "any",
                header_bytes: int | None = None, start: int | None = None) -> list[list[int]]:
    """``n`` distinct ``[offset, bit]`` pairs in ``region``, the same for the same seed.

    With ``start`` the bits lie in the ``ceil(n / 8)`` bytes from ``start`` on (a placed
    flip), whatever the region.
    """
    if start is not None:
        if not 0 <= start < len(data):
            raise FaultError(f"offset {start} is past the end of a {len(data)}-byte file; nothing to flip")
        lo, hi = start, min(len(data), start + max(1, -(-n // 8)))
    else:
        lo, hi = region_range(data, region, header_bytes)
    space = (hi - lo) * 8
    if space <= 0:
        raise FaultError(f"region {region} of the file is empty; nothing to flip")
    if n > space:
        raise ConfigError(f"cannot flip {n} distinct bits in {space} bits")
    picks = random.Random(seed).sample(range(space), n)
    return sorted([lo + x // 8, x % 8] for x in picks)


def zero_range(path: str | os.PathLike[str], start: int, end: int, *,
               scratch_root: str | os.PathLike[str]) -> CorruptionRecord:
    """Overwrite bytes [start, end) with zeros (clipped to the file)."""
    p = _check(path, scratch_root)
    before = _read(p)
    s, e = max(0, start), min(end, len(before))
    if s >= e:
        raise ConfigError(f"zero range [{start}, {end}) is empty for a {len(before)}-byte file")
    after_b = before[:s] + bytes(e - s) + before[e:]
    _write(p, after_b)
    after = _read(p)
    return _record("zero", p, None, {"start": s, "end": e}, before, after, [[s, e]],
                   [_change(s, before[s:e], after[s:e])])


def delete(path: str | os.PathLike[str], *, scratch_root: str | os.PathLike[str]) -> CorruptionRecord:
    """Unlink the file (its size and hash stay in the record)."""
    p = _check(path, scratch_root)
    before = _read(p)
    os.unlink(p)
    return _record("delete", p, None, {}, before, None, [[0, len(before)]],
                   [{"start": 0, "end": len(before), "old_sha256": _sha(before), "deleted": True}])


def stale_copy(path: str | os.PathLike[str], source: str | os.PathLike[str], *,
               scratch_root: str | os.PathLike[str]) -> CorruptionRecord:
    """Replace ``path``'s contents with those of ``source`` (same name, older step)."""
    p = _check(path, scratch_root)
    s = _check(source, scratch_root)
    before = _read(p)
    new = _read(s)
    _write(p, new)
    after = _read(p)
    n = max(len(before), len(after))
    return _record("stale", p, None, {"source": s}, before, after, [[0, n]],
                   [_change(0, before, after)])


def swap(a: str | os.PathLike[str], b: str | os.PathLike[str], *,
         scratch_root: str | os.PathLike[str]) -> CorruptionRecord:
    """Exchange the contents of two files (e.g. rank 0 and rank 1 shards)."""
    pa, pb = _check(a, scratch_root), _check(b, scratch_root)
    if pa == pb:
        raise ConfigError("swap needs two different files")
    da, db = _read(pa), _read(pb)
    _write(pa, db)
    _write(pb, da)
    aa, ab = _read(pa), _read(pb)
    rec = _record("swap", pa, None, {"other": pb}, da, aa, [[0, max(len(da), len(aa))]],
                  [_change(0, da, aa)])
    rec.other = _record("swap", pb, None, {"other": pa}, db, ab, [[0, max(len(db), len(ab))]],
                        [_change(0, db, ab)]).to_dict()
    rec.changed = rec.changed or rec.other["changed"]
    return rec


# ---------------------------------------------------------------------- plans
def checkpoint_files(ckpt_dir: str | os.PathLike[str], pattern: str | None = None) -> list[str]:
    """Regular files under ``ckpt_dir``, sorted by relative path (the chooser's domain)."""
    import fnmatch

    root = os.path.realpath(os.fspath(ckpt_dir))
    out = []
    for dirpath, dirs, names in os.walk(root):
        dirs.sort()
        for n in names:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            if os.path.isfile(p) and not os.path.islink(p) and (
                    pattern is None or fnmatch.fnmatchcase(rel, pattern)
                    or fnmatch.fnmatchcase(n, pattern)):
                out.append(p)
    return sorted(out, key=lambda q: os.path.relpath(q, root))


def corruptible(files: list[str], kind: str, *, region: str = "any", header_bytes: int | None = None,
                offset: int | None = None, at: float | None = None) -> list[str]:
    """The files a ``kind`` corruption can change: for bitflip and zero, those whose ``region``
    (or placed byte) is non-empty — a ``latest`` pointer has no data region; others: all.
    Called by :func:`plan_corruption` and by the harness before it draws a target."""
    if kind not in ("bitflip", "zero"):
        return list(files)
    placed = offset is not None or at is not None

    def has_region(f: str) -> bool:
        data = _read(f)
        if placed:
            p = placed_offset(len(data), offset=offset, at=at)
            return p is not None and p < len(data)
        lo, hi = region_range(data, region, header_bytes)
        return hi > lo

    return [f for f in files if has_region(f)]


def plan_corruption(ckpt_dir: str | os.PathLike[str], kind: str, seed: int, *,
                    scratch_root: str | os.PathLike[str], pattern: str | None = None,
                    region: str = "any", n_bits: int = 1, fraction: float | None = None,
                    zero_len: int = 64, older_dir: str | os.PathLike[str] | None = None,
                    header_bytes: int | None = None, offset: int | None = None,
                    at: float | None = None) -> CorruptionPlan:
    """Pick a target in ``ckpt_dir`` and the exact bytes, deterministically from ``seed``.

    ``pattern`` narrows the files (fnmatch on relative path or name); bitflip and zero
    consider only files whose ``region`` is non-empty. ``offset``/``at`` place a bitflip
    or zero exactly (see :func:`placed_offset`), overriding the region. ``stale`` takes
    the file of the same relative path in ``older_dir``; ``swap`` picks a second file
    of the same size if there is one (shards of two ranks), else any other file.
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown corruption kind {kind!r}; expected one of {KINDS}")
    root = _check(ckpt_dir, scratch_root)
    files = checkpoint_files(root, pattern)
    if not files:
        raise FaultError(f"no files to corrupt in {root} (pattern {pattern!r})")
    placed = offset is not None or at is not None
    if kind in ("bitflip", "zero"):  # only files where the asked-for region (or byte) exists
        files = corruptible(files, kind, region=region, header_bytes=header_bytes, offset=offset, at=at)
        if not files:
            where = f"byte {offset}" if offset is not None else f"at={at}" if placed else f"a non-empty {region} region"
            raise FaultError(f"no file in {root} (pattern {pattern!r}) has {where}")
    rng = random.Random(f"{seed}:{kind}")
    target = rng.choice(files)
    params: dict[str, Any] = {}
    size = os.path.getsize(target)
    if kind == "truncate":
        params["size"] = int(size * fraction) if fraction is not None else (
            rng.randrange(size) if size else 0)
    elif kind == "bitflip":
        data = _read(target)
        at_byte = placed_offset(len(data), offset=offset, at=at)
        params["bits"] = choose_bits(data, n=n_bits, seed=rng.randrange(2**32), region=region,
                                     header_bytes=header_bytes, start=at_byte)
        params["region"] = "any" if placed else region
        params["header_bytes"] = header_bytes
        if placed:
            params["placed"] = {"offset": offset, "at": at, "byte": at_byte}
    elif kind == "zero":
        data = _read(target)
        at_byte = placed_offset(len(data), offset=offset, at=at)
        if at_byte is not None:
            start, length = at_byte, min(zero_len, len(data) - at_byte)
            params["placed"] = {"offset": offset, "at": at, "byte": at_byte}
        else:
            lo, hi = region_range(data, region, header_bytes)
            if hi <= lo:
                raise FaultError(f"region {region} of {target} is empty")
            length = min(zero_len, hi - lo)
            start = lo + rng.randrange(hi - lo - length + 1)
        params.update(start=start, end=start + length, region="any" if placed else region)
    elif kind == "stale":
        if older_dir is None:
            raise ConfigError("stale corruption needs older_dir (a checkpoint of an earlier step)")
        src = os.path.join(os.fspath(older_dir), os.path.relpath(target, root))
        if not os.path.isfile(src):
            raise FaultError(f"no older copy of {os.path.relpath(target, root)} in {older_dir}")
        params["source"] = _check(src, scratch_root)
    elif kind == "swap":
        others = [f for f in files if f != target]
        if not others:
            others = [f for f in checkpoint_files(root) if f != target]
        if not others:
            raise FaultError(f"swap needs two files in {root}")
        same = [f for f in others if os.path.getsize(f) == size]
        params["other"] = rng.choice(same or others)
    return CorruptionPlan(kind, target, params, seed, os.path.realpath(os.fspath(scratch_root)))


def why_unchanged(rec: CorruptionRecord) -> str:
    """Why an applied edit left every byte as it was (a fault that did nothing tests nothing)."""
    p = rec.params
    if rec.kind == "truncate":
        return f"truncating to {p.get('size')} bytes cut nothing from a {rec.size_before}-byte file"
    if rec.kind == "zero":
        return f"bytes [{p.get('start')}, {p.get('end')}) were already zero"
    if rec.kind == "stale":
        return f"the older copy {p.get('source')} is byte for byte the same file"
    if rec.kind == "swap":
        return f"the two files are identical ({p.get('other')})"
    return f"the {rec.kind} left every byte as it was"


def apply(plan: CorruptionPlan) -> CorruptionRecord:
    """Carry out a plan; the record carries the plan's seed."""
    k, p, prm, root = plan.kind, plan.path, plan.params, plan.scratch_root
    if k == "truncate":
        rec = truncate(p, size=prm["size"], scratch_root=root)
    elif k == "bitflip":
        rec = flip_bits(p, bits=prm["bits"], region=prm.get("region", "any"),
                        header_bytes=prm.get("header_bytes"), scratch_root=root)
    elif k == "zero":
        rec = zero_range(p, prm["start"], prm["end"], scratch_root=root)
    elif k == "delete":
        rec = delete(p, scratch_root=root)
    elif k == "stale":
        rec = stale_copy(p, prm["source"], scratch_root=root)
    elif k == "swap":
        rec = swap(p, prm["other"], scratch_root=root)
    else:
        raise ConfigError(f"unknown corruption kind {k!r}")
    rec.seed = plan.seed
    return rec


__all__ = [
    "KINDS", "REGIONS", "CorruptionPlan", "CorruptionRecord", "apply", "checkpoint_files",
    "choose_bits", "delete", "flip_bits", "header_length", "placed_offset", "plan_corruption", "region_range",
    "stale_copy", "swap", "truncate", "why_unchanged", "zero_range",
]
