"""``chaos bench-launch``: the wall time of one kill scenario, against a plain ``torchrun`` launch.

Measured side by side in one run and reported as a ratio; the golden run is cached
first so the figure is what a user pays per scenario in a campaign.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAME = "bench-launch"
HELP = "time one kill scenario (golden cached) against a plain torchrun launch of the same job"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpointer", default="torch-save")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="scenario runs to time (median reported)")
    p.add_argument("--no-torchrun", action="store_true", help="skip the torchrun comparison")
    p.add_argument("--json", metavar="PATH")


def _torchrun(world_size: int, steps: int, scratch: Path) -> float:
    logs = scratch / "torchrun-logs"
    logs.mkdir()
    port = str(__import__("chaos.cluster", fromlist=["free_port"]).free_port())
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world_size}",
           "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "chaos.workload.standalone", str(logs), str(steps)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    from chaos.runner import RunOptions, run_scenario
    from chaos.scenario import Scenario, parse_fault
    from chaos.workload.config import WorkloadConfig

    scratch = Path(tempfile.mkdtemp(prefix="chaos-bench-launch-"))
    try:
        cfg = WorkloadConfig(steps=args.steps)
        kill_step = max(2, round(args.steps * 0.575))
        options = RunOptions(scratch_base=str(scratch), cache_dir=scratch / "golden")
        scenario = Scenario(args.checkpointer, args.world_size, cfg,
                            [parse_fault(f"kill:rank={args.world_size - 1},step={kill_step}")])
        t0 = time.perf_counter()
        run_scenario(scenario, options)  # runs and caches the golden run
        first_s = time.perf_counter() - t0
        times, preloaded = [], True
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = run_scenario(scenario, options)
            times.append(time.perf_counter() - t0)
            starts = [e for a in res.record.events.values() for evs in a.values() for e in evs if e["ev"] == "start"]
            preloaded = preloaded and all(e["preloaded_torch"] for e in starts)
            if res.verdict != "pass":
                print(f"scenario did not pass: {res.verdict}", file=sys.stderr)
                return 1
        scenario_s = sorted(times)[len(times) // 2]
        torchrun_s = None if args.no_torchrun else _torchrun(args.world_size, args.steps, scratch)
        report = {
            "checkpointer": args.checkpointer, "world_size": args.world_size, "steps": args.steps,
            "first_scenario_with_golden_s": round(first_s, 3), "scenario_golden_cached_s": round(scenario_s, 3),
            "scenario_runs_s": [round(t, 3) for t in times], "torch_preloaded_in_every_rank": preloaded,
            "torchrun_plain_launch_s": None if torchrun_s is None else round(torchrun_s, 3),
            "ratio_scenario_to_torchrun": None if torchrun_s is None else round(scenario_s / torchrun_s, 3),
            "target_s": 10.0,
        }
        from rich.console import Console
        from rich.table import Table

        table = Table(title="launch benchmark (2 launches + restart per scenario)")
        table.add_column("measure")
        table.add_column("value", justify="right")
        for key, value in report.items():
            table.add_row(key, str(value))
        Console().print(table)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
