"""`chaos certify --backend URL|s3-local`: prove a storage backend safe for checkpoints.

Runs the conformance battery, a chaos campaign with the reference checkpointer on the
backend and a throughput measurement, prints a verdict per property and writes the
report as JSON (``--json``), HTML (``--html``), JUnit XML (``--junit``) and a Markdown summary
(``--summary``, appended). Exit 0 only when certified, 1 when
not — including every partial run (``--only``, ``--no-campaign``, ``--quick``), which is
never certified, so a CI gate cannot pass on one — and 2 on bad input (one line, nothing
created)::

    chaos certify --backend s3-local --json cert.json --html cert.html
    chaos certify --backend file:///mnt/lustre/ckpt-test
    chaos certify --backend s3://bucket/prefix?endpoint_url=http://10.0.0.5:9000
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from chaos.errors import ConfigError

NAME = "certify"
HELP = "certify a storage backend (file://, s3://, s3-local): conformance battery + chaos campaign + throughput"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", required=True,
                        help="file:///dir, a directory, s3://bucket/prefix?endpoint_url=..., s3-local, or an fsspec URL (local:///dir)")
    parser.add_argument("--wrapper", default=None, help="module:Class or file.py:Class wrapping the backend (certify a variant)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON")
    parser.add_argument("--html", default=None, metavar="PATH", help="write the report as a self-contained HTML page")
    parser.add_argument("--junit", default=None, metavar="FILE",
                        help="write JUnit XML: a test case per property and campaign scenario, and one for the verdict")
    parser.add_argument("--summary", default=None, metavar="FILE",
                        help="append a Markdown summary to FILE (e.g. $GITHUB_STEP_SUMMARY); never truncates it")
    parser.add_argument("--only", default=None, help="comma-separated properties (a partial run is never certified)")
    parser.add_argument("--no-campaign", action="store_true", help="skip the chaos campaign (never certified)")
    parser.add_argument("--quick", action="store_true", help="campaign: only the kill mid-save scenario (partial: never certified)")
    parser.add_argument("--throughput-mib", type=int, default=64, help="state size for the throughput measurement (0: skip)")
    parser.add_argument("--dcp", action="store_true", help="also certify PyTorch DCP's FsspecWriter on the backend (s3 only)")
    parser.add_argument("--remount", default=None, metavar="CMD",
                        help="how to mount a FUSE backend again after client_crash killed its daemon (default: the "
                             "daemon's own command line, read from /proc/PID/cmdline)")
    parser.add_argument("--scratch", default=None, help="parent directory for local scratch (default: the system temp dir)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="keep the campaign's golden runs here (default: inside the scratch dir, removed at the end)")


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console

    c = Console(soft_wrap=True)
    c.print(f"backend {report['backend']} ({report['backend_kind']})" + (f", wrapped by {report['wrapper']}" if report["wrapper"] else ""),
            highlight=False, markup=False)
    c.print(f"commit protocol: {report['commit_protocol']}", highlight=False, markup=False)
    for p in report["properties"]:
        c.print(f"  {p['name']:<22} {p['status'].upper():<5} {p['summary'][:160]}", highlight=False, markup=False)
    for s in report["campaign"]:
        c.print(f"  campaign {s['verdict'].upper():<5} {s['name']} ({s['seconds']}s)", highlight=False, markup=False)
    t = report.get("throughput")
    if t and t.get("error"):
        c.print(f"  throughput FAIL {t['error'][:200]}", highlight=False, markup=False)
    elif t:
        c.print(f"  throughput: save {t['save_mb_s']} MB/s, verified load {t['load_mb_s']} MB/s ({t['bytes'] >> 20} MiB)",
                highlight=False, markup=False)
    for d in report.get("dcp") or []:
        c.print(f"  DCP FsspecWriter {d['name']:<22} {d['status'].upper():<5} {d['summary'][:150]}", highlight=False, markup=False)
    if report.get("cleanup_error"):
        c.print(f"  cleanup FAIL {report['cleanup_error']}", highlight=False, markup=False)
    verdict = report.get("verdict") or ("CERTIFIED" if report["certified"] else "NOT CERTIFIED")
    reasons = ([f"failing: {', '.join(report['failing'])}"] if report["failing"] else []) + (
        [f"not tested: {'; '.join(report['not_tested'])}"] if report.get("not_tested") else []) + (
        [report["partial"]] if report.get("partial") else [])
    why = f" ({'; '.join(reasons)})" if reasons else ""
    c.print(f"{verdict}{why} in {report['seconds']}s", highlight=False, markup=False)


def run(args: argparse.Namespace) -> int:
    from chaos.certify import certify
    from chaos.reference.storage.base import StorageConfigError

    only = [x.strip() for x in args.only.split(",") if x.strip()] if args.only else None
    if only:
        from chaos.certify.battery import PROPERTIES

        unknown = sorted(set(only) - {n for n, _ in PROPERTIES})
        if unknown:
            raise ConfigError(f"--only: unknown propert{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                              f"known: {', '.join(n for n, _ in PROPERTIES)}")
    for path in (args.json, args.html, args.junit, args.summary):
        if path and not Path(path).resolve().parent.is_dir():
            raise ConfigError(f"output {path}: its directory does not exist")
        if path and Path(path).is_dir():
            raise ConfigError(f"output {path}: is a directory, expected a file path")
    for flag, path in (("--scratch", args.scratch), ("--cache-dir", args.cache_dir)):
        if path and not Path(path).is_dir():
            raise ConfigError(f"{flag} {path}: not an existing directory")
    if args.throughput_mib < 0:
        raise ConfigError(f"--throughput-mib must be >= 0, got {args.throughput_mib}")
    remount = shlex.split(args.remount) if args.remount is not None else None
    if remount is not None and not remount:
        raise ConfigError("--remount: an empty command")
    try:
        report = certify(args.backend, args.wrapper, args.seed, campaign=not args.no_campaign, quick=args.quick,
                         throughput_mib=args.throughput_mib, only=only, scratch_base=args.scratch,
                         progress=lambda msg: print(f".. {msg}", flush=True), dcp=args.dcp, cache_dir=args.cache_dir,
                         remount=remount)
    except StorageConfigError as exc:
        raise ConfigError(str(exc)) from None
    _print(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    if args.html:
        from reports.html import render_certification

        Path(args.html).write_text(render_certification(report))
    doc = json.loads(json.dumps(report, default=str))  # JUnit and summary read what --json holds
    if args.junit:
        from reports.junit import write_junit

        write_junit(doc, args.junit)
    if args.summary:
        from reports.summary import append_summary

        append_summary(doc, args.summary)
    return 0 if report["certified"] else 1
