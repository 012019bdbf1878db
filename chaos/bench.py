"""`chaos bench`: the reference checkpointer against DCP, DCP async, torch.save and the disk.

Two gloo ranks on CPU save and load the same training-shaped state (model and Adam
moments replicated, RNG per rank) with each checkpointer, and the same ranks measure
the disk's raw ``write + fsync`` bandwidth for the same number of bytes. Throughput is
computed over the *payload* (replicated bytes once plus per-rank bytes per rank), so
every checkpointer is measured on the same figure. Each timing is the median of
``repeats`` runs, bracketed by barriers, and a raw write+fsync sample is taken right
before every save so that disk noise hits both sides alike; stall is the slowest rank's ``save()`` return
time (for async checkpointers, the time before training could continue).

Targets from the design: reference sync save >= 80% of raw bandwidth and faster than
DCP; reference async stall <= 0.5x DCP async's; verified load <= 1.2x DCP's load.
Missing checkpointers are skipped with a note; every load is checked bit-exact.

``--workload parallel=fsdp`` benchmarks a sharded FSDP2 state instead (``chaos.bench_sharded``:
reference against DCP per repeat pair, and a resharded load at half the world size); it
launches its ranks through :func:`launch`, as this module does.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import shutil
import socket
import statistics
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

DEFAULT_CHECKPOINTERS = ("reference", "reference-async", "reference-async-trust", "dcp", "dcp-async", "torch-save")
# reference-async-trust: replicas=trust, DCP's own assumption that replicated tensors
# are identical on every rank (no bytes read for those another rank writes); plain
# reference-async also hashes them before save() returns, safety DCP does not have.
VARIANTS = {
    "reference-async": ("reference", {"async_save": True}),
    "reference-async-trust": ("reference", {"async_save": True, "replicas": "trust"}),
}
TARGETS = {
    "reference_vs_raw": (">=", 0.8),
    "reference_vs_dcp_save": (">=", 1.0),
    "async_stall_vs_dcp_async": ("<=", 0.5),
    "async_stall_trust_vs_dcp_async": ("<=", 0.5),
    "verified_load_vs_dcp_load": ("<=", 1.2),
}


@dataclass
class BenchConfig:
    size_mb: float = 100.0
    world_size: int = 2
    checkpointers: tuple[str, ...] = DEFAULT_CHECKPOINTERS
    repeats: int = 3
    root: str | None = None
    timeout_s: float = 600.0
    parallel: str = "ddp"  # "fsdp": the sharded FSDP2 benchmark (chaos.bench_sharded)
    workload: dict[str, Any] = field(default_factory=dict)  # --workload overrides (fsdp only)


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


def make_state(rank: int, size_bytes: int) -> dict[str, Any]:
    """Training-shaped: model + Adam moments (replicated, ~1/3 each), per-rank RNG/data."""
    import torch

    g = torch.Generator().manual_seed(1234)
    per_kind = max(1, size_bytes // 3 // 4)  # float32 elements per kind
    chunk = 1 << 20  # 4 MB tensors, like mid-sized layers
    sizes = [chunk] * (per_kind // chunk) + ([per_kind % chunk] if per_kind % chunk else [])
    model = {f"layer{i}.weight": torch.randn(n, generator=g) for i, n in enumerate(sizes)}
    state = {i: {"step": torch.tensor(10.0), "exp_avg": torch.randn(n, generator=g), "exp_avg_sq": torch.rand(n, generator=g)} for i, n in enumerate(sizes)}
    r = torch.Generator().manual_seed(rank)
    return {
        "model": model,
        "optimizer": {"state": state, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": list(range(len(sizes)))}]},
        "rng": {"torch": torch.randint(0, 255, (5056,), generator=r, dtype=torch.uint8), "python": torch.randint(0, 2**31, (625,), generator=r)},
        "progress": {"step": 10, "tokens": 10240},
    }


def _zeros_like(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, dict):
        return {k: _zeros_like(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_zeros_like(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_zeros_like(v) for v in value)
    return value


def _payload_bytes(state: dict[str, Any], world: int) -> int:
    from chaos.ckptformat import tree

    _, tensors = tree.encode(state)
    total = 0
    for path, t in tensors.items():
        n = t.numel() * t.element_size()
        total += n * (world if path.startswith("rng/") else 1)
    return total


def _max(value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _raw(rank: int, world: int, base: str, nbytes: int, buf: Any) -> float:
    """Wall time for every rank to write and fsync its share of ``nbytes``."""
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
    seconds = _max(time.perf_counter() - t0)
    os.remove(path)
    return seconds


def _one(name: str, rank: int, world: int, base: str, state: dict, payload: int, repeats: int, buf: Any, raws: list[float]) -> dict[str, Any]:
    import torch.distributed as dist

    from chaos.errors import ConfigError
    from chaos.protocol import load_checkpointer
    from chaos.statehash import fingerprint

    spec, opts = VARIANTS.get(name, (name, {}))
    try:
        cls = load_checkpointer(spec)
    except ConfigError as exc:
        return asdict(Result(name, skipped=str(exc)))
    root = os.path.join(base, name)
    ck = cls(root, rank, world, **opts)
    saves, stalls = [], []
    for i in range(repeats):
        raws.append(_raw(rank, world, base, payload, buf))  # interleaved: same disk weather
        dist.barrier()
        t0 = time.perf_counter()
        ck.save(i + 1, state)
        stall = time.perf_counter() - t0
        ck.wait()
        dist.barrier()
        saves.append(_max(time.perf_counter() - t0))
        stalls.append(_max(stall))
    loads, ok = [], True
    for _ in range(repeats):
        template = _zeros_like(state)
        dist.barrier()
        t0 = time.perf_counter()
        found = ck.load_latest(template)
        dist.barrier()
        loads.append(_max(time.perf_counter() - t0))
        ok = ok and found is not None and found[0] == repeats and fingerprint(found[1]) == fingerprint(state)
    ck.close()
    dist.barrier()
    if rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    save_s = statistics.median(saves)
    return asdict(Result(name, save_s=save_s, stall_s=statistics.median(stalls), load_s=statistics.median(loads),
                         save_mb_s=payload / save_s / 1e6, correct=ok, extra={"save_all_s": saves, "stall_all_s": stalls, "load_all_s": loads}))


def _measure(rank: int, world: int, cfg: BenchConfig, base: str) -> dict[str, Any]:
    """One rank of the replicated (DDP-shaped) benchmark: every checkpointer in turn."""
    import torch

    state = make_state(rank, int(cfg.size_mb * 1e6))
    payload = _payload_bytes(state, world)
    buf = torch.randint(0, 255, (payload // world + 1,), dtype=torch.uint8)
    raws: list[float] = []
    results = [_one(name, rank, world, base, state, payload, cfg.repeats, buf, raws) for name in cfg.checkpointers]
    return {"payload_bytes": payload, "raw_s": statistics.median(raws), "raw_all_s": raws, "results": results}


def _entry(target: Any, rank: int, world: int, port: int, timeout_s: float, args: tuple, out: Any) -> None:
    """A rank process: join the gloo group, run ``target(rank, world, *args)``, send rank 0's value."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(target: Any, world_size: int, timeout_s: float, args: tuple, ctx: Any = None) -> Any:
    """Run ``target(rank, world_size, *args)`` in ``world_size`` fresh gloo rank processes; return rank 0's value.

    ``target`` must be importable (module level). ``ctx`` is a multiprocessing context
    (default: spawn; ``chaos.bench_sharded`` passes a forkserver that has imported torch
    and FSDP once, since it launches twice). A rank that raises or dies, or a run past
    ``timeout_s``, raises RuntimeError; every started process is gone when this returns.
    """
    ctx = ctx or mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(target, r, world_size, port, timeout_s, args, out), daemon=True)
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


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the benchmark in ``cfg.world_size`` fresh rank processes; return the report.

    ``cfg.parallel == "fsdp"`` measures the sharded FSDP2 state instead (``chaos.bench_sharded``);
    a combination that cannot run raises ConfigError before any process starts.
    """
    from chaos import bench_sharded

    bench_sharded.validate(cfg)
    if cfg.parallel == "fsdp":
        return bench_sharded.run(cfg)
    base = tempfile.mkdtemp(prefix="chaos-bench-", dir=cfg.root)
    try:
        measured = launch(_measure, cfg.world_size, cfg.timeout_s, (cfg, base))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return make_report(cfg, measured)


def make_report(cfg: BenchConfig, measured: dict[str, Any]) -> dict[str, Any]:
    """Add bandwidths, ratios and target verdicts, all computed from the measured seconds."""
    payload = measured["payload_bytes"]
    raw_mb_s = payload / measured["raw_s"] / 1e6
    by = {r["name"]: r for r in measured["results"] if not r.get("skipped")}

    def ratio(num: float | None, den: float | None) -> float | None:
        return num / den if num is not None and den else None

    ref, ref_a, ref_t, dcp, dcp_a = (by.get(n) for n in ("reference", "reference-async", "reference-async-trust", "dcp", "dcp-async"))
    ratios = {
        "reference_vs_raw": ratio(ref and ref["save_mb_s"], raw_mb_s),
        "reference_vs_dcp_save": ratio(dcp and dcp["save_s"], ref and ref["save_s"]),
        "async_stall_vs_dcp_async": ratio(ref_a and ref_a["stall_s"], dcp_a and dcp_a["stall_s"]),
        "async_stall_trust_vs_dcp_async": ratio(ref_t and ref_t["stall_s"], dcp_a and dcp_a["stall_s"]),
        "verified_load_vs_dcp_load": ratio(ref and ref["load_s"], dcp and dcp["load_s"]),
    }
    verdicts = {}
    for key, (op, bound) in TARGETS.items():
        value = ratios[key]
        verdicts[key] = None if value is None else (value >= bound if op == ">=" else value <= bound)
    return {
        "config": {"size_mb": cfg.size_mb, "world_size": cfg.world_size, "repeats": cfg.repeats,
                   "checkpointers": list(cfg.checkpointers), "parallel": cfg.parallel},
        "payload_bytes": payload,
        "raw": {"seconds": measured["raw_s"], "mb_s": raw_mb_s, "all_seconds": measured.get("raw_all_s", [])},
        "results": measured["results"],
        "ratios": ratios,
        "targets": {k: f"{op} {b}" for k, (op, b) in TARGETS.items()},
        "meets_target": verdicts,
    }


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def to_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# chaos bench: {report['payload_bytes'] / 1e6:.0f} MB payload, {report['config']['world_size']} ranks",
        "",
        f"raw write+fsync: {report['raw']['mb_s']:.0f} MB/s ({report['raw']['seconds']:.3f} s)",
        "",
        "| checkpointer | save s | save MB/s | stall s | load s | bit-exact | note |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in report["results"]:
        if r.get("skipped"):
            lines.append(f"| {r['name']} | - | - | - | - | - | skipped: {r['skipped']} |")
        else:
            lines.append(f"| {r['name']} | {r['save_s']:.3f} | {r['save_mb_s']:.0f} | {r['stall_s']:.3f} | {r['load_s']:.3f} | {r['correct']} | |")
    lines += ["", "| ratio | value | target | met |", "|---|---:|---|---|"]
    for k, v in report["ratios"].items():
        lines.append(f"| {k} | {_f(v)} | {report['targets'][k]} | {report['meets_target'][k]} |")
    if "fsdp" in report:
        from chaos import bench_sharded

        lines += ["", *bench_sharded.markdown(report["fsdp"])]
    return "\n".join(lines) + "\n"


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"checkpoint bench: {report['payload_bytes'] / 1e6:.0f} MB payload, {report['config']['world_size']} ranks, raw write+fsync {report['raw']['mb_s']:.0f} MB/s")
    for col in ("checkpointer", "save s", "save MB/s", "stall s", "load s", "bit-exact", "note"):
        t.add_column(col, justify="right" if col.endswith(("s", "MB/s")) else "left")
    for r in report["results"]:
        if r.get("skipped"):
            t.add_row(r["name"], "-", "-", "-", "-", "-", f"skipped: {r['skipped']}")
        else:
            t.add_row(r["name"], f"{r['save_s']:.3f}", f"{r['save_mb_s']:.0f}", f"{r['stall_s']:.3f}", f"{r['load_s']:.3f}", str(r["correct"]), "")
    console.print(t)
    rt = Table(title="ratios")
    for col in ("ratio", "value", "target", "met"):
        rt.add_column(col)
    for k, v in report["ratios"].items():
        rt.add_row(k, _f(v), report["targets"][k], str(report["meets_target"][k]))
    console.print(rt)
    if "fsdp" in report:
        from chaos import bench_sharded

        bench_sharded.print_section(report["fsdp"], console)


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)
