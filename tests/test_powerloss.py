"""Power-loss exploration: a careful checkpointer survives every crash state, one without
fsync survives a process kill but not a power loss, and the warm pool cleans up after itself.

Two real 2-rank saves are recorded once per module (a few seconds each); each
exploration then checks a seeded sample of their crash states in a warm pool.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from chaos.judge.powerloss import (
    CLASSES,
    PowerLossInput,
    classify,
    explore,
    plan_states,
    record_save,
    sync_tree,
)
from chaos.launch.recovery_pool import RecoveryPool

HERE = Path(__file__).resolve().parent
CAREFUL = f"{HERE / 'checkpointers' / 'careful.py'}:CarefulCheckpointer"
NO_FSYNC = f"{HERE / 'checkpointers' / 'no_fsync.py'}:NoFsyncCheckpointer"


def _record(tmp_path_factory: pytest.TempPathFactory, spec: str) -> PowerLossInput:
    work = tmp_path_factory.mktemp("powerloss")
    inp = record_save(work / "ckpt", work / "rec", checkpointer=spec, world_size=2, saves=(1, 2),
                      max_states=120, exhaustive_limit=1000)
    return dataclasses.replace(inp, scratch=str(work / "states"))


@pytest.fixture(scope="module")
def careful(tmp_path_factory: pytest.TempPathFactory) -> PowerLossInput:
    return _record(tmp_path_factory, CAREFUL)


@pytest.fixture(scope="module")
def no_fsync(tmp_path_factory: pytest.TempPathFactory) -> PowerLossInput:
    return _record(tmp_path_factory, NO_FSYNC)


def _consistent(rep: object) -> None:
    d = rep.to_dict()  # type: ignore[attr-defined]
    json.dumps(d)  # JSON-serialisable as is
    assert set(d["counts"]) == set(CLASSES)
    assert d["checked"] == sum(d["counts"].values()) == d["generated"] > 0
    assert d["violation_count"] == len(d["violations"]) == d["checked"] - d["counts"]["ok"]
    assert d["total_possible"] >= d["generated"]
    assert d["states_per_s"] > 0 and d["cpu"]["per_state_ms"] > 0
    # generated = checked + pruned, pruned never counted as checked, each pruned one judged
    assert d["states_checked"] == d["checked"] == d["states_distinct"]
    assert d["states_generated"] == d["states_checked"] + d["states_pruned"] >= d["checked"]
    assert sum(d["pruned_counts"].values()) == d["states_pruned"]
    assert set(d["pruned_counts"]) == set(CLASSES)
    assert d["checked_per_s"] > 0 and d["total_seconds"] >= d["seconds"]


def test_recording_holds_what_explore_needs(careful: PowerLossInput) -> None:
    assert careful.step == 2 and careful.acked_before == 1
    assert set(careful.committed) == {1, 2} and set(careful.committed[2]) == {0, 1}
    assert careful.committed[1][0] != careful.committed[2][0]
    assert any(p.startswith("step-1/") for p in careful.base.files)
    ops = {r["op"] for t in careful.traces for r in t if r.get("event") == "op"}
    assert {"write", "fsync", "rename"} <= ops
    assert all(r.get("data") is not None for t in careful.traces for r in t if r.get("op") == "write")


def test_careful_checkpointer_survives_every_sampled_crash_state(careful: PowerLossInput) -> None:
    rep = explore(careful)
    _consistent(rep)
    assert not rep.exhaustive and rep.seed == careful.seed and "seed" in rep.sampling
    assert rep.passed, rep.violations[:3]
    assert rep.counts["ok"] == rep.checked >= 100
    assert rep.summary().startswith("power crash states of save 2: checked ")


def test_no_fsync_passes_a_kill_but_not_a_power_loss(no_fsync: PowerLossInput) -> None:
    killed = explore(dataclasses.replace(no_fsync, mode="kill"))
    _consistent(killed)
    assert killed.exhaustive and killed.passed and killed.checked >= 20

    rep = explore(dataclasses.replace(no_fsync, parallel=2))  # two recovery groups at once
    _consistent(rep)
    assert rep.pool["pools"] == 2
    bad = rep.violations
    assert bad, rep.counts
    assert {v["class"] for v in bad} <= {"atomicity", "durability"}
    for v in bad:
        assert v["lost"], v  # each says what the power loss dropped
        assert all(x["reason"] in ("file not fsynced", "directory not fsynced") for x in v["lost"])
        assert len(v["loaded_step"]) == 2
    # the acknowledged step 1 vanishing (rmtree persisted, new data not) or ranks split
    assert any(v["class"] == "durability" for v in bad) or any(None in v["loaded_step"] for v in bad)


def _verdicts(rep: object) -> tuple:
    d = rep.to_dict(max_violations=10_000)  # type: ignore[attr-defined]
    return (d["counts"], d["pruned_counts"], d["states_generated"],
            sorted((v["id"], v["class"], tuple(v["loaded_step"]), v.get("after_ack", False)) for v in d["violations"]))


def test_no_fsync_verdicts_do_not_depend_on_batching_or_groups(no_fsync: PowerLossInput) -> None:
    """One state per round trip in one group, or batches in two groups: the same verdict for
    every state, and the same verdicts for the pruned ones."""
    one = explore(dataclasses.replace(no_fsync, parallel=1, batch=1))
    many = explore(dataclasses.replace(no_fsync, parallel=2, batch=8))
    odd = explore(dataclasses.replace(no_fsync, parallel=2, batch=3))
    for rep in (one, many, odd):
        _consistent(rep)
    assert _verdicts(one) == _verdicts(many) == _verdicts(odd)
    assert one.counts["durability"] > 0 and many.pool["batch"] == 8
    # the pruned states of a failing save include failing ones, judged as such
    assert sum(n for c, n in many.pruned_counts.items() if c != "ok") > 0


def test_pruned_states_have_exactly_the_tree_of_the_state_checked_for_them(no_fsync: PowerLossInput) -> None:
    """On a real recording: every combination deduplicated into a kept state has its tree."""
    import itertools

    from chaos.judge.powerloss import covering_prefixes
    from faults.crashstate import Deduper

    model, cs = plan_states(no_fsync)
    assert cs.enumerated > cs.generated and sum(s.equivalents for s in cs.states) == cs.enumerated
    dedup = Deduper(model, latest=True)
    combos = [(k, ch) for k in reversed(covering_prefixes(model)) for ch in itertools.islice(model.all_choices(k), 1500)]
    for k, ch in combos:
        dedup.add(k, *ch, unique=True)
    kept = {s.fingerprint: s for s in dedup.states()}
    assert len(kept) < len(combos)  # there is something to prune
    for k, ch in combos:
        st = model.state(k, *ch)
        rep = kept[model.fingerprint(st)]
        assert model.contents(st) == model.contents(rep), st.id
        assert rep.prefix >= k


def test_sampling_is_reproducible_by_seed(no_fsync: PowerLossInput) -> None:
    a = [s.id for s in plan_states(no_fsync)[1].states]
    b = [s.id for s in plan_states(no_fsync)[1].states]
    c = [s.id for s in plan_states(dataclasses.replace(no_fsync, seed=1))[1].states]
    assert a == b and len(a) >= 100
    assert a != c


def test_sync_tree_equals_a_fresh_materialisation(no_fsync: PowerLossInput, tmp_path: Path) -> None:
    """Reusing a directory between states must not leak what a recovery changed."""
    model, cs = plan_states(no_fsync)
    slot = tmp_path / "slot"
    slot.mkdir()

    def tree(root: Path) -> dict[str, bytes | None]:
        return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
                for p in sorted(root.rglob("*"))}

    for a, b in zip(cs.states[:-1:7], cs.states[1::7], strict=False):
        sync_tree(model, a, str(slot))
        # what a recovery might do: new files, a shard rewritten in place, a dir removed
        (slot / "metrics.prom").write_text("x")
        for f in [p for p in slot.rglob("*.pt")][:1]:
            data = bytearray(f.read_bytes())
            if data:
                data[0] ^= 0xFF
                f.write_bytes(bytes(data))
        if (slot / "step-1").is_dir():
            shutil.rmtree(slot / "step-1")
        sync_tree(model, b, str(slot))
        fresh = tmp_path / f"fresh-{b.id}"
        model.materialize(b, fresh)
        assert tree(slot) == tree(fresh), b.id


def test_classify() -> None:
    fp = {s: {r: {"x": f"{s}.{r}"} for r in (0, 1)} for s in (1, 2)}

    def res(*steps: int | None, err: str | None = None, timeout: bool = False) -> list[dict]:
        return [{"rank": r, "step": s, "fingerprint": None if s is None else fp[s][r],
                 "error": err if r == 0 else None, "timeout": timeout and r == 0}
                for r, s in enumerate(steps)]

    assert classify(res(2, 2), fp, 1)[0] == "ok"
    assert classify(res(1, 1), fp, 1)[0] == "ok"
    assert classify(res(1, 1), fp, 2) == ("durability", classify(res(1, 1), fp, 2)[1])
    assert classify(res(None, None), fp, None)[0] == "ok"
    assert classify(res(None, None), fp, 1)[0] == "durability"
    assert classify(res(1, 2), fp, None)[0] == "atomicity"
    assert classify(res(2, None), fp, None)[0] == "atomicity"
    assert classify(res(None, None, err="ValueError: bad"), fp, 1)[1]["liveness"] is True
    assert classify(res(None, None, timeout=True, err="Timeout"), fp, 1)[0] == "hang"
    mixed = res(2, 2)
    mixed[1]["fingerprint"] = {"x": "junk"}
    cls, detail = classify(mixed, fp, 1)
    assert cls == "atomicity" and "never committed" in detail["reason"]
    assert detail["first_difference"] == "x: differs"
    # step keys as strings (committed read back from JSON) work the same
    js = json.loads(json.dumps(fp))
    assert classify(res(2, 2), js, 1)[0] == "ok"


HANGS = '''
import torch.distributed as dist

class Hangs:
    """Rank 1 enters a barrier that rank 0 never joins when the directory says so."""
    def __init__(self, root, rank, world_size):
        self.root, self.rank = root, rank
    def save(self, step, state): pass
    def wait(self): pass
    def load_latest(self, template):
        import os
        if os.path.exists(os.path.join(self.root, "hang")) and self.rank == 1:
            dist.barrier()
        return None
    def close(self): pass
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_pool_times_out_a_hang_restarts_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "hangs.py").write_text(HANGS)
    ok_dir, hang_dir = tmp_path / "ok", tmp_path / "h"
    ok_dir.mkdir()
    hang_dir.mkdir()
    (hang_dir / "hang").write_text("")
    seen: set[int] = set()
    with RecoveryPool(2, {"d_model": 32, "n_layers": 1, "n_heads": 2}, f"{tmp_path / 'hangs.py'}:Hangs",
                      pg_timeout_s=2.0, job_timeout_s=6.0) as pool:
        first = list(pool.pids)
        seen.update(first)
        assert all(_alive(p) for p in first)
        assert [r["step"] for r in pool.recover(ok_dir)] == [None, None]
        t0 = time.monotonic()
        out = pool.recover(hang_dir)
        assert time.monotonic() - t0 < 15
        assert any(r["timeout"] for r in out)
        assert classify(out, {}, None)[0] == "hang"
        assert pool.stats.restarts and pool.pids != first  # fresh group after the hang
        seen.update(pool.pids)
        assert [r["error"] for r in pool.recover(ok_dir)] == [None, None]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in seen if _alive(p)]
    assert not any(os.path.exists(f"/proc/{p}") and _alive(p) for p in seen)


@pytest.mark.bench
def test_bench_crashstates_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`chaos bench crashstates` end to end (a benchmark: prints the rate, asserts no timing)."""
    import argparse

    from chaos.bench import crashstates as crashbench

    parser = argparse.ArgumentParser()
    crashbench.add_arguments(parser)
    out = tmp_path / "bench.json"
    code = crashbench.run(parser.parse_args(["--max-states", "200", "--json", str(out)]))
    text = capsys.readouterr().out
    print(text)
    doc = json.loads(out.read_text())
    assert code == (0 if doc["passed"] else 1)
    assert doc["checked"] == sum(doc["counts"].values()) > 0
    assert "states/s" in text and doc["cpu"]["capacity_states_per_s_2_cores"] > 0
    # today's keys stay (history), the separate counts join them
    assert {"states_per_s", "checked", "generated", "seconds", "generate_seconds", "counts", "cpu"} <= set(doc)
    assert doc["states_generated"] == doc["states_checked"] + doc["states_pruned"]
    assert sum(doc["pruned_counts"].values()) == doc["states_pruned"]
    assert "pruned" in text and "checked/s" in text


MISBEHAVES = '''
import os
import torch.distributed as dist

class Misbehaves:
    """Rank 1 enters a barrier rank 0 never joins when the state holds ``hang``."""
    def __init__(self, root, rank, world_size):
        self.root, self.rank = root, rank
    def save(self, step, state): pass
    def wait(self): pass
    def load_latest(self, template):
        if os.path.exists(os.path.join(self.root, "hang")) and self.rank == 1:
            dist.barrier()
        return None
    def close(self): pass
'''


def test_states_a_hang_cut_out_of_a_batch_are_sent_again(tmp_path: Path) -> None:
    """A hanging state ends its batch; the states after it are written again and judged."""
    from faults.crashstate import Snapshot
    from faults.interposer import Interposer, read_trace

    (tmp_path / "misbehaves.py").write_text(MISBEHAVES)
    root = tmp_path / "ckpt"
    root.mkdir()
    base = Snapshot.capture(root)
    trace = tmp_path / "trace.jsonl"
    with Interposer(root, 0, trace):  # no fsync at all: x and hang may or may not survive
        (root / "x").write_bytes(b"1")
        (root / "hang").write_bytes(b"")
    spec = f"{tmp_path / 'misbehaves.py'}:Misbehaves"
    wl = {"d_model": 32, "n_layers": 1, "n_heads": 2}
    inp = PowerLossInput(ckpt_root=str(root), base=base, traces=[read_trace(trace, with_data=True)],
                         checkpointer=spec, world_size=2, workload=wl, step=1, committed={}, acked_before=None,
                         scratch=str(tmp_path / "states"), batch=4)
    with RecoveryPool(2, wl, spec, pg_timeout_s=1.0, job_timeout_s=4.0) as pool:
        rep = explore(inp, pool=pool)
    _consistent(rep)
    model, cs = plan_states(inp)
    hangs = sum(1 for s in cs.states if "hang" in model.contents(s)[1])
    assert 1 <= hangs < cs.generated
    assert rep.checked == rep.generated == cs.generated  # every state judged, none lost with its batch
    # the others load nothing although save 1 (the end of this trace) was acknowledged
    assert rep.counts["hang"] == hangs and rep.counts["durability"] == rep.checked - hangs
    assert len(rep.pool["restarts"]) == hangs, (rep.pool, rep.violations)
