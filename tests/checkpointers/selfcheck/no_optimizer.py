"""Planted defect: the optimizer state is not saved.

"Adam's moments are twice the model; we re-create the optimizer on resume" — so a
restart continues with the weights of the checkpoint but fresh, zero moments (and
Adam's step counter back at 0). Otherwise this is ``correct.py``.
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


class NoOptimizerCheckpointer(Correct):
    def _payload(self, state: dict) -> Any:
        return {k: v for k, v in state.items() if k != "optimizer"}

    def _restore(self, payload: Any, template: dict) -> dict:
        return {**payload, "optimizer": template["optimizer"]}
