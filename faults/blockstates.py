"""Crash states of a block device, from a block log (:mod:`faults.blocklog`).

The model is dm-log-writes' / CrashMonkey's, for a device with a volatile write cache:

- a power cut happens at a *moment* ``m``: right after the ``m``-th write of the log (a
  write or a zeroing; ``0 <= m <= W``; 0 is before any), before the flush or marker that
  may follow it; moment ``W + 1`` is the end of the log;
- every write before the last flush before the moment survives (it was acknowledged
  before the flush was issued, so the flush made it durable);
- any subset of the writes since that flush, and before the moment, may survive
  (the *pending* writes): the cache may have written back any of them, in any order.
  Surviving writes are applied in log order, so where two overlap the later wins.

Which states: for every moment, "none of the pending writes" and "all of them" (the
latter is the device exactly as the log left it at that moment); every subset where the
pending writes are few (``2**p <= enumerate_limit``, or all of them where every subset of
every moment fits in ``max_states``); then seeded random subsets of the larger pending
sets, as many as ``max_states`` leaves room for. When even the none/all pairs exceed
``max_states``, evenly spaced moments are kept (the first and the last always, and each
moment right after a marker). A state is fully given by ``(moment, subset)``: the log and
the base image rebuild it (:func:`materialize`), and the seed rebuilds the plan.

Deduplication: many states are the same bytes (every "none" of one epoch, a subset whose
writes were overwritten later). A state's key is a hash of what it changes against the
base image, sector by sector (an order-independent sum of per-sector hashes, kept up to
date as the durable prefix grows), so equal contents get equal keys however they were
reached; a sector written back to its base contents counts as unchanged. *checked* is
the number of states planned, *distinct* the number of different keys: only those need
mounting.

Who calls what: ``chaos.certify.blockcrash`` calls :func:`plan` on a log read with
:func:`faults.blocklog.read_log`, then :func:`materialize` for each distinct state.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from faults.blocklog import BlockLogError, Record, sparse_copy

SECTOR = 512
_MASK = (1 << 128) - 1


@dataclass(frozen=True)
class BlockState:
    """One crash state: the first ``durable`` writes plus the pending writes in ``subset``.

    ``moment``: the crash came right after this many writes (``W + 1``: at the log's end,
    after its last flush); ``durable``: writes ``0..durable-1`` survive; ``subset``: indices (into the log's
    writes, counted from 0) of the pending writes that survive, in log order; ``marks``: the
    markers logged before the moment (``"acknowledged" in marks``: the save had returned);
    ``key``: the hash of what the state changes against the base (equal bytes, equal key);
    ``how``: ``none`` | ``all`` | ``enumerated`` | ``sampled``.
    """

    moment: int
    durable: int
    subset: tuple[int, ...]
    marks: tuple[str, ...]
    key: str
    how: str

    def to_dict(self) -> dict[str, Any]:
        return {"moment": self.moment, "durable": self.durable,
                "subset": list(self.subset), "marks": list(self.marks), "key": self.key, "how": self.how}


@dataclass
class Plan:
    """The planned states of one log: ``states`` (checked) and the count of distinct keys."""

    states: list[BlockState]
    writes: int
    flushes: int
    seed: int
    max_states: int
    moments_total: int
    moments_used: int
    distinct_keys: list[str] = field(default_factory=list)

    @property
    def checked(self) -> int:
        return len(self.states)

    @property
    def distinct(self) -> int:
        return len(self.distinct_keys)

    def unique(self) -> list[BlockState]:
        """The first state of each key, in plan order: the ones to mount."""
        seen: set[str] = set()
        out = []
        for s in self.states:
            if s.key not in seen:
                seen.add(s.key)
                out.append(s)
        return out


class Epochs:
    """The log's writes and its crash moments: for each, the writes done, the durable prefix and the marks.

    Moment ``m`` for ``0 <= m <= W`` is the instant right after the ``m``-th write (``m = 0``:
    before any), before whatever the log holds next, so a flush right after a write is *not*
    before it; moment ``W + 1`` is the end of the log (after its last record).
    """

    def __init__(self, records: Sequence[Record]) -> None:
        self.writes: list[Record] = []
        self.flushes = 0
        durable = 0
        marks: list[str] = []
        # (writes done, durable prefix, marks before) of each moment.
        self.at: list[tuple[int, int, tuple[str, ...]]] = [(0, 0, ())]
        for r in records:
            if r.is_write:
                self.writes.append(r)
                self.at.append((len(self.writes), durable, tuple(marks)))
            elif r.kind == "flush":
                self.flushes += 1
                durable = len(self.writes)
            elif r.kind == "mark":
                marks.append(r.name)
        self.at.append((len(self.writes), durable, tuple(marks)))

    @property
    def moments(self) -> int:
        return len(self.at)

    def done(self, moment: int) -> int:
        return self.at[moment][0]

    def durable(self, moment: int) -> int:
        return self.at[moment][1]

    def marks(self, moment: int) -> tuple[str, ...]:
        return self.at[moment][2]

    def pending(self, moment: int) -> range:
        return range(self.at[moment][1], self.at[moment][0])


def _subsets_of(pending: range, rng: random.Random, how_many: int, limit: int) -> list[tuple[tuple[int, ...], str]]:
    """none, all, every other subset when few, else up to ``how_many`` seeded random ones."""
    items = list(pending)
    out: list[tuple[tuple[int, ...], str]] = [((), "none")]
    if items:
        out.append((tuple(items), "all"))
    if len(items) >= 2 and (1 << len(items)) <= limit:
        for r in range(1, len(items)):
            out += [(c, "enumerated") for c in itertools.combinations(items, r)]
    elif len(items) >= 2:
        drawn: set[tuple[int, ...]] = set()
        for _ in range(how_many):
            chosen = tuple(i for i in items if rng.random() < 0.5)
            if 0 < len(chosen) < len(items) and chosen not in drawn:
                drawn.add(chosen)
                out.append((chosen, "sampled"))
    return out


class _Keys:
    """Order-independent sector hashes of states over one base image and one log."""

    def __init__(self, log_path: str, base_path: str, writes: Sequence[Record]) -> None:
        self.writes = writes
        self._chunks: dict[int, list[tuple[int, int]]] = {}
        self._base: dict[int, int] = {}
        self.durable_map: dict[int, int] = {}
        self.durable_sum = 0
        self.durable_upto = 0
        self._log = os.open(log_path, os.O_RDONLY | os.O_NOFOLLOW)
        self._basefd = os.open(base_path, os.O_RDONLY | os.O_NOFOLLOW)
        self._zero = xxhash.xxh3_64_intdigest(bytes(SECTOR))

    def close(self) -> None:
        os.close(self._log)
        os.close(self._basefd)

    def chunks(self, w: int) -> list[tuple[int, int]]:
        """(sector, hash of its new contents) for write ``w``."""
        got = self._chunks.get(w)
        if got is None:
            r = self.writes[w]
            if r.offset % SECTOR or r.length % SECTOR:
                raise BlockLogError(f"write {w} at {r.offset}+{r.length} is not sector-aligned")
            first = r.offset // SECTOR
            if r.kind == "zero":
                got = [(first + i, self._zero) for i in range(r.length // SECTOR)]
            else:
                data = os.pread(self._log, r.length, r.pos)
                got = [(first + i, xxhash.xxh3_64_intdigest(data[i * SECTOR:(i + 1) * SECTOR]))
                       for i in range(r.length // SECTOR)]
            self._chunks[w] = got
        return got

    def base(self, sector: int) -> int:
        h = self._base.get(sector)
        if h is None:
            data = os.pread(self._basefd, SECTOR, sector * SECTOR)
            h = self._base[sector] = xxhash.xxh3_64_intdigest(data.ljust(SECTOR, b"\0"))
        return h

    def term(self, sector: int, h: int) -> int:
        if h == self.base(sector):
            return 0
        return xxhash.xxh3_128_intdigest(sector.to_bytes(8, "little") + h.to_bytes(8, "little"))

    def advance(self, durable: int) -> None:
        """Grow the durable map to the first ``durable`` writes (moments come in order)."""
        for w in range(self.durable_upto, durable):
            for sec, h in self.chunks(w):
                old = self.durable_map.get(sec)
                self.durable_sum += self.term(sec, h) - (self.term(sec, old) if old is not None else 0)
                self.durable_map[sec] = h
        self.durable_upto = max(self.durable_upto, durable)

    def key(self, subset: Sequence[int]) -> str:
        total = self.durable_sum
        overlay: dict[int, int] = {}
        for w in subset:
            for sec, h in self.chunks(w):
                old = overlay.get(sec, self.durable_map.get(sec))
                total += self.term(sec, h) - (self.term(sec, old) if old is not None else 0)
                overlay[sec] = h
        return format(total & _MASK, "032x")


def plan(records: Sequence[Record], log_path: str, base_path: str, seed: int = 0, max_states: int = 200,
         enumerate_limit: int = 16, draws_per_moment: int = 4) -> Plan:
    """The crash states to check for one log (see the module docstring), deduplicated by key.

    ``max_states`` caps the states planned (checked); ``enumerate_limit``: enumerate every
    subset of a pending set of ``p`` writes when ``2**p`` is at most this;
    ``draws_per_moment``: at least this many seeded random subsets are drawn per moment
    with more pending writes (more when the budget allows; repeats dropped). When every
    subset of every moment fits in ``max_states``, all are enumerated.
    """
    if max_states < 2:
        raise BlockLogError(f"max_states must be at least 2 (none and all), got {max_states}")
    ep = Epochs(records)
    rng = random.Random(seed)
    moments = list(range(ep.moments))
    half = max(1, max_states // 2)
    if len(moments) > half:
        # Too many moments for a none/all pair each: the first, the last, each one right
        # after a marker, and evenly spaced ones between them.
        must = sorted({0, ep.moments - 1} | {m for m in range(1, ep.moments) if ep.marks(m) != ep.marks(m - 1)})
        must = _spread(must, half)
        moments = sorted(set(must) | set(_spread(moments, half - len(must))))
    sizes = [len(ep.pending(m)) for m in moments]
    if sum(1 << min(p, 62) for p in sizes) <= max_states:
        enumerate_limit = max(enumerate_limit, 1 << max(sizes, default=0))  # it all fits: every subset
    big = sum(1 for p in sizes if (1 << min(p, 62)) > enumerate_limit)
    small = sum(1 << p for p in sizes if (1 << p) <= enumerate_limit)
    draws = max(draws_per_moment, -(-(max_states - small - 2 * big) // max(1, big)))
    firsts: list[tuple[int, tuple[int, ...], str]] = []
    extras: list[tuple[int, tuple[int, ...], str]] = []
    for m in moments:
        subs = _subsets_of(ep.pending(m), rng, draws, enumerate_limit)
        firsts += [(m, s, how) for s, how in subs if how in ("none", "all")]
        extras += [(m, s, how) for s, how in subs if how not in ("none", "all")]
    chosen = firsts + _pick(extras, max(0, max_states - len(firsts)), rng)
    chosen.sort(key=lambda t: (t[0], len(t[1]), t[1]))
    keys = _Keys(log_path, base_path, ep.writes)
    states: list[BlockState] = []
    seen: dict[str, None] = {}
    try:
        for m, subset, how in chosen:
            keys.advance(ep.durable(m))
            k = keys.key(subset)
            seen.setdefault(k)
            states.append(BlockState(m, ep.durable(m), subset, ep.marks(m), k, how))
    finally:
        keys.close()
    return Plan(states, len(ep.writes), ep.flushes, seed, max_states, ep.moments, len(moments), list(seen))


def _pick(items: list[Any], n: int, rng: random.Random) -> list[Any]:
    """``n`` of ``items`` drawn with ``rng``, in their order (all of them when fewer)."""
    if len(items) <= n:
        return items
    return [items[i] for i in sorted(rng.sample(range(len(items)), n))]


def _spread(items: list[int], n: int) -> list[int]:
    """``n`` evenly spaced of ``items``, the first and the last among them (all when fewer)."""
    if n <= 0:
        return []
    if len(items) <= n:
        return list(items)
    if n == 1:
        return [items[-1]]
    return sorted({items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)})


def state_at(records: Sequence[Record], moment: int, subset: Sequence[int]) -> BlockState:
    """The state ``(moment, subset)`` of a log, rebuilt without a plan (a failure's replay).

    Raises :class:`BlockLogError` when ``subset`` names a write that was not pending then.
    """
    ep = Epochs(records)
    if not 0 <= moment < ep.moments:
        raise BlockLogError(f"moment {moment} outside the log's 0..{ep.moments - 1}")
    pend = ep.pending(moment)
    bad = [w for w in subset if w not in pend]
    if bad:
        raise BlockLogError(f"writes {bad} were not pending at moment {moment} (pending: {list(pend)})")
    return BlockState(moment, pend.start, tuple(sorted(subset)), ep.marks(moment), "", "replay")


def materialize(state: BlockState, records: Sequence[Record], log_path: str, base_path: str, dest: str) -> str:
    """Write the state's image to ``dest`` (a new file): a sparse copy of the base, then the
    durable writes and the surviving pending ones applied in log order. Returns ``dest``."""
    writes = [r for r in records if r.is_write]
    sparse_copy(base_path, dest)
    fd = os.open(dest, os.O_WRONLY | os.O_NOFOLLOW)
    log = os.open(log_path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        for w in itertools.chain(range(state.durable), state.subset):
            r = writes[w]
            data = bytes(r.length) if r.kind == "zero" else os.pread(log, r.length, r.pos)
            if len(data) != r.length:
                raise BlockLogError(f"block log {log_path}: write {w} holds {len(data)} of {r.length} bytes")
            os.pwrite(fd, data, r.offset)
    finally:
        os.close(log)
        os.close(fd)
    return dest
