"""Known-bad checkpointers for sharded state: right at a fixed world size, caught on a resize.

``tests/checkpointers/worldsize_keyed.py`` keys every rank's shard file by the world size
(a resized job finds nothing and starts over: ``durability``); ``gather_no_reshard.py``
gathers every rank's shards on rank 0 and pours the saved shard into the new one on load
without resharding (a resized job trains on a state that was never saved:
``committed_state``, naming the first tensor that differs). Both pass a kill and resume
at the world size they saved with (the slow test shows it), which is why a harness that
never resizes a sharded job would call them correct.
"""

from __future__ import annotations

import pytest

FSDP = {"parallel": "fsdp", "steps": 16, "save_every": 4, "d_model": 128, "n_layers": 1}
KNOWN_BAD = {
    "worldsize_keyed": ("tests/checkpointers/worldsize_keyed.py:WorldSizeKeyedShards", "durability",
                        "resumed from step 0"),
    "gather_no_reshard": ("tests/checkpointers/gather_no_reshard.py:GatherNoReshard", "committed_state",
                          "not the state saved then"),
}


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
def test_a_checkpointer_that_does_not_reshard_is_caught_by_its_oracle_on_the_resize(chaos, name):
    spec, oracle, why = KNOWN_BAD[name]
    result = chaos.run(chaos.scenario(spec, ["kill:rank=1,step=11,lost=true"], world_size=2, **FSDP))
    assert result.verdict == "fail", chaos.explain(result)
    assert [a["world_size"] for a in result.record.attempts] == [2, 1]
    judged = result.oracles[oracle]
    assert not judged.passed and why in judged.summary, chaos.explain(result)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
def test_the_same_checkpointer_passes_a_kill_at_a_fixed_world_size(chaos, name):
    spec = KNOWN_BAD[name][0]
    chaos.check(chaos.run(chaos.scenario(spec, ["kill:rank=1,step=11"], world_size=2, **FSDP)))
