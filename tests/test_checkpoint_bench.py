"""`chaos bench`: report structure and ratios computed from the measured numbers.

No timing is asserted (this machine is shared and noisy); the tiny end-to-end run checks
that every checkpointer loaded bit-exact and that a missing one is skipped with a note.
"""

from __future__ import annotations

import argparse
import json

import pytest

from chaos import bench
from chaos.commands import bench as bench_cmd


def _measured() -> dict:
    return {
        "payload_bytes": 100_000_000,
        "raw_s": 0.2,
        "results": [
            {"name": "reference", "skipped": None, "save_s": 0.25, "stall_s": 0.25, "load_s": 0.3, "save_mb_s": 400.0, "correct": True},
            {"name": "reference-async", "skipped": None, "save_s": 0.3, "stall_s": 0.05, "load_s": 0.3, "save_mb_s": 333.0, "correct": True},
            {"name": "reference-async-trust", "skipped": None, "save_s": 0.3, "stall_s": 0.02, "load_s": 0.3, "save_mb_s": 333.0, "correct": True},
            {"name": "dcp", "skipped": None, "save_s": 0.5, "stall_s": 0.5, "load_s": 0.2, "save_mb_s": 200.0, "correct": True},
            {"name": "dcp-async", "skipped": None, "save_s": 0.5, "stall_s": 0.08, "load_s": 0.2, "save_mb_s": 200.0, "correct": True},
            {"name": "torch-save", "skipped": "cannot import", "save_s": 0, "stall_s": 0, "load_s": 0, "save_mb_s": 0, "correct": False},
        ],
    }


def test_ratios_come_from_measured_numbers():
    r = bench.make_report(bench.BenchConfig(size_mb=100), _measured())
    assert r["raw"]["mb_s"] == pytest.approx(500.0)
    assert r["ratios"]["reference_vs_raw"] == pytest.approx(400.0 / 500.0)
    assert r["ratios"]["reference_vs_dcp_save"] == pytest.approx(0.5 / 0.25)
    assert r["ratios"]["async_stall_vs_dcp_async"] == pytest.approx(0.05 / 0.08)
    assert r["ratios"]["async_stall_trust_vs_dcp_async"] == pytest.approx(0.02 / 0.08)
    assert r["ratios"]["verified_load_vs_dcp_load"] == pytest.approx(0.3 / 0.2)
    assert r["meets_target"] == {"reference_vs_raw": True, "reference_vs_dcp_save": True,
                                 "async_stall_vs_dcp_async": False, "async_stall_trust_vs_dcp_async": True,
                                 "verified_load_vs_dcp_load": False}
    md = bench.to_markdown(r)
    assert "| torch-save | - |" in md and "skipped: cannot import" in md and "| reference_vs_raw | 0.800 |" in md


def test_missing_comparison_gives_no_ratio():
    m = _measured()
    m["results"] = [x for x in m["results"] if not x["name"].startswith("dcp")]
    r = bench.make_report(bench.BenchConfig(), m)
    assert r["ratios"]["reference_vs_dcp_save"] is None and r["meets_target"]["reference_vs_dcp_save"] is None
    assert r["ratios"]["reference_vs_raw"] is not None


def test_tiny_end_to_end_run(tmp_path, capsys):
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    out = tmp_path / "r.json"
    md = tmp_path / "r.md"
    args = p.parse_args(["--size-mb", "1", "--repeats", "1", "--only", "reference,reference-async-trust,no-such-ckpt",
                         "--dir", str(tmp_path), "--json", str(out), "--markdown", str(md)])
    assert bench_cmd.run(args) == 0
    r = json.loads(out.read_text())
    by = {x["name"]: x for x in r["results"]}
    assert by["no-such-ckpt"]["skipped"] and "unknown checkpointer" in by["no-such-ckpt"]["skipped"]
    for name in ("reference", "reference-async-trust"):
        x = by[name]
        assert x["correct"] and x["save_s"] > 0 and x["load_s"] > 0
        assert x["save_mb_s"] == pytest.approx(r["payload_bytes"] / x["save_s"] / 1e6)
    assert r["ratios"]["reference_vs_raw"] == pytest.approx(by["reference"]["save_mb_s"] / r["raw"]["mb_s"])
    assert r["ratios"]["reference_vs_dcp_save"] is None
    assert "checkpoint bench" in capsys.readouterr().out and md.read_text().startswith("# chaos bench")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("chaos-bench-")] == []
