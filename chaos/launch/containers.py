"""``--launcher docker``: every copy of a job's attempt runs in a container of its own.

Why: teams run training in containers, and a container changes what a crash leaves. The
whole process tree goes with it (a torchrun agent's workers, a data loader's children),
signals reach the job through an init, and only what is bind-mounted outlives it. A job
that is right as a process may not be right as a container, so the harness attacks it
there too, with every fault family that acts from inside a rank or on its files.

How: :func:`wrap` turns a copy's command line into ``docker run --rm --init`` of it, which
``job.run_attempt`` starts in the copy's place, attached. To the harness the copy is still
a process: its output is the copy's log, its exit status is the container's (128+N for a
signal N, read back as -N by :func:`returncode`, as for a process), and a SIGTERM sent to
it is forwarded to the container (the client's signal proxy: a term point works as for a
process). Every copy runs the empty image (``engine.EMPTY_IMAGE``, made once) with the
host's system, Python and this project bind-mounted read-only (``engine.host_mounts``),
and also read-only the job's working directory, the files its COMMAND names and the
directories on its ``PYTHONPATH``; the exploration's scratch root is mounted read-write at
its own path, so ``{out}``, the traces, the logs and the native tracer are where the
harness reads and edits them. The copy runs as the harness's uid (what it writes stays
removable), on the host's network (``MASTER_ADDR`` and ``MASTER_PORT`` as for a process),
with the copy's environment. What it writes anywhere else is gone with the container.

With ``--image NAME`` the copy runs the user's own image instead: its Python, working
directory, ``PATH`` and libraries (:data:`HOST_ONLY` variables are not passed in), with only
this project's ``chaos`` and ``faults`` packages mounted read-only (the boot path and the
tracer, standard library only: it runs on the image's Python) and the scratch root
read-write; the boot path goes before the image's own ``PYTHONPATH``. The native tracer,
built against this host's C library, is not preloaded there (``job._native_library`` says so).

Faults: the in-rank families (kill, errno, term, and the halts of at-rest, power, stale,
swap and reorder points) fire from inside the container exactly as in a process; their
effects on ``{out}`` are made by the harness on the host between attempts. A network cut
is not explored (``JobSpec.net_unavailable``), nor simulated nodes or Slurm.

Clean-up: a ``docker run`` client that is SIGKILLed leaves its container running, so
:func:`stop` kills an attempt's containers through the engine before the harness reaps
their clients, and looks again once they are gone: a client killed while the engine was
still making its container (an interrupt as the attempt starts; a fresh-clone CI run met
one) leaves it made but never started, where ``--rm`` never applies. :func:`sweep` removes
whatever of this process's attempts is still on the engine when an exploration ends. Each container's processes also carry the attempt's ``CHAOS_JOB_MARK``
and run as the harness's uid, so ``reaper`` finds and kills them from the host after an
interrupt; ``--rm`` then removes the container, and :func:`stop` removes (and reports)
any container of the attempt still on the engine.

Who calls what: ``cli.job.build`` calls :func:`check` (a missing client, engine or image is a
ConfigError before anything runs); ``job.run_attempt`` calls :func:`wrap` for every copy
(``job._plan``), :func:`stop` in its clean-up (before and after the clients are reaped), then
:func:`returncode` and :func:`start_error`; ``chaos.nemesis.restart`` calls :func:`restart` when a
restart point fires (the engine restarts that copy's container in place); ``job.kill_all`` calls :func:`sweep` when an
exploration ends or is interrupted.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import time
from typing import Any

from chaos.errors import ConfigError
from chaos.launch.drivers import engine

SETTLE_S = 3.0  # settle(): how long a container whose client was killed mid-start may take to appear
LABEL_ATTEMPT = "chaos.job.attempt"  # the attempt's CHAOS_JOB_MARK: stop() finds its containers by it
START_FAILED = 125  # docker run's own status when the daemon could not create or start the container
NOT_RUN = (126, 127)  # the COMMAND was found but could not be run, or was not found


def _engine() -> tuple[Any, str]:
    """(client, url) of the engine ``DOCKER_HOST`` names now (a test session's private engine sets it)."""
    return _reach(os.environ.get("DOCKER_HOST"))


def _name(c: dict[str, Any]) -> str:
    """A container's name from the engine's low-level listing (``/name``), else its id."""
    return str(next(iter(c.get("Names") or []), c["Id"])).lstrip("/")


@functools.lru_cache(maxsize=4)
def _reach(docker_host: str | None) -> tuple[Any, str]:
    """(client, url) of the engine, its empty image made; once per ``DOCKER_HOST`` in a process."""
    try:
        client, url = engine.locate()
        engine.ensure_image(client)
    except engine.EngineUnavailable as exc:
        raise ConfigError(f"--launcher docker: {exc}") from None
    return client, url


def engine_client() -> Any:
    """The Docker SDK client of the engine ``DOCKER_HOST`` names now (ConfigError where none answers)."""
    return _engine()[0]


def check(image: str | None = None) -> str:
    """ConfigError unless a ``docker`` client is on PATH, an engine answers and has ``image``
    (never pulled here: a run must not depend on a registry); the engine's URL."""
    if shutil.which("docker") is None:
        raise ConfigError("--launcher docker needs the docker client on PATH (it runs each copy as `docker run`)")
    client, url = _engine()
    if image is not None:
        import docker

        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            raise ConfigError(f"--image {image}: no such image on the engine at {url} (docker pull it, or build it, "
                              "first)") from None
        except docker.errors.APIError as exc:
            raise ConfigError(f"--image {image}: the engine at {url} refused it: {exc.explanation or exc}") from None
    return url


def describe(image: str | None) -> dict[str, Any]:
    """The engine and image a run's copies ran on, for the results' ``environment.docker``: a tag
    can move, so the image's id says which one the points ran against. Asked of the engine once
    per process (``cli.job`` rewrites the results after every point): what the run started on."""
    return dict(_described(image, os.environ.get("DOCKER_HOST")))


@functools.lru_cache(maxsize=4)
def _described(image: str | None, docker_host: str | None) -> dict[str, Any]:
    client, url = _reach(docker_host)
    name = image or engine.EMPTY_IMAGE
    try:
        version = client.version().get("Version")
        image_id = client.images.get(name).id
    except Exception as exc:  # noqa: BLE001 - a record, never a reason to fail the run's results
        return {"url": url, "image": name, "error": f"{type(exc).__name__}: {exc}"}
    return {"url": url, "engine": version, "image": name, "image_id": image_id, "host_mounted": image is None}


def container_name(mark: str, copy: int) -> str:
    """A copy's container name: unique per attempt (from its mark) and copy, in Docker's alphabet."""
    return f"chaos-job-{hashlib.sha1(mark.encode()).hexdigest()[:16]}-c{copy}"


def mounts(root: str, cwd: str, argv: list[str], env: dict[str, str]) -> list[tuple[str, str]]:
    """``(path, mode)`` of every bind mount of a copy, each at its own path, parents first.

    ``root`` (the exploration's scratch root) is the only one written; the host's system and
    this project, ``cwd``, the installation of the program ``argv[0]`` finds on the copy's
    ``PATH`` (a venv, a pyenv root), the directories of the files ``argv`` names, the native
    tracer (``LD_PRELOAD``) and the ``PYTHONPATH`` directories are read-only. A path already
    visible through an earlier mount is not mounted again. ``--volume SRC:DST:MODE`` splits on
    ``:``, so a path holding one (from a hostile results file's ``cwd``, say) could name another
    mount: ``root`` or ``cwd`` with one is a ConfigError, any other such path is not mounted.
    """
    for must in (root, cwd):
        if ":" in must:
            raise ConfigError(f"--launcher docker cannot bind-mount {must!r}: a path with ':' cannot be a volume")
    wanted: list[tuple[str, str]] = [(p, "ro") for p in engine.host_mounts()]
    wanted.append((os.path.abspath(root), "rw"))
    wanted.append((os.path.abspath(cwd), "ro"))
    program = shutil.which(argv[0], path=env.get("PATH")) if "/" not in argv[0] else os.path.join(cwd, argv[0])
    if program is not None and os.path.isfile(program):  # the installation it lives in: a venv, pyenv, /opt/x
        for path in {os.path.abspath(program), os.path.realpath(program)}:
            wanted.append((_installation(path), "ro"))
    for arg in argv:
        path = os.path.join(cwd, arg)
        if os.path.isfile(path):
            wanted.append((os.path.dirname(os.path.abspath(path)), "ro"))
    for lib in env.get("LD_PRELOAD", "").replace(":", " ").split():
        if os.path.isfile(lib):
            wanted.append((os.path.abspath(lib), "ro"))
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.isdir(entry):
            wanted.append((os.path.abspath(entry), "ro"))
    out: list[tuple[str, str]] = []
    for path, mode in wanted:
        if ":" in path:
            continue  # it would split into another mount (see above)
        if any(path == p or path.startswith(p.rstrip("/") + "/") for p, m in out if m == mode or m == "rw"):
            continue  # visible already, and at least as writable
        out = [(p, m) for p, m in out if p != path]  # a read-only mount of the same path gives way
        out.append((path, mode))
    return sorted(out, key=lambda pm: (pm[0].count("/"), pm[0]))


def _installation(program: str) -> str:
    """The tree a program is installed in: ``/x/venv`` for ``/x/venv/bin/python`` (its ``bin``'s
    parent), but never ``/`` itself (``/bin/sh``: its own directory)."""
    bindir = os.path.dirname(program)
    root = os.path.dirname(bindir)
    return bindir if root in ("/", "") else root


# What a copy's environment says about this host only: not passed into a container of --image,
# whose own values (its PATH, its Python, its libraries) stand.
HOST_ONLY = ("PATH", "HOME", "HOSTNAME", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONHOME", "VIRTUAL_ENV",
             "PYTHONPATH", "CONDA_PREFIX", "PYENV_VERSION")


def tracer_mounts() -> list[str]:
    """What a container of ``--image`` needs of this project: the ``chaos`` and ``faults`` packages
    (the boot path and the tracer, standard library only), each at its own path."""
    import chaos
    import faults

    return [os.path.dirname(os.path.abspath(m.__file__)) for m in (chaos, faults)]  # type: ignore[arg-type]


def image_env(image: str) -> dict[str, str]:
    """The image's own environment (its ``ENV`` lines), as the engine has it."""
    client, _ = _engine()
    pairs = client.images.get(image).attrs.get("Config", {}).get("Env") or []
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def wrap(argv: list[str], env: dict[str, str], cwd: str | None, root: str, mark: str, copy: int,
         image: str | None = None, network: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """``docker run`` of one copy, and the environment to start that client with.

    Without ``image``: ``argv`` in ``cwd`` with ``env``, in a container of the empty image with
    :func:`mounts`. With it: ``argv`` in the image's own working directory, with ``env`` less
    :data:`HOST_ONLY` and the boot path put before the image's own ``PYTHONPATH``; only this
    project's packages (read-only, :func:`tracer_mounts`) and ``root`` (read-write) are mounted.
    Every variable is passed by name (the client's environment holds the values, with
    ``DOCKER_HOST``), so no value appears on a command line. ``network``: the ``docker run``
    options of a run chain's own network (``containernet.ContainerNetwork.run_options``), in
    place of the host's."""
    client_env = dict(env)
    _marks.add(mark)
    cmd = ["docker", "run", "--rm", "--init", "--name", container_name(mark, copy),
           "--label", f"{engine.LABEL}=job", "--label", f"{LABEL_ATTEMPT}={mark}",
           *(network or ["--network", "host"]), "--user", f"{os.getuid()}:{os.getgid()}", "--log-driver", "none"]
    if image is None:
        workdir = os.path.abspath(cwd or os.getcwd())
        cmd += ["--workdir", workdir]
        volumes = mounts(root, workdir, argv, env)
        passed = sorted(env)
    else:
        if ":" in root:  # (mounts() says why)
            raise ConfigError(f"--launcher docker cannot bind-mount {root!r}: a path with ':' cannot be a volume")
        volumes = [(p, "ro") for p in tracer_mounts()] + [(os.path.abspath(root), "rw")]
        boot = env.get("PYTHONPATH", "").split(os.pathsep)[0]  # job_env puts the boot path first
        own = image_env(image).get("PYTHONPATH")
        client_env["PYTHONPATH"] = os.pathsep.join(p for p in (boot, own) if p)
        passed = sorted(k for k in client_env if k not in HOST_ONLY or k == "PYTHONPATH")
    for path, mode in volumes:
        cmd += ["--volume", f"{path}:{path}:{mode}"]
    for key in passed:
        cmd += ["--env", key]
    # the engine reached (and the empty image made) before a copy names them
    client_env["DOCKER_HOST"] = _engine()[1]
    return [*cmd, image or engine.EMPTY_IMAGE, *argv], client_env


_marks: set[str] = set()  # every attempt this process made containers for (wrap): what sweep() looks for


def sweep() -> list[str]:
    """Remove every container of this process's attempts still on the engine, whatever its state; the
    names removed. Called by ``job.kill_all`` (an exploration's end, an interrupt); nothing where no
    attempt ran as a container."""
    if not _marks:
        return []
    marks = sorted(_marks)
    _marks.clear()
    import docker

    try:
        api = _engine()[0].api
        found = api.containers(all=True, filters={"label": LABEL_ATTEMPT})
    except (ConfigError, docker.errors.DockerException):
        return []  # no engine now: nothing of ours can be on it
    return [_name(c) for c in found
            if (c.get("Labels") or {}).get(LABEL_ATTEMPT) in marks and _remove(api, c["Id"])]


def _remove(api: Any, cid: str) -> bool:
    """Force-remove one container; False where the engine had it gone or going already (``--rm``
    at work: a 409 "removal ... already in progress", or not found), True where this removed it."""
    import docker

    try:
        api.remove_container(cid, force=True)
        return True
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # its own --rm is removing it: wait until it is gone
            try:
                api.wait(cid, timeout=10, condition="removed")
            except Exception:  # noqa: BLE001 - gone (NotFound), or the wait itself failed: nothing more to do
                pass
            return False
        raise


def stop(mark: str, seen: set[str] | None = None) -> list[str]:
    """Kill the attempt's containers still running, wait until the engine has removed them all;
    the names of those it had to remove itself (their ``--rm`` had not, within 10 s). ``seen``
    gets the name of every container of the attempt found on the engine.

    Through the engine's low-level calls, each of which may find its container already gone
    (``--rm`` removes it the moment it exits): the SDK's ``containers.list`` inspects every
    container it lists, and raises for one removed in between."""
    import docker

    api = _engine()[0].api
    flt = {"label": f"{LABEL_ATTEMPT}={mark}"}
    for c in api.containers(filters=flt):  # running ones
        try:
            api.kill(c["Id"])
        except docker.errors.APIError:
            pass  # it exited (or was removed) meanwhile
    left: list[str] = []
    for c in api.containers(all=True, filters=flt):
        name = _name(c)
        if seen is not None:
            seen.add(name)
        if c.get("State") == "created":  # made, never started (the attempt ended first): --rm never applies
            _remove(api, c["Id"])
            continue
        try:
            api.wait(c["Id"], timeout=10, condition="removed")
        except docker.errors.NotFound:
            continue  # removed before the wait began
        except Exception:  # noqa: BLE001 - still there after 10 s (or the wait failed): remove it
            if _remove(api, c["Id"]):
                left.append(name)
    return left


def restart(name: str, timeout_s: float) -> dict[str, Any]:
    """``docker restart -t T`` of one copy's container, through the engine (``chaos.nemesis.restart``):
    its processes are stopped (SIGTERM, SIGKILL after ``timeout_s``; at once with 0) and its command
    started again in it, the copy's client still attached. What the engine said: the container's
    start time and main process before and after, or the error."""
    import docker

    api = _engine()[0].api
    try:
        before = api.inspect_container(name)["State"]
        api.restart(name, timeout=int(timeout_s))
        after = api.inspect_container(name)["State"]
    except docker.errors.DockerException as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"started_at_before": before.get("StartedAt"), "started_at": after.get("StartedAt"),
            "pid_before": before.get("Pid"), "pid": after.get("Pid"), "running": bool(after.get("Running"))}


def settle(names: list[str], within_s: float = SETTLE_S) -> list[str]:
    """Wait up to ``within_s`` for containers whose client was killed before the engine showed them
    (an interrupt as the attempt started: the engine may still be making them) and remove each that
    appears; the names removed. Called by ``job.run_attempt`` only for such clients."""
    if not names:
        return []
    api = _engine()[0].api
    wanted, removed = set(names), []
    deadline = time.monotonic() + within_s
    while wanted and time.monotonic() < deadline:
        for c in api.containers(all=True, filters={"label": LABEL_ATTEMPT}):
            name = _name(c)
            if name in wanted:
                wanted.discard(name)
                if _remove(api, c["Id"]):
                    removed.append(name)
        time.sleep(0.05)
    return removed


def returncode(rc: int | None) -> int | None:
    """A copy's exit status as the harness reads a process's: 128+N from the container is -N."""
    return None if rc is None else engine.exit_code(rc)


def start_error(rc: int | None, log: str) -> str | None:
    """Why a copy's container never ran its COMMAND, in the words of the engine (a ``docker:``
    or ``Error response from daemon:`` line) or of its init (``[FATAL tini ...] exec X failed``),
    or None: only a status of 1, :data:`START_FAILED` or :data:`NOT_RUN` whose log begins so."""
    if rc not in (1, START_FAILED, *NOT_RUN):  # 1: docker start's own status where the engine refused
        return None
    try:
        with open(log, errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return None
    first = next((line for line in head.splitlines() if line.strip()), "")
    first = first.strip()
    if rc == 1:  # docker start's own status: only where the engine refused to start the container
        return first if first.startswith("Error response from daemon:") else None
    return first if first.startswith(("docker:", "[FATAL tini", "Error response from daemon:")) else None


__all__ = ["HOST_ONLY", "LABEL_ATTEMPT", "check", "container_name", "engine_client", "describe", "image_env", "mounts", "returncode",
           "settle", "start_error", "stop", "sweep", "tracer_mounts", "wrap"]
