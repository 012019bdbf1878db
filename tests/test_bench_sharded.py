"""`chaos bench --workload parallel=fsdp`: report structure, per-repeat ratios, bytes read, bad combinations.

The end-to-end test runs the real thing at a tiny size (two gloo ranks holding the
workload's FSDP2 state, then one rank loading it resharded) and checks what the report
says — every load matched the saved fingerprints, ratios are the quotients of the
measured seconds, the reference read less than its checkpoint — never how fast anything
was (this machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import json

import pytest

from chaos.bench import checkpoint as bench
from chaos.bench import save as bench_cmd
from chaos.bench import sharded as bench_sharded
from chaos.cli import main as cli
from chaos.errors import ConfigError

EXISTING_KEYS = {"config", "payload_bytes", "raw", "results", "ratios", "targets", "meets_target"}
MEASURES = [m[0] for m in bench_sharded.MEASURES]


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    return p.parse_args(list(argv))


def test_tiny_fsdp_bench_end_to_end(tmp_path, capsys):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    args = _args("--workload", "parallel=fsdp", "--size-mb", "1.5", "--repeats", "1", "--world-size", "2",
                 "--dir", str(tmp_path), "--json", str(out), "--markdown", str(md))
    assert bench_cmd.run(args) == 0
    r = json.loads(out.read_text())
    assert EXISTING_KEYS <= set(r) and r["config"]["parallel"] == "fsdp"
    assert [x["name"] for x in r["results"]] == ["reference", "reference-async", "dcp", "dcp-async"]
    assert all(x["correct"] and x["save_s"] > 0 and x["load_s"] > 0 for x in r["results"])

    f = r["fsdp"]
    assert (f["world_size"], f["resharded_world_size"]) == (2, 1)
    assert f["correct"] == {"reference": {"load": True, "resharded_load": True},
                            "dcp": {"load": True, "resharded_load": True}}
    assert 1e6 < f["state_bytes"] < 3e6 and f["state_bytes"] == r["payload_bytes"]
    for key in MEASURES:
        ref, dcp = f["seconds"]["reference"][key], f["seconds"]["dcp"][key]
        ratio = f["ratios"][key]
        assert len(ref) == len(dcp) == 1 and ref[0] > 0 and dcp[0] > 0
        assert ratio["per_repeat"] == pytest.approx([ref[0] / dcp[0]])
        assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]

    size = f["checkpoint_bytes"]["reference"]
    b = f["bytes_read"]
    assert len(b["reference_load_per_rank"]) == 2 and len(b["reference_resharded_per_rank"]) == 1
    # same world: each rank reads about its half; resharded onto one rank: all slices, but
    # never the other rank's per-rank values, so still less than the whole checkpoint
    assert all(0 < frac < 0.6 for frac in b["reference_load_fraction"])
    assert 0.5 < b["reference_resharded_fraction"][0] < 1.0 and b["reference_resharded_per_rank"][0] < size
    assert b["reference_resharded_fraction"][0] == pytest.approx(b["reference_resharded_per_rank"][0] / size)

    text = md.read_text()
    assert "## fsdp:" in text and "| load, resharded 2 -> 1 |" in text and "| sync save |" in text
    assert "fsdp:" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("chaos-bench-")] == []


def _series(ref: list[float], dcp: list[float]) -> tuple[dict, dict]:
    """Phase results shaped as the ranks send them, every measure taking the given seconds."""
    def loads(values):
        return [{"seconds": s, "ok": True, "bytes_read": [10, 10], "syscall_read": [11, 11]} for s in values]

    seconds = {n: {"save": ref if n.startswith("reference") else dcp, "stall": [x / 10 for x in (ref if n.startswith("reference") else dcp)],
                   "load": []} for n in bench_sharded.CHECKPOINTERS}
    first = {"payload_bytes": 40, "raw_all_s": [0.1 * (i + 1) for i in range(len(ref))], "seconds": seconds,
             "loads": {"reference": loads(ref), "dcp": loads(dcp)}, "checkpoint_bytes": {"reference": 40, "dcp": 44},
             "fingerprint": {}, "step": len(ref)}
    second = {"loads": {"reference": [{**x, "bytes_read": [30]} for x in loads(ref)], "dcp": loads(dcp)}}
    return first, second


def test_ratios_are_per_repeat_pairs_with_min_median_max():
    first, second = _series([1.0, 2.0, 6.0], [2.0, 1.0, 3.0])
    cfg = bench.BenchConfig(size_mb=1, world_size=2, repeats=3, parallel="fsdp")
    r = bench_sharded.make_report(cfg, {"d_model": 64, "n_layers": 1}, first, second)
    for key in MEASURES:
        assert r["fsdp"]["ratios"][key] == {"min": 0.5, "median": 2.0, "max": 2.0, "per_repeat": [0.5, 2.0, 2.0]}
    # chaos bench's keys, per repeat pair too: dcp time / reference time = 2, 0.5, 0.5
    assert r["ratio_spread"]["reference_vs_dcp_save"]["per_repeat"] == pytest.approx([2.0, 0.5, 0.5])
    assert r["ratios"]["reference_vs_dcp_save"] == pytest.approx(0.5)
    # the raw sample of each repeat against the reference's save of that repeat: 0.1/1, 0.2/2, 0.3/6
    assert r["ratio_spread"]["reference_vs_raw"]["per_repeat"] == pytest.approx([0.1, 0.1, 0.05])
    assert r["ratios"]["async_stall_trust_vs_dcp_async"] is None
    assert r["fsdp"]["bytes_read"]["reference_resharded_fraction"] == [0.75]
    assert r["fsdp"]["bytes_read"]["reference_load_fraction"] == [0.25, 0.25]
    assert "| load, resharded 2 -> 1 | 2.000 | 2.000 | 0.50 | 2.00 | 2.00 |" in bench_cmd.to_markdown(r)


@pytest.mark.parametrize("mb", [1.5, 100.0, 1000.0])
def test_model_is_sized_to_the_requested_state(mb):
    d, n = bench_sharded.model_shape(mb * 1e6, vocab=256, seq_len=32, n_heads=4)
    params = 2 * 256 * d + 32 * d + 2 * d + n * (12 * d * d + 13 * d)
    assert d % 32 == 0 and abs(12 * params - mb * 1e6) / (mb * 1e6) < 0.15
    assert bench_sharded.model_shape(mb * 1e6, 256, 32, 4, d_model=128)[0] == 128


@pytest.mark.parametrize("cfg,message", [
    (dict(parallel="fsdp", world_size=1), "needs --world-size 2 or more"),
    (dict(parallel="zero3"), "parallel='zero3' is unknown"),
    (dict(parallel="tp"), "parallel=tp is not benchmarked"),
    (dict(parallel="fsdp", workload={"widht": 3}), "unknown --workload key"),
    (dict(parallel="fsdp", workload={"d_model": 0}), "d_model=0 must be a positive integer"),
    (dict(parallel="ddp", workload={"d_model": 64}), "apply to parallel=fsdp only"),
])
def test_impossible_combinations_are_config_errors(cfg, message):
    with pytest.raises(ConfigError, match=message):
        bench_cmd.run_bench(bench.BenchConfig(**cfg))


def test_cli_reports_a_bad_combination_in_one_line(capsys):
    assert cli.main(["bench", "--workload", "parallel=fsdp", "--world-size", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chaos: error: chaos bench --workload parallel=fsdp needs --world-size 2") and "Traceback" not in err
    assert cli.main(["bench", "--workload", "parallel=fsdp", "--only", "reference"]) == 2
    assert "--only does not apply" in capsys.readouterr().err
