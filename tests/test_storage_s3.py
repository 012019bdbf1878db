"""The S3 backend against the embedded S3 endpoint (moto on 127.0.0.1) and the fault proxy."""

from __future__ import annotations

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

from chaos.certify.harness import fingerprint, make_state  # noqa: E402
from chaos.certify.local_s3 import LocalS3  # noqa: E402
from chaos.reference.checkpoint.engine import ReferenceCheckpointer  # noqa: E402
from chaos.reference.storage import CommitConflict, open_storage, parse_url  # noqa: E402
from faults.tcpproxy import FaultProxy, ProxyRule  # noqa: E402


@pytest.fixture(scope="module")
def s3():
    with LocalS3() as server:
        yield server


def _ckpt(tmp_path, url, **kw):
    d = tmp_path / f"local{len(list(tmp_path.iterdir()))}"
    return ReferenceCheckpointer(str(d), 0, 1, storage=url, metrics=False, **kw)


def test_save_load_retention_multipart(s3, tmp_path):
    url = s3.url(part_size=5 << 20)
    c = _ckpt(tmp_path, url, keep_last=2)
    states = {i: make_state(i, 6 << 20 if i == 3 else 1 << 16) for i in (1, 2, 3)}
    for i, st in states.items():
        c.save(i, st)
    c.close()
    r = _ckpt(tmp_path, url)
    try:
        assert r.store.list_steps() == [3, 2] and r.store.read_latest() == 3
        step, got = r.load_latest(states[3])
        assert step == 3 and fingerprint(got) == fingerprint(states[3])
    finally:
        r.close()
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=parse_url(url).prefix)["Contents"]]
    assert not any("step-0000000001" in k for k in keys), "retention removed step 1's commit and data"


def test_commit_is_exclusive_and_a_loser_is_told(s3, tmp_path):
    url = s3.url()
    a, b = open_storage(url, str(tmp_path)), open_storage(url, str(tmp_path))
    for st, nonce in ((a, "aaaa"), (b, "bbbb")):
        with st.create_shard(f".tmp-step-0000000005-{nonce}", "x") as f:
            f.write(b"data")
            st.durable(f)
    a.publish(".tmp-step-0000000005-aaaa", 5, b"{}")
    with pytest.raises(CommitConflict, match="another writer committed step 5"):
        b.publish(".tmp-step-0000000005-bbbb", 5, b"{}")


def test_clean_stale_aborts_orphan_uploads_and_unreferenced_data(s3, tmp_path):
    url = s3.url(part_size=5 << 20)
    st = open_storage(url, str(tmp_path))
    w = st.create_shard(".tmp-step-0000000007-abcd", "shard")
    w.write(b"x" * (6 << 20))  # one part uploaded, never completed: an orphan multipart upload
    cl = s3.client()
    assert cl.list_multipart_uploads(Bucket=s3.bucket, Prefix=st.prefix).get("Uploads")
    removed = st.clean_stale()
    assert any(r.startswith("multipart:") for r in removed)
    assert not cl.list_multipart_uploads(Bucket=s3.bucket, Prefix=st.prefix).get("Uploads")


def test_reset_mid_upload_fails_the_save_and_commits_nothing(s3, tmp_path):
    host, port = s3.endpoint.rsplit(":", 1)
    with FaultProxy((host.split("//")[1], int(port)), seed=1) as proxy:
        url = s3.url(endpoint=proxy.endpoint, part_size=5 << 20, retries=1, read_timeout=3)
        c = _ckpt(tmp_path, url)
        try:
            c.save(1, make_state(1, 1 << 16))
            proxy.set_rules([ProxyRule("reset", after_bytes=2 << 20, once=False)])
            with pytest.raises(Exception, match="save of step 2"):
                c.save(2, make_state(2, 6 << 20))
            proxy.set_rules([])
            assert c.store.list_steps() == [1] and c.store.read_latest() == 1
            assert any(e["action"] == "reset" for e in proxy.log)
        finally:
            c.close()


def test_proxy_latency_bandwidth_slice_still_deliver(s3, tmp_path):
    host, port = s3.endpoint.rsplit(":", 1)
    with FaultProxy((host.split("//")[1], int(port)), seed=2) as proxy:
        proxy.set_rules([ProxyRule("latency", delay_s=0.001, once=False), ProxyRule("slice", slice_bytes=777, once=False),
                         ProxyRule("bandwidth", bytes_per_s=50e6, once=False)])
        c = _ckpt(tmp_path, s3.url(endpoint=proxy.endpoint))
        try:
            st = make_state(1, 1 << 18)
            c.save(1, st)
            step, got = c.load_latest(st)
            assert step == 1 and fingerprint(got) == fingerprint(st)
        finally:
            c.close()


def test_replication_file_to_s3_verified_there(s3, tmp_path):
    replica = s3.url()
    c = ReferenceCheckpointer(str(tmp_path / "primary"), 0, 1, metrics=False, replicate_to=replica,
                              replicate="milestones", milestones="every-2")
    states = {i: make_state(i, 1 << 16) for i in (1, 2, 3, 4)}
    for i, st in states.items():
        c.save(i, st)
    c.close()
    done = [e for e in c.events if e["kind"] == "replicated"]
    assert [e["step"] for e in done] == [2, 4] and all(e["verified_shards"] == 1 for e in done)
    r = _ckpt(tmp_path, replica)
    try:
        assert r.store.list_steps() == [4, 2]
        step, got = r.load_latest(states[4])
        assert step == 4 and fingerprint(got) == fingerprint(states[4])
    finally:
        r.close()


def test_replication_s3_to_file(s3, tmp_path):
    dst = tmp_path / "offsite"
    c = _ckpt(tmp_path, s3.url(), replicate_to=f"file://{dst}")
    st = make_state(5, 1 << 16)
    c.save(5, st)
    c.close()
    assert [e["step"] for e in c.events if e["kind"] == "replicated"] == [5]
    r = ReferenceCheckpointer(str(dst), 0, 1, metrics=False)
    try:
        step, got = r.load_latest(st)
        assert step == 5 and fingerprint(got) == fingerprint(st)
    finally:
        r.close()


def test_no_temp_dir_outlives_an_s3_store_that_is_never_closed(s3, tmp_path, monkeypatch):
    """Hole 8: opening the backend creates nothing (no chaos-s3-* dir to leak); downloads are temporary."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    url = s3.url()
    c = _ckpt(tmp_path, url)
    c.save(1, make_state(1, 1 << 16))
    c.close()
    reader = open_storage(url)  # never closed
    m, _ = reader.read_manifest(1, 1 << 20)
    for name, spec in m["shards"].items():
        assert reader.read_shard(1, name, spec, m["hash"], True).path.startswith("s3://")
    assert list(tmp.iterdir()) == []
