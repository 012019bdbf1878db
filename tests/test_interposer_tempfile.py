"""Files opened through an ``opener`` are traced under the path the opener really opened.

``tempfile.NamedTemporaryFile(dir=d)`` calls ``io.open(d, mode, opener=...)``: ``d`` is only
the name handed to the opener, which makes ``d/tmpXXXX`` with ``os.open``. The interposer
used to record that open, its writes and its close against ``d`` itself, so the later
``os.replace(tmpXXXX, ckpt)`` moved a file the crash model never saw created: no power state
was ever "rename kept, data lost", and an injected ENOSPC named the directory. These tests
drive the interposer directly (``Interposer``) and a real job through ``chaos run``.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from faults.interposer import Interposer, IORule, read_trace

REPO = Path(__file__).resolve().parent.parent
_WRITTEN = ("write", "truncate", "fsync", "fdatasync", "close")


def _ops(ix: Interposer) -> list[dict[str, Any]]:
    return [r for r in ix.records if r["event"] == "op"]


def _names_a_directory_as_a_file(rec: dict[str, Any]) -> bool:
    """A record that treats a directory as a file written (the bug: ``open``/``write``/``close`` of ``d``)."""
    path = rec.get("path")
    if rec.get("event") != "op" or not isinstance(path, str) or not os.path.isdir(path):
        return False
    return rec["op"] in (*_WRITTEN, "open") and not rec.get("is_dir")


# ---------------------------------------------------------------------- the interposer alone
def test_named_temporary_file_is_traced_under_its_own_name(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    with Interposer(root, extra_roots=()) as ix:
        with tempfile.NamedTemporaryFile("w", dir=root, delete=False) as f:
            f.write('{"step": 3}')
            f.flush()
            os.fsync(f.fileno())
        os.replace(f.name, root / "ckpt")
    tmp = os.path.realpath(f.name)
    assert os.path.dirname(tmp) == str(root) and tmp != str(root)
    ops = _ops(ix)
    assert [(r["op"], r["path"]) for r in ops] == [
        ("open", tmp), ("write", tmp), ("fsync", tmp), ("close", tmp), ("rename", str(root / "ckpt")),
    ]
    opened, written = ops[0], ops[1]
    assert opened["created"] and "creat" in opened["flags"] and opened["opener"] == "io.open"
    assert not opened["is_dir"]
    assert ix.data_of(written) == b'{"step": 3}' and written["offset"] == 0
    assert ops[4]["src"] == tmp  # the rename moves the very file the trace saw created
    assert not any(_names_a_directory_as_a_file(r) for r in ops)


def test_a_write_error_on_a_named_temporary_file_names_the_file_not_its_directory(tmp_path: Path) -> None:
    """The ENOSPC message case: a rule on ``tmp*`` fires on the temporary file's write, and the
    fired record (what a user reads as "rank 0's write of ...") names that file."""
    root = tmp_path.resolve()
    with Interposer(root, extra_roots=(), rules=[IORule("enospc", op="write", path_glob="tmp*")]) as ix:
        with tempfile.NamedTemporaryFile("wb", buffering=0, dir=root, delete=False) as f:
            with pytest.raises(OSError) as err:
                f.write(b"x" * 64)
    assert err.value.errno == errno.ENOSPC
    [fired] = ix.fired
    assert fired["op"] == "write" and fired["path"] == os.path.realpath(f.name)
    assert err.value.filename == os.path.realpath(f.name)


def test_open_with_an_opener_is_traced_under_the_path_the_opener_opened(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    alias, real = root / "alias", root / "real"

    def opener(path: str, flags: int) -> int:
        assert os.fspath(path) == str(alias)
        return os.open(real, flags, 0o644)

    with Interposer(root, extra_roots=()) as ix:
        with open(alias, "wb", opener=opener) as f:
            f.write(b"abc")
        with open(alias, "rb", opener=opener) as f:  # a read: its fd is forgotten at close too
            assert f.read() == b"abc"
    assert not alias.exists() and real.read_bytes() == b"abc"
    ops = _ops(ix)
    assert [(r["op"], r["path"]) for r in ops] == [
        ("open", str(real)), ("write", str(real)), ("close", str(real)),
        ("open", str(real)), ("close", str(real)),
    ]
    assert ops[0]["created"] and ops[0]["trunc"] and ops[0]["opener"] == "io.open"
    assert ops[3]["flags"] == ["rdonly"]
    assert not any(r.get("path") == str(alias) for r in ix.records)


def test_an_open_rule_fires_on_the_path_the_opener_opens(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    with Interposer(root, extra_roots=(), rules=[IORule("eio", op="open", path_glob="real")]) as ix:
        with pytest.raises(OSError) as err:
            open(root / "alias", "w", opener=lambda p, fl: os.open(root / "real", fl, 0o644))
    assert err.value.errno == errno.EIO
    assert [(r["op"], r["path"]) for r in ix.fired] == [("open", str(root / "real"))]
    assert not (root / "real").exists()  # an error rule keeps the open from happening


def test_an_opener_the_interposer_cannot_see_is_traced_from_its_fd(tmp_path: Path) -> None:
    """An opener holding ``os.open`` from before install (as C code would open the file): the
    open is recorded after the fact, the path read back from the fd."""
    root = tmp_path.resolve()
    real_open = os.open

    with Interposer(root, extra_roots=()) as ix:
        with open(root / "alias", "w", opener=lambda p, fl: real_open(root / "real", fl, 0o644)) as f:
            f.write("hi")
    ops = _ops(ix)
    assert [(r["op"], r["path"]) for r in ops] == [
        ("open", str(root / "real")), ("write", str(root / "real")), ("close", str(root / "real")),
    ]
    assert ops[0]["opener"] == "untraced" and ops[0]["mode"] == "w"


def test_anonymous_temporary_files_never_name_their_directory(tmp_path: Path) -> None:
    """``TemporaryFile`` (an ``O_TMPFILE`` file, or mkstemp then unlink where that fails) and a
    ``SpooledTemporaryFile`` that rolled over: nothing written is pinned on the directory."""
    root = tmp_path.resolve()
    with Interposer(root, extra_roots=()) as ix:
        with tempfile.TemporaryFile(dir=root) as f:
            f.write(b"y" * 10)
            f.flush()
        spooled = tempfile.SpooledTemporaryFile(max_size=4, dir=root)
        spooled.write(b"z" * 10)
        spooled.rollover()
        spooled.close()
    assert not any(_names_a_directory_as_a_file(r) for r in ix.records), _ops(ix)
    assert not any(r.get("path") == str(root) for r in ix.records)
    assert os.listdir(root) == []


def test_an_opener_fd_refused_by_the_file_object_is_recorded_closed(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    (root / "sub").mkdir()
    with Interposer(root, extra_roots=()) as ix:
        with pytest.raises(IsADirectoryError):
            open(root / "x", "w", opener=lambda p, fl: os.open(root / "sub", os.O_RDONLY))
        with open(root / "y", "w") as f:  # the same fd number, reused: traced under its own name
            f.write("y")
    ops = _ops(ix)
    assert [(r["op"], r["path"]) for r in ops] == [
        ("open", str(root / "sub")), ("close", str(root / "sub")),
        ("open", str(root / "y")), ("write", str(root / "y")), ("close", str(root / "y")),
    ]
    assert ops[0]["is_dir"]


# ---------------------------------------------------------------------- a real job, explored
NTF_JOB = """
    import json, os, sys, tempfile
    out = sys.argv[1]
    ckpt = os.path.join(out, "ckpt")
    step, w = 0, 0.0
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            saved = json.load(f)
        step, w = saved["step"], saved["w"]
        print(f"resumed from step {step}", flush=True)
    while step < 12:
        step += 1
        w = w * 0.9 + step
        print(f"step {step} loss {w:.6f}", flush=True)
        if step % 3 == 0:  # a temp file and a rename, but no fsync of either
            with tempfile.NamedTemporaryFile("w", dir=out, delete=False) as f:
                json.dump({"step": step, "w": w}, f)
            os.replace(f.name, ckpt)
"""


def test_a_named_temporary_file_job_without_fsync_loses_power_loss_points(tmp_path: Path) -> None:
    """The 15-line job of issue #34: before the fix it passed every power point (exit 0). Its
    temp-file-and-rename save without fsync must fail, as the mkstemp + fdopen job does."""
    job = tmp_path / "ntf_job.py"
    job.write_text(textwrap.dedent(NTF_JOB))
    scratch, results = tmp_path / "scratch", tmp_path / "r.json"
    scratch.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "chaos.cli.main", "run", "--keep", "--scratch", str(scratch), "--json", str(results),
         "--faults", "power", "--", sys.executable, str(job), "{out}"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(results.read_text())
    failed = [s for s in doc["scenarios"] if s["outcome"] in ("hard_failure", "lost_work")]
    assert failed, doc["summary"]
    # The state the old trace could not make: the rename kept, the renamed file's data lost.
    assert any("ckpt" in s["fault_applied"]["files_after"]
               and {"what": "data", "path": "ckpt"}.items() <= lost.items()
               for s in failed for lost in s["fault_applied"]["lost"]), [s["summary"] for s in failed]

    # The fault-free run's trace: each save is open / write / close of the temp file, then its rename.
    [golden] = glob.glob(str(scratch / "*" / "golden-0" / "trace" / "trace-r0-a0-p*.jsonl"))
    out = os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(golden)), "out"))
    ops = [r for r in read_trace(golden) if r["event"] == "op"]
    assert len(ops) == 16  # four saves of four events
    for i in range(0, 16, 4):
        opened, written, closed, renamed = ops[i:i + 4]
        tmp = opened["path"]
        assert os.path.dirname(tmp) == out and os.path.basename(tmp).startswith("tmp"), opened
        assert (opened["op"], written["op"], closed["op"], renamed["op"]) == ("open", "write", "close", "rename")
        assert opened["created"] and written["path"] == closed["path"] == renamed["src"] == tmp
        assert renamed["dst"] == os.path.join(out, "ckpt")

    # No event of any run (fault-free, faulted, resumed) names {out} as a file written.
    traces = glob.glob(str(scratch / "*" / "*" / "trace" / "trace-*.jsonl"))
    assert len(traces) > 2
    for trace in traces:
        run_out = os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(trace)), "out"))
        bad = [r for r in read_trace(trace) if r.get("path") == run_out]
        assert not bad, (trace, bad[:3])
