"""The native tracer (faults/chaosio.c, issue #31): writes from native code and child processes.

Real jobs, real ``chaos run``: an HDF5 checkpoint written by h5py's C library, a numpy
memmap flushed with msync, a checkpoint written by a ``dd`` the job starts. Each is
compared with ``--no-native-trace`` (the Python interposer alone), which misses them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.model.jobspec import JobSpec
from chaos.nemesis.atrest import merged_records
from chaos.run import explore
from faults import shim
from faults.crashstate import CrashModel, Snapshot
from faults.errors import Unsupported

JOBS = Path(__file__).parent / "fixtures" / "nativejobs"
pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the native tracer is built with a C compiler; none here")


def _run(tmp_path: Path, script: str, *opts: str) -> dict:
    results = tmp_path / f"{script}-{len(list(tmp_path.iterdir()))}.json"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "chaos.cli", "run", "--result-file", "final.json", "--seed", "1",
                           "--json", str(results), *opts, "--", sys.executable, str(JOBS / script), "--out", "{out}"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert results.exists(), done.stdout + done.stderr
    return json.loads(results.read_text())


def _failing_paths(doc: dict) -> set[str]:
    return {f.get("rel") or os.path.basename(f.get("path") or "") for s in doc["scenarios"]
            if s["outcome"] == "hard_failure" for f in s["fired"]}


def test_a_kill_in_the_middle_of_an_in_place_hdf5_save_is_a_hard_failure_naming_the_file(tmp_path: Path) -> None:
    pytest.importorskip("h5py")
    doc = _run(tmp_path, "h5py_job.py", "--faults", "kill", "--modes", "torn", "--max-points", "6")
    assert doc["job"]["reference"]["native_trace"] is True
    torn = [s for s in doc["scenarios"] if s["id"].endswith(":torn")]
    assert torn and all(s["fired"] and s["fired"][0]["when"] == "torn" for s in torn)
    hard = [s for s in torn if s["outcome"] == "hard_failure"]
    assert hard, [(s["id"], s["outcome"], s["summary"]) for s in torn]
    assert _failing_paths(doc) == {"ckpt.h5"}
    assert "Unable to synchronously open" in json.dumps(hard[0]["oracles"]["liveness"])
    # The Python interposer alone never sees HDF5's writes: no point lands in them, nothing fails.
    blind = _run(tmp_path, "h5py_job.py", "--faults", "kill", "--modes", "torn", "--max-points", "6",
                 "--no-native-trace")
    assert blind["job"]["reference"]["native_trace"] is False
    assert blind["job"]["spec"]["native_trace"] is False
    assert not _failing_paths(blind)
    assert blind["job"]["points_found"] < doc["job"]["points_found"]
    assert any("ckpt.h5" in str(u) for u in blind["job"]["reference"]["untraced_changes"])
    assert doc["job"]["reference"]["untraced_changes"] == []


def test_a_kill_between_the_writes_of_a_child_process_is_a_hard_failure(tmp_path: Path) -> None:
    doc = _run(tmp_path, "child_job.py", "--faults", "kill", "--modes", "after,torn", "--max-points", "10")
    assert _failing_paths(doc) == {"ckpt.json"}
    fired = [f for s in doc["scenarios"] if s["outcome"] == "hard_failure" for f in s["fired"]]
    assert fired and all(f.get("native") is True and f.get("via") == "native" for f in fired)  # dd fired them
    assert any("JSONDecodeError" in s["summary"] for s in doc["scenarios"] if s["outcome"] == "hard_failure")
    blind = _run(tmp_path, "child_job.py", "--faults", "kill", "--modes", "after,torn", "--max-points", "10",
                 "--no-native-trace")
    assert not _failing_paths(blind)


def test_a_memmap_flush_is_traced_as_the_bytes_it_made_durable(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    job = JobSpec(command=(sys.executable, str(JOBS / "memmap_job.py"), "--out", "{out}"),
                  result_globs=("final.json",))
    _ref, run = explore.reference(job, str(tmp_path / "x"), 1)
    recs = [r for r in merged_records(run.scratch) if r.get("event") == "op"]
    synced = [r for r in recs if r["op"] == "write" and r.get("via") == "msync"]
    assert synced and all(r.get("native") and r["data"] is not None for r in synced)
    final = Path(run.out, "ckpt.mm").read_bytes()
    last = synced[-1]
    assert final[last["offset"]: last["offset"] + last["length"]] == last["data"]
    after = recs[recs.index(last) + 1]
    assert (after["op"], after.get("via")) == ("fdatasync", "msync")


def _every_change_kept(records: list[dict], out: str) -> dict[str, bytes]:
    model = CrashModel(out, Snapshot(), records)
    last = model.n_prefixes - 1
    _names, files = model.contents(model.state(last, *model.extreme_choices(last)[1]))
    return files


def _tree(out: str) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in Path(out).rglob("*") if p.is_file()}


@pytest.mark.parametrize("native", [True, False], ids=["native", "python-only"])
def test_a_power_loss_state_accounts_for_every_file_whatever_wrote_it(tmp_path: Path, native: bool) -> None:
    pytest.importorskip("numpy")
    job = JobSpec(command=(sys.executable, str(JOBS / "mixed_job.py"), "--out", "{out}"),
                  result_globs=("final.json",), native_trace=native)
    _ref, run = explore.reference(job, str(tmp_path / "x"), 1)
    real = _tree(run.out)
    assert set(real) == {"py.json", "dd.bin", "mm.bin", "final.json"}
    rebuilt = _every_change_kept(merged_records(run.scratch), run.out)
    if native:  # Python's writes, dd's and the memmap's: the trace alone rebuilds the tree
        assert rebuilt == real
    else:  # dd.bin and mm.bin's bytes are not in the record
        assert rebuilt.get("py.json") == real["py.json"]
        assert rebuilt.get("dd.bin") != real["dd.bin"] and rebuilt.get("mm.bin") != real["mm.bin"]


def test_a_pure_python_job_is_traced_the_same_with_and_without_the_native_tracer(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "chaos" / "examples" / "careless_job.py"
    shape = []
    for native in (True, False):
        job = JobSpec(command=(sys.executable, str(script), "--out", "{out}"), result_globs=("final.json",),
                      native_trace=native)
        ref, run = explore.reference(job, str(tmp_path / f"n{native}"), 1)
        assert ref.native_trace is native
        shape.append([(r["op"], os.path.basename(r.get("path") or ""), r.get("ord"), r.get("native"))
                      for r in merged_records(run.scratch) if r.get("event") == "op"])
    assert shape[0] == shape[1] and shape[0]


def test_no_compiler_is_a_typed_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(Unsupported, match="no-such-cc"):
        shim.build(str(tmp_path / "shim"))
    assert not list((tmp_path / "shim").glob("*.so"))


def test_the_library_is_built_once_in_a_private_cache_and_never_taken_from_one_others_can_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, dest = tmp_path / "cache" / "native", tmp_path / "root"
    (tmp_path / "cache").mkdir(mode=0o700)
    lib = shim.build(str(dest), cache=str(cache))
    assert Path(lib).parent == cache and not dest.exists()
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert shim.build(str(dest), cache=str(cache)) == lib  # no second compile: no compiler needed
    monkeypatch.delenv("CC")
    cache.chmod(0o777)  # anyone may now have put a library there: it is not loaded
    assert Path(shim.build(str(dest), cache=str(cache))).parent == dest
    cache.chmod(0o700)
    Path(lib).unlink()
    Path(lib).symlink_to(tmp_path / "elsewhere.so")
    assert Path(shim.build(str(dest), cache=str(cache))).parent == dest


def _standalone(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """{out}, the trace directory and the environment of a process the interposer does not run in:
    the library preloaded and configured for rank 0, attempt 0 (standalone mode)."""
    lib = shim.build(str(tmp_path / "shim"))
    out, trace = tmp_path / "out", tmp_path / "trace"
    out.mkdir()
    trace.mkdir()
    conf = shim.conf(0, 0, str(trace), [str(out)], str(trace / "ord-r0-a0"), None)
    return out, trace, {**os.environ, "LD_PRELOAD": lib, shim.ENV_CONF: conf}


def test_standalone_records_are_json_whatever_the_file_name(tmp_path: Path) -> None:
    """A process the interposer does not run in writes its own records: a hostile name stays data."""
    out, trace, env = _standalone(tmp_path)
    name = 'we"ird\\na\nme'
    subprocess.run(["dd", f"of={out / name}", "bs=16", "status=none"], input=b"x" * 40, env=env, check=True)
    recs = [json.loads(line) for f in trace.glob("trace-r0-a0-p*.jsonl") for line in f.read_text().splitlines()]
    writes = [r for r in recs if r["op"] == "write"]
    assert [r["length"] for r in writes] == [16, 16, 8]
    assert {r["path"] for r in recs} == {str(out / name)}
    assert [r["ord"] for r in recs] == list(range(len(recs)))  # numbered from the rank's shared counter
    data = (trace / next(trace.glob("*.jsonl")).name).with_suffix(".jsonl.data").read_bytes()
    assert data == b"x" * 40


def test_standalone_records_name_the_real_path_even_for_bytes_that_are_no_utf8(tmp_path: Path) -> None:
    out, trace, env = _standalone(tmp_path)
    (out / "sub").mkdir()
    odd = os.fsencode(out) + b"/sub/../bad\xffname"  # a dotted parent and a byte that starts no UTF-8 character
    subprocess.run([b"dd", b"of=" + odd, b"status=none"], input=b"y" * 10, env=env, check=True)
    (line,) = [json.loads(x) for f in trace.glob("trace-*.jsonl") for x in f.read_text().splitlines()
               if '"write"' in x]
    assert os.fsencode(line["path"]) == os.fsencode(out) + b"/bad\xffname"
    assert Path(os.fsdecode(os.fsencode(line["path"]))).read_bytes() == b"y" * 10


def test_points_fire_at_a_memmap_flush(tmp_path: Path) -> None:
    """A kill before the msync's event and a power cut right after it: the event is a point like any other."""
    pytest.importorskip("numpy")
    job = JobSpec(command=(sys.executable, str(JOBS / "memmap_job.py"), "--out", "{out}"), result_globs=("final.json",))
    _ref, run = explore.reference(job, str(tmp_path / "x"), 1)
    synced = [r for r in merged_records(run.scratch) if r.get("event") == "op" and r.get("via") == "msync"
              and r["op"] == "write"]
    n = synced[0]["ord"]
    doc = _run(tmp_path, "memmap_job.py", "--point", f"rank0:op{n}:before", "--point", f"rank0:op{n}:power")
    kill, power = (next(s for s in doc["scenarios"] if s["id"] == f"rank0:op{n}:{m}") for m in ("before", "power"))
    assert [(f["action"], f["op"], f["ord"], f["rel"]) for f in kill["fired"]] == [("kill", "write", n, "ckpt.mm")]
    assert kill["outcome"] == "pass"  # the stores were in the page cache: a kill loses none of them
    assert [(f["action"], f["ord"]) for f in power["fired"]] == [("halt", n)]
    assert "ckpt.mm" in power["summary"] and power["outcome"] != "no_effect", power["summary"]


def test_a_power_cut_in_a_child_process_is_applied(tmp_path: Path) -> None:
    """The halt of a power-loss point fired by dd itself (standalone), then the crash state applied."""
    doc = _run(tmp_path, "child_job.py", "--faults", "power", "--max-points", "6")
    in_dd = [s for s in doc["scenarios"] if any(f.get("via") == "native" for f in s["fired"])]
    assert in_dd, [(s["id"], s["fired"]) for s in doc["scenarios"]]
    for s in in_dd:
        assert [f["action"] for f in s["fired"]] == ["halt"]
        assert s["fault_applied"] and s["outcome"] != "no_effect", s["summary"]


def test_a_vforked_child_leaves_the_parent_s_fd_table_alone(tmp_path: Path) -> None:
    """subprocess starts children with vfork: the child's dup2 of a file under {out} onto its stdout
    runs in the parent's memory and must not make the parent's own stdout look like that file."""
    out, trace, env = _standalone(tmp_path)
    code = ("import subprocess, sys\n"
            f"with open({str(out / 'log')!r}, 'w') as f:\n"
            "    subprocess.run(['true'], stdout=f, check=True)\n"
            "sys.stdout.write('hello from the parent\\n'); sys.stdout.flush()\n")
    done = subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, check=True)
    assert done.stdout == "hello from the parent\n"
    recs = [json.loads(x) for f in trace.glob("trace-*.jsonl") for x in f.read_text().splitlines()]
    assert not [r for r in recs if r.get("op") == "write"], recs  # nothing was written to {out}/log
    assert {r["op"] for r in recs} <= {"open", "close"}


@pytest.mark.parametrize("native", [True, False], ids=["native", "python-only"])
def test_a_power_cut_after_the_last_write_accounts_for_every_file(tmp_path: Path, native: bool) -> None:
    """A real power-loss point at the mixed job's last file event: with the native tracer every
    file it wrote is in the record the crash state is rebuilt from; without it, dd's and the
    memmap's files are kept as they were, unexplained."""
    pytest.importorskip("numpy")
    job = JobSpec(command=(sys.executable, str(JOBS / "mixed_job.py"), "--out", "{out}"), result_globs=("final.json",),
                  native_trace=native)
    _ref, run = explore.reference(job, str(tmp_path / "x"), 1)
    last = max(r["ord"] for r in merged_records(run.scratch) if r.get("event") == "op" and r.get("ord") is not None)
    opts = ("--no-native-trace",) if not native else ()
    doc = _run(tmp_path, "mixed_job.py", "--point", f"rank0:op{last}:power", *opts)
    (s,) = doc["scenarios"]
    applied = s["fault_applied"]
    assert s["fired"] and set(applied["files_before"]) >= {"py.json", "dd.bin", "mm.bin"}, applied
    untraced = sorted(u["file"] for u in applied.get("untraced") or [])
    assert untraced == ([] if native else ["dd.bin", "mm.bin"]), applied


def test_a_forked_child_traces_into_its_own_file_numbered_with_its_parent(tmp_path: Path) -> None:
    """A process without the interposer forks: the child writes its own trace (its pid), and the
    two processes' events take their numbers from the one counter of the rank."""
    out, trace, env = _standalone(tmp_path)
    code = ("import os\n"
            f"out = {str(out)!r}\n"
            "open(os.path.join(out, 'parent-before'), 'w').write('a')\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    open(os.path.join(out, 'child'), 'w').write('b')\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "open(os.path.join(out, 'parent-after'), 'w').write('c')\n")
    subprocess.run([sys.executable, "-c", code], env=env,
                   check=True, timeout=60)
    files = sorted(trace.glob("trace-r0-a0-p*.jsonl"))
    assert len(files) == 2
    by_file = [[json.loads(x) for x in f.read_text().splitlines()] for f in files]
    names = [{os.path.basename(r["path"]) for r in recs} for recs in by_file]
    assert sorted(map(sorted, names)) == [["child"], ["parent-after", "parent-before"]]
    ords = sorted(r["ord"] for recs in by_file for r in recs)
    assert ords == list(range(len(ords))) and len(ords) == 9  # open, write, close of each file


def test_a_root_the_library_cannot_name_is_said_and_never_claimed_as_traced(tmp_path: Path) -> None:
    """The library's configuration separates paths with ':' and ';', so a scratch root holding one
    cannot be given to it: the rank runs with the Python interposer alone, and the results say
    so rather than ``native_trace: true``."""
    scratch = tmp_path / "runs:1"
    scratch.mkdir()
    doc = _run(tmp_path, "child_job.py", "--faults", "kill", "--modes", "after", "--max-points", "1",
               "--scratch", str(scratch))
    reference = doc["job"]["reference"]
    assert reference["native_trace"] is False
    said = [n for n in reference["notes"] if n.startswith("writes from native code and from processes")]
    assert said and "cannot name the path" in said[0] and "runs:1" in said[0], reference["notes"]


def test_an_op_s_time_is_when_its_call_began_not_when_it_returned(tmp_path: Path) -> None:
    """Ranks' traces are merged by ``ts``; a thread descheduled between its syscall and its record
    would sort its op after another rank's later one (which once dropped a shard from every crash
    state). So ``ts`` is taken before the call: an open of a FIFO, which returns only once a reader
    opened the other end, is stamped before the reader was there."""
    out, trace, env = _standalone(tmp_path)
    fifo = out / "pipe"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["dd", f"of={fifo}", "status=none"], stdin=subprocess.PIPE, env=env)
    try:
        time.sleep(0.5)  # dd is blocked in its open until the read end exists
        reader_at = time.monotonic()  # CLOCK_MONOTONIC, the native tracer's clock
        with open(fifo, "rb") as fh:
            writer.communicate(b"z" * 8, timeout=30)
            assert fh.read() == b"z" * 8
    finally:
        writer.kill()
        writer.wait()
    recs = [json.loads(line) for f in trace.glob("trace-r0-a0-p*.jsonl") for line in f.read_text().splitlines()]
    (opened,) = [r for r in recs if r["op"] == "open" and r["path"] == str(fifo)]
    (wrote,) = [r for r in recs if r["op"] == "write" and r["path"] == str(fifo)]
    assert opened["ts"] < reader_at < wrote["ts"]
