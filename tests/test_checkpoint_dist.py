"""Real multi-process gloo tests of the reference checkpointer (2-4 ranks, tiny states).

Each test launches rank processes through ``ckpt_dist.run_ranks`` and judges the
outcome the way the harness does: ``chaos.model.statehash.fingerprint`` of what
``load_latest`` returns against the fingerprint of what was saved.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from ckpt_dist import check_all_ok, run_ranks

from chaos.model.statehash import fingerprint
from chaos.reference.checkpoint import ReferenceCheckpointer
from chaos.reference.ckptformat.commit import list_steps, read_latest, step_dirname
from chaos.reference.ckptformat.manifest import read_manifest

pytestmark = pytest.mark.timeout(120)

OPTS = {"timeout_s": 15}


def make_state(rank: int, step: int) -> dict:
    """A workload-shaped state: model/optimizer replicated, rng/data per rank."""
    g = torch.Generator().manual_seed(step)
    w = torch.randn(16, 8, generator=g)
    b = torch.randn(8, generator=g).to(torch.bfloat16)
    r = torch.Generator().manual_seed(1000 * rank + step)
    return {
        "model": {"layer.weight": w, "layer.bias": b},
        "optimizer": {
            "state": {0: {"step": torch.tensor(float(step)), "exp_avg": w * 0.1, "exp_avg_sq": w * w},
                      1: {"step": torch.tensor(float(step)), "exp_avg": b.float(), "exp_avg_sq": b.float() ** 2}},
            "param_groups": [{"lr": 1e-3 * step, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False,
                              "foreach": None, "initial_lr": 1e-3, "params": [0, 1]}],
        },
        "scheduler": {"base_lrs": [1e-3], "last_epoch": step, "_step_count": step + 1, "_last_lr": [1e-3 * step], "lr_lambdas": [None]},
        "rng": {"python": {"version": 3, "state": torch.randint(0, 2**31, (625,), generator=r, dtype=torch.int64), "gauss": float("nan") if rank else 0.5},
                "torch": torch.randint(0, 255, (32,), generator=r, dtype=torch.uint8), "cuda": []},
        "data": {"epoch": 0, "position": step * 4 + rank, "sampler_rng": torch.randint(0, 255, (8,), generator=r, dtype=torch.uint8)},
        "progress": {"step": step, "tokens": step * 1024},
    }


def _save_steps(rank: int, world: int, root: str, steps: list[int], opts: dict) -> list[dict]:
    ckpt = ReferenceCheckpointer(root, rank, world, **opts)
    for s in steps:
        ckpt.save(s, make_state(rank, s))
    ckpt.wait()
    ckpt.close()
    return [fingerprint(make_state(rank, s)) for s in steps]


def _load(rank: int, world: int, root: str, opts: dict) -> tuple:
    ckpt = ReferenceCheckpointer(root, rank, world, **opts)
    try:
        found = ckpt.load_latest(make_state(rank, 0))
        rejects = [e["reason"] for e in ckpt.events if e["kind"] == "load_reject"]
        alerts = [e["rule"] for e in ckpt.events if e["kind"] == "alert"]
        if found is None:
            return None, None, rejects, alerts
        return found[0], fingerprint(found[1]), rejects, alerts
    finally:
        ckpt.close()


def test_roundtrip_bit_exact_and_replicas_written_once(tmp_path):
    root = str(tmp_path)
    saved = check_all_ok(run_ranks(_save_steps, 2, root, [5, 10], OPTS))
    loaded = check_all_ok(run_ranks(_load, 2, root, OPTS))
    for rank in (0, 1):
        step, fp, rejects, _ = loaded[rank]
        assert step == 10 and not rejects
        assert fp == saved[rank][1], f"rank {rank} did not load bit-exact"
    assert saved[0][1] != saved[1][1]  # per-rank state really differs
    m = read_manifest(os.path.join(root, step_dirname(10)))
    names = set(m["entries"])
    assert "model/layer.weight" in names and not any(n.startswith("model/") and "@r" in n for n in names)
    assert {"rng/torch@r0", "rng/torch@r1"} <= names
    assert {s["rank"] for s in m["shards"].values()} == {0, 1}
    assert read_latest(root) == 10


def _save_then_die(rank: int, world: int, root: str, phase_name: str, killer: int) -> str:
    from chaos import phases

    ckpt = ReferenceCheckpointer(root, rank, world, **OPTS)
    ckpt.save(5, make_state(rank, 5))

    def listener(name: str, info: dict) -> None:
        if name == phase_name and info.get("step") == 10 and killer in (rank, -1):
            os.kill(os.getpid(), signal.SIGKILL)

    phases.subscribe(listener)
    try:
        ckpt.save(10, make_state(rank, 10))
    except Exception as exc:  # noqa: BLE001 - the survivor must see an error
        return f"raised {type(exc).__name__}"
    return "saved"


@pytest.mark.parametrize(("phase_name", "killer"), [("write_shards", 1), ("vote", -1), ("rename", 0), ("update_latest", 0)])
def test_killed_save_leaves_previous_checkpoint_latest(tmp_path, phase_name, killer):
    root = str(tmp_path)
    res = run_ranks(_save_then_die, 2, root, phase_name, killer, timeout=40)
    assert all(r.value != "saved" for r in res.values()), "a rank reported success for a killed save"
    assert any(r.exitcode == -signal.SIGKILL for r in res.values())
    assert read_latest(root) == 5
    step, fp, rejects, _ = check_all_ok(run_ranks(_load, 2, root, OPTS))[0]
    assert step == 5 and fp == fingerprint(make_state(0, 5))


def _load_all_in_place(rank: int, world: int, root: str, opts: dict) -> tuple:
    from chaos.reference.checkpoint import loader

    loader.IN_PLACE_MIN_BYTES = 1  # every replicated tensor is read into the template
    return _load(rank, world, root, opts)


@pytest.mark.parametrize("in_place", [False, True])
def test_corrupted_shard_detected_and_falls_back(tmp_path, in_place):
    """With in-place loading the rejected step's bytes land in the template first; the
    fallback must overwrite every one of them."""
    root = str(tmp_path)
    check_all_ok(run_ranks(_save_steps, 2, root, [5, 10], OPTS))
    shard = os.path.join(root, step_dirname(10), "shard-r00001.safetensors")
    m = read_manifest(os.path.join(root, step_dirname(10)))
    # Inside a replicated tensor (the kind read in place), not a per-rank one.
    begin, end = next(e["offsets"] for n, e in m["entries"].items()
                      if e["shard"] == "shard-r00001.safetensors" and "@r" not in n and e["offsets"][1] - e["offsets"][0] >= 8)
    at = (begin + end) // 2
    with open(shard, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))
    loaded = check_all_ok(run_ranks(_load_all_in_place if in_place else _load, 2, root, OPTS))
    for rank in (0, 1):
        step, fp, rejects, alerts = loaded[rank]
        assert step == 5 and fp == fingerprint(make_state(rank, 5))
        assert len(rejects) == 1 and "checksum mismatch" in rejects[0] and "shard-r00001" in rejects[0]
        assert "checksum_failure" in alerts
    assert os.path.exists(shard), "a rejected checkpoint must not be deleted"


def _load_replicated(rank: int, world: int, root: str) -> tuple:
    ckpt = ReferenceCheckpointer(root, rank, world, **OPTS)
    step, state = ckpt.load_latest(make_state(rank, 0))
    ckpt.close()
    return step, fingerprint(state)


@pytest.mark.parametrize(("old", "new"), [(4, 2), (2, 1)])
def test_resharding_loads_replicated_state_bit_exact(tmp_path, old, new):
    root = str(tmp_path)
    saved = check_all_ok(run_ranks(_save_steps, old, root, [7], OPTS))
    loaded = check_all_ok(run_ranks(_load_replicated, new, root, timeout=60))
    for rank in range(new):
        step, fp = loaded[rank]
        assert step == 7
        # Replicated parts equal every old rank's; per-rank parts are this rank's own.
        assert fp == saved[rank][0]
        replicated = {k: v for k, v in fp.items() if k.split("/")[0] in ("model", "optimizer", "scheduler", "progress")}
        assert replicated == {k: v for k, v in saved[old - 1][0].items() if k in replicated}


def _async_mutation(rank: int, world: int, root: str, replicas: str = "verify") -> tuple:
    ckpt = ReferenceCheckpointer(root, rank, world, async_save="true", replicas=replicas, **OPTS)
    expected = []
    state = make_state(rank, 3)
    for step in (3, 4, 5):
        expected.append(fingerprint(state))
        ckpt.save(step, state)
        for t in [state["model"]["layer.weight"], state["optimizer"]["state"][0]["exp_avg"], state["rng"]["torch"]]:
            t.add_(1)  # mutate live tensors right after save() returned
        state["progress"]["step"] = -1
        state["optimizer"]["param_groups"][0]["lr"] = 99.0
    ckpt.wait()
    step, loaded = ckpt.load_latest(make_state(rank, 0))
    ckpt.close()
    stalls = [(e["stall_s"], e["seconds"]) for e in ckpt.events if e["kind"] == "save"]
    return step, fingerprint(loaded) == expected[-1], stalls


@pytest.mark.parametrize("replicas", ["verify", "trust"])
def test_async_snapshot_immune_to_mutation_after_save_returns(tmp_path, replicas):
    """Also with replicas=trust, where a rank neither copies nor reads the replicas another
    rank writes: mutating them right after save() must not reach the checkpoint."""
    results = check_all_ok(run_ranks(_async_mutation, 2, str(tmp_path), replicas))
    for step, same, stalls in results:
        assert step == 5 and same
        assert len(stalls) == 3 and all(stall <= seconds for stall, seconds in stalls)


def _replication_changes(rank: int, world: int, root: str, replicas: str = "verify") -> tuple:
    ckpt = ReferenceCheckpointer(root, rank, world, async_save=True, replicas=replicas, **OPTS)
    state = make_state(rank, 1)
    state["data"]["shared"] = torch.zeros(64)  # identical on both ranks: written once
    ckpt.save(1, state)
    ckpt.wait()
    state["data"]["shared"] += rank  # now differs: per-rank, but a non-owner only hashed it
    ckpt.save(2, state)
    try:
        ckpt.wait()
        second = "committed"
    except Exception as exc:  # noqa: BLE001
        second = str(exc)
    ckpt.save(3, state)  # the next save copies everything again
    ckpt.wait()
    step, loaded = ckpt.load_latest(state)
    ok = fingerprint(loaded) == fingerprint(state)
    ckpt.close()
    return second, step, ok


def test_async_dedup_detects_changed_replication_pattern(tmp_path):
    results = check_all_ok(run_ranks(_replication_changes, 2, str(tmp_path)))
    # The rank that did not write data/shared at step 1 only hashed it at step 2, so
    # step 2 must abort on every rank with a clear reason (never save a wrong copy).
    for second, _, _ in results:
        assert "replication pattern changed" in second and "data/shared" in second
    for _, step, ok in results:
        assert step == 3 and ok


def test_async_dedup_trusting_replicas_misses_a_diverged_one_as_documented(tmp_path):
    """replicas=trust is DCP's assumption: a tensor that stops being identical across
    ranks is not noticed until the pattern is re-learned, so the non-owner's value is lost.
    This pins the documented trade-off; the default (verify) catches it (test above)."""
    results = check_all_ok(run_ranks(_replication_changes, 2, str(tmp_path), "trust"))
    assert [second for second, _, _ in results] == ["committed", "committed"]
    assert sorted(ok for _, _, ok in results) == [False, True]  # one rank got the other's copy


def _one_rank_fails_write(rank: int, world: int, root: str) -> str:
    import chaos.reference.checkpoint.saver as saver

    ckpt = ReferenceCheckpointer(root, rank, world, **OPTS)
    ckpt.save(5, make_state(rank, 5))
    if rank == 1:
        def broken(*args, **kwargs):
            raise OSError(28, "No space left on device")

        saver.write_shard = broken
    try:
        ckpt.save(10, make_state(rank, 10))
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    finally:
        ckpt.close()
    return "saved"


def test_failing_rank_makes_save_raise_everywhere_and_commits_nothing(tmp_path):
    root = str(tmp_path)
    outcomes = check_all_ok(run_ranks(_one_rank_fails_write, 2, root))
    for text in outcomes:
        assert text.startswith("CommitError") and "rank 1" in text and "No space left" in text
    assert list_steps(root) == [5] and read_latest(root) == 5
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-step")], "partial directory left behind"


def _load_keeping_template(rank: int, world: int, root: str, in_place: bool) -> tuple:
    from chaos.reference.checkpoint import loader

    loader.IN_PLACE_MIN_BYTES = 1  # these tensors are tiny; real ones are MBs
    ckpt = ReferenceCheckpointer(root, rank, world, load_in_place=in_place, **OPTS)
    try:
        template = make_state(rank, 0)
        before = fingerprint(template)
        step, state = ckpt.load_latest(template)
        shared = sorted(
            path for path, t in (("model/layer.weight", state["model"]["layer.weight"]),
                                 ("optimizer/exp_avg", state["optimizer"]["state"][0]["exp_avg"]),
                                 ("rng/torch", state["rng"]["torch"]))
            if t.data_ptr() == {"model/layer.weight": template["model"]["layer.weight"],
                                "optimizer/exp_avg": template["optimizer"]["state"][0]["exp_avg"],
                                "rng/torch": template["rng"]["torch"]}[path].data_ptr()
        )
        return step, fingerprint(state), shared, fingerprint(template) == before
    finally:
        ckpt.close()


@pytest.mark.parametrize("in_place", [True, False])
def test_load_in_place_fills_replicated_template_tensors_only(tmp_path, in_place):
    root = str(tmp_path)
    saved = check_all_ok(run_ranks(_save_steps, 2, root, [5], OPTS))
    loaded = check_all_ok(run_ranks(_load_keeping_template, 2, root, in_place))
    for rank in (0, 1):
        step, fp, shared, untouched = loaded[rank]
        assert step == 5 and fp == saved[rank][0]
        if in_place:
            # Replicated tensors land in the template's memory; per-rank ones never do.
            assert shared == ["model/layer.weight", "optimizer/exp_avg"] and not untouched
        else:
            assert shared == [] and untouched
