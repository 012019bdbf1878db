"""Result files: equal, or the first difference named (tensor, key path, byte offset)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from chaos.judge.compare import first_difference


def _safetensors(path: Path, tensors: dict[str, list[float]]) -> Path:
    header, data = {}, b""
    for name, values in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": [len(values)], "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


def test_safetensors_name_the_first_differing_tensor(tmp_path: Path) -> None:
    a = _safetensors(tmp_path / "a.safetensors", {"layer.0.w": [1.0, 2.0], "layer.1.w": [3.0, 4.0]})
    b = _safetensors(tmp_path / "b.safetensors", {"layer.0.w": [1.0, 2.0], "layer.1.w": [3.0, 4.5]})
    assert first_difference(a, a, None) is None
    assert first_difference(a, b, None) == "layer.1.w: bytes differ"
    assert "layer.1.w[1]" in first_difference(a, b, 1e-3)
    assert first_difference(a, b, 0.5) is None  # tolerance mode: within rtol


def test_json_names_the_key_path(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"step": 12, "weights": [0.5, 1.0]}))
    b.write_text(json.dumps({"step": 12, "weights": [0.5, 1.25]}))
    assert first_difference(a, b, None) == "weights[1]: 1.25, fault-free run 1.0"


def test_other_files_name_the_first_differing_byte(tmp_path: Path) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"abcdef")
    b.write_bytes(b"abcXef")
    assert first_difference(a, b, None) == "bytes differ from offset 3 (sizes 6 and 6)"


def test_torch_files_are_compared_tensor_by_tensor(tmp_path: Path) -> None:
    import torch

    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"model": {"w": torch.ones(3), "b": torch.zeros(1)}, "step": 4}, a)
    torch.save({"model": {"w": torch.ones(3), "b": torch.full((1,), 0.5)}, "step": 4}, b)
    assert first_difference(a, b, None) == "model.b: values differ"
