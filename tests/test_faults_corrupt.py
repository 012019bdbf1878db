"""At-rest corruption changes exactly the bytes its record names, per seed, inside the root."""

from __future__ import annotations

import hashlib
import json
import pathlib
import random
import shutil
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults import OutsideScratchRoot
from faults import corrupt as C


def safetensors_like(n_data: int = 256) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n_data // 4],
                               "data_offsets": [0, n_data]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(range(256)) * (n_data // 256)


@pytest.fixture
def ckpt(tmp_path: pathlib.Path) -> pathlib.Path:
    d = tmp_path / "scratch" / "step-20"
    d.mkdir(parents=True)
    (d / "rank0.safetensors").write_bytes(safetensors_like())
    (d / "rank1.safetensors").write_bytes(safetensors_like()[::-1])
    (d / "manifest.json").write_bytes(b'{"step": 20}')
    return d


def bits_differ(a: bytes, b: bytes) -> int:
    return sum(bin(x ^ y).count("1") for x, y in zip(a, b, strict=True))


def test_truncate_size_and_fraction(ckpt: pathlib.Path) -> None:
    f = ckpt / "rank0.safetensors"
    orig = f.read_bytes()
    rec = C.truncate(f, size=100, scratch_root=ckpt.parent)
    assert f.read_bytes() == orig[:100] and rec.ranges == [[100, len(orig)]]
    assert rec.size_before == len(orig) and rec.size_after == 100 and rec.changed
    assert rec.changes[0]["old_sha256"] == hashlib.sha256(orig[100:]).hexdigest()
    rec = C.truncate(f, fraction=0.25, scratch_root=ckpt.parent)
    assert f.stat().st_size == 25 and rec.params["size"] == 25
    rec = C.truncate(f, size=0, scratch_root=ckpt.parent)
    assert f.read_bytes() == b"" and rec.changes[0]["old"] == orig[:25].hex()


def test_bitflip_exact_bits_deterministic_and_in_region(ckpt: pathlib.Path, tmp_path: pathlib.Path) -> None:
    f = ckpt / "rank0.safetensors"
    orig = f.read_bytes()
    hdr = C.header_length(orig)
    assert hdr == 8 + struct.unpack("<Q", orig[:8])[0]
    rec = C.flip_bits(f, n=5, seed=11, region="data", scratch_root=ckpt.parent)
    new = f.read_bytes()
    assert bits_differ(orig, new) == 5 and rec.changed
    assert all(hdr <= s < len(orig) for s, _e in rec.ranges)
    for ch in rec.changes:  # old/new bytes in the record are the real ones
        assert bytes.fromhex(ch["old"]) == orig[ch["start"]:ch["end"]]
        assert bytes.fromhex(ch["new"]) == new[ch["start"]:ch["end"]]
    assert C.choose_bits(orig, n=5, seed=11, region="data") == rec.params["bits"]
    assert C.choose_bits(orig, n=5, seed=12, region="data") != rec.params["bits"]
    hb = C.choose_bits(orig, n=3, seed=1, region="header")
    assert all(off < hdr for off, _b in hb)


def test_zero_delete_stale_swap(ckpt: pathlib.Path, tmp_path: pathlib.Path) -> None:
    root = ckpt.parent
    f0, f1, m = ckpt / "rank0.safetensors", ckpt / "rank1.safetensors", ckpt / "manifest.json"
    o0, o1 = f0.read_bytes(), f1.read_bytes()
    rec = C.zero_range(f0, 200, 210, scratch_root=root)
    assert f0.read_bytes() == o0[:200] + bytes(10) + o0[210:]
    assert rec.changes[0] == {"start": 200, "end": 210, "old": o0[200:210].hex(), "new": "00" * 10}
    again = C.zero_range(f0, 200, 210, scratch_root=root)
    assert not again.changed  # zeroing zeros changes nothing, and says so
    older = root / "step-10"
    older.mkdir()
    (older / "manifest.json").write_bytes(b'{"step": 10}')
    rec = C.stale_copy(m, older / "manifest.json", scratch_root=root)
    assert m.read_bytes() == b'{"step": 10}' and rec.changes[0]["old"] == b'{"step": 20}'.hex()
    rec = C.swap(f0, f1, scratch_root=root)
    assert f1.read_bytes() == o0[:200] + bytes(10) + o0[210:] and f0.read_bytes() == o1
    assert rec.other["path"] == str(f1.resolve()) and rec.changed
    rec = C.delete(m, scratch_root=root)
    assert not m.exists() and rec.size_after is None and rec.sha256_before == hashlib.sha256(
        b'{"step": 10}').hexdigest()
    json.dumps(rec.to_dict())


def test_refuses_paths_outside_scratch_root(ckpt: pathlib.Path, tmp_path: pathlib.Path) -> None:
    outside = tmp_path / "precious"
    outside.write_bytes(b"keep me")
    sneaky = ckpt / "link"
    sneaky.symlink_to(outside)  # inside by name, outside by realpath
    for fn in (lambda p: C.truncate(p, size=0, scratch_root=ckpt.parent),
               lambda p: C.flip_bits(p, n=1, scratch_root=ckpt.parent),
               lambda p: C.delete(p, scratch_root=ckpt.parent),
               lambda p: C.zero_range(p, 0, 3, scratch_root=ckpt.parent)):
        for target in (outside, sneaky):
            with pytest.raises(OutsideScratchRoot):
                fn(target)
    with pytest.raises(OutsideScratchRoot):
        C.stale_copy(ckpt / "manifest.json", outside, scratch_root=ckpt.parent)
    with pytest.raises(OutsideScratchRoot):
        C.plan_corruption(tmp_path, "delete", 1, scratch_root=ckpt.parent)
    assert outside.read_bytes() == b"keep me"


@pytest.mark.parametrize("kind", ["truncate", "bitflip", "zero", "delete", "swap", "stale"])
def test_plan_is_deterministic_and_apply_replays(ckpt: pathlib.Path, kind: str) -> None:
    root = ckpt.parent
    older = root / "step-10"
    shutil.copytree(ckpt, older)
    (older / "manifest.json").write_bytes(b'{"step": 10}')
    (older / "rank0.safetensors").write_bytes(safetensors_like(512))
    (older / "rank1.safetensors").write_bytes(safetensors_like(512)[::-1])
    kw = dict(scratch_root=root, older_dir=older, region="data", n_bits=3)
    p1 = C.plan_corruption(ckpt, kind, 42, **kw)
    assert p1 == C.plan_corruption(ckpt, kind, 42, **kw)
    plans = {json.dumps(C.plan_corruption(ckpt, kind, s, **kw).to_dict()) for s in range(12)}
    if kind != "delete":
        assert len(plans) > 1  # the seed matters
    copy = root / "copy"
    shutil.copytree(ckpt, copy)
    rec = C.apply(p1)
    assert rec.seed == 42 and rec.kind == kind and rec.changed
    # replaying the same plan (from its JSON) on an identical copy gives the same result
    p2 = C.CorruptionPlan.from_dict(json.loads(json.dumps(p1.to_dict())))
    p2.path = str(copy / pathlib.Path(p1.path).name)
    for key in ("other",):
        if key in p2.params:
            p2.params[key] = str(copy / pathlib.Path(p2.params[key]).name)
    rec2 = C.apply(p2)
    assert rec2.sha256_after == rec.sha256_after and rec2.ranges == rec.ranges


# ---------------------------------------------------------------- corruption everywhere a byte can be
def big_safetensors(n_data: int = 1 << 20) -> bytes:
    return safetensors_like(n_data)


def test_default_region_draws_over_the_whole_file(tmp_path: pathlib.Path) -> None:
    """Seeded draws (region=any, the default) land in every tenth of a 1 MiB file, deep data included."""
    d = tmp_path / "scratch" / "step-1"
    d.mkdir(parents=True)
    f = d / "rank0.safetensors"
    f.write_bytes(big_safetensors())
    size = f.stat().st_size
    offsets = [C.plan_corruption(d, "bitflip", s, scratch_root=d.parent).params["bits"][0][0] for s in range(200)]
    assert all(0 <= o < size for o in offsets)
    assert {o * 10 // size for o in offsets} == set(range(10))
    zeros = [C.plan_corruption(d, "zero", s, scratch_root=d.parent, zero_len=4096).params["start"] for s in range(200)]
    assert {z * 10 // size for z in zeros} == set(range(10))
    assert max(zeros) + 4096 <= size


@given(size=st.integers(1, 1 << 16), at=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1),
       n=st.integers(1, 8))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_placed_flip_changes_exactly_the_byte_asked_for(tmp_path: pathlib.Path, size: int, at: float, seed: int,
                                                        n: int) -> None:
    root = tmp_path / f"s{size}-{seed}"
    root.mkdir(exist_ok=True)
    f = root / "blob.bin"
    data = bytes(random.Random(seed).randbytes(size))
    f.write_bytes(data)
    want = min(int(at * size), size - 1)
    assert C.placed_offset(size, at=at) == want
    plan = C.plan_corruption(root, "bitflip", seed, scratch_root=root, at=at, n_bits=1)
    rec = C.apply(plan)
    after = f.read_bytes()
    assert [i for i in range(size) if after[i] != data[i]] == [want] == [c["start"] for c in rec.changes]
    assert bits_differ(data, after) == 1
    plan = C.plan_corruption(root, "bitflip", seed, scratch_root=root, offset=want, n_bits=n)
    assert all(want <= o < want + 1 + n // 8 for o, _b in plan.params["bits"])
    assert plan.params["placed"]["byte"] == want


def test_placed_zero_and_offsets_past_the_end(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / "a.bin").write_bytes(b"\xff" * 1000)
    plan = C.plan_corruption(root, "zero", 0, scratch_root=root, at=0.9, zero_len=500)
    assert (plan.params["start"], plan.params["end"]) == (900, 1000)
    from faults import FaultError

    with pytest.raises(FaultError, match="byte 5000"):
        C.plan_corruption(root, "bitflip", 0, scratch_root=root, offset=5000)
    from chaos.errors import ConfigError

    with pytest.raises(ConfigError):
        C.placed_offset(10, offset=1, at=0.5)


# ---------------------------------------------------------------- a fault that did nothing says so
def _env(tmp_path: pathlib.Path, storage: str | None = None):
    from chaos.nemesis.environment import Environment

    scratch = tmp_path / "chaos-x"
    (scratch / "logs").mkdir(parents=True, exist_ok=True)
    return Environment([], 2, str(scratch / "ckpt"), str(scratch / "logs"), 4, storage=storage), scratch


def _fault(spec: str):
    from chaos.plan.scenario import parse_fault

    return parse_fault(spec)


def _tree(ckpt: pathlib.Path) -> None:
    for step in (12, 16):
        d = ckpt / f"step-{step}"
        d.mkdir(parents=True)
        (d / "rank0.safetensors").write_bytes(safetensors_like(1024) + bytes([step]))
        (d / "rank1.safetensors").write_bytes(safetensors_like(1024)[::-1] + bytes([step]))
        (d / "manifest.json").write_bytes(b'{"step": %d}' % step)
        (d / "pad.bin").write_bytes(bytes(128))


def test_corruption_that_matches_no_file_or_changes_no_byte_is_idle(tmp_path: pathlib.Path) -> None:
    from chaos.nemesis.environment import idle_faults

    env, scratch = _env(tmp_path)
    _tree(scratch / "ckpt")
    none = env.corrupt(_fault("bitflip:step=3,file=*.distcp"), [])
    assert none["changed"] is False and none["idle"] == "no target" and "file='*.distcp'" in none["reason"]
    zero = env.corrupt(_fault("zero:step=3,file=pad.bin,length=64"), [])
    assert zero["changed"] is False and zero["idle"] == "same bytes" and "already zero" in zero["reason"]
    same = env.corrupt(_fault("truncate:step=3,file=manifest.json,fraction=1.0"), [])
    assert same["changed"] is False and same["idle"] == "same bytes" and "cut nothing" in same["reason"]
    real = env.corrupt(_fault("bitflip:step=3,file=rank0.safetensors,at=0.75"), [])
    assert real["changed"] and real["offsets"] == [c["start"] for c in real["changes"]]
    assert real["offsets"][0] == int(0.75 * real["size_before"])
    fired = [{"spec": "zero:step=3", "detail": {"corruption": {"kind": "zero", **zero}}}]
    assert "did nothing (same bytes)" in idle_faults(fired) and "already zero" in idle_faults(fired)
    assert idle_faults([{"spec": "bitflip:step=3", "detail": {"corruption": real}}]) is None
    assert idle_faults([{"spec": "kill:rank=0,step=3", "detail": {}}]) is None


def test_corruption_acts_only_on_the_newest_checkpoint(tmp_path: pathlib.Path) -> None:
    import os
    import time

    env, scratch = _env(tmp_path)
    ckpt = scratch / "ckpt"
    _tree(ckpt)
    t_save = time.time() + 100  # the newest save began after every file of step 12 was written
    for f in (ckpt / "step-16").iterdir():
        os.utime(f, (t_save + 1, t_save + 1))
    logs = []
    for rank in (0, 1):
        log = scratch / "logs" / f"rank{rank}.jsonl"
        log.write_text("\n".join(json.dumps(e) for e in [
            {"ev": "save_call", "step": 16, "t": t_save}, {"ev": "save_return", "step": 16, "t": t_save + 2}]) + "\n")
        logs.append(str(log))
    old_only = env.corrupt(_fault("delete:step=3,file=step-12/*"), logs)
    assert old_only["changed"] is False and "newest checkpoint" in old_only["reason"]
    assert (ckpt / "step-12" / "manifest.json").exists()
    rec = env.corrupt(_fault("delete:step=3,file=manifest.json"), logs)
    assert rec["changed"] and rec["target"] == "step-16/manifest.json"


# ---------------------------------------------------------------- object stores: the objects themselves
@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto")
    from chaos.certify.local_s3 import LocalS3

    with LocalS3() as server:
        yield server


def _s3_checkpoints(s3, prefix: str) -> dict[str, bytes]:
    c = s3.client()
    objects = {}
    for step, nonce in ((12, "aa"), (16, "bb")):
        data = f"{prefix}/data/step-{step:010d}-{nonce}/"
        objects[data + "shard-r00000.safetensors"] = safetensors_like(1024) + bytes([step])
        objects[data + "shard-r00001.safetensors"] = safetensors_like(1024)[::-1] + bytes([step])
        objects[data + "manifest.json"] = b'{"step": %d}' % step
        objects[f"{prefix}/commits/step-{step:010d}.json"] = json.dumps(
            {"format": "chaos-commit", "step": step, "data": data[len(prefix) + 1:]}).encode()
    objects[f"{prefix}/latest"] = b"step-0000000016\n"
    for k, v in objects.items():
        c.put_object(Bucket=s3.bucket, Key=k, Body=v)
    return objects


def _get(s3, key: str) -> bytes | None:
    try:
        return s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    except Exception:  # noqa: BLE001 - NoSuchKey
        return None


def test_s3_corruption_edits_the_newest_committed_objects(tmp_path: pathlib.Path, s3) -> None:
    prefix = "run-corrupt"
    objects = _s3_checkpoints(s3, prefix)
    env, scratch = _env(tmp_path, s3.url(prefix))
    key = f"{prefix}/data/step-0000000016-bb/shard-r00001.safetensors"
    rec = env.corrupt(_fault("bitflip:step=3,file=shard-r00001.safetensors,region=data,bits=3,seed=5"), [])
    assert rec["changed"] and rec["objects_written"] == [key] and rec["step"] == 16
    assert rec["target"] == "data/step-0000000016-bb/shard-r00001.safetensors"
    now = _get(s3, key)
    assert bits_differ(objects[key], now) == 3
    assert sorted(i for i in range(len(now)) if now[i] != objects[key][i]) == sorted(set(rec["offsets"]))
    # the same seeded functions as on files: the same plan on the same bytes flips the same bits
    local = tmp_path / "local" / "data" / "step-0000000016-bb"
    local.mkdir(parents=True)
    (local / "shard-r00001.safetensors").write_bytes(objects[key])
    plan = C.plan_corruption(local, "bitflip", 5, scratch_root=tmp_path / "local", region="data", n_bits=3,
                             pattern="shard-r00001.safetensors")
    assert C.apply(plan).sha256_after == rec["sha256_after"]
    older = f"{prefix}/data/step-0000000012-aa/shard-r00001.safetensors"
    assert _get(s3, older) == objects[older]  # the older checkpoint is untouched
    gone = env.corrupt(_fault("delete:step=3,file=manifest.json"), [])
    assert gone["objects_deleted"] == [f"{prefix}/data/step-0000000016-bb/manifest.json"]
    assert _get(s3, f"{prefix}/data/step-0000000016-bb/manifest.json") is None
    stale = env.corrupt(_fault("stale:step=3,file=shard-r00000.safetensors"), [])
    assert stale["changed"] and _get(s3, f"{prefix}/data/step-0000000016-bb/shard-r00000.safetensors") == \
        objects[f"{prefix}/data/step-0000000012-aa/shard-r00000.safetensors"]
    none = env.corrupt(_fault("bitflip:step=3,file=*.distcp"), [])
    assert none["changed"] is False and none["idle"] == "no target" and "step 16" in none["reason"]
    commit = env.corrupt(_fault("truncate:step=3,file=step-0000000016.json,fraction=0.5"), [])
    assert commit["objects_written"] == [f"{prefix}/commits/step-0000000016.json"]
    again = env.corrupt(_fault("bitflip:step=3,file=*.safetensors"), [])  # a damaged commit names no data
    assert again["changed"] is False and "step 16" in again["reason"]
    assert not list(scratch.glob("s3-rest-*"))  # the mirror is cleaned up


def test_s3_without_a_commit_is_idle(tmp_path: pathlib.Path, s3) -> None:
    env, _ = _env(tmp_path, s3.url("run-empty"))
    rec = env.corrupt(_fault("bitflip:step=3"), [])
    assert rec["changed"] is False and "no committed checkpoint" in rec["reason"]


def test_checksum_detection_names_offsets_and_calls_an_idle_corruption_did_nothing() -> None:
    from chaos.judge.oracles import checksum_detection
    from chaos.record.golden import GoldenRun
    from chaos.record.history import RunRecord

    def rec(corruption):
        fired = [{"spec": "bitflip:step=3", "attempt": 0, "kind": "bitflip", "detail": {"corruption": corruption}}]
        attempts = [{"attempt": 0, "outcome": "rank_failed", "detail": "", "fired": fired},
                    {"attempt": 1, "outcome": "ok", "detail": "", "fired": []}]
        events = {0: {0: [{"ev": "save_return", "rank": 0, "attempt": 0, "t": 0.0, "step": 2}]},
                  1: {0: [{"ev": "resume", "rank": 0, "attempt": 1, "t": 1.0, "step": 0, "fingerprint": None}]}}
        return RunRecord(1, attempts, events, {}, {}, {})

    gold = GoldenRun("k", 1, {0: {}}, {0: []}, {0: {}})
    idle = checksum_detection(gold, rec({"changed": False, "idle": "no target", "reason": "no file matches"}))
    case = idle.evidence["cases"][0]
    assert idle.passed and case["class"] == "did nothing" and case["reason"] == "no file matches"
    deep = checksum_detection(gold, rec({"changed": True, "target": "step-2/r0", "offsets": [9_000_123],
                                         "size_before": 19_000_000, "changes": []}))
    case = deep.evidence["cases"][0]
    assert case["offsets"] == [9_000_123] and case["size"] == 19_000_000


@pytest.mark.parametrize("seed", range(6))
def test_flips_drawn_over_the_whole_file_find_where_a_partial_checksum_ends(tmp_path: pathlib.Path, seed: int) -> None:
    """partial_checksum.py hashes each shard's first 64 KiB: a seeded flip there is detected (the
    older step loads); past it, the newest step loads with the flipped tensor (silent)."""
    import torch

    from chaos.target.protocol import load_checkpointer

    path = pathlib.Path(__file__).with_name("checkpointers") / "partial_checksum.py"
    cls = load_checkpointer(f"{path}:PartialChecksumCheckpointer")
    root = tmp_path / "ckpt"
    states = {s: {"model": {"w": torch.arange(1 << 18, dtype=torch.float32) * s}, "optimizer": {"step": s}}
              for s in (1, 2)}
    c = cls(str(root), 0, 1)
    for s, st_ in states.items():
        c.save(s, st_)
    shard = root / "step-2" / "rank0.pt"
    size = shard.stat().st_size
    placed = {0: {"offset": 100}, 1: {"offset": 65536}}.get(seed, {})  # either side of the head; the rest drawn
    plan = C.plan_corruption(shard.parent, "bitflip", seed, scratch_root=root, pattern="rank0.pt", **placed)
    rec = C.apply(plan)
    (offset,) = [c_["start"] for c_ in rec.changes]
    assert seed < 2 or offset > 65536  # drawn over ~1 MB, the flips land deep in the tensor data
    step, state = cls(str(root), 0, 1).load_latest({})
    if offset < 65536:
        assert step == 1, f"a flip at byte {offset} of {size}, inside the checksummed head, was not detected"
    else:  # the defect the corruption suite catches: past the head, the flipped tensor loads silently
        assert step == 2 and not torch.equal(state["model"]["w"], states[2]["model"]["w"])


def test_a_bitflip_is_never_drawn_on_a_file_it_cannot_change(tmp_path: pathlib.Path) -> None:
    """Default campaign seed 6 drew the 7-byte `latest` pointer for region=data, tested nothing and was
    skipped: only files with a non-empty region are candidates; truncate and delete take any file."""
    from faults.corrupt import corruptible

    (tmp_path / "latest").write_text("step-20")
    shard = tmp_path / "shard.safetensors"
    shard.write_bytes(b"\x00" * 4096)
    files = [str(tmp_path / "latest"), str(shard)]
    assert corruptible(files, "bitflip", region="data") == [str(shard)]
    assert corruptible(files, "zero", offset=100) == [str(shard)]
    assert corruptible(files, "truncate") == files
