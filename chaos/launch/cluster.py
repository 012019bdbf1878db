"""Launch, supervise and restart real rank processes.

Ranks are forked from a multiprocessing *fork server* that preloaded torch and the
workload once, so a launch or a restart costs a fork (tens of ms), not a 2 s torch
import. All ranks of a launch start at once: the supervisor binds and listens on the
rendezvous store's port itself and hands that socket to rank 0 (``Attempt.launch``).
Each rank makes itself a process-group leader, so one ``killpg`` takes down a
rank together with any helper process it started. The supervisor restarts the whole
job from its latest checkpoint up to ``max_restarts`` times, the way
``torchrun --max-restarts`` does, and no rank outlives ``run`` — not on failure, not
on timeout, not on Ctrl-C.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from chaos.errors import HarnessError
from chaos.launch.ports import UNIX_PATH_MAX, free_port
from chaos.launch.reaper import forget, kill_all, kill_rank, signal_rank, track
from chaos.model.fault import PROCESS_SIGNALS, Fault
from chaos.nemesis.environment import Environment
from chaos.target.workload.device import rank_env as rank_device_env
from chaos.target.workload.spec import EXIT_CONFIG, EXIT_OK, RankSpec

_ctx: Any = None
# The fork server's socket is DIR/listener-XXXXXXXX in multiprocessing's temp dir DIR,
# here TMPDIR/chaos-pymp-XXXXXXXX (own_mp_temp_dir).
_LISTENER_TAIL, _PYMP_TAIL = 18, 20


def own_mp_temp_dir() -> None:
    """Give multiprocessing a temp dir that a killed harness does not leave behind, and that is
    short enough for the fork server's Unix socket.

    multiprocessing makes its own ``pymp-*`` dir (the socket's) under TMPDIR once per process
    and removes it at exit, so a SIGKILLed harness (a CI timeout) left one behind every time.
    Made here instead as a claimed scratch root (``chaos.scratch.make_root``): the next
    harness's sweep, or ``chaos clean``, removes it once its maker is dead, with the same
    checks as for any root. Under a deep TMPDIR (a CI workspace, pytest-xdist's ``popen-gwN``
    temp dirs) the socket's path would pass sun_path's limit and every launch fail with
    "AF_UNIX path too long": then it goes in a short system temp dir, as Python 3.13 does
    itself. Called by :func:`_context` before the server first starts, and by certify before
    it moves TMPDIR into its own scratch. A dir multiprocessing already made is kept where
    it fits; one that does not is replaced in multiprocessing's per-process config (``util.get_temp_dir``
    reads it there), with the same clean-up at exit."""
    from multiprocessing import process, util

    from chaos.errors import ConfigError
    from chaos.scratch import make_root

    config = process.current_process()._config
    current = config.get("tempdir")
    if current and len(os.fsencode(current)) + _LISTENER_TAIL <= UNIX_PATH_MAX:
        return
    base = tempfile.gettempdir()
    if len(os.fsencode(base)) + _PYMP_TAIL + _LISTENER_TAIL > UNIX_PATH_MAX:
        short = (d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK))
        base = next(short, None)  # type: ignore[arg-type]
        if base is None:
            return  # nowhere shorter: the launch's error names the cause
    try:
        made = make_root("chaos-pymp-", base)
    except ConfigError:
        return  # a temp dir the harness does not trust: multiprocessing makes its own, as before
    util.Finalize(None, shutil.rmtree, args=(made,), kwargs={"ignore_errors": True}, exitpriority=-100)
    config["tempdir"] = made


def _context() -> Any:
    global _ctx
    if _ctx is None:
        own_mp_temp_dir()
        ctx = mp.get_context("forkserver")
        # chaos.launch.cluster too: each rank unpickles its target from it, and would import it
        # (with chaos.nemesis.environment and chaos.plan.scenario, ~12 ms) at every start otherwise.
        ctx.set_forkserver_preload(["chaos.target.workload.preload", "chaos.launch.cluster"])
        _ctx = ctx
    return _ctx


def warm_up() -> None:
    """Start the fork server now (it imports torch once), e.g. while a golden run is looked up."""
    from multiprocessing import forkserver

    _context()
    forkserver.ensure_running()


@dataclass
class LaunchPlan:
    """One job: what every rank runs, and the faults the supervisor carries out."""

    world_size: int
    workload: dict[str, Any]
    log_dir: str
    checkpointer: str | None = None
    ckpt_options: dict[str, Any] = field(default_factory=dict)
    ckpt_root: str | None = None
    faults: list[Fault] = field(default_factory=list)
    max_restarts: int = 0
    backend: str = "gloo"
    hang_timeout_s: float = 60.0
    attempt_timeout_s: float = 900.0
    trace_io: bool = False  # trace every rank's checkpoint I/O even without an I/O fault
    scratch: str | None = None  # the scenario's scratch root: ranks keep their temp files below it
    # Called with (event, info) as the job goes: "attempt", "step", "save"; for live displays.
    progress: Callable[[str, dict[str, Any]], None] | None = None

    def wants_trace(self) -> bool:
        return self.trace_io or any(f.family in ("io", "powerloss") for f in self.faults)


@dataclass
class FiredFault:
    index: int
    spec: str
    kind: str
    attempt: int
    rank: int
    step: int | None
    signal: str | None
    pid: int | None
    t: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class AttemptResult:
    attempt: int
    outcome: str  # ok | rank_failed | hang | timeout | config_error
    exit_codes: dict[int, int | None]
    started: float
    ended: float
    fired: list[FiredFault] = field(default_factory=list)
    detail: str = ""
    world_size: int | None = None  # ranks launched in this attempt (fewer after a rank was lost for good)


@dataclass
class ClusterResult:
    attempts: list[AttemptResult]

    @property
    def completed(self) -> bool:
        return bool(self.attempts) and self.attempts[-1].outcome == "ok"

    @property
    def config_error(self) -> bool:
        return any(a.outcome == "config_error" for a in self.attempts)

    def fired(self) -> list[FiredFault]:
        return [f for a in self.attempts for f in a.fired]

    @property
    def final_world_size(self) -> int | None:
        """Ranks of the last attempt: the world a final load must use after an elastic shrink."""
        return self.attempts[-1].world_size if self.attempts else None

    def to_dict(self) -> dict[str, Any]:
        return {"attempts": [asdict(a) for a in self.attempts]}


def _tree_bytes(root: str | None) -> int:
    total = 0
    for dirpath, _, names in os.walk(root or "/nonexistent"):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def log_path(log_dir: str, rank: int, attempt: int | str) -> str:
    return str(Path(log_dir) / f"rank{rank}.attempt{attempt}.jsonl")


def trace_path(log_dir: str, rank: int, attempt: int | str) -> str:
    return str(Path(log_dir) / f"io-rank{rank}.attempt{attempt}.jsonl")


class Attempt:
    """Supervises one launch of all ranks until they all exit, one fails, or they hang.

    The shared attempt logic of both drivers (``chaos.launch.protocol``). Its driver makes one
    per launch, calls ``launch()`` once, then ``supervise()`` once, which returns with every
    rank reaped, whatever happened; ``pending_rest`` then holds the at-rest faults to apply
    before the next attempt (``Environment.after_attempt``). A driver whose ranks are not
    forked (``DockerAttempt``) overrides ``launch``, ``_start`` (one rank), ``_fire`` (one
    fault) and ``_kill_rest`` (stop and reap every rank, keep its exit code); its ``procs``
    need only ``pid``, ``sentinel``, ``is_alive``, ``join`` and ``exitcode``.
    """

    def __init__(self, plan: LaunchPlan, attempt: int, env: Environment, mode: str = "train") -> None:
        self.plan, self.attempt, self.env, self.mode = plan, attempt, env, mode
        self.procs: dict[int, Any] = {}
        self.conns: dict[int, Any] = {}
        self.codes: dict[int, int | None] = {}
        self.fired: list[FiredFault] = []
        self.pending_kills: list[tuple[float, int]] = []  # (deadline, rank): SIGTERM grace expiry
        self.pending_rest: list[Fault] = []  # corruption to apply once every rank is down
        self.barriers: dict[int, set[int]] = {}  # fault index -> ranks waiting at it
        self.started: float | None = None  # time.time() of the launch: the attempt's start

    def _mine(self) -> list[tuple[int, Fault]]:
        if self.mode != "train":
            return []
        return [(i, f) for i, f in enumerate(self.plan.faults) if f.attempt == self.attempt]

    def _spec(self, rank: int, port: int) -> RankSpec:
        plan = self.plan
        triggers, rules = [], []
        for i, f in self._mine():
            if f.family == "io" and f.rank == rank:
                rules += self.env.io_rules(f)
            elif f.family == "disk" and self.env.disk_mechanism == "interposer":
                rules += self.env.io_rules(f)
            elif f.family in ("process", "net") and f.rank == rank:
                triggers.append({"index": i, "step": f.step, "phase": f.param("phase")})
            elif f.family == "rest":
                # At rest means no save in flight: every rank settles first (an async save
                # acknowledged, every save's return logged, then a barrier), or which
                # checkpoint is "newest" is a race. Only rank 0 (or rank=) then fires.
                triggers.append({"index": i, "step": f.step, "phase": None, "settle": True,
                                 "fire": rank == (f.rank or 0)})
            elif f.family == "disk" and rank == (f.rank or 0):
                triggers.append({"index": i, "step": f.step, "phase": None})
            elif f.family == "powerloss":
                triggers.append({"index": i, "step": f.step, "phase": "save", "quiesce": True})
        addr, netns, env = self.env.rank_network(rank, port)
        env = {**env, **rank_device_env(plan.workload, rank)}  # device=cuda: this rank's one GPU
        traced = plan.wants_trace() or bool(rules)
        return RankSpec(
            rank=rank, world_size=plan.world_size, attempt=self.attempt, master_addr=addr,
            master_port=port, workload=plan.workload, log_path=log_path(plan.log_dir, rank, self.attempt),
            checkpointer=plan.checkpointer, ckpt_options=plan.ckpt_options, ckpt_root=plan.ckpt_root,
            backend=plan.backend, triggers=triggers, io_rules=rules,
            trace_path=trace_path(plan.log_dir, rank, self.attempt) if traced else None,
            trace_data=any(f.family == "powerloss" for _, f in self._mine()), netns=netns, env=env,
            mode=self.mode, scratch=plan.scratch,
        )

    def _start(self, rank: int, port: int, listener: socket.socket | None = None) -> None:
        ctx = _context()
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_rank_target, args=(self._spec(rank, port), child, listener), daemon=False)
        proc.start()
        child.close()
        track(proc, self.plan.scratch)
        self.procs[rank], self.conns[rank] = proc, parent

    def launch(self) -> None:
        """Start every rank at once, rank 0 with its rendezvous store's socket already listening.

        The supervisor binds and listens on the store's port itself and hands the socket
        to rank 0 (``TCPStore(master_listen_fd=...)``): a rank that connects before rank
        0's store runs waits in the socket's backlog instead of backing off, so no rank
        waits for another to start, and no other process can take the port in between.
        Ranks in their own network namespaces (``env.lab``) cannot share a socket bound
        here: there rank 0 starts first and the rest once it says its store listens.
        """
        self.started = time.time()
        if self.env.lab is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                listener.bind(("127.0.0.1", 0))
                listener.listen(max(128, 2 * self.plan.world_size))
                port = listener.getsockname()[1]
                for rank in range(self.plan.world_size):
                    self._start(rank, port, listener if rank == 0 else None)
            finally:
                listener.close()  # rank 0 holds its own copy
            return
        port = free_port()
        self._start(0, port)
        conn, proc = self.conns[0], self.procs[0]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not wait([conn, proc.sentinel], timeout=1.0):
                continue
            if conn.poll():
                try:
                    if conn.recv()[0] == "store_ready":
                        break
                except (EOFError, OSError):
                    pass
            if not proc.is_alive():
                break  # rank 0 died at start: supervise() records its exit
        for rank in range(1, self.plan.world_size):
            self._start(rank, port)

    def _record(self, index: int, rank: int | None, sig: str | None = None, detail: dict | None = None) -> None:
        fault = self.plan.faults[index]
        pid = self.procs[rank].pid if rank is not None else None
        self.fired.append(FiredFault(index, fault.spec(), fault.kind, self.attempt, rank if rank is not None else -1,
                                     fault.step, sig, pid, time.time(), dict(detail or {})))

    def _go(self, *ranks: int) -> None:
        for rank in ranks:
            if rank in self.conns:
                self.conns[rank].send(("go",))

    def _fire(self, rank: int, index: int) -> None:
        """Carry out fault ``index`` while ``rank`` waits at its trigger point."""
        fault = self.plan.faults[index]
        family = fault.family
        if family == "process":
            sig_name = PROCESS_SIGNALS[fault.kind]
            self._record(index, rank, sig_name)
            signal_rank(self.procs[rank].pid, getattr(signal, sig_name))
            if fault.kind == "term":
                grace = float(fault.param("grace", 5.0))
                self.pending_kills.append((time.monotonic() + grace, rank))
                self._go(rank)  # a rank that handles SIGTERM (preemption) may go on; let it
        elif family == "rest":
            self._record(index, rank, "SIGKILL", {"note": "every rank killed; files corrupted before the restart"})
            self.pending_rest.append(fault)
            for proc in self.procs.values():
                signal_rank(proc.pid, signal.SIGKILL)
        elif family == "disk":
            self._record(index, rank, None, self.env.fill_disk(fault))
            self._go(rank)
        elif family == "net":
            self._record(index, rank, None, self.env.link_down(rank))
            self._go(rank)
        elif family == "powerloss":
            waiting = self.barriers.setdefault(index, set())
            waiting.add(rank)
            if len(waiting) == self.plan.world_size:
                marks = self.env.mark_powerloss(index, lambda r: trace_path(self.plan.log_dir, r, self.attempt))
                self._record(index, None, None, marks)
                self._go(*sorted(waiting))

    def _kill_rest(self) -> None:
        for rank, proc in self.procs.items():
            if self.codes.get(rank) is None:
                kill_rank(proc.pid)
        for rank, proc in self.procs.items():
            proc.join(timeout=10)
            self.codes[rank] = proc.exitcode
            forget(proc)

    def _linger_s(self) -> float:
        """How long the survivors of a failed rank run on before the job is torn down.

        A real launcher notices a dead worker only at its next poll (torchrun's monitor
        interval), and until then the others go on: finish their part of a save, or
        block in a collective with the dead rank. A fault's ``linger=S`` gives them
        that time, so a rank that commits without the others does so every run, not
        when the teardown happens to be slow.
        """
        return max((float(self.plan.faults[f.index].param("linger", 0.0)) for f in self.fired), default=0.0)

    def _report(self, msg: tuple) -> None:
        """Rank 0's step and save reports, with the checkpoint root's growth as throughput."""
        assert self.plan.progress is not None
        if msg[0] == "hb":
            self.plan.progress("step", {"attempt": self.attempt, "step": msg[1]})
            return
        size = _tree_bytes(self.plan.ckpt_root)
        grown, self._last_bytes = max(0, size - getattr(self, "_last_bytes", 0)), size
        self.plan.progress("save", {"attempt": self.attempt, "step": msg[1], "seconds": msg[2],
                                    "mb_s": grown / 1e6 / msg[2] if msg[2] > 0 else None})

    def supervise(self) -> AttemptResult:
        started = self.started if self.started is not None else time.time()
        deadline = time.monotonic() + self.plan.attempt_timeout_s
        last_progress = time.monotonic()
        outcome, detail = "ok", ""
        linger_until: float | None = None  # once a rank failed: survivors run on until then
        try:
            while True:
                sentinels = {p.sentinel: r for r, p in self.procs.items() if self.codes.get(r) is None}
                conns = {c: r for r, c in self.conns.items()}
                for obj in wait(list(sentinels) + list(conns), timeout=0.25):
                    if obj in conns:
                        rank = conns[obj]
                        try:
                            msg = obj.recv()
                        except (EOFError, OSError):
                            self.conns.pop(rank, None)
                            continue
                        last_progress = time.monotonic()
                        if msg[0] == "fault":
                            self._fire(rank, msg[1])
                        elif rank == 0 and self.plan.progress is not None and msg[0] in ("hb", "save"):
                            self._report(msg)
                    else:
                        rank = sentinels[obj]
                        self.procs[rank].join()
                        self.codes[rank] = self.procs[rank].exitcode
                        forget(self.procs[rank])
                now = time.monotonic()
                for deadline_kill, rank in list(self.pending_kills):
                    if now >= deadline_kill:
                        self.pending_kills.remove((deadline_kill, rank))
                        if self.codes.get(rank) is None:
                            signal_rank(self.procs[rank].pid, signal.SIGKILL)
                failed = {r: c for r, c in self.codes.items() if c not in (None, EXIT_OK)}
                if failed and linger_until is None:
                    linger_until = now + self._linger_s()
                if failed and (now >= linger_until or len(self.codes) == len(self.procs)):
                    outcome = "config_error" if EXIT_CONFIG in failed.values() else "rank_failed"
                    detail = ", ".join(f"rank {r} exit {c}" for r, c in sorted(failed.items()))
                    break
                if len(self.codes) == self.plan.world_size and all(c == EXIT_OK for c in self.codes.values()):
                    break
                if now - last_progress > self.plan.hang_timeout_s:
                    outcome, detail = "hang", f"no rank made progress for {self.plan.hang_timeout_s:.0f} s"
                    break
                if now > deadline:
                    outcome, detail = "timeout", f"attempt exceeded {self.plan.attempt_timeout_s:.0f} s"
                    break
        finally:
            self._kill_rest()
            for conn in self.conns.values():
                conn.close()
        return AttemptResult(self.attempt, outcome, dict(sorted(self.codes.items())), started, time.time(),
                             self.fired, detail, self.plan.world_size)


def _rank_target(spec: RankSpec, conn: Any, listener: socket.socket | None = None) -> None:
    from chaos.target.workload.train import rank_entry

    rank_entry(spec, conn, listener)


VERIFY = "verify"


def verify(plan: LaunchPlan, env: Environment | None = None) -> AttemptResult:
    """After the job: a fresh launch that only loads the latest checkpoint and logs what it got."""
    env = env or Environment([], plan.world_size, plan.ckpt_root, plan.log_dir, 0)
    runner = Attempt(plan, VERIFY, env, mode="verify")  # type: ignore[arg-type]
    try:
        runner.launch()
        return runner.supervise()
    except KeyboardInterrupt:
        kill_all()
        raise


def _shrink(plan: LaunchPlan, result: AttemptResult) -> LaunchPlan:
    """Elastic restart: ranks killed with ``lost=true`` are gone for good, so the next
    attempt launches that many fewer ranks (renumbered 0..n-1, as torchrun's elastic
    agent does) and the checkpointer must load at the smaller world size."""
    lost = {f.rank for f in result.fired if plan.faults[f.index].param("lost", False) is True and f.rank >= 0}
    if not lost or len(lost) >= plan.world_size:
        return plan
    return replace(plan, world_size=plan.world_size - len(lost))


def run(plan: LaunchPlan, env: Environment | None = None) -> ClusterResult:
    """Run the job, restarting after a failed attempt up to ``plan.max_restarts`` times.

    ``env`` (set up by the caller, torn down by it) provides what the faults need; a
    plain one is made for a plan without such faults.
    """
    Path(plan.log_dir).mkdir(parents=True, exist_ok=True)
    env = env or Environment([], plan.world_size, plan.ckpt_root, plan.log_dir, 0)
    if hasattr(env, "bind"):  # an at-rest fault traces a fault-free load of this very plan (chaos.plan.loadtrace)
        from chaos.plan.loadtrace import trace_load

        env.bind(functools.partial(trace_load, plan, verify=verify, trace_path=trace_path, verify_kind=VERIFY))
    attempts: list[AttemptResult] = []
    world = plan
    try:
        for attempt in range(plan.max_restarts + 1):
            runner = Attempt(world, attempt, env)
            if plan.progress is not None:
                plan.progress("attempt", {"attempt": attempt})
            runner.launch()
            result = runner.supervise()
            logs = [log_path(plan.log_dir, r, attempt) for r in range(plan.world_size)]
            for done in env.after_attempt(attempt, runner.pending_rest, logs):
                index = next(i for i, f in enumerate(plan.faults) if f.spec() == done["spec"] and f.attempt == attempt)
                fired = next(f for f in result.fired if f.index == index)
                fired.detail["corruption"] = done
            attempts.append(result)
            if result.outcome in ("ok", "config_error"):
                break
            world = _shrink(world, result)
    except KeyboardInterrupt:
        kill_all()
        raise
    except OSError as exc:
        kill_all()
        raise HarnessError(f"could not run the ranks: {exc}") from exc
    return ClusterResult(attempts)
