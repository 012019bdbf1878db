"""`chaos report`: the HTML report of a results JSON, one self-contained file.

    chaos report results.json -o report.html
    chaos report results.json --bench bench.json --interval interval.json --certification cert.json
    chaos report results.json --save-seconds 30 --mtbf-hours 24 --alert stall_seconds=0.5

The optional inputs are the JSON files other commands write (``chaos bench --json``,
``chaos interval --json``, a certification run's ``{"properties": [...]}``); each adds
its section. A missing or invalid input is one clear line and exit status 2: the results
are checked against ``chaos.model.resultschema.SCHEMA`` before anything is rendered.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from chaos.errors import ConfigError

NAME = "report"
HELP = "render a results JSON as a self-contained HTML report (charts, timeline, replay commands)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="results JSON written by `chaos run --json`")
    parser.add_argument("-o", "--output", metavar="PATH", default=None,
                        help="where to write the page (default: the results path with .html)")
    parser.add_argument("--bench", metavar="PATH", help="`chaos bench --json` output: adds the scheme comparison")
    parser.add_argument("--interval", metavar="PATH",
                        help="`chaos interval --json` output (save_seconds, mtbf_seconds): adds the Young/Daly chart")
    parser.add_argument("--save-seconds", type=float, metavar="S", help="save cost C for the Young/Daly chart")
    parser.add_argument("--mtbf-hours", type=float, metavar="H", help="mean time between failures for the Young/Daly chart")
    parser.add_argument("--certification", metavar="PATH",
                        help='certification JSON ({"properties": [{name, verdict, evidence}]}): adds the property matrix')
    parser.add_argument("--alert", action="append", default=[], metavar="METRIC=SECONDS",
                        help="alert threshold for the save/load metrics (stall_seconds, save_latency_seconds, "
                             "ack_wait_seconds, load_seconds); repeatable")
    parser.add_argument("--title", default=None, help="page title (default: chaos report)")


def _alerts(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        try:
            if not eq:
                raise ValueError
            out[key.strip()] = float(raw)
        except ValueError:
            raise ConfigError(f"malformed --alert {item!r}: expected METRIC=SECONDS") from None
    return out


def _input(path: str, key: str, what: str) -> Any:
    """Load one optional input and check its shape now, so that an error names its file."""
    from reports.html import load_json, normalize_extras

    value = load_json(path, what)
    try:
        normalize_extras({key: value})
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return value


def build_extras(args: argparse.Namespace) -> dict[str, Any]:
    """The optional inputs named on the command line, loaded and checked (ConfigError names the file)."""
    extras: dict[str, Any] = {"source": Path(args.results).name, "thresholds": _alerts(args.alert)}
    if args.title:
        extras["title"] = args.title
    if args.bench:
        extras["bench"] = _input(args.bench, "bench", "bench")
    if args.interval:
        extras["young_daly"] = _input(args.interval, "young_daly", "interval")
    if args.save_seconds is not None or args.mtbf_hours is not None:
        if args.save_seconds is None or args.mtbf_hours is None:
            raise ConfigError("--save-seconds and --mtbf-hours go together")
        extras["young_daly"] = {**(extras.get("young_daly") or {}), "save_seconds": args.save_seconds,
                                "mtbf_seconds": args.mtbf_hours * 3600}
    if args.certification:
        cert = _input(args.certification, "certification", "certification")
        extras["certification"] = cert if isinstance(cert, dict) else {"properties": cert}
    return extras


def run(args: argparse.Namespace) -> int:
    from chaos.model.resultschema import load_results
    from reports.html import render_report

    doc = load_results(args.results)
    out = Path(args.output) if args.output else Path(args.results).with_suffix(".html")
    path = render_report(doc, out, build_extras(args))
    print(f"report written to {path} ({path.stat().st_size / 1e6:.1f} MB, {len(doc['scenarios'])} scenarios)")
    return 0
