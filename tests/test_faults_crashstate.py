"""Crash states follow the model: lost renames, torn un-fsynced data, exact counts, seeds."""

from __future__ import annotations

import os
import pathlib

import pytest

from faults.crashstate import CrashModel, CrashState, Snapshot, materialize
from faults.interposer import Interposer, read_trace

R = "/r"


def op(seq: int, kind: str, **kw: object) -> dict:
    return {"event": "op", "seq": seq, "rank": 0, "op": kind, **kw}


def tmp_fsync_rename(dir_fsync: bool = False) -> list[dict]:
    """write tmp (100 B), fsync tmp, close, rename tmp -> ckpt; optionally fsync the dir."""
    t = [op(0, "open", path=f"{R}/ckpt.tmp", fd=5, created=True, trunc=True),
         op(1, "write", path=f"{R}/ckpt.tmp", fd=5, offset=0, length=100, data=b"A" * 100),
         op(2, "fsync", path=f"{R}/ckpt.tmp", fd=5),
         op(3, "close", path=f"{R}/ckpt.tmp", fd=5),
         op(4, "rename", src=f"{R}/ckpt.tmp", dst=f"{R}/ckpt", path=f"{R}/ckpt")]
    if dir_fsync:
        t += [op(5, "open", path=R, fd=6, is_dir=True), op(6, "fsync", path=R, fd=6),
              op(7, "close", path=R, fd=6)]
    return t


def contents(model: CrashModel, st: CrashState) -> dict[str, bytes]:
    return model.contents(st)[1]


def test_tmp_fsync_rename_without_dir_fsync() -> None:
    base = Snapshot({"old": b"OLD"})
    m = CrashModel(R, base, tmp_fsync_rename(), seed=1)
    cs = m.generate()
    # per prefix: 1 | create 2 | create 2 x cuts{0, torn, 100} 3 | 2 | 2 | queue[create, rename] 3
    assert [m.count(k) for k in range(m.n_prefixes)] == [1, 2, 6, 2, 2, 3]
    assert cs.exhaustive and cs.total_possible == 16 and cs.sampling == "exhaustive"
    got = {tuple(sorted((k, len(v)) for k, v in contents(m, s).items())) for s in cs.states}
    torn = [s for s in cs.states if any(x.get("torn") for x in s.lost)]
    assert len(torn) == 1
    t = torn[0].lost[0]["persisted"]
    assert 0 < t < 100
    assert got == {(("old", 3),), (("ckpt.tmp", 0), ("old", 3)), (("ckpt.tmp", t), ("old", 3)),
                   (("ckpt.tmp", 100), ("old", 3)), (("ckpt", 100), ("old", 3))}
    assert cs.generated == 5 == len(cs.states)
    assert sum(s.equivalents for s in cs.states) == 16
    # the rename was issued but lost: tmp survives with its fsynced data, ckpt absent
    lost_rename = [s for s in cs.states if s.prefix == 5 and contents(m, s) == {
        "old": b"OLD", "ckpt.tmp": b"A" * 100}]
    assert lost_rename and [x["op"] for x in lost_rename[0].lost] == ["rename"]
    assert lost_rename[0].lost[0]["src"] == "ckpt.tmp" and lost_rename[0].lost[0]["path"] == "ckpt"
    # the torn state is a prefix of what was written
    assert contents(m, torn[0])["ckpt.tmp"] == b"A" * t


def test_dir_fsync_makes_the_rename_durable() -> None:
    m = CrashModel(R, Snapshot(), tmp_fsync_rename(dir_fsync=True), seed=1)
    last = m.n_prefixes - 1
    assert m.count(last) == 1
    (st,) = [s for s in m.generate().states if s.prefix == last]
    assert contents(m, st) == {"ckpt": b"A" * 100} and st.lost == []


def test_unsynced_data_lost_torn_and_dir_rename_without_entries() -> None:
    """A checkpoint dir renamed into place whose files were never fsynced, nor the dir."""
    t = [op(0, "mkdir", path=f"{R}/s.tmp"),
         op(1, "open", path=f"{R}/s.tmp/w", fd=3, created=True, trunc=True),
         op(2, "write", path=f"{R}/s.tmp/w", fd=3, offset=0, length=8, data=b"12345678"),
         op(3, "write", path=f"{R}/s.tmp/w", fd=3, offset=8, length=4, data=b"abcd"),
         op(4, "close", path=f"{R}/s.tmp/w", fd=3),
         op(5, "rename", src=f"{R}/s.tmp", dst=f"{R}/s", path=f"{R}/s"),
         op(6, "open", path=R, fd=4, is_dir=True), op(7, "fsync", path=R, fd=4)]
    m = CrashModel(R, Snapshot(), t, seed=3)
    finals = [s for s in m.generate().states if s.prefix == m.n_prefixes - 1]
    dirs_files = [(tuple(m.contents(s)[0]), tuple(sorted(m.contents(s)[1].items()))) for s in finals]
    # root fsynced: 's' exists; its own entry list was never fsynced, so 'w' may be missing
    assert (("s",), ()) in dirs_files
    datas = {dict(f).get("s/w") for _d, f in dirs_files if f}
    assert {b"", b"12345678", b"12345678abcd"} <= datas  # whole-write prefixes
    assert any(d is not None and 0 < len(d) < 12 and len(d) != 8 for d in datas)  # torn inside


def test_sampling_is_seeded_and_reports_totals() -> None:
    t = []
    seq = 0
    for f in range(3):
        t.append(op(seq, "open", path=f"{R}/f{f}", fd=10 + f, created=True, trunc=True))
        seq += 1
    for i in range(30):
        f = i % 3
        t.append(op(seq, "write", path=f"{R}/f{f}", fd=10 + f, offset=(i // 3) * 10, length=10,
                    data=bytes([i]) * 10))
        seq += 1
    ma = CrashModel(R, Snapshot(), t, seed=5)
    a = ma.generate(samples=60)
    b = CrashModel(R, Snapshot(), t, seed=5).generate(samples=60)
    c = CrashModel(R, Snapshot(), t, seed=6).generate(samples=60)
    assert not a.exhaustive and a.generated == 60
    assert a.total_possible == sum(ma.count(k) for k in range(ma.n_prefixes)) > 4096
    assert [s.id for s in a.states] == [s.id for s in b.states]
    assert [s.fingerprint for s in a.states] != [s.fingerprint for s in c.states]
    assert "seed 5" in a.sampling
    assert len({s.fingerprint for s in a.states}) == 60  # distinct contents


def test_real_trace_materializes(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "keep").write_bytes(b"K")
    base = Snapshot.capture(root)
    trace = tmp_path / "trace.jsonl"
    with Interposer(root, 0, trace):
        os.makedirs(root / "step-1.tmp")
        with open(root / "step-1.tmp" / "shard", "wb") as f:
            f.write(b"x" * 5000)
            f.flush()
            os.fsync(f.fileno())
        os.replace(root / "step-1.tmp", root / "step-1")
    m = CrashModel(root, base, read_trace(trace, with_data=True))
    cs = m.generate()
    assert cs.exhaustive and cs.generated >= 4
    for st in cs.states:
        dest = tmp_path / "out" / st.id
        materialize(st, dest)
        dirs, files = m.contents(st)
        on_disk = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
        assert on_disk == files
        assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_dir()) == sorted(dirs)
        assert files["keep"] == b"K"  # what existed before the save is durable
    # a state dict (as a worker pool would receive it) materializes the same
    d = cs.states[-1].to_dict()
    m.materialize(d, tmp_path / "from_dict")
    assert (tmp_path / "from_dict" / "step-1" / "shard").read_bytes() == b"x" * 5000
    with pytest.raises(Exception, match="not empty"):
        m.materialize(d, tmp_path / "from_dict")


@pytest.mark.parametrize("failure", [
    {"event": "fired", "seq": 2, "rank": 0, "action": "fsync_fail", "op": "fsync", "path": f"{R}/ckpt.tmp", "fd": 5},
    op(2, "fsync", path=f"{R}/ckpt.tmp", fd=5, error=5),
], ids=["injected", "real"])
def test_data_before_a_failed_fsync_is_lost_even_after_a_later_fsync_succeeds(failure: dict) -> None:
    """fsyncgate: after a failed fsync the dirty pages may be dropped; a retry that succeeds
    does not bring them back, so no crash state may hold the bytes written before it."""
    trace = [op(0, "open", path=f"{R}/ckpt.tmp", fd=5, created=True, trunc=True),
             op(1, "write", path=f"{R}/ckpt.tmp", fd=5, offset=0, length=100, data=b"A" * 100),
             failure,
             op(3, "fsync", path=f"{R}/ckpt.tmp", fd=5),
             op(4, "write", path=f"{R}/ckpt.tmp", fd=5, offset=100, length=10, data=b"B" * 10),
             op(5, "fsync", path=f"{R}/ckpt.tmp", fd=5),
             op(6, "close", path=f"{R}/ckpt.tmp", fd=5)]
    m = CrashModel(R, Snapshot({}), trace, seed=1)
    states = m.generate().states
    # a crash before the failed fsync may hold the bytes (they may have been written back)
    assert any((contents(m, s).get("ckpt.tmp") or b"").startswith(b"A") for s in states if s.prefix <= 2)
    after = [contents(m, s).get("ckpt.tmp") for s in states if s.prefix > 3]  # prefix k: after op k-1
    assert after and not any(c and c.startswith(b"A") for c in after), after
    # what was written after the failure is durable once its own fsync returned
    last = [contents(m, s).get("ckpt.tmp") for s in states if s.prefix == m.n_prefixes - 1]
    assert [c for c in last if c is not None] and all(c.endswith(b"B" * 10) for c in last if c is not None)


# ---------------------------------------------------------------------- files from outside the root
def traced_move_in(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, cross_device: bool = False):
    """Lightning's _atomic_save: an fsspec transaction writes a mkstemp file in the temp dir and
    shutil.moves it into the root (a rename, or with ``cross_device`` a copy and an unlink)."""
    import shutil
    import tempfile

    import fsspec

    root, tmp = tmp_path / "root", tmp_path / "tmp"
    root.mkdir()
    tmp.mkdir()
    (root / "old.ckpt").write_bytes(b"OLD")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    base = Snapshot.capture(root)
    trace = tmp_path / "t.jsonl"
    payload = bytes(range(256)) * 40
    with Interposer(root, 0, trace) as ix:  # extra roots default to the temp dir
        assert ix.extra_roots == (os.path.realpath(tmp),)
        traced_rename = os.rename
        if cross_device:
            def rename(src, dst, **kw):  # what a temp dir on another file system answers
                if os.path.dirname(os.fspath(src)) == str(tmp):
                    raise OSError(18, "Invalid cross-device link")
                return traced_rename(src, dst, **kw)

            os.rename = rename
        try:
            fs, path = fsspec.core.url_to_fs(str(root / "step=12.ckpt"))
            with fs.transaction, fs.open(path, "wb") as f:
                f.write(payload)
        finally:
            os.rename = traced_rename
    assert not os.listdir(tmp) and shutil.os is os
    return root, base, read_trace(trace, with_data=True), payload


@pytest.mark.parametrize("cross_device", [False, True], ids=["rename", "copy-unlink"])
def test_a_temp_file_moved_in_from_the_temp_dir_carries_its_unsynced_data(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, cross_device: bool) -> None:
    root, base, recs, payload = traced_move_in(tmp_path, monkeypatch, cross_device)
    tmp = os.path.realpath(tmp_path / "tmp")
    opened = [r for r in recs if r["event"] == "op" and r["op"] == "open"]
    assert opened[0]["path"].startswith(tmp + "/") and opened[0]["created"]  # traced from mkstemp on
    writes = [r for r in recs if r["event"] == "op" and r["op"] == "write"]
    assert b"".join(w["data"] for w in writes if w["path"].startswith(tmp + "/")) == payload
    m = CrashModel(root, base, recs, seed=3)
    cs = m.generate()
    got = {contents(m, s).get("step=12.ckpt") for s in cs.states}
    assert None in got and payload in got and b"" in got  # lost, whole, or the entry without its data
    torn = [g for g in got if g and g != payload]
    assert torn and all(payload.startswith(g) for g in torn)
    assert all(contents(m, s)["old.ckpt"] == b"OLD" for s in cs.states)
    assert all(set(contents(m, s)) <= {"old.ckpt", "step=12.ckpt"} for s in cs.states)  # nothing of tmp
    lost = [x for s in cs.states for x in s.lost]
    if cross_device:  # the copy's own writes into the root
        copied = [w["data"] for w in writes if w["path"] == f"{os.path.realpath(root)}/step=12.ckpt"]
        assert b"".join(copied) == payload
        assert any(x["what"] == "dir_entry" and x["op"] == "create" and x["path"] == "step=12.ckpt" for x in lost)
    else:
        moved = [x for x in lost if x["what"] == "dir_entry" and x["op"] == "rename"]
        assert moved and moved[0]["src"].startswith(tmp + "/") and moved[0]["path"] == "step=12.ckpt"
    # Until the move, what the temp dir holds is no choice: the root reads as before.
    first_move = next(i for i, r in enumerate(m.ops) if r["op"] in ("rename", "open") and
                      (r.get("dst") or r.get("path") or "").startswith(os.path.realpath(root) + "/"))
    assert all(m.count(k) == 1 for k in range(first_move + 1))


def test_an_untraced_file_moved_in_is_taken_as_it_was(tmp_path: pathlib.Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (elsewhere / "made-before").write_bytes(b"BEFORE")  # no trace saw it written
    base = Snapshot.capture(root)
    with Interposer(root, 0, tmp_path / "t.jsonl", extra_roots=[]):
        os.rename(elsewhere / "made-before", root / "ckpt")
    recs = read_trace(tmp_path / "t.jsonl", with_data=True)
    ren = [r for r in recs if r["event"] == "op" and r["op"] == "rename"][0]
    assert ren["src"] is None and ren["src_untraced"] == str(elsewhere / "made-before") and ren["data"] == b"BEFORE"
    m = CrashModel(root, base, recs)
    assert {contents(m, s).get("ckpt") for s in m.generate().states} == {None, b"BEFORE"}


def test_an_outside_file_whose_creation_is_not_in_the_trace_is_refused(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from faults import FaultError

    root, base, recs, _payload = traced_move_in(tmp_path, monkeypatch)
    late = [r for r in recs if r.get("op") == "rename"]  # the trace slice began after the temp file was written
    with pytest.raises(FaultError, match="not created within this trace"):
        CrashModel(root, base, late)


def test_a_directory_staged_in_the_temp_dir_brings_its_own_pending_entries(tmp_path: pathlib.Path) -> None:
    """mkdtemp, a shard fsynced inside, the directory moved in and the root fsynced: the
    shard's name in the staged directory was never fsynced, so it may be missing."""
    import tempfile

    root, tmp = tmp_path / "root", tmp_path / "tmp"
    root.mkdir()
    tmp.mkdir()
    base = Snapshot.capture(root)
    with Interposer(root, 0, tmp_path / "t.jsonl", extra_roots=[tmp]):
        staging = tempfile.mkdtemp(dir=tmp)
        with open(os.path.join(staging, "shard"), "wb") as f:
            f.write(b"S" * 10)
            f.flush()
            os.fsync(f.fileno())
        os.rename(staging, root / "step-1")
        fd = os.open(root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    m = CrashModel(root, base, read_trace(tmp_path / "t.jsonl", with_data=True))
    end = [s for s in m.generate().states if s.prefix == m.n_prefixes - 1]
    assert {tuple(sorted(m.contents(s)[1].items())) for s in end} == {(), (("step-1/shard", b"S" * 10),)}
    assert {tuple(m.contents(s)[0]) for s in end} == {("step-1",)}  # the directory itself is durable
    missing = [s for s in end if not m.contents(s)[1]]
    assert missing[0].lost[0]["op"] == "create" and missing[0].lost[0]["path"].endswith("/shard")



def test_two_ranks_sharing_a_save_directory_merge_by_when_each_op_began() -> None:
    """Rank 1 makes the save's shared directory; rank 0's mkdir fails (it exists) and it
    writes its shard there. Each op's ``ts`` is when it began (the interposer stamps it
    before the syscall), so the merge puts the mkdir first however late rank 1 wrote its
    line. A file in a directory no earlier op made is refused, never silently dropped: a
    dropped shard made every state load the previous step (the CI flake of 2026-12-06)."""
    from faults import FaultError
    from faults.crashstate import merge_traces

    def r(rank: int, seq: int, ts: float, kind: str, **kw: object) -> dict:
        return {**op(seq, kind, **kw), "rank": rank, "ts": ts}

    shard = f"{R}/step-12.tmp/shard-0"
    rank0 = [r(0, 0, 2.0, "open", path=shard, fd=5, created=True, trunc=True),
             r(0, 1, 2.1, "write", path=shard, fd=5, offset=0, length=4, data=b"SSSS"),
             r(0, 2, 2.2, "fsync", path=shard, fd=5), r(0, 3, 2.3, "close", path=shard, fd=5)]
    mkdir = r(1, 0, 1.0, "mkdir", path=f"{R}/step-12.tmp")
    model = CrashModel(R, Snapshot(), merge_traces([rank0, [mkdir]]), seed=0)
    states = model.generate(exhaustive_limit=1 << 12).states
    assert any(contents(model, s).get("step-12.tmp/shard-0") == b"SSSS" for s in states)
    with pytest.raises(FaultError, match=r"step-12.tmp/shard-0 \(rank 0, seq 0\) in a directory that neither"):
        CrashModel(R, Snapshot(), merge_traces([rank0, [{**mkdir, "ts": 2.5}]]), seed=0)
