"""Loading a checkpoint that holds sharded tensors: byte ranges, verified, at any world size.

``loader.load_step`` hands a manifest with a ``dtensors`` section here. Nothing is read
whole: each rank opens only the shards it needs (size checked against the manifest,
safetensors header parsed and checked: step, rank, every entry it reads), reads every
ordinary entry it decodes (replicated values, its own per-rank values) by its byte
range, verified by the entry's checksum, and for every sharded tensor only the slices of
the saved pieces that overlap the box its template DTensor needs, rounded out to whole
checksum blocks and verified block by block (``chaos.reference.ckptformat.dtensor``). Bytes no rank
of the new world needs (per-rank values of ranks that are gone) are not read, so damage
there changes nothing that loads.

The template decides the layout: a DTensor template gets a DTensor with the template's
mesh and placements holding exactly its local box; a plain tensor (or no template value)
gets the whole global tensor. A missing shard, a short file, a checksum mismatch or a
header that disagrees with the manifest raises a CheckpointError, and the caller falls
back to an older checkpoint: never a partial load.

POSIX storage is read with seeks; other backends (S3, fsspec) fetch a shard whole
through their ``read_shard`` and slices are cut from it (a ranged read there needs a
``read_range`` on the storage protocol).
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from chaos.reference.ckptformat import tree
from chaos.reference.ckptformat.dtensor import (
    BLOCK,
    block_span,
    is_dtensor,
    needed_box,
    overlap,
    runs,
)
from chaos.reference.ckptformat.errors import (
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    ManifestError,
)
from chaos.reference.ckptformat.hashing import digest
from chaos.reference.ckptformat.manifest import DTYPES
from chaos.reference.ckptformat.safeio import open_regular
from chaos.reference.ckptformat.shard import ST_CODES, read_header


@dataclass
class _Open:
    path: str
    f: Any
    header: dict[str, Any]
    base: int
    buffer: Any = None  # a whole-shard fallback (non-POSIX storage)


@dataclass
class RangedReader:
    """One rank's reads of one checkpoint's shards; ``bytes_read`` counts what it really read."""

    store: Any
    step: int
    m: dict[str, Any]
    verify: bool
    bytes_read: int = 0
    bytes_needed: int = 0
    _open: dict[str, _Open] = field(default_factory=dict)

    def close(self) -> None:
        for o in self._open.values():
            if o.f is not None:
                o.f.close()
        self._open.clear()

    # -- shards ---------------------------------------------------------------
    def _shard(self, name: str) -> _Open:
        if name in self._open:
            return self._open[name]
        from chaos.reference.storage.posix import PosixStorage

        spec = self.m["shards"][name]
        if not isinstance(self.store, PosixStorage):
            loaded = self.store.read_shard(self.step, name, spec, self.m["hash"], self.verify)
            self.bytes_read += spec["size"]
            o = _Open(loaded.path, None, loaded.header, loaded.base, loaded.buffer)
            self._open[name] = o
            return o
        path = os.path.join(self.store.step_location(self.step), name)
        try:
            # Below the root nothing is followed and only a regular file is read (safeio).
            f, st = open_regular(path, self.store.root, CorruptCheckpointError)
        except FileNotFoundError:
            raise CorruptCheckpointError(path, "shard file is missing") from None
        try:
            size = st.st_size
            if size != spec["size"]:
                raise CorruptCheckpointError(path, f"size {size} bytes, manifest says {spec['size']} (truncated or replaced)")
            head, header = read_header(f, path, size, self.step, spec)
            self.bytes_read += len(head)
        except BaseException:
            f.close()
            raise
        o = _Open(path, f, header, len(head))
        self._open[name] = o
        return o

    def _entry(self, name: str) -> tuple[_Open, dict[str, Any]]:
        e = self.m["entries"][name]
        o = self._shard(e["shard"])
        h = o.header.get(name)
        offs = h.get("data_offsets") if isinstance(h, dict) else None
        if (not isinstance(h, dict) or h.get("dtype") != ST_CODES.get(e["dtype"]) or h.get("shape") != e["shape"]
                or not isinstance(offs, list) or [o.base + x for x in offs if isinstance(x, int)] != list(e["offsets"])):
            raise ManifestError(o.path, f"entry {name[:120]!r}: safetensors header disagrees with the manifest on "
                                        "dtype, shape or offsets")
        return o, e

    def _read(self, o: _Open, begin: int, end: int) -> bytearray:
        """Bytes ``[begin, end)`` of a shard."""
        n = end - begin
        if o.buffer is not None:
            return bytearray(o.buffer[begin:end].numpy().tobytes())
        data = bytearray(n)
        o.f.seek(begin)
        got = o.f.readinto(memoryview(data)) or 0
        while got < n:
            more = o.f.readinto(memoryview(data)[got:])
            if not more:
                raise CorruptCheckpointError(o.path, f"read {got} of {n} bytes at offset {begin} (file shrank while reading)")
            got += more
        self.bytes_read += n
        return data

    # -- tensors --------------------------------------------------------------
    def tensor(self, name: str) -> torch.Tensor:
        """A whole ordinary entry, verified by its checksum."""
        o, e = self._entry(name)
        begin, end = e["offsets"]
        data = self._read(o, begin, end)
        self.bytes_needed += end - begin
        if self.verify and digest(self.m["hash"], data) != e["checksum"]:
            raise CorruptCheckpointError(o.path, f"entry {name[:120]!r} checksum mismatch")
        dtype = DTYPES[e["dtype"]]
        if not data:
            return torch.empty(e["shape"], dtype=dtype)
        return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(e["shape"])

    def _piece_box(self, name: str, piece_shape: list[int], sub_off: list[int], sub_shape: list[int],
                   dtype: torch.dtype) -> torch.Tensor:
        """The box ``[sub_off, sub_off + sub_shape)`` of a saved piece, reading only its blocks."""
        o, e = self._entry(name)
        begin, end = e["offsets"]
        size, item = end - begin, dtype.itemsize
        element_runs = runs(piece_shape, sub_off, sub_shape)
        spans: list[list[int]] = []
        for first, count in element_runs:
            b, en = block_span(first * item, count * item, size)
            if spans and b <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], en)
            else:
                spans.append([b, en])
        blocks = e.get("blocks") or []
        chunks = []
        for b, en in spans:
            data = self._read(o, begin + b, begin + en)
            if self.verify:
                for i in range(b // BLOCK, -(-en // BLOCK)):
                    lo, hi = i * BLOCK - b, min(en, (i + 1) * BLOCK) - b
                    if i >= len(blocks) or digest(self.m["hash"], memoryview(data)[lo:hi]) != blocks[i]:
                        raise CorruptCheckpointError(o.path, f"entry {name[:120]!r} block {i} checksum mismatch")
            chunks.append(data)
        starts = [b for b, _ in spans]
        out = torch.empty(math.prod(sub_shape) * item, dtype=torch.uint8)
        view = memoryview(out.numpy()).cast("B")
        pos = 0
        for first, count in element_runs:
            fb, nb = first * item, count * item
            k = bisect.bisect_right(starts, fb) - 1
            view[pos:pos + nb] = memoryview(chunks[k])[fb - starts[k]:fb - starts[k] + nb]
            pos += nb
        self.bytes_needed += pos
        return out.view(dtype).reshape(sub_shape) if pos else torch.empty(sub_shape, dtype=dtype)

    def dtensor(self, key: str, template: Any) -> torch.Tensor:
        """This rank's part of sharded tensor ``key``, shaped and placed like ``template``."""
        d = self.m["dtensors"][key]
        dtype = DTYPES.get(d["dtype"])
        if dtype is None:
            raise ManifestError(key, f"unknown dtype {d['dtype']!r}")
        if isinstance(template, torch.Tensor):
            if list(template.shape) != d["shape"] or template.dtype != dtype:
                raise IncompatibleCheckpointError(f"{key}: checkpoint holds {d['dtype']} {d['shape']}, the template "
                                                  f"{template.dtype} {list(template.shape)}")
            box_off, box_shape = needed_box(template)
        else:
            box_off, box_shape = [0] * len(d["shape"]), list(d["shape"])
        out = torch.empty(box_shape, dtype=dtype)
        for p in d["pieces"]:
            ov = overlap(p["offset"], p["shape"], box_off, box_shape)
            if ov is None:
                continue
            off, shape = ov
            sub = self._piece_box(p["entry"], p["shape"], [a - b for a, b in zip(off, p["offset"], strict=True)],
                                  shape, dtype)
            out[tuple(slice(a - b, a - b + n) for a, b, n in zip(off, box_off, shape, strict=True))] = sub
        if is_dtensor(template):
            from torch.distributed.tensor import DTensor

            return DTensor.from_local(out, template.device_mesh, template.placements, run_check=False,
                                      shape=template.shape, stride=template.stride())
        return out


def load_sharded(store: Any, step: int, m: dict[str, Any], file: str, template: Any, rank: int, verify: bool) -> Any:
    """Decode ``m`` for ``rank`` reading byte ranges only; returns ``(state, reader, decoder)``."""
    index = tree.template_index(template)
    reader = RangedReader(store, step, m, verify)
    try:
        def load(entry: str) -> torch.Tensor:
            if entry not in m["entries"]:
                raise ManifestError(file, f"tree references undefined entry {entry[:120]!r}")
            return reader.tensor(entry)

        decoder = tree.Decoder(file, rank, load, fallback=lambda path: (path in index, index.get(path)),
                               load_dtensor=lambda key, path: reader.dtensor(key, index.get(path)))
        state = decoder.decode(m["tree"])
    finally:
        reader.close()
    return state, reader, decoder
