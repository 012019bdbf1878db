"""Scratch roots, and the clean-up after a harness that was killed before its own.

Whoever makes a scratch root removes it in a ``finally`` (its mounts unmounted and its
network namespaces torn down first), on an error and on Ctrl-C too. A harness that is
SIGKILLed (a CI job's hard timeout, the OOM killer) runs no ``finally``: its root stays,
a full-disk tmpfs stays mounted on it holding memory, a network lab's namespaces and
links stay, and a rank that left its process group may run on. So every harness
process keeps a *claim file* of what it made, one JSON line appended per root or lab,
named for the process (its pid namespace, pid and start time, so a reused pid is never
taken for it), its first line saying which host and boot it ran on::

    /run/chaos-claims-0/<pidns>-<pid>-<start>.jsonl            (root)
    $XDG_RUNTIME_DIR/chaos-claims/...  or  <tmp>/chaos-claims-<uid>/...   (other users)
    $CHAOS_CLAIMS_DIR/...                                       (override)

The first root a process makes sweeps the claims of processes that are gone: the
processes still marked with a claimed root are killed, its mounts unmounted and the
root removed, the lab's namespaces and links deleted, and one line on stderr says what
was removed and after which command. Roots made to be kept (``--keep``) keep their
files and mounts. A claim of another host (a TMPDIR shared between nodes) or another pid
namespace is never judged: its owner may be alive where this process cannot see it. A
process that ends normally removes its claim file, unless something it claimed is still
there for the next sweep.

The sweep often runs as root on machines other users share, so nothing it reads is
taken on trust (see SECURITY.md):

- the claims directory must be a directory of this uid that nobody else can write,
  reached without a link (``chaos.trustedpath``); otherwise it is refused with one line
  and never used (root's default lies under ``/run``, where other users cannot create it);
- a claim file must be a regular file of this uid; anything else there is left alone;
- a clean-up is a name in :data:`CLEANUPS`, never a dotted path read from a file;
- a root is acted on only when its parent is a trusted path, walked without following
  links, and the directory there is the very one the claim recorded (device, inode,
  owner); mounts are unmounted only where ``/proc/self/mountinfo`` lists them under it,
  and it is removed relative to its parent's descriptor;
- a process is killed only when a mark variable (``faults.process.MARK_VARS``) names the
  root or a path below it, it runs as this uid, and it started after the root was claimed.

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
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from chaos import trustedpath
from chaos.errors import ConfigError
from faults.process import start_ticks

CLAIMS_ENV = "CHAOS_CLAIMS_DIR"
ROOT_PREFIX = "chaos-"  # every harness root's name starts so; nothing else is ever removed
MAX_CLAIM_BYTES = 1 << 20  # a few lines per root or lab; a bigger file is not a claim of ours

# The only clean-ups a sweep ever calls, by the name a claim records: what stops something
# that runs detached under a root (given that root), as ``module:function`` of this package.
CLEANUPS: dict[str, str] = {"dockerd": "chaos.launch.drivers.engine:stop_engine_at",
                             "slurm": "chaos.launch.slurmcluster:stop_cluster_at"}

_lock = threading.RLock()  # _claim holds it while claims_dir() takes it again
_mine: dict[str, Any] = {"pid": None, "path": None, "swept_pid": None, "default_dir": None, "said": set()}


def cache_root() -> str:
    """The user's chaos cache: ``$CHAOS_CACHE_DIR``, else ``$XDG_CACHE_HOME/chaos`` (``~/.cache/chaos``).

    Below it ``chaos.record.golden`` keeps fault-free runs (``golden/``) and ``chaos.launch.job``
    the native tracer's compiled library (``native/``, checked before each use by ``faults.shim``).
    """
    return os.environ.get("CHAOS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "chaos")


class UnsafeClaims(ConfigError):
    """The claims directory could be another user's (or is missing its parent): never used."""


def _root_run_dir_ok() -> bool:
    """Whether ``/run`` is root's own (other users cannot create a claims directory in it)."""
    try:
        os.close(trustedpath.open_dir("/run", uid=0, private=True))
        return True
    except (OSError, trustedpath.Untrusted):
        return False


def claims_dir() -> str:
    """Where claim files live: ``$CHAOS_CLAIMS_DIR``, else this user's private default.

    Root: ``/run/chaos-claims-0`` (only root can create it). Others: ``$XDG_RUNTIME_DIR/
    chaos-claims`` (the user's own runtime directory), else ``<tmp>/chaos-claims-<uid>``,
    where another user may have made it first: it is then refused, never used. ``<tmp>``
    is the temp directory this process had at its first call: ``chaos certify`` points
    TMPDIR into its own scratch root meanwhile, and what it claims there must still be
    found if it is killed.
    """
    override = os.environ.get(CLAIMS_ENV)
    if override:
        return override
    with _lock:
        if _mine.get("default_dir") is None:
            uid = os.geteuid()
            runtime = os.environ.get("XDG_RUNTIME_DIR", "")
            if uid == 0 and _root_run_dir_ok():
                _mine["default_dir"] = "/run/chaos-claims-0"
            elif uid != 0 and os.path.isabs(runtime) and os.path.isdir(runtime):
                _mine["default_dir"] = os.path.join(runtime, "chaos-claims")
            else:
                _mine["default_dir"] = os.path.join(os.path.realpath(tempfile.gettempdir()), f"chaos-claims-{uid}")
        return _mine["default_dir"]


def _open_claims(create: bool) -> int:
    """A descriptor of the claims directory, made (0700) if ``create``; checked private.

    Raises :class:`UnsafeClaims` with one line when it is not a directory of this uid that
    nobody else can write, reached without a link; ``FileNotFoundError`` when missing.
    """
    directory = claims_dir()
    path = os.path.abspath(directory)
    try:
        if create:
            trustedpath.private_dir(path)
        return trustedpath.open_dir(path, private=True)
    except trustedpath.Untrusted as exc:
        raise UnsafeClaims(f"refusing the claims directory {directory}: {exc}") from None
    except FileNotFoundError:
        if create:
            raise UnsafeClaims(f"cannot make the claims directory {directory}: its parent is missing") from None
        raise


def _say_once(message: str) -> None:
    """Print ``message`` on stderr once per process (a refused directory, every root made)."""
    with _lock:
        if message in _mine["said"]:
            return
        _mine["said"].add(message)
    print(f"chaos: {message}", file=sys.stderr)


def _unclaimed(exc: Exception) -> str:
    """The one line a process says when it can neither sweep nor claim."""
    return f"{exc}; nothing swept, and this run's scratch roots are not claimed (if it is killed, they stay)"


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


def now_ticks() -> int:
    """Clock ticks since boot now, on the clock of ``/proc/PID/stat``'s start time (0: unknown).

    A root's claim records it: a process that started before it cannot be one of the
    root's (so a sweep never kills it, whatever its environment says). One tick of slack
    for the rounding of ``/proc/uptime``.
    """
    try:
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(int(up * os.sysconf("SC_CLK_TCK")) - 1, 0)
    except (OSError, ValueError, IndexError):
        return 0


_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _append(dir_fd: int, name: str, doc: dict[str, Any]) -> None:
    """Append ``doc`` as one JSON line to claim file ``name`` (made 0600) of the claims directory."""
    fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise UnsafeClaims(f"claim file {name} in {claims_dir()} is not a regular file of this user")
        os.write(fd, (json.dumps(doc) + "\n").encode())
    finally:
        os.close(fd)


def _claim(entry: dict[str, Any]) -> None:
    """Append ``entry`` to this process's claim file (made, with its owner line, on first use).

    A refused claims directory is said once on stderr and nothing is claimed: the run goes
    on, and only a SIGKILL of it would leave its roots for ``chaos clean`` to miss.
    """
    pid, directory = os.getpid(), claims_dir()
    refused = ""
    with _lock:
        try:
            dir_fd = _open_claims(create=True)
        except (UnsafeClaims, OSError) as exc:
            refused = _unclaimed(exc)
        else:
            try:
                if _mine["pid"] != (pid, directory):  # first claim of this process (a forked child, a new $CHAOS_CLAIMS_DIR)
                    name = f"{_pid_ns()}-{pid}-{start_ticks(pid) or 0}.jsonl"
                    owner = {"owner": {"pid": pid, "uid": os.geteuid(), "host": _host(), "boot": _boot_id(),
                                       "argv": sys.argv[:8], "created": time.time()}}
                    _append(dir_fd, name, owner)
                    _mine.update(pid=(pid, directory), path=os.path.join(directory, name))
                    atexit.register(_release, pid, name)
                _append(dir_fd, os.path.basename(_mine["path"]), entry)
            finally:
                os.close(dir_fd)
    if refused:
        _say_once(refused)


def _trusted_base(base: str | None) -> str:
    """The canonical parent for a new root; a ConfigError when another user could redirect it.

    The user's own links in the path they gave are resolved once, here; what the resolved
    path crosses must then be root's or this user's (``chaos.trustedpath``), or the run
    would make, write and later remove its root where someone else decides.
    """
    parent = os.path.realpath(base if base is not None else tempfile.gettempdir())
    try:
        os.close(trustedpath.open_dir(parent, own_last=False))
    except trustedpath.Untrusted as exc:
        raise ConfigError(f"scratch directory {base or parent} is not safe to work in: {exc}") from None
    except FileNotFoundError:
        raise ConfigError(f"scratch directory {base or parent} does not exist") from None
    return parent


def make_root(prefix: str, base: str | None = None, *, keep: bool = False) -> str:
    """A new scratch directory ``<base>/<prefix>XXXXXXXX`` claimed by this process.

    ``prefix`` must start with ``chaos-``; ``base`` (default: the temp directory) must be a
    trusted path (:func:`_trusted_base`). The first call in a process sweeps what killed
    harnesses left (:func:`sweep`) before it makes its own root; ``keep``: the caller keeps
    the root afterwards, so a sweep never removes it. The claim records the directory's
    device and inode and the time it was made: a sweep acts on that directory only.
    """
    if not prefix.startswith(ROOT_PREFIX) or "/" in prefix:
        raise ValueError(f"scratch root prefix {prefix!r} must start with {ROOT_PREFIX!r} and name one directory")
    parent = _trusted_base(base)
    sweep_once()
    since = now_ticks()
    root = tempfile.mkdtemp(prefix=prefix, dir=parent)
    st = os.lstat(root)
    _claim({"root": root, "keep": bool(keep), "dev": st.st_dev, "ino": st.st_ino, "since": since})
    return root


def claim_netns(suffix: str) -> None:
    """Record network lab ``suffix`` (``faults.network.NetworkLab``) as this process's, before it is set up."""
    _claim({"netns": suffix})


def claim_cleanup(root: str, name: str) -> None:
    """Have a sweep run clean-up ``name`` (a key of :data:`CLEANUPS`) on ``root`` before removing it.

    For what only its maker knows how to stop: the pytest plugin's private ``dockerd``
    (``"dockerd"``) runs detached and unmarked, and removing its root under it would leave
    it and its containers running. ``root`` must be a root this process made with
    :func:`make_root`: the sweep runs the clean-up only on a root it has verified.
    """
    if name not in CLEANUPS:
        raise ValueError(f"clean-up {name!r} is not one of the registered clean-ups {sorted(CLEANUPS)}")
    _claim({"cleanup": name, "root": os.path.abspath(root)})


@dataclass
class Root:
    """One claimed root: where, whether kept, and which directory it was when made."""

    path: str
    keep: bool = False
    dev: int | None = None
    ino: int | None = None
    since: int | None = None  # clock ticks since boot when it was made (see now_ticks)


@dataclass
class Claim:
    """One claim file: whose, whether its owner still runs, and what it claimed."""

    path: str
    pid: int
    pid_ns: str
    start: int
    # "alive", "gone", "foreign" (another host or pid namespace: never judged; see _owner_state),
    # or "untrusted" (not a regular file of this user: never read, ``why`` says why)
    state: str
    argv: list[str] = field(default_factory=list)
    roots: list[Root] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    cleanups: list[tuple[str, str]] = field(default_factory=list)  # (name in CLEANUPS, root)
    why: str = ""


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _read(dir_fd: int, name: str) -> Claim | None:
    """The claim file ``name`` of the claims directory; None for a name that is not one, or
    one a live sweep holds.

    ``NAME.jsonl.sweeping-PID-START`` is a claim a sweep took: while that process runs
    it is its sweep's; once it is gone (killed mid-sweep) it is an ordinary gone claim.
    A file that is not a regular file of this user (a link, a FIFO, another owner's) is
    returned as ``untrusted`` and never read.
    """
    base, _, sweeper = name.partition(".sweeping-")
    if sweeper:
        spid, _, sstart = sweeper.partition("-")
        if not (spid.isdigit() and sstart.isdigit()) or start_ticks(int(spid)) == int(sstart):
            return None
    parts = base[: -len(".jsonl")].split("-") if base.endswith(".jsonl") else []
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    ns, pid, start = parts[0], int(parts[1]), int(parts[2])
    path = os.path.join(claims_dir(), name)
    claim = Claim(path, pid, ns, start, "untrusted")
    try:
        fd = os.open(name, os.O_RDONLY | _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        claim.why = f"claim file {path} cannot be opened without following a link ({exc.strerror})"
        return claim
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            claim.why = f"claim file {path} is not a regular file"
            return claim
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            claim.why = f"claim file {path} belongs to uid {st.st_uid} or is writable by others"
            return claim
        if st.st_size > MAX_CLAIM_BYTES:
            claim.why = f"claim file {path} holds {st.st_size} bytes, more than a claim ever does"
            return claim
        raw = os.read(fd, MAX_CLAIM_BYTES + 1)
    finally:
        os.close(fd)
    owner: dict[str, Any] | None = None
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            e = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a line torn by the kill that ended its owner
        if not isinstance(e, dict):
            continue
        if isinstance(e.get("owner"), dict):
            owner = e["owner"]
            argv = owner.get("argv")
            claim.argv = [str(a) for a in argv] if isinstance(argv, list) else []
        elif isinstance(e.get("cleanup"), str) and isinstance(e.get("root"), str):
            claim.cleanups.append((e["cleanup"], e["root"]))
        elif isinstance(e.get("root"), str):
            claim.roots.append(Root(e["root"], bool(e.get("keep")), _int_or_none(e.get("dev")),
                                    _int_or_none(e.get("ino")), _int_or_none(e.get("since"))))
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
    """Every claim file in :func:`claims_dir`, oldest owner first (``chaos clean`` lists them).

    Raises :class:`UnsafeClaims` when the directory is not private to this user.
    """
    try:
        dir_fd = _open_claims(create=False)
    except FileNotFoundError:
        return []
    try:
        out = [c for c in (_read(dir_fd, n) for n in sorted(os.listdir(dir_fd))) if c is not None]
    finally:
        os.close(dir_fd)
    return sorted(out, key=lambda c: (c.start, c.pid))


def own() -> Claim | None:
    """This process's claims so far, or None before its first (tests check its labs are gone)."""
    key = (os.getpid(), claims_dir())
    with _lock:
        mine = _mine["path"] if _mine["pid"] == key else None
    if not mine:
        return None
    with contextlib.closing(_ClaimsFd()) as d:
        return _read(d.fd, os.path.basename(mine)) if d.fd is not None else None


class _ClaimsFd:
    """The claims directory's descriptor, or None where it is missing or refused."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = _open_claims(create=False)
        except (UnsafeClaims, OSError):
            self.fd = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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
    stopped: list[str] = field(default_factory=list)  # clean-ups run: "name root"
    detached: list[str] = field(default_factory=list)  # loop devices whose image lay under a root
    refused: list[str] = field(default_factory=list)  # claims that are not a harness root: left alone, said why

    @property
    def acted(self) -> bool:
        """Whether the sweep did (or, dry, would do) anything for this owner, or refused something."""
        return bool(self.removed or self.killed or self.netns or self.unmounted or self.refused or self.stopped
                    or self.detached)

    def line(self) -> str:
        what = self.argv[1:3] if len(self.argv) > 1 else self.argv
        cmd = " ".join([os.path.basename(self.argv[0]) if self.argv else "?", *what])
        parts = [f"{len(self.removed)} scratch root(s) removed"]
        for label, items in (("stopped", self.stopped), ("unmounted", self.unmounted),
                             ("loop device(s) detached", self.detached), ("process(es) killed", self.killed),
                             ("network namespace(s)/link(s) deleted", self.netns), ("kept (--keep)", self.kept)):
            if items:
                parts.append(f"{len(items)} {label}")
        text = f"chaos: cleaned up after pid {self.pid} ({cmd}), which ended without its own clean-up: " + ", ".join(parts)
        if self.removed:
            text += f" ({', '.join(self.removed[:3])}{', ...' if len(self.removed) > 3 else ''})"
        for why in self.refused:
            text += f"; left alone: {why}"
        return printable(text)


def printable(text: str) -> str:
    """``text`` with control characters shown escaped (paths and argv come from files)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _refusal(root: str) -> str | None:
    """Why ``root`` is not something a sweep may remove by its name alone (None: it may)."""
    if not os.path.isabs(root) or os.path.normpath(root) != root or root.startswith("//"):
        return f"{root!r} is not a normalised absolute path"
    if not os.path.basename(root).startswith(ROOT_PREFIX):
        return f"{root} is not a harness scratch root (its name does not start with {ROOT_PREFIX!r})"
    return None


class _Refused(Exception):
    """A claimed root the sweep will not touch; the message says why in one line."""


def _open_parent(r: Root) -> int | None:
    """The descriptor of ``r``'s parent, once ``r`` is verified to be the directory its claim
    made (None: it is gone). Raises :class:`_Refused` for anything else: a path another
    user could redirect, a link, another directory in its place."""
    why = _refusal(r.path)
    if why is not None:
        raise _Refused(why)
    if r.dev is None or r.ino is None or r.since is None:
        raise _Refused(f"{r.path}: its claim records no identity (not written by this chaos)")
    parent, name = os.path.split(r.path)
    try:
        pfd = trustedpath.open_dir(parent, own_last=False)
    except FileNotFoundError:
        return None
    except trustedpath.Untrusted as exc:
        raise _Refused(f"{r.path}: {exc}") from None
    st = trustedpath.child_identity(pfd, name)
    if st is None:
        os.close(pfd)
        return None
    if stat.S_ISLNK(st.st_mode):
        os.close(pfd)
        raise _Refused(f"{r.path} is a symbolic link")
    if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != (r.dev, r.ino) or st.st_uid != os.geteuid():
        os.close(pfd)
        raise _Refused(f"{r.path} is not the directory its claim made (another one is there now)")
    return pfd


def _ours(pids: list[int], since: int) -> list[int]:
    """Of ``pids``, those running as this uid that started after ``since`` (clock ticks)."""
    from faults.process import uids

    me = os.geteuid()
    out = []
    for pid in pids:
        started = start_ticks(pid)
        if uids(pid) == (me, me) and started is not None and started >= since:
            out.append(pid)
    return out


def _sweep_one(claim: Claim, dry_run: bool) -> Swept:
    from faults.blocklog import loop_detach, loops_of
    from faults.disk import mounts_under, unmount_all
    from faults.errors import FaultError
    from faults.process import marked_under, marks

    done = Swept(claim.pid, claim.argv)
    by_path = {r.path: r for r in claim.roots}
    for name, root in claim.cleanups:  # first: what runs detached under a root is stopped by its maker's code
        target = CLEANUPS.get(name)
        r = by_path.get(root)
        if target is None:
            done.refused.append(f"clean-up {name!r} is not a registered clean-up")
            continue
        if r is None:
            done.refused.append(f"clean-up {name} of {root}: not a root this claim made")
            continue
        try:
            pfd = _open_parent(r)
        except _Refused as exc:
            done.refused.append(f"clean-up {name}: {exc}")
            continue
        if pfd is None:
            continue  # its root is gone: nothing of it to stop
        os.close(pfd)
        if not dry_run:
            try:
                module, _, func = target.partition(":")
                getattr(importlib.import_module(module), func)(root)
            except Exception as exc:  # noqa: BLE001 - said; the root is still removed below
                done.refused.append(f"clean-up {name} of {root} failed: {type(exc).__name__}: {exc}")
                continue
        done.stopped.append(f"{name} {root}")
    found = marks() if claim.roots else {}  # one pass over /proc for all of this owner's roots
    for r in claim.roots:
        try:
            pfd = _open_parent(r)
        except _Refused as exc:
            done.refused.append(str(exc))
            continue
        pids = _ours(marked_under(r.path, found), r.since or 0)  # a gone root's ranks may still run
        if not dry_run:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        done.killed += pids
        if pfd is None:
            continue  # removed by its owner before it died
        try:
            if r.keep:
                done.kept.append(r.path)
                continue
            mounts = mounts_under(r.path, resolve=False)
            # Loop devices over images under the root (a block log's disk): named now, while their
            # backing path still reads as under the root; a lazy unmount of the FUSE file system
            # beneath would make it read "/disk.img" and the device would never be detached.
            loops = loops_of(r.path)
            if not dry_run:
                try:
                    unmount_all(r.path, resolve=False)
                except OSError as exc:
                    done.refused.append(f"{r.path}: unmount failed ({exc}); not removed")
                    continue
                for dev in loops:
                    try:
                        loop_detach(dev)
                    except FaultError as exc:
                        done.refused.append(f"{dev} (an image under {r.path}): {exc}")
                trustedpath.remove_tree(pfd, os.path.basename(r.path))
            done.unmounted += mounts
            done.detached += loops
            done.removed.append(r.path)
        finally:
            os.close(pfd)
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
    Raises :class:`UnsafeClaims` when the claims directory is not private to this user.
    """
    out = []
    for claim in claims():
        if claim.state != "gone":
            continue
        name = os.path.basename(claim.path)
        taken = ""
        if not dry_run:
            me = os.getpid()
            taken = f"{name.partition('.sweeping-')[0]}.sweeping-{me}-{start_ticks(me) or 0}"
            try:
                dir_fd = _open_claims(create=False)
            except FileNotFoundError:
                break
            try:
                os.rename(name, taken, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except FileNotFoundError:
                continue  # another sweep took it
            finally:
                os.close(dir_fd)
        done = _sweep_one(claim, dry_run)
        if not dry_run:
            with contextlib.closing(_ClaimsFd()) as d:
                if d.fd is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(taken, dir_fd=d.fd)
        out.append(done)
    return out


def untrusted() -> list[Claim]:
    """Files in the claims directory that look like claims but are not this user's own."""
    try:
        return [c for c in claims() if c.state == "untrusted"]
    except (UnsafeClaims, OSError):
        return []


def sweep_once() -> None:
    """:func:`sweep` at most once per process, printing one line per owner cleaned up after."""
    with _lock:
        if _mine["swept_pid"] == os.getpid():
            return
        _mine["swept_pid"] = os.getpid()
    try:
        done = sweep()
    except UnsafeClaims as exc:
        _say_once(_unclaimed(exc))
        return
    except OSError as exc:  # an unreadable claims directory must not stop the run
        print(f"chaos: could not sweep {claims_dir()}: {exc}", file=sys.stderr)
        return
    for d in done:
        if d.acted:
            print(d.line(), file=sys.stderr)


def _release(pid: int, name: str) -> None:
    """At a normal exit: drop this process's claim file unless something it claimed remains.

    A root not kept that still exists, or a lab with namespaces or links left, stays
    claimed for the next sweep. Registered by :func:`_claim`; a no-op in a forked child.
    The directory itself stays: a private directory of this user, kept, cannot be taken
    by someone else in between.
    """
    if os.getpid() != pid:
        return
    with contextlib.closing(_ClaimsFd()) as d:
        if d.fd is None:
            return
        claim = _read(d.fd, name)
        if claim is None or claim.state == "untrusted":
            return
        if any(not r.keep and os.path.isdir(r.path) for r in claim.roots):
            return
        if claim.netns:
            try:
                from faults.network import leftovers

                if any(leftovers(s) for s in claim.netns):
                    return
            except Exception:  # noqa: BLE001 - cannot tell: leave it to the next sweep
                return
        with contextlib.suppress(OSError):
            os.remove(name, dir_fd=d.fd)
