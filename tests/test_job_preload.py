"""Modules preloaded before an attempt's gate (#30): torch imported while the spare waits, not after.

The tracer records what the job imported before its first file event and which variables
it changed meanwhile; ``launch.preload.choose`` turns that into the list the boot path
imports before the gate; the boot path imports it and takes the variable away.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from chaos.launch.job import BOOT_DIR
from chaos.launch.preload import Choice, choose
from chaos.model import jobspec as S
from chaos.model.jobspec import JobSpec

SCRIPT = """
import os, sys
print("fractions" in sys.modules, "CHAOS_JOB_PRELOAD" in os.environ)
import fractions
import xml
if len(sys.argv) > 2:
    os.environ["OMP_NUM_THREADS"] = "1"
    if sys.argv[2] == "then-import":
        import colorsys
        import fractions as again  # already there: still imported before the change
        import email.utils  # a package's first import, after the change
        import xml.dom  # a submodule of a package imported before it: the package stays early
open(os.path.join(sys.argv[1], "a.txt"), "w").write("x")
"""


def _boot(tmp: Path, *extra: str, preload: str | None = None) -> subprocess.CompletedProcess:
    out, trace = tmp / "out", tmp / "trace"
    out.mkdir(parents=True, exist_ok=True)
    trace.mkdir(exist_ok=True)
    (tmp / "job.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_") and k != "OMP_NUM_THREADS"}
    env.update({"PYTHONPATH": BOOT_DIR, S.ENV_OUT: str(out), S.ENV_TRACE_DIR: str(trace)})
    if preload is not None:
        env[S.ENV_PRELOAD] = preload
    proc = subprocess.run([sys.executable, str(tmp / "job.py"), str(out), *extra], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


def _record(tmp: Path) -> dict:
    [path] = (tmp / "trace").glob("imports-r0-a0-p*.json")
    return json.loads(path.read_text())


def test_the_tracer_records_what_the_job_imported_before_its_first_file_event(tmp_path: Path) -> None:
    assert _boot(tmp_path / "plain").stdout.split() == ["False", "False"]
    record = _record(tmp_path / "plain")
    assert record["modules"]["fractions"].endswith("fractions.py") and record["env_changed"] == []
    assert "json" not in record["modules"]  # imported before the job started (by the tracer): not the job's
    _boot(tmp_path / "env", "set-env")
    record = _record(tmp_path / "env")
    assert record["env_changed"] == ["OMP_NUM_THREADS"] and record["env_values"] == {"OMP_NUM_THREADS": "1"}
    assert record["imported_after_change"] == []  # fractions came before the change
    _boot(tmp_path / "late", "then-import")
    late = _record(tmp_path / "late")["imported_after_change"]
    assert {"colorsys", "email"} <= set(late) and not {"fractions", "xml"} & set(late)


LAZY_PACKAGE = {
    "__init__.py": "def make():\n    from lazypkg import heavy  # only when first called, as torch.optim's optimizer does\n"
                   "    return heavy.VALUE\n",
    "heavy.py": "import lazypkg.inner  # inside heavy's own import: importing heavy brings it\nVALUE = 7\n",
    "inner.py": "",
}

LAZY_SCRIPT = """
import os, sys
import lazypkg
open(os.path.join(sys.argv[1], "a.txt"), "w").write("x")  # the first file event
assert lazypkg.make() == 7
import json  # loaded before the job started: not the job's import
open(os.path.join(sys.argv[1], "b.txt"), "w").write("y")
"""


def _traced_with_package(tmp: Path, package: str, files: dict[str, str], script: str) -> tuple[Path, Path]:
    """Run ``script`` traced (a fault-free run's tracer) with ``package`` installed in a site-packages
    folder of its own; (the package's folder, the trace folder holding the imports record)."""
    site = tmp / "venv" / "site-packages" / package
    site.mkdir(parents=True)
    for name, text in files.items():
        (site / name).write_text(text)
    out, trace = tmp / "out", tmp / "trace"
    out.mkdir()
    trace.mkdir()
    (tmp / "job.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_") and k != "ENVPKG_PORT"}
    env.update({"PYTHONPATH": os.pathsep.join([BOOT_DIR, str(site.parent)]), S.ENV_OUT: str(out),
                S.ENV_TRACE_DIR: str(trace)})
    proc = subprocess.run([sys.executable, str(tmp / "job.py"), str(out)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return site, trace


def test_the_tracer_records_what_a_library_imports_when_first_called_after_the_first_file_event(
        tmp_path: Path) -> None:
    """torch.optim's first optimizer imports torch._dynamo and sympy, 1.3 s of a forked attempt's
    2.1 s: importing torch does not bring them, so the record names the outermost import of each
    chain the job's calls started, however late, and not what that import brought with it."""
    site, trace = _traced_with_package(tmp_path, "lazypkg", LAZY_PACKAGE, LAZY_SCRIPT)
    record = _record(tmp_path)
    assert list(record["modules"]) == ["lazypkg"]  # by the first file event
    assert [c[0] for c in record["calls"]] == ["lazypkg", "lazypkg.heavy"]  # not lazypkg.inner, nor json
    assert record["calls"][1][1] == str(site / "heavy.py") and record["calls"][1][2] is False
    got = choose(JobSpec(command=("python", "job.py", "{out}"), cwd=str(tmp_path)), str(trace), can_prestart=True)
    assert got.modules == ("lazypkg", "lazypkg.heavy")


ENV_PACKAGE = {
    "__init__.py": "def clean():\n    from envpkg import quiet\n\n\ndef reads():\n    from envpkg import loud\n\n\n"
                   "def native():\n    from envpkg import natively\n",
    "quiet.py": "import os\nHOME = os.environ.get('HOME')  # a variable the job left alone\nimport envpkg.deep\n",
    "deep.py": "import os\nTHREADS = os.getenv('OMP_NUM_THREADS')\n",
    "loud.py": "import os\nPORT = os.environ.get('ENVPKG_PORT')  # the job set it: a fresh import reads another value\n",
    "natively.py": "import ctypes\nctypes.CDLL('libc.so.6')  # native code may call getenv(3), unseen\n",
}

ENV_SCRIPT = """
import os, sys
import envpkg
open(os.path.join(sys.argv[1], "a.txt"), "w").write("x")  # the first file event
os.environ["ENVPKG_PORT"] = "29511"  # as fsdp2_dcp.py sets MASTER_PORT for its own rendezvous
envpkg.clean()
envpkg.reads()
envpkg.native()
open(os.path.join(sys.argv[1], "b.txt"), "w").write("y")
"""


def test_a_module_the_job_s_calls_import_after_it_changed_its_environment_is_preloaded_if_its_import_read_none(
        tmp_path: Path) -> None:
    """fsdp2_dcp.py sets MASTER_* itself before its optimizer imports torch._dynamo (1.3 s). The
    fault-free run's tracer sees every read of os.environ while a module is imported: one that
    read none of the changed variables, and loaded no native code (whose reads it cannot see),
    loads alike before the change and is preloaded; the others stay the job's to import."""
    _, trace = _traced_with_package(tmp_path, "envpkg", ENV_PACKAGE, ENV_SCRIPT)
    calls = {c[0]: c[2:] for c in _record(tmp_path)["calls"]}
    assert calls["envpkg.quiet"] == [True, [], False]  # after the change; read HOME and OMP_NUM_THREADS only
    assert calls["envpkg.loud"] == [True, ["ENVPKG_PORT"], False]
    assert calls["envpkg.natively"][0] is True and calls["envpkg.natively"][2] is True
    assert "envpkg.deep" not in calls  # brought by quiet's own import
    got = choose(JobSpec(command=("python", "job.py", "{out}"), cwd=str(tmp_path)), str(trace), can_prestart=True)
    assert got.modules == ("envpkg", "envpkg.quiet")


CHILD_SCRIPT = """
import os, subprocess, sys
import fractions
out = sys.argv[1]
open(os.path.join(out, "a.txt"), "w").write("x")  # the rank's first file event
subprocess.run([sys.executable, "-c", "import colorsys, os, sys; open(os.path.join(sys.argv[1], 'c.txt'), 'w')",
                out], check=True)
pid = os.fork()
if pid == 0:
    import email.utils
    open(os.path.join(out, "f.txt"), "w").write("z")
    os._exit(0)
os.waitpid(pid, 0)
print(os.getpid())
"""


def test_only_the_rank_s_own_interpreter_writes_the_record_preloading_is_chosen_from(tmp_path: Path) -> None:
    """With CHAOS_JOB_CHILDREN=1 a rank's children are traced too (a forked one keeps the rank's
    tracer, a started one installs its own); their imports are not the rank's, and preloading
    reads the first record by name, so a child's record could stand for the rank's."""
    out, trace = tmp_path / "out", tmp_path / "trace"
    out.mkdir()
    trace.mkdir()
    (tmp_path / "job.py").write_text(CHILD_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_")}
    env.update({"PYTHONPATH": BOOT_DIR, S.ENV_OUT: str(out), S.ENV_TRACE_DIR: str(trace), S.ENV_CHILDREN: "1"})
    proc = subprocess.run([sys.executable, str(tmp_path / "job.py"), str(out)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "c.txt", "f.txt"]
    # the started child traced on its own; the forked one into the rank's trace, with its own pid
    assert len(list(trace.glob("trace-r0-a0-p*.jsonl"))) == 2
    records = [p.name for p in trace.glob("imports-r0-a0-p*.json")]
    assert records == [f"imports-r0-a0-p{proc.stdout.strip()}.json"]


def test_the_boot_path_imports_the_named_modules_before_the_job_and_hides_the_variable(tmp_path: Path) -> None:
    proc = _boot(tmp_path, preload="fractions,no_such_module_xyz")  # one that fails is the job's to import
    assert proc.stdout.split() == ["True", "False"]


def _write(trace: Path, modules: dict[str, str | None], changed: list[str] = (),
           values: dict[str, str | None] | None = None, late: list[str] | None = None) -> str:
    trace.mkdir(parents=True, exist_ok=True)
    record = {"modules": modules, "env_changed": list(changed), **({"env_values": values} if values is not None else {}),
              **({"imported_after_change": late} if late is not None else {})}
    (trace / "imports-r0-a0-p42.json").write_text(json.dumps(record))
    return str(trace)


def test_only_installed_distributions_are_preloaded_and_never_after_the_job_changed_its_environment(
        tmp_path: Path) -> None:
    job = JobSpec(command=("python", "train.py", "{out}"), cwd=str(tmp_path / "proj"))
    mods = {"torch": "/venv/lib/python3.11/site-packages/torch/__init__.py",
            "yaml": "/usr/lib/python3/dist-packages/yaml/__init__.py",
            "fractions": "/usr/lib/python3.11/fractions.py",            # the standard library: cheap, left alone
            "mymodel": str(tmp_path / "proj" / "mymodel.py"),           # the job's own code: never run early
            "_private": "/venv/lib/python3.11/site-packages/_private.py", "sys": None}
    trace = _write(tmp_path / "t1", mods)
    got = choose(job, trace, can_prestart=True)
    assert got.modules == ("torch", "yaml") and got.note is not None and "torch, yaml" in got.note
    assert not got.zygote_only and not got.env
    assert choose(job, trace, can_prestart=False) == Choice()  # no spares: nothing to gain
    assert choose(JobSpec(command=job.command, cwd=job.cwd, preload=False), trace, True) == Choice()
    # Changed only after every module to preload was imported: they loaded as they load here
    got = choose(job, _write(tmp_path / "t3", mods, ["MASTER_PORT"], {"MASTER_PORT": "29500"}, late=[]),
                 can_prestart=True)
    assert got.modules == ("torch", "yaml") and not got.zygote_only and "MASTER_PORT" in (got.note or "")
    got = choose(job, _write(tmp_path / "t4", mods, ["MASTER_PORT"], {"MASTER_PORT": "29500"}, late=["yaml"]),
                 can_prestart=True)
    assert got.modules == ("torch",) and not got.zygote_only  # yaml: the job imports it itself, after its change
    got = choose(job, _write(tmp_path / "t5", mods, ["X"], {"X": "1"}, late=["torch", "yaml"]), can_prestart=True)
    assert got.modules == () and got.zygote_only == ("torch", "yaml")  # changed before any: a zygote may check
    # A record without the variables' values (written before they were kept): no preload anywhere
    got = choose(job, _write(tmp_path / "t2", mods, ["OMP_NUM_THREADS"]), can_prestart=True)
    assert got.modules == () == got.zygote_only and got.note is not None and "OMP_NUM_THREADS" in got.note
    assert choose(job, str(tmp_path / "none"), True) == Choice()  # no file event: nothing to go by


def test_a_submodule_the_job_s_calls_imported_is_preloaded_after_its_package_unless_it_came_after_a_change(
        tmp_path: Path) -> None:
    job = JobSpec(command=("python", "train.py", "{out}"), cwd=str(tmp_path / "proj"))
    site = "/venv/lib/python3.11/site-packages"
    mods = {"torch": f"{site}/torch/__init__.py"}
    calls = [["torch", f"{site}/torch/__init__.py", False],            # already named
             ["torch._dynamo", f"{site}/torch/_dynamo/__init__.py", False],
             ["argparse", "/usr/lib/python3.11/argparse.py", False],       # the standard library
             ["mymodel.layers", str(tmp_path / "proj" / "mymodel" / "layers.py"), False],  # the job's own
             ["sympy", f"{site}/sympy/__init__.py", True],                 # after the job set a variable
             ["torch._dynamo", f"{site}/torch/_dynamo/__init__.py", False], ["bad"], "junk",
             ["mpmath", f"{site}/mpmath/__init__.py", True, [], False],    # after, but read none: clean
             ["numba", f"{site}/numba/__init__.py", True, ["X"], False],   # read a changed variable
             ["cffi", f"{site}/cffi/__init__.py", True, [], True],         # loaded native code
             ["odd", f"{site}/odd/__init__.py", True, [], "no"]]           # malformed: not clean

    def record(trace: Path, changed: list[str], late: list[str] | None) -> str:
        path = _write(trace, mods, changed, {k: "1" for k in changed}, late=late)
        doc = json.loads((trace / "imports-r0-a0-p42.json").read_text())
        (trace / "imports-r0-a0-p42.json").write_text(json.dumps({**doc, "calls": calls}))
        return path

    # sympy, numba, cffi and odd came after a change (made after the first file event in t1) and may
    # have read it: the job's own to import, wherever that change was made
    assert choose(job, record(tmp_path / "t1", [], []), True).modules == ("torch", "torch._dynamo", "mpmath")
    got = choose(job, record(tmp_path / "t2", ["X"], []), True)
    assert got.modules == ("torch", "torch._dynamo", "mpmath") and not got.zygote_only
    got = choose(job, record(tmp_path / "t3", ["X"], ["torch"]), True)  # torch itself came after the change
    assert got.modules == () and got.zygote_only == ("torch", "torch._dynamo", "mpmath")
    got = choose(job, record(tmp_path / "t4", ["X"], ["mpmath"]), True)  # its package came after the change
    assert got.modules == ("torch", "torch._dynamo")


def test_after_the_job_changed_its_environment_only_a_zygote_preloads_and_only_in_import_order(
        tmp_path: Path) -> None:
    """Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK as it is imported: the job "changed" it before its
    first file event. Spares never preload then; a zygote may, if its own imports set it the same."""
    job = JobSpec(command=("python", "train.py", "{out}"), cwd=str(tmp_path / "proj"))
    mods = {"torch": "/venv/lib/python3.11/site-packages/torch/__init__.py",
            "lightning": "/venv/lib/python3.11/site-packages/lightning/__init__.py"}
    got = choose(job, _write(tmp_path / "t", mods, ["PYTORCH_NVML_BASED_CUDA_CHECK", "GONE"],
                             {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "GONE": None}), can_prestart=True)
    assert got.modules == () and got.zygote_only == ("torch", "lightning")  # the job's order, not sorted
    assert got.env == (("PYTORCH_NVML_BASED_CUDA_CHECK", "1"), ("GONE", None))
    assert got.note is not None and "PYTORCH_NVML_BASED_CUDA_CHECK" in got.note


def test_no_preload_is_replayed_and_recorded() -> None:
    job = JobSpec(command=("python", "t.py", "{out}"), preload=False)
    assert "--no-preload" in job.replay_args() and job.to_dict()["preload"] is False
    assert JobSpec.from_dict(job.to_dict()).preload is False
    assert "preload" not in JobSpec(command=("python", "t.py", "{out}")).to_dict()  # the default: as before


def test_an_exploration_preloads_what_the_fault_free_run_imported_and_still_judges_the_same(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(
        "import os, sys\n"
        "cold = 'numpy' not in sys.modules or 'numpy.random' not in sys.modules\n"
        "import numpy\n"
        "out = sys.argv[1]\n"
        "p = os.path.join(out, 'n')\n"
        "n = int(open(p).read()) if os.path.exists(p) else 0\n"
        "if n and cold:\n"
        "    sys.exit('a restart started cold: numpy or its lazily imported random was not preloaded')\n"
        "numpy.random.default_rng(0)  # numpy imports numpy.random on first use, after the first file event\n"
        "for i in range(n, 3):\n"
        "    open(p + '.tmp', 'w').write(str(i + 1))\n"
        "    os.replace(p + '.tmp', p)\n")
    results = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(tmp_path), "--json",
                           str(results), "--faults", "kill", "--point", "rank0:op2:after", "--",
                           sys.executable, str(tmp_path / "job.py"), "{out}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(results.read_text())
    assert doc["job"]["reference"]["preloaded"] == ["numpy", "numpy.random"]
    [point] = doc["scenarios"]
    assert point["verdict"] == "pass" and len(point["attempts"]) == 2  # the restart found numpy loaded
