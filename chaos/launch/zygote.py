"""Zygotes: one interpreter per exploration that imported the job's modules and forks its attempts.

Why: on a torch or framework job, most of an attempt's cost is its interpreter importing
torch and the framework (``chaos.target.job.zygote`` says more). ``explore`` calls
``launch.begin_zygote`` once the first fault-free run has said what to preload; from then on
``launch.run_attempt`` asks :func:`spawn` for each copy an attempt starts, and only where
it gets None (no zygote, a copy it cannot stand for, a zygote that died) starts the copy
as before, from a spare or a fresh interpreter. ``launch.kill_all`` ends every zygote.

A zygote stands for a copy only where forking cannot change what the job does:

- the same command line up to the job's own arguments (interpreter, its options, the
  script or ``-m module``: the zygote reports how many words that is), the same working
  directory, and the same environment but for the harness's per-attempt variables
  (``CHAOS_JOB_*``), ``TMPDIR``, and a ``--ranks N`` job's ``MASTER_PORT`` and
  ``TORCHELASTIC_RESTART_COUNT``, which the forked child takes on before the job runs;
  a ``--ranks N`` job has one zygote per rank, started with that rank's ``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE`` ..., so a module that reads its rank as it is imported
  (Lightning's ``rank_zero_only``) reads the copy's own;
- it was started by ``launch.begin_zygote`` only for a Python job the harness launches
  itself (one process, or ``--ranks N`` outside a network lab) with modules to preload
  (``--no-preload`` turns both off), and it had
  no thread but its main one once those were imported (a fork copies only the calling
  thread). Where the job had changed environment variables by its first file event (spares
  then preload nothing: ``preload.choose``), only if its own imports set each one the same
  (Lightning sets ``PYTORCH_NVML_BASED_CUDA_CHECK`` as it loads), in the order the job
  imported them.

An attempt forked by a zygote is the zygote's child, not the harness's: :class:`ForkedProcess`
stands in for its ``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``returncode``), with the
exit status the zygote reports when it reaps it. It is its own session, so
``reaper.killpg(pid)`` ends it and what it started, as for a copy started directly.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import threading
import time

from chaos.errors import HarnessError
from chaos.launch import reaper
from chaos.launch.spares import Copy
from chaos.model import contract as C
from faults.process import alive

READY_WAIT_S = 120.0  # importing torch and a framework on a loaded machine
# Variables a forked child takes on from its attempt: its temp dir, and a --ranks N job's rendezvous
# port and restart count (launch.job._plan: each attempt's own). Every other one must be the zygote's.
_PER_ATTEMPT = ("TMPDIR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


class ForkedProcess:
    """A copy forked by a :class:`Zygote`, as much of ``subprocess.Popen`` as ``launch.job`` uses."""

    def __init__(self, pid: int, zygote: Zygote, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._zygote = zygote

    def poll(self) -> int | None:
        if self.returncode is None:
            self._zygote.pump(0.0)
        if self.returncode is None and self._zygote._dead and not alive(self.pid):
            # Its parent, the zygote, died first: how it ended is lost, and is not guessed.
            raise HarnessError(f"the zygote that forked attempt process {self.pid} died before reporting "
                               "how it ended")
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """As ``Popen.send_signal``: to the process only while its exit is not known (its pid may be reused after)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._zygote.pump(left)
        assert self.returncode is not None
        return self.returncode


class Zygote:
    """One zygote process and its socket; thread-safe (points may run ``--jobs N`` at a time)."""

    def __init__(self, template: Copy, log: str) -> None:
        self.template = template
        self.head = 0
        self.why_not: str | None = None
        self._lock = threading.RLock()
        self._children: dict[int, ForkedProcess] = {}
        self._dead = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        env = dict(template.env)
        env[C.ENV_ZYGOTE] = str(theirs.fileno())
        try:
            with open(log, "wb") as fh:
                self.proc = subprocess.Popen(list(template.argv), cwd=template.cwd, env=env, stdin=subprocess.DEVNULL,
                                             stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                             pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        # Marked with the zygote's own CHAOS_JOB_MARK, as every child it forks is in /proc (a fork keeps
        # the environment the zygote was started with there, whatever the child's os.environ says).
        reaper.track(self.proc, env.get(C.ENV_MARK), marked=True)
        self._log = log
        self._hello = False  # its hello read (ready)

    def ready(self) -> str | None:
        """Wait for the zygote's hello (its preload done), once; None when it serves, else why not.

        The constructor only starts it, so its imports overlap whatever the harness does
        meanwhile (``explore`` starts it before the second fault-free run); everything that
        forks from it or asks whether it serves calls this first.
        """
        with self._lock:
            if self._hello:
                return self.why_not
            self._hello = True
            hello = self._recv(READY_WAIT_S, answer=True)
            if hello is None or not hello.get("ready"):
                self.why_not = (hello or {}).get("why") or "it did not come up (its log: " + self._log + ")"
            elif hello.get("threads", 1) != 1:
                self.why_not = (f"the preloaded modules started {hello['threads'] - 1} thread(s), which a fork "
                                "would not copy")
            elif int(hello.get("head", -1)) < 1:
                self.why_not = "it could not read its own command line"
            else:
                self.head = int(hello["head"])
            if self.why_not is not None:
                self.close()
            return self.why_not

    # -- the socket -------------------------------------------------------------
    def _recv(self, timeout: float, *, answer: bool) -> dict | None:
        """The next message that is not an exit notice (None: none within ``timeout``, or end of
        file); exit notices on the way are filed. ``answer``: wait the whole ``timeout`` for one
        (a fork's reply, the hello); else only file what arrived, waiting for the first."""
        deadline = time.monotonic() + timeout
        while True:
            r, _, _ = select.select([self._sock], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                return None
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self._lost()
                return None
            msg = json.loads(data)
            if "exit" in msg:
                child = self._children.pop(int(msg["exit"]), None)
                if child is not None:
                    child.returncode = int(msg["code"])
                if not answer:
                    deadline = time.monotonic()  # what else is there, without waiting
                continue
            return msg

    def _lost(self) -> None:
        """The zygote is gone, with the exit statuses of children it had not reported: a child
        that ended too cannot be judged, and its ``poll`` raises rather than guess one."""
        self._dead = True

    def pump(self, timeout: float) -> None:
        """File the exit notices that arrived (waiting up to ``timeout`` for the first)."""
        with self._lock:
            if self._dead:
                time.sleep(min(timeout, 0.05))
                return
            msg = self._recv(timeout, answer=False)
            if msg is not None:  # an answer nobody waits for: a protocol error
                raise HarnessError(f"unexpected message from the zygote: {msg}")

    # -- forking ----------------------------------------------------------------
    def fits(self, copy: Copy) -> bool:
        """Whether a child of this zygote runs ``copy`` exactly as a fresh interpreter would."""
        if self.ready() is not None or self._dead or copy.cwd != self.template.cwd:
            return False
        if copy.argv[:self.head] != self.template.argv[:self.head]:
            return False
        return _steady(dict(copy.env)) == _steady(dict(self.template.env))

    def spawn(self, copy: Copy) -> ForkedProcess | None:
        """Fork ``copy`` (its log, environment, arguments), or None where this zygote cannot."""
        with self._lock:
            if not self.fits(copy):
                return None
            req = {"args": list(copy.argv[self.head:]), "env": dict(copy.env), "cwd": copy.cwd, "log": copy.log}
            try:
                self._sock.send(json.dumps(req).encode())
            except OSError:
                self._lost()
                return None
            answer = self._recv(30.0, answer=True)
            if answer is None or "pid" not in answer:
                if answer is None:  # no answer in time: it is not trusted with another attempt
                    self._dead = True
                return None
            child = ForkedProcess(int(answer["pid"]), self, list(copy.argv))
            self._children[child.pid] = child
            return child

    def close(self) -> None:
        """End the zygote (its children are each killed by whoever runs them)."""
        with self._lock:
            self._dead = True
            try:
                self._sock.close()
            except OSError:
                pass
            reaper.killpg(self.proc.pid)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            reaper.forget(self.proc)


def _steady(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("CHAOS_JOB_") and k not in _PER_ATTEMPT}


_zygotes: dict[str, list[Zygote]] = {}  # exploration root -> its zygotes, one per copy of an attempt
_lock = threading.Lock()


def begin(root: str, templates: list[Copy], logs: list[str]) -> None:
    """Start the zygotes of the exploration in ``root``, one per copy of an attempt (``--ranks N``:
    one per rank, each started with that rank's environment), without waiting for their preload
    (:func:`ready`)."""
    found = [Zygote(template, log) for template, log in zip(templates, logs, strict=True)]
    with _lock:
        old = _zygotes.pop(root, [])
        _zygotes[root] = found
    for z in old:
        z.close()


def started(root: str) -> bool:
    """Whether :func:`begin` started zygotes for ``root`` (ready or not yet)."""
    with _lock:
        return root in _zygotes


def ready(root: str) -> str | None:
    """Wait until every zygote of ``root`` has preloaded; None when they serve, else why not (and every
    one of them is gone: an attempt is forked whole or not at all)."""
    with _lock:
        found = _zygotes.get(root)
    if found is None:
        return "none was started"
    whys = [z.ready() for z in found]
    why = next((f"copy {i}'s: {w}" if len(found) > 1 else w for i, w in enumerate(whys) if w is not None), None)
    if why is not None:
        with _lock:
            if _zygotes.get(root) is found:
                del _zygotes[root]
        for z in found:
            z.close()
    return why


def spawn(root: str, copy: Copy) -> ForkedProcess | None:
    """A child of the zygote of ``root`` started for ``copy``'s rank (the one whose environment it has
    but for the per-attempt variables), or None (start it another way)."""
    with _lock:
        found = list(_zygotes.get(root, []))
    z = next((z for z in found if z.fits(copy)), None)
    return z.spawn(copy) if z is not None else None


def serves(root: str) -> bool:
    """Whether the exploration in ``root`` has zygotes forking its attempts (``launch.begin_zygote``), once ready."""
    with _lock:
        found = _zygotes.get(root)
    return bool(found) and all(z.ready() is None and not z._dead for z in found)  # type: ignore[union-attr]


def close_all() -> None:
    with _lock:
        found = [z for zs in _zygotes.values() for z in zs]
        _zygotes.clear()
    for z in found:
        z.close()


__all__ = ["ForkedProcess", "Zygote", "begin", "close_all", "ready", "serves", "spawn", "started"]
