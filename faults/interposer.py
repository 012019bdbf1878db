"""In-rank I/O interposer: trace every file operation under a root, and fire faults.

Installed inside a rank process before the checkpointer runs. It replaces, for the
life of the installation, ``builtins.open`` / ``io.open`` and the ``os`` functions a
Python checkpointer reaches directly or through ``pathlib``, ``shutil`` and
``tempfile``:

    open/io.open   file objects whose *raw* layer is traced: a write is recorded when
                   its bytes reach the kernel (on flush, close or a full buffer), at
                   the file offset they land on (seeks and appends are reflected), so
                   the trace is what a crash would leave, not what sat in a buffer.
    os.open write pwrite sendfile fsync fdatasync truncate ftruncate close
    os.rename replace link unlink remove mkdir rmdir   (makedirs, Path.*, shutil.*,
                   tempfile.* all end up here; ``dir_fd=`` forms are resolved)

``open(x, opener=f)`` is traced under the file ``f`` really opened, never under ``x`` (only
the name handed to ``f``): ``tempfile.NamedTemporaryFile(dir=d)`` is ``io.open(d,
opener=...)`` whose opener makes ``d/tmpXXXX``, so its open, writes, fsyncs and close name
``d/tmpXXXX`` and its later rename moves a file the trace saw created. The opener's own
``os.open`` is the traced open (its record says ``"opener": "io.open"``); an fd the opener
got some other way is traced from ``/proc/self/fd/N``. An anonymous ``O_TMPFILE`` file
(``tempfile.TemporaryFile``, a rolled-over ``SpooledTemporaryFile``) is not traced: it has
no name, so no crash can leave it in the tree.

Only paths whose realpath lies under ``root`` are traced, plus files made under the
*extra roots* (default: the process's temp dir, ``$TMPDIR``, which in a rank is the
scenario's scratch ``tmp``): a file or directory there is traced from its creation
(``open`` with ``O_CREAT``/``"w"``/``"x"``, ``mkstemp``, ``mkdtemp``, a truncating open)
until it is unlinked or moved away, so a save that writes a temp file outside the root
and moves it in (Lightning's ``_atomic_save`` through fsspec) is one traced sequence:
open, writes, close, then a rename whose ``src`` is the temp file (or, across file
systems, ``shutil.move``'s copy into the root and the unlink). A file of an extra root
that was there before is never traced (its history is unknown); a rename into the root
from a path nothing traced records ``src_untraced`` and the moved file's bytes (like a
write's data), so a crash model can take it as it was. Everything else (imports,
logging, stdout) goes straight to the original functions after one dict lookup or
one path check. Calls made while the interposer itself is busy are never traced.

Each traced op becomes one JSON line, appended with a single ``write(2)`` to the
trace file as it happens, so the trace survives a SIGKILL of the rank a moment
later. The bytes of each write go to a side file (``<trace>.data``), referenced by
``data_off``/``data_len``; ``max_data_bytes`` bounds it. Example lines for
``with open(root/"a.tmp", "wb") as f: f.write(b"x" * 10); os.fsync(f.fileno())``
followed by ``os.replace(root/"a.tmp", root/"a")``::

    {"event":"op","seq":0,"rank":0,"op":"open","path":"/r/a.tmp","fd":5,"created":true,"trunc":true,...}
    {"event":"op","seq":1,"rank":0,"op":"write","path":"/r/a.tmp","fd":5,"offset":0,"length":10,"data_off":0,...}
    {"event":"op","seq":2,"rank":0,"op":"fsync","path":"/r/a.tmp","fd":5,...}
    {"event":"op","seq":3,"rank":0,"op":"close","path":"/r/a.tmp","fd":5,...}
    {"event":"op","seq":4,"rank":0,"op":"rename","src":"/r/a.tmp","dst":"/r/a","via":"replace",...}

An op's ``ts`` (``time.monotonic()``, one clock for every process of a machine) is when
it *began*: taken before its syscall, though the line is written after it returns. Ranks'
traces are merged by it (:func:`faults.crashstate.merge_traces`), and an op that
completed before another began is then ordered first even when its thread was
descheduled before writing its line; within a rank ``seq`` orders, as the lock does.

Rules (``IORule``) fire at an exact point; the fired point is appended to the trace
as ``{"event":"fired",...}`` *before* the action, so it survives the kill it causes:

- the Nth op of a kind, optionally only on paths matching a glob:
  ``IORule("kill", op="rename", nth=1, path_glob="*.safetensors")``;
- byte X of a file: ``IORule("kill", byte=4096, path_glob="shard-*")`` fires on the
  write that would cover offset 4096 (``offset <= X < offset+length``). Bytes before X
  are written first, so a file written sequentially is left exactly 4096 bytes long;
- a phase announced through :mod:`chaos.phases`, optionally of the save at one step:
  ``IORule("kill", phase="rename", step=10)``. With ``op`` set as well the phase only
  *arms* the rule and the Nth matching op after it fires.

Actions: ``kill`` (SIGKILL self), ``enospc`` / ``eio`` (raise OSError with that
errno; for a write, after writing the bytes before X when ``byte`` is set),
``short_write`` (write only ``keep`` bytes, then ``then="kill"`` or ``"return"`` the
short count), ``fsync_fail`` (fsync/fdatasync raises EIO without syncing), ``delay``
(sleep ``delay_s``, then do the op). A matched non-write op is *not* performed when
its action is kill or an error.

Native writers: while installed, :mod:`faults.native` wraps ``torch.save`` /
``torch.serialization.save`` and safetensors ``save_file`` (torch and numpy), patching
modules imported later as their import finishes, so a file they write to a traced path
is an ordinary traced open/write/close sequence whose open says ``"via": "torch.save"``
or ``"via": "safetensors.save_file"`` (``native=False`` turns this off).

Not seen: other I/O done in C/C++/Rust (numpy ``tofile``, a name bound to the
original ``torch.save`` before install), memory maps, ``os.writev``/``pwritev``, and
processes started by the rank. :func:`untraced_changes` finds such writes after the
fact by comparing a snapshot of the tree, so the record can say "I/O not traced"
instead of guessing.
"""

from __future__ import annotations

import builtins
import errno as _errno
import fnmatch
import io
import json
import os
import signal
import stat
import sys
import threading
import time

from faults import phases
from faults.errors import ConfigError

# This module is imported as every traced rank process starts (``chaos run -- COMMAND``'s
# boot path), so it keeps off the imports a pure-Python job would not pay for itself:
# ``typing`` only for type checkers, and small hand-written classes where
# ``dataclasses`` (and the ``inspect`` it imports) would cost each process ~5 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

OP_KINDS = (
    "open", "write", "truncate", "fsync", "fdatasync", "close",
    "rename", "link", "unlink", "mkdir", "rmdir",
)
ACTIONS = ("kill", "enospc", "eio", "short_write", "fsync_fail", "delay")
_FSYNC_KINDS = ("fsync", "fdatasync")
_WRITE_MODES = frozenset("wax+")
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)  # includes O_DIRECTORY's bit


class IORule:
    """One fault to fire at an exact point of a rank's I/O.

    ``op``        op kind to match (one of ``OP_KINDS``); ``rename`` also matches
                  ``os.replace``. Defaults: ``write`` when ``byte`` is set, fsync and
                  fdatasync for ``fsync_fail``; otherwise any kind.
    ``nth``       fire on the Nth match (1-based), counted after arming for a phase rule.
    ``path_glob`` fnmatch pattern on the root-relative path (``*`` crosses ``/``); a
                  pattern without ``/`` also matches the basename alone. For renames
                  and links either side may match.
    ``byte``      fire on the write covering this file offset, after writing the bytes
                  before it.
    ``phase``     name announced through chaos.phases; ``step`` restricts it to the
                  announcement whose ``info["step"]`` equals it. Without ``phase``,
                  ``step`` restricts ops to those after the most recent announcement
                  of that step.
    ``times``     fire at most this many times (``None``: every match from the Nth on).
    ``past``      with ``byte``: match every write reaching past X, not only the one
                  covering it (a per-file size limit: ``IORule("enospc", byte=X,
                  past=True, times=None)`` is the disk-full fallback without root).
    """

    __slots__ = ("action", "op", "nth", "path_glob", "byte", "phase", "step", "delay_s", "keep", "then",
                 "times", "past")

    def __init__(self, action: str, op: str | None = None, nth: int = 1, path_glob: str | None = None,
                 byte: int | None = None, phase: str | None = None, step: int | None = None,
                 delay_s: float = 0.0, keep: int | None = None, then: str = "kill", times: int | None = 1,
                 past: bool = False) -> None:
        self.action, self.op, self.nth, self.path_glob = action, op, nth, path_glob
        self.byte, self.phase, self.step, self.delay_s = byte, phase, step, delay_s
        self.keep, self.then, self.times, self.past = keep, then, times, past
        self._validate()

    def __eq__(self, other: object) -> bool:
        return type(other) is IORule and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass would be

    def __repr__(self) -> str:
        return "IORule(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"

    def _validate(self) -> None:
        if self.action not in ACTIONS:
            raise ConfigError(f"unknown I/O action {self.action!r}; expected one of {ACTIONS}")
        if self.op is not None and self.op not in OP_KINDS:
            raise ConfigError(f"unknown op kind {self.op!r}; expected one of {OP_KINDS}")
        if self.nth < 1:
            raise ConfigError(f"nth must be >= 1, got {self.nth}")
        if self.byte is not None:
            if self.byte < 0:
                raise ConfigError(f"byte must be >= 0, got {self.byte}")
            if self.op not in (None, "write"):
                raise ConfigError("a byte rule matches writes only")
        if self.action == "fsync_fail" and self.op not in (None, *_FSYNC_KINDS):
            raise ConfigError("fsync_fail applies to fsync/fdatasync only")
        if self.action == "short_write" and self.op not in (None, "write"):
            raise ConfigError("short_write applies to writes only")
        if self.then not in ("kill", "return"):
            raise ConfigError(f"then must be 'kill' or 'return', got {self.then!r}")
        if self.action == "delay" and self.delay_s <= 0:
            raise ConfigError("a delay rule needs delay_s > 0")

    def kinds(self) -> tuple[str, ...] | None:
        """Op kinds this rule can match (None: any)."""
        if self.op is not None:
            return (self.op,)
        if self.byte is not None or self.action == "short_write":
            return ("write",)
        if self.action == "fsync_fail":
            return _FSYNC_KINDS
        return None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IORule:
        return cls(**d)


class _RuleState:
    __slots__ = ("count", "fired", "armed")

    def __init__(self) -> None:
        self.count, self.fired, self.armed = 0, 0, False


class _Fd:
    __slots__ = ("path", "append", "is_dir")

    def __init__(self, path: str, append: bool = False, is_dir: bool = False) -> None:
        self.path, self.append, self.is_dir = path, append, is_dir


class _Kill(BaseException):
    """Never raised in practice: os.kill(SIGKILL) does not return."""


def _default_temp_dir() -> str:
    """The directory ``tempfile`` would use, found without its probe: ``gettempdir()``
    writes and removes a test file on first use, and nothing of the interposer's own
    may land in a rank's temp dir (``$TMPDIR``, the scenario's scratch ``tmp``)."""
    tempfile = sys.modules.get("tempfile")  # not imported here: it costs a rank ~3 ms at start
    if tempfile is not None and tempfile.tempdir is not None:
        return tempfile.tempdir
    for name in ("TMPDIR", "TEMP", "TMP"):
        d = os.environ.get(name)
        if d and os.path.isdir(d):
            return d
    for d in ("/tmp", "/var/tmp", "/usr/tmp"):
        if os.path.isdir(d):
            return d
    return os.getcwd()


def _fsync_target(fd: Any) -> int:
    return fd if isinstance(fd, int) else fd.fileno()


def _plain_mode(mode: str) -> bool:
    """Whether ``io.open`` accepts ``mode`` (one of r/w/x/a, optional ``+``, ``b`` or ``t``)."""
    chars = set(mode)
    return (len(chars) == len(mode) and chars <= set("rwxabt+") and len(chars & set("rwxa")) == 1
            and not {"b", "t"} <= chars)


def _flag_names(flags: int) -> list[str]:
    names = []
    acc = flags & os.O_ACCMODE
    names.append({os.O_RDONLY: "rdonly", os.O_WRONLY: "wronly", os.O_RDWR: "rdwr"}.get(acc, "?"))
    for name in ("O_CREAT", "O_EXCL", "O_TRUNC", "O_APPEND", "O_DIRECTORY", "O_SYNC", "O_DSYNC"):
        bit = getattr(os, name, 0)
        if bit and flags & bit:
            names.append(name[2:].lower())
    return names


class _TracedFileIO(io.FileIO):
    """FileIO whose writes, truncates and close go through the interposer.

    Buffered and text wrappers are the stock C classes stacked on top, exactly as
    ``io.open`` builds them, so ``isinstance`` checks and buffering behave as usual.
    """

    _chaos_ix: Interposer

    def write(self, b: Any) -> int:  # type: ignore[override]
        return self._chaos_ix._file_write(self, b)

    def truncate(self, size: int | None = None) -> int:
        return self._chaos_ix._file_truncate(self, size)

    def close(self) -> None:
        self._chaos_ix._file_close(self)


class Interposer:
    """Trace file operations under ``root`` in this process and fire ``rules``.

    >>> ix = Interposer("/scratch/ckpt", rank=0, trace_path="/scratch/trace-0.jsonl",
    ...                 rules=[IORule("kill", op="rename", nth=1)])
    >>> ix.install()
    >>> ...run the checkpointer...      # dies at its first rename, trace on disk
    >>> ix.uninstall(); ix.fired        # when nothing killed us

    ``records`` holds the op/phase/fired dicts written so far (without data bytes).
    ``extra_roots``: directories whose new files are traced too (None: the temp dir at
    install; ``()``: none). ``native``: wrap torch.save / safetensors save_file.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        rank: int = 0,
        trace_path: str | os.PathLike[str] | None = None,
        rules: Iterable[IORule] = (),
        *,
        max_data_bytes: int = 512 << 20,
        keep_records: bool = True,
        extra_roots: Iterable[str | os.PathLike[str]] | None = None,
        native: bool = True,
        trace_reads: bool = False,
    ) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self._root_sep = self.root.rstrip(os.sep) + os.sep
        # None: the process's temp dir, looked up at install (see _default_temp_dir).
        self._extra_spec = None if extra_roots is None else [os.fspath(x) for x in extra_roots]
        self.extra_roots: tuple[str, ...] = ()
        self._tracked: set[str] = set()  # files and dirs under extra roots, traced since their creation
        self.native = native
        # Read-only opens of files under root as ``{"event":"read",...}`` records, never ops (no
        # ordinal, no rule, no crash state): who read a file the harness planted something in.
        self.trace_reads = trace_reads
        self._native: Any = None
        self.rank = rank
        self.trace_path = os.path.abspath(os.fspath(trace_path)) if trace_path else None
        self.data_path = self.trace_path + ".data" if self.trace_path else None
        self.rules = list(rules)
        self.max_data_bytes = max_data_bytes
        self.keep_records = keep_records
        self.records: list[dict[str, Any]] = []
        self.fired: list[dict[str, Any]] = []
        self._data: list[bytes] = []  # in-memory data when there is no trace file
        self._data_size = 0
        self._state = [_RuleState() for _ in self.rules]
        self._seq = 0
        self._step: int | None = None
        self._fds: dict[int, _Fd] = {}
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._installed = False
        self._saved: list[tuple[Any, str, Any]] = []
        self._trace_fd: int | None = None
        self._data_fd: int | None = None
        self._fork_hook = False
        # Originals, bound once: the interposer's own I/O always goes through these.
        self._o = {name: getattr(os, name) for name in (
            "open", "write", "pwrite", "fsync", "fdatasync", "rename", "replace", "link",
            "unlink", "remove", "mkdir", "rmdir", "truncate", "ftruncate", "close", "sendfile",
        ) if hasattr(os, name)}
        self._o_open = io.open

    # ------------------------------------------------------------------ install
    def install(self) -> Interposer:
        """Patch open/io.open and the os functions; subscribe to phases. Idempotent."""
        if self._installed:
            return self
        if self.trace_path:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
            self._trace_fd = self._o["open"](self.trace_path, flags, 0o644)
            self._data_fd = self._o["open"](self.data_path, flags, 0o644)
            self._data_size = os.fstat(self._data_fd).st_size
        patches: list[tuple[Any, str, Any]] = [
            (builtins, "open", self._open),
            (io, "open", self._open),
            (os, "open", self._os_open),
            (os, "write", self._os_write),
            (os, "pwrite", self._os_pwrite),
            (os, "fsync", lambda fd: self._sync("fsync", fd)),
            (os, "fdatasync", lambda fd: self._sync("fdatasync", fd)),
            (os, "rename", self._os_rename),
            (os, "replace", self._os_replace),
            (os, "link", self._os_link),
            (os, "unlink", lambda path, *, dir_fd=None: self._entry("unlink", "unlink", path, dir_fd)),
            (os, "remove", lambda path, *, dir_fd=None: self._entry("unlink", "remove", path, dir_fd)),
            (os, "mkdir", self._os_mkdir),
            (os, "rmdir", lambda path, *, dir_fd=None: self._entry("rmdir", "rmdir", path, dir_fd)),
            (os, "truncate", self._os_truncate),
            (os, "ftruncate", self._os_ftruncate),
            (os, "close", self._os_close),
        ]
        if "sendfile" in self._o:
            patches.append((os, "sendfile", self._os_sendfile))
        by_orig = {id(getattr(obj, name)): new for obj, name, new in patches}
        for obj, name, new in patches:
            self._saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, new)
        # Python 3.10's pathlib keeps its own references (pathlib._NormalAccessor.open =
        # io.open, ...): patch any class attribute that *is* one of the originals.
        import pathlib

        acc = getattr(pathlib, "_NormalAccessor", None)
        if acc is not None:
            for name, value in list(vars(acc).items()):
                if id(value) in by_orig:
                    self._saved.append((acc, name, value))
                    setattr(acc, name, staticmethod(by_orig[id(value)]))
        if not self._fork_hook:
            os.register_at_fork(after_in_child=self._after_fork)
            self._fork_hook = True
        spec = [_default_temp_dir()] if self._extra_spec is None else self._extra_spec
        extra = []
        for x in spec:
            r = os.path.realpath(x)
            if r != self.root and not r.startswith(self._root_sep) and r not in extra:
                extra.append(r)  # an extra root inside the root adds nothing
        self.extra_roots = tuple(extra)
        phases.subscribe(self._on_phase)
        self._installed = True
        if self.native:
            from faults.native import NativeWriters

            self._native = NativeWriters(self).install()
        return self

    def quiesced(self) -> Any:
        """Hold every other thread of this process out of traced I/O while the block runs.

        A traced op's syscall and its record happen under one lock, so while it is held
        the disk and the trace agree: no op is done but unrecorded, and none starts. The
        built-in workload holds it while the harness snapshots the tree and counts the
        trace's lines at a power-loss point (``chaos.launch.cluster``), which a commit or
        janitor thread left running by an asynchronous checkpointer could otherwise
        straddle. Re-entrant: the holding thread's own I/O is traced as usual. Use as
        ``with ix.quiesced(): ...`` (the lock itself: no contextlib on the boot path).
        """
        return self._lock

    def uninstall(self) -> None:
        """Restore every patched function, unsubscribe, close the trace. Idempotent."""
        if not self._installed:
            return
        if self._native is not None:
            self._native.uninstall()
            self._native = None
        for obj, name, orig in reversed(self._saved):
            setattr(obj, name, orig)
        self._saved.clear()
        phases.unsubscribe(self._on_phase)
        self._installed = False
        for fd in (self._trace_fd, self._data_fd):
            if fd is not None:
                self._o["close"](fd)
        self._trace_fd = self._data_fd = None

    def __enter__(self) -> Interposer:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # ------------------------------------------------------------------ helpers
    def _after_fork(self) -> None:
        """A child forked while another thread held the lock must not inherit it held.
        The child keeps tracing into the same files (its records carry its own pid)."""
        self._lock = threading.RLock()
        self._tls = threading.local()

    def _busy(self) -> bool:
        return not self._installed or getattr(self._tls, "busy", False)

    def _enter(self) -> None:
        self._lock.acquire()
        self._tls.busy = True
        self._tls.t0 = time.monotonic()

    def _leave(self) -> None:
        self._tls.busy = False
        self._tls.t0 = None
        self._lock.release()

    def _restamp(self) -> None:
        """The next op of this region begins now (after a rule's delay, or after the previous op)."""
        self._tls.t0 = time.monotonic()

    def _resolve(self, path: Any, dir_fd: int | None = None, follow: bool = False,
                 create: bool = False) -> str | None:
        """Absolute realpath for ops that follow symlinks (open, truncate); for entry
        ops (unlink, rename, mkdir, ...) only the parent is realpath'd, so an unlink of
        a symlink names the link. None unless the result lies under root, is a tracked
        file of an extra root, or (``create``: the op may create it) lies under one."""
        if isinstance(path, int):
            info = self._fds.get(path)
            return info.path if info else None
        p = self._norm(path, dir_fd, follow)
        if p is None:
            return None
        if p == self.root or p.startswith(self._root_sep) or p in self._tracked:
            return p
        return p if create and self._in_extra(p) else None

    def _norm(self, path: Any, dir_fd: int | None = None, follow: bool = False) -> str | None:
        """The absolute path an op names (see ``_resolve``), wherever it lies."""
        try:
            p = os.fsdecode(os.fspath(path))
        except TypeError:
            return None
        if dir_fd is not None and not os.path.isabs(p):
            base = self._fd_path(dir_fd)
            if base is None:
                return None
            p = os.path.join(base, p)
        p = os.path.abspath(p)
        head, tail = os.path.split(p)
        if follow or not tail:
            return os.path.realpath(p)
        return os.path.join(os.path.realpath(head), tail)

    def _in_root(self, p: str) -> bool:
        return p == self.root or p.startswith(self._root_sep)

    def _in_extra(self, p: str) -> bool:
        return any(p == r or p.startswith(r.rstrip(os.sep) + os.sep) for r in self.extra_roots)

    def _untracked(self, p: str) -> bool:
        """A path outside the root that is not (yet) traced: an extra-root candidate."""
        return not self._in_root(p) and p not in self._tracked

    def _track_move(self, src: str | None, dst: str | None) -> None:
        """After a rename: ``src`` and everything below it left, ``dst`` (when outside the
        root) is traced from now on, with what was below ``src`` now below it."""
        if src is not None and src in self._tracked:
            self._tracked.discard(src)
            below = [t for t in self._tracked if t.startswith(src + os.sep)]
            for t in below:
                self._tracked.discard(t)
                if dst is not None and not self._in_root(dst):
                    self._tracked.add(dst + t[len(src):])
        if dst is not None and not self._in_root(dst):
            self._tracked.add(dst)

    def _untrack(self, p: str) -> None:
        self._tracked.discard(p)
        for t in [t for t in self._tracked if t.startswith(p + os.sep)]:
            self._tracked.discard(t)

    def _fd_path(self, fd: int) -> str | None:
        info = self._fds.get(fd)
        if info is not None:
            return info.path
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None

    def _rel(self, path: str) -> str:
        """Root-relative path for globs; a traced file of an extra root keeps its absolute path."""
        return os.path.relpath(path, self.root) if self._in_root(path) else path

    def _glob_ok(self, pattern: str | None, paths: tuple[str, ...]) -> bool:
        if pattern is None:
            return True
        for p in paths:
            rel = self._rel(p)
            if fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(p, pattern):
                return True
            if "/" not in pattern and fnmatch.fnmatchcase(os.path.basename(p), pattern):
                return True
        return False

    def _emit(self, rec: dict[str, Any], ts: float | None = None) -> dict[str, Any]:
        rec["seq"] = self._seq
        self._seq += 1
        rec["rank"] = self.rank
        rec["pid"] = os.getpid()
        if ts is None:
            ts = time.monotonic()
            if getattr(self._tls, "t0", None) is not None:
                self._tls.t0 = ts  # an op this region records next began after this record
        rec["ts"] = ts
        if self._trace_fd is not None:
            line = (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode()
            self._write_all(self._trace_fd, line)
        if self.keep_records:
            self.records.append(rec)
        return rec

    def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._o["write"](fd, view)
            view = view[n:]

    def _store(self, data: bytes) -> dict[str, Any]:
        if self._data_size + len(data) > self.max_data_bytes:
            return {"data_off": None, "data_dropped": True}
        off = self._data_size
        if self._data_fd is not None:
            self._write_all(self._data_fd, data)
        else:
            self._data.append(data)
        self._data_size += len(data)
        return {"data_off": off, "data_len": len(data)}

    def data_of(self, rec: dict[str, Any]) -> bytes | None:
        """Bytes of a write record (from memory or the side file)."""
        if rec.get("data_off") is None:
            return None
        if self._data_fd is None and self.data_path is None:
            blob = b"".join(self._data)
            return blob[rec["data_off"]: rec["data_off"] + rec["data_len"]]
        return read_data(self.data_path, rec)  # type: ignore[arg-type]

    def _op(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Record an op once its syscall returned, stamped with when it *began*.

        ``ts`` is taken before the syscall (under the lock, after any rule's delay), not
        when the record is written: a rank descheduled between its ``mkdir`` of a save's
        shared directory and the record would otherwise be ordered after the other
        rank's files in that directory (``faults.crashstate.merge_traces``), and the
        crash model would lose them. An op that completes before another begins is so
        ordered before it, whatever happens to either thread after its syscall.
        """
        rec: dict[str, Any] = {"event": "op", "op": kind}
        rec.update(fields)
        t0 = getattr(self._tls, "t0", None)
        out = self._emit(rec, t0)
        if t0 is not None:
            self._restamp()
        return out

    # ------------------------------------------------------------------ rules
    def _match(self, kind: str, paths: tuple[str, ...], offset: int | None = None,
               length: int | None = None) -> list[int]:
        """Advance rule counters for this op; return indices of rules that fire now."""
        hits: list[int] = []
        for i, rule in enumerate(self.rules):
            st = self._state[i]
            kinds = rule.kinds()
            if kinds is not None and kind not in kinds:
                continue
            if rule.phase is not None and not st.armed:
                continue
            if rule.phase is None and rule.step is not None and self._step != rule.step:
                continue
            if not self._glob_ok(rule.path_glob, paths):
                continue
            if rule.byte is not None:
                if offset is None or length is None:
                    continue
                end = offset + length
                if not (offset <= rule.byte < end or (rule.past and end > rule.byte)):
                    continue
            st.count += 1
            if st.count < rule.nth or (rule.times is not None and st.fired >= rule.times):
                continue
            st.fired += 1
            hits.append(i)
        return hits

    def _fire(self, i: int, kind: str, paths: tuple[str, ...], **point: Any) -> dict[str, Any]:
        rule = self.rules[i]
        rec = self._emit({
            "event": "fired", "rule": i, "action": rule.action, "op": kind,
            "path": paths[0] if paths else None, "paths": list(paths),
            "spec": rule.to_dict(), "step": self._step, **point,
        })
        self.fired.append(rec)
        return rec

    def _die(self) -> None:
        # The trace is written with write(2) per record: nothing is buffered to flush.
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # pragma: no cover - SIGKILL cannot be caught
        raise _Kill()

    @staticmethod
    def _error(action: str, path: str | None) -> OSError:
        code = _errno.ENOSPC if action == "enospc" else _errno.EIO
        return OSError(code, os.strerror(code), path)

    def _act_before(self, kind: str, paths: tuple[str, ...], **point: Any) -> None:
        """Fire matching rules for a non-write op before it is performed."""
        hits = self._match(kind, paths)
        for i in hits:
            rule = self.rules[i]
            self._fire(i, kind, paths, performed=rule.action == "delay", **point)
            if rule.action == "delay":
                time.sleep(rule.delay_s)
                self._restamp()
            elif rule.action == "kill":
                self._die()
            else:  # enospc, eio, fsync_fail
                raise self._error(rule.action, paths[0] if paths else None)

    def _on_phase(self, name: str, info: dict[str, Any]) -> None:
        if self._busy():
            return
        self._enter()
        try:
            if "step" in info:
                self._step = info["step"]
            self._emit({"event": "phase", "name": name, "info": info})
            for i, rule in enumerate(self.rules):
                if rule.phase != name or (rule.step is not None and info.get("step") != rule.step):
                    continue
                st = self._state[i]
                if rule.kinds() is not None or rule.path_glob is not None:
                    st.armed = True  # the Nth matching op from here on fires
                    continue
                st.count += 1
                if st.count < rule.nth or (rule.times is not None and st.fired >= rule.times):
                    continue
                st.fired += 1
                self._fire(i, "phase", (), phase=name, info=info)
                if rule.action == "delay":
                    time.sleep(rule.delay_s)
                elif rule.action == "kill":
                    self._die()
                else:
                    raise self._error(rule.action, None)
        finally:
            self._leave()

    # ------------------------------------------------------------------ writes
    def _do_write(self, info: _Fd, fd: int, data: bytes, offset: int,
                  real: Callable[[bytes], int], via: str) -> int:
        """Write ``data`` at ``offset`` through ``real``; record; fire write rules."""
        hits = self._match("write", (info.path,), offset, len(data))
        rule_i = None
        for i in hits:
            if self.rules[i].action == "delay":
                self._fire(i, "write", (info.path,), offset=offset, length=len(data))
                time.sleep(self.rules[i].delay_s)
                self._restamp()
            elif rule_i is None:
                rule_i = i
        if rule_i is None:
            try:
                n = real(data)
            except OSError as e:
                self._op("write", path=info.path, fd=fd, offset=offset, length=len(data),
                         via=via, error=e.errno, data_off=None)
                raise
            self._op("write", path=info.path, fd=fd, offset=offset, length=n, via=via,
                     **self._store(data[:n]))
            return n
        rule = self.rules[rule_i]
        if rule.action == "short_write":
            cut = rule.keep if rule.keep is not None else (
                rule.byte - offset if rule.byte is not None else len(data) // 2)
        else:
            cut = rule.byte - offset if rule.byte is not None else 0
        cut = max(0, min(cut, len(data)))
        written = 0
        op_seq = None
        if cut:
            while written < cut:
                written += real(data[written:cut])
            op_seq = self._op("write", path=info.path, fd=fd, offset=offset, length=written,
                              via=via, partial_of=len(data), **self._store(data[:written]))["seq"]
        self._fire(rule_i, "write", (info.path,), offset=offset, length=len(data),
                   written=written, op_seq=op_seq, byte=rule.byte)
        if rule.action == "kill" or (rule.action == "short_write" and rule.then == "kill"):
            self._die()
        if rule.action == "short_write":
            return written
        raise self._error(rule.action, info.path)

    def _file_write(self, f: _TracedFileIO, b: Any) -> int:
        if self._busy() or f.closed:
            return io.FileIO.write(f, b)
        data = bytes(b)
        fd = f.fileno()
        info = self._fds.get(fd)
        if info is None:
            return io.FileIO.write(f, b)
        self._enter()
        try:
            off = os.fstat(fd).st_size if info.append else os.lseek(fd, 0, os.SEEK_CUR)
            return self._do_write(info, fd, data, off, lambda d: io.FileIO.write(f, d), "file")
        finally:
            self._leave()

    def _file_truncate(self, f: _TracedFileIO, size: int | None) -> int:
        fd = f.fileno()
        info = self._fds.get(fd)
        if self._busy() or info is None:
            return io.FileIO.truncate(f, size)
        self._enter()
        try:
            length = os.lseek(fd, 0, os.SEEK_CUR) if size is None else size
            self._act_before("truncate", (info.path,), length=length)
            n = io.FileIO.truncate(f, size)
            self._op("truncate", path=info.path, fd=fd, length=length, via="file")
            return n
        finally:
            self._leave()

    def _file_close(self, f: _TracedFileIO) -> None:
        if f.closed:
            return
        fd = f.fileno()
        info = self._fds.get(fd) if f.closefd else None
        if self._busy() or info is None:
            io.FileIO.close(f)
            return
        self._enter()
        try:
            self._act_before("close", (info.path,), fd=fd)
            io.FileIO.close(f)
            self._fds.pop(fd, None)
            self._op("close", path=info.path, fd=fd, via="file")
        finally:
            self._leave()

    # ------------------------------------------------------------------ open
    def _open(self, file: Any, mode: str = "r", buffering: int = -1, encoding: str | None = None,
              errors: str | None = None, newline: str | None = None, closefd: bool = True,
              opener: Callable[[str, int], int] | None = None) -> Any:
        return self._open_via(file, mode, buffering, encoding, errors, newline, closefd, opener)

    def _open_via(self, file: Any, mode: str = "r", buffering: int = -1, encoding: str | None = None,
                  errors: str | None = None, newline: str | None = None, closefd: bool = True,
                  opener: Callable[[str, int], int] | None = None, via: str = "io.open") -> Any:
        """``open`` with the record's ``via`` chosen by the caller (faults.native names its writer)."""
        args = (file, mode, buffering, encoding, errors, newline, closefd, opener)
        if self._busy() or not isinstance(mode, str):
            return self._o_open(*args)
        if opener is not None and not isinstance(file, int):
            return self._open_with_opener(args, via)
        if not (_WRITE_MODES & set(mode)):
            if self.trace_reads and not isinstance(file, int):
                self._note_read(file, via)
            return self._o_open(*args)
        path = self._resolve(file, follow=True, create="w" in mode or "x" in mode or "a" in mode)
        if path is None or "t" in mode and "b" in mode:
            return self._o_open(*args)
        binary = "b" in mode
        if binary and (encoding is not None or errors is not None or newline is not None):
            return self._o_open(*args)  # let io.open raise its own ValueError
        rawmode = "".join(c for c in mode if c in "rwxa+")
        self._enter()
        try:
            existed = True if isinstance(file, int) else os.path.lexists(path)
            if existed and "w" not in mode and self._untracked(path):
                # An extra root's file from before: its earlier contents are unknown.
                return self._o_open(*args)
            if not isinstance(file, int):
                self._act_before("open", (path,), mode=mode)
            try:
                raw = _TracedFileIO(file, rawmode, closefd, opener=opener)
            except OSError as e:
                if not isinstance(file, int):
                    self._op("open", path=path, fd=None, mode=mode, error=e.errno)
                raise
            raw._chaos_ix = self
            fd = raw.fileno()
            self._fds[fd] = _Fd(path, append="a" in mode)
            if not self._in_root(path):
                self._tracked.add(path)
            if not isinstance(file, int):
                self._op("open", path=path, fd=fd, mode=mode, created=not existed,
                         trunc="w" in mode, is_dir=False, via=via)
        finally:
            self._leave()
        return self._wrap(raw, mode, buffering, encoding, errors, newline)

    def _note_read(self, file: Any, via: str) -> None:
        """A read-only open of a file under root (``trace_reads``): recorded before the open, never
        counted as an op; an open that then fails is recorded too (a reader that tried)."""
        p = self._norm(file, follow=True)
        if p is None or not (p.startswith(self._root_sep) and os.path.isfile(p)):
            return
        self._enter()
        try:
            self._emit({"event": "read", "path": p, "via": via})
        finally:
            self._leave()

    def _open_with_opener(self, args: tuple[Any, ...], via: str) -> Any:
        """``open(file, mode, ..., opener=opener)``: trace the file the opener really opened.

        ``file`` is only the name handed to the opener, which may open anything else:
        ``tempfile.NamedTemporaryFile(dir=d)`` calls ``io.open(d, opener=...)`` and its
        opener makes ``d/tmpXXXX`` with ``os.open``. So nothing is resolved from ``file``:
        the opener runs with the interposer idle, its own ``os.open`` is traced as any
        other (``_os_open``: the open record, with ``"opener": via``, names the real path,
        open rules fire on it, and its fd is registered), and the file object built on
        that fd traces its writes, truncates and close against the same path. An opener
        that opened its fd some way the interposer does not see (C code, an ``os.open``
        bound before install) is traced after the fact from ``/proc/self/fd/N`` (the open
        record says ``"opener": "untraced"``; its open rules fire once the file is open).
        Any mode is routed here, reads too, so that a traced fd made by the opener is
        forgotten when the file object closes it.
        """
        file, mode, buffering, encoding, errors, newline, closefd, opener = args
        if not _plain_mode(mode) or "b" in mode and (encoding, errors, newline) != (None, None, None):
            return self._o_open(*args)  # let io.open raise its own ValueError
        writes = bool(_WRITE_MODES & set(mode))
        named = self._norm(file, follow=True) if writes else None
        existed = named is not None and os.path.lexists(named)
        ctx: dict[str, Any] = {"via": via, "seen": False, "fd": None, "traced": set()}

        def traced_opener(name: Any, flags: int) -> int:
            outer = getattr(self._tls, "opener", None)
            self._tls.opener = ctx
            try:
                fd = opener(name, flags)
            finally:
                self._tls.opener = outer
            ctx["fd"] = fd
            return fd

        rawmode = "".join(c for c in mode if c in "rwxa+")
        try:
            raw = _TracedFileIO(file, rawmode, closefd, opener=traced_opener)
        except BaseException:
            self._forget(ctx["fd"], ctx["traced"])  # FileIO closed what the opener gave it (EISDIR)
            raise
        raw._chaos_ix = self
        fd = raw.fileno()
        if fd not in ctx["traced"]:
            self._fds.pop(fd, None)  # a number the kernel just handed out again: any entry is stale
            if writes and not ctx["seen"]:
                self._trace_opened(raw, fd, mode, via, named, existed)
        return self._wrap(raw, mode, buffering, encoding, errors, newline)

    def _trace_opened(self, raw: _TracedFileIO, fd: int, mode: str, via: str, named: str | None,
                      existed: bool) -> None:
        """An opener's fd the interposer did not see being opened: trace it by what it is."""
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if not real.startswith("/") or real.endswith(" (deleted)"):
            return  # an anonymous (O_TMPFILE) or already unlinked file: nothing a crash leaves in the tree
        path = self._resolve(real, create=True)
        if path is None:
            return
        self._enter()
        try:
            if self._untracked(path) and (real != named or existed and "w" not in mode):
                return  # an extra root's file from before (or maybe so): its history is unknown
            try:
                self._act_before("open", (path,), mode=mode)
            except BaseException:
                io.FileIO.close(raw)
                raise
            self._fds[fd] = _Fd(path, append="a" in mode)
            if not self._in_root(path):
                self._tracked.add(path)
            self._op("open", path=path, fd=fd, mode=mode, created=None if real != named else not existed,
                     trunc="w" in mode, is_dir=False, via=via, opener="untraced")
        finally:
            self._leave()

    def _forget(self, fd: int | None, traced: set[int]) -> None:
        """The opener's traced fd was closed by ``FileIO`` itself (it refused it): record the close."""
        if fd is None or fd not in traced or fd not in self._fds or self._busy():
            return
        self._enter()
        try:
            info = self._fds.pop(fd)
            self._op("close", path=info.path, fd=fd, is_dir=info.is_dir, via="file")
        finally:
            self._leave()

    @staticmethod
    def _wrap(raw: _TracedFileIO, mode: str, buffering: int, encoding: str | None, errors: str | None,
              newline: str | None) -> Any:
        """Stack the stock buffered and text layers on ``raw`` exactly as ``io.open`` does."""
        binary = "b" in mode
        try:
            line_buffering = False
            if buffering == 1 or (buffering < 0 and raw.isatty()):
                buffering, line_buffering = -1, True
            if buffering < 0:
                buffering = io.DEFAULT_BUFFER_SIZE
                blk = os.fstat(raw.fileno()).st_blksize
                if blk > 1:
                    buffering = blk
            if buffering == 0:
                if binary:
                    return raw
                raise ValueError("can't have unbuffered text I/O")
            if "+" in mode:
                buffer: Any = io.BufferedRandom(raw, buffering)
            elif "r" in mode:
                buffer = io.BufferedReader(raw, buffering)
            else:
                buffer = io.BufferedWriter(raw, buffering)
            if binary:
                return buffer
            text = io.TextIOWrapper(buffer, encoding, errors, newline, line_buffering)
            text.mode = mode  # type: ignore[misc]
            return text
        except BaseException:
            raw.close()
            raise

    def _os_open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        follow = not flags & getattr(os, "O_NOFOLLOW", 0)
        writes = flags & os.O_ACCMODE != os.O_RDONLY
        create = bool(flags & os.O_CREAT) or bool(flags & os.O_TRUNC) and writes
        busy = self._busy()
        ctx = None if busy else getattr(self._tls, "opener", None)  # run as an open()'s opener
        if ctx is not None:
            ctx["seen"] = True
        if _O_TMPFILE and flags & _O_TMPFILE == _O_TMPFILE:
            # An anonymous file in the directory ``path`` names (TemporaryFile): it has no
            # name, so no crash can leave it in the tree; tracing it would pin its writes
            # on the directory. (One linked in later through /proc/self/fd comes in as a
            # link from an untraced file, its bytes captured.)
            return self._o["open"](path, flags, mode, dir_fd=dir_fd)
        p = None if busy else self._resolve(path, dir_fd, follow=follow, create=create)
        if p is None:
            return self._o["open"](path, flags, mode, dir_fd=dir_fd)
        self._enter()
        try:
            existed = os.path.lexists(p)
            if self._untracked(p) and existed and not (flags & os.O_TRUNC and writes):
                # An extra root's file from before (or mkstemp's name clash): not ours to trace.
                return self._o["open"](path, flags, mode, dir_fd=dir_fd)
            self._act_before("open", (p,), flags=_flag_names(flags))
            try:
                fd = self._o["open"](path, flags, mode, dir_fd=dir_fd)
            except OSError as e:
                self._op("open", path=p, fd=None, flags=_flag_names(flags), error=e.errno)
                raise
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            self._fds[fd] = _Fd(p, append=bool(flags & os.O_APPEND), is_dir=is_dir)
            if not self._in_root(p):
                self._tracked.add(p)
            extra: dict[str, Any] = {}
            if ctx is not None:
                ctx["traced"].add(fd)  # the file object owns it if the opener returns it
                extra["opener"] = ctx["via"]
            self._op("open", path=p, fd=fd, flags=_flag_names(flags),
                     created=bool(flags & os.O_CREAT) and not existed,
                     trunc=bool(flags & os.O_TRUNC) and not is_dir, is_dir=is_dir, via="os.open", **extra)
            return fd
        finally:
            self._leave()

    # ------------------------------------------------------------------ os.*
    def _os_write(self, fd: int, data: Any) -> int:
        info = self._fds.get(fd)
        if info is None or self._busy():
            return self._o["write"](fd, data)
        self._enter()
        try:
            off = os.fstat(fd).st_size if info.append else os.lseek(fd, 0, os.SEEK_CUR)
            return self._do_write(info, fd, bytes(data), off,
                                  lambda d: self._o["write"](fd, d), "os.write")
        finally:
            self._leave()

    def _os_pwrite(self, fd: int, data: Any, offset: int) -> int:
        info = self._fds.get(fd)
        if info is None or self._busy():
            return self._o["pwrite"](fd, data, offset)
        self._enter()
        try:
            base = offset

            def real(d: bytes) -> int:
                # _do_write may call us again for the rest of a prefix: keep the offset moving.
                nonlocal base
                n = self._o["pwrite"](fd, d, base)
                base += n
                return n

            return self._do_write(info, fd, bytes(data), offset, real, "os.pwrite")
        finally:
            self._leave()

    def _os_sendfile(self, out_fd: int, in_fd: int, offset: int | None, count: int,
                     *args: Any, **kwargs: Any) -> int:
        info = self._fds.get(out_fd)
        if info is None or self._busy() or args or kwargs:
            return self._o["sendfile"](out_fd, in_fd, offset, count, *args, **kwargs)
        self._enter()
        try:
            src = os.lseek(in_fd, 0, os.SEEK_CUR) if offset is None else offset
            data = os.pread(in_fd, count, src)
            dst = os.fstat(out_fd).st_size if info.append else os.lseek(out_fd, 0, os.SEEK_CUR)
            moved = 0

            def real(d: bytes) -> int:
                nonlocal moved
                if offset is None:
                    n = self._o["sendfile"](out_fd, in_fd, None, len(d))
                else:
                    n = self._o["sendfile"](out_fd, in_fd, offset + moved, len(d))
                moved += n
                return n

            if not data:
                return self._o["sendfile"](out_fd, in_fd, offset, count)
            return self._do_write(info, out_fd, data, dst, real, "os.sendfile")
        finally:
            self._leave()

    def _sync(self, kind: str, fd: Any) -> None:
        n = _fsync_target(fd)
        info = self._fds.get(n)
        orig = self._o[kind]
        if info is None or self._busy():
            return orig(fd)
        self._enter()
        try:
            self._act_before(kind, (info.path,), fd=n)
            try:
                orig(n)
            except OSError as e:
                self._op(kind, path=info.path, fd=n, is_dir=info.is_dir, error=e.errno)
                raise
            self._op(kind, path=info.path, fd=n, is_dir=info.is_dir)
        finally:
            self._leave()

    def _two_path(self, kind: str, via: str, src: Any, dst: Any, call: Callable[[], Any],
                  src_dir_fd: int | None, dst_dir_fd: int | None) -> Any:
        if self._busy():
            return call()
        s = self._resolve(src, src_dir_fd)
        # A traced file moved under an extra root stays traced there.
        d = self._resolve(dst, dst_dir_fd, create=s is not None)
        if s is None and d is None:
            return call()
        self._enter()
        try:
            paths = tuple(p for p in (s, d) if p is not None)
            existed = d is not None and os.path.lexists(d)
            extra: dict[str, Any] = {}
            if s is None:
                # Moved in from a file no trace saw being written: its path, and (after the
                # move) its bytes, so a crash model can take it as it was.
                extra["src_untraced"] = self._norm(src, src_dir_fd)
            self._act_before(kind, paths, src=s, dst=d)
            try:
                result = call()
            except OSError as e:
                self._op(kind, src=s, dst=d, path=d or s, via=via, error=e.errno, **extra)
                raise
            if s is None and d is not None:
                extra.update(self._capture(d))
            self._op(kind, src=s, dst=d, path=d or s, via=via, replaced=existed, **extra)
            if kind == "rename":
                self._track_move(s, d)
            elif d is not None and not self._in_root(d):
                self._tracked.add(d)
            return result
        finally:
            self._leave()

    def _capture(self, path: str) -> dict[str, Any]:
        """The bytes of a regular file now at ``path`` (stored like a write's); a directory
        or an unreadable file says only what it is."""
        try:
            st = os.lstat(path)
        except OSError:
            return {}
        if not stat.S_ISREG(st.st_mode):
            return {"src_kind": "dir" if stat.S_ISDIR(st.st_mode) else "other"}
        if self._data_size + st.st_size > self.max_data_bytes:
            return {"src_kind": "file", "src_size": st.st_size, "data_off": None, "data_dropped": True}
        try:
            with self._o_open(path, "rb") as f:
                data = f.read()
        except OSError:
            return {"src_kind": "file"}
        return {"src_kind": "file", "src_size": len(data), **self._store(data)}

    def _os_rename(self, src: Any, dst: Any, *, src_dir_fd: int | None = None,
                   dst_dir_fd: int | None = None) -> None:
        def call() -> None:
            self._o["rename"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        return self._two_path("rename", "rename", src, dst, call, src_dir_fd, dst_dir_fd)

    def _os_replace(self, src: Any, dst: Any, *, src_dir_fd: int | None = None,
                    dst_dir_fd: int | None = None) -> None:
        def call() -> None:
            self._o["replace"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        return self._two_path("rename", "replace", src, dst, call, src_dir_fd, dst_dir_fd)

    def _os_link(self, src: Any, dst: Any, *, src_dir_fd: int | None = None,
                 dst_dir_fd: int | None = None, follow_symlinks: bool = True) -> None:
        def call() -> None:
            self._o["link"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd,
                            follow_symlinks=follow_symlinks)
        return self._two_path("link", "link", src, dst, call, src_dir_fd, dst_dir_fd)

    def _entry(self, kind: str, name: str, path: Any, dir_fd: int | None, **extra: Any) -> None:
        """unlink / remove / rmdir / mkdir: one directory entry added or removed."""
        orig = self._o[name]
        args = (path, extra["mode"]) if "mode" in extra else (path,)
        p = None if self._busy() else self._resolve(path, dir_fd, create=kind == "mkdir")
        if p is None or kind == "mkdir" and self._untracked(p) and os.path.lexists(p):
            return orig(*args, dir_fd=dir_fd)
        self._enter()
        try:
            self._act_before(kind, (p,))
            try:
                orig(*args, dir_fd=dir_fd)
            except OSError as e:
                self._op(kind, path=p, via=name, error=e.errno)
                raise
            if kind == "mkdir":
                if not self._in_root(p):
                    self._tracked.add(p)
            else:
                self._untrack(p)
            self._op(kind, path=p, via=name)
        finally:
            self._leave()

    def _os_mkdir(self, path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        return self._entry("mkdir", "mkdir", path, dir_fd, mode=mode)

    def _os_truncate(self, path: Any, length: int) -> None:
        if isinstance(path, int):
            return self._os_ftruncate(path, length)
        p = None if self._busy() else self._resolve(path, follow=True)
        if p is None:
            return self._o["truncate"](path, length)
        self._enter()
        try:
            self._act_before("truncate", (p,), length=length)
            self._o["truncate"](path, length)
            self._op("truncate", path=p, fd=None, length=length, via="os.truncate")
        finally:
            self._leave()

    def _os_ftruncate(self, fd: int, length: int) -> None:
        info = self._fds.get(fd)
        if info is None or self._busy():
            return self._o["ftruncate"](fd, length)
        self._enter()
        try:
            self._act_before("truncate", (info.path,), length=length)
            self._o["ftruncate"](fd, length)
            self._op("truncate", path=info.path, fd=fd, length=length, via="os.ftruncate")
        finally:
            self._leave()

    def _os_close(self, fd: int) -> None:
        info = self._fds.get(fd)
        if info is None or self._busy():
            return self._o["close"](fd)
        self._enter()
        try:
            self._act_before("close", (info.path,), fd=fd)
            self._o["close"](fd)
            self._fds.pop(fd, None)
            self._op("close", path=info.path, fd=fd, is_dir=info.is_dir, via="os.close")
        finally:
            self._leave()


# ---------------------------------------------------------------------- reading traces
def read_trace(trace_path: str | os.PathLike[str], *, with_data: bool = False) -> list[dict[str, Any]]:
    """Records of a trace file, in order. A torn last line (killed mid-append) is dropped.

    With ``with_data`` each write record gets ``data`` (bytes, or None if dropped), and so
    does a rename into the root from an untraced file (``src_untraced``): the bytes it moved.
    """
    out: list[dict[str, Any]] = []
    path = os.fspath(trace_path)
    if not os.path.exists(path):
        return out
    with builtins.open(path, "rb") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                break
    if with_data:
        blob = b""
        dpath = path + ".data"
        if os.path.exists(dpath):
            with builtins.open(dpath, "rb") as f:
                blob = f.read()
        for rec in out:
            if rec.get("event") == "op" and "data_off" in rec:
                off = rec.get("data_off")
                rec["data"] = None if off is None else blob[off: off + rec["data_len"]]
    return out


def read_data(data_path: str, rec: dict[str, Any]) -> bytes | None:
    """The bytes of one write record from a ``<trace>.data`` file."""
    if rec.get("data_off") is None:
        return None
    with builtins.open(data_path, "rb") as f:
        f.seek(rec["data_off"])
        return f.read(rec["data_len"])


# ---------------------------------------------------------------------- untraced I/O
class TreeSnapshot:
    """Cheap identity of every file under a root: relpath -> (size, mtime_ns, inode)."""

    __slots__ = ("root", "files")

    def __init__(self, root: str, files: dict[str, tuple[int, int, int]] | None = None) -> None:
        self.root = root
        self.files: dict[str, tuple[int, int, int]] = {} if files is None else files

    def __eq__(self, other: object) -> bool:
        return type(other) is TreeSnapshot and (self.root, self.files) == (other.root, other.files)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TreeSnapshot(root={self.root!r}, files={self.files!r})"


def snapshot_tree(root: str | os.PathLike[str]) -> TreeSnapshot:
    """Stat every regular file under ``root`` (take it before the save)."""
    r = os.path.realpath(os.fspath(root))
    files: dict[str, tuple[int, int, int]] = {}
    for dirpath, _dirs, names in os.walk(r):
        for name in names:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                files[os.path.relpath(p, r)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return TreeSnapshot(r, files)


def untraced_changes(root: str | os.PathLike[str], trace_records: Iterable[dict[str, Any]],
                     before: TreeSnapshot) -> list[str]:
    """Files under ``root`` that appeared, changed or vanished since ``before`` without
    any traced op naming them (absolute paths, sorted).

    A non-empty answer means some writer bypassed the interposer (C-level I/O that
    :mod:`faults.native` does not wrap, a child process): the run record should say
    "I/O not traced" for those files rather than treat the trace as complete.
    """
    after = snapshot_tree(root)
    touched: set[str] = set()
    for rec in trace_records:
        if rec.get("event") != "op" or rec.get("error") is not None:
            continue
        for key in ("path", "src", "dst"):
            if rec.get(key):
                touched.add(rec[key])
    r = after.root
    changed = []
    for rel in set(before.files) | set(after.files):
        if before.files.get(rel) != after.files.get(rel):
            p = os.path.join(r, rel)
            if p not in touched:
                changed.append(p)
    return sorted(changed)


__all__ = [
    "ACTIONS", "OP_KINDS", "IORule", "Interposer", "TreeSnapshot", "read_data",
    "read_trace", "snapshot_tree", "untraced_changes",
]
