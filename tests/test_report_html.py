"""Fast tests of the HTML report renderer (no browser): size, escaping, content, CLI.

The browser test (test_report_browser.py) proves the charts draw; these prove what
goes into the page, from real results JSONs (tests/fixtures/report, written by
``chaos run --json``) and synthetic variations of them.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from chaos.cli import main as cli
from chaos.errors import ConfigError
from reports import html as report_html

FIXTURES = Path(__file__).parent / "fixtures" / "report"


def _load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def fail_doc() -> dict[str, Any]:
    return _load("results-fail.json")


@pytest.fixture(scope="module")
def pass_doc() -> dict[str, Any]:
    return _load("results-pass.json")


def _with(doc: dict[str, Any], scenarios: list[dict[str, Any]]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["scenarios"] = scenarios
    return out


def _figures(page: str) -> dict[str, Any]:
    """The chart data of a page rendered in gzip mode, unpacked as the browser does."""
    start = page.index('id="chaos-figures-gz"')
    blob = page[page.index(">", start) + 1: page.index("</script>", start)]
    return json.loads(gzip.decompress(base64.b64decode(blob)))


def _strict_json(text: str) -> Any:
    def refuse(const: str) -> Any:
        raise ValueError(f"non-standard JSON constant {const}")

    return json.loads(text, parse_constant=refuse)


def test_hundred_scenarios_stay_small_and_embed_plotly_once(fail_doc: dict, pass_doc: dict) -> None:
    base = [fail_doc["scenarios"][0], pass_doc["scenarios"][0]]
    scenarios = []
    for i in range(100):
        sc = copy.deepcopy(base[0] if i % 10 == 0 else base[1])
        sc["id"] = f"scenario-{i:03d}"
        scenarios.append(sc)
    page = report_html.render_html(_with(pass_doc, scenarios))
    assert len(page.encode()) < 3_000_000, f"{len(page.encode()) / 1e6:.2f} MB for 100 scenarios"
    assert page.count('id="plotly-gz"') == 1
    assert "cdn.plot.ly" not in page and "<script src=" not in page  # opens offline
    figures = _figures(page)
    assert len(figures) == 300  # loss, timeline, metrics for each
    # failing scenarios first and open, passing ones closed (their charts drawn on demand)
    first = page.index('<details class="scenario')
    assert page[first:first + 120].startswith('<details class="scenario fail" id="s0" open')
    assert page.count('<details class="scenario fail"') == 10
    assert page.count('<details class="scenario pass"') == 90
    assert page.count("<details class=\"scenario pass\" id=\"s1\" open") == 0


def test_inline_mode_embeds_plotly_js_exactly_once(pass_doc: dict) -> None:
    page = report_html.render_html(pass_doc, plotly_js="inline")
    banner = report_html.plotly_bundle("inline")[:60]
    assert page.count(banner) == 1
    assert page.count("plotly.js v") >= 1
    start = page.index('id="chaos-figures">') + len('id="chaos-figures">')
    figures = _strict_json(page[start: page.index("</script>", start)])
    assert set(figures) == {"s0-loss", "s0-timeline", "s0-metrics"}


def test_everything_from_the_json_is_escaped(pass_doc: dict) -> None:
    evil = '<script>alert("x")</script>'
    sc = copy.deepcopy(pass_doc["scenarios"][0])
    sc["id"] = f"id-{evil}"
    sc["checkpointer"] = f"ck{evil}"
    sc["error"] = f"boom {evil}"
    sc["oracles"]["bit_exact"]["summary"] = f"sum {evil}"
    sc["fired"][0]["spec"] = f"kill{evil}"
    doc = _with(pass_doc, [sc])
    doc["environment"]["torch"] = evil
    for mode in ("gzip", "inline"):
        page = report_html.render_html(doc, {"title": f"T{evil}", "properties": [
            {"name": evil, "verdict": "fail", "evidence": {"k": evil}}]}, plotly_js=mode)
        assert evil not in page, mode
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page
    # inside the chart data the id is escaped for plotly's label markup too
    labels = json.dumps(_figures(report_html.render_html(doc)))
    assert "<script>" not in labels and "&lt;script&gt;" in labels


def test_failing_scenario_shows_replay_and_first_divergence(fail_doc: dict) -> None:
    sc = fail_doc["scenarios"][0]
    div = report_html.first_divergence(sc)
    # the bit-exact oracle's own evidence names the same step and rank
    oracle = sc["oracles"]["bit_exact"]["evidence"]["first_loss_difference"]
    assert div is not None and (div["rank"], div["step"], div["attempt"]) == (
        oracle["rank"], oracle["step"], oracle["attempt"])
    page = report_html.render_html(fail_doc)
    assert f'<code id="replay-0">{sc["replay"]}</code>' in page.replace("&#39;", "'")
    assert 'class="copy" data-target="replay-0"' in page
    assert f"step {div['step']} on rank {div['rank']}" in page
    loss = _figures(page)["s0-loss"]
    marker = next(t for t in loss["data"] if t["name"] == "first divergence")
    assert marker["x"] == [div["step"], div["step"]]
    notes = " ".join(a["text"] for a in loss["layout"]["annotations"])
    assert "kill:rank=1,step=23" in notes and "resumed at step 20" in notes and "first divergence" in notes


def test_passing_scenario_has_no_divergence(pass_doc: dict) -> None:
    assert report_html.first_divergence(pass_doc["scenarios"][0]) is None
    page = report_html.render_html(pass_doc)
    assert "First divergence" not in page
    assert 'id="s0" open' not in page


def test_optional_sections_only_with_extras(pass_doc: dict) -> None:
    page = report_html.render_html(pass_doc)
    figures = _figures(page)
    for marker in ('id="certification"', 'id="bench"', 'id="young-daly"'):
        assert marker not in page
    assert not {"bench-times", "bench-overhead", "young-daly"} & set(figures)
    extras = {
        "bench": {"results": [{"name": "reference", "save_s": 0.3, "stall_s": 0.001, "load_s": 0.2, "save_mb_s": 300,
                               "correct": True},
                              {"name": "dcp", "save_s": 0.5, "stall_s": 0.5, "load_s": 0.2, "save_mb_s": 200,
                               "correct": True}]},
        "save_seconds": 30, "mtbf_seconds": 86_400,
        "properties": [{"name": "atomic commit", "verdict": "pass", "evidence": "42 crash states"}],
    }
    page = report_html.render_html(pass_doc, extras)
    figures = _figures(page)
    for marker in ('id="certification"', 'id="bench"', 'id="young-daly"', "atomic commit", "42 crash states"):
        assert marker in page
    assert {"bench-times", "bench-overhead", "young-daly"} <= set(figures)
    # overhead uses the step time measured in the scenarios: the 1 ms stall is under 2 %, 0.5 s is not
    colors = figures["bench-overhead"]["data"][0]["marker"]["color"]
    assert colors == ["#59a14f", "#d62728"]


def test_young_daly_optimum_is_minimum_of_the_curve() -> None:
    c, m = 30.0, 86_400.0
    calc = report_html.young_daly(c, m)
    assert calc["optimum"] == pytest.approx(math.sqrt(2 * c * m))
    totals = [a + b for a, b in zip(calc["save"], calc["lost"], strict=True)]
    best = calc["taus"][totals.index(min(totals))]
    assert best == pytest.approx(calc["optimum"], rel=0.05)  # grid of 200 log-spaced points
    assert calc["total_at_optimum"] == pytest.approx(c / calc["optimum"] + (calc["optimum"] / 2 + c) / m)


def test_thresholds_raise_alerts(pass_doc: dict) -> None:
    page = report_html.render_html(pass_doc, {"thresholds": {"stall_seconds": 0.001}})
    assert "alert:</b> save() stall: 16 of 16 above 0.001 s" in page
    with pytest.raises(ConfigError, match="unknown threshold"):
        report_html.render_html(pass_doc, {"thresholds": {"stal": 1}})


def test_phases_and_io_faults_reach_the_timeline(pass_doc: dict) -> None:
    sc = copy.deepcopy(pass_doc["scenarios"][0])
    call = next(e for e in sc["timeline"] if e["ev"] == "save_call")
    sc["timeline"] += [
        {"ev": "phase", "rank": call["rank"], "attempt": 0, "t": call["t"] + 0.01, "name": "write_shards", "step": 5},
        {"ev": "phase", "rank": call["rank"], "attempt": 0, "t": call["t"] + 0.02, "name": "commit", "step": 5},
        {"ev": "io_fault", "rank": call["rank"], "attempt": 0, "t": call["t"] + 0.015, "op": "fsync", "errno": "EIO"},
    ]
    timeline = _figures(report_html.render_html(_with(pass_doc, [sc])))["s0-timeline"]
    names = {t["name"] for t in timeline["data"]}
    assert {"phase write_shards", "phase commit", "I/O fault", "save() blocking", "fault fired", "ack (durable)"} <= names
    write = next(t for t in timeline["data"] if t["name"] == "phase write_shards")
    assert write["x"] == [pytest.approx(0.01, abs=1e-3)]  # lasts until the next phase


def test_nan_losses_and_missing_parts_still_render(pass_doc: dict) -> None:
    sc = copy.deepcopy(pass_doc["scenarios"][0])
    sc["losses"]["0"][30]["loss"] = float("nan")
    bare = {"id": "harness-broke", "verdict": "error", "error": "HarnessError: could not launch ranks"}
    page = report_html.render_html(_with(pass_doc, [sc, bare]), plotly_js="inline")
    start = page.index('id="chaos-figures">') + len('id="chaos-figures">')
    figures = _strict_json(page[start: page.index("</script>", start)])  # NaN became null, not invalid JSON
    assert any(None in t["y"] for t in figures["s0-loss"]["data"] if t["name"].startswith("r0 attempt"))
    assert "could not launch ranks" in page and "nothing to chart" in page


def test_downsample_keeps_extremes_and_marked_steps() -> None:
    xs = list(range(1, 10_001))
    ys = [math.sin(x / 50) for x in xs]
    ys[5000] = 100.0  # a spike
    dx, dy = report_html.downsample(xs, ys, max_points=400, keep={7777})
    assert len(dx) <= 420
    assert 100.0 in dy and 7777 in dx and dx[0] == 1 and dx[-1] == 10_000


@pytest.fixture
def chaos_main(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`chaos`, whose report subcommand chaos/cli/main.py's EXTRA_COMMANDS registers."""
    assert "chaos.cli.commands.report" in cli.EXTRA_COMMANDS
    return cli.main


def test_cli_writes_report(tmp_path: Path, capsys: pytest.CaptureFixture[str], chaos_main: Any) -> None:
    interval = tmp_path / "interval.json"
    interval.write_text(json.dumps({"save_seconds": 30, "mtbf_seconds": 86_400, "interval_seconds": 3000}))
    out = tmp_path / "out" / "r.html"
    rc = chaos_main(["report", str(FIXTURES / "results-fail.json"), "-o", str(out), "--interval", str(interval),
                     "--alert", "stall_seconds=0.05"])
    assert rc == 0 and out.exists()
    page = out.read_text()
    assert 'id="young-daly"' in page and "results-fail.json" in page
    assert "report written to" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    (None, "results file not found"),
    ("{not json", "is not valid JSON"),
    ('{"schema_version": 1}', "is not a chaos results JSON"),
])
def test_cli_bad_input_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None,
                                         message: str, chaos_main: Any) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    rc = chaos_main(["report", str(path), "-o", str(tmp_path / "r.html")])
    captured = capsys.readouterr()
    text = captured.err + captured.out
    assert rc == 2
    assert message in text and str(path) in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_cli_bad_extras_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], chaos_main: Any) -> None:
    bench = tmp_path / "bench.json"
    bench.write_text('{"rows": []}')
    rc = chaos_main(["report", str(FIXTURES / "results-pass.json"), "-o", str(tmp_path / "r.html"), "--bench", str(bench)])
    captured = capsys.readouterr()
    assert rc == 2 and str(bench) in captured.out + captured.err
