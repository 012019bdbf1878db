"""What a job's output says about why it failed: the line that names the cause, cut between words.

Read from an attempt's captured output (``launch.AttemptOutcome.tail``) or a node agent's
log. Called by ``launch`` (an attempt's description), ``judge`` (the liveness verdict),
``explore`` (a full disk only an untraced writer hit), ``netcut`` and ``nodes`` (how each
copy or agent ended).
"""

from __future__ import annotations

import os
import re

_EXC = re.compile(r"\b[A-Za-z_.]*(Error|Exception|Interrupt)\b:")


def cause(tail: str) -> str:
    """The line of a failed run's output that says why: the job's last exception, not the
    launcher's ``ChildFailedError`` banner; else the last line that is not a rule of ``=`` or ``-``."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _EXC.search(ln) and "ChildFailedError" not in ln:
            return ln
    return next((ln for ln in reversed(lines) if set(ln) - set("=-")), "")


CAUSE_CHARS = 400  # a cause line longer than this is cut, between words, with " ..."


def clip(line: str, limit: int = CAUSE_CHARS) -> str:
    """``line`` whole when short, else cut at the last space before ``limit`` (never mid-word:
    torch's messages run long, and half a word reads as a different error)."""
    line = line.strip()
    if len(line) <= limit:
        return line
    head = line[:limit]
    return (head.rsplit(" ", 1)[0] if " " in head else head) + " ..."


def log_cause(log: str) -> str:
    """:func:`cause` of the last 12 kB of the log file ``log`` ("" when it cannot be read)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 12000))
            return cause(f.read().decode(errors="replace"))
    except OSError:
        return ""
