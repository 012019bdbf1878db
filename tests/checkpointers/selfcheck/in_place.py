"""Planted defect: the checkpoint is overwritten in place.

One directory, ``current/``, holds every rank's shard and checksum file; a save truncates
and rewrites them (fsynced), then bumps ``latest``. There is no second copy: a crash in
the middle of a save destroys the only checkpoint, and the job starts over from step 0
even though a save had been acknowledged. Checksums, fsyncs and the pointer are as in
``correct.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from chaos.target.protocol import load_checkpointer

# correct.py beside this file, through the harness's own by-path loader (cached per path).
Correct = load_checkpointer(f"{Path(__file__).with_name('correct.py')}:CorrectCheckpointer")


# The self-check counts this defect as caught only when one of these oracles fails in one of these
# probes (chaos.run.selfcheck): the crash tears the only copy; the restart begins at step 0 although
# step 4 was acknowledged.
EXPECTED_CATCH = {"crash-mid-write": ("durability",)}

# The self-check's job half runs it inside the built-in workload as a job, as `chaos run --as-job`
# does (chaos.run.jobselfcheck): JobSpec fields and max_points, a literal; and the job families and
# oracles that must catch the defect there.
CHAOS_AS_JOB = {"faults": ("errno",), "max_points": 3}
EXPECTED_JOB_CATCH = {"errno": ("durability",)}


class InPlaceCheckpointer(Correct):
    def _commit(self, step: int, payload: Any) -> None:
        cur = os.path.join(self.root, "current")
        if self.rank == 0 and not os.path.isdir(cur):
            os.makedirs(cur)
            self._fsync_dir(self.root)
        self._barrier()
        meta = self._write_shard(os.path.join(cur, f"rank{self.rank}.pt"), payload)
        self._write_json(os.path.join(cur, f"rank{self.rank}.json"), {"step": step, "rank": self.rank, **meta})
        self._barrier()
        if self.rank == 0:
            self._fsync_dir(cur)
            pointer = os.path.join(self.root, "latest.tmp")
            with open(pointer, "w") as f:
                f.write(self._name(step))
                f.flush()
                self._fsync(f.fileno())
            os.replace(pointer, os.path.join(self.root, "latest"))
            self._fsync_dir(self.root)
        self._barrier()

    def _committed(self) -> list[int]:
        try:
            with open(os.path.join(self.root, "latest")) as f:
                text = f.read().strip()
        except OSError:
            return []
        return [int(text[5:])] if text.startswith("step-") and text[5:].isdigit() else []

    def _read_shard(self, step: int) -> Any:
        import io

        import torch

        base = os.path.join(self.root, "current", f"rank{self.rank}")
        try:
            with open(base + ".json") as f:
                meta = json.load(f)
            with open(base + ".pt", "rb") as f:
                data = f.read()
            if meta.get("step") != step or not self._verify(data, meta):
                return None
            return torch.load(io.BytesIO(data), weights_only=False)
        except Exception:  # noqa: BLE001 - damaged: start over
            return None
