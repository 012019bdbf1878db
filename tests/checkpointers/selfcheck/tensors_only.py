"""Planted defect: only tensors are saved; every other value is dropped.

The team moved to a tensor-only format (a flat name -> tensor map, like safetensors) and
rebuilds the tree from the template on load. Everything that is not a tensor — the
step and token counters, the scheduler's counters, Adam's hyper-parameters, the Python
and NumPy RNG states, the data position — silently comes back with the template's
(fresh) value. Otherwise this is ``correct.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from chaos.target.protocol import load_checkpointer

# correct.py beside this file, through the harness's own by-path loader (cached per path).
Correct = load_checkpointer(f"{Path(__file__).with_name('correct.py')}:CorrectCheckpointer")


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


# The self-check counts this defect as caught only when one of these oracles fails in one of these
# probes (chaos.run.selfcheck): a restart loads the tensors but the template's counters, RNG states and
# data position: not the state saved.
EXPECTED_CATCH = {"kill-between-saves": ("committed_state",)}

# The self-check's job half runs it inside the built-in workload as a job, as `chaos run --as-job`
# does (chaos.run.jobselfcheck): JobSpec fields and max_points, a literal; and the job families and
# oracles that must catch the defect there.
CHAOS_AS_JOB = {"faults": ("kill",), "max_points": 3}
EXPECTED_JOB_CATCH = {"kill": ("committed_state",)}


class TensorsOnlyCheckpointer(Correct):
    def _payload(self, state: dict) -> Any:
        return flatten(state)

    def _restore(self, payload: Any, template: dict) -> dict:
        return fill(template, payload)
