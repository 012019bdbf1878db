"""``chaos bench scale``: how the harness's costs grow, as one Markdown table set for README.

Four measurements, each made by the bench that owns it (nothing is re-implemented here):

* **kill scenario by world size** (1, 2, 4, 8 ranks): ``chaos bench launch``'s scenario
  (``run_scenario`` with the golden run cached, as ``chaos.bench.launch`` runs it)
  at each world size, its verdicts shown beside the seconds. On a machine with fewer
  cores than ranks the ranks are oversubscribed, and the table says so per row;
* **save, stall and load by state size** (10 MB, 100 MB, 1 GB): ``chaos bench``
  (``chaos.bench.save.run_bench``) with the reference sync and async saves against
  DCP's ``save`` and ``async_save``, every figure min / median / max over the repeats,
  ratios per repeat pair;
* **crash states by shard count** (2, 4, 8 ranks, one shard each): ``chaos
  bench-crashstates`` (``chaos.bench.crashstates``) on the reference's save at each
  world size, sampling the same number of states at every size (``--exhaustive-limit 0``)
  so the rates compare; ``--crash-exhaustive`` keeps that bench's own default;
* **campaign scenarios per minute**: the bare ``chaos run`` family campaign (one
  scenario per fault family) as a user runs it, in a fresh process with a fresh golden
  cache, or with ``--campaign-args`` a fixed short campaign of your choosing.

::

    chaos bench scale --markdown scale.md --json scale.json     # everything (~10-15 min on 2 idle cores)
    chaos bench scale --quick                                    # 1-2 ranks, 10 MB, 2 shards, a short campaign
    chaos bench scale --sections save --sizes-mb 10,100 --repeats 7

Exit 0 when every measurement ran and every check in it held (scenarios passed, loads
bit-exact, no crash-state violation), 1 otherwise (the row says which); bad options are
a ConfigError (exit 2). Called by ``chaos.cli.main`` as the ``bench scale`` subcommand;
:func:`measure` and :func:`to_markdown` are what a test or a script uses.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chaos.bench.ranks import spread, triple
from chaos.errors import ConfigError
from chaos.scratch import make_root

NAME = "scale"  # `chaos bench scale`
HELP = "how cost grows: kill scenario by world size, save/stall/load by size, crash states by shards, campaign rate"

SECTIONS = ("kill", "save", "crash", "campaign")
SAVE_CHECKPOINTERS = ("reference", "reference-async", "dcp", "dcp-async")
DEFAULTS: dict[str, Any] = {"world_sizes": (1, 2, 4, 8), "sizes_mb": (10.0, 100.0, 1000.0), "shards": (2, 4, 8),
                            "repeats": 7, "kill_repeats": 3, "max_states": 500, "campaign_args": ""}
QUICK: dict[str, Any] = {"world_sizes": (1, 2), "sizes_mb": (10.0,), "shards": (2,), "repeats": 3,
                         "kill_repeats": 1, "max_states": 60, "campaign_args": "--steps 16 --save-every 4"}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"which measurements, comma-separated (default: {','.join(SECTIONS)})")
    p.add_argument("--quick", action="store_true",
                   help="small defaults for a quick look (~2 min on 2 cores): world sizes 1,2 with one timed kill "
                        "scenario each; 10 MB with 3 repeats; 2 shards, 60 crash states; a 16-step campaign "
                        "(options given explicitly still win)")
    p.add_argument("--world-sizes", type=_ints, default=None, metavar="N,N",
                   help="kill scenario world sizes (default 1,2,4,8)")
    p.add_argument("--kill-checkpointer", default="torch-save",
                   help="checkpointer of the kill scenario (default torch-save, as chaos bench launch)")
    p.add_argument("--kill-repeats", type=int, default=None, help="timed kill scenarios per world size (default 3)")
    p.add_argument("--kill-steps", type=int, default=40, help="steps of the kill scenario's job (default 40, as chaos bench launch)")
    p.add_argument("--sizes-mb", type=_floats, default=None, metavar="MB,MB",
                   help="state sizes for save/stall/load (default 10,100,1000)")
    p.add_argument("--repeats", type=int, default=None, help="chaos bench repeats per size (default 7)")
    p.add_argument("--bench-world-size", type=int, default=2, help="ranks of the save/stall/load bench (default 2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the save/stall/load bench keeps its state (chaos bench --device)")
    p.add_argument("--shards", type=_ints, default=None, metavar="N,N",
                   help="crash states: world sizes of the recorded reference save, one shard per rank (default 2,4,8)")
    p.add_argument("--max-states", type=int, default=None, help="crash states sampled per save (default 500)")
    p.add_argument("--crash-exhaustive", action="store_true",
                   help="let chaos bench crashstates enumerate every state where it would (its default limit) "
                        "instead of the same sample size at every shard count")
    p.add_argument("--campaign-args", default=None, metavar="ARGS",
                   help="extra `chaos run` arguments for the campaign, one string (default: none, the bare "
                        "family campaign; e.g. '--steps 16 --save-every 4')")
    p.add_argument("--dir", default=None, help="scratch and the disk the save bench measures (default: system temp)")
    p.add_argument("--json", metavar="PATH", help="also write every measurement as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the tables as Markdown")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The resolved settings: explicit options, else ``--quick``'s, else the defaults; ConfigError if impossible."""
    base = QUICK if args.quick else DEFAULTS
    chosen = {k: getattr(args, k) if getattr(args, k, None) is not None else v for k, v in base.items()}
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown or not sections:
        raise ConfigError(f"chaos bench scale: unknown --sections {', '.join(unknown) or '(none)'}: "
                          f"choose from {', '.join(SECTIONS)}")
    if any(n < 1 for n in chosen["world_sizes"]) or not chosen["world_sizes"]:
        raise ConfigError("chaos bench scale: --world-sizes must be positive integers")
    if any(s <= 0 for s in chosen["sizes_mb"]) or not chosen["sizes_mb"]:
        raise ConfigError("chaos bench scale: --sizes-mb must be positive")
    if any(n < 1 for n in chosen["shards"]) or not chosen["shards"]:
        raise ConfigError("chaos bench scale: --shards must be positive integers")
    for key in ("repeats", "kill_repeats", "max_states"):
        if chosen[key] < 1:
            raise ConfigError(f"chaos bench scale: --{key.replace('_', '-')} must be at least 1")
    if args.bench_world_size < 1:
        raise ConfigError("chaos bench scale: --bench-world-size must be at least 1")
    try:
        campaign = shlex.split(chosen["campaign_args"])
    except ValueError as exc:
        raise ConfigError(f"chaos bench scale: --campaign-args: {exc}") from None
    if "--" in campaign or any(a in ("--json", "--scratch", "--cache-dir") for a in campaign):
        raise ConfigError("chaos bench scale: --campaign-args sets the campaign, not a job (--) or where results go")
    if args.kill_steps < 2:
        raise ConfigError("chaos bench scale: --kill-steps must be at least 2 (the kill comes after a save)")
    return {**chosen, "sections": sections, "campaign": campaign, "kill_checkpointer": args.kill_checkpointer,
            "kill_steps": args.kill_steps,
            "bench_world_size": args.bench_world_size, "device": args.device,
            "crash_exhaustive": args.crash_exhaustive, "dir": args.dir}


# ----------------------------------------------------------------- the measurements
def _quiet(fn: Any, *a: Any) -> tuple[Any, str]:
    """``fn(*a)`` with its printing captured: (its value, what it printed)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        value = fn(*a)
    return value, buf.getvalue()


def _subcommand(module: Any, argv: list[str], json_path: str) -> tuple[int, dict[str, Any] | None, str]:
    """Run a bench subcommand in this process as its CLI would (its own parser, so its defaults);
    return (exit status, its ``--json`` document or None, what it printed)."""
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args([*argv, "--json", json_path])
    try:
        rc, printed = _quiet(module.run, args)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the row reports it; the other measurements still run
        return 2, None, f"{type(exc).__name__}: {exc}"
    doc = json.loads(Path(json_path).read_text()) if os.path.exists(json_path) else None
    return int(rc), doc, printed


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())


def measure_kill(world_sizes: tuple[int, ...], checkpointer: str, repeats: int, steps: int,
                 work: str) -> list[dict[str, Any]]:
    """One kill scenario per world size, golden run cached: ``chaos bench launch``'s scenario, timed the same way.

    ``run_scenario`` directly, as ``chaos.bench.launch`` does (a kill of the last
    rank at 57.5 % of the steps; the first run computes and caches the golden run, the
    next ``repeats`` are timed), but a scenario whose verdict is not ``pass`` is timed
    too and its verdict shown: its cost is still the cost (bench-launch stops there).
    """
    from chaos.bench.launch import kill_scenario, kill_step
    from chaos.run.runner import RunOptions, run_scenario

    cores = os.cpu_count() or 1
    rows = []
    for n in world_sizes:
        scratch = Path(work) / f"kill-{n}"
        scratch.mkdir(parents=True, exist_ok=True)
        options = RunOptions(scratch_base=str(scratch), cache_dir=scratch / "golden")
        scenario = kill_scenario(checkpointer, n, steps)
        row: dict[str, Any] = {"world_size": n, "cores": cores, "ranks_per_core": round(n / cores, 2),
                               "oversubscribed": n > cores, "kill_step": kill_step(steps), "steps": steps}
        try:
            t0 = time.perf_counter()
            first = run_scenario(scenario, options)  # runs and caches the golden run
            row["first_with_golden_s"] = time.perf_counter() - t0
            times, results = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                results.append(run_scenario(scenario, options))
                times.append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - the row reports it; the other measurements still run
            row.update(ok=False, error=f"{type(exc).__name__}: {exc}")
            _progress(f"kill scenario, {n} rank(s): {row['error']}")
            rows.append(row)
            continue
        verdicts = [r.verdict for r in [first, *results]]
        failing = sorted({o.name for r in [first, *results] for o in r.failing()})
        row.update(ok=all(v == "pass" for v in verdicts), seconds=spread(times), verdicts=verdicts,
                   failing_oracles=failing, replay=first.replay)
        if not row["ok"]:
            bad = next(r for r in [first, *results] if r.verdict != "pass")
            why = bad.failing()[0].summary if bad.failing() else (bad.error or bad.verdict)
            row["error"] = f"{bad.verdict}: {why}"
        _progress(f"kill scenario, {n} rank(s): {triple(row['seconds'])} s, verdicts {', '.join(verdicts)}")
        rows.append(row)
    return rows


def measure_save(sizes_mb: tuple[float, ...], repeats: int, world_size: int, device: str,
                 root: str | None) -> list[dict[str, Any]]:
    """``chaos bench`` at each size: reference sync/async against DCP save/async_save."""
    from chaos.bench import checkpoint as bench
    from chaos.bench import save as bench_cmd

    rows = []
    for mb in sizes_mb:
        cfg = bench.BenchConfig(size_mb=mb, world_size=world_size, checkpointers=SAVE_CHECKPOINTERS,
                                repeats=repeats, root=root, device=device)
        try:
            report, _ = _quiet(bench_cmd.run_bench, cfg)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - the row reports it
            rows.append({"size_mb": mb, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            _progress(f"save/stall/load at {mb:g} MB: {rows[-1]['error']}")
            continue
        ok = all(r.get("skipped") is None and r["correct"] for r in report["results"])
        rows.append({"size_mb": mb, "ok": ok, "payload_bytes": report["payload_bytes"], "raw": report["raw"],
                     "results": report["results"], "ratios": report["ratios"],
                     "ratio_spread": report["ratio_spread"], "world_size": world_size, "repeats": repeats,
                     "device": device})
        _progress(f"save/stall/load at {mb:g} MB: reference save {triple(_by(rows[-1])['reference']['spread']['save_s'])} s"
                  if ok else f"save/stall/load at {mb:g} MB: a checkpointer was skipped or loaded wrong")
    return rows


def _by(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in row.get("results", [])}


def measure_crash(shards: tuple[int, ...], max_states: int, exhaustive: bool, work: str) -> list[dict[str, Any]]:
    """Crash states of one reference save per shard count, by ``chaos bench crashstates``."""
    from chaos.bench import crashstates as crashbench

    rows = []
    for n in shards:
        path = os.path.join(work, f"crash-{n}.json")
        argv = ["--world-size", str(n), "--max-states", str(max_states)]
        if not exhaustive:
            argv += ["--exhaustive-limit", "0"]
        rc, doc, printed = _subcommand(crashbench, argv, path)
        row: dict[str, Any] = {"shards": n, "ok": rc == 0 and doc is not None}
        if doc is not None:
            cpu = doc.get("cpu") or {}
            row.update({k: doc.get(k) for k in ("checkpointer", "total_possible", "states_generated", "states_distinct",
                                                 "states_checked", "states_pruned", "exhaustive", "states_per_s",
                                                 "checked_per_s", "total_seconds", "violation_count", "passed")})
            row["cpu_ms_per_state"] = cpu.get("per_state_ms")
            row["load_avg_1m"] = cpu.get("load_avg_1m")
        if not row["ok"]:
            row["error"] = _tail(printed) or f"chaos bench crashstates exited {rc}"
        _progress(f"crash states, {n} shards: {row.get('states_per_s')} states/s"
                  + ("" if row["ok"] else f" ({row['error']})"))
        rows.append(row)
    return rows


def measure_campaign(extra: list[str], work: str) -> dict[str, Any]:
    """The ``chaos run`` campaign in a fresh process and golden cache, as a user's first run pays it."""
    results = os.path.join(work, "campaign.json")
    argv = [sys.executable, "-m", "chaos.cli.main", "run", "--json", results, "--scratch", os.path.join(work, "campaign"),
            "--cache-dir", os.path.join(work, "campaign-golden"), *extra]
    os.makedirs(os.path.join(work, "campaign"), exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"command": " ".join(["chaos", "run", *extra]), "exit": proc.returncode, "wall_s": wall}
    try:
        doc = json.loads(Path(results).read_text())
    except (OSError, ValueError):
        out.update(ok=False, error=_tail(proc.stderr or proc.stdout) or f"chaos run exited {proc.returncode}")
        _progress(f"campaign: {out['error']}")
        return out
    seconds = [float(s.get("seconds") or 0.0) for s in doc.get("scenarios", [])]
    verdicts: dict[str, int] = {}
    for s in doc.get("scenarios", []):
        verdicts[s.get("verdict", "?")] = verdicts.get(s.get("verdict", "?"), 0) + 1
    n = len(seconds)
    rest = seconds[1:]
    out.update(ok=proc.returncode in (0, 1) and n > 0, scenarios=n, verdicts=verdicts, scenario_seconds=seconds,
               per_minute=60.0 * n / wall if wall > 0 else None,
               after_first_s=statistics.median(rest) if rest else None,
               per_minute_after_first=60.0 * len(rest) / sum(rest) if rest and sum(rest) > 0 else None)
    if proc.returncode not in (0, 1):
        out["error"] = _tail(proc.stderr) or f"chaos run exited {proc.returncode}"
    _progress(f"campaign: {n} scenarios in {wall:.1f} s ({out['per_minute']:.1f} per minute)" if n else "campaign: none ran")
    return out


def _progress(line: str) -> None:
    print(f"bench scale: {line}", file=sys.stderr, flush=True)


def measure(s: dict[str, Any]) -> dict[str, Any]:
    """Every chosen section, in order, under one scratch directory (removed after); the JSON document."""
    import platform

    doc: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_avg_before": [round(x, 2) for x in os.getloadavg()]},
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.items()},
    }
    try:
        import torch

        doc["machine"]["torch"] = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    work = make_root("chaos-bench-scale-", s["dir"])
    try:
        t0 = time.perf_counter()
        if "kill" in s["sections"]:
            doc["kill"] = measure_kill(s["world_sizes"], s["kill_checkpointer"], s["kill_repeats"], s["kill_steps"], work)
        if "save" in s["sections"]:
            doc["save"] = measure_save(s["sizes_mb"], s["repeats"], s["bench_world_size"], s["device"], s["dir"])
        if "crash" in s["sections"]:
            doc["crash"] = measure_crash(s["shards"], s["max_states"], s["crash_exhaustive"], work)
        if "campaign" in s["sections"]:
            doc["campaign"] = measure_campaign(s["campaign"], work)
        doc["seconds"] = round(time.perf_counter() - t0, 1)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    doc["machine"]["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    doc["ok"] = all(r["ok"] for key in ("kill", "save", "crash") for r in doc.get(key, [])) and \
        doc.get("campaign", {"ok": True})["ok"]
    return doc


# ----------------------------------------------------------------- the tables
def _ratio(row: dict[str, Any], key: str) -> str:
    s = (row.get("ratio_spread") or {}).get(key)
    return "-" if not s else f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def _size(mb: float) -> str:
    return f"{mb / 1000:g} GB" if mb >= 1000 else f"{mb:g} MB"


def to_markdown(doc: dict[str, Any]) -> str:
    """The tables README's *How cost grows* shows, with the date, the machine and each bench's command."""
    from chaos.bench.launch import kill_step

    m = doc["machine"]
    st = doc["settings"]
    lines = [f"### How cost grows (`chaos bench scale`, {doc['date']})", "",
             f"{m['cpus']} CPU core(s), torch {m.get('torch', '?')}; load average {m['load_avg_before']} before, "
             f"{m['load_avg_after']} after; {doc.get('seconds', '?')} s in all. Every figure is min / median / max "
             f"over its repeats.", ""]
    if "kill" in doc:
        lines += [f"**One kill scenario, golden run cached** (chaos bench launch's scenario: `chaos run --checkpointer "
                  f"{st['kill_checkpointer']} --steps {st['kill_steps']} --world-size N --fault "
                  f"kill:rank=N-1,step={kill_step(st['kill_steps'])}`, {st['kill_repeats']} timed "
                  f"run{'s' * (st['kill_repeats'] != 1)} after the one that computes the golden run: launch, kill, "
                  f"restart, resume, final load, verdict; verdicts of every run):", "",
                  "| world size | ranks per core | scenario s (min / med / max) | first run, with the golden run s | "
                  "verdicts |", "|---:|---|---:|---:|---|"]
        notes = []
        for r in doc["kill"]:
            per_core = f"{r['ranks_per_core']:g}" + (f" (oversubscribed: {r['world_size']} ranks on {r['cores']} cores)"
                                                    if r["oversubscribed"] else "")
            if "seconds" not in r:
                lines.append(f"| {r['world_size']} | {per_core} | failed: {r.get('error')} | - | - |")
                continue
            first = r.get("first_with_golden_s")
            counts: dict[str, int] = {}
            for v in r["verdicts"]:
                counts[v] = counts.get(v, 0) + 1
            verdicts = ", ".join(f"{k} x{c}" if c > 1 else k for k, c in counts.items())
            if r.get("failing_oracles"):
                verdicts += f" ({', '.join(r['failing_oracles'])})"
                notes.append(f"World size {r['world_size']}: {r['error']}")
            lines.append(f"| {r['world_size']} | {per_core} | {triple(r['seconds'])} | "
                         f"{'-' if first is None else f'{first:.3f}'} | {verdicts} |")
        lines += ["", *notes, ""] if notes else [""]
    if "save" in doc:
        ws = st["bench_world_size"]
        dev = " --device cuda" if st.get("device") == "cuda" else ""
        lines += [f"**Save, stall and load by state size** (`chaos bench --only {','.join(SAVE_CHECKPOINTERS)} "
                  f"--repeats {st['repeats']} --world-size {ws}{dev} --size-mb S`; stall = how long `save()` blocks "
                  f"training; every load checked bit-exact):", "",
                  "| state | checkpointer | save s | stall s | load s | save MB/s (median) |", "|---|---|---:|---:|---:|---:|"]
        for row in doc["save"]:
            if not row["ok"] and "results" not in row:
                lines.append(f"| {_size(row['size_mb'])} | failed: {row['error']} | | | | |")
                continue
            for r in row["results"]:
                if r.get("skipped"):
                    lines.append(f"| {_size(row['size_mb'])} | {r['name']} | skipped: {r['skipped']} | | | |")
                    continue
                sp = r["spread"]
                bad = "" if r["correct"] else " (load NOT bit-exact)"
                lines.append(f"| {_size(row['size_mb'])} | {r['name']}{bad} | {triple(sp['save_s'])} | "
                             f"{triple(sp['stall_s'])} | {triple(sp['load_s'])} | {r['save_mb_s']:.0f} |")
        lines += ["", "Ratios per repeat pair, median (min-max):", "",
                  "| state | raw write+fsync MB/s | reference save / raw | DCP save s / reference save s | "
                  "async stall / DCP async stall | reference load / DCP load |", "|---|---:|---:|---:|---:|---:|"]
        for row in doc["save"]:
            if "raw" not in row:
                continue
            lines.append(f"| {_size(row['size_mb'])} | {triple(row['raw'].get('mb_s_spread'), '{:.0f}')} | "
                         f"{_ratio(row, 'reference_vs_raw')} | {_ratio(row, 'reference_vs_dcp_save')} | "
                         f"{_ratio(row, 'async_stall_vs_dcp_async')} | {_ratio(row, 'verified_load_vs_dcp_load')} |")
        lines.append("")
    if "crash" in doc:
        how = ("`chaos bench crashstates --world-size N`" if st["crash_exhaustive"] else
               f"`chaos bench crashstates --world-size N --max-states {st['max_states']} --exhaustive-limit 0`: the "
               f"same sample size at every shard count")
        names = sorted({str(r.get("checkpointer")).rsplit(":", 1)[-1] for r in doc["crash"] if r.get("checkpointer")})
        lines += [f"**Power-loss crash states of one save** ({', '.join(names) or 'reference'}, {how}; every state "
                  f"recovered by the real loader in warm rank groups and judged):", "",
                  "| shards (ranks) | combinations | generated | distinct | checked | pruned | states/s wall | "
                  "ms CPU per checked state | violations |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in doc["crash"]:
            if r.get("states_generated") is None:
                lines.append(f"| {r['shards']} | failed: {r['error']} | | | | | | | |")
                continue
            lines.append(f"| {r['shards']} | {r['total_possible']} | {r['states_generated']} | {r['states_distinct']} | "
                         f"{r['states_checked']} | {r['states_pruned']} | {r['states_per_s']} | "
                         f"{r['cpu_ms_per_state']} | {r['violation_count']} |")
        lines.append("")
    if "campaign" in doc:
        c = doc["campaign"]
        lines += [f"**Campaign** (`{c['command']}` in a fresh process with a fresh golden cache, as a first run pays it):",
                  ""]
        if c.get("scenarios"):
            verdicts = ", ".join(f"{n} {v}" for v, n in sorted(c["verdicts"].items()))
            after = "-" if c["after_first_s"] is None else f"{c['after_first_s']:.1f}"
            per_after = "-" if c["per_minute_after_first"] is None else f"{c['per_minute_after_first']:.1f}"
            lines += ["| scenarios | verdicts | wall s | scenarios per minute | s per scenario after the first "
                      "(median) | per minute after the first |", "|---:|---|---:|---:|---:|---:|",
                      f"| {c['scenarios']} | {verdicts} | {c['wall_s']:.1f} | {c['per_minute']:.1f} | {after} | "
                      f"{per_after} |"]
        else:
            lines.append(f"failed: {c.get('error')}")
        lines.append("")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Measure, print the Markdown, write ``--json`` / ``--markdown``; 0 when everything ran and held."""
    s = settings(args)
    if s["device"] == "cuda" and "save" in s["sections"]:
        from chaos.bench import checkpoint as bench

        bench.validate(bench.BenchConfig(world_size=s["bench_world_size"], device="cuda"))  # before anything runs
    doc = measure(s)
    text = to_markdown(doc)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0 if doc["ok"] else 1
