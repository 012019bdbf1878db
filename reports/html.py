"""Self-contained HTML report of a chaos run: one file that opens offline in any browser.

``chaos report results.json -o report.html`` and ``chaos run --html PATH`` both call
:func:`render_report`. The page is built with jinja2 (autoescaped: every string that
comes from a results JSON is untrusted, since scenario ids, error messages and oracle
evidence can contain anything a checkpointer wrote) and draws its charts with plotly.js.

Design choices, and why:

* **plotly.js is embedded once**, gzipped and base64-encoded (about 2 MB instead of
  4.8 MB), and unpacked in the browser with ``DecompressionStream``; the chart data is
  packed the same way (100 scenarios: ~0.2 MB instead of ~1.7 MB). Every chart is a
  plain ``{data, layout}`` dict handed to ``Plotly.newPlot``; plotly's Python figure
  objects are not used because each would carry a ~10 kB default template, which is
  what makes naive plotly reports of 100 scenarios weigh tens of MB.
* **Charts render lazily**: a scenario's charts are drawn when its ``<details>`` is
  opened. Failing and erroring scenarios come first and open, so what needs reading is
  drawn at once and a page of 100 passing scenarios stays quick.
* **Data is compact**: long loss curves are downsampled (min/max per bucket, so spikes
  survive), numbers are rounded to what a chart can show, and non-finite values (a loss
  that went NaN) become gaps rather than invalid JSON. The first divergence is computed
  on the full-precision data before any of that.

A job run's failing points come first as "Failures by cause" (``reports.causes``): one
block per cause with its fix, where the faults landed, how the resume failed, a
representative point (its replay command, a link to its scenario) and every point,
folded; of the failing scenarios below only each cause's representative is open.

Optional sections come from ``extras`` (see :func:`normalize_extras`): the scheme
comparison of ``chaos bench --json``, the Young/Daly interval chart, the certification
property matrix and alert thresholds for the save/load metrics.
"""

from __future__ import annotations

import base64
import datetime as _dt
import gzip
import html
import json
import math
import statistics
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from faults.errors import ConfigError
from reports.jsonfile import atomic_file, read_json

TEMPLATES = Path(__file__).parent / "templates"
VERDICT_ORDER = {"fail": 0, "error": 1, "pass": 2, "skipped": 3}
MAX_CURVE_POINTS = 400  # per trace; beyond this a curve is downsampled
STALL_BUDGET = 0.02  # share of training time a checkpoint may stall it (design target)
THRESHOLD_KEYS = ("stall_seconds", "save_latency_seconds", "ack_wait_seconds", "load_seconds")
RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
PHASE_COLORS = ("#6baed6", "#9e9ac8", "#74c476", "#fdae6b", "#fd8d3c", "#a1d99b", "#bcbddc", "#c6dbef")
PLOT_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


# -- input ---------------------------------------------------------------------------

def load_json(path: str | Path, what: str = "results") -> Any:
    """Read a JSON input of the report; any problem is one clear ConfigError naming the file."""
    return read_json(path, what)


def _check_results(doc: Any, source: str) -> None:
    if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), list):
        raise ConfigError(f"{source} is not a chaos results JSON: expected an object with a 'scenarios' list")
    for i, sc in enumerate(doc["scenarios"]):
        if not isinstance(sc, dict):
            raise ConfigError(f"{source}: scenario #{i} is not an object")


def _positive(value: Any, name: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return x


def normalize_extras(extras: dict[str, Any] | None) -> dict[str, Any]:
    """Accept the optional inputs in the shapes their producers write them.

    Keys understood (all optional):

    * ``bench``: the document of ``chaos bench --json`` (``results`` rows with ``name``,
      ``save_s``, ``stall_s``, ``load_s``, ``save_mb_s``), or just a list of such rows.
    * ``young_daly``: ``{save_seconds, mtbf_seconds[, restart_seconds, budget,
      interval_seconds, step_seconds]}``; the output of ``chaos interval --json`` fits.
      ``save_seconds`` and ``mtbf_seconds`` at the top level of ``extras`` work too.
    * ``certification``: ``{"properties": [{name, verdict, evidence}]}``; a top-level
      ``properties`` list works too.
    * ``thresholds``: alert lines for the metrics chart, seconds, keyed by
      :data:`THRESHOLD_KEYS` (``stall_seconds``, ``save_latency_seconds``,
      ``ack_wait_seconds``, ``load_seconds``).
    * ``step_seconds`` / ``save_every``: for the bench overhead; measured from the
      results when absent.
    * ``title``, ``source`` (shown in the header), ``loss_tolerance`` (relative; 0 means
      bit-exact, the default).
    """
    ex = dict(extras or {})
    out: dict[str, Any] = {}
    yd = ex.get("young_daly") or ex.get("interval")
    if yd is None and "save_seconds" in ex and "mtbf_seconds" in ex:
        yd = {k: ex[k] for k in ("save_seconds", "mtbf_seconds", "restart_seconds", "budget", "interval_seconds",
                                 "step_seconds") if k in ex}
    if yd is not None:
        if not isinstance(yd, dict):
            raise ConfigError("young_daly input must be an object with save_seconds and mtbf_seconds")
        out["young_daly"] = {**yd, "save_seconds": _positive(yd.get("save_seconds"), "save_seconds"),
                             "mtbf_seconds": _positive(yd.get("mtbf_seconds"), "mtbf_seconds")}
    cert = ex.get("certification")
    if cert is None and "properties" in ex:
        cert = {"properties": ex["properties"]}
    if cert is not None:
        props = cert.get("properties") if isinstance(cert, dict) else cert
        if not isinstance(props, list) or not all(isinstance(p, dict) for p in props):
            raise ConfigError("certification input must hold a 'properties' list of {name, verdict, evidence}")
        out["certification"] = {**(cert if isinstance(cert, dict) else {}), "properties": props}
    bench = ex.get("bench")
    if bench is not None:
        if isinstance(bench, list):
            bench = {"results": bench}
        if not isinstance(bench, dict) or not isinstance(bench.get("results"), list):
            raise ConfigError("bench input must be the JSON of `chaos bench --json` (a 'results' list)")
        out["bench"] = bench
    thresholds = ex.get("thresholds") or {}
    unknown = sorted(set(thresholds) - set(THRESHOLD_KEYS))
    if unknown:
        raise ConfigError(f"unknown threshold(s) {', '.join(unknown)}: known are {', '.join(THRESHOLD_KEYS)}")
    out["thresholds"] = {k: _positive(v, k) for k, v in thresholds.items()}
    for key in ("step_seconds", "save_every"):
        if ex.get(key) is not None:
            out[key] = _positive(ex[key], key)
    out["title"] = str(ex.get("title") or "chaos report")
    out["source"] = str(ex["source"]) if ex.get("source") else None
    out["loss_tolerance"] = float(ex.get("loss_tolerance") or 0.0)
    return out


# -- small numeric helpers -----------------------------------------------------------

def _num(x: Any, digits: int = 6) -> float | None:
    """A finite number rounded to ``digits`` significant digits, or None (a gap in a chart)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    if not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def _t(x: float) -> float:
    """Seconds on a timeline: 0.1 ms is finer than anything drawn."""
    return round(x, 4)


def downsample(xs: list[Any], ys: list[Any], max_points: int = MAX_CURVE_POINTS,
               keep: set[Any] | None = None) -> tuple[list[Any], list[Any]]:
    """Thin a curve to about ``max_points`` points, keeping each bucket's min and max.

    Min/max (rather than every n-th point) keeps the spikes a reader is looking for;
    x values in ``keep`` (the resume and divergence steps) always survive.
    """
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    keep = keep or set()
    bucket = max(1, math.ceil(n / (max_points / 2)))
    chosen: set[int] = {0, n - 1}
    for start in range(0, n, bucket):
        idx = [i for i in range(start, min(n, start + bucket)) if isinstance(ys[i], int | float) and math.isfinite(ys[i])]
        if idx:
            chosen.add(min(idx, key=lambda i: ys[i]))
            chosen.add(max(idx, key=lambda i: ys[i]))
        else:
            chosen.add(start)
    chosen |= {i for i, x in enumerate(xs) if x in keep}
    order = sorted(chosen)
    return [xs[i] for i in order], [ys[i] for i in order]


def _esc(s: Any) -> str:
    """Text for plotly labels: plotly.js reads a subset of HTML in labels, so escape it."""
    return html.escape(str(s), quote=False)


def _short(s: Any, limit: int = 300) -> str:
    s = str(s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``0–2, 5``: seeds of 100 scenarios in one line."""
    vals = sorted(set(values))
    parts: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        parts.append(str(vals[i]) if i == j else f"{vals[i]}–{vals[j]}")
        i = j + 1
    return ", ".join(parts)


# -- per-scenario analysis -------------------------------------------------------------

def _losses(sc: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for rank, entries in (sc.get("losses") or {}).items():
        try:
            out[int(rank)] = [e for e in entries if isinstance(e, dict) and "step" in e]
        except (TypeError, ValueError):
            continue
    return out


def _golden(sc: dict[str, Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for rank, curve in (sc.get("golden_losses") or {}).items():
        try:
            out[int(rank)] = list(curve)
        except (TypeError, ValueError):
            continue
    return out


def _same(a: Any, b: Any, rtol: float) -> bool:
    if not isinstance(a, int | float) or not isinstance(b, int | float):
        return a == b
    if math.isnan(a) and math.isnan(b):
        return True
    if rtol <= 0:
        return a == b
    return math.isclose(a, b, rel_tol=rtol, abs_tol=0.0)


def first_divergence(sc: dict[str, Any], rtol: float = 0.0) -> dict[str, Any] | None:
    """The first executed step whose loss differs from golden: earliest attempt, then step, then rank.

    Bit-exact by default (``rtol=0``), as the bit-exact oracle judges; this is computed
    from the curves themselves so that the chart can mark it even when the failing
    oracle was another one.
    """
    golden = _golden(sc)
    found: list[dict[str, Any]] = []
    for rank, entries in _losses(sc).items():
        curve = golden.get(rank)
        if not curve:
            continue
        for e in entries:
            step = e.get("step")
            if not isinstance(step, int) or not 1 <= step <= len(curve):
                continue
            if not _same(e.get("loss"), curve[step - 1], rtol):
                found.append({"rank": rank, "step": step, "attempt": e.get("attempt"), "loss": e.get("loss"),
                              "golden_loss": curve[step - 1], "t": e.get("t") or 0.0})
                break
    if not found:
        return None
    return min(found, key=lambda d: (d["attempt"] if isinstance(d["attempt"], int) else 0, d["step"], d["rank"]))


def _step_at(sc: dict[str, Any], rank: int | None, t: float) -> int | None:
    """The last step a rank had logged by time ``t``: where a time-triggered fault landed."""
    best = None
    for r, entries in _losses(sc).items():
        if rank is not None and r != rank:
            continue
        for e in entries:
            when = e.get("t") if isinstance(e.get("t"), int | float) else 0  # an entry without a time: at 0
            if when <= t and (best is None or when >= best[0]):
                best = (when, e["step"])
    return best[1] if best else None


def _fault_label(f: dict[str, Any]) -> str:
    spec = f.get("spec") or f.get("kind") or "fault"
    sig = f.get("signal")
    return f"{spec}" + (f" ({sig})" if sig and str(sig) not in str(spec) else "")


def _resumes(sc: dict[str, Any]) -> list[dict[str, Any]]:
    """One resume per restarted attempt (attempt > 0), the lowest step over ranks."""
    by_attempt: dict[int, dict[str, Any]] = {}
    for e in sc.get("timeline") or []:
        if e.get("ev") == "resume" and isinstance(e.get("attempt"), int) and e["attempt"] > 0:
            cur = by_attempt.get(e["attempt"])
            if cur is None or (e.get("step") or 0) < (cur.get("step") or 0):
                by_attempt[e["attempt"]] = e
    return [by_attempt[a] for a in sorted(by_attempt)]


def _t0(sc: dict[str, Any]) -> float:
    times = [e["t"] for e in sc.get("timeline") or [] if isinstance(e.get("t"), int | float)]
    times += [a["started"] for a in sc.get("attempts") or [] if isinstance(a.get("started"), int | float)]
    return min(times) if times else 0.0


def _focus_rank(sc: dict[str, Any], div: dict[str, Any] | None) -> int:
    """The rank a reader wants first: the divergent one, else the faulted one, else rank 0."""
    if div:
        return div["rank"]
    for f in sc.get("fired") or []:
        if isinstance(f.get("rank"), int):
            return f["rank"]
    return 0


def _base_layout(title: str, height: int) -> dict[str, Any]:
    return {"title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 14}},
            "height": height, "margin": {"l": 60, "r": 20, "t": 50, "b": 45}, "font": PLOT_FONT,
            "paper_bgcolor": "white", "plot_bgcolor": "white", "hovermode": "closest",
            "legend": {"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top",
                       "font": {"size": 11}}}


def _vline(x: float, color: str, dash: str = "dash") -> dict[str, Any]:
    return {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
            "line": {"color": color, "width": 1.5, "dash": dash}}


def _label(x: float, text: str, color: str, y: float = 1.0) -> dict[str, Any]:
    return {"x": x, "y": y, "xref": "x", "yref": "paper", "text": text, "showarrow": False, "xanchor": "left",
            "yanchor": "bottom", "font": {"size": 11, "color": color}, "bgcolor": "rgba(255,255,255,0.8)"}


def loss_figure(sc: dict[str, Any], div: dict[str, Any] | None) -> dict[str, Any] | None:
    """Golden and resumed loss per step, with the fault, the restarts and the divergence marked."""
    losses, golden = _losses(sc), _golden(sc)
    if not any(losses.values()) and not any(golden.values()):
        return None
    focus = _focus_rank(sc, div)
    ranks = sorted(set(losses) | set(golden))
    keep = {r["step"] for r in _resumes(sc) if isinstance(r.get("step"), int)}
    if div:
        keep.add(div["step"])
    data: list[dict[str, Any]] = []
    for rank in ranks:
        visible = True if rank == focus else "legendonly"  # one rank at a time stays readable
        curve = golden.get(rank) or []
        if curve:
            xs, ys = downsample(list(range(1, len(curve) + 1)), curve, keep=keep)
            data.append({"type": "scatter", "mode": "lines", "name": f"golden r{rank}", "legendgroup": f"r{rank}",
                         "x": xs, "y": [_num(y) for y in ys], "visible": visible,
                         "line": {"color": "#222", "width": 2, "dash": "dot"},
                         "hovertemplate": f"golden rank {rank}<br>step %{{x}}<br>loss %{{y}}<extra></extra>"})
        by_attempt: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for e in losses.get(rank, []):
            by_attempt[int(e.get("attempt") or 0)].append(e)
        for attempt, entries in sorted(by_attempt.items()):
            xs, ys = downsample([e["step"] for e in entries], [e.get("loss") for e in entries], keep=keep)
            color = RANK_COLORS[(rank + attempt * 3) % len(RANK_COLORS)]
            data.append({"type": "scatter", "mode": "lines+markers" if len(xs) <= 80 else "lines",
                         "name": f"r{rank} attempt {attempt}", "legendgroup": f"r{rank}", "visible": visible,
                         "x": xs, "y": [_num(y) for y in ys], "marker": {"size": 4, "color": color},
                         "line": {"color": color, "width": 1.5, "dash": "solid" if attempt == 0 else "dashdot"},
                         "hovertemplate": f"rank {rank} attempt {attempt}<br>step %{{x}}<br>loss %{{y}}<extra></extra>"})
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    fault_steps: list[int] = []
    for f in sc.get("fired") or []:
        step = f.get("step") if isinstance(f.get("step"), int) else (
            _step_at(sc, f.get("rank"), f["t"]) if isinstance(f.get("t"), int | float) else None)
        if step is None:
            continue
        fault_steps.append(step)
        shapes.append(_vline(step, "#d62728"))
        notes.append(_label(step, f"⚡ {_esc(_fault_label(f))}", "#d62728"))
    for r in _resumes(sc):
        step = r.get("step")
        if not isinstance(step, int):
            continue
        shapes.append(_vline(step, "#1f77b4", "dot"))
        notes.append(_label(step, f"↻ restart {r['attempt']}: resumed at step {step}", "#1f77b4", y=0.92))
        lost_to = max([s for s in fault_steps if s >= step], default=None)
        if lost_to is not None and lost_to > step:
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": step, "x1": lost_to, "y0": 0, "y1": 1,
                           "fillcolor": "rgba(31,119,180,0.08)", "line": {"width": 0}, "layer": "below"})
    if div:
        data.append({"type": "scatter", "mode": "markers", "name": "first divergence", "x": [div["step"], div["step"]],
                     "y": [_num(div["loss"]), _num(div["golden_loss"])],
                     "marker": {"symbol": ["x", "circle-open"], "size": 13, "color": "#d62728", "line": {"width": 2}},
                     "hovertemplate": "first divergence<br>step %{x}<br>%{y}<extra></extra>"})
        notes.append({"x": div["step"], "y": _num(div["loss"]), "xref": "x", "yref": "y", "ax": 40, "ay": -40,
                      "text": f"first divergence: step {div['step']}, rank {div['rank']}", "showarrow": True,
                      "arrowcolor": "#d62728", "font": {"color": "#d62728", "size": 11},
                      "bgcolor": "rgba(255,255,255,0.85)"})
    others = " (other ranks: click the legend)" if len(ranks) > 1 else ""
    layout = _base_layout(f"Loss per step, rank {focus}: golden vs. faulted and resumed run{others}", 360)
    layout.update({"shapes": shapes, "annotations": notes,
                   "xaxis": {"title": {"text": "step"}, "gridcolor": "#eee", "zeroline": False},
                   "yaxis": {"title": {"text": "loss"}, "gridcolor": "#eee", "zeroline": False}})
    return {"data": data, "layout": layout}


def _pair_saves(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """save_call → save_return (and → ack) per rank, attempt and step; a call with no return was cut short."""
    last_t: dict[tuple[int, int], float] = {}
    for e in events:
        key = (e.get("rank"), e.get("attempt"))
        last_t[key] = max(last_t.get(key, e["t"]), e["t"])
    open_calls: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    saves: list[dict[str, Any]] = []
    for e in events:
        key = (e.get("rank"), e.get("attempt"), e.get("step"))
        if e.get("ev") == "save_call":
            open_calls[key] = {"rank": e.get("rank"), "attempt": e.get("attempt"), "step": e.get("step"),
                               "start": e["t"], "end": None, "ack": None}
            saves.append(open_calls[key])
        elif e.get("ev") == "save_return" and key in open_calls:
            open_calls[key]["end"] = e["t"]
            open_calls[key]["seconds"] = e.get("seconds")
        elif e.get("ev") == "ack":
            for step in e.get("steps") or []:
                s = open_calls.get((e.get("rank"), e.get("attempt"), step))
                if s is not None and s["ack"] is None:
                    s["ack"] = e["t"]
    for s in saves:
        if s["end"] is None:
            s["end"] = last_t.get((s["rank"], s["attempt"]), s["start"])
            s["cut"] = True
    return saves


def _phase_bands(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ``phase`` event starts a band that lasts until the rank's next phase or save event."""
    bands: list[dict[str, Any]] = []
    current: dict[tuple[Any, Any], dict[str, Any]] = {}
    enders = {"phase", "save_return", "ack", "save_call", "final", "exit", "error"}
    for e in events:
        key = (e.get("rank"), e.get("attempt"))
        if e.get("ev") in enders and key in current:
            band = current.pop(key)
            band["end"] = e["t"]
            bands.append(band)
        if e.get("ev") == "phase":
            current[key] = {"rank": e.get("rank"), "name": str(e.get("name") or "phase"), "step": e.get("step"),
                            "start": e["t"], "end": e["t"]}
    for (rank, attempt), band in current.items():  # cut short by a crash: ends at the rank's last event
        band["end"] = max([e["t"] for e in events if (e.get("rank"), e.get("attempt")) == (rank, attempt)]
                          + [band["start"]])
        band["cut"] = True
        bands.append(band)
    return bands


def timeline_figure(sc: dict[str, Any]) -> dict[str, Any] | None:
    """Jepsen-style history: a lane per rank, saves and phases as bands, faults and acks as marks."""
    events = sorted((e for e in sc.get("timeline") or [] if isinstance(e.get("t"), int | float)), key=lambda e: e["t"])
    if not events:
        return None
    t0 = _t0(sc)
    world = int(sc.get("world_size") or 0)
    ranks = sorted({e["rank"] for e in events if isinstance(e.get("rank"), int)} | set(range(world)))
    lane = {r: f"rank {r}" for r in ranks}
    data: list[dict[str, Any]] = []

    def bars(name: str, items: list[dict[str, Any]], color: str, width: float, texts: list[str],
             start_key: str = "start", end_key: str = "end", colors: list[str] | None = None) -> None:
        if not items:
            return
        data.append({"type": "bar", "orientation": "h", "name": name, "width": width,
                     "y": [lane.get(i["rank"], f"rank {i['rank']}") for i in items],
                     "base": [_t(i[start_key] - t0) for i in items],
                     "x": [max(_t(i[end_key] - i[start_key]), 0.0005) for i in items],
                     "marker": {"color": colors or color, "line": {"width": 0}},
                     "hovertext": texts, "hoverinfo": "text"})

    saves = _pair_saves(events)
    bars("save() blocking", saves, "#4e79a7", 0.55,
         [f"rank {s['rank']} save step {s['step']} (attempt {s['attempt']})<br>"
          + (f"cut short after {s['end'] - s['start']:.3f} s" if s.get("cut") else f"blocked {s['end'] - s['start']:.3f} s")
          for s in saves],
         colors=["#e15759" if s.get("cut") else "#4e79a7" for s in saves])
    inflight = [s for s in saves if s.get("ack") and s["ack"] > s["end"] and not s.get("cut")]
    bars("until acknowledged", inflight, "rgba(78,121,167,0.25)", 0.25,
         [f"rank {s['rank']} step {s['step']}: durable (ack) {s['ack'] - s['start']:.3f} s after save()" for s in inflight],
         start_key="end", end_key="ack")
    bands = _phase_bands(events)
    names = sorted({b["name"] for b in bands})
    for i, name in enumerate(names):
        mine = [b for b in bands if b["name"] == name]
        bars(f"phase {_esc(name)}", mine, PHASE_COLORS[i % len(PHASE_COLORS)], 0.3,
             [f"rank {b['rank']} phase {_esc(name)} (step {b.get('step')}) {b['end'] - b['start']:.3f} s"
              + (" — cut short" if b.get("cut") else "") for b in mine])

    def marks(name: str, items: list[dict[str, Any]], symbol: str, color: str, size: int,
              texts: list[str]) -> None:
        if not items:
            return
        data.append({"type": "scatter", "mode": "markers", "name": name,
                     "x": [_t(i["t"] - t0) for i in items], "y": [lane.get(i.get("rank"), "cluster") for i in items],
                     "marker": {"symbol": symbol, "color": color, "size": size, "line": {"width": 1.5, "color": color}},
                     "hovertext": texts, "hoverinfo": "text"})

    def of(ev: str) -> list[dict[str, Any]]:
        return [e for e in events if e.get("ev") == ev]

    acks = of("ack")
    marks("ack (durable)", acks, "diamond", "#59a14f", 7,
          [f"rank {e.get('rank')} ack steps {e.get('steps')} (waited {e.get('wait_seconds') or 0:.6f} s)" for e in acks])
    resumes = of("resume")
    marks("resume (load)", resumes, "triangle-right", "#1f77b4", 10,
          [f"rank {e.get('rank')} attempt {e.get('attempt')} resumed at step {e.get('step')}"
           f" (load {e.get('seconds') or 0:.3f} s)" for e in resumes])
    starts = of("start")
    marks("process start", starts, "line-ns-open", "#999", 10,
          [f"rank {e.get('rank')} attempt {e.get('attempt')} start (pid {e.get('pid')})" for e in starts])
    exits = of("exit") + of("final")
    marks("final / exit", exits, "square-open", "#555", 7,
          [f"rank {e.get('rank')} {e.get('ev')} (step {e.get('step', '-')}, code {e.get('code', '-')})" for e in exits])
    io = of("io_fault")
    marks("I/O fault", io, "star", "#f28e2b", 13,
          [_esc(_short(f"rank {e.get('rank')} I/O fault: " + ", ".join(f"{k}={v}" for k, v in e.items()
                                                                         if k not in ("ev", "rank", "t")))) for e in io])
    errors = of("error")
    marks("error", errors, "circle-open", "#b00020", 11,
          [_esc(_short(f"rank {e.get('rank')} {e.get('type', '')}: {e.get('message', '')}")) for e in errors])
    fired = [f for f in sc.get("fired") or [] if isinstance(f.get("t"), int | float)]
    marks("fault fired", fired, "x", "#d62728", 15,
          [_esc(f"{_fault_label(f)} → rank {f.get('rank')} (pid {f.get('pid')})") for f in fired])

    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    attempts = [a for a in sc.get("attempts") or [] if isinstance(a.get("started"), int | float)]
    for prev, nxt in zip(attempts, attempts[1:], strict=False):
        if isinstance(prev.get("ended"), int | float):
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": _t(prev["ended"] - t0),
                           "x1": _t(nxt["started"] - t0), "y0": 0, "y1": 1, "layer": "below",
                           "fillcolor": "rgba(214,39,40,0.10)", "line": {"width": 0}})
        shapes.append(_vline(_t(nxt["started"] - t0), "#1f77b4", "dot"))
    for i, a in enumerate(attempts):
        text = f"{'↻ restart: ' if i else ''}attempt {a.get('attempt')}: {a.get('outcome')}"
        notes.append(_label(_t(a["started"] - t0), _esc(text), "#1f77b4" if i else "#666"))
    # tall enough for the legend of every kind of mark, and a lane of 60 px per rank
    layout = _base_layout("Timeline (Jepsen-style history): ranks as lanes", max(370, 140 + 60 * len(ranks)))
    layout.update({"barmode": "overlay", "shapes": shapes, "annotations": notes,
                   "xaxis": {"title": {"text": "seconds since start"}, "gridcolor": "#eee", "zeroline": False},
                   "yaxis": {"type": "category", "categoryorder": "array", "autorange": "reversed",
                             "categoryarray": [lane[r] for r in ranks], "gridcolor": "#eee"}})
    return {"data": data, "layout": layout}


def save_metrics(sc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Save and load figures over time: blocking stall, call→ack latency, ack wait, load time."""
    events = [e for e in sc.get("timeline") or [] if isinstance(e.get("t"), int | float)]
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in THRESHOLD_KEYS}
    for s in _pair_saves(sorted(events, key=lambda e: e["t"])):
        if isinstance(s.get("seconds"), int | float):
            out["stall_seconds"].append({"t": s["end"], "v": s["seconds"], "rank": s["rank"], "step": s["step"]})
        if s.get("ack"):
            out["save_latency_seconds"].append({"t": s["ack"], "v": s["ack"] - s["start"], "rank": s["rank"],
                                                "step": s["step"]})
    for e in events:
        if e.get("ev") == "ack" and isinstance(e.get("wait_seconds"), int | float):
            out["ack_wait_seconds"].append({"t": e["t"], "v": e["wait_seconds"], "rank": e.get("rank"),
                                            "step": (e.get("steps") or [None])[-1]})
        elif e.get("ev") == "resume" and isinstance(e.get("seconds"), int | float):
            out["load_seconds"].append({"t": e["t"], "v": e["seconds"], "rank": e.get("rank"), "step": e.get("step")})
    return out


METRIC_LABELS = {"stall_seconds": ("save() stall", "#4e79a7"), "save_latency_seconds": ("save latency (call→ack)", "#76b7b2"),
                 "ack_wait_seconds": ("ack wait (wait())", "#59a14f"), "load_seconds": ("load on resume", "#f28e2b")}


def metrics_figure(sc: dict[str, Any], thresholds: dict[str, float]) -> tuple[dict[str, Any] | None, list[str]]:
    """Save/load metrics over time with alert lines; returns the figure and the alerts raised."""
    metrics = save_metrics(sc)
    if not any(metrics.values()):
        return None, []
    t0 = _t0(sc)
    data: list[dict[str, Any]] = []
    alerts: list[str] = []
    positives = [p["v"] for pts in metrics.values() for p in pts if p["v"] > 0]
    floor = min(positives) if positives else 1e-6
    for key, pts in metrics.items():
        if not pts:
            continue
        label, color = METRIC_LABELS[key]
        limit = thresholds.get(key)
        over = [p for p in pts if limit is not None and p["v"] > limit]
        if over:
            worst = max(over, key=lambda p: p["v"])
            alerts.append(f"{label}: {len(over)} of {len(pts)} above {limit:g} s "
                          f"(worst {worst['v']:.3g} s, rank {worst['rank']}, step {worst['step']})")
        data.append({"type": "scatter", "mode": "markers+lines", "name": label,
                     "x": [_t(p["t"] - t0) for p in pts], "y": [_num(max(p["v"], floor), 4) for p in pts],
                     "line": {"color": color, "width": 1, "shape": "hv"},
                     "marker": {"color": ["#d62728" if p in over else color for p in pts], "size": 7},
                     "hovertext": [f"{label}<br>rank {p['rank']} step {p['step']}: {p['v']:.4g} s" for p in pts],
                     "hoverinfo": "text"})
    shapes, notes = [], []
    for key, limit in thresholds.items():
        label, color = METRIC_LABELS[key]
        shapes.append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": limit, "y1": limit,
                       "line": {"color": "#d62728", "width": 1, "dash": "dash"}})
        notes.append({"xref": "paper", "yref": "y", "x": 1, "y": math.log10(limit), "xanchor": "right",
                      "yanchor": "bottom", "showarrow": False, "text": f"alert: {label} > {limit:g} s",
                      "font": {"size": 10, "color": "#d62728"}})
    layout = _base_layout("Save and load metrics over time (log scale)", 320)
    layout.update({"shapes": shapes, "annotations": notes,
                   "xaxis": {"title": {"text": "seconds since start"}, "gridcolor": "#eee", "zeroline": False},
                   "yaxis": {"title": {"text": "seconds"}, "type": "log", "gridcolor": "#eee"}})
    return {"data": data, "layout": layout}, alerts


# -- optional sections --------------------------------------------------------------

def measured_step_seconds(doc: dict[str, Any]) -> float | None:
    """Median time between consecutive steps of one rank and attempt, over all scenarios."""
    gaps: list[float] = []
    for sc in doc.get("scenarios") or []:
        for entries in _losses(sc).values():
            for a, b in zip(entries, entries[1:], strict=False):
                if (a.get("attempt") == b.get("attempt") and b.get("step") == (a.get("step") or 0) + 1
                        and isinstance(a.get("t"), int | float) and isinstance(b.get("t"), int | float)):
                    gaps.append(b["t"] - a["t"])
    return statistics.median(gaps) if gaps else None


def _save_every(doc: dict[str, Any]) -> int | None:
    values = [((sc.get("scenario") or {}).get("workload") or {}).get("save_every") for sc in doc.get("scenarios") or []]
    values = [v for v in values if isinstance(v, int) and v > 0]
    return Counter(values).most_common(1)[0][0] if values else None


def bench_view(bench: dict[str, Any], step_s: float | None, save_every: float | None,
               step_source: str) -> dict[str, Any]:
    """Scheme comparison: stall, save and load time per checkpointer, and stall overhead vs. the 2 % budget.

    Overhead is the stall of one save divided by the training time between two saves
    (``save_every × step time``): the share of training time the checkpointer takes away.
    """
    rows = []
    for r in bench.get("results") or []:
        if not isinstance(r, dict):
            continue
        name = str(r.get("name") or "?")
        if r.get("skipped"):
            rows.append({"name": name, "skipped": str(r["skipped"])})
            continue
        row = {"name": name, "save_s": r.get("save_s"), "stall_s": r.get("stall_s"), "load_s": r.get("load_s"),
               "mb_s": r.get("save_mb_s", r.get("mb_s")), "correct": r.get("correct"), "skipped": None}
        interval = step_s * save_every if step_s and save_every else None
        row["overhead"] = (r["stall_s"] / interval) if interval and isinstance(r.get("stall_s"), int | float) else None
        rows.append(row)
    live = [r for r in rows if not r["skipped"]]
    names = [_esc(r["name"]) for r in live]
    times = {"data": [{"type": "bar", "name": label, "x": names, "y": [_num(r[key], 4) for r in live],
                       "marker": {"color": color},
                       "hovertemplate": f"%{{x}}<br>{label}: %{{y}} s<extra></extra>"}
                      for key, label, color in (("stall_s", "stall (save() blocks)", "#e15759"),
                                                ("save_s", "save (until durable)", "#4e79a7"),
                                                ("load_s", "load (verified)", "#f28e2b"))],
             "layout": {**_base_layout("Save, stall and load time per checkpointer", 340), "barmode": "group",
                        "yaxis": {"title": {"text": "seconds (median)"}, "gridcolor": "#eee"}}}
    overhead = None
    if any(r["overhead"] is not None for r in live):
        budget = float(bench.get("budget") or STALL_BUDGET)
        overhead = {"data": [{"type": "bar", "name": "stall overhead", "x": names,
                              "y": [_num((r["overhead"] or 0) * 100, 4) for r in live],
                              "marker": {"color": ["#59a14f" if (r["overhead"] or 0) <= budget else "#d62728"
                                                   for r in live]},
                              "hovertemplate": "%{x}<br>%{y}% of training time<extra></extra>"}],
                    "layout": {**_base_layout(f"Stall overhead vs. the {budget:.0%} budget", 340),
                               "yaxis": {"title": {"text": "% of training time"}, "gridcolor": "#eee",
                                         "rangemode": "tozero"},
                               "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": budget * 100,
                                           "y1": budget * 100, "line": {"color": "#d62728", "dash": "dash"}}],
                               "annotations": [{"xref": "paper", "x": 0, "y": budget * 100, "xanchor": "left",
                                                "yanchor": "bottom", "showarrow": False, "yshift": 2,
                                                "bgcolor": "rgba(255,255,255,0.85)",
                                                "text": f"{budget:.0%} budget", "font": {"color": "#d62728"}}],
                               "showlegend": False}}
    return {"rows": rows, "times": times, "overhead": overhead, "step_s": step_s, "save_every": save_every,
            "step_source": step_source, "budget": float(bench.get("budget") or STALL_BUDGET),
            "payload_mb": (bench["payload_bytes"] / 1e6) if isinstance(bench.get("payload_bytes"), int | float) else None,
            "raw_mb_s": (bench.get("raw") or {}).get("mb_s"),
            "config": {"world_size": None, "repeats": None, **(bench.get("config") or {})},
            "ratios": [{"name": k, "value": v, "target": (bench.get("targets") or {}).get(k),
                        "ok": (bench.get("meets_target") or {}).get(k)} for k, v in (bench.get("ratios") or {}).items()]}


def young_daly(save_s: float, mtbf_s: float, restart_s: float = 0.0) -> dict[str, Any]:
    """Expected cost of checkpointing every τ seconds, as shares of wall time.

    Saving costs ``C/τ``; each failure (one per MTBF on average) loses half an interval
    plus the save in progress (and the restart, when given): ``(τ/2 + C + R)/MTBF``.
    Young's optimum ``sqrt(2·C·MTBF)`` minimises the sum to first order.
    """
    opt = math.sqrt(2 * save_s * mtbf_s)
    lo, hi = max(save_s, opt / 30), opt * 30
    taus = [lo * (hi / lo) ** (i / 199) for i in range(200)]

    def cost(tau: float) -> tuple[float, float]:
        return save_s / tau, (tau / 2 + save_s + restart_s) / mtbf_s

    pts = [cost(t) for t in taus]
    return {"optimum": opt, "taus": taus, "save": [p[0] for p in pts], "lost": [p[1] for p in pts],
            "total_at_optimum": sum(cost(opt))}


def _fmt_s(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    if s >= 60:
        return f"{s / 60:.3g} min"
    return f"{s:.3g} s"


def young_daly_view(yd: dict[str, Any]) -> dict[str, Any]:
    c, m = yd["save_seconds"], yd["mtbf_seconds"]
    r = float(yd.get("restart_seconds") or 0.0)
    calc = young_daly(c, m, r)
    opt = calc["optimum"]
    budget = float(yd.get("budget") or STALL_BUDGET)
    xs = [_num(t, 5) for t in calc["taus"]]
    pct = [[_num(v * 100, 4) for v in calc[k]] for k in ("save", "lost")]
    total = [_num((a + b) * 100, 4) for a, b in zip(calc["save"], calc["lost"], strict=True)]
    data = [
        {"type": "scatter", "mode": "lines", "name": "save overhead C/τ", "x": xs, "y": pct[0],
         "line": {"color": "#4e79a7"}},
        {"type": "scatter", "mode": "lines", "name": "expected lost work (τ/2 + C" + (" + R" if r else "") + ")/MTBF",
         "x": xs, "y": pct[1], "line": {"color": "#f28e2b"}},
        {"type": "scatter", "mode": "lines", "name": "total", "x": xs, "y": total, "line": {"color": "#222", "width": 3}},
        {"type": "scatter", "mode": "markers+text", "name": "optimum √(2·C·MTBF)", "x": [_num(opt, 5)],
         "y": [_num(calc["total_at_optimum"] * 100, 4)], "text": [f"τ* = {_fmt_s(opt)}"], "textposition": "top center",
         "marker": {"color": "#d62728", "size": 12, "symbol": "star"}},
    ]
    shapes = [_vline(opt, "#d62728")]
    notes = []
    floor = c / budget
    shapes.append(_vline(floor, "#59a14f", "dot"))
    notes.append(_label(floor, f"{budget:.0%} stall budget: τ ≥ {_fmt_s(floor)}", "#59a14f", y=0.92))
    chosen = yd.get("interval_seconds")
    if isinstance(chosen, int | float) and chosen > 0 and abs(chosen - opt) / opt > 0.01:
        shapes.append(_vline(chosen, "#9467bd", "dashdot"))
        notes.append(_label(chosen, f"chosen τ = {_fmt_s(chosen)}", "#9467bd", y=0.84))
    layout = _base_layout("Young/Daly: checkpoint cost against the save interval", 380)
    layout.update({"shapes": shapes, "annotations": notes,
                   "xaxis": {"title": {"text": "save interval τ (seconds, log)"}, "type": "log", "gridcolor": "#eee"},
                   "yaxis": {"title": {"text": "% of wall time"}, "type": "log", "gridcolor": "#eee"}})
    step_s = yd.get("step_seconds")
    return {"figure": {"data": data, "layout": layout}, "save_seconds": c, "mtbf_seconds": m, "restart_seconds": r,
            "optimum": opt, "optimum_h": _fmt_s(opt), "total_pct": calc["total_at_optimum"] * 100,
            "optimum_steps": math.ceil(opt / step_s) if isinstance(step_s, int | float) and step_s > 0 else None,
            "budget": budget, "budget_floor_h": _fmt_s(floor), "chosen_h": _fmt_s(chosen) if chosen else None,
            "c_h": _fmt_s(c), "m_h": _fmt_s(m)}


def _evidence_text(evidence: Any) -> str:
    if evidence is None or evidence == {}:
        return ""
    if isinstance(evidence, str):
        return evidence
    return json.dumps(evidence, indent=1, sort_keys=True, default=str)


# -- assembling the page ------------------------------------------------------------

def _run_notes(doc: dict[str, Any]) -> list[str]:
    """Coverage of a job or a campaign, as the CI summary says it (reports.cases)."""
    from reports.cases import describe

    try:
        return describe(doc).notes
    except ConfigError:
        return []


def _job_view(job: Any) -> dict[str, Any] | None:
    """What a job-mode results document (``chaos run -- COMMAND``) says about the job as a whole."""
    if not isinstance(job, dict):
        return None
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    command = spec.get("command") or []
    resume = spec.get("resume_command")
    ref = job.get("reference") if isinstance(job.get("reference"), dict) else {}
    outcomes = job.get("outcomes") if isinstance(job.get("outcomes"), dict) else {}
    return {"command": " ".join(map(str, command)) if isinstance(command, list) else str(command),
            "resume": " ".join(map(str, resume)) if isinstance(resume, list) else resume,
            "world_size": spec.get("world_size"), "torchrun": bool(spec.get("torchrun")),
            "found": job.get("points_found"), "tried": job.get("points_tried"), "coverage": job.get("coverage"),
            "budget": job.get("budget_s"), "outcomes": {str(k): v for k, v in outcomes.items()},
            "tolerance": bool(ref.get("tolerance_mode")), "notes": [str(n) for n in ref.get("notes") or []],
            "untraced": [str(n) for n in ref.get("untraced_files") or []]}


def scenario_view(sc: dict[str, Any], idx: int, ex: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """What the template shows of one scenario; its figures go into ``figures`` keyed by chart id."""
    verdict = str(sc.get("verdict") or "error")
    div = first_divergence(sc, ex["loss_tolerance"])
    charts = []
    loss = loss_figure(sc, div)
    if loss:
        figures[f"s{idx}-loss"] = loss
        charts.append(f"s{idx}-loss")
    timeline = timeline_figure(sc)
    if timeline:
        figures[f"s{idx}-timeline"] = timeline
        charts.append(f"s{idx}-timeline")
    metrics, alerts = metrics_figure(sc, ex["thresholds"])
    if metrics:
        figures[f"s{idx}-metrics"] = metrics
        charts.append(f"s{idx}-metrics")
    oracles = []
    for name, o in (sc.get("oracles") or {}).items():
        o = o if isinstance(o, dict) else {"result": str(o)}
        oracles.append({"name": name, "result": str(o.get("result", "?")), "summary": str(o.get("summary") or ""),
                        "evidence": _evidence_text(o.get("evidence"))})
    attempts = []
    for a in sc.get("attempts") or []:
        if not isinstance(a, dict):
            continue
        started, ended = a.get("started"), a.get("ended")
        dur = ended - started if isinstance(started, int | float) and isinstance(ended, int | float) else a.get("seconds")
        # the built-in workload records exit_codes by rank; a job's attempt, returncodes in rank order
        codes = a.get("exit_codes") or {f"{i}": c for i, c in enumerate(a.get("returncodes") or [])}
        detail = a.get("detail") or ("timed out" if a.get("timed_out") else "")
        if a.get("leftovers"):
            detail = f"{detail}; left behind: {a['leftovers']}" if detail else f"left behind: {a['leftovers']}"
        attempts.append({"attempt": a.get("attempt"), "outcome": a.get("outcome"), "seconds": dur,
                         "exit_codes": ", ".join(f"r{k}: {v}" for k, v in codes.items()) if isinstance(codes, dict) else str(codes),
                         "detail": detail, "fired": ", ".join(_fault_label(f) for f in a.get("fired") or [])})
    faults = [str(f.get("spec") or f.get("kind")) if isinstance(f, dict) else str(f) for f in sc.get("faults") or []]
    outcome = str(sc.get("outcome") or verdict)  # a job point's finer word: hard_failure, lost_work, ...
    return {"idx": idx, "anchor": f"s{idx}", "id": str(sc.get("id") or f"scenario {idx}"), "verdict": verdict,
            "outcome": outcome if outcome != verdict else None, "kind": str((sc.get("scenario") or {}).get("kind")
                                                                            or "workload"),
            "open": verdict in ("fail", "error"), "checkpointer": str(sc.get("checkpointer") or "?"),
            "backend": str(sc.get("backend") or "?"), "world_size": sc.get("world_size"), "seed": sc.get("seed"),
            "faults": faults, "seconds": sc.get("seconds"), "error": sc.get("error"), "replay": sc.get("replay"),
            "oracles": oracles, "failing": [o for o in oracles if o["result"] not in ("pass", "skipped", "not_judged")],
            "divergence": div, "attempts": attempts, "charts": charts, "alerts": alerts,
            "golden_cached": sc.get("golden_cached")}


def causes_view(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The "Failures by cause" blocks of a job document (``reports.causes.group``); none for another
    document. Scenario anchors are ``s<index in scenarios>``, as :func:`scenario_view` names them."""
    from reports.causes import group, natural

    views = []
    for i, c in enumerate(group(doc)):
        rep = c.representative
        views.append({
            "anchor": f"cause-{i}", "idx": i, "id": c.id, "outcome": c.outcome, "title": c.title, "count": c.count,
            "fix": c.fix, "fix_text": c.fix_text, "families": c.families_text(), "where": c.where(),
            "signatures": c.signatures() if c.outcome == "hard_failure" else [],
            "rep": {"id": rep.id, "anchor": f"s{rep.index}", "index": rep.index, "landed": rep.landed,
                    "summary": rep.summary(), "replay": rep.replay},
            "points": [{"id": p.id, "anchor": f"s{p.index}", "landed": p.landed}
                       for p in sorted(c.points, key=lambda p: natural(p.id))]})
    return views


def build_context(doc: dict[str, Any], extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the template needs, as plain data (figures under ``figures``)."""
    ex = normalize_extras(extras)
    _check_results(doc, ex["source"] or "results document")
    scenarios = doc["scenarios"]
    order = sorted(range(len(scenarios)), key=lambda i: (VERDICT_ORDER.get(scenarios[i].get("verdict"), 1), i))
    figures: dict[str, Any] = {}
    views = [scenario_view(scenarios[i], i, ex, figures) for i in order]
    causes = causes_view(doc)
    if causes:  # one open failing scenario per cause: the rest are a click away in its block
        shown = {c["rep"]["index"] for c in causes}
        for v in views:
            if v["verdict"] == "fail":
                v["open"] = v["idx"] in shown
    counts = Counter(v["verdict"] for v in views)
    by_ckpt: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for v in views:
        by_ckpt[(v["checkpointer"], v["backend"])][v["verdict"]] += 1
    seeds = [v["seed"] for v in views if isinstance(v["seed"], int)]
    ctx: dict[str, Any] = {
        "title": ex["title"], "source": ex["source"],
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "schema_version": doc.get("schema_version"), "environment": doc.get("environment") or {},
        "counts": {k: counts.get(k, 0) for k in ("fail", "error", "pass", "skipped")}, "total": len(views),
        "matrix": [{"checkpointer": k[0], "backend": k[1], **{v: c.get(v, 0) for v in VERDICT_ORDER}}
                   for k, c in sorted(by_ckpt.items())],
        "checkpointers": sorted({v["checkpointer"] for v in views}), "backends": sorted({v["backend"] for v in views}),
        "world_sizes": sorted({v["world_size"] for v in views if isinstance(v["world_size"], int)}),
        "seeds": _ranges(seeds), "scenarios": views, "thresholds": ex["thresholds"],
        "alerting": sum(1 for v in views if v["alerts"]),
        "bench": None, "young_daly": None, "certification": None, "run_notes": _run_notes(doc),
        "job": _job_view(doc.get("job")), "causes": causes,
        "causes_failing": sum(c["count"] for c in causes),
    }
    if "bench" in ex:
        step_s, source = ex.get("step_seconds"), "given"
        if step_s is None:
            step_s = ex["bench"].get("step_seconds") or measured_step_seconds(doc)
            source = "median step time measured in these scenarios" if step_s else "unknown"
        save_every = ex.get("save_every") or ex["bench"].get("save_every") or _save_every(doc)
        ctx["bench"] = bench_view(ex["bench"], step_s, save_every, source)
        figures["bench-times"] = ctx["bench"]["times"]
        if ctx["bench"]["overhead"]:
            figures["bench-overhead"] = ctx["bench"]["overhead"]
    if "young_daly" in ex:
        ctx["young_daly"] = young_daly_view(ex["young_daly"])
        figures["young-daly"] = ctx["young_daly"]["figure"]
    if "certification" in ex:
        props = []
        for p in ex["certification"]["properties"]:
            props.append({"name": str(p.get("name") or "?"), "verdict": str(p.get("verdict") or "?"),
                          "evidence": _evidence_text(p.get("evidence"))})
        ctx["certification"] = {"properties": props, "counts": Counter(p["verdict"] for p in props),
                                "meta": {k: v for k, v in ex["certification"].items() if k != "properties"
                                         and isinstance(v, str | int | float)}}
    ctx["figures"] = figures
    return ctx


def script_json(value: Any) -> Markup:
    """JSON safe inside ``<script>``: no ``</script>``, ``<!--`` or line separators can break out."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    for ch, rep in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, rep)
    return Markup(text)


@lru_cache(maxsize=2)
def plotly_bundle(mode: str = "gzip") -> str:
    """plotly.js from the plotly package, as-is (``inline``) or gzipped and base64-encoded (``gzip``)."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if mode == "inline":
        if "</script" in js.lower():  # never true of plotly.min.js; checked because it would break the page
            raise RuntimeError("plotly.js contains '</script' and cannot be inlined")
        return js
    return base64.b64encode(gzip.compress(js.encode("utf-8"), 9, mtime=0)).decode("ascii")


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["script_json"] = script_json
    env.filters["secs"] = lambda v: "-" if not isinstance(v, int | float) else f"{v:.3g} s" if v < 10 else f"{v:.1f} s"
    env.filters["num"] = lambda v, fmt="{:.3f}": "-" if not isinstance(v, int | float) else fmt.format(v)
    return env


def render_html(results_doc: dict[str, Any], extras: dict[str, Any] | None = None, *, plotly_js: str = "gzip") -> str:
    """The report as one HTML string. ``plotly_js``: ``gzip`` (default, ~2 MB) or ``inline`` (~4.8 MB, no
    DecompressionStream needed: for very old browsers)."""
    if plotly_js not in ("gzip", "inline"):
        raise ValueError(f"plotly_js must be 'gzip' or 'inline', not {plotly_js!r}")
    ctx = build_context(results_doc, extras)
    figures_gz = ""
    if plotly_js == "gzip":  # chart data compresses ~10x: 100 scenarios' charts shrink from ~1.7 MB
        raw = json.dumps(ctx["figures"], separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        raw_bytes = raw.encode("utf-8", "backslashreplace")  # a lone surrogate: its \\udcxx escape, valid JSON
        figures_gz = base64.b64encode(gzip.compress(raw_bytes, 9, mtime=0)).decode("ascii")
    return _environment().get_template("report.html.j2").render(
        **ctx, plotly_mode=plotly_js, plotly_js=Markup(plotly_bundle(plotly_js)), figures_gz=figures_gz)


def render_report(results_doc: dict[str, Any], out: str | Path, extras: dict[str, Any] | None = None) -> Path:
    """Write the HTML report of a results document to ``out`` (atomically) and return its path.

    Bad input (a document without scenarios, malformed extras) raises ConfigError.
    """
    target = Path(out)
    page = render_html(results_doc, extras)
    # its mode as the umask says, not mkstemp's 0600; a lone surrogate (a non-UTF-8 file name a rank
    # traced) is written as its escape rather than failing the write
    with atomic_file(target, errors="backslashreplace") as f:
        f.write(page)
    return target


__all__ = ["render_report", "render_html", "build_context", "load_json", "normalize_extras", "first_divergence",
           "downsample", "young_daly", "plotly_bundle", "script_json", "THRESHOLD_KEYS"]


def render_certification(report: dict[str, Any]) -> str:
    """The ``chaos certify`` report as one self-contained HTML page (no scripts)."""
    return _environment().get_template("certify.html.j2").render(r=report)
