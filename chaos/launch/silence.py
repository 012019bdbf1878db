"""When a job's attempt stopped showing signs of life (``chaos run --hang-timeout S``).

Why: a job that deadlocks after a fault (a resume that waits forever on a lock file a killed
run left, a rank blocked in a collective whose partner is gone) would otherwise hold its
point until the attempt's ``--timeout`` (300 s by default), at every point where it hangs,
and be reported as merely slow. The built-in workload's launcher has judged "no rank made
progress for S s" as a hang since the start (``chaos.launch.cluster``); this gives a job the
same judgement from what the harness can see of any unmodified program.

A sign of life is progress the harness can see in any unmodified program: a line of output
(the copies' logs), a probe call (``probe-*.jsonl``), a checkpointer's phase, or a traced
file event that changed something (a write, an fsync, a rename, a file created or
truncated ...; ``trace-*.jsonl``, ``chaos.target.job.inproc``). A failed event or a
read-only open is no progress: a resume that polls a lock file with ``O_EXCL`` every 50 ms
traces an event each time, and is as stuck as one that sleeps. Only what was appended since
the last look is read, at most every :data:`POLL_S`, and a batch stops being parsed at its
first sign. A job that computes longer than S without any of these is hung by this
definition: choose S above its longest silent stretch (a first-step compile, a dataset
download, the load of a large checkpoint).

Called by ``chaos.launch.job.run_attempt`` and ``chaos.nemesis.nodes.run_attempt`` in their
wait loops, while no harness hold (a SIGTERM's grace, a network cut) is under way.
"""

from __future__ import annotations

import json
import os

POLL_S = 0.25  # how often the signs are looked at
READ_CAP = 1 << 22  # bytes of one trace file read at one look; the rest at the next


class Silence:
    """``hung(now)``: the seconds the attempt has been silent once they reach ``limit_s``, else None."""

    def __init__(self, limit_s: float, trace_dir: str, logs: list[str], now: float) -> None:
        self.limit_s = limit_s
        self.trace_dir = trace_dir
        self.logs = list(logs)
        self._last = now
        self._next = now + POLL_S
        self._read: dict[str, int] = {}   # trace file -> bytes read so far (up to its last whole line)
        self._sizes: dict[str, int] = {}  # log or probe file -> size at the last look
        self._progressed()

    def _progressed(self) -> bool:
        """Whether anything appended since the last look is a sign of life (see the module's docstring)."""
        moved = False
        names: list[str] = []
        try:
            with os.scandir(self.trace_dir) as it:
                names = [e.name for e in it]
        except OSError:
            pass
        for name in names:
            path = os.path.join(self.trace_dir, name)
            if name.startswith("trace-") and name.endswith(".jsonl"):
                moved = self._trace_moved(path) or moved
            elif name.startswith("probe-") and name.endswith(".jsonl"):
                moved = self._grew(path) or moved
        for log in self.logs:
            moved = self._grew(log) or moved
        return moved

    def _grew(self, path: str) -> bool:
        try:
            size = os.stat(path).st_size
        except OSError:
            return False
        before = self._sizes.get(path)
        self._sizes[path] = size
        return before is not None and size != before or before is None and size > 0

    def _trace_moved(self, path: str) -> bool:
        start = self._read.get(path, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(start)
                chunk = fh.read(READ_CAP)
        except OSError:
            return False
        whole = chunk[:chunk.rfind(b"\n") + 1]
        self._read[path] = start + len(whole)
        return any(_progress(line) for line in whole.splitlines())

    def hung(self, now: float) -> float | None:
        if now < self._next:
            return None
        self._next = now + POLL_S
        if self._progressed():
            self._last = now
            return None
        silent = now - self._last
        return silent if silent >= self.limit_s else None

    def resume(self, now: float) -> None:
        """A harness hold ended (its own stillness is not the job's): count silence from ``now``."""
        self._last = now


def _progress(line: bytes) -> bool:
    """A trace record that is progress: a phase, or an event that succeeded and changed something."""
    if b'"event":"phase"' in line:
        return True
    if b'"event":"op"' not in line or b'"error":' in line:
        return False
    try:
        rec = json.loads(line)
    except ValueError:
        return False
    if rec.get("op") == "open":
        return bool(rec.get("created") or rec.get("trunc"))
    return rec.get("op") != "close"


def describe(limit_s: float) -> str:
    """How an attempt stopped for silence reads in a verdict (``AttemptOutcome.describe``)."""
    return f"hung: no output, traced file event or probe call for {limit_s:g} s (--hang-timeout)"


__all__ = ["POLL_S", "Silence", "describe"]
