"""Optional probe for a user's own job: four calls that let every oracle see inside it.

    from chaos import probe
    probe.resumed(step)          # after loading a checkpoint (never called: started from scratch)
    probe.step(n, loss)          # each training step
    probe.saved(n)               # a save is acknowledged: durable, the job relies on it
    probe.state(obj)             # a fingerprint of any state (bytes, str, or anything repr()-able)

Outside ``chaos run -- COMMAND`` every call is a no-op (one environment lookup), so the
probe can stay in production code. It imports nothing beyond the standard library and
``chaos.phases`` (no torch). Inside the harness each call appends one JSON line to the
file named by ``CHAOS_PROBE_FILE`` and announces itself as the phase ``chaos.probe``,
which the in-rank I/O interposer writes into the rank's trace in order with its file
events: that order is how the judge knows which saves were acknowledged before a kill.
"""

from __future__ import annotations

import json
import os
import time

from chaos import phases

TYPE_CHECKING = False  # the job imports this as it starts: no ``typing`` (nor ``hashlib``) until needed
if TYPE_CHECKING:
    from typing import Any

PROBE_FILE_ENV = "CHAOS_PROBE_FILE"
PHASE = "chaos.probe"


def _emit(kind: str, **fields: Any) -> None:
    path = os.environ.get(PROBE_FILE_ENV)
    if not path:
        return
    rec = {"probe": kind, **fields, "pid": os.getpid(), "ts": time.monotonic()}
    line = (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    phases.phase(PHASE, kind=kind, **fields)


def step(n: int, loss: float | None = None) -> None:
    """Training step ``n`` ran (with its loss, if known)."""
    _emit("step", n=int(n), loss=None if loss is None else float(loss))


def saved(n: int) -> None:
    """The checkpoint of step ``n`` is acknowledged: a resume must not start before it."""
    _emit("saved", n=int(n))


def resumed(n: int) -> None:
    """The job resumed from the checkpoint of step ``n``."""
    _emit("resumed", n=int(n))


def state(obj: Any, name: str = "state") -> None:
    """Record a SHA-256 fingerprint of ``obj`` (bytes as is, str UTF-8, else its repr)."""
    if not os.environ.get(PROBE_FILE_ENV):
        return
    data = obj if isinstance(obj, bytes) else (obj if isinstance(obj, str) else repr(obj)).encode()
    import hashlib

    _emit("state", name=name, sha256=hashlib.sha256(data).hexdigest())


__all__ = ["PROBE_FILE_ENV", "resumed", "saved", "state", "step"]
