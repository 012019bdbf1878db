"""`chaos bench --workload parallel=fsdp`: the reference checkpointer against DCP on sharded FSDP2 state.

``chaos.bench.save.run_bench`` hands a ``parallel=fsdp`` config here. The ranks hold the real
workload's state (``chaos.target.workload.train.Trainer`` with ``parallel=fsdp``: per-block
``fully_shard`` on gloo/CPU, parameters and AdamW moments as DTensors, after one training
step), its model sized so the whole state (all ranks together) is about ``size_mb``. That
is exactly what ``chaos run --workload parallel=fsdp`` hands a checkpointer, and the DCP
adapters save and load it through ``get_state_dict`` / ``set_state_dict`` as torchtitan does.

Two launches through :func:`chaos.bench.ranks.launch` (one forkserver that imported torch and
FSDP once, so the second costs forks, not imports):

1. ``N`` ranks, per repeat: a raw ``write + fsync`` sample, then reference sync save and
   DCP save, reference ``async_save`` and DCP ``async_save`` (stall: the slowest rank's
   ``save()`` return, the time training is blocked; save: until ``wait()`` returned), then
   a load of each at the same world size. Reference and DCP alternate which goes first
   each repeat, so disk weather and page-cache order hit both alike.
2. ``N // 2`` ranks load the checkpoints phase 1 left (``N -> N//2``, resharded), again
   alternating per repeat, and count the bytes each rank read.

Every load is checked: same world, the fingerprint (DTensors hashed as their global
value) equals the saved state's; resharded, every entry but the per-rank RNG states does.
Ratios are reference seconds / DCP seconds of the same repeat (below 1: the reference
is faster), reported with min / median / max over the repeats. The report keeps
``chaos.bench.checkpoint``'s keys (``results``, ``ratios``: medians of per-repeat ratios, ``raw`` ...)
and adds ``fsdp``.

Who calls what: ``chaos.bench.save.run_bench`` calls :func:`validate` and :func:`run`
for a ``parallel=fsdp`` config and renders :func:`markdown` / :func:`print_section`
beside ``chaos.bench.checkpoint``'s tables. Rank machinery is ``chaos.bench.ranks``'s.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import time
from dataclasses import replace
from typing import Any

from chaos.bench import checkpoint as bench
from chaos.bench import ranks as bench_ranks
from chaos.bench.ranks import spread
from chaos.errors import ConfigError
from chaos.scratch import make_root

CHECKPOINTERS = ("reference", "reference-async", "dcp", "dcp-async")
BENCHED_MODES = ("ddp", "fsdp")
# One measure per row of the report: (key, reference checkpointer, DCP checkpointer, what is timed).
MEASURES = (
    ("save", "reference", "dcp", "sync save"),
    ("async_stall", "reference-async", "dcp-async", "async save: training blocked"),
    ("async_save", "reference-async", "dcp-async", "async save: until durable"),
    ("load", "reference", "dcp", "load, same world size"),
    ("resharded_load", "reference", "dcp", "load, resharded"),
)
PRELOAD = ["torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.checkpoint",
           "torch.distributed.checkpoint.state_dict", "chaos.reference.checkpoint", "chaos.target.workload.train", "chaos.target.adapters.dcp"]


# ----------------------------------------------------------------- configuration
def validate(cfg: Any) -> None:
    """Raise ConfigError for a parallel mode or fsdp workload that cannot run (before any process starts).

    ``parallel=ddp`` passes through: ``chaos.bench.checkpoint.validate`` checks the replicated bench.
    """
    from chaos.target.workload.config import PARALLEL_MODES

    if cfg.parallel not in PARALLEL_MODES:
        raise ConfigError(f"chaos bench: --workload parallel={cfg.parallel!r} is unknown: choose ddp or fsdp")
    if cfg.parallel not in BENCHED_MODES:
        raise ConfigError(f"chaos bench: --workload parallel={cfg.parallel} is not benchmarked: choose ddp or fsdp")
    if cfg.parallel == "ddp":
        return  # chaos.bench.checkpoint.validate checks the rest
    if cfg.world_size < 2:
        raise ConfigError(f"chaos bench --workload parallel=fsdp needs --world-size 2 or more (a sharded state, "
                          f"then a resharded load at half the ranks), got {cfg.world_size}")
    for key in ("d_model", "n_layers"):
        value = cfg.workload.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"chaos bench: --workload {key}={value!r} must be a positive integer")
    workload(cfg)


def model_shape(size_bytes: float, vocab: int, seq_len: int, n_heads: int,
                d_model: int | None = None, n_layers: int | None = None) -> tuple[int, int]:
    """``(d_model, n_layers)`` whose fsdp state (weights + two AdamW moments, fp32) is nearest ``size_bytes``.

    Layers grow with the size (1-3 at ~1 MB, 6-10 at ~100 MB, 10-14 from ~200 MB) and ``d_model``
    is a multiple of 32 (and of ``n_heads``) so every dim 0 splits evenly over 2, 4 or 8 ranks.
    A value the user gave is kept and only the other one is fitted.
    """
    def state_bytes(d: int, n: int) -> int:
        params = 2 * vocab * d + seq_len * d + 2 * d + n * (12 * d * d + 13 * d)
        return 12 * params

    step = 32 * n_heads // math.gcd(32, n_heads)
    ds = [d_model] if d_model else range(step, 16385, step)
    if n_layers:
        ns: Any = [n_layers]
    elif d_model:
        ns = range(1, 129)
    else:
        n0 = max(1, min(12, round(math.sqrt(size_bytes / 1.5e6))))
        ns = range(max(1, n0 - 2), n0 + 3)
    return min(((d, n) for d in ds for n in ns), key=lambda dn: abs(state_bytes(*dn) - size_bytes))


def workload(cfg: Any) -> dict[str, Any]:
    """The ``WorkloadConfig`` (as a dict) every rank builds: ``parallel=fsdp``, sized from ``cfg.size_mb``."""
    from chaos.target.workload.config import WorkloadConfig

    known = {f for f in WorkloadConfig.__dataclass_fields__}
    unknown = sorted(set(cfg.workload) - known)
    if unknown:
        raise ConfigError(f"chaos bench: unknown --workload key(s) {', '.join(unknown)}: known are {', '.join(sorted(known))}")
    base = WorkloadConfig(**{**cfg.workload, "parallel": "fsdp"})
    d, n = model_shape(cfg.size_mb * 1e6, base.vocab, base.seq_len, base.n_heads,
                       cfg.workload.get("d_model"), cfg.workload.get("n_layers"))
    wc = replace(base, d_model=d, n_layers=n)
    wc.check_world_size(cfg.world_size)
    wc.check_world_size(cfg.world_size // 2)
    return wc.to_dict()


def _context() -> Any:
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # no effect once the forkserver runs (e.g. the tests' own)
    return ctx


# ----------------------------------------------------------------- in the ranks
def _trainer(spec: dict[str, Any], rank: int, world: int) -> Any:
    from chaos.target.workload.config import WorkloadConfig
    from chaos.target.workload.train import Trainer

    return Trainer(WorkloadConfig.from_dict(spec), rank, world)


def _tensors(value: Any, path: str = "") -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensors(v, f"{path}/{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{path}[{i}]")


def _state_bytes(state: dict[str, Any], rank: int) -> int:
    """Bytes of the whole sharded state over all ranks: local shards, per-rank RNG, other tensors once."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    local = 0
    for path, t in _tensors(state):
        if isinstance(t, DTensor):
            t = t.to_local()
        elif not path.startswith("rng") and rank != 0:
            continue
        local += t.numel() * t.element_size()
    total = torch.tensor([local], dtype=torch.int64)
    dist.all_reduce(total)
    return int(total.item())


def _rchar() -> int | None:
    """Bytes this process passed through read(2) and friends (Linux ``/proc/self/io``), or None."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _shared(fp: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in fp.items() if not k.startswith("rng")}


def _load(ck: Any, template: dict[str, Any], step: int, expected: dict[str, str], resharded: bool) -> dict[str, Any]:
    """One timed collective ``load_latest``, checked against the saved fingerprint; bytes read per rank."""
    import torch.distributed as dist

    from chaos.model.statehash import fingerprint

    fresh = bench_ranks.zeros_like(template)
    before = _rchar()
    dist.barrier()
    t0 = time.perf_counter()
    found = ck.load_latest(fresh)
    dist.barrier()
    seconds = bench_ranks.max_all(time.perf_counter() - t0)
    after = _rchar()
    got = fingerprint(found[1]) if found is not None else {}  # collective (DTensors gather): every rank calls it
    if resharded:
        got, expected = _shared(got), _shared(expected)
    ok = bench_ranks.all_true(found is not None and found[0] == step and got == expected)
    events = [e for e in getattr(ck, "events", []) if e.get("kind") == "load"]
    own = events[-1]["bytes"] if events else None
    syscall = after - before if before is not None and after is not None else None
    per_rank = bench_ranks.gather((own, syscall))
    return {"seconds": seconds, "ok": ok, "bytes_read": [p[0] for p in per_rank], "syscall_read": [p[1] for p in per_rank]}


def _step_bytes(root: str) -> int:
    """Size of the newest step directory under ``root`` (either checkpointer's naming)."""
    steps = []
    for name in os.listdir(root):
        digits = name.rsplit("-", 1)[-1].rsplit("_", 1)[-1]
        if name.startswith("step") and digits.isdigit() and os.path.isdir(os.path.join(root, name)):
            steps.append((int(digits), name))
    newest = os.path.join(root, max(steps)[1])
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(newest) for f in files)


def _open(name: str, base: str, rank: int, world: int) -> Any:
    return bench_ranks.open_checkpointer(name, os.path.join(base, name), rank, world)


def measure_saves(rank: int, world: int, spec: dict[str, Any], base: str, repeats: int) -> dict[str, Any]:
    """Phase 1 (``world`` ranks): saves, async stalls and same-world loads, per repeat; leaves the sync checkpoints."""
    import torch
    import torch.distributed as dist

    from chaos.model.statehash import fingerprint

    trainer = _trainer(spec, rank, world)
    trainer.train_step()  # AdamW moments exist from here on, sharded like the parameters
    state = trainer.state_dict()
    template = trainer.template()
    saved = fingerprint(state)
    payload = _state_bytes(state, rank)
    buf = torch.randint(0, 255, (payload // world + 1,), dtype=torch.uint8)
    cks = {name: _open(name, base, rank, world) for name in CHECKPOINTERS}
    seconds: dict[str, dict[str, list[float]]] = {n: {"save": [], "stall": [], "load": []} for n in CHECKPOINTERS}
    raws: list[float] = []
    for i in range(repeats):
        raws.append(bench_ranks.raw_write(rank, world, base, payload, buf))
        for pair in (("reference", "dcp"), ("reference-async", "dcp-async")):
            for name in bench_ranks.ordered(pair, i):
                stall, save = bench_ranks.timed_save(cks[name], i + 1, state)
                seconds[name]["stall"].append(stall)
                seconds[name]["save"].append(save)
    loads: dict[str, list[dict[str, Any]]] = {"reference": [], "dcp": []}
    for i in range(repeats):
        for name in bench_ranks.ordered(("reference", "dcp"), i):
            loads[name].append(_load(cks[name], template, repeats, saved, resharded=False))
    for ck in cks.values():
        ck.close()
    dist.barrier()
    sizes = {name: _step_bytes(os.path.join(base, name)) for name in ("reference", "dcp")} if rank == 0 else {}
    if rank == 0:
        for name in ("reference-async", "dcp-async"):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return {"payload_bytes": payload, "raw_all_s": raws, "seconds": seconds, "loads": loads,
            "checkpoint_bytes": sizes, "fingerprint": saved, "step": repeats}


def measure_resharded_loads(rank: int, world: int, spec: dict[str, Any], base: str, repeats: int,
                            expected: dict[str, str], step: int) -> dict[str, Any]:
    """Phase 2 (``N // 2`` ranks): load phase 1's checkpoints resharded, per repeat, reference and DCP alternating."""
    trainer = _trainer(spec, rank, world)
    template = trainer.template()
    cks = {name: _open(name, base, rank, world) for name in ("reference", "dcp")}
    loads: dict[str, list[dict[str, Any]]] = {"reference": [], "dcp": []}
    for i in range(repeats):
        for name in bench_ranks.ordered(("reference", "dcp"), i):
            loads[name].append(_load(cks[name], template, step, expected, resharded=True))
    for ck in cks.values():
        ck.close()
    return {"loads": loads}


# ----------------------------------------------------------------- in the parent
def run(cfg: Any) -> dict[str, Any]:
    """Both phases in fresh rank processes under one scratch directory (removed after); the report."""
    validate(cfg)
    spec = workload(cfg)
    cfg = replace(cfg, checkpointers=CHECKPOINTERS)
    ctx = _context()
    base = make_root("chaos-bench-", cfg.root)
    try:
        first = bench_ranks.launch(measure_saves, cfg.world_size, cfg.timeout_s, (spec, base, cfg.repeats), ctx)
        second = bench_ranks.launch(measure_resharded_loads, cfg.world_size // 2, cfg.timeout_s,
                              (spec, base, cfg.repeats, first["fingerprint"], first["step"]), ctx)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return make_report(cfg, spec, first, second)


def _series(first: dict[str, Any], second: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Seconds per repeat of every measure, by checkpointer."""
    s, loads, reloads = first["seconds"], first["loads"], second["loads"]
    out: dict[str, dict[str, list[float]]] = {}
    for key, ref, dcp, _ in MEASURES:
        for side, name in (("reference", ref), ("dcp", dcp)):
            if key == "load":
                values = [x["seconds"] for x in loads[name]]
            elif key == "resharded_load":
                values = [x["seconds"] for x in reloads[name]]
            else:
                values = s[name]["stall" if key == "async_stall" else "save"]
            out.setdefault(side, {})[key] = values
    return out


def make_report(cfg: Any, spec: dict[str, Any], first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """``chaos.bench.checkpoint``'s report of the four checkpointers plus the ``fsdp`` section (per-repeat ratios, bytes read).

    Every result carries the repeat's raw write+fsync sample (``extra.raw_all_s``, one per
    repeat, taken before that repeat's saves), so ``chaos.bench.checkpoint.make_report`` computes
    ``reference_vs_raw`` per repeat like every other ratio.
    """
    payload = first["payload_bytes"]
    series = _series(first, second)
    ok = {name: {"load": all(x["ok"] for x in first["loads"][name]),
                 "resharded_load": all(x["ok"] for x in second["loads"][name])} for name in ("reference", "dcp")}
    results = []
    for name in CHECKPOINTERS:
        s = first["seconds"][name]
        loader = name.removesuffix("-async")
        loads = [x["seconds"] for x in first["loads"][loader]]
        reloads = [x["seconds"] for x in second["loads"][loader]]
        save_s = statistics.median(s["save"])
        results.append({"name": name, "skipped": None, "save_s": save_s, "stall_s": statistics.median(s["stall"]),
                        "load_s": statistics.median(loads), "save_mb_s": payload / save_s / 1e6,
                        "correct": ok[loader]["load"] and ok[loader]["resharded_load"],
                        "extra": {"save_all_s": s["save"], "stall_all_s": s["stall"], "load_all_s": loads,
                                  "raw_all_s": list(first["raw_all_s"]),
                                  "resharded_load_all_s": reloads, "resharded_load_s": statistics.median(reloads)}})
    measured = {"payload_bytes": payload, "raw_s": statistics.median(first["raw_all_s"]),
                "raw_all_s": first["raw_all_s"], "results": results}
    report = bench.make_report(cfg, measured)
    ratios = {}
    for key, _, _, _ in MEASURES:
        ref, dcp = series["reference"][key], series["dcp"][key]
        ratios[key] = spread([r / d for r, d in zip(ref, dcp, strict=True)])
    sizes = first["checkpoint_bytes"]
    last_same = {n: first["loads"][n][-1] for n in ("reference", "dcp")}
    last_resharded = {n: second["loads"][n][-1] for n in ("reference", "dcp")}

    def fractions(counts: list[int | None], total: int) -> list[float | None]:
        return [None if c is None else c / total for c in counts]

    report["config"]["workload"] = spec
    report["fsdp"] = {
        "world_size": cfg.world_size,
        "resharded_world_size": cfg.world_size // 2,
        "model": {"d_model": spec["d_model"], "n_layers": spec["n_layers"]},
        "state_bytes": payload,
        "ratio_meaning": "reference seconds / DCP seconds of the same repeat (below 1: the reference is faster)",
        "ratios": ratios,
        "seconds": series,
        "correct": ok,
        "checkpoint_bytes": sizes,
        "bytes_read": {
            # the reference's own count (its load event): slices rounded out to checksum blocks
            "reference_load_per_rank": last_same["reference"]["bytes_read"],
            "reference_resharded_per_rank": last_resharded["reference"]["bytes_read"],
            "reference_load_fraction": fractions(last_same["reference"]["bytes_read"], sizes["reference"]),
            "reference_resharded_fraction": fractions(last_resharded["reference"]["bytes_read"], sizes["reference"]),
            # read(2) bytes per rank during the load (/proc/self/io rchar): files plus any collective traffic
            "syscall_load_per_rank": {n: last_same[n]["syscall_read"] for n in ("reference", "dcp")},
            "syscall_resharded_per_rank": {n: last_resharded[n]["syscall_read"] for n in ("reference", "dcp")},
        },
    }
    return report


# ----------------------------------------------------------------- rendering
def _pct(values: list[float | None]) -> str:
    return ", ".join("-" if v is None else f"{100 * v:.1f} %" for v in values)


def rows(section: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per measure: what, reference median s, DCP median s, ratio min / median / max."""
    n, m = section["world_size"], section["resharded_world_size"]
    out = []
    for key, _, _, what in MEASURES:
        if key == "resharded_load":
            what = f"load, resharded {n} -> {m}"
        elif key == "load":
            what = f"load, same world size ({n})"
        r = section["ratios"][key]
        out.append((what, f"{statistics.median(section['seconds']['reference'][key]):.3f}",
                    f"{statistics.median(section['seconds']['dcp'][key]):.3f}",
                    f"{r['min']:.2f}", f"{r['median']:.2f}", f"{r['max']:.2f}"))
    return out


def bytes_line(section: dict[str, Any]) -> str:
    b, sizes = section["bytes_read"], section["checkpoint_bytes"]
    return (f"reference checkpoint {sizes['reference'] / 1e6:.1f} MB, DCP {sizes['dcp'] / 1e6:.1f} MB; "
            f"reference bytes read per rank: {_pct(b['reference_load_fraction'])} of its checkpoint at "
            f"{section['world_size']} ranks, {_pct(b['reference_resharded_fraction'])} resharded to "
            f"{section['resharded_world_size']}")


def markdown(section: dict[str, Any]) -> list[str]:
    lines = [f"## fsdp: {section['state_bytes'] / 1e6:.0f} MB sharded state, {section['world_size']} ranks "
             f"(d_model {section['model']['d_model']}, {section['model']['n_layers']} layers)", "",
             f"Ratios: {section['ratio_meaning']}.", "",
             "| measure | reference s | DCP s | ratio min | median | max |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {' | '.join(r)} |" for r in rows(section)]
    return [*lines, "", bytes_line(section) + ".",
            f"correct (fingerprints equal): {section['correct']}"]


def print_section(section: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    t = Table(title=f"fsdp: {section['state_bytes'] / 1e6:.0f} MB sharded state, {section['world_size']} ranks; "
                    f"ratio = reference s / DCP s per repeat")
    for col in ("measure", "reference s", "DCP s", "ratio min", "median", "max"):
        t.add_column(col, justify="left" if col == "measure" else "right")
    for r in rows(section):
        t.add_row(*r)
    console.print(t)
    console.print(bytes_line(section))
    console.print(f"correct (fingerprints equal): {section['correct']}")
