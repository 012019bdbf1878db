"""The Docker engine the container driver talks to: a reachable one, or a private ``dockerd``.

No Docker daemon runs on a fresh CI machine, but Debian's ``docker.io`` starts one as
root in seconds with its own socket, data and exec roots. ``PrivateEngine`` does exactly
that, under one directory it owns, so a test session (or ``chaos engine start``) gets an
engine that shares nothing with a system daemon and leaves nothing behind when stopped:

    dockerd --iptables=false --storage-driver=vfs --bridge=none --host unix://ROOT/docker.sock
            --data-root ROOT/data --exec-root ROOT/exec --pidfile ROOT/dockerd.pid

``--bridge=none`` keeps it off the host's ``docker0`` (another engine may own it);
``--iptables=false`` keeps it off the host firewall. No registry is reachable either, so
``ensure_image`` builds the driver's default image itself: ``docker import`` of an empty
tar. Containers of that image run the host's Python and virtual environment, bind-mounted
read-only (see ``chaos.launch.drivers.docker``).

Which engine ``connect`` picks: ``DOCKER_HOST`` if set; else a private engine running under
``CHAOS_ENGINE_ROOT`` (default ``/run/chaos-engine``, where ``chaos engine start`` puts it:
a place other users cannot make first, since the daemon runs as root from what is there);
else the system socket ``/var/run/docker.sock``. None reachable raises ``EngineUnavailable``,
which the runner reports as a *skipped* scenario with the reason.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from chaos import trustedpath
from faults import Unsupported
from faults.process import alive, read_pidfile, uids

DEFAULT_ROOT = "/run/chaos-engine"
EMPTY_IMAGE = "chaos-empty:latest"
LABEL = "chaos.harness"  # every container, network and volume the driver makes carries it
SYSTEM_SOCKET = "/var/run/docker.sock"
ENGINE_BINARIES = ("dockerd", "containerd", "runc", "docker-")  # /proc/PID/comm prefixes


class EngineUnavailable(Unsupported):
    """No Docker engine can be reached or started here; the reason is one line."""


def default_root() -> Path:
    """Where ``chaos engine start`` keeps its private engine (``CHAOS_ENGINE_ROOT`` overrides)."""
    return Path(os.environ.get("CHAOS_ENGINE_ROOT", DEFAULT_ROOT))


def can_start_engine() -> tuple[bool, str]:
    """(possible, reason): a private engine needs root, the docker SDK and a ``dockerd`` binary."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return False, "the docker SDK is not installed (pip install docker)"
    if os.geteuid() != 0:
        return False, "starting a private dockerd needs root"
    if shutil.which("dockerd") is None:
        return False, "no dockerd binary (apt-get install docker.io)"
    return True, "ok"


def _client(base_url: str, timeout: int = 60) -> Any:
    import docker

    return docker.DockerClient(base_url=base_url, timeout=timeout)


class PrivateEngine:
    """A ``dockerd`` of our own under ``root``: start, ping, stop, and remove every trace of it."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.socket = self.root / "docker.sock"
        self.pidfile = self.root / "dockerd.pid"
        self.logfile = self.root / "dockerd.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def pid(self) -> int | None:
        """The daemon's pid from its pidfile, if that process is alive and is this root's dockerd.

        A pidfile outlives its daemon, and the pid may since be anyone's (another user's
        process that ignores SIGTERM, say): only a ``dockerd`` of this uid started with
        ``--pidfile`` naming this very file is ever signalled.
        """
        pid = read_pidfile(self.pidfile)
        return pid if pid is not None and self._is_ours(pid) else None

    def _is_ours(self, pid: int) -> bool:
        """Whether ``pid`` runs ``dockerd`` as this uid with ``--pidfile`` this engine's pidfile."""
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return False
        me = os.geteuid()
        want = os.fsencode(str(self.pidfile))
        named = any(a == b"--pidfile" and b == want for a, b in zip(argv, argv[1:], strict=False)) or \
            b"--pidfile=" + want in argv
        return comm == "dockerd" and uids(pid) == (me, me) and named

    def running(self) -> bool:
        if self.pid() is None or not self.socket.exists():
            return False
        try:
            return bool(_client(self.url, timeout=5).ping())
        except Exception:  # noqa: BLE001 - any failure to answer means not usable
            return False

    def client(self) -> Any:
        return _client(self.url)

    def start(self, timeout_s: float = 60.0) -> PrivateEngine:
        """Start the daemon (detached, its own session) and wait until it answers a ping.

        The root must be a private directory of this user reached without links
        (``chaos.trustedpath``): dockerd runs as root from the data and config there.
        """
        ok, why = can_start_engine()
        if not ok:
            raise EngineUnavailable(why)
        if self.running():
            return self
        self.root.parent.mkdir(parents=True, exist_ok=True)
        try:
            trustedpath.private_dir(os.path.abspath(self.root))
        except trustedpath.Untrusted as exc:
            raise EngineUnavailable(f"refusing the engine root: {exc}") from None
        config = self.root / "daemon.json"
        config.write_text("{}\n")  # never the host's /etc/docker/daemon.json
        cmd = ["dockerd", "--iptables=false", "--ip-masq=false", "--bridge=none", "--storage-driver=vfs",
               "--host", self.url, "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
               "--pidfile", str(self.pidfile), "--config-file", str(config), "--log-level", "warn"]
        # The daemons' temp files stay in the root, removed with it: containerd writes
        # containerd.<pid>.stacks.log into its temp dir when it is told to dump its stacks,
        # which left one in the harness's /tmp after a test run (2026-12-07).
        tmp = self.root / "tmp"
        tmp.mkdir(mode=0o700, exist_ok=True)
        with open(self.logfile, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          start_new_session=True, env={**os.environ, "TMPDIR": str(tmp)})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.logfile.read_text(errors="replace").strip().splitlines()[-3:]
                raise EngineUnavailable(f"dockerd exited with status {self._proc.returncode}: {' | '.join(tail)}")
            if self.running():
                return self
            time.sleep(0.3)
        self.stop()
        raise EngineUnavailable(f"dockerd did not answer on {self.socket} within {timeout_s:.0f} s")

    def _processes(self) -> list[int]:
        """The engine's own processes still alive: dockerd, its containerd, shims, runc,
        proxies — an engine binary whose command line names our root. A shell that merely
        mentions the root (``bash -c "chaos engine stop --root ..."``) is never one of them."""
        pids, needle, me = [], os.fsencode(str(self.root)) + b"/", os.geteuid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/comm") as f:
                    comm = f.read().strip()
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if comm.startswith(ENGINE_BINARIES) and needle in cmdline and uids(entry) == (me, me):
                pids.append(int(entry))
        return [p for p in pids if alive(p)]

    def stop(self, remove: bool = True, timeout_s: float = 20.0) -> dict[str, Any]:
        """Remove our containers, networks and volumes, stop the daemon, then delete its root.

        Returns what was done; processes that survive SIGTERM get SIGKILL (only ours:
        processes whose command line names this engine's root).
        """
        done: dict[str, Any] = {"root": str(self.root)}
        if self.running():
            try:
                done["removed"] = remove_labelled(self.client())
            except Exception as exc:  # noqa: BLE001 - stopping goes on regardless
                done["remove_error"] = str(exc)
        pid = self.pid() or (self._proc.pid if self._proc is not None and self._proc.poll() is None else None)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and alive(pid):
                if self._proc is not None and self._proc.pid == pid:
                    self._proc.poll()
                time.sleep(0.2)
        for straggler in self._processes():
            try:
                os.kill(straggler, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self._proc = None
        done["stopped_pid"] = pid
        if remove and self.root.exists():
            why = _remove_root(self.root)
            if why:
                done["not_removed"] = why
        return done

    def status(self) -> dict[str, Any]:
        running = self.running()
        out: dict[str, Any] = {"root": str(self.root), "socket": str(self.socket), "pid": self.pid(),
                               "running": running}
        if running:
            client = self.client()
            out["version"] = client.version().get("Version")
            out["containers"] = len(client.containers.list(all=True, filters={"label": LABEL}))
            out["networks"] = len(client.networks.list(filters={"label": LABEL}))
        return out


def stop_engine_at(root: str) -> dict[str, Any]:
    """Stop the private engine under ``root`` whose starter is gone.

    Called by ``chaos.scratch``'s sweep (the clean-up ``"dockerd"`` claimed by the pytest
    plugin's ``docker_engine``) when the harness that started it was killed, on a root the
    sweep has verified: its containers, networks and volumes removed, the daemon and its
    helpers stopped. The sweep itself then unmounts and removes the root.
    """
    return PrivateEngine(root).stop(remove=False)


def _remove_root(root: Path) -> str:
    """Unmount what the daemon left under ``root`` (netns files, shm) and delete it; why not, or "".

    Only a root reached without links whose every component is root's or this user's
    (``chaos.trustedpath``): the mounts unmounted are those ``/proc/self/mountinfo`` lists
    under that path, and the tree goes relative to its parent's descriptor.
    """
    from faults.disk import unmount_all

    path = os.path.abspath(root)
    parent, name = os.path.split(path)
    try:
        os.close(trustedpath.open_dir(path))
        parent_fd = trustedpath.open_dir(parent, own_last=False)
    except (trustedpath.Untrusted, FileNotFoundError) as exc:
        return f"{path} left in place: {exc}"
    try:
        try:
            unmount_all(path, resolve=False)
        except OSError as exc:
            return f"{path} left in place: unmount failed ({exc})"
        trustedpath.remove_tree(parent_fd, name)
        return ""
    finally:
        os.close(parent_fd)


def remove_labelled(client: Any, label: str = LABEL, value: str | None = None) -> dict[str, list[str]]:
    """Force-remove every container, network and volume carrying ``label`` (``=value``)."""
    filters = {"label": f"{label}={value}" if value is not None else label}
    removed: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": []}
    for c in client.containers.list(all=True, filters=filters):
        try:
            if c.status == "paused":
                c.unpause()
        except Exception:  # noqa: BLE001 - removal below still forces it
            pass
        try:
            c.remove(force=True, v=True)
            removed["containers"].append(c.name)
        except Exception:  # noqa: BLE001 - already gone
            pass
    for n in client.networks.list(filters=filters):
        try:
            n.remove()
            removed["networks"].append(n.name)
        except Exception:  # noqa: BLE001
            pass
    for v in client.volumes.list(filters=filters):
        try:
            v.remove(force=True)
            removed["volumes"].append(v.name)
        except Exception:  # noqa: BLE001
            pass
    return removed


def connect() -> Any:
    """A client of the engine to use: ``DOCKER_HOST``, else the private engine, else the system socket."""
    return locate()[0]


def locate() -> tuple[Any, str]:
    """:func:`connect`'s client and the URL it reached (``DOCKER_HOST`` for a ``docker`` client
    process: ``chaos.launch.containers`` runs a job's copies through the CLI on the same engine)."""
    try:
        import docker
    except ImportError:
        raise EngineUnavailable("the docker SDK is not installed (pip install docker)") from None
    candidates: list[tuple[str, str, Any]] = []
    if os.environ.get("DOCKER_HOST"):
        candidates.append(("DOCKER_HOST", os.environ["DOCKER_HOST"], lambda: docker.from_env(timeout=60)))
    else:
        private = PrivateEngine()
        if private.socket.exists():
            candidates.append((str(private.socket), private.url, private.client))
        if os.path.exists(SYSTEM_SOCKET):
            candidates.append((SYSTEM_SOCKET, f"unix://{SYSTEM_SOCKET}", lambda: _client(f"unix://{SYSTEM_SOCKET}")))
    reasons = []
    for where, url, make in candidates:
        try:
            client = make()
            client.ping()
            return client, url
        except Exception as exc:  # noqa: BLE001 - try the next one, keep the reason
            reasons.append(f"{where}: {type(exc).__name__}")
    why = "; ".join(reasons) if reasons else "DOCKER_HOST is unset, no private engine and no system socket"
    raise EngineUnavailable(f"no Docker engine reachable ({why}); start one with `chaos engine start`")


def empty_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    return buf.getvalue()


def ensure_image(client: Any, name: str = EMPTY_IMAGE) -> str:
    """Make the empty image (``docker import`` of an empty tar) unless the engine has it."""
    import docker

    try:
        client.images.get(name)
        return name
    except docker.errors.ImageNotFound:
        pass
    repo, _, tag = name.partition(":")
    client.api.import_image_from_data(empty_tar(), repository=repo, tag=tag or "latest")
    client.images.get(name)
    return name


def describe(client: Any) -> str:
    """One line naming the engine, for logs and results."""
    info = client.version()
    return json.dumps({"version": info.get("Version"), "api": info.get("ApiVersion"),
                       "url": getattr(client.api, "base_url", "")})


def host_mounts() -> list[str]:
    """Host directories a container of the empty image needs, read-only, outermost first."""
    import chaos

    wanted = ["/usr", "/lib", "/lib64", "/bin", "/etc", sys.prefix, sys.base_prefix, sys.exec_prefix,
              str(Path(chaos.__file__).resolve().parent.parent)]
    out: list[str] = []
    for path in sorted({os.path.abspath(p) for p in wanted if os.path.exists(p)}, key=len):
        real = os.path.realpath(path)
        if any(real == o or real.startswith(o.rstrip("/") + "/") for o in out) and not os.path.islink(path):
            continue
        out.append(path)
    return out


def exit_code(status: int) -> int:
    """Docker's 128+N for a signal becomes -N, as multiprocessing reports a signalled process."""
    return -(status - 128) if 128 < status < 160 else status
