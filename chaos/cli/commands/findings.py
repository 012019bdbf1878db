"""`chaos findings`: the findings tables of job explorations and of storage certifications, as Markdown.

    chaos findings RESULTS.json... [--annotations FILE] [--out FILE]
    chaos findings CERTIFY.json... SAVERS.json... [--out FILE]

A document whose ``kind`` is ``certification`` (``chaos certify --json``) or
``block-crash-savers`` (``chaos savers --json``) goes to the storage findings
(``chaos.cli.storagefindings``: a verdict row per mount with what to do, the
property-by-mount matrix, the evidence, the savers' lost and torn counts); this is how
``docs/storage-findings.md`` is made. Every other document is a job's results.

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
``chaos.model.resultschema.SCHEMA`` or the storage schemas refuse, not a job's results, a
malformed annotations file) is one line naming the file and exit status 2. Standard
library and jsonschema only: no torch import.
"""

from __future__ import annotations

import argparse
import sys

from chaos.errors import ConfigError
from chaos.model.resultschema import check_results
from reports.jsonfile import read_json

NAME = "findings"
HELP = ("render the findings tables (Markdown) of job explorations' results JSON files, and of storage "
        "certifications (chaos certify --json, chaos savers --json)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+",
                        help="results JSON files written by `chaos run [options] --json PATH -- COMMAND...`, "
                             "`chaos certify --json PATH` or `chaos savers --json PATH`")
    parser.add_argument("--annotations", metavar="FILE", default=None,
                        help="framework names and the human columns, keyed by framework + family + verdict "
                             "(default: chaos/examples/frameworks/findings.json)")
    parser.add_argument("--out", metavar="FILE", default=None, help="write the Markdown here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from chaos.cli import findings, storagefindings

    docs = [(path, read_json(path, "results")) for path in args.results]
    storage = [storagefindings.read_document(doc, path) for path, doc in docs if storagefindings.is_storage(doc)]
    jobs = [(path, check_results(doc, path)) for path, doc in docs if not storagefindings.is_storage(doc)]
    parts = []
    if jobs:
        annotations = findings.load_annotations(args.annotations)
        runs = [findings.read_run(doc, path, annotations) for path, doc in jobs]
        parts.append(findings.render(findings.build(runs, annotations)))
    if storage:
        parts.append(storagefindings.render(storage))
    text = "\n".join(parts)
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise ConfigError(f"--out {args.out}: cannot write it: {exc}") from None
        print(f"findings of {len(docs)} run(s) written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
