"""``chaos run [options] -- COMMAND...``: a user's own job under chaos.

``chaos.cli.main`` hands over here when the arguments of ``run`` contain ``--``;
everything after it is COMMAND, with ``{out}`` where the job takes its output
directory. Prints one line per failing point (its outcome, the evidence, and the
command that replays exactly that point), then the counts and the coverage.
Exit status as for every ``chaos run``: 0 all pass or skipped, 1 any fails, 2 harness
error or bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from typing import Any

from chaos.errors import ChaosError, ConfigError
from chaos.job.spec import (
    DEFAULT_GRACE_S,
    DEFAULT_NET_HOLD_S,
    DEFAULT_NODE_HOLD_S,
    FAULT_KINDS,
    MODES,
    JobSpec,
    parse_point,
    replay_point,
)


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
    p.add_argument("--jobs", type=int, default=1, metavar="J", help="points run concurrently")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--point", action="append", default=[], metavar="ID",
                   help="run only this point (a replay; repeatable)")
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
    p.add_argument("--max-restarts", type=int, default=1, metavar="K", help="restarts after a fault (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="seconds per attempt")
    p.add_argument("--rtol", type=float, default=1e-3, help="tolerance mode: relative tolerance of results")
    p.add_argument("--json", metavar="PATH", help="write the results JSON here")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML here: a test case per point (for CI test reports)")
    p.add_argument("--summary", metavar="FILE",
                   help="append a Markdown summary to FILE (e.g. $GITHUB_STEP_SUMMARY); never truncates it")
    p.add_argument("--scratch", metavar="DIR", help="parent of the scratch root (default: system temp)")
    p.add_argument("--keep", action="store_true", help="keep the scratch root for inspection")
    return p


def help_epilog() -> str:
    """The job options, for the end of ``chaos run --help`` (``chaos.cli`` shows them there)."""
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
                  timeout_s=args.timeout, rtol=args.rtol, modes=tuple(m for m in args.modes.split(",") if m),
                  faults=tuple(f for f in args.faults.split(",") if f) if args.faults is not None else None,
                  grace_s=args.grace, net_hold_s=args.net_hold, nodes=args.nodes, node_hold_s=args.node_hold)
    if args.chaos_mesh is not None and job.nodes is None:
        raise ConfigError("--chaos-mesh writes node faults: it needs --nodes N")
    return args, job


def _say(text: str) -> None:
    """A line on stdout. Every caller's text may hold the job's own output (a summary quotes its
    traceback) or names it chose (its files, a replayed results file's ids), so control
    characters are shown as escapes, never acted on by the terminal (``reports.cases.printable``)."""
    from reports.cases import printable

    print(printable(text), flush=True)


def replay_argv(doc: dict[str, Any], ids: list[str], source: str) -> tuple[list[str], str | None]:
    """``chaos replay RESULTS.json`` of a job run: the options and COMMAND that rerun its failing
    points (or ``ids``) exactly, and the directory the job ran in. Called by ``chaos.cli``."""
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


def main(argv: list[str], cwd: str | None = None) -> int:
    """Run a job's exploration; every error is one line on stderr and exit 2.

    ``cwd``: where COMMAND runs (a replay runs it where the recorded run did); default here.
    """
    from chaos.job import launch

    try:
        args, job = build(argv)
        if cwd is not None:
            if not os.path.isdir(cwd):
                raise ConfigError(f"the recorded job ran in {cwd}, which does not exist here")
            job = dataclasses.replace(job, cwd=cwd)
        return _run(args, job)
    except ConfigError as exc:
        print(f"chaos: error: {_printable(exc)}", file=sys.stderr)
        return 2
    except ChaosError as exc:  # a JobError quotes the job's output
        print(f"chaos: harness error: {_printable(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        launch.kill_all()
        print("chaos: interrupted; every process of the job was stopped", file=sys.stderr)
        return 130
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


def _run(args: argparse.Namespace, job: JobSpec) -> int:
    from chaos.job.explore import explore
    from chaos.job.pointset import by_kind
    from chaos.job.results import exit_status, results_document, write_results

    only = [parse_point(p) for p in args.point] or None
    if only and job.nodes is None and any(p.family == "node" for p in only):
        raise ConfigError(f"--point {next(p.id for p in only if p.family == 'node')}: a node point needs --nodes N")
    _check_ci_outputs(args)
    results: list[Any] = []
    started = time.monotonic()
    progress = {"planned": 0, "shown": started}

    def on_reference(ref: Any) -> None:
        mode = "torchrun (its agent restarts the workers)" if job.torchrun else (
            f"{job.ranks} rank(s)" if job.ranks else "one process")
        if job.nodes:
            mode = f"{job.nodes} nodes, a torchrun agent each in its own network namespace"
        if ref.netlab:
            mode += ", each in its own network namespace"
        _say(f"fault-free runs: {mode}, {sum(ref.events.values())} file event(s) traced, "
             f"{len(ref.points)} point(s) found, {ref.seconds:.1f} s")
        _say("  points by kind: " + (", ".join(f"{n} {k}" for k, n in by_kind(ref.points).items()) or "none"))
        for note in ref.notes:
            _say(f"  note: {note}")
        progress["planned"] = len(only) if only else min(len(ref.points), args.max_points or len(ref.points))

    def on_result(res: Any) -> None:
        results.append(res)
        if args.json:
            write_results(args.json, results_document(job, None, results))
        v = res.verdict
        if v.verdict in ("fail", "error"):
            where = f" ({res.point.kind} {res.point.path})" if res.point.kind else ""
            _say(f"{v.outcome.upper()} {res.point.id}{where}: {v.summary}")
            _say(f"  replay: {res.replay}")
        _progress(args, progress, len(results), started)

    exploration = explore(job, seed=args.seed, max_points=args.max_points, budget_s=args.budget, jobs=args.jobs,
                          only=only, scratch_base=args.scratch, keep=args.keep, on_reference=on_reference,
                          on_result=on_result)
    final = exploration.results
    doc = results_document(job, exploration, final)
    if args.json:
        write_results(args.json, doc)
    counts: dict[str, int] = {}
    for r in final:
        counts[r.verdict.outcome] = counts.get(r.verdict.outcome, 0) + 1
    tally = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing run"
    _say(f"{tally}; coverage {len(final)}/{exploration.found} point(s) "
         f"({exploration.coverage:.0%}) in {time.monotonic() - started:.1f} s")
    if exploration.reference.golden.tolerance:
        _say("tolerance mode: the fault-free runs differed, results were compared within "
             f"rtol {job.rtol:g}, not bit for bit")
    if args.json:
        _say(f"results written to {args.json}")
    if args.chaos_mesh:
        from chaos.job.nodes import write_chaos_mesh

        written = write_chaos_mesh(args.chaos_mesh, job, [r.point for r in final])
        _say(f"Chaos Mesh resources for {len(written)} node point(s) written to {args.chaos_mesh}")
    _ci_reports(args, doc)
    return exit_status(final)


PROGRESS_EVERY_S = 10.0


def _progress(args: argparse.Namespace, progress: dict[str, Any], done: int, started: float) -> None:
    """Every PROGRESS_EVERY_S seconds of a long exploration: points done / planned, budget left."""
    now = time.monotonic()
    if now - progress["shown"] < PROGRESS_EVERY_S or done >= progress["planned"]:
        return
    progress["shown"] = now
    left = f", {max(0.0, args.budget - (now - started)):.0f} s of the {args.budget:g} s budget left" if args.budget else ""
    _say(f"progress: {done}/{progress['planned']} point(s) done{left}")


def _check_ci_outputs(args: argparse.Namespace) -> None:
    from reports.cases import check_output

    for flag, path in (("--junit", args.junit), ("--summary", args.summary)):
        check_output(path, flag)


def _ci_reports(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    """``--junit`` and ``--summary``, from the same document as ``--json`` (reports.junit, reports.summary)."""
    if args.junit:
        from reports.junit import write_junit

        write_junit(doc, args.junit)
        _say(f"JUnit XML written to {args.junit}")
    if args.summary:
        from reports.summary import append_summary

        append_summary(doc, args.summary)
        _say(f"summary appended to {args.summary}")
