"""Format tests: typed tree roundtrip, safetensors compatibility, hostile input.

Every hostile case must end in a typed error that names the file and the problem,
both when read directly and through ``load_latest`` (as a rejection reason).
"""

from __future__ import annotations

import json
import math
import os
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.model.statehash import fingerprint
from chaos.reference.checkpoint import ManifestError, NoValidCheckpointError, ReferenceCheckpointer
from chaos.reference.checkpoint.loader import load_step
from chaos.reference.ckptformat import tree
from chaos.reference.ckptformat.errors import (
    CheckpointConfigError,
    CorruptCheckpointError,
    UnsupportedValueError,
)
from chaos.reference.ckptformat.hashing import digest
from chaos.reference.ckptformat.manifest import encode_manifest, read_manifest, safe_json_loads

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.uint8, torch.bool]

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.binary(max_size=8),
    st.builds(lambda d, n: (torch.arange(n) % 7).to(d), st.sampled_from(DTYPES), st.integers(0, 5)),
)
keys = st.one_of(st.integers(-3, 3), st.text(max_size=4))
states = st.recursive(
    leaves,
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.lists(kids, max_size=3).map(tuple), st.dictionaries(keys, kids, max_size=3)),
    max_leaves=12,
)


def same(a, b) -> bool:
    """Strict equality: container types, key types, leaf types and float bits."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.dtype == torch.bool else a, b.view(torch.uint8) if b.dtype == torch.bool else b)
    if isinstance(a, float):
        return struct.pack(">d", a) == struct.pack(">d", b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(type(k1) is type(k2) for k1, k2 in zip(a, b, strict=True)) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@settings(max_examples=150, deadline=None)
@given(states)
def test_tree_roundtrip_keeps_key_container_and_leaf_types(state):
    node, tensors = tree.encode(state)
    node = json.loads(json.dumps(node))  # must survive plain JSON
    node = tree.resolve(node, lambda p: p)
    out = tree.Decoder("m.json", 0, lambda entry: tensors[entry]).decode(node)
    assert same(out, state)
    # The cheap path walker used by structure checks names tensors exactly as encode does.
    fast = tree.tensor_paths(state)
    assert list(fast) == list(tensors) and all(fast[p] is tensors[p] for p in tensors)


def test_float_bits_survive_exactly():
    nan = struct.unpack(">d", bytes.fromhex("7ff8000000000123"))[0]
    node, _ = tree.encode([nan, -0.0, math.inf, 5e-324])
    out = tree.Decoder("m", 0, lambda e: None).decode(json.loads(json.dumps(node)))
    assert [struct.pack(">d", x).hex() for x in out] == ["7ff8000000000123", "8000000000000000", "7ff0000000000000", "0000000000000001"]


def test_unsupported_values_and_options_are_typed_errors(tmp_path):
    with pytest.raises(UnsupportedValueError, match="optimizer/x"):
        tree.encode({"optimizer": {"x": object()}})
    with pytest.raises(TypeError, match="unknown option"):
        ReferenceCheckpointer(str(tmp_path), 0, 1, keep_lats=2)
    with pytest.raises(CheckpointConfigError, match="hash"):
        ReferenceCheckpointer(str(tmp_path), 0, 1, hash="md5")
    c = ReferenceCheckpointer(str(tmp_path), 0, 1, keep_last="2", async_save="false", throttle_mb_s="none", milestones="every-100")
    assert c.options.keep_last == 2 and not c.options.async_save and c.options.throttle_mb_s is None and 300 in c.options.milestones


def small_state(step: int) -> dict:
    return {
        "model": {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4) + step, "b": torch.ones(4, dtype=torch.bfloat16)},
        "optimizer": {"state": {0: {"step": torch.tensor(float(step))}}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}]},
        "progress": {"step": step},
    }


@pytest.fixture
def saved(tmp_path):
    root = str(tmp_path)
    c = ReferenceCheckpointer(root, 0, 1)
    c.save(1, small_state(1))
    c.save(2, small_state(2))
    return root, os.path.join(root, "step-0000000002")


def test_world1_roundtrip_and_safetensors_library_reads_shards(saved):
    import safetensors.torch

    root, d = saved
    step, state = ReferenceCheckpointer(root, 0, 1).load_latest(small_state(0))
    assert step == 2 and fingerprint(state) == fingerprint(small_state(2))
    lib = safetensors.torch.load_file(os.path.join(d, "shard-r00000.safetensors"))
    assert torch.equal(lib["model/w"], small_state(2)["model"]["w"])
    m = read_manifest(d)
    for key in ("format_version", "step", "world_size", "shards", "entries", "model_fingerprint", "torch_version", "created"):
        assert key in m
    e = m["entries"]["model/w"]
    assert e["dtype"] == "float32" and e["shape"] == [3, 4] and e["checksum"].startswith("xxh3:")


def test_safetensors_serializer_option_writes_the_same_format(tmp_path):
    c = ReferenceCheckpointer(str(tmp_path), 0, 1, serializer="safetensors", hash="sha256")
    c.save(3, small_state(3))
    step, state = c.load_latest(small_state(0))
    assert step == 3 and fingerprint(state) == fingerprint(small_state(3))
    assert read_manifest(str(tmp_path / "step-0000000003"))["hash"] == "sha256"


def _edit_manifest(d: str, edit) -> None:
    path = os.path.join(d, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    edit(m)
    with open(path, "wb") as f:
        f.write(encode_manifest(m))


def _set_shard(name):
    def edit(m):
        old = next(iter(m["shards"]))
        m["shards"][name] = m["shards"].pop(old)
        for e in m["entries"].values():
            e["shard"] = name
    return edit


HOSTILE = {
    "traversal": (_set_shard("../step-0000000001/shard-r00000.safetensors"), "path traversal"),
    "absolute": (_set_shard("/etc/passwd"), "absolute path"),
    "dtype": (lambda m: m["entries"]["model/w"].update(dtype="float99"), "unknown dtype"),
    "shape": (lambda m: m["entries"]["model/w"].update(shape=[4, 4]), "needs 64 bytes"),
    "huge shape": (lambda m: m["entries"]["model/w"].update(shape=[2**61, 2**61]), "needs"),
    "range": (lambda m: m["entries"]["model/w"].update(offsets=[0, 10**15]), "outside shard"),
    "step": (lambda m: m.update(step=7), "directory is for step 2"),
    "undefined entry": (lambda m: m["tree"]["items"][0][1]["items"][0][1].update(entry="nope"), "undefined entr"),
    "deep tree": (lambda m: m.update(tree=_deep(400)), "nesting deeper"),
}


def _deep(n: int) -> dict:
    node: dict = {"t": "none"}
    for _ in range(n):
        node = {"t": "list", "items": [node]}
    return node


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_manifest_is_rejected_with_typed_error(saved, case):
    root, d = saved
    edit, message = HOSTILE[case]
    _edit_manifest(d, edit)
    with pytest.raises(ManifestError, match=message) as info:
        load_step(root, 2, small_state(0), 0, 1, True, 1 << 20)
    assert "manifest.json" in info.value.file
    # Through the engine: logged, rejected, fallback to step 1.
    step, state = ReferenceCheckpointer(root, 0, 1).load_latest(small_state(0))
    assert step == 1 and fingerprint(state) == fingerprint(small_state(1))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b'{"format": "chaos-ckpt", "step": 1, "step": 2}', "duplicate JSON key 'step'"),
        (b'{"format": "chaos-ckpt", "step": ', "truncated or malformed JSON"),
        (b'{"step": 1' + b"0" * 100 + b"}", "out of range"),
        (b'{"step": 1e400}', "overflows"),
        (b'{"step": NaN}', "non-finite"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[" * 100000 + b"]" * 100000, "JSON"),
    ],
)
def test_hostile_json_text(saved, text, message):
    root, d = saved
    with pytest.raises(ManifestError, match=message):
        safe_json_loads(text, "x.json")
    with open(os.path.join(d, "manifest.json"), "wb") as f:
        f.write(text)
    with pytest.raises(ManifestError, match="manifest.json"):
        read_manifest(d)


def test_oversized_manifest_refused_before_reading(saved):
    root, d = saved
    with pytest.raises(ManifestError, match="exceeds"):
        read_manifest(d, max_bytes=100)


def test_absurd_safetensors_header_length(saved):
    root, d = saved
    shard = os.path.join(d, "shard-r00000.safetensors")
    with open(shard, "r+b") as f:
        f.write(struct.pack("<Q", 2**62))
    with open(shard, "rb") as f:
        new_sum = digest("xxh3", f.read())
    _edit_manifest(d, lambda m: m["shards"]["shard-r00000.safetensors"].update(checksum=new_sum))
    with pytest.raises(ManifestError, match="absurd safetensors header length"):
        load_step(root, 2, small_state(0), 0, 1, True, 1 << 20)


def test_truncated_shard_and_missing_manifest(saved):
    root, d = saved
    shard = os.path.join(d, "shard-r00000.safetensors")
    os.truncate(shard, os.path.getsize(shard) - 5)
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        load_step(root, 2, small_state(0), 0, 1, True, 1 << 20)
    os.remove(os.path.join(root, "step-0000000001", "manifest.json"))
    with pytest.raises(NoValidCheckpointError) as info:
        ReferenceCheckpointer(root, 0, 1).load_latest(small_state(0))
    assert [s for s, _ in info.value.rejected] == [2, 1]
    assert "truncated" in info.value.rejected[0][1] and "missing" in info.value.rejected[1][1]


def test_each_step_passed_over_is_announced_with_its_reason(saved):
    """Phase load_rejected: what a harness recovering this tree quotes when an older step loaded."""
    from chaos import phases

    root, d = saved
    os.truncate(os.path.join(d, "shard-r00000.safetensors"), 10)
    seen: list[tuple[str, dict]] = []
    listener = lambda name, info: seen.append((name, info))  # noqa: E731
    phases.subscribe(listener)
    try:
        assert ReferenceCheckpointer(root, 0, 1).load_latest(small_state(0))[0] == 1
    finally:
        phases.unsubscribe(listener)
    rejected = [info for name, info in seen if name == "load_rejected"]
    assert [i["step"] for i in rejected] == [2] and "rank 0:" in rejected[0]["why"]
    assert "shard-r00000.safetensors" in rejected[0]["why"]


def test_template_structure_mismatch_falls_back(saved):
    root, _ = saved
    bad = small_state(0)
    bad["model"]["w"] = torch.zeros(4, 4)
    with pytest.raises(NoValidCheckpointError, match="model structure differs: w"):
        ReferenceCheckpointer(root, 0, 1).load_latest(bad)
    fresh = small_state(0)
    fresh["optimizer"]["state"] = {}  # a fresh optimizer matches any saved state
    assert ReferenceCheckpointer(root, 0, 1).load_latest(fresh)[0] == 2
    other = small_state(0)
    other["optimizer"]["param_groups"][0]["params"] = [0, 1]
    with pytest.raises(NoValidCheckpointError, match="param groups differ"):
        ReferenceCheckpointer(root, 0, 1).load_latest(other)


def test_no_checkpoints_returns_none(tmp_path):
    assert ReferenceCheckpointer(str(tmp_path), 0, 1).load_latest(small_state(0)) is None


def test_per_rank_value_missing_for_a_new_rank_keeps_the_template_value():
    node = {"t": "dict", "items": [[{"t": "str", "v": "rng"}, {"t": "per_rank", "values": [{"t": "int", "v": "0"}, {"t": "int", "v": "1"}]}]]}
    index = tree.template_index({"rng": 42})
    dec = tree.Decoder("m.json", 3, lambda e: None, fallback=lambda p: (p in index, index.get(p)))
    assert dec.decode(node) == {"rng": 42} and dec.kept_from_template == ["rng"]
    assert tree.Decoder("m.json", 1, lambda e: None).decode(node) == {"rng": 1}
    with pytest.raises(ManifestError, match="has none for rank 3"):
        tree.Decoder("m.json", 3, lambda e: None, fallback=lambda p: (False, None)).decode(node)


def test_throttle_paces_writes(monkeypatch):
    from chaos.reference.ckptformat import shard

    clock = [0.0]
    slept: list[float] = []
    monkeypatch.setattr(shard.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(shard.time, "sleep", lambda s: (slept.append(s), clock.__setitem__(0, clock[0] + s)))
    t = shard.Throttle(10.0)  # 10 MB/s
    t.consume(5_000_000)
    t.consume(5_000_000)
    assert slept == [pytest.approx(0.5), pytest.approx(0.5)]
    shard.Throttle(None).consume(10**9)  # unlimited: no sleep
    assert len(slept) == 2


def test_shard_writer_starts_writeback_as_it_goes_and_writes_the_same_bytes(tmp_path, monkeypatch):
    """Early writeback is a hint only: same bytes and checksum as without it, on any file object."""
    import io

    from chaos.reference.ckptformat import shard

    calls: list[tuple[int, int]] = []
    real = shard._load_sync_file_range()
    assert real, "sync_file_range must be available on Linux"
    monkeypatch.setattr(shard._Writeback, "_libc", lambda fd, off, n, flags: (calls.append((off, n)), real(fd, off, n, flags))[1])
    tensors = {f"w{i}": torch.full((3 << 20,), float(i)) for i in range(3)}  # 3 x 12 MB
    with open(tmp_path / "s.safetensors", "wb") as f:
        info = shard.write_shard(f, "s.safetensors", tensors, {"step": "1"}, "xxh3")
    mem = io.BytesIO()  # no file descriptor: writeback is skipped, nothing else changes
    info_mem = shard.write_shard(mem, "s.safetensors", tensors, {"step": "1"}, "xxh3")
    assert (tmp_path / "s.safetensors").read_bytes() == mem.getvalue()
    assert info.checksum == info_mem.checksum and info.size == len(mem.getvalue())
    # Contiguous ranges from the start, each kicked once it reached a chunk.
    assert len(calls) >= 3 and calls[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in zip(calls, calls[1:], strict=False))
    assert sum(n for _, n in calls) > info.size - shard.CHUNK
