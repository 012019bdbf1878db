"""`chaos selfcheck`: run the fault battery against a corpus of planted defects and a correct checkpointer.

    chaos selfcheck                                   # the corpus in tests/checkpointers/selfcheck
    chaos selfcheck --corpus DIR --fail-fast --json selfcheck.json
    chaos selfcheck --checkpointer mine=pkg.mod:Mine --correct mine     # add your own (repeatable)
    chaos selfcheck --only no_fsync,correct --probe powerloss

Every module of the corpus directory defining a ``*Checkpointer`` class is one
checkpointer, named by its file; those named ``correct*`` (or given with ``--correct``)
must pass every probe, every other one carries a defect and declares the probe(s) and
oracle(s) meant to catch it (``EXPECTED_CATCH = {probe: (oracle, ...)}`` in its module;
see :mod:`chaos.run.selfcheck`). Prints a table, what caught or failed each one, and the
score line. Exit status 0 only when every planted defect is caught by its intended
oracle in its intended probe and no correct checkpointer fails a probe; 1 otherwise (a
defect that only other oracles failed is a miss); 2 on bad input, a missing or
malformed ``EXPECTED_CATCH`` included.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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
    parser.add_argument("--only", default=None, metavar="NAMES", help="comma-separated checkpointers to run")
    parser.add_argument("--probe", action="append", default=[], metavar="NAME",
                        help="run only these probes of the battery (repeatable; default: all)")
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop probing a planted defect once its intended oracle failed (same score, shorter run)")
    parser.add_argument("--powerloss-states", type=int, default=40, metavar="N",
                        help="crash states the runner explores per power-loss probe (default 40)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--scratch", metavar="DIR", help="parent directory of scenario scratch roots")
    parser.add_argument("--cache-dir", metavar="DIR", help="golden-run cache (default ~/.cache/chaos/golden)")


def _corpus(args: argparse.Namespace) -> dict[str, str]:
    from chaos.run.selfcheck import discover

    found: dict[str, str] = {}
    if args.corpus is not None:
        if not Path(args.corpus).is_dir():
            raise ConfigError(f"--corpus {args.corpus}: not a directory")
        found = discover(args.corpus)
        if not found:
            raise ConfigError(f"--corpus {args.corpus}: no module defines a *Checkpointer class")
    elif DEFAULT_CORPUS.is_dir() and not args.checkpointer:
        found = discover(DEFAULT_CORPUS)
    for item in args.checkpointer:
        name, eq, spec = item.partition("=")
        if not eq or not name or not spec:
            raise ConfigError(f"malformed --checkpointer {item!r}: expected NAME=SPEC")
        found[name] = spec
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        missing = [n for n in wanted if n not in found]
        if missing:
            raise ConfigError(f"--only: unknown checkpointer(s) {', '.join(missing)}; known: {', '.join(found)}")
        found = {n: found[n] for n in wanted}
    if not found:
        raise ConfigError(f"no checkpointers: give --corpus DIR or --checkpointer NAME=SPEC "
                          f"(./{DEFAULT_CORPUS} does not exist here)")
    return found


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from chaos.run.runner import RunOptions
    from chaos.run.selfcheck import PROBES, SelfCheckOptions, render, run_selfcheck

    checkpointers = _corpus(args)
    unknown = [p for p in args.probe if p not in PROBES]
    if unknown:
        raise ConfigError(f"unknown --probe {', '.join(unknown)}; the battery has {', '.join(PROBES)}")
    unknown = [n for n in args.correct if n not in checkpointers]
    if unknown:
        raise ConfigError(f"--correct names no checkpointer being run: {', '.join(unknown)}")
    if args.powerloss_states < 1:
        raise ConfigError(f"--powerloss-states {args.powerloss_states}: must be at least 1")
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
    report = run_selfcheck(checkpointers, options, correct=correct)
    if args.json:  # the results first: nothing the rendering does can lose them
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2))
    render(report, console)
    if args.json:
        console.print(f"report written to {args.json}", highlight=False, markup=False)
    return 0 if report.passed else 1
