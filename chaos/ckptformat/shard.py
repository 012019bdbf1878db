"""Safetensors shards: written through Python file objects, read with checks first.

Writing: the default ``native`` serializer lays out the standard safetensors format
(8-byte little-endian header length, JSON header padded to 8 bytes, tensors in
descending alignment order) and writes each tensor's bytes straight from its memory,
so the harness's Python-level I/O interposer sees every write and no extra copy of the
state is made. ``serializer="safetensors"`` uses ``safetensors.torch.save`` (bytes,
then ``f.write``) instead; it produces the same format but costs a full serialization
copy (measured ~0.25 s per 50 MB here, more than the write itself). Tests check that
the library reads our files back bit-exact.

Reading: the shard's size is compared with the manifest before anything is allocated,
the checksum is verified over the bytes actually read, the safetensors header length is
bounded, and every entry is cross-checked against the header.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import torch

from chaos.ckptformat.errors import CorruptCheckpointError, ManifestError
from chaos.ckptformat.hashing import digest, new_hasher, tensor_bytes
from chaos.ckptformat.manifest import DTYPE_NAMES, DTYPES, safe_json_loads

MAX_HEADER = 100 * 1024 * 1024
CHUNK = 8 * 1024 * 1024
ST_CODES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
    "complex64": "C64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "uint16": "U16", "uint32": "U32", "uint64": "U64",
}


class Throttle:
    """Keeps a writer at or below ``mb_s`` megabytes per second (None: unlimited)."""

    def __init__(self, mb_s: float | None) -> None:
        self.rate = mb_s * 1e6 if mb_s else None
        self.start = time.monotonic()
        self.done = 0

    def consume(self, nbytes: int) -> None:
        if self.rate is None:
            return
        self.done += nbytes
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


@dataclass
class ShardInfo:
    file: str
    size: int
    checksum: str
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)


class _Writeback:
    """Starts the kernel's writeback of each chunk as soon as it is written.

    A plain ``write`` + ``fsync`` leaves all dirty pages to the fsync, so the disk idles
    while the data is copied in and the CPU idles while it is flushed. Asking for
    writeback (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, Linux) every few MB overlaps
    the two, the way RocksDB's ``bytes_per_sync`` does. It is only a hint: durability
    still comes from the fsync the caller does, and crash-state exploration treats the
    data as volatile until then. Where the call or a file descriptor is missing, no-op.
    """

    _libc: Any = None

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.fd, self.synced, self.pos = f, None, 0, 0
        try:
            self.fd = f.fileno()
            self.pos = f.tell()
        except (AttributeError, OSError, ValueError):
            return
        if _Writeback._libc is None:
            _Writeback._libc = _load_sync_file_range()
        if not _Writeback._libc:
            self.fd = None
        self.synced = self.pos

    def advance(self, nbytes: int) -> None:
        self.pos += nbytes
        if self.fd is None or self.pos - self.synced < CHUNK:
            return
        self.f.flush()
        if _Writeback._libc(self.fd, self.synced, self.pos - self.synced, SYNC_FILE_RANGE_WRITE) == 0:
            self.synced = self.pos
        else:
            self.fd = None  # e.g. a file system that refuses it: fall back to fsync alone


SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Any:
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return False


class _Sink:
    """Writes in chunks, hashing each chunk while it is still in the CPU cache."""

    def __init__(self, f: BinaryIO, hasher: Any, throttle: Throttle) -> None:
        self.f, self.hasher, self.throttle = f, hasher, throttle
        self.writeback = _Writeback(f)

    def write(self, data: Any) -> None:
        mv = memoryview(data).cast("B")
        for i in range(0, len(mv), CHUNK):
            chunk = mv[i : i + CHUNK]
            self.f.write(chunk)
            self.hasher.update(chunk)
            self.throttle.consume(len(chunk))
            self.writeback.advance(len(chunk))


def _header(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> tuple[bytes, list[str], dict]:
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        code = ST_CODES.get(DTYPE_NAMES.get(t.dtype, ""))
        if code is None:
            raise ManifestError(name, f"dtype {t.dtype} cannot be stored in safetensors")
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return blob, order, header


def write_shard(
    f: BinaryIO,
    file: str,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str],
    algorithm: str,
    entry_checksums: Mapping[str, str] | None = None,
    throttle: Throttle | None = None,
    serializer: str = "native",
) -> ShardInfo:
    """Write ``tensors`` (contiguous CPU) to ``f``; return size, checksums and byte ranges."""
    throttle = throttle or Throttle(None)
    shard_hash = new_hasher(algorithm)
    entry_checksums = dict(entry_checksums or {})
    info = ShardInfo(file=file, size=0, checksum="")
    sink = _Sink(f, shard_hash, throttle)
    if serializer == "safetensors":
        import safetensors.torch

        seen: set[int] = set()
        plain = {}
        for k, t in tensors.items():  # the library refuses tensors sharing storage (tied weights)
            ptr = t.untyped_storage().data_ptr() if t.numel() else -1
            plain[k] = t.clone() if ptr in seen else t
            seen.add(ptr)
        blob = safetensors.torch.save(plain, metadata=dict(metadata))
        (hlen,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + hlen])
        base = 8 + hlen
        sink.write(blob)
        info.size = len(blob)
        ranges = {k: (base + v["data_offsets"][0], base + v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"}
    else:
        blob, order, header = _header(tensors, metadata)
        prefix = struct.pack("<Q", len(blob)) + blob
        sink.write(prefix)
        base = len(prefix)
        ranges = {}
        for name in order:
            sink.write(tensor_bytes(tensors[name]))
            b, e = header[name]["data_offsets"]
            ranges[name] = (base + b, base + e)
        info.size = base + (header[order[-1]]["data_offsets"][1] if order else 0)
    for name, (b, e) in ranges.items():
        t = tensors[name]
        checksum = entry_checksums.get(name) or digest(algorithm, tensor_bytes(t))
        info.entries[name] = {
            "dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "offsets": [b, e], "checksum": checksum,
        }
    info.checksum = f"{algorithm}:{shard_hash.hexdigest()}"
    return info


@dataclass
class LoadedShard:
    path: str
    buffer: torch.Tensor
    header: dict[str, Any]
    # Entries read straight into a caller's tensor: name -> (first byte, that tensor).
    inplace: dict[str, tuple[int, torch.Tensor]] = field(default_factory=dict)
    base: int = 0  # where tensor data starts: 8 + header length


def _fill(f: BinaryIO, view: memoryview, hasher: Any) -> int:
    """Read into ``view`` in chunks, hashing each while it is still in the CPU cache."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got : min(len(view), got + CHUNK)])
        if not n:
            break
        if hasher is not None:
            hasher.update(view[got : got + n])
        got += n
    return got


def read_shard(
    path: str, spec: Mapping[str, Any], algorithm: str, verify: bool, step: int,
    targets: Mapping[str, tuple[int, int, torch.Tensor]] | None = None,
) -> LoadedShard:
    """Read a whole shard after checking its size; verify checksum and header.

    ``targets`` maps an entry's name to its byte range and a contiguous CPU
    tensor of exactly that many bytes that should receive it directly, as DCP loads into
    the caller's tensors: that skips allocating (and page-faulting) a second copy of the
    state, which is most of a load's cost from the page cache. Such a tensor holds the
    bytes read even if the shard then fails verification, so callers only pass tensors
    that any later valid checkpoint overwrites. Ranges that overlap the header or each
    other, or that do not fit the file, are read into the buffer as usual.
    """
    want = spec["size"]
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CorruptCheckpointError(path, "shard file is missing") from None
    inplace: dict[str, tuple[int, torch.Tensor]] = {}
    with f:
        actual = os.fstat(f.fileno()).st_size
        if actual != want:
            raise CorruptCheckpointError(path, f"size {actual} bytes, manifest says {want} (truncated or replaced)")
        # Allocated, not touched: pages of ranges read in place are never faulted in.
        buf = torch.empty(want, dtype=torch.uint8)
        view = memoryview(buf.numpy()).cast("B")
        hasher = new_hasher(algorithm) if verify else None
        got = _fill(f, view[: min(want, 8)], hasher)
        if got == 8 and targets:
            (hlen,) = struct.unpack("<Q", bytes(view[:8]))
            pos = min(want, 8 + hlen)
            got += _fill(f, view[8:pos], hasher)
            for name, (begin, end, tensor) in sorted(targets.items(), key=lambda kv: kv[1][0]):
                if got != pos or begin < pos or end > want or end - begin != tensor.numel() * tensor.element_size():
                    continue
                got += _fill(f, view[pos:begin], hasher)
                pos = begin
                if got != pos:
                    break
                got += _fill(f, tensor_bytes(tensor), hasher)
                pos = end
                inplace[name] = (begin, tensor)
        got += _fill(f, view[got:want], hasher)
    if got != want:
        raise CorruptCheckpointError(path, f"read {got} of {want} bytes (file shrank while reading)")
    if hasher is not None:
        checksum = f"{algorithm}:{hasher.hexdigest()}"
        if checksum != spec["checksum"]:
            raise CorruptCheckpointError(path, f"checksum mismatch: manifest {spec['checksum']}, file {checksum}")
    (hlen,) = struct.unpack("<Q", bytes(view[:8]))
    if hlen > min(want - 8, MAX_HEADER):
        raise ManifestError(path, f"absurd safetensors header length {hlen} (file has {want} bytes)")
    header = safe_json_loads(bytes(view[8 : 8 + hlen]), path)
    if not isinstance(header, dict):
        raise ManifestError(path, "safetensors header is not a JSON object")
    meta = header.get("__metadata__", {})
    if isinstance(meta, dict) and "step" in meta and meta["step"] != str(step):
        raise CorruptCheckpointError(path, f"shard belongs to step {meta['step']}, not step {step} (stale copy)")
    if isinstance(meta, dict) and "rank" in meta and meta["rank"] != str(spec["rank"]):
        raise CorruptCheckpointError(path, f"shard was written by rank {meta['rank']}, manifest says rank {spec['rank']} (swapped)")
    return LoadedShard(path=path, buffer=buf, header=header, inplace=inplace, base=8 + hlen)


def entry_tensor(shard: LoadedShard, name: str, e: Mapping[str, Any], algorithm: str, verify: bool) -> torch.Tensor:
    """The tensor of entry ``name`` as a view into the shard buffer (checked against the header)."""
    h = shard.header.get(name)
    base = shard.base
    if not isinstance(h, dict):
        raise ManifestError(shard.path, f"entry {name[:120]!r} is missing from the safetensors header")
    offs = h.get("data_offsets")
    if (
        h.get("dtype") != ST_CODES.get(e["dtype"])
        or h.get("shape") != e["shape"]
        or not isinstance(offs, list)
        or [base + o for o in offs if isinstance(o, int)] != list(e["offsets"])
    ):
        raise ManifestError(shard.path, f"entry {name[:120]!r}: safetensors header disagrees with the manifest on dtype, shape or offsets")
    b, end = e["offsets"]
    dtype = DTYPES[e["dtype"]]
    start, into = shard.inplace.get(name, (None, None))
    if into is not None and start == b and into.dtype == dtype and list(into.shape) == list(e["shape"]):
        if verify and digest(algorithm, tensor_bytes(into)) != e["checksum"]:
            raise CorruptCheckpointError(shard.path, f"entry {name[:120]!r} checksum mismatch")
        return into
    raw = shard.buffer[b:end]
    if verify:
        checksum = digest(algorithm, tensor_bytes(raw))
        if checksum != e["checksum"]:
            raise CorruptCheckpointError(shard.path, f"entry {name[:120]!r} checksum mismatch")
    if raw.numel() and b % dtype.itemsize:
        raw = raw.clone()
    return raw.view(dtype).reshape(e["shape"]) if raw.numel() else torch.empty(e["shape"], dtype=dtype)
