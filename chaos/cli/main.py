"""``chaos``: run, replay, and the subcommands other modules contribute.

Exit status: 0 all scenarios pass, 1 any fails, 2 harness error or bad input (one
clear line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from chaos.errors import ChaosError, ConfigError
from chaos.model.grammar import parse_fault
from chaos.model.keyvalue import key_values
from chaos.plan.scenario import Scenario
from chaos.run.campaign import DEFAULT_BUDGET_S
from chaos.target.workload.config import DEVICES, WorkloadConfig

# Modules that add a subcommand (each has NAME, HELP, add_arguments and run), in help order.
EXTRA_COMMANDS = ("chaos.cli.commands.interval", "chaos.bench.command", "chaos.cli.commands.report",
                  "chaos.cli.commands.selfcheck", "chaos.cli.commands.engine", "chaos.cli.commands.slurm",
                  "chaos.cli.commands.certify", "chaos.cli.commands.savers", "chaos.cli.commands.repro",
                  "chaos.cli.commands.findings", "chaos.cli.commands.clean")


def default_campaign(cfg: WorkloadConfig, world_size: int) -> list[list[str]]:
    """The embedded default: one scenario per fault family, each aimed past the middle of the run.

    A kill between two saves, a preemption, a crash in the middle of a save's writes, a
    rank killed as a save begins while the survivors run on with their part of it (as a
    real launcher lets them until its monitor notices), a bit flip in the newest
    checkpoint, a payload planted in it, a full disk, a dropped network link (root only;
    skipped with the reason elsewhere) and a power loss during a save.
    """
    def between(fraction: float) -> int:
        step = max(2, round(cfg.steps * fraction))
        return step - 1 if cfg.save_every and step % cfg.save_every == 0 else step

    saves = cfg.save_steps() or [cfg.steps]
    mid_save = saves[len(saves) // 2]
    last = world_size - 1
    # At-rest faults once two saves exist: destroying the only checkpoint leaves nothing a
    # correct checkpointer could resume (the reference then rightly refuses to start over).
    at_rest = min(cfg.steps, max(between(0.575), saves[1] + 1 if len(saves) > 1 else 0))
    return [
        [f"kill:rank={last},step={between(0.575)}"],
        [f"term:rank=0,step={between(0.45)},grace=2"],
        [f"crash:rank={last},step={mid_save},op=write,nth=2"],
        [f"kill:rank={last},phase=save,step={saves[-2] if len(saves) > 1 else mid_save},linger=3"],
        [f"bitflip:step={at_rest},bits=16,region=data,seed={cfg.seed}"],
        [f"payload:step={at_rest},format=pickle,seed={cfg.seed}"],
        [f"diskfull:step={max(1, mid_save - 1)},free=4096"],
        [f"netdrop:rank={last},step={between(0.575)}"],
        [f"powerloss:step={mid_save},seed={cfg.seed},max_states=60"],
    ]


def build_scenarios(args: argparse.Namespace) -> list[Scenario]:
    """``--fault`` given: one scenario with those faults. None: the default campaign.

    ``--budget`` (generated schedules) needs hypothesis: checked here, so a missing
    development dependency is one error line before anything runs.
    """
    overrides = key_values(args.workload, "--workload")
    known = {f.name for f in dataclasses.fields(WorkloadConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"unknown --workload key(s) {', '.join(unknown)}: known are {', '.join(sorted(known))}")
    device = getattr(args, "device", None)  # --device is --workload device=..., said plainly
    if device is not None:
        if overrides.get("device", device) != device:
            raise ConfigError(f"--device {device} contradicts --workload device={overrides['device']}")
        overrides["device"] = device
    cfg = WorkloadConfig(**{**overrides, "seed": args.seed, "steps": args.steps, "save_every": args.save_every})
    if args.budget is not None and args.budget < 0:
        raise ConfigError(f"--budget must be a non-negative number of seconds, got {args.budget:g}")
    if args.budget and not args.fault:
        from chaos.run.campaign import require_hypothesis

        require_hypothesis()  # before the family scenarios, not a minute later
    plans = [args.fault] if args.fault else default_campaign(cfg, args.world_size)
    options = key_values(args.ckpt_opt, "--ckpt-opt")
    if args.checkpointer == "reference" and "storage" in options:  # refused now, not once ranks are up
        from chaos.reference.storage.base import StorageConfigError, parse_url

        try:
            parse_url(str(options["storage"]))
        except StorageConfigError as exc:
            raise ConfigError(f"--ckpt-opt storage: {exc}") from None
    scenarios = []
    for specs in plans:
        faults = [parse_fault(f) for f in specs]
        workload = cfg
        if any(f.family == "net" for f in faults) and "collective_timeout_s" not in overrides:
            workload = dataclasses.replace(cfg, collective_timeout_s=5.0)  # a cut link fails in seconds
        scenarios.append(Scenario(checkpointer=args.checkpointer, world_size=args.world_size, workload=workload,
                                  faults=faults, ckpt_options=dict(options), max_restarts=args.max_restarts,
                                  loss_band=args.loss_band, driver=args.driver, image=args.image))
    return scenarios


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write the results JSON here")
    p.add_argument("--html", metavar="PATH", help="write the HTML report here")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML here: a test case per scenario (for CI test reports)")
    p.add_argument("--summary", metavar="FILE",
                   help="append a Markdown summary to FILE (e.g. $GITHUB_STEP_SUMMARY); never truncates it")
    p.add_argument("--scratch", metavar="DIR", help="parent directory of scenario scratch roots (default: system temp)")
    p.add_argument("--keep", action="store_true", help="keep each scenario's scratch root for inspection")
    p.add_argument("--cache-dir", metavar="DIR", help="golden-run cache (default ~/.cache/chaos/golden)")
    p.add_argument("--no-cache", action="store_true", help="always rerun the golden run")
    p.add_argument("--hang-timeout", type=float, default=60.0, metavar="S",
                   help="declare a hang when no rank makes progress for S seconds")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chaos", description="Chaos harness for training-checkpoint recovery.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from chaos.cli.job import help_epilog

    run = sub.add_parser("run", help="run fault scenarios against a checkpointer and judge recovery",
                         epilog=help_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--checkpointer", default="reference",
                     help="built-in name (reference, dcp, dcp-async, torch-save), pkg.module:Class or file.py:Class")
    run.add_argument("--ckpt-opt", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword option passed to the checkpointer (repeatable)")
    run.add_argument("--world-size", type=int, default=2)
    run.add_argument("--steps", type=int, default=40)
    run.add_argument("--save-every", type=int, default=5)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--max-restarts", type=int, default=3)
    run.add_argument("--fault", action="append", default=[], metavar="SPEC",
                     help="e.g. rank1:step23:kill | rank0:step12:term,grace=2 | ckpt:step8:bitflip,bits=2, or the "
                          "older kill:rank=1,step=23 (repeatable; docs/reference/faults.md: the grammar)")
    run.add_argument("--driver", default="process", metavar="NAME",
                     help="run ranks as forked processes (default) or as Docker containers (see `chaos engine`)")
    run.add_argument("--image", default=None, metavar="NAME",
                     help="--driver docker: a real image with Python, torch and chaos-ckpt (default: an empty "
                          "image with the host's Python bind-mounted read-only)")
    run.add_argument("--device", choices=DEVICES, default=None,
                     help="where the built-in workload computes: cpu (gloo, default) or cuda (one GPU per rank, "
                          "NCCL; judged in tolerance mode unless --workload deterministic=true)")
    run.add_argument("--workload", action="append", default=[], metavar="KEY=VALUE",
                     help="override a workload setting, e.g. d_model=128 (repeatable)")
    run.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                     help="without --fault: after the one scenario per fault family, spend this many more "
                          "seconds on generated schedules whose faults are drawn from a traced fault-free run "
                          "(needs hypothesis, a dev dependency; default: none)")
    run.add_argument("--loss-band", type=float, default=None, metavar="REL",
                     help="loss_continuity: relative band around the golden loss (default 0.005); "
                          "with --workload nondeterminism=X>0 or --device cuda, bit_exact is not judged "
                          "(tolerance mode)")
    run.add_argument("--as-job", action="store_true",
                     help="run the built-in workload as a job through the job pipeline (python -m "
                          "chaos.target.workload): every job fault family at every file event of the run; the job "
                          "mode's own options (--max-points N, default 12; --faults K,...; --jobs J) pass through, "
                          "--fault is its --point, --budget its --budget")
    _add_run_options(run)

    replay = sub.add_parser("replay", help="rerun scenarios (or a job's points) exactly as recorded in a results JSON")
    replay.add_argument("results", help="results JSON written by chaos run --json")
    replay.add_argument("--scenario", action="append", default=[], metavar="ID",
                        help="only these scenario ids (default: every failing one, else all)")
    replay.add_argument("--yes", action="store_true",
                        help="run what a results file not provably written by you on this host says (a CI "
                             "artifact, an older file) without asking")
    replay.add_argument("--dry-run", action="store_true", help="print what the replay would run, run nothing")
    _add_run_options(replay)

    for name in EXTRA_COMMANDS:  # a module that fails to import is a broken install: said, never skipped
        module = importlib.import_module(name)
        extra = sub.add_parser(module.NAME, help=module.HELP)
        module.add_arguments(extra)
        extra.set_defaults(handler=module.run)
    from chaos.bench.command import ALIASES
    from chaos.bench.command import module as bench_module

    for old, new in ALIASES.items():  # `chaos bench job` ...: hidden aliases of `chaos bench job` for a release
        bench = bench_module(new)
        alias = sub.add_parser(old)
        bench.add_arguments(alias)
        alias.set_defaults(handler=bench.run)
    _hide(sub, set(ALIASES))
    return parser


def _hide(sub: Any, names: set[str]) -> None:
    """Leave subcommands ``names`` out of ``chaos --help`` (argparse lists every one it has)."""
    sub._choices_actions[:] = [a for a in sub._choices_actions if a.dest not in names]


def _read_results(args: argparse.Namespace) -> dict[str, Any]:
    """The results document ``chaos replay`` reads, checked against the schema (chaos.model.resultschema)."""
    from chaos.model.resultschema import load_results

    return load_results(args.results)


def _confirm(args: argparse.Namespace, doc: dict[str, Any], commands: list[str]) -> bool:
    """Print what a replay will run; whether to run it.

    Called by ``chaos replay`` once it knows exactly what it would run, before it runs any
    of it: a results file may come from anyone (a CI artifact), and a replay runs its job's
    COMMAND or imports its checkpointer file. False with ``--dry-run``. A file this user
    wrote on this host (``chaos.model.resultschema.not_ours``) runs at once; any other needs
    ``--yes`` or a "y" typed at a terminal, else one ConfigError line saying why.
    """
    from chaos.model.resultschema import not_ours
    from reports.cases import printable

    for command in commands:
        print(f"chaos replay: {printable(command)}", flush=True)
    if args.dry_run:
        return False
    why = not_ours(doc)
    if why is None or args.yes:
        return True
    try:
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError, OSError):
        interactive = False
    if interactive:
        answer = input(f"{printable(args.results)}: {why}. Run the above? [y/N] ")
        if answer.strip().lower() in ("y", "yes"):
            return True
    raise ConfigError(f"{args.results}: not replayed: {why}; read the command(s) above, then pass --yes to run "
                      "them (--dry-run only prints them)")


def _replay_job(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    """``chaos replay`` of a job's results (``chaos run -- COMMAND``): its failing points (or
    ``--scenario`` ids) rerun exactly, in the directory the job ran in, by job mode itself."""
    import shlex

    from chaos.cli.job import main as job_main
    from chaos.cli.job import output_options, replay_argv

    argv, cwd = replay_argv(doc, args.scenario, args.results)
    extra = output_options(args)
    moved = _image_moved(doc)
    if moved:
        print(f"chaos: note: {moved}", file=sys.stderr)
    where = f"in {cwd}" if cwd else "here"
    if not _confirm(args, doc, [f"{where}: {shlex.join(['chaos', 'run', *extra, *argv])}"]):
        return 0
    return job_main([*extra, *argv], cwd=cwd)


def _image_moved(doc: dict[str, Any]) -> str | None:
    """Where a ``--launcher docker`` run's image is no longer the one its points ran on: the replay
    runs the image as it is now (a rebuilt one, to check a fix), and says so."""
    from chaos.model.jobspec import IMAGE_REF

    ran_on = (doc.get("environment") or {}).get("docker")
    if (not isinstance(ran_on, dict) or not isinstance(ran_on.get("image_id"), str) or ran_on.get("host_mounted")
            or not isinstance(ran_on.get("image"), str) or not IMAGE_REF.fullmatch(ran_on["image"])):
        return None  # the host-mounted empty image is made per engine: the host's files are what ran
    from chaos.launch.containers import describe

    try:
        now = describe(ran_on["image"])
    except ConfigError:
        return None  # no engine now: the replay itself says so
    if now.get("image_id") == ran_on["image_id"]:
        return None
    return (f"image {ran_on.get('image')} is {now.get('image_id') or 'not on the engine'} now; the recorded run "
            f"was on {ran_on['image_id']}")


def _load_replay(args: argparse.Namespace, doc: dict[str, Any]) -> list[Scenario]:
    path = Path(args.results)
    entries = doc["scenarios"]
    if args.scenario:
        chosen = [e for e in entries if e.get("id") in args.scenario]
        missing = set(args.scenario) - {e.get("id") for e in chosen}
        if missing:
            raise ConfigError(f"{path} has no scenario {', '.join(sorted(missing))}")
    else:
        chosen = [e for e in entries if e.get("verdict") in ("fail", "error")] or entries
    try:
        return [Scenario.from_dict(e["scenario"]) for e in chosen]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: scenario entry is malformed: {type(exc).__name__}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: a recorded scenario: {exc}") from None


def _replay(args: argparse.Namespace) -> int:
    """``chaos replay RESULTS.json``: what it would run, printed; then run it where allowed (``_confirm``)."""
    doc = _read_results(args)
    if "job" in doc:
        return _replay_job(args, doc)
    scenarios = _load_replay(args, doc)
    if not _confirm(args, doc, [s.replay_command() for s in scenarios]):
        return 0
    return _run(args, scenarios)


def _run(args: argparse.Namespace, scenarios: list[Scenario]) -> int:
    """Run, then write the results, then render: evidence is on disk before anything can fail to print.

    The results JSON is rewritten after every scenario, so a harness crash or a Ctrl-C
    later in a campaign still leaves every finished scenario's verdict and replay
    command in ``--json``; ``main`` turns such a crash into exit 2.
    """
    from chaos.cli.console import LiveProgress, make_console, scenario_line, summary_table
    from chaos.run.campaign import run_pipelined
    from chaos.run.results import exit_status, results_document, write_results
    from chaos.run.runner import RunOptions
    from reports.cases import check_output

    for flag, path in (("--junit", args.junit), ("--summary", args.summary)):
        check_output(path, flag)  # before the run, not after it
    console = make_console()
    options = RunOptions(scratch_base=args.scratch, keep=args.keep,
                         cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                         use_golden_cache=not args.no_cache, hang_timeout_s=args.hang_timeout)
    results: list[Any] = []
    campaign: dict[str, Any] = {}

    def save() -> None:
        if args.json:
            write_results(args.json, results_document(results, campaign.get("doc")))

    started = time.monotonic()
    try:
        with LiveProgress(console, len(scenarios)) as live:
            def done(result: Any) -> None:  # in scenario order; the next one's ranks may already run
                live.finish(result)
                results.append(result)
                save()
                scenario_line(console, result, position=f"[{len(results)}/{len(scenarios)}] ")

            # Each scenario is judged while the next one's ranks run (chaos.run.campaign.run_pipelined).
            run_pipelined(scenarios, options, on_start=live.start, progress=live.update, on_result=done)
        if getattr(args, "command", None) == "run" and not args.fault and scenarios:
            generated = _generated(args, scenarios[0], options, console, started, results)
            results += generated
            if hasattr(generated, "to_dict"):
                campaign["doc"] = generated.to_dict()
    finally:
        save()  # also on a crash or Ctrl-C: what finished is kept
    if args.json:
        console.print(f"results written to {args.json}", markup=False, highlight=False)
    if args.html or args.junit or args.summary:
        doc = results_document(results, campaign.get("doc"))
        if args.html:
            from reports.html import render_report

            render_report(doc, Path(args.html))
            console.print(f"report written to {args.html}", markup=False, highlight=False)
        if args.junit:
            from reports.junit import write_junit

            write_junit(doc, args.junit)
            console.print(f"JUnit XML written to {args.junit}", markup=False, highlight=False)
        if args.summary:
            from reports.summary import append_summary

            append_summary(doc, args.summary)
            console.print(f"summary appended to {args.summary}", markup=False, highlight=False)
    summary_table(console, results)
    return exit_status(r.verdict for r in results)


def _generated(args: argparse.Namespace, template: Scenario, options: Any, console: Any, started: float,
               done: list[Any]) -> Any:
    """The campaign's optional second half: generated schedules within ``--budget`` seconds.

    Called by ``_run`` after the family scenarios (``started`` is kept for its call; the
    budget is counted from here). Returns a ``chaos.run.campaign.Campaign``: iterating it
    gives the generated results, ``.to_dict()`` the results document's ``campaign`` entry
    (budget, seed, skipped generated scenarios, fault-point coverage), ``.summary()``
    the closing lines. Without ``--budget`` it runs nothing and needs no hypothesis.
    """
    from chaos.cli.console import LiveProgress, scenario_line
    from chaos.run.campaign import Campaign, fill_budget
    from chaos.run.runner import run_scenario

    budget = args.budget if args.budget is not None else DEFAULT_BUDGET_S
    if not budget:
        campaign = Campaign(family_scenarios=len(done), seed=template.workload.seed)
        console.print(campaign.summary(), markup=False, highlight=False)
        return campaign
    from chaos.record.points import reference_points

    begun = time.monotonic()
    deadline = begun + budget
    console.print(f"tracing a fault-free run of {template.checkpointer} to find its fault points", markup=False,
                  highlight=False)
    points = reference_points(template, options)
    if points.error:
        console.print(f"no I/O fault points: {points.error}", markup=False, highlight=False)
    timed = list(done)

    def estimate() -> float:  # a scenario's mean cost so far: none starts unless one more fits
        return sum(r.seconds for r in timed) / len(timed) if timed else 10.0

    def run_one(specs: list[str]) -> Any:
        scenario = dataclasses.replace(template, faults=[parse_fault(f) for f in specs], id="")
        n = len(timed) - len(done) + 1
        left = f"{max(0.0, deadline - time.monotonic()):.0f} s of the {budget:g} s budget left"
        with LiveProgress(console, 1, title=f"generated schedule {n}", note=left) as live:
            live.start(scenario)
            result = run_scenario(scenario, options, progress=live.update)
            live.finish(result)
        timed.append(result)
        left = f"{max(0.0, deadline - time.monotonic()):.0f} s of budget left"
        scenario_line(console, result, position=f"[generated {n}, {left}] ")
        console.print(f"  generated schedule {n}: {' '.join(specs)}  replay: {result.replay}",
                      markup=False, highlight=False, soft_wrap=True)  # one line: copy-paste replays it
        return result

    campaign = fill_budget(template.workload, template.world_size, points, deadline, run_one, estimate)
    campaign.family_scenarios, campaign.budget_s = len(done), budget
    left = deadline - time.monotonic()
    console.print(f"{campaign.summary()}\n{max(0.0, left):.0f} s of the {budget:g} s budget left", markup=False,
                  highlight=False)
    return campaign


def _printable(exc: BaseException) -> str:
    """An error's message for the terminal: it may quote a results file or a job's output, so its
    control characters are shown as escapes, not acted on (one line, whatever it quotes)."""
    from reports.cases import printable

    return printable(exc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"] and "--" in argv:  # a user's own job: chaos run [options] -- COMMAND...
        from chaos.cli.job import main as job_main

        return job_main(argv[1:])
    parser = make_parser()
    as_job = argv[:1] == ["run"] and "--as-job" in argv
    args, rest = parser.parse_known_args(argv) if as_job else (parser.parse_args(argv), [])

    def _terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        if as_job:  # the built-in workload as one job among others (#28)
            from chaos.cli.asjob import job_argv
            from chaos.cli.job import main as job_main

            return job_main(job_argv(args, rest))
        if args.command == "run":
            return _run(args, build_scenarios(args))
        if args.command == "replay":
            return _replay(args)
        return int(args.handler(args))
    except ConfigError as exc:
        print(f"chaos: error: {_printable(exc)}", file=sys.stderr)
        return 2
    except ChaosError as exc:
        print(f"chaos: harness error: {_printable(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from chaos.launch import cluster

        cluster.kill_all()
        print("chaos: interrupted; every rank process was stopped", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug of the harness itself: exit 2, never a bare traceback
        from chaos.launch import cluster

        cluster.kill_all()
        kept = getattr(args, "json", None)
        where = f"; results of the finished scenarios are in {kept}" if kept else ""
        print(f"chaos: harness error: {type(exc).__name__}: {_printable(exc)}{where}", file=sys.stderr)
        if os.environ.get("CHAOS_DEBUG"):
            traceback.print_exc()
        return 2


if __name__ == "__main__":
    sys.exit(main())
