"""A known-bad checkpointer: ``careful.py`` with every ``fsync`` removed.

It writes to a temp directory, renames it into place and updates ``latest`` by
temp + rename, exactly like the careful one, so a process kill at any instant
leaves a loadable checkpoint (every byte written before a rename has reached the
kernel). A power loss does not: the renames and the removal of the old checkpoint
may persist while the new shards' data does not, so ranks fall back to different
steps (a mixture) or find nothing at all (the acknowledged checkpoint is gone).
The power-loss exploration must catch it; an ordinary kill must not.
"""

from __future__ import annotations

from pathlib import Path

from chaos.target.protocol import load_checkpointer

# careful.py beside this file, through the harness's own by-path loader (cached per path).
CarefulCheckpointer = load_checkpointer(f"{Path(__file__).with_name('careful.py')}:CarefulCheckpointer")


class NoFsyncCheckpointer(CarefulCheckpointer):
    def _sync(self, fd: int) -> None:
        pass  # the defect: nothing is ever forced to stable storage

    def _sync_dir(self, path: str) -> None:
        pass
