"""``chaos bench scale``: settings, the tables it renders, and a tiny real run of every section.

Nothing here is timed: the real run (``slow``) checks that each section came from the
bench that owns it and that its numbers are consistent (min <= median <= max, checked +
pruned = generated, every load bit-exact, the campaign's rate is its count over its
wall time); the fast tests check the options and what the tables say about each row.
"""

from __future__ import annotations

import argparse
import json

import pytest

from chaos.bench import scale as scalebench
from chaos.cli import main as cli
from chaos.errors import ConfigError


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    scalebench.add_arguments(p)
    return p.parse_args(list(argv))


def test_quick_defaults_and_explicit_options_win():
    full = scalebench.settings(_args())
    assert full["world_sizes"] == (1, 2, 4, 8) and full["sizes_mb"] == (10.0, 100.0, 1000.0)
    assert full["shards"] == (2, 4, 8) and full["sections"] == scalebench.SECTIONS and full["campaign"] == []
    quick = scalebench.settings(_args("--quick", "--shards", "2,4"))
    assert quick["world_sizes"] == (1, 2) and quick["sizes_mb"] == (10.0,) and quick["shards"] == (2, 4)
    assert quick["campaign"] == ["--steps", "16", "--save-every", "4"]
    assert cli.make_parser().parse_args(["bench-scale", "--quick"]).handler is scalebench.run


@pytest.mark.parametrize("argv,message", [
    (["--sections", "kill,speed"], "unknown --sections speed"),
    (["--world-sizes", "0,2"], "--world-sizes must be positive"),
    (["--sizes-mb", "10,-1"], "--sizes-mb must be positive"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--campaign-args", "--json x.json"], "--campaign-args sets the campaign"),
    (["--campaign-args", "'unclosed"], "--campaign-args"),
    (["--kill-steps", "1"], "--kill-steps must be at least 2"),
])
def test_impossible_settings_are_config_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        scalebench.settings(_args(*argv))


def test_cli_says_a_bad_option_in_one_line(capsys):
    assert cli.main(["bench-scale", "--sections", "nothing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chaos: error: chaos bench scale: unknown --sections nothing") and "Traceback" not in err


def _doc() -> dict:
    spread = {"min": 1.0, "median": 2.0, "max": 3.0, "per_repeat": [1.0, 2.0, 3.0]}
    result = {"name": "reference", "skipped": None, "correct": True, "save_mb_s": 50.0,
              "spread": {"save_s": spread, "stall_s": spread, "load_s": spread}}
    return {
        "date": "2026-12-04T14:00+00:00", "seconds": 12.0,
        "machine": {"cpus": 2, "torch": "2.13.0", "load_avg_before": [0.5], "load_avg_after": [0.7]},
        "settings": {"kill_checkpointer": "torch-save", "kill_steps": 40, "kill_repeats": 3, "repeats": 3,
                     "bench_world_size": 2, "device": "cpu", "crash_exhaustive": False, "max_states": 500},
        "kill": [{"world_size": 2, "cores": 2, "ranks_per_core": 1.0, "oversubscribed": False, "ok": True,
                  "seconds": spread, "first_with_golden_s": 9.5, "verdicts": ["pass"] * 4, "failing_oracles": []},
                 {"world_size": 8, "cores": 2, "ranks_per_core": 4.0, "oversubscribed": True, "ok": False,
                  "seconds": spread, "first_with_golden_s": 30.0, "verdicts": ["fail", "fail"],
                  "failing_oracles": ["bit_exact"], "error": "fail: rank 0 step 22 (attempt 1): loss differs"},
                 {"world_size": 16, "cores": 2, "ranks_per_core": 8.0, "oversubscribed": True, "ok": False,
                  "error": "HarnessError: no fork server"}],
        "save": [{"size_mb": 1000.0, "ok": True, "results": [result, {"name": "dcp", "skipped": "cannot import"}],
                  "raw": {"mb_s_spread": {"min": 400.0, "median": 500.0, "max": 600.0}},
                  "ratio_spread": {"reference_vs_dcp_save": {"min": 0.9, "median": 1.1, "max": 1.3}}}],
        "crash": [{"shards": 4, "ok": True, "total_possible": 900, "states_generated": 60, "states_distinct": 40,
                   "states_checked": 40, "states_pruned": 20, "states_per_s": 55.5, "cpu_ms_per_state": 20.1,
                   "checkpointer": "chaos.reference.checkpoint.engine:ReferenceCheckpointer",
                   "violation_count": 0}],
        "campaign": {"command": "chaos run", "ok": True, "scenarios": 9, "verdicts": {"pass": 8, "skipped": 1},
                     "wall_s": 90.0, "per_minute": 6.0, "after_first_s": 8.0, "per_minute_after_first": 7.5},
    }


def test_tables_say_what_each_row_is():
    text = scalebench.to_markdown(_doc())
    assert "| 2 | 1 | 1.000 / 2.000 / 3.000 | 9.500 | pass x4 |" in text
    assert "| 8 | 4 (oversubscribed: 8 ranks on 2 cores) | 1.000 / 2.000 / 3.000 | 30.000 | fail x2 (bit_exact) |" in text
    assert "World size 8: fail: rank 0 step 22 (attempt 1): loss differs" in text
    assert "| 16 | 8 (oversubscribed: 16 ranks on 2 cores) | failed: HarnessError: no fork server | - | - |" in text
    assert "| 1 GB | reference | 1.000 / 2.000 / 3.000 | 1.000 / 2.000 / 3.000 | 1.000 / 2.000 / 3.000 | 50 |" in text
    assert "| 1 GB | dcp | skipped: cannot import |" in text
    assert "| 1 GB | 400 / 500 / 600 | - | 1.10 (0.90-1.30) | - | - |" in text
    assert "| 4 | 900 | 60 | 40 | 40 | 20 | 55.5 | 20.1 | 0 |" in text
    assert "| 9 | 8 pass, 1 skipped | 90.0 | 6.0 | 8.0 | 7.5 |" in text
    assert "--max-states 500 --exhaustive-limit 0" in text and "2026-12-04" in text
    assert "**Power-loss crash states of one save** (ReferenceCheckpointer," in text


@pytest.mark.slow
def test_a_tiny_run_of_every_section_gives_sane_tables(tmp_path, capsys):
    out, md = tmp_path / "scale.json", tmp_path / "scale.md"
    args = _args("--world-sizes", "1", "--kill-repeats", "2", "--kill-steps", "8", "--sizes-mb", "1",
                 "--repeats", "2", "--shards", "2", "--max-states", "10",
                 "--campaign-args", "--fault kill:rank=0,step=3 --steps 6 --save-every 2 --world-size 1",
                 "--dir", str(tmp_path), "--json", str(out), "--markdown", str(md))
    assert scalebench.run(args) == 0
    doc = json.loads(out.read_text())
    assert doc["ok"]

    (kill,) = doc["kill"]
    assert kill["ok"] and kill["world_size"] == 1 and kill["verdicts"] == ["pass"] * 3
    assert len(kill["seconds"]["per_repeat"]) == 2 and "--world-size 1" in kill["replay"]
    assert 0 < kill["seconds"]["min"] <= kill["seconds"]["median"] <= kill["seconds"]["max"]
    assert kill["first_with_golden_s"] > 0 and kill["oversubscribed"] is (1 > kill["cores"])

    (save,) = doc["save"]
    assert save["ok"] and [r["name"] for r in save["results"]] == list(scalebench.SAVE_CHECKPOINTERS)
    for r in save["results"]:
        s = r["spread"]["save_s"]
        assert r["correct"] and 0 < s["min"] <= s["median"] <= s["max"] and len(s["per_repeat"]) == 2
    assert all(save["ratios"][k] is not None for k in ("reference_vs_raw", "reference_vs_dcp_save",
                                                       "async_stall_vs_dcp_async", "verified_load_vs_dcp_load"))

    (crash,) = doc["crash"]
    assert crash["ok"] and crash["shards"] == 2 and crash["violation_count"] == 0 and not crash["exhaustive"]
    assert 0 < crash["states_checked"] <= crash["states_distinct"] <= crash["states_generated"] <= crash["total_possible"]
    assert crash["states_checked"] + crash["states_pruned"] == crash["states_generated"]

    c = doc["campaign"]
    assert c["ok"] and c["scenarios"] == 1 and c["verdicts"] == {"pass": 1}
    assert c["per_minute"] == pytest.approx(60.0 / c["wall_s"])

    text = md.read_text()
    for heading in ("**One kill scenario", "**Save, stall and load", "**Power-loss crash states of one save** "
                    "(ReferenceCheckpointer", "**Campaign**"):
        assert heading in text
    assert text in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("chaos-bench")] == []
