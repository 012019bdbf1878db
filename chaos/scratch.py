"""Scratch roots, and the clean-up after a harness that was killed before its own.

Whoever makes a scratch root removes it in a ``finally`` (its mounts unmounted and its
network namespaces torn down first), on an error and on Ctrl-C too. A harness that is
SIGKILLed (a CI job's hard timeout, the OOM killer) runs no ``finally``: its root stays,
a full-disk tmpfs stays mounted on it holding memory, a network lab's namespaces and
links stay, and a rank that left its process group may run on. So every harness
process keeps a *claim file* of what it made, one JSON line appended per root or lab,
named for the process (its pid namespace, pid and start time, so a reused pid is never
taken for it), its first line saying which host and boot it ran on::

    <tmp>/chaos-claims-<uid>/<pidns>-<pid>-<start>.jsonl     (CHAOS_CLAIMS_DIR overrides)

The first root a process makes sweeps the claims of processes that are gone: the
processes still marked with a claimed root are killed, its mounts unmounted and the
root removed, the lab's namespaces and links deleted, and one line on stderr says what
was removed and after which command. Roots made to be kept (``--keep``) keep their
files and mounts. A claim of another host (a TMPDIR shared between nodes) or another pid
namespace is never judged: its owner may be alive where this process cannot see it. A
process that ends normally removes its claim file (and the directory, once empty),
unless something it claimed is still there for the next sweep.

Who calls what: the runner, job exploration, trace recording, power-loss exploration,
``chaos certify``, the benches and the pytest plugin make their roots with
:func:`make_root`; ``environment`` and ``job.netcut`` call :func:`claim_netns` for each
network lab; the plugin's private ``dockerd`` is claimed with :func:`claim_cleanup` (the
sweep stops it with its own code); ``chaos clean`` (``commands/clean.py``) calls
:func:`sweep` and :func:`claims` on demand.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from faults.process import start_ticks

CLAIMS_ENV = "CHAOS_CLAIMS_DIR"
ROOT_PREFIX = "chaos-"  # every harness root's name starts so; nothing else is ever removed

_lock = threading.Lock()
_mine: dict[str, Any] = {"pid": None, "path": None, "swept_pid": None, "default_dir": None}


def claims_dir() -> str:
    """Where claim files live: ``$CHAOS_CLAIMS_DIR``, else ``<tmp>/chaos-claims-<uid>``.

    ``<tmp>`` is the temp directory this process had at its first call: ``chaos certify``
    points TMPDIR into its own scratch root meanwhile, and what it claims there must
    still be found if it is killed.
    """
    override = os.environ.get(CLAIMS_ENV)
    if override:
        return override
    with _lock:
        if _mine.get("default_dir") is None:
            _mine["default_dir"] = os.path.join(tempfile.gettempdir(), f"chaos-claims-{os.getuid()}")
        return _mine["default_dir"]


def _pid_ns() -> str:
    """This process's pid namespace inode (``pid:[4026531836]`` -> ``4026531836``), or "0"."""
    try:
        return os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]") or "0"
    except OSError:
        return "0"


def _host() -> str:
    return socket.gethostname()


def _boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), "" where there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _claim(entry: dict[str, Any]) -> None:
    """Append ``entry`` to this process's claim file (made, with its owner line, on first use)."""
    pid, directory = os.getpid(), claims_dir()
    with _lock:
        if _mine["pid"] != (pid, directory):  # first claim of this process (a forked child, a new $CHAOS_CLAIMS_DIR)
            path = os.path.join(directory, f"{_pid_ns()}-{pid}-{start_ticks(pid) or 0}.jsonl")
            owner = {"owner": {"pid": pid, "host": _host(), "boot": _boot_id(), "argv": sys.argv[:8],
                               "created": time.time()}}
            for last in (False, True):  # a releasing process may remove the empty directory meanwhile
                os.makedirs(directory, mode=0o700, exist_ok=True)
                try:
                    with open(path, "a") as f:
                        f.write(json.dumps(owner) + "\n")
                    break
                except FileNotFoundError:
                    if last:
                        raise
            _mine.update(pid=(pid, directory), path=path)
            atexit.register(_release, pid, path)
        with open(_mine["path"], "a") as f:
            f.write(json.dumps(entry) + "\n")


def make_root(prefix: str, base: str | None = None, *, keep: bool = False) -> str:
    """A new scratch directory ``<base>/<prefix>XXXXXXXX`` claimed by this process.

    ``prefix`` must start with ``chaos-``. The first call in a process sweeps what killed
    harnesses left (:func:`sweep`) before it makes its own root; ``keep``: the caller keeps
    the root afterwards, so a sweep never removes it.
    """
    if not prefix.startswith(ROOT_PREFIX):
        raise ValueError(f"scratch root prefix {prefix!r} must start with {ROOT_PREFIX!r}")
    sweep_once()
    root = os.path.abspath(tempfile.mkdtemp(prefix=prefix, dir=base))
    _claim({"root": root, "keep": bool(keep)})
    return root


def claim_netns(suffix: str) -> None:
    """Record network lab ``suffix`` (``faults.network.NetworkLab``) as this process's, before it is set up."""
    _claim({"netns": suffix})


def _chaos_callable(stop: str) -> bool:
    """Whether ``stop`` names a function of this package (``chaos.module:function``): nothing else is ever called."""
    return stop.startswith("chaos.") and ":" in stop


def claim_cleanup(root: str, stop: str) -> None:
    """Have a sweep call ``stop`` (``chaos.module:function``, given ``root``) before it removes ``root``.

    For what only its maker knows how to stop: the pytest plugin's private ``dockerd``
    (``chaos.drivers.engine:stop_engine_at``) runs detached and unmarked, and removing its
    root under it would leave it and its containers running.
    """
    if not _chaos_callable(stop):
        raise ValueError(f"clean-up {stop!r} must be a chaos.module:function")
    _claim({"cleanup": stop, "root": os.path.abspath(root)})


@dataclass
class Claim:
    """One claim file: whose, whether its owner still runs, and what it claimed."""

    path: str
    pid: int
    pid_ns: str
    start: int
    state: str  # "alive", "gone", "foreign" (another host or pid namespace: never judged; see _owner_state)
    argv: list[str] = field(default_factory=list)
    roots: list[tuple[str, bool]] = field(default_factory=list)  # (path, keep)
    netns: list[str] = field(default_factory=list)
    cleanups: list[tuple[str, str]] = field(default_factory=list)  # (chaos.module:function, root)


def _read(path: str) -> Claim | None:
    """The claim file at ``path``; None for a name that is not one, or one a live sweep holds.

    ``NAME.jsonl.sweeping-PID-START`` is a claim a sweep took: while that process runs
    it is its sweep's; once it is gone (killed mid-sweep) it is an ordinary gone claim.
    """
    name = os.path.basename(path)
    name, _, sweeper = name.partition(".sweeping-")
    if sweeper:
        spid, _, sstart = sweeper.partition("-")
        if not (spid.isdigit() and sstart.isdigit()) or start_ticks(int(spid)) == int(sstart):
            return None
    parts = name[: -len(".jsonl")].split("-") if name.endswith(".jsonl") else []
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    ns, pid, start = parts[0], int(parts[1]), int(parts[2])
    claim = Claim(path, pid, ns, start, "foreign")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    owner: dict[str, Any] | None = None
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a line torn by the kill that ended its owner
        if not isinstance(e, dict):
            continue
        if isinstance(e.get("owner"), dict):
            owner = e["owner"]
            claim.argv = [str(a) for a in owner.get("argv", [])]
        elif isinstance(e.get("cleanup"), str) and isinstance(e.get("root"), str):
            claim.cleanups.append((e["cleanup"], e["root"]))
        elif isinstance(e.get("root"), str):
            claim.roots.append((e["root"], bool(e.get("keep"))))
        elif isinstance(e.get("netns"), str):
            claim.netns.append(e["netns"])
    claim.state = _owner_state(owner, ns, pid, start)
    return claim


def _owner_state(owner: dict[str, Any] | None, ns: str, pid: int, start: int) -> str:
    """"alive", "gone" or "foreign" (never judged) for a claim's owner.

    Foreign: another host (a TMPDIR shared between nodes), another pid namespace, no
    owner line (torn by the kill) or no /proc to tell. Gone: this host booted since
    (every process of that boot is dead), or the pid is free or has another start time.
    """
    if owner is None or owner.get("host") != _host() or ns != _pid_ns() or ns == "0" or start == 0:
        return "foreign"
    if owner.get("boot") != _boot_id():
        return "gone"
    return "alive" if start_ticks(pid) == start else "gone"


def claims() -> list[Claim]:
    """Every claim file in :func:`claims_dir`, oldest owner first (``chaos clean`` lists them)."""
    directory = claims_dir()
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    out = [c for c in (_read(os.path.join(directory, n)) for n in names) if c is not None]
    return sorted(out, key=lambda c: (c.start, c.pid))


def own() -> Claim | None:
    """This process's claims so far, or None before its first (tests check its labs are gone)."""
    key = (os.getpid(), claims_dir())
    with _lock:
        mine = _mine["path"] if _mine["pid"] == key else None
    return _read(mine) if mine else None


@dataclass
class Swept:
    """What one sweep did (or, dry, would do) for one gone owner."""

    pid: int
    argv: list[str]
    removed: list[str] = field(default_factory=list)  # roots
    kept: list[str] = field(default_factory=list)  # roots made with keep
    unmounted: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)  # namespaces and links deleted
    stopped: list[str] = field(default_factory=list)  # clean-ups run: "module:function root"
    refused: list[str] = field(default_factory=list)  # claims that are not a harness root: left alone, said why

    @property
    def acted(self) -> bool:
        """Whether the sweep did (or, dry, would do) anything for this owner, or refused something."""
        return bool(self.removed or self.killed or self.netns or self.unmounted or self.refused or self.stopped)

    def line(self) -> str:
        what = self.argv[1:3] if len(self.argv) > 1 else self.argv
        cmd = " ".join([os.path.basename(self.argv[0]) if self.argv else "?", *what])
        parts = [f"{len(self.removed)} scratch root(s) removed"]
        for label, items in (("stopped", self.stopped), ("unmounted", self.unmounted), ("process(es) killed", self.killed),
                             ("network namespace(s)/link(s) deleted", self.netns), ("kept (--keep)", self.kept)):
            if items:
                parts.append(f"{len(items)} {label}")
        text = f"chaos: cleaned up after pid {self.pid} ({cmd}), which ended without its own clean-up: " + ", ".join(parts)
        if self.removed:
            text += f" ({', '.join(self.removed[:3])}{', ...' if len(self.removed) > 3 else ''})"
        for why in self.refused:
            text += f"; left alone: {why}"
        return text


def _refusal(root: str) -> str | None:
    """Why ``root`` is not something a sweep may remove (None: it may)."""
    if not os.path.isabs(root) or os.path.normpath(root) != root:
        return f"{root!r} is not a normalised absolute path"
    if not os.path.basename(root).startswith(ROOT_PREFIX):
        return f"{root} is not a harness scratch root (its name does not start with {ROOT_PREFIX!r})"
    if os.path.islink(root):
        return f"{root} is a symbolic link"
    return None


def _sweep_one(claim: Claim, dry_run: bool) -> Swept:
    from faults.disk import mounts_under, unmount_all
    from faults.process import marked_under, marks

    done = Swept(claim.pid, claim.argv)
    for stop, root in claim.cleanups:  # first: what runs detached under a root is stopped by its maker's code
        why = _refusal(root) or (None if _chaos_callable(stop) else f"clean-up {stop!r} is not chaos's")
        if why is not None:
            done.refused.append(why)
            continue
        if not dry_run:
            try:
                module, _, func = stop.partition(":")
                getattr(importlib.import_module(module), func)(root)
            except Exception as exc:  # noqa: BLE001 - said; the root is still removed below
                done.refused.append(f"{stop}({root}) failed: {type(exc).__name__}: {exc}")
                continue
        done.stopped.append(f"{stop} {root}")
    found = marks() if claim.roots else {}  # one pass over /proc for all of this owner's roots
    for root, keep in claim.roots:
        why = _refusal(root)
        if why is not None:
            done.refused.append(why)
            continue
        pids = marked_under(root, found)
        if not dry_run:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    continue
        done.killed += pids
        if keep:
            if os.path.isdir(root):
                done.kept.append(root)
            continue
        if not os.path.isdir(root):
            continue  # removed by its owner before it died
        mounts = mounts_under(root)
        if not dry_run:
            try:
                unmount_all(root)
            except OSError as exc:
                done.refused.append(f"{root}: unmount failed ({exc}); not removed")
                continue
            shutil.rmtree(root, ignore_errors=True)
        done.unmounted += mounts
        done.removed.append(root)
    for suffix in claim.netns:
        from faults.network import leftovers, remove_leftovers

        try:
            if dry_run:
                done.netns += leftovers(suffix)
                continue
            result = remove_leftovers(suffix)
        except Exception as exc:  # noqa: BLE001 - no iproute2, bad suffix: said, not raised
            done.refused.append(f"network lab {suffix!r}: {exc}")
            continue
        done.netns += result["removed"]
        done.refused += [f"network lab {suffix}: {e}" for e in result["errors"]]
    return done


def sweep(dry_run: bool = False) -> list[Swept]:
    """Clean up after every claiming process that is gone; what was done, per owner.

    Each gone owner's claim file is first renamed to one of this process's, so two
    harnesses starting at once never sweep the same one; it is removed when done
    (kept when ``dry_run``). Claims of live owners and of other pid namespaces are left.
    """
    out = []
    for claim in claims():
        if claim.state != "gone":
            continue
        if not dry_run:
            me = os.getpid()
            taken = f"{claim.path.partition('.sweeping-')[0]}.sweeping-{me}-{start_ticks(me) or 0}"
            try:
                os.rename(claim.path, taken)
            except FileNotFoundError:
                continue  # another sweep took it
        done = _sweep_one(claim, dry_run)
        if not dry_run:
            os.remove(taken)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(taken))  # empty now: _claim makes it again when needed
        out.append(done)
    return out


def sweep_once() -> None:
    """:func:`sweep` at most once per process, printing one line per owner cleaned up after."""
    with _lock:
        if _mine["swept_pid"] == os.getpid():
            return
        _mine["swept_pid"] = os.getpid()
    try:
        done = sweep()
    except OSError as exc:  # an unreadable claims directory must not stop the run
        print(f"chaos: could not sweep {claims_dir()}: {exc}", file=sys.stderr)
        return
    for d in done:
        if d.acted:
            print(d.line(), file=sys.stderr)


def _release(pid: int, path: str) -> None:
    """At a normal exit: drop this process's claim file unless something it claimed remains.

    A root not kept that still exists, or a lab with namespaces or links left, stays
    claimed for the next sweep. Registered by :func:`_claim`; a no-op in a forked child.
    """
    if os.getpid() != pid:
        return
    claim = _read(path)
    if claim is None:
        return
    if any(not keep and os.path.isdir(root) for root, keep in claim.roots):
        return
    if claim.netns:
        try:
            from faults.network import leftovers

            if any(leftovers(s) for s in claim.netns):
                return
        except Exception:  # noqa: BLE001 - cannot tell: leave it to the next sweep
            return
    try:
        os.remove(path)
        os.rmdir(os.path.dirname(path))  # the last claim gone: no empty directory left in TMPDIR
    except OSError:
        pass
