"""`chaos interval`: the optimal checkpoint interval from save cost and failure rate.

Prints Young's and Daly's optimal intervals, the expected work lost per failure and
the expected overhead, checks the 2% save-stall budget (stretching the interval when
it is exceeded) and, with ``--step-seconds``, the same in training steps::

    chaos interval --save-seconds 30 --mtbf-hours 24 --step-seconds 1.5
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from chaos.reference.checkpoint import policy

NAME = "interval"
HELP = "optimal checkpoint interval (Young/Daly) from save cost and MTBF"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--save-seconds", type=float, required=True, help="stall of one checkpoint save (C)")
    parser.add_argument("--mtbf-hours", type=float, required=True, help="mean time between failures of the job (M)")
    parser.add_argument("--step-seconds", type=float, default=None, help="time of one training step, to express intervals in steps")
    parser.add_argument("--restart-seconds", type=float, default=0.0, help="time to restart and reload after a failure (R)")
    parser.add_argument("--budget", type=float, default=0.02, help="largest share of training time spent stalled on saves (default 0.02)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def compute(save_s: float, mtbf_s: float, step_s: float | None = None, restart_s: float = 0.0, budget: float = 0.02) -> dict[str, Any]:
    """All figures of the report, as plain numbers (seconds, fractions, steps)."""
    young = policy.young_interval(save_s, mtbf_s)
    daly = policy.daly_interval(save_s, mtbf_s)
    floor = policy.budget_interval(save_s, budget)
    chosen = max(daly, floor)
    out: dict[str, Any] = {
        "save_seconds": save_s,
        "mtbf_seconds": mtbf_s,
        "restart_seconds": restart_s,
        "young_interval_seconds": young,
        "daly_interval_seconds": daly,
        "budget": budget,
        "budget_interval_seconds": floor,
        "stretched_by_budget": floor > daly,
        "interval_seconds": chosen,
        "expected_lost_work_seconds": policy.expected_lost_work(chosen, save_s),
        "overhead_fraction": policy.overhead_fraction(chosen, save_s, mtbf_s, restart_s),
        "daly_overhead_fraction": policy.overhead_fraction(daly, save_s, mtbf_s, restart_s),
        "save_stall_fraction": save_s / chosen,
    }
    if step_s:
        out["step_seconds"] = step_s
        out["interval_steps"] = max(1, math.ceil(chosen / step_s))
        out["young_interval_steps"] = max(1, round(young / step_s))
        out["expected_lost_steps"] = out["expected_lost_work_seconds"] / step_s
    return out


def _fmt_s(s: float) -> str:
    return f"{s:,.1f} s ({s / 60:,.1f} min)" if s >= 60 else f"{s:.3f} s"


def run(args: argparse.Namespace) -> int:
    if args.save_seconds <= 0 or args.mtbf_hours <= 0 or (args.step_seconds is not None and args.step_seconds <= 0):
        print("error: --save-seconds, --mtbf-hours and --step-seconds must be positive")
        return 2
    if not 0 < args.budget < 1:
        print("error: --budget must be in (0, 1)")
        return 2
    r = compute(args.save_seconds, args.mtbf_hours * 3600, args.step_seconds, args.restart_seconds, args.budget)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"checkpoint interval for C={args.save_seconds}s, MTBF={args.mtbf_hours}h")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("Young interval sqrt(2CM)", _fmt_s(r["young_interval_seconds"]))
    t.add_row("Daly interval (higher order)", _fmt_s(r["daly_interval_seconds"]))
    t.add_row(f"budget floor (stall <= {args.budget:.0%})", _fmt_s(r["budget_interval_seconds"]))
    t.add_row("chosen interval" + (" (stretched by budget)" if r["stretched_by_budget"] else ""), _fmt_s(r["interval_seconds"]))
    t.add_row("expected lost work per failure", _fmt_s(r["expected_lost_work_seconds"]))
    t.add_row("expected overhead (saves + rework + restart)", f"{r['overhead_fraction']:.2%}")
    if r["stretched_by_budget"]:
        t.add_row("overhead at the Daly interval (budget ignored)", f"{r['daly_overhead_fraction']:.2%}")
    t.add_row("save stall share of training", f"{r['save_stall_fraction']:.2%}")
    if "interval_steps" in r:
        t.add_row("interval in steps", f"{r['interval_steps']:,}")
        t.add_row("expected lost steps per failure", f"{r['expected_lost_steps']:,.0f}")
    Console().print(t)
    return 0
