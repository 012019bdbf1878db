"""User-space TCP fault proxy between a client and an object store (no netem here).

Why user space: the kernel on these machines has no netem, and a proxy can aim a
fault at an exact point of an upload: after N bytes sent upstream, on the Nth
connection. Every fault that fires is appended to ``log`` (what, when, which
connection, byte offset), so a run records its network schedule and a seeded plan
replays identically.

Rules (:class:`ProxyRule`), checked for each chunk sent upstream (client -> store):

- ``reset``    after ``after_bytes`` upstream bytes on a connection: RST both sides.
- ``blackhole`` after ``after_bytes``: keep the sockets open, forward nothing more.
- ``latency``  delay every chunk by ``delay_s`` (+ seeded jitter up to ``jitter_s``).
- ``bandwidth`` limit to ``bytes_per_s`` in each direction.
- ``slice``    forward in pieces of at most ``slice_bytes`` (exercises partial reads).

``connection`` (0-based, counted from the proxy's start or its last ``set_rules``)
limits a rule to one connection; ``once`` makes it fire on one connection only.
"""

from __future__ import annotations

import contextlib
import random
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

KINDS = ("reset", "blackhole", "latency", "bandwidth", "slice")


class ProxyConfigError(ValueError):
    """A proxy rule is malformed (one line naming the rule)."""


@dataclass
class ProxyRule:
    kind: str
    after_bytes: int = 0
    connection: int | None = None
    once: bool = True
    delay_s: float = 0.0
    jitter_s: float = 0.0
    bytes_per_s: float = 0.0
    slice_bytes: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ProxyConfigError(f"proxy rule {self!r}: kind must be one of {KINDS}")
        if self.after_bytes < 0 or (self.kind == "bandwidth" and self.bytes_per_s <= 0) or (self.kind == "slice" and self.slice_bytes <= 0):
            raise ProxyConfigError(f"proxy rule {self!r}: bad parameters")


def _rst(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.close()


class FaultProxy:
    """``with FaultProxy(("127.0.0.1", port), seed=0) as p: endpoint = p.endpoint``."""

    def __init__(self, target: tuple[str, int], seed: int = 0, rules: list[ProxyRule] | None = None) -> None:
        self.target = target
        self.rng = random.Random(seed)
        self.seed = seed
        self.rules: list[ProxyRule] = list(rules or [])
        self.log: list[dict[str, Any]] = []
        self.connections = 0
        self._fired: dict[int, int] = {}  # rule index -> the connection it fired on
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._lsock = socket.create_server(("127.0.0.1", 0))
        self.address = self._lsock.getsockname()[:2]
        self.endpoint = f"http://{self.address[0]}:{self.address[1]}"
        self._threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True, name="faultproxy-accept")
        t.start()
        self._threads.append(t)

    def set_rules(self, rules: list[ProxyRule]) -> None:
        with self._lock:
            self.rules, self._fired, self.connections = list(rules), {}, 0
        self._record("rules", rules=[r.__dict__ for r in rules])

    def _record(self, action: str, **info: Any) -> None:
        with self._lock:
            self.log.append({"action": action, "t": time.time(), **info})

    def _accept(self) -> None:
        self._lsock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                c, _ = self._lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                u = socket.create_connection(self.target, timeout=5)
            except OSError:
                _rst(c)
                continue
            with self._lock:
                idx = self.connections
                self.connections += 1
                self._socks += [c, u]
            t = threading.Thread(target=self._pump, args=(idx, c, u), daemon=True, name=f"faultproxy-{idx}")
            t.start()
            self._threads.append(t)

    def _rules_for(self, idx: int) -> list[tuple[int, ProxyRule]]:
        with self._lock:
            out = []
            for i, r in enumerate(self.rules):
                if r.connection is not None and r.connection != idx:
                    continue
                if r.once and self._fired.get(i, idx) != idx:
                    continue
                out.append((i, r))
            return out

    def _pump(self, idx: int, client: socket.socket, upstream: socket.socket) -> None:
        sent_up = 0
        black = False
        try:
            while not self._stop.is_set():
                r, _, _ = select.select([client, upstream], [], [], 0.1)
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        return
                    if black:
                        continue
                    up = s is client
                    dest = upstream if up else client
                    for i, rule in self._rules_for(idx):
                        if rule.kind in ("reset", "blackhole") and up and sent_up + len(data) > rule.after_bytes:
                            keep = max(0, rule.after_bytes - sent_up)
                            if keep:
                                dest.sendall(data[:keep])
                            with self._lock:
                                self._fired.setdefault(i, idx)
                            self._record(rule.kind, connection=idx, byte=rule.after_bytes, rule=i)
                            if rule.kind == "reset":
                                _rst(client)
                                _rst(upstream)
                                return
                            black = True
                            break
                        if rule.kind == "latency":
                            time.sleep(rule.delay_s + (self.rng.uniform(0, rule.jitter_s) if rule.jitter_s else 0))
                    if black:
                        continue
                    pieces = [data]
                    slicer = next((r for _, r in self._rules_for(idx) if r.kind == "slice"), None)
                    if slicer is not None:
                        pieces = [data[i : i + slicer.slice_bytes] for i in range(0, len(data), slicer.slice_bytes)]
                    bw = next((r for _, r in self._rules_for(idx) if r.kind == "bandwidth"), None)
                    for piece in pieces:
                        dest.sendall(piece)
                        if bw is not None:
                            time.sleep(len(piece) / bw.bytes_per_s)
                    if up:
                        sent_up += len(data)
        except OSError:
            return
        finally:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._lsock.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
