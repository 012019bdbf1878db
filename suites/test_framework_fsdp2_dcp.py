"""A torchtitan-style FSDP2 + DCP loop under chaos: ``chaos/examples/frameworks/fsdp2_dcp.py`` (CPU, gloo).

The job shards a tiny model with ``fully_shard``, saves ``{model, optimizer,
dataloader (StatefulDataLoader, per rank), train_state}`` with DCP every 2 of 8 steps
into ``checkpoint/step-N`` (``dcp.save``, or ``dcp.async_save`` with ``--async``) and
resumes from the highest ``step-N`` that has a ``.metadata`` file (torchtitan's rule).
DCP writes the shards straight into the folder, fsyncs each shard, and commits by
renaming ``.metadata.tmp`` to ``.metadata``; it fsyncs no directory.

Recorded exploration (torch 2.13.0 CPU, torchdata 0.11.0, one process, ``dcp.save``,
seed 0, every family, ``--max-points 24``): 1964 points, 24 tried: 18 passes, 3 lost
work, 3 hard failures.

- kills and torn writes inside a save, ENOSPC / EIO on a shard write, a failed fsync,
  SIGTERM at a step, a real full disk (``disk:full:389120``, ENOSPC on a shard of step-6):
  pass, bit for bit (the ``.metadata`` rule skips a save cut short,
  and the data loader's position comes back with the rest).
- power loss: no directory is fsynced, so a power loss during a later save loses every
  ``step-N`` folder (``mkdir of checkpoint/step-2 lost (directory not fsynced)``): the
  restart trains from scratch though earlier saves were acknowledged: lost work.
- at-rest corruption of a ``.metadata`` (zeroed bytes, a flipped bit): DCP's load
  fails (``AssertionError: metadata is None; global metadata read failed``; ``RuntimeError:
  Missing key in checkpoint state_dict``), and the torchtitan rule, which only asks
  that ``.metadata`` exists, never falls back to the older complete step: hard failure.
- ``dcp.async_save`` (two ranks, the previous future waited on before the next save):
  the persisted shards are byte-identical to ``dcp.save``'s at every step, so the
  values changed after the call (pytorch #144657) do not leak into the checkpoint here.
  Under chaos (``--ranks 2 --async``, 16 points over every family): 13 passes, 3 lost
  work (power loss, as with ``dcp.save``).

A network cut between the two ranks (``--ranks 2 --faults net --net-hold 3``, 35 points;
``dcp.save``: 6 sampled, ``--async``: 4 sampled): 10 passes. A cut in a
save keeps it from its ``.metadata`` commit (the coordinator gathers every rank's write
results, a collective), both ranks block until the hold is over, and the restart skips
the uncommitted step and resumes bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from framework_jobs import At, need, net_endings, python_job, run_net_point, run_point

from chaos.cli.plugin import job_failed

need("torchdata")
torch = need("torch")

pytestmark = [pytest.mark.chaos, pytest.mark.frameworks]  # run nightly, with the extra (.ci/nightly)

DCP = python_job("fsdp2_dcp.py")
OPTIONS = {"result_files": ["final.pt"], "checkpoint_glob": "checkpoint/step-*"}
REPLAY = ("chaos run --result-file final.pt --checkpoint-glob 'checkpoint/step-*' --point {point} "
          "-- python chaos/examples/frameworks/fsdp2_dcp.py --out '{{out}}'")


def test_a_torn_shard_write_resumes_from_the_previous_step(chaos):
    result = run_point(chaos, DCP, At("write", "checkpoint/step-4/__0_0.distcp", 61, "torn", "rank0:op148:torn"),
                       **OPTIONS)
    chaos.check(result)


def test_a_failed_fsync_of_a_shard_resumes_from_the_previous_step(chaos):
    result = run_point(chaos, DCP, At("fsync", "checkpoint/step-4/__0_0.distcp", 1, "eio", "rank0:op158:eio"),
                       **OPTIONS)
    chaos.check(result)


@pytest.mark.xfail(strict=True, raises=job_failed("lost_work"), reason=(
    f"torch {torch.__version__}: point rank0:op164:power (power loss at the rename that commits "
    "checkpoint/step-4/.metadata): DCP fsyncs the shards but no directory, so the crash state has no "
    "checkpoint/ folder and the restart trains from scratch though step 2 was acknowledged (lost_work; "
    "not reported upstream). Replay: " + REPLAY.format(point="rank0:op164:power")))
def test_a_power_loss_during_a_dcp_save_loses_every_step(chaos):
    result = run_point(chaos, DCP, At("rename", "checkpoint/step-4/.metadata", 1, "power", "rank0:op164:power"),
                       **OPTIONS)
    chaos.check(result)


@pytest.mark.xfail(strict=True, raises=job_failed("hard_failure"), reason=(
    f"torch {torch.__version__}: point rank0:op243:zero (64 bytes of checkpoint/step-6/.metadata zeroed "
    "once committed): dcp.load raises AssertionError: metadata is None; global metadata read failed: "
    "invalid load key, and torchtitan's resume rule (the newest step-N with a .metadata file) never falls "
    "back to the complete step-4 (hard_failure; not reported upstream). Replay: "
    + REPLAY.format(point="rank0:op243:zero")))
def test_a_corrupt_metadata_file_stops_the_job(chaos):
    result = run_point(chaos, DCP, At("rename", "checkpoint/step-6/.metadata", 1, "zero", "rank0:op243:zero"),
                       **OPTIONS)
    chaos.check(result)


@pytest.mark.slow
def test_two_ranks_with_async_save_resume_bit_for_bit_after_a_kill_between_saves(chaos):
    result = run_point(chaos, python_job("fsdp2_dcp.py", "--async"), "rank1:step5:kill", ranks=2, **OPTIONS)
    chaos.check(result)


@pytest.mark.slow
def test_async_save_persists_the_values_of_the_call_not_later_ones(tmp_path):
    """pytorch #144657 (async_save persisting values changed after the call): two ranks under
    torchrun train the same seeded job with ``dcp.save`` and with ``dcp.async_save`` (training
    goes on while each save is written); every shard of every step must be byte-identical."""
    runs = {}
    for mode in ("sync", "async"):
        out = tmp_path / mode
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               python_job("fsdp2_dcp.py")[1], "--out", str(out), *(["--async"] if mode == "async" else [])]
        env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[mode] = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*.distcp"))}
    assert runs["sync"].keys() == runs["async"].keys() and len(runs["sync"]) == 8
    differ = [str(k) for k in runs["sync"] if runs["sync"][k] != runs["async"][k]]
    assert not differ, f"async_save persisted other bytes than save in {differ}"


@pytest.mark.slow
def test_two_ranks_cut_apart_during_a_dcp_save_resume_from_the_last_committed_step(chaos):
    """rank1:op82:net (``--ranks 2``, ``dcp.save``): rank 1's link is cut right after its first
    write of ``checkpoint/step-4/__1_0.distcp``; the save never reaches its ``.metadata`` commit
    (rank 0 gathers every rank's write results first, a collective), both ranks block (gloo
    waits its 30 min timeout: no rank fails by itself), are SIGKILLed when the hold is over, and
    the restart skips the uncommitted step-4 and resumes from step 2 bit for bit. (Rank 1's
    ordinals used to move by two from run to run: both ranks' first ``dcp.save`` made
    ``checkpoint/`` and whichever came second saw its ``mkdir`` of ``step-N`` fail or not, so
    this point fired at that ``mkdir`` in about half the runs. The job now makes ``checkpoint/``
    up front; its file events are the same in every run. ``--async``'s step points pass the
    same way.)"""
    result = run_net_point(chaos, DCP, At("write", "checkpoint/step-4/__1_0.distcp", 1, "net", "rank1:op82:net",
                                          rank=1), **OPTIONS)
    chaos.check(result)
    assert net_endings(result) == ["killed_after_hold", "killed_after_hold"], result.explain()
    assert "rank 1 at step 2 (newest complete: 2)" in result.points[0].verdict.summary, result.explain()
