"""Payloads planted in a checkpoint's own format: loading must never execute code from it.

A checkpoint is input from disk, and disks are shared: whoever can write a file the
loader reads can try to make the next restart run their code. This module builds, in
the formats checkpointers really read, the files such an attacker would plant, and
plants them as exact, replayable :class:`faults.corrupt.CorruptionRecord` s:

- ``pickle``: a pickle whose unpickling calls ``os.open(marker, O_CREAT)``. In a
  DCP data file (``*.distcp`` beside a ``.metadata``) it replaces every byte item
  (non-tensor values, which DCP reads with ``torch.load``) in place, padded to the
  item's length; anywhere else it replaces the whole file.
- ``torchzip``: the same pickle as ``data.pkl`` of a minimal ``torch.save`` zip
  (``data.pkl``, ``byteorder``, ``version`` — what ``torch.load`` requires), padded
  to an exact length with the zip comment when it fills a DCP byte item.
- ``safetensors-header``: the file's own safetensors header rewritten to lie: a
  header length beyond the file or near 2**64, data offsets beyond the file or near
  2**64, two tensors' offsets overlapping, an entry whose end precedes its start.

The "code" a payload runs is one ``os.open`` of a marker path inside the scenario's
scratch root, chosen by the harness; nothing else. The marker existing afterwards is
the proof that some process executed data from the checkpoint: the environment checks
it after every attempt and the ``no_code_execution`` oracle reads that record.

Worked example: ``payload:step=19,format=pickle,file=.metadata`` against DCP replaces
``step-16/.metadata`` (DCP's commit marker, which ``FileSystemReader.read_metadata``
reads with ``pickle.load``) by a 90-byte pickle; the restart unpickles it and the marker
appears.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import struct
import zipfile
from typing import Any

from faults import FaultError
from faults.corrupt import CorruptionRecord, _change, _check, _read, _record, _write
from faults.errors import ConfigError

FORMATS = ("pickle", "torchzip", "safetensors-header")
HEADER_VARIANTS = ("length-beyond-file", "length-overflow", "offsets-beyond-file", "offsets-overflow",
                   "offsets-overlap", "offsets-reversed")
DCP_METADATA = ".metadata"


class _Touch:
    """Unpickles to ``os.open(path, O_WRONLY | O_CREAT, 0o600)``: the marker, and nothing else."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (os.open, (self.path, os.O_WRONLY | os.O_CREAT, 0o600))


def pickle_payload(marker: str) -> bytes:
    """A pickle (protocol 2) whose loading creates ``marker``."""
    return pickle.dumps(_Touch(os.fspath(marker)), protocol=2)


def torchzip_payload(marker: str, size: int | None = None) -> bytes:
    """A ``torch.save``-format zip whose ``data.pkl`` creates ``marker`` when loaded.

    ``size``: pad to exactly that many bytes (so it fills a DCP byte item): a few bytes
    go in the end-of-central-directory comment, more in a stored ``archive/.pad`` record
    (torch's zip reader looks for the directory's end only near the end of the data);
    a size under ~500 bytes raises FaultError.
    """
    def build(pad: int | None) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("archive/data.pkl", pickle_payload(marker))
            zf.writestr("archive/byteorder", b"little")
            zf.writestr("archive/version", b"3\n")
            if pad is not None:
                zf.writestr("archive/.pad", bytes(pad))
        return buf.getvalue()

    data = build(None)
    if size is None or size == len(data):
        return data
    if size > len(data) + 256:
        padded = build(0)
        data = build(size - len(padded))
    pad = size - len(data)
    if not 0 <= pad <= 256:
        raise FaultError(f"a torch zip payload is {len(data)} bytes; it cannot fill exactly {size}")
    return data[:-2] + struct.pack("<H", pad) + bytes(pad)  # the last 2 bytes: comment length


def padded_pickle(marker: str, size: int) -> bytes:
    """The pickle payload followed by zeros to ``size`` bytes (unpickling stops at STOP)."""
    data = pickle_payload(marker)
    if len(data) > size:
        raise FaultError(f"a pickle payload is {len(data)} bytes; a {size}-byte slot cannot hold it")
    return data + bytes(size - len(data))


def _split_safetensors(data: bytes) -> tuple[dict[str, Any], int]:
    if len(data) < 8:
        raise FaultError(f"not a safetensors file: {len(data)} bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if not 0 < n <= len(data) - 8:
        raise FaultError(f"not a safetensors file: header length {n} for {len(data)} bytes")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as exc:
        raise FaultError(f"not a safetensors file: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise FaultError("not a safetensors file: header is not a JSON object")
    return header, n


def safetensors_header_payload(data: bytes, variant: str) -> bytes:
    """``data`` (a safetensors file) with its header rewritten as ``variant`` says (see module doc).

    The header keeps its JSON length where it can (padded with spaces, as safetensors
    pads), so a loader that checks only the file size is not warned off by it.
    """
    if variant not in HEADER_VARIANTS:
        raise ConfigError(f"unknown safetensors-header variant {variant!r}; expected one of {HEADER_VARIANTS}")
    header, n = _split_safetensors(data)
    body = data[8 + n:]
    if variant == "length-beyond-file":
        return struct.pack("<Q", len(data) + 1) + data[8:]
    if variant == "length-overflow":
        return struct.pack("<Q", 2**64 - 8) + data[8:]
    entries = sorted((k for k in header if k != "__metadata__"),
                     key=lambda k: header[k].get("data_offsets", [0])[0])
    if not entries:
        raise FaultError("the safetensors header lists no tensor to lie about")
    first = header[entries[0]]
    b, e = first["data_offsets"]
    if variant == "offsets-beyond-file":
        first["data_offsets"] = [b, len(body) + 4096]
    elif variant == "offsets-overflow":
        first["data_offsets"] = [2**64 - 4, 2**64 + e - b - 4]
    elif variant == "offsets-reversed":
        first["data_offsets"] = [e, b]
    elif variant == "offsets-overlap":
        if len(entries) < 2:
            raise FaultError("offsets-overlap needs two tensors in the safetensors header")
        second = header[entries[1]]
        sb, se = second["data_offsets"]
        second["data_offsets"] = [b, b + (se - sb)]  # the second tensor reads the first one's bytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob = blob + b" " * (n - len(blob)) if len(blob) <= n else blob
    return struct.pack("<Q", len(blob)) + blob + body


# ---------------------------------------------------------------------- DCP byte items
class _MetadataUnpickler(pickle.Unpickler):
    """Reads DCP's ``.metadata`` without running code: only DCP's own classes, torch
    dtypes/layouts/``Size`` and plain containers may be named by the pickle."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module.startswith("torch.distributed.checkpoint"):
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if name == "Size" or isinstance(value, torch.dtype | torch.layout | torch.memory_format):
                return value
        if (module, name) in (("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
                              ("torch.serialization", "_get_layout"),  # a layout by name, as weights_only allows
                              ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")):  # storage_meta.checkpoint_id
            return super().find_class(module, name)
        raise FaultError(f"DCP metadata names {module}.{name}: refusing to unpickle it")


def dcp_byte_items(path: str) -> list[tuple[str, int, int]]:
    """``(fqn, offset, length)`` of every byte item DCP's ``.metadata`` places in ``path``."""
    meta_path = os.path.join(os.path.dirname(path), DCP_METADATA)
    try:
        with open(meta_path, "rb") as f:
            meta = _MetadataUnpickler(f).load()
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        raise FaultError(f"cannot read DCP metadata {meta_path}: {exc}") from None
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    kinds = getattr(meta, "state_dict_metadata", {})
    out = []
    for index, info in (getattr(meta, "storage_data", None) or {}).items():
        if info.relative_path == os.path.basename(path) and isinstance(kinds.get(index.fqn), BytesStorageMetadata):
            out.append((index.fqn, int(info.offset), int(info.length)))
    return sorted(out, key=lambda t: t[1])


def is_dcp_data(path: str) -> bool:
    return path.endswith(".distcp") and os.path.isfile(os.path.join(os.path.dirname(path), DCP_METADATA))


def speaks(path: str | os.PathLike[str], fmt: str) -> bool:
    """Whether the file at ``path`` is already in a format a ``fmt`` payload is written in.

    ``pickle`` and ``torchzip``: a pickle (protocol 2 or later), a zip (``torch.save``'s
    format, whose ``data.pkl`` is a pickle) or a DCP data file with byte items (which DCP
    reads with ``torch.load``); ``safetensors-header``: a safetensors file. The harness
    (``chaos.plan.loadtrace.choose``) plants a payload in the first file the load reads that
    speaks its format: a pickle in a text ``latest`` pointer tests nothing.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown payload format {fmt!r}; expected one of {FORMATS}")
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            head = f.read(8)
            if fmt == "safetensors-header":
                if len(head) < 8:
                    return False
                (n,) = struct.unpack("<Q", head)
                if not 0 < n <= min(os.fstat(f.fileno()).st_size - 8, 1 << 26):
                    return False
                _split_safetensors(head + f.read(n))
                return True
    except (OSError, FaultError):
        return False
    if (head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5) or head[:4] == b"PK\x03\x04":
        return True  # a pickle of protocol 2+, or a zip
    if is_dcp_data(p):
        try:
            return bool(dcp_byte_items(p))
        except FaultError:
            return False
    return False


# ---------------------------------------------------------------------- planting
def plant(path: str | os.PathLike[str], fmt: str, marker: str | os.PathLike[str], *, seed: int = 0,
          scratch_root: str | os.PathLike[str], marker_root: str | os.PathLike[str] | None = None,
          variant: str | None = None) -> CorruptionRecord:
    """Plant a ``fmt`` payload in ``path``; the record's ``params`` name the marker and slots.

    ``path`` must lie inside ``scratch_root`` and ``marker`` inside ``marker_root``
    (default: the same), else OutsideScratchRoot and nothing is touched. ``variant``
    (safetensors-header) defaults to one drawn with ``seed``.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown payload format {fmt!r}; expected one of {FORMATS}")
    p = _check(path, scratch_root)
    mark = os.path.join(_check(os.path.dirname(os.fspath(marker)), marker_root or scratch_root),
                        os.path.basename(os.fspath(marker)))
    before = _read(p)
    params: dict[str, Any] = {"format": fmt, "marker": mark}
    if fmt == "safetensors-header":
        params["variant"] = variant or random.Random(f"{seed}:payload").choice(HEADER_VARIANTS)
        after = safetensors_header_payload(before, params["variant"])
    elif is_dcp_data(p):
        slots = dcp_byte_items(p)
        if not slots:
            raise FaultError(f"{p} holds no DCP byte item to plant a {fmt} payload in")
        buf = bytearray(before)
        for _fqn, off, length in slots:
            buf[off:off + length] = (torchzip_payload(mark, length) if fmt == "torchzip"
                                     else padded_pickle(mark, length))
        params["slots"] = [{"fqn": f, "start": o, "end": o + n} for f, o, n in slots]
        after = bytes(buf)
    else:
        after = torchzip_payload(mark) if fmt == "torchzip" else pickle_payload(mark)
    _write(p, after)
    after = _read(p)
    if "slots" in params:
        ranges = [[s["start"], s["end"]] for s in params["slots"]]
        changes = [_change(s, before[s:e], after[s:e]) for s, e in ranges]
    else:
        ranges = [[0, max(len(before), len(after))]]
        changes = [_change(0, before, after)]
    return _record("payload", p, seed, params, before, after, ranges, changes)


__all__ = [
    "FORMATS", "HEADER_VARIANTS", "dcp_byte_items", "is_dcp_data", "padded_pickle", "pickle_payload", "plant",
    "safetensors_header_payload", "speaks", "torchzip_payload",
]
