"""Commit protocol: ordering of fsyncs and renames, failures that must commit nothing,
and retention that never deletes the newest checkpoint or deletes before a commit."""

from __future__ import annotations

import os

import pytest
import torch

from chaos import phases
from chaos.reference.checkpoint import CommitError, ReferenceCheckpointer
from chaos.reference.checkpoint.options import Milestones
from chaos.reference.checkpoint.policy import select_for_deletion
from chaos.reference.ckptformat import commit


def state(step: int) -> dict:
    return {"model": {"w": torch.full((8,), float(step))}, "optimizer": {"state": {}, "param_groups": []}, "progress": {"step": step}}


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def trace(monkeypatch):
    """Record fsync/rename/replace and phase announcements, in order."""
    log: list[tuple[str, str]] = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

    def fsync(fd):
        log.append(("fsync", _fd_path(fd)))
        return real_fsync(fd)

    def rename(a, b):
        log.append(("rename", f"{a} -> {b}"))
        return real_rename(a, b)

    def replace(a, b):
        log.append(("replace", f"{a} -> {b}"))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)

    def listener(name, info):
        log.append(("phase", name))

    phases.subscribe(listener)
    yield log
    phases.unsubscribe(listener)


def _index(log, kind, pred):
    for i, (k, v) in enumerate(log):
        if k == kind and pred(v):
            return i
    raise AssertionError(f"no {kind} matching in {log}")


def test_commit_order_fsync_before_rename_before_latest(tmp_path, trace):
    root = str(tmp_path)
    ReferenceCheckpointer(root, 0, 1, metrics=False).save(10, state(10))
    final = os.path.join(root, "step-0000000010")
    shard_fsync = _index(trace, "fsync", lambda p: p.endswith("shard-r00000.safetensors") and ".tmp-step" in p)
    manifest_fsync = _index(trace, "fsync", lambda p: p.endswith("manifest.json") and ".tmp-step" in p)
    rename = _index(trace, "rename", lambda v: v.endswith("-> " + final))
    final_fsync = _index(trace, "fsync", lambda p: p == final)
    latest_fsync = _index(trace, "fsync", lambda p: ".tmp-latest" in p)
    latest_replace = _index(trace, "replace", lambda v: v.endswith(os.path.join(root, "latest")))
    vote = _index(trace, "phase", lambda v: v == "vote")
    assert shard_fsync < vote < manifest_fsync < rename < final_fsync < latest_fsync < latest_replace
    # One root fsync after both renames makes the directory and the pointer durable.
    assert trace[latest_replace + 1] == ("fsync", root), "latest rename must be followed by a directory fsync"
    assert [i for i, (k, v) in enumerate(trace) if k == "fsync" and v == root] == [latest_replace + 1]
    names = [v for k, v in trace if k == "phase"]
    assert names == ["snapshot", "write_shards", "fsync_shards", "vote", "write_manifest", "rename", "update_latest", "retention"]
    assert commit.read_latest(root) == 10


@pytest.mark.parametrize("fail_at", ["write_shards", "fsync_shards", "write_manifest", "rename", "update_latest"])
def test_failure_at_any_phase_commits_nothing(tmp_path, fail_at):
    root = str(tmp_path)
    c = ReferenceCheckpointer(root, 0, 1)
    c.save(5, state(5))

    def boom(name, info):
        if name == fail_at:
            raise OSError(5, "Input/output error")

    phases.subscribe(boom)
    try:
        with pytest.raises(CommitError, match="Input/output error"):
            c.save(10, state(10))
    finally:
        phases.unsubscribe(boom)
    assert commit.list_steps(root) == [5] and commit.read_latest(root) == 5
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-step")]
    assert c.load_latest(state(0))[0] == 5
    assert [e["ok"] for e in c.events if e["kind"] == "save"] == [True, False]


def test_async_failure_raised_at_wait_and_next_save(tmp_path, monkeypatch):
    root = str(tmp_path)
    c = ReferenceCheckpointer(root, 0, 1, async_save=True)
    c.save(1, state(1))
    c.wait()

    def boom(name, info):
        if name == "rename":
            raise OSError(28, "No space left on device")

    phases.subscribe(boom)
    try:
        c.save(2, state(2))
        with pytest.raises(CommitError, match="No space left"):
            c.wait()
        c.save(3, state(3))
        c._background.join()
        with pytest.raises(CommitError, match="step 3"):
            c.save(4, state(4))
    finally:
        phases.unsubscribe(boom)
    c.wait()
    c.close()
    assert commit.read_latest(root) == 1


def test_retention_selection_rules():
    # Keeps the newest N of the current timeline, milestones, and anything newer than current.
    assert select_for_deletion([10, 20, 30, 40], 40, 2) == [10, 20]
    assert select_for_deletion([10, 20, 30, 40], 40, 2, Milestones(steps=frozenset({10}))) == [20]
    assert select_for_deletion([10, 20, 30, 40], 40, 1, Milestones(every=20)) == [10, 30]
    # Never delete before the new checkpoint is committed (current must be listed).
    assert select_for_deletion([10, 20, 30], 40, 1) == []
    # Resumed from 15 after 20/30 were rejected: the new save at 16 and its timeline are kept,
    # the newer (abandoned) ones are left for loaders to try last, and 16 is never deleted.
    assert select_for_deletion([10, 15, 16, 20, 30], 16, 1) == [10, 15]
    assert 16 not in select_for_deletion([16, 20, 30], 16, 1)


def test_retention_runs_after_commit_only(tmp_path):
    root = str(tmp_path)
    c = ReferenceCheckpointer(root, 0, 1, keep_last=2, milestones="every-30")
    for s in (10, 20, 30, 40, 50):
        c.save(s, state(s))
    assert commit.list_steps(root) == [50, 40, 30]

    def boom(name, info):
        if name == "rename":
            raise OSError(5, "Input/output error")

    phases.subscribe(boom)
    try:
        with pytest.raises(CommitError):
            c.save(60, state(60))
    finally:
        phases.unsubscribe(boom)
    assert commit.list_steps(root) == [50, 40, 30], "a failed save must not trigger retention"
    deletions = [e for e in c.events if e["kind"] == "retention"]
    assert [d["deleted"] for d in deletions] == [[10], [20]]


def test_pointer_and_listing_on_fake_fs(fs):
    fs.create_dir("/ck/step-0000000010")
    fs.create_dir("/ck/step-0000000020")
    fs.create_dir("/ck/.tmp-step-0000000030-abc")
    fs.create_file("/ck/step-0000000040")  # a file, not a checkpoint dir
    assert commit.list_steps("/ck") == [20, 10]
    assert commit.read_latest("/ck") is None
    fs.create_file("/ck/latest", contents="../../etc/passwd\n")
    with pytest.raises(commit.ManifestError, match="does not name a step directory"):
        commit.read_latest("/ck")
    fs.remove("/ck/latest")
    fs.create_file("/ck/latest", contents="x" * 1000)
    with pytest.raises(commit.ManifestError, match="larger than"):
        commit.read_latest("/ck")
    assert commit.clean_stale("/ck") == [".tmp-step-0000000030-abc"]
    from chaos.reference.checkpoint.loader import candidate_order

    fs.remove("/ck/latest")
    fs.create_file("/ck/latest", contents="step-0000000010\n")
    assert candidate_order("/ck") == [10, 20]


def test_every_rank_makes_the_root_with_the_same_calls_whoever_made_it_first(tmp_path, monkeypatch) -> None:
    """make_root: each new directory's entry made durable by an fsync of its parent, and the same calls
    on a rank that finds the root made by another (two runs of a job trace the same events per rank)."""
    calls: list[tuple[str, str]] = []
    real_mkdir, real_fsync_dir = os.mkdir, commit.fsync_dir

    def mkdir(path, *a, **kw):
        calls.append(("mkdir", os.path.relpath(path, tmp_path)))
        return real_mkdir(path, *a, **kw)

    def fsync_dir(path):
        calls.append(("fsync", os.path.relpath(path, tmp_path)))
        return real_fsync_dir(path)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(commit, "fsync_dir", fsync_dir)
    commit.make_root(str(tmp_path / "a" / "ckpt"))  # the first rank: makes a/ and a/ckpt
    assert calls == [("mkdir", "a"), ("fsync", "."), ("mkdir", "a/ckpt"), ("fsync", "a")]
    assert (tmp_path / "a" / "ckpt").is_dir()
    calls.clear()
    commit.make_root(str(tmp_path / "a" / "ckpt"))  # another rank, once the first made it
    assert calls == [("mkdir", "a/ckpt"), ("fsync", "a")]
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError):
        commit.make_root(str(tmp_path / "f"))  # a file in the way is no directory
