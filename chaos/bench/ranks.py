"""Rank processes and in-rank helpers shared by the checkpoint benchmarks.

``chaos.bench.checkpoint`` (replicated state, ``chaos bench``) and ``chaos.bench.sharded`` (FSDP2
state, ``chaos bench --workload parallel=fsdp``) both start a fresh gloo group of rank
processes, time collective saves and loads as the slowest rank saw them, sample the
disk's raw ``write + fsync`` bandwidth beside every save, and run the two checkpointers
they compare back to back in each repeat, alternating which goes first. That machinery
lives here so neither bench module imports the other; ``chaos.bench.save`` picks
which one runs.

Parent side: :func:`launch`, :func:`rank_envs`. In the ranks: :func:`max_all`,
:func:`max_each`, :func:`all_true`, :func:`gather`, :func:`raw_write`, :func:`timed_save`, :func:`timed_save_then_step`,
:func:`zeros_like`,
:func:`open_checkpointer`, :func:`ordered`. In the report: :func:`spread`, :func:`triple`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import statistics
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chaos.launch.ports import free_port

# Bench names for checkpointer variants: (built-in checkpointer, options).
# reference-async-trust: replicas=trust, DCP's own assumption that replicated tensors
# are identical on every rank (no bytes read for those another rank writes); plain
# reference-async (replicas=verify) also hashes them, safety DCP does not have: those an
# optimizer owns on its commit thread while optimizer steps wait at a fence.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "reference-async": ("reference", {"async_save": True}),
    "reference-async-trust": ("reference", {"async_save": True, "replicas": "trust"}),
}


# ----------------------------------------------------------------- parent side
def rank_envs(device: str, world_size: int) -> list[dict[str, str]]:
    """The environment each rank gets before it imports anything: its own GPU for ``cuda``.

    The same assignment ``chaos run --device cuda`` makes (``chaos.target.workload.device.rank_env``):
    rank ``r`` sees exactly one device, the ``r``-th the parent sees, as ``cuda:0``. Empty
    dicts for ``cpu``. A ConfigError when the parent's ``CUDA_VISIBLE_DEVICES`` lists fewer
    devices than ranks; raised here, in the parent, before any rank starts.
    """
    from chaos.target.workload.device import rank_env

    return [rank_env({"device": device}, r) for r in range(world_size)]


def _entry(target: Any, rank: int, world: int, port: int, timeout_s: float, args: tuple, env: dict[str, str],
           out: Any) -> None:
    """A rank process: take its environment, join the gloo group, run ``target(rank, world, *args)``.

    ``env`` is applied before torch touches CUDA (a spawned rank imports torch here, and
    CUDA reads ``CUDA_VISIBLE_DEVICES`` at its first use). Rank 0 sends its value back.
    """
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **env})
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
        value = target(rank, world, *args)
        dist.destroy_process_group()
        if rank == 0:
            out.put(("ok", value))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put(("error", f"rank {rank}:\n{traceback.format_exc()}"))


def launch(target: Any, world_size: int, timeout_s: float, args: tuple, ctx: Any = None,
           envs: Sequence[dict[str, str]] | None = None) -> Any:
    """Run ``target(rank, world_size, *args)`` in ``world_size`` fresh gloo rank processes; return rank 0's value.

    ``target`` must be importable (module level). ``ctx`` is a multiprocessing context
    (default: spawn; ``chaos.bench.sharded`` passes a forkserver that has imported torch
    and FSDP once, since it launches twice). ``envs[r]`` is added to rank ``r``'s
    environment first thing (:func:`rank_envs`). The ranks' default group is gloo: they
    train nothing, and every checkpointer keeps its own gloo group for its messages. A
    rank that raises or dies, or a run past ``timeout_s``, raises RuntimeError; every
    started process is gone when this returns.
    """
    ctx = ctx or mp.get_context("spawn")
    envs = list(envs) if envs is not None else [{} for _ in range(world_size)]
    if len(envs) != world_size:
        raise ValueError(f"launch: {len(envs)} rank environments for {world_size} ranks")
    out = ctx.Queue()
    port = free_port()  # the rank group's rendezvous
    procs = [ctx.Process(target=_entry, args=(target, r, world_size, port, timeout_s, args, envs[r], out), daemon=True)
             for r in range(world_size)]
    started: list[Any] = []
    try:
        for p in procs:
            p.start()
            started.append(p)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                kind, value = out.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > deadline or all(not p.is_alive() for p in procs):
                    raise RuntimeError("benchmark ranks died or timed out without a result") from None
                continue
            if kind == "error":
                raise RuntimeError(f"benchmark rank failed: {value}")
            break
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in started:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
    return value


# ----------------------------------------------------------------- in the ranks
def max_all(value: float) -> float:
    """The largest ``value`` over all ranks (collective): a timing is the slowest rank's."""
    return max_each(value)[0]


def max_each(*values: float) -> list[float]:
    """:func:`max_all` of several values in one collective (a save's timings together)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(v) for v in t.tolist()]


def raw_write(rank: int, world: int, base: str, nbytes: int, buf: Any) -> float:
    """Wall time for every rank to write and fsync its share of ``nbytes`` (collective).

    The disk's own figure, taken by the same ranks on the same disk right before a save,
    so the save is compared with the bandwidth the disk had at that moment.
    """
    import torch.distributed as dist

    share = nbytes // world
    path = os.path.join(base, f"raw-{rank}.bin")
    view = memoryview(buf.numpy()).cast("B")[:share]
    dist.barrier()
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(view)
        f.flush()
        os.fsync(f.fileno())
    dist.barrier()
    seconds = max_all(time.perf_counter() - t0)
    os.remove(path)
    return seconds


def all_true(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (collective): a load is correct only if it is on all of them."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(bool(flag))])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def gather(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank (collective)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def timed_save(ck: Any, step: int, state: dict[str, Any], cuda: bool = False) -> tuple[float, float]:
    """``(stall, save)`` seconds of one collective save, each the slowest rank's.

    stall: until ``save()`` returned (what training waits for); save: until ``wait()``
    returned, the save durable and committed. With ``cuda`` the device is idle first, so
    no earlier kernel is billed to the save. (:func:`timed_save_then_step` with no step.)
    """
    t = timed_save_then_step(ck, step, state, lambda: None, cuda)
    return t.stall, t.save


@dataclass(frozen=True)
class SaveTiming:
    """One collective save as :func:`timed_save_then_step` saw it, each figure the worst rank's.

    ``stall_faults``: page faults the training thread took during the stall (minor and
    major, ``getrusage(RUSAGE_THREAD)``). A stager that copies into memory the allocator
    just got from the kernel faults once per page it touches; one that reuses memory
    faults next to never. The same stager's stall can halve between the two, so the
    report shows which one each repeat got (``chaos.bench.checkpoint`` puts it beside the stalls).
    """

    stall: float
    save: float
    at_return: float
    stall_faults: int


def _thread_faults() -> int:
    """Page faults of the calling thread so far (0 where ``RUSAGE_THREAD`` does not exist)."""
    import resource

    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        return 0
    r = resource.getrusage(who)
    return r.ru_minflt + r.ru_majflt


def timed_save_then_step(ck: Any, step: int, state: dict[str, Any], next_step: Any,
                         cuda: bool = False) -> SaveTiming:
    """:func:`timed_save` with the caller's next optimizer step, and the faults of the stall.

    ``next_step`` (the bench's ``optimizer.step()``, with no gradients: it changes nothing
    and costs microseconds) runs right after ``save()`` returns and is billed to the stall:
    an async save may still hold the training thread there (the reference's replica check
    fence, ``replicas=verify``), and that is training time lost to the save. This is the
    worst case: a real loop runs a forward and backward pass in between. ``at_return`` is
    the stall as :func:`timed_save` measures it, until ``save()`` returned.
    """
    import torch.distributed as dist

    if cuda:
        import torch

        torch.cuda.synchronize()
    dist.barrier()
    f0 = _thread_faults()
    t0 = time.perf_counter()
    ck.save(step, state)
    at_return = time.perf_counter() - t0
    next_step()
    stall = time.perf_counter() - t0
    faults = _thread_faults() - f0
    ck.wait()
    dist.barrier()
    stall, save, at_return, worst_faults = max_each(stall, time.perf_counter() - t0, at_return, faults)
    return SaveTiming(stall, save, at_return, int(worst_faults))


def zeros_like(value: Any) -> Any:
    """A load template: the same tree with every tensor zeroed (on its own device)."""
    import torch

    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, dict):
        return {k: zeros_like(v) for k, v in value.items()}
    if isinstance(value, list):
        return [zeros_like(v) for v in value]
    if isinstance(value, tuple):
        return tuple(zeros_like(v) for v in value)
    return value


def open_checkpointer(name: str, root: str, rank: int, world: int) -> Any:
    """Construct the checkpointer a bench name stands for (a :data:`VARIANTS` entry or a protocol spec).

    Raises ConfigError for a name that does not resolve (``chaos.target.protocol.load_checkpointer``).
    """
    from chaos.target.protocol import load_checkpointer

    spec, opts = VARIANTS.get(name, (name, {}))
    return load_checkpointer(spec)(root, rank, world, **opts)


def ordered(names: Sequence[str], repeat: int) -> tuple[str, ...]:
    """``names`` in repeat ``repeat``'s order: as given on even repeats, reversed on odd ones.

    Checkpointers compared with each other run back to back in every repeat, and which
    goes first alternates, so page-cache state and disk weather favour neither.
    """
    return tuple(names) if repeat % 2 == 0 else tuple(reversed(names))


# ----------------------------------------------------------------- in the report
def spread(values: Sequence[float]) -> dict[str, Any]:
    """Min, median and max of a per-repeat series, with the series itself (``per_repeat``)."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "per_repeat": list(values)}


def triple(s: dict[str, Any] | None, fmt: str = "{:.3f}") -> str:
    """``min / median / max`` of a :func:`spread` as text ("-" when there is none)."""
    if not s:
        return "-"
    return " / ".join(fmt.format(s[k]) for k in ("min", "median", "max"))
