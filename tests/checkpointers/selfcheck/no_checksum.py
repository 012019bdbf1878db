"""Planted defect: checksums are written but never verified on load.

Each shard's SHA-256 goes into its ``rank<r>.json`` as in ``correct.py``, but the load
path only unpickles the shard. ``torch.load`` does not check the zip CRCs, so a flipped
bit in tensor data loads silently and training continues from a state nobody saved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.target.protocol import load_checkpointer

# correct.py beside this file, through the harness's own by-path loader (cached per path).
Correct = load_checkpointer(f"{Path(__file__).with_name('correct.py')}:CorrectCheckpointer")


# The self-check counts this defect as caught only when one of these oracles fails in one of these
# probes (chaos.run.selfcheck): flipped bits in tensor data load silently (which seed's bits land in
# tensor data depends on the layout).
EXPECTED_CATCH = {
    "bitflip-newest-s0": ("checksum_detection",),
    "bitflip-newest-s1": ("checksum_detection",),
    "bitflip-newest-s2": ("checksum_detection",),
}

# The self-check's job half runs it inside the built-in workload as a job, as `chaos run --as-job`
# does (chaos.run.jobselfcheck): JobSpec fields and max_points, a literal; and the job families and
# oracles that must catch the defect there.
CHAOS_AS_JOB = {"faults": ("payload",), "max_points": 2}
EXPECTED_JOB_CATCH = {"payload": ("no_code_execution",)}


class NoChecksumCheckpointer(Correct):
    def _verify(self, data: bytes, meta: dict[str, Any]) -> bool:
        return True  # the defect: nothing is compared
