"""Inside a job's rank process: trace its file events under {out} and fire one point.

Called by ``boot/sitecustomize.py`` as the interpreter starts, before the job's own
code runs. Everything it needs comes from the ``ENV_*`` variables of
:mod:`chaos.model.jobspec`; without ``CHAOS_JOB_OUT`` nothing happens.

The tracer is :class:`faults.interposer.Interposer` with three additions made by
subclassing, not by editing it:

- every op record carries ``ord``, the ordinal of the rank's file event (0, 1, ...),
  which is what a point names (``rank0:op17:before``). Ordinals, unlike paths, are
  stable when a job writes random temp names (``tempfile.mkstemp``); but where ranks
  race (on creating one directory, say) they move from run to run. An anchored point
  (``Point.anchored``: its path was the same in both fault-free runs) therefore fires
  at the ``nth`` event of its kind on its path, counted here per (kind, path) the way
  ``pointset.enumerate_points`` counts them, whatever that event's ordinal;
- a point fires *before* event N (the event is not performed), *after* it (its record
  is on disk, then SIGKILL), or *torn* (a write stores the first half of its bytes,
  then SIGKILL, through the interposer's own ``short_write`` rule);
- a corruption or power-loss point *halts* right after event N (the built-in ``ckpt:stepS:KIND``,
  which names no event: once the rank announces step S): the rank records it,
  leaves a request in the trace directory and waits, frozen, until the launcher has
  stopped every copy (torchrun's agent included, so it cannot restart the workers
  before the harness has edited {out}); SIGKILL itself after ``HALT_WAIT_S`` without one;
- an ``enospc`` / ``eio`` point makes event N raise ``OSError`` instead of being
  performed, through the interposer's own rule actions (``fsync_fail`` for an fsync);
  the job sees the error and carries on as it will. EIO is one bad event; a full disk
  stays full, so after an ``enospc`` every later event that needs space (a write, a
  file created, mkdir, rename, link) raises ENOSPC too — Python's retry of a failed
  buffered write at ``close()`` included. If the job is still running at its next
  announced step, it is killed there, so the restart shows whether what it acknowledged
  after the error was really saved;
- a ``term`` step point leaves a request for the launcher (which sends SIGTERM to every
  copy, then SIGKILL after ``--grace``) and waits, up to ``TERM_WAIT_S``, for its answer,
  outside the interposer's lock, so the job's own SIGTERM handler runs (and its saves
  are traced) as it would under a real preemption;
- a ``net`` point (at an announced step, or right after event N) leaves a request for
  the launcher (which cuts this rank's network link, ``netcut.py``) and waits, up to
  ``NET_WAIT_S``, for its answer, so the cut lands exactly there; then the job goes on,
  its next collective meeting a dead link. It fires once, even where a step is
  announced twice (``probe.step`` and a ``--loss-regex`` line). At an event the wait
  holds the interposer's lock (the launcher answers in milliseconds); at a step it
  does not;
- a ``sched`` point (``--launcher sbatch``: requeue, preempt, node; at an announced step,
  or right after event N) leaves a request for the sbatch launcher, which tells Slurm
  (``chaos.nemesis.sched``), and waits, up to ``SCHED_WAIT_S``, until Slurm's SIGTERM has
  reached the job: its own handler ran (the wait relays the signal to it and sees it), or
  the default action ended the process. The point lands exactly there, in attempt 0 only
  (a rerun after Slurm's requeue is attempt 1 and more: ``sbatchwrap``);
- a full disk at a step (the built-in ``disk:stepS:full,free=B``) leaves a request for the
  launcher, which shrinks {out}'s tmpfs to what it holds plus B bytes (``nemesis/diskfull.py``),
  and waits, up to ``FILL_WAIT_S``, for its answer: the job's next write meets the full disk;
- a ``stop`` point (at an announced step, or right after event N) records it, leaves a
  request for the launcher and stops this process with SIGSTOP: a hung process, whose
  threads all freeze where they are while its peers and children run on
  (``chaos.nemesis.stop``). The launcher ends the attempt once nothing of it can go on;
- ``chaos.probe`` calls and lines of the job's stdout/stderr matching
  ``--step-regex`` become ``{"event":"phase","name":"chaos.probe",...}`` records in the
  same trace, in order with the file events; a step point fires at such a record.

Child processes (data-loader workers, helpers) are not traced unless
``CHAOS_JOB_CHILDREN=1``: a forked child uninstalls the tracer, and a spawned one sees
``CHAOS_JOB_BOOTED`` and does not install it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from chaos import phases
from chaos.model import contract as S
from faults.interposer import Interposer, IORule

TYPE_CHECKING = False  # imported as every rank starts: no ``typing`` at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_installed: JobInterposer | None = None
HALT_WAIT_S = 20.0  # a halted rank waits this long for the launcher to stop it, then SIGKILLs itself
TERM_WAIT_S = 10.0  # a term point waits this long for the launcher's SIGTERM, then carries on
NET_WAIT_S = 10.0   # a net point waits this long for the launcher's cut, then carries on
SCHED_WAIT_S = 30.0  # a sched point waits this long for Slurm's SIGTERM, then carries on
FILL_WAIT_S = 10.0  # a disk filled at a step: the rank waits this long for the launcher, then carries on
RESTART_WAIT_S = 120.0  # a restart point waits this long to be killed by the engine's restart, then carries on
_NEEDS_SPACE = ("write", "mkdir", "rename", "link")  # and an open that creates its file


def _rules(point: dict[str, Any] | None) -> list[IORule]:
    """The interposer rules a point needs; ``_match`` decides when they fire. A kill at a named phase
    of a step's save is the interposer's own phase rule (the checkpointer announces it, chaos.phases)."""
    mode = point.get("mode") if point else None
    if point is not None and point.get("rule"):  # a built-in I/O fault: the rule the built-in rank would fire
        return [IORule.from_dict(point["rule"])]
    if point is not None and point.get("phase"):  # (a hang or a cut at a phase: JobInterposer._on_phase)
        return [IORule("kill", phase=point["phase"], step=point.get("step"))] if mode == "kill" else []
    if mode == "torn":
        return [IORule("short_write", op="write", keep=None, then="kill", times=None)]
    if mode == "enospc":
        return [IORule("enospc", times=None)]
    if mode == "eio":
        return [IORule("eio", times=None), IORule("fsync_fail", times=None)]
    return []


def _let_sigterm_land() -> None:
    """Return once the job's own SIGTERM handler has run (a term point, ``JobInterposer._term``).

    The launcher writes its answer only after ``kill()`` returned, so SIGTERM is pending
    or already delivered here. On the main thread the kernel delivers it on the way out of
    a syscall and Python runs the handler at the next bytecode boundary, so waiting until
    the kernel no longer holds it pending is enough (a fixed 50 ms sleep cost every term
    point as much as a whole attempt of a pure-Python job). On another thread the handler
    runs on the main thread whenever that one gets to it, and a torchrun worker gets the
    signal only once its agent forwarded it: give those the 50 ms. A signal the job blocks
    stays pending: after 50 ms the job carries on as it would.
    """
    import signal
    import threading

    forwarded = os.environ.get(S.ENV_RANKS_ONLY) == "1"  # torchrun's agent got the SIGTERM, not this process
    if forwarded or threading.current_thread() is not threading.main_thread():
        time.sleep(0.05)
        return
    until = time.monotonic() + 0.05
    while signal.SIGTERM in signal.sigpending() and time.monotonic() < until:
        time.sleep(0.001)


class JobInterposer(Interposer):
    """The interposer, numbering file events and firing one ``Point`` given as a dict."""

    def __init__(self, root: str, rank: int, trace_path: str, point: dict[str, Any] | None) -> None:
        super().__init__(root, rank=rank, trace_path=trace_path, rules=_rules(point),
                         keep_records=False, trace_reads=True)
        self.point = point
        self._anchor: tuple[str, str, int] | None = None
        self._counts: dict[tuple[str, str], int] = {}  # (kind, path key) -> events so far (anchored point)
        if point is not None and point.get("anchor"):
            kind, path, nth = point["anchor"]
            self._anchor = (str(kind), str(path), int(nth))
            self.point = {**point, "op": None}  # no ordinal matches until the anchor's event comes
        self._ord = 0
        self.next_ord: Any = None  # set by native.attach: the rank's shared event counter
        self._cur: int | None = None
        self._errored = False  # an enospc / eio point fired: kill at the next announced step
        self._net_fired = False  # a net point fires once
        self._sched_fired = False  # a sched point fires once
        self._stop_fired = False  # a stop point fires once (a SIGCONT from outside lets the job go on)
        self._fill_fired = False  # a disk fills once (a step announced twice: probe.step and a --loss-regex line)
        self._deferred: tuple[str, dict[str, Any]] | None = None  # a corruption waiting for its step (at_step)
        self._requests = os.path.dirname(trace_path)
        self._imports: tuple[frozenset[str], dict[str, str]] | None = None  # (modules, environ) at install
        self._late: set[str] = set()  # top-level modules first imported once the job had changed os.environ
        self._early: set[str] = set()  # ... and those first imported before
        self._calls: list[tuple[str, bool]] = []  # (module, after a change) imported by the job's own call
        self._called: set[str] = set()  # every module the job looked for
        self._written: tuple[dict[str, Any], int, int] | None = None  # the imports record, len(_calls), len(_io)
        self._io: list[list[Any]] = []  # [ordinal, [modules whose import is under way, outermost first]]
        self._skip: frozenset[int] = frozenset()  # ordinals not made here: their modules were preloaded
        self._changed_yet = False
        self.child = False  # a traced child of a rank (install): it writes no imports record
        self._owner = os.getpid()  # the process whose imports the record says: a forked child's are not
        self._within: dict[str, set[str]] = {}  # module -> modules first imported while its import was under way
        self._env_read: dict[str, set[str]] = {}  # module -> variables read during its import, then changed
        self._dlopened: set[str] = set()  # modules during whose import a shared library was loaded by ctypes

    def note_start(self, attempt: int) -> None:
        """Remember what was imported and the environment as the job starts (``install``), so the
        first file event can say what the job imported before it (:meth:`_write_imports`), and
        which of those it imported only after changing an environment variable; and, for as long
        as it runs, which modules its own calls imported (an audit hook on every import)."""
        self._attempt = attempt
        self._imports = (frozenset(sys.modules), dict(os.environ))
        self._skip = _preloaded_events(self._imports[0])
        sys.addaudithook(self._on_audit)
        if self.point is None:  # a fault-free run: its record says what may be preloaded
            _watch_environ(self._on_env_read)

    def _on_audit(self, event: str, args: tuple) -> None:
        # CPython raises "import" as it looks for a module that is not loaded yet.
        if self._imports is None or event not in ("import", "ctypes.dlopen"):
            return
        try:
            started, env = self._imports
            if event == "ctypes.dlopen":  # native code that may read the environment as it loads
                self._dlopened.update(name for name, _ in _importing(started))
                return
            name = str(args[0])
            top = name.partition(".")[0]
            if top in started or name in self._called:
                return
            self._called.add(name)
            if not self._changed_yet:
                self._changed_yet = dict(os.environ) != env
            if self._written is None and top not in self._early and top not in self._late:
                (self._late if self._changed_yet else self._early).add(top)
            under = _importing(started)
            for outer, _ in under:
                self._within.setdefault(outer, set()).add(name)
            if not any(isinstance(file, str) and _installed_file(file) for _, file in under):
                # The outermost import of a chain, by the job's code or a library's function: what
                # a library imports only when first called (torch.optim's first optimizer imports
                # torch._dynamo and sympy, about 1.3 s) is not brought by importing the library,
                # so the preload must name it, and that may come after the first file event.
                self._calls.append((name, self._changed_yet))
        except Exception:  # noqa: BLE001, S110 - an audit hook must never break an import
            pass

    def _on_env_read(self, key: Any, value: str | None) -> None:
        """A read of ``os.environ[key]`` (``_watch_environ``): where the job has changed that variable
        since it started, every module whose import is under way read a value that an interpreter
        preloading it would not see, so it stays the job's to import (``launch.preload``)."""
        if self._imports is None or not isinstance(key, str) or value == self._imports[1].get(key):
            return
        if _reader_module().startswith(("chaos.", "faults.")):
            return  # the tracer's own reads (dict(os.environ) while it checks for a change)
        for name, _ in _importing(self._imports[0]):
            self._env_read.setdefault(name, set()).add(key)

    def _call_entry(self, name: str, late: bool) -> list[Any]:
        """The record's ``calls`` entry of a module the job's calls imported: name, file, imported after
        an environment change, the changed variables its import read, whether it loaded native code
        (an extension module or a ctypes library: what it read from the environment is not seen)."""
        inside = self._within.get(name, set()) | {name}
        native = bool(inside & self._dlopened) or any(_is_extension(sys.modules.get(m)) for m in inside)
        read = sorted(set().union(*(self._env_read.get(m, set()) for m in inside)))
        return [name, getattr(sys.modules.get(name), "__file__", None), late, read, native]

    def note_native_off(self, why: str) -> None:
        """The native tracer was preloaded but could not be bound (``native.attach``'s reason):
        one record in the trace, so the results say so instead of ``native_trace: true``."""
        self._emit({"event": "native_off", "why": why})

    def _note_io_at_import(self, started: frozenset[str]) -> None:
        """At traced file event ``self._cur``: the modules whose import is under way here (a
        ``<module>`` frame on the stack), outermost first. An attempt that has one of them
        preloaded does not make this event: its tracer skips the ordinal (``_preloaded_events``),
        so every later event keeps the fault-free trace's number, which names the points."""
        mods = [name for name, _ in _importing(started)]
        if mods:
            self._io.append([self._cur, mods[::-1]])

    def _write_imports(self) -> None:
        """At the first file event: the top-level modules the job imported since it started, with
        their files, and which environment variables it changed meanwhile; at a later event, the
        same with the modules its calls imported since (``calls``: name, file, after a change)
        and those whose import made a file event (``io_at_import``); nothing is written where
        neither grew. The harness preloads such modules in the interpreters it starts ahead of
        an attempt (``launch.preload``), but only where the job changed no variable a module
        could have read as it was imported, and none whose import made a file event."""
        if self.child or os.getpid() != self._owner:
            return  # a traced child's imports are not the rank's (CHAOS_JOB_CHILDREN=1)
        if self._written is not None and self._written[1:] == (len(self._calls), len(self._io)):
            return
        if self._written is None:
            started, env = self._imports  # type: ignore[misc]
            mods = {name: getattr(sys.modules.get(name), "__file__", None) for name in sys.modules
                    if "." not in name and name not in started}
            changed = sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))
            record = {"modules": mods, "env_changed": changed, "env_values": {k: os.environ.get(k) for k in changed},
                      "imported_after_change": sorted(self._late & set(mods))}
        else:
            record = self._written[0]
        calls = list(self._calls)
        record["calls"] = [self._call_entry(name, late) for name, late in calls if name in sys.modules]
        record["io_at_import"] = list(self._io)
        self._written = (record, len(calls), len(self._io))
        path = os.path.join(self._requests, S.IMPORTS_FILE.format(rank=self.rank, attempt=self._attempt,
                                                                   pid=os.getpid()))
        fd = self._o["open"](path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self._write_all(fd, json.dumps(record, default=str).encode())
        finally:
            self._o["close"](fd)

    def _target(self, *modes: str) -> bool:
        p = self.point
        return p is not None and p.get("mode") in modes and p.get("op") == self._cur

    def _match(self, kind: str, paths: tuple[str, ...], offset: int | None = None,
               length: int | None = None) -> list[int]:
        # Called exactly once per traced op, before it is performed, under the lock.
        while True:
            if self.next_ord is None:
                self._cur = self._ord
                self._ord += 1
            else:  # the native tracer's counter, shared with the processes this rank starts (native.py)
                self._cur = self.next_ord()
            if self._cur not in self._skip:
                break
        if self._imports is not None:
            self._note_io_at_import(self._imports[0])
            self._write_imports()  # (at once where nothing new was imported since the last event)
        if self._anchor is not None:
            self._count(kind, paths)
        if self.point is not None and self.point.get("rule"):  # the rule counts its matches itself
            return super()._match(kind, paths, offset, length)
        if self._target("torn"):
            if kind == "write" and length and length > 1:
                return [0]  # _do_write keeps the first half (keep=None), records it, fires, dies
            self._cut(kind, paths, "before", note="torn point on a non-write or 1-byte event: killed before it")
        if self._target("before"):
            self._cut(kind, paths, "before")
        if self._target("enospc", "eio"):
            self._errored = True
            # _act_before / _do_write fire the rule: the op is not performed and raises OSError
            return [1] if self.point["mode"] == "eio" and kind in S.SYNC_OPS else [0]  # type: ignore[index]
        if self._errored and self.point["mode"] == "enospc" and (  # type: ignore[index]
                kind in _NEEDS_SPACE or kind == "open" and paths and not os.path.lexists(paths[0])):
            return [0]  # the disk is still full
        return []

    def _count(self, kind: str, paths: tuple[str, ...]) -> None:
        """Count this event under its (kind, path key) and aim the point at it if it is the anchor's.

        The key is the path its trace record carries (a rename's destination, else its one
        path), relative to {out} as ``history.read_traces`` makes it: the same key and count
        ``pointset.enumerate_points`` gave the anchor in the fault-free run.
        """
        path = paths[-1] if len(paths) > 1 else paths[0] if paths else None
        key = (kind, self._rel(path) if path else "")
        n = self._counts[key] = self._counts.get(key, 0) + 1
        if (kind, key[1], n) == self._anchor:
            self.point["op"] = self._cur  # type: ignore[index]

    def _op(self, kind: str, **fields: Any) -> dict[str, Any]:
        fields.setdefault("ord", self._cur)
        if getattr(self._tls, "native", False):
            fields["native"] = True  # made by native code, handed over by the native tracer (native.py)
        rec = super()._op(kind, **fields)
        if fields["ord"] == self._cur:
            if self._target("after"):
                self._cut(kind, (fields.get("path"),), "after")
            elif self._target(*S.HALT_MODES):
                if self.point.get("at_step") is None:  # type: ignore[union-attr]
                    self._halt(kind, fields)
                else:  # the file is complete; the corruption lands once the job has moved on
                    self._deferred = (kind, {"ord": self._cur, **fields})
            elif self._target("net"):
                self._net({"op": kind, "ord": self._cur, "path": fields.get("path"), "dst": fields.get("dst")})
            elif self._target("stop"):
                self._stop({"op": kind, "ord": self._cur, "path": fields.get("path"), "dst": fields.get("dst")})
            elif self._target(*S.SCHED_MODES):
                self._sched({"op": kind, "ord": self._cur, "path": self._rel(fields["path"]) if fields.get("path")
                             else None})
        return rec

    def _fire(self, i: int, kind: str, paths: tuple[str, ...], **point: Any) -> dict[str, Any]:
        point.setdefault("ord", self._cur)
        point.setdefault("when", self.point.get("mode") if self.point else "torn")
        if self.rules[i].action in ("eio", "enospc", "fsync_fail") and self.point and self.point.get("rule"):
            self._errored = True  # a built-in I/O fault's error: as an errno point, killed at the next step
        return super()._fire(i, kind, paths, **point)

    def _request(self, name: str, info: dict[str, Any]) -> None:
        """Leave a request for the launcher's poll loop (written whole, then renamed into view)."""
        final = os.path.join(self._requests, f"{name}-r{self.rank}-p{os.getpid()}.json")
        tmp = final + ".tmp"
        fd = self._o["open"](tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self._write_all(fd, json.dumps(info, default=str).encode())
        finally:
            self._o["close"](fd)
        self._o["rename"](tmp, final)

    def _halt(self, kind: str, fields: dict[str, Any], step: Any = None) -> None:
        """Right after event N of a corruption / power-loss point, or at the step a deferred corruption
        waits for (``step``; ``fields`` then are event N's): freeze until every copy is stopped."""
        rec = self._emit({"event": "fired", "action": "halt", "op": kind, "when": self.point["mode"],  # type: ignore[index]
                          "ord": fields.get("ord", self._cur), "path": fields.get("path"), "dst": fields.get("dst"),
                          **({} if step is None else {"step_n": step, "last_ord": self._cur})})
        self._request(S.HALT_REQUEST, {"rank": self.rank, "ord": self._cur, "ts": rec["ts"]})
        deadline = time.monotonic() + HALT_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.005)
        self._die()

    def _cut(self, kind: str, paths: tuple[Any, ...], when: str, note: str | None = None) -> None:
        rec: dict[str, Any] = {"event": "fired", "action": "kill", "op": kind, "when": when, "ord": self._cur,
                               "path": paths[0] if paths else None}
        if note:
            rec["note"] = note
        self._emit(rec)
        self._die()

    def _on_phase(self, name: str, info: dict[str, Any]) -> None:
        super()._on_phase(name, info)
        p = self.point
        if (p is not None and p.get("phase") == name and p.get("mode") in ("stop", "net", "restart")
                and not self._busy() and info.get("step") == p.get("step")):  # where the checkpointer says it is
            where = {"op": "step", "step_n": p["step"], "phase": name, "source": "phase"}
            if p["mode"] == "stop":
                self._stop(where)
            elif p["mode"] == "restart":
                self._restart(where)
            else:
                self._net(where)
            return
        if p is None or name != "chaos.probe" or info.get("kind") not in S.STEP_KINDS:
            return
        if p.get("rule") and isinstance(info.get("n"), int):
            self._step = info["n"]  # a rule's step=S: the events after the job announced step S (Fault.io_rule)
        if self._errored:  # still running after the injected error: crash it at its next step
            self._record({"event": "fired", "action": "kill", "op": "step", "when": "after_error",
                          "step_n": info.get("n"), "source": info.get("kind")})
            self._die()
        if self._deferred is not None and info.get("n") == p.get("at_step"):
            self._enter()  # held until the copies are stopped: no thread writes past the halt
            self._halt(*self._deferred, step=info.get("n"))
        if (p.get("op") is None and self._anchor is None and p.get("at_step") is not None  # the built-in ckpt:stepS:KIND
                and info.get("n") == p["at_step"] and p.get("mode") in S.HALT_MODES):
            self._enter()
            self._halt("step", {"ord": None}, step=info.get("n"))
        if p.get("step") is None or info.get("n") != p["step"] or p.get("phase"):
            return  # (a phase point is the interposer's phase rule: it fires at the phase, not the step)
        if p.get("mode") == "term":
            self._term(p["step"], info.get("kind"))
            return
        if p.get("mode") == "net":
            self._net({"op": "step", "step_n": p["step"], "source": info.get("kind")})
            return
        if p.get("mode") in S.SCHED_MODES:
            self._sched({"op": "step", "step_n": p["step"], "source": info.get("kind")})
            return
        if p.get("mode") == "stop":
            self._stop({"op": "step", "step_n": p["step"], "source": info.get("kind")})
            return
        if p.get("mode") == "restart":
            self._restart({"op": "step", "step_n": p["step"], "source": info.get("kind")})
            return
        if p.get("mode") == "diskfull":
            self._fill(p["step"], info.get("kind"))
            return
        self._record({"event": "fired", "action": "kill", "op": "step", "when": "kill", "step_n": p["step"],
                      "source": info.get("kind")})
        self._die()

    def _record(self, rec: dict[str, Any]) -> dict[str, Any]:
        """Write one record to the trace under the interposer's lock (outside a traced event)."""
        self._enter()
        try:
            return self._emit(rec)
        finally:
            self._leave()

    def _ask(self, fired: dict[str, Any], request: str, req: dict[str, Any]) -> None:
        """Record that the point fired, then leave ``request`` for the launcher stamped with that record's
        moment, both under the lock: the record is in the trace before the launcher can act on it."""
        self._enter()
        try:
            rec = self._emit({"event": "fired", **fired})
            self._request(request, {**req, "ts": rec["ts"]})
        finally:
            self._leave()

    def _term(self, step: int, source: Any) -> None:
        """Ask the launcher for SIGTERM and wait for it here, outside the lock (the job's handler runs)."""
        self._ask({"action": "term", "op": "step", "when": "term", "step_n": step, "source": source},
                  S.TERM_REQUEST, {"rank": self.rank, "step": step})
        sent = os.path.join(self._requests, S.TERM_SENT)
        deadline = time.monotonic() + TERM_WAIT_S
        while time.monotonic() < deadline:
            if os.path.exists(sent):
                _let_sigterm_land()
                return
            time.sleep(0.005)
        self._record({"event": "note", "note": f"no SIGTERM came within {TERM_WAIT_S:g} s: the job carried on"})

    def _net(self, where: dict[str, Any]) -> None:
        """Ask the launcher to cut this rank's link and wait for the cut; then the job goes on."""
        if self._net_fired:
            return
        self._net_fired = True
        self._ask({"action": "net", "when": "net", **where}, S.NET_REQUEST, {"rank": self.rank, **where})
        self._await(S.NET_DOWN, NET_WAIT_S, "the network cut request", "no network cut came")

    def _await(self, answer: str, timeout_s: float, asked: str, missing: str) -> None:
        """Wait up to ``timeout_s`` for the launcher's ``answer`` to a request the job must not run past (a
        cut, a full disk), holding the interposer's lock only where the caller does (a cut right after
        an event); then note which it was, and the job goes on."""
        path = os.path.join(self._requests, answer)
        deadline = time.monotonic() + timeout_s
        note = f"{missing} within {timeout_s:g} s: the job carried on"
        while time.monotonic() < deadline:
            if os.path.exists(path):
                note = f"the launcher answered {asked}"
                break
            time.sleep(0.005)
        self._record({"event": "note", "note": note})

    def _stop(self, where: dict[str, Any]) -> None:
        """Record the stop, tell the launcher, then SIGSTOP this whole process (every thread) right here.

        The record and the request are on disk before the signal: the launcher and the judge
        learn where the process froze from them, never from the frozen process."""
        if self._stop_fired:
            return
        self._stop_fired = True
        import signal

        self._ask({"action": "stop", "when": "stop", **where}, S.STOP_REQUEST,
                  {"rank": self.rank, "pid": os.getpid(), **where})
        os.kill(os.getpid(), signal.SIGSTOP)

    def _restart(self, where: dict[str, Any]) -> None:
        """Ask the launcher to have the engine restart this rank's container (``chaos.nemesis.restart``),
        and wait to be killed by it. The process the engine starts again finds the marker and runs on."""
        marker = S.restart_marker(self._requests, self.rank, self._attempt)
        if os.path.exists(marker):
            return  # the restarted process: the point fired in the one before it
        with open(marker, "w"):
            pass
        self._ask({"action": "restart", "when": "restart", **where}, S.RESTART_REQUEST,
                  {"rank": self.rank, "pid": os.getpid(), **where})
        self._await(S.RESTART_DONE, RESTART_WAIT_S, "the container restart request", "no container restart came")

    def _fill(self, step: int, source: Any) -> None:
        """Ask the launcher to fill {out}'s disk (the built-in ``disk:stepS:full``) and wait until it is full:
        the job's next write meets the full disk, as the built-in rank's does."""
        if self._fill_fired:
            return
        self._fill_fired = True
        self._ask({"action": "fill", "op": "step", "when": "diskfull", "step_n": step, "source": source},
                  S.FILL_REQUEST, {"rank": self.rank, "step": step})
        self._await(S.FILL_DONE, FILL_WAIT_S, "the request to fill the disk", "the disk was not filled")

    def _sched(self, where: dict[str, Any]) -> None:
        """Ask the sbatch launcher to have Slurm strike the job, and wait until its SIGTERM is here."""
        if self._sched_fired:
            return
        self._sched_fired = True
        self._ask({"action": "sched", "when": self.point["mode"], **where}, S.SCHED_REQUEST,  # type: ignore[index]
                  {"rank": self.rank, "step": where.get("step_n"), "ord": where.get("ord"),
                   "op": None if where.get("op") == "step" else where.get("op"), "path": where.get("path")})
        note = _await_sigterm(os.path.join(self._requests, S.SCHED_DONE), SCHED_WAIT_S)
        self._record({"event": "note", "note": note})


def _await_sigterm(answer: str, timeout_s: float) -> str:
    """Wait until Slurm's SIGTERM reached this process (a sched point); what happened, as a note.

    On the main thread a job's own SIGTERM handler is wrapped for the wait, so its running is
    seen (and it runs exactly as it would); with the default action the signal ends the
    process here. Elsewhere, or with SIGTERM ignored, the wait ends 50 ms after the launcher's
    answer (``_let_sigterm_land``'s reasoning). An answer saying Slurm refused ends it at once."""
    import signal
    import threading

    got: list[int] = []
    relay = None
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.getsignal(signal.SIGTERM)
        if callable(old):
            job_handler = old

            def relay(signum: int, frame: Any) -> None:
                got.append(signum)
                job_handler(signum, frame)

            signal.signal(signal.SIGTERM, relay)
    observable = relay is not None or old == signal.SIG_DFL
    try:
        deadline = time.monotonic() + timeout_s
        answered_at = None
        while time.monotonic() < deadline:
            if got:
                return "Slurm's SIGTERM reached the job: its handler ran"
            if answered_at is None and os.path.exists(answer):
                answered_at = time.monotonic()
                try:
                    with open(answer) as f:
                        said = json.load(f)
                except (OSError, ValueError):
                    said = {"done": True}
                if not said.get("done"):
                    return f"Slurm was not told: {said.get('error')}; the job carried on"
            if answered_at is not None and not observable and time.monotonic() - answered_at > 0.05:
                return "the launcher answered; whether SIGTERM arrived cannot be seen here"
            time.sleep(0.002)
        return f"no SIGTERM from Slurm within {timeout_s:g} s: the job carried on"
    finally:
        if relay is not None and signal.getsignal(signal.SIGTERM) is relay:
            signal.signal(signal.SIGTERM, old)


class _OutputScanner:
    """A stand-in for sys.stdout/sys.stderr that announces the lines matching ``--step-regex``
    (``regex``: where a step ran) and ``--loss-regex`` (``loss``: a step's loss) as probes.

    Everything is passed through to the real stream unchanged; attributes it does not
    define (``buffer``, ``fileno``, ``encoding``, ...) are the real stream's.
    """

    def __init__(self, stream: Any, step: re.Pattern[str] | None, loss: re.Pattern[str] | None) -> None:
        self._stream = stream
        self._step, self._loss = step, loss
        self._groups = S.loss_groups(loss.pattern) if loss is not None else None
        self._partial = ""

    def write(self, s: str) -> int:
        n = self._stream.write(s)
        self._partial += s
        if "\n" in self._partial:
            *lines, self._partial = self._partial.split("\n")
            for line in lines:
                self._scan(line)
        if len(self._partial) > 65536:
            self._partial = self._partial[-4096:]
        return n

    def _scan(self, line: str) -> None:
        for m in self._step.finditer(line) if self._step is not None else ():
            try:
                value = int(m.group(1))
            except (TypeError, ValueError):
                continue
            phases.phase("chaos.probe", kind="regex", n=value)
        for m in self._loss.finditer(line) if self._loss is not None else ():
            step, loss = self._groups
            try:
                n, value = int(m.group(step)), float(m.group(loss))
            except (TypeError, ValueError):
                continue
            phases.phase("chaos.probe", kind="loss", n=n, loss=value)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _preloaded_events(loaded: frozenset[str]) -> frozenset[int]:
    """The fault-free run's file events this process will not make (``ENV_IMPORT_EVENTS``: each
    made inside the import of modules, of which one is loaded already as the tracer starts: a
    zygote or a spare preloaded it); a fresh interpreter skips none."""
    try:
        events = json.loads(os.environ.get(S.ENV_IMPORT_EVENTS) or "[]")
        return frozenset(int(n) for n, mods in events if any(m in loaded for m in mods))
    except (ValueError, TypeError):
        return frozenset()


def _importing(started: frozenset[str]) -> list[tuple[str, object]]:
    """(name, file) of each module whose import is under way on this thread (its ``<module>``
    frame on the stack), innermost first: modules the job imported, not one loaded before it
    started, nor its ``__main__``."""
    found = []
    f: Any = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "<module>":
            name = f.f_globals.get("__name__")
            if isinstance(name, str) and name != "__main__" and name not in started:
                found.append((name, f.f_globals.get("__file__")))
        f = f.f_back
    return found


def _installed_file(file: str) -> bool:
    """A module file of an installed distribution. An import audited inside the import of such a
    module is brought by importing that module again, so only the outermost import of such a chain
    needs naming (``JobInterposer._on_audit``)."""
    return "site-packages" in file or "dist-packages" in file


def _is_extension(module: Any) -> bool:
    """Whether ``module`` was loaded from a shared library (a C extension)."""
    import importlib.machinery  # at the record's writing only: not on every rank's start

    file = getattr(module, "__file__", None)
    return isinstance(file, str) and file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def _reader_module() -> str:
    """The module whose code read ``os.environ`` (the first frame outside ``os`` and the mapping
    machinery, above the watch), for :meth:`JobInterposer._on_env_read`, its only caller."""
    f: Any = sys._getframe(3)  # above this, _on_env_read and the watch's __getitem__
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if name not in ("os", "_collections_abc", "collections.abc"):  # the last is _collections_abc's own name
            return str(name)
        f = f.f_back
    return ""


_environ_hook: list[Callable[[Any, str | None], None]] = []


def _watch_environ(on_read: Callable[[Any, str | None], None]) -> None:
    """Call ``on_read(key, value or None)`` at every read of ``os.environ[key]`` in this process.

    ``os.getenv``, ``os.environ.get``, ``in`` and ``copy()`` all read through
    ``os._Environ.__getitem__``, so the class's method is wrapped, once per process (a later call
    replaces the callback). Reads from native code (``getenv(3)``) are not seen: the tracer marks
    modules that load any (``_is_extension``, ``ctypes.dlopen``) instead. Called by
    :meth:`JobInterposer.note_start` in a fault-free run only.
    """
    _environ_hook[:] = [on_read]
    cls: Any = os._Environ
    if getattr(cls.__getitem__, "_chaos_watch", False):
        return
    original = cls.__getitem__

    def __getitem__(self: Any, key: Any) -> Any:
        value = None
        try:
            value = original(self, key)
        finally:
            if self is os.environ and _environ_hook:
                try:
                    _environ_hook[0](key, value)
                except Exception:  # noqa: BLE001, S110 - a read must never fail for the tracer
                    pass
        return value

    __getitem__._chaos_watch = True  # type: ignore[attr-defined]
    cls.__getitem__ = __getitem__


def _rank_attempt(env: os._Environ[str] | dict[str, str]) -> tuple[int, int]:
    """(rank, attempt). A torchrun worker's attempt is torchelastic's restart count, offset by
    ``TORCHRUN_STRIDE`` per relaunch of torchrun itself by the harness."""
    rank = env.get("RANK", env.get(S.ENV_RANK, "0"))
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", env.get(S.ENV_ATTEMPT, "0"))
    n = int(attempt) if attempt.isdigit() else 0
    base = env.get(S.ENV_ATTEMPT, "0")
    if env.get(S.ENV_RANKS_ONLY) == "1" and "TORCHELASTIC_RESTART_COUNT" in env and base.isdigit():
        n += S.TORCHRUN_STRIDE * int(base)
    return (int(rank) if rank.isdigit() else 0, n)


def should_install(env: os._Environ[str] | dict[str, str]) -> bool:
    """This process is one the harness traces: a job process, a rank, and no traced ancestor."""
    if not env.get(S.ENV_OUT) or not env.get(S.ENV_TRACE_DIR):
        return False
    if env.get(S.ENV_RANKS_ONLY) == "1" and "RANK" not in env:
        return False  # torchrun's agent: only its workers are ranks
    if env.get(S.ENV_BOOTED) and env.get(S.ENV_CHILDREN) != "1":
        return False  # a child of a traced rank (a data-loader worker): not unless asked
    return True


def _own_temp_dir(env: os._Environ[str] | dict[str, str], rank: int) -> None:
    """TMPDIR = a folder of the point's temp dir for this rank alone (``ENV_TMP``/rank<R>).

    The interposer traces the temp dir too (a file written there and moved into {out} is
    part of a save), and event ordinals are point identities: ranks sharing one temp
    dir race for what lands there first (torch's import makes its cache folder in
    whichever rank gets there first), which would shift every later ordinal of the
    loser between runs.
    """
    base = env.get(S.ENV_TMP)
    if not base:
        return
    own = os.path.abspath(os.path.join(base, f"rank{rank}"))
    os.makedirs(own, exist_ok=True)
    env["TMPDIR"] = own
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        # Where a module preloaded before the tracer (a spare's, a zygote's) has asked already, the
        # folder is set without the probe tempfile makes on first use (a file written and removed
        # there): the fault-free run made that probe inside the module's import, an event this
        # process skips (JobSpec.import_events). Else TMPDIR is read again on first use, as it was.
        tempfile.tempdir = own if tempfile.tempdir is not None else None


def install() -> JobInterposer | None:
    """Install the tracer in this process if the environment says so; None otherwise."""
    global _installed
    env = os.environ
    if _installed is not None or not should_install(env):
        return None
    rank, attempt = _rank_attempt(env)
    _own_temp_dir(env, rank)
    point: dict[str, Any] | None = None
    for key in (S.ENV_POINT, S.ENV_POINT_THEN):  # a torchrun worker's second fault: the agent's restart's
        p = json.loads(env[key]) if env.get(key) else None
        if p is not None and p.get("rank") == rank and attempt == p.get("attempt", 0):
            point = p
    tdir = env[S.ENV_TRACE_DIR]
    pid = os.getpid()
    # a container the engine restarted in place (chaos.nemesis.restart) runs its process again, often
    # under the same pid: it writes a trace of its own, never after a line the first one's death tore
    again = (point is not None and point.get("mode") == "restart"
             and os.path.exists(S.restart_marker(tdir, rank, attempt)))
    traced = S.IN_PLACE_BASE + attempt if again else attempt  # (contract.IN_PLACE_BASE)
    trace = os.path.join(tdir, f"trace-r{rank}-a{traced}-p{pid}.jsonl")
    ix = JobInterposer(env[S.ENV_OUT], rank, trace, point).install()
    ix.child = bool(env.get(S.ENV_BOOTED))  # started by a traced rank (CHAOS_JOB_CHILDREN=1)
    _installed = ix
    env[S.ENV_BOOTED] = str(pid)
    env[S.PROBE_FILE_ENV] = os.path.join(tdir, f"probe-r{rank}-a{traced}-p{pid}.jsonl")
    if "chaosio" in env.get("LD_PRELOAD", ""):  # the native tracer (launch.job.job_env)
        from chaos.target.job import native

        why = native.attach(ix, rank, traced, tdir, point)
        if why is not None:
            ix.note_native_off(why)
    ix.note_start(attempt)  # after attach: the variable it exports is the harness's, not the job's
    if env.get(S.ENV_CHILDREN) != "1":
        os.register_at_fork(after_in_child=_forget)
    step_rx, loss_rx = env.get(S.ENV_STEP_REGEX), env.get(S.ENV_LOSS_REGEX)
    if step_rx or loss_rx:
        step, loss = (re.compile(step_rx) if step_rx else None), (re.compile(loss_rx) if loss_rx else None)
        sys.stdout = _OutputScanner(sys.stdout, step, loss)
        sys.stderr = _OutputScanner(sys.stderr, step, loss)
    return ix


def _forget() -> None:
    """In a forked child of a traced rank: stop tracing (its records would be the rank's)."""
    global _installed
    if _installed is not None:
        _installed.uninstall()
        _installed = None
