"""Result files of a job compared with the fault-free run's, naming the first difference.

Called by the judge after a point's last attempt, for every file under {out} matching
``--result-file``. Equal bytes are equal. Otherwise, by format:

- safetensors (``*.safetensors``): the header is read here (8-byte length + JSON, no
  library needed) and tensors are compared one by one in file order; the first whose
  dtype, shape or bytes differ is named (``model.w: bytes differ``);
- torch files (``*.pt``, ``*.pth``, ``*.bin``, ``*.ckpt`` zip archives): loaded with
  ``torch.load(weights_only=True)`` (torch imported only then) and compared key by key;
- JSON (``*.json``): compared value by value, naming the first differing key path;
- anything else: the first differing byte offset.

In tolerance mode (two fault-free runs differed) numbers and tensors may differ by
``rtol`` (relative); bytes of other files are then not judged.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def first_difference(golden: Path, got: Path, rtol: float | None) -> str | None:
    """None if ``got`` matches ``golden`` (exactly, or within ``rtol`` when given), else why not."""
    a, b = golden.read_bytes(), got.read_bytes()
    if a == b:
        return None
    name = golden.name
    try:
        if name.endswith(".safetensors"):
            return _safetensors(a, b, rtol)
        if name.endswith(TORCH_SUFFIXES) and a[:2] == b"PK":
            return _torch(golden, got, rtol)
        if name.endswith(".json"):
            return _tree("", json.loads(a), json.loads(b), rtol) or "same values, different bytes"
    except (ValueError, KeyError, struct.error, UnicodeDecodeError) as exc:
        return f"could not be read as its format ({type(exc).__name__}: {exc}); bytes differ"
    if rtol is not None:
        return None  # tolerance mode: a non-numeric file cannot be judged bit for bit
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"bytes differ from offset {at} (sizes {len(a)} and {len(b)})"


def _close(x: float, y: float, rtol: float | None) -> bool:
    if rtol is None:
        return x == y or (math.isnan(x) and math.isnan(y))
    return math.isclose(x, y, rel_tol=rtol, abs_tol=rtol * 1e-3)


def _tree(path: str, a: Any, b: Any, rtol: float | None) -> str | None:
    where = path or "(top level)"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where}: keys differ ({sorted(set(a) ^ set(b))[:5]})"
        for k in a:
            d = _tree(f"{path}.{k}" if path else str(k), a[k], b[k], rtol)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: length {len(b)}, fault-free run {len(a)}"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            d = _tree(f"{path}[{i}]", x, y, rtol)
            if d:
                return d
        return None
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return None if _close(float(a), float(b), rtol) else f"{where}: {b!r}, fault-free run {a!r}"
    return None if a == b else f"{where}: {b!r}, fault-free run {a!r}"


_ST_DTYPES = {"F64": "d", "F32": "f", "F16": "e", "I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B",
              "BOOL": "?"}


def _st_header(blob: bytes) -> tuple[dict[str, Any], int]:
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return header, 8 + n


def _st_values(dtype: str, raw: bytes) -> list[float] | None:
    if dtype == "BF16":
        return [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    code = _ST_DTYPES.get(dtype)
    if code is None:
        return None
    return list(struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw))


def _safetensors(a: bytes, b: bytes, rtol: float | None) -> str | None:
    ha, oa = _st_header(a)
    hb, ob = _st_header(b)
    if set(ha) != set(hb):
        return f"tensor names differ: {sorted(set(ha) ^ set(hb))[:5]}"
    for name in sorted(ha, key=lambda k: ha[k]["data_offsets"][0]):
        ta, tb = ha[name], hb[name]
        if ta["dtype"] != tb["dtype"] or ta["shape"] != tb["shape"]:
            return f"{name}: {tb['dtype']}{tb['shape']}, fault-free run {ta['dtype']}{ta['shape']}"
        ra = a[oa + ta["data_offsets"][0]: oa + ta["data_offsets"][1]]
        rb = b[ob + tb["data_offsets"][0]: ob + tb["data_offsets"][1]]
        if ra == rb:
            continue
        va, vb = _st_values(ta["dtype"], ra), _st_values(tb["dtype"], rb)
        if rtol is None or va is None or vb is None:
            return f"{name}: bytes differ"
        for i, (x, y) in enumerate(zip(va, vb, strict=False)):
            if not _close(x, y, rtol):
                return f"{name}[{i}]: {y!r}, fault-free run {x!r} (beyond rtol {rtol:g})"
    return None


def _torch(golden: Path, got: Path, rtol: float | None) -> str | None:
    import torch

    a = torch.load(golden, map_location="cpu", weights_only=True)
    b = torch.load(got, map_location="cpu", weights_only=True)
    return _torch_tree("", a, b, rtol, torch)


def _torch_tree(path: str, a: Any, b: Any, rtol: float | None, torch: Any) -> str | None:
    where = path or "(top level)"
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {b.dtype}{list(b.shape)}, fault-free run {a.dtype}{list(a.shape)}"
        if rtol is None:
            return None if torch.equal(a, b) else f"{where}: values differ"
        ok = torch.allclose(a.double(), b.double(), rtol=rtol, atol=rtol * 1e-3) if a.is_floating_point() \
            else torch.equal(a, b)
        return None if ok else f"{where}: values differ beyond rtol {rtol:g}"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where}: keys differ"
        for k in a:
            d = _torch_tree(f"{path}.{k}" if path else str(k), a[k], b[k], rtol, torch)
            if d:
                return d
        return None
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return f"{where}: length {len(b)}, fault-free run {len(a)}"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            d = _torch_tree(f"{path}[{i}]", x, y, rtol, torch)
            if d:
                return d
        return None
    return _tree(path, a, b, rtol)
