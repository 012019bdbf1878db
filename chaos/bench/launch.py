"""``chaos bench launch``: the wall time of one kill scenario, where it goes, and a plain ``torchrun`` beside it.

The golden run is cached first, so the figure is what a user pays per scenario in a
campaign. Every timed scenario is split into phases, measured, not estimated: the
runner's own stages (``ScenarioResult.spans``), each attempt's bounds as the supervisor
saw them, and the interval before each event a rank logged (rank 0's log, the rank
every collective waits on). The phases partition the scenario's wall time exactly, so
they add up to it; what the bench measured around ``run_scenario`` beyond that is
reported as ``outside run_scenario``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chaos.scratch import make_root

NAME = "launch"  # `chaos bench launch`
HELP = "time one kill scenario (golden cached), phase by phase, against a plain torchrun launch"

# The interval that ends at a rank event, by the event's name: what the rank was doing.
_BY_EVENT = {
    "start": "launch: fork, rank start",
    "pg_ready": "launch: rendezvous (init_process_group)",
    "trainer_ready": "launch: build model + optimizer",
    "io_trace": "launch: I/O interposer",
    "ckpt_ready": "launch: checkpointer init",
    "resume": "resume: template + state hash",
    "step": "train: steps",
    "fault_point": "train: steps",
    "settled": "train: settle before an at-rest fault",
    "save_call": "save: state_dict + state hash",
    "save_return": "save: checkpointer save()",
    "ack": "save: checkpointer wait()",
    "final": "end: final state hash",
    "exit": "end: barrier, destroy group",
    "verify": "template + state hash",
    "error": "fault: fired -> every rank down",
}
# Events whose ``seconds`` field times the checkpointer's own call inside their interval.
_TIMED = {"resume": "resume: checkpointer load_latest()", "verify": "checkpointer load_latest()"}
_GROUPS = (
    ("state hashes (the record's evidence)", ("state hash",)),
    ("final load (a fresh launch after the job)", ("final load:",)),
    ("harness (set-up, record, hygiene, judge, clean-up)", ("harness:", "outside run_scenario")),
    ("launch and teardown (fork server, supervisor)", ("fork, rank start", "fault:", "exit noticed", "reaped",
                                                       "restart:", "run:")),
    ("the job's own work (rendezvous, build, train, save, load)", ("",)),
)


def group_of(phase: str) -> str:
    """Which of ``_GROUPS`` a phase belongs to (the first whose marker it contains)."""
    return next(name for name, marks in _GROUPS if any(m in phase for m in marks))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpointer", default="torch-save")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="scenario runs to time (min/median/max reported)")
    p.add_argument("--no-torchrun", action="store_true", help="skip the torchrun comparison")
    p.add_argument("--json", metavar="PATH")


def _attempt_segments(events: list[dict[str, Any]], started: float, ended: float, outcome: str,
                      fired: float | None = None, prefix: str = "") -> list[tuple[str, float, float]]:
    """Split one attempt [started, ended] at rank 0's events; the tail is the supervisor's.

    From the moment a fault fired (``fired``, the supervisor's clock) to the attempt's
    end is the fault's: the kill, the survivors noticing, the teardown.
    """
    out, t = [], started
    stop = ended if fired is None else min(max(fired, started), ended)
    for e in sorted(events, key=lambda e: e["t"]):
        if e["t"] > stop:
            break
        end = max(e["t"], t)
        label = prefix + _BY_EVENT.get(e["ev"], f"other: {e['ev']}")
        timed = min(max(float(e.get("seconds") or 0.0), 0.0), end - t) if e["ev"] in _TIMED else 0.0
        if timed:  # the checkpointer's call, then the rest of the interval (template, hash)
            out.append((prefix + _TIMED[e["ev"]], t, t + timed))
            t += timed
        out.append((label, t, end))
        t = end
    if fired is not None:
        out.append((prefix + "train: steps", t, stop))  # rank 0 in its next step, until the fault fired
        out.append((prefix + "fault: fired -> every rank down", stop, ended))
    else:
        tail = "end: exit noticed, ranks reaped" if outcome == "ok" else "end: attempt failed, ranks reaped"
        out.append((prefix + tail, t, ended))
    return out


def scenario_phases(result: Any) -> list[tuple[str, float, float]]:
    """The scenario's wall time as consecutive (phase, start, end) segments, from its record.

    ``result`` is a ``chaos.run.runner.ScenarioResult``. The runner's stages ``run`` and
    ``final load`` are split further by attempt and rank event; a gap between stages
    (the environment set-up) is ``harness: between stages``.
    """
    record = result.record
    out: list[tuple[str, float, float]] = []
    t = min(s for _, s, _ in result.spans)
    for name, start, end in sorted(result.spans, key=lambda s: s[1]):
        if start > t:
            out.append(("harness: between stages", t, start))
        if name == "run" and record is not None and record.attempts:
            cursor = start
            for i, a in enumerate(record.attempts):
                a_start, a_end = max(a["started"], cursor), max(a["ended"], a["started"], cursor)
                out.append(("restart: between attempts" if i else "run: before the first launch", cursor, a_start))
                events = record.events.get(a["attempt"], {}).get(0, [])
                fired = (min((f["t"] for f in a.get("fired") or []), default=None)
                         if a["outcome"] != "ok" else None)  # a fault the job ran on past is no teardown
                out += _attempt_segments(events, a_start, a_end, a["outcome"], fired)
                cursor = a_end
            out.append(("run: after the last attempt", cursor, max(end, cursor)))
        elif name == "final load" and record is not None and record.verify:
            events = record.verify.get("events", {}).get(0, [])
            out += _attempt_segments(events, start, end, record.verify.get("outcome", "ok"), prefix="final load: ")
        else:
            out.append((f"harness: {name}", start, end))
        t = max(t, end)
    return [(name, a, b) for name, a, b in out]


def aggregate(segments: list[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
    """Seconds and segment count per phase, in first-seen order."""
    out: dict[str, dict[str, float]] = {}
    for name, a, b in segments:
        row = out.setdefault(name, {"s": 0.0, "n": 0})
        row["s"] += max(0.0, b - a)
        row["n"] += 1
    return out


def _stats(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def _torchrun(world_size: int, steps: int, scratch: Path) -> float:
    logs = scratch / "torchrun-logs"
    logs.mkdir()
    port = str(__import__("chaos.launch.ports", fromlist=["free_port"]).free_port())
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world_size}",
           "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "chaos.target.workload.standalone", str(logs), str(steps)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    return time.perf_counter() - t0


def kill_step(steps: int) -> int:
    """The step the bench's scenario kills at: 57.5 % of the way (step 23 of 40), after a save."""
    return max(2, round(steps * 0.575))


def kill_scenario(checkpointer: str, world_size: int, steps: int) -> Any:
    """The bench's scenario: the last rank SIGKILLed at :func:`kill_step` (also ``chaos bench scale``'s)."""
    from chaos.model.grammar import parse_fault
    from chaos.plan.scenario import Scenario
    from chaos.target.workload.config import WorkloadConfig

    return Scenario(checkpointer, world_size, WorkloadConfig(steps=steps),
                    [parse_fault(f"kill:rank={world_size - 1},step={kill_step(steps)}")])


def measure(checkpointer: str, steps: int, world_size: int, repeat: int, scratch: Path) -> dict[str, Any]:
    """Run the kill scenario once to cache its golden, then ``repeat`` timed runs; the report.

    Called by ``run`` below (and by tests with a small workload). Raises RuntimeError
    when a timed run does not pass: a failing scenario's time means nothing.
    """
    from chaos.run.runner import RunOptions, run_scenario

    options = RunOptions(scratch_base=str(scratch), cache_dir=scratch / "golden")
    scenario = kill_scenario(checkpointer, world_size, steps)
    t0 = time.perf_counter()
    first = run_scenario(scenario, options)  # runs and caches the golden run
    first_s = time.perf_counter() - t0
    if first.verdict != "pass":
        raise RuntimeError(f"scenario did not pass: {first.verdict} {first.error or ''}")
    times: list[float] = []
    per_run: list[dict[str, dict[str, float]]] = []
    preloaded = True
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = run_scenario(scenario, options)
        times.append(time.perf_counter() - t0)
        if res.verdict != "pass":
            raise RuntimeError(f"scenario did not pass: {res.verdict} {res.error or ''}")
        starts = [e for a in res.record.events.values() for evs in a.values() for e in evs if e["ev"] == "start"]
        preloaded = preloaded and all(e["preloaded_torch"] for e in starts)
        segments = scenario_phases(res)
        rows = aggregate(segments)
        rows["outside run_scenario"] = {"s": times[-1] - (segments[-1][2] - segments[0][1]), "n": 1}
        per_run.append(rows)
    names = list(dict.fromkeys(name for rows in per_run for name in rows))
    phases = {name: {**_stats([rows.get(name, {"s": 0.0})["s"] for rows in per_run]),
                     "count": max(int(rows.get(name, {"n": 0})["n"]) for rows in per_run)} for name in names}
    groups = {name: _stats([sum(row["s"] for phase, row in rows.items() if group_of(phase) == name)
                            for rows in per_run]) for name, _ in _GROUPS}
    return {
        "checkpointer": checkpointer, "world_size": world_size, "steps": steps, "kill_step": kill_step(steps),
        "first_scenario_with_golden_s": round(first_s, 3),
        "scenario_golden_cached_s": round(statistics.median(times), 3),
        "scenario_golden_cached": _stats(times),
        "scenario_runs_s": [round(t, 3) for t in times], "torch_preloaded_in_every_rank": preloaded,
        "phases_s": phases, "groups_s": groups,
        "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
        "target_s": 2.0,
    }


def run(args: argparse.Namespace) -> int:
    scratch = Path(make_root("chaos-bench-launch-"))
    try:
        try:
            report = measure(args.checkpointer, args.steps, args.world_size, max(1, args.repeat), scratch)
        except RuntimeError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        torchrun_s = None if args.no_torchrun else _torchrun(args.world_size, args.steps, scratch)
        report["torchrun_plain_launch_s"] = None if torchrun_s is None else round(torchrun_s, 3)
        report["ratio_scenario_to_torchrun"] = (None if torchrun_s is None
                                                else round(report["scenario_golden_cached_s"] / torchrun_s, 3))
        from rich.console import Console
        from rich.table import Table

        console = Console()
        phases = Table(title=f"where a kill scenario's time goes (median of {len(report['scenario_runs_s'])} runs; "
                             f"rank 0's events)")
        for col in ("phase", "count", "min s", "median s", "max s"):
            phases.add_column(col, justify="left" if col == "phase" else "right")
        for name, row in report["phases_s"].items():
            phases.add_row(name, str(row["count"]), f"{row['min']:.3f}", f"{row['median']:.3f}", f"{row['max']:.3f}")
        console.print(phases)
        groups = Table(title="the same phases by who spends them")
        for col in ("group", "min s", "median s", "max s"):
            groups.add_column(col, justify="left" if col == "group" else "right")
        for name, row in report["groups_s"].items():
            groups.add_row(name, f"{row['min']:.3f}", f"{row['median']:.3f}", f"{row['max']:.3f}")
        console.print(groups)
        table = Table(title="launch benchmark (launch, kill, restart, resume, final load, verdict)")
        table.add_column("measure")
        table.add_column("value", justify="right")
        for key, value in report.items():
            if key not in ("phases_s", "groups_s"):
                table.add_row(key, str(value))
        console.print(table)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
