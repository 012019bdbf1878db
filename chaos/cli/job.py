"""``chaos run [options] -- COMMAND...``: a user's own job under chaos.

``chaos.cli.main.main`` hands over here when the arguments of ``run`` contain ``--``;
everything after it is COMMAND, with ``{out}`` where the job takes its output
directory. Prints one line per failing point (its outcome, the evidence, and the
command that replays exactly that point), a progress line with the time left every
``PROGRESS_EVERY_S`` seconds on stderr, then the counts, the coverage, and where the
results JSON and the reports asked for (``--junit``, ``--summary``, ``--html``) were written.
Exit status as for every ``chaos run``: 0 all pass or skipped, 1 any fails, 2 harness
error or bad input (one line on stderr): a ``--result-file`` the fault-free run never
wrote, a ``--point`` the job does not have or that was never reached. SIGINT and
SIGTERM stop the run cleanly (:class:`_Stop`): the point running then is recorded as
interrupted, not judged, the results say "interrupted after N of M points", and the
exit status is 130 or 143 once no process of the job is left and the scratch root is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from chaos.errors import ChaosError, ConfigError
from chaos.model.grammar import parse_point, replay_point
from chaos.model.jobspec import (
    DEFAULT_GRACE_S,
    DEFAULT_NET_HOLD_S,
    DEFAULT_NODE_HOLD_S,
    FAULT_KINDS,
    LAUNCHERS,
    MODES,
    JobSpec,
    Point,
    check_sbatch_options,
)
from chaos.nemesis.family import families

if TYPE_CHECKING:
    from chaos.run.explore import Interrupted, Reference


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, like every bad input
        raise ConfigError(message)


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="chaos run [options] -- COMMAND...",
                description="Run your own training job under chaos: {out} in COMMAND is its output directory.")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="launch N copies with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)")
    p.add_argument("--resume-cmd", default=None, metavar="CMD", help="what a restart runs (default: COMMAND)")
    p.add_argument("--result-file", action="append", default=[], metavar="GLOB",
                   help="files under {out} compared with the fault-free run after each point (repeatable)")
    p.add_argument("--step-regex", default=None, metavar="RE",
                   help="a regex with one group: the step, in the job's output (where a resume started)")
    p.add_argument("--loss-regex", default=None, metavar="RE",
                   help="a regex for the job's loss lines in its output: groups named step and loss (or the "
                        "first two, step first); the loss curve is then judged against the fault-free run's")
    p.add_argument("--loss-band", type=float, default=None, metavar="B",
                   help="relative band around the fault-free loss (default: exact when the two fault-free runs "
                        "agree, else 0.005)")
    p.add_argument("--checkpoint-glob", default=None, metavar="GLOB",
                   help="the job's checkpoints under {out} (step = last number in the name); one whose files "
                        "and sizes equal the fault-free run's is complete")
    p.add_argument("--max-points", type=int, default=None, metavar="N", help="a seeded sample of N points")
    p.add_argument("--budget", type=float, default=None, metavar="S", help="start no point after S seconds")
    p.add_argument("--resume-points", type=int, default=0, metavar="N",
                   help="then N points more: passing points tried again with a kill inside their resume (its "
                        "load, cleanup or first save), every second one a power cut there instead (not for a "
                        "torchrun COMMAND), and one restart more (rankR:opN:MODE+rankR:opM:MODE)")
    p.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="points run concurrently (--executor slurm: the array's tasks, each a share of the points)")
    p.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="where the chosen points run: here (default), or as a Slurm job array (sbatch --array, the "
                        "SLURM_CONF of this environment; --scratch must then be a file system every node mounts), "
                        "judged here with this run's fault-free runs")
    p.add_argument("--executor-opt", action="append", default=[], metavar="--OPT=VALUE",
                   help="--executor slurm: an sbatch option for the array that runs the points (repeatable), e.g. "
                        "--executor-opt=--partition=debug; --sbatch-opt is the job's own, with --launcher sbatch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--point", action="append", default=[], metavar="ID",
                   help="run only this point (a replay; repeatable): rank0:op17:before, rank0:step5:kill "
                        "(or kill:rank=0,step=5), disk:full:8192, ...; +rankR:opN:MODE after it strikes its "
                        "restart too, at that restart's event N: a kill (before, after, torn) or a power cut "
                        "(power), e.g. rank0:step5:kill+rank0:op6:power")
    p.add_argument("--materialize", action=argparse.BooleanOptionalAction, default=True,
                   help="rebuild a point's first attempt from the fault-free trace (its files as they were "
                        "at the event) and run only the resume, where the trace says it all: one-process jobs, "
                        "kills before, after or in the middle of (torn) an event and corruptions and power losses "
                        "at one (default); --no-materialize runs every point's first attempt to the point")
    p.add_argument("--no-preload", action="store_true",
                   help="do not import the modules the fault-free run imported before its first file event "
                        "(torch, numpy, ...) ahead of an attempt: neither in the interpreters started ahead of "
                        "it nor in the one that forks a one-process job's attempts (a zygote)")
    p.add_argument("--no-native-trace", action="store_true",
                   help="do not preload the native tracer (faults/chaosio.c), which sees and faults writes from "
                        "native code (h5py, a C++ writer, an msync) and from the processes the job starts")
    p.add_argument("--modes", default=",".join(MODES), metavar="M,...",
                   help="kill points at a file event: before, after, torn (default all)")
    p.add_argument("--faults", default=None, metavar="K,...",
                   help=f"fault families to explore: {','.join(FAULT_KINDS)} (default: all that apply here; "
                        "diskfull needs root and tmpfs; net, a network cut between ranks, needs --ranks N >= 2, "
                        "root and iproute2, and is not available for a torchrun COMMAND, which starts its "
                        "workers itself)")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, metavar="S",
                   help=f"a term point: seconds between SIGTERM and SIGKILL (default {DEFAULT_GRACE_S:g})")
    p.add_argument("--net-hold", type=float, default=DEFAULT_NET_HOLD_S, metavar="S",
                   help="a net point: seconds the rank's link stays down; a job still running then is SIGKILLed "
                        f"and restarted with the network back (default {DEFAULT_NET_HOLD_S:g})")
    p.add_argument("--nodes", type=int, default=None, metavar="N",
                   help="run COMMAND, a torchrun agent, once per simulated node (each in its own network namespace, "
                        "root and iproute2): {rdzv} in COMMAND is node 0's rendezvous endpoint ({node}: the node's "
                        "index, {addr}: its address); explores node faults: loss, link cut, rendezvous host loss")
    p.add_argument("--node-hold", type=float, default=DEFAULT_NODE_HOLD_S, metavar="S",
                   help=f"a node link point: seconds the node stays cut off before its link comes back up "
                        f"(default {DEFAULT_NODE_HOLD_S:g})")
    p.add_argument("--chaos-mesh", default=None, metavar="DIR",
                   help="write the node points tried as Chaos Mesh resources (PodChaos pod-kill, NetworkChaos "
                        "partition) for a Kubeflow PyTorchJob into DIR, one YAML file per point")
    p.add_argument("--launcher", choices=LAUNCHERS, default="subprocess",
                   help="who starts each attempt: the harness (subprocess, default), the harness with each copy "
                        "in a Docker container of its own (docker: the host's system and Python mounted read-only, "
                        "the scratch root read-write, on the engine DOCKER_HOST names or `chaos engine start`'s) or "
                        "Slurm (sbatch: a batch job submitted with --requeue through this environment's sbatch and "
                        "SLURM_CONF; explores kill, errno and sched, Slurm's requeue, preemption and node loss, after "
                        "which Slurm restarts it)")
    p.add_argument("--image", default=None, metavar="NAME",
                   help="with --launcher docker: run each copy in image NAME (on the engine already: docker pull it) "
                        "with its own Python, working directory and environment, instead of the host-mounted empty "
                        "image; only this project's tracer (read-only) and the scratch root are mounted into it")
    p.add_argument("--sbatch-opt", action="append", default=[], metavar="--OPT=VALUE",
                   help="an sbatch option for the job, as given (repeatable; with --launcher sbatch), e.g. "
                        "--sbatch-opt=--signal=B:USR1@30")
    p.add_argument("--max-restarts", type=int, default=1, metavar="K", help="restarts after a fault (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="seconds per attempt")
    p.add_argument("--hang-timeout", type=float, default=None, metavar="S",
                   help="stop an attempt as hung once it has been silent S seconds: no output, traced file event or "
                        "probe call (default: only --timeout ends it); choose S above the job's longest silent stretch")
    p.add_argument("--rtol", type=float, default=1e-3, help="tolerance mode: relative tolerance of results")
    p.add_argument("--json", metavar="PATH", help="write the results JSON here")
    p.add_argument("--html", metavar="FILE", help="write the HTML report here (what chaos report renders)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML here: a test case per point (for CI test reports)")
    p.add_argument("--summary", metavar="FILE",
                   help="append a Markdown summary to FILE (e.g. $GITHUB_STEP_SUMMARY); never truncates it")
    p.add_argument("--scratch", metavar="DIR", help="parent of the scratch root (default: system temp)")
    p.add_argument("--keep", action="store_true", help="keep the scratch root for inspection")
    return p


def help_epilog() -> str:
    """The job options, for the end of ``chaos run --help`` (``chaos.cli.main`` shows them there)."""
    text = make_parser().format_help()
    cut = max(text.find("\noptions:\n"), text.find("\noptional arguments:\n"))
    options = text[cut + 1:] if cut >= 0 else text
    options = options[options.index("\n") + 1:]  # the heading; ours says "job options"
    return ("your own job: chaos run [job options] -- COMMAND...   ({out} in COMMAND is its output directory)\n\n"
            "job options:\n" + options)


def build(argv: list[str]) -> tuple[argparse.Namespace, JobSpec]:
    """Options before ``--``, COMMAND after it."""
    cut = argv.index("--")
    args = make_parser().parse_args(argv[:cut])
    command = tuple(argv[cut + 1:])
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {args.jobs}")
    if args.scratch is not None and not os.path.isdir(args.scratch):
        raise ConfigError(f"--scratch {args.scratch}: not an existing directory")
    if args.max_points is not None and args.max_points < 1:
        raise ConfigError(f"--max-points must be at least 1, got {args.max_points}")
    if args.budget is not None and args.budget <= 0:
        raise ConfigError(f"--budget must be a positive number of seconds, got {args.budget:g}")
    resume = tuple(shlex.split(args.resume_cmd)) if args.resume_cmd else None
    job = JobSpec(command=command, resume_command=resume, ranks=args.ranks, result_globs=tuple(args.result_file),
                  step_regex=args.step_regex, loss_regex=args.loss_regex, loss_band=args.loss_band,
                  checkpoint_glob=args.checkpoint_glob, max_restarts=args.max_restarts,
                  timeout_s=args.timeout, hang_timeout_s=args.hang_timeout, rtol=args.rtol, modes=tuple(m for m in args.modes.split(",") if m),
                  faults=tuple(f for f in args.faults.split(",") if f) if args.faults is not None else None,
                  grace_s=args.grace, net_hold_s=args.net_hold, nodes=args.nodes, node_hold_s=args.node_hold,
                  preload=not args.no_preload, native_trace=not args.no_native_trace, materialize=args.materialize, launcher=args.launcher,
                  sbatch_options=tuple(args.sbatch_opt), image=args.image)
    if args.executor_opt and args.executor != "slurm":
        raise ConfigError("--executor-opt is for --executor slurm")
    check_sbatch_options("--executor-opt", args.executor_opt,
                         ("--array", "-a", "--output", "-o", "--wrap", "--parsable", "--chdir", "-D", "--export"),
                         "--array, --output, --chdir, --export and the task's command itself")
    if args.executor == "slurm" and job.launcher == "docker":
        raise ConfigError("--executor slurm with --launcher docker: the array tasks run on Slurm's nodes, whose "
                          "Docker engines the harness here neither reaches nor prepares; run one or the other")
    if job.launcher == "docker":
        from chaos.launch import containers

        containers.check(job.image)  # no client, no engine or no such image: said now, before any run
    if args.executor == "slurm" and job.launcher == "sbatch":
        raise ConfigError("--executor slurm with --launcher sbatch: each array task would submit the job's batch "
                          "jobs and wait for them, holding a slot they may need; run one or the other")
    if args.resume_points < 0:
        raise ConfigError(f"--resume-points must be non-negative, got {args.resume_points}")
    if args.resume_points or any(parse_point(p).then is not None for p in args.point):
        _check_second_faults(args, job)
    if args.chaos_mesh is not None and job.nodes is None:
        raise ConfigError("--chaos-mesh writes node faults: it needs --nodes N")
    return args, job


def _check_second_faults(args: argparse.Namespace, job: JobSpec) -> None:
    """ConfigError where a second fault in a resume (``--resume-points``, ``--point A+B``) cannot be run."""
    from chaos.plan.resumepoints import why_not

    why = why_not(job)
    if why is not None:
        raise ConfigError(f"a second fault in a resume (--resume-points, --point ...+rankR:opN:MODE): {why}")
    if args.resume_points and args.point:
        raise ConfigError("--resume-points samples points to strike again; --point runs exactly the points given "
                          "(write one with its second fault: --point rank0:op17:after+rank0:op4:before)")
    if job.torchrun and any((then := parse_point(p).then) is not None and then.mode == "power" for p in args.point):
        raise ConfigError("a power cut in a resume (+rankR:opN:power) with a torchrun COMMAND: its agent restarts "
                          "the workers by itself, before the harness could cut the power; a kill (before, after, "
                          "torn) can strike its restart")
    if args.executor == "slurm":
        raise ConfigError("a second fault in a resume with --executor slurm: the array's tasks run one fault a "
                          "point, and the second faults are chosen from the first points' resumes, which they do "
                          "not hand back")


def output_options(args: argparse.Namespace) -> list[str]:
    """Where a built-in ``run`` or ``replay`` asked its results and reports to go (``--json``, ``--html``,
    ``--junit``, ``--summary``, ``--scratch``, ``--keep``), as the job mode's options: the same flags,
    the same meaning. Called by ``chaos.cli.main`` (a job's replay) and ``chaos.cli.asjob``."""
    out: list[str] = []
    for flag in ("--json", "--html", "--junit", "--summary", "--scratch"):
        value = getattr(args, flag[2:], None)
        if value:
            out += [flag, value]
    return [*out, "--keep"] if args.keep else out


def _say(text: str) -> None:
    """A line on stdout. Every caller's text may hold the job's own output (a summary quotes its
    traceback) or names it chose (its files, a replayed results file's ids), so control
    characters are shown as escapes, never acted on by the terminal (``reports.cases.printable``)."""
    from reports.cases import printable

    print(printable(text), flush=True)


def replay_argv(doc: dict[str, Any], ids: list[str], source: str) -> tuple[list[str], str | None]:
    """``chaos replay RESULTS.json`` of a job run: the options and COMMAND that rerun its failing
    points (or ``ids``) exactly, and the directory the job ran in. Called by ``chaos.cli.main``."""
    try:
        spec = doc["job"]["spec"]
        entries = doc["scenarios"]
        command = [str(a) for a in spec["command"]]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{source}: not a job results JSON (missing {exc})") from None
    known = [e.get("id") for e in entries if isinstance(e, dict)]
    if ids:
        missing = sorted(set(ids) - set(known))
        if missing:
            raise ConfigError(f"{source} has no point {', '.join(missing)}")
        chosen = list(ids)
    else:
        chosen = [e["id"] for e in entries if e.get("verdict") in ("fail", "error")] or known
    if not chosen:
        raise ConfigError(f"{source}: no point to replay (the run tried none)")
    try:
        job = JobSpec.from_dict(spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: the recorded job spec is not one chaos run wrote ({type(exc).__name__}: "
                          f"{exc})") from None
    except ConfigError as exc:
        raise ConfigError(f"{source}: the recorded job spec: {exc}") from None
    argv = job.replay_args()
    seeds = {e.get("seed") for e in entries if isinstance(e, dict) and e.get("id") in chosen}
    seed = seeds.pop() if len(seeds) == 1 else None
    if seed:  # the run's seed decides a corruption's bytes and a power-loss state
        argv += ["--seed", str(seed)]
    by_id = {e.get("id"): e for e in entries if isinstance(e, dict)}
    for point in chosen:  # --point=ID: an id that looks like an option stays the value it is
        argv.append(f"--point={replay_point(by_id[point])}")
    return [*argv, "--", *command], spec.get("cwd")


class _Stop:
    """SIGINT and SIGTERM in job mode, installed by :func:`main` for the whole run.

    The first signal raises ``launch.Interrupt`` in the main thread: a KeyboardInterrupt,
    so Ctrl-C and a SIGTERM (what ``timeout``, a cancelled CI job and ``kill`` send) take
    the same way out: ``explore`` stops every copy of the job, records the point it cut
    short as interrupted, removes the scratch root, and :func:`_run` writes the results
    and exits 128 + the signal. Without this handler a SIGTERM ended the harness at once
    (exit 143), leaving the job's processes (each in a session of its own) and the
    scratch root behind. A later signal, while that clean-up runs, is only noted: the
    clean-up is bounded (``launch.kill_all``), and cutting it short is what left things
    behind. Once the exploration has ended (``settled``), or while it cleans up at its end
    (``launch.shield``), a signal no longer interrupts: the results are written in full,
    and the exit status still says a signal came.
    SIGINT is left alone where this process was started with it ignored (``nohup``, a
    background job of a non-interactive shell), as Python itself leaves it.
    """

    def __init__(self) -> None:
        from chaos.launch import job as launch

        self._launch = launch
        self.signum: int | None = None
        self.settled = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            if not self.settled and not self._launch.shielded():
                raise self._launch.Interrupt(signum)
            return  # the exploration is over, or its clean-up runs: it ends as it was ending
        os.write(2, b"chaos: already stopping: the job's processes and scratch root are being cleaned up\n")

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers can only be set from the main thread; the caller's own apply
            return
        previous: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(sig)
            if sig == signal.SIGINT and current == signal.SIG_IGN:
                continue
            previous[sig] = current
            signal.signal(sig, self._handle)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def main(argv: list[str], cwd: str | None = None) -> int:
    """Run a job's exploration; every error is one line on stderr and exit 2.

    ``cwd``: where COMMAND runs (a replay runs it where the recorded run did); default here.
    SIGINT and SIGTERM stop it cleanly (:class:`_Stop`): exit 130 or 143 once nothing of
    the job is left and the results are written.
    """
    from chaos.launch import job as launch

    stop = _Stop()
    with stop.installed():
        try:
            args, job = build(argv)
            if cwd is not None:
                if not os.path.isdir(cwd):
                    raise ConfigError(f"the recorded job ran in {cwd}, which does not exist here")
                job = dataclasses.replace(job, cwd=cwd)
            return _run(args, job, stop)
        except ConfigError as exc:
            print(f"chaos: error: {_printable(exc)}", file=sys.stderr)
            return 2
        except ChaosError as exc:  # a JobError quotes the job's output
            print(f"chaos: harness error: {_printable(exc)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:  # before or after the exploration (it handles its own: _interrupted)
            launch.kill_all()
            signum = launch.signal_of(exc)
            print(f"chaos: interrupted ({signal.Signals(signum).name}); every process of the job was stopped",
                  file=sys.stderr)
            return 128 + signum
        except Exception as exc:  # noqa: BLE001 - a bug of the harness: exit 2, never a bare traceback
            launch.kill_all()
            print(f"chaos: harness error: {type(exc).__name__}: {_printable(exc)}", file=sys.stderr)
            if os.environ.get("CHAOS_DEBUG"):
                import traceback

                traceback.print_exc()
            return 2


def _printable(exc: BaseException) -> str:
    from reports.cases import printable

    return printable(exc)


def unreachable(job: JobSpec, ref: Reference, point: Point) -> str | None:
    """Why the fault-free run shows that ``--point`` ``point`` can never fire, or None where it may.

    Called by :func:`_run` once the fault-free runs are over and before any point runs, so
    a point this job does not have (``rank0:op999:after`` of a job with 40 file events, a
    step past the last one announced, a rank it does not run) is one usage error line,
    not a run that ends "1 not_reached" with exit 0. Only what the traces prove: an
    anchored point (it fires at its event wherever this run numbers it), a node point and
    a full disk are left to the run, and :func:`_run` refuses one that was not reached then.
    """
    if point.anchored or point.node is not None or point.family == "diskfull" and point.step is None:
        return None
    if point.whole_save:  # the built-in all:stepS:power: the power points of that save, if it has any
        from chaos.plan.translate import empty_why

        return None if ref.expand(job, point) else empty_why(point, ref.traces)
    ranks = sorted({r for (r, a) in ref.traces if a == 0})
    if point.rank not in ranks:
        shown = ", ".join(map(str, ranks)) or "none"
        return f"the fault-free run traced no rank {point.rank} (rank(s) traced: {shown})"
    if point.then is not None and point.then.rank not in ranks:
        return f"its second fault's rank {point.then.rank} is none the fault-free run traced"
    if point.phase is not None:
        seen = sorted({str(r.get("name")) for r in ref.traces.get((point.rank, 0), [])
                       if r.get("event") == "phase" and r.get("name") != "chaos.probe"
                       and isinstance(r.get("info"), dict) and r["info"].get("step") == point.step})
        if point.phase in seen:
            return None
        return (f"rank {point.rank} announced no phase {point.phase!r} of step {point.step} in the fault-free run"
                + (f" (its phases of that step: {', '.join(seen)})" if seen else
                   " (no phase of that step: a checkpointer announces its phases through chaos.phases)"))
    if point.op is not None:
        ords = [r["ord"] for r in ref.traces.get((point.rank, 0), [])
                if r.get("event") == "op" and isinstance(r.get("ord"), int)]
        if not ords:
            return f"rank {point.rank}'s fault-free run traced no file event"
        if point.op > max(ords):
            return (f"rank {point.rank}'s fault-free run traced {len(ords)} file event(s), op{min(ords)} to "
                    f"op{max(ords)}")
    step = point.step if point.step is not None else point.at_step if point.strikes_newest else None
    if step is not None:
        last = ref.golden.last_steps.get(point.rank)
        if last is None:
            return (f"rank {point.rank} announced no step in the fault-free run (give --step-regex or "
                    "--loss-regex, or call chaos.probe.step)")
        if step > last:
            return f"rank {point.rank}'s last step announced in the fault-free run was {last}"
    return None


def _run(args: argparse.Namespace, job: JobSpec, stop: _Stop | None = None) -> int:
    from chaos.plan.pointset import by_kind
    from chaos.run.explore import Interrupted, explore
    from chaos.run.results import job_results_document, write_results

    only = [parse_point(p) for p in args.point] or None
    if only and job.nodes is None and any(p.family == "node" for p in only):
        raise ConfigError(f"--point {next(p.id for p in only if p.family == 'node')}: a node point needs --nodes N")
    for point in only or []:  # a family's own refusal: a kill's lost=true without --ranks N, a restart without docker
        refuse = families()[point.family].refusal if point.family in families() else None
        if refuse is not None and (why := refuse(job, point)) is not None:
            raise ConfigError(f"--point {point.replay_id}: {why}")
        if point.lost and args.executor == "slurm":  # (explore.resized_reference runs in this process only)
            raise ConfigError(f"--point {point.replay_id}: lost=true is judged against a fault-free resize this "
                              "process runs; not with --executor slurm, whose tasks run the points elsewhere")
    _check_ci_outputs(args)
    executor = None
    if args.executor == "slurm":
        from chaos.run import slurmexec

        slurmexec.check()  # before the fault-free runs: one line where no controller answers
        executor = slurmexec.SlurmExecutor(args.jobs, tuple(args.executor_opt))
    results: list[Any] = []
    started = time.monotonic()
    progress: dict[str, Any] = {"planned": 0, "found": 0, "shown": started, "seconds": []}

    def on_reference(ref: Reference) -> None:
        for point in only or []:
            why = unreachable(job, ref, point)
            if why:
                raise ConfigError(f"--point {point.replay_id} is not a point of this job: {why}")
        mode = "torchrun (its agent restarts the workers)" if job.torchrun else (
            f"{job.ranks} rank(s)" if job.ranks else "one process")
        if job.nodes:
            mode = f"{job.nodes} nodes, a torchrun agent each in its own network namespace"
        if ref.netlab:
            mode += (" (the second run, as every network-cut point, with each copy on a network of the engine)"
                     if ref.net_engine else
                     " (the second run, as every network-cut point, with each copy in its own network namespace)")
        _say(f"fault-free runs: {mode}, {sum(ref.events.values())} file event(s) traced, "
             f"{len(ref.points)} point(s) found, {ref.seconds:.1f} s")
        _say("  points by kind: " + (", ".join(f"{n} {k}" for k, n in by_kind(ref.points).items()) or "none"))
        for note in ref.notes:
            _say(f"  note: {note}")
        progress["found"] = len(ref.points)
        progress["planned"] = (sum(len(ref.expand(job, p)) for p in only) if only else  # (all:stepS:power: many)
                               min(len(ref.points), args.max_points or len(ref.points)))
        progress["planned"] += 0 if only else args.resume_points  # at most: each a passing point struck again
        said = cost_line(progress["planned"], ref.seconds, args.jobs, args.budget, args.max_points)
        if said:
            print(said, file=sys.stderr, flush=True)

    def on_result(res: Any) -> None:
        results.append(res)
        progress["seconds"].append(res.seconds)
        if args.json:
            write_results(args.json, job_results_document(job, None, results, _so_far(progress, len(results))))
        v = res.verdict
        if v.verdict in ("fail", "error"):  # one line as it comes; the end groups the failures by cause
            where = f" ({res.point.kind} {res.point.path})" if res.point.kind else ""
            _say(f"{v.outcome.upper()} {res.point.id}{where}: {v.summary}")
        _progress(args, progress, len(results), started)

    try:
        exploration = explore(job, seed=args.seed, max_points=args.max_points, budget_s=args.budget, jobs=args.jobs,
                              only=only, scratch_base=args.scratch, keep=args.keep, on_reference=on_reference,
                              on_result=on_result, executor=executor, resume_points=args.resume_points)
    except Interrupted as interrupted:  # every process of the job is gone, the scratch root too
        if stop is not None:
            stop.settled = True
        return _interrupted(args, job, interrupted, started)
    if stop is not None:
        stop.settled = True  # from here on a signal waits for the results to be written
    final = exploration.results
    doc = job_results_document(job, exploration, final)
    if executor is not None and executor.record:  # which array jobs ran the points, retried, lost
        doc["job"]["executor"] = executor.record
    tally = _tally(final)
    second = exploration.struck_again
    line = (f"{tally}; coverage {len(exploration.first_points)}/{exploration.found} point(s) "
            f"({exploration.coverage:.0%})" + (f", and {second} struck again in their resume" if second else "")
            + f" in {time.monotonic() - started:.1f} s")
    status = _report(args, job, doc, line, final, exploration.reference.golden.tolerance)
    missed = [r for r in final if only and r.verdict.outcome == "not_reached"]
    if missed:  # asked for by name and never reached: a mistake (or a drifted replay), never a pass
        r = missed[0]
        print(f"chaos: error: --point {r.point.id} was never reached: {_printable(r.verdict.summary)}"
              + (f" (and {len(missed) - 1} more)" if len(missed) > 1 else ""), file=sys.stderr)
        status = 2
    if stop is not None and stop.signum is not None:
        print(f"chaos: {signal.Signals(stop.signum).name} came after the last point; the results above are complete",
              file=sys.stderr)
        return 128 + stop.signum
    return status


def _tally(final: list[Any]) -> str:
    """The counts by outcome (``1 interrupted, 2 hard_failure, 9 pass``), or ``nothing run``."""
    counts: dict[str, int] = {}
    for r in final:
        counts[r.verdict.outcome] = counts.get(r.verdict.outcome, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing run"


def _so_far(progress: dict[str, Any], done: int) -> dict[str, Any]:
    """The ``job`` entry's counts while points still run: what a report of a killed harness's file shows."""
    found = progress["found"]
    return {"points_found": found, "points_chosen": progress["planned"], "points_tried": done,
            "coverage": round(done / found, 4) if found else 0.0}


def _interrupted(args: argparse.Namespace, job: JobSpec, interrupted: Interrupted, started: float) -> int:
    """SIGINT / SIGTERM: the results of what ran (the point cut short recorded as interrupted, not
    judged), ``interrupted after N of M points``, and exit 128 + the signal (130, 143)."""
    from chaos.run.explore import INTERRUPTED
    from chaos.run.results import job_results_document

    name = interrupted.signal_name
    exploration = interrupted.exploration
    elapsed = f"in {time.monotonic() - started:.1f} s"
    if exploration is None:
        record = {"signal": name, "during": "the fault-free runs", "after": 0, "points": []}
        doc = job_results_document(job, None, [], {"interrupted": record})
        line = f"nothing run; interrupted during the fault-free runs ({name}), before any point ran, {elapsed}"
        final: list[Any] = []
        tolerance = False
    else:
        final = exploration.results
        doc = job_results_document(job, exploration, final)
        record = exploration.interrupted or {}
        line = (f"{_tally(final)}; interrupted after {record.get('after', 0)} of {record.get('of', 0)} points "
                f"({name}); coverage {len(exploration.first_points)}/{exploration.found} point(s) "
                f"({exploration.coverage:.0%}) {elapsed}")
        tolerance = exploration.reference.golden.tolerance
        for r in final:
            if r.verdict.outcome == INTERRUPTED:
                _say(f"INTERRUPTED {r.point.id}: {r.verdict.summary}")
    _report(args, job, doc, line, final, tolerance)
    left = "kept (--keep)" if args.keep else "removed"
    print(f"chaos: interrupted ({name}); every process of the job was stopped and its scratch root {left}",
          file=sys.stderr)
    return 128 + interrupted.signum


def _report(args: argparse.Namespace, job: JobSpec, doc: dict[str, Any], line: str, final: list[Any],
            tolerance: bool) -> int:
    """The end of a run, finished or interrupted: the results JSON, the counts line, every report
    asked for, then one line saying where each was written; the exit status of ``final``'s verdicts."""
    from chaos.run.results import exit_status, write_results
    from reports.causes import console_lines

    if args.json:
        write_results(args.json, doc)
    for text in console_lines(doc):  # one block per cause: its count, fix, representative and replay
        _say(text)
    _say(line)
    if tolerance:
        _say("tolerance mode: the fault-free runs differed, results were compared within "
             f"rtol {job.rtol:g}, not bit for bit")
    if args.chaos_mesh:
        from chaos.nemesis.nodes import write_chaos_mesh

        written = write_chaos_mesh(args.chaos_mesh, job, [r.point for r in final])
        _say(f"Chaos Mesh resources for {len(written)} node point(s) written to {args.chaos_mesh}")
    where = ([f"results JSON {args.json}"] if args.json else []) + _ci_reports(args, doc)
    if where:
        _say("written: " + "; ".join(where))
    return exit_status(r.verdict.verdict for r in final)


PROGRESS_EVERY_S = 5.0  # at most one progress line this often: a CI log stays readable


LONG_RUN_S = 300.0  # an exploration estimated longer than this says so before its first point


def cost_line(planned: int, per_point: float, jobs: int, budget: float | None, max_points: int | None,
              cores: int | None = None) -> str | None:
    """Before the first point, where the run looks long (over :data:`LONG_RUN_S`): what it will
    cost and what ``--max-points`` / ``--jobs`` would make of it; None for a short run.

    A point is about as long as the fault-free runs were (``per_point``: the run to the point
    and the resume, two interpreter starts), ``jobs`` at a time, never past ``--budget``;
    more ``--jobs`` is suggested only where ``cores`` (default: this machine's) has room.
    """
    jobs = max(1, jobs)
    cores = cores or os.cpu_count() or 1

    def total(points: int, at_once: int) -> float:
        t = per_point * -(-points // at_once)
        return min(t, budget) if budget is not None else t

    if planned < 1 or total(planned, jobs) <= LONG_RUN_S:
        return None
    fits = max(1, int(LONG_RUN_S // max(per_point, 1e-9)) * jobs)
    options = []
    if fits < planned and max_points is None:
        options.append(f"--max-points {fits} about {_duration(total(fits, jobs))}")
    if jobs < planned and jobs * 2 <= cores:
        options.append(f"--jobs {jobs * 2} about {_duration(total(planned, jobs * 2))}")
    return (f"estimate: about {_duration(total(planned, jobs))} for {planned} point(s) at about {per_point:.1f} s a "
            f"point, {jobs} at a time" + (f"; {', '.join(options)}" if options else "")
            + (" (within the --budget)" if budget is not None else ""))


def progress_line(done: int, planned: int, seconds: list[float], jobs: int, elapsed: float,
                  budget: float | None) -> str:
    """``progress: 5/24 point(s) done in 31 s, about 1 min 2 s left (6.2 s a point, 2 at a time)``.

    The time left is the mean point time so far times the rounds still to run (``jobs``
    points at a time), never more than the ``--budget`` left: no point starts after it.
    """
    line = f"progress: {done}/{planned} point(s) done in {_duration(elapsed)}"
    if seconds and planned > done:
        mean = sum(seconds) / len(seconds)
        rounds = -(-(planned - done) // max(1, jobs))
        left = mean * rounds
        if budget is not None:
            left = min(left, max(0.0, budget - elapsed))
        line += f", about {_duration(left)} left ({mean:.1f} s a point, {max(1, jobs)} at a time)"
    if budget is not None:
        line += f"; {max(0.0, budget - elapsed):.0f} s of the {budget:g} s budget left"
    return line


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _progress(args: argparse.Namespace, progress: dict[str, Any], done: int, started: float) -> None:
    """At most every PROGRESS_EVERY_S seconds of a long exploration, on stderr (stdout keeps the
    verdicts): points done / planned and the time left (:func:`progress_line`). Called by
    :func:`_run`'s ``on_result``, after each point."""
    now = time.monotonic()
    if now - progress["shown"] < PROGRESS_EVERY_S or done >= progress["planned"]:
        return
    progress["shown"] = now
    print(progress_line(done, progress["planned"], progress["seconds"], args.jobs, now - started, args.budget),
          file=sys.stderr, flush=True)


def _check_ci_outputs(args: argparse.Namespace) -> None:
    from reports.cases import check_output

    for flag, path in (("--junit", args.junit), ("--summary", args.summary), ("--html", args.html)):
        check_output(path, flag)


def _ci_reports(args: argparse.Namespace, doc: dict[str, Any]) -> list[str]:
    """``--junit``, ``--summary`` and ``--html``, from the same document as ``--json`` (reports.junit,
    reports.summary, and reports.html's renderer, as ``chaos report`` calls it); what was written where."""
    where = []
    if args.junit:
        from reports.junit import write_junit

        write_junit(doc, args.junit)
        where.append(f"JUnit XML {args.junit}")
    if args.summary:
        from reports.summary import append_summary

        append_summary(doc, args.summary)
        where.append(f"Markdown summary appended to {args.summary}")
    if args.html:
        from pathlib import Path

        from reports.html import render_report

        render_report(doc, Path(args.html), {"source": Path(args.json).name} if args.json else None)
        where.append(f"HTML report {args.html}")
    return where
