"""Crash states assembled from memoised trees and file versions equal states built from scratch.

``CrashModel.contents`` / ``fingerprint`` / ``materialize`` build each state as a delta
from shared pieces (a tree per crash point and directory choices, a file version per
inode, epoch and cut). Here, for many generated traces (hypothesis) and every
combination of their crash points, that is compared with the plain construction the
model used before the memos (a fresh copy of the durable tree, the chosen directory
operations replayed, every file's pending stream applied to its durable bytes), and
pruning by fingerprint is checked to mean byte-identical trees.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults.crashstate import CrashModel, CrashState, Deduper, Snapshot, _apply_data

R = "/r"
NAMES = ["a", "b", "d/c", "d/e", "a.tmp"]


def plain_contents(m: CrashModel, s: CrashState) -> tuple[list[str], dict[str, bytes]]:
    """The state's tree without any memo (the model's construction before deltas)."""
    p = m._prefixes[s.prefix]
    tree = {d: dict(e) for d, e in p.ddir.items()}
    chosen = [op for d, q in p.pdir.items() for op in q[: s.dirs.get(d, len(q))]]
    for op in sorted(chosen, key=lambda o: o.seq):
        m._apply_dirop(tree, op)
    dirs: list[str] = []
    files: dict[str, bytes] = {}
    stack = [(0, "")]
    seen = {0}
    while stack:
        d, rel = stack.pop()
        for name, ino in sorted(tree.get(d, {}).items()):
            path = f"{rel}/{name}" if rel else name
            if m._kind.get(ino) == "d":
                if ino in seen:
                    continue
                seen.add(ino)
                dirs.append(path)
                stack.append((ino, path))
            else:
                base = p.ddata.get(ino, b"")
                q = p.pdata.get(ino)
                if not q:
                    files[path] = base
                    continue
                whole, extra = s.data.get(ino, (len(q), 0))
                tail = None
                if extra and whole < len(q) and q[whole][0] == "w":
                    kind, off, data = q[whole]
                    tail = (kind, off, data[:extra])
                files[path] = _apply_data(base, q[:whole], tail)
    dirs.sort(key=lambda x: (x.count("/"), x))
    return dirs, files


@st.composite
def traces(draw: st.DrawFn) -> list[dict]:
    """A save-like trace over a few names: creates, writes, truncates, fsyncs (some failing),
    renames, unlinks, mkdir and directory fsyncs, in any order the model must take."""
    recs: list[dict] = []
    seq = itertools.count()
    fds: dict[int, str] = {}
    nfd = itertools.count(10)

    def op(kind: str, **kw: object) -> None:
        recs.append({"event": "op", "seq": next(seq), "rank": 0, "op": kind, **kw})

    op("mkdir", path=f"{R}/d")
    for _ in range(draw(st.integers(3, 14))):
        what = draw(st.sampled_from(["open", "write", "write", "fsync", "close", "rename", "unlink",
                                     "truncate", "dirsync", "failsync"]))
        name = draw(st.sampled_from(NAMES))
        path = f"{R}/{name}"
        if what == "open":
            fd = next(nfd)
            fds[fd] = path
            op("open", path=path, fd=fd, created=True, trunc=draw(st.booleans()))
        elif what in ("write", "fsync", "close", "failsync") and fds:
            fd = draw(st.sampled_from(sorted(fds)))
            p = fds[fd]
            if what == "write":
                data = draw(st.binary(min_size=1, max_size=40))
                op("write", path=p, fd=fd, offset=draw(st.integers(0, 30)), length=len(data), data=data)
            elif what == "fsync":
                op("fsync", path=p, fd=fd)
            elif what == "failsync":
                recs.append({"event": "op", "seq": next(seq), "rank": 0, "op": "fsync", "path": p, "fd": fd,
                             "error": "OSError: [Errno 5] EIO"})
            else:
                op("close", path=p, fd=fd)
                del fds[fd]
        elif what == "rename":
            op("rename", src=path, dst=f"{R}/{draw(st.sampled_from(NAMES))}", path=path)
        elif what == "unlink":
            op("unlink", path=path)
        elif what == "truncate":
            op("truncate", path=path, length=draw(st.integers(0, 20)))
        elif what == "dirsync":
            d = draw(st.sampled_from([R, f"{R}/d"]))
            fd = next(nfd)
            op("open", path=d, fd=fd, is_dir=True)
            op("fsync", path=d, fd=fd)
            op("close", path=d, fd=fd)
    return recs


BASE = Snapshot({"a": b"old-a" * 3, "d/c": b"C" * 7}, ("d",))


def _combos(m: CrashModel, limit: int = 60) -> list[CrashState]:
    out = []
    rng = random.Random(0)
    for k in range(m.n_prefixes):
        chs = list(itertools.islice(m.all_choices(k), 400))
        rng.shuffle(chs)
        out += [m.state(k, *ch) for ch in chs[:limit]]
    rng.shuffle(out)  # any order: a memo filled by one crash point must serve every other
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(), st.integers(0, 3))
def test_delta_built_states_equal_plain_ones_and_fingerprints_mean_identical_trees(recs: list[dict], seed: int) -> None:
    m = CrashModel(R, BASE, recs, seed=seed)
    states = _combos(m)
    by_fp: dict[str, tuple[list[str], dict[str, bytes]]] = {}
    by_tree: dict[tuple, str] = {}
    for s in states:
        plain = plain_contents(m, s)
        assert m.contents(s) == plain, s.id
        fp = m.fingerprint(s)
        assert fp == m.fingerprint_choice(s.prefix, s.dirs, s.data)
        if fp in by_fp:
            assert by_fp[fp] == plain, f"{s.id}: same fingerprint, different tree"
        by_fp[fp] = plain
        key = (tuple(plain[0]), tuple(sorted(plain[1].items())))
        assert by_tree.setdefault(key, fp) == fp, f"{s.id}: same tree, different fingerprint"
    # a model whose file-version memo holds nothing (evicted every time) builds the same
    small = CrashModel(R, BASE, recs, seed=seed)
    small._DATA_MEMO_LIMIT = 1
    for s in states[::3]:
        assert small.contents(small.state(s.prefix, s.dirs, s.data)) == plain_contents(m, s)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(traces())
def test_dedup_keeps_one_state_per_tree_and_counts_every_combination(tmp_path: pathlib.Path, recs: list[dict]) -> None:
    m = CrashModel(R, BASE, recs)
    dd = Deduper(m, latest=True)
    every = []
    for k in reversed(range(m.n_prefixes)):
        for ch in itertools.islice(m.all_choices(k), 300):
            dd.add(k, *ch, unique=True)
            every.append(m.state(k, *ch))
    kept = dd.states()
    assert dd.enumerated == len(every) == sum(s.equivalents for s in kept)
    assert len({s.fingerprint for s in kept}) == len(kept)
    ends = dd.end_equivalents()
    assert sum(ends.values()) == sum(1 for s in every if s.prefix == m.n_prefixes - 1)
    trees = {s.fingerprint: plain_contents(m, s) for s in kept}
    for s in every:  # every pruned combination has exactly the tree of the state kept for it
        assert plain_contents(m, s) == trees[m.fingerprint(s)]
        kept_one = next(x for x in kept if x.fingerprint == m.fingerprint(s))
        assert kept_one.prefix >= s.prefix  # the latest crash point leaving that tree is kept
    # and it materialises byte for byte as built from scratch
    for s in kept[:8]:
        dest = tmp_path / f"{len(os.listdir(tmp_path))}"
        m.materialize(s, dest)
        dirs, files = plain_contents(m, s)
        on_disk = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
        assert on_disk == files
        assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_dir()) == sorted(dirs)


def test_generate_counts_a_combination_drawn_twice_once() -> None:
    recs = [{"event": "op", "seq": i, "rank": 0, "op": "write", "path": f"{R}/a", "fd": None, "offset": 0,
             "length": 3, "data": b"xyz"} for i in range(12)]
    m = CrashModel(R, BASE, recs)
    cs = m.generate(exhaustive_limit=0, samples=10_000, max_attempts=2000)
    assert not cs.exhaustive
    assert cs.enumerated == sum(s.equivalents for s in cs.states) <= cs.total_possible
    assert cs.generated == len(cs.states) == len({s.fingerprint for s in cs.states})
