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

import importlib.util
import os
import sys

_NAME = "chaos_testckpt_careful"
if _NAME in sys.modules:
    _careful = sys.modules[_NAME]
else:
    _spec = importlib.util.spec_from_file_location(
        _NAME, os.path.join(os.path.dirname(os.path.abspath(__file__)), "careful.py"))
    assert _spec is not None and _spec.loader is not None
    _careful = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _careful
    _spec.loader.exec_module(_careful)


class NoFsyncCheckpointer(_careful.CarefulCheckpointer):
    def _sync(self, fd: int) -> None:
        pass  # the defect: nothing is ever forced to stable storage

    def _sync_dir(self, path: str) -> None:
        pass
