"""The built-in workload on GPUs (``--device cuda``): one GPU per rank, NCCL, tolerance mode.

The nightly GPU runner's regression (``.ci/nightly``). Every test here is marked ``gpu``
and skips, with the reason ("no CUDA device: ..." or "2 ranks need 2 CUDA devices ..."),
where the machine lacks them: the plugin checks before any fixture runs.

What is judged how (``WorkloadConfig.nondeterministic``):

* ``device=cuda`` alone is *tolerance mode*: NCCL's reductions and atomics-based kernels
  are not bit-reproducible across restarts, so bit_exact is not judged and
  loss_continuity holds the resumed curve to the golden one within the loss band;
* ``device=cuda`` with ``deterministic=true`` (``torch.use_deterministic_algorithms``,
  fixed cuBLAS workspace) at a fixed world size is judged bit-exact, as on the CPU.

The last two tests run ``chaos bench --device cuda`` small: every load of a state saved
from device memory (the reference's async snapshot into pinned staging, DCP's
``async_save``) must give the saved bytes back, each rank on its own GPU; the timings are
reported, never asserted (``.ci/nightly`` records the full-size bench beside the tests).

Nothing here has run on a GPU in this project yet (the machines have none); the first
nightly on a GPU runner is the measurement.
"""

import pytest

pytestmark = [pytest.mark.chaos, pytest.mark.gpu]

# 16 steps, a save every 4: saves at 4, 8, 12, 16.
GPU_WORKLOAD = {"steps": 16, "save_every": 4, "device": "cuda"}


def _run(chaos, checkpointer, faults, world_size=1, **workload):
    result = chaos.run(chaos.scenario(checkpointer, faults, world_size=world_size, **{**GPU_WORKLOAD, **workload}))
    if result.verdict == "skipped":
        pytest.skip(result.error or "scenario skipped")
    return result


def _devices(result):
    """Each rank's (device, CUDA_VISIBLE_DEVICES) from its first ``pg_ready`` event."""
    out = {}
    for rank in range(result.scenario.world_size):
        ready = result.record.rank_events(rank, "pg_ready")
        out[rank] = (ready[0].get("device"), ready[0].get("visible_devices")) if ready else None
    return out


def _in_tolerance_mode(result):
    assert "bit_exact" not in result.oracles, "device=cuda without deterministic=true is judged in tolerance mode"
    continuity = result.oracles["loss_continuity"]
    assert continuity.passed, continuity.summary
    assert "nondeterministic" in continuity.evidence["bit_exact"]


def test_a_kill_mid_save_on_the_gpu_resumes_within_the_loss_band(chaos):
    result = _run(chaos, "reference", ["kill:rank=0,phase=save,step=12"])
    chaos.check(result)
    _in_tolerance_mode(result)
    assert len(result.record.attempts) == 2, "the kill must have forced exactly one restart"
    assert _devices(result)[0][0] == "cuda:0"
    assert "--device cuda" in result.replay


@pytest.mark.gpu(count=2)
def test_two_ranks_over_nccl_resume_within_the_loss_band(chaos, checkpointer):
    result = _run(chaos, checkpointer, ["kill:rank=1,step=10"], world_size=2)
    chaos.check(result)
    _in_tolerance_mode(result)
    devices = _devices(result)
    assert {d for d, _ in devices.values()} == {"cuda:0"}  # each rank sees one GPU as cuda:0 ...
    assert len({v for _, v in devices.values()}) == 2, devices  # ... and they are two different GPUs


def test_the_reference_async_save_snapshots_device_memory_and_resumes(chaos):
    result = _run(chaos, "reference", ["kill:rank=0,step=14"], ckpt_options={"async_save": True})
    chaos.check(result)
    _in_tolerance_mode(result)
    # What was acknowledged is what the async save copied out of device memory at the call.
    assert result.oracles["committed_state"].passed, result.oracles["committed_state"].summary
    assert result.oracles["durability"].passed
    acks = [s for e in result.record.rank_events(0, "ack") for s in e["steps"]]
    assert 8 in acks, acks  # acknowledged in the first attempt, when the save at 12 began
    assert _devices(result)[0][0] == "cuda:0"


def test_deterministic_kernels_are_judged_bit_exact_after_a_kill(chaos):
    result = _run(chaos, "reference", ["kill:rank=0,step=10"], deterministic=True)
    chaos.check(result)
    assert result.oracles["bit_exact"].passed, result.oracles["bit_exact"].summary
    assert "--workload deterministic=true" in result.replay


def _bench_on_gpus(tmp_path, world_size):
    """``chaos bench --device cuda`` at a small size: the reference's async snapshot of device memory
    (pinned staging) and DCP's ``async_save``, state on one GPU per rank. Timings are reported,
    never asserted; what is asserted is that every load gave back the saved bytes and where ranks ran."""
    from chaos.bench import checkpoint as bench
    from chaos.bench import ranks as bench_ranks
    from chaos.bench import save as bench_cmd

    cfg = bench.BenchConfig(size_mb=8, world_size=world_size, repeats=2, root=str(tmp_path), device="cuda",
                            checkpointers=("reference", "reference-async", "reference-async-trust", "dcp", "dcp-async"))
    report = bench_cmd.run_bench(cfg)
    assert [r["name"] for r in report["results"] if r["skipped"] or not r["correct"]] == []
    assert report["config"]["device"] == "cuda"
    ranks = report["ranks"]
    assert [f["visible_devices"] for f in ranks] == [e["CUDA_VISIBLE_DEVICES"] for e in bench_ranks.rank_envs("cuda", world_size)]
    assert all(f["device"] == "cuda" and f["gpu"] for f in ranks)
    copy = report["device_copy"]
    assert copy["bytes_per_rank"] > 0 and len(copy["all_seconds"]) == 2
    for key in ("async_stall_vs_dcp_async", "async_stall_trust_vs_dcp_async", "reference_vs_dcp_save"):
        assert len(report["ratio_spread"][key]["per_repeat"]) == 2, key
    assert "device -> pinned host copy" in bench.to_markdown(report)
    return report


def test_bench_snapshots_device_memory_and_every_load_is_exact(tmp_path):
    _bench_on_gpus(tmp_path, 1)


@pytest.mark.gpu(count=2)
def test_bench_gives_each_rank_its_own_gpu(tmp_path):
    report = _bench_on_gpus(tmp_path, 2)
    assert len({f["visible_devices"] for f in report["ranks"]}) == 2
