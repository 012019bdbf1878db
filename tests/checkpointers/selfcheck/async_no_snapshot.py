"""Planted defect: an async save that does not snapshot the state first.

``save()`` hands the live state dict to the background writer and returns at once ("no
copy: saves memory and time"). The writer first lets training get ahead (a short sleep,
as in ``correct.py``'s async mode) and then serialises tensors that the optimizer has
updated in place since: the checkpoint of step N holds weights and moments of a later
step next to step N's counters. Otherwise this is ``correct.py`` with ``async_save=true``.
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


class AsyncNoSnapshotCheckpointer(Correct):
    def __init__(self, root: str, rank: int, world_size: int, **options: object) -> None:
        super().__init__(root, rank, world_size, **{**options, "async_save": True})

    def _snapshot(self, state: dict) -> dict:
        return state  # the defect: the live tensors, not a copy
