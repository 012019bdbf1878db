"""`chaos savers`: what a power cut does to an unsafe and a safe save on ext4, per mount option.

Why: whether "write a temp file, rename it over the old one" survives a power cut without
an fsync is a property of the file system and its mount options, not of POSIX. This
measures it on the real kernel: :func:`chaos.certify.blockcrash.compare_savers` saves a
file both ways (the unsafe saver renames without any fsync; the safe one fsyncs the
file, renames, fsyncs the directory) on a fresh ext4 loop image whose block writes are
logged, replays the crash states a volatile device cache allows, and counts, among the
distinct states, those where the renamed file was lost (missing, or old after the save
returned) or torn (zeros, short, a mixture)::

    chaos savers                                       # data=ordered, data=writeback, each also noauto_da_alloc
    chaos savers --options data=ordered,data=writeback --json savers.json

The JSON (``kind: block-crash-savers``, dated) is an input of ``chaos findings``, which
renders the rows into the storage findings table. Needs root, ``/dev/fuse``, ``losetup``
and ``mkfs.ext4``; without them it says why and exits 2. Registered by
:mod:`chaos.cli.main` (not a ``chaos bench`` subcommand: ``chaos.bench`` may not import
``chaos.certify``, where the block-level explorer lives).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import time
from pathlib import Path

from chaos.errors import ConfigError
from chaos.scratch import make_root

NAME = "savers"
HELP = "block-level power loss of an unsafe and a safe save on ext4, per mount option (root, FUSE, loop)"
SCHEMA_VERSION = 1
KIND = "block-crash-savers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--options", default=None, metavar="OPTS;OPTS...",
                        help="ext4 mount option sets to compare, separated by ';' (default: data=ordered; "
                             "data=writeback; each also with noauto_da_alloc)")
    parser.add_argument("--max-states", type=int, default=60,
                        help="crash states checked per saver and option set, sampled by --seed beyond that "
                             "(default 60)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--dir", default=None, help="parent of the scratch directory (default: the system temp dir)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the rows as JSON (chaos findings reads it)")


def option_sets(text: str | None) -> tuple[str, ...]:
    """The ``--options`` value as option sets; ConfigError for an empty set or an empty list."""
    from chaos.certify.blockcrash import COMPARED_OPTIONS

    if text is None:
        return COMPARED_OPTIONS
    sets = tuple(s.strip() for s in text.split(";"))
    if not sets or any(not s for s in sets):
        raise ConfigError(f"--options {text!r}: expected mount option sets separated by ';', none empty")
    return sets


def run(args: argparse.Namespace) -> int:
    from chaos.certify.blockcrash import compare_savers
    from faults.blocklog import can_log

    options = option_sets(args.options)
    if args.max_states < 1:
        raise ConfigError(f"--max-states must be >= 1, got {args.max_states}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise ConfigError(f"--json {args.json}: its directory does not exist")
    if args.dir and not os.path.isdir(args.dir):
        raise ConfigError(f"--dir {args.dir}: not an existing directory")
    ok, why = can_log()
    if not ok:
        print(f"error: cannot log block writes here: {why}")
        return 2
    started = time.time()
    work = make_root("chaos-savers-", args.dir)
    try:
        rows = compare_savers(work, seed=args.seed, max_states=args.max_states, options=options)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'options':<34} {'saver':<7} {'states':>6} {'distinct':>8} {'lost':>5} {'torn':>5} {'ok':>4}")
    for r in rows:
        print(f"{r['options']:<34} {r['saver']:<7} {r['states']:>6} {r['distinct']:>8} {r['lost']:>5} "
              f"{r['torn']:>5} {r['ok']:>4}")
    doc = {"schema_version": SCHEMA_VERSION, "kind": KIND, "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
           "seed": args.seed, "max_states": args.max_states, "seconds": round(time.time() - started, 1),
           "host": {"kernel": platform.release(), "machine": platform.machine()}, "rows": rows}
    if args.json:
        from reports.jsonfile import write_json_atomic

        write_json_atomic(args.json, doc, indent=1)
    return 0

