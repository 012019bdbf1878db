"""The HTML report in a real browser: every chart drawn with data, no console errors.

Headless Chromium (Debian's ``chromium`` package) driven by Playwright's Python
package; no browser download. A string test cannot see that plotly.js unpacked, that
the lazily drawn charts actually drew, or that a copy button works: this can. The
checker is proven by the last two tests, which hand it a page with an empty chart and a
page with a JavaScript error and expect both flagged.

Screenshots go to pytest's ``tmp_path`` and, when ``CHAOS_ARTIFACTS`` is set, there too.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reports import html as report_html

CHROMIUM = os.environ.get("CHAOS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)

FIXTURES = Path(__file__).parent / "fixtures" / "report"

# Every chart div: did plotly draw it, and how many traces and points does it hold?
CHART_PROBE = """() => Array.from(document.querySelectorAll('.chart[data-fig]')).map(d => ({
  fig: d.dataset.fig,
  rendered: d.dataset.rendered || null,
  container: !!d.querySelector('.plot-container .main-svg'),
  traces: (d._fullData || []).length,
  points: (d._fullData || []).reduce((n, t) => n + ((t.x && t.x.length) || (t.y && t.y.length) || 0), 0),
  drawn: d.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
}))"""


@dataclass
class PageCheck:
    """What the browser saw: problems (empty means the page is good) and the raw facts."""

    problems: list[str] = field(default_factory=list)
    charts: list[dict[str, Any]] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    copied: str | None = None
    screenshot: Path | None = None


def check_report(page_path: Path, screenshot: Path, *, click_copy: bool = True,
                 timeout_ms: int = 30_000) -> PageCheck:
    """Open a report, draw every chart, and list everything wrong with it."""
    result = PageCheck()
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            try:
                context.grant_permissions(["clipboard-read", "clipboard-write"])
            except Exception:  # noqa: BLE001 - older Chromium: copy falls back to selection
                pass
            page = context.new_page()
            page.on("console", lambda m: m.type == "error" and result.console_errors.append(m.text))
            page.on("pageerror", lambda e: result.console_errors.append(f"page error: {e}"))
            page.goto(page_path.resolve().as_uri())
            try:
                page.wait_for_function("() => window.chaosReport !== undefined", timeout=timeout_ms)
                page.evaluate("() => window.chaosReport.ready")
                page.evaluate("() => window.chaosReport.renderAll()")
            except Exception as exc:  # noqa: BLE001 - a broken page is a finding, not a crash
                result.problems.append(f"report script did not finish: {str(exc).splitlines()[0]}")
            result.charts = page.evaluate(CHART_PROBE)
            if not result.charts:
                result.problems.append("page has no charts")
            for c in result.charts:
                if c["rendered"] != "ok" or not c["container"]:
                    result.problems.append(f"chart {c['fig']} not rendered (state {c['rendered']})")
                elif c["traces"] == 0 or c["points"] == 0 or c["drawn"] == 0:
                    result.problems.append(f"chart {c['fig']} is empty ({c['traces']} traces, {c['points']} points)")
            buttons = page.locator("button.copy")
            if click_copy and buttons.count():
                buttons.first.click()
                page.wait_for_timeout(200)
                label = buttons.first.text_content() or ""
                if label.strip() not in ("copied", "selected: press Ctrl-C"):
                    result.problems.append(f"copy button did not react (label {label!r})")
                try:
                    result.copied = page.evaluate("() => navigator.clipboard.readText()")
                except Exception:  # noqa: BLE001 - clipboard unreadable here; the label was checked
                    result.copied = None
            page.evaluate("() => window.scrollTo(0, 0)")
            page.screenshot(path=str(screenshot), full_page=True)
            result.screenshot = screenshot
        finally:
            browser.close()
    result.problems += [f"console error: {e}" for e in result.console_errors]
    return result


def _keep(path: Path) -> None:
    """Copy a screenshot or page to $CHAOS_ARTIFACTS when CI asks for artifacts."""
    dest = os.environ.get("CHAOS_ARTIFACTS")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(dest) / path.name)


def _doc() -> dict[str, Any]:
    """A failing and a passing scenario from real runs (fixtures), the failing one first."""
    fail = json.loads((FIXTURES / "results-fail.json").read_text())
    ok = json.loads((FIXTURES / "results-pass.json").read_text())
    doc = copy.deepcopy(fail)
    doc["scenarios"] = fail["scenarios"] + ok["scenarios"]
    add_phases(doc["scenarios"][0])
    doc["summary"] = {"pass": 1, "fail": 1, "error": 0, "skipped": 0, "total": 2}
    return doc


def add_phases(sc: dict[str, Any]) -> None:
    """Give every save of a scenario named phases and one I/O fault, as a phase-aware checkpointer logs them."""
    extra = []
    for e in sc["timeline"]:
        if e["ev"] == "save_call":
            for i, name in enumerate(("stage", "write_shards", "commit")):
                extra.append({"ev": "phase", "rank": e["rank"], "attempt": e["attempt"], "t": e["t"] + 0.002 + 0.004 * i,
                              "name": name, "step": e["step"]})
    first_call = next(e for e in sc["timeline"] if e["ev"] == "save_call")
    extra.append({"ev": "io_fault", "rank": first_call["rank"], "attempt": 0, "t": first_call["t"] + 0.003,
                  "op": "fsync", "path": "ckpt/<shard>.safetensors", "errno": "EIO"})
    sc["timeline"] = sorted(sc["timeline"] + extra, key=lambda e: e["t"])


EXTRAS: dict[str, Any] = {
    "bench": {"payload_bytes": 100_000_000, "config": {"world_size": 2, "repeats": 3},
              "raw": {"mb_s": 900.0, "seconds": 0.11},
              "results": [{"name": "reference", "save_s": 0.30, "stall_s": 0.30, "load_s": 0.20, "save_mb_s": 330, "correct": True},
                          {"name": "reference-async", "save_s": 0.35, "stall_s": 0.02, "load_s": 0.20, "save_mb_s": 290, "correct": True},
                          {"name": "dcp", "save_s": 0.50, "stall_s": 0.50, "load_s": 0.25, "save_mb_s": 200, "correct": True},
                          {"name": "torch-save", "skipped": "not installed"}]},
    "young_daly": {"save_seconds": 30.0, "mtbf_seconds": 86_400.0, "step_seconds": 1.5},
    "certification": {"properties": [{"name": "bit-exact resume", "verdict": "pass", "evidence": {"scenarios": 12}},
                                     {"name": "atomic commit", "verdict": "fail", "evidence": "crash state 17 loads a mixture"}]},
    "thresholds": {"stall_seconds": 0.05, "load_seconds": 0.1},
}


def test_report_renders_every_chart_without_errors(tmp_path: Path) -> None:
    page = report_html.render_report(_doc(), tmp_path / "report.html", EXTRAS)
    check = check_report(page, tmp_path / "report.png")
    _keep(tmp_path / "report.png")
    _keep(page)
    assert check.problems == []
    figs = {c["fig"] for c in check.charts}
    # 2 scenarios x (loss, timeline, metrics) + bench (2) + Young/Daly
    assert {"s0-loss", "s0-timeline", "s0-metrics", "s1-loss", "s1-timeline", "s1-metrics",
            "bench-times", "bench-overhead", "young-daly"} <= figs
    assert all(c["points"] > 0 for c in check.charts)
    if check.copied is not None:  # clipboard readable in this Chromium: the whole replay command arrived
        assert check.copied.startswith("chaos run ") and "--fault" in check.copied
    assert check.screenshot and check.screenshot.stat().st_size > 10_000


def test_checker_flags_an_empty_chart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = report_html.loss_figure

    def hollow(sc: dict[str, Any], div: dict[str, Any] | None) -> dict[str, Any] | None:
        fig = real(sc, div)
        return {"data": [], "layout": fig["layout"]} if fig else None

    monkeypatch.setattr(report_html, "loss_figure", hollow)
    page = report_html.render_report(_doc(), tmp_path / "empty.html")
    check = check_report(page, tmp_path / "empty.png", click_copy=False)
    assert any("chart s0-loss is empty" in p for p in check.problems), check.problems
    assert not any("timeline" in p for p in check.problems)  # only the broken chart is flagged


def test_checker_flags_a_javascript_error(tmp_path: Path) -> None:
    page = report_html.render_report(_doc(), tmp_path / "broken.html")
    text = page.read_text(encoding="utf-8")
    page.write_text(text.replace("</body>", "<script>undefinedFunctionOfABrokenReport();</script></body>"),
                    encoding="utf-8")
    check = check_report(page, tmp_path / "broken.png", click_copy=False)
    assert any("undefinedFunctionOfABrokenReport" in p for p in check.problems), check.problems


def test_checker_flags_a_chart_that_fails_to_draw(tmp_path: Path) -> None:
    page = report_html.render_report(_doc(), tmp_path / "bad-fig.html")
    text = page.read_text(encoding="utf-8")
    # point one chart at a figure that does not exist: the page logs an error and shows it
    page.write_text(text.replace('data-fig="s1-timeline"', 'data-fig="no-such-figure"', 1), encoding="utf-8")
    check = check_report(page, tmp_path / "bad-fig.png", click_copy=False)
    assert any("no-such-figure not rendered" in p for p in check.problems), check.problems
    assert any(p.startswith("console error") for p in check.problems), check.problems
