"""Planted defect: only tensors are saved; every other value is dropped.

The team moved to a tensor-only format (a flat name -> tensor map, like safetensors) and
rebuilds the tree from the template on load. Everything that is not a tensor — the
step and token counters, the scheduler's counters, Adam's hyper-parameters, the Python
and NumPy RNG states, the data position — silently comes back with the template's
(fresh) value. Otherwise this is ``correct.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import torch


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


def flatten(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, torch.Tensor):
        out[prefix] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}/{k}"))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}/{i}"))
    return out


def fill(template: Any, flat: dict[str, torch.Tensor], prefix: str = "") -> Any:
    if isinstance(template, torch.Tensor):
        return flat.get(prefix, template)
    if isinstance(template, dict):
        return {k: fill(v, flat, f"{prefix}/{k}") for k, v in template.items()}
    if isinstance(template, (list, tuple)):
        return type(template)(fill(v, flat, f"{prefix}/{i}") for i, v in enumerate(template))
    return template


class TensorsOnlyCheckpointer(Correct):
    def _payload(self, state: dict) -> Any:
        return flatten(state)

    def _restore(self, payload: Any, template: dict) -> dict:
        return fill(template, payload)
