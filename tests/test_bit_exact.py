"""The bit-exact oracle: it passes a correct resume and fails a model-only checkpointer."""

import pytest

from chaos.judge.oracles import bit_exact
from chaos.record.golden import GoldenRun
from chaos.record.history import RunRecord

MODEL_ONLY = "tests/checkpointers/model_only.py:ModelOnlyCheckpointer"


def _record(losses, final, outcome="ok"):
    events = {0: {0: [{"ev": "step", "attempt": 0, "step": s, "loss": float.fromhex(h), "loss_hex": h, "lr": 0.1, "t": 0.0}
                      for s, h in losses.items()] + [{"ev": "final", "fingerprint": final}]}}
    return RunRecord(1, [{"attempt": 0, "outcome": outcome, "detail": "", "fired": []}], events)


GOLDEN = GoldenRun("k", 1, {0: {1: (1.5).hex(), 2: (1.25).hex()}}, {0: [1.5, 1.25]}, {0: {"model/w": "a", "rng/torch": "b"}})


def test_equal_record_passes():
    result = bit_exact(GOLDEN, _record({1: (1.5).hex(), 2: (1.25).hex()}, {"model/w": "a", "rng/torch": "b"}))
    assert result.passed, result.summary
    assert result.evidence == {"leaves": 2, "steps": 2}


def test_differing_tensor_and_loss_are_both_named():
    result = bit_exact(GOLDEN, _record({1: (1.5).hex(), 2: (1.0).hex()}, {"model/w": "a", "rng/torch": "X"}))
    assert not result.passed
    assert result.evidence["first_state_difference"]["tensor"] == "rng/torch"
    assert result.evidence["first_loss_difference"]["step"] == 2
    assert "rng/torch" in result.summary and "step 2" in result.summary


def test_missing_steps_and_unfinished_runs_fail():
    assert not bit_exact(GOLDEN, _record({1: (1.5).hex()}, {"model/w": "a", "rng/torch": "b"})).passed
    unfinished = bit_exact(GOLDEN, _record({}, {}, outcome="hang"))
    assert not unfinished.passed and "did not finish" in unfinished.summary


@pytest.mark.chaos
def test_model_only_checkpointer_fails_naming_the_first_differing_tensor(chaos):
    result = chaos.run(chaos.scenario(MODEL_ONLY, ["kill:rank=1,step=8"], steps=10, save_every=3))
    assert result.verdict == "fail", chaos.explain(result)
    evidence = result.oracles["bit_exact"].evidence
    first = evidence["first_state_difference"]["tensor"]
    assert not first.startswith("model/"), "the weights were saved; what differs must be the rest of the state"
    assert first in result.oracles["bit_exact"].summary
    assert evidence["first_loss_difference"]["step"] == 7, "the first re-run step after resuming from 6 must differ"


@pytest.mark.chaos
def test_a_kill_at_three_ranks_resumes_bit_exact_on_ddps_settled_buckets(chaos):
    # With 3+ ranks an all-reduce's float sums depend on how DDP groups the gradients, and a
    # new DDP regroups them after its first iteration: without chaos.target.workload.parallel's
    # settle_buckets, the step after a restart differed (~1e-7) from the uninterrupted run's.
    scenario = chaos.scenario("reference", ["kill:rank=2,step=5"], steps=7, save_every=2, world_size=3, d_model=64)
    result = chaos.run(scenario)
    assert result.verdict == "pass", chaos.explain(result)
    assert result.oracles["bit_exact"].passed, result.oracles["bit_exact"].summary
