"""Every process the harness launched and has not reaped yet, and the one call that reaps them.

Each launcher's processes lead process groups of their own (a forked rank makes itself
one, a job's copy and a node's agent start a session), so one ``killpg`` takes a process
with whatever it started. A launcher tracks each (:func:`track`) from its start until
it reaped it itself (:func:`forget`); whatever an interrupt, a harness error or the
interpreter's exit (``atexit``) leaves tracked, :func:`kill_all` SIGKILLs:

* a rank forked by ``cluster`` (its scope: the scenario's scratch root): its group (the
  rank alone before it made its group), then SIGCONT; it is joined and forgotten;
* a job's copy (``job``) or a node's agent (``chaos.nemesis.nodes``), tracked ``marked``
  with its attempt's ``CHAOS_JOB_MARK`` as scope: its group, and every process carrying
  the mark (torchrun's workers start sessions of their own); the attempt that waits for
  it forgets it.

Not here: spares held at their gate (``spares.drop_all``, which ``job.kill_all`` adds),
the recovery pool's ranks (``recovery_pool``, its own ``atexit``) and rank containers
(``drivers.docker.DockerCluster.close``).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from typing import Any

from chaos.model.contract import ENV_MARK
from faults.process import alive, marked_with

_live: dict[int, tuple[Any, str | None, bool]] = {}  # pid -> (process, scope, marked): every one not yet reaped
_lock = threading.Lock()


def track(proc: Any, scope: str | None, marked: bool = False) -> None:
    """``proc`` (a ``multiprocessing.Process`` or a ``subprocess.Popen``) runs until forgotten."""
    with _lock:
        _live[proc.pid] = (proc, scope, marked)


def forget(*procs: Any) -> None:
    with _lock:
        for proc in procs:
            _live.pop(proc.pid, None)


def signal_rank(pid: int, sig: int) -> None:
    """Signal a rank's process group; before the rank has made its group, the rank alone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_rank(pid: int) -> None:
    """SIGKILL a rank's group, and SIGCONT it, so a stopped rank dies at once too."""
    signal_rank(pid, signal.SIGKILL)
    signal_rank(pid, signal.SIGCONT)


def killpg(pgid: int) -> None:
    """SIGKILL a session's group (a job's copy, a node's agent); one already gone is no error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_pids(pids: list[int]) -> list[int]:
    """SIGKILL each of ``pids`` and return them once none is alive (up to 5 s)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0  # a SIGKILL is delivered asynchronously: gone before we return
    while pids and any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return pids


def kill_marked(mark: str) -> list[int]:
    """SIGKILL every process whose ``CHAOS_JOB_MARK`` is ``mark``; returns them, gone."""
    return kill_pids(marked_with(ENV_MARK, mark))


def kill_all(scope: str | None = None) -> None:
    """SIGKILL everything tracked and reap it; with ``scope``, only what was tracked with it.

    The runner's clean-up passes its scenario's scratch root: in a pipelined campaign
    (``chaos.run.campaign.run_pipelined``) the next scenario's ranks are already running
    while this one is judged and cleaned up, and must not be taken down with it.
    """
    with _lock:
        items = [(pid, entry) for pid, entry in _live.items() if scope is None or entry[1] == scope]
    for pid, (proc, owner, marked) in items:
        if marked:
            killpg(pid)
            kill_marked(owner)  # type: ignore[arg-type]
        else:
            kill_rank(pid)
            proc.join(timeout=10)
            forget(proc)


atexit.register(kill_all)
