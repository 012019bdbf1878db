"""Power-loss crash states built from a recorded I/O trace (the ALICE / LazyFS model).

A process crash (SIGKILL) leaves exactly what the trace says reached the kernel. A
*power loss* can leave less: the page cache and un-journalled directory updates are
gone. This module replays a save's trace (from :mod:`faults.interposer`) over the
directory as it was before the save, and lists the states a POSIX file system may
legally be left in, under a deliberately strict model:

- the crash happens after some prefix ``ops[:k]`` of the trace (every k, 0..n);
- file data written since that file's last ``fsync``/``fdatasync`` is *pending*.
  What persists is a prefix of the pending byte stream, in write order: none of it,
  all of it, up to any write boundary, or torn inside a write at a seeded point.
  Example: ``write(a, off=0, 100 B); fsync(a); write(a, off=100, 50 B)`` then crash:
  ``a`` holds 100, 100+t (seeded 0<t<50) or 150 bytes;
- directory entries created, renamed or unlinked since their directory's last fsync
  are pending too. Each directory's pending entries persist as a prefix of that
  directory's own list (a journal commits them in order), independently of other
  directories. ``fsync`` of a file does *not* persist its name (POSIX leaves that to
  a directory fsync; ext4 happens to do it, other file systems need not). A rename
  across directories travels with its destination directory.

So ``write tmp; fsync tmp; rename tmp -> final`` with no directory fsync yields, at
the last prefix, three states: nothing, ``tmp`` with its data, ``final`` with its
data; the missing rename is the classic lost commit.

Files from outside the root (the interposer's extra roots, e.g. the temp dir where
Lightning's ``_atomic_save`` writes through fsspec) live in a second, *outside* tree
keyed by absolute path, with the same rules: a temp file's writes are pending until it
is fsynced, and its name in the temp dir is pending until that directory is fsynced.
A rename from there into the root moves the inode with its data and that data's
durability (un-fsynced bytes stay lost on power loss) and is pending in its
destination directory, like any cross-directory rename. Until such a rename is issued,
nothing outside can change what the root holds, so the outside tree's pending work is
no choice of a crash state (``_relevant``); a directory staged there (``mkdtemp``) and
moved in brings its own pending entries along. A move across file systems is
``shutil.move``'s copy: the copy's writes into the root, then the unlink of the source.
A file moved in from a path no trace saw written is taken with the bytes the
interposer kept at the move (``src_untraced``), as durable as the tree before the
save; one whose contents are unknown (no bytes kept, or created before the trace
slice began) raises :class:`~faults.FaultError` rather than being guessed.

Everything before the trace is taken as durable. Short traces are enumerated
exhaustively; long ones are sampled with a seed (each prefix's all-lost and
all-persisted states first, then uniform draws), reporting the total number of
combinations, the number generated and how. States with identical contents are
generated once.

A :class:`CrashState` is small data (prefix and choices, plus a description of
what was lost); :meth:`CrashModel.materialize` writes its files into a directory.
A worker pool ships the model once per worker and states as ``to_dict()``.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import xxhash

from faults import FaultError

# A pending data element: ("w", offset, bytes) or ("t", length, b"").
_DataOp = tuple[str, int, bytes]
# The choices of one crash state after a prefix: directory inode -> entries persisted,
# file inode -> (whole pending writes persisted, bytes of the next).
_Choice = tuple[dict[int, int], dict[int, tuple[int, int]]]


def _failed_sync(rec: dict[str, Any]) -> bool:
    """An fsync/fdatasync that failed: a real error on the op, or an injected failure (the
    interposer's ``fired`` record: it raises before the real call, so no op record follows)."""
    if rec.get("op") not in ("fsync", "fdatasync"):
        return False
    if rec.get("event", "op") == "op":
        return rec.get("error") is not None
    return rec.get("event") == "fired" and rec.get("action") in ("fsync_fail", "eio")


@dataclass(frozen=True)
class Snapshot:
    """Contents of a directory tree: ``files`` relpath -> bytes, ``dirs`` relpaths."""

    files: dict[str, bytes] = field(default_factory=dict)
    dirs: tuple[str, ...] = ()

    @classmethod
    def capture(cls, root: str | os.PathLike[str]) -> Snapshot:
        """Read every file and directory under ``root`` (take it before the save)."""
        r = os.path.realpath(os.fspath(root))
        files: dict[str, bytes] = {}
        dirs: list[str] = []
        for dirpath, dnames, fnames in os.walk(r):
            for d in dnames:
                dirs.append(os.path.relpath(os.path.join(dirpath, d), r))
            for f in fnames:
                p = os.path.join(dirpath, f)
                if os.path.isfile(p) and not os.path.islink(p):
                    with open(p, "rb") as fh:
                        files[os.path.relpath(p, r)] = fh.read()
        return cls(files, tuple(sorted(dirs)))


@dataclass(frozen=True)
class _DirOp:
    seq: int
    kind: str  # link | unlink | rename
    dir: int
    name: str
    ino: int | None
    src_dir: int | None = None
    src_name: str | None = None
    desc: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class _Prefix:
    ddir: dict[int, dict[str, int]]
    ddata: dict[int, bytes]
    pdir: dict[int, tuple[_DirOp, ...]]
    pdata: dict[int, tuple[_DataOp, ...]]
    names: dict[int, str]  # last known relpath of each inode (for descriptions)
    seq: int | None  # seq of the last op in the prefix
    # Per file inode, how many times its durable data was replaced (fsync) or its pending
    # stream dropped (failed fsync). Between two such events a file's pending stream only
    # grows, so (inode, epoch, whole, extra) names one content across every prefix.
    epoch: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Tree:
    """The names of one state's tree: directories (parents first) and (relpath, inode) of files."""

    dirs: tuple[str, ...]
    files: tuple[tuple[str, int], ...]
    head: bytes  # the directories, encoded for the fingerprint
    keyed: tuple[tuple[bytes, int], ...]  # files sorted by relpath, encoded for the fingerprint


@dataclass
class CrashState:
    """One possible on-disk state after power loss.

    ``prefix``: ops of the trace that had been issued; ``after_seq``: the last one's
    seq. ``dirs``: directory inode -> how many of its pending entries persisted.
    ``data``: file inode -> (whole pending writes persisted, extra bytes of the next).
    ``lost``: what the crash dropped, e.g. ``{"what": "dir_entry", "op": "rename",
    "src": "step10.tmp", "path": "step10"}`` or ``{"what": "data", "path": "a",
    "persisted": 100, "pending": 150, "torn": true}``.
    """

    id: str
    prefix: int
    after_seq: int | None
    dirs: dict[int, int]
    data: dict[int, tuple[int, int]]
    lost: list[dict[str, Any]]
    fingerprint: str = ""
    equivalents: int = 1  # combinations (over all prefixes) that leave these same contents
    _model: CrashModel | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "prefix": self.prefix, "after_seq": self.after_seq,
            "dirs": [[k, v] for k, v in sorted(self.dirs.items())],
            "data": [[k, list(v)] for k, v in sorted(self.data.items())],
            "lost": self.lost, "fingerprint": self.fingerprint, "equivalents": self.equivalents,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], model: CrashModel | None = None) -> CrashState:
        return cls(d["id"], d["prefix"], d["after_seq"], {k: v for k, v in d["dirs"]},
                   {k: (v[0], v[1]) for k, v in d["data"]}, d["lost"], d.get("fingerprint", ""),
                   d.get("equivalents", 1), model)


@dataclass
class CrashSet:
    """The generated states and how they were chosen."""

    states: list[CrashState]
    total_possible: int  # combinations over all prefixes, duplicates included
    generated: int  # distinct states returned
    exhaustive: bool
    seed: int
    sampling: str
    prefixes: int
    # distinct combinations (crash point + choices) looked at to find them: each is a crash
    # state of the model; several may leave the same contents (``equivalents``), and
    # ``enumerated - generated`` of them share the verdict of an identical tree.
    enumerated: int = 0
    # state id -> how many of its ``equivalents`` are crashes after the last op (the rest
    # crash earlier); only states that have some are listed
    end_equivalents: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_possible": self.total_possible, "generated": self.generated,
            "enumerated": self.enumerated,
            "exhaustive": self.exhaustive, "seed": self.seed, "sampling": self.sampling,
            "prefixes": self.prefixes, "states": [s.to_dict() for s in self.states],
        }


def merge_traces(traces: Iterable[Iterable[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Merge several ranks' traces into one order by their monotonic timestamps.

    ``time.monotonic()`` is one clock for all processes of a machine, and an op's
    ``ts`` is when it began (``faults.interposer``), so an op that completed before
    another began comes first: a rank's ``mkdir`` of a save's shared directory before
    the other rank's files in it, however late its record was written. Ops that truly
    overlap may come in either order, as the kernel may have run them.
    """
    allrecs = [r for t in traces for r in t]
    return sorted(allrecs, key=lambda r: (r.get("ts", 0.0), r.get("rank", 0), r.get("seq", 0)))


def _apply_data(base: bytes, ops: Iterable[_DataOp], extra: tuple[str, int, bytes] | None = None) -> bytes:
    buf = bytearray(base)
    for kind, a, data in itertools.chain(ops, [extra] if extra else []):
        if kind == "t":
            if a < len(buf):
                del buf[a:]
            else:
                buf.extend(bytes(a - len(buf)))
        else:
            end = a + len(data)
            if a > len(buf):
                buf.extend(bytes(a - len(buf)))
            buf[a:end] = data
    return bytes(buf)


class CrashModel:
    """Replay of one trace over a base snapshot; the source of crash states.

    >>> base = Snapshot.capture(root)             # before the save
    >>> ...save under the interposer...
    >>> model = CrashModel(root, base, read_trace(trace, with_data=True))
    >>> cs = model.generate(seed=7)
    >>> for st in cs.states: model.materialize(st, f"/scratch/cs/{st.id}")
    """

    def __init__(self, root: str | os.PathLike[str], base: Snapshot,
                 records: Iterable[dict[str, Any]], *, torn_per_write: int = 1,
                 seed: int = 0) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.torn_per_write = torn_per_write
        self.seed = seed
        self.ops = [r for r in records if r.get("event", "op") == "op" and r.get("error") is None
                    or _failed_sync(r)]
        self._kind: dict[int, str] = {0: "d"}
        self._file_no: dict[int, int] = {}  # file inode -> its ordinal among files (seeds its torn points)
        self._next = 1
        self._oroot: int | None = None  # the outside tree ("/"), made on the first path outside the root
        self._prefixes: list[_Prefix] = []
        # Memos (see "contents"): every crash state of one save is a small delta from a
        # few shared trees and file versions, so each is computed once per model.
        self._cut_memo: dict[tuple[int, int, int], list[int]] = {}
        self._dims_memo: dict[int, tuple[list[tuple[int, int]], list[tuple[int, list[tuple[int, int]]]]]] = {}
        self._tree_memo: dict[tuple[int, tuple[int, ...]], _Tree] = {}
        self._digest_memo: dict[tuple[int, int, int, int], bytes] = {}
        self._data_memo: dict[tuple[int, int, int, int], bytes] = {}
        self._data_memo_bytes = 0
        self._replay(base)

    # ------------------------------------------------------------------ replay
    def _rel(self, path: str) -> str | None:
        if path == self.root:
            return ""
        if not path.startswith(self.root.rstrip("/") + "/"):
            return None
        return os.path.relpath(path, self.root)

    def _new(self, kind: str) -> int:
        ino = self._next
        self._next += 1
        self._kind[ino] = kind
        if kind == "f":
            self._file_no[ino] = len(self._file_no)
        return ino

    def _replay(self, base: Snapshot) -> None:
        vdir: dict[int, dict[str, int]] = {0: {}}
        ddir: dict[int, dict[str, int]] = {0: {}}
        ddata: dict[int, bytes] = {}
        pdir: dict[int, tuple[_DirOp, ...]] = {}
        pdata: dict[int, tuple[_DataOp, ...]] = {}
        names: dict[int, str] = {0: ""}
        fds: dict[tuple[int, int], int] = {}
        epoch: dict[int, int] = {}

        def loc(path: str | None) -> tuple[int, str] | None:
            """(tree, relpath): the root's tree (0) or, for an absolute path outside it (a
            traced file of an extra root, e.g. the temp dir), the outside tree."""
            if not path:
                return None
            rel = self._rel(path)
            if rel is not None:
                return 0, rel
            if not os.path.isabs(path):
                return None
            if self._oroot is None:
                self._oroot = self._new("d")
                vdir[self._oroot], ddir[self._oroot] = {}, {}
                names[self._oroot] = "/"
            return self._oroot, path.strip("/")

        def shown(where: tuple[int, str]) -> str:
            return where[1] if where[0] == 0 else "/" + where[1]

        def lookup(where: tuple[int, str]) -> int | None:
            ino, rel = where
            for part in (p for p in rel.split("/") if p):
                nxt = vdir.get(ino, {}).get(part)
                if nxt is None:
                    return None
                ino = nxt
            return ino

        def parent(where: tuple[int, str]) -> tuple[int | None, str]:
            tree, rel = where
            head, tail = os.path.split(rel)
            if tree == 0:
                return lookup((0, head)), tail
            # Outside the root, directories the trace did not make were there before it:
            # durable, as the root's own tree before the save is.
            ino = tree
            for part in (p for p in head.split("/") if p):
                nxt = vdir[ino].get(part)
                if nxt is None:
                    nxt = self._new("d")
                    vdir[nxt], ddir[nxt] = {}, {}
                    vdir[ino][part] = ddir[ino][part] = nxt
                    names[nxt] = names[ino].rstrip("/") + "/" + part
                elif self._kind.get(nxt) != "d":
                    return None, tail
                ino = nxt
            return ino, tail

        for d in sorted(base.dirs, key=lambda s: s.count("/")):
            pi, name = parent((0, d))
            if pi is None:
                raise FaultError(f"snapshot directory {d!r} has no parent")
            ino = self._new("d")
            vdir[ino], ddir[ino] = {}, {}
            vdir[pi][name] = ddir[pi][name] = ino
            names[ino] = d
        for f, content in sorted(base.files.items()):
            pi, name = parent((0, f))
            if pi is None:
                raise FaultError(f"snapshot file {f!r} has no parent directory")
            ino = self._new("f")
            vdir[pi][name] = ddir[pi][name] = ino
            ddata[ino] = content
            names[ino] = f

        def snap(seq: int | None) -> None:
            qdir = {d: q for d, q in pdir.items() if q}
            qdata = {i: q for i, q in pdata.items() if q}
            if self._oroot is not None:
                qdir, qdata = self._relevant(ddir, qdir, qdata)
            self._prefixes.append(_Prefix(
                {d: dict(e) for d, e in ddir.items()}, dict(ddata), qdir, qdata, dict(names), seq,
                dict(epoch)))

        def queue(op: _DirOp) -> None:
            pdir[op.dir] = pdir.get(op.dir, ()) + (op,)

        def file_of(rec: dict[str, Any]) -> int | None:
            if rec.get("fd") is not None and (rec.get("rank", 0), rec["fd"]) in fds:
                return fds[(rec.get("rank", 0), rec["fd"])]
            where = loc(rec.get("path"))
            return None if where is None else lookup(where)

        def move(rec: dict[str, Any], kind: str, seq: int | None) -> None:
            """A rename or link, wherever its two ends lie (see the module docstring)."""
            sw, dw = loc(rec.get("src")), loc(rec.get("dst"))
            if sw is None and dw is not None:
                # Moved in from a file no trace saw being written: the interposer kept
                # its bytes as they were when it moved in; taken as durable (it was
                # written before the trace, as the root's own tree before the save is).
                src = rec.get("src_untraced") or "an untraced path"
                data = rec.get("data") if rec.get("src_kind") == "file" else None
                if data is None:
                    what = "a directory" if rec.get("src_kind") == "dir" else "a file whose bytes were not kept"
                    raise FaultError(f"{kind} into the model root from {src}, {what} that no trace saw "
                                     f"being written (seq {seq}): its contents are unknown, so it is not "
                                     "modelled")
                dpi, dname = parent(dw)
                if dpi is None:
                    return
                ino = self._new("f")
                ddata[ino] = data
                vdir[dpi][dname] = ino
                names[ino] = shown(dw)
                queue(_DirOp(seq, "link", dpi, dname, ino,
                             desc={"op": kind, "src": src, "path": shown(dw), "untraced_source": True}))
                return
            if dw is None:
                if sw is not None and kind == "rename":
                    # Moved out to a place nothing traces: here, an entry removed.
                    spi, sname = parent(sw)
                    if spi is not None and sname in vdir.get(spi, {}):
                        del vdir[spi][sname]
                        queue(_DirOp(seq, "unlink", spi, sname, None,
                                     desc={"op": "rename", "path": shown(sw), "moved_out": True}))
                return
            spi, sname = parent(sw)  # type: ignore[arg-type]
            dpi, dname = parent(dw)
            ino = vdir.get(spi, {}).get(sname) if spi is not None else None
            if ino is None and sw[0] != 0 and dw[0] == 0:  # type: ignore[index]
                raise FaultError(f"{kind} of {rec.get('src')} into the model root (seq {seq}): that file "
                                 "outside the root was not created within this trace, so its contents "
                                 "are unknown")
            if ino is None or dpi is None:
                return
            if kind == "rename":
                del vdir[spi][sname]
            vdir[dpi][dname] = ino
            names[ino] = shown(dw)
            if kind == "rename":
                queue(_DirOp(seq, "rename", dpi, dname, ino, spi, sname,
                             desc={"op": "rename", "src": shown(sw), "path": shown(dw)}))  # type: ignore[arg-type]
            else:
                queue(_DirOp(seq, "link", dpi, dname, ino,
                             desc={"op": "link", "src": shown(sw), "path": shown(dw)}))  # type: ignore[arg-type]

        snap(None)
        for rec in self.ops:
            kind, seq = rec["op"], rec.get("seq")
            path = rec.get("path") or ""
            where = loc(path)
            key = (rec.get("rank", 0), rec.get("fd"))
            if kind == "open":
                ino = lookup(where) if where is not None else None
                if ino is None and where is not None:
                    pi, name = parent(where)
                    if pi is not None:
                        ino = self._new("f")
                        ddata[ino] = b""
                        vdir[pi][name] = ino
                        names[ino] = shown(where)
                        queue(_DirOp(seq, "link", pi, name, ino,
                                     desc={"op": "create", "path": shown(where)}))
                    else:
                        # Never guessed: dropping the file would make every state lack it.
                        raise FaultError(
                            f"open of {shown(where)} (rank {rec.get('rank', 0)}, seq {seq}) in a directory "
                            "that neither the tree before the save nor an earlier op of the merged traces "
                            "made: the traces are out of order or a directory was made by untraced code")
                elif ino is not None and rec.get("trunc") and self._kind[ino] == "f":
                    pdata[ino] = pdata.get(ino, ()) + (("t", 0, b""),)
                if ino is not None and rec.get("fd") is not None:
                    fds[key] = ino
            elif kind == "write":
                ino = file_of(rec)
                if ino is not None:
                    data = rec.get("data")
                    if data is None:
                        raise FaultError(f"trace has no data for write seq {seq} ({path}); "
                                         "read it with read_trace(..., with_data=True)")
                    pdata[ino] = pdata.get(ino, ()) + (("w", rec["offset"], data),)
            elif kind == "truncate":
                ino = file_of(rec)
                if ino is not None:
                    pdata[ino] = pdata.get(ino, ()) + (("t", rec["length"], b""),)
            elif kind in ("fsync", "fdatasync") and _failed_sync(rec):
                # fsyncgate: after a failed fsync Linux may mark the dirty pages clean and
                # drop them, so a later fsync that succeeds does not make them durable:
                # the data written before the failure is lost in every crash state.
                ino = file_of(rec)
                if ino is not None and self._kind[ino] == "f":
                    pdata.pop(ino, None)
                    epoch[ino] = epoch.get(ino, 0) + 1
            elif kind in ("fsync", "fdatasync"):
                ino = file_of(rec)
                if ino is None:
                    pass
                elif self._kind[ino] == "d":
                    for op in pdir.pop(ino, ()):
                        self._apply_dirop(ddir, op)
                else:
                    ddata[ino] = _apply_data(ddata.get(ino, b""), pdata.pop(ino, ()))
                    epoch[ino] = epoch.get(ino, 0) + 1
            elif kind == "close":
                fds.pop(key, None)
            elif kind in ("rename", "link"):
                move(rec, kind, seq)
            elif kind in ("unlink", "rmdir") and where is not None:
                pi, name = parent(where)
                if pi is not None and name in vdir.get(pi, {}):
                    del vdir[pi][name]
                    queue(_DirOp(seq, "unlink", pi, name, None, desc={"op": kind, "path": shown(where)}))
            elif kind == "mkdir" and where is not None:
                pi, name = parent(where)
                if pi is not None:
                    ino = self._new("d")
                    vdir[ino], ddir[ino] = {}, {}
                    vdir[pi][name] = ino
                    names[ino] = shown(where)
                    queue(_DirOp(seq, "link", pi, name, ino, desc={"op": "mkdir", "path": shown(where)}))
            snap(seq)

    @staticmethod
    def _relevant(ddir: dict[int, dict[str, int]], qdir: dict[int, tuple[_DirOp, ...]],
                  qdata: dict[int, tuple[_DataOp, ...]]
                  ) -> tuple[dict[int, tuple[_DirOp, ...]], dict[int, tuple[_DataOp, ...]]]:
        """The pending work that can change what the root holds.

        Files written outside the root (the temp dir) matter once a rename into the root
        is issued; until then their data, and the outside directories' own entries, are
        no choice of a crash state: whatever survives there, the root reads the same.
        A directory's queue counts when it, or the source of one of its renames, can be
        part of the root's tree; a file's data when the file can.
        """
        edges: dict[int, set[int]] = {}
        for d, entries in ddir.items():
            edges.setdefault(d, set()).update(entries.values())
        for d, q in qdir.items():
            for op in q:
                if op.ino is not None:
                    edges.setdefault(d, set()).add(op.ino)
        reach = {0}
        stack = [0]
        while stack:
            for i in edges.get(stack.pop(), ()):
                if i not in reach:
                    reach.add(i)
                    stack.append(i)
        keep_dir = {d: q for d, q in qdir.items()
                    if d in reach or any(op.kind == "rename" and op.src_dir in reach for op in q)}
        return keep_dir, {i: q for i, q in qdata.items() if i in reach}

    @staticmethod
    def _apply_dirop(tree: dict[int, dict[str, int]], op: _DirOp) -> None:
        entries = tree.setdefault(op.dir, {})
        if op.kind == "unlink":
            entries.pop(op.name, None)
        elif op.kind == "link":
            entries[op.name] = op.ino  # type: ignore[assignment]
        else:  # rename: the journal record carries the inode, so dst appears either way
            src = tree.setdefault(op.src_dir, {})  # type: ignore[arg-type]
            if src.get(op.src_name) == op.ino:  # type: ignore[arg-type]
                del src[op.src_name]  # type: ignore[arg-type]
            entries[op.name] = op.ino  # type: ignore[assignment]

    # ------------------------------------------------------------------ choices
    def _torn(self, ino: int, i: int, n: int) -> list[int]:
        """The seeded torn points inside pending write ``i`` (``n`` bytes) of inode ``ino``."""
        key = (ino, i, n)
        got = self._cut_memo.get(key)
        if got is None:
            # keyed on the file's ordinal among files, not its inode: directories above an
            # extra root (a deeper $TMPDIR) shift inode numbers, and must not move torn points
            rng = random.Random(f"{self.seed}:{self._file_no.get(ino, ino)}:{i}:{n}")
            got = self._cut_memo[key] = sorted(rng.sample(range(1, n), min(self.torn_per_write, n - 1)))
        return got

    def _cuts(self, ino: int, ops: tuple[_DataOp, ...]) -> list[tuple[int, int]]:
        """Persistable prefixes of a pending stream: (whole elements, bytes of the next)."""
        cuts = [(i, 0) for i in range(len(ops) + 1)]
        for i, (kind, _a, data) in enumerate(ops):
            if kind == "w" and len(data) >= 2 and self.torn_per_write > 0:
                cuts.extend((i, t) for t in self._torn(ino, i, len(data)))
        return cuts

    def _dims(self, k: int) -> tuple[list[tuple[int, int]], list[tuple[int, list[tuple[int, int]]]]]:
        got = self._dims_memo.get(k)
        if got is None:
            p = self._prefixes[k]
            dirs = [(d, len(q) + 1) for d, q in sorted(p.pdir.items())]
            data = [(i, self._cuts(i, q)) for i, q in sorted(p.pdata.items())]
            got = self._dims_memo[k] = (dirs, data)
        return got

    def count(self, k: int) -> int:
        """Number of crash-state combinations after prefix ``k`` (duplicates included)."""
        dirs, data = self._dims(k)
        n = 1
        for _d, m in dirs:
            n *= m
        for _i, cuts in data:
            n *= len(cuts)
        return n

    @property
    def n_prefixes(self) -> int:
        return len(self._prefixes)

    @staticmethod
    def choice_id(k: int, dirs: dict[int, int], data: dict[int, tuple[int, int]]) -> str:
        """The id of the crash state after prefix ``k`` with these choices (``CrashState.id``)."""
        return f"k{k}" + "".join(f".d{d}={j}" for d, j in sorted(dirs.items())) + "".join(
            f".f{i}={w}" + (f"+{t}" if t else "") for i, (w, t) in sorted(data.items()))

    def state(self, k: int, dirs: dict[int, int], data: dict[int, tuple[int, int]]) -> CrashState:
        """The crash state after prefix ``k`` with the given choices (data + description)."""
        p = self._prefixes[k]
        lost: list[dict[str, Any]] = []
        for d, q in sorted(p.pdir.items()):
            j = dirs.get(d, len(q))
            for op in q[j:]:
                lost.append({"what": "dir_entry", **op.desc, "dir": p.names.get(d, "?"),
                             "reason": "directory not fsynced"})
        for i, q in sorted(p.pdata.items()):
            whole, extra = data.get(i, (len(q), 0))
            total = sum(len(x[2]) for x in q)
            kept = sum(len(x[2]) for x in q[:whole]) + extra
            if whole < len(q) or extra:
                lost.append({"what": "data", "path": p.names.get(i, "?"), "persisted": kept,
                             "pending": total, "ops_persisted": whole, "ops_pending": len(q),
                             "torn": extra > 0, "reason": "file not fsynced"})
        return CrashState(self.choice_id(k, dirs, data), k, p.seq, dict(dirs), dict(data), lost, "", 1, self)

    # ------------------------------------------------------------------ contents
    # A state is (crash point, how many pending entries of each directory persisted, how
    # much of each file's pending stream persisted). Its *tree* (which names exist) depends
    # only on the crash point and the directory choices, and each file's bytes only on
    # (inode, epoch, whole, extra): so trees and file versions are computed once and every
    # state is assembled from them, the delta from a shared base being a dictionary lookup.
    # ``contents``, ``fingerprint`` and ``materialize`` all read the same memos.
    def _tree(self, k: int, dirs: dict[int, int]) -> _Tree:
        p = self._prefixes[k]
        dims, _data = self._dims(k)
        choice = tuple(min(max(dirs.get(d, m - 1), 0), m - 1) for d, m in dims)
        key = (k, choice)
        got = self._tree_memo.get(key)
        if got is not None:
            return got
        tree = {d: dict(e) for d, e in p.ddir.items()}
        chosen = [op for (d, _m), j in zip(dims, choice, strict=True) for op in p.pdir[d][:j]]
        for op in sorted(chosen, key=lambda o: o.seq):
            self._apply_dirop(tree, op)
        out_dirs: list[str] = []
        files: list[tuple[str, int]] = []
        stack: list[tuple[int, str]] = [(0, "")]
        seen = {0}
        while stack:
            d, rel = stack.pop()
            for name, ino in sorted(tree.get(d, {}).items()):
                path = f"{rel}/{name}" if rel else name
                if self._kind.get(ino) == "d":
                    if ino in seen:
                        continue
                    seen.add(ino)
                    out_dirs.append(path)
                    stack.append((ino, path))
                else:
                    files.append((path, ino))
        out_dirs.sort(key=lambda s: (s.count("/"), s))
        head = b"".join(b"D" + d.encode() + b"\0" for d in out_dirs)
        keyed = [(b"F" + f.encode() + b"\0", ino) for f, ino in sorted(files)]
        got = self._tree_memo[key] = _Tree(tuple(out_dirs), tuple(files), head, tuple(keyed))
        return got

    def _file_key(self, p: _Prefix, ino: int, choice: dict[int, tuple[int, int]]) -> tuple[int, int, int, int]:
        """(inode, epoch, whole, extra): the same key means the same bytes, whatever the prefix."""
        ep = p.epoch.get(ino, 0)
        q = p.pdata.get(ino)
        if not q:
            return ino, ep, 0, 0
        whole, extra = choice.get(ino, (len(q), 0))
        whole = min(max(whole, 0), len(q))
        if extra > 0 and whole < len(q) and q[whole][0] == "w":
            extra = min(extra, len(q[whole][2]))
        else:
            extra = 0
        return ino, ep, whole, extra

    _DATA_MEMO_LIMIT = 256 << 20  # bytes of file versions kept (then dropped, rebuilt on demand)

    def _data(self, p: _Prefix, key: tuple[int, int, int, int]) -> bytes:
        got = self._data_memo.get(key)
        if got is not None:
            return got
        ino, _ep, whole, extra = key
        base = p.ddata.get(ino, b"")
        q = p.pdata.get(ino)
        if not q:
            got = base
        else:
            tail = None
            if extra:
                kind, off, data = q[whole]
                tail = (kind, off, data[:extra])
            got = _apply_data(base, q[:whole], tail)
        if self._data_memo_bytes + len(got) > self._DATA_MEMO_LIMIT:
            self._data_memo.clear()
            self._data_memo_bytes = 0
        self._data_memo[key] = got
        self._data_memo_bytes += len(got)
        return got

    def _digest(self, p: _Prefix, key: tuple[int, int, int, int]) -> bytes:
        got = self._digest_memo.get(key)
        if got is None:
            got = self._digest_memo[key] = xxhash.xxh3_128_digest(self._data(p, key))
        return got

    def contents(self, st: CrashState) -> tuple[list[str], dict[str, bytes]]:
        """Directories (relpaths, parents first) and files of a state, in memory."""
        p = self._prefixes[st.prefix]
        tree = self._tree(st.prefix, st.dirs)
        return list(tree.dirs), {path: self._data(p, self._file_key(p, ino, st.data)) for path, ino in tree.files}

    def file_digests(self, st: CrashState) -> dict[str, bytes]:
        """relpath -> xxh3-128 of the file's bytes, for every file of the state (no bytes built
        when the version was seen before): lets a caller tell which files two states share."""
        p = self._prefixes[st.prefix]
        tree = self._tree(st.prefix, st.dirs)
        return {path: self._digest(p, self._file_key(p, ino, st.data)) for path, ino in tree.files}

    def fingerprint_choice(self, k: int, dirs: dict[int, int], data: dict[int, tuple[int, int]]) -> str:
        """Tree identity of the state after prefix ``k`` with these choices, without building it.

        xxh3-128 over every directory's relpath and every file's relpath with the xxh3-128
        of its bytes: equal fingerprints mean byte-identical trees (up to a 128-bit hash
        collision), which is what lets one recovery judge them all.
        """
        p = self._prefixes[k]
        tree = self._tree(k, dirs)
        h = xxhash.xxh3_128(tree.head)
        for name, ino in tree.keyed:
            h.update(name)
            h.update(self._digest(p, self._file_key(p, ino, data)))
        return h.hexdigest()

    def fingerprint(self, st: CrashState) -> str:
        return self.fingerprint_choice(st.prefix, st.dirs, st.data)

    def materialize(self, st: CrashState | dict[str, Any], dest: str | os.PathLike[str]) -> str:
        """Write the state's tree into ``dest`` (created; must be empty if it exists)."""
        if isinstance(st, dict):
            st = CrashState.from_dict(st, self)
        out = os.fspath(dest)
        os.makedirs(out, exist_ok=True)
        if os.listdir(out):
            raise FaultError(f"materialize target {out} is not empty")
        dirs, files = self.contents(st)
        for d in dirs:
            os.mkdir(os.path.join(out, d))
        for f, data in files.items():
            fd = os.open(os.path.join(out, f), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        return out

    # ------------------------------------------------------------------ enumeration
    # Choices are (dirs, data) dicts as CrashState holds them; a CrashState (with its
    # ``lost`` description) is built only for the combinations that are kept.
    def all_choices(self, k: int) -> Iterator[_Choice]:
        """Every combination of choices after prefix ``k`` (``count(k)`` of them)."""
        dirs, data = self._dims(k)
        ranges = [range(m) for _d, m in dirs] + [cuts for _i, cuts in data]
        nd = len(dirs)
        dkeys = [d for d, _m in dirs]
        fkeys = [i for i, _c in data]
        for combo in itertools.product(*ranges):
            yield dict(zip(dkeys, combo[:nd], strict=True)), dict(zip(fkeys, combo[nd:], strict=True))  # type: ignore[arg-type]

    def extreme_choices(self, k: int) -> list[_Choice]:
        """After prefix ``k``: everything pending lost, and everything pending persisted."""
        dirs, data = self._dims(k)
        pdata = self._prefixes[k].pdata
        return [({d: 0 for d, _m in dirs}, {i: (0, 0) for i, _c in data}),
                ({d: m - 1 for d, m in dirs}, {i: (len(pdata[i]), 0) for i, _c in data})]

    def random_choice(self, k: int, rng: random.Random) -> _Choice:
        """One uniform combination after prefix ``k`` (draws from ``rng`` in a fixed order)."""
        dirs, data = self._dims(k)
        return {d: rng.randrange(m) for d, m in dirs}, {i: rng.choice(c) for i, c in data}

    def _all(self, k: int) -> Iterator[CrashState]:
        for dch, fch in self.all_choices(k):
            yield self.state(k, dch, fch)

    def _extremes(self, k: int) -> Iterator[CrashState]:
        for dch, fch in self.extreme_choices(k):
            yield self.state(k, dch, fch)

    def _random(self, k: int, rng: random.Random) -> CrashState:
        return self.state(k, *self.random_choice(k, rng))

    def generate(self, *, seed: int | None = None, exhaustive_limit: int = 4096,
                 samples: int = 512, max_attempts: int | None = None) -> CrashSet:
        """Distinct crash states: all of them when the total is at most
        ``exhaustive_limit``, else up to ``samples`` drawn with ``seed``.

        Distinct means distinct contents (:meth:`fingerprint_choice`); ``enumerated``
        counts the distinct combinations looked at, ``equivalents`` how many of them each
        kept state stands for (a combination drawn twice counts once).
        """
        seed = self.seed if seed is None else seed
        counts = [self.count(k) for k in range(self.n_prefixes)]
        total = sum(counts)
        dedup = Deduper(self)

        def done(exhaustive: bool, how: str) -> CrashSet:
            out = dedup.states()
            return CrashSet(out, total, len(out), exhaustive, seed, how, self.n_prefixes, dedup.enumerated,
                            dedup.end_equivalents())

        # Later prefixes first: of all combinations leaving the same contents, the one
        # kept is the crash latest in the save, whose ``lost`` list says the most
        # ("rename issued but lost" rather than "crashed before the rename").
        if total <= exhaustive_limit:
            for k in reversed(range(self.n_prefixes)):
                for ch in self.all_choices(k):
                    dedup.add(k, *ch, unique=True)
            return done(True, "exhaustive")
        rng = random.Random(seed)
        for k in reversed(range(self.n_prefixes)):
            for ch in self.extreme_choices(k):
                dedup.add(k, *ch)
                if len(dedup) >= samples:
                    break
        attempts = max_attempts if max_attempts is not None else samples * 20
        while len(dedup) < samples and attempts > 0:
            attempts -= 1
            k = rng.randrange(self.n_prefixes)
            dedup.add(k, *self.random_choice(k, rng))
        return done(False, f"seeded sample: per-prefix all-lost/all-persisted, then uniform "
                           f"prefix and uniform choices (seed {seed}, {samples} wanted)")


class Deduper:
    """Keeps one crash state per distinct tree, counting the combinations behind each.

    ``add(k, dirs, data)`` fingerprints a combination without building it; a new tree
    becomes a :class:`CrashState`, a tree seen before adds to its ``equivalents``. With
    ``latest=True`` a later crash point leaving the same tree replaces the kept state (its
    ``lost`` says the most, and a state the end can leave is judged as after the ack);
    otherwise the first one stays. A combination added twice (a sampler drawing it again)
    counts once unless the caller says it is ``unique`` (exhaustive enumeration).
    """

    def __init__(self, model: CrashModel, *, latest: bool = False) -> None:
        self.model = model
        self.latest = latest
        self.enumerated = 0
        self._seen_ids: set[str] = set()
        self._by_fp: dict[str, CrashState] = {}
        self._order: list[str] = []
        self._end = model.n_prefixes - 1
        self._at_end: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._order)

    def add(self, k: int, dirs: dict[int, int], data: dict[int, tuple[int, int]], *, unique: bool = False) -> None:
        if not unique:
            sid = CrashModel.choice_id(k, dirs, data)
            if sid in self._seen_ids:
                return
            self._seen_ids.add(sid)
        self.enumerated += 1
        fp = self.model.fingerprint_choice(k, dirs, data)
        if k == self._end:
            self._at_end[fp] = self._at_end.get(fp, 0) + 1
        old = self._by_fp.get(fp)
        if old is None:
            st = self.model.state(k, dirs, data)
            st.fingerprint = fp
            self._by_fp[fp] = st
            self._order.append(fp)
        elif self.latest and k > old.prefix:
            st = self.model.state(k, dirs, data)
            st.fingerprint, st.equivalents = fp, old.equivalents + 1
            self._by_fp[fp] = st
        else:
            old.equivalents += 1

    def end_equivalents(self) -> dict[str, int]:
        """Kept state id -> how many of its combinations crash after the last op."""
        return {self._by_fp[fp].id: n for fp, n in self._at_end.items()}

    def states(self) -> list[CrashState]:
        """The kept states, sorted by (prefix, id)."""
        out = [self._by_fp[fp] for fp in self._order]
        out.sort(key=lambda s: (s.prefix, s.id))
        return out


def materialize(state: CrashState, dest: str | os.PathLike[str]) -> str:
    """Write ``state`` (made by a :class:`CrashModel`) into ``dest``."""
    if state._model is None:
        raise FaultError("state has no model; use CrashModel.materialize(state_dict, dest)")
    return state._model.materialize(state, dest)


def clear(dest: str | os.PathLike[str]) -> None:
    """Empty a materialisation directory for reuse (keeps ``dest`` itself)."""
    out = os.fspath(dest)
    for name in os.listdir(out):
        p = os.path.join(out, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)


def bench(dest_root: str = "/dev/shm", *, files: int = 6, file_bytes: int = 256 << 10,
          seconds: float = 3.0) -> dict[str, Any]:
    """Materialisation rate for a checkpoint-shaped save (``python -m faults.crashstate``).

    An older checkpoint of ``files`` files is the base; the traced save writes the same
    number of ``file_bytes`` files into ``step-2.tmp`` in 64 KiB writes, fsyncs each,
    renames the directory and writes a manifest without a final directory fsync. One
    process then materialises states round-robin into fresh directories for
    ``seconds`` (each state's directory removed again, as a checker would).
    """
    import tempfile
    import time

    from faults.interposer import Interposer, read_trace

    work = tempfile.mkdtemp(prefix="chaos-csbench-", dir=dest_root)
    try:
        root = os.path.join(work, "ckpt")
        os.makedirs(os.path.join(root, "step-1"))
        for i in range(files):
            with open(os.path.join(root, "step-1", f"shard{i}"), "wb") as f:
                f.write(os.urandom(file_bytes))
        base = Snapshot.capture(root)
        trace = os.path.join(work, "trace.jsonl")
        with Interposer(root, 0, trace):
            tmp = os.path.join(root, "step-2.tmp")
            os.mkdir(tmp)
            for i in range(files):
                with open(os.path.join(tmp, f"shard{i}"), "wb") as f:
                    blob = os.urandom(file_bytes)
                    for o in range(0, file_bytes, 64 << 10):
                        f.write(blob[o:o + (64 << 10)])
                    f.flush()
                    os.fsync(f.fileno())
            os.rename(tmp, os.path.join(root, "step-2"))
            with open(os.path.join(root, "latest"), "w") as f:
                f.write("step-2")
        t0 = time.perf_counter()
        model = CrashModel(root, base, read_trace(trace, with_data=True), seed=0)
        cs = model.generate(samples=200)
        t_gen = time.perf_counter() - t0
        out = os.path.join(work, "out")
        os.mkdir(out)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            st = cs.states[n % len(cs.states)]
            d = os.path.join(out, str(n))
            model.materialize(st, d)
            shutil.rmtree(d)
            n += 1
        el = time.perf_counter() - t0
        return {"dest_root": dest_root, "ops": len(model.ops), "prefixes": model.n_prefixes,
                "total_possible": cs.total_possible, "generated": cs.generated,
                "exhaustive": cs.exhaustive, "generate_s": round(t_gen, 3),
                "bytes_per_state_max": (2 * files + 1) * file_bytes,
                "materialized": n, "states_per_s": round(n / el, 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover - a benchmark, not a test
    import json
    import sys

    for where in sys.argv[1:] or ["/dev/shm", "/tmp"]:
        print(json.dumps(bench(where)))


__all__ = ["CrashModel", "CrashSet", "CrashState", "Deduper", "Snapshot", "bench", "clear", "materialize",
           "merge_traces"]
