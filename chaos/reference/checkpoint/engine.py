"""ReferenceCheckpointer: the crash-safe checkpointer the harness holds others against.

Construct it in every rank after ``torch.distributed`` is initialised (or with
``world_size=1`` and no process group)::

    ckpt = ReferenceCheckpointer(root, rank, world_size, keep_last=3, async_save=True)
    ckpt.save(step, state)        # collective
    ckpt.wait()                   # every earlier save durable and committed, or raise
    found = ckpt.load_latest(template)   # collective: (step, state) | None
    ckpt.close()

Options (strings from the CLI are coerced; unknown names raise a ConfigError that is
also a TypeError): ``keep_last`` (3), ``milestones`` (steps, ``"every-N"`` or N),
``async_save`` (False), ``hash`` (``xxh3`` | ``sha256`` | ``crc32c``), ``throttle_mb_s``
(None), ``verify`` (True: check checksums on load), ``timeout_s`` (default: the process group's own timeout, for the
checkpointer's collectives), ``metrics`` (True: rank 0 writes ``metrics.prom``), ``metrics_port`` (0; N: rank r serves
its metrics over HTTP on N + r, closed by ``close()``),
``serializer`` (``native`` | ``safetensors``), ``latency_alert_factor`` (3.0),
``disk_alert_free_fraction`` (0.05), ``max_manifest_bytes``, ``async_dedup`` (True:
an async snapshot copies only the tensors this rank writes and hashes the replicated
ones another rank wrote last time; a changed replication pattern aborts that one save),
``replicas`` (``verify`` | ``verify-sync`` | ``trust``, below).

Async saves and replicated tensors (``replicas``). A rank does not copy the replicated
tensors another rank writes. Whether they are still identical across ranks is checked by
hashing them; where that happens is the option:

- ``verify`` (default): tensors an optimizer owns (its parameters and state, in CPU
  memory) are hashed on the commit thread after ``save()`` returned, and until that is
  done every ``optimizer.step()`` in the process waits in a global pre-hook (the *fence*;
  ``wait_snapshot()`` waits on it explicitly), hashing what is left itself meanwhile.
  Time spent there is added to the save's ``stall_s``: a step right after ``save()``
  stalls about as long as ``verify-sync`` does, one after a forward and backward pass
  usually not at all. Other tensors (module buffers, anything no optimizer has stepped)
  are hashed before ``save()`` returns; GPU tensors are copied to staging and hashed
  off the training thread. The check is exact for updates made by optimizer steps and
  catches in-place updates through PyTorch ops (their version counter moves: the save
  is refused). **Contract:** between ``save()`` and the next optimizer step, do not
  change parameters or optimizer state through ``.data``, numpy views or kernels that
  bypass the version counter without calling ``wait_snapshot()`` first; such a write is
  not seen, and if it made a diverged replica equal to the writer's copy, that rank's
  own value at ``save()`` would be lost without an error.
- ``verify-sync``: every such tensor is hashed before ``save()`` returns; no contract,
  a longer stall.
- ``trust``: not read at all (DDP's invariant is assumed, as DCP's dedup assumes it); a
  replica that silently diverged loses the non-writing ranks' values.

Observability: ``events`` (list of dicts: saves, loads, rejections, alerts),
``prometheus_text()`` and ``cadence`` (a :class:`~chaos.reference.checkpoint.policy.Cadence` fed
with measured stalls).

Sharded tensors (DTensor: FSDP2, HSDP, tensor parallel) are saved as pieces — each rank
writes only its local shards, the manifest records every piece's global box, placement
and per-block checksums — and load at any world size, each rank reading and verifying
only the byte ranges its template's shards need (``chaos.reference.checkpoint.reshard``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import weakref
from typing import Any

from chaos.phases import phase
from chaos.reference.checkpoint import policy
from chaos.reference.checkpoint.async_writer import BackgroundCommit, Fence, OptimizerFence, Staging
from chaos.reference.checkpoint.comm import Comm
from chaos.reference.checkpoint.loader import candidate_order, describe, load_step
from chaos.reference.checkpoint.metrics import AUXILIARY_FILES, Metrics
from chaos.reference.checkpoint.options import Options, parse_options
from chaos.reference.checkpoint.saver import (
    ReplicaCheck,
    Snapshot,
    finish_snapshot,
    run_save,
    take_snapshot,
)
from chaos.reference.ckptformat import commit
from chaos.reference.ckptformat.errors import CheckpointError, CommitError, NoValidCheckpointError

log = logging.getLogger("chaos.reference.checkpoint")


def _remove_all(removers: list[Any]) -> None:
    for remove in removers:
        remove()


class ReferenceCheckpointer:
    """Per-rank safetensors shards + JSON manifest, two-phase commit, verified load."""

    # Written beside the checkpoints, read by no load: a failure writing them is logged and
    # does not fail the save (see chaos.target.protocol.auxiliary_files).
    auxiliary_files = (*AUXILIARY_FILES, ".tmp-metrics-*.prom")

    def __init__(self, root: str, rank: int, world_size: int, **options: Any) -> None:
        self.options: Options = parse_options(**options)
        if not (isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size):
            raise CheckpointError(f"bad rank/world_size {rank!r}/{world_size!r}")
        # Storage: ``storage=URL`` option, else ``root`` itself (a path or URL). ``self.root``
        # stays a local directory (metrics.prom, download scratch): the backend's own for
        # file URLs, ``root`` when a storage URL is given, else a private temp dir. That one
        # is made in the temp dir, which in rank processes is inside the scenario's scratch
        # root (so a SIGKILLed rank's is removed with it), and removed by close() and by a
        # construction that fails.
        from chaos.reference.storage import open_storage, parse_url, wrap_storage

        url = self.options.storage or root
        u = parse_url(url)  # a malformed URL fails here, before anything is created
        self._own_local = u.scheme != "file" and not self.options.storage
        local = u.location if u.scheme == "file" else (tempfile.mkdtemp(prefix="chaos-ckpt-") if self._own_local else root)
        self.root = os.path.abspath(local)
        self.rank = rank
        self.world_size = world_size
        try:
            commit.make_root(self.root)  # its entry durable too: a power loss must not take the whole tree
            self.store = wrap_storage(open_storage(url, local_dir=self.root), self.options.storage_wrapper)
            self._replica = open_storage(self.options.replicate_to, local_dir=self.root) if self.options.replicate_to and rank == 0 else None
            self.comm = Comm(rank, world_size, self.options.timeout_s)
            self.metrics = Metrics(
                self.root, rank, self.options.latency_alert_factor, self.options.disk_alert_free_fraction, self.options.metrics,
                port=self.options.metrics_port,
            )
            self.events = self.metrics.events
            self.cadence = policy.Cadence()
            self._staging = Staging()
            self._background = BackgroundCommit()
            self._janitor = BackgroundCommit()
            self._replicator = BackgroundCommit()  # at most one replication in flight (back-pressure)
            self._skip: frozenset[str] = frozenset()  # async: replicated tensors other ranks write
            # replicas=verify: deferred replica checks, and the optimizer pre-hook that waits for them
            self._fence = Fence()
            self._optimizer_fence: OptimizerFence | None = None
            if self.options.async_save and self.options.replicas == "verify":
                self._optimizer_fence = OptimizerFence(self._fence)
                weakref.finalize(self, self._optimizer_fence.remove)  # never closed: the hook goes with it
            if rank == 0:
                self.store.clean_stale()  # leftovers of crashed saves; no save of ours runs yet
        except BaseException:
            if getattr(self, "metrics", None) is not None:
                self.metrics.close()  # frees its HTTP port, if it serves one
            if self._own_local:
                shutil.rmtree(self.root, ignore_errors=True)
            raise
        self._closed = False

    # -- save -------------------------------------------------------------------
    def save(self, step: int, state: dict) -> None:
        """Collective. Sync: returns after the durable commit. Async: after the snapshot."""
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"step must be a non-negative int, got {step!r}")
        start = time.perf_counter()
        if self.options.async_save:
            self._background.join()
            self._raise_pending()
        managed = self._optimizer_fence.managed() if self._optimizer_fence is not None and self._skip else None
        snap = take_snapshot(step, state, self._staging if self.options.async_save else None, self._skip,
                             trust=self.options.replicas == "trust", managed=managed)
        if self.options.async_save:
            stall = time.perf_counter() - start
            check = ReplicaCheck(snap.deferred, on_complete=self._fence.open) if snap.deferred else None
            if check is not None:
                self._fence.arm(check.help)  # released by the thread that reads the last deferred replica
            try:
                self._background.submit(lambda: self._commit(snap, start, stall, check))
            except BaseException:
                self._fence.release()
                raise
            return
        self._commit(snap, start, None)

    def wait_snapshot(self) -> float:
        """Block until the async save in flight no longer reads the caller's tensors; the seconds blocked.

        With ``replicas=verify`` an async save hashes the replicated parameters and
        optimizer state another rank writes on its commit thread, after ``save()`` returned
        (see the module docs). Optimizer steps wait for that on their own (a pre-hook);
        call this before changing those tensors any other way, e.g. through ``.data``.
        Returns at once when nothing is pending; the time spent is counted in the save's
        ``stall_s``, as the pre-hook's is.
        """
        return self._fence.wait()

    def _finish_snapshot(self, snap: Snapshot, check: ReplicaCheck | None) -> None:
        """Commit thread: read the deferred replicas with any waiter at the fence; whichever reads the
        last one lets the caller's updates through (``ReplicaCheck``), and this does again on failure."""
        if check is None:
            return
        try:
            phase("replica_check", step=snap.step)
        except Exception as exc:  # noqa: BLE001 - a listener that fails here fails the save, everywhere
            snap.error = snap.error or f"{type(exc).__name__}: {exc}"
        try:
            finish_snapshot(snap, check)
        finally:
            self._fence.release()

    def _commit(self, snap: Snapshot, start: float, stall: float | None, check: ReplicaCheck | None = None) -> None:
        try:
            self._finish_snapshot(snap, check)
            result = run_save(self.root, self.comm, self.options, snap, self.store)
        except BaseException as exc:
            self._skip = frozenset()
            seconds = time.perf_counter() - start
            if stall is not None:
                stall += self._fence.take_waited()
            self.metrics.save(snap.step, False, seconds, stall if stall is not None else seconds, 0, 0, describe(exc))
            if isinstance(exc, Exception) and not isinstance(exc, CheckpointError):
                # e.g. a collective failing because a peer rank died mid-save
                raise CommitError(f"save of step {snap.step} failed, nothing acknowledged: {describe(exc)}") from exc
            raise
        if self.options.async_save and self.options.async_dedup:
            self._skip = result.written_by_others
        seconds = time.perf_counter() - start
        # async: the stall is save()'s own time plus any optimizer step (or wait_snapshot) held at the fence
        stall = seconds if stall is None else stall + self._fence.take_waited()
        self.cadence.record_save(stall)
        self.metrics.save(snap.step, True, seconds, stall, result.bytes_written, result.checkpoint_bytes)
        if self.rank == 0:
            self._replicate(snap.step)
            self._retention(snap.step)

    def _replicate(self, step: int) -> None:
        """Rank 0, after a commit: copy it to the replica backend in the background, verified there."""
        if self._replica is None or (self.options.replicate == "milestones" and step not in self.options.milestones):
            return
        from chaos.reference.storage.replicate import replicate_step

        def job() -> None:
            try:
                self.metrics.emit("replicated", **replicate_step(self.store, self._replica, step, self.options.max_manifest_bytes))
            except Exception as exc:  # noqa: BLE001 - a failed off-site copy never fails the save
                log.warning("replication of step %d to %s failed: %s", step, self.options.replicate_to, describe(exc))
                self.metrics.emit("replication_failed", step=step, target=self.options.replicate_to, error=describe(exc))

        self._replicator.submit(job)  # joins the previous one first, so retention never races it

    def _retention(self, step: int) -> None:
        """After a commit only; failures are logged, never turn a committed save into an error."""
        try:
            phase("retention", step=step)
            doomed = policy.select_for_deletion(self.store.list_steps(), step, self.options.keep_last, self.options.milestones)
            hidden = [self.store.hide_step(old) for old in doomed]
            if doomed:
                self.metrics.emit("retention", step=step, deleted=doomed)
                # Removing the files is slow and no longer visible to loaders: off the save path.
                self._janitor.submit(lambda: _remove_all(hidden))
        except Exception as exc:  # noqa: BLE001 - the save is committed whatever happens here
            log.warning("retention after step %d failed: %s", step, exc)

    def wait(self) -> None:
        """Every earlier save is durable and committed, or raise its error."""
        self._background.join()
        self._raise_pending()

    def _raise_pending(self) -> None:
        err = self._background.take_error()
        if err is not None:
            if isinstance(err, CheckpointError):
                raise err
            raise CommitError(f"background save failed: {describe(err)}") from err

    # -- load -------------------------------------------------------------------
    def load_latest(self, template: dict) -> tuple[int, dict] | None:
        """Collective: the newest checkpoint valid on every rank, shaped like ``template``."""
        self._check_open()
        self._background.join()  # its error, if any, stays pending for save()/wait()
        start = time.perf_counter()
        order = self.comm.all_gather_json(candidate_order(self.store) if self.rank == 0 else None)[0]
        rejected: list[tuple[int, str]] = []
        for step in order:
            loaded, verdict = None, {"ok": True}
            try:
                phase("load_verify", step=step)
                loaded = load_step(
                    self.store, step, template, self.rank, self.world_size, self.options.verify, self.options.max_manifest_bytes,
                    self.options.load_in_place,
                )
            except Exception as exc:  # noqa: BLE001 - every failure is a reason to fall back
                verdict = {"ok": False, "why": describe(exc)}
            verdicts = self.comm.all_gather_json(verdict)
            if all(v["ok"] for v in verdicts):
                assert loaded is not None
                self.metrics.load(step, "loaded", time.perf_counter() - start, loaded.bytes_read, self.options.verify, rejected, loaded.kept_from_template)
                return step, loaded.state
            why = "; ".join(f"rank {r}: {v['why']}" for r, v in enumerate(verdicts) if not v["ok"])
            rejected.append((step, why))
            phase("load_rejected", step=step, why=why)  # a harness that recovers this tree says why it fell back
            self.metrics.reject(step, why)
        if not order:
            self.metrics.load(None, "none", time.perf_counter() - start, 0, self.options.verify, [])
            return None
        self.metrics.load(None, "no_valid", time.perf_counter() - start, 0, self.options.verify, rejected)
        raise NoValidCheckpointError(self.root if self.store.kind == "posix" else self.store.url, rejected)

    # -- misc -------------------------------------------------------------------
    def prometheus_text(self) -> str:
        return self.metrics.prometheus_text()

    def close(self) -> None:
        """Finish any in-flight save, then release the checkpointer's process group."""
        if self._closed:
            return
        self._background.stop()
        if self._optimizer_fence is not None:
            self._optimizer_fence.remove()
        self._replicator.stop()
        self._janitor.stop()
        err = self._background.take_error()
        if err is not None:
            log.error("an async save failed and was never waited for: %s", describe(err))
        self.comm.close()
        self.store.close()
        self.metrics.close()
        if self._replica is not None:
            self._replica.close()
        if self._own_local:
            shutil.rmtree(self.root, ignore_errors=True)
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("checkpointer is closed")

    def __enter__(self) -> ReferenceCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
