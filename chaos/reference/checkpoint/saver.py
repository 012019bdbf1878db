"""The save pipeline every rank runs: snapshot, plan, write, vote, publish.

Every rank goes through the same collectives whatever happens locally: a rank whose
snapshot or write failed still takes part in the exchanges and reports the failure, so
all ranks abort together (nobody hangs waiting for it) and nothing is published. Only
after every rank reported a durable shard does rank 0 publish (see ``commit.py``); a
final exchange carries rank 0's outcome so that ``save()`` returns on every rank only
after the commit and raises on every rank when it did not happen.
"""

from __future__ import annotations

import datetime as _dt
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from chaos.phases import phase
from chaos.reference.checkpoint.comm import Comm
from chaos.reference.checkpoint.options import Options
from chaos.reference.checkpoint.planner import TRUSTED, make_plan
from chaos.reference.ckptformat import commit, manifest, tree
from chaos.reference.ckptformat.dtensor import (
    block_checksums,
    describe,
    is_dtensor,
    local_box,
    piece_name,
)
from chaos.reference.ckptformat.errors import CommitError
from chaos.reference.ckptformat.hashing import digest, tensor_bytes
from chaos.reference.ckptformat.shard import Throttle, write_shard


@dataclass
class Snapshot:
    """What a save needs from the caller's state, taken before ``save()`` returns."""

    step: int
    skeleton: dict[str, Any] | None = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    model_structure: dict[str, list] | None = None
    optimizer_structure: dict[str, Any] | None = None
    error: str | None = None
    # Async dedup: replicated tensors another rank wrote last time are only hashed
    # (path -> [digest, nbytes, dtype, shape]), not copied.
    hashed_only: dict[str, list] = field(default_factory=dict)
    # Of those, the ones an optimizer owns, to be hashed on the commit thread (by
    # finish_snapshot) while the caller's optimizer steps wait at the fence:
    # (path, the live tensor, its version counter at save()).
    deferred: list[tuple[str, torch.Tensor, int]] = field(default_factory=list)
    # Sharded tensors: path -> {dtype, shape, placements, mesh, piece: {name, offset, shape} | None};
    # the piece (this rank's local tensor) is in ``tensors`` under its piece name.
    dtensors: dict[str, dict[str, Any]] = field(default_factory=dict)


def split_dtensors(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """Replace every DTensor in ``tensors`` by this rank's piece of it; return their descriptions.

    An empty piece (a rank holding no rows of an unevenly sharded tensor) is left out.
    """
    out: dict[str, dict[str, Any]] = {}
    for path in [p for p, t in tensors.items() if is_dtensor(t)]:
        t = tensors.pop(path)
        offset, shape = local_box(t)
        local = t.to_local()
        if list(local.shape) != shape:
            raise manifest.ManifestError(path, f"DTensor local shape {list(local.shape)} is not its box {shape}")
        info: dict[str, Any] = {"dtype": manifest.dtype_name(t.dtype), **describe(t), "piece": None}
        if math.prod(shape) > 0:
            name = piece_name(path, offset)
            tensors[name] = local
            info["piece"] = {"name": name, "offset": offset, "shape": shape}
        out[path] = info
    return out


def _meta(t: torch.Tensor) -> list:
    return [digest("xxh3", tensor_bytes(t)), t.numel() * t.element_size(), manifest.DTYPE_NAMES[t.dtype], list(t.shape)]


def optimizer_structure(opt: Any) -> dict[str, Any] | None:
    """Tensor shapes under the optimizer and each param group's ``params`` list."""
    if not isinstance(opt, dict):
        return None
    groups = opt.get("param_groups")
    params = None
    if isinstance(groups, list) and all(isinstance(g, dict) and "params" in g for g in groups):
        params = [list(g["params"]) if isinstance(g["params"], (list, tuple)) else None for g in groups]
        if any(p is None or not all(isinstance(x, (int, str)) for x in p) for p in params):
            params = None
    return {"tensors": manifest.structure_of(opt), "param_groups": params}


def _deferrable(t: torch.Tensor, managed: dict[int, int] | None) -> int | None:
    """``t``'s version counter if its replica check may wait for the commit thread, else None.

    Only a contiguous CPU tensor lying in memory an optimizer owns (``managed``, from
    ``OptimizerFence.managed``) qualifies: optimizer steps are held at the fence, so its
    bytes cannot change through them before the check has read them. Inference tensors
    never qualify: they change (in inference mode) without moving a version counter.
    """
    if managed is None or t.device.type != "cpu" or not t.is_contiguous() or t.is_inference():
        return None
    nbytes = t.numel() * t.element_size()
    if nbytes == 0 or managed.get(t.data_ptr(), 0) < nbytes:
        return None
    return int(t._version)


def take_snapshot(step: int, state: Any, staging: Any | None, skip: frozenset[str] = frozenset(),
                  trust: bool = False, managed: dict[int, int] | None = None) -> Snapshot:
    """Encode the tree and capture tensors (copied into ``staging`` for async saves).

    Called by ``ReferenceCheckpointer.save`` on the caller's thread; what it does is the
    stall. Paths in ``skip`` (replicated tensors another rank wrote at the previous save)
    are not copied; their bytes are hashed instead, so that a tensor that stopped being
    identical across ranks aborts the save (loudly, on every rank, nothing committed)
    and the next save copies all:

    - CPU tensors in memory an optimizer owns (``managed`` given: ``replicas=verify``)
      are only listed in ``snap.deferred`` with their version counter; the commit thread
      hashes them (:func:`finish_snapshot`) while the engine's fence holds every optimizer
      step, so the stall is this rank's copy alone;
    - other CPU tensors are hashed here, before ``save()`` returns (all of them with
      ``replicas=verify-sync``, where ``managed`` is None);
    - tensors on a GPU are copied into staging like this rank's own (a DMA into pinned
      memory) and hashed on the commit thread with them: sound without any fence, and
      if the pattern changed this rank still holds its value and writes it.

    With ``trust`` (option ``replicas=trust``) they are not read at all: the DDP
    invariant is assumed, as DCP's dedup assumes it, and the stall is the copy alone.
    """
    snap = Snapshot(step=step)
    try:
        phase("snapshot", step=step)
        skeleton, tensors = tree.encode(state)
        # dtype and shape of every tensor as the state has it (a DTensor: global), for the structure checks
        shapes = {p: [manifest.dtype_name(t.dtype), list(t.shape)] for p, t in tensors.items()}
        snap.dtensors = split_dtensors(tensors)
        for path, t in tensors.items():
            manifest.dtype_name(t.dtype)
            if t.layout != torch.strided:
                raise manifest.ManifestError(path, f"tensor layout {t.layout} is not supported")
        if staging is not None:
            for path in sorted(skip & tensors.keys()):
                t = tensors[path].detach()
                if trust:  # DDP replicas by contract: shape and dtype only, no bytes read
                    del tensors[path]
                    nbytes = t.numel() * t.element_size()
                    snap.hashed_only[path] = [TRUSTED, nbytes, manifest.DTYPE_NAMES[t.dtype], list(t.shape)]
                elif t.device.type != "cpu":
                    continue  # staged with this rank's own tensors, hashed on the commit thread
                elif (version := _deferrable(t, managed)) is not None:
                    del tensors[path]
                    snap.deferred.append((path, t, version))
                else:
                    del tensors[path]
                    snap.hashed_only[path] = _meta(t)
            tensors = staging.copy(tensors)
        else:
            tensors = {p: t.detach().cpu().contiguous() for p, t in tensors.items()}
        snap.skeleton, snap.tensors = skeleton, tensors
        if isinstance(state, dict) and "model" in state:
            snap.model_structure = {p[len("model/"):]: v for p, v in sorted(shapes.items()) if p.startswith("model/")}
        if isinstance(state, dict) and "optimizer" in state:
            snap.optimizer_structure = optimizer_structure(state["optimizer"])
    except Exception as exc:  # noqa: BLE001 - reported to every rank through the vote
        snap.error = f"{type(exc).__name__}: {exc}"
        snap.deferred = []
    return snap


class ReplicaCheck:
    """The deferred replica hashes of one async snapshot, done by whichever thread gets there first.

    The commit thread runs them (:func:`finish_snapshot`); a training thread that reaches
    the engine's fence before they are done (an optimizer step, ``wait_snapshot()``) calls
    :meth:`help` and hashes what is left alongside it instead of idling. Items are claimed
    one at a time under a lock, largest first; xxhash releases the GIL while it reads, so
    two threads hash in parallel. Once none is left to claim, a helper also reads the items
    another thread is still reading, rather than wait for it: with two ranks' training and
    commit threads on two cores, the commit thread often sits preempted in the middle of
    one, which cost the waiter up to a scheduler slice (about 5 ms at 100 MB, where the
    whole check takes 2.5). The bytes cannot change while the fence holds optimizer steps,
    so the first digest of an item counts. The thread that records the last digest
    completes the check (the version counters compared) and calls ``on_complete`` (the
    engine opens the fence), so a waiting training thread never waits on the commit thread.
    :meth:`help` never raises: a failure is kept and fails the save, never the caller's
    optimizer step.
    """

    def __init__(self, items: list[tuple[str, torch.Tensor, int]],
                 on_complete: Callable[[], None] | None = None) -> None:
        self._items = sorted(items, key=lambda item: -item[1].numel() * item[1].element_size())
        self._next = 0
        self._cond = threading.Condition()
        self._on_complete = on_complete
        self._done: set[str] = set()  # paths read (a digest or an error)
        self.digests: dict[str, list] = {}
        self.error: str | None = None
        self.complete = len(self._items) == 0

    def _claim(self) -> tuple[str, torch.Tensor] | None:
        """Under the lock: the next item nobody claimed, else one still being read, else None."""
        if self.complete:
            return None
        if self._next < len(self._items):
            path, t, _ = self._items[self._next]
            self._next += 1
            return path, t
        for path, t, _ in reversed(self._items):  # the last claimed is likeliest the least read
            if path not in self._done:
                return path, t
        return None

    def help(self) -> None:
        """Read items until every one has been read (any thread)."""
        while True:
            with self._cond:
                claimed = self._claim()
            if claimed is None:
                return
            path, t = claimed
            digest_, error = None, None
            try:
                digest_ = _meta(t)
            except Exception as exc:  # noqa: BLE001 - fails the save through finish_snapshot
                error = f"{type(exc).__name__}: {exc}"
            with self._cond:
                if self.complete or path in self._done:
                    continue  # another thread read it first
                self._done.add(path)
                if digest_ is not None:
                    self.digests[path] = digest_
                self.error = self.error or error
                if len(self._done) < len(self._items):
                    continue
                self._check_versions()
                self.complete = True
                self._cond.notify_all()
            if self._on_complete is not None:
                self._on_complete()
            return

    def _check_versions(self) -> None:
        """Under the lock, once every item was read: refuse the save if one changed in place meanwhile."""
        if self.error is not None:
            return
        moved = [path for path, t, version in self._items if int(t._version) != version]
        if moved:
            self.error = (f"replicated tensor(s) {moved[:3]} changed in place between save() and the end of their "
                          "replica check, outside an optimizer step; what was read may not be their value at "
                          "save(), so this save is refused (call wait_snapshot() before such updates)")

    def finish(self) -> tuple[dict[str, list], str | None]:
        """Commit thread: read what is left, wait until every item was read, then drop the tensors.

        Returns the digests and an error (or None).
        """
        self.help()
        with self._cond:
            while not self.complete:
                self._cond.wait()
            self._items = []
            return self.digests, self.error


def finish_snapshot(snap: Snapshot, check: ReplicaCheck | None = None) -> None:
    """Commit thread, before the first exchange: hash the deferred replicas of ``snap``.

    Called by ``ReferenceCheckpointer._commit`` while the engine's fence holds optimizer
    steps (``check`` is the :class:`ReplicaCheck` the fence's waiters help with; the one
    that reads the last replica opens the fence, before this returns). A tensor whose
    version counter moved
    since ``save()`` was changed in place by something other than an optimizer step
    (which the fence holds): what was hashed may not be the value at ``save()``, so the
    save is refused, on every rank, through the first exchange (``snap.error``), and the
    next save copies everything again. Writes that bypass the version counter
    (``tensor.data``, numpy views, foreign kernels) are not seen: see the engine's docs
    for that contract. Never raises; drops its references to the live tensors.
    """
    check = check if check is not None else ReplicaCheck(snap.deferred)
    snap.deferred = []
    digests, error = check.finish()
    if snap.error is None:
        snap.hashed_only.update(digests)
        snap.error = error


@dataclass
class SaveResult:
    bytes_written: int
    checkpoint_bytes: int
    written_by_others: frozenset[str] = frozenset()  # replicated paths another rank wrote


def _raise_if_failed(step: int, stage: str, replies: list[dict[str, Any]]) -> None:
    failed = [(r, m.get("error")) for r, m in enumerate(replies) if not m.get("ok")]
    if failed:
        who = "; ".join(f"rank {r}: {why}" for r, why in failed)
        raise CommitError(f"save of step {step} aborted at {stage}, nothing committed ({who})")


def run_save(root: str, comm: Comm, opts: Options, snap: Snapshot, store: Any = None) -> SaveResult:
    """Collective: write this rank's shard, vote, publish on rank 0, agree on the outcome.

    ``store`` is the storage backend (``chaos.reference.storage``); None means the POSIX one at ``root``.
    """
    from chaos.reference.storage import as_storage

    store = as_storage(root) if store is None else store
    rank, step = comm.rank, snap.step
    msg: dict[str, Any] = {"ok": snap.error is None, "error": snap.error}
    if snap.error is None:
        try:
            msg["meta"] = {p: _meta(t) for p, t in snap.tensors.items()} | snap.hashed_only
            msg["skeleton"] = snap.skeleton
            if snap.dtensors:
                msg["dtensors"] = snap.dtensors
        except Exception as exc:  # noqa: BLE001
            msg = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if rank == 0:
        msg["nonce"] = commit.new_nonce()
    replies = comm.all_gather_json(msg)
    _raise_if_failed(step, "snapshot", replies)
    pieces = {d["piece"]["name"] for m in replies for d in m.get("dtensors", {}).values() if d["piece"]}
    plan = make_plan([m["meta"] for m in replies], shared=pieces)
    torn = sorted(n for n in pieces if n not in plan.replicated)
    torn = [n for n in torn if sum(n in m["meta"] for m in replies) > 1]
    if torn:
        raise CommitError(f"save of step {step} aborted, nothing committed: ranks holding replicas of the same "
                          f"DTensor piece disagree on its bytes ({torn[:3]})")
    tmp_name = commit.tmp_dirname(step, replies[0]["nonce"])
    shard_name = f"shard-r{rank:05d}.safetensors"

    vote: dict[str, Any]
    try:
        phase("write_shards", step=step)
        missing = sorted(p for p in plan.owned[rank].values() if p not in snap.tensors)
        if missing:
            raise CommitError(
                f"replication pattern changed since the previous save: this rank must now write {missing[:3]} "
                "but only hashed it at snapshot time; the next save copies everything"
            )
        owned = {name: snap.tensors[path] for name, path in plan.owned[rank].items()}
        checksums = {name: replies[rank]["meta"][path][0] for name, path in plan.owned[rank].items()} if opts.hash == "xxh3" else None
        meta = {"format": manifest.FORMAT, "step": str(step), "rank": str(rank), "world_size": str(comm.world_size)}
        with store.create_shard(tmp_name, shard_name) as f:  # POSIX: makedirs + open(..., "wb")
            info = write_shard(f, shard_name, owned, meta, opts.hash, checksums, Throttle(opts.throttle_mb_s), opts.serializer)
            for name, path in plan.owned[rank].items():
                if path in pieces:  # a slice of it may be all a resharded load reads: checksums per block
                    info.entries[name]["blocks"] = block_checksums(opts.hash, tensor_bytes(owned[name]))
            phase("fsync_shards", step=step)
            store.durable(f)  # POSIX: flush + fsync; S3: complete the upload, read back its size
        vote = {"ok": True, "file": shard_name, "size": info.size, "checksum": info.checksum, "entries": info.entries}
    except Exception as exc:  # noqa: BLE001 - reported to every rank through the vote
        vote = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        phase("vote", step=step)
    except Exception as exc:  # noqa: BLE001 - a listener that fails here fails the vote
        vote = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    votes = comm.all_gather_json(vote)
    try:
        _raise_if_failed(step, "vote", votes)
    except CommitError:
        if rank == 0:
            store.clean_stale()
        raise

    outcome: dict[str, Any] = {"ok": True}
    if rank == 0:
        previous = _safe_latest(store)
        try:
            body = build_manifest(step, comm.world_size, opts, snap, replies, votes, plan)
            store.publish(tmp_name, step, manifest.encode_manifest(body))
        except Exception as exc:  # noqa: BLE001 - reported to every rank below
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            store.roll_back(step, tmp_name, previous)
    finals = comm.all_gather_json(outcome)
    _raise_if_failed(step, "publish", finals)
    others = frozenset(plan.replicated - set(plan.owned[rank].values()))
    return SaveResult(bytes_written=votes[rank]["size"], checkpoint_bytes=sum(v["size"] for v in votes), written_by_others=others)


def dtensor_section(replies: list, plan: Any) -> dict[str, Any]:
    """The manifest's ``dtensors`` section: every sharded tensor and all its pieces, from every rank's report."""
    section: dict[str, Any] = {}
    pieces: dict[str, dict[str, dict[str, Any]]] = {}
    for r, m in enumerate(replies):
        for path, d in m.get("dtensors", {}).items():
            head = {k: d[k] for k in ("dtype", "shape", "placements", "mesh")}
            if section.setdefault(path, head) != head:
                raise CommitError(f"ranks disagree on what DTensor {path!r} is: {section[path]} vs {head} (rank {r})")
            piece = d["piece"]
            if piece is not None:
                pieces.setdefault(path, {}).setdefault(piece["name"], {
                    "entry": plan.entry_of(r, piece["name"]), "offset": piece["offset"], "shape": piece["shape"]})
    for path, head in section.items():
        head["pieces"] = sorted(pieces.get(path, {}).values(), key=lambda p: p["offset"])
    return section


def _safe_latest(store: Any) -> int | None:
    try:
        return store.read_latest()
    except Exception:  # noqa: BLE001 - a malformed pointer is simply replaced
        return None


def build_manifest(step: int, world: int, opts: Options, snap: Snapshot, replies: list, votes: list, plan: Any) -> dict[str, Any]:
    shards, entries = {}, {}
    for r, v in enumerate(votes):
        shards[v["file"]] = {"rank": r, "size": v["size"], "checksum": v["checksum"]}
        for name, e in v["entries"].items():
            entries[name] = {"shard": v["file"], **e}
    skeletons = [tree.resolve(m["skeleton"], lambda p, r=r: plan.entry_of(r, p)) for r, m in enumerate(replies)]
    now = time.time()
    body: dict[str, Any] = {
        "format": manifest.FORMAT,
        "format_version": manifest.FORMAT_VERSION,
        "step": step,
        "world_size": world,
        "hash": opts.hash,
        "created": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(),
        "created_unix": now,
        "torch_version": torch.__version__,
        "shards": shards,
        "entries": entries,
        "tree": tree.merge(skeletons),
        "replicated_entries": len(plan.replicated),
    }
    section = dtensor_section(replies, plan)
    if section:
        body["format_version"] = manifest.FORMAT_VERSION_SHARDED
        body["dtensors"] = section
    if snap.model_structure is not None:
        body["model_structure"] = snap.model_structure
        body["model_fingerprint"] = manifest.fingerprint_structure(snap.model_structure)
    if snap.optimizer_structure is not None:
        body["optimizer_structure"] = snap.optimizer_structure
    return body
