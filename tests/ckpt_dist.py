"""Run a function in N real rank processes joined by a gloo process group.

Used by the checkpointer tests: ``run_ranks(fn, world_size, *args)`` starts one
process per rank from a forkserver that has already imported torch (so each launch
costs a fork, not a 2 s import), initialises gloo on a free localhost port, calls
``fn(rank, world_size, *args)`` and returns ``{rank: RankResult}``. A rank that
raises reports its traceback; a rank that dies (e.g. SIGKILL from a phase listener)
reports its exit code. Children still alive at the deadline, or when the caller is
interrupted, are killed in ``finally``. ``fn`` must be importable (module level).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chaos.launch.ports import free_port

_CTX: Any = None


def _context() -> Any:
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "chaos.reference.checkpoint"])
        _CTX = ctx
    return _CTX


@dataclass
class RankResult:
    rank: int
    ok: bool
    value: Any = None
    error: str | None = None
    exitcode: int | None = None


def _main(rank: int, world: int, port: int, fn: Callable, args: tuple, results: Any, pg_timeout: float) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=pg_timeout))
        value = fn(rank, world, *args)
        results.put((rank, True, value, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, None, traceback.format_exc()))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def run_ranks(fn: Callable, world_size: int, *args: Any, timeout: float = 60.0, pg_timeout: float = 20.0) -> dict[int, RankResult]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` gloo ranks; never leaves children behind."""
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_main, args=(r, world_size, port, fn, args, results, pg_timeout), daemon=True) for r in range(world_size)]
    out: dict[int, RankResult] = {}
    started: list[Any] = []
    try:
        for p in procs:
            p.start()
            started.append(p)
        deadline = time.monotonic() + timeout
        while len(out) < world_size and time.monotonic() < deadline:
            try:
                rank, ok, value, error = results.get(timeout=0.2)
                out[rank] = RankResult(rank, ok, value, error)
            except queue.Empty:
                if all(not p.is_alive() for p in procs):
                    # Drain what finished ranks queued just before exiting.
                    try:
                        while True:
                            rank, ok, value, error = results.get(timeout=0.5)
                            out[rank] = RankResult(rank, ok, value, error)
                    except queue.Empty:
                        break
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for p in started:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        results.close()
    for r, p in enumerate(procs):
        if r not in out:
            out[r] = RankResult(r, False, None, "no result (killed or timed out)", p.exitcode)
        else:
            out[r].exitcode = p.exitcode
    return out


def check_all_ok(results: dict[int, RankResult]) -> list[Any]:
    """Values in rank order; fails with every rank's traceback if any rank failed."""
    bad = [r for r in results.values() if not r.ok]
    if bad:
        raise AssertionError("\n".join(f"rank {r.rank} (exit {r.exitcode}):\n{r.error}" for r in bad))
    return [results[r].value for r in sorted(results)]
