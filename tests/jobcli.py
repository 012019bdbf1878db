"""``chaos run`` as a user runs it, for the tests of a job's fault families.

:func:`run_json` runs the CLI in a subprocess with its own scratch root and results file, and
returns the process with the results document; a run that wrote none fails the test with the
output's tail. Called by ``test_job_stop`` and ``test_job_io_faults``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_json(scratch: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``chaos run --scratch SCRATCH --json SCRATCH/r.json --timeout 120 ARGS...``: the process and its results."""
    results = scratch / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(scratch), "--json",
                           str(results), "--timeout", "120", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(results.read_text())
