"""Which files of a checkpoint the loader really reads, in order: where at-rest faults land.

An at-rest fault (a planted payload, a bit flip, a truncation...) tests something only
where the next load looks. A file drawn at random from the newest checkpoint is, for a
checkpointer with many shards and one manifest, almost always a shard: a pickled
manifest that every rank unpickles on load then never receives a payload, and a
checkpointer that checks its shards but not its manifest passes (issue #34, item 16).
So the environment (``chaos.nemesis.environment.Environment.corrupt``) first traces one
fault-free load of the very checkpoint it is about to attack, and picks from the files
that load opened:

1. the tree under the checkpoint root is copied into the scenario's scratch root (the
   load must not change what is attacked: a loader may tidy up as it reads);
2. one ``verify`` launch (the launcher's ``verify``, ``chaos.launch.cluster.verify``: every rank constructs the
   checkpointer and calls ``load_latest`` once) runs the real checkpointer on the
   copy, wrapped by :class:`LoadTracer`, which records every ``open`` of a file
   under the root before it happens: a Python audit hook (``sys.addaudithook``) sees
   ``builtins.open`` / ``io.open`` / ``os.open`` with their modes (``torch.load``'s own
   open included), and the I/O interposer (``trace_io``) resolves the ``os.open(...,
   dir_fd=)`` component walks that an audit event names only relatively;
3. :func:`reads_of` turns both streams into each rank's files in the order they were
   first opened for reading, and :func:`merge` into one order (every rank's first file,
   then every rank's second, ...); :func:`kind_of` names what each file is with its step,
   rank and other numbers made ``*`` (``step-*/manifest.pkl``, ``step-*/rank*.pt``,
   ``latest``), a glob that ``file=`` takes as it is.

:func:`choose` then picks the target: without ``file=``, the first kind of file the load
read (for a payload, the first one already in the payload's format: a pickle payload
goes to the first pickle or torch zip read, not to a text ``latest`` pointer), one of its
files drawn with the fault's seed; with ``file=GLOB``, a file the load read among those
the glob matches, drawn with the seed. Every choice is recorded (``choice`` in the
fault's record: the kinds in read order, the files the draw was made from, the
``random.Random`` key), so the target follows from the seed and the record. When no
load could be traced (an object store, a checkpointer that reads only from C, a driver
that does not hand over its launch plan, a load that failed), the choice is the one
made before this module existed (seeded among the newest checkpoint's files) and the
record says why.

Each scenario traces its own load (once, before its first at-rest fault): one ``verify``
launch on the warm fork server, measured at 0.35-0.65 s for two ranks here, against a
scenario's 5-20 s. Tracing the very checkpoint that is attacked keeps the record exact
(the files it lists are the files of that checkpoint) and a replay traces the same load
again. (A cache beside the golden runs would need the run options' cache directory,
which ``chaos.run.runner`` does not hand to the environment.)

Called by ``chaos.nemesis.environment``; ``chaos.run.campaign`` reads the recorded kinds to cover
every kind of file the loader reads over a campaign.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos.model.fault import Fault

TRACER_SPEC = "chaos.plan.loadtrace:LoadTracer"
READ_LOG = "reads-rank{rank}.jsonl"  # in the traced launch's log directory
SHOWN_READS = 40  # files of the read order kept in a fault's record
TRACE_TIMEOUT_S = 300.0
_WRITE_MODE = frozenset("wax+")
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")
_SEPARATORS = re.compile(r"([/._-])")
_NONCE = re.compile(r"[0-9a-fA-F]{6,}")  # a hex token with a digit in it: a nonce, a hash, a uuid part


# ---------------------------------------------------------------------- in the rank
class LoadTracer:
    """The checkpointer under test, wrapped for one traced load (a ``verify`` launch only).

    Constructed by the rank (``chaos.target.workload.train``) like any checkpointer, with
    ``inner`` (the spec under test), ``inner_options`` (its options) and ``read_dir``
    (where this rank's read events go, :data:`READ_LOG`). It installs an audit hook
    before it constructs the inner checkpointer, so the constructor's reads count too,
    then hands every call on. The hook cannot be removed; the rank exits after the load.
    """

    def __init__(self, root: str, rank: int, world_size: int, inner: str, read_dir: str,
                 inner_options: dict[str, Any] | None = None) -> None:
        from chaos.target.protocol import load_checkpointer

        _install_audit(os.path.join(read_dir, READ_LOG.format(rank=rank)), os.path.realpath(root))
        self.inner = load_checkpointer(inner)(root, rank, world_size, **(inner_options or {}))
        self.auxiliary_files = getattr(self.inner, "auxiliary_files", ()) or ()

    def save(self, step: int, state: dict) -> None:
        self.inner.save(step, state)

    def wait(self) -> None:
        self.inner.wait()

    def load_latest(self, template: dict) -> tuple[int, dict] | None:
        return self.inner.load_latest(template)

    def close(self) -> None:
        self.inner.close()


def _install_audit(log_path: str, root: str) -> None:
    """Append one JSON line per ``open`` event naming a path under ``root`` to ``log_path``.

    The line says the path (absolute, resolved against the current directory; an
    ``os.open`` relative to a ``dir_fd`` is kept relative and marked, since the event does
    not say which directory), the mode (``None`` for ``os.open``), the flags and a
    ``time.monotonic()`` stamp, comparable with the interposer's ``ts``. Written with one
    ``os.write`` each, so a rank killed mid-load leaves every line before it.
    """
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    prefix = root.rstrip(os.sep) + os.sep
    busy = [False]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or busy[0] or len(args) < 3:
            return
        path, mode, flags = args[0], args[1], args[2]
        if isinstance(path, int) or path is None:
            return
        busy[0] = True
        try:
            text = os.fsdecode(path)
            relative = not os.path.isabs(text)
            if relative and mode is None:  # os.open(name, dir_fd=...): the interposer resolves those
                return
            full = os.path.abspath(text)
            if not (full + os.sep).startswith(prefix) and not full.startswith(prefix):
                return
            rec = {"path": full, "mode": mode if isinstance(mode, str) else None,
                   "flags": int(flags) if isinstance(flags, int) else None, "ts": time.monotonic()}
            os.write(fd, (json.dumps(rec) + "\n").encode())
        except Exception:  # noqa: BLE001, S110 - an audit hook must never break the load it watches
            pass
        finally:
            busy[0] = False

    sys.addaudithook(hook)


# ---------------------------------------------------------------------- reading the traces
def _reads_flags(flags: Any) -> bool:
    """An ``open`` with these flags only reads (interposer records name them, audit ones are ints)."""
    if isinstance(flags, int):
        return flags & os.O_ACCMODE == os.O_RDONLY and not flags & (os.O_CREAT | os.O_TRUNC)
    if isinstance(flags, list):
        return not any(f in _WRITE_FLAGS for f in flags)
    return False


def reads_of(audit: Iterable[dict[str, Any]], interposed: Iterable[dict[str, Any]], root: str) -> list[str]:
    """One rank's files under ``root`` (relative paths) in the order it first opened them to read.

    ``audit``: the :class:`LoadTracer` lines; ``interposed``: the interposer's trace
    records (``faults.interposer.read_trace``), whose read-only ``os.open`` records name
    the resolved path. Directories, writes and files that no longer exist are left out.
    """
    root = os.path.realpath(root)
    events: list[tuple[float, str]] = []
    for rec in audit:
        mode, path = rec.get("mode"), rec.get("path")
        if not isinstance(path, str):
            continue
        if isinstance(mode, str):
            if _WRITE_MODE & set(mode):
                continue
        elif not _reads_flags(rec.get("flags")):
            continue
        events.append((float(rec.get("ts") or 0.0), path))
    for rec in interposed:
        if rec.get("event") != "op" or rec.get("op") != "open" or rec.get("error") is not None or rec.get("is_dir"):
            continue
        if "flags" in rec and _reads_flags(rec.get("flags")) and isinstance(rec.get("path"), str):
            events.append((float(rec.get("ts") or 0.0), rec["path"]))
    out: list[str] = []
    for _ts, path in sorted(events, key=lambda e: e[0]):
        real = os.path.realpath(path)
        if not real.startswith(root.rstrip(os.sep) + os.sep) or not os.path.isfile(real):
            continue
        rel = os.path.relpath(real, root)
        if rel not in out:
            out.append(rel)
    return out


def merge(per_rank: dict[int, list[str]]) -> list[str]:
    """Every rank's first file, then every rank's second, ... (rank order within a round), once each."""
    out: list[str] = []
    depth = max((len(v) for v in per_rank.values()), default=0)
    for i in range(depth):
        for rank in sorted(per_rank):
            if i < len(per_rank[rank]) and per_rank[rank][i] not in out:
                out.append(per_rank[rank][i])
    return out


def _escape(text: str) -> str:
    """``text`` as a literal fnmatch pattern (and no comma: ``file=`` values are comma-separated)."""
    return re.sub(r"[\[\]*?]", lambda m: f"[{m.group(0)}]", text).replace(",", "?")


def kind_of(rel: str) -> str:
    """What a file is, as a glob: its path with every number (and hex nonce) made ``*``.

    ``step-00000020/rank1.pt`` -> ``step-*/rank*.pt``; ``latest`` -> ``latest``;
    ``step-20/__1_0.distcp`` -> ``step-*/__*_*.distcp``; ``data/step-8-3fa9c1/m.json`` ->
    ``data/step-*-*/m.json``. The same file of two steps, or of two ranks, is one kind;
    ``fnmatch`` (``file=``) matches the kind's files, and nothing else matches a literal
    character of it (``[``, ``]``, ``?`` and ``*`` of a name are escaped; a comma, which
    ``file=`` cannot carry, becomes ``?``).
    """
    out = []
    for token in _SEPARATORS.split(rel):
        if _NONCE.fullmatch(token) and any(c.isdigit() for c in token):
            out.append("*")
        else:
            out.append("*".join(_escape(t) for t in re.split(r"\d+", token)))
    return re.sub(r"\*+", "*", "".join(out))


def matches(rel: str, kind: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(rel, kind)


@dataclass
class LoadTrace:
    """One traced fault-free load: each rank's reads, the merged order and their kinds."""

    per_rank: dict[int, list[str]] = field(default_factory=dict)
    error: str | None = None  # why there is no trace
    seconds: float = 0.0

    @property
    def order(self) -> list[str]:
        return merge(self.per_rank)

    @property
    def kinds(self) -> list[str]:
        out: list[str] = []
        for rel in self.order:
            k = kind_of(rel)
            if k not in out:
                out.append(k)
        return out

    def summary(self) -> dict[str, Any]:
        order = self.order
        return {"error": self.error, "seconds": round(self.seconds, 3),
                "files_read": len(order), "read": order[:SHOWN_READS], "kinds": self.kinds}


# ---------------------------------------------------------------------- tracing a load
def trace_load(plan: Any, root: str, scratch: str, storage_scheme: str | None = None, *,
               verify: Callable[[Any], Any], trace_path: Callable[[str, int, str], str],
               verify_kind: str = "verify") -> LoadTrace:
    """The reads of one fault-free load of the checkpoint tree at ``root`` by ``plan``'s checkpointer.

    Runs on a copy of the tree in a fresh directory under ``scratch`` (removed after),
    one ``verify`` launch of ``plan.world_size`` ranks (``plan``: a ``chaos.launch.cluster.LaunchPlan``;
    ``verify``, ``trace_path`` and ``verify_kind``: the launcher's own, handed down so that
    this module never imports the launcher). Bound to its plan by ``chaos.launch.cluster.run`` and
    called by ``chaos.nemesis.environment.Environment`` before its first at-rest fault, with every
    rank of the job down. Never raises for the harness's sake: a launch that does not finish, or
    a tree that cannot be copied, gives a trace with ``error`` set (the choice then falls
    back and says why); an interrupt is raised.
    """
    if plan.checkpointer is None:
        return LoadTrace(error="no checkpointer")
    if storage_scheme not in (None, "file"):
        return LoadTrace(error=f"the checkpoint lives in {storage_scheme}:// storage, whose reads no trace sees")
    import tempfile

    t0 = time.monotonic()
    os.makedirs(scratch, exist_ok=True)
    work = tempfile.mkdtemp(prefix="load-trace-", dir=scratch)
    try:
        return _trace_copy(plan, root, work, storage_scheme, t0, verify, trace_path, verify_kind)
    except Exception as exc:  # noqa: BLE001 - no trace is a recorded fallback, never a harness error
        return LoadTrace(error=f"the fault-free load could not be traced: {type(exc).__name__}: {exc}"[:400],
                         seconds=time.monotonic() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _trace_copy(plan: Any, root: str, work: str, storage_scheme: str | None, t0: float,
                verify: Callable[[Any], Any], trace_path: Callable[[str, int, str], str],
                verify_kind: str) -> LoadTrace:
    """``trace_load``'s work inside its directory ``work``."""
    import dataclasses

    from faults.interposer import read_trace

    copy = os.path.join(work, "ckpt")
    shutil.copytree(root, copy, symlinks=True)
    options = dict(plan.ckpt_options)
    if storage_scheme == "file":
        options["storage"] = copy
    logs = os.path.join(work, "logs")
    os.makedirs(logs)
    traced = dataclasses.replace(
        plan, checkpointer=TRACER_SPEC, faults=[], max_restarts=0, trace_io=True, log_dir=logs, progress=None,
        ckpt_root=copy, attempt_timeout_s=min(plan.attempt_timeout_s, TRACE_TIMEOUT_S),
        ckpt_options={"inner": plan.checkpointer, "inner_options": options, "read_dir": logs})
    result = verify(traced)
    trace = LoadTrace(seconds=time.monotonic() - t0)
    if result.outcome != "ok":
        trace.error = (f"the traced fault-free load did not finish ({result.outcome}"
                       f"{': ' + result.detail[:200] if result.detail else ''})")
        return trace
    for rank in range(plan.world_size):
        audit = _read_jsonl(os.path.join(logs, READ_LOG.format(rank=rank)))
        interposed = read_trace(trace_path(logs, rank, verify_kind))
        trace.per_rank[rank] = reads_of(audit, interposed, copy)
    if not trace.order:
        trace.error = ("the fault-free load opened no file under the checkpoint root through Python "
                       "(reads done in C, C++ or Rust, e.g. safetensors' own reader, are invisible)")
    return trace


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# ---------------------------------------------------------------------- the choice
def choose(fault: Fault, root: str, files: list[str], trace: LoadTrace | None,
           why_untraced: str | None = None) -> tuple[str, dict[str, Any]]:
    """The target of ``fault`` among ``files`` (absolute, under ``root``) and the record of the choice.

    ``trace``: the fault-free load's reads (None or with ``error``: none). The draw is
    ``random.Random(choice["rng"]).choice(choice["among"])`` over relative paths, always.
    """
    seed = int(fault.param("seed", 0))
    rng = f"{seed}:{fault.kind}:target"
    pattern = fault.param("file")
    rel = {os.path.relpath(f, root): f for f in files}
    if pattern is not None:  # as faults.corrupt.checkpoint_files matches: the relative path or the name
        rel = {r: f for r, f in rel.items() if matches(r, str(pattern)) or matches(os.path.basename(r), str(pattern))}
    if not rel:
        raise ValueError(f"no file to choose from (file={pattern!r})")
    record: dict[str, Any] = {"rng": rng}
    problem = why_untraced or (trace.error if trace is not None else "no load was traced")
    if trace is None or trace.error or not trace.order:
        among = sorted(rel)
        record.update(by="seeded", why=f"no load traced: {problem}; chosen as before this choice followed the "
                                         f"load: seeded among the newest checkpoint's files")
    else:
        kinds = trace.kinds
        by_kind = {k: sorted(r for r in rel if matches(r, k)) for k in kinds}
        read = sorted({r for k in kinds for r in by_kind[k]})
        record.update(kinds=kinds, trace=trace.summary())
        if not read:
            among = sorted(rel)
            record.update(by="seeded", why=(f"no candidate file is of a kind the fault-free load read "
                                            f"({', '.join(kinds)}): seeded among the newest checkpoint's files"))
        elif pattern is not None:
            among = read
            record.update(by="seeded among read", why=f"file={pattern}: seeded among the matching files "
                                                      f"the fault-free load read")
        else:
            order = [k for k in kinds if by_kind[k]]
            if fault.kind == "payload":
                from faults.payload import speaks

                fmt = str(fault.param("format", "pickle"))
                fits = [k for k in order if any(speaks(rel[r], fmt) for r in by_kind[k])]
                order = fits + [k for k in order if k not in fits]
                record["format_fits"] = fits
            among = by_kind[order[0]]
            record.update(by="first read", why=("the first kind of file the fault-free load read"
                                                + (" in the payload's format" if record.get("format_fits") else "")
                                                + f" ({order[0]}), one of its files drawn with the seed"))
    target = random.Random(rng).choice(among)
    record.update(among=among, kind=kind_of(target))
    return rel[target], record


__all__ = ["TRACER_SPEC", "LoadTrace", "LoadTracer", "choose", "kind_of", "matches", "merge", "reads_of",
           "trace_load"]
