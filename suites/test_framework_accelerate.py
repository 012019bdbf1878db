"""Hugging Face Accelerate under chaos: ``chaos/examples/frameworks/accelerate_loop.py`` (CPU).

The job trains 12 steps, ``accelerator.save_state()`` every 3 with
``ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=2)``
(``checkpoints/checkpoint_N``; past the limit the oldest folder is removed *before*
the new one is written) and, on start, ``accelerator.load_state()``, which takes the
highest ``checkpoint_N`` without checking that it is complete, then
``skip_first_batches`` to continue inside the epoch.

Recorded exploration (accelerate 1.16.0, torch 2.13.0 CPU, one process, seed 0, every
family, ``--max-points 24``): 609 points, 24 tried: 12 hard failures, 3 lost work,
9 passes.

- a kill, a torn write, ENOSPC / EIO or a corruption inside a save: the half-written
  ``checkpoint_N`` is the highest and ``load_state`` fails on it, every restart
  (``FileNotFoundError: .../optimizer.bin``, ``EOFError: Ran out of input``,
  ``OSError: [Errno 22] Invalid argument``, ``RuntimeError: Number of custom checkpoints
  in folder ... does not match``): hard failure. The same shape as transformers #35525.
- a real full disk (``disk:full:49152``): the save raises, the restart fails on the
  half-written folder: hard failure.
- power loss: nothing is fsynced, so a power loss after the first saves leaves no
  ``checkpoints/`` at all and the restart trains from scratch: lost work.
- kills during the rotation (the ``rmtree`` of the oldest folder), between saves, and
  SIGTERM at a step: pass, bit for bit (unshuffled loader; with ``--shuffle`` a resume
  draws another order, accelerate #2016).

Two ranks (``--ranks 2``, 12 points): 6 passes, 4 hard failures (a torn
``optimizer.bin``, a deleted ``random_states_1.pkl``, a truncated
``custom_checkpoint_0.pkl``, a real full disk), 2 lost work (power loss).

A network cut between the two ranks (``--ranks 2 --faults net --net-hold 3 --max-points 6``,
51 points: cuts in the writes of ``optimizer.bin``, ``model.safetensors`` and
``random_states_1.pkl``, at steps 6 and 10): 6 passes; each rank finishes what it writes
alone, blocks in the next collective until the hold is over, and resumes bit for bit.
"""

from __future__ import annotations

import pytest
from framework_jobs import At, need, net_endings, python_job, run_net_point, run_point

from chaos.cli.plugin import job_failed

accelerate = need("accelerate")

pytestmark = [pytest.mark.chaos, pytest.mark.frameworks]  # run nightly, with the extra (.ci/nightly)

ACC = python_job("accelerate_loop.py")
OPTIONS = {"result_files": ["final/model.safetensors"], "checkpoint_glob": "checkpoints/checkpoint_*"}
REPLAY = ("chaos run --result-file final/model.safetensors --checkpoint-glob 'checkpoints/checkpoint_*' "
          "--point {point} -- python chaos/examples/frameworks/accelerate_loop.py --out '{{out}}'")


def test_a_sigterm_at_a_step_resumes_bit_for_bit(chaos):
    result = run_point(chaos, ACC, "rank0:step7:term", **OPTIONS)
    chaos.check(result)


def test_a_kill_while_total_limit_removes_the_oldest_checkpoint_resumes_bit_for_bit(chaos):
    result = run_point(chaos, ACC, At("rmdir", "checkpoints/checkpoint_1", 1, "before", "rank0:op83:before"),
                       **OPTIONS)
    chaos.check(result)


@pytest.mark.xfail(strict=True, raises=job_failed("hard_failure"), reason=(
    f"accelerate {accelerate.__version__}: point rank0:op9:before (killed before model.safetensors of "
    "checkpoints/checkpoint_0 is closed): load_state() takes the highest checkpoint_N, the half-written "
    "checkpoint_0, and raises FileNotFoundError: .../checkpoint_0/optimizer.bin, every restart too "
    "(hard_failure; not reported upstream for Accelerate, the same defect as transformers #35525). "
    "Replay: " + REPLAY.format(point="rank0:op9:before")))
def test_a_kill_inside_save_state_leaves_a_checkpoint_load_state_cannot_load(chaos):
    result = run_point(chaos, ACC, At("close", "checkpoints/checkpoint_0/model.safetensors", 1, "before",
                                      "rank0:op9:before"), **OPTIONS)
    chaos.check(result)


@pytest.mark.xfail(strict=True, raises=job_failed("lost_work"), reason=(
    f"accelerate {accelerate.__version__}: point rank0:op98:power (power loss during the write of "
    "checkpoints/checkpoint_3/random_states_0.pkl): save_state fsyncs no file and no directory, so the crash "
    "state has no checkpoints/ folder at all and the restart trains from scratch though the step-9 save was "
    "acknowledged (lost_work; not reported upstream). Replay: " + REPLAY.format(point="rank0:op98:power")))
def test_a_power_loss_during_save_state_loses_every_checkpoint(chaos):
    result = run_point(chaos, ACC, At("write", "checkpoints/checkpoint_3/random_states_0.pkl", 3, "power",
                                      "rank0:op98:power"), **OPTIONS)
    chaos.check(result)


@pytest.mark.xfail(strict=True, raises=job_failed("hard_failure"), reason=(
    f"accelerate {accelerate.__version__}: point disk:full:49152 ({{out}} on a 49152-byte tmpfs, remounted "
    "larger before the restart): the real ENOSPC hits checkpoints/checkpoint_1/scheduler.bin, save_state "
    "raises, and the restart's load_state takes the half-written checkpoint_1 and raises EOFError "
    "(hard_failure; not reported upstream). Replay: " + REPLAY.format(point="disk:full:49152")))
def test_a_full_disk_during_save_state_leaves_a_checkpoint_load_state_cannot_load(chaos):
    from chaos.nemesis import diskfull

    ok, why = diskfull.available()
    if not ok:
        pytest.skip(f"a real full disk needs a size-limited tmpfs: {why}")
    result = run_point(chaos, ACC, "disk:full:49152", **OPTIONS)
    chaos.check(result)


@pytest.mark.xfail(strict=True, raises=job_failed("silent_divergence"), reason=(
    f"accelerate {accelerate.__version__}: point rank0:step7:kill with --shuffle (a SIGKILL between saves, "
    "checkpoint_1 of step 6 complete): load_state restores the RNG of the save's moment, and "
    "skip_first_batches then iterates a new permutation drawn from it instead of the epoch's, so the resumed "
    "run trains on another order and ends on other weights (final/model.safetensors: 0.bias: bytes differ; "
    "silent_divergence; accelerate #2016). Replay: chaos run --result-file final/model.safetensors "
    "--checkpoint-glob 'checkpoints/checkpoint_*' --point rank0:step7:kill -- python "
    "chaos/examples/frameworks/accelerate_loop.py --out '{out}' --shuffle"))
def test_a_shuffled_loader_resumes_on_another_data_order(chaos):
    result = run_point(chaos, python_job("accelerate_loop.py", "--shuffle"), "rank0:step7:kill", **OPTIONS)
    chaos.check(result)


@pytest.mark.xfail(strict=True, raises=job_failed("silent_divergence"), reason=(
    f"accelerate {accelerate.__version__}: point rank0:op63:zero:step10 (64 bytes of "
    "checkpoints/checkpoint_2/optimizer.bin zeroed at rest once step 10 was announced: the save complete "
    "and trusted): torch.load checks no CRC and load_state verifies nothing, so the restart resumes with "
    "damaged Adam moments and ends on other weights (final/model.safetensors: 0.bias: bytes differ; "
    "silent_divergence; not reported upstream). Replay: chaos run --result-file final/model.safetensors "
    "--checkpoint-glob 'checkpoints/checkpoint_*' --point rank0:op63:zero:step10 -- python "
    "chaos/examples/frameworks/accelerate_loop.py --out '{out}'"))
def test_bit_rot_in_a_saved_optimizer_state_loads_silently(chaos):
    at = At("close", "checkpoints/checkpoint_2/optimizer.bin", 1, "zero", "rank0:op63:zero:step10", at_step=10)
    result = run_point(chaos, ACC, at, **OPTIONS)
    chaos.check(result)


@pytest.mark.slow
def test_two_ranks_cut_apart_while_rank_1_writes_its_random_states_resume_bit_for_bit(chaos):
    """rank1:op17:net (``--ranks 2``): rank 1's link is cut right after its first write of
    ``checkpoints/checkpoint_1/random_states_1.pkl``; both ranks finish what they write alone
    and block in the next collective (gloo waits its 30 min timeout: no rank fails by itself),
    are SIGKILLed when the hold is over, and ``load_state()``, with the link back, resumes from
    the complete ``checkpoint_1`` bit for bit."""
    result = run_net_point(chaos, ACC, At("write", "checkpoints/checkpoint_1/random_states_1.pkl", 1, "net",
                                          "rank1:op17:net", rank=1), **OPTIONS)
    chaos.check(result)
    assert net_endings(result) == ["killed_after_hold", "killed_after_hold"], result.explain()
