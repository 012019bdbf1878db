"""Signals to rank process groups, and reaping that leaves nothing alive.

Each rank runs in its own process group (session), so one ``killpg`` reaches the
rank and anything it started (data-loader workers, an async-save process). Every
function returns a plain dict for the run record, e.g.::

    {"action": "terminate", "pgid": 4242, "signal": "SIGTERM", "grace_s": 2.0,
     "escalated": true, "members_before": [4242, 4250], "survivors": []}

A zombie counts as dead: it runs no code and holds no files; ``alive`` reads the
state letter from ``/proc/PID/stat`` rather than trusting ``kill(pid, 0)``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def _state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (R, S, D, T, Z, ...), or None if gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def state_and_session(pid: int | str) -> tuple[str, int] | None:
    """``pid``'s state letter and session id (field 6 of /proc/PID/stat), None if gone. Read by
    ``chaos.nemesis.stop.frozen``: whether anything of a job's attempt can still run."""
    fields = _stat_fields(pid)
    try:
        return (fields[0], int(fields[3])) if fields else None
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int | str) -> int | None:
    """``pid``'s start time in clock ticks after boot (field 22 of /proc/PID/stat), None if gone.

    With the pid it names one process for good: a reused pid has another start time
    (``chaos.scratch`` tells a claim's owner from a newcomer by it).
    """
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    s = _state(pid)
    return s is not None and s not in ("Z", "X")


def read_pidfile(path: str | os.PathLike[str]) -> int | None:
    """The live process a daemon's pidfile names, or None (no file, not a positive number, gone).

    Opened without following a link or blocking on a FIFO, and read to 32 bytes: a pidfile
    outlives its daemon and may be anyone's by then. Whose process it is, the caller checks
    (``PrivateSlurm.pids``: the daemon's name and uid 0; ``PrivateEngine.pid``: its command line).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            pid = int(os.read(fd, 32).strip())
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and alive(pid) else None


def state(pid: int) -> str | None:
    """Public form of the /proc state letter ("T" after SIGSTOP, None when gone)."""
    return _state(pid)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid``, from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields and len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(name))
    return sorted(out)


def _environs() -> Iterator[tuple[int, list[bytes]]]:
    """``(pid, NAME=VALUE items)`` of every process but this one whose environment is readable."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                yield int(entry), f.read().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read


def marked_with(name: str, value: str) -> list[int]:
    """Live pids whose environment has ``name=value`` (inherited by every descendant, even
    one that left its parent's process group or session), from /proc."""
    want = f"{name}={value}".encode()
    return sorted(pid for pid, env in _environs() if want in env and alive(pid))


# The environment variables the harness marks the processes of a scratch root with, each
# holding a path that starts with that root: a scenario's ranks and their children
# (CHAOS_SCENARIO), a job attempt's processes (CHAOS_JOB_MARK), a node's agent and workers
# (CHAOS_JOB_NODE), a helper daemon serving a mount under the root (CHAOS_DAEMON: the block
# log's FUSE file system). Nothing else counts as a mark: CHAOS_CLAIMS_DIR, CHAOS_CACHE_DIR
# or a user's own CHAOS_* setting never make a process a target of the sweep.
MARK_VARS = ("CHAOS_SCENARIO", "CHAOS_JOB_MARK", "CHAOS_JOB_NODE", "CHAOS_DAEMON")
DAEMON_MARK = "CHAOS_DAEMON"


def uids(pid: int | str) -> tuple[int, int] | None:
    """``pid``'s real and effective uid (from /proc/PID/status), None if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    real, effective = line.split()[1:3]
                    return int(real), int(effective)
    except (OSError, ValueError, IndexError):
        return None
    return None


def marks(names: tuple[str, ...] = MARK_VARS) -> dict[int, list[bytes]]:
    """Every live pid (but this one) with the values of its mark variables ``names``,
    from /proc in one pass (for :func:`marked_under` over many roots)."""
    want = {n.encode() for n in names}
    found: dict[int, list[bytes]] = {}
    for pid, env in _environs():
        values = [v for name, eq, v in (item.partition(b"=") for item in env) if eq and name in want]
        if values and alive(pid):
            found[pid] = values
    return found


def marked_under(prefix: str, found: dict[int, list[bytes]] | None = None) -> list[int]:
    """Live pids with a mark variable (:data:`MARK_VARS`) whose value is the path ``prefix``
    or lies under it (``prefix/...`` or ``prefix#...``); ``found``: a :func:`marks` pass to reuse.

    What the harness marks every process of a scratch root with (a scenario's root, a
    job point's scratch and attempt) all start with that root, so this finds what a
    harness killed before its clean-up left running, whatever its process group.
    """
    root = os.fsencode(prefix).rstrip(b"/")
    n = len(root)

    def under(v: bytes) -> bool:
        return v == root or (v.startswith(root) and v[n:n + 1] in (b"/", b"#"))

    found = marks() if found is None else found
    return sorted(pid for pid, values in found.items() if any(under(v) for v in values))


def signal_group(pgid: int, sig: int | signal.Signals) -> dict[str, Any]:
    """Send ``sig`` to every process of group ``pgid``; an empty group is not an error."""
    members = group_members(pgid)
    sent = True
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        sent = False
    try:
        name = signal.Signals(sig).name
    except ValueError:  # 0 probes existence only
        name = str(int(sig))
    return {"action": "signal", "pgid": pgid, "signal": name,
            "members_before": members, "delivered": sent, "ts": time.time()}


def kill_group(pgid: int) -> dict[str, Any]:
    """SIGKILL the group: the rank dies between two instructions, no handler runs."""
    rec = signal_group(pgid, signal.SIGKILL)
    rec["action"] = "kill"
    return rec


def stop_group(pgid: int) -> dict[str, Any]:
    """SIGSTOP the group: the rank freezes (a hung peer: collectives time out)."""
    rec = signal_group(pgid, signal.SIGSTOP)
    rec["action"] = "stop"
    return rec


def cont_group(pgid: int) -> dict[str, Any]:
    """SIGCONT the group: a stopped rank resumes where it froze."""
    rec = signal_group(pgid, signal.SIGCONT)
    rec["action"] = "cont"
    return rec


def wait_gone(pgid: int, timeout: float, poll: float = 0.02) -> list[int]:
    """Poll until no live member of ``pgid`` remains; return the survivors at timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = group_members(pgid)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll)


def terminate_group(pgid: int, grace_s: float = 5.0) -> dict[str, Any]:
    """SIGTERM (and SIGCONT, so a stopped rank can act on it), wait ``grace_s``, then
    SIGKILL whatever is left. A preemption notice followed by the hard kill."""
    rec = signal_group(pgid, signal.SIGTERM)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)
    left = wait_gone(pgid, grace_s)
    escalated = bool(left)
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        left = wait_gone(pgid, 5.0)
    rec.update(action="terminate", grace_s=grace_s, escalated=escalated, survivors=left)
    return rec


def reap_group(pgid: int, timeout: float = 10.0) -> dict[str, Any]:
    """Guarantee nothing of group ``pgid`` survives: SIGKILL it (repeatedly, in case
    members fork while dying) and wait until /proc shows no live member. Raises
    :class:`faults.FaultError` if any survive ``timeout``.

    Exit statuses are left for their owner to collect (``Popen.wait``): a dead child
    is a zombie until then, and zombies count as gone."""
    from faults import FaultError

    members = group_members(pgid)
    deadline = time.monotonic() + timeout
    left = members
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        left = wait_gone(pgid, min(0.5, max(0.0, deadline - time.monotonic())))
        if not left or time.monotonic() >= deadline:
            break
    if left:
        raise FaultError(f"process group {pgid} survived SIGKILL for {timeout}s: {left} "
                         f"(states {[state(p) for p in left]})")
    return {"action": "reap", "pgid": pgid, "members_before": members, "survivors": []}


__all__ = ["alive", "cont_group", "group_members", "kill_group", "reap_group", "signal_group",
           "state", "stop_group", "terminate_group", "wait_gone"]
