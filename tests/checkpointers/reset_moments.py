"""A known-bad checkpointer: the optimizer's moments do not survive a restart.

"We rebuild the optimizer on resume; it warms up again in a few steps" — this wraps the
reference checkpointer, saves everything, but on load hands back a fresh AdamW state
(zero ``exp_avg``/``exp_avg_sq``, step counter 0) from the template. The weights, LR
schedule, data position and RNGs all resume correctly, so the job trains on; only the
first Adam steps after the resume are too large. In a nondeterministic run, where
bit_exact is the wrong tool, loss_continuity must catch it by the loss spike.
"""

from __future__ import annotations

import copy
from typing import Any

from chaos.reference.checkpoint.engine import ReferenceCheckpointer


class ResetMomentsCheckpointer(ReferenceCheckpointer):
    def load_latest(self, template: dict) -> tuple[int, dict[str, Any]] | None:
        fresh = copy.deepcopy(template["optimizer"])  # before the load, which may fill the template in place
        loaded = super().load_latest(template)
        if loaded is None:
            return None
        step, state = loaded
        return step, {**state, "optimizer": fresh}
