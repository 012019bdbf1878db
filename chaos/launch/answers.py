"""The launcher's answer to a rank's request, which the rank waits for before it goes on.

A rank that asks the launcher for something it must not run past (a network cut, a full disk,
Slurm's action, a SIGTERM) leaves a request in the trace directory (``inproc.JobInterposer._ask``)
and waits for an answer file of a name the contract gives (``NET_DOWN``, ``FILL_DONE``,
``SCHED_DONE``, ``TERM_SENT``, ``RESTART_DONE``). :func:`answer` writes it whole, then renames it into view, so
the rank never reads half of one. Called by ``netcut.cut``, ``nodes`` (a node's cut),
``diskfull.fill``, ``restart.carry_out``, ``sbatch`` and ``job._send_term``.
"""

from __future__ import annotations

import json
import os
from typing import Any


def answer(trace_dir: str, name: str, body: dict[str, Any]) -> None:
    """Write ``body`` as JSON to ``trace_dir``/``name``: a temp file renamed over it."""
    final = os.path.join(trace_dir, name)
    with open(final + ".tmp", "w") as f:
        f.write(json.dumps(body))
    os.replace(final + ".tmp", final)


__all__ = ["answer"]
