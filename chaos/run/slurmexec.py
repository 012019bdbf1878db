"""``chaos run --executor slurm``: a job's points run as a Slurm job array, judged here.

Why: a real training script costs seconds a point and a team wants hundreds of points
per commit; one machine is not enough. The exploration is planned once, here (the two
fault-free runs, their traces, the seeded choice of points: ``explore.explore``); only
running the chosen points is spread out. Judging stays here, with this run's golden, so
the point ids and verdicts are those of the same command run without ``--executor``.

Who calls what: ``cli.job`` makes a :class:`SlurmExecutor` (after :func:`check` found a
controller) and hands it to ``explore.explore``, which calls it in place of its own
``_run_points``. It:

1. writes ``ROOT/array/plan.json``: the job, the seed, and each chosen point with its
   index, its array task (points dealt round-robin over ``--jobs`` tasks) and where its
   first attempt is rebuilt from (materialized points);
2. submits ``sbatch --array=0-(N-1)`` of ``python -m chaos.run.slurmexec PLAN`` (this
   Python, the job's working directory, the caller's environment, ``--executor-opt`` as
   given); each task (:func:`task_main`) runs its share with ``explore.run_chain`` in the
   same scratch root, ``ROOT/point-NNNNN`` as a local run would, and leaves one record per
   point in ``ROOT/array/done/NNNNN.json`` (the attempts and what the harness did);
3. polls the array (``squeue``), reads every new record, rebuilds the point's
   ``PointRecord`` with the traces its task left, judges it and hands it to ``on_result``;
4. resubmits, once, the tasks that ended with points of theirs not run (a node lost, a
   task killed); a point still not run then is an ``error`` verdict with outcome
   ``lost``, naming the task, its state and its log: never dropped;
5. on an interrupt (Ctrl-C, SIGTERM) cancels the array (``scancel``), waits for its tasks
   to end, and records the points not judged as interrupted.

The scratch root must be one file system every node mounts at the same path (``--scratch``
on a shared file system; on one host, as the private ``chaos slurm start`` cluster is,
any directory will do).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.errors import ChaosError
from chaos.judge.job import PointVerdict, judge
from chaos.launch import job as launch
from chaos.launch import sbatch
from chaos.launch.job import AttemptOutcome
from chaos.model.jobspec import JobSpec, Point
from chaos.nemesis import netcut
from chaos.nemesis.atrest import Applied
from chaos.record.jobhistory import PointRecord, read_traces
from chaos.run.explore import (
    PointResult,
    Reference,
    interrupted_result,
    new_run,
    replay_source,
    run_chain,
)
from faults import disk
from reports.jsonfile import write_json_atomic

PLAN = "plan.json"
LOST = "lost"  # the outcome of a point whose array task ended twice without running it
POLL_S = 0.5
PROGRESS_EVERY_S = 5.0
CANCEL_WAIT_S = 60.0  # after scancel: how long the tasks get to end (KillWait, then SIGKILL)
_COMMAND_TIMEOUT_S = 60.0


class SlurmError(ChaosError):
    """A Slurm command failed while the points ran (sbatch refused, the controller went away): exit 2."""


def _slurm(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A Slurm client command (``sbatch.slurm``: a hang or a missing binary is a failed command);
    SlurmError naming it and its last line of output where ``check`` and it failed."""
    done = sbatch.slurm(*argv, timeout_s=_COMMAND_TIMEOUT_S)
    if check and done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise SlurmError(f"{shlex.join(argv)}: {why}")
    return done


def check() -> None:
    """Before the fault-free runs: a Slurm controller this environment reaches (``SLURM_CONF`` or the
    host's own configuration), or one ConfigError line saying what is missing (``sbatch.check``)."""
    sbatch.check("--executor slurm", ("sbatch", "squeue", "scancel", "scontrol"))


@dataclass
class _Array:
    """One ``sbatch --array`` submission: its job id and which task ids it ran."""

    job_id: str
    tasks: list[int]
    attempt: int  # 0: the first submission, 1: the retry of tasks that left points not run


@dataclass
class SlurmExecutor:
    """Runs the chosen points as a Slurm job array (``explore.PointsRunner``); see the module docstring.

    ``tasks``: array tasks (``--jobs``); ``sbatch_args``: given to every ``sbatch``
    (partition, time limit, account: ``--executor-opt``); ``say``: progress lines (stderr).
    ``record`` is what the results' ``job.executor`` shows once the points have run.
    """

    tasks: int
    sbatch_args: tuple[str, ...] = ()
    say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True)
    record: dict[str, Any] = field(default_factory=dict)

    def __call__(self, job: JobSpec, ref: Reference, chosen: list[Point], root: str, seed: int,
                 budget_s: float | None, jobs: int, keep: bool, started: float, results: list[PointResult],
                 on_result: Callable[[PointResult], None] | None) -> None:
        if not chosen:
            return
        array_dir = Path(root) / "array"
        (array_dir / "done").mkdir(parents=True, exist_ok=True)
        tasks = max(1, min(self.tasks, len(chosen)))
        share = {i: i % tasks for i in range(len(chosen))}
        deadline = None if budget_s is None else time.time() + budget_s - (time.monotonic() - started)
        plan = {"job": job.to_dict(), "preload_modules": list(job.preload_modules), "seed": seed,
                "netlab": ref.netlab, "deadline": deadline,
                "points": [{"index": i, "task": share[i], "point": dataclasses.asdict(p),
                            "replay_from": replay_source(job, ref, p)} for i, p in enumerate(chosen)]}
        write_json_atomic(array_dir / PLAN, plan, indent=1)
        self.record.update({"kind": "slurm", "tasks": tasks, "arrays": [], "retried": [], "lost": []})
        judged: set[int] = set()  # every point whose record was read: judged, or left out by the --budget
        arrays: list[_Array] = []
        try:
            arrays.append(self._submit(job, array_dir, list(range(tasks)), 0))
            self._follow(job, ref, chosen, root, seed, arrays[-1], judged, results, on_result, keep)
            left = sorted({share[i] for i in range(len(chosen)) if i not in judged})
            if left:
                states = _states(arrays[-1].job_id)
                self.say(f"slurm: task(s) {', '.join(map(str, left))} of array job {arrays[-1].job_id} ended with "
                         f"points not run ({'; '.join(f'task {t}: {_describe(states.get(t))}' for t in left)}): "
                         "resubmitted once")
                self.record["retried"] = left
                arrays.append(self._submit(job, array_dir, left, 1))
                self._follow(job, ref, chosen, root, seed, arrays[-1], judged, results, on_result, keep)
            self._lost(job, chosen, root, seed, arrays, share, judged, results, on_result)
        except BaseException:
            self._cancel([a["job_id"] for a in self.record["arrays"]])  # each one sbatch accepted, even mid-_submit
            if isinstance(sys.exc_info()[1], KeyboardInterrupt):
                self._collect(job, ref, chosen, root, seed, judged, results, on_result, keep)
                for i, point in enumerate(chosen):  # started by a task (its folder is there), never finished
                    if i not in judged and (Path(root) / f"point-{i:05d}").is_dir():
                        run = new_run(root, f"point-{i:05d}")
                        results.append(interrupted_result(job, point, run, None, seed, 0.0))
            raise

    def _submit(self, job: JobSpec, array_dir: Path, tasks: list[int], attempt: int) -> _Array:
        spec = ",".join(map(str, tasks)) if attempt else f"0-{tasks[-1]}"
        argv = ["sbatch", "--parsable", f"--array={spec}", "--job-name=chaos-points",
                f"--output={array_dir}/task-%a-try{attempt}.log", f"--chdir={job.cwd}", "--export=ALL",
                *self.sbatch_args,
                "--wrap", shlex.join([sys.executable, "-m", "chaos.run.slurmexec", str(array_dir / PLAN)])]
        job_id = _slurm(*argv).stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {job_id!r}, not a job id")
        self.record["arrays"].append({"job_id": job_id, "tasks": tasks})
        self.say(f"slurm: submitted array job {job_id} ({len(tasks)} task(s)"
                 + (", a retry" if attempt else "") + f"; SLURM_CONF={os.environ.get('SLURM_CONF', 'default')})")
        return _Array(job_id, tasks, attempt)

    def _follow(self, job: JobSpec, ref: Reference, chosen: list[Point], root: str, seed: int, array: _Array,
                judged: set[int], results: list[PointResult], on_result: Callable[[PointResult], None] | None,
                keep: bool) -> None:
        """Until no task of ``array`` is queued or running: judge each point as its record comes."""
        shown, last = 0.0, ""
        while True:
            queued = _queued(array.job_id)
            self._collect(job, ref, chosen, root, seed, judged, results, on_result, keep)
            pending = sum(1 for s in queued.values() if s == "PENDING")
            running = len(queued) - pending
            line = (f"slurm: array job {array.job_id}: {pending} pending, {running} running, "
                    f"{len(array.tasks) - len(queued)} done; {len(judged)}/{len(chosen)} point(s) judged")
            now = time.monotonic()
            if line != last and (now - shown >= PROGRESS_EVERY_S or not queued):
                self.say(line)
                shown, last = now, line
            if not queued:
                self._collect(job, ref, chosen, root, seed, judged, results, on_result, keep)
                return
            time.sleep(POLL_S)

    def _collect(self, job: JobSpec, ref: Reference, chosen: list[Point], root: str, seed: int, judged: set[int],
                 results: list[PointResult], on_result: Callable[[PointResult], None] | None, keep: bool) -> None:
        """Judge every point whose record its task has written and that is not judged yet."""
        done_dir = Path(root) / "array" / "done"
        for i, point in enumerate(chosen):
            path = done_dir / f"{i:05d}.json"
            if i in judged or not path.is_file():
                continue
            data = _read_record(path)
            judged.add(i)
            if data.get("budget"):
                continue  # not started: the --budget ran out first, as a local run leaves it out
            run = new_run(root, f"point-{i:05d}")
            rec = rebuild(point, run.out, read_traces(run.scratch, run.out), data, path)
            res = PointResult(job, point, judge(job, ref.golden, rec), rec, seed, float(data.get("seconds", 0.0)))
            results.append(res)
            if on_result:
                on_result(res)
            if not keep:
                shutil.rmtree(run.scratch, ignore_errors=True)

    def _lost(self, job: JobSpec, chosen: list[Point], root: str, seed: int, arrays: list[_Array],
              share: dict[int, int], judged: set[int], results: list[PointResult],
              on_result: Callable[[PointResult], None] | None) -> None:
        """The points no task ran, even after the retry: each an error verdict naming its task."""
        array_dir = Path(root) / "array"
        states = _states(arrays[-1].job_id) if arrays else {}
        for i, point in enumerate(chosen):
            if i in judged:
                continue
            task = share[i]
            log = array_dir / f"task-{task}-try{arrays[-1].attempt}.log"
            tail = _tail(log)
            why = (f"Slurm array task {task} (job {arrays[-1].job_id}) ended "
                   f"{'after a retry ' if len(arrays) > 1 else ''}without running this point "
                   f"({_describe(states.get(task))}); its log {log}"
                   + (f" ends: {tail}" if tail else " is empty"))
            run = new_run(root, f"point-{i:05d}")
            res = PointResult(job, point, PointVerdict("error", LOST, why, {}), PointRecord(point, run.out, [], {}),
                              seed, 0.0)
            self.record["lost"].append(point.id)
            results.append(res)
            if on_result:
                on_result(res)

    def _cancel(self, ids: list[str]) -> None:
        """scancel every array submitted, and wait (bounded) until none of its tasks is left."""
        if not ids:
            return
        _slurm("scancel", *ids, check=False)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline and any(_queued(i) for i in ids):
            time.sleep(POLL_S)


def _queued(job_id: str) -> dict[int, str]:
    """The array's tasks Slurm still holds (pending, running, completing): task id -> state."""
    done = _slurm("squeue", "-h", "-r", "-j", job_id, "-o", "%K|%T", check=False)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return {}  # purged: every task ended long ago
        raise SlurmError(f"squeue -j {job_id}: {(done.stderr.strip() or 'failed').splitlines()[-1]}")
    found: dict[int, str] = {}
    for line in done.stdout.splitlines():
        task, _, state = line.strip().partition("|")
        if task.isdigit() and state not in sbatch.TERMINAL:
            found[int(task)] = state
    return found


def _states(job_id: str) -> dict[int, dict[str, str]]:
    """How each task of an ended array ended (``scontrol show job``: JobState, Reason, ExitCode), while
    the controller still keeps it (MinJobAge); empty where it does not."""
    done = _slurm("scontrol", "show", "job", "-o", job_id, check=False)
    found: dict[int, dict[str, str]] = {}
    for line in done.stdout.splitlines():
        fields = dict(item.partition("=")[::2] for item in line.split() if "=" in item)
        if fields.get("ArrayTaskId", "").isdigit():
            found[int(fields["ArrayTaskId"])] = fields
    return found


def _describe(state: dict[str, str] | None) -> str:
    if not state:
        return "state unknown to the controller (cancelled while pending, or purged after MinJobAge)"
    return f"{state.get('JobState', '?')}, reason {state.get('Reason', '?')}, exit {state.get('ExitCode', '?')}"


def _tail(path: Path, chars: int = 300) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - chars))
            return " ".join(f.read().decode(errors="replace").split())
    except OSError:
        return ""


def rebuild(point: Point, out: str, traces: dict[tuple[int, int], list[dict[str, Any]]], data: dict[str, Any],
            path: Path) -> PointRecord:
    """The ``PointRecord`` a task's record (``_record``) and the traces it left stand for; SlurmError naming
    ``path`` where the record is not one this harness writes (a task of another version, say)."""
    try:
        attempts = [AttemptOutcome(**a) for a in data["attempts"]]
        applied = Applied(**data["applied"]) if data.get("applied") else None
    except (TypeError, KeyError, ValueError) as exc:
        raise SlurmError(f"{path}: not a point record this harness writes ({type(exc).__name__}: {exc}); "
                         "do the array's nodes run another version of it?") from None
    return PointRecord(point, out, attempts, traces, data.get("after_kill"), applied, data.get("before_fault"),
                       data.get("untraced") or [])


def _read_record(path: Path) -> dict[str, Any]:
    """A task's record of one point (written atomically by :func:`task_main`); SlurmError if it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SlurmError(f"{path}: not a point record ({exc})") from None
    if not isinstance(data, dict) or not (data.get("budget") or isinstance(data.get("attempts"), list)):
        raise SlurmError(f"{path}: not a point record (no attempts)")
    return data


# -- the array task's side: ``python -m chaos.run.slurmexec PLAN`` under sbatch


def task_main(plan_path: str, task: int) -> int:
    """Run this task's share of the plan, one point after another, each leaving its record.

    A point whose record is there already (a retried task) is not run again; a folder a lost
    task left half-written is cleared first. SIGTERM (``scancel``, preemption) stops the
    point running now (every copy killed): no record, so the coordinator retries or reports it.
    """
    try:
        plan = json.loads(Path(plan_path).read_text())
    except OSError as exc:
        print(f"chaos: error: the plan {plan_path} cannot be read on {socket.gethostname()} ({exc.strerror}): "
              "--scratch must be a file system every node mounts at the same path", file=sys.stderr)
        return 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(plan_path)))
    job = dataclasses.replace(JobSpec.from_dict(plan["job"]), preload_modules=tuple(plan["preload_modules"]))
    done_dir = Path(root) / "array" / "done"
    signal.signal(signal.SIGTERM, _interrupt)
    mine: list[str] = []  # this task's point folders: the only ones its cleanup may unmount under
    try:
        for entry in plan["points"]:
            if entry["task"] != task:
                continue
            index = int(entry["index"])
            mine.append(os.path.join(root, f"point-{index:05d}"))
            record = done_dir / f"{index:05d}.json"
            if record.exists():
                continue
            if plan.get("deadline") is not None and time.time() > plan["deadline"]:
                write_json_atomic(record, {"budget": True})
                continue
            point = Point(**entry["point"])
            shutil.rmtree(os.path.join(root, f"point-{index:05d}"), ignore_errors=True)
            run = new_run(root, f"point-{index:05d}")
            run.replay_from = entry.get("replay_from")
            t0 = time.monotonic()
            rec = run_chain(job, run, point, int(plan["seed"]), bool(plan["netlab"]))
            write_json_atomic(record, _record(rec, time.monotonic() - t0), default=str)
        return 0
    except KeyboardInterrupt:
        launch.cancel()
        return 128 + launch.signal_of(sys.exc_info()[1] or KeyboardInterrupt())
    finally:
        launch.kill_all()
        netcut.teardown_all()
        # Not the whole root: the other tasks on this node share its mount namespace, and a full
        # disk another one has mounted over its point's {out} must outlive this task's end.
        for folder in mine:
            disk.unmount_all(folder)


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM in an array task (scancel, a preemption): the point running now stops, every copy killed."""
    raise launch.Interrupt(signum)


def _record(rec: PointRecord, seconds: float) -> dict[str, Any]:
    """What the coordinator needs beyond the traces it reads itself (``SlurmExecutor._collect``)."""
    if rec.applied is not None and not isinstance(rec.applied, Applied):
        raise ChaosError(f"point {rec.point.id}: what the harness did is a {type(rec.applied).__name__}, "
                         "which a task cannot hand over")
    return {"attempts": [dataclasses.asdict(a) for a in rec.attempts], "after_kill": rec.after_kill,
            "applied": dataclasses.asdict(rec.applied) if rec.applied is not None else None,
            "before_fault": rec.before_fault, "untraced": rec.untraced, "seconds": round(seconds, 3)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    task = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    if len(args) != 1 or not task.isdigit():
        print("usage: python -m chaos.run.slurmexec PLAN (as a Slurm array task: SLURM_ARRAY_TASK_ID set)",
              file=sys.stderr)
        return 2
    return task_main(args[0], int(task))


if __name__ == "__main__":
    sys.exit(main())
