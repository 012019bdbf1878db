"""Hostile object stores: every read of the S3 and fsspec backends is bounded.

What a bucket or a remote directory holds is whatever its writers made it. Spoiled here,
one way per case, on the embedded S3 endpoint (moto), on ``memory://`` and on
``local://``: a ``latest`` pointer of megabytes, a commit object padded to megabytes, a
commit record without ``manifest_size`` naming a manifest far over
``max_manifest_bytes`` (whitespace-padded, so it is still the same valid manifest), a
shard object replaced by a larger one, and on ``local://`` the POSIX attacks (a FIFO, a
symbolic link out of the tree). Judged by outcomes: the bytes the S3 client pulled
(counted on every GetObject body), the Python heap peak on ``memory://``, a deadline for
every call, one typed error naming the object, and ``load_latest`` falling back to the
older committed step (or loading the newest when only the pointer was spoiled).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from test_hostile_checkpoint import bounded

from chaos.model.statehash import fingerprint
from chaos.reference.checkpoint import ReferenceCheckpointer
from chaos.reference.ckptformat.errors import CheckpointError, CorruptCheckpointError, ManifestError
from chaos.reference.ckptformat.manifest import MANIFEST_NAME
from chaos.reference.storage import open_storage, parse_url

MiB = 1 << 20
LIMIT = MiB  # max_manifest_bytes in these tests
SHARD = "shard-r00000.safetensors"


def state(step: int) -> dict:
    return {"model": {"w": torch.arange(4096, dtype=torch.float32) + step}, "progress": {"step": step}}


def _save_two(url: str, local: Path) -> None:
    c = ReferenceCheckpointer(str(local), 0, 1, storage=url, metrics=False)
    c.save(1, state(1))
    c.save(2, state(2))
    c.close()


def _load_latest(url: str, local: Path) -> tuple[int, Any]:
    c = ReferenceCheckpointer(str(local), 0, 1, storage=url, metrics=False, max_manifest_bytes=LIMIT)
    try:
        return c.load_latest(state(0))
    finally:
        c.close()


def _padded_manifest(body: bytes, pad: int) -> bytes:
    """The same manifest, valid JSON still, ``pad`` bytes longer (trailing whitespace)."""
    assert json.loads(body)
    return body + b" " * pad


# -- S3 ---------------------------------------------------------------------------------
# The S3 server (moto) runs in this process, so its own copies would count on the heap:
# what is judged is the bytes the client pulled, counted on every GetObject body.


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from chaos.certify.local_s3 import LocalS3

    with LocalS3() as server:
        yield server


def _meter(store: Any) -> dict[str, int]:
    """Count the bytes the store's client reads from every GetObject body."""
    seen = {"bytes": 0, "gets": 0}

    def wrap(parsed: dict, **_: Any) -> None:
        body = parsed.get("Body")
        if body is None:
            return
        seen["gets"] += 1
        real = body.read

        def read(*args: Any, **kwargs: Any) -> bytes:
            data = real(*args, **kwargs)
            seen["bytes"] += len(data)
            return data

        body.read = read

    store.client.meta.events.register("after-call.s3.GetObject", wrap)
    return seen


class S3Tree:
    def __init__(self, s3: Any, tmp_path: Path) -> None:
        self.url = s3.url()
        self.local = tmp_path / "local"
        _save_two(self.url, tmp_path / "writer")
        self.client, self.bucket = s3.client(), s3.bucket
        self.prefix = parse_url(self.url).prefix

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=body)

    def record(self, step: int) -> dict:
        return json.loads(self.get(f"commits/step-{step:010d}.json"))

    def reader(self) -> Any:
        store = open_storage(self.url, str(self.local))
        return store, _meter(store)


def test_s3_latest_pointer_of_megabytes_is_read_only_to_its_limit(s3, tmp_path):
    t = S3Tree(s3, tmp_path)
    t.put("latest", b"step-0000000001\n" + b" " * (32 * MiB))
    store, seen = t.reader()
    got = bounded(store.read_latest, tmp_path, "read_latest", heap_limit=None)
    assert isinstance(got.error, ManifestError) and got.error.file.endswith("/latest"), got.error
    assert seen["bytes"] <= 4096, f"read {seen['bytes']} bytes of a pointer that may hold 256"
    step, loaded = bounded(lambda: _load_latest(t.url, t.local), tmp_path, "load_latest", heap_limit=None).value
    assert step == 2 and fingerprint(loaded) == fingerprint(state(2))  # the pointer is ignored, not followed


def test_s3_manifest_without_a_recorded_size_is_still_bounded_by_max_manifest_bytes(s3, tmp_path):
    t = S3Tree(s3, tmp_path)
    rec = t.record(2)
    key = rec["data"].rstrip("/") + "/" + MANIFEST_NAME
    big = _padded_manifest(t.get(key), 16 * MiB)
    t.put(key, big)
    rec.pop("manifest_size")
    rec["manifest_sha256"] = hashlib.sha256(big).hexdigest()
    t.put("commits/step-0000000002.json", json.dumps(rec).encode())
    store, seen = t.reader()
    got = bounded(lambda: store.read_manifest(2, LIMIT), tmp_path, "read_manifest", heap_limit=None)
    assert isinstance(got.error, ManifestError) and "exceeds" in str(got.error) and got.error.file.endswith(MANIFEST_NAME)
    assert seen["bytes"] <= LIMIT + 64 * 1024, f"read {seen['bytes']} bytes under a {LIMIT}-byte limit"
    step, loaded = bounded(lambda: _load_latest(t.url, t.local), tmp_path, "load_latest", heap_limit=None).value
    assert step == 1 and fingerprint(loaded) == fingerprint(state(1))


def test_s3_commit_object_of_megabytes_is_refused_after_its_limit(s3, tmp_path):
    t = S3Tree(s3, tmp_path)
    rec = json.dumps(t.record(2)).encode()
    t.put("commits/step-0000000002.json", rec + b" " * (8 * MiB))  # still the same valid JSON
    store, seen = t.reader()
    got = bounded(lambda: store.read_manifest(2, LIMIT), tmp_path, "read_manifest", heap_limit=None)
    assert isinstance(got.error, ManifestError) and "commit object is larger" in str(got.error), got.error
    assert seen["bytes"] <= 128 * 1024, f"read {seen['bytes']} bytes of a commit object"
    step, _ = bounded(lambda: _load_latest(t.url, t.local), tmp_path, "load_latest", heap_limit=None).value
    assert step == 1


@pytest.mark.parametrize("verify", [True, False])
def test_s3_shard_size_is_checked_before_a_byte_is_downloaded(s3, tmp_path, verify):
    t = S3Tree(s3, tmp_path)
    rec = t.record(2)
    t.put(rec["data"].rstrip("/") + "/" + SHARD, b"\0" * (16 * MiB))
    store, seen = t.reader()
    m, _ = store.read_manifest(2, LIMIT)
    before = seen["bytes"]
    got = bounded(lambda: store.read_shard(2, SHARD, m["shards"][SHARD], m["hash"], verify), tmp_path, "read_shard",
                  heap_limit=None)
    assert isinstance(got.error, CorruptCheckpointError) and "manifest says" in str(got.error), got.error
    assert got.error.file.startswith("s3://") and got.error.file.endswith(SHARD)
    assert seen["bytes"] == before, f"downloaded {seen['bytes'] - before} bytes of a shard of the wrong size"
    step, _ = bounded(lambda: _load_latest(t.url, t.local), tmp_path, "load_latest", heap_limit=None).value
    assert step == 1


# -- memory:// ------------------------------------------------------------------------------

@pytest.fixture
def mem_url():
    url = f"memory://chaos-hostile-{uuid.uuid4().hex[:8]}/ckpt"
    yield url
    import fsspec

    fsspec.filesystem("memory").rm(url.split("://", 1)[1].split("/")[0], recursive=True)


def _heap_peak(fn: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        try:
            out: Any = fn()
        except CheckpointError as exc:
            out = exc
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_fs_manifest_without_a_recorded_size_is_bounded(tmp_path, mem_url):
    _save_two(mem_url, tmp_path / "writer")
    store = open_storage(mem_url, str(tmp_path / "local"))
    key = store.commit_key(2)
    rec = json.loads(store.fs.cat_file(key))
    path = f"{store.base}/{rec['data']}/{MANIFEST_NAME}"
    big = _padded_manifest(store.fs.cat_file(path), 32 * MiB)
    store.fs.pipe_file(path, big)
    rec.pop("manifest_size")
    rec["manifest_sha256"] = hashlib.sha256(big).hexdigest()
    store.fs.pipe_file(key, json.dumps(rec).encode())
    del big
    err, peak = _heap_peak(lambda: open_storage(mem_url).read_manifest(2, LIMIT))
    assert isinstance(err, ManifestError) and "exceeds" in str(err), err
    assert peak < 4 * LIMIT, f"heap peaked at {peak} bytes reading a manifest under a {LIMIT}-byte limit"
    step, loaded = _load_latest(mem_url, tmp_path / "local")
    assert step == 1 and fingerprint(loaded) == fingerprint(state(1))


def test_memory_fs_latest_pointer_of_megabytes_is_bounded(tmp_path, mem_url):
    _save_two(mem_url, tmp_path / "writer")
    store = open_storage(mem_url, str(tmp_path / "local"))
    store.fs.pipe_file(store.latest_key, b"step-0000000001\n" + b" " * (32 * MiB))
    err, peak = _heap_peak(lambda: open_storage(mem_url).read_latest())
    assert isinstance(err, ManifestError), err
    assert peak < MiB, f"heap peaked at {peak} bytes reading a 256-byte pointer"
    assert _load_latest(mem_url, tmp_path / "local")[0] == 2


# -- local:// (an fsspec filesystem that is a directory tree) ---------------------------------

def _local_tree(tmp_path: Path) -> tuple[str, Any, Path]:
    url = f"local://{tmp_path}/ckpt"
    _save_two(url, tmp_path / "writer")
    store = open_storage(url, str(tmp_path / "local"))
    rec = json.loads(Path(store.commit_key(2)).read_bytes())
    return url, store, Path(store.base) / rec["data"]


@pytest.mark.parametrize("target", ["latest", "commit", "manifest", "shard"])
def test_local_fsspec_fifo_never_blocks_a_load(tmp_path, target):
    url, store, data = _local_tree(tmp_path)
    path = {"latest": Path(store.latest_key), "commit": Path(store.commit_key(2)), "manifest": data / MANIFEST_NAME,
            "shard": data / SHARD}[target]
    path.unlink()
    os.mkfifo(path)
    got = bounded(lambda: _load_latest(url, tmp_path / "local"), tmp_path, "load_latest")
    assert got.error is None, got.error
    step, loaded = got.value
    assert step == (2 if target == "latest" else 1) and fingerprint(loaded) == fingerprint(state(step))
    if target != "latest":
        reader = open_storage(url, str(tmp_path / "local"))
        what = (lambda: reader.read_manifest(2, LIMIT)) if target != "shard" else (
            lambda: reader.read_shard(2, SHARD, reader.read_manifest(2, LIMIT)[0]["shards"][SHARD], "xxh3", True))
        err = bounded(what, tmp_path, "read").error
        assert isinstance(err, CheckpointError) and "FIFO" in str(err) and err.file.endswith(path.name), err


@pytest.mark.parametrize("target", ["shard", "data directory"])
def test_local_fsspec_never_follows_a_link_out_of_its_tree(tmp_path, target):
    url, store, data = _local_tree(tmp_path)
    spec = json.loads((data / MANIFEST_NAME).read_bytes())["shards"][SHARD]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    victim = data / SHARD if target == "shard" else data
    shutil.move(victim, outside / victim.name)  # a faithful copy: following the link would load step 2
    os.symlink(outside / victim.name, victim)
    got = bounded(lambda: _load_latest(url, tmp_path / "local"), tmp_path, "load_latest")
    assert got.error is None, got.error
    step, loaded = got.value
    assert step == 1 and fingerprint(loaded) == fingerprint(state(1))
    reader = open_storage(url, str(tmp_path / "local"))
    err = bounded(lambda: reader.read_shard(2, SHARD, spec, "xxh3", False), tmp_path, "read_shard").error
    assert isinstance(err, CheckpointError) and "symbolic link" in str(err) and err.file == str(victim), err
