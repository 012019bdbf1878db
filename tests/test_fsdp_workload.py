"""The workload's parallelism option: configuration, the global sample stream, the FSDP2 state.

Pure checks first (configuration errors, golden-run keys, the sampler), then one real
2-rank gloo job that builds the FSDP2 workload and checks the three promises the
harness relies on: the state is torch's ``get_state_dict`` (DTensors), the load
template has exactly its structure and building it does not change training, and a
DTensor fingerprints as its global value.
"""

from __future__ import annotations

import ckpt_dist
import pytest
import torch
from ckpt_dist import check_all_ok, run_ranks

from chaos.errors import ConfigError
from chaos.record import golden
from chaos.target.workload.config import WorkloadConfig
from chaos.target.workload.data import GlobalSampler

TINY = {"d_model": 64, "n_layers": 1, "n_heads": 2, "vocab": 64, "seq_len": 16}


def test_an_unknown_mode_and_an_impossible_world_size_are_config_errors():
    with pytest.raises(ConfigError, match="parallel='zero3' is unknown: choose one of ddp, fsdp, hsdp, tp"):
        WorkloadConfig(parallel="zero3")
    with pytest.raises(ConfigError, match="hsdp needs an even world size"):
        WorkloadConfig(parallel="hsdp").check_world_size(3)
    with pytest.raises(ConfigError, match="tp shards the MLP's 512 hidden units over 3 ranks"):
        WorkloadConfig(parallel="tp").check_world_size(3)
    WorkloadConfig(parallel="fsdp").check_world_size(3)  # uneven shards are fine


def test_the_default_keeps_its_golden_key_and_a_sharded_mode_gets_its_own():
    cfg = WorkloadConfig()
    assert "parallel" not in cfg.to_dict()  # the default configuration's key and JSON are what they were
    assert WorkloadConfig.from_dict(cfg.to_dict()) == cfg
    fsdp = WorkloadConfig(parallel="fsdp")
    assert fsdp.to_dict()["parallel"] == "fsdp" and WorkloadConfig.from_dict(fsdp.to_dict()) == fsdp
    assert golden.golden_key(fsdp, 2, "gloo") != golden.golden_key(cfg, 2, "gloo")


def test_the_global_stream_continues_at_another_world_size():
    """Two ranks for three steps, then one rank: the same samples a one-rank run sees, in order."""
    one = GlobalSampler(64, 0, 1, 4, seed=0)
    stream = torch.cat([one.next_indices() for _ in range(40)])  # crosses epoch boundaries
    two = [GlobalSampler(64, r, 2, 4, seed=0) for r in range(2)]
    seen = [torch.cat([s.next_indices() for s in two]) for _ in range(3)]
    assert torch.equal(torch.cat(seen), stream[:24])
    resumed = GlobalSampler(64, 0, 1, 4, seed=0)
    resumed.load_state_dict(two[1].state_dict())
    assert two[0].state_dict()["position"] == two[1].state_dict()["position"] == 24  # global, the same everywhere
    after = torch.cat([resumed.next_indices() for _ in range(30)])
    assert torch.equal(after, stream[24:144])


@pytest.fixture(scope="module", autouse=True)
def _sharded_machinery_preloaded():
    ckpt_dist._context().set_forkserver_preload(
        ["torch", "torch.distributed", "chaos.reference.checkpoint", "chaos.target.workload.train", "torch.distributed.fsdp",
         "torch.distributed.tensor.parallel", "torch.distributed.checkpoint.state_dict"])


def _structure(state) -> dict[str, tuple]:
    from chaos.model.statehash import iter_leaves

    out = {}
    for path, leaf in iter_leaves(state):
        if isinstance(leaf, torch.Tensor):
            out[path] = (type(leaf).__name__, leaf.dtype, tuple(leaf.shape), repr(getattr(leaf, "placements", None)))
        else:
            out[path] = type(leaf).__name__
    return out


def _fsdp_promises(rank: int, world: int) -> dict:
    from chaos.model.statehash import fingerprint, tensor_digest
    from chaos.target.workload.train import Trainer

    cfg = WorkloadConfig(**TINY, parallel="fsdp")
    plain = Trainer(cfg, rank, world)
    plain_losses = [plain.train_step()[0] for _ in range(3)]
    probed = Trainer(cfg, rank, world)
    template = probed.template()  # what every checkpointed run builds before its first step
    probed_losses = [probed.train_step()[0] for _ in range(3)]
    state = probed.state_dict()
    tok = state["model"]["tok.weight"]
    return {
        "losses_equal": [x.hex() for x in plain_losses] == [x.hex() for x in probed_losses],
        "template": _structure(template), "state": _structure(state),
        "tok_type": type(tok).__name__, "tok_local_rows": tok.to_local().shape[0],
        "moment_type": type(state["optimizer"]["state"]["tok.weight"]["exp_avg"]).__name__,
        "digest_is_global": tensor_digest(tok) == tensor_digest(tok.full_tensor()),
        "fingerprint": {k: v for k, v in fingerprint(state).items() if not k.startswith("rng/")},
    }


def test_fsdp_state_is_get_state_dict_and_its_template_changes_nothing(tmp_path):
    r0, r1 = check_all_ok(run_ranks(_fsdp_promises, 2, timeout=120))
    for r in (r0, r1):
        assert r["losses_equal"], "building the load template changed training (the optimizer was stepped?)"
        assert r["template"] == r["state"], "the template is not shaped like the state it must receive"
        assert r["tok_type"] == "DTensor" and r["moment_type"] == "DTensor" and r["tok_local_rows"] == 32
        assert r["digest_is_global"]
    assert r0["fingerprint"] == r1["fingerprint"]  # global values: the same on every rank
