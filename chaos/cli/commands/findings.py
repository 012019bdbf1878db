"""`chaos findings`: the findings table of one or more job explorations, as Markdown.

    chaos findings RESULTS.json... [--annotations FILE] [--out FILE]

Each RESULTS.json is what ``chaos run [options] --json RESULTS.json -- COMMAND...`` wrote
for a job exploration (a framework job of ``chaos/examples/frameworks/``, or any job).
The table has a row per (framework, ranks, fault family, verdict) with the counts, one
example point and its evidence, the versions the results recorded, and the two human
columns (what it means for a user, the public issue) from the annotations file (default
``chaos/examples/frameworks/findings.json``); a row it does not annotate says so. Below
the table: per framework, its findings in the families the peer tool cannot test, the
replay command of every failing example, and the runs behind it all. This is how
README's "Findings against the frameworks people train with" table is made: by runs,
not by hand. The rows are built and rendered by ``chaos.cli.findings``.

Bad input (a missing or unreadable file, not JSON, a document the results schema
``chaos.model.resultschema.SCHEMA`` refuses, not a job's results, a malformed annotations file)
is one line naming the file and exit status 2. Standard library only:
no torch import.
"""

from __future__ import annotations

import argparse
import sys

from chaos.errors import ConfigError
from chaos.model.resultschema import load_results

NAME = "findings"
HELP = "render the findings table (Markdown) of job explorations' results JSON files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+",
                        help="results JSON files written by `chaos run [options] --json PATH -- COMMAND...`")
    parser.add_argument("--annotations", metavar="FILE", default=None,
                        help="framework names and the human columns, keyed by framework + family + verdict "
                             "(default: chaos/examples/frameworks/findings.json)")
    parser.add_argument("--out", metavar="FILE", default=None, help="write the Markdown here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from chaos.cli import findings

    annotations = findings.load_annotations(args.annotations)
    runs = [findings.read_run(load_results(path), path, annotations) for path in args.results]
    text = findings.render(findings.build(runs, annotations))
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise ConfigError(f"--out {args.out}: cannot write it: {exc}") from None
        print(f"findings of {len(runs)} run(s) written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
