"""Manifest validation on a fake file system (pyfakefs): a malformed ``manifest.json`` is
a :class:`ManifestError` that names the file and the problem, never a traceback.

The manifest is a real one: written once by the reference checkpointer on real disk, then
copied (and spoiled, one way per case) into the in-memory tree, where the public readers
``manifest.read_manifest`` and ``PosixStorage.read_manifest`` take it apart.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from chaos.reference.checkpoint import ReferenceCheckpointer
from chaos.reference.ckptformat import manifest
from chaos.reference.ckptformat.commit import step_dirname
from chaos.reference.ckptformat.errors import ManifestError
from chaos.reference.storage.posix import PosixStorage

ROOT = "/ckpt"
STEP = 5
DIR = f"{ROOT}/{step_dirname(STEP)}"
PATH = f"{DIR}/manifest.json"


@pytest.fixture(scope="module")
def real_manifest(tmp_path_factory) -> bytes:
    root = tmp_path_factory.mktemp("real-manifest")
    c = ReferenceCheckpointer(str(root), 0, 1)
    c.save(STEP, {"model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.zeros(3)},
                  "optimizer": {"state": {}, "param_groups": []}, "step": STEP})
    c.close()
    data = (root / step_dirname(STEP) / "manifest.json").read_bytes()
    shutil.rmtree(root)
    return data


def _put(fs, data: bytes, directory: str = DIR) -> str:
    fs.create_file(f"{directory}/manifest.json", contents=data)
    return f"{directory}/manifest.json"


def test_the_real_manifest_reads_back(fs, real_manifest):
    _put(fs, real_manifest)
    m, path = PosixStorage(ROOT).read_manifest(STEP, 1 << 20)
    assert path == PATH and m["step"] == STEP and m["world_size"] == 1
    assert set(m["entries"]) == {"model/w", "model/b"}
    assert m == json.loads(real_manifest)


def _edit(fn):
    def spoil(data: bytes) -> bytes:
        m = json.loads(data)
        fn(m)
        return manifest.encode_manifest(m)
    return spoil


def _first_entry(m):
    return m["entries"][sorted(m["entries"])[0]]


def _first_shard_name(m):
    return sorted(m["shards"])[0]


def _rename_shard(m, new):
    old = _first_shard_name(m)
    m["shards"][new] = m["shards"].pop(old)
    for e in m["entries"].values():
        e["shard"] = new


SPOILED = [
    ("truncated", lambda d: d[: len(d) // 2], "truncated or malformed JSON"),
    ("empty", lambda d: b"", "truncated or malformed JSON"),
    ("not utf-8", lambda d: b"\xff\xfe" + d, "not UTF-8"),
    ("not an object", lambda d: b"[1, 2]", "not a JSON object"),
    ("duplicate key", lambda d: d[:-1] + b',"step":6}', "duplicate JSON key 'step'"),
    ("NaN", lambda d: d[:-1] + b',"x":NaN}', "non-finite JSON number NaN"),
    ("huge int", lambda d: d[:-1] + b',"x":' + b"9" * 50 + b"}", "50 digits"),
    ("other format", _edit(lambda m: m.update(format="dcp")), "not a chaos-ckpt manifest"),
    ("future version", _edit(lambda m: m.update(format_version=99)), "unsupported format version 99"),
    ("step as string", _edit(lambda m: m.update(step="5")), "field 'step' has the wrong type"),
    ("bool world", _edit(lambda m: m.update(world_size=True)), "field 'world_size' has the wrong type"),
    ("no entries", _edit(lambda m: m.pop("entries")), "lacks 'entries'"),
    ("traversal", _edit(lambda m: _rename_shard(m, "../../etc/passwd")), "path traversal"),
    ("absolute", _edit(lambda m: _rename_shard(m, "/etc/passwd")), "absolute path"),
    ("manifest as shard", _edit(lambda m: _rename_shard(m, "manifest.json")), "not an allowed file name"),
    ("rank outside world", _edit(lambda m: m["shards"][_first_shard_name(m)].update(rank=3)), "outside world size 1"),
    ("range outside shard", _edit(lambda m: _first_entry(m).update(offsets=[0, 10**9])), "lies outside shard"),
    ("range does not fit dtype", _edit(lambda m: _first_entry(m).update(dtype="float64")), "needs"),
    ("unknown dtype", _edit(lambda m: _first_entry(m).update(dtype="float128")), "unknown dtype"),
    ("undefined entry", _edit(lambda m: m["entries"].pop(sorted(m["entries"])[0])), "undefined entr"),
    ("malformed tree", _edit(lambda m: m.update(tree={"t": "dict", "items": 7})), "tree"),
]


@pytest.mark.parametrize("case, spoil, words", SPOILED, ids=[c[0] for c in SPOILED])
def test_a_spoiled_manifest_is_a_typed_error_naming_the_file(fs, real_manifest, case, spoil, words):
    _put(fs, spoil(real_manifest))
    with pytest.raises(ManifestError) as exc:
        PosixStorage(ROOT).read_manifest(STEP, 1 << 20)
    assert exc.value.file == PATH and str(exc.value).startswith(PATH + ": ")
    assert words in exc.value.problem, exc.value.problem


def test_a_manifest_in_another_steps_directory_is_refused(fs, real_manifest):
    other = f"{ROOT}/{step_dirname(STEP + 1)}"
    path = _put(fs, real_manifest, other)
    with pytest.raises(ManifestError, match=f"says step {STEP} but its directory is for step {STEP + 1}") as exc:
        manifest.read_manifest(other, expect_step=STEP + 1)
    assert exc.value.file == path


def test_missing_directory_and_oversized_manifests_name_the_file(fs, real_manifest):
    fs.create_dir(DIR)
    with pytest.raises(ManifestError, match="missing") as exc:
        manifest.read_manifest(DIR, STEP)
    assert exc.value.file == PATH
    fs.create_dir(PATH)
    with pytest.raises(ManifestError, match="is a directory"):
        manifest.read_manifest(DIR, STEP)
    fs.remove_object(PATH)
    _put(fs, real_manifest)
    with pytest.raises(ManifestError, match=f"exceeds the {len(real_manifest) - 1}-byte limit") as exc:
        manifest.read_manifest(DIR, STEP, max_bytes=len(real_manifest) - 1)
    assert exc.value.file == PATH
    assert manifest.read_manifest(DIR, STEP, max_bytes=len(real_manifest))["step"] == STEP
