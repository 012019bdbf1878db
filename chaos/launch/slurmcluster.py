"""A private Slurm cluster on this host: ``munged``, ``slurmctld`` and ``slurmd`` under one root.

Why: a fresh CI machine has no Slurm, yet Slurm is where large training runs are queued,
preempted and requeued. Debian's ``slurm-wlm`` and ``munge`` run a one-node cluster as
root in seconds, given a configuration that keeps every file of theirs under one
directory and off the host's own ``/etc/slurm`` and ``/run/munge``:

- ``munged`` with its own key (1 KiB from ``os.urandom``, mode 0400), socket, pid, log
  and seed files under ``ROOT/munge`` (``--force``: munged wants its socket directory
  traversable by all; this one is root's alone, as only root submits here);
- ``slurm.conf`` at ``ROOT/slurm.conf``: this host's name as ``SlurmctldHost`` and as its
  one node, ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none`` (no cgroups
  needed), free TCP ports, state and spool dirs, pid and log files under ``ROOT``, no
  accounting, ``PlugStackConfig=/dev/null``;
- the client commands (``sbatch``, ``srun``, ``scontrol``) find it through
  ``SLURM_CONF=ROOT/slurm.conf`` (:meth:`PrivateSlurm.env`).

Who calls what: ``chaos slurm start | status | stop`` (:mod:`chaos.cli.commands.slurm`)
and the tests, which claim their cluster's root with the clean-up ``"slurm"``
(:func:`stop_cluster_at`) so that ``chaos clean`` stops the cluster of a killed session. :meth:`PrivateSlurm.stop` cancels every job, waits for their steps to end,
stops the daemons, kills any process still holding a file under the root (a
``slurmstepd`` whose daemon died first) and deletes the root: nothing is left. Against a
real cluster none of this runs: the user's own ``SLURM_CONF`` and ``sbatch`` are used.
The root must be a private directory of this user reached without links
(``chaos.trustedpath``): the daemons run as root from what is there.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from chaos import trustedpath
from chaos.launch.ports import UNIX_PATH_MAX, free_port
from faults import Unsupported
from faults.process import alive, read_pidfile

DEFAULT_ROOT = "/run/chaos-slurm"
DAEMONS = ("slurmd", "slurmctld", "munged")  # the order they are stopped in
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")
KILL_WAIT_S = 5  # KillWait: seconds between a job's SIGTERM and its SIGKILL (preemption, cancel, requeue)


class SlurmUnavailable(Unsupported):
    """No private Slurm cluster can be started or reached here; the reason is one line."""


def default_root() -> Path:
    """Where ``chaos slurm start`` keeps its cluster (``CHAOS_SLURM_ROOT`` overrides)."""
    return Path(os.environ.get("CHAOS_SLURM_ROOT", DEFAULT_ROOT))


def can_start() -> tuple[bool, str]:
    """(possible, reason): root, and Debian's ``slurm-wlm`` and ``munge`` binaries on PATH."""
    if os.geteuid() != 0:
        return False, "starting slurmctld, slurmd and munged needs root"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return False, f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge)"
    return True, "ok"


class PrivateSlurm:
    """A one-node Slurm cluster of our own under ``root``: start, inspect, stop, and leave nothing."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(os.path.abspath(root if root is not None else default_root()))
        self.conf = self.root / "slurm.conf"
        self.munge = self.root / "munge"
        self.munge_socket = self.munge / "munge.socket.2"
        self.pidfiles = {"munged": self.munge / "munged.pid", "slurmctld": self.root / "slurmctld.pid",
                         "slurmd": self.root / "slurmd.pid"}
        self.logs = {"munged": self.munge / "munged.log", "slurmctld": self.root / "log" / "slurmctld.log",
                     "slurmd": self.root / "log" / "slurmd.log"}

    def env(self) -> dict[str, str]:
        """The environment the client commands need to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def pids(self) -> dict[str, int]:
        """The daemons alive now: a pidfile's pid whose process runs that binary as root."""
        out = {}
        for name, pidfile in self.pidfiles.items():
            pid = read_pidfile(pidfile)
            if pid is None:
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
                uid = os.stat(f"/proc/{pid}").st_uid
            except OSError:
                continue
            if comm == name and uid == 0:
                out[name] = pid
        return out

    def command(self, *argv: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **self.env()}, stdin=subprocess.DEVNULL)

    def running(self) -> bool:
        """Every daemon alive, and the node answers as idle, mixed or allocated."""
        if set(self.pids()) != set(DAEMONS):
            return False
        try:
            state = self.command("sinfo", "-h", "-o", "%T", timeout_s=10).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            return False
        return bool(state) and all(s.rstrip("*~#") in ("idle", "mixed", "allocated", "completing") for s in state)

    def start(self, timeout_s: float = 60.0) -> PrivateSlurm:
        """Make the root, the key and the configuration, start the three daemons, wait for an idle node."""
        ok, why = can_start()
        if not ok:
            raise SlurmUnavailable(why)
        if len(os.fsencode(str(self.munge_socket))) > UNIX_PATH_MAX:
            raise SlurmUnavailable(f"root {self.root} is too long for munged's socket path "
                                   f"({len(os.fsencode(str(self.munge_socket)))} bytes > {UNIX_PATH_MAX}): choose a shorter --root")
        if self.running():
            return self
        if self.pids():
            self.stop()  # half a cluster (a daemon died): start again from nothing
        self.root.parent.mkdir(parents=True, exist_ok=True)
        try:
            trustedpath.private_dir(str(self.root))
        except trustedpath.Untrusted as exc:
            raise SlurmUnavailable(f"refusing the Slurm root: {exc}") from None
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(mode=0o700, exist_ok=True)
        key = self.munge / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
        self.conf.write_text(self.conf_text())
        try:
            self._daemon(["munged", f"--key-file={key}", f"--socket={self.munge_socket}",
                          f"--pid-file={self.pidfiles['munged']}", f"--log-file={self.logs['munged']}",
                          f"--seed-file={self.munge / 'munged.seed'}",
                          "--force"], "munged")  # --force: its socket dir is private to root, on purpose
            self._daemon(["slurmctld", "-f", str(self.conf)], "slurmctld")
            self._daemon(["slurmd", "-f", str(self.conf)], "slurmd")
            started = time.monotonic()
            while not self.running():
                missing = set(DAEMONS) - set(self.pids())
                waited = time.monotonic() - started
                if waited > timeout_s or (missing and waited > 5):  # a daemon that is gone after 5 s died
                    raise SlurmUnavailable(self._why_not(missing, timeout_s))
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def conf_text(self) -> str:
        """``slurm.conf`` for a one-node cluster on this host, every path under the root."""
        host = socket.gethostname().split(".")[0]
        cpus = os.cpu_count() or 1
        r = self.root
        return "\n".join([
            "# written by chaos slurm start: a private one-node cluster; chaos slurm stop removes it",
            "ClusterName=chaos",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={self.pidfiles['slurmctld']}",
            f"SlurmdPidFile={self.pidfiles['slurmd']}",
            f"SlurmctldLogFile={self.logs['slurmctld']}",
            f"SlurmdLogFile={self.logs['slurmd']}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmUser=root",
            "SlurmdUser=root",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "PlugStackConfig=/dev/null",
            f"KillWait={KILL_WAIT_S}",
            f"NodeName={host} CPUs={cpus} State=UNKNOWN",
            f"PartitionName=chaos Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

    def _daemon(self, argv: list[str], name: str) -> None:
        """Start one daemon (each detaches itself); its failure to start is the error, with its log's tail."""
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                              env={**os.environ, **self.env()}, start_new_session=True)
        if done.returncode != 0:
            said = (done.stderr.strip() or self._tail(name)).splitlines()[-2:]
            raise SlurmUnavailable(f"{name} exited with status {done.returncode}: {' | '.join(said)}")

    def _tail(self, name: str) -> str:
        try:
            return "\n".join(self.logs[name].read_text(errors="replace").strip().splitlines()[-3:])
        except OSError:
            return "(no log)"

    def _why_not(self, missing: set[str], timeout_s: float) -> str:
        if missing:
            name = next(n for n in DAEMONS if n in missing)
            return f"{name} died after starting: {' | '.join(self._tail(name).splitlines())}"
        return f"the node did not come up idle within {timeout_s:.0f} s: {' | '.join(self._tail('slurmd').splitlines())}"

    def status(self) -> dict[str, Any]:
        running = self.running()
        out: dict[str, Any] = {"root": str(self.root), "conf": str(self.conf), "running": running, "pids": self.pids()}
        if running:
            out["nodes"] = self.command("sinfo", "-h", "-o", "%N %T %c").stdout.split("\n")[0].strip()
            out["jobs"] = len([ln for ln in self.command("squeue", "-h", "-o", "%i").stdout.splitlines() if ln.strip()])
        return out

    def stop(self, timeout_s: float = 30.0, remove: bool = True) -> dict[str, Any]:
        """Cancel every job, stop the daemons, kill what still holds a file of the root, delete the root
        (unless not ``remove``: the sweep deletes a root it verified itself)."""
        done: dict[str, Any] = {"root": str(self.root), "stopped": {}}
        pids = self.pids()
        if "slurmctld" in pids:
            try:
                self.command("scancel", "--full", "--user=root", timeout_s=10)
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline and self.command("squeue", "-h", "-o", "%i", timeout_s=10).stdout.strip():
                    time.sleep(0.3)
            except (OSError, subprocess.TimeoutExpired) as exc:
                done["cancel_error"] = str(exc)
        for name in DAEMONS:
            pid = pids.get(name)
            if pid is None:
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and alive(pid):
                time.sleep(0.1)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
            done["stopped"][name] = pid
        done["killed"] = self._kill_holders()
        if remove and self.root.exists():
            why = self._remove_root()
            if why:
                done["not_removed"] = why
        return done

    def _kill_holders(self) -> list[int]:
        """SIGKILL every other process whose cwd or an open file is under the root (a stray slurmstepd)."""
        prefix, killed = str(self.root) + "/", []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                links = [os.readlink(f"/proc/{entry}/cwd")]
                links += [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
            except OSError:
                continue
            if any(link == str(self.root) or link.startswith(prefix) for link in links):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                    killed.append(int(entry))
                except ProcessLookupError:
                    pass
        return killed

    def _remove_root(self) -> str:
        """Delete the root relative to its parent's descriptor, reached without links; why not, or ""."""
        parent, name = os.path.split(str(self.root))
        try:
            os.close(trustedpath.open_dir(str(self.root)))
            parent_fd = trustedpath.open_dir(parent, own_last=False)
        except (trustedpath.Untrusted, FileNotFoundError) as exc:
            return f"{self.root} left in place: {exc}"
        try:
            trustedpath.remove_tree(parent_fd, name)
            return ""
        finally:
            os.close(parent_fd)


def stop_cluster_at(root: str) -> dict[str, Any]:
    """Stop the private cluster under ``root`` whose starter is gone.

    Called by ``chaos.scratch``'s sweep (the clean-up ``"slurm"``, claimed with
    ``claim_cleanup`` by whoever started a cluster in a root of its own: the tests) when that
    process was killed: jobs cancelled, daemons stopped, holders killed. The sweep itself
    then removes the root it has verified.
    """
    return PrivateSlurm(root).stop(remove=False)
