"""The boot path: the tracer is in a job's process only when the harness says so, numbers
file events, fires a point before / after / torn, and stays out of children."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaos.launch.job import BOOT_DIR
from chaos.model import jobspec as S
from chaos.record.jobhistory import read_traces

JOB = textwrap.dedent("""
    import os, sys, subprocess
    out = sys.argv[1]
    with open(os.path.join(out, "a.txt"), "w") as f:
        f.write("hello world")
    os.replace(os.path.join(out, "a.txt"), os.path.join(out, "b.txt"))
    if len(sys.argv) > 2:  # a spawned child and a forked child each write a file
        subprocess.run([sys.executable, "-c", f"open({os.path.join(out, 'child.txt')!r}, 'w').write('c')"], check=True)
        pid = os.fork()
        if pid == 0:
            open(os.path.join(out, "forked.txt"), "w").write("f")
            os._exit(0)
        os.waitpid(pid, 0)
    print("done")
""")


def _run(tmp: Path, point: dict | None = None, *extra: str, boot: bool = True) -> subprocess.CompletedProcess:
    out, trace = tmp / "out", tmp / "trace"
    out.mkdir(exist_ok=True)
    trace.mkdir(exist_ok=True)
    script = tmp / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_")}
    env["PYTHONPATH"] = BOOT_DIR
    if boot:
        env.update({S.ENV_OUT: str(out), S.ENV_TRACE_DIR: str(trace)})
    if point is not None:
        env[S.ENV_POINT] = json.dumps(point)
    return subprocess.run([sys.executable, str(script), str(out), *extra], env=env, capture_output=True, text=True,
                          timeout=60)


def _ops(tmp: Path) -> list[tuple[int, str, str]]:
    recs = read_traces(str(tmp), str(tmp / "out"))
    assert list(recs) == [(0, 0)], recs.keys()
    return [(r["ord"], r["op"], r.get("rel")) for r in recs[(0, 0)] if r.get("event") == "op"]


def test_without_the_harness_environment_nothing_is_traced(tmp_path: Path) -> None:
    proc = _run(tmp_path, boot=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "done"
    assert not list((tmp_path / "trace").iterdir())


def test_every_file_event_under_out_is_numbered(tmp_path: Path) -> None:
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _ops(tmp_path) == [(0, "open", "a.txt"), (1, "write", "a.txt"), (2, "close", "a.txt"),
                              (3, "rename", "b.txt")]


def test_children_are_not_traced_unless_asked(tmp_path: Path) -> None:
    proc = _run(tmp_path, None, "children")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "child.txt").exists() and (tmp_path / "out" / "forked.txt").exists()
    assert [rel for _o, _k, rel in _ops(tmp_path)] == ["a.txt", "a.txt", "a.txt", "b.txt"]


def test_a_kill_before_an_event_does_not_perform_it(tmp_path: Path) -> None:
    proc = _run(tmp_path, {"rank": 0, "mode": "before", "op": 3})
    assert proc.returncode == -9
    assert (tmp_path / "out" / "a.txt").read_text() == "hello world"
    assert not (tmp_path / "out" / "b.txt").exists()
    fired = [r for r in read_traces(str(tmp_path), str(tmp_path / "out"))[(0, 0)] if r.get("event") == "fired"]
    assert [(f["ord"], f["op"], f["when"]) for f in fired] == [(3, "rename", "before")]


def test_a_kill_after_an_event_performs_it_first(tmp_path: Path) -> None:
    proc = _run(tmp_path, {"rank": 0, "mode": "after", "op": 3})
    assert proc.returncode == -9 and "done" not in proc.stdout
    assert (tmp_path / "out" / "b.txt").read_text() == "hello world"


def test_a_torn_write_keeps_half_of_its_bytes(tmp_path: Path) -> None:
    proc = _run(tmp_path, {"rank": 0, "mode": "torn", "op": 1})
    assert proc.returncode == -9
    assert (tmp_path / "out" / "a.txt").read_text() == "hello"


def test_a_point_of_another_rank_does_not_fire(tmp_path: Path) -> None:
    proc = _run(tmp_path, {"rank": 1, "mode": "before", "op": 0})
    assert proc.returncode == 0 and (tmp_path / "out" / "b.txt").exists()


def test_the_probe_is_a_no_op_outside_the_harness_and_needs_no_torch() -> None:
    code = ("import sys; from chaos import probe; probe.step(1, 0.5); probe.saved(1); probe.resumed(0); "
            "probe.state(b'x'); print('torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_every_probe_call_records_itself_under_the_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call appends its line and announces the ``chaos.probe`` phase with its fields: a
    ``state`` fingerprint's own ``name`` included (it once collided with the phase's name and raised)."""
    from chaos import phases, probe

    heard: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setenv(probe.PROBE_FILE_ENV, str(tmp_path / "probe.jsonl"))
    def listen(name: str, info: dict[str, object]) -> None:
        heard.append((name, info))

    phases.subscribe(listen)
    try:
        probe.step(3, 0.25)
        probe.saved(2)
        probe.resumed(2)
        probe.state(b"abc")
        probe.state("final weights", name="final")
    finally:
        phases.unsubscribe(listen)
    lines = [json.loads(x) for x in (tmp_path / "probe.jsonl").read_text().splitlines()]
    assert [(r["probe"], r.get("name")) for r in lines] == [("step", None), ("saved", None), ("resumed", None),
                                                            ("state", "state"), ("state", "final")]
    assert lines[3]["sha256"] == hashlib.sha256(b"abc").hexdigest()
    assert [(n, i["kind"], i.get("name")) for n, i in heard][-2:] == [("chaos.probe", "state", "state"),
                                                                      ("chaos.probe", "state", "final")]


def test_the_tracer_is_compiled_once_into_the_scratch_pycache_even_without_bytecode_writing(tmp_path: Path) -> None:
    """PYTHONDONTWRITEBYTECODE would make every rank recompile the tracer; the boot path compiles
    it into CHAOS_JOB_PYCACHE instead, and the job's own imports keep the interpreter's setting."""
    out, trace = tmp_path / "out", tmp_path / "trace"
    out.mkdir()
    trace.mkdir()
    (tmp_path / "helper_mod.py").write_text("X = 1\n")
    script = tmp_path / "job.py"
    script.write_text("import sys, os\nsys.path.insert(0, os.path.dirname(__file__))\nimport helper_mod\n"
                      "open(os.path.join(sys.argv[1], 'a.txt'), 'w').write('x')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_")}
    env.update({"PYTHONPATH": BOOT_DIR, "PYTHONDONTWRITEBYTECODE": "1", S.ENV_OUT: str(out),
                S.ENV_TRACE_DIR: str(trace), S.ENV_PYCACHE: str(tmp_path / "pycache")})
    proc = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    cached = {p.name.split(".")[0] for p in (tmp_path / "pycache").rglob("*.pyc")}
    assert {"interposer", "inproc", "contract"} <= cached, cached
    assert "helper_mod" not in cached and not (tmp_path / "__pycache__").exists()  # the job's import: untouched
    assert [op for _o, op, _r in _ops(tmp_path)][:2] == ["open", "write"]  # and the tracer really ran


def test_the_tracer_adds_no_heavy_imports_to_a_pure_python_job(tmp_path: Path) -> None:
    """Every traced rank pays the boot path's imports as it starts: the tracer (contract,
    interposer, native-writer hooks, probe) keeps off the modules a plain job does not import
    itself, so a point's two short processes cost what the job costs, not more."""
    out, trace = tmp_path / "out", tmp_path / "trace"
    out.mkdir()
    trace.mkdir()
    heavy = ("dataclasses", "typing", "inspect", "tempfile", "shutil", "hashlib", "shlex")
    script = tmp_path / "job.py"
    script.write_text("import sys\nfrom chaos import probe\nprobe.step(1, 0.5)\n"
                      f"open(sys.argv[1] + '/a.txt', 'w').write('x')\nprint([m for m in {heavy!r} if m in sys.modules])\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_")}
    traced = dict(clean, PYTHONPATH=BOOT_DIR, **{S.ENV_OUT: str(out), S.ENV_TRACE_DIR: str(trace)})
    runs = [subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True,
                           timeout=60) for env in (clean, traced)]
    assert [p.returncode for p in runs] == [0, 0], [p.stderr for p in runs]
    assert runs[1].stdout == runs[0].stdout, runs[1].stdout  # the same modules as untraced
    assert [op for _o, op, _r in _ops(tmp_path)][:2] == ["open", "write"]  # and the tracer really ran
