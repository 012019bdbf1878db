"""``chaos run --launcher docker -- COMMAND``: every copy of every attempt is a container.

The mounts, exit statuses and the client's own failures are read without an engine; the
rest runs on the session's private ``dockerd`` (``docker_engine``): the careless example
gives, point for point, the verdicts it gives as processes; a SIGTERM reaches the job
through the container's init; an attempt stopped at its timeout leaves no container and
no process; a COMMAND the container cannot run is a usage error. The refusals need no
engine. A two-rank torch job with every default family is ``slow``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from chaos.errors import ConfigError
from chaos.launch import containers
from chaos.launch.drivers import engine
from chaos.model.jobspec import JobSpec

REPO = Path(__file__).resolve().parent.parent
CARELESS = ["chaos/examples/careless_job.py", "--out", "{out}"]

# Prints "step N" a step and keeps its step in {out}/step.txt, resuming after it; on SIGTERM says so
# in {out}/term.txt and exits 143, as a preempted job should (a supervisor then restarts it).
TERM_JOB = """
    import os, signal, sys, time
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    def stop(signum, frame):
        with open(os.path.join(out, "term.txt"), "w") as f:
            f.write(f"got {signal.Signals(signum).name} as pid {os.getpid()}")
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    saved = os.path.join(out, "step.txt")
    start = int(open(saved).read()) + 1 if os.path.exists(saved) else 1
    for step in range(start, 5):
        print(f"step {step}", flush=True)
        with open(os.path.join(out, "step.txt"), "w") as f:
            f.write(str(step))
        time.sleep(0.2)
    with open(os.path.join(out, "final.txt"), "w") as f:
        f.write("done")
"""


IMAGE = "chaos-test-python:1"
IMAGE_LIB = "image-lib"
# The image's job: the careless example, after saying which Python runs it, that the image's own
# PYTHONPATH still reaches it (its helper), and whether this host's virtual environment shows.
IMAGE_JOB = """
import os, runpy, sys
import helper
print("in image:", sys.executable, helper.WHERE, "host venv seen:", os.path.exists({venv!r}), flush=True)
sys.argv = ["careless.py", *sys.argv[1:]]
runpy.run_path("/app/careless.py", run_name="__main__")
"""
_SKIP_STDLIB = {"site-packages", "test", "idlelib", "tkinter", "ensurepip", "lib2to3", "turtledemo", "distutils",
                "pydoc_data", "unittest", "sqlite3", "tests"}
_SKIP_DYNLOAD = ("_tkinter", "_sqlite3", "_test", "_ctypes_test", "xx", "_curses", "readline", "_dbm", "_gdbm")


def _libraries(binaries: list[str]) -> set[str]:
    """The shared libraries ``ldd`` says these binaries load (their paths as the loader finds them)."""
    out: set[str] = set()
    for b in binaries:
        text = subprocess.run(["ldd", b], capture_output=True, text=True, check=False).stdout
        for line in text.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts and parts[0].startswith("/") else None
            if path and os.path.isfile(path):
                out.add(path)
    return out


def _python_image_tar() -> bytes:
    """A real image without this host's system: its Python under /opt/py (binary, libpython, the
    standard library without its tests), the C libraries they load at their own paths, and /app."""
    import importlib.util
    import io
    import marshal
    import tarfile
    import zipfile

    prefix = sys.base_prefix
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = os.path.join(prefix, "lib", version)
    binary = os.path.realpath(sys.executable)
    libpython = [lib for lib in _libraries([binary]) if lib.startswith(prefix)]
    dynload = [os.path.join(stdlib, "lib-dynload", n) for n in os.listdir(os.path.join(stdlib, "lib-dynload"))
               if not n.startswith(_SKIP_DYNLOAD)]
    buf = io.BytesIO()
    stripped = tempfile.mkdtemp(prefix="chaos-image-")  # debug symbols off: the engine copies the image per container
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(src: str, dst: str) -> None:
            src = os.path.realpath(src)
            if shutil.which("strip") and (src.endswith(".so") or ".so." in src or src == binary):
                small = os.path.join(stripped, f"{len(os.listdir(stripped))}-{os.path.basename(src)}")
                if subprocess.run(["strip", "-o", small, src], capture_output=True, check=False).returncode == 0:
                    os.chmod(small, os.stat(src).st_mode)
                    src = small
            tar.add(src, arcname=dst.lstrip("/"), recursive=False)

        add(binary, "/opt/py/bin/python3")
        for lib in libpython:
            add(lib, f"/opt/py/lib/{os.path.basename(lib)}")
        for lib in dynload:
            add(lib, f"/opt/py/lib/{version}/lib-dynload/{os.path.basename(lib)}")
        # The pure-Python standard library as python3NN.zip of compiled modules (on Python's default
        # path): a few files, not two thousand, since the engine's vfs driver copies them per container.
        zipped = io.BytesIO()
        with zipfile.ZipFile(zipped, "w") as zf:
            for root, dirs, files in os.walk(stdlib):
                dirs[:] = [d for d in dirs if d not in _SKIP_STDLIB and d != "lib-dynload" and d != "__pycache__"
                           and not d.startswith("config-")]
                for name in files:
                    if name.endswith(".py"):
                        src = os.path.join(root, name)
                        code = compile(Path(src).read_bytes(), src, "exec", dont_inherit=True)
                        pyc = importlib.util.MAGIC_NUMBER + b"\x00" * 12 + marshal.dumps(code)
                        zf.writestr(os.path.relpath(src, stdlib)[:-3] + ".pyc", pyc)
        data = zipped.getvalue()
        info = tarfile.TarInfo(f"opt/py/lib/python{sys.version_info.major}{sys.version_info.minor}.zip")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        for lib in _libraries([binary, *libpython, *dynload]):
            if not lib.startswith(prefix):
                add(lib, lib)
        files = {"/app/careless.py": (REPO / "chaos/examples/careless_job.py").read_text(),
                 "/app/job.py": IMAGE_JOB.format(venv=sys.prefix),
                 "/app/lib/helper.py": f"WHERE = {IMAGE_LIB!r}\n"}
        for dst, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(dst.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    shutil.rmtree(stripped)
    return buf.getvalue()


@pytest.fixture(scope="module")
def python_image(docker_engine) -> str:
    """:data:`IMAGE` on the session's engine, made once (about 70 MB, no registry)."""
    client = docker_engine.client()
    client.api.import_image_from_data(_python_image_tar(), repository=IMAGE.split(":")[0], tag=IMAGE.split(":")[1],
                                      changes=["ENV PATH=/opt/py/bin:/usr/bin:/bin", "ENV PYTHONPATH=/app/lib",
                                               "ENV LD_LIBRARY_PATH=/opt/py/lib", "WORKDIR /app"])
    return IMAGE


def _chaos(*argv: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def _ours(client) -> list[str]:
    """Our job containers and networks still on the engine (low level: ``containers.list`` races with ``--rm``)."""
    flt = {"label": f"{engine.LABEL}=job"}
    return ([c["Names"][0] for c in client.api.containers(all=True, filters=flt)]
            + [n["Name"] for n in client.api.networks(filters=flt)])


def _attempts(doc: dict) -> list[dict]:
    return [a for s in doc["scenarios"] for a in s["oracles"]["liveness"]["evidence"]["attempts"]]


# -- without an engine ----------------------------------------------------------------------------

def test_mounts_write_only_the_scratch_root_and_show_what_the_command_needs(tmp_path: Path) -> None:
    root, cwd, lib, extra = (tmp_path / n for n in ("root", "cwd", "lib", "extra"))
    for d in (root, cwd, lib, extra, cwd / "sub"):
        d.mkdir()
    (cwd / "sub" / "job.py").write_text("")
    (lib / "chaosio.so").write_bytes(b"")
    env = {"PATH": os.path.dirname(sys.executable), "LD_PRELOAD": str(lib / "chaosio.so"),
           "PYTHONPATH": os.pathsep.join([str(extra), str(root / "boot"), "/no/such/dir"])}
    got = containers.mounts(str(root), str(cwd), [os.path.basename(sys.executable), "sub/job.py", "--x"], env)
    modes = dict(got)
    assert len(modes) == len(got), got  # no path mounted twice
    assert [p for p, m in got if m == "rw"] == [str(root)]
    assert modes[str(cwd)] == "ro" and modes[str(lib / "chaosio.so")] == "ro" and modes[str(extra)] == "ro"
    assert str(cwd / "sub") not in modes  # visible through the working directory already
    assert "/no/such/dir" not in modes and str(root / "boot") not in modes
    real = os.path.realpath(sys.executable)
    assert any(real.startswith(p.rstrip("/") + "/") for p in modes), (real, got)  # its Python runs
    assert "/" not in modes
    depth = [p.count("/") for p, _ in got]
    assert depth == sorted(depth)  # parents before what is mounted inside them


def test_a_path_with_a_colon_is_never_split_into_another_mount(tmp_path: Path) -> None:
    odd = tmp_path / "x:"
    (odd / "etc:rw").mkdir(parents=True)
    with pytest.raises(ConfigError, match="cannot bind-mount"):
        containers.mounts(str(tmp_path), f"{odd}/etc:rw", ["true"], {})
    with pytest.raises(ConfigError, match="cannot bind-mount"):  # an image's copies too
        containers.wrap(["python3"], {}, None, f"{odd}/etc:rw", "mark", 0, image="any:1")
    job = odd / "etc:rw" / "job.py"
    job.write_text("")
    got = containers.mounts(str(tmp_path / "root"), str(tmp_path / "cwd"), ["python3", str(job)], {})
    assert got and not any(":" in p for p, _ in got)  # the job's directory is not mounted at all


def test_a_read_write_mount_wins_over_a_read_only_one_of_the_same_path(tmp_path: Path) -> None:
    got = containers.mounts(str(tmp_path), str(tmp_path), ["true"], {"PYTHONPATH": str(tmp_path)})
    assert dict(got)[str(tmp_path)] == "rw" and [p for p, _ in got].count(str(tmp_path)) == 1


def test_exit_statuses_read_as_a_process_s_and_the_client_s_own_failures_are_told_apart(tmp_path: Path) -> None:
    assert containers.returncode(137) == -9 and containers.returncode(143) == -15
    assert containers.returncode(0) == 0 and containers.returncode(3) == 3 and containers.returncode(None) is None
    log = tmp_path / "copy0.log"
    log.write_text("[FATAL tini (7)] exec nope failed: No such file or directory\n")
    assert containers.start_error(127, str(log)) == "[FATAL tini (7)] exec nope failed: No such file or directory"
    assert containers.start_error(1, str(log)) is None  # the job's own status: not the client's failure
    log.write_text("Traceback (most recent call last):\n  ...\n")
    assert containers.start_error(127, str(log)) is None  # a job that exits 127 by itself
    log.write_text('docker: Error response from daemon: invalid mount config for type "bind".\n')
    assert containers.start_error(125, str(log)).startswith("docker: Error response from daemon")
    log.write_text("Error response from daemon: cannot start container\nError: failed to start containers: x\n")
    assert containers.start_error(1, str(log)) == "Error response from daemon: cannot start container"


@pytest.mark.parametrize(("argv", "said"), [
    (["--faults", "net"], "--faults net: a network cut between ranks needs at least two"),
    (["--executor", "slurm"], "--executor slurm with --launcher docker"),
    (["--launcher", "subprocess", "--image", "x:1"], "--image needs --launcher docker"),
])
def test_what_a_container_cannot_take_is_refused_in_one_line(argv: list[str], said: str) -> None:
    proc = _chaos("--launcher", "docker", *argv, "--", sys.executable, *CARELESS, timeout=60)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("image", ["--privileged", "a b", "", "-v/:/host"])
def test_an_image_that_is_no_image_reference_is_refused_even_from_a_results_file(image: str) -> None:
    spec = JobSpec(command=("python3", "j.py", "{out}"), launcher="docker").to_dict()
    with pytest.raises(ConfigError, match="not an image reference"):
        JobSpec.from_dict({**spec, "image": image})


def test_simulated_nodes_are_refused() -> None:
    with pytest.raises(ConfigError, match="--launcher docker with --nodes: simulated nodes are network namespaces"):
        JobSpec(command=("torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", "{rdzv}", "j.py", "{out}"), nodes=2, launcher="docker")


def test_no_engine_is_a_usage_error_naming_where_it_looked(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}
    proc = _chaos("--launcher", "docker", "--", sys.executable, *CARELESS, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--launcher docker: no Docker engine reachable (DOCKER_HOST" in proc.stderr and "Traceback" not in proc.stderr


def test_net_is_a_default_family_of_ranks_in_containers_without_network_namespaces(monkeypatch) -> None:
    from chaos.nemesis import netcut
    from chaos.plan.pointset import kinds_to_explore

    # the engine's own networks: no namespace, veth or root needed on this side
    monkeypatch.setattr(netcut, "available", lambda: (False, "no iproute2"))
    kinds, notes = kinds_to_explore(JobSpec(command=(sys.executable, "j.py", "{out}"), ranks=2, launcher="docker"))
    assert "net" in kinds and not any("network" in n for n in notes), notes
    one, _ = kinds_to_explore(JobSpec(command=(sys.executable, "j.py", "{out}"), launcher="docker"))
    assert "net" not in one  # one copy has no ranks to cut apart


# -- on a real engine -----------------------------------------------------------------------------

def test_the_careless_example_fails_in_containers_exactly_as_it_does_as_processes(docker_engine,
                                                                                   tmp_path: Path) -> None:
    common = ["--faults", "kill", "--max-points", "4", "--seed", "1", "--scratch", str(tmp_path)]
    docs = {}
    for launcher in ("docker", "subprocess"):
        out = tmp_path / f"{launcher}.json"
        proc = _chaos(*common, "--launcher", launcher, "--json", str(out), "--", sys.executable, *CARELESS)
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        docs[launcher] = json.loads(out.read_text())
    verdicts = {k: {s["id"]: s["outcome"] for s in d["scenarios"]} for k, d in docs.items()}
    assert verdicts["docker"] == verdicts["subprocess"] and "hard_failure" in verdicts["docker"].values()
    attempts = _attempts(docs["docker"])
    assert all(len(a["containers"]) == 1 for a in attempts)
    assert len({a["containers"][0] for a in attempts}) == len(attempts)  # a container per copy per attempt
    killed = [a for a in attempts if a["attempt"] == 0]
    assert killed and all(a["returncodes"] == [-9] for a in killed)  # SIGKILLed in its container, read as -9
    assert not any("containers" in a for a in _attempts(docs["subprocess"]))
    assert "--launcher docker" in json.dumps([s["replay"] for s in docs["docker"]["scenarios"]])
    assert _ours(docker_engine.client()) == []


def test_a_sigterm_reaches_the_job_through_the_container_init(docker_engine, tmp_path: Path) -> None:
    job = tmp_path / "term_job.py"
    job.write_text(textwrap.dedent(TERM_JOB))
    out = tmp_path / "r.json"
    proc = _chaos("--launcher", "docker", "--point", "rank0:step2:term", "--step-regex", r"step (\d+)",
                  "--result-file", "final.txt", "--scratch", str(tmp_path), "--keep", "--json", str(out), "--",
                  sys.executable, str(job), "{out}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (point,) = json.loads(out.read_text())["scenarios"]
    first = point["oracles"]["liveness"]["evidence"]["attempts"][0]
    # exit(143) from inside a container is the status a SIGTERM gives it: read as killed by SIGTERM
    assert first["term"]["exited_within_grace"] == [0] and first["returncodes"] == [-15], first
    assert point["outcome"] == "pass"
    notes = list(tmp_path.glob("chaos-job-*/point-*/out/term.txt"))
    assert len(notes) == 1 and notes[0].read_text().startswith("got SIGTERM as pid "), notes
    assert notes[0].read_text() != "got SIGTERM as pid 1"  # the job runs under an init, not as pid 1
    assert _ours(docker_engine.client()) == []


def test_an_attempt_stopped_at_its_timeout_leaves_no_container_and_no_process(docker_engine, tmp_path: Path) -> None:
    from chaos.launch import job as launch
    from chaos.launch.reaper import marked_with

    spec = JobSpec(command=(sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)", "{out}"),
                   timeout_s=3.0, launcher="docker", native_trace=False)
    scratch = tmp_path / "chain"
    scratch.mkdir()
    mark = f"test-docker-timeout-{os.getpid()}"
    outcome = launch.run_attempt(spec, str(tmp_path / "out"), str(scratch), 0, None, mark)
    assert outcome.timed_out and outcome.stopped == [0] and outcome.returncodes == [-9], outcome.to_dict()
    assert outcome.containers == [containers.container_name(launch.attempt_mark(mark, 0), 0)]
    assert outcome.leftovers == [] and outcome.containers_removed == []
    assert "up" in Path(outcome.logs[0]).read_text()
    assert _ours(docker_engine.client()) == [] and marked_with("CHAOS_JOB_MARK", launch.attempt_mark(mark, 0)) == []


def test_a_client_killed_while_the_engine_makes_its_container_leaves_none_behind(docker_engine,
                                                                                 tmp_path: Path) -> None:
    """The race a fresh-clone CI run met: an interrupt kills a copy's ``docker run`` client while the
    engine is still making its container, which then exists, never started, where ``--rm`` never
    applies. Killed at once after its start, each client's container is found and removed."""
    import time

    for attempt in range(6):
        mark = f"race-{os.getpid()}-{attempt}"
        argv, env = containers.wrap([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), None,
                                    str(tmp_path), mark, 0)
        client = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.02 * attempt)  # from before the request reaches the engine to a running container
        client.kill()
        client.wait()
        seen: set[str] = set()
        containers.stop(mark, seen)
        unseen = [n for n in [containers.container_name(mark, 0)] if n not in seen]
        containers.settle(unseen, within_s=1.5)
        time.sleep(0.5)  # anything the engine was still making would show by now
        assert _ours(docker_engine.client()) == [], attempt


def test_a_command_the_container_cannot_run_is_a_usage_error(docker_engine, tmp_path: Path) -> None:
    proc = _chaos("--launcher", "docker", "--scratch", str(tmp_path), "--", "no-such-program-7f3a", "{out}",
                  timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("--launcher docker: copy 0 of COMMAND 'no-such-program-7f3a' did not run: [FATAL tini" in proc.stderr
            and "Traceback" not in proc.stderr), proc.stderr
    assert _ours(docker_engine.client()) == []


def test_a_job_in_its_own_image_fails_as_it_does_on_the_host(python_image, docker_engine, tmp_path: Path) -> None:
    common = ["--faults", "kill", "--max-points", "4", "--seed", "1", "--scratch", str(tmp_path)]
    image_json, host_json = tmp_path / "image.json", tmp_path / "host.json"
    proc = _chaos(*common, "--launcher", "docker", "--image", python_image, "--keep", "--json", str(image_json), "--",
                  "python3", "job.py", "--out", "{out}")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    host = _chaos(*common, "--json", str(host_json), "--", sys.executable, *CARELESS)
    assert host.returncode == 1, host.stdout[-2000:] + host.stderr[-2000:]
    docs = {"image": json.loads(image_json.read_text()), "host": json.loads(host_json.read_text())}
    verdicts = {k: {s["id"]: s["outcome"] for s in d["scenarios"]} for k, d in docs.items()}
    assert verdicts["image"] == verdicts["host"] and "hard_failure" in verdicts["image"].values()
    logs = list(tmp_path.glob("chaos-job-*/golden-0/logs/*.log"))
    said = "".join(p.read_text() for p in logs)
    assert f"in image: /opt/py/bin/python3 {IMAGE_LIB} host venv seen: False" in said, said
    assert docs["image"]["job"]["spec"]["image"] == python_image
    ran_on = docs["image"]["environment"]["docker"]
    assert ran_on["image"] == python_image and ran_on["host_mounted"] is False
    assert ran_on["image_id"] == docker_engine.client().images.get(python_image).id  # a tag moves; the id does not
    assert "docker" not in docs["host"]["environment"]
    from chaos.model.resultschema import load_results

    load_results(image_json)  # what chaos report / replay / findings read
    dry_run = [sys.executable, "-m", "chaos.cli.main", "replay", "--dry-run", str(image_json)]
    replay = subprocess.run(dry_run, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert replay.returncode == 0 and "now; the recorded run was on" not in replay.stderr, replay.stderr
    image_id, doc = ran_on["image_id"], docs["image"]
    doc["environment"]["docker"]["image_id"] = "sha256:" + "0" * 64  # as if the tag were rebuilt since
    image_json.write_text(json.dumps(doc))
    replay = subprocess.run(dry_run, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (f"note: image {python_image} is {image_id} now; the recorded run was on sha256:000"
            in replay.stderr), replay.stderr + replay.stdout
    replays = json.dumps([s["replay"] for s in docs["image"]["scenarios"]])
    assert f"--launcher docker --image {python_image}" in replays
    assert _ours(docker_engine.client()) == []


def test_an_image_the_engine_lacks_is_a_usage_error(docker_engine, tmp_path: Path) -> None:
    proc = _chaos("--launcher", "docker", "--image", "no-such-image-7f3a:9", "--", "python3", "job.py", "{out}",
                  timeout=60)
    assert proc.returncode == 2 and "--image no-such-image-7f3a:9: no such image on the engine" in proc.stderr, \
        proc.stderr


@pytest.mark.parametrize(("keep", "outcome"), [("/ckpt", "lost_work"), ("{out}/ckpt", "pass")])
def test_a_checkpoint_kept_in_the_container_s_own_files_is_lost_at_the_restart(docker_engine, tmp_path: Path,
                                                                               keep: str, outcome: str) -> None:
    """A save that is durable on a host is gone in a container that is replaced: only mounts outlive it."""
    # saves carefully; with "fsync" its restart's rewrite of the checkpoint is durable too
    from test_job_power_in_restart import RENORMALIZING

    job = tmp_path / "keeper.py"
    job.write_text(textwrap.dedent(RENORMALIZING))
    out = tmp_path / "r.json"
    proc = _chaos("--launcher", "docker", "--point", "rank0:step5:kill", "--result-file", "final.json", "--scratch",
                  str(tmp_path), "--json", str(out), "--", sys.executable, str(job), "{out}", "fsync", keep)
    assert proc.returncode == (1 if outcome != "pass" else 0), proc.stdout[-2000:] + proc.stderr[-2000:]
    (point,) = json.loads(out.read_text())["scenarios"]
    assert point["outcome"] == outcome, point["summary"]
    if outcome == "lost_work":
        assert "4" in point["oracles"]["durability"]["summary"], point["oracles"]["durability"]
    assert _ours(docker_engine.client()) == []


def test_sigterm_to_the_harness_leaves_no_container_and_no_process(docker_engine, tmp_path: Path) -> None:
    """cancel() reaches a container through the mark its processes carry and the engine; observed
    right after the harness exited, before anything here cleans up."""
    from test_job_interrupt import SLOW_RESUME, _start, _stopped, _wait_for

    proc, base = _start(tmp_path, SLOW_RESUME, "--launcher", "docker", "--result-file", "final.json",
                        "--point", "rank0:step3:kill")
    root, pids = _wait_for(proc, base, "point-*/logs/attempt1-copy0.log", "resuming from 3")
    assert len(_ours(docker_engine.client())) == 1  # the resume's container, running
    out, err = _stopped(proc, signal.SIGTERM, root, pids)  # no process of the job left, the root removed
    assert proc.returncode == 143, out + err
    assert _ours(docker_engine.client()) == [], out + err
    assert "interrupted after 0 of 1 points (SIGTERM)" in out


def test_second_faults_strike_a_container_s_restart_as_a_process_s(docker_engine, tmp_path: Path) -> None:
    """A kill and a power cut inside the restart (the restart a fresh container too)."""
    from test_job_power_in_restart import RENORMALIZING

    job = tmp_path / "renorm.py"
    job.write_text(textwrap.dedent(RENORMALIZING))
    out = tmp_path / "r.json"
    proc = _chaos("--launcher", "docker", "--point", "rank0:step5:kill+rank0:op6:power", "--point",
                  "rank0:step5:kill+rank0:op6:after", "--result-file", "final.json", "--scratch", str(tmp_path),
                  "--json", str(out), "--", sys.executable, str(job), "{out}", "nosync")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    points = {s["id"]: s for s in json.loads(out.read_text())["scenarios"]}
    assert points["rank0:step5:kill+rank0:op6:power"]["outcome"] == "hard_failure"
    assert points["rank0:step5:kill+rank0:op6:after"]["outcome"] == "pass"
    attempts = points["rank0:step5:kill+rank0:op6:power"]["oracles"]["liveness"]["evidence"]["attempts"]
    assert len(attempts) == 3 and all(len(a["containers"]) == 1 for a in attempts)
    assert _ours(docker_engine.client()) == []


# Two ranks train with DDP over gloo (tests/test_job_net.py's job): argv OUT STEPS COLLECTIVE_TIMEOUT_S.
def _net_job() -> str:
    from test_job_net import JOB

    return JOB


def test_a_rank_s_container_cut_off_its_network_fails_its_peers_and_the_job_resumes(docker_engine,
                                                                                  tmp_path: Path) -> None:
    script = tmp_path / "ddp_net.py"
    script.write_text(_net_job())
    out = tmp_path / "r.json"
    proc = _chaos("--launcher", "docker", "--ranks", "2", "--point", "rank1:step3:net", "--net-hold", "20",
                  "--result-file", "final.json", "--scratch", str(tmp_path), "--json", str(out), "--",
                  sys.executable, str(script), "{out}", "6", "3", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [point] = json.loads(out.read_text())["scenarios"]
    assert point["outcome"] == "pass", point["summary"]
    net = point["attempts"][0]["net"]
    assert net["down"]["call"] == "network disconnect --force" and net["down"]["container"].endswith("-c1"), net
    assert net["lab"]["bridge"].startswith("chaos-jobnet-") and net["lab"]["addresses"] == ["rank0", "rank1"]
    assert net["failed_by_itself"], net  # the collectives raised at their 3 s timeout, long before the hold
    assert point["summary"].startswith("rank 1's link down at its step 3 for a hold of 20 s: "), point["summary"]
    assert "resumed at or after the newest complete checkpoint" in point["summary"], point["summary"]
    assert _ours(docker_engine.client()) == []  # the run chain's network is gone with its containers


@pytest.mark.slow  # 85 s: two ranks importing torch in fresh containers at every attempt
def test_a_two_rank_torch_job_passes_every_default_family_in_containers(docker_engine, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = _chaos("--launcher", "docker", "--ranks", "2", "--max-points", "8", "--seed", "3", "--result-file",
                  "final.pt", "--scratch", str(tmp_path), "--json", str(out), "--", sys.executable,
                  "chaos/examples/ddp_job.py", "--out", "{out}", "--save", "careful", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    kinds = {s["id"].split(":")[-1] if s["id"].startswith("disk") else s["faults"][0]["kind"] for s in doc["scenarios"]}
    # every point held; a payload the resume never read tested nothing (skipped, no_effect), never a pass
    assert len(doc["scenarios"]) == 8 and all(s["outcome"] in ("pass", "no_effect") for s in doc["scenarios"])
    assert sum(s["outcome"] == "pass" for s in doc["scenarios"]) >= 6
    assert len(kinds) >= 4 and "netcut" in kinds, kinds  # net: the containers on a network of the engine
    assert all(len(a["containers"]) == 2 for a in _attempts(doc))
    assert _ours(docker_engine.client()) == []
