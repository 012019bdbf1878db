"""`chaos selfcheck`: run the fault battery against a corpus of planted defects and a correct checkpointer.

    chaos selfcheck                                   # the corpus in tests/checkpointers/selfcheck (and jobs/)
    chaos selfcheck --corpus DIR --fail-fast --json selfcheck.json
    chaos selfcheck --checkpointer mine=pkg.mod:Mine --correct mine     # add your own (repeatable)
    chaos selfcheck --only no_fsync,correct --probe powerloss
    chaos selfcheck --only job:correct,job:unpickles --max-points 12   # the job oracles' corpus
    chaos selfcheck --as-job --only as-job:correct,as-job:no_fsync    # checkpointers inside the workload as a job

Every module of the corpus directory defining a ``*Checkpointer`` class is one
checkpointer, named by its file; those named ``correct*`` (or given with ``--correct``)
must pass every probe, every other one carries a defect and declares the probe(s) and
oracle(s) meant to catch it (``EXPECTED_CATCH = {probe: (oracle, ...)}`` in its module;
see :mod:`chaos.run.selfcheck`). Prints a table, what caught or failed each one, and the
score line. Exit status 0 only when every planted defect is caught by its intended
oracle in its intended probe and no correct checkpointer fails a probe; 1 otherwise (a
defect that only other oracles failed is a miss); 2 on bad input, a missing or
malformed ``EXPECTED_CATCH`` included.

The job corpus (``jobs/`` beside the checkpointer corpus, or ``--job-corpus DIR``) scores the
oracles a user's job is judged by the same way: each module is a small training job declaring
how it is run (``CHAOS_JOB``) and, a defect, the fault family and job oracle meant to catch it
(:mod:`chaos.run.jobselfcheck`). Its rows are named ``job:<file>``; ``--no-jobs`` leaves it out.
``--as-job`` adds, for each checkpointer whose module declares ``CHAOS_AS_JOB``, a row
``as-job:<file>``: the built-in workload attacking it as a job, through the job pipeline
(``chaos run --as-job``), caught by the job families and oracles in ``EXPECTED_JOB_CATCH``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos.errors import ConfigError

NAME = "selfcheck"
HELP = "score the harness: run the fault battery against planted-defect checkpointers and a correct one"
DEFAULT_CORPUS = Path("tests/checkpointers/selfcheck")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", metavar="DIR", default=None,
                        help=f"directory of checkpointer modules (default: ./{DEFAULT_CORPUS}, else none)")
    parser.add_argument("--checkpointer", action="append", default=[], metavar="NAME=SPEC",
                        help="add a checkpointer (pkg.module:Class or file.py:Class); repeatable")
    parser.add_argument("--correct", action="append", default=[], metavar="NAME",
                        help="a checkpointer expected to pass (default: names starting with 'correct'); repeatable")
    parser.add_argument("--only", default=None, metavar="NAMES",
                        help="comma-separated checkpointers (and job:NAME jobs) to run")
    parser.add_argument("--job-corpus", metavar="DIR", default=None,
                        help="directory of planted-defect training jobs (default: jobs/ in the corpus, if there)")
    parser.add_argument("--no-jobs", action="store_true", help="leave the job corpus out")
    parser.add_argument("--as-job", action="store_true",
                        help="also run each checkpointer of the corpus that declares CHAOS_AS_JOB inside the built-in "
                             "workload as a job (chaos run --as-job), judged by the job oracles (rows as-job:NAME)")
    parser.add_argument("--max-points", type=int, default=None, metavar="N",
                        help="at most N points per job of the job corpus (default: each job's own, else all)")
    parser.add_argument("--probe", action="append", default=[], metavar="NAME",
                        help="run only these probes of the battery (repeatable; default: all)")
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop probing a planted defect once its intended oracle failed (same score, shorter run)")
    parser.add_argument("--powerloss-states", type=int, default=40, metavar="N",
                        help="crash states the runner explores per power-loss probe (default 40)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--scratch", metavar="DIR", help="parent directory of scenario scratch roots")
    parser.add_argument("--cache-dir", metavar="DIR", help="golden-run cache (default ~/.cache/chaos/golden)")


def _given(flag: str, path: str, discover: Callable[[str], dict[str, Any]], none: str) -> dict[str, Any]:
    """What ``discover`` finds in the directory a flag names; ConfigError where it is none or finds nothing."""
    if not Path(path).is_dir():
        raise ConfigError(f"{flag} {path}: not a directory")
    found = discover(path)
    if not found:
        raise ConfigError(f"{flag} {path}: {none}")
    return found


def _corpus(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, Path]]:
    """The checkpointers and the jobs to run: (name -> spec, job:name -> path), --only applied."""
    from chaos.run.jobselfcheck import default_corpus, discover_as_job, discover_jobs
    from chaos.run.selfcheck import discover

    found: dict[str, str] = {}
    jobs_dir: Path | None = None
    if args.corpus is not None:
        found = _given("--corpus", args.corpus, discover, "no module defines a *Checkpointer class")
        jobs_dir = default_corpus(args.corpus)
    elif DEFAULT_CORPUS.is_dir() and not args.checkpointer:
        found = discover(DEFAULT_CORPUS)
        jobs_dir = default_corpus(DEFAULT_CORPUS)
    for item in args.checkpointer:
        name, eq, spec = item.partition("=")
        if not eq or not name or not spec:
            raise ConfigError(f"malformed --checkpointer {item!r}: expected NAME=SPEC")
        found[name] = spec
    jobs: dict[str, Path] = {}
    if args.job_corpus is not None:
        jobs = _given("--job-corpus", args.job_corpus, discover_jobs, "no module declares CHAOS_JOB")
    elif jobs_dir is not None and jobs_dir.is_dir():
        jobs = discover_jobs(jobs_dir)
    if args.no_jobs:
        jobs = {}
    if args.as_job:  # the same checkpointers, each inside the built-in workload run as a job
        for directory in {str(Path(spec.rpartition(":")[0]).parent) for spec in found.values() if ":" in spec}:
            jobs.update(discover_as_job(directory))
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        missing = [n for n in wanted if n not in found and n not in jobs]
        if missing:
            raise ConfigError(f"--only: unknown checkpointer(s) {', '.join(missing)}; known: "
                              f"{', '.join([*found, *jobs])}")
        found = {n: found[n] for n in wanted if n in found}
        jobs = {n: jobs[n] for n in wanted if n in jobs}
    if not found and not jobs:
        raise ConfigError(f"no checkpointers: give --corpus DIR or --checkpointer NAME=SPEC "
                          f"(./{DEFAULT_CORPUS} does not exist here)")
    return found, jobs


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from chaos.run.jobselfcheck import JobSelfCheckOptions, run_job_selfcheck
    from chaos.run.runner import RunOptions
    from chaos.run.selfcheck import PROBES, SelfCheckOptions, SelfCheckReport, render, run_selfcheck

    checkpointers, jobs = _corpus(args)
    unknown = [p for p in args.probe if p not in PROBES]
    if unknown:
        raise ConfigError(f"unknown --probe {', '.join(unknown)}; the battery has {', '.join(PROBES)}")
    unknown = [n for n in args.correct if n not in checkpointers and n not in jobs]
    if unknown:
        raise ConfigError(f"--correct names no checkpointer being run: {', '.join(unknown)}")
    if args.powerloss_states < 1:
        raise ConfigError(f"--powerloss-states {args.powerloss_states}: must be at least 1")
    if args.max_points is not None and args.max_points < 1:
        raise ConfigError(f"--max-points {args.max_points}: must be at least 1")
    console = Console()

    def progress(name: str, outcome) -> None:  # noqa: ANN001 - ProbeOutcome
        mark = {"pass": "pass", "fail": "FAIL", "skipped": "skip", "error": "ERROR"}.get(outcome.verdict, outcome.verdict)
        oracles = f" ({', '.join(outcome.failing)})" if outcome.failing else ""
        console.print(f"{name:>20}  {outcome.probe:<20} {mark}{oracles}  {outcome.seconds:.1f}s",
                      highlight=False, markup=False)

    options = SelfCheckOptions(
        run=RunOptions(scratch_base=args.scratch, cache_dir=Path(args.cache_dir) if args.cache_dir else None),
        probes=tuple(args.probe) or None, fail_fast=args.fail_fast, powerloss_states=args.powerloss_states,
        progress=progress)
    correct = set(args.correct) if args.correct else None
    report = SelfCheckReport([], 0.0)
    if checkpointers:
        report = run_selfcheck(checkpointers, options, correct=correct)
    if jobs:
        job_options = JobSelfCheckOptions(max_points=args.max_points, scratch_base=args.scratch, progress=progress)
        part = run_job_selfcheck(jobs, job_options, correct=correct & set(jobs) if correct is not None else None)
        report = SelfCheckReport(report.checkpointers + part.checkpointers, report.seconds + part.seconds)
    if args.json:  # the results first: nothing the rendering does can lose them
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2))
    render(report, console)
    if args.json:
        console.print(f"report written to {args.json}", highlight=False, markup=False)
    return 0 if report.passed else 1
