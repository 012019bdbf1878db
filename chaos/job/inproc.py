"""Inside a job's rank process: trace its file events under {out} and fire one point.

Called by ``boot/sitecustomize.py`` as the interpreter starts, before the job's own
code runs. Everything it needs comes from the ``ENV_*`` variables of
:mod:`chaos.job.spec`; without ``CHAOS_JOB_OUT`` nothing happens.

The tracer is :class:`faults.interposer.Interposer` with three additions made by
subclassing, not by editing it:

- every op record carries ``ord``, the ordinal of the rank's file event (0, 1, ...),
  which is what a point names (``rank0:op17:before``). Ordinals, unlike paths, are
  stable when a job writes random temp names (``tempfile.mkstemp``);
- a point fires *before* event N (the event is not performed), *after* it (its record
  is on disk, then SIGKILL), or *torn* (a write stores the first half of its bytes,
  then SIGKILL, through the interposer's own ``short_write`` rule);
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
from typing import Any

from chaos import phases
from chaos.job import spec as S
from faults.interposer import Interposer, IORule

_installed: JobInterposer | None = None


class JobInterposer(Interposer):
    """The interposer, numbering file events and firing one ``Point`` given as a dict."""

    def __init__(self, root: str, rank: int, trace_path: str, point: dict[str, Any] | None) -> None:
        torn = point is not None and point.get("mode") == "torn"
        rules = [IORule("short_write", op="write", keep=None, then="kill", times=None)] if torn else []
        super().__init__(root, rank=rank, trace_path=trace_path, rules=rules, keep_records=False)
        self.point = point
        self._ord = 0
        self._cur: int | None = None

    def _target(self, mode: str) -> bool:
        p = self.point
        return p is not None and p.get("mode") == mode and p.get("op") == self._cur

    def _match(self, kind: str, paths: tuple[str, ...], offset: int | None = None,
               length: int | None = None) -> list[int]:
        # Called exactly once per traced op, before it is performed, under the lock.
        self._cur = self._ord
        self._ord += 1
        if self._target("torn"):
            if kind == "write" and length and length > 1:
                return [0]  # _do_write keeps the first half (keep=None), records it, fires, dies
            self._cut(kind, paths, "before", note="torn point on a non-write or 1-byte event: killed before it")
        if self._target("before"):
            self._cut(kind, paths, "before")
        return []

    def _op(self, kind: str, **fields: Any) -> dict[str, Any]:
        fields.setdefault("ord", self._cur)
        rec = super()._op(kind, **fields)
        if self._target("after") and fields["ord"] == self._cur:
            self._cut(kind, (fields.get("path"),), "after")
        return rec

    def _fire(self, i: int, kind: str, paths: tuple[str, ...], **point: Any) -> dict[str, Any]:
        point.setdefault("ord", self._cur)
        point.setdefault("when", "torn")
        return super()._fire(i, kind, paths, **point)

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
        if (p is None or p.get("step") is None or name != "chaos.probe"
                or info.get("kind") not in ("step", "regex") or info.get("n") != p["step"]):
            return
        self._enter()
        try:
            self._emit({"event": "fired", "action": "kill", "op": "step", "when": "kill", "step_n": p["step"],
                        "source": info.get("kind")})
        finally:
            self._leave()
        self._die()


class _StepScanner:
    """A stand-in for sys.stdout/sys.stderr that announces lines matching the step regex.

    Everything is passed through to the real stream unchanged; attributes it does not
    define (``buffer``, ``fileno``, ``encoding``, ...) are the real stream's.
    """

    def __init__(self, stream: Any, regex: re.Pattern[str]) -> None:
        self._stream = stream
        self._regex = regex
        self._partial = ""

    def write(self, s: str) -> int:
        n = self._stream.write(s)
        self._partial += s
        if "\n" in self._partial:
            *lines, self._partial = self._partial.split("\n")
            for line in lines:
                for m in self._regex.finditer(line):
                    try:
                        value = int(m.group(1))
                    except (TypeError, ValueError):
                        continue
                    phases.phase("chaos.probe", kind="regex", n=value)
        if len(self._partial) > 65536:
            self._partial = self._partial[-4096:]
        return n

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _rank_attempt(env: os._Environ[str] | dict[str, str]) -> tuple[int, int]:
    rank = env.get("RANK", env.get(S.ENV_RANK, "0"))
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", env.get(S.ENV_ATTEMPT, "0"))
    return (int(rank) if rank.isdigit() else 0, int(attempt) if attempt.isdigit() else 0)


def should_install(env: os._Environ[str] | dict[str, str]) -> bool:
    """This process is one the harness traces: a job process, a rank, and no traced ancestor."""
    if not env.get(S.ENV_OUT) or not env.get(S.ENV_TRACE_DIR):
        return False
    if env.get(S.ENV_RANKS_ONLY) == "1" and "RANK" not in env:
        return False  # torchrun's agent: only its workers are ranks
    if env.get(S.ENV_BOOTED) and env.get(S.ENV_CHILDREN) != "1":
        return False  # a child of a traced rank (a data-loader worker): not unless asked
    return True


def install() -> JobInterposer | None:
    """Install the tracer in this process if the environment says so; None otherwise."""
    global _installed
    env = os.environ
    if _installed is not None or not should_install(env):
        return None
    rank, attempt = _rank_attempt(env)
    point: dict[str, Any] | None = None
    if env.get(S.ENV_POINT):
        p = json.loads(env[S.ENV_POINT])
        if p.get("rank") == rank and attempt == 0:
            point = p
    tdir = env[S.ENV_TRACE_DIR]
    pid = os.getpid()
    trace = os.path.join(tdir, f"trace-r{rank}-a{attempt}-p{pid}.jsonl")
    ix = JobInterposer(env[S.ENV_OUT], rank, trace, point).install()
    _installed = ix
    env[S.ENV_BOOTED] = str(pid)
    env[S.PROBE_FILE_ENV] = os.path.join(tdir, f"probe-r{rank}-a{attempt}-p{pid}.jsonl")
    if env.get(S.ENV_CHILDREN) != "1":
        os.register_at_fork(after_in_child=_forget)
    regex = env.get(S.ENV_STEP_REGEX)
    if regex:
        rx = re.compile(regex)
        sys.stdout = _StepScanner(sys.stdout, rx)
        sys.stderr = _StepScanner(sys.stderr, rx)
    return ix


def _forget() -> None:
    """In a forked child of a traced rank: stop tracing (its records would be the rank's)."""
    global _installed
    if _installed is not None:
        _installed.uninstall()
        _installed = None
