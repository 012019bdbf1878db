"""The ``docker`` driver: every rank is a container, every process fault goes through the Docker SDK.

Teams run training in containers, and the faults they fear are container-level: a
node's container killed, frozen, or cut off the network. This driver runs the same
workload, checkpointers and oracles as the process driver (``chaos.launch.cluster``), with
the same result types, but each rank is a container on a bridge network made for the
scenario:

* **Image.** By default the empty image ``chaos-empty`` (``docker import`` of an empty
  tar, built by ``engine.ensure_image``) with the host's ``/usr``, ``/lib``, ``/lib64``,
  ``/bin``, ``/etc``, the Python install, the virtual environment and this project
  bind-mounted read-only — no registry needed. ``--image NAME`` runs a real image
  instead; it must have Python, torch and this package (``python3 -m chaos.launch.drivers.rank``).
* **Files.** The scenario's scratch root is bind-mounted read-write at the *same path*,
  so rank logs, I/O traces and the checkpoint root are where the process driver puts
  them: ``RunRecord`` and the oracles read them unchanged.
* **Supervisor link.** A rank cannot share a pipe with the supervisor, so it connects
  to a Unix socket in the scratch root (``d/cA.sock``) and speaks the same
  ``multiprocessing`` connection protocol as a forked rank: ``store_ready``,
  heartbeats, and ``("fault", i)`` at a trigger point, after which it blocks until the
  supervisor answers. A Unix socket lives on the file system, not the network, so a
  rank cut off the network still reaches its supervisor and a netdrop is recorded at
  its exact point.
* **Faults.** ``kill`` → ``container.kill(SIGKILL)``; ``term`` → ``SIGTERM`` (the rank
  runs under ``docker-init``, so it is not PID 1 and the signal acts), then ``SIGKILL``
  after ``grace``; ``stop`` → ``container.pause()`` (the cgroup freezer: a frozen rank,
  detected when its peers' collectives time out or by the hang timeout); ``netdrop`` →
  ``network.disconnect(force=True)``, reconnected before the container is removed if it
  still runs; ``restart`` → ``container.restart(timeout=T)`` (docker only: the engine
  brings the container back with a fresh rank the job no longer has).
  Every fired fault is a ``FiredFault`` naming the container and the SDK call.
* **Cleanup.** Containers of an attempt are removed when it ends; the network and
  anything left labelled with the scenario's token when the scenario ends — on
  success, failure, timeout, Ctrl-C, and at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import select
import socket
import sys
import time
import uuid
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from chaos.errors import HarnessError
from chaos.launch import cluster
from chaos.launch.drivers import engine
from chaos.launch.ports import UNIX_PATH_MAX
from chaos.model.fault import PROCESS_SIGNALS, Fault
from chaos.nemesis.environment import Environment
from chaos.target.workload.spec import SCENARIO_ENV

STORE_PORT = 29500  # each container has its own network namespace: a fixed port is free
CONNECT_TIMEOUT_S = 180.0  # a container start plus a cold torch import, on a loaded 2-core box


class ContainerProc:
    """A rank container seen through the process interface ``cluster.Attempt`` supervises.

    ``pid`` is the host pid of the container's init; ``sentinel`` a pidfd of it that
    becomes readable when the container's init exits, so ``multiprocessing``'s ``wait``
    watches containers and supervisor connections together.
    """

    def __init__(self, container: Any, rank: int) -> None:
        self.container, self.rank, self.name = container, rank, container.name
        self._exitcode: int | None = None
        container.reload()
        self.pid: int = int(container.attrs["State"].get("Pid") or 0)
        self.sentinel: int
        try:
            if not self.pid:
                raise ProcessLookupError
            self.sentinel = os.pidfd_open(self.pid)
        except (ProcessLookupError, OSError, AttributeError):
            r, w = os.pipe()  # already exited: a sentinel that is readable at once
            os.close(w)
            self.sentinel = r

    def is_alive(self) -> bool:
        if self._exitcode is not None:
            return False
        return not select.select([self.sentinel], [], [], 0)[0]

    def join(self, timeout: float | None = None) -> None:
        if self._exitcode is not None:
            return
        try:
            status = self.container.wait(timeout=timeout if timeout is not None else 120)
            self._exitcode = engine.exit_code(int(status.get("StatusCode", -1)))
        except Exception:  # noqa: BLE001 - still running after timeout, or the engine lost it
            pass

    @property
    def exitcode(self) -> int | None:
        return self._exitcode

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.sentinel)


class DockerAttempt(cluster.Attempt):
    """One launch of all ranks as containers; supervision is the process driver's own loop."""

    def __init__(self, plan: cluster.LaunchPlan, attempt: int | str, env: Environment, owner: DockerCluster,
                 mode: str = "train") -> None:
        super().__init__(plan, attempt, env, mode)  # type: ignore[arg-type]
        self.owner = owner
        self.ctl = owner.ctl_dir / f"c{attempt}.sock"
        self.listener: socket.socket | None = None
        self.disconnected: set[int] = set()

    def _name(self, rank: int) -> str:
        return f"chaos-{self.owner.token}-a{self.attempt}-r{rank}"

    def _start(self, rank: int, port: int) -> None:
        spec = self._spec(rank, port)
        spec.master_addr, spec.master_port = self._name(0), STORE_PORT
        spec.env = {**spec.env, "GLOO_SOCKET_IFNAME": "eth0"}
        spec_path = self.owner.ctl_dir / f"spec-a{self.attempt}-r{rank}.json"
        spec_path.write_text(json.dumps(dataclasses.asdict(spec)))
        container = self.owner.start_container(self._name(rank), [str(spec_path), str(self.ctl)])
        proc = ContainerProc(container, rank)
        self.procs[rank] = proc
        self.owner.procs.append(proc)

    def _accept(self, deadline: float) -> None:
        """Accept every rank's connection (each says ``("hello", rank)`` once it has imported
        torch), or stop early when a rank's container exited before saying hello."""
        assert self.listener is not None
        fresh: list[Connection] = []
        want = set(self.procs)
        while time.monotonic() < deadline:
            if want <= set(self.conns):
                return
            if any(not self.procs[r].is_alive() for r in want - set(self.conns)):
                return  # it died before connecting: supervise() records its exit
            for obj in wait([self.listener, *fresh], timeout=0.5):
                if obj is self.listener:
                    sock, _ = self.listener.accept()
                    fresh.append(Connection(sock.detach()))
                    continue
                fresh.remove(obj)
                try:
                    msg = obj.recv()
                except (EOFError, OSError):
                    continue
                if msg[0] == "hello":
                    self.conns[int(msg[1])] = obj
        raise HarnessError(f"rank containers did not connect to {self.ctl} within {CONNECT_TIMEOUT_S:.0f} s")

    def _store_ready(self, deadline: float) -> None:
        """Wait for rank 0's ``store_ready`` (or its exit); later messages are left for supervise()."""
        conn, proc = self.conns.get(0), self.procs[0]
        while conn is not None and time.monotonic() < deadline:
            if not wait([conn, proc.sentinel], timeout=0.5):
                continue
            if conn.poll():
                try:
                    if conn.recv()[0] == "store_ready":
                        return
                except (EOFError, OSError):
                    return
            elif not proc.is_alive():
                return

    def launch(self) -> None:
        """Start every rank's container at once, let each import torch and say hello, then
        release rank 0, wait for its store, and release the rest: the rendezvous then takes
        milliseconds, as with forked ranks, however slow the containers were to start."""
        if len(str(self.ctl)) > UNIX_PATH_MAX:
            raise HarnessError(f"scratch root too deep for a Unix socket ({len(str(self.ctl))} chars): {self.ctl}")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.ctl))
        self.listener.listen(64)
        for rank in range(self.plan.world_size):
            self._start(rank, STORE_PORT)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        self._accept(deadline)
        self._go(0)
        self._store_ready(deadline)
        self._go(*range(1, self.plan.world_size))

    def _record_sdk(self, index: int, rank: int, sig: str | None, call: str, **extra: Any) -> None:
        self._record(index, rank, sig, {"driver": "docker", "container": self.procs[rank].name, "sdk": call, **extra})

    def _fire(self, rank: int, index: int) -> None:
        """Carry out fault ``index`` on ``rank``'s container while the rank waits at its trigger."""
        fault: Fault = self.plan.faults[index]
        proc: ContainerProc = self.procs[rank]
        if fault.kind == "restart":
            timeout = int(float(fault.param("timeout", 0)))
            self._record_sdk(index, rank, "SIGTERM" if timeout else "SIGKILL", f"container.restart(timeout={timeout})")
            proc.container.restart(timeout=timeout)
            # The container runs again, a fresh rank process that waits to be released; the
            # job has lost its rank: the peers' collectives fail, and the job restarts.
            self.procs[rank] = ContainerProc(proc.container, rank)
            self.owner.procs.append(self.procs[rank])
            self.fired[-1].detail["restarted_pid"] = self.procs[rank].pid
            proc.close()
        elif fault.family == "process":
            sig_name = PROCESS_SIGNALS[fault.kind]
            if fault.kind == "stop":
                self._record_sdk(index, rank, sig_name, "container.pause()", mechanism="cgroup freezer")
                proc.container.pause()
                return
            self._record_sdk(index, rank, sig_name, f"container.kill({sig_name!r})")
            proc.container.kill(signal=sig_name)
            if fault.kind == "term":
                grace = float(fault.param("grace", 5.0))
                self.pending_kills.append((time.monotonic() + grace, rank))
                self._go(rank)
        elif fault.family == "net":
            self._record_sdk(index, rank, None, "network.disconnect(force=True)", network=self.owner.network.name)
            self.owner.network.disconnect(proc.container, force=True)
            self.disconnected.add(rank)
            self._go(rank)
        elif fault.family == "rest":
            self._record_sdk(index, rank, "SIGKILL", "container.kill('SIGKILL') for every rank",
                             note="every rank killed; files corrupted before the restart")
            self.pending_rest.append(fault)
            for other in self.procs.values():
                with contextlib.suppress(Exception):
                    other.container.kill(signal="SIGKILL")
        else:
            super()._fire(rank, index)

    def _kill_rest(self) -> None:
        """Reconnect, unpause and kill what still runs, collect exit codes and output, remove containers."""
        for rank, proc in self.procs.items():
            if rank in self.disconnected and proc.is_alive():
                with contextlib.suppress(Exception):
                    self.owner.network.connect(proc.container)
                    for fired in self.fired:
                        if fired.rank == rank and fired.kind == "netdrop":
                            fired.detail["reconnected"] = True
            if proc.is_alive():
                with contextlib.suppress(Exception):
                    proc.container.reload()
                    if proc.container.status == "paused":
                        proc.container.unpause()
                with contextlib.suppress(Exception):
                    proc.container.kill(signal="SIGKILL")
        for rank, proc in self.procs.items():
            proc.join(timeout=30)
            self.codes[rank] = proc.exitcode
            self._save_output(rank, proc)
            with contextlib.suppress(Exception):
                proc.container.remove(force=True, v=True)
            proc.close()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            with contextlib.suppress(OSError):
                self.ctl.unlink()

    def _save_output(self, rank: int, proc: ContainerProc) -> None:
        """What the container printed before the rank redirected its output (e.g. an import error)."""
        try:
            text = proc.container.logs(stdout=True, stderr=True).decode(errors="replace")
        except Exception:  # noqa: BLE001 - best effort
            return
        if text.strip():
            out = cluster.log_path(self.plan.log_dir, rank, self.attempt) + ".container"
            Path(out).write_text(text)


class DockerCluster:
    """The docker driver for one scenario: its network, its containers, and their removal.

    Use as a context manager around ``run`` and ``verify``; leaving it removes every
    container, network and volume labelled with this scenario's token.
    """

    name = "docker"

    def __init__(self, scratch: str | os.PathLike[str], image: str | None = None) -> None:
        self.scratch = Path(scratch).resolve()
        self.image_arg = image
        self.token = uuid.uuid4().hex[:10]
        self.ctl_dir = self.scratch / "d"
        self.client: Any = None
        self.network: Any = None
        self.image = image or engine.EMPTY_IMAGE
        self.procs: list[ContainerProc] = []
        self.removed: dict[str, list[str]] = {}

    # -- lifetime ----------------------------------------------------------------------
    def __enter__(self) -> DockerCluster:
        self.client = engine.connect()
        atexit.register(self.close)
        try:
            if self.image_arg is None:
                engine.ensure_image(self.client)
            else:
                import docker

                try:
                    self.client.images.get(self.image)
                except docker.errors.ImageNotFound:
                    raise engine.EngineUnavailable(f"image {self.image!r} is not on the engine "
                                                   "(no registry to pull from here)") from None
            (self.ctl_dir / "home").mkdir(parents=True, exist_ok=True)
            (self.ctl_dir / "tmp").mkdir(exist_ok=True)
            self.network = self.client.networks.create(f"chaos-{self.token}", driver="bridge",
                                                       labels={engine.LABEL: self.token})
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.client is None:
            return
        with contextlib.suppress(Exception):
            removed = engine.remove_labelled(self.client, engine.LABEL, self.token)
            for key, names in removed.items():
                self.removed.setdefault(key, []).extend(names)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    # -- containers ----------------------------------------------------------------------
    def start_container(self, name: str, args: list[str], command: list[str] | None = None) -> Any:
        """Start one rank container: same paths as on the host, on the scenario's network.

        ``command`` replaces the rank entry point (tests start a plain ``sleep``)."""
        scratch = str(self.scratch)
        volumes = {scratch: {"bind": scratch, "mode": "rw"}}
        if self.image_arg is None:
            volumes.update({p: {"bind": p, "mode": "ro"} for p in engine.host_mounts()})
            argv = [sys.executable, "-m", "chaos.launch.drivers.rank", *args]
        else:
            argv = ["python3", "-m", "chaos.launch.drivers.rank", *args]
        # SCENARIO_ENV: the rank's own process carries the scenario's mark as its children
        # do, so a sweep after a killed harness (chaos.scratch) finds it from the host
        env = {SCENARIO_ENV: scratch, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
               "HOME": str(self.ctl_dir / "home"), "TMPDIR": str(self.ctl_dir / "tmp"),
               "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"])}
        return self.client.containers.run(
            self.image, list(command) if command is not None else argv, name=name, hostname=name, detach=True,
            init=True, volumes=volumes, network=self.network.name, environment=env, working_dir=scratch,
            labels={engine.LABEL: self.token, "chaos.rank": name.rsplit("-r", 1)[-1]})

    # -- the driver interface ------------------------------------------------------------
    @staticmethod
    def env_faults(faults: list[Fault]) -> list[Fault]:
        """Faults the shared Environment must prepare: a netdrop here is a network
        disconnect, not a namespace link, so the host needs no network lab for it."""
        return [f for f in faults if f.family != "net"]

    def run(self, plan: cluster.LaunchPlan, env: Environment) -> cluster.ClusterResult:
        """Run the job, restarting after a failed attempt, exactly as ``cluster.run`` does."""
        Path(plan.log_dir).mkdir(parents=True, exist_ok=True)
        attempts: list[cluster.AttemptResult] = []
        world = plan
        shrink = getattr(cluster, "_shrink", None)
        for attempt in range(plan.max_restarts + 1):
            runner = DockerAttempt(world, attempt, env, self)
            if plan.progress is not None:
                plan.progress("attempt", {"attempt": attempt})
            try:
                runner.launch()
            except BaseException:
                runner._kill_rest()
                raise
            result = runner.supervise()
            logs = [cluster.log_path(plan.log_dir, r, attempt) for r in range(world.world_size)]
            for done in env.after_attempt(attempt, runner.pending_rest, logs):
                index = next(i for i, f in enumerate(plan.faults) if f.spec() == done["spec"] and f.attempt == attempt)
                fired = next(f for f in result.fired if f.index == index)
                fired.detail["corruption"] = done
            attempts.append(result)
            if result.outcome in ("ok", "config_error"):
                break
            if shrink is not None:
                world = shrink(world, result)
        return cluster.ClusterResult(attempts)

    def verify(self, plan: cluster.LaunchPlan, env: Environment) -> cluster.AttemptResult:
        """A fresh launch (new containers) that only loads the latest checkpoint."""
        runner = DockerAttempt(plan, cluster.VERIFY, env, self, mode="verify")
        try:
            runner.launch()
        except BaseException:
            runner._kill_rest()
            raise
        return runner.supervise()

    def leftovers(self) -> dict[str, list[Any]]:
        """What of this scenario is still there: containers, networks, volumes, container processes."""
        out: dict[str, list[Any]] = {"containers": [], "networks": [], "volumes": []}
        if self.client is not None:
            flt = {"label": f"{engine.LABEL}={self.token}"}
            with contextlib.suppress(Exception):
                out["containers"] = [c.name for c in self.client.containers.list(all=True, filters=flt)]
                out["networks"] = [n.name for n in self.client.networks.list(filters=flt)]
                out["volumes"] = [v.name for v in self.client.volumes.list(filters=flt)]
        from faults.process import alive

        out["processes"] = sorted(p.pid for p in self.procs if p.pid and alive(p.pid))
        return out

    def hygiene(self, found: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """The runner's hygiene, with container-side facts: the pids rank logs name are
        container-namespace pids (meaningless on the host), so processes are judged by the
        containers' host pids instead."""
        return {**found, **self.leftovers()}
