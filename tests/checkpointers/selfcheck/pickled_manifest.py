"""Planted defect: the manifest is a pickle, and every rank unpickles it on load.

Issue #34, item 16. Each step's directory holds the ranks' shards and one
``manifest.pkl`` that rank 0 writes with every shard's size and SHA-256 (gathered from
all ranks)::

    step-00000008/rank0.pt       torch.save of rank 0's state (as in correct.py)
    step-00000008/rank1.pt
    step-00000008/manifest.pkl   pickle.dumps({"step": 8, "shards": {0: {"bytes", "sha256"}, ...}})
    latest                       the text "step-00000008"

The commit is ``correct.py``'s (tmp directory, fsyncs, rename, ``latest`` replaced), and
the loader verifies every shard's size and SHA-256 against the manifest before it
unpickles the shard, so a corrupted or replaced shard is refused and the load falls
back. But the manifest itself is read with ``pickle.load``: whoever can write to the
store runs code in every rank at the next restart. A payload planted in a *shard* is
rejected by its checksum, so a harness that plants into a file drawn at random from the
checkpoint usually misses this; one that plants into the files the loader reads, the
manifest first, catches it (``no_code_execution``).

    chaos run --checkpointer tests/checkpointers/selfcheck/pickled_manifest.py:PickledManifestCheckpointer \
        --world-size 2 --seed 5
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from chaos.target.protocol import load_checkpointer

# correct.py beside this file, through the harness's own by-path loader (cached per path).
Correct = load_checkpointer(f"{Path(__file__).with_name('correct.py')}:CorrectCheckpointer")

# The self-check counts this defect as caught only when this oracle fails in this probe
# (chaos.run.selfcheck): the payload planted in the manifest runs when the restart unpickles it.
EXPECTED_CATCH = {"payload-newest": ("no_code_execution",)}

# The self-check's job half runs it inside the built-in workload as a job, as `chaos run --as-job`
# does (chaos.run.jobselfcheck): JobSpec fields and max_points, a literal; and the job families and
# oracles that must catch the defect there. Every payload point (each file of each save the rename of
# its directory completed: about six): a sample may plant only in the verified .pt shards.
CHAOS_AS_JOB = {"faults": ("payload",)}
EXPECTED_JOB_CATCH = {"payload": ("no_code_execution",)}

MANIFEST = "manifest.pkl"


class PickledManifestCheckpointer(Correct):
    def _gather(self, meta: dict[str, Any]) -> list[Any]:
        if self.group is None:
            return [meta]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, meta, group=self.group)
        return out

    def _commit(self, step: int, payload: Any) -> None:
        name = self._name(step)
        tmp, final = os.path.join(self.root, name + ".tmp"), os.path.join(self.root, name)
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        self._barrier()
        meta = self._write_shard(os.path.join(tmp, f"rank{self.rank}.pt"), payload)
        metas = self._gather(meta)
        if self.rank == 0:
            with open(os.path.join(tmp, MANIFEST), "wb") as f:
                pickle.dump({"step": step, "shards": dict(enumerate(metas))}, f)
                f.flush()
                self._fsync(f.fileno())
        self._barrier()
        if self.rank == 0:
            self._fsync_dir(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
            self._fsync_dir(self.root)
            pointer = os.path.join(self.root, "latest.tmp")
            with open(pointer, "w") as f:
                f.write(name)
                f.flush()
                self._fsync(f.fileno())
            os.replace(pointer, os.path.join(self.root, "latest"))
            self._fsync_dir(self.root)
            for old in self._committed()[self.keep_last:]:
                shutil.rmtree(os.path.join(self.root, self._name(old)), ignore_errors=True)
        self._barrier()

    def _read_shard(self, step: int) -> Any:
        """This rank's verified payload of ``step``, or None when it is missing or damaged."""
        d = os.path.join(self.root, self._name(step))
        try:
            with open(os.path.join(d, MANIFEST), "rb") as f:
                manifest = pickle.load(f)  # the defect: a pickle from the store runs whatever it says
            meta = manifest["shards"][self.rank]
            with open(os.path.join(d, f"rank{self.rank}.pt"), "rb") as f:
                data = f.read()
            if manifest.get("step") != step or not self._verify(data, meta):
                return None
            return torch.load(io.BytesIO(data), weights_only=False)
        except Exception:  # noqa: BLE001 - damaged or missing: the caller falls back
            return None
