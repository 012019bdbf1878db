"""Spare interpreters: an attempt's copies started ahead of time, held at the boot path's gate.

A pure-Python job's attempt lasts a few tens of milliseconds, and most of that is the
interpreter starting (site, the venv's ``.pth`` hooks, the tracer's imports), which
involves nothing of the job. So while one attempt runs, ``explore.py`` asks
``launch.prestart`` for the copies of the attempt that will most likely come next (the
restart of the point in hand; the first attempt of the next point when points run one
at a time). They are started here with exactly the command line, working directory,
environment and log file the attempt will have, plus ``CHAOS_JOB_GATE``: two pipe fds.
The boot path (``boot/sitecustomize.py``) writes one byte on the first when the
interpreter is up and the tracer imported, then blocks on the second *before* it installs
the tracer or runs a line of the job; it takes the variable out of ``os.environ`` first,
so the job sees the environment a plain launch gives it.

``launch.run_attempt`` calls :func:`take` with the copies it would start: only an exact
match is used (every argument, variable and path equal), after every copy said it is
ready, and then the gate opens and the attempt's clock starts. Anything else — a plan
that changed, a spare that died or is not ready within ``READY_WAIT_S`` — is SIGKILLed
and the attempt starts its copies itself, as it always did; a spare that never hears
"go" reads end-of-file or is killed, and exits without running the job. Unused spares
are dropped with their run chain (:func:`drop`) and all at the end of an exploration or
on an interrupt (:func:`drop_all`, from ``launch.kill_all``).

Only where that cannot change what the job does: the command is a Python interpreter
(its own boot path is the gate: a shell script or a binary in front of it could act
before the gate), the harness launches the copies itself (not a torchrun COMMAND, whose
agent starts the workers), and no network namespace is made per run chain.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from chaos.model import contract as C

READY_WAIT_S = 30.0  # how long a taken spare may still take to reach its gate (a loaded machine)
_PYTHON = re.compile(r"python[0-9.]*")


@dataclass(frozen=True)
class Copy:
    """One process of an attempt as ``launch.run_attempt`` starts it."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # sorted items
    log: str
    cwd: str


@dataclass
class _Spare:
    copies: tuple[Copy, ...]
    port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    go: list[int] = field(default_factory=list)     # write ends: b"g" opens the gate
    ready: list[int] = field(default_factory=list)  # read ends: b"r" once at the gate


_spares: dict[tuple[str, int], _Spare] = {}  # (scratch, attempt) -> its spare
_lock = threading.Lock()


def is_python(argv0: str) -> bool:
    """Whether COMMAND starts a Python interpreter itself (``python``, ``python3.11``, a venv's)."""
    return bool(_PYTHON.fullmatch(os.path.basename(argv0)))


def start(scratch: str, attempt: int, copies: list[Copy], port: int) -> None:
    """Start ``copies`` held at the gate, for ``take(scratch, attempt, ...)`` to use later."""
    spare = _Spare(tuple(copies), port)
    try:
        for c in copies:
            go_r, go_w = os.pipe()
            ready_r, ready_w = os.pipe()
            spare.go.append(go_w)
            spare.ready.append(ready_r)
            env = dict(c.env)
            env[C.ENV_GATE] = f"{go_r},{ready_w}"
            try:
                with open(c.log, "wb") as fh:
                    spare.procs.append(subprocess.Popen(
                        list(c.argv), cwd=c.cwd, env=env, stdin=subprocess.DEVNULL, stdout=fh,
                        stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(go_r, ready_w)))
            finally:
                os.close(go_r)
                os.close(ready_w)
    except OSError:
        _discard(spare)  # no spare: the attempt starts its copies itself
        return
    with _lock:
        old = _spares.pop((scratch, attempt), None)
        _spares[(scratch, attempt)] = spare
    if old is not None:
        _discard(old)


def port_of(scratch: str, attempt: int) -> int | None:
    """The MASTER_PORT the waiting spare of this attempt was started with, if there is one."""
    with _lock:
        spare = _spares.get((scratch, attempt))
    return spare.port if spare is not None else None


def take(scratch: str, attempt: int, copies: list[Copy]) -> list[subprocess.Popen[bytes]] | None:
    """The spare's processes, gate open, when it was started with exactly ``copies``; else None."""
    with _lock:
        spare = _spares.pop((scratch, attempt), None)
    if spare is None:
        return None
    if spare.copies != tuple(copies):
        _discard(spare)
        return None
    deadline = time.monotonic() + READY_WAIT_S
    for fd in spare.ready:
        r, _w, _x = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not r or os.read(fd, 1) != b"r":  # not ready in time, or it died (end of file)
            _discard(spare)
            return None
    try:
        for fd in spare.go:
            os.write(fd, b"g")
    except OSError:
        _discard(spare)
        return None
    _close(spare)
    return spare.procs


def drop(scratch: str) -> None:
    """Every spare of one run chain (its folder ``scratch``) that was not used."""
    with _lock:
        keys = [k for k in _spares if k[0] == scratch]
        found = [_spares.pop(k) for k in keys]
    for spare in found:
        _discard(spare)


def drop_all() -> None:
    """Every spare not used (the exploration is over, or interrupted)."""
    with _lock:
        found = list(_spares.values())
        _spares.clear()
    for spare in found:
        _discard(spare)


def _close(spare: _Spare) -> None:
    for fd in (*spare.go, *spare.ready):
        try:
            os.close(fd)
        except OSError:
            pass
    spare.go.clear()
    spare.ready.clear()


def _discard(spare: _Spare) -> None:
    _close(spare)  # a spare still at its gate reads end of file and exits without running the job
    for p in spare.procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in spare.procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
