"""`chaos bench crashstates`: how fast power-loss crash states are checked.

Records one real save of a checkpointer (2 gloo ranks, a small model), builds its
crash states and runs the checkpointer's recovery on each distinct tree in warm worker
groups, then prints the state counts, states per second and the class counts::

    chaos bench crashstates                                   # the reference checkpointer
    chaos bench crashstates --checkpointer tests/checkpointers/no_fsync.py:NoFsyncCheckpointer
    chaos bench crashstates --max-states 1000 --seed 3 --json out.json

The counts are kept apart: states *generated* (distinct combinations of crash point
and choices, every one a crash state of the model), *distinct* trees among them,
*checked* (recovered by the real checkpointer and judged) and *pruned* (byte-identical
to a checked tree, sharing its recovery; never counted as checked). ``states_per_s`` is
(checked + pruned) per second of planning plus recovery; ``checked_per_s`` is checked
states per second of recovery (what ``states_per_s`` measured before pruning was counted).

Besides the wall-clock rates it reports the CPU time spent per checked state (parent
plus workers) and the rate that CPU cost allows on 2 otherwise idle cores, because on a
shared box the wall-clock figure mostly measures the neighbours.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from chaos.scratch import make_root

NAME = "crashstates"  # `chaos bench crashstates`
HELP = "record one save, explore its power-loss crash states and report states/s"

CAREFUL = str(Path(__file__).resolve().parents[2] / "tests" / "checkpointers" / "careful.py") + ":CarefulCheckpointer"


def default_checkpointer() -> str:
    """The reference checkpointer when it imports, else the careful test checkpointer."""
    try:
        import importlib

        importlib.import_module("chaos.reference.checkpoint.engine").ReferenceCheckpointer  # noqa: B018
        return "chaos.reference.checkpoint.engine:ReferenceCheckpointer"
    except Exception:  # noqa: BLE001 - any import failure: fall back
        return CAREFUL


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpointer", default=None,
                        help="checkpointer to record and recover (default: reference if importable, else careful)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="checkpointer option (repeatable)")
    parser.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--d-model", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--max-states", type=int, default=500,
                        help="states to sample when the total exceeds --exhaustive-limit (default 500)")
    parser.add_argument("--exhaustive-limit", type=int, default=32768,
                        help="enumerate every state when there are at most this many (default 32768: the "
                             "reference's 10-15k covering combinations, ~2k distinct trees, all of them)")
    parser.add_argument("--parallel", type=int, default=2,
                        help="recovery groups working at once, to fill collective waits (default 2)")
    parser.add_argument("--batch", type=int, default=8,
                        help="states sent to a recovery group per round trip (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--mode", choices=("power", "power-uniform", "kill"), default="power",
                        help="power: power-loss states at the covering crash points (default); "
                             "power-uniform: every crash point alike; kill: process-kill states only")
    parser.add_argument("--dir", default=None, help="scratch directory (default: /dev/shm when present)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the full report as JSON")


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"bad --option {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    from chaos.errors import ChaosError
    from chaos.judge.powerloss import explore, record_save, scratch_root

    try:
        opts = _options(args.option)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    ckpt = args.checkpointer or default_checkpointer()
    work = make_root("chaos-crashbench-", args.dir or scratch_root())
    try:
        t0 = time.perf_counter()
        inp = record_save(os.path.join(work, "ckpt"), os.path.join(work, "rec"), checkpointer=ckpt,
                          ckpt_options=opts, world_size=args.world_size,
                          workload={"d_model": args.d_model}, seed=args.seed,
                          max_states=args.max_states, exhaustive_limit=args.exhaustive_limit)
        record_s = time.perf_counter() - t0
        inp = dataclasses.replace(inp, mode=args.mode, scratch=os.path.join(work, "states"),
                                  parallel=args.parallel, batch=args.batch)
        report = explore(inp)
    except ChaosError as exc:
        print(f"error: {exc}")
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    d = report.to_dict(max_violations=20)
    d["record_seconds"] = round(record_s, 3)
    print(f"checkpointer     {ckpt}")
    print(f"save             step {report.step} ({report.trace_ops} traced ops, "
          f"{report.prefixes} crash points); acknowledged before: {report.acked_before}")
    how = "exhaustive" if report.exhaustive else f"sampled with seed {report.seed}: {report.sampling}"
    print(f"states           {report.states_generated} generated, {report.states_distinct} distinct trees, "
          f"{report.states_checked} checked, {report.states_pruned} pruned (byte-identical to a checked "
          f"tree); {report.total_possible} combinations at all crash points ({how})")
    print(f"speed            {report.states_per_s} states/s wall ({report.total_seconds} s: planning "
          f"{report.generate_seconds} s, recovery {report.seconds} s); {report.checked_per_s} checked/s")
    print(f"cpu              {report.cpu.get('per_state_ms')} ms per checked state = "
          f"{report.cpu.get('capacity_states_per_s_2_cores')} checked/s on 2 idle cores; "
          f"{report.cpu.get('per_generated_state_ms')} ms per generated state = "
          f"{report.cpu.get('capacity_generated_per_s_2_cores')} states/s "
          f"(load average {report.cpu.get('load_avg_1m')})")
    print("classes          " + "  ".join(f"{k}={v}" for k, v in report.counts.items()))
    print("pruned classes   " + "  ".join(f"{k}={v}" for k, v in report.pruned_counts.items()))
    print(f"pool             {report.pool.get('pools')} x {report.world_size} ranks, "
          f"{report.pool.get('batch')} states per round trip, started in "
          f"{report.pool.get('start_seconds')} s, "
          f"{len(report.pool.get('restarts', []))} restarts; recording took {record_s:.1f} s")
    for v in report.violations[:5]:
        lost = "; ".join(f"{x.get('what')} {x.get('op', '')} {x.get('path', '')}".strip() for x in v["lost"][:3])
        print(f"  {v['class']:<10} {v['id']}  loaded {v['loaded_step']}  lost: {lost}  "
              f"{v.get('reason') or v.get('error') or ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(d, f, indent=1, default=str)
    return 0 if report.passed else 1
