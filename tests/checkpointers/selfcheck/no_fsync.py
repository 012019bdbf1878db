"""Planted defect: nothing is ever fsynced (files or directories).

Temp directory, rename into place, ``latest`` by temp + rename: exactly ``correct.py``,
so a process kill at any instant leaves a loadable checkpoint — every byte written
before a rename has reached the kernel. A power loss does not: the rename and the
removal of older checkpoints may persist while the new shards' data does not, and an
acknowledged save can vanish.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _correct():
    """``correct.py`` next to this file, loaded once per process (this file is loaded by path)."""
    name = "chaos_selfcheck_correct"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(os.path.dirname(os.path.abspath(__file__)), "correct.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


Correct = _correct().CorrectCheckpointer


class NoFsyncCheckpointer(Correct):
    def _fsync(self, fd: int) -> None:
        pass  # the defect: "fsync is slow, the page cache is fine"
