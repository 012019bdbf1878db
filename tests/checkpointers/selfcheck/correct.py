"""A correct checkpointer: the self-check battery must find nothing wrong with it.

Layout under ``root``::

    step-00000008/rank0.pt     torch.save of rank 0's state, through a Python file object
    step-00000008/rank0.json   {"step", "rank", "bytes", "sha256"} of rank0.pt
    step-00000008/rank1.pt ...
    latest                     the text "step-00000008"

A save commits in an order that neither a process kill nor a power loss can break:

1. rank 0 creates ``step-N.tmp/`` (removing a leftover of a crashed save); barrier;
2. every rank writes its shard and its checksum file, each fsynced; barrier;
3. rank 0 fsyncs ``step-N.tmp/`` (the new names), renames it to ``step-N``, fsyncs
   ``root`` (the rename), then replaces ``latest`` by tmp + fsync + rename + fsync;
4. rank 0 removes committed checkpoints beyond ``keep_last`` (only now that the new
   one is durable); barrier. Any failure raises: the save is never acknowledged.

``load_latest`` tries ``latest`` first, then every committed ``step-*`` newest first;
each rank verifies its shard's size and SHA-256 before unpickling it, and the ranks
agree (all-gather) on the first step every rank verified, so a damaged shard on one
rank makes all of them fall back together.

With ``async_save=true`` the state is copied (tensors cloned) before ``save`` returns
and the commit runs in a background thread on a process group of its own, so its
barriers never interleave with the training's collectives; ``wait`` joins it and
re-raises its error.

Every durability primitive is a method (``_fsync``, ``_fsync_dir``, ``_verify``,
``_snapshot``...) so each planted defect in this directory is this very code with one
of them changed.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import shutil
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

# The self-check's job half runs it inside the built-in workload as a job, as `chaos run --as-job`
# does (chaos.run.jobselfcheck): JobSpec fields and max_points, a literal: every point must pass.
CHAOS_AS_JOB = {"faults": ("kill", "corrupt", "power", "errno", "stale", "payload"), "max_points": 12}


class HashingWriter:
    """A file object wrapper that hashes and counts every byte written through it."""

    def __init__(self, f: Any) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        n = self.f.write(data)
        self.sha.update(data)
        self.size += len(data)
        return n

    def flush(self) -> None:
        self.f.flush()


class CorrectCheckpointer:
    def __init__(self, root: str, rank: int, world_size: int, keep_last: int = 2, async_save: bool = False,
                 settle_s: float = 0.15) -> None:
        self.root, self.rank, self.world_size = os.path.abspath(root), rank, world_size
        self.keep_last, self.async_save, self.settle_s = max(2, int(keep_last)), bool(async_save), float(settle_s)
        self._make_root()
        # Our own group: a background commit must not share a channel with DDP's allreduces.
        self.group = dist.new_group(backend="gloo") if world_size > 1 and dist.is_initialized() else None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- durability primitives -------------------------------------------------------
    def _fsync(self, fd: int) -> None:
        os.fsync(fd)

    def _fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._fsync(fd)
        finally:
            os.close(fd)

    def _make_root(self) -> None:
        """The root and any missing parent, each new entry made durable by an fsync of its parent:
        without it a power loss can take the whole tree, every committed checkpoint with it."""
        missing: list[str] = []
        here = self.root
        while not os.path.isdir(here) and os.path.dirname(here) != here:
            missing.append(here)
            here = os.path.dirname(here)
        for d in reversed(missing):
            os.makedirs(d, exist_ok=True)
            self._fsync_dir(os.path.dirname(d))

    def _barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def _all_ok(self, ok: bool) -> bool:
        if self.group is None:
            return ok
        flags: list[Any] = [None] * self.world_size
        dist.all_gather_object(flags, bool(ok), group=self.group)
        return all(flags)

    def _write_json(self, path: str, obj: Any) -> None:
        with open(path, "w") as f:
            json.dump(obj, f)
            f.flush()
            self._fsync(f.fileno())

    # -- what goes into a shard and back -------------------------------------------
    def _payload(self, state: dict) -> Any:
        return state

    def _restore(self, payload: Any, template: dict) -> dict:
        return payload

    def _snapshot(self, state: dict) -> dict:
        """A private copy of ``state`` that training can no longer change."""
        return copy.deepcopy({k: v for k, v in state.items()})

    def _write_shard(self, path: str, payload: Any) -> dict[str, Any]:
        with open(path, "wb") as f:
            w = HashingWriter(f)
            torch.save(payload, w)
            f.flush()
            self._fsync(f.fileno())
        return {"bytes": w.size, "sha256": w.sha.hexdigest()}

    def _verify(self, data: bytes, meta: dict[str, Any]) -> bool:
        return len(data) == meta.get("bytes") and hashlib.sha256(data).hexdigest() == meta.get("sha256")

    # -- save ------------------------------------------------------------------------
    @staticmethod
    def _name(step: int) -> str:
        return f"step-{step:08d}"

    def _commit(self, step: int, payload: Any) -> None:
        name = self._name(step)
        tmp, final = os.path.join(self.root, name + ".tmp"), os.path.join(self.root, name)
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        self._barrier()
        meta = self._write_shard(os.path.join(tmp, f"rank{self.rank}.pt"), payload)
        self._write_json(os.path.join(tmp, f"rank{self.rank}.json"), {"step": step, "rank": self.rank, **meta})
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

    def _background(self, step: int, state: dict) -> None:
        try:
            time.sleep(self.settle_s)  # let training get ahead; the commit is off the critical path
            self._commit(step, self._payload(state))
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
            self._error = exc

    def save(self, step: int, state: dict) -> None:
        if not self.async_save:
            self._commit(step, self._payload(state))
            return
        self.wait()
        self._thread = threading.Thread(target=self._background, args=(step, self._snapshot(state)), daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"checkpoint save failed: {err}") from err

    # -- load ------------------------------------------------------------------------
    def _committed(self) -> list[int]:
        """Steps with a committed directory (no ``.tmp``), newest first."""
        steps = [int(n[5:]) for n in os.listdir(self.root) if n.startswith("step-") and n[5:].isdigit()]
        return sorted(steps, reverse=True)

    def _candidates(self) -> list[int]:
        order = self._committed()
        try:
            with open(os.path.join(self.root, "latest")) as f:
                text = f.read().strip()
            named = int(text[5:]) if text.startswith("step-") and text[5:].isdigit() else None
        except (OSError, ValueError):  # missing, or not text at all (UnicodeDecodeError): no pointer
            named = None
        if named in order:
            order.remove(named)
            order.insert(0, named)
        return order

    def _read_shard(self, step: int) -> Any:
        """This rank's verified payload of ``step``, or None when it is missing or damaged."""
        base = os.path.join(self.root, self._name(step), f"rank{self.rank}")
        try:
            with open(base + ".json") as f:
                meta = json.load(f)
            with open(base + ".pt", "rb") as f:
                data = f.read()
            if meta.get("step") != step or not self._verify(data, meta):
                return None
            return torch.load(io.BytesIO(data), weights_only=False)
        except Exception:  # noqa: BLE001 - damaged or missing: the caller falls back
            return None

    def load_latest(self, template: dict) -> tuple[int, dict] | None:
        order = [self._candidates()]
        if self.group is not None:
            dist.broadcast_object_list(order, src=0, group=self.group)
        for step in order[0]:
            payload = self._read_shard(step)
            if self._all_ok(payload is not None):
                return step, self._restore(payload, template)
        return None

    def close(self) -> None:
        self.wait()
