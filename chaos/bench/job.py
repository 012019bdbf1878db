"""``chaos bench job``: our job mode side by side with the peer tool ckpt-chaos, on the same scripts.

Both tools put the same unmodified command (``python SCRIPT --out {out}``) under
chaos: ours as ``chaos run -- COMMAND``, theirs as ``ckpt-chaos run -- COMMAND``
(ckpt-chaos 0.1.8, the dev extra), with the same number of ranks, the same point
budget (``--max-points``; ckpt-chaos splits it evenly between its modes) and the
same point concurrency. Each repeat runs both back to back (which one goes first
alternates), so the ratio ours/theirs of a repeat compares two runs made at the same
moment of a shared machine::

    chaos bench job                                    # both shipped pure-Python examples, 3 repeats
    chaos bench job --script train.py --repeat 5 --markdown bench.md --json bench.json

Per script and tool it reports wall time (total, and per point run: min / median /
max over the repeats), points run, the fault kinds explored (ours: each scenario's
``faults[].kind`` with ``params.when``, so kinds other modules add show up unasked;
theirs: each point's mode), the file-event kinds hit, verdict counts, points whose
fault did nothing (ours: skipped; theirs: ``crashed`` false, still judged) and
whether the tool found a defect (any failing point). Verdicts are shown in our
vocabulary (pass, hard_failure, silent_divergence, lost_work); the JSON keeps theirs.

Everything either tool writes goes below one scratch root (``--scratch``, default the
system temp): our ``--scratch``, ckpt-chaos's ``--work`` folder and its JUnit file,
and both tools run there as their working directory with ``TMPDIR`` inside it. The
root is removed at the end unless ``--keep``. Exit 0 when every run of both tools
completed (whatever the verdicts), 2 when a tool could not run or the input is bad.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Any

from chaos.errors import ConfigError
from chaos.judge.job import FAILURES
from chaos.scratch import make_root

NAME = "job"  # `chaos bench job`
HELP = "run our job mode and the peer ckpt-chaos on the same scripts, side by side, and compare"

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DEFAULT_SCRIPTS = (EXAMPLES / "careless_job.py", EXAMPLES / "careful_job.py")
PEER = "ckpt-chaos"
PEER_MODULE = "ckpt_chaos"
PEER_MODES = "before,torn,term,unsynced"  # every mode ckpt-chaos 0.1.8 has (its own default: before,torn)
PEER_VERDICTS = ("PASS", "HARD_FAIL", "SILENT_DIVERGENCE", "LOST_WORK", "CONTROL_FAIL")
# their verdict -> our outcome (CONTROL_FAIL: the fault-free control run failed; we call that a harness error)
TO_OURS = {"PASS": "pass", "HARD_FAIL": "hard_failure", "SILENT_DIVERGENCE": "silent_divergence",
           "LOST_WORK": "lost_work", "CONTROL_FAIL": "error"}
FAILING = ("hard_failure", "silent_divergence", "lost_work")
_EVENTS_LINE = re.compile(r"(\d+) file events -> (\d+) crash points")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--script", action="append", default=[], metavar="PATH",
                   help="a Python training script taking --out DIR (repeatable; default: the shipped "
                        "careless_job.py and careful_job.py)")
    p.add_argument("--repeat", type=int, default=3, metavar="R", help="runs of each tool per script (default 3)")
    p.add_argument("--max-points", type=int, default=16, metavar="N",
                   help="points each tool runs per script (default 16)")
    p.add_argument("--ranks", type=int, default=1, metavar="N",
                   help="copies with torchrun's environment, for both tools (default 1: one plain process)")
    p.add_argument("--jobs", type=int, default=1, metavar="J", help="points run concurrently, both tools (default 1)")
    p.add_argument("--seed", type=int, default=0, help="our sampling seed, the same in every repeat (default 0)")
    p.add_argument("--modes", default=None, metavar="M,...", help="our --modes (default: ours, all of them)")
    p.add_argument("--faults", default=None, metavar="K,...", help="our --faults (default: every kind that applies)")
    p.add_argument("--materialize", action=argparse.BooleanOptionalAction, default=True,
                   help="our points' first attempts rebuilt from the fault-free trace where it says it all "
                        "(default, as in chaos run); --no-materialize runs every one to the point")
    p.add_argument("--peer-modes", default=PEER_MODES, metavar="M,...",
                   help=f"ckpt-chaos's --modes (default {PEER_MODES}: all it has)")
    p.add_argument("--result-file", default=None, metavar="NAME",
                   help="the result file under {out} both compare with the fault-free run (default final.json, "
                        "or final-rank*.json with --ranks > 1; ckpt-chaos takes one file: * becomes 0)")
    p.add_argument("--timeout", type=int, default=300, metavar="S", help="seconds per attempt, both tools")
    p.add_argument("--markdown", metavar="FILE", help="also write the Markdown table here")
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON here")
    p.add_argument("--scratch", metavar="DIR", help="parent of the scratch root (default: system temp)")
    p.add_argument("--keep", action="store_true", help="keep the scratch root (both tools' work folders)")


@dataclass
class ToolRun:
    """One run of one tool on one script: what it did, as read from its own output files."""

    tool: str
    repeat: int
    first: bool                      # ran first in its repeat
    wall_s: float
    returncode: int
    points: int = 0                  # crash points run (ckpt-chaos's control run not counted)
    points_found: int | None = None  # ours: points found in the fault-free trace (ckpt-chaos does not say)
    file_events: int | None = None   # traced file events of the fault-free run (ours: all ranks; theirs: crash rank)
    kinds: dict[str, int] = field(default_factory=dict)     # fault kind (ours kind[:when], theirs mode) -> points
    events: dict[str, int] = field(default_factory=dict)    # file-event kind hit -> points
    verdicts: dict[str, int] = field(default_factory=dict)  # in the tool's own vocabulary
    outcomes: dict[str, int] = field(default_factory=dict)  # in ours: pass, hard_failure, ...
    not_fired: int = 0               # points whose fault did nothing (ours: skipped; theirs: crashed false)
    failing: int = 0
    example_failure: str | None = None   # the worst failing point (ours) or the first (theirs), in the tool's words
    example_evidence: str | None = None  # ... and why it failed (ours: the summary; theirs: the resume's last line)
    error: str | None = None

    @property
    def per_point_s(self) -> float | None:
        return self.wall_s / self.points if self.points else None


def _command(script: Path) -> list[str]:
    return [sys.executable, str(script), "--out", "{out}"]


def _result_names(args: argparse.Namespace) -> tuple[str, str]:
    """(ours: a glob under {out}, theirs: one file under {out})."""
    ours = args.result_file or ("final-rank*.json" if args.ranks > 1 else "final.json")
    return ours, ours.replace("*", "0")


def _env(where: Path) -> dict[str, str]:
    tmp = where / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def _timed(argv: list[str], where: Path, limit: float) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=where, env=_env(where), capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        proc = subprocess.CompletedProcess(argv, -9, str(exc.stdout or ""), f"timed out after {limit:g} s")
    return time.perf_counter() - t0, proc


def _tail(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (proc.stderr or proc.stdout or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else f"exit {proc.returncode}, no output"


def _limit(args: argparse.Namespace) -> float:
    """A whole tool run's wall-clock cap: every point's attempts at their timeout, plus the fault-free runs."""
    return float(args.timeout) * (2 * args.max_points + 4)


def run_ours(script: Path, args: argparse.Namespace, where: Path, repeat: int, first: bool) -> ToolRun:
    """``chaos run -- python SCRIPT --out {out}`` in a subprocess; read back from its results JSON."""
    where.mkdir(parents=True)
    results = where / "results.json"
    ours_result, _ = _result_names(args)
    argv = [sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(where), "--json", str(results),
            "--seed", str(args.seed), "--max-points", str(args.max_points), "--jobs", str(args.jobs),
            "--timeout", str(args.timeout), "--result-file", ours_result]
    if args.ranks > 1:
        argv += ["--ranks", str(args.ranks)]
    if args.modes:
        argv += ["--modes", args.modes]
    if getattr(args, "faults", None):
        argv += ["--faults", args.faults]
    if not getattr(args, "materialize", True):
        argv += ["--no-materialize"]
    wall, proc = _timed([*argv, "--", *_command(script)], where, _limit(args))
    run = ToolRun("chaos", repeat, first, round(wall, 3), proc.returncode)
    if proc.returncode not in (0, 1) or not results.exists():
        run.error = _tail(proc)
        return run
    return read_ours(json.loads(results.read_text()), run)


def read_ours(doc: dict[str, Any], run: ToolRun) -> ToolRun:
    """Fill ``run`` from our results JSON (``chaos run --json``)."""
    scenarios = doc.get("scenarios", [])
    kinds: Counter[str] = Counter()
    events: Counter[str] = Counter()
    for s in scenarios:
        for f in s.get("faults", []):
            params = f.get("params") or {}
            when = params.get("when")
            kinds[f"{f['kind']}:{when}" if when and when != f["kind"] else f["kind"]] += 1
            if params.get("event"):
                events[params["event"]] += 1
    run.points = len(scenarios)
    job = doc.get("job", {})
    run.points_found = job.get("points_found")
    run.file_events = sum((job.get("reference", {}).get("file_events") or {}).values()) or None
    run.kinds, run.events = dict(sorted(kinds.items())), dict(sorted(events.items()))
    run.verdicts = {k: v for k, v in doc.get("summary", {}).items() if k != "total" and v}
    run.outcomes = dict(sorted(Counter(s.get("outcome", s["verdict"]) for s in scenarios).items()))
    run.not_fired = sum(1 for s in scenarios if s["verdict"] == "skipped")
    # the worst first (chaos.judge.job.FAILURES' order), then in the document's order
    bad = sorted((s for s in scenarios if s["verdict"] == "fail"),
                 key=lambda s: FAILURES.index(s["outcome"]) if s.get("outcome") in FAILURES else len(FAILURES))
    run.failing = len(bad)
    if bad:
        params = (bad[0].get("faults") or [{}])[0].get("params") or {}
        where = f" ({params['event']} {params.get('path', '')})" if params.get("event") else ""
        run.example_failure = f"{bad[0]['outcome']} {bad[0]['id']}{where}"
        run.example_evidence = (bad[0].get("summary") or "")[:300]
    errors = [s for s in scenarios if s["verdict"] == "error"]
    if errors:
        run.error = f"{len(errors)} point(s) erred: {errors[0].get('summary', '')}"[:300]
    return run


def run_peer(script: Path, args: argparse.Namespace, where: Path, repeat: int, first: bool) -> ToolRun:
    """``ckpt-chaos run -- python SCRIPT --out {out}``; read back from its work folder and JUnit XML."""
    where.mkdir(parents=True)
    work, junit = where / "work", where / "junit.xml"
    _, peer_result = _result_names(args)
    argv = [sys.executable, "-m", PEER_MODULE, "run", "--work", str(work), "--junit", str(junit),
            "--fail-on", ",".join(PEER_VERDICTS[1:]),  # every non-PASS verdict is a JUnit failure: all are named
            "--max-points", str(args.max_points), "--jobs", str(args.jobs), "--timeout", str(args.timeout),
            "--modes", args.peer_modes, "--result-file", "{out}/" + peer_result]
    if args.ranks > 1:
        argv += ["--ranks", str(args.ranks)]
    wall, proc = _timed([*argv, "--", *_command(script)], where, _limit(args))
    run = ToolRun(PEER, repeat, first, round(wall, 3), proc.returncode)
    if proc.returncode not in (0, 1) or not junit.exists():
        run.error = _tail(proc)
        return run
    return read_peer(work, junit, proc.stdout, run)


def read_peer(work: Path, junit: Path, stdout: str, run: ToolRun) -> ToolRun:
    """Fill ``run`` from ckpt-chaos's output: JUnit XML (a test case per point, the verdict in a
    failure's message), each point's ``pt_*/result.json`` (mode, event, whether it crashed) and the
    ``N file events -> M crash points`` line it prints."""
    root = ET.parse(junit).getroot()
    if root.get("errors") not in (None, "0"):
        run.error = "ckpt-chaos could not run: " + " ".join((root.findtext(".//error") or "").split())[:300]
        return run
    verdict_of: dict[str, str] = {}
    for case in root.iter("testcase"):
        failure = case.find("failure")
        verdict_of[case.get("name", "")] = (failure.get("message", "").split(":")[0] if failure is not None
                                            else "PASS")
    kinds: Counter[str] = Counter()
    events: Counter[str] = Counter()
    verdicts: Counter[str] = Counter()
    not_fired, first_bad = 0, None
    for path in sorted(glob.glob(str(work / "pt_*" / "result.json"))):
        rec = json.loads(Path(path).read_text())
        verdict = verdict_of.get(rec.get("label", ""), "?")
        if "point" not in rec:  # the fault-free control run
            if verdict != "PASS":
                run.error = f"ckpt-chaos's control run: {verdict}"
            continue
        kinds[rec["point"][1]] += 1
        events[rec.get("event", ["?"])[0]] += 1
        verdicts[verdict] += 1
        not_fired += 0 if rec.get("crashed") else 1
        if TO_OURS.get(verdict) in FAILING and first_bad is None:
            first_bad = f"{verdict} {rec['label']}"
            tail = [ln for ln in (rec.get("resume_tail") or "").splitlines() if ln.strip()]
            run.example_evidence = tail[-1][:300] if tail else None
    run.points = sum(verdicts.values())
    m = _EVENTS_LINE.search(stdout or "")
    if m:  # the events of the crash rank; it prints only the points it chose, not how many it could have
        run.file_events = int(m.group(1))
    run.kinds, run.events, run.verdicts = dict(sorted(kinds.items())), dict(sorted(events.items())), dict(verdicts)
    run.outcomes = dict(sorted(Counter({TO_OURS.get(v, v): n for v, n in verdicts.items()}).items()))
    run.not_fired = not_fired
    run.failing = sum(n for v, n in verdicts.items() if TO_OURS.get(v) in FAILING)
    run.example_failure = first_bad
    return run


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3)}


def _union(runs: list[ToolRun], attr: str) -> dict[str, int]:
    total: Counter[str] = Counter()
    for r in runs:
        total.update(getattr(r, attr))
    return dict(sorted(total.items()))


def summarize(runs: list[ToolRun]) -> dict[str, Any]:
    """One tool on one script over its repeats."""
    ok = [r for r in runs if r.error is None]
    return {
        "repeats": len(runs), "completed": len(ok),
        "wall_s": _spread([r.wall_s for r in ok]),
        "wall_total_s": round(sum(r.wall_s for r in runs), 3),
        "points": sorted({r.points for r in ok}),
        "per_point_s": _spread([r.per_point_s for r in ok if r.per_point_s is not None]),
        "points_found": sorted({r.points_found for r in ok if r.points_found is not None}),
        "file_events": sorted({r.file_events for r in ok if r.file_events is not None}),
        "kinds": sorted(_union(ok, "kinds")), "events": sorted(_union(ok, "events")),
        "outcomes": _union(ok, "outcomes"), "verdicts": _union(ok, "verdicts"),
        "not_fired": sum(r.not_fired for r in ok), "failing": sum(r.failing for r in ok),
        "found_defect": any(r.failing for r in ok),
        "example_failure": next((r.example_failure for r in ok if r.example_failure), None),
        "example_evidence": next((r.example_evidence for r in ok if r.example_failure), None),
        "errors": [r.error for r in runs if r.error],
    }


def ratios(ours: list[ToolRun], theirs: list[ToolRun]) -> dict[str, Any]:
    """Ours / theirs per repeat pair (both runs made back to back), and their spread."""
    total, per_point = [], []
    for a, b in zip(ours, theirs, strict=True):
        if a.error is None and b.error is None and b.wall_s > 0:
            total.append(round(a.wall_s / b.wall_s, 3))
            if a.per_point_s and b.per_point_s:
                per_point.append(round(a.per_point_s / b.per_point_s, 3))
    return {"total": total, "total_spread": _spread(total), "per_point": per_point,
            "per_point_spread": _spread(per_point)}


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def require_peer() -> None:
    """ckpt-chaos must be importable by this Python (it is in the dev extra): else one clear error."""
    if util.find_spec(PEER_MODULE) is None:
        raise ConfigError(f"{PEER} is not installed for {sys.executable}: pip install {PEER}==0.1.8 "
                          "(it is in the dev extra: pip install -e '.[dev]')")


def _check(args: argparse.Namespace) -> list[Path]:
    for name in ("repeat", "max_points", "ranks", "jobs", "timeout"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    scripts = [Path(s).resolve() for s in args.script] or list(DEFAULT_SCRIPTS)
    for s in scripts:
        if not s.is_file():
            raise ConfigError(f"--script {s}: no such file")
    for flag in (args.markdown, args.json):
        if flag and not Path(flag).resolve().parent.is_dir():
            raise ConfigError(f"cannot write {flag}: its directory does not exist")
    require_peer()
    return scripts


def bench(args: argparse.Namespace, say: Any = print) -> dict[str, Any]:
    """Every script, every repeat, both tools; the report as one JSON-able dict."""
    scripts = _check(args)
    root = Path(make_root("chaos-bench-job-", args.scratch))
    started, load_before = time.time(), _load()
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "machine": {"cpus": os.cpu_count(), "load_avg_before": load_before, "platform": platform.platform(),
                    "python": platform.python_version()},
        "tools": {"chaos": _version("chaos-ckpt"), PEER: _version(PEER)},
        "settings": {"repeat": args.repeat, "max_points": args.max_points, "ranks": args.ranks, "jobs": args.jobs,
                     "seed": args.seed, "modes": args.modes or "all", "peer_modes": args.peer_modes,
                     "faults": getattr(args, "faults", None) or "all", "materialize": bool(getattr(args, "materialize", True)),
                     "result_files": dict(zip(("chaos", PEER), _result_names(args), strict=True)), "timeout_s": args.timeout},
        "scratch": str(root) if args.keep else None,
        "scripts": [],
    }
    try:
        for script in scripts:
            runs: dict[str, list[ToolRun]] = {"chaos": [], PEER: []}
            for i in range(args.repeat):
                order = [("chaos", run_ours), (PEER, run_peer)]
                if i % 2:
                    order.reverse()
                for pos, (tool, fn) in enumerate(order):
                    where = root / script.stem / f"r{i}" / tool
                    run = fn(script, args, where, i, pos == 0)
                    runs[tool].append(run)
                    state = run.error or f"{run.points} points, {run.failing} failing"
                    say(f"{script.name} repeat {i + 1}/{args.repeat} {tool}: {run.wall_s:.1f} s, {state}")
            both = {t: summarize(r) for t, r in runs.items()}
            doc["scripts"].append({
                "script": str(script), "name": script.name, "command": _command(script),
                "summary": both, "ratios_ours_over_theirs": ratios(runs["chaos"], runs[PEER]),
                "defect_found": {t: s["found_defect"] for t, s in both.items()}
                | {"both": all(s["found_defect"] for s in both.values())},
                "runs": {t: [asdict(r) | {"per_point_s": r.per_point_s} for r in rs] for t, rs in runs.items()},
            })
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    doc["machine"]["load_avg_after"] = _load()
    doc["seconds"] = round(time.time() - started, 1)
    return doc


def _mmm(s: dict[str, float] | None, digits: int = 2) -> str:
    return "-" if not s else f"{s['min']:.{digits}f} / {s['median']:.{digits}f} / {s['max']:.{digits}f}"


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"


def markdown(doc: dict[str, Any]) -> str:
    """The side-by-side table, the ratios, and who found which defect."""
    m, st = doc["machine"], doc["settings"]
    lines = [f"### chaos job mode vs {PEER} {doc['tools'][PEER]} ({doc['date']})", "",
             f"{m['cpus']} CPU(s), load average {m['load_avg_before']} before, {m['load_avg_after']} after; "
             f"{st['repeat']} repeat(s), at most {st['max_points']} points per run, {st['ranks']} rank(s), "
             f"{st['jobs']} point(s) at a time; our modes {st['modes']}, faults {st.get('faults', 'all')}"
             f"{', materialized' if st.get('materialize') else ''}, theirs {st['peer_modes']}. "
             "Times: min / median / max over the repeats. Verdicts in our words, summed over the repeats "
             "(theirs: PASS, HARD_FAIL, SILENT_DIVERGENCE, LOST_WORK).", "",
             "| script | tool | points run (found) | file events | wall s per run | s per point | fault kinds "
             "explored | file events hit | verdicts | fault did nothing | defect found |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in doc["scripts"]:
        for tool, x in s["summary"].items():
            found = f" ({', '.join(map(str, x['points_found']))})" if x["points_found"] else ""
            note = f" **errors: {len(x['errors'])}**" if x["errors"] else ""
            lines.append(
                f"| {s['name']} | {tool} | {', '.join(map(str, x['points'])) or '-'}{found} | "
                f"{', '.join(map(str, x['file_events'])) or '-'} | {_mmm(x['wall_s'])} | {_mmm(x['per_point_s'], 3)} | "
                f"{', '.join(x['kinds']) or '-'} | {', '.join(x['events']) or '-'} | {_counts(x['outcomes'])} | "
                f"{x['not_fired']} | {'yes' if x['found_defect'] else 'no'}{note} |")
    lines += ["", "| script | ours / theirs, wall per run (each repeat) | spread | ours / theirs, per point | spread |",
              "|---|---|---|---|---|"]
    for s in doc["scripts"]:
        r = s["ratios_ours_over_theirs"]
        lines.append(f"| {s['name']} | {', '.join(f'{v:.2f}' for v in r['total']) or '-'} | "
                     f"{_mmm(r['total_spread'])} | {', '.join(f'{v:.2f}' for v in r['per_point']) or '-'} | "
                     f"{_mmm(r['per_point_spread'])} |")
    lines.append("")
    for s in doc["scripts"]:
        d = s["defect_found"]
        who = ("both tools found a defect" if d["both"] else "only chaos found a defect" if d["chaos"]
               else f"only {PEER} found a defect" if d[PEER] else "neither tool found a defect")
        examples = "; ".join(f"{t}: {x['example_failure']}" for t, x in s["summary"].items() if x["example_failure"])
        lines.append(f"- {s['name']}: {who}" + (f" ({examples})" if examples else ""))
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    doc = bench(args, say=lambda text: print(text, flush=True))
    text = markdown(doc)
    print()
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
    errors = [e for s in doc["scripts"] for x in s["summary"].values() for e in x["errors"]]
    for e in errors:
        print(f"chaos: bench-job: a tool did not complete: {e}", file=sys.stderr)
    return 2 if errors else 0
