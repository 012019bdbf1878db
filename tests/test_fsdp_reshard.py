"""The reference checkpointer on sharded (FSDP2 / tensor-parallel) state: saved per piece, resharded on load.

Real rank processes (gloo), the real workload ``Trainer`` with ``parallel=fsdp`` (or
``tp``), real files. A state saved at one world size is loaded at another and compared
through the harness's own fingerprints, which hash every DTensor as its *global* value:
equal fingerprints mean every element of every parameter and AdamW moment arrived.
Each loading rank must also read less than the whole checkpoint (its slices, rounded to
checksum blocks), and a damaged or missing piece must reject the step, never load part.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import ckpt_dist
import pytest
from ckpt_dist import check_all_ok, run_ranks

from chaos.reference.ckptformat import dtensor
from chaos.reference.ckptformat.errors import ManifestError

TINY = {"d_model": 64, "n_layers": 1, "n_heads": 2, "vocab": 64, "seq_len": 16, "steps": 6}


def _trainer(rank: int, world: int, cfg: dict):
    from chaos.target.workload.config import WorkloadConfig
    from chaos.target.workload.train import Trainer

    return Trainer(WorkloadConfig(**cfg), rank, world)


def _shared(fp: dict[str, str]) -> dict[str, str]:
    """Fingerprint entries every rank must agree on (RNG states are per rank)."""
    return {k: v for k, v in fp.items() if not k.startswith("rng/")}


def _train_and_save(rank: int, world: int, root: str, cfg: dict, steps: list[int]) -> dict[str, str]:
    from chaos.model.statehash import fingerprint
    from chaos.reference.checkpoint import ReferenceCheckpointer

    trainer = _trainer(rank, world, cfg)
    ckpt = ReferenceCheckpointer(root, rank, world)
    fp = {}
    for step in steps:
        while trainer.step < step:
            trainer.train_step()
        state = trainer.state_dict()
        fp = fingerprint(state)
        ckpt.save(step, state)
    ckpt.close()
    return fp


def _load(rank: int, world: int, root: str, cfg: dict) -> dict:
    from chaos.model.statehash import fingerprint
    from chaos.reference.checkpoint import ReferenceCheckpointer

    trainer = _trainer(rank, world, cfg)
    ckpt = ReferenceCheckpointer(root, rank, world)
    try:
        found = ckpt.load_latest(trainer.template())
        load = [e for e in ckpt.events if e["kind"] == "load"][-1]
        if found is None:
            return {"step": None, "load": load}
        step, state = found
        loaded = fingerprint(state)
        trainer.load_state_dict(state)  # set_state_dict: the live model and optimizer now hold it
        live = fingerprint(trainer.state_dict())
        trainer.train_step()  # and train on from it
        return {"step": step, "loaded": loaded, "live": live, "bytes": load["bytes"], "load": load}
    finally:
        ckpt.close()


def _checkpoint_bytes(root: Path) -> int:
    step_dir = sorted(p for p in root.iterdir() if p.name.startswith("step-"))[-1]
    return sum(f.stat().st_size for f in step_dir.iterdir())


@pytest.fixture(scope="module", autouse=True)
def _sharded_machinery_preloaded():
    """Rank processes fork from ckpt_dist's forkserver; let it import FSDP and the workload once (if
    it has not started yet), not every rank (~3 s a launch on a loaded machine)."""
    ckpt_dist._context().set_forkserver_preload(
        ["torch", "torch.distributed", "chaos.reference.checkpoint", "chaos.target.workload.train", "torch.distributed.fsdp",
         "torch.distributed.tensor.parallel", "torch.distributed.checkpoint.state_dict"])


def _check_loaded(saved: dict[str, str], loaded: list[dict], step: int, total: int | None = None) -> None:
    for rank, got in enumerate(loaded):
        assert got["step"] == step, f"rank {rank} loaded step {got['step']}"
        assert _shared(got["loaded"]) == _shared(saved), f"rank {rank} loaded a state that differs from the save"
        assert _shared(got["live"]) == _shared(saved), f"rank {rank}: set_state_dict did not restore the saved state"
        if total is not None:
            assert got["bytes"] < total, f"rank {rank} read {got['bytes']} of {total} bytes: more than its slices"


def test_fsdp_state_saved_on_two_ranks_loads_resharded_on_one_and_a_lost_piece_falls_back(tmp_path):
    cfg = {**TINY, "parallel": "fsdp"}
    saved = check_all_ok(run_ranks(_train_and_save, 2, str(tmp_path), cfg, [2, 4], timeout=120))[0]
    newest = sorted(tmp_path.glob("step-*"))[-1]
    manifest = json.loads((newest / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    tok = manifest["dtensors"]["model/tok.weight"]
    assert tok["shape"] == [64, 64] and tok["placements"] == ["Shard(dim=0)"] and len(tok["pieces"]) == 2
    assert [p["offset"] for p in tok["pieces"]] == [[0, 0], [32, 0]]
    assert all(manifest["entries"][p["entry"]]["blocks"] for p in tok["pieces"])
    _check_loaded(saved, check_all_ok(run_ranks(_load, 1, str(tmp_path), cfg, timeout=120)), 4)

    os.remove(newest / "shard-r00001.safetensors")  # rank 1's pieces of step 4 exist nowhere else
    older = check_all_ok(run_ranks(_load, 1, str(tmp_path), cfg, timeout=120))[0]
    assert older["step"] == 2, "a step missing a piece must be rejected as a whole"
    assert "shard file is missing" in older["load"]["rejected"][0]["reason"]
    assert _shared(older["loaded"]) != _shared(saved)


def test_fsdp_state_saved_on_one_rank_loads_slices_on_two_and_a_flipped_bit_falls_back(tmp_path):
    cfg = {**TINY, "parallel": "fsdp"}
    saved = check_all_ok(run_ranks(_train_and_save, 1, str(tmp_path), cfg, [2, 4], timeout=120))[0]
    total = _checkpoint_bytes(tmp_path)
    _check_loaded(saved, check_all_ok(run_ranks(_load, 2, str(tmp_path), cfg, timeout=120)), 4, total)

    newest = sorted(tmp_path.glob("step-*"))[-1]
    m = json.loads((newest / "manifest.json").read_text())
    e = m["entries"][m["dtensors"]["model/blocks.0.mlp.0.weight"]["pieces"][0]["entry"]]
    shard = newest / e["shard"]
    data = bytearray(shard.read_bytes())
    data[e["offsets"][1] - 5] ^= 0x10  # in the rows rank 1 of a 2-rank load needs
    shard.write_bytes(bytes(data))
    loaded = check_all_ok(run_ranks(_load, 2, str(tmp_path), cfg, timeout=120))
    assert [v["step"] for v in loaded] == [2, 2]
    assert "block" in loaded[0]["load"]["rejected"][0]["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("old,new", [(2, 2), (4, 2), (2, 4)])
def test_fsdp_state_reshards_between_two_and_four_ranks(tmp_path, old, new):
    cfg = {**TINY, "parallel": "fsdp"}
    saved = check_all_ok(run_ranks(_train_and_save, old, str(tmp_path), cfg, [3], timeout=180))[0]
    total = _checkpoint_bytes(tmp_path)
    _check_loaded(saved, check_all_ok(run_ranks(_load, new, str(tmp_path), cfg, timeout=180)), 3, total)


@pytest.mark.slow
def test_tensor_parallel_column_slices_reshard(tmp_path):
    """TP's rowwise weight is sharded on dim 1: a 2 -> 1 load reads the column pieces, 1 -> 2 one run per row."""
    cfg = {**TINY, "parallel": "tp"}
    saved = check_all_ok(run_ranks(_train_and_save, 2, str(tmp_path / "a"), cfg, [2], timeout=120))[0]
    manifest = json.loads(next((tmp_path / "a").glob("step-*/manifest.json")).read_text())
    assert manifest["dtensors"]["model/blocks.0.mlp.2.weight"]["placements"] == ["Shard(dim=1)"]
    _check_loaded(saved, check_all_ok(run_ranks(_load, 1, str(tmp_path / "a"), cfg, timeout=120)), 2)
    saved = check_all_ok(run_ranks(_train_and_save, 1, str(tmp_path / "b"), cfg, [2], timeout=120))[0]
    _check_loaded(saved, check_all_ok(run_ranks(_load, 2, str(tmp_path / "b"), cfg, timeout=120)), 2)


# ------------------------------------------------------------------ pure geometry
def test_runs_of_a_row_slice_and_of_a_column_slice():
    assert dtensor.runs([8, 4], [2, 0], [3, 4]) == [(8, 12)]  # rows 2..4: one run
    assert dtensor.runs([3, 4], [0, 2], [3, 2]) == [(2, 2), (6, 2), (10, 2)]  # columns 2..3: one per row
    assert dtensor.runs([], [], []) == [(0, 1)]
    assert dtensor.overlap([0, 0], [4, 4], [2, 2], [4, 4]) == ([2, 2], [2, 2])
    assert dtensor.overlap([0], [2], [2], [2]) is None


def _section(pieces):
    entries = {p["entry"]: {"dtype": "float32", "shape": p["shape"], "offsets": [0, 4 * p["shape"][0] * 2],
                            "blocks": ["x"]} for p in pieces}
    return {"w": {"dtype": "float32", "shape": [4, 2], "placements": ["Shard(dim=0)"], "mesh": [2],
                  "pieces": pieces}}, entries


def test_a_section_with_a_gap_or_an_overlap_is_refused():
    ok, entries = _section([{"entry": "a", "offset": [0, 0], "shape": [2, 2]}, {"entry": "b", "offset": [2, 0], "shape": [2, 2]}])
    dtensor.validate_section(ok, entries, "m.json")
    gap, entries = _section([{"entry": "a", "offset": [0, 0], "shape": [2, 2]}])
    with pytest.raises(ManifestError, match="a piece is missing"):
        dtensor.validate_section(gap, entries, "m.json")
    lap, entries = _section([{"entry": "a", "offset": [0, 0], "shape": [3, 2]}, {"entry": "b", "offset": [2, 0], "shape": [2, 2]}])
    with pytest.raises(ManifestError, match="overlap"):
        dtensor.validate_section(lap, entries, "m.json")


@pytest.mark.slow
def test_hsdp_replicas_of_a_piece_are_written_once_and_reshard(tmp_path):
    """HSDP on 4 ranks: mesh (replicate 2, shard 2), so every piece is held by two ranks."""
    cfg = {**TINY, "parallel": "hsdp"}
    saved = check_all_ok(run_ranks(_train_and_save, 4, str(tmp_path), cfg, [2], timeout=180))[0]
    manifest = json.loads(next(tmp_path.glob("step-*/manifest.json")).read_text())
    tok = manifest["dtensors"]["model/tok.weight"]
    assert tok["placements"] == ["Replicate()", "Shard(dim=0)"] and tok["mesh"] == [2, 2]
    assert len(tok["pieces"]) == 2 and all("@r" not in p["entry"] for p in tok["pieces"])  # shared: written once
    _check_loaded(saved, check_all_ok(run_ranks(_load, 2, str(tmp_path), cfg, timeout=180)), 2)
