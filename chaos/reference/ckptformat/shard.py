"""Safetensors shards: written through Python file objects, read with checks first.

Writing: the default ``native`` serializer lays out the standard safetensors format
(8-byte little-endian header length, JSON header padded to 8 bytes, tensors in
descending alignment order) and writes each tensor's bytes straight from its memory,
so the harness's Python-level I/O interposer sees every write and no extra copy of the
state is made. ``serializer="safetensors"`` uses ``safetensors.torch.save`` (bytes,
then ``f.write``) instead; it produces the same format but costs a full serialization
copy (measured ~0.25 s per 50 MB here, more than the write itself). Tests check that
the library reads our files back bit-exact.

Reading: a shard is hostile input. It is opened without following links and must be a
regular file (:mod:`chaos.reference.ckptformat.safeio`); its size is compared with the manifest and
with what this machine could hold before anything is allocated; the safetensors header
(length bounded) is read and checked first — JSON object, step and rank, tensor data
ending exactly at the end of the file — so a file of garbage or of zeros is refused
having cost a few bytes; a file with holes (sparse: gigabytes claimed, nothing stored)
is checksummed through a small buffer before its bytes are given memory; then the
checksum is verified over the bytes actually read and every entry is cross-checked
against the header.
"""

from __future__ import annotations

import io
import json
import os
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import torch

from chaos.reference.ckptformat.errors import CheckpointError, CorruptCheckpointError, ManifestError
from chaos.reference.ckptformat.hashing import digest, new_hasher, tensor_bytes
from chaos.reference.ckptformat.manifest import DTYPE_NAMES, DTYPES, safe_json_loads
from chaos.reference.ckptformat.safeio import open_regular, read_upto

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


def memory_limit() -> int | None:
    """This machine's RAM plus swap in bytes (None when unknown).

    A shard is loaded into one buffer of its size, so one that declares more than this
    can never load: it is refused before a byte is downloaded or hashed, which also
    bounds the time a sparse file claiming a petabyte can cost.
    """
    try:
        with open("/proc/meminfo", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read(1 << 16).splitlines() if b":" in line)
        return sum(int(fields[k].split()[0]) * 1024 for k in (b"MemTotal", b"SwapTotal") if k in fields) or None
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_loadable(path: str, size: int) -> None:
    """Refuse a shard whose declared ``size`` exceeds :func:`memory_limit` (see there)."""
    limit = memory_limit()
    if limit is not None and size > limit:
        raise CorruptCheckpointError(path, f"declares {size} bytes, more than this machine's memory and swap "
                                           f"({limit} bytes) could hold")


def check_header(raw: bytes, path: str, size: int, step: int, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Parse and check a shard's safetensors header (``raw``: the JSON after the length).

    Shared by :func:`read_shard` and ``chaos.reference.checkpoint.reshard`` (which reads byte
    ranges). Checks: a JSON object, ``__metadata__`` step and rank as the manifest says,
    every entry's ``data_offsets`` well formed, and the data ending exactly at the end of
    the file (safetensors leaves no unindexed bytes), so a shard cannot claim more bytes
    than its header accounts for.
    """
    try:
        header = safe_json_loads(raw, path)
    except ManifestError as exc:
        raise ManifestError(path, f"safetensors header: {exc.problem}") from None
    if not isinstance(header, dict):
        raise ManifestError(path, "safetensors header is not a JSON object")
    meta = header.get("__metadata__", {})
    if isinstance(meta, dict) and "step" in meta and meta["step"] != str(step):
        raise CorruptCheckpointError(path, f"shard belongs to step {meta['step']}, not step {step} (stale copy)")
    if isinstance(meta, dict) and "rank" in meta and meta["rank"] != str(spec["rank"]):
        raise CorruptCheckpointError(path, f"shard was written by rank {meta['rank']}, manifest says rank {spec['rank']} (swapped)")
    end = 0
    for name, h in header.items():
        if name == "__metadata__":
            continue
        offs = h.get("data_offsets") if isinstance(h, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offs) and 0 <= offs[0] <= offs[1]):
            raise ManifestError(path, f"safetensors header entry {str(name)[:120]!r} has malformed data_offsets")
        end = max(end, offs[1])
    data = size - 8 - len(raw)
    if end != data:
        raise ManifestError(path, f"safetensors header describes {end} bytes of tensor data, the file holds {data} "
                                  "after its header")
    return header


def read_header(f: BinaryIO, path: str, size: int, step: int, spec: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The 8-byte length and JSON header of the open shard ``f`` (at offset 0), and the parsed header.

    Reads at most ``8 + min(size - 8, MAX_HEADER)`` bytes, whatever the file says.
    """
    if size < 8:
        raise CorruptCheckpointError(path, f"{size} bytes is shorter than a safetensors header")
    first = read_upto(f, 8)
    if len(first) != 8:
        raise CorruptCheckpointError(path, f"read {len(first)} of {size} bytes (file shrank while reading)")
    (hlen,) = struct.unpack("<Q", first)
    if hlen > min(size - 8, MAX_HEADER):
        raise ManifestError(path, f"absurd safetensors header length {hlen} (file has {size} bytes)")
    raw = read_upto(f, hlen)
    if len(raw) != hlen:
        raise CorruptCheckpointError(path, f"read {8 + len(raw)} of {size} bytes (file shrank while reading)")
    return first + raw, check_header(raw, path, size, step, spec)


def _has_holes(f: BinaryIO, size: int) -> bool:
    """Whether the open file has a hole (``SEEK_HOLE`` before its end): a sparse file.

    Only a hint that picks the cautious path; a file system without hole support
    reports none, which costs nothing but that caution.
    """
    here = f.tell()
    try:
        hole = os.lseek(f.fileno(), 0, os.SEEK_HOLE)
    except (OSError, AttributeError, ValueError, TypeError, io.UnsupportedOperation):
        hole = None
    f.seek(here)
    return isinstance(hole, int) and hole < size


def _mismatch(path: str, spec: Mapping[str, Any], checksum: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(path, f"checksum mismatch: manifest {spec['checksum']}, file {checksum}")


def verify_streaming(f: BinaryIO, path: str, spec: Mapping[str, Any], algorithm: str, size: int) -> None:
    """Check the whole-file checksum of ``f`` through one small buffer; raise on a mismatch.

    The memory-bounded check :func:`read_shard` runs before allocating a sparse shard,
    and after a header problem (so bytes damaged at rest are reported as a checksum
    mismatch, as metrics and alerts expect, whichever byte was hit).
    """
    f.seek(0)
    hasher = new_hasher(algorithm)
    scratch = memoryview(bytearray(max(1, min(CHUNK, size))))
    got = 0
    while got < size:
        n = f.readinto(scratch[: min(len(scratch), size - got)])
        if not n:
            break
        hasher.update(scratch[:n])
        got += n
    if got != size:
        raise CorruptCheckpointError(path, f"read {got} of {size} bytes (file shrank while reading)")
    checksum = f"{algorithm}:{hasher.hexdigest()}"
    if checksum != spec["checksum"]:
        raise _mismatch(path, spec, checksum)


def read_shard(
    path: str, spec: Mapping[str, Any], algorithm: str, verify: bool, step: int,
    targets: Mapping[str, tuple[int, int, torch.Tensor]] | None = None, *, root: str | None = None,
) -> LoadedShard:
    """Read a whole shard after checking its kind, size and header; verify checksum and header.

    ``root``: the directory the caller owns that ``path`` lies below (PosixStorage passes
    the checkpoint root, so the step directory is not followed if it is a link either);
    default, the shard's own directory. Never reads more than the manifest's ``size``,
    which must equal the file's.

    ``targets`` maps an entry's name to its byte range and a contiguous CPU
    tensor of exactly that many bytes that should receive it directly, as DCP loads into
    the caller's tensors: that skips allocating (and page-faulting) a second copy of the
    state, which is most of a load's cost from the page cache. Such a tensor holds the
    bytes read even if the shard then fails verification, so callers only pass tensors
    that any later valid checkpoint overwrites. Ranges that overlap the header or each
    other, or that do not fit the file, are read into the buffer as usual.
    """
    try:
        f, st = open_regular(path, root if root is not None else (os.path.dirname(path) or "."), CorruptCheckpointError)
    except FileNotFoundError:
        raise CorruptCheckpointError(path, "shard file is missing") from None
    with f:
        try:
            return _read_open_shard(f, st.st_size, path, spec, algorithm, verify, step, targets)
        except OSError as exc:  # EIO and the like: a reason to fall back like any other
            raise CorruptCheckpointError(path, f"cannot be read: {exc.strerror or exc}") from None


def _read_open_shard(f: BinaryIO, actual: int, path: str, spec: Mapping[str, Any], algorithm: str, verify: bool,
                     step: int, targets: Mapping[str, tuple[int, int, torch.Tensor]] | None) -> LoadedShard:
    want = spec["size"]
    if actual != want:
        raise CorruptCheckpointError(path, f"size {actual} bytes, manifest says {want} (truncated or replaced)")
    check_loadable(path, want)
    try:
        head, header = read_header(f, path, want, step, spec)
    except CheckpointError:
        if verify:
            verify_streaming(f, path, spec, algorithm, want)
        raise
    if verify and _has_holes(f, want):
        verify_streaming(f, path, spec, algorithm, want)
    base = len(head)
    f.seek(base)
    inplace: dict[str, tuple[int, torch.Tensor]] = {}
    # Allocated, not touched: pages of ranges read in place are never faulted in.
    buf = torch.empty(want, dtype=torch.uint8)
    view = memoryview(buf.numpy()).cast("B")
    hasher = new_hasher(algorithm) if verify else None
    view[:base] = head
    if hasher is not None:
        hasher.update(view[:base])
    got = pos = base
    for name, (begin, end, tensor) in sorted((targets or {}).items(), key=lambda kv: kv[1][0]):
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
            raise _mismatch(path, spec, checksum)
    return LoadedShard(path=path, buffer=buf, header=header, inplace=inplace, base=base)


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
