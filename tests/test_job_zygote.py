"""The zygote (chaos/launch/zygote.py, chaos/target/job/zygote.py): one interpreter per exploration
imports the job's installed modules once and forks each attempt. A forked attempt must be
indistinguishable from a fresh one to the job (its arguments, environment, folder, temp dir,
session, fresh randomness), report its own exit status, change no verdict, and leave nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from chaos.errors import HarnessError
from chaos.launch import job as launch
from chaos.launch import zygote
from chaos.model.jobspec import JobSpec
from chaos.run import explore
from faults.process import alive

JOB = """\
import json, os, sys, tempfile, time
import numpy as np
out = sys.argv[sys.argv.index("--out") + 1]
if "--code" in sys.argv:
    code = int(sys.argv[sys.argv.index("--code") + 1])
    if code < 0:
        time.sleep(60)
    sys.exit(code)
ck = os.path.join(out, "ckpt.npy")
start = int(np.load(ck)[0]) if os.path.exists(ck) else 0
for step in range(start, 4):
    with open(ck + ".tmp", "wb") as f:
        np.save(f, np.array([step + 1]))
    os.replace(ck + ".tmp", ck)
seen = {"argv": sys.argv, "cwd": os.getcwd(), "tmp": tempfile.gettempdir(), "TMPDIR": os.environ.get("TMPDIR"),
        "leader": os.getsid(0) == os.getpid(), "noise": float(np.random.rand()),
        "boot": sorted(k for k in os.environ if k in ("CHAOS_JOB_GATE", "CHAOS_JOB_PRELOAD", "CHAOS_JOB_ZYGOTE")),
        "out_env": os.environ.get("CHAOS_JOB_OUT"), "set_by_import": os.environ.get("SET_BY_IMPORT")}
with open(os.path.join(os.environ["SEEN_DIR"], f"seen-{os.getpid()}.json"), "w") as f:
    json.dump(seen, f)
with open(os.path.join(out, "final.txt"), "w") as f:
    f.write("4")
"""


def _job(tmp_path: Path, **kw: object) -> JobSpec:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return JobSpec(command=(sys.executable, str(script), "--out", "{out}"), cwd=str(tmp_path),
                   result_globs=("final.txt",), **kw)  # type: ignore[arg-type]


def test_forked_attempts_see_what_a_fresh_interpreter_sees_and_change_no_verdict(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    monkeypatch.setenv("SEEN_DIR", str(seen_dir))
    base = tmp_path / "scratch"
    base.mkdir()
    forked = explore.explore(_job(tmp_path), max_points=6, jobs=1, seed=2, scratch_base=str(base))
    assert any("forked from one interpreter" in n for n in forked.reference.notes), forked.reference.notes
    ran = [a for r in forked.results for a in r.record.attempts if not a.materialized]
    assert len(ran) >= 6 and all(a.forked and not a.prestarted for a in ran)
    seen = [json.loads(p.read_text()) for p in seen_dir.glob("seen-*.json")]
    assert len(seen) >= 6
    for s in seen:
        assert s["argv"][1:] == ["--out", s["out_env"]]  # its own {out}, not the zygote's
        assert s["tmp"] == s["TMPDIR"] != str(base) and s["cwd"] == str(tmp_path)
        assert s["leader"] and s["boot"] == []
    assert len({s["noise"] for s in seen}) == len(seen)  # numpy's unseeded state is fresh in each
    for p in seen_dir.iterdir():
        p.unlink()
    cold = explore.explore(_job(tmp_path, preload=False), max_points=6, jobs=1, seed=2, scratch_base=str(base))
    assert not any(a.forked for r in cold.results for a in r.record.attempts)
    # tempfile.gettempdir() probes the folder with a randomly named file: a file event whose name differs
    verdicts = [{r.point.id: (r.verdict.outcome, re.sub(r"chaos-job-\w+|tmp/rank0/\w+", "X", r.verdict.summary))
                 for r in e.results} for e in (forked, cold)]
    assert len(verdicts[0]) == 6 and verdicts[0] == verdicts[1]
    assert not zygote._zygotes and not os.listdir(base)  # the zygote ended with the exploration


def _template(tmp_path: Path, name: str, job: JobSpec) -> launch.spares.Copy:
    scratch = tmp_path / name
    (scratch / "out").mkdir(parents=True)
    return launch._plan(job, str(scratch / "out"), str(scratch), 1, None, str(scratch), None, 0)[0]


def test_a_zygote_reports_each_childs_exit_and_refuses_what_it_cannot_stand_for(tmp_path: Path,
                                                                              monkeypatch) -> None:
    monkeypatch.setenv("SEEN_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # warm_tmp below: importable before the job's own folder is
    # numpy.random imported in the zygote (numpy itself imports it lazily): each child draws afresh;
    # a module that asked tempfile for the temp dir as it loaded: each child still gets its own TMPDIR
    (tmp_path / "warm_tmp.py").write_text("import os, tempfile\nWHERE = tempfile.gettempdir()\n"
                                          "os.environ['SET_BY_IMPORT'] = '1'\n")  # as Lightning sets a variable
    job = dataclasses.replace(_job(tmp_path), preload_modules=("numpy", "numpy.random", "warm_tmp"))
    root = str(tmp_path)
    zygote.begin(root, [_template(tmp_path, "zygote", job)], [str(tmp_path / "zygote.log")])
    assert zygote.ready(root) is None
    [z] = zygote._zygotes[root]
    try:
        for i in range(3):
            child = zygote.spawn(root, _template(tmp_path, f"run{i}", job))
            assert child is not None and child.wait(timeout=30) == 0
        seen = [json.loads(p.read_text()) for p in tmp_path.glob("seen-*.json")]
        assert len(seen) == 3 and len({s["noise"] for s in seen}) == 3
        for s in seen:  # TMPDIR: the attempt's own (its run's tmp), and tempfile asked it again
            assert s["tmp"] == s["TMPDIR"] and s["TMPDIR"].startswith(os.path.dirname(s["argv"][2]) + "/tmp")
            assert s["set_by_import"] == "1"  # what the preloaded import did, as in a fresh interpreter
        copy = _template(tmp_path, "a", job)
        three = zygote.spawn(root, dataclasses.replace(copy, argv=(*copy.argv, "--code", "3")))
        hang = zygote.spawn(root, dataclasses.replace(copy, argv=(*copy.argv, "--code", "-1")))
        assert three is not None and hang is not None and three.pid != hang.pid != z.proc.pid
        assert three.wait(timeout=30) == 3
        os.killpg(hang.pid, signal.SIGKILL)  # its own session, as a copy started directly
        assert hang.wait(timeout=30) == -signal.SIGKILL
        term = zygote.spawn(root, dataclasses.replace(copy, argv=(*copy.argv, "--code", "-1")))
        assert term is not None
        term.send_signal(signal.SIGTERM)  # as a term point's preemption does (launch.job._send_term)
        assert term.wait(timeout=30) == -signal.SIGTERM
        term.send_signal(signal.SIGTERM)  # once its end is known: nothing (its pid may belong to another)
        # An exit notice the harness has not read yet comes before the next fork's reply: it is filed,
        # and the reply still awaited (it once made the fork look unanswered and the zygote dead)
        done = zygote.spawn(root, dataclasses.replace(copy, argv=(*copy.argv, "--code", "0")))
        assert done is not None
        deadline = time.monotonic() + 30
        while alive(done.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the zygote reaps it and sends the notice; nobody polls it meanwhile
        after = zygote.spawn(root, dataclasses.replace(copy, argv=(*copy.argv, "--code", "4")))
        assert after is not None and done.returncode == 0 and zygote.serves(root)
        assert after.wait(timeout=30) == 4
        # Another environment (a variable a module may read as it loads) or folder: not forked
        env = dict(copy.env) | {"OMP_NUM_THREADS": "7"}
        assert zygote.spawn(root, dataclasses.replace(copy, env=tuple(sorted(env.items())))) is None
        assert zygote.spawn(root, dataclasses.replace(copy, cwd=str(tmp_path / "a"))) is None
        assert zygote.spawn(root, dataclasses.replace(copy, argv=("python3.99", *copy.argv[1:]))) is None
        # A zygote that died: no more forks, and a child whose status it took along is an error, not a guess
        orphan = zygote.spawn(root, dataclasses.replace(copy, argv=(*copy.argv, "--code", "-1")))
        assert orphan is not None
        os.kill(z.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while zygote.spawn(root, copy) is not None and time.monotonic() < deadline:
            pass
        assert zygote.spawn(root, copy) is None
        os.killpg(orphan.pid, signal.SIGKILL)
        with pytest.raises(HarnessError, match="died before reporting"):
            orphan.wait(timeout=30)
    finally:
        zygote.close_all()
    assert not alive(z.proc.pid)


def test_no_zygote_without_modules_to_preload(tmp_path: Path) -> None:
    job = _job(tmp_path)
    assert launch.begin_zygote(job, str(tmp_path)) is False  # nothing preloaded: spares as before
    assert launch.zygote_note(job, str(tmp_path)) is None and not zygote._zygotes


# Two ranks (--ranks 2), each with its own numpy checkpoint; a module of an installed distribution that
# reads the rank as it is imported, as Lightning's rank_zero_only does. What each copy saw is written
# to SEEN_DIR.
RANKS_JOB = """\
import json, os, sys
import numpy as np
import rank_at_import
rank = int(os.environ["RANK"])
out = sys.argv[sys.argv.index("--out") + 1]
ck = os.path.join(out, f"ckpt-r{rank}.npy")
start = int(np.load(ck)[0]) if os.path.exists(ck) else 0
for step in range(start, 4):
    with open(ck + ".tmp", "wb") as f:
        np.save(f, np.array([step + 1]))
    os.replace(ck + ".tmp", ck)
seen = {"rank": rank, "imported_rank": rank_at_import.RANK, "local": os.environ["LOCAL_RANK"],
        "port": os.environ["MASTER_PORT"], "restarts": os.environ["TORCHELASTIC_RESTART_COUNT"],
        "out": out, "noise": float(np.random.rand())}
with open(os.path.join(os.environ["SEEN_DIR"], f"seen-{os.getpid()}.json"), "w") as f:
    json.dump(seen, f)
with open(os.path.join(out, f"final-r{rank}.txt"), "w") as f:
    f.write("4")
"""


def test_a_job_of_several_ranks_forks_each_rank_from_a_zygote_of_its_own(tmp_path: Path, monkeypatch) -> None:
    """--ranks 2: one zygote per rank, started with that rank's environment, so a module that read
    its rank as it was imported holds the copy's own; each child takes on its attempt's rendezvous
    port and restart count. Verdicts are those of fresh interpreters."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "rank_at_import.py").write_text("import os\nRANK = os.environ.get('RANK')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    monkeypatch.setenv("SEEN_DIR", str(seen_dir))
    script = tmp_path / "ranks_job.py"
    script.write_text(RANKS_JOB)
    job = JobSpec(command=(sys.executable, str(script), "--out", "{out}"), cwd=str(tmp_path),
                  result_globs=("final-r*.txt",), ranks=2)
    base = tmp_path / "scratch"
    base.mkdir()
    forked = explore.explore(job, max_points=4, jobs=1, seed=3, scratch_base=str(base))
    assert {"numpy", "rank_at_import"} <= set(forked.reference.preload), forked.reference.preload
    assert any("forked from one interpreter per rank" in n for n in forked.reference.notes), "\n".join(forked.reference.notes)
    # a network-cut point's copies start inside its network namespaces; every other point's are forked
    ran = [a for r in forked.results if r.point.family != "net" for a in r.record.attempts if not a.materialized]
    assert len(ran) >= 4 and all(a.forked and not a.prestarted for a in ran)
    seen = [json.loads(p.read_text()) for p in seen_dir.glob("seen-*.json")]
    late = [s for s in seen if "/point-" in s["out"]]  # the fault-free runs' copies are fresh interpreters
    assert len(late) >= 4
    for s in late:
        assert s["imported_rank"] == s["local"] == str(s["rank"]), s
    by_attempt: dict[tuple[str, str], set[str]] = {}
    for s in late:
        by_attempt.setdefault((s["out"], s["restarts"]), set()).add(s["port"])
    assert all(len(ports) == 1 for ports in by_attempt.values())  # the two ranks of one attempt meet on one port
    assert len({p for ports in by_attempt.values() for p in ports}) == len(by_attempt)  # each attempt its own
    assert {r for _, r in by_attempt} == {"0", "1"}  # the restart count is the attempt's, not the zygote's
    assert len({s["noise"] for s in late}) == len(late)
    for p in seen_dir.iterdir():
        p.unlink()
    # the same points (which are sampled can differ: two ranks race, and the point set follows their order)
    cold = explore.explore(dataclasses.replace(job, preload=False), only=[r.point for r in forked.results], jobs=1,
                           seed=3, scratch_base=str(base))
    assert not any(a.forked for r in cold.results for a in r.record.attempts)
    verdicts = [{r.point.id: r.verdict.outcome for r in e.results} for e in (forked, cold)]
    assert len(verdicts[0]) == 4 and verdicts[0] == verdicts[1]
    assert not zygote._zygotes and not os.listdir(base)


def test_a_job_that_changed_its_environment_gets_a_zygote_only_if_the_imports_set_it_so(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """The job had set a variable by its first file event (Lightning does, as it is imported): only a
    zygote whose own preload leaves the same value may fork its attempts; spares never preload."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "sets_env.py").write_text("import os\nos.environ['SET_BY_IMPORT'] = '1'\n")
    base = dataclasses.replace(_job(tmp_path), zygote_preload=("sets_env",))
    for value, serves in (("1", True), ("2", False)):
        job = dataclasses.replace(base, zygote_env=(("SET_BY_IMPORT", value),))
        root = tmp_path / f"root-{value}"
        root.mkdir()
        try:
            assert launch.begin_zygote(job, str(root))
            note = launch.zygote_note(job, str(root))
            assert note is not None and zygote.serves(str(root)) is serves, note
            assert ("importing them set exactly that" in note) if serves else ("did not set SET_BY_IMPORT" in note)
            plan = launch._plan(job, str(root / "out"), str(root / "p"), 1, None, str(root), None, 0)
            assert "CHAOS_JOB_PRELOAD" not in dict(plan[0].env)  # the spares' copies: nothing preloaded
        finally:
            zygote.close_all()


LAZY_IO_PACKAGE = {
    "__init__.py": "def make():\n    from lazyio import heavy  # on first call, after the job's first file event\n"
                   "    return heavy.VALUE\n",
    # Its import makes a file event in the traced temp dir, as torch._dynamo's makes torch's cache folder
    "heavy.py": "import os, tempfile\nos.makedirs(os.path.join(tempfile.gettempdir(), 'lazyio-cache'), exist_ok=True)\n"
                "VALUE = 3\n",
}

LAZY_IO_JOB = """\
import json, os, sys, tempfile
import lazyio
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
steps = lazyio.make()
ck = os.path.join(out, "ckpt.json")
start = json.load(open(ck))["step"] if os.path.exists(ck) else 0
for step in range(start, steps):
    fd, tmp = tempfile.mkstemp(dir=out)  # a new random name each save: its events are named by number only
    with os.fdopen(fd, "w") as f:
        json.dump({"step": step + 1}, f)
    os.replace(tmp, ck)
open(os.path.join(out, "final.json"), "w").write(json.dumps({"done": steps}))
"""


def test_an_attempt_with_a_preloaded_module_whose_import_made_a_file_event_keeps_the_trace_s_numbers(
        tmp_path: Path, monkeypatch) -> None:
    """The fault-free run makes a file event inside the import of a module it imports late; a forked
    attempt has it preloaded and does not make that event. Its tracer skips that ordinal, so a point
    named by number (a temp file's random name cannot anchor it) fires at the same event as in an
    attempt started fresh, and the verdicts are the same. A point at that event itself runs fresh: only
    a fresh interpreter makes it."""
    site = tmp_path / "venv" / "site-packages"
    (site / "lazyio").mkdir(parents=True)
    for name, text in LAZY_IO_PACKAGE.items():
        (site / "lazyio" / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    harness_tmp = tmp_path / "harness-tmp"
    harness_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(harness_tmp))
    script = tmp_path / "lazy_io_job.py"
    script.write_text(LAZY_IO_JOB)
    job = JobSpec(command=(sys.executable, str(script), "{out}"), cwd=str(tmp_path), result_globs=("final.json",),
                  faults=("kill",), modes=("before", "after"), materialize=False)
    base = tmp_path / "scratch"
    base.mkdir()

    def fired(e: explore.Exploration) -> dict[str, tuple]:
        return {r.point.id: (r.verdict.verdict, r.verdict.outcome,
                             [(x.get("op"), x.get("ord")) for x in r.record.fired()]) for r in e.results}

    forked = explore.explore(job, max_points=12, jobs=1, seed=1, scratch_base=str(base))
    assert "lazyio.heavy" in forked.reference.preload and forked.reference.same_events
    # Its events (tempfile's probe of the temp dir, then the mkdir), right after the job's own mkdir of {out}
    inside = {n for n, mods in forked.reference.preload_choice.import_events if "lazyio.heavy" in mods}
    assert min(inside) == 1 and inside == set(range(1, max(inside) + 1))
    ran = {r.point: r.record.attempts[0].forked for r in forked.results}
    assert len(ran) == 12 and all(forked_ is (p.op not in inside) for p, forked_ in ran.items())
    assert any(p.op in inside for p in ran)  # such a point ran fresh: only a fresh interpreter makes its event
    fresh = explore.explore(dataclasses.replace(job, preload=False), max_points=12, jobs=1, seed=1,
                            scratch_base=str(base))
    assert not any(a.forked for r in fresh.results for a in r.record.attempts)
    assert fired(forked) == fired(fresh)
    assert all(ords for _, _, ords in fired(forked).values())  # every point fired
    assert list(harness_tmp.iterdir()) == []  # the zygote's imports wrote in the scratch root, not here
