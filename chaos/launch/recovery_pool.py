"""A warm group of rank processes that run a checkpointer's recovery again and again.

Power-loss exploration checks hundreds of crash states of one save. Launching a
fresh ``torch.distributed`` job per state would cost a fork server round trip, a
rendezvous and a model build each time (about a second); the states would then
trickle through at one per second. Here ``world_size`` rank processes are forked
*once* from the warm fork server (torch already imported), join one gloo process
group, build the workload's load template, and then loop:

    parent sends a directory ──► every rank: cls(dir, rank, ws, **opts)
                                             .load_latest(deepcopy(template))
                                             fingerprint(state)
    parent receives, per rank ◄── {"step", "fingerprint", "error", "timeout", "seconds"}
                                  (+ "rejected": the steps it passed over and why, where
                                   the checkpointer announces phase ``load_rejected``)

so a state costs one checkpointer construction, one load and one hash per rank.

A recovery that hangs (ranks disagreeing on which collectives to run) is bounded
twice: the process group's own timeout (``pg_timeout_s``, short on purpose) makes a
stuck collective raise, and the pool's ``job_timeout_s`` catches anything else. Either
way the state's ranks are marked ``timeout`` and the group is torn down and started
again, because a gloo group that timed out, or whose ranks ran different numbers of
collectives, cannot be trusted for the next state. After any state in which a rank
raised, the pool runs one ``all_reduce`` health check and restarts on a wrong answer.

Processes: each rank is its own process-group leader (one ``killpg`` takes it and
anything it started), asks the kernel for ``PR_SET_PDEATHSIG`` and exits when its
pipe to the parent closes. :meth:`RecoveryPool.close` (and the context manager, and
an ``atexit`` hook) SIGKILLs every group and reaps it; nothing outlives the pool.

>>> with RecoveryPool(2, {"d_model": 64}, "tests/checkpointers/careful.py:CarefulCheckpointer") as pool:
...     pool.recover("/dev/shm/state-17")
[{'rank': 0, 'step': 2, 'fingerprint': {...}, 'error': None, 'timeout': False, ...}, {...}]
"""

from __future__ import annotations

import atexit
import copy
import os
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from chaos import phases
from chaos.errors import HarnessError
from chaos.launch.cluster import _context as cluster_context
from chaos.launch.ports import free_port
from chaos.launch.reaper import kill_rank

_pools: weakref.WeakSet[RecoveryPool] = weakref.WeakSet()


def _context() -> Any:
    """The harness's warm fork server (torch preloaded), shared with the cluster."""
    return cluster_context()


def _proc_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


# ---------------------------------------------------------------------- worker side
@dataclass(frozen=True)
class _WorkerSpec:
    rank: int
    world_size: int
    port: int
    workload: dict[str, Any]
    checkpointer: str
    ckpt_options: dict[str, Any]
    pg_timeout_s: float


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:1000]}"


def _is_timeout(exc: BaseException) -> bool:
    """A collective that gave up waiting: gloo raises DistBackendError / RuntimeError
    saying "Timed out"; either way the group is no longer in step."""
    text = f"{type(exc).__name__} {exc}".lower()
    return "timed out" in text or "timeout" in text or type(exc).__name__ == "DistBackendError"


def _clone_tree(x: Any) -> Any:
    """A private copy of the load template, ~10x cheaper than ``copy.deepcopy``.

    DCP-style loaders fill the template in place, so every state needs a fresh one;
    deepcopy of a tensor goes through ``__deepcopy__`` / storage copies and costs
    tens of microseconds each. Plain tensors are cloned, containers rebuilt (keeping
    attributes such as ``state_dict()._metadata``), anything unusual deep-copied.
    """
    import torch

    t = type(x)
    if t is torch.Tensor:
        return x.detach().clone()
    if t in (int, float, bool, str, bytes, type(None)):
        return x
    if t is dict:
        return {k: _clone_tree(v) for k, v in x.items()}
    if t is list:
        return [_clone_tree(v) for v in x]
    if t is tuple:
        return tuple(_clone_tree(v) for v in x)
    if isinstance(x, dict) and t.__module__ == "collections":  # OrderedDict
        y = t((k, _clone_tree(v)) for k, v in x.items())
        for k, v in getattr(x, "__dict__", {}).items():
            setattr(y, k, copy.deepcopy(v))
        return y
    return copy.deepcopy(x)


_SCALARS = (int, float, str, bool, bytes, type(None))


class _Fingerprinter:
    """:func:`chaos.model.statehash.fingerprint`, with tensor digests memoised by content.

    The SHA-256 of every tensor dominates hashing a loaded state, yet across crash
    states the same few checkpoints load again and again. A tensor's digest is
    cached under (dtype, shape, xxh3-128 of its bytes), xxh3 being an order of
    magnitude cheaper; on a miss the real ``tensor_digest`` is computed. The leaf walk
    and non-tensor encodings are statehash's own. ``check`` compares against the
    plain function once and switches the cache off if they ever disagree.
    """

    def __init__(self, limit: int = 200_000) -> None:
        self.cache: dict[tuple[Any, ...], str] = {}
        self.limit = limit
        self.enabled = True

    @staticmethod
    def _key(leaf: Any) -> tuple[Any, ...]:
        """(kind, dtype, shape, xxh3 of the bytes): what ``tensor_digest`` hashes, cheaply."""
        import numpy as np
        import torch
        import xxhash

        from chaos.model import statehash

        leaf = statehash.global_value(leaf)  # a DTensor (parallel=fsdp|hsdp|tp): its gathered global value
        if isinstance(leaf, np.ndarray):
            arr = np.ascontiguousarray(leaf)
            return ("np", arr.dtype.str, arr.shape, xxhash.xxh3_128_digest(arr.reshape(-1).view(np.uint8)))
        try:
            arr = leaf.numpy()  # shares memory: no copy for a plain CPU tensor
        except (RuntimeError, TypeError):  # requires grad, not on CPU, or no numpy dtype (bf16)
            t = leaf.detach().cpu().contiguous()
            arr = t.reshape(-1).view(torch.uint8).numpy()
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        return ("torch", leaf.dtype, tuple(leaf.shape), xxhash.xxh3_128_digest(arr))

    def __call__(self, state: Any) -> dict[str, str]:
        import numpy as np
        import torch

        from chaos.model import statehash

        if not self.enabled:
            return statehash.fingerprint(state)
        if len(self.cache) > self.limit:
            self.cache.clear()
        cache = self.cache
        out: dict[str, str] = {}
        for path, leaf in statehash.iter_leaves(state):
            t = type(leaf)
            if isinstance(leaf, (torch.Tensor, np.ndarray)):
                key: tuple[Any, ...] = self._key(leaf)
                digest = cache.get(key)
                if digest is None:
                    digest = cache[key] = statehash.tensor_digest(leaf)
            elif t in _SCALARS:
                key = ("v", t, leaf.hex() if t is float else leaf)
                digest = cache.get(key)
                if digest is None:
                    digest = cache[key] = statehash.value_digest(leaf)
            else:
                digest = statehash.value_digest(leaf)
            out[path] = digest
        return out

    def check(self, state: Any) -> bool:
        from chaos.model import statehash

        self.enabled = self(state) == statehash.fingerprint(state)
        return self.enabled


def _recover(cls: type, spec: _WorkerSpec, template: dict[str, Any], path: str,
             fingerprint: Any) -> dict[str, Any]:
    """One recovery: construct, load into a fresh copy of the template, fingerprint."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"rank": spec.rank, "step": None, "fingerprint": None, "error": None,
                           "timeout": False, "seconds": 0.0}
    ckpt = None
    # Why the checkpointer fell back past a newer step, where it says so (phase
    # ``load_rejected``, the reference's): a verdict of "loaded an older step" then names it.
    rejected: list[dict[str, Any]] = []

    def note(name: str, info: dict[str, Any]) -> None:
        if name == "load_rejected":
            rejected.append({"step": info.get("step"), "why": str(info.get("why"))[:500]})

    phases.subscribe(note)
    try:
        ckpt = cls(path, spec.rank, spec.world_size, **spec.ckpt_options)
        found = ckpt.load_latest(_clone_tree(template))  # DCP-style loaders fill it in place
        if found is not None:
            step, state = found
            out["step"] = int(step)
            out["fingerprint"] = fingerprint(state)
    except BaseException as exc:  # noqa: BLE001 - any failure of the code under test is a result
        out["error"] = _err(exc)
        out["timeout"] = _is_timeout(exc)
    finally:
        if ckpt is not None:
            try:
                ckpt.close()
            except BaseException as exc:  # noqa: BLE001
                if out["error"] is None:
                    out["error"] = "close: " + _err(exc)
        phases.unsubscribe(note)
    if rejected:
        out["rejected"] = rejected[:8]
    out["seconds"] = time.perf_counter() - t0
    return out


def _health(gen: int, group: Any = None) -> bool:
    """All ranks in step: an all_reduce of (gen, -gen) with MAX must give back exactly that.

    ``group``: the pool's own gloo group, which no checkpointer uses, so a collective the
    code under test left unmatched on the default group cannot pair with this one."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([gen, -gen], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist() == [gen, -gen]


def _agree(gen: int, flag: int, group: Any) -> tuple[bool, int]:
    """After one state of a batch: are all ranks done with state ``gen``, and the worst
    ``flag`` (0 ok, 1 a rank raised, 2 a rank timed out) any rank saw. On the pool's own
    group (see :func:`_health`): a rank still stuck in the checkpointer's collectives
    makes it time out instead of completing it."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([gen, -gen, flag], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    got = t.tolist()
    return got[:2] == [gen, -gen], int(got[2])


def _run_batch(cls: type, spec: _WorkerSpec, template: dict[str, Any], job: int, paths: list[str],
               fingerprint: Any, conn: Any, group: Any) -> None:
    """Recover every directory of a batch in order, sending each result as soon as it is known.

    After each state the ranks agree (one all_reduce) that they are on the same state and
    whether any of them failed; the state's result then goes out with the outcome. A group
    out of step, or a timeout on any rank, ends the batch there (the parent restarts the
    group and sends the rest again), the last state of a batch included.
    """
    for i, path in enumerate(paths):
        out = _recover(cls, spec, template, path, fingerprint)
        flag = 2 if out["timeout"] else (1 if out["error"] else 0)
        stop = None
        if spec.world_size > 1:
            try:
                ok, flag = _agree(job * 1_000_003 + i + 1, flag, group)
            except BaseException:  # noqa: BLE001 - a broken group is the answer
                ok = False
            if not ok:
                stop = "process group out of step after a failed recovery"
        if stop is None and flag >= 2:
            stop = "a collective timed out"
        conn.send(("bresult", job, i, out, stop))  # the last state of a batch says it too
        if stop is not None:
            return


def _worker_main(spec: _WorkerSpec, conn: Any) -> None:
    """Entry point of one rank of the pool (runs in a process forked by the fork server)."""
    from chaos.target.workload.train import become_rank_process

    become_rank_process()
    code = 0
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from chaos.target.protocol import load_checkpointer
        from chaos.target.workload.config import WorkloadConfig
        from chaos.target.workload.train import Trainer

        torch.set_num_threads(1)
        timeout = timedelta(seconds=spec.pg_timeout_s)
        store = dist.TCPStore("127.0.0.1", spec.port, spec.world_size, is_master=spec.rank == 0,
                              timeout=timedelta(seconds=60), wait_for_workers=False)
        if spec.rank == 0:
            conn.send(("store_ready",))
        dist.init_process_group("gloo", store=store, rank=spec.rank, world_size=spec.world_size,
                                timeout=timeout)
        # The pool's own group for its health checks, made before any checkpointer makes one.
        own = dist.new_group(backend="gloo", timeout=timeout) if spec.world_size > 1 else None
        template = Trainer(WorkloadConfig.from_dict(spec.workload), spec.rank, spec.world_size).template()
        cls = load_checkpointer(spec.checkpointer)
        fingerprint = _Fingerprinter()
        fingerprint.check(template)
        conn.send(("ready", os.getpid()))
    except BaseException as exc:  # noqa: BLE001 - report, then die: the parent raises
        try:
            conn.send(("failed", _err(exc)))
        finally:
            os._exit(3)
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break  # the parent is gone
            if msg[0] == "stop":
                break
            if msg[0] == "load":
                conn.send(("result", msg[1], _recover(cls, spec, template, msg[2], fingerprint)))
            elif msg[0] == "batch":
                _run_batch(cls, spec, template, msg[1], msg[2], fingerprint, conn, own)
            elif msg[0] == "health":
                try:
                    ok = _health(msg[1], own)
                except BaseException:  # noqa: BLE001
                    ok = False
                conn.send(("health", msg[1], ok))
    except BaseException:  # noqa: BLE001
        code = 4
    os._exit(code)


# ---------------------------------------------------------------------- parent side
@dataclass
class _Worker:
    rank: int
    proc: Any
    conn: Any


@dataclass
class _Batch:
    """A batch in flight: what each rank sent back so far."""

    job: int
    paths: list[str]
    results: dict[int, list[dict[str, Any]]]
    stopped: dict[int, str] = field(default_factory=dict)  # rank -> why it ended the batch early
    died: dict[int, str] = field(default_factory=dict)  # rank -> "rank R exited C"
    last: float = 0.0  # time.monotonic() of the last message

    def rank_done(self, rank: int) -> bool:
        return len(self.results[rank]) >= len(self.paths) or rank in self.stopped or rank in self.died


@dataclass
class PoolStats:
    """What the pool did: starts (1 + restarts), jobs, and why it restarted."""

    starts: int = 0
    jobs: int = 0
    restarts: list[str] = field(default_factory=list)
    start_seconds: float = 0.0


class RecoveryPool:
    """``world_size`` warm rank processes that run ``load_latest`` on directory after directory.

    ``workload``: a WorkloadConfig dict; its model gives the load template (the same
    shapes the recorded run saved). ``checkpointer``: a spec for
    :func:`chaos.target.protocol.load_checkpointer`. ``pg_timeout_s`` bounds every collective
    of a recovery; ``job_timeout_s`` (default ``pg_timeout_s + 5``) bounds a whole state.
    """

    def __init__(self, world_size: int, workload: dict[str, Any], checkpointer: str,
                 ckpt_options: dict[str, Any] | None = None, *, pg_timeout_s: float = 10.0,
                 job_timeout_s: float | None = None, start_timeout_s: float = 120.0) -> None:
        if world_size < 1:
            raise HarnessError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.workload = dict(workload)
        self.checkpointer = checkpointer
        self.ckpt_options = dict(ckpt_options or {})
        self.pg_timeout_s = pg_timeout_s
        self.job_timeout_s = job_timeout_s if job_timeout_s is not None else pg_timeout_s + 5.0
        self.start_timeout_s = start_timeout_s
        self.stats = PoolStats()
        self._workers: list[_Worker] = []
        self._job = 0
        self._pending: int | None = None
        self._batch: _Batch | None = None
        self._closed = False
        self._cpu_done = 0.0
        _pools.add(self)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- lifecycle ------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers (each also a process-group id)."""
        return [w.proc.pid for w in self._workers]

    def _spawn(self, rank: int, port: int) -> _Worker:
        ctx = _context()
        parent, child = ctx.Pipe()
        spec = _WorkerSpec(rank, self.world_size, port, self.workload, self.checkpointer,
                           self.ckpt_options, self.pg_timeout_s)
        proc = ctx.Process(target=_worker_main, args=(spec, child), daemon=False,
                           name=f"chaos-recovery-{rank}")
        proc.start()
        child.close()
        w = _Worker(rank, proc, parent)
        self._workers.append(w)
        return w

    def _start(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout_s
        port = free_port()
        first = self._spawn(0, port)
        self._expect(first, "store_ready", deadline)
        for rank in range(1, self.world_size):
            self._spawn(rank, port)
        for w in self._workers:
            self._expect(w, "ready", deadline)
        self.stats.starts += 1
        self.stats.start_seconds += time.monotonic() - t0

    def _expect(self, w: _Worker, what: str, deadline: float) -> Any:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HarnessError(f"recovery rank {w.rank} did not become {what} in {self.start_timeout_s:.0f} s")
            if not wait([w.conn, w.proc.sentinel], timeout=left):
                continue
            if w.conn.poll():
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    msg = ("failed", "pipe closed")
                if msg[0] == what:
                    return msg
                if msg[0] == "failed":
                    raise HarnessError(f"recovery rank {w.rank} failed to start: {msg[1]}")
            elif not w.proc.is_alive():
                raise HarnessError(f"recovery rank {w.rank} exited at start with code {w.proc.exitcode}")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the pool's workers used so far, restarted ones included.

        Read from ``/proc`` because the workers are the fork server's children, not
        ours; lets a benchmark tell CPU cost from time lost to other load on the box.
        """
        return self._cpu_done + sum(_proc_cpu(w.proc.pid) for w in self._workers)

    def _stop_workers(self) -> None:
        self._cpu_done += sum(_proc_cpu(w.proc.pid) for w in self._workers)
        for w in self._workers:
            kill_rank(w.proc.pid)
        for w in self._workers:
            w.proc.join(timeout=10)
            try:
                w.conn.close()
            except OSError:
                pass
        self._workers = []
        self._pending = None
        self._batch = None

    def restart(self, why: str) -> None:
        """Kill the group and start a fresh one (after a hang or a broken process group)."""
        self.stats.restarts.append(why)
        self._stop_workers()
        self._start()

    def close(self) -> None:
        """SIGKILL every worker's process group and reap it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_workers()

    def __enter__(self) -> RecoveryPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs -----------------------------------------------------------------
    def submit(self, path: str | os.PathLike[str]) -> None:
        """Start recovery from ``path`` on every rank; :meth:`collect` returns the results."""
        if self._closed:
            raise HarnessError("recovery pool is closed")
        if self._pending is not None or self._batch is not None:
            raise HarnessError("a recovery is already in flight; collect() it first")
        self._job += 1
        self._pending = self._job
        for w in self._workers:
            w.conn.send(("load", self._job, os.fspath(path)))

    def collect(self) -> list[dict[str, Any]]:
        """Per-rank results of the submitted recovery, in rank order.

        A rank that did not answer within ``job_timeout_s`` gets ``timeout: True`` and
        an error saying so; a rank that died gets its exit code. Either restarts the
        group, as does a failed health check after any rank raised.
        """
        job = self._pending
        if job is None:
            raise HarnessError("no recovery in flight")
        self.stats.jobs += 1
        results: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + self.job_timeout_s
        died: list[str] = []
        while len(results) < self.world_size:
            open_ = {w.conn: w for w in self._workers if w.rank not in results}
            sentinels = {w.proc.sentinel: w for w in self._workers if w.rank not in results}
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for obj in wait(list(open_) + list(sentinels), timeout=left):
                w = open_.get(obj) or sentinels[obj]
                if w.rank in results:
                    continue
                try:
                    msg = w.conn.recv() if w.conn.poll() else None
                except (EOFError, OSError):
                    msg = None
                if msg is not None and msg[0] == "result" and msg[1] == job:
                    results[w.rank] = msg[2]
                elif msg is None and not w.proc.is_alive():
                    w.proc.join(timeout=1)
                    results[w.rank] = {"rank": w.rank, "step": None, "fingerprint": None,
                                       "error": f"WorkerDied: recovery process exited with code {w.proc.exitcode}",
                                       "timeout": False, "seconds": 0.0}
                    died.append(f"rank {w.rank} exited {w.proc.exitcode}")
            if died:
                break
        self._pending = None
        hung = [r for r in range(self.world_size) if r not in results]
        for r in hung:
            results[r] = {"rank": r, "step": None, "fingerprint": None,
                          "error": ("Aborted: a peer recovery process died" if died else
                                    f"Timeout: no answer within {self.job_timeout_s:.0f} s"),
                          "timeout": not died, "seconds": self.job_timeout_s}
        out = [results[r] for r in range(self.world_size)]
        if died or hung:
            self.restart("; ".join(died) or f"ranks {hung} hung")
        elif any(r["timeout"] for r in out):
            self.restart("a collective timed out")
        elif any(r["error"] for r in out) and self.world_size > 1 and not self._healthy():
            self.restart("process group out of step after a failed recovery")
        return out

    # -- batches ----------------------------------------------------------------
    def submit_batch(self, paths: list[str | os.PathLike[str]]) -> None:
        """Start recovery from each of ``paths``, in order, on every rank, in one round trip.

        Each rank streams one result per state as it finishes it, so a state is bounded by
        ``job_timeout_s`` from the previous answer, however long the batch. After every
        state the ranks run one all_reduce to agree they are in step (the health check
        :meth:`collect` runs only after a failure); :meth:`collect_batch` returns the results.
        """
        if self._closed:
            raise HarnessError("recovery pool is closed")
        if self._pending is not None or self._batch is not None:
            raise HarnessError("a recovery is already in flight; collect it first")
        if not paths:
            raise HarnessError("an empty batch")
        self._job += 1
        b = _Batch(self._job, [os.fspath(x) for x in paths], {w.rank: [] for w in self._workers},
                   last=time.monotonic())
        self._batch = b
        for w in self._workers:
            w.conn.send(("batch", b.job, b.paths))

    def waitables(self) -> list[Any]:
        """Connections and process sentinels to ``multiprocessing.connection.wait`` on while a
        batch is in flight (any becomes ready when a rank answers or dies)."""
        b = self._batch
        if b is None:
            return []
        return [x for w in self._workers if not b.rank_done(w.rank) for x in (w.conn, w.proc.sentinel)]

    def _drain(self, b: _Batch, w: _Worker) -> None:
        """Read whatever rank ``w`` sent; notice its death once its pipe is empty."""
        eof = False
        while not b.rank_done(w.rank):
            try:
                if not w.conn.poll():
                    break
                msg = w.conn.recv()
            except (EOFError, OSError):  # the pipe is closed and empty: the rank is gone
                eof = True
                break
            b.last = time.monotonic()
            if msg[0] == "bresult" and msg[1] == b.job and msg[2] == len(b.results[w.rank]):
                b.results[w.rank].append(msg[3])
                if msg[4] is not None:
                    b.stopped[w.rank] = msg[4]
        if not b.rank_done(w.rank) and (eof or not w.proc.is_alive()):
            if not eof:
                try:
                    if w.conn.poll():
                        return  # it wrote before dying: read that first, next time round
                except (EOFError, OSError):
                    pass
            w.proc.join(timeout=1)
            b.died[w.rank] = f"rank {w.rank} exited {w.proc.exitcode}"

    def poll_batch(self) -> bool:
        """Read what has arrived without waiting; True once :meth:`collect_batch` will not
        wait (every rank finished or ended the batch, or the batch ran past its deadline)."""
        b = self._batch
        if b is None:
            raise HarnessError("no batch in flight")
        for w in self._workers:
            self._drain(b, w)
        return all(b.rank_done(w.rank) for w in self._workers) or time.monotonic() - b.last > self.job_timeout_s

    def collect_batch(self) -> list[list[dict[str, Any]] | None]:
        """Per state of the submitted batch, the per-rank results in rank order, or ``None``
        for a state that was not run (the group ended the batch early: send it again).

        A state on which a rank died or gave no answer within ``job_timeout_s`` gets the
        same results :meth:`collect` gives it (``WorkerDied`` / ``Timeout`` / ``Aborted``)
        and the states after it ``None``. A death, a hang, a timeout or a group out of step
        restarts the group, as :meth:`collect` does.
        """
        b = self._batch
        if b is None:
            raise HarnessError("no batch in flight")
        while not self.poll_batch():
            left = b.last + self.job_timeout_s - time.monotonic()
            wait(self.waitables(), timeout=max(0.0, left))
        self._batch = None
        n = len(b.paths)
        self.stats.jobs += n
        done = min(len(r) for r in b.results.values())
        out: list[list[dict[str, Any]] | None] = [
            [b.results[r][i] for r in range(self.world_size)] for i in range(done)]
        hung = [r for r in range(self.world_size) if not b.rank_done(r)]
        if done < n and (b.died or hung):
            died = bool(b.died)
            state: list[dict[str, Any]] = []
            for r in range(self.world_size):
                if len(b.results[r]) > done:
                    state.append(b.results[r][done])
                elif r in b.died:
                    state.append({"rank": r, "step": None, "fingerprint": None,
                                  "error": f"WorkerDied: recovery process {b.died[r]}", "timeout": False,
                                  "seconds": 0.0})
                else:
                    state.append({"rank": r, "step": None, "fingerprint": None,
                                  "error": ("Aborted: a peer recovery process died" if died else
                                            f"Timeout: no answer within {self.job_timeout_s:.0f} s"),
                                  "timeout": not died and r in hung,
                                  "seconds": self.job_timeout_s})
            out.append(state)
        out.extend([None] * (n - len(out)))
        why = ("; ".join(b.died.values()) or (f"ranks {hung} hung" if hung else "")
               or next(iter(b.stopped.values()), ""))
        if why:
            self.restart(why)
        return out

    def recover(self, path: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """Run recovery from ``path`` on every rank and return the per-rank results."""
        self.submit(path)
        return self.collect()

    def _healthy(self) -> bool:
        self._job += 1
        gen = self._job
        try:
            for w in self._workers:
                w.conn.send(("health", gen))
        except OSError:
            return False
        deadline = time.monotonic() + self.pg_timeout_s + 2.0
        ok: dict[int, bool] = {}
        while len(ok) < self.world_size:
            left = deadline - time.monotonic()
            conns = {w.conn: w for w in self._workers if w.rank not in ok}
            if left <= 0 or not (ready := wait(list(conns), timeout=left)):
                return False
            for c in ready:
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    return False
                if msg[0] == "health" and msg[1] == gen:
                    ok[conns[c].rank] = bool(msg[2])
        return all(ok.values())


@atexit.register
def _close_all() -> None:
    for pool in list(_pools):
        pool.close()


__all__ = ["PoolStats", "RecoveryPool"]
