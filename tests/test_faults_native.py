"""torch.save and safetensors save_file, seen by the interposer as ordinary traced writes."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from faults.interposer import Interposer, IORule, read_trace

REPO = pathlib.Path(__file__).resolve().parents[1]


def ops(records: list[dict], path: str | None = None) -> list[dict]:
    return [r for r in records if r["event"] == "op" and (path is None or r.get("path") == path)]


def rebuilt(records: list[dict], path: str) -> bytes:
    """The file as the trace says it reached the kernel: each write's bytes at its offset."""
    buf = bytearray()
    for r in ops(records, path):
        if r["op"] == "write":
            end = r["offset"] + len(r["data"])
            buf.extend(bytes(max(0, end - len(buf))))
            buf[r["offset"]:end] = r["data"]
        elif r["op"] == "open" and r.get("trunc"):
            del buf[:]
    return bytes(buf)


def parsed(blob: bytes) -> tuple[dict, bytes]:
    """A safetensors file as (header, tensor bytes)."""
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    r = tmp_path / "root"
    r.mkdir()
    (tmp_path / "tmp").mkdir()
    return r


def installed(root: pathlib.Path, tmp_path: pathlib.Path, **kw) -> Interposer:
    return Interposer(root, trace_path=tmp_path / "t.jsonl", extra_roots=[tmp_path / "tmp"], **kw)


def test_torch_save_to_a_path_is_a_traced_open_write_close(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    obj = {"w": torch.arange(5000, dtype=torch.float32), "step": 3, "nested": [torch.ones(2), "x"]}
    outside = tmp_path / "outside.pt"
    with installed(root, tmp_path):
        assert torch.save(obj, root / "a.pt") is None  # a Path, through torch.save
        torch.serialization.save(obj, str(root / "b.pt"), pickle_protocol=2)  # a str, the other name, keywords
        torch.save(obj, root / "legacy.pt", _use_new_zipfile_serialization=False)
        torch.save(obj, outside)  # outside the root and its extra roots: the native writer, untraced
    recs = read_trace(tmp_path / "t.jsonl", with_data=True)
    real = os.path.realpath(root)
    for name in ("a.pt", "b.pt", "legacy.pt"):
        path = f"{real}/{name}"
        seq = ops(recs, path)
        assert [r["op"] for r in seq][0] == "open" and seq[-1]["op"] == "close"
        assert {r["op"] for r in seq[1:-1]} == {"write"}, seq
        assert seq[0]["via"] == "torch.save" and seq[0]["created"] and seq[0]["trunc"]
        assert rebuilt(recs, path) == (root / name).read_bytes()  # the trace holds every byte
        loaded = torch.load(root / name, weights_only=True)
        assert torch.equal(loaded["w"], obj["w"]) and loaded["step"] == 3 and loaded["nested"][1] == "x"
    assert not [r for r in ops(recs) if "outside" in (r.get("path") or "")]
    assert torch.equal(torch.load(outside, weights_only=True)["w"], obj["w"])


def test_a_file_object_target_stays_the_callers_own_traced_file(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with installed(root, tmp_path) as ix:
        with open(root / "f.pt", "wb") as f:
            torch.save({"x": torch.zeros(3)}, f)
        with open(root / "legacy.pt", "wb") as f:  # the legacy format's tensor data goes through write() too
            torch.save({"x": torch.arange(999)}, f, _use_new_zipfile_serialization=False)
    opens = [r for r in ops(ix.records) if r["op"] == "open"]
    assert [r["via"] for r in opens] == ["io.open", "io.open"]  # not wrapped a second time
    recs = read_trace(tmp_path / "t.jsonl", with_data=True)
    for name in ("f.pt", "legacy.pt"):
        assert rebuilt(recs, f"{os.path.realpath(root)}/{name}") == (root / name).read_bytes()
    assert torch.load(root / "legacy.pt", weights_only=True)["x"].tolist() == list(range(999))


@pytest.mark.parametrize("module", [safetensors.torch, safetensors.numpy])
def test_safetensors_save_file_is_traced_with_its_metadata(root: pathlib.Path, tmp_path: pathlib.Path,
                                                           module) -> None:
    if module is safetensors.torch:
        tensors = {"a": torch.arange(300, dtype=torch.float32), "b": torch.ones(2, 3, dtype=torch.int64)}
    else:
        tensors = {"a": np.arange(300, dtype=np.float32), "b": np.ones((2, 3), dtype=np.int64)}
    meta = {"step": "7", "format": "pt"}
    with installed(root, tmp_path):
        assert module.save_file(tensors, root / "m.safetensors", metadata=meta) is None
        module.save_file(tensor_dict := tensors, filename=str(root / "kw.safetensors"))  # keywords work
    recs = read_trace(tmp_path / "t.jsonl", with_data=True)
    path = f"{os.path.realpath(root)}/m.safetensors"
    seq = ops(recs, path)
    assert [r["op"] for r in seq] == ["open", "write", "close"] and seq[0]["via"] == "safetensors.save_file"
    data = (root / "m.safetensors").read_bytes()
    assert rebuilt(recs, path) == data
    # What the native writer makes (its header's metadata order varies from call to call).
    assert parsed(data) == parsed(module.save(tensors, metadata=meta))
    with safetensors.safe_open(str(root / "m.safetensors"), framework="np") as f:
        assert f.metadata() == meta and (f.get_tensor("a") == np.arange(300, dtype=np.float32)).all()
    assert parsed((root / "kw.safetensors").read_bytes()) == parsed(module.save(tensor_dict))


def test_uninstall_restores_the_native_writers(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    originals = (torch.save, torch.serialization.save, safetensors.torch.save_file, safetensors.numpy.save_file)
    finders = list(sys.meta_path)
    ix = installed(root, tmp_path).install()
    assert torch.save is torch.serialization.save is not originals[0]
    assert safetensors.torch.save_file is not originals[2] and safetensors.numpy.save_file is not originals[3]
    ix.uninstall()
    assert (torch.save, torch.serialization.save, safetensors.torch.save_file,
            safetensors.numpy.save_file) == originals
    assert sys.meta_path == finders
    n = len(ix.records)
    torch.save({"x": 1}, root / "after.pt")
    assert len(ix.records) == n


def test_injected_errors_surface_as_the_native_writers_own(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    rules = [IORule("enospc", byte=100, path_glob="*.pt"), IORule("eio", op="open", path_glob="*.safetensors")]
    with installed(root, tmp_path, rules=rules) as ix:
        with pytest.raises(RuntimeError):
            torch.save({"w": torch.zeros(1000)}, root / "full.pt")
        with pytest.raises(safetensors.SafetensorError) as e:
            safetensors.torch.save_file({"w": torch.zeros(10)}, root / "x.safetensors")
        assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.EIO
        with pytest.raises(RuntimeError, match="Parent directory"):  # a real failure: torch's own message
            torch.save({"w": 1}, root / "no" / "such.pt")
    assert [(f["action"], f["op"]) for f in ix.fired] == [("enospc", "write"), ("eio", "open")]
    hit = ix.fired[0]
    assert hit["offset"] + hit["written"] == 100  # the bytes before the rule's byte reached the file first
    recs = read_trace(tmp_path / "t.jsonl", with_data=True)
    assert rebuilt(recs, f"{os.path.realpath(root)}/full.pt") == (root / "full.pt").read_bytes()
    assert not (root / "x.safetensors").exists()


def test_a_temp_file_written_by_torch_save_and_moved_in_is_traced(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    tmp = tmp_path / "tmp" / "ckpt.pt.tmp"
    with installed(root, tmp_path) as ix:
        torch.save({"w": torch.ones(4)}, tmp)
        os.replace(tmp, root / "ckpt.pt")
    seq = [(r["op"], r.get("via")) for r in ops(ix.records)]
    assert seq[0] == ("open", "torch.save") and seq[-1] == ("rename", "replace")
    assert ops(ix.records)[-1]["src"] == str(tmp) and ops(ix.records)[-1]["dst"] == f"{os.path.realpath(root)}/ckpt.pt"


LATE_IMPORT = textwrap.dedent("""
    import json, os, sys
    from faults.interposer import Interposer
    root = sys.argv[1]
    assert "torch" not in sys.modules and "safetensors" not in sys.modules
    ix = Interposer(root, extra_roots=[]).install()
    assert "torch" not in sys.modules, "installing must not import torch"
    import numpy as np
    import safetensors.numpy
    safetensors.numpy.save_file({"a": np.zeros(3, dtype=np.float32)}, os.path.join(root, "n.safetensors"))
    import torch
    from torch import save as bound_at_import
    torch.save({"t": torch.ones(2)}, os.path.join(root, "t.pt"))
    wrapped = [hasattr(f, "_chaos_native") for f in (torch.save, torch.serialization.save, bound_at_import,
                                                     safetensors.numpy.save_file)]
    ix.uninstall()
    restored = [hasattr(f, "_chaos_native") for f in (torch.save, torch.serialization.save,
                                                      safetensors.numpy.save_file)]
    hooks = [type(f).__name__ for f in sys.meta_path if type(f).__module__ == "faults.native"]
    vias = [r["via"] for r in ix.records if r["event"] == "op" and r["op"] == "open"]
    print(json.dumps({"wrapped": wrapped, "restored": restored, "hooks": hooks, "vias": vias,
                      "loader": type(torch.__loader__).__name__}))
""")


def test_modules_imported_after_install_are_patched_when_they_load(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    p = subprocess.run([sys.executable, "-c", LATE_IMPORT, str(root)], capture_output=True, text=True,
                       timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["wrapped"] == [True, True, True, True]  # torch/__init__ bound the wrapper itself
    assert out["restored"] == [False, False, False] and out["hooks"] == []
    assert out["vias"] == ["safetensors.save_file", "torch.save"]
    assert out["loader"] == "SourceFileLoader"  # the module's own loader, not a stand-in
    assert torch.load(root / "t.pt", weights_only=True)["t"].tolist() == [1.0, 1.0]
