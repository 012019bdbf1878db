"""The per-rank JSONL event log: the raw history the run record is built from.

Each line is flushed to the OS as it is written, so a SIGKILLed rank leaves every
event up to the kill on disk (page cache survives the process).
"""

from __future__ import annotations

import json
import time
from typing import Any


class EventLog:
    def __init__(self, path: str, rank: int, attempt: int) -> None:
        self._f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives with the rank
        self.rank, self.attempt = rank, attempt

    def emit(self, ev: str, **fields: Any) -> None:
        rec = {"ev": ev, "rank": self.rank, "attempt": self.attempt, "t": time.time(), **fields}
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()
