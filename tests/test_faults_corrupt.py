"""At-rest corruption changes exactly the bytes its record names, per seed, inside the root."""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import struct

import pytest

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
