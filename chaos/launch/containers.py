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

Faults: the in-rank families (kill, errno, term, and the halts of at-rest, power, stale,
swap and reorder points) fire from inside the container exactly as in a process; their
effects on ``{out}`` are made by the harness on the host between attempts. A network cut
is not explored (``JobSpec.net_unavailable``), nor simulated nodes or Slurm.

Clean-up: a ``docker run`` client that is SIGKILLed leaves its container running, so
:func:`stop` kills an attempt's containers through the engine before the harness reaps
their clients. Each container's processes also carry the attempt's ``CHAOS_JOB_MARK``
and run as the harness's uid, so ``reaper`` finds and kills them from the host after an
interrupt; ``--rm`` then removes the container, and :func:`stop` removes (and reports)
any container of the attempt still on the engine.

Who calls what: ``cli.job.build`` calls :func:`check` (a missing client or engine is a
ConfigError before anything runs); ``job.run_attempt`` calls :func:`wrap` for every copy
(``job._plan``), :func:`stop` in its clean-up, then :func:`returncode` and :func:`start_error`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from typing import Any

from chaos.errors import ConfigError
from chaos.launch.drivers import engine

LABEL_ATTEMPT = "chaos.job.attempt"  # the attempt's CHAOS_JOB_MARK: stop() finds its containers by it
START_FAILED = 125  # docker run's own status when the daemon could not create or start the container
NOT_RUN = (126, 127)  # the COMMAND was found but could not be run, or was not found


@functools.lru_cache(maxsize=4)
def _engine(docker_host: str | None) -> tuple[Any, str]:
    """(client, url) of the engine, its empty image made; once per ``DOCKER_HOST`` in a process."""
    try:
        client, url = engine.locate()
        engine.ensure_image(client)
    except engine.EngineUnavailable as exc:
        raise ConfigError(f"--launcher docker: {exc}") from None
    return client, url


def check() -> str:
    """ConfigError unless a ``docker`` client is on PATH and an engine answers; the engine's URL."""
    if shutil.which("docker") is None:
        raise ConfigError("--launcher docker needs the docker client on PATH (it runs each copy as `docker run`)")
    return _engine(os.environ.get("DOCKER_HOST"))[1]


def container_name(mark: str, copy: int) -> str:
    """A copy's container name: unique per attempt (from its mark) and copy, in Docker's alphabet."""
    return f"chaos-job-{hashlib.sha1(mark.encode()).hexdigest()[:16]}-c{copy}"


def mounts(root: str, cwd: str, argv: list[str], env: dict[str, str]) -> list[tuple[str, str]]:
    """``(path, mode)`` of every bind mount of a copy, each at its own path, parents first.

    ``root`` (the exploration's scratch root) is the only one written; the host's system and
    this project, ``cwd``, the installation of the program ``argv[0]`` finds on the copy's
    ``PATH`` (a venv, a pyenv root), the directories of the files ``argv`` names, the native
    tracer (``LD_PRELOAD``) and the ``PYTHONPATH`` directories are read-only. A path already
    visible through an earlier mount is not mounted again.
    """
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


def wrap(argv: list[str], env: dict[str, str], cwd: str | None, root: str, mark: str, copy: int) -> list[str]:
    """``docker run`` of one copy: ``argv`` in ``cwd`` with ``env``, in a container of the empty image.

    Its client is started with ``env`` plus ``DOCKER_HOST`` (:func:`client_env`); every
    variable of ``env`` is passed by name, so the values never appear on a command line."""
    _engine(os.environ.get("DOCKER_HOST"))  # the engine reached and its image made, before a copy names them
    workdir = os.path.abspath(cwd or os.getcwd())
    cmd = ["docker", "run", "--rm", "--init", "--name", container_name(mark, copy),
           "--label", f"{engine.LABEL}=job", "--label", f"{LABEL_ATTEMPT}={mark}",
           "--network", "host", "--user", f"{os.getuid()}:{os.getgid()}", "--workdir", workdir,
           "--log-driver", "none"]
    for path, mode in mounts(root, workdir, argv, env):
        cmd += ["--volume", f"{path}:{path}:{mode}"]
    for key in sorted(env):
        cmd += ["--env", key]
    return [*cmd, engine.EMPTY_IMAGE, *argv]


def client_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a copy's ``docker run`` client: the copy's own, and the engine to reach."""
    return {**env, "DOCKER_HOST": _engine(os.environ.get("DOCKER_HOST"))[1]}


def stop(mark: str) -> list[str]:
    """Kill the attempt's containers still running, wait until the engine has removed them all;
    the names of those it had to remove itself (their ``--rm`` had not, within 10 s).

    Through the engine's low-level calls, each of which may find its container already gone
    (``--rm`` removes it the moment it exits): the SDK's ``containers.list`` inspects every
    container it lists, and raises for one removed in between."""
    import docker

    api = _engine(os.environ.get("DOCKER_HOST"))[0].api
    flt = {"label": f"{LABEL_ATTEMPT}={mark}"}
    for c in api.containers(filters=flt):  # running ones
        try:
            api.kill(c["Id"])
        except docker.errors.APIError:
            pass  # it exited (or was removed) meanwhile
    left: list[str] = []
    for c in api.containers(all=True, filters=flt):
        try:
            api.wait(c["Id"], timeout=10, condition="removed")
        except docker.errors.NotFound:
            continue  # removed before the wait began
        except Exception:  # noqa: BLE001 - still there after 10 s (or the wait failed): remove it
            try:
                api.remove_container(c["Id"], force=True)
            except docker.errors.NotFound:
                continue
            left.append(next(iter(c.get("Names") or []), c["Id"]).lstrip("/"))
    return left


def returncode(rc: int | None) -> int | None:
    """A copy's exit status as the harness reads a process's: 128+N from the container is -N."""
    return None if rc is None else engine.exit_code(rc)


def start_error(rc: int | None, log: str) -> str | None:
    """Why a copy's container never ran its COMMAND, in the words of the engine (a ``docker:``
    line) or of its init (``[FATAL tini ...] exec X failed``), or None: only a status of
    :data:`START_FAILED` or :data:`NOT_RUN` whose log begins so."""
    if rc not in (START_FAILED, *NOT_RUN):
        return None
    try:
        with open(log, errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return None
    first = next((line for line in head.splitlines() if line.strip()), "")
    first = first.strip()
    return first if first.startswith(("docker:", "[FATAL tini")) else None


__all__ = ["LABEL_ATTEMPT", "check", "client_env", "container_name", "mounts", "returncode", "start_error", "stop",
           "wrap"]
