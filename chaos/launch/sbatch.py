"""Launch a job's attempt as a Slurm batch job (``chaos run --launcher sbatch -- COMMAND``).

Why: on a cluster the job is not a child of the harness; Slurm starts it, signals it,
requeues it and starts it again. This launcher submits the attempt with ``sbatch
--requeue`` (plus the user's ``--sbatch-opt`` options, e.g. ``--signal=B:USR1@30``) and
waits for the Slurm job to end, reading ``scontrol show job -o JOBID`` (a private cluster
has no accounting, so no ``sacct``). It uses whatever ``sbatch`` and ``SLURM_CONF`` the
environment has: a real cluster's, or a private one's (``chaos slurm start``); with no
``sbatch`` on PATH or no controller answering, :func:`check` refuses in one line.

The batch script is :mod:`chaos.launch.sbatchwrap` (run with ``-S -E``): each run of the
Slurm job is one attempt, numbered from ``SLURM_RESTART_COUNT``, its output in
``logs/attempt<A>-copy0.log`` and its status in ``slurm/rc-a<A>.json``. One call returns
every attempt the Slurm job ran (attempt 0 and Slurm's own reruns after a requeue), as
the usual :class:`~chaos.launch.job.AttemptOutcome` list; the first carries the Slurm
record (``slurm``: job id, final state, ``Restarts=``, the sched point's action). A kill
or an injected error fails the job like any exit; Slurm does not requeue a failed job, so
the harness restarts it as usual: a new batch job submitted for attempt 1.

At a ``sched`` point the armed rank leaves a ``sched-request`` in the trace directory; the
watch loop answers it through :mod:`chaos.nemesis.sched` (``begin``, then ``finish`` for a
preemption's requeue or a node's resume, ``release`` for a requeued job Slurm holds by its
BeginTime) and writes ``sched-done`` for the waiting rank. Slurm then restarts the job.

Called by ``explore.Run.attempt``; nothing of the job survives the call: on any exit
(error, timeout, interrupt) the job is cancelled (``scancel``) and waited for, a node the
point set down is resumed, and every process still carrying the attempt's
``CHAOS_JOB_MARK`` on this host is SIGKILLed. On a real cluster the scratch root
(``--scratch``) must be on a file system the compute nodes share, and the harness's Python
must exist at the same path there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any

from chaos.errors import ConfigError
from chaos.launch import job as launch
from chaos.launch import reaper
from chaos.launch.answers import answer
from chaos.model import jobspec as S
from chaos.nemesis import sched

WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sbatchwrap.py")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT")
STATE_POLL_S = 0.2    # how often Slurm is asked for the job's state
REQUEST_POLL_S = 0.005  # how often an armed rank's request is looked for (it waits for the answer)
QUEUE_SLACK_S = 120.0  # on top of --timeout per run: time for Slurm to schedule and reschedule
_TOKEN = re.compile(r"(\S+?)=(\S*)")


def slurm(*argv: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command with this environment's ``SLURM_CONF``; a hang or a missing binary
    is a failed command (status 124 / 127), never an exception."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]} did not answer in {timeout_s:g} s")
    except OSError as exc:
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: {exc.strerror}")


_answered: set[str] = set()  # the SLURM_CONF values whose controller answered (checked once each)


def check(flag: str = "--launcher sbatch", tools: tuple[str, ...] = ("sbatch", "scontrol", "scancel", "sinfo")) -> None:
    """ConfigError, one line naming ``flag``, unless ``tools`` are on PATH and a controller answers
    (asked once per ``SLURM_CONF`` and process: every attempt calls this). Called by
    :func:`run_attempts` and, before the fault-free runs, by ``cli.job`` for ``--executor slurm``."""
    conf = f"{os.environ.get('PATH')}|{os.environ.get('SLURM_CONF', '')}|{','.join(tools)}"
    if conf in _answered:
        return
    missing = [b for b in tools if shutil.which(b) is None]
    if missing:
        raise ConfigError(f"{flag}: {', '.join(missing)} not on PATH (install slurm-wlm's client "
                          "commands, or start a private cluster with chaos slurm start)")
    named = os.environ.get("SLURM_CONF")
    if named and not os.path.isfile(named):  # Slurm's own clients would retry reading it for a minute
        raise ConfigError(f"{flag}: SLURM_CONF={named} is not a file (a stopped private cluster's? start one with "
                          "chaos slurm start, or unset SLURM_CONF to use the host's configuration)")
    ping = slurm("scontrol", "ping", timeout_s=15)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        said = " ".join((ping.stdout + " " + ping.stderr).split())[:200]
        raise ConfigError(f"{flag}: no Slurm controller answers (scontrol ping: {said or 'no answer'}; "
                          f"SLURM_CONF={os.environ.get('SLURM_CONF', 'unset')})")
    _answered.add(conf)


def show_job(job_id: str) -> dict[str, str]:
    """``scontrol show job -o JOBID`` as key -> value ({} when Slurm no longer knows the job)."""
    done = slurm("scontrol", "show", "job", "-o", job_id, timeout_s=15)
    if done.returncode != 0:
        return {}
    return dict(_TOKEN.findall(done.stdout.strip()))


def _node_state(node: str | None) -> str | None:
    if not node:
        return None
    done = slurm("sinfo", "-h", "-n", node, "-o", "%T", timeout_s=15)
    return done.stdout.split()[0] if done.returncode == 0 and done.stdout.split() else None


def _config(job: S.JobSpec, out: str, scratch: str, attempt: int, mark: str) -> str:
    """The batch wrapper's configuration (``sbatchwrap``), written into the point's ``slurm/`` folder."""
    runs = os.path.join(scratch, "slurm")
    logs = os.path.join(scratch, "logs")
    for d in (runs, logs, os.path.join(scratch, "trace"), os.path.join(scratch, "tmp")):
        os.makedirs(d, exist_ok=True)
    cfg = {"base": attempt, "argv": job.argv(out, resume=attempt > 0), "resume_argv": job.argv(out, resume=True),
           "cwd": job.cwd, "runs": runs, "logs": logs, "mark": mark, "attempt_env": S.ENV_ATTEMPT,
           "mark_env": S.ENV_MARK, "point_env": S.ENV_POINT}
    path = os.path.join(runs, f"batch-a{attempt}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def _environment(job: S.JobSpec, out: str, scratch: str, attempt: int, point: S.Point | None,
                 mark: str) -> dict[str, str]:
    """What the batch job exports (``--export=ALL``): the job's environment, as the subprocess launcher's."""
    env = launch.job_env(job, out, os.path.join(scratch, "trace"), os.path.join(scratch, "tmp"),
                         launch.attempt_mark(mark, attempt), attempt, point)
    env[S.ENV_PYCACHE] = os.path.join(os.path.dirname(os.path.abspath(scratch)), "pycache")
    env[S.ENV_RANK] = "0"
    if job.preload_modules:
        env[S.ENV_PRELOAD] = ",".join(job.preload_modules)
    return env


def submit(job: S.JobSpec, out: str, scratch: str, attempt: int, point: S.Point | None,
           mark: str) -> tuple[str, list[str]]:
    """``sbatch --requeue`` the attempt; (job id, the sbatch command line). ConfigError if Slurm refuses."""
    config = _config(job, out, scratch, attempt, mark)
    wrap = f"exec {shlex.quote(sys.executable)} -S -E {shlex.quote(WRAPPER)} {shlex.quote(config)}"
    argv = ["sbatch", "--parsable", "--requeue", f"--job-name=chaos-{os.path.basename(scratch)}-a{attempt}",
            f"--output={os.path.join(scratch, 'slurm', 'batch-%j.log')}", "--open-mode=append",
            f"--chdir={job.cwd}", "--export=ALL", "--ntasks=1", *job.sbatch_options, "--wrap", wrap]
    env = _environment(job, out, scratch, attempt, point, mark)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--launcher sbatch: sbatch failed: {exc}") from None
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id.isdigit():
        said = " ".join(done.stderr.split())[:300]
        raise ConfigError(f"--launcher sbatch: sbatch refused the job: {said or f'status {done.returncode}'}")
    return job_id, argv


class _Watch:
    """The state of one Slurm job while it runs, and the sched point's record as Slurm is told."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.info: dict[str, str] = {}
        self.record: dict[str, Any] | None = None
        self.due: float | None = None  # preempt: when the requeue comes at the latest (the grace)
        self.released: set[str] = set()  # the Restarts= values whose BeginTime hold was lifted

    @property
    def state(self) -> str:
        return self.info.get("JobState", "")

    def poll(self) -> None:
        self.info = show_job(self.job_id) or self.info

    def answer(self, point: S.Point, trace_dir: str, grace_s: float) -> None:
        """A rank's sched request: Slurm told (``sched.begin``), the answer left for the waiting rank."""
        reqs = launch.requests(trace_dir, S.SCHED_REQUEST)
        if not reqs:
            return
        self.poll()
        node = self.info.get("BatchHost") or self.info.get("NodeList") or None
        self.record = sched.begin(point.mode, self.job_id, node, reqs[0], slurm)
        if self.record.get("pending") == "requeue":
            self.due = time.monotonic() + grace_s
        answer(trace_dir, S.SCHED_DONE, {"done": "error" not in self.record, "error": self.record.get("error")})

    def settle(self) -> None:
        """The point's second step once due; a requeued job's BeginTime hold lifted."""
        rec = self.record
        if rec is None:
            return
        pending = rec.get("pending")
        if pending == "requeue" and (self.state in TERMINAL or time.monotonic() >= (self.due or 0)):
            sched.finish(rec, None, slurm)
            self.poll()
        elif pending == "resume" and self.state not in ("RUNNING", ""):
            sched.finish(rec, _node_state(rec.get("node")), slurm)
        restarts = self.info.get("Restarts", "")
        if (self.state == "PENDING" and self.info.get("Reason") == "BeginTime" and restarts not in self.released
                and "pending" not in rec):
            self.released.add(restarts)
            sched.release(rec, self.job_id, self.info.get("StartTime"), slurm)

    def ended(self) -> bool:
        return self.state in TERMINAL and (self.record is None or "pending" not in self.record)


def run_attempts(job: S.JobSpec, out: str, scratch: str, attempt: int, point: S.Point | None,
                 mark: str) -> list[launch.AttemptOutcome]:
    """Submit attempt ``attempt`` as a batch job and wait for it to end; one outcome per run Slurm made.

    An armed sched point is answered through Slurm (the module docstring); every other point
    fires in the rank as under the subprocess launcher. Nothing of the job survives the call."""
    check()
    if launch.cancelled():
        raise launch.Cancelled("the exploration was interrupted: no attempt is started")
    trace_dir = os.path.join(scratch, "trace")
    started = time.monotonic()
    job_id, argv = submit(job, out, scratch, attempt, point, mark)
    watch = _Watch(job_id)
    armed = point is not None and attempt == 0 and point.family == "sched"
    deadline = started + job.timeout_s * (1 + (job.max_restarts if armed else 0)) + QUEUE_SLACK_S
    timed_out = interrupted = False
    next_poll = 0.0
    try:
        while True:
            if armed and watch.record is None and point is not None:
                watch.answer(point, trace_dir, job.grace_s)
            now = time.monotonic()
            if now >= next_poll:
                watch.poll()
                watch.settle()
                next_poll = time.monotonic() + STATE_POLL_S
                if watch.ended():
                    break
            if now > deadline:
                timed_out = True
                break
            if launch.cancelled():
                interrupted = True
                break
            time.sleep(REQUEST_POLL_S if armed and watch.record is None else STATE_POLL_S / 2)
    finally:
        _clean_up(watch, mark, attempt)
    outcomes = _outcomes(job, out, scratch, attempt, watch, timed_out, interrupted, time.monotonic() - started)
    outcomes[0].slurm = {"job_id": job_id, "state": watch.state, "restarts": _int(watch.info.get("Restarts")),
                         "node": watch.info.get("BatchHost") or None, "reason": watch.info.get("Reason"),
                         "exit_code": watch.info.get("ExitCode"), "sbatch": argv, **outcomes[0].slurm}
    if watch.record is not None:
        watch.record["restarts"] = outcomes[0].slurm["restarts"]
        watch.record["final_state"] = watch.state
        outcomes[0].slurm["sched"] = watch.record
        outcomes[0].slurm["what"] = sched.describe(watch.record)
    return outcomes


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _clean_up(watch: _Watch, mark: str, base: int) -> None:
    """The job cancelled unless it ended, waited for; a node left down resumed; marked leftovers killed."""
    if watch.record is not None and watch.record.get("pending") == "resume":
        sched.finish(watch.record, _node_state(watch.record.get("node")), slurm)
    if not watch.ended():
        slurm("scancel", watch.job_id)
        until = time.monotonic() + 60
        while time.monotonic() < until:
            watch.poll()
            if watch.state in TERMINAL or not watch.info:
                break
            time.sleep(STATE_POLL_S)
    runs = (_int(watch.info.get("Restarts")) or 0) + 1
    for a in range(base, base + runs + 1):  # what a run's job left on this host (a stray child)
        reaper.kill_marked(launch.attempt_mark(mark, a))


def _outcomes(job: S.JobSpec, out: str, scratch: str, base: int, watch: _Watch, timed_out: bool,
              interrupted: bool, seconds: float) -> list[launch.AttemptOutcome]:
    """One AttemptOutcome per run the batch wrapper recorded (``run-a<A>.json``), in attempt order."""
    runs_dir = os.path.join(scratch, "slurm")
    found = []
    for a in range(base, base + 1000):
        run = _read(os.path.join(runs_dir, f"run-a{a}.json"))
        if run is None:
            break
        found.append((a, run, _read(os.path.join(runs_dir, f"rc-a{a}.json"))))
    if not found:
        o = launch.AttemptOutcome(base, job.argv(out, resume=base > 0), returncodes=[None], seconds=seconds,
                                  timed_out=timed_out, interrupted=interrupted)
        o.logs = [os.path.join(scratch, "logs", f"attempt{base}-copy0.log")]
        o.slurm = {"ran": False}
        return [o]
    outcomes = []
    for i, (a, run, rc) in enumerate(found):
        last = i == len(found) - 1
        code = rc.get("returncode") if rc is not None else -9  # no status: SIGKILLed with its wrapper (KillWait)
        o = launch.AttemptOutcome(a, list(run.get("argv") or []), returncodes=[code],
                                  timed_out=timed_out and last, interrupted=interrupted and last)
        o.seconds = (rc or {}).get("ended", run.get("started", 0)) - run.get("started", 0) if rc else 0.0
        o.logs = [os.path.join(scratch, "logs", f"attempt{a}-copy0.log")]
        o.slurm = {"restart_count": run.get("restart_count"), "node": run.get("node"),
                   **({"sigterm_to_batch_script": rc["sigterm"]} if rc and rc.get("sigterm") else {}),
                   **({} if rc is not None else {"no_status": "the batch script was killed (SIGKILL)"})}
        outcomes.append(o)
    return outcomes


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            got = json.load(f)
        return got if isinstance(got, dict) else None
    except (OSError, ValueError):
        return None
