"""Crash the storage client under a save: where a FUSE mount's daemon dies, what is left.

Why: ``commit_atomicity`` kills the checkpointer and trusts the storage to keep POSIX
promises. A FUSE mount (s3fs, rclone, gcsfuse, JuiceFS ...) keeps them, or not, in a
user-space daemon: s3fs renames a directory by copying and deleting one object at a
time, and uploads a file on flush. Only a crash of that daemon in the middle of its own
work shows what a reader finds afterwards.

Who calls what: ``chaos.certify.battery.client_crash`` (the certify property) counts the
save's operations with :func:`count`, plans the crash points with :func:`plan`, and runs
each with :func:`run_point`, giving it how to judge the fresh mount and how to put the
backend back to "step 1 only". The mechanism (find the daemon, SIGKILL it, mount it
again) is :mod:`faults.fusemount`; the counting interposer is :mod:`chaos.certify.crash`.

A point is (operation, requests): the daemon dies before the checkpointer's operation
number ``op`` (``sends`` 0), or inside it, right after its ``sends``-th upstream request
since the operation began (counted by ``strace``: ``faults.fusemount.SendWatch``), or
after the save returned (``op`` one past the last: the save was acknowledged and must
survive).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.certify.crash import Counter, install, run_crashing
from faults.fusemount import FuseDaemon, SendWatch, alive, kill, remount


@dataclass(frozen=True)
class Op:
    """One mutating operation of the save, and the daemon's upstream traffic during it (unfaulted run)."""

    name: str
    sends: int  # what the kill counts: mutating requests (by_request) or sends
    requests: tuple[str, ...] = ()  # the mutating requests, "PUT /bucket/key", where readable

    def describe(self) -> str:
        if self.requests:
            return f"{self.name} ({self.sends} requests: {', '.join(r[:90] for r in self.requests[:8])})"
        return f"{self.name} ({self.sends} sends)"


@dataclass(frozen=True)
class Point:
    """Kill the daemon before operation ``op`` (1-based), or as its ``sends``-th upstream request in it leaves."""

    op: int
    sends: int = 0

    def describe(self, ops: list[Op]) -> str:
        if self.op > len(ops):
            return "after the save returned (acknowledged)"
        o = ops[self.op - 1]
        where = f"op {self.op} ({o.name})"
        if self.sends == 0:
            return f"before {where}"
        if o.requests and self.sends <= len(o.requests):
            return f"as request {self.sends} of {where} left: {o.requests[self.sends - 1][:120]}"
        return f"as upstream {'request' if o.requests else 'send'} {self.sends} since {where} began left"


@dataclass
class Outcome:
    """What one crash point did: whether the save was acknowledged, where the kill landed, what a fresh mount showed."""

    point: Point
    where: str
    acknowledged: bool
    result: str  # completed | failed | hung (chaos.certify.crash.run_crashing)
    fired: str
    listing: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"point": [self.point.op, self.point.sends], "where": self.where, "acknowledged": self.acknowledged,
                "result": self.result, "fired": self.fired, "listing": self.listing[:40],
                "violations": self.violations[:10], "seconds": round(self.seconds, 2)}


def _in_child(body: Callable[[Callable[[str], None]], None],
              hook: Callable[[int, str, Callable[[str], None]], None]) -> tuple[str, list[str], list[str]]:
    """Run ``body(mark)`` in a forked child whose mutating operations pass through ``hook(n, what, tick)``.

    Returns (result, operations, marks): the child's outcome (``run_crashing``), the
    operations it counted and the ``mark``s it left, in order.
    """
    holder: list[Counter] = []

    def patch(counter: Counter) -> None:
        install(counter)
        holder.append(counter)
        tick, seen = counter.tick, [0]

        def hooked(what: str) -> None:
            seen[0] += 1
            hook(seen[0], what, tick)

        counter.tick = hooked  # type: ignore[method-assign]

    result, lines = run_crashing(lambda: body(lambda m: holder[0].ops.append("@" + m)), None, patch=patch)
    return result, [x for x in lines if not x.startswith("@")], [x[1:] for x in lines if x.startswith("@")]


def count(daemon: FuseDaemon, save: Callable[[], None]) -> tuple[list[Op], bool]:
    """Run ``save`` once in a child, unfaulted: each mutating operation with the daemon's upstream traffic in it.

    Returns the operations and whether the kills count mutating HTTP requests (True:
    some were readable) or plain sends. An operation's traffic is what left from its
    start until the next operation started (or the save returned): what the mount did
    for it, which a kill inside aims at.
    """
    watch: list[SendWatch] = []

    def hook(n: int, what: str, tick: Callable[[str], None]) -> None:
        if not watch:
            watch.append(SendWatch(daemon).start())
        tick(f"{what}\t{time.time()!r}")

    def body(mark: Callable[[str], None]) -> None:
        try:
            save()
            mark(f"end {time.time()!r}")
        finally:
            for w in watch:
                w.stop()
                mark("sent " + " ".join(repr(t) for t in w.sent))
                for t, req in w.requests:
                    mark(f"request {t!r} {req}")

    result, lines, marks = _in_child(body, hook)
    ends = [m for m in marks if m.startswith("end ")]
    if result != "completed" or not ends:
        raise RuntimeError(f"the unfaulted save did not complete on the mount ({result}): {lines[-3:]}")
    sent = [float(t) for m in marks if m.startswith("sent ") for t in m.split()[1:]]
    requests = [(float(t), req) for m in marks if m.startswith("request ") for _, t, req in [m.split(" ", 2)]]
    starts = [(name, float(t)) for name, _, t in (line.rpartition("\t") for line in lines)]
    bounds = [t for _, t in starts[1:]] + [float(ends[0].split()[1])]
    ops = []
    for (name, t), bound in zip(starts, bounds, strict=True):
        reqs = tuple(r for x, r in requests if t <= x < bound)
        ops.append(Op(name, len(reqs), reqs) if requests else Op(name, sum(1 for x in sent if t <= x < bound)))
    return ops, bool(requests)


def plan(ops: list[Op], max_points: int) -> list[Point]:
    """The crash points: at the requests inside operations, before operations, after the save.

    Inside: up to two thirds of the budget go to the operations during which the daemon
    sent mutating requests (a rename that copies and deletes objects, an upload at fsync
    or close): every request where they fit, else shared in proportion to each
    operation's requests, spread evenly over them; these are the states only a client
    crash reaches. Then before each operation, evenly thinned to the rest of the budget,
    and always once after the save returned.
    """
    busy = [(i, o.sends) for i, o in enumerate(ops) if o.sends > 0]
    total = sum(n for _, n in busy) or 1
    share = max(1, 2 * (max_points - 1) // 3)
    inside: list[Point] = []
    for i, n in busy:
        k = n if total <= share else max(1, min(n, round(share * n / total)))
        inside += [Point(i + 1, s) for s in sorted({1 + round(j * (n - 1) / max(1, k - 1)) for j in range(k)})]
    inside = inside[:share]
    before = [Point(i + 1) for i in range(len(ops))]
    room = max(1, max_points - 1 - len(inside))
    if len(before) > room:
        before = [before[round(k * (len(before) - 1) / max(1, room - 1))] for k in range(room)]
    return sorted(set(inside + before), key=lambda p: (p.op, p.sends)) + [Point(len(ops) + 1)]


def run_point(daemon: FuseDaemon, save: Callable[[], None], point: Point, ops: list[Op], by_request: bool,
              judge: Callable[[bool], list[str]], listing: Callable[[], list[str]],
              reset: Callable[[], None], remount_cmd: list[str] | None = None) -> tuple[Outcome, FuseDaemon]:
    """Crash the daemon at ``point`` during ``save``, mount again, judge, reset; returns the daemon now serving.

    ``judge(acknowledged)`` returns the violations a fresh reader sees on the new mount;
    ``listing()`` what the checkpoint directory holds (observed before judging, which may
    clean); ``reset()`` puts the backend back to "step 1 only" for the next point.
    """
    t = time.perf_counter()
    watch: list[SendWatch] = []
    before: list[str] = []

    def hook(n: int, what: str, tick: Callable[[str], None]) -> None:
        if not watch:  # observed from the first operation on, as count() observed it
            watch.append(SendWatch(daemon).start())
        tick(f"{what}\t{time.time()!r}")
        if n == point.op:
            if point.sends == 0:
                kill(daemon)
                before.append(f"{time.time()!r} before the operation")
            else:
                watch[0].arm(point.sends, by_request)

    def body(mark: Callable[[str], None]) -> None:
        try:
            save()
        finally:
            for w in watch:
                w.stop()
                if w.fired_at is not None:
                    what = f"request {w.fired_request}" if w.fired_request else f"send {w.fired_at}"
                    mark(f"killed {w.fired_time!r} as {what} left")
            for b in before:
                mark(f"killed {b}")
        mark("acknowledged")
        if point.op > len(ops) or (point.sends and watch[0].fired_at is None):
            kill(daemon)
            mark(f"killed {time.time()!r} after the save returned")

    result, lines, marks = _in_child(body, hook)
    acknowledged = "acknowledged" in marks
    fired = _landed(lines, marks)
    if alive(daemon.pid):  # the save failed before the watch fired: crash it now
        kill(daemon)
        fired = fired or "after the save failed, before the planned point"
    fresh = remount(daemon, remount_cmd)
    seen = listing()
    outcome = Outcome(point, point.describe(ops), acknowledged, result, fired, seen)
    outcome.violations = judge(acknowledged)
    reset()
    outcome.seconds = time.perf_counter() - t
    return outcome, fresh


def _landed(lines: list[str], marks: list[str]) -> str:
    """Where the kill really landed: which operation had begun last when it fired (``killed STAMP WHY``)."""
    killed = next((m.split(" ", 2) for m in marks if m.startswith("killed ")), None)
    if killed is None:
        return ""
    at, why = float(killed[1]), killed[2]
    begun = [(i + 1, name) for i, (name, _, t) in enumerate(line.rpartition("\t") for line in lines) if float(t) <= at]
    if not begun or "after the save returned" in why:
        return why
    n, name = begun[-1]
    return f"{why}, in op {n} ({name})"
