"""`chaos bench`: report structure, per-repeat-pair ratios with min / median / max, and --device cuda's CPU side.

No timing is asserted (this machine is shared and noisy); the tiny end-to-end run checks
that every checkpointer loaded bit-exact, that compared checkpointers ran back to back
with the first one alternating, that each ratio is the quotient of the same repeat's
seconds, and that a missing one is skipped with a note. ``--device cuda`` is checked
here for what happens before any rank starts (its GPU run is ``suites/test_gpu.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics

import pytest

from chaos.bench import checkpoint as bench
from chaos.bench import ranks as bench_ranks
from chaos.bench import save as bench_cmd
from chaos.cli import main as cli
from chaos.errors import ConfigError


def _measured() -> dict:
    """An old-shaped measurement: medians only, no per-repeat series."""
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


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_cmd.add_arguments(p)
    return p.parse_args(list(argv))


def test_ratios_of_a_report_without_repeats_come_from_its_medians():
    r = bench.make_report(bench.BenchConfig(size_mb=100), _measured())
    assert r["raw"]["mb_s"] == pytest.approx(500.0)
    assert r["ratios"]["reference_vs_raw"] == pytest.approx(400.0 / 500.0)
    assert r["ratios"]["reference_vs_dcp_save"] == pytest.approx(0.5 / 0.25)
    assert r["ratios"]["async_stall_vs_dcp_async"] == pytest.approx(0.05 / 0.08)
    assert r["ratios"]["async_stall_trust_vs_dcp_async"] == pytest.approx(0.02 / 0.08)
    assert r["ratios"]["verified_load_vs_dcp_load"] == pytest.approx(0.3 / 0.2)
    assert r["ratio_spread"]["reference_vs_dcp_save"]["per_repeat"] == [pytest.approx(2.0)]
    assert r["meets_target"] == {"reference_vs_raw": True, "reference_vs_dcp_save": True,
                                 "async_stall_vs_dcp_async": True, "async_stall_trust_vs_dcp_async": True,
                                 "verified_load_vs_dcp_load": False, "async_stall_over_floor": None}
    md = bench.to_markdown(r)
    assert "| torch-save | - |" in md and "skipped: cannot import" in md
    assert "| reference_vs_raw | 0.800 | 0.800 | 0.800 | 0.80 | >= 0.8 | True |" in md


def test_ratios_are_computed_per_repeat_pair_not_from_medians():
    m = _measured()
    by = {x["name"]: x for x in m["results"]}
    by["reference"]["extra"] = {"save_all_s": [0.2, 0.4, 0.3], "stall_all_s": [0.2, 0.4, 0.3],
                                "load_all_s": [0.1, 0.3, 0.2], "raw_all_s": [0.1, 0.2, 0.3]}
    by["dcp"]["extra"] = {"save_all_s": [0.4, 0.2, 0.6], "stall_all_s": [0.4, 0.2, 0.6],
                          "load_all_s": [0.2, 0.3, 0.1], "raw_all_s": [0.1, 0.1, 0.1]}
    r = bench.make_report(bench.BenchConfig(repeats=3), m)
    save = r["ratio_spread"]["reference_vs_dcp_save"]
    assert save["per_repeat"] == pytest.approx([2.0, 0.5, 2.0])
    assert (save["min"], save["median"], save["max"]) == pytest.approx((0.5, 2.0, 2.0))
    # the ratio of the medians (0.4 / 0.3) would hide that one repeat went the other way
    assert r["ratios"]["reference_vs_dcp_save"] == pytest.approx(2.0)
    assert r["ratio_spread"]["verified_load_vs_dcp_load"]["per_repeat"] == pytest.approx([0.5, 1.0, 2.0])
    # bandwidth over the raw sample taken just before the same save
    assert r["ratio_spread"]["reference_vs_raw"]["per_repeat"] == pytest.approx([0.5, 0.5, 1.0])
    ref = {x["name"]: x for x in r["results"]}["reference"]["spread"]
    assert (ref["save_s"]["min"], ref["save_s"]["median"], ref["save_s"]["max"]) == pytest.approx((0.2, 0.3, 0.4))
    assert ref["vs_raw"]["median"] == pytest.approx(0.5)
    assert "| reference | 0.200 / 0.300 / 0.400 |" in bench.to_markdown(r)


def test_compared_checkpointers_form_groups_that_alternate():
    assert bench.groups(list(bench.DEFAULT_CHECKPOINTERS)) == [
        ("reference", "dcp"), ("reference-async", "dcp-async", "reference-async-trust"), ("torch-save",)]
    assert bench.groups(["torch-save", "dcp", "reference"]) == [("torch-save",), ("reference", "dcp")]
    assert bench.groups(["reference-async-trust", "dcp-async"]) == [("dcp-async", "reference-async-trust")]
    assert bench_ranks.ordered(("a", "b", "c"), 0) == ("a", "b", "c")
    assert bench_ranks.ordered(("a", "b", "c"), 1) == ("c", "b", "a")


def test_missing_comparison_gives_no_ratio():
    m = _measured()
    m["results"] = [x for x in m["results"] if not x["name"].startswith("dcp")]
    r = bench.make_report(bench.BenchConfig(), m)
    assert r["ratios"]["reference_vs_dcp_save"] is None and r["meets_target"]["reference_vs_dcp_save"] is None
    assert r["ratio_spread"]["reference_vs_dcp_save"] is None
    assert r["ratios"]["reference_vs_raw"] is not None


def test_tiny_end_to_end_run(tmp_path, capsys):
    out = tmp_path / "r.json"
    md = tmp_path / "r.md"
    args = _args("--size-mb", "1", "--repeats", "2", "--only", "reference,dcp,no-such-ckpt",
                 "--dir", str(tmp_path), "--json", str(out), "--markdown", str(md))
    assert bench_cmd.run(args) == 0
    r = json.loads(out.read_text())
    by = {x["name"]: x for x in r["results"]}
    assert by["no-such-ckpt"]["skipped"] and "unknown checkpointer" in by["no-such-ckpt"]["skipped"]
    # back to back in every repeat, the first one alternating
    assert r["schedule"] == [["reference", "dcp"], ["dcp", "reference"]]
    for name in ("reference", "dcp"):
        x = by[name]
        assert x["correct"] and x["save_s"] > 0 and x["load_s"] > 0
        assert x["save_mb_s"] == pytest.approx(r["payload_bytes"] / x["save_s"] / 1e6)
        assert len(x["extra"]["save_all_s"]) == len(x["extra"]["raw_all_s"]) == 2
        assert [type(c) for c in x["extra"]["stall_faults_all"]] == [int, int]
        # one save before the repeats, reported apart and in none of the per-repeat series
        assert x["extra"]["first_stall_s"] > 0 and isinstance(x["extra"]["first_stall_faults"], int)
        s = x["spread"]["save_s"]
        assert s["min"] <= s["median"] <= s["max"] and s["median"] == pytest.approx(x["save_s"])
    ref, dcp = by["reference"]["extra"], by["dcp"]["extra"]
    assert r["ratio_spread"]["reference_vs_dcp_save"]["per_repeat"] == pytest.approx(
        [d / f for d, f in zip(dcp["save_all_s"], ref["save_all_s"], strict=True)])
    assert r["ratios"]["reference_vs_raw"] == pytest.approx(
        statistics.median([w / s for w, s in zip(ref["raw_all_s"], ref["save_all_s"], strict=True)]))
    assert len(r["raw"]["all_seconds"]) == 4  # one raw sample before every save
    assert r["ratios"]["async_stall_vs_dcp_async"] is None
    assert [f["device"] for f in r["ranks"]] == ["cpu", "cpu"] and r["config"]["device"] == "cpu"
    assert "device_copy" not in r
    floor = r["memory_floor"]  # sampled once per repeat on the CPU
    assert floor["bytes_share"] + floor["bytes_rest"] == floor["bytes_all"] > 0
    assert len(floor["copy_share_s"]["per_repeat"]) == len(floor["copy_all_fresh_s"]["per_repeat"]) == 2
    assert "Memory floor per rank" in md.read_text()
    assert re.search(r"First save of the run.*reference [0-9.]+ \(\d+\); dcp [0-9.]+ \(\d+\)", md.read_text())
    printed = capsys.readouterr().out
    assert "chaos bench:" in printed and "| reference_vs_dcp_save |" in printed  # off a terminal: Markdown
    assert md.read_text().startswith("# chaos bench")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("chaos-bench-")] == []


# ----------------------------------------------------------------- --device cuda, before any rank starts
@pytest.fixture
def no_launch(monkeypatch):
    """Fails the test if a rank process would start."""
    def launch(*a, **k):
        raise AssertionError("a rank process was started")
    monkeypatch.setattr(bench_ranks, "launch", launch)


def test_cuda_without_a_gpu_is_one_error_line_before_any_rank(monkeypatch, capsys, no_launch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "--device", "cuda", "--size-mb", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chaos: error: chaos bench --device cuda: no CUDA device: torch.cuda.is_available() is false")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cuda_with_fewer_gpus_than_ranks_is_a_config_error(monkeypatch, no_launch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="2 ranks need 2 CUDA devices"):
        bench_cmd.run_bench(bench_cmd.config(_args("--device", "cuda", "--world-size", "2")))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # a runner whose count disagrees with the list
    with pytest.raises(ConfigError, match="rank 1 has no GPU"):
        bench_cmd.run_bench(bench_cmd.config(_args("--device", "cuda", "--world-size", "2")))


def test_cuda_is_for_the_replicated_bench_only(no_launch):
    with pytest.raises(ConfigError, match="--device cuda measures the replicated state"):
        bench_cmd.run_bench(bench_cmd.config(_args("--device", "cuda", "--workload", "parallel=fsdp")))
    with pytest.raises(SystemExit):
        _args("--device", "tpu")


def test_each_rank_gets_its_own_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert bench_ranks.rank_envs("cpu", 2) == [{}, {}]
    assert bench_ranks.rank_envs("cuda", 2) == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa, GPU-bb,GPU-cc")  # a runner that hands out UUIDs
    assert bench_ranks.rank_envs("cuda", 2) == [{"CUDA_VISIBLE_DEVICES": "GPU-aa"}, {"CUDA_VISIBLE_DEVICES": "GPU-bb"}]


def _environment(rank: int, world: int, key: str) -> list:
    return bench_ranks.gather(os.environ.get(key))


def test_launch_gives_each_rank_its_environment_before_it_starts():
    from chaos.bench import sharded as bench_sharded

    envs = [{"CHAOS_BENCH_PROBE": "first"}, {"CHAOS_BENCH_PROBE": "second"}]
    ctx = bench_sharded._context()  # the forkserver with torch preloaded (the fsdp bench test's too): forks, not imports
    assert bench_ranks.launch(_environment, 2, 120, ("CHAOS_BENCH_PROBE",), ctx, envs) == ["first", "second"]
    with pytest.raises(ValueError, match="1 rank environments for 2 ranks"):
        bench_ranks.launch(_environment, 2, 120, ("X",), envs=[{}])


def test_the_async_stall_is_judged_against_its_floor_in_the_same_repeat_and_against_dcp():
    """#30's restated target: median reference-async stall <= 1.2x its design's floor (per repeat) and <= DCP
    async's median stall; a report without a sampled floor judges nothing there (None, never True)."""
    m = _measured()
    by = {x["name"]: x for x in m["results"]}
    by["reference-async"]["extra"] = {"stall_all_s": [0.020, 0.018, 0.030]}
    by["dcp-async"]["extra"] = {"stall_all_s": [0.040, 0.016, 0.050]}
    m["memory_floor"] = {"bytes_share": 50, "bytes_rest": 50, "bytes_all": 100,
                         "copy_share_all_s": [0.010, 0.010, 0.010], "read_rest_all_s": [0.006, 0.006, 0.006],
                         "copy_all_fresh_all_s": [0.040, 0.040, 0.040]}
    r = bench.make_report(bench.BenchConfig(size_mb=100), m)
    assert r["ratio_spread"]["async_stall_over_floor"]["per_repeat"] == pytest.approx([1.25, 1.125, 1.875])
    assert r["ratios"]["async_stall_over_floor"] == pytest.approx(1.25)
    assert r["meets_target"]["async_stall_over_floor"] is False and r["targets"]["async_stall_over_floor"] == "<= 1.2"
    assert r["ratios"]["async_stall_vs_dcp_async"] == pytest.approx(0.6)  # median of 0.5, 1.125, 0.6
    assert r["meets_target"]["async_stall_vs_dcp_async"] is True and r["targets"]["async_stall_vs_dcp_async"] == "<= 1.0"
    assert "| async_stall_over_floor | 1.125 | 1.250 | 1.875 | 1.25, 1.12, 1.88 | <= 1.2 | False |" in bench.to_markdown(r)


def test_memory_floor_shares_partition_the_state_by_bytes():
    state = bench.make_state(0, 3 * 4 * (5 << 20))  # 5 M floats per kind: several 4 MB tensors each
    floors = [bench.MemoryFloor(state, r, 2) for r in range(2)]
    ptrs = [{t.data_ptr() for t in f.share.values()} for f in floors]
    everything = {t.data_ptr() for t in bench._tensors(state)}
    assert len(everything) == len(bench._tensors(state)) == len(floors[0].tensors)
    assert not ptrs[0] & ptrs[1] and (ptrs[0] | ptrs[1]) == everything
    assert floors[0].bytes_share + floors[0].bytes_rest == floors[0].bytes_all
    assert floors[0].bytes_share == floors[1].bytes_rest
    assert 0.3 < floors[0].bytes_share / floors[0].bytes_all < 0.7, "balanced by bytes"


def test_memory_floor_report_sets_each_stall_against_its_own_design_floor():
    measured = {"bytes_share": 50, "bytes_rest": 50, "bytes_all": 100,
                "copy_share_all_s": [0.010, 0.012], "read_rest_all_s": [0.006, 0.004], "copy_all_fresh_all_s": [0.040, 0.020]}
    by = {"reference-async": {"stall_s": 0.02, "extra": {"stall_all_s": [0.020, 0.032]}},
          "dcp-async": {"stall_s": 0.04, "extra": {"stall_all_s": [0.048, 0.030]}}}
    f = bench.memory_floor(measured, by)
    assert f["reference_async_floor_s"]["per_repeat"] == pytest.approx([0.016, 0.016])
    assert f["floor_ratio"]["per_repeat"] == pytest.approx([0.4, 0.8])
    assert f["stall_over_floor"]["reference-async"]["per_repeat"] == pytest.approx([1.25, 2.0])
    assert f["stall_over_floor"]["dcp-async"]["per_repeat"] == pytest.approx([1.2, 1.5])
    line = bench._floor_line({"memory_floor": f})
    assert "16.0 / 16.0 / 16.0" in line and "0.40 / 0.60 / 0.80" in line
    assert bench.memory_floor(None, by) is None and bench.memory_floor({}, by) is None
    only_ours = bench.memory_floor(measured, {"reference-async": by["reference-async"]})
    assert set(only_ours["stall_over_floor"]) == {"reference-async"}


def test_thread_faults_count_pages_first_touched_not_pages_touched_again():
    import mmap

    size = 8 << 20
    pages = size // mmap.PAGESIZE
    with mmap.mmap(-1, size) as m:  # fresh anonymous memory: no page is mapped until written
        f0 = bench_ranks._thread_faults()
        for off in range(0, size, mmap.PAGESIZE):
            m[off] = 1
        first = bench_ranks._thread_faults() - f0
        f1 = bench_ranks._thread_faults()
        for off in range(0, size, mmap.PAGESIZE):
            m[off] = 2
        again = bench_ranks._thread_faults() - f1
    assert first >= pages // 2, f"{first} faults for {pages} fresh pages"  # huge pages would fault fewer
    assert again < pages // 10, f"{again} faults writing {pages} pages already mapped"


def test_staging_faults_split_the_stall_ratio_by_the_memory_dcp_staged_into():
    by = {"reference-async": {"extra": {"stall_faults_all": [24000, 0, 1, 0]}},
          "dcp-async": {"extra": {"stall_faults_all": [24400, 20000, 3, 12000]}}}
    ratio = {"per_repeat": [1.0, 0.4, 0.9, 0.5]}
    f = bench.staging_faults(by, ratio, 4096, 100_000_000)
    assert f["faults"]["dcp-async"]["median"] == pytest.approx(16000)
    # fresh: faulted bytes reach half the state (12000 pages = 49 MB falls just short)
    assert f["dcp_async_fresh"] == [True, True, False, False]
    split = f["async_stall_vs_dcp_async_by_dcp_pages"]
    assert split["fresh"]["per_repeat"] == pytest.approx([1.0, 0.4])
    assert split["reused"]["per_repeat"] == pytest.approx([0.9, 0.5])
    line = bench._faults_line({"staging_faults": f})
    assert "in 2 of 4 repeats" in line and "0.40 / 0.70 / 1.00 over the fresh ones" in line
    assert "0.50 / 0.70 / 0.90 over the reused ones" in line
    only_fresh = bench.staging_faults(by | {"dcp-async": {"extra": {"stall_faults_all": [24400] * 4}}}, ratio, 4096,
                                      100_000_000)
    assert only_fresh["async_stall_vs_dcp_async_by_dcp_pages"]["reused"] is None
    assert "over the reused" not in bench._faults_line({"staging_faults": only_fresh})
    assert bench.staging_faults({"reference": {"extra": {}}}, ratio, 4096, 100) is None  # no async series
    no_dcp = bench.staging_faults({"reference-async": by["reference-async"]}, None, 4096, 100)
    assert set(no_dcp) == {"page_bytes", "faults"}


def test_device_copy_times_every_device_tensor():
    """On the CPU the copy has no device tensors to take and times the whole state (no pinning)."""
    state = bench.make_state(0, 3 * 4 * 1000)
    copy = bench.DeviceCopy(state)
    assert not copy.cuda and copy.bytes == sum(t.numel() * t.element_size() for t in bench._tensors(state))


def test_the_bench_state_is_owned_by_a_real_optimizer_whose_step_changes_nothing():
    # The reference's default async save defers the replica check of tensors an optimizer owns
    # and holds the next optimizer.step(): the bench's state must be such tensors, and the step
    # it bills to the stall must leave them as they were.
    import torch

    from chaos.bench.checkpoint import make_state, owning_optimizer
    from chaos.model.statehash import fingerprint

    state = make_state(0, 3_000_000)
    before = fingerprint(state)
    opt = owning_optimizer(state)
    owned = {p.data_ptr() for g in opt.param_groups for p in g["params"]}
    owned |= {t.data_ptr() for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)}
    assert {t.data_ptr() for t in state["model"].values()} <= owned
    moments = [t for st in state["optimizer"]["state"].values() for k, t in st.items() if k != "step"]
    assert moments and {t.data_ptr() for t in moments} <= owned
    opt.step()
    assert fingerprint(state) == before
