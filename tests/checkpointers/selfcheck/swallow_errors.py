"""Planted defect: write errors are logged and swallowed; the save is acknowledged anyway.

"A full disk must never kill a week-long run": the writer catches the error (an
``OSError``, or the ``RuntimeError`` torch.save wraps it in), prints a
warning and carries on, so the directory is committed with a missing or partial shard,
``latest`` points at it and ``save()``/``wait()`` return normally. The next restart finds
that checkpoint unloadable and falls back to an older one, or to nothing. Otherwise this
is ``correct.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from chaos.target.protocol import load_checkpointer

# correct.py beside this file, through the harness's own by-path loader (cached per path).
Correct = load_checkpointer(f"{Path(__file__).with_name('correct.py')}:CorrectCheckpointer")


# The self-check counts this defect as caught only when one of these oracles fails in one of these
# probes (chaos.run.selfcheck): the failed write (or fsync) is swallowed and the save acknowledged.
EXPECTED_CATCH = {"enospc-write": ("no_false_ack",), "fsync-fails": ("no_false_ack",)}


class SwallowErrorsCheckpointer(Correct):
    def _write_shard(self, path: str, payload: Any) -> dict[str, Any]:
        try:
            return super()._write_shard(path, payload)
        except (OSError, RuntimeError) as exc:
            print(f"warning: checkpoint shard {path} not written: {exc}", file=sys.stderr)
            return {"bytes": None, "sha256": None}

    def _write_json(self, path: str, obj: Any) -> None:
        try:
            super()._write_json(path, obj)
        except OSError as exc:
            print(f"warning: checkpoint metadata {path} not written: {exc}", file=sys.stderr)
