"""RecoveryPool batches: several states per round trip, each still bounded, judged and in step.

A batch streams one result per state and per rank; after each state the ranks agree on
the pool's own gloo group that they are in step. These tests run real 2-rank pools on
small checkpointers that misbehave when a marker file is in the directory: a rank that
hangs in a collective the other never joins, a rank that dies, a rank that raises.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from chaos.errors import HarnessError
from chaos.judge.powerloss import classify
from chaos.launch.recovery_pool import RecoveryPool

WORKLOAD = {"d_model": 32, "n_layers": 1, "n_heads": 2}

MISBEHAVES = '''
import os
import torch.distributed as dist
from chaos.phases import phase

class Misbehaves:
    """Marker files in the directory: hang (rank 1 enters a barrier rank 0 never joins),
    die (rank 1 exits), raise (rank 0 raises). Otherwise nothing to load."""
    def __init__(self, root, rank, world_size):
        self.root, self.rank = root, rank
    def save(self, step, state): pass
    def wait(self): pass
    def load_latest(self, template):
        has = lambda name: os.path.exists(os.path.join(self.root, name))
        if has("hang") and self.rank == 1:
            dist.barrier()
        if has("die") and self.rank == 1:
            os._exit(7)
        if has("raise") and self.rank == 0:
            raise ValueError("bad checkpoint")
        if has("reject"):
            phase("load_rejected", step=12, why=f"rank {self.rank}: shard checksum mismatch")
        return None
    def close(self): pass
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("ok", "hang", "die", "raise", "reject"):
        d = tmp_path / name
        d.mkdir()
        if name != "ok":
            (d / name).write_text("")
        out[name] = d
    (tmp_path / "misbehaves.py").write_text(MISBEHAVES)
    return out


def _pool(tmp_path: Path) -> RecoveryPool:
    return RecoveryPool(2, WORKLOAD, f"{tmp_path / 'misbehaves.py'}:Misbehaves", pg_timeout_s=2.0, job_timeout_s=6.0)


def _wait_gone(pids: set[int]) -> list[int]:
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_a_batch_gives_each_state_its_own_results(dirs: dict[str, Path], tmp_path: Path) -> None:
    with _pool(tmp_path) as pool:
        first = list(pool.pids)
        pool.submit_batch([dirs["ok"], dirs["raise"], dirs["ok"]])
        out = pool.collect_batch()
        assert [None if s is None else [r["error"] for r in s] for s in out] == [
            [None, None], ["ValueError: bad checkpoint", None], [None, None]]
        assert classify(out[1], {}, None)[0] == "error"  # type: ignore[arg-type]
        # a rank that raised left the group in step: no restart, same processes
        assert not pool.stats.restarts and pool.pids == first
        assert pool.stats.jobs == 3
        # the single-state path still works beside it
        assert [r["error"] for r in pool.recover(dirs["ok"])] == [None, None]
        with pytest.raises(HarnessError, match="no batch in flight"):
            pool.collect_batch()


def test_a_hang_in_a_batch_is_a_hang_and_the_rest_is_sent_back(dirs: dict[str, Path], tmp_path: Path) -> None:
    """Rank 1 stuck in a barrier must not be mistaken for done: the agreement runs on the
    pool's own group, so it cannot pair with the checkpointer's stray barrier."""
    seen: set[int] = set()
    with _pool(tmp_path) as pool:
        first = list(pool.pids)
        seen.update(first)
        t0 = time.monotonic()
        pool.submit_batch([dirs["ok"], dirs["hang"], dirs["ok"], dirs["ok"]])
        out = pool.collect_batch()
        assert time.monotonic() - t0 < 20
        assert out[0] is not None and [r["error"] for r in out[0]] == [None, None]
        assert out[1] is not None and classify(out[1], {}, None)[0] == "hang"
        assert out[2:] == [None, None]  # not run: to be sent again
        assert pool.stats.restarts and pool.pids != first
        seen.update(pool.pids)
        pool.submit_batch([dirs["ok"], dirs["ok"]])
        again = pool.collect_batch()
        assert [[r["error"] for r in s] for s in again if s is not None] == [[None, None], [None, None]]
        # the last state of a batch hanging restarts the group too (its result carries the outcome)
        before = len(pool.stats.restarts)
        pool.submit_batch([dirs["ok"], dirs["hang"]])
        last = pool.collect_batch()
        assert last[1] is not None and classify(last[1], {}, None)[0] == "hang"
        assert len(pool.stats.restarts) == before + 1
        seen.update(pool.pids)
        pool.submit_batch([dirs["ok"]])
        assert [r["error"] for r in pool.collect_batch()[0] or []] == [None, None]
    assert not _wait_gone(seen)


def test_a_rank_dying_in_a_batch(dirs: dict[str, Path], tmp_path: Path) -> None:
    seen: set[int] = set()
    with _pool(tmp_path) as pool:
        seen.update(pool.pids)
        pool.submit_batch([dirs["ok"], dirs["die"], dirs["ok"]])
        out = pool.collect_batch()
        assert out[0] is not None and [r["error"] for r in out[0]] == [None, None]
        died = out[1]
        assert died is not None and "WorkerDied" in (died[1]["error"] or "") and "exited 7" in died[1]["error"]
        assert classify(died, {}, None)[0] == "error"
        assert out[2] is None
        assert pool.stats.restarts and "rank 1 exited 7" in pool.stats.restarts[0]
        seen.update(pool.pids)
        pool.submit_batch([dirs["ok"]])
        assert [r["error"] for r in pool.collect_batch()[0] or []] == [None, None]
    assert not _wait_gone(seen)
    assert not any(os.path.exists(f"/proc/{p}") and _alive(p) for p in seen)


def test_a_fallback_the_checkpointer_explains_is_quoted_in_the_verdict(dirs: dict[str, Path], tmp_path: Path) -> None:
    """A power-loss "loaded an older step" says why, where the loader announces phase load_rejected."""
    with _pool(tmp_path) as pool:
        quiet, loud = pool.recover(dirs["ok"]), pool.recover(dirs["reject"])
    assert all("rejected" not in r for r in quiet)
    assert [r["rejected"] for r in loud] == [[{"step": 12, "why": f"rank {r}: shard checksum mismatch"}]
                                             for r in (0, 1)]
    fp = {"w": "abc"}
    for r in loud:
        r.update(step=8, fingerprint=fp)
    kind, detail = classify(loud, {8: {0: fp, 1: fp}}, 12)
    assert kind == "durability" and detail["reason"] == "loaded step 8, older than acknowledged step 12"
    assert detail["rejected"]["rank 1"] == [{"step": 12, "why": "rank 1: shard checksum mismatch"}]
