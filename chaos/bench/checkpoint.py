"""`chaos bench`: the reference checkpointer against DCP, DCP async, torch.save and the disk.

Gloo ranks (2 by default) save and load the same training-shaped state (model and Adam
moments replicated, RNG per rank) with each checkpointer, and the same ranks measure the
disk's raw ``write + fsync`` bandwidth for the same number of bytes right before every
save. Throughput is computed over the *payload* (replicated bytes once plus per-rank
bytes per rank), so every checkpointer is measured on the same figure.

Noise is reported, not hidden. Every checkpointer is open for the whole run and every
repeat saves with all of them; checkpointers that are compared run back to back in the
same repeat (:data:`GROUPS`: the reference next to DCP, the reference's async variants
on either side of DCP's ``async_save``), and which goes first alternates from repeat to
repeat. Each ratio is computed per repeat from the two saves of that repeat (the same
moment, the same disk, the same page-cache state), and every figure is given as
min / median / max over the repeats. ``ratios`` (the ``--json`` key the HTML report and
earlier results read) holds the median of each per-repeat series, ``ratio_spread`` the
min / median / max and the series itself. The state's weights and moments are owned by a
real Adam (:func:`owning_optimizer`), and every save is followed at once by its
``step()`` (no gradients: it changes nothing): stall is the slowest rank's time from
``save()`` until that step returned — for async checkpointers, the time before training
could go on, including any wait the save imposes on the step (the reference's replica
check fence) — and ``stall_at_return_all_s`` keeps the time to ``save()``'s return; save
is until ``wait()`` returned on every rank. Timings are bracketed by barriers. Before the
first repeat every checkpointer saves once (step 0), in no figure: a run's first save
allocates what the later ones reuse, and its stall is reported apart (``first_stall_s``).

``device="cuda"`` (``chaos bench --device cuda``) puts the model and optimizer tensors
on one GPU per rank (``CUDA_VISIBLE_DEVICES`` per rank, as ``chaos run --device cuda``
does), so the reference's async save snapshots device memory into its pinned staging
buffers and DCP's ``async_save`` stages its own copy; the ranks' default group stays
gloo (nothing trains here) and each checkpointer keeps its own gloo group for its
messages. A device-to-pinned-host copy of each rank's state is timed once per repeat,
the floor an async stall cannot go below. Missing CUDA or too few GPUs is a ConfigError
before any rank starts (:func:`validate`).

With the state on the CPU, a :class:`MemoryFloor` is sampled in every repeat: the
least memory work any async save must finish before the next step with this state —
the reference's default copying its share and reading the rest, DCP's stager copying
everything into fresh memory — so each async stall is also read against its own
design's floor (``memory_floor`` in the report). The training thread's page faults
during every stall are counted too (``stall_faults_all``): DCP's stager allocates a new
copy at every save, and whether that memory comes back from an earlier save or fresh
from the kernel (faulted in and zeroed page by page) doubles or halves its stall; the
report says which each repeat got and splits the async stall ratio by it
(``staging_faults``, :func:`staging_faults`).

Targets from the design: reference sync save >= 80% of raw bandwidth and faster than
DCP; reference async stall (default, ``replicas=verify``) <= DCP async's and <= 1.2x its
own design's floor measured in the same repeat (``async_stall_over_floor``: issue #30
restated the old <= 0.5x DCP, which depended on whether DCP's allocator reused pages),
with ``replicas=trust`` <= 0.5x DCP async's; verified load <= 1.2x DCP's load.
Missing checkpointers are skipped with a note; every load is checked bit-exact on
every rank.

Who calls what: ``chaos.bench.save`` validates a config and runs :func:`run_bench`
(``parallel=ddp``) or ``chaos.bench.sharded.run`` (``parallel=fsdp``, whose report is
built on :func:`make_report`); ``chaos.bench.scale`` runs :func:`run_bench` at
several sizes. Rank processes come from ``chaos.bench.ranks``.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.bench import ranks as bench_ranks
from chaos.bench.ranks import VARIANTS, spread, triple
from chaos.errors import ConfigError
from chaos.scratch import make_root

__all__ = ["DEFAULT_CHECKPOINTERS", "DEVICES", "GROUPS", "RATIOS", "TARGETS", "VARIANTS", "BenchConfig", "Result",
           "groups", "make_report", "make_state", "print_report", "run_bench", "to_markdown", "validate"]

DEFAULT_CHECKPOINTERS = ("reference", "reference-async", "reference-async-trust", "dcp", "dcp-async", "torch-save")
DEVICES = ("cpu", "cuda")
# Run back to back in every repeat, the order reversed on odd repeats: each reference
# variant next to the DCP checkpointer it is compared with (dcp-async in the middle of
# the async group sits next to both reference variants whichever way round).
GROUPS = (("reference", "dcp"), ("reference-async", "dcp-async", "reference-async-trust"))
# Ratio key -> (numerator, denominator), each (checkpointer, measure); computed per repeat.
# "raw" is the raw write+fsync sample taken just before that checkpointer's save, so
# raw s / save s is the save's bandwidth over the disk's at that moment.
RATIOS: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {
    "reference_vs_raw": (("reference", "raw"), ("reference", "save")),
    "reference_vs_dcp_save": (("dcp", "save"), ("reference", "save")),
    "async_stall_vs_dcp_async": (("reference-async", "stall"), ("dcp-async", "stall")),
    "async_stall_trust_vs_dcp_async": (("reference-async-trust", "stall"), ("dcp-async", "stall")),
    "verified_load_vs_dcp_load": (("reference", "load"), ("dcp", "load")),
}
RATIO_MEANING = {
    "reference_vs_raw": "reference save MB/s / raw write+fsync MB/s sampled just before it (above 1: faster than a plain write)",
    "reference_vs_dcp_save": "DCP save s / reference save s (above 1: the reference saves faster)",
    "async_stall_vs_dcp_async": "reference async stall s / DCP async_save stall s (below 1: training blocked less)",
    "async_stall_trust_vs_dcp_async": "the same with replicas=trust (DCP's own assumption)",
    "verified_load_vs_dcp_load": "reference verified load s / DCP unverified load s (below 1: the reference loads faster)",
    "async_stall_over_floor": "reference async stall s / its design's floor s in the same repeat (copy of this rank's "
                              "share + read of the rest; 1: nothing but the memory traffic a replica check needs)",
}
TARGETS = {
    "reference_vs_raw": (">=", 0.8),
    "reference_vs_dcp_save": (">=", 1.0),
    "async_stall_vs_dcp_async": ("<=", 1.0),
    "async_stall_trust_vs_dcp_async": ("<=", 0.5),
    "verified_load_vs_dcp_load": ("<=", 1.2),
    "async_stall_over_floor": ("<=", 1.2),  # from the memory floor (MemoryFloor), not a pair of checkpointers
}
# Adapters that keep every step they save: between repeats (untimed) the bench removes
# their older steps, so 7 repeats at 1 GB do not fill the disk. The reference keeps its
# own retention (keep_last=3), whose cost is part of its saves.
_KEEPS_EVERY_STEP = ("dcp", "dcp-async", "torch-save")
_STEP_ENTRY = re.compile(r"^(?:step_|ckpt_)(\d+)(?:\.pt)?$")


@dataclass
class BenchConfig:
    size_mb: float = 100.0
    world_size: int = 2
    checkpointers: tuple[str, ...] = DEFAULT_CHECKPOINTERS
    repeats: int = 7
    root: str | None = None
    timeout_s: float = 600.0
    parallel: str = "ddp"  # "fsdp": the sharded FSDP2 benchmark (chaos.bench.sharded)
    workload: dict[str, Any] = field(default_factory=dict)  # --workload overrides (fsdp only)
    device: str = "cpu"  # "cuda": the state on one GPU per rank (ddp only)


@dataclass
class Result:
    name: str
    skipped: str | None = None
    save_s: float = 0.0
    stall_s: float = 0.0
    load_s: float = 0.0
    save_mb_s: float = 0.0
    correct: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------- configuration
def validate(cfg: BenchConfig) -> None:
    """Raise a one-line ConfigError for a config that cannot run, before any rank starts.

    ``--workload`` keys belong to the fsdp bench (``chaos.bench.sharded.validate``).
    ``cuda`` needs the replicated (ddp) bench, CUDA, and one GPU per rank
    (``chaos.target.workload.device.unavailable`` says which is missing; the same text
    ``chaos run --device cuda`` gives), and a ``CUDA_VISIBLE_DEVICES`` that lists enough.
    Called by ``chaos.bench.save.run_bench`` and :func:`run_bench`.
    """
    if cfg.parallel == "ddp" and cfg.workload:
        raise ConfigError(f"chaos bench: --workload {', '.join(sorted(cfg.workload))} apply to parallel=fsdp only "
                          "(the ddp bench saves a synthetic training-shaped state)")
    if cfg.device not in DEVICES:
        raise ConfigError(f"chaos bench: --device {cfg.device!r} is unknown: choose {' or '.join(DEVICES)}")
    if cfg.device != "cuda":
        return
    if cfg.parallel != "ddp":
        raise ConfigError(f"chaos bench --device cuda measures the replicated state (parallel=ddp), "
                          f"not parallel={cfg.parallel}")
    from chaos.target.workload.device import unavailable

    why = unavailable(cfg.world_size)
    if why is not None:
        raise ConfigError(f"chaos bench --device cuda: {why}")
    bench_ranks.rank_envs("cuda", cfg.world_size)  # a short CUDA_VISIBLE_DEVICES raises here


def groups(names: tuple[str, ...] | list[str]) -> list[tuple[str, ...]]:
    """The checkpointers of one run split into the groups that run back to back (:data:`GROUPS`).

    In the order of ``names``; a name outside :data:`GROUPS` (torch-save, a user's own)
    is a group of its own. ``groups(["torch-save", "dcp", "reference"])`` is
    ``[("torch-save",), ("reference", "dcp")]``.
    """
    out: list[tuple[str, ...]] = []
    placed: set[str] = set()
    for name in names:
        if name in placed:
            continue
        group = next((g for g in GROUPS if name in g), (name,))
        members = tuple(n for n in group if n in names and n not in placed)
        out.append(members)
        placed.update(members)
    return out


# ----------------------------------------------------------------- in the ranks
def make_state(rank: int, size_bytes: int, device: Any = "cpu") -> dict[str, Any]:
    """Training-shaped: model + Adam moments (replicated, ~1/3 each), per-rank RNG/data.

    Model weights and the Adam moments live on ``device`` (a GPU for ``--device cuda``);
    Adam's ``step`` counters, the RNG states and the progress stay on the CPU, where
    torch keeps them in a real job.
    """
    import torch

    g = torch.Generator().manual_seed(1234)
    per_kind = max(1, size_bytes // 3 // 4)  # float32 elements per kind
    chunk = 1 << 20  # 4 MB tensors, like mid-sized layers
    sizes = [chunk] * (per_kind // chunk) + ([per_kind % chunk] if per_kind % chunk else [])
    model = {f"layer{i}.weight": torch.randn(n, generator=g).to(device) for i, n in enumerate(sizes)}
    state = {i: {"step": torch.tensor(10.0), "exp_avg": torch.randn(n, generator=g).to(device),
                 "exp_avg_sq": torch.rand(n, generator=g).to(device)} for i, n in enumerate(sizes)}
    r = torch.Generator().manual_seed(rank)
    return {
        "model": model,
        "optimizer": {"state": state, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": list(range(len(sizes)))}]},
        "rng": {"torch": torch.randint(0, 255, (5056,), generator=r, dtype=torch.uint8), "python": torch.randint(0, 2**31, (625,), generator=r)},
        "progress": {"step": 10, "tokens": 10240},
    }


def owning_optimizer(state: dict[str, Any]) -> Any:
    """A real ``torch.optim.Adam`` whose parameters and moments are ``state``'s own tensors.

    The bench's state stands for a training job's, whose weights and Adam moments an
    optimizer owns and steps: the reference's default async save defers the replica check
    of exactly such tensors to its commit thread and holds the next ``optimizer.step()``
    until it is done, so the bench must have an optimizer for that to happen and call its
    step after each save (``bench_ranks.timed_save_then_step``) for the wait to be billed.
    ``state["model"]`` is rebound to the parameters' detached views (same memory); the
    moment dicts under ``state["optimizer"]["state"]`` become the optimizer's state as
    they are. Called by :func:`run_ranks` on every rank; no gradient ever exists, so a
    step changes nothing.
    """
    import torch

    names = list(state["model"])
    params = [torch.nn.Parameter(state["model"][n]) for n in names]
    opt = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.95))
    for i, p in enumerate(params):
        opt.state[p] = state["optimizer"]["state"][i]
    state["model"] = {n: p.detach() for n, p in zip(names, params, strict=True)}
    return opt


def _payload_bytes(state: dict[str, Any], world: int) -> int:
    from chaos.reference.ckptformat import tree

    _, tensors = tree.encode(state)
    total = 0
    for path, t in tensors.items():
        n = t.numel() * t.element_size()
        total += n * (world if path.startswith("rng/") else 1)
    return total


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class DeviceCopy:
    """Times a copy of every device tensor of ``state`` into pinned host buffers (``--device cuda``).

    The buffers are allocated once (pinned only when the tensors are on a GPU), so a
    sample is the copy alone: the least an async save's snapshot of device memory can
    block training for. :meth:`sample` is collective (the slowest rank's seconds).
    """

    def __init__(self, state: dict[str, Any]) -> None:
        import torch

        self.sources = [t for t in _tensors(state) if t.device.type != "cpu"] or _tensors(state)
        self.cuda = any(t.is_cuda for t in self.sources)
        self.buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=self.cuda) for t in self.sources]
        self.bytes = sum(t.numel() * t.element_size() for t in self.sources)

    def sample(self) -> float:
        import torch
        import torch.distributed as dist

        if self.cuda:
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for buf, t in zip(self.buffers, self.sources, strict=True):
            buf.copy_(t, non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.synchronize()
        return bench_ranks.max_all(time.perf_counter() - t0)


class MemoryFloor:
    """Times what an async save of this replicated CPU state must at least do in memory (collective).

    Before the next optimizer step may change the state, an async save that writes its
    share of the replicated tensors and checks the rest against the other ranks (the
    reference's default, ``replicas=verify``) copies its share into staging and reads
    the rest, and DCP's default stager copies every tensor into freshly allocated memory.
    :meth:`sample` times the three alone, with the same primitives (the reference's
    :class:`~chaos.reference.checkpoint.async_writer.Staging` copy and xxh3 replica digest;
    ``torch.empty_like(t).copy_(t)`` as DCP's ``_copy_state_dict`` does), each after
    :attr:`evict` is overwritten so no cache holds the state, as before a save. A stall is
    then read against the floor of its design — ``copy_share + read_rest`` for the
    reference's default, ``copy_all_fresh`` for DCP's — and their quotient is the best
    ``async_stall_vs_dcp_async`` any save that checks every replica could reach on this
    machine at that moment. The share is what the reference's planner
    (``chaos.reference.checkpoint.planner.make_plan``) gives this rank to write. Called by
    :func:`_measure` once per repeat (right before the default async save), CPU state only.
    """

    EVICT_BYTES = 256 << 20

    def __init__(self, state: dict[str, Any], rank: int, world: int) -> None:
        import torch

        from chaos.reference.checkpoint.async_writer import Staging
        from chaos.reference.checkpoint.planner import make_plan
        from chaos.reference.ckptformat import tree

        _, tensors = tree.encode(state)  # path -> tensor, as the reference's saver sees the state
        sizes = {p: t.numel() * t.element_size() for p, t in tensors.items()}
        # Every tensor as replicated (the per-rank RNG states are a few KB): the planner assigns
        # each to its writer exactly as the reference's saves do.
        meta = {p: ["replicated", sizes[p], str(t.dtype), list(t.shape)] for p, t in tensors.items()}
        mine = set(make_plan([meta] * world).owned[rank].values())
        self.tensors = [t.detach() for t in tensors.values()]
        self.share: dict[str, Any] = {p: t.detach() for p, t in tensors.items() if p in mine}
        self.rest: list[Any] = [t.detach() for p, t in tensors.items() if p not in mine]
        self.bytes_share = sum(sizes[p] for p in self.share)
        self.bytes_all = sum(sizes.values())
        self.bytes_rest = self.bytes_all - self.bytes_share
        self.staging = Staging()
        self.staging.copy(self.share)  # the buffers, allocated once as the reference's are
        self.evict = torch.empty(self.EVICT_BYTES, dtype=torch.uint8)

    def _timed(self, work: Any) -> float:
        import torch.distributed as dist

        self.evict.fill_(self.evict[0].item() ^ 1)
        dist.barrier()
        t0 = time.perf_counter()
        work()
        return bench_ranks.max_all(time.perf_counter() - t0)

    def sample(self) -> dict[str, float]:
        """``{"copy_share": s, "read_rest": s, "copy_all_fresh": s}``, each the slowest rank's seconds.

        Collective: both ranks must call it together (every timing is bracketed by a barrier).
        """
        import torch

        from chaos.reference.ckptformat.hashing import digest, tensor_bytes

        def read_rest() -> None:
            for t in self.rest:
                digest("xxh3", tensor_bytes(t))

        def copy_all_fresh() -> None:
            fresh = [torch.empty_like(t).copy_(t) for t in self.tensors]
            del fresh

        # One sample each, not the median of several back to back: at 1 GB a second and third
        # pass ran about 40 % faster than the first (2026-12-07: copy of the 499 MB share
        # 50-70 ms against 92-105 ms), and the stall is a first pass over the state.
        return {"copy_share": self._timed(lambda: self.staging.copy(self.share)),
                "read_rest": self._timed(read_rest),
                "copy_all_fresh": self._timed(copy_all_fresh)}


def _setup_device(device: str) -> Any:
    """The rank's ``torch.device``: for cuda its one visible GPU (``chaos.target.workload.device.setup``)."""
    import torch

    if device != "cuda":
        return torch.device("cpu")
    from chaos.target.workload.device import setup

    return setup("cuda", deterministic=False)


def _rank_facts(device: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"device": device, "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if device == "cuda":
        import torch

        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["cuda"] = torch.version.cuda
    return facts


def _prune(base: str, names: list[str], step: int, rank: int) -> None:
    """Between repeats: the adapters that keep every step lose the ones before ``step`` (rank 0, untimed)."""
    import torch.distributed as dist

    dist.barrier()
    if rank == 0:
        for name in names:
            if name not in _KEEPS_EVERY_STEP:
                continue
            root = os.path.join(base, name)
            for entry in os.listdir(root) if os.path.isdir(root) else []:
                m = _STEP_ENTRY.match(entry)
                if m and int(m.group(1)) < step:
                    path = os.path.join(root, entry)
                    if os.path.isdir(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        os.remove(path)
    dist.barrier()


def _measure(rank: int, world: int, cfg: BenchConfig, base: str) -> dict[str, Any]:
    """One rank of the replicated (DDP-shaped) benchmark: every repeat saves with every checkpointer.

    Saves of a repeat run group by group (:func:`groups`), each group back to back in
    the repeat's order (:func:`chaos.bench.ranks.ordered`), with a raw write+fsync sample
    right before every save; then the loads, in the same alternating order, each checked
    against the saved state's fingerprint on every rank.
    """
    import torch
    import torch.distributed as dist

    from chaos.model.statehash import fingerprint

    dev = _setup_device(cfg.device)
    cuda = dev.type == "cuda"
    state = make_state(rank, int(cfg.size_mb * 1e6), dev)
    expected = fingerprint(state)
    payload = _payload_bytes(state, world)
    buf = torch.randint(0, 255, (payload // world + 1,), dtype=torch.uint8)
    cks: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in cfg.checkpointers:
        try:
            cks[name] = bench_ranks.open_checkpointer(name, os.path.join(base, name), rank, world)
        except ConfigError as exc:
            skipped[name] = str(exc)
    opt = owning_optimizer(state)
    opt.step()  # as a training loop's first step would: the reference's fence learns the optimizer
    runs = groups(list(cks))
    series: dict[str, dict[str, list[Any]]] = {
        name: {"save": [], "stall": [], "load": [], "raw": [], "at_return": [], "faults": []} for name in cks}
    copy = DeviceCopy(state) if cuda else None
    copies: list[float] = []
    floor = MemoryFloor(state, rank, world) if not cuda else None
    floors: list[dict[str, float]] = []
    schedule: list[list[str]] = []  # the save order of every repeat, for the report
    raws: list[float] = []  # every raw sample, in the order taken
    # The floor is sampled right before the default async save's raw write, so the two meet the
    # same machine state (at the end of the repeat, after torch-save's writes, the floor varied
    # by half from repeat to repeat and the per-repeat quotient with it); without that save, at
    # the end of the repeat.
    floor_at = "reference-async" if "reference-async" in cks else None
    # One save with every checkpointer before the repeats (step 0, not in any figure): the
    # first save of a run allocates what later ones reuse (the reference's staging buffers,
    # 24,439 page faults a rank at 100 MB, five times its steady stall), and with it in
    # repeat 1 every median was the fourth of six steady repeats. Its stall is reported apart.
    for group in runs:
        for name in group:
            t = bench_ranks.timed_save_then_step(cks[name], 0, state, opt.step, cuda)
            series[name]["first"] = [t.stall, t.stall_faults]
    for i in range(cfg.repeats):
        schedule.append([n for group in runs for n in bench_ranks.ordered(group, i)])
        for group in runs:
            for name in bench_ranks.ordered(group, i):
                if floor is not None and name == floor_at:
                    floors.append(floor.sample())
                raws.append(bench_ranks.raw_write(rank, world, base, payload, buf))
                series[name]["raw"].append(raws[-1])
                t = bench_ranks.timed_save_then_step(cks[name], i + 1, state, opt.step, cuda)
                series[name]["stall"].append(t.stall)
                series[name]["at_return"].append(t.at_return)
                series[name]["save"].append(t.save)
                series[name]["faults"].append(t.stall_faults)
        if copy is not None:
            copies.append(copy.sample())
        if floor is not None and floor_at is None:
            floors.append(floor.sample())
        _prune(base, list(cks), i + 1, rank)
    ok = dict.fromkeys(cks, True)
    loaded_on: dict[str, list[str]] = {}
    for i in range(cfg.repeats):
        for group in runs:
            for name in bench_ranks.ordered(group, i):
                template = bench_ranks.zeros_like(state)
                if cuda:
                    torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                found = cks[name].load_latest(template)
                dist.barrier()
                series[name]["load"].append(bench_ranks.max_all(time.perf_counter() - t0))
                good = found is not None and found[0] == cfg.repeats and fingerprint(found[1]) == expected
                ok[name] = bench_ranks.all_true(good) and ok[name]
                if found is not None:
                    loaded_on[name] = sorted({str(t.device.type) for t in _tensors(found[1].get("model", {}))})
                del found, template  # one loaded copy of the state at a time (1 GB at --large)
    for ck in cks.values():
        ck.close()
    dist.barrier()
    if rank == 0:
        for name in cks:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    facts = bench_ranks.gather(_rank_facts(cfg.device))
    results = []
    for name in cfg.checkpointers:
        if name in skipped:
            results.append(asdict(Result(name, skipped=skipped[name])))
            continue
        if name not in series:  # listed twice
            continue
        s = series[name]
        save_s = statistics.median(s["save"])
        results.append(asdict(Result(
            name, save_s=save_s, stall_s=statistics.median(s["stall"]), load_s=statistics.median(s["load"]),
            save_mb_s=payload / save_s / 1e6, correct=ok[name],
            extra={"save_all_s": s["save"], "stall_all_s": s["stall"], "stall_at_return_all_s": s["at_return"],
                   "stall_faults_all": s["faults"], "load_all_s": s["load"],
                   "first_stall_s": s["first"][0], "first_stall_faults": s["first"][1],
                   "raw_all_s": s["raw"], "loaded_on": loaded_on.get(name, [])})))
        series.pop(name)
    measured: dict[str, Any] = {"payload_bytes": payload, "raw_s": statistics.median(raws) if raws else 0.0,
                                "raw_all_s": raws, "results": results, "ranks": facts, "schedule": schedule}
    measured["page_bytes"] = resource.getpagesize()
    if copy is not None:
        measured["device_copy"] = {"bytes_per_rank": copy.bytes, "all_seconds": copies}
    if floor is not None and floors:
        measured["memory_floor"] = {"bytes_share": floor.bytes_share, "bytes_rest": floor.bytes_rest,
                                    "bytes_all": floor.bytes_all,
                                    **{f"{k}_all_s": [f[k] for f in floors] for k in floors[0]}}
    return measured


# ----------------------------------------------------------------- in the parent
def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the replicated benchmark in ``cfg.world_size`` fresh rank processes; return the report.

    A config that cannot run raises ConfigError before any process starts. Sharded state
    (``parallel=fsdp``) is ``chaos.bench.sharded.run``; ``chaos.bench.save.run_bench``
    picks between the two.
    """
    if cfg.parallel != "ddp":
        raise ConfigError(f"chaos.bench.checkpoint.run_bench measures parallel=ddp; parallel={cfg.parallel} is "
                          "chaos.bench.save.run_bench's to dispatch")
    validate(cfg)
    envs = bench_ranks.rank_envs(cfg.device, cfg.world_size)
    base = make_root("chaos-bench-", cfg.root)
    try:
        measured = bench_ranks.launch(_measure, cfg.world_size, cfg.timeout_s, (cfg, base), envs=envs)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return make_report(cfg, measured)


def _series(result: dict[str, Any], measure: str, raw_s: float) -> list[float]:
    """Per-repeat seconds of one measure of one result; a single median for a report without them."""
    extra = result.get("extra") or {}
    values = extra.get(f"{measure}_all_s")
    if values:
        return list(values)
    return [raw_s] if measure == "raw" else [result[f"{measure}_s"]]


def _with_spread(result: dict[str, Any], payload: int, raw_s: float) -> dict[str, Any]:
    """The result with ``spread``: min / median / max of its seconds, MB/s and bandwidth over raw."""
    if result.get("skipped"):
        return result
    save, raw = _series(result, "save", raw_s), _series(result, "raw", raw_s)
    out = {f"{m}_s": spread(_series(result, m, raw_s)) for m in ("save", "stall", "load")}
    out["save_mb_s"] = spread([payload / s / 1e6 for s in save if s > 0] or [0.0])
    if len(raw) == len(save) and all(s > 0 for s in save):
        out["vs_raw"] = spread([r / s for r, s in zip(raw, save, strict=True)])
    return {**result, "spread": out}


def make_report(cfg: BenchConfig, measured: dict[str, Any]) -> dict[str, Any]:
    """Bandwidths, per-repeat ratios and target verdicts, all computed from the measured seconds.

    ``ratios[key]`` is the median of the ratio's per-repeat series (``ratio_spread[key]``:
    min / median / max / per_repeat), None where a side is missing. A report whose results
    carry no per-repeat series (``extra.*_all_s``) falls back to one ratio of the medians.
    ``chaos.bench.sharded.make_report`` builds its report on this one.
    """
    payload = measured["payload_bytes"]
    raw_s = measured["raw_s"]
    raw_all = list(measured.get("raw_all_s") or [raw_s])
    results = [_with_spread(r, payload, raw_s) for r in measured["results"]]
    by = {r["name"]: r for r in results if not r.get("skipped")}
    ratio_spread: dict[str, dict[str, Any] | None] = {}
    for key, ((num_name, num_m), (den_name, den_m)) in RATIOS.items():
        if num_name not in by or den_name not in by:
            ratio_spread[key] = None
            continue
        num, den = _series(by[num_name], num_m, raw_s), _series(by[den_name], den_m, raw_s)
        if len(num) != len(den) or not all(d > 0 for d in den):
            ratio_spread[key] = None
            continue
        ratio_spread[key] = spread([n / d for n, d in zip(num, den, strict=True)])
    floor = memory_floor(measured.get("memory_floor"), by)
    ratio_spread["async_stall_over_floor"] = (floor or {}).get("stall_over_floor", {}).get("reference-async")
    ratios = {k: (s["median"] if s else None) for k, s in ratio_spread.items()}
    verdicts = {}
    for key, (op, bound) in TARGETS.items():
        value = ratios[key]
        verdicts[key] = None if value is None else (value >= bound if op == ">=" else value <= bound)
    report: dict[str, Any] = {
        "config": {"size_mb": cfg.size_mb, "world_size": cfg.world_size, "repeats": cfg.repeats,
                   "checkpointers": list(cfg.checkpointers), "parallel": cfg.parallel, "device": cfg.device},
        "payload_bytes": payload,
        "raw": {"seconds": raw_s, "mb_s": payload / raw_s / 1e6 if raw_s else 0.0, "all_seconds": raw_all,
                "mb_s_spread": spread([payload / s / 1e6 for s in raw_all if s > 0] or [0.0])},
        "results": results,
        "ratios": ratios,
        "ratio_spread": ratio_spread,
        "ratio_meaning": dict(RATIO_MEANING),
        "order": "compared checkpointers ran back to back in every repeat, the first one alternating; each ratio "
                 "is from one repeat's pair, min / median / max over the repeats",
        "targets": {k: f"{op} {b}" for k, (op, b) in TARGETS.items()},
        "meets_target": verdicts,
    }
    for key in ("schedule", "ranks"):  # save order per repeat; each rank's device and CUDA_VISIBLE_DEVICES
        if measured.get(key):
            report[key] = measured[key]
    if floor:
        report["memory_floor"] = floor
    faults = staging_faults(by, ratio_spread.get("async_stall_vs_dcp_async"), measured.get("page_bytes"),
                            (measured.get("memory_floor") or {}).get("bytes_all"))
    if faults:
        report["staging_faults"] = faults
    copy = measured.get("device_copy")
    if copy and copy.get("all_seconds"):
        report["device_copy"] = {**copy, "gb_s": spread([copy["bytes_per_rank"] / s / 1e9 for s in copy["all_seconds"]
                                                         if s > 0] or [0.0])}
    return report


def memory_floor(measured: dict[str, Any] | None, by: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The report's ``memory_floor``: :class:`MemoryFloor`'s samples as spreads, set against the stalls.

    Per repeat: ``reference_async_floor_s`` is copy_share + read_rest (the least the
    reference's default async stall can be), ``floor_ratio`` that over copy_all_fresh
    (the best ``async_stall_vs_dcp_async`` reachable while checking every replica), and
    ``stall_over_floor`` each async checkpointer's stall over its own design's floor.
    None when nothing was sampled (``--device cuda``, or a report from before it existed).
    """
    if not measured or not measured.get("copy_share_all_s"):
        return None
    share, rest, fresh = (measured[f"{k}_all_s"] for k in ("copy_share", "read_rest", "copy_all_fresh"))
    ours = [a + b for a, b in zip(share, rest, strict=True)]
    out: dict[str, Any] = {k: measured[k] for k in ("bytes_share", "bytes_rest", "bytes_all")}
    out.update({"copy_share_s": spread(share), "read_rest_s": spread(rest), "reference_async_floor_s": spread(ours),
                "copy_all_fresh_s": spread(fresh)})
    if all(f > 0 for f in fresh):
        out["floor_ratio"] = spread([o / f for o, f in zip(ours, fresh, strict=True)])
    over: dict[str, Any] = {}
    for name, base in (("reference-async", ours), ("dcp-async", fresh)):
        stalls = _series(by[name], "stall", 0.0) if name in by else []
        if len(stalls) == len(base) and all(b > 0 for b in base):
            over[name] = spread([st / b for st, b in zip(stalls, base, strict=True)])
    out["stall_over_floor"] = over
    return out


# Async checkpointers whose stall page faults the report shows.
ASYNC_NAMES = ("reference-async", "reference-async-trust", "dcp-async")


def staging_faults(by: dict[str, dict[str, Any]], stall_ratio: dict[str, Any] | None, page_bytes: int | None,
                   bytes_all: int | None) -> dict[str, Any] | None:
    """The report's ``staging_faults``: which memory each async stager copied into, repeat by repeat.

    DCP's default stager allocates a new copy of the state at every ``async_save``; whether
    the allocator serves it from memory an earlier save freed or from pages the kernel must
    fault in and zero depends on what else the process allocated and freed, and halves or
    doubles its stall. The training thread's page faults during the stall
    (``bench_ranks.SaveTiming.stall_faults``) say which: a repeat counts as ``fresh`` when
    the faulted bytes reach half of ``bytes_all`` (this rank's whole state, what DCP copies).
    ``async_stall_vs_dcp_async_by_dcp_pages`` splits that ratio's repeats by it, so a
    median judged over a mix of both says so. None when no fault counts were measured
    (``--device cuda`` has no memory floor, a report from before they existed).
    """
    counts = {n: by[n]["extra"]["stall_faults_all"] for n in ASYNC_NAMES
              if n in by and (by[n].get("extra") or {}).get("stall_faults_all")}
    if not counts or not page_bytes:
        return None
    out: dict[str, Any] = {"page_bytes": page_bytes, "faults": {n: spread([float(c) for c in v])
                                                               for n, v in counts.items()}}
    dcp = counts.get("dcp-async")
    if dcp and bytes_all:
        fresh = [c * page_bytes >= bytes_all / 2 for c in dcp]
        out["dcp_async_fresh"] = fresh
        if stall_ratio and len(stall_ratio["per_repeat"]) == len(fresh):
            per = stall_ratio["per_repeat"]
            out["async_stall_vs_dcp_async_by_dcp_pages"] = {
                kind: (spread([r for r, f in zip(per, fresh, strict=True) if f == want])
                       if want in fresh else None)
                for kind, want in (("fresh", True), ("reused", False))}
    return out


# ----------------------------------------------------------------- rendering
COLUMNS = ("checkpointer", "save s (min / med / max)", "save MB/s", "vs raw", "stall s (min / med / max)",
           "load s (min / med / max)", "bit-exact", "note")
RATIO_COLUMNS = ("ratio", "min", "median", "max", "per repeat", "target", "met (median)")


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def result_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per checkpointer (:data:`COLUMNS`): seconds as min / median / max, MB/s and vs-raw medians."""
    rows = []
    for r in report["results"]:
        if r.get("skipped"):
            rows.append((r["name"], "-", "-", "-", "-", "-", "-", f"skipped: {r['skipped']}"))
            continue
        s = r.get("spread") or {}
        vs_raw = (s.get("vs_raw") or {}).get("median")
        on = r.get("extra", {}).get("loaded_on") or []
        note = f"loaded on {', '.join(on)}" if on and on != ["cpu"] else ""
        rows.append((r["name"], triple(s.get("save_s")), f"{r['save_mb_s']:.0f}", _f(vs_raw, "{:.2f}"),
                     triple(s.get("stall_s")), triple(s.get("load_s")), str(r["correct"]), note))
    return rows


def ratio_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per ratio (:data:`RATIO_COLUMNS`): min, median, max, the per-repeat values, target, met."""
    rows = []
    for key, value in report["ratios"].items():
        s = (report.get("ratio_spread") or {}).get(key)
        per = ", ".join(f"{x:.2f}" for x in s["per_repeat"]) if s else "-"
        rows.append((key, _f(s and s["min"]), _f(value), _f(s and s["max"]), per, report["targets"][key],
                     str(report["meets_target"][key])))
    return rows


def headline(report: dict[str, Any]) -> str:
    """The one-line title: payload, ranks, device, repeats and the raw disk bandwidth."""
    c = report["config"]
    dev = c.get("device", "cpu")
    where = f", state on {dev} (one GPU per rank)" if dev == "cuda" else ""
    raw = report["raw"]
    ranks, repeats = c["world_size"], c["repeats"]
    return (f"{report['payload_bytes'] / 1e6:.0f} MB payload, {ranks} rank{'s' * (ranks != 1)}{where}, "
            f"{repeats} repeat{'s' * (repeats != 1)}; "
            f"raw write+fsync {triple(raw.get('mb_s_spread'), '{:.0f}')} MB/s (min / med / max, one sample before "
            f"every save)")


def _copy_line(report: dict[str, Any]) -> str | None:
    copy = report.get("device_copy")
    if not copy:
        return None
    gpus = sorted({r.get("gpu") or "?" for r in report.get("ranks", [])})
    return (f"device -> pinned host copy of each rank's {copy['bytes_per_rank'] / 1e6:.0f} MB on the GPU: "
            f"{triple(copy['gb_s'], '{:.1f}')} GB/s (min / med / max; {', '.join(gpus)})")


def _floor_line(report: dict[str, Any]) -> str | None:
    f = report.get("memory_floor")
    if not f:
        return None
    ms = "{:.1f}"

    def t(key: str) -> str:
        return triple({k: v * 1e3 for k, v in f[key].items() if k != "per_repeat"}, ms)

    line = (f"Memory floor per rank, uncached (ms, min / med / max): copy of its {f['bytes_share'] / 1e6:.0f} MB "
            f"share into staging {t('copy_share_s')}, read of the other {f['bytes_rest'] / 1e6:.0f} MB "
            f"{t('read_rest_s')}, both (the least the default async stall can be) {t('reference_async_floor_s')}; "
            f"every tensor copied into fresh memory (DCP's default staging) {t('copy_all_fresh_s')}.")
    if f.get("floor_ratio"):
        line += (f" Best async_stall_vs_dcp_async reachable while checking every replica: "
                 f"{triple(f['floor_ratio'], '{:.2f}')}.")
    over = f.get("stall_over_floor") or {}
    if over:
        line += " Stall over its design's floor: " + "; ".join(
            f"{name} {triple(s, '{:.2f}')}" for name, s in over.items()) + "."
    return line


def _first_line(report: dict[str, Any]) -> str | None:
    firsts = [(r["name"], r["extra"]["first_stall_s"], r["extra"].get("first_stall_faults"))
              for r in report.get("results", []) if (r.get("extra") or {}).get("first_stall_s") is not None]
    if not firsts:
        return None
    return ("First save of the run, before the repeats and in no figure above (what a run's first save "
            "allocates, later ones reuse): stall ms (page faults) " + "; ".join(
                f"{name} {s * 1e3:.1f} ({faults if faults is not None else '?'})" for name, s, faults in firsts) + ".")


def _faults_line(report: dict[str, Any]) -> str | None:
    f = report.get("staging_faults")
    if not f:
        return None
    line = ("Page faults of the training thread during the stall (min / med / max; one per "
            f"{f['page_bytes'] // 1024} KB page first touched): " + "; ".join(
                f"{name} {triple(s, '{:.0f}')}" for name, s in f["faults"].items()) + ".")
    fresh = f.get("dcp_async_fresh")
    if fresh:
        line += (f" dcp-async's staging copied into fresh pages (at least half its state faulted in) in "
                 f"{sum(fresh)} of {len(fresh)} repeats")
        split = f.get("async_stall_vs_dcp_async_by_dcp_pages") or {}
        parts = [f"{triple(split[k], '{:.2f}')} over the {k} ones" for k in ("fresh", "reused") if split.get(k)]
        line += (": async_stall_vs_dcp_async " + ", ".join(parts) + ".") if parts else "."
    return line


def to_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: the checkpointer table, then the per-repeat ratios."""
    lines = [f"# chaos bench: {headline(report)}", "",
             f"| {' | '.join(COLUMNS)} |", "|---|---:|---:|---:|---:|---:|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in result_rows(report)]
    for extra in (_copy_line(report), _floor_line(report), _faults_line(report), _first_line(report)):
        if extra:
            lines += ["", extra]
    lines += ["", f"Ratios ({report.get('order', 'per repeat pair')}):", "",
              f"| {' | '.join(RATIO_COLUMNS)} |", "|---|---:|---:|---:|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in ratio_rows(report)]
    return "\n".join(lines) + "\n"


def print_report(report: dict[str, Any], console: Any = None) -> None:
    """The report on the console (rich tables; plain lines off a terminal)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(title=f"checkpoint bench: {headline(report)}")
    for col in COLUMNS:
        t.add_column(col, justify="left" if col in ("checkpointer", "bit-exact", "note") else "right")
    for row in result_rows(report):
        t.add_row(*row)
    console.print(t)
    for extra in (_copy_line(report), _floor_line(report), _faults_line(report), _first_line(report)):
        if extra:
            console.print(extra, markup=False, highlight=False)
    rt = Table(title="ratios, per repeat pair (median judged against the target)")
    for col in RATIO_COLUMNS:
        rt.add_column(col, justify="left" if col in ("ratio", "per repeat", "target") else "right")
    for row in ratio_rows(report):
        rt.add_row(*row)
    console.print(rt)


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)
