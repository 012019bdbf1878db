"""The I/O interposer sees every route it claims, ignores the rest, and fires exactly."""

from __future__ import annotations

import builtins
import errno
import io
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from chaos import phases
from faults.interposer import Interposer, IORule, read_trace, snapshot_tree, untraced_changes

REPO = pathlib.Path(__file__).resolve().parents[1]


def ops(ix: Interposer, kind: str | None = None) -> list[dict]:
    return [r for r in ix.records if r["event"] == "op" and (kind is None or r["op"] == kind)]


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)  # the interposer is given the symlink: paths must come out realpath'd
    return link


def test_file_objects_traced_at_kernel_offsets(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    real = os.path.realpath(root)
    with Interposer(root, rank=3, trace_path=tmp_path / "t.jsonl") as ix:
        with open(root / "a.bin", "wb") as f:
            f.write(b"hello")
            f.seek(10)  # flushes "hello" at 0, then "world" lands at 10
            f.writelines([b"wor", b"ld"])
            f.flush()
            os.fsync(f.fileno())
            f.truncate(12)
        with open(root / "t.txt", "a", encoding="utf-8") as f:
            f.write("x\n")
        with open(root / "t.txt", "a", encoding="utf-8") as f:
            f.write("yz\n")
    recs = ops(ix)
    a = f"{real}/a.bin"
    assert [(r["op"], r.get("offset"), r.get("length")) for r in recs if r["path"] == a] == [
        ("open", None, None), ("write", 0, 5), ("write", 10, 5), ("fsync", None, None),
        ("truncate", None, 12), ("close", None, None)]
    assert all(r["rank"] == 3 for r in recs)
    assert [r["seq"] for r in ix.records] == sorted(r["seq"] for r in ix.records)
    appends = [(r["offset"], r["length"]) for r in recs if r["op"] == "write" and r["path"].endswith("t.txt")]
    assert appends == [(0, 2), (2, 3)]  # O_APPEND offsets are the file end
    # persisted trace and data side file agree with memory
    disk = read_trace(tmp_path / "t.jsonl", with_data=True)
    writes = [r for r in disk if r["event"] == "op" and r["op"] == "write"]
    assert [w["data"] for w in writes] == [b"hello", b"world", b"x\n", b"yz\n"]
    assert (root / "a.bin").read_bytes() == b"hello\0\0\0\0\0wo"


def test_os_pathlib_shutil_routes(root: pathlib.Path) -> None:
    r = os.path.realpath(root)
    with Interposer(root) as ix:
        fd = os.open(root / "c", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"123")
        os.pwrite(fd, b"zz", 100)
        os.fdatasync(fd)
        os.ftruncate(fd, 50)
        os.close(fd)
        os.truncate(root / "c", 3)
        os.makedirs(root / "d" / "e")
        p = root / "d" / "p.txt"
        p.write_text("x")
        p.write_bytes(b"yy")
        (root / "d" / "touched").touch()
        p.rename(root / "d" / "q.txt")
        (root / "d" / "q.txt").replace(root / "q2")
        (root / "d" / "e").rmdir()
        shutil.copyfile(root / "c", root / "copy")
        shutil.copy2(root / "c", root / "copy2")
        shutil.move(str(root / "copy2"), str(root / "d" / "moved"))
        os.link(root / "copy", root / "hard")
        shutil.rmtree(root / "d")
        (root / "hard").unlink()
        os.remove(root / "q2")
        dfd = os.open(root, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
    seen = {(x["op"], x.get("via")) for x in ops(ix)}
    for kind in ("open", "write", "truncate", "fsync", "fdatasync", "close", "rename", "link",
                 "unlink", "mkdir", "rmdir"):
        assert any(k == kind for k, _v in seen), kind
    for via in ("os.write", "os.pwrite", "os.sendfile", "os.ftruncate", "os.truncate", "replace",
                "remove", "file", "io.open", "os.open"):
        assert any(v == via for _k, v in seen), via
    w = [(x["path"], x["offset"], x["length"], x["via"]) for x in ops(ix, "write")]
    assert (f"{r}/c", 0, 3, "os.write") in w
    assert (f"{r}/c", 100, 2, "os.pwrite") in w
    assert (f"{r}/copy", 0, 3, "os.sendfile") in w  # shutil.copyfile's sendfile path
    assert [x["path"] for x in ops(ix, "mkdir")] == [f"{r}/d", f"{r}/d/e"]  # makedirs
    renames = [(x["src"], x["dst"], x["via"]) for x in ops(ix, "rename")]
    assert renames == [(f"{r}/d/p.txt", f"{r}/d/q.txt", "rename"),
                       (f"{r}/d/q.txt", f"{r}/q2", "replace"),
                       (f"{r}/copy2", f"{r}/d/moved", "rename")]  # shutil.move
    unlinked = [x["path"] for x in ops(ix, "unlink")]
    # rmtree works with dir_fd-relative names; they must resolve to full paths
    assert sorted(unlinked) == sorted([f"{r}/d/moved", f"{r}/d/touched", f"{r}/hard", f"{r}/q2"])
    assert f"{r}/d" in [x["path"] for x in ops(ix, "rmdir")]
    touched = [x for x in ops(ix, "open") if x["path"] == f"{r}/d/touched"]
    assert touched and touched[0]["created"] is True
    dir_sync = [x for x in ops(ix, "fsync") if x["path"] == r]
    assert dir_sync and dir_sync[0]["is_dir"] is True
    assert (f"{r}/c", 3) in [(x["path"], x["length"]) for x in ops(ix, "truncate")]


def test_ignores_outside_root_and_python_keeps_working(root: pathlib.Path, tmp_path: pathlib.Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    outside = tmp_path / "outside.txt"  # outside the root and outside its extra root
    (tmp_path / "tmp").mkdir()
    with Interposer(root, extra_roots=[tmp_path / "tmp"]) as ix:
        with open(outside, "w") as f:
            f.write("no")
        fd = os.open(outside, os.O_WRONLY)
        os.write(fd, b"x")
        os.close(fd)
        os.rename(outside, tmp_path / "o2")
        logging.getLogger("t").warning("logging still works")
        import email.mime.audio  # noqa: F401 - an import while installed
        with open(root / "in", "w") as f:
            f.write("yes")
    assert {x["path"] for x in ops(ix)} == {f"{os.path.realpath(root)}/in"}
    assert "logging still works" in caplog.text


def test_uninstall_restores_originals(root: pathlib.Path) -> None:
    names = ["open", "write", "pwrite", "fsync", "fdatasync", "rename", "replace", "unlink",
             "remove", "mkdir", "rmdir", "truncate", "ftruncate", "close", "sendfile", "link"]
    before = {n: getattr(os, n) for n in names}
    b_open, i_open = builtins.open, io.open
    ix = Interposer(root).install()
    assert os.write is not before["write"] and builtins.open is not b_open
    ix.uninstall()
    ix.uninstall()  # idempotent
    assert {n: getattr(os, n) for n in names} == before
    assert builtins.open is b_open and io.open is i_open
    n = len(ix.records)
    (root / "after").write_bytes(b"x")
    phases.phase("anything", step=1)
    assert len(ix.records) == n


KILL_SCRIPT = textwrap.dedent("""
    import os, sys
    from chaos import phases
    from faults.interposer import Interposer, IORule
    root, trace, rule = sys.argv[1], sys.argv[2], eval(sys.argv[3])
    Interposer(root, 0, trace, [rule]).install()
    data = bytes(range(256)) * 400          # 102400 bytes
    phases.phase("write", step=10)
    with open(os.path.join(root, "shard.bin"), "wb") as f:
        for i in range(0, len(data), 3000):   # buffered: raw writes are 8 KiB-ish chunks
            f.write(data[i:i + 3000])
        f.flush()
        os.fsync(f.fileno())
    phases.phase("rename", step=5)
    phases.phase("rename", step=10)
    os.rename(os.path.join(root, "shard.bin"), os.path.join(root, "final.bin"))
    print("survived")
""")


def run_kill(tmp_path: pathlib.Path, rule: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    root = tmp_path / "root"
    root.mkdir()
    trace = tmp_path / "trace.jsonl"
    p = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(root), str(trace), rule],
                       capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    return p, read_trace(trace, with_data=True)


@pytest.mark.parametrize("x", [0, 5000, 12345, 102399])
def test_byte_rule_kill_leaves_exactly_x_bytes(tmp_path: pathlib.Path, x: int) -> None:
    p, recs = run_kill(tmp_path, f"IORule('kill', byte={x}, path_glob='shard.*')")
    assert p.returncode == -9, p.stderr
    data = (bytes(range(256)) * 400)[:x]
    assert (tmp_path / "root" / "shard.bin").read_bytes() == data
    fired = [r for r in recs if r["event"] == "fired"]
    assert len(fired) == 1 and fired[0]["byte"] == x and fired[0]["written"] == x - fired[0]["offset"]
    assert fired[0]["offset"] <= x < fired[0]["offset"] + fired[0]["length"]
    # the trace (which survived the kill) holds every byte that reached the file
    assert b"".join(r["data"] for r in recs if r["event"] == "op" and r["op"] == "write") == data


def test_phase_rule_kills_at_the_named_step(tmp_path: pathlib.Path) -> None:
    p, recs = run_kill(tmp_path, "IORule('kill', phase='rename', step=10)")
    assert p.returncode == -9 and "survived" not in p.stdout
    fired = [r for r in recs if r["event"] == "fired"]
    assert fired[0]["phase"] == "rename" and fired[0]["info"] == {"step": 10}
    assert (tmp_path / "root" / "shard.bin").stat().st_size == 102400  # not renamed
    assert [r["info"]["step"] for r in recs if r["event"] == "phase"] == [10, 5, 10]


def test_nth_op_rule_kills_before_the_op(tmp_path: pathlib.Path) -> None:
    p, recs = run_kill(tmp_path, "IORule('kill', op='rename', nth=1)")
    assert p.returncode == -9
    assert (tmp_path / "root" / "shard.bin").exists() and not (tmp_path / "root" / "final.bin").exists()
    assert [r["op"] for r in recs if r["event"] == "fired"] == ["rename"]
    again = tmp_path / "again"
    again.mkdir()
    p, _ = run_kill(again, "IORule('kill', op='rename', nth=2)")
    assert p.returncode == 0 and "survived" in p.stdout  # only one rename: nth=2 never fires


def test_error_actions_raise_with_errno_at_the_point(root: pathlib.Path) -> None:
    rules = [IORule("enospc", op="write", nth=2, path_glob="a*"),
             IORule("eio", op="rename"),
             IORule("fsync_fail", path_glob="b"),
             IORule("enospc", byte=10, path_glob="c")]
    with Interposer(root, rules=rules) as ix:
        fd = os.open(root / "a", os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"one")
        with pytest.raises(OSError) as e:
            os.write(fd, b"two")
        assert e.value.errno == errno.ENOSPC
        os.write(fd, b"three")  # times=1: fired once
        os.close(fd)
        with pytest.raises(OSError) as e:
            os.rename(root / "a", root / "a2")
        assert e.value.errno == errno.EIO
        assert (root / "a").exists() and not (root / "a2").exists()
        with open(root / "b", "wb") as f:
            f.write(b"x")
            f.flush()
            with pytest.raises(OSError) as e:
                os.fsync(f.fileno())
            assert e.value.errno == errno.EIO
        with pytest.raises(OSError) as e, open(root / "c", "wb", buffering=0) as f:
            f.write(b"0123456789abcdef")
        assert e.value.errno == errno.ENOSPC
    assert (root / "a").read_bytes() == b"onethree"
    assert (root / "c").read_bytes() == b"0123456789"
    assert [(f["action"], f["op"]) for f in ix.fired] == [
        ("enospc", "write"), ("eio", "rename"), ("fsync_fail", "fsync"), ("enospc", "write")]
    assert ix.fired[0]["offset"] == 3 and ix.fired[3]["written"] == 10


def test_short_write_returns_short_and_delay_sleeps(root: pathlib.Path) -> None:
    rules = [IORule("short_write", keep=4, then="return"), IORule("delay", op="fsync", delay_s=0.2)]
    with Interposer(root, rules=rules) as ix:
        fd = os.open(root / "s", os.O_WRONLY | os.O_CREAT)
        assert os.write(fd, b"0123456789") == 4
        t = time.monotonic()
        os.fsync(fd)
        assert time.monotonic() - t >= 0.2
        os.close(fd)
    assert (root / "s").read_bytes() == b"0123"
    assert [f["action"] for f in ix.fired] == ["short_write", "delay"]


def test_phase_arms_an_op_rule(root: pathlib.Path) -> None:
    with Interposer(root, rules=[IORule("eio", phase="commit", step=3, op="fsync")]):
        fd = os.open(root / "f", os.O_WRONLY | os.O_CREAT)
        os.fsync(fd)  # not armed yet
        phases.phase("commit", step=2)
        os.fsync(fd)  # wrong step
        phases.phase("commit", step=3)
        with pytest.raises(OSError):
            os.fsync(fd)
        os.close(fd)


def test_untraced_changes_names_writers_the_trace_cannot_see(root: pathlib.Path) -> None:
    """A child process's writes (here a shell's) bypass the interposer; the snapshot names them."""
    (root / "old").write_bytes(b"x")
    before = snapshot_tree(root)
    with Interposer(root) as ix:
        (root / "py.bin").write_bytes(b"traced")
        subprocess.run(["sh", "-c", 'printf untraced > "$1"', "sh", str(root / "child.bin")], check=True)
        assert not [x for x in ops(ix) if "child" in x["path"]]
    assert untraced_changes(root, ix.records, before) == [f"{os.path.realpath(root)}/child.bin"]


def test_rules_validate() -> None:
    from chaos.errors import ConfigError

    for bad in (dict(action="explode"), dict(action="kill", op="bogus"),
                dict(action="fsync_fail", op="write"), dict(action="delay"),
                dict(action="kill", byte=3, op="rename")):
        with pytest.raises(ConfigError):
            IORule(**bad)
    r = IORule("kill", byte=7, path_glob="*.bin")
    assert IORule.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_past_rule_is_a_per_file_size_limit(root: pathlib.Path) -> None:
    from faults.disk import plan_disk_full

    rule = IORule("enospc", byte=6, past=True, times=None)
    with Interposer(root, rules=[rule]) as ix:
        fd = os.open(root / "f", os.O_WRONLY | os.O_CREAT)
        assert os.write(fd, b"0123") == 4
        for _ in range(2):  # the covering write, then a write wholly past the limit
            with pytest.raises(OSError) as e:
                os.write(fd, b"456789")
            assert e.value.errno == errno.ENOSPC
        os.close(fd)
    assert (root / "f").read_bytes() == b"012345"
    assert [f["written"] for f in ix.fired] == [2, 0]
    plan = plan_disk_full(1 << 20)
    assert plan["mechanism"] in ("tmpfs-private-ns", "interposer") and plan["reason"]
    if plan["mechanism"] == "interposer":
        assert IORule.from_dict(plan["rule"]).past


def test_extra_root_files_are_traced_from_their_creation(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp / "before.log").write_text("old")  # there before: its history is unknown, so never traced
    real, rtmp = os.path.realpath(root), os.path.realpath(tmp)
    with Interposer(root, extra_roots=[tmp]) as ix:
        with open(tmp / "before.log", "a") as f:
            f.write("more")
        fd, name = tempfile.mkstemp(dir=tmp)  # O_CREAT | O_EXCL: traced from here
        os.write(fd, b"abc")
        os.fsync(fd)
        os.close(fd)
        os.rename(name, tmp / "renamed")  # still traced under its new name
        with open(tmp / "renamed", "ab") as f:
            f.write(b"d")
        staging = tempfile.mkdtemp(dir=tmp)
        with open(os.path.join(staging, "shard"), "wb") as f:
            f.write(b"S")
        shutil.move(staging, root / "step-1")  # a staged directory moved in
        shutil.move(str(tmp / "renamed"), str(root / "file"))
        with open(tmp / "scratch", "w") as f:
            f.write("x")
        os.unlink(tmp / "scratch")
        with open(tmp / "scratch", "a") as f:  # recreated after the unlink: traced again
            f.write("y")
    paths = {r.get("path") for r in ops(ix)}
    assert f"{rtmp}/before.log" not in paths
    assert {name, f"{rtmp}/renamed", f"{rtmp}/scratch", os.path.join(staging, "shard")} <= paths
    renames = [(r["src"], r["dst"]) for r in ops(ix, "rename")]
    assert renames == [(name, f"{rtmp}/renamed"), (staging, f"{real}/step-1"), (f"{rtmp}/renamed", f"{real}/file")]
    assert [r["path"] for r in ops(ix, "mkdir")] == [staging]
    assert [r["path"] for r in ops(ix, "unlink")] == [f"{rtmp}/scratch"]
    assert ix._tracked == {f"{rtmp}/scratch"}  # what moved into the root is the root's now


def test_default_extra_root_is_the_temp_dir_found_without_writing_there(
        root: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    tmp = tmp_path / "rank-tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # as at interpreter start: gettempdir() would probe
    monkeypatch.setenv("TMPDIR", str(tmp))
    ix = Interposer(root, trace_path=tmp_path / "t.jsonl").install()
    try:
        assert ix.extra_roots == (os.path.realpath(tmp),)
        assert tempfile.tempdir is None and os.listdir(tmp) == []  # nothing of the harness's own went there
        with open(root / "a", "wb") as f:
            f.write(b"x")
    finally:
        ix.uninstall()
    assert os.listdir(tmp) == []
    inside = Interposer(root, extra_roots=[root / "sub", tmp]).install()
    inside.uninstall()
    assert inside.extra_roots == (os.path.realpath(tmp),)  # one inside the root adds nothing


def test_quiesced_holds_other_threads_out_of_traced_io(tmp_path: pathlib.Path) -> None:
    """While held, another thread's writes neither reach the disk nor the trace: a snapshot
    and a count of the trace's lines taken then agree (the built-in power-loss point)."""
    import threading

    root = tmp_path / "ckpt"
    root.mkdir()
    trace = tmp_path / "trace.jsonl"
    stop = threading.Event()
    ix = Interposer(root, trace_path=trace, keep_records=False, extra_roots=())

    def writer() -> None:
        n = 0
        while not stop.is_set():
            with open(root / "metrics.prom", "wb") as f:
                f.write(str(n).encode())
            n += 1

    with ix:
        t = threading.Thread(target=writer)
        t.start()
        try:
            time.sleep(0.05)
            with ix.quiesced():
                lines, data = trace.read_bytes().count(b"\n"), (root / "metrics.prom").read_bytes()
                time.sleep(0.2)
                assert trace.read_bytes().count(b"\n") == lines
                assert (root / "metrics.prom").read_bytes() == data
                with open(root / "mine", "wb") as f:  # the holder's own I/O is still traced
                    f.write(b"x")
                held = trace.read_bytes().count(b"\n")
                assert held > lines
            time.sleep(0.1)
            assert trace.read_bytes().count(b"\n") > held  # released, the writer went on
        finally:
            stop.set()
            t.join()
    last = [r for r in read_trace(trace) if r.get("op") == "write" and r["path"].endswith("metrics.prom")][-1]
    assert last["length"] == len((root / "metrics.prom").read_bytes())  # the trace ends where the disk does


def test_an_op_is_stamped_when_it_began_not_when_its_line_was_written(tmp_path: pathlib.Path) -> None:
    """A thread descheduled between its syscall and its trace line keeps the time its op
    began: ranks' traces merge by it (``faults.crashstate.merge_traces``)."""
    import threading

    root = tmp_path / "ckpt"
    root.mkdir()
    original = os.mkdir

    def slow_return(*args: object, **kw: object) -> None:
        original(*args, **kw)  # type: ignore[arg-type]
        time.sleep(0.3)  # the syscall is done; the thread is late to write its line

    os.mkdir = slow_return  # there when the interposer is made: it is the "original" it calls
    try:
        ix = Interposer(root, trace_path=tmp_path / "t.jsonl", extra_roots=())
    finally:
        os.mkdir = original
    ix.install()
    try:
        began = time.monotonic()
        t = threading.Thread(target=os.mkdir, args=(str(root / "shared"),))
        t.start()
        t.join()
        ended = time.monotonic()
        with open(root / "after", "wb") as f:
            f.write(b"x")
    finally:
        ix.uninstall()
        os.mkdir = original  # uninstall put back what it found at construction
    recs = [r for r in read_trace(tmp_path / "t.jsonl") if r.get("event") == "op"]
    mkdir = next(r for r in recs if r["op"] == "mkdir")
    assert began <= mkdir["ts"] < began + 0.2 < ended
    assert [r["seq"] for r in recs] == sorted(r["seq"] for r in recs)
    assert [r["ts"] for r in recs] == sorted(r["ts"] for r in recs)  # one rank: still in seq order
