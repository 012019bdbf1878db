"""Launch one attempt of a job: its command once, or N copies with torchrun's environment.

Called by ``explore.py`` for every attempt of every run. Each copy (each rank, or the
one ``torchrun`` process) gets its own session and process group, its output in a log
file of the point's scratch root, and ``CHAOS_JOB_MARK`` in its environment, so
everything it started — torchrun's workers start their own sessions — is found and
SIGKILLed when the attempt ends, times out, or the harness is interrupted. Like
torchrun's agent, when one rank fails the others are stopped at once.

The poll loop also answers the requests a rank of an armed point leaves in the trace
directory (``inproc.py``): *halt* (a corruption or power-loss point fired: every copy
is SIGKILLed at once, torchrun's agent with its workers, so nothing restarts before the
harness has edited {out}) and *term* (SIGTERM to every copy's main process, to torchrun
itself for a torchrun COMMAND, which forwards it to its workers; then up to ``--grace``
seconds for them to exit, and SIGKILL for whatever is left) and *net* (a network cut:
the rank's link down, ``netcut.cut``; the copies go on for up to ``--net-hold``
seconds, failing by themselves or SIGKILLed when the hold is over, and the link is
back up before the attempt returns; once one copy has failed in the cut, the others
get ``NET_SETTLE_S`` to fail by themselves — they wait in the same collective — before
they are stopped as above) and *stop* (the rank has sent itself SIGSTOP: the rest of the
job runs on until a copy fails by itself, nothing of it can run any more, or it has been
silent for the stop's limit; then every copy is SIGKILLed, ``chaos.nemesis.stop``).

An interrupt (``cancel``) ends every running attempt at its next poll, marks it
``interrupted`` and starts no other (``Cancelled``); ``Interrupt`` is the
KeyboardInterrupt ``cli_job``'s handler raises for SIGINT and SIGTERM alike, and
``shield`` keeps a second signal from cutting the last clean-up short.

With a ``lab`` (``faults.network.NetworkLab``, made by ``explore.py`` per run chain)
each copy of ``--ranks N`` runs inside its rank's network namespace, with
``MASTER_ADDR`` = rank 0's lab address (``netcut.in_netns``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.errors import ChaosError, ConfigError
from chaos.launch import containernet, containers, preload, reaper, silence, spares, zygote
from chaos.launch.answers import answer
from chaos.launch.output import log_cause
from chaos.launch.ports import free_port
from chaos.model import jobspec as S
from chaos.nemesis import diskfull, family, netcut, restart, stop
from chaos.scratch import cache_root
from faults import shim
from faults.errors import Unsupported

if TYPE_CHECKING:
    from faults.network import NetworkLab

    Lab = NetworkLab | containernet.ContainerNetwork  # a run chain's network: namespaces, or the engine's (docker)

BOOT_DIR = str(Path(__file__).resolve().parents[1] / "target" / "job" / "boot")  # the job target's boot path
_cancelled = threading.Event()  # set by cancel(): no attempt starts, running ones end (an interrupt)
_shielded = threading.Event()  # set by shield(): a clean-up runs that a signal must not cut short
HALT_SETTLE_S = 5.0  # a halted point whose family waits (a swap's other rank's file): how long, at most
HALT_READY_POLL_S = 0.025  # while it waits, how often it asks whether the file is there
NET_SETTLE_S = 1.0  # in a network cut, after one copy failed, how long the others get to fail by themselves
ARMED_POLL_S = 0.002  # an armed point's rank leaves a request file and waits: look often (10 ms after 1 s)
FROZEN_POLL_S = 0.05  # once a stop point's process stopped: how often /proc is read for what can still run
IDLE_POLL_S = 0.05    # otherwise the loop wakes when a copy exits; this bounds the deadline / cancel checks


@dataclass
class AttemptOutcome:
    """How one attempt ended. ``returncodes`` per copy (negative: killed by that signal)."""

    attempt: int
    argv: list[str]
    returncodes: list[int | None] = field(default_factory=list)
    timed_out: bool = False
    hung: float | None = None  # --hang-timeout: stopped after this many seconds with no sign of life (silence.py)
    seconds: float = 0.0
    logs: list[str] = field(default_factory=list)
    leftovers: list[int] = field(default_factory=list)  # pids still alive after the attempt, then killed
    stopped: list[int] = field(default_factory=list)  # copies the harness stopped (another failed, or timeout)
    halted: dict[str, Any] | None = None  # a halt request answered: which rank, after which event
    term: dict[str, Any] | None = None    # a term request answered: SIGTERM sent, who exited within the grace
    net: dict[str, Any] | None = None     # a net request answered: the cut, the hold, how each copy ended
    node: dict[str, Any] | None = None    # a node point answered (--nodes, nodes.py): the loss or cut, each agent's end
    stop: dict[str, Any] | None = None    # a stop point's process stopped itself: where, how the attempt ended
    fill: dict[str, Any] | None = None    # a disk filled at a step (disk:stepS:full): in use, the size set, free after
    restart: dict[str, Any] | None = None  # a rank's container restarted in place by the engine (nemesis.restart)
    # the built-in linger=S: the other copies ran on for up to S seconds once one failed (``stopped``: those
    # still running after it, SIGKILLed)
    lingered: float | None = None
    slurm: dict[str, Any] | None = None   # --launcher sbatch (sbatch.py): the Slurm job, its run, a sched point's action
    prestarted: bool = False  # its copies were spares started ahead, held at the gate until it began
    forked: bool = False  # its copies were forked by the exploration's zygote (zygote.py), modules loaded
    interrupted: bool = False  # its copies were stopped because the exploration was interrupted (``cancel``)
    materialized: bool = False  # rebuilt from the fault-free trace, never run (``chaos.run.materialize``)
    containers: list[str] | None = None  # --launcher docker: each copy's container (``containers.py``)
    containers_removed: list[str] = field(default_factory=list)  # of those, the ones still there after the attempt

    @property
    def ok(self) -> bool:
        return (not self.timed_out and self.hung is None and self.halted is None and not self.interrupted
                and all(rc == 0 for rc in self.returncodes))

    @property
    def describe(self) -> str:
        if self.interrupted:
            return "stopped by the harness: the run was interrupted"
        if self.stop is not None:
            return stop.describe(self.stop)
        if self.timed_out:
            return "timed out"
        if self.hung is not None:
            return silence.describe(self.hung)
        if self.halted is not None:
            return f"stopped by the harness right after rank {self.halted.get('rank')}'s event {self.halted.get('ord')}"
        if self.net is not None:
            return netcut.describe(self.net)
        if self.term is not None:
            t = self.term
            head = f"SIGTERM at rank {t['rank']}'s step {t['step']}: "
            if t["killed_after_grace"]:
                who = ", ".join(f"copy {i}" for i in t["killed_after_grace"]) if len(self.returncodes) > 1 else "it"
                return head + f"still running after the {t['grace_s']:g} s grace, SIGKILLed ({who})"
            codes = sorted({rc for rc in self.returncodes if rc is not None})
            how = " / ".join(f"killed by {signal.Signals(-c).name}" if c < 0 else f"exited {c}" for c in codes)
            return head + f"{how} within the {t['grace_s']:g} s grace"
        ended = self._ended()
        if self.lingered is not None:
            ended += f" (the others ran on for up to {self.lingered:g} s first, as a launcher's monitor interval allows)"
        what = (self.slurm or {}).get("what")
        return f"{what}: {ended}" if what else ended

    def _ended(self) -> str:
        """How the copies ended: exited 0, which copy exited or was killed by what."""
        bad = [(i, rc) for i, rc in enumerate(self.returncodes) if rc != 0 and i not in self.stopped]
        if not bad:
            return "stopped by the harness" if self.stopped else "exited 0"
        parts = []
        for i, rc in bad:
            what = f"killed by {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exited {rc}"
            parts.append(f"copy {i} {what}" if len(self.returncodes) > 1 else what)
        return ", ".join(parts)

    def tail(self, chars: int = 1500) -> str:
        """The end of the output of the copies that failed by themselves (else of every copy)."""
        failed = [log for i, log in enumerate(self.logs)
                  if i < len(self.returncodes) and self.returncodes[i] != 0 and i not in self.stopped]
        out = []
        for log in failed or self.logs:
            try:
                text = Path(log).read_text(errors="replace")
            except OSError:
                continue
            if text.strip():
                out.append(text[-chars:])
        return "\n".join(out)[-chars:]

    def to_dict(self) -> dict[str, Any]:
        d = {"attempt": self.attempt, "outcome": self.describe, "returncodes": self.returncodes,
             "timed_out": self.timed_out, "seconds": round(self.seconds, 3), "leftovers": self.leftovers}
        if self.hung is not None:
            d["hung_s"] = self.hung
        if self.halted is not None:
            d["halted"] = self.halted
        if self.term is not None:
            d["term"] = self.term
        if self.net is not None:
            d["net"] = self.net
        if self.node is not None:
            d["node"] = self.node
        if self.stop is not None:
            d["stop"] = self.stop
        if self.fill is not None:
            d["fill"] = self.fill
        if self.restart is not None:
            d["restart"] = self.restart
        if self.lingered is not None:
            d["lingered_s"] = self.lingered
        if self.slurm is not None:
            d["slurm"] = self.slurm
        if self.prestarted:
            d["prestarted"] = True
        if self.forked:
            d["forked"] = True
        if self.materialized:
            d["materialized"] = True
        if self.containers is not None:
            d["containers"] = self.containers
        if self.containers_removed:
            d["containers_removed"] = self.containers_removed
        if self.interrupted:
            d["interrupted"] = True
        return d


class _Exits:
    """Wakes the poll loop the moment a copy exits (a pidfd per copy, Linux >= 5.3), instead of
    at its next tick: a pure-Python job's attempt lasts a few tens of milliseconds, and a fixed
    10 ms tick cost each attempt 5 ms on average. Where pidfds are missing it just sleeps."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}  # pid -> pidfd

    def watch(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            self.fds[proc.pid] = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pass  # no pidfds here: wait() sleeps its timeout

    def wait(self, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
        live = [self.fds[p.pid] for p in procs if p.returncode is None and p.pid in self.fds]
        if len(live) < sum(1 for p in procs if p.returncode is None):
            time.sleep(timeout)
            return
        select.select(live, [], [], timeout)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def job_env(job: S.JobSpec, out: str, trace_dir: str, tmp: str, mark: str, attempt: int,
            point: S.Point | None) -> dict[str, str]:
    """The environment every copy of an attempt shares (the boot path's contract)."""
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("CHAOS_JOB_") or key in (S.PROBE_FILE_ENV, shim.ENV_CONF):
            del env[key]
    if "chaosio" in env.get("LD_PRELOAD", ""):  # a harness run inside a traced job: not its tracer
        env["LD_PRELOAD"] = " ".join(p for p in re.split(r"[:\s]+", env["LD_PRELOAD"]) if p and "chaosio" not in p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOT_DIR, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = tmp  # the job's scratch (and torchrun's) stays in the point's root
    env[S.ENV_TMP] = tmp  # each traced rank moves to its own folder in it (inproc.install)
    env.setdefault("OMP_NUM_THREADS", "1")
    env[S.ENV_OUT] = out
    env[S.ENV_TRACE_DIR] = trace_dir
    env[S.ENV_MARK] = mark
    env[S.ENV_ATTEMPT] = str(attempt)
    if job.torchrun:
        env[S.ENV_RANKS_ONLY] = "1"
    if job.step_regex:
        env[S.ENV_STEP_REGEX] = job.step_regex
    if job.loss_regex:
        env[S.ENV_LOSS_REGEX] = job.loss_regex
    if point is not None and point.attempt == attempt and point.in_rank:  # (a second fault's: attempt 1)
        armed = point.env()
        if job.torchrun and attempt > 0:  # torchrun relaunched: its workers' attempt is TORCHRUN_STRIDE x it
            armed["attempt"] = S.TORCHRUN_STRIDE * attempt
        env[S.ENV_POINT] = json.dumps(armed)
    if (job.torchrun and attempt == 0 and point is not None and point.then is not None
            and not family.families()[point.family].restarts_torchrun):
        env[S.ENV_POINT_THEN] = json.dumps(point.then.env())  # fired by the workers of the agent's first restart
    if job.import_events:  # the tracer skips those whose modules were loaded before it started
        env[S.ENV_IMPORT_EVENTS] = json.dumps([[n, list(mods)] for n, mods in job.import_events])
    lib = native_tracer(job, os.path.dirname(os.path.dirname(os.path.abspath(trace_dir))))
    if lib is not None:
        env["LD_PRELOAD"] = " ".join(p for p in (lib, env.get("LD_PRELOAD")) if p)
    return env


def native_tracer(job: S.JobSpec, root: str) -> str | None:
    """The native tracer's library for ``job``'s attempts (``faults.shim``: from the user's cache,
    else built in the exploration ``root``); None with ``--no-native-trace`` or where it cannot be
    built (the reason: :func:`native_tracer_problem`)."""
    return _native_library(job, root)[0]


def native_tracer_problem(job: S.JobSpec, root: str) -> str | None:
    """Why ``job``'s native writes go untraced, or None where the native tracer is on."""
    return _native_library(job, root)[1]


def _native_library(job: S.JobSpec, root: str) -> tuple[str | None, str | None]:
    """(library, None), (None, why it cannot be built), or (None, None) with --no-native-trace."""
    if not job.native_trace:
        return None, None
    if job.image is not None:
        return None, ("the native tracer is built against this host's C library, which --image's containers do "
                      "not have, so it is not preloaded there")
    try:
        return shim.build(os.path.join(root, "shim"), cache=os.path.join(cache_root(), "native")), None
    except Unsupported as e:
        return None, str(e)


def requests(trace_dir: str, name: str) -> list[dict[str, Any]]:
    """The requests of one kind ranks left in ``trace_dir`` (``inproc.JobInterposer._request``).

    Read by every launcher's watch loop that answers a rank: :func:`run_attempt` (halt, term,
    net), ``nodes.run_attempt`` (a node point's request) and ``sbatch.run_attempts`` (sched)."""
    found = []
    for entry in sorted(os.listdir(trace_dir)):
        if entry.startswith(name + "-") and entry.endswith(".json"):
            try:
                with open(os.path.join(trace_dir, entry)) as f:
                    found.append(json.load(f))
            except (OSError, ValueError):
                continue
    return found


def _send_term(procs: list[subprocess.Popen[bytes]], trace_dir: str, req: dict[str, Any],
               grace_s: float) -> dict[str, Any]:
    """SIGTERM to every copy's main process (torchrun forwards it), then tell the waiting rank."""
    sent = []
    for i, p in enumerate(procs):
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                sent.append(i)
            except ProcessLookupError:
                pass
    answer(trace_dir, S.TERM_SENT, {"sent_to": sent})
    return {"signal": "SIGTERM", "rank": req.get("rank"), "step": req.get("step"), "grace_s": grace_s,
            "sent_to": sent, "exited_within_grace": [], "killed_after_grace": []}


def attempt_mark(mark: str, attempt: int) -> str:
    """The ``CHAOS_JOB_MARK`` of one attempt: its clean-up never finds the next one's spare."""
    return f"{mark}#attempt{attempt}"


def _plan(job: S.JobSpec, out: str, scratch: str, attempt: int, point: S.Point | None, mark: str,
          lab: Lab | None, port: int) -> list[spares.Copy]:
    """Every copy of an attempt exactly as it is started (its folders made)."""
    trace_dir = os.path.join(scratch, "trace")
    tmp = os.path.join(scratch, "tmp")
    logs_dir = os.path.join(scratch, "logs")
    for d in (trace_dir, tmp, logs_dir):
        os.makedirs(d, exist_ok=True)
    argv = job.argv(out, resume=attempt > 0)
    base = job_env(job, out, trace_dir, tmp, mark, attempt, point)
    base[S.ENV_PYCACHE] = os.path.join(_exploration(scratch), "pycache")  # one per exploration
    if job.preload_modules:
        base[S.ENV_PRELOAD] = ",".join(job.preload_modules)
    copies = job.ranks if job.ranks is not None else 1
    in_lab = lab is not None and job.ranks is not None
    plan = []
    for rank in range(copies):
        env = dict(base)
        if job.ranks is not None:
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(copies),
                       LOCAL_WORLD_SIZE=str(copies), GROUP_RANK="0", ROLE_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       TORCHELASTIC_RESTART_COUNT=str(attempt))
            if in_lab:
                env.update(lab.rank_env(rank, port))  # type: ignore[union-attr]
        elif not job.torchrun:
            env[S.ENV_RANK] = "0"
        if job.launcher == "docker":  # the copy's docker run client in its place (containers.py)
            network = lab.run_options(rank) if in_lab else None  # type: ignore[union-attr]
            cmd, env = containers.wrap(argv, env, job.cwd, _exploration(scratch), mark, rank, job.image, network)
        else:
            cmd = netcut.in_netns(lab, rank, argv) if in_lab else argv  # type: ignore[arg-type]
        plan.append(spares.Copy(tuple(cmd), tuple(sorted(env.items())),
                                os.path.join(logs_dir, f"attempt{attempt}-copy{rank}.log"), job.cwd))
    return plan


def begin_zygote(job: S.JobSpec, root: str) -> bool:
    """Start the zygote that forks this exploration's attempts (``zygote.py``; one per rank for
    ``--ranks N``), without waiting for its preload; whether one was started. Called by ``explore``
    as soon as the first fault-free run said what to preload (``job.preload_modules``), so its
    imports overlap the second one; :func:`zygote_note` then waits for it. A run in a network lab
    (a network-cut point's, the second fault-free run where cuts are explored) starts its copies
    inside the lab, never from a zygote (``run_attempt``)."""
    names = job.preload_modules or job.zygote_preload
    if not names or not can_prestart(job) or job.nodes:
        return False  # (a --nodes job's attempts start on its simulated nodes: nodes.run_attempt)
    scratch = os.path.join(root, "zygote")
    os.makedirs(os.path.join(scratch, "out"), exist_ok=True)
    templates = _plan(job, os.path.join(scratch, "out"), scratch, 1, None, scratch, None, free_port())
    if not job.preload_modules:  # zygote only: it checks that its imports set what the job had set
        extra = {S.ENV_PRELOAD: ",".join(names), S.ENV_ZYGOTE_ENV: json.dumps(dict(job.zygote_env))}
        templates = [spares.Copy(t.argv, tuple(sorted((dict(t.env) | extra).items())), t.log, t.cwd)
                     for t in templates]
    logs = [os.path.join(scratch, "zygote.log" if len(templates) == 1 else f"zygote-copy{i}.log")
            for i in range(len(templates))]
    zygote.begin(root, templates, logs)
    return True


def zygote_note(job: S.JobSpec, root: str) -> str | None:
    """Wait for the exploration's zygote (:func:`begin_zygote`); a note for the user: what it does,
    or why there is none although modules are preloaded (None: none was started)."""
    if not zygote.started(root):
        return None
    names = job.preload_modules or job.zygote_preload
    why = zygote.ready(root)
    if why is not None:
        return f"attempts start as fresh interpreters, not forked from a zygote: {why}"
    if not job.preload_modules:
        return (f"attempts are forked from one interpreter that imported {preload.shown(names)} once (a zygote): "
                f"the job had set {', '.join(k for k, _ in job.zygote_env[:5])} by its first file event, and "
                "importing them set exactly that (--no-preload: off)")
    who = "one interpreter per rank" if job.ranks is not None else "one interpreter"
    return (f"attempts are forked from {who} that imported the preloaded modules once (a zygote), "
            "each with its own session, folder, environment and arguments (--no-preload: off)")


def _preloads(job: S.JobSpec) -> bool:
    """Whether ``job``'s attempts take preloaded modules, and so may fork from the zygote. The
    fault-free runs do not (their ``job`` names none): they run as a fresh interpreter would,
    the second too while the zygote already starts beside it (``explore.reference``)."""
    return bool(job.preload_modules or job.zygote_preload)


def _exploration(scratch: str) -> str:
    """The exploration's scratch root, from one run chain's folder in it (its zygote's key)."""
    return os.path.dirname(os.path.abspath(scratch))


def can_prestart(job: S.JobSpec, lab: Lab | None = None) -> bool:
    """Whether an attempt's copies may be started ahead of it (``spares.py`` says when)."""
    return (lab is None and not job.torchrun and job.launcher == "subprocess"
            and spares.is_python(job.argv("", resume=False)[0]))


def prestart(job: S.JobSpec, out: str, scratch: str, attempt: int, point: S.Point | None, mark: str,
             lab: Lab | None = None) -> bool:
    """Start attempt ``attempt``'s copies now, held at the gate until ``run_attempt`` takes them.

    Called by ``explore.py`` while another attempt runs; False (nothing started) where
    ``can_prestart`` says no or the exploration is being interrupted.
    """
    if _cancelled.is_set() or not can_prestart(job, lab) or (_preloads(job) and zygote.serves(_exploration(scratch))):
        return False  # with a zygote, a fork at the attempt's start is cheaper than a spare importing beside it
    port = free_port()
    spares.start(scratch, attempt, _plan(job, out, scratch, attempt, point, attempt_mark(mark, attempt), lab, port),
                 port)
    return True


def run_attempt(job: S.JobSpec, out: str, scratch: str, attempt: int, point: S.Point | None,
                mark: str, lab: Lab | None = None) -> AttemptOutcome:
    """Run attempt ``attempt`` to its end (or ``job.timeout_s``); nothing of it survives the call.

    ``lab``: each copy of ``--ranks N`` runs in its rank's namespace of it (a net point cuts there).
    An ``AttemptLauncher`` (``chaos.launch.protocol``); a ``--nodes`` job's is ``nodes.run_attempt``.
    """
    mark = attempt_mark(mark, attempt)
    trace_dir = os.path.join(scratch, "trace")
    argv = job.argv(out, resume=attempt > 0)
    port = spares.port_of(scratch, attempt) or free_port()
    if isinstance(lab, containernet.ContainerNetwork):
        lab.mark = mark  # a cut disconnects this attempt's container of the rank
    plan = _plan(job, out, scratch, attempt, point, mark, lab, port)
    outcome = AttemptOutcome(attempt, argv)
    outcome.logs = [c.log for c in plan]
    docker = job.launcher == "docker"
    if docker:
        outcome.containers = [containers.container_name(mark, i) for i in range(len(plan))]
    procs: list[subprocess.Popen[bytes]] = []
    if _cancelled.is_set():
        raise Cancelled("the exploration was interrupted: no attempt is started")
    in_lab = lab is not None and job.ranks is not None
    if in_lab and not docker and not netcut.command_exists(argv[0], job.cwd, dict(plan[0].env).get("PATH")):
        raise ConfigError(f"cannot start COMMAND {argv[0]!r}: No such file or directory")
    held_out = False
    exits = _Exits()
    warm = spares.take(scratch, attempt, plan)
    outcome.prestarted = warm is not None
    root = _exploration(scratch)
    started = time.monotonic()
    try:
        for i, c in enumerate(plan):
            if warm is not None:
                proc = warm[i]
            elif (forked := None if in_lab or not _preloads(job) else zygote.spawn(root, c)) is not None:
                proc = forked  # type: ignore[assignment]
                outcome.forked = True
            else:
                with open(c.log, "wb") as fh:
                    proc = subprocess.Popen(list(c.argv), cwd=c.cwd, env=dict(c.env), stdin=subprocess.DEVNULL,
                                            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
            reaper.track(proc, mark, marked=True)
            procs.append(proc)
            exits.watch(proc)
        deadline = started + job.timeout_s
        armed = point is not None and attempt == point.attempt and (
            point.mode in S.HALT_MODES or point.mode in ("term", "net", "stop", "restart")
            or point.mode == "diskfull" and point.step is not None)
        grace_end: float | None = None
        hold_end: float | None = None
        linger_end: float | None = None
        halted_at = next_ready = 0.0
        ready: Callable[[S.Point, str, str], bool] | None = None
        settle_end: float | None = None
        quiet = None if job.hang_timeout_s is None else silence.Silence(job.hang_timeout_s, trace_dir, outcome.logs, started)
        stop_quiet: silence.Silence | None = None  # a stop point's: the rest of the job's silence since the stop
        stop_ended = "exited"
        next_frozen = 0.0
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if armed and point is not None:
                if point.mode in S.HALT_MODES and (outcome.halted is not None
                                                   or (halt := requests(trace_dir, S.HALT_REQUEST))):
                    if outcome.halted is None:
                        outcome.halted = halt[0]
                        halted_at = time.monotonic()
                        ready = family.families()[point.family].halt_ready  # type: ignore[attr-defined]
                    if time.monotonic() >= next_ready:
                        if _halt_settled(outcome.halted, ready, point, out, scratch, halted_at, codes):
                            break  # every copy is killed below, at once
                        next_ready = time.monotonic() + HALT_READY_POLL_S  # reading traces takes CPU the others need
                if point.mode == "term" and outcome.term is None and (req := requests(trace_dir, S.TERM_REQUEST)):
                    grace = point.grace_s if point.grace_s is not None else job.grace_s
                    outcome.term = _send_term(procs, trace_dir, req[0], grace)
                    grace_end = time.monotonic() + grace
                if point.mode == "net" and outcome.net is None and (req := requests(trace_dir, S.NET_REQUEST)):
                    outcome.net = netcut.cut(lab if in_lab else None, req[0], job.net_hold_s, trace_dir, out)
                    if "down" in outcome.net:
                        hold_end = time.monotonic() + job.net_hold_s
                if point.mode == "diskfull" and outcome.fill is None and (req := requests(trace_dir, S.FILL_REQUEST)):
                    outcome.fill = diskfull.fill(out, int(point.size or 0), req[0], trace_dir)
                if (point.mode == "restart" and outcome.restart is None
                        and (req := requests(trace_dir, S.RESTART_REQUEST))):
                    outcome.restart = restart.carry_out(req[0], outcome.containers or [], point, trace_dir)
                if point.mode == "stop" and outcome.stop is None and (req := requests(trace_dir, S.STOP_REQUEST)):
                    outcome.stop = stop.begin(req[0], job)
                    stop_quiet = silence.Silence(outcome.stop["silence_s"], trace_dir, outcome.logs, time.monotonic())
            failed = any(c not in (None, 0) for c in codes)
            if stop_quiet is not None and not failed:  # (set with outcome.stop, once its rank stopped)
                now = time.monotonic()
                if now >= next_frozen:
                    next_frozen = now + FROZEN_POLL_S
                    if stop.frozen(outcome.stop.get("pid"), [p.pid for p in procs], mark):  # type: ignore[union-attr]
                        # a copy that failed by itself since the poll above is gone from /proc too: it, not
                        # the freeze, ended the attempt
                        stop_ended = "failed" if any(p.poll() not in (None, 0) for p in procs) else "frozen"
                        break  # nothing of the attempt can run: every copy is killed below
                if stop_quiet.hung(now) is not None:
                    stop_ended = "silent"
                    break
            if grace_end is not None:
                if time.monotonic() > grace_end:
                    break  # the grace is over: SIGKILL below
            elif hold_end is not None:
                if time.monotonic() > hold_end:
                    held_out = True
                    break  # the partition lasted the hold: SIGKILL below
                if failed:
                    # the other copies wait in the same collective: a moment to raise by themselves
                    settle_end = settle_end or time.monotonic() + NET_SETTLE_S
                    if time.monotonic() > settle_end:
                        break
            elif failed:
                linger = point.linger_s if point is not None and attempt == point.attempt else 0.0
                if linger and linger_end is None:  # the built-in linger=S: a launcher's monitor interval
                    linger_end = time.monotonic() + linger
                    outcome.lingered = linger
                if linger_end is None or time.monotonic() > linger_end:
                    stop_ended = "failed"
                    break  # one rank failed: stop the others, as torchrun's agent does
            if time.monotonic() > deadline:
                outcome.timed_out = True
                stop_ended = "timeout"
                break
            if (quiet is not None and grace_end is None and hold_end is None and outcome.halted is None
                    and outcome.stop is None and quiet.hung(time.monotonic()) is not None):
                outcome.hung = quiet.limit_s  # every copy is killed below
                break
            if _cancelled.is_set():
                outcome.interrupted = True
                break  # interrupted: every copy is killed below
            exits.wait(procs, IDLE_POLL_S if not armed else ARMED_POLL_S if time.monotonic() - started < 1.0
                       else 0.01)
    except FileNotFoundError as exc:
        raise ConfigError(f"cannot start COMMAND {argv[0]!r}: {exc.strerror}") from None
    finally:
        exits.close()
        outcome.stopped = [i for i, p in enumerate(procs) if p.poll() is None]
        if outcome.term is not None:
            outcome.term["killed_after_grace"] = list(outcome.stopped)
            outcome.term["exited_within_grace"] = [i for i in range(len(procs)) if i not in outcome.stopped]
        seen: set[str] = set()
        if docker:  # a client SIGKILLed below would leave its container running
            outcome.containers_removed = containers.stop(mark, seen)
        for p in procs:
            reaper.killpg(p.pid)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        outcome.leftovers = reaper.kill_marked(mark)
        if docker and outcome.containers is not None:
            # a client killed while the engine was still making its container (an interrupt as the attempt
            # started) leaves it made later, never started: wait for it where no container was seen
            unseen = [n for n, p in zip(outcome.containers, procs, strict=False)
                      if n not in seen and p.returncode is not None and p.returncode < 0]
            outcome.containers_removed += containers.stop(mark) + containers.settle(unseen)
        if outcome.net is not None:
            netcut.restore(lab if in_lab else None, outcome.net)  # every copy is gone: the link back up
        reaper.forget(*procs)
        outcome.seconds = time.monotonic() - started
    outcome.returncodes = [p.returncode for p in procs]
    if docker:
        for i, rc in enumerate(outcome.returncodes):
            if (why := containers.start_error(rc, outcome.logs[i])) is not None:
                raise ConfigError(f"--launcher docker: copy {i} of COMMAND {argv[0]!r} did not run: {why}")
        outcome.returncodes = [containers.returncode(rc) for rc in outcome.returncodes]
    if _cancelled.is_set() and not all(rc == 0 for rc in outcome.returncodes):
        outcome.interrupted = True  # cancel() may have killed the copies before the loop saw it
    if outcome.net is not None or outcome.stop is not None:  # how each copy that failed by itself said why
        causes = {i: netcut.clean_cause(log_cause(outcome.logs[i])) for i, rc in enumerate(outcome.returncodes)
                  if rc is not None and rc > 0 and i not in outcome.stopped}
        if outcome.net is not None:
            netcut.finish(outcome.net, outcome.returncodes, outcome.stopped, causes, held_out, outcome.timed_out)
        if outcome.stop is not None:
            stop.finish(outcome.stop, stop_ended, outcome.returncodes, outcome.stopped, causes)
    return outcome


def _halt_settled(halted: dict[str, Any], ready: Callable[[S.Point, str, str], bool] | None, point: S.Point,
                  out: str, scratch: str, since: float, codes: list[int | None]) -> bool:
    """Whether every copy may be stopped now that the point's rank halted: at once, unless the point's
    family waits for what it strikes (``AtRestFamily.halt_ready``: a swap, for the other rank's file).
    Then the other copies run on until it is there, every one of them has exited, or HALT_SETTLE_S
    has passed; ``halted`` records the wait (``settled_s``, and ``settled: false`` where it gave up)."""
    if ready is None:
        return True
    waited = time.monotonic() - since
    done = ready(point, out, scratch)
    # one process (torchrun's agent) holds every rank: only the deadline ends the wait
    others = sum(c is None for c in codes) > 1 if len(codes) > 1 else codes[0] is None
    if not done and waited < HALT_SETTLE_S and others:
        return False
    halted["settled_s"] = round(waited, 3)
    if not done:
        halted["settled"] = False
    return True


class Cancelled(ChaosError):
    """An attempt was to start after the exploration was interrupted (``cancel``)."""


class Interrupt(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread by the handler ``cli_job.main`` installs.

    A KeyboardInterrupt, so that every clean-up written for Ctrl-C (``explore``'s
    ``finally``, ``reference``'s ``cancel``) runs for a SIGTERM too; ``signum`` says which
    signal it was, for the record (``explore.Interrupted``) and the exit status, 128 + it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_of(exc: BaseException) -> int:
    """The signal behind an interrupt: ``Interrupt.signum``, else SIGINT (Python's own KeyboardInterrupt)."""
    return int(getattr(exc, "signum", signal.SIGINT))


@contextlib.contextmanager
def shield() -> Iterator[None]:
    """A clean-up no signal may cut short: ``explore``'s last steps (every copy killed, labs torn
    down, the scratch root removed). ``cli_job``'s signal handler asks :func:`shielded` and, while
    this is held, only notes the signal: the exploration ends as it was ending, and the exit
    status says a signal came."""
    _shielded.set()
    try:
        yield
    finally:
        _shielded.clear()


def shielded() -> bool:
    """Whether a :func:`shield` clean-up runs now (a signal handler defers to it)."""
    return _shielded.is_set()


def cancelled() -> bool:
    """Whether the exploration is being interrupted (``cancel`` called, ``uncancel`` not yet):
    ``explore`` records a point whose chain ran into it as interrupted instead of judging it."""
    return _cancelled.is_set()


def cancel() -> None:
    """Interrupted (Ctrl-C, an error): no attempt starts from now on (a point's chain would
    otherwise go on to its restart), running ones end, every copy is killed. ``uncancel``
    when the exploration has wound down."""
    _cancelled.set()
    kill_all()


def uncancel() -> None:
    _cancelled.clear()


def kill_all() -> None:
    """Every spare not used, and every copy of every attempt still running with what it started
    (Ctrl-C, harness crash): ``reaper.kill_all``, which reaps all the harness launched."""
    spares.drop_all()
    zygote.close_all()
    reaper.kill_all()
    containers.sweep()  # --launcher docker: any container of this process's attempts still on the engine
    containernet.sweep()  # ... and any network a run chain made for its network cuts (containernet.py)
