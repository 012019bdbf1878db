"""Which paths the save in progress made, read from one rank's trace in order: what an injected error hurt.

Both targets' traces come from the same in-rank I/O interposer, so one reader serves both: the
built-in workload's record (``chaos.record.history``: each fired error gets ``save_changes``, which
``chaos.judge.oracles.no_false_ack`` reads) and a job's (``chaos.judge.job``'s ``no_false_ack``).
"""

from __future__ import annotations

import os
from typing import Any

from chaos.model.contract import SYNC_OPS

INJURIES = ("enospc", "eio", "fsync_fail", "short_write")


WRITE_FLAGS = frozenset({"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"})


def writes(rec: dict[str, Any]) -> bool:
    """Whether a traced open (its ``mode`` or ``flags``) could write; unknown: assume it could."""
    if rec.get("mode") is not None:
        return bool(set(str(rec["mode"])) & set("wax+"))
    if rec.get("flags") is not None:
        return bool(set(rec["flags"]) & WRITE_FLAGS)
    return True


class SaveScope:
    """Which paths the save in progress made, read from one rank's trace in order.

    A save starts at the workload's ``save`` phase, or a job's ``probe.saving(n, state)``. An injected error hurts *that save*
    only where it hits data the save made and had not yet made durable: a write or
    truncate; a rename, unlink or rmdir of something the save created; an fsync of a
    file or directory holding changes of the save that no successful fsync covered yet
    (or the open of that directory for its fsync).
    An error in deleting older checkpoints (retention renaming ``step-5`` aside, removing
    it, syncing the directory after the commit was already synced) does not make the
    acknowledgement of the new save a lie. Each fired error record gets ``save_changes``:
    the paths of the save it hit (empty: none); ``no_false_ack`` drops those the
    checkpointer declared auxiliary and sets the injury aside when nothing is left.
    """

    def __init__(self) -> None:
        self.step: int | None = None                 # the save in progress (None: before the first)
        self.created: set[str] = set()               # files and directories the save created or wrote
        self.unsynced: dict[str, set[str]] = {}      # path -> save changes in it no successful fsync covered
        self.dirs: set[str] = set()                  # directories seen holding (or being) the save's entries

    def see(self, rec: dict[str, Any]) -> None:
        event = rec.get("event")
        info = rec.get("info") if isinstance(rec.get("info"), dict) else {}
        saving = event == "phase" and rec.get("name") == "chaos.probe" and info.get("kind") == "saving"
        if event == "phase" and (rec.get("name") == "save" or saving):  # a job's probe.saving(n, state) too
            self.step = info.get("n") if saving else info.get("step")
            self.created.clear()
            self.unsynced.clear()
            return
        if event != "op" or rec.get("error") is not None:
            return
        op, path = rec.get("op"), rec.get("path")
        if op in SYNC_OPS:
            self.unsynced.pop(path, None)
        elif op in ("open", "mkdir") and (rec.get("created") or op == "mkdir"):
            self._made(path)
            if op == "mkdir" and path:
                self.dirs.add(path)
        elif op in ("write", "truncate") and path:
            self.created.add(path)
            self.unsynced.setdefault(path, set()).add(path)
        elif op in ("rename", "link") and rec.get("src") in self.created:
            self._made(rec.get("dst"))

    def _made(self, path: str | None) -> None:
        if path:
            self.created.add(path)
            self.unsynced.setdefault(path, set()).add(path)
            self.unsynced.setdefault(os.path.dirname(path), set()).add(path)
            self.dirs.add(os.path.dirname(path))

    def injury(self, rec: dict[str, Any]) -> dict[str, Any]:
        if rec.get("action") not in INJURIES:
            return {}
        op, path = rec.get("op"), rec.get("path")
        first = (rec.get("paths") or [path])[0]
        if op == "open" and (path in self.dirs or not writes(rec)):
            # A directory opened to fsync it, or a read-only open (rmtree walking an older
            # checkpoint): it hurts only what a following fsync of that path would have covered.
            hit = sorted(self.unsynced.get(path, ()))
        elif op == "close" and path not in self.created:
            # Closing what the save never wrote: a directory fd (rmtree's, a read of `latest` below the root,
            # one whose fsync already ran) or a read-only file. No data rides on such a close: the fsync
            # before it covered the directory's entries or failed on its own, and a read loses nothing.
            hit = []
        elif op in ("write", "truncate", "open", "close") or rec.get("action") == "short_write":
            hit = [path]
        elif op in SYNC_OPS:
            hit = sorted(self.unsynced.get(path, ()))
        elif op in ("rename", "link", "unlink", "rmdir"):
            hit = [first] if first in self.created else []
        else:
            hit = [path]
        return {"save_changes": [h for h in hit if h]}


__all__ = ["INJURIES", "WRITE_FLAGS", "SaveScope", "writes"]
