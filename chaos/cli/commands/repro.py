"""`chaos repro`: a standalone reproduction script and an upstream issue draft for one failing point.

    chaos repro RESULTS.json [--point ID] [--out DIR]

RESULTS.json is what ``chaos run [options] --json RESULTS.json -- COMMAND...`` wrote for
a user's own job. The first failing point (or ``--point ID``) becomes, in DIR (default:
``repro-<ID>`` beside RESULTS.json):

- ``repro.py``: reruns exactly that point through the harness (the recorded options,
  seed, point, COMMAND and cwd are embedded) and exits 0 when the same outcome comes
  back, 1 when it does not (``python DIR/repro.py``, from anywhere);
- ``issue.md``: the draft — what was done, expected, observed, how to reproduce,
  versions, the trimmed output — with every local path replaced by a placeholder;
- a copy of the job's script when COMMAND runs a single local ``.py`` file, which
  ``repro.py`` falls back to (``--here``) where the recorded directory is gone.

The texts are built by ``chaos.cli.repro``. Bad input (a missing or unreadable file,
results that are not a job's, no failing point, an unknown ``--point``) is one line
and exit status 2. Standard library only: no torch import.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from chaos.errors import ConfigError
from chaos.model.resultschema import load_results
from reports.jsonfile import current_umask

NAME = "repro"
HELP = "write a standalone reproduction script and an upstream issue draft for a job's failing point"
RESERVED = ("repro.py", "issue.md")
SUMMARY_CHARS = 1000  # of the point's summary printed (issue.md has it all)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="results JSON written by `chaos run [options] --json PATH -- COMMAND...`")
    parser.add_argument("--point", metavar="ID", default=None,
                        help="the failing point to reproduce (default: the first failing one)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="where to write repro.py and issue.md (default: repro-<ID> beside RESULTS)")


def read_results(path: str) -> Any:
    """The results document; ConfigError naming ``path`` when it is missing, unreadable, not JSON or not
    a results document (``chaos.model.resultschema``)."""
    return load_results(path)


def run(args: argparse.Namespace) -> int:
    from chaos.cli import repro
    from chaos.target.job.script import job_script
    from reports.cases import one_line

    finding = repro.find(read_results(args.results), args.results, args.point)
    results = Path(args.results).resolve()
    out = Path(args.out) if args.out else results.parent / f"repro-{re.sub(r'[^A-Za-z0-9_.-]+', '-', finding.point)}"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create it: {exc}") from None
    script = job_script(finding.spec)
    copied = None
    if script is not None:
        copied = script.path.name if script.path.name not in RESERVED else f"job_{script.path.name}"
        if script.path != (out / copied).resolve():
            shutil.copy2(script.path, out / copied)
    (out / "repro.py").write_text(repro.repro_script(finding, sys.executable, script, copied), encoding="utf-8")
    (out / "repro.py").chmod(0o777 & ~current_umask())
    scrubber = repro.Scrubber.for_finding(finding, ((str(out.resolve()), "<repro>"), (str(results.parent), "<results>")))
    found = repro.versions(finding, script)
    (out / "issue.md").write_text(repro.issue_markdown(finding, found, scrubber, script, copied), encoding="utf-8")
    _say(f"{finding.outcome.upper()} {finding.point}: {one_line(finding.summary, SUMMARY_CHARS)}")
    _say(f"  reproduction script: {out / 'repro.py'} (python {out / 'repro.py'}: exit 0 when it reproduces)")
    _say(f"  issue draft: {out / 'issue.md'} (local paths replaced by placeholders)")
    if copied:
        _say(f"  job script copied: {out / copied} (repro.py runs it with --here, or when {finding.spec.cwd} is gone)")
    else:
        _say(f"  job script not copied (COMMAND runs no single local .py file): repro.py needs the job's files "
             f"in {finding.spec.cwd}")
    return 0


def _say(line: str) -> None:
    """One line on stdout: its point id, summary and paths come from the results file, so control
    characters are shown as escapes, never acted on by the terminal."""
    from reports.cases import printable

    print(printable(line))
