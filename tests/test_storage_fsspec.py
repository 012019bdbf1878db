"""The generic fsspec backend: commit object written last, honest about what it lacks.

In-process on ``memory://`` (one rank) and across real rank processes on ``local://``
(an fsspec filesystem every rank sees), always judged by fingerprints of what loads.
"""

from __future__ import annotations

import os
import tempfile
import uuid

import pytest
import torch
from ckpt_dist import check_all_ok, run_ranks

from chaos.model.statehash import fingerprint
from chaos.reference.checkpoint import ReferenceCheckpointer
from chaos.reference.ckptformat.errors import CommitError
from chaos.reference.storage import CommitConflict, StorageConfigError, open_storage
from chaos.reference.storage.fsspec_store import FsspecStorage


def state(step: int, rank: int = 0) -> dict:
    g = torch.Generator().manual_seed(step)
    w = torch.randn(64, 32, generator=g)
    return {"model": {"w": w}, "optimizer": {"state": {0: {"exp_avg": w * 0.5}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "rng": torch.full((4,), rank, dtype=torch.uint8), "progress": {"step": step}}


@pytest.fixture
def mem_url():
    url = f"memory://chaos-test-{uuid.uuid4().hex[:8]}/ckpt"
    yield url
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.rm(url.split("://", 1)[1].split("/")[0], recursive=True)


def test_memory_roundtrip_fallback_and_stated_protocol(tmp_path, mem_url):
    store = open_storage(mem_url, local_dir=str(tmp_path))
    assert isinstance(store, FsspecStorage) and not store.exclusive_commit
    assert "NOT provided" in store.commit_protocol and "last writer wins" in store.commit_protocol
    ck = ReferenceCheckpointer(str(tmp_path / "local"), 0, 1, storage=mem_url, metrics=False)
    ck.save(5, state(5))
    ck.save(10, state(10))
    step, got = ck.load_latest(state(0))
    assert step == 10 and fingerprint(got) == fingerprint(state(10))
    # Corrupt the newest shard in the store: detected, the older step loads.
    fs, data = store.fs, store
    rec = fs.cat_file(data.commit_key(10))
    import json

    shard = f"{store.base}/{json.loads(rec)['data']}/shard-r00000.safetensors"
    blob = bytearray(fs.cat_file(shard))
    blob[-5] ^= 0x40
    fs.pipe_file(shard, bytes(blob))
    step, got = ck.load_latest(state(0))
    assert step == 5 and fingerprint(got) == fingerprint(state(5))
    rejects = [e["reason"] for e in ck.events if e["kind"] == "load_reject"]
    assert rejects and "checksum mismatch" in rejects[-1] and "memory://" in rejects[-1]
    ck.close()


def test_uncommitted_data_is_invisible_and_cleaned(tmp_path, mem_url):
    ck = ReferenceCheckpointer(str(tmp_path / "local"), 0, 1, storage=mem_url, metrics=False)
    ck.save(5, state(5))
    store = ck.store
    # A crashed save: shards under data/ but no commit object.
    with store.create_shard(".tmp-step-0000000009-abcdef", "shard-r00000.safetensors") as f:
        f.write(b"partial")
    assert store.list_steps() == [5]
    assert any("step-0000000009" in r for r in store.clean_stale())
    assert not store.fs.exists(f"{store.base}/data/step-0000000009-abcdef")
    ck.close()


def test_a_second_writer_to_a_committed_step_is_refused(tmp_path, mem_url):
    a = ReferenceCheckpointer(str(tmp_path / "a"), 0, 1, storage=mem_url, metrics=False)
    a.save(5, state(5))
    b = ReferenceCheckpointer(str(tmp_path / "b"), 0, 1, storage=mem_url, metrics=False, keep_last=10)
    b.store._seen.clear()  # b never listed step 5: to it, that commit is someone else's
    with pytest.raises(CommitError) as exc:
        b.save(5, state(6))
    assert isinstance(exc.value, CommitConflict) or "already committed by another writer" in str(exc.value)
    step, got = a.load_latest(state(0))
    assert step == 5 and fingerprint(got) == fingerprint(state(5))
    a.close()
    b.close()


def test_a_step_without_its_commit_object_was_never_committed(tmp_path, mem_url):
    ck = ReferenceCheckpointer(str(tmp_path / "local"), 0, 1, storage=mem_url, metrics=False)
    assert ck.load_latest(state(0)) is None
    ck.save(5, state(5))
    ck.save(7, state(7))
    ck.store.fs.rm_file(ck.store.commit_key(7))  # data, manifest and latest remain; the commit point does not
    step, got = ck.load_latest(state(0))
    assert step == 5 and fingerprint(got) == fingerprint(state(5))
    ck.close()


def _save_load_local(rank: int, world: int, url: str) -> tuple:
    ck = ReferenceCheckpointer(url, rank, world, metrics=False, timeout_s=15)
    ck.save(3, state(3, rank))
    ck.save(6, state(6, rank))
    step, got = ck.load_latest(state(0, rank))
    ck.close()
    return step, fingerprint(got) == fingerprint(state(6, rank))


def test_two_rank_processes_on_local_fsspec(tmp_path):
    results = check_all_ok(run_ranks(_save_load_local, 2, f"local://{tmp_path}/ckpt"))
    assert results == [(6, True), (6, True)]


def _temp_dir_here(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # what a rank process has: its scenario's scratch
    return tmp


def test_no_temp_dir_outlives_a_store_that_is_never_closed(tmp_path, mem_url, monkeypatch):
    """Hole 8: opening a backend creates nothing (no chaos-fsspec-* dir to leak on error or SIGKILL);
    a shard download lives in a temp dir only while it is read."""
    tmp = _temp_dir_here(tmp_path, monkeypatch)
    ck = ReferenceCheckpointer(str(tmp_path / "local"), 0, 1, storage=mem_url, metrics=False)
    ck.save(3, state(3))
    ck.close()
    reader = open_storage(mem_url)  # never closed, as after an error or a SIGKILL
    m, _ = reader.read_manifest(3, 1 << 20)
    for name, spec in m["shards"].items():
        assert reader.read_shard(3, name, spec, m["hash"], True).path.startswith("memory://")
    assert list(tmp.iterdir()) == []


def test_a_failed_construction_removes_the_checkpointers_own_temp_dir(tmp_path, mem_url, monkeypatch):
    """A URL root gets a private local dir (chaos-ckpt-*): removed on close() and when __init__ fails."""
    tmp = _temp_dir_here(tmp_path, monkeypatch)
    with pytest.raises(StorageConfigError, match="nothere.py"):
        ReferenceCheckpointer(mem_url, 0, 1, metrics=False, storage_wrapper=f"{tmp_path}/nothere.py:W")
    assert list(tmp.iterdir()) == []
    ck = ReferenceCheckpointer(mem_url, 0, 1, metrics=False)
    assert os.path.dirname(ck.root) == str(tmp)
    ck.save(1, state(1))
    assert ck.load_latest(state(0))[0] == 1
    ck.close()
    assert list(tmp.iterdir()) == []


def test_every_reader_is_a_fresh_filesystem_instance_without_a_listing_cache(mem_url):
    """Hole 5: fsspec's instance cache would hand a reader the writer's instance (and its listings)."""
    a, b = open_storage(mem_url), open_storage(mem_url)
    assert a.fs is not b.fs
    assert not a.fs.dircache.use_listings_cache
    with pytest.raises(StorageConfigError, match="use_listings_cache cannot be set"):
        open_storage(mem_url + "?use_listings_cache=1")
