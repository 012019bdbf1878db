"""Planted defect: checksums are written but never verified on load.

Each shard's SHA-256 goes into its ``rank<r>.json`` as in ``correct.py``, but the load
path only unpickles the shard. ``torch.load`` does not check the zip CRCs, so a flipped
bit in tensor data loads silently and training continues from a state nobody saved.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any


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


class NoChecksumCheckpointer(Correct):
    def _verify(self, data: bytes, meta: dict[str, Any]) -> bool:
        return True  # the defect: nothing is compared
