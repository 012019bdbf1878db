"""Planted defect: the optimizer state is not saved.

"Adam's moments are twice the model; we re-create the optimizer on resume" — so a
restart continues with the weights of the checkpoint but fresh, zero moments (and
Adam's step counter back at 0). Otherwise this is ``correct.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.target.protocol import load_checkpointer

# correct.py beside this file, through the harness's own by-path loader (cached per path).
Correct = load_checkpointer(f"{Path(__file__).with_name('correct.py')}:CorrectCheckpointer")


# The self-check counts this defect as caught only when one of these oracles fails in one of these
# probes (chaos.run.selfcheck): a restart loads fresh Adam moments: not the state saved.
EXPECTED_CATCH = {"kill-between-saves": ("committed_state",)}

# The self-check's job half runs it inside the built-in workload as a job, as `chaos run --as-job`
# does (chaos.run.jobselfcheck): JobSpec fields and max_points, a literal; and the job families and
# oracles that must catch the defect there.
CHAOS_AS_JOB = {"faults": ("kill",), "max_points": 3}
EXPECTED_JOB_CATCH = {"kill": ("committed_state",)}


class NoOptimizerCheckpointer(Correct):
    def _payload(self, state: dict) -> Any:
        return {k: v for k, v in state.items() if k != "optimizer"}

    def _restore(self, payload: Any, template: dict) -> dict:
        return {**payload, "optimizer": template["optimizer"]}
