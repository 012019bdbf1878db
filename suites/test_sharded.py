"""Sharded training state (FSDP2, ``--workload parallel=fsdp``): faults that mean something now.

With FSDP2 every rank holds a different slice of every parameter and AdamW moment (DTensors,
``Shard(0)``): there is no second copy of a rank's shard, and a resume at another world
size must reshard. Run against the checkpointers that claim to handle sharded state —
``reference`` (pieces + global offsets in its manifest, ranged verified reads) and
PyTorch DCP (``dcp``, ``dcp-async``) — at world size 2 (4 in the slow tests):

* a save killed on one rank in the middle of writing its shard: the job resumes bit-exact;
* one rank's shard of the newest checkpoint deleted or bit-flipped: the load falls back to
  the previous checkpoint (DCP's documented lack of checksums and of fallback are strict
  xfails, as in ``test_corruption.py``);
* a rank lost for good (2 -> 1, 4 -> 2): the job resumes resharded; bit_exact is not judged
  (the data split changes, so the golden run is no longer the run to equal), committed_state
  compares whole tensors (the fingerprints hash a DTensor's global value) and loss_continuity
  compares every loss after the resize, bit for bit, with a fault-free run at the new world
  size resumed from the same checkpoint (``chaos.record.golden.ResizedReference``). At 16, 40 and
  100 steps: a band around the golden run fixed in advance failed the correct 40-step resume
  (#34), since the resized job's curve drifts from the golden one as it trains on.

Checkpointers that are right only at a fixed world size are caught in
``tests/test_fsdp_known_bad.py``.

Measured on the shared 2-core machine at load average ~10 (2026-12-03): a 2-rank fsdp
scenario of this 16-step workload takes 6-12 s with its golden run cached (26 s for the
first, which runs the golden), a 4-rank one 9-20 s (43 s for the first); the 12 default
tests about 2 minutes, the 6 slow ones about 2 minutes more. A lost-rank scenario runs
one more job the first time its resize is seen (the fault-free run at the new size,
cached for the session like the golden run). Measured 2026-12-06 at load average 3-6,
per checkpointer, the first one of a length running the golden and that run too:
2 -> 1 in 4-24 s at 16 steps, 6-17 s at 40 (default run), 13-30 s at 100 (slow); 4 -> 2
(slow) in 8-18 s, 15-32 s and 23-63 s.
"""

import pytest

pytestmark = pytest.mark.chaos

# dcp-async writes what dcp writes, from a background thread: the nightly's (slow), as in the plugin's matrix.
SHARDED = ["reference", "dcp", pytest.param("dcp-async", marks=pytest.mark.slow)]
FSDP = {"parallel": "fsdp", "steps": 16, "save_every": 4, "d_model": 128, "n_layers": 1}
RANK1_SHARD = {"reference": "shard-r00001.safetensors", "dcp": "__1_*.distcp", "dcp-async": "__1_*.distcp"}
DAMAGE = {
    "delete": "delete:step=11,seed=3,file={shard}",
    "bitflip": "bitflip:step=11,bits=16,region=data,seed=3,file={shard}",
}
SILENT, NO_FALLBACK = "silent", "no-fallback"
# DCP verifies nothing and never falls back: flipped bits in tensor bytes load silently;
# where they hit a record DCP parses (seen here with seed 3: CheckpointException on rank 1)
# every restart fails on the same newest checkpoint. Either is the documented defect. Which
# bytes the flip hits is not fixed for dcp-async (its background writer's file layout
# varies from run to run; before at-rest faults waited for the save in flight, one run here
# flipped bits of a step-8 save that never committed), so a bit flip
# against DCP is an imperative, non-strict xfail when the defect shows and a pass otherwise.
FLIP = "DCP has no checksums and no fallback: a bit-flipped shard of one FSDP rank loads silently or fails every restart"
DELETE = "DCP loads the newest .metadata directory only: a deleted rank shard fails every restart"
KNOWN = {
    ("dcp", "bitflip"): ((SILENT, NO_FALLBACK), FLIP),
    ("dcp-async", "bitflip"): ((SILENT, NO_FALLBACK), FLIP),
    ("dcp", "delete"): ((NO_FALLBACK,), DELETE),
    ("dcp-async", "delete"): ((NO_FALLBACK,), DELETE),
}


class KnownDefect(AssertionError):
    """Raised only when a run fails in exactly the documented way; any other failure stays red."""


def _shows(defects: tuple[str, ...], result) -> bool:
    oracle = result.oracles.get("bit_exact")
    if result.verdict != "fail" or oracle is None:
        return False
    if SILENT in defects and result.record.completed and oracle.evidence.get("first_loss_difference") is not None:
        return True
    return NO_FALLBACK in defects and "did not finish" in oracle.summary


@pytest.fixture(params=SHARDED)
def sharded(request):
    chosen = request.config.getoption("--chaos-checkpointer")
    if chosen and request.param not in chosen:
        pytest.skip(f"{request.param} not among --chaos-checkpointer {chosen}")
    return request.param


def _run(chaos, checkpointer, faults, world_size=2, **workload):
    result = chaos.run(chaos.scenario(checkpointer, faults, world_size=world_size, **{**FSDP, **workload}))
    if result.verdict == "skipped":
        pytest.skip(result.error or "scenario skipped")
    return result


def test_save_killed_mid_write_on_one_rank_resumes_bit_exact(chaos, sharded):
    result = _run(chaos, sharded, ["crash:rank=1,step=8,op=write,nth=2"])
    chaos.check(result)
    assert result.oracles["bit_exact"].passed
    assert result.record.fired_faults(), "the crash never fired"


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_shard_of_one_rank_falls_back(request, chaos, sharded, damage):
    known = KNOWN.get((sharded, damage))
    if known and damage == "delete":
        request.applymarker(pytest.mark.xfail(strict=True, raises=KnownDefect, reason=known[1]))
    result = _run(chaos, sharded, [DAMAGE[damage].format(shard=RANK1_SHARD[sharded])])
    corruption = result.record.fired_faults()[0]["detail"]["corruption"]
    assert corruption.get("changed", True), f"the corruption changed nothing: {corruption}"
    if known and _shows(known[0], result):
        if damage != "delete":
            pytest.xfail(f"{known[1]}\n{chaos.explain(result)}")
        raise KnownDefect(f"{known[1]}\n{chaos.explain(result)}")
    chaos.check(result)
    case = result.oracles["checksum_detection"].evidence["cases"][0]
    assert case["class"] in ("fell back", "detected"), case
    assert result.oracles["durability"].passed


LOSE = {2: ["kill:rank=1,step=11,lost=true"], 4: ["kill:rank=3,step=11,lost=true", "kill:rank=2,step=11,lost=true"]}
SAVE_EVERY = {16: 4, 40: 5, 100: 5}  # 16: the workload above; 40 and 100: the cadence of #34's failing run


def _resumes_resharded_like_a_fault_free_run(chaos, result, sizes):
    chaos.check(result)
    assert [a["world_size"] for a in result.record.attempts] == sizes
    assert "bit_exact" not in result.oracles
    continuity = result.oracles["loss_continuity"]
    assert f"world size changed ({sizes[0]} -> {sizes[1]})" in continuity.evidence["bit_exact"]
    assert continuity.evidence["mode"] == "bit-exact"
    # Compared with a fault-free run at the new size from the very checkpoint the job resumed from.
    resumed = result.oracles["durability"].evidence["restarts"][0]["resumed"]
    reference = next(r for r in continuity.evidence["references"] if r["world_size"] == sizes[1])
    assert reference["resumed_from_step"] == resumed and resumed > 0, reference
    assert result.oracles["committed_state"].evidence["loads"] >= 2 * sizes[1]  # whole tensors equal what was saved


@pytest.mark.parametrize("steps", [16, pytest.param(40, marks=pytest.mark.slow),
                                   pytest.param(100, marks=pytest.mark.slow)])  # 40 per commit: tests/test_reshard_loss.py
def test_rank_lost_for_good_resumes_resharded_like_a_fault_free_run_at_the_new_size(chaos, sharded, steps):
    result = _run(chaos, sharded, LOSE[2], steps=steps, save_every=SAVE_EVERY[steps])
    _resumes_resharded_like_a_fault_free_run(chaos, result, [2, 1])


@pytest.mark.slow
def test_four_ranks_save_killed_mid_write_resumes_bit_exact(chaos, sharded):
    chaos.check(_run(chaos, sharded, ["crash:rank=3,step=8,op=write,nth=2"], world_size=4))


@pytest.mark.slow
@pytest.mark.parametrize("steps", [16, 40, 100])
def test_four_ranks_lose_two_for_good_and_resume_on_two(chaos, sharded, steps):
    result = _run(chaos, sharded, LOSE[4], world_size=4, steps=steps, save_every=SAVE_EVERY[steps])
    _resumes_resharded_like_a_fault_free_run(chaos, result, [4, 2])
