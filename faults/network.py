"""Network drop between ranks: one network namespace per rank on a private veth bridge.

Topology for a lab with suffix ``3fa9c1`` and two ranks (all names carry the suffix,
so concurrent scenarios never collide; interface names stay within 15 characters)::

    netns chaos-3fa9c1-r0            root namespace                netns chaos-3fa9c1-r1
    cxn3fa9c10  10.213.47.1/24 ── cxh3fa9c10 ─┐             ┌─ cxh3fa9c11 ── cxn3fa9c11  10.213.47.2/24
                                              └─ cxb3fa9c1 ─┘   (bridge, no address)

The bridge has no address, so the /24 exists only inside the namespaces: nothing on
the host can reach it and it cannot shadow a host route. A rank enters its namespace
from a forked child with :func:`enter_netns` (``setns(2)`` through ctypes; Python
3.11 has no ``os.setns``) before it creates any socket, then uses ``addr(0)`` as
``MASTER_ADDR``.

``link_down(rank)`` sets the rank's host-side veth down: the rank's interface loses
carrier and every packet to or from it is silently dropped, as with a pulled cable
(TCP retransmits, collectives hang until their timeout). ``side="ns"`` downs the
interface inside the namespace instead, which removes its route: sends then fail at
once with ENETUNREACH. ``link_up`` restores either.

There is no netem here, so delay and loss are not kernel features:
``faults.tcpproxy.FaultProxy`` is the user-space alternative (reset, blackhole,
latency, bandwidth, slices) for traffic that can be pointed at a proxy (an
object-store endpoint, a TCPStore).

Teardown always runs (context manager, idempotent) and :func:`leftovers` lists any
namespace, link or bridge of ours still present. A namespace whose name is deleted
lives on while a process is still inside it; reap the ranks first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from faults import FaultError, Unsupported

CLONE_NEWNET = 0x40000000
NETNS_PREFIX = "chaos-"
IF_PREFIXES = ("cxb", "cxh", "cxn")
_SUFFIX_RE = re.compile(r"^[0-9a-f]{6}$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise FaultError(f"ip {' '.join(args)} failed: {p.stderr.strip()}")
    return p


def _netns_names() -> list[str]:
    p = _ip("netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _link_names() -> list[str]:
    p = _ip("-o", "link", "show", check=False)
    out = []
    for line in p.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            out.append(parts[1].strip().split("@")[0])
    return out


def leftovers(suffix: str | None = None) -> list[str]:
    """Namespaces (``netns:NAME``) and links (``link:NAME``) of ours still present;
    only those of one lab when ``suffix`` is given."""
    ns_pre = NETNS_PREFIX + (f"{suffix}-" if suffix else "")
    out = [f"netns:{n}" for n in _netns_names() if n.startswith(ns_pre)]
    for name in _link_names():
        for pre in IF_PREFIXES:
            rest = name[len(pre):]
            if name.startswith(pre) and (rest.startswith(suffix) if suffix else
                                         _SUFFIX_RE.match(rest[:6]) is not None):
                out.append(f"link:{name}")
                break
    return sorted(out)


def remove_leftovers(suffix: str) -> dict[str, list[str]]:
    """Delete the namespaces, links and bridge of lab ``suffix`` without its ``NetworkLab``
    (the harness that made it was killed): ``{"removed": [...], "errors": [...]}``.

    Namespaces first (deleting one takes both ends of its veth pair with it), then the
    links still there. ``removed`` is what was there before and is gone after, in
    :func:`leftovers`' names; anything still there is an error. Safe when nothing is there.
    """
    if not _SUFFIX_RE.match(suffix):
        raise FaultError(f"suffix must be 6 hex digits, got {suffix!r}")
    errors: list[str] = []

    def delete(kind: str, items: list[str]) -> None:
        for item in items:
            k, _, name = item.partition(":")
            if k == kind:
                p = _ip(kind, "del", name, check=False)
                if p.returncode and "Cannot find" not in p.stderr and "No such" not in p.stderr:
                    errors.append(f"ip {kind} del {name}: {p.stderr.strip()}")

    before = leftovers(suffix)
    delete("netns", before)
    delete("link", leftovers(suffix))  # listed again: each namespace took its veth pair with it
    after = leftovers(suffix)
    errors += [f"{item} is still there" for item in after if not any(item in e for e in errors)]
    return {"removed": sorted(set(before) - set(after)), "errors": errors}


def enter_netns(target: str | int) -> None:
    """Move this (single-threaded, freshly forked) process into a network namespace.

    ``target``: a netns name (``/run/netns/NAME``), a path to a namespace file, or a
    pid (its ``/proc/PID/ns/net``). Sockets made afterwards live in that namespace.
    """
    if isinstance(target, int):
        path = f"/proc/{target}/ns/net"
    elif "/" in target:
        path = target
    else:
        path = f"/run/netns/{target}"
    try:
        ntask = len(os.listdir("/proc/self/task"))
    except OSError:
        ntask = 1
    if ntask > 1:
        raise FaultError(f"setns(CLONE_NEWNET) in a process with {ntask} threads moves only "
                         "the calling thread; call it right after fork")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns({path}): {os.strerror(e)}")
    finally:
        os.close(fd)


def can_use_netns() -> tuple[bool, str]:
    """Whether namespaces, veth and bridges can be made here: tries a tiny lab."""
    if os.geteuid() != 0:
        return False, "not root: network namespaces need CAP_SYS_ADMIN/CAP_NET_ADMIN"
    try:
        with NetworkLab(1) as lab:
            _ip("-n", lab.ns_name(0), "link", "show")
    except (FaultError, OSError, subprocess.SubprocessError) as e:
        return False, f"netns probe failed: {e}"
    return True, "root; netns + veth + bridge work"


@dataclass
class NetworkLab:
    """Per-rank network namespaces joined by veth pairs to one bridge.

    >>> with NetworkLab(2) as lab:           # setup on enter, teardown on exit
    ...     # in rank r's forked child: enter_netns(lab.ns_name(r)); MASTER_ADDR=lab.addr(0)
    ...     lab.link_down(1); ...; lab.link_up(1)
    """

    n_ranks: int
    suffix: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: str = "10.213.47"  # first three octets of the /24
    log: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not _SUFFIX_RE.match(self.suffix):
            raise FaultError(f"suffix must be 6 hex digits, got {self.suffix!r}")
        if not 1 <= self.n_ranks <= 250:
            raise FaultError(f"n_ranks must be in 1..250, got {self.n_ranks}")

    # names ---------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"cxb{self.suffix}"

    def ns_name(self, rank: int) -> str:
        return f"{NETNS_PREFIX}{self.suffix}-r{rank}"

    def ns_path(self, rank: int) -> str:
        return f"/run/netns/{self.ns_name(rank)}"

    def host_if(self, rank: int) -> str:
        return f"cxh{self.suffix}{rank}"

    def ns_if(self, rank: int) -> str:
        return f"cxn{self.suffix}{rank}"

    def addr(self, rank: int) -> str:
        return f"{self.subnet}.{rank + 1}"

    def rank_env(self, rank: int, port: int = 29500) -> dict[str, str]:
        """Environment for a rank inside its namespace. Gloo picks its interface from
        the host name, which resolves to a host address unreachable from the
        namespace, so ``GLOO_SOCKET_IFNAME`` must name the rank's veth."""
        return {"MASTER_ADDR": self.addr(0), "MASTER_PORT": str(port),
                "GLOO_SOCKET_IFNAME": self.ns_if(rank), "TP_SOCKET_IFNAME": self.ns_if(rank)}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(bridge=self.bridge, namespaces=[self.ns_name(r) for r in range(self.n_ranks)],
                 addresses=[self.addr(r) for r in range(self.n_ranks)])
        return d

    def _do(self, *args: str) -> None:
        _ip(*args)
        self.log.append({"cmd": "ip " + " ".join(args), "ts": time.time()})

    # lifecycle -----------------------------------------------------------
    def setup(self) -> dict[str, Any]:
        """Create bridge, namespaces and veth pairs; on any failure tear down and raise."""
        if os.geteuid() != 0:
            raise Unsupported("network namespaces need root")
        try:
            self._do("link", "add", self.bridge, "type", "bridge")
            self._do("link", "set", self.bridge, "up")
            for r in range(self.n_ranks):
                ns, h, n = self.ns_name(r), self.host_if(r), self.ns_if(r)
                self._do("netns", "add", ns)
                self._do("link", "add", h, "type", "veth", "peer", "name", n)
                self._do("link", "set", n, "netns", ns)
                self._do("link", "set", h, "master", self.bridge)
                self._do("link", "set", h, "up")
                self._do("-n", ns, "addr", "add", f"{self.addr(r)}/24", "dev", n)
                self._do("-n", ns, "link", "set", "lo", "up")
                self._do("-n", ns, "link", "set", n, "up")
        except BaseException:
            self.teardown()
            raise
        return {"action": "netns_setup", **self.to_dict()}

    def teardown(self) -> dict[str, Any]:
        """Remove namespaces, links and bridge; safe to call any number of times."""
        errors = []
        for r in range(self.n_ranks):
            if self.ns_name(r) in _netns_names():
                p = _ip("netns", "del", self.ns_name(r), check=False)
                if p.returncode:
                    errors.append(p.stderr.strip())
        links = set(_link_names())
        for name in [self.host_if(r) for r in range(self.n_ranks)] + [self.bridge]:
            if name in links:
                p = _ip("link", "del", name, check=False)
                if p.returncode and "Cannot find" not in p.stderr:
                    errors.append(p.stderr.strip())
        left = leftovers(self.suffix)
        return {"action": "netns_teardown", "suffix": self.suffix, "leftovers": left,
                "errors": errors}

    def __enter__(self) -> NetworkLab:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    # faults --------------------------------------------------------------
    def link_down(self, rank: int, side: str = "host") -> dict[str, Any]:
        """Cut ``rank`` off: ``host`` side (silent drop) or ``ns`` side (route gone)."""
        return self._set(rank, "down", side)

    def link_up(self, rank: int, side: str = "host") -> dict[str, Any]:
        """Reconnect ``rank`` (undo :meth:`link_down` with the same ``side``)."""
        return self._set(rank, "up", side)

    def _set(self, rank: int, state: str, side: str) -> dict[str, Any]:
        if side == "host":
            self._do("link", "set", self.host_if(rank), state)
        elif side == "ns":
            self._do("-n", self.ns_name(rank), "link", "set", self.ns_if(rank), state)
        else:
            raise FaultError(f"side must be 'host' or 'ns', got {side!r}")
        return {"action": f"link_{state}", "rank": rank, "side": side, "suffix": self.suffix,
                "interface": self.host_if(rank) if side == "host" else self.ns_if(rank),
                "ts": time.time()}


# ---------------------------------------------------------------------- TCP proxy
def run_in_netns(target: str | int, fn: Callable[[], int]) -> int:
    """Fork a child that enters ``target`` and runs ``fn`` (its return is the exit
    status); returns the child's pid. For tests and small helpers."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            enter_netns(target)
            code = int(fn())
        finally:
            os._exit(code)
    return pid


__all__ = ["NetworkLab", "can_use_netns", "enter_netns", "leftovers", "run_in_netns"]
