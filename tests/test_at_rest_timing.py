"""An at-rest fault hits a checkpoint at rest: with an async checkpointer, the save in flight
commits before the corruption lands.

Found in CI (2026-12-03): on a loaded runner ``dcp-async``'s step-8 save had not written
its ``.metadata`` by step 11, so ``delete:step=11`` removed a shard of a checkpoint that
was never committed, the job resumed from step 4, and the judge called it "fell back" —
a pass that says nothing about fallback. Here a 3 s delay on rank 0's first rename of the
step-8 save makes that race certain; the at-rest trigger must still wait for the save to
be acknowledged, so the deleted shard belongs to a committed checkpoint that the load
then has to detect and fall back from.
"""

import pytest

pytestmark = pytest.mark.chaos


def test_an_at_rest_fault_waits_for_the_async_save_in_flight(chaos):
    scenario = chaos.scenario(
        "reference", ["slowio:rank=0,step=8,op=rename,delay=3", "delete:step=11,seed=3,file=shard-r00001.safetensors"],
        world_size=2, ckpt_options={"async_save": "true"}, steps=16, save_every=4, d_model=64, n_layers=1)
    result = chaos.run(scenario)
    chaos.check(result)
    assert [f["action"] for f in result.record.io["fired"]] == ["delay"], "the slow rename never happened"
    case = result.oracles["checksum_detection"].evidence["cases"][0]
    assert case["target"].startswith("step-0000000008/"), case  # the save in flight, not the one before
    assert case["class"] == "fell back" and case["loaded_step"] == 4, case
    events = result.record.events[0][0]  # attempt 0, rank 0: the rank that carries the trigger
    acked = next(i for i, e in enumerate(events) if e["ev"] == "ack" and 8 in e["steps"])
    fault = next(i for i, e in enumerate(events) if e["ev"] == "fault_point" and e.get("step") == 11)
    assert acked < fault, "the corruption landed before the step-8 save was acknowledged"
    # Every rank settled (its saves returned and logged, then a barrier) before rank 0 fired:
    # otherwise a rank killed right after its save's commit may not have logged its return,
    # and the judge would take the save before for the newest (default campaign seed 3).
    for rank in (0, 1):
        events = result.record.events[0][rank]
        settled = [e for e in events if e["ev"] == "settled"]
        assert [e["step"] for e in settled] == [10], (rank, settled)
        returned = [e["step"] for e in events if e["ev"] == "save_return"]
        assert returned == [4, 8] and events.index(settled[0]) > max(
            i for i, e in enumerate(events) if e["ev"] == "save_return")
