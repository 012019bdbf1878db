"""Sharded tensors (DTensor) in the format: pieces, their boxes in the global tensor, slices.

A DTensor (FSDP2, HSDP, tensor parallel) is saved as *pieces*: each rank's local tensor
is one piece, a box ``[offset, offset + shape)`` of the global tensor, stored as an
ordinary safetensors entry named ``<path>@o<offset>`` (``@`` never occurs in an escaped
state path). Replicas of a piece (HSDP's replicate dimension, a ``Replicate()``
placement) have the same name and are written once. The manifest's ``dtensors``
section records, per DTensor path: dtype, global shape, the placements and mesh shape
it was saved with, and every piece (entry, offset, shape). Every piece entry carries,
besides its whole-entry checksum, a checksum per ``BLOCK`` bytes (``blocks``) so that a
rank that needs only a slice reads and verifies only the blocks under that slice.

Loading at any world size: a rank computes the box its template DTensor needs
(:func:`needed_box`), intersects it with every saved piece and reads, from each piece it
overlaps, only the byte runs of the intersection (:func:`runs`), rounded out to whole
blocks for verification. Validation refuses a section whose pieces overlap or leave any
element of the global tensor uncovered, so a checkpoint missing a piece is invalid as a
whole (fall back), never partially loaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from chaos.reference.ckptformat.errors import ManifestError

BLOCK = 64 * 1024
PIECE_MARK = "@o"
MAX_PIECES = 1024  # pieces of one tensor (pairwise disjointness check)


def is_dtensor(value: Any) -> bool:
    """A ``torch.distributed.tensor.DTensor``, recognised without importing torch.distributed."""
    return type(value).__name__ == "DTensor" and hasattr(value, "to_local") and hasattr(value, "placements")


def local_box(t: Any) -> tuple[list[int], list[int]]:
    """``(offset, shape)`` of this rank's local tensor inside the global tensor ``t``."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return list(offset), list(shape)


def needed_box(template: Any) -> tuple[list[int], list[int]]:
    """The box a template leaf needs: a DTensor its local box, anything else the whole tensor."""
    if is_dtensor(template):
        return local_box(template)
    return [0] * template.dim(), list(template.shape)


def piece_name(path: str, offset: Sequence[int]) -> str:
    return f"{path}{PIECE_MARK}{'.'.join(str(o) for o in offset)}"


def describe(t: Any) -> dict[str, Any]:
    """What the manifest records of a DTensor besides its pieces (dtype is added by the caller)."""
    return {"shape": list(t.shape), "placements": [repr(p) for p in t.placements], "mesh": list(t.device_mesh.shape)}


def overlap(a_off: Sequence[int], a_shape: Sequence[int], b_off: Sequence[int], b_shape: Sequence[int]
            ) -> tuple[list[int], list[int]] | None:
    """The intersection of two boxes as ``(offset, shape)``, or None if it is empty."""
    off, shape = [], []
    for ao, al, bo, bl in zip(a_off, a_shape, b_off, b_shape, strict=True):
        lo, hi = max(ao, bo), min(ao + al, bo + bl)
        if hi <= lo:
            return None
        off.append(lo)
        shape.append(hi - lo)
    return off, shape


def runs(outer_shape: Sequence[int], box_off: Sequence[int], box_shape: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous element runs ``(first, count)`` of a box inside a row-major array of ``outer_shape``.

    The box's trailing dimensions that span the whole array merge into one run per index
    of the leading ones: a dim-0 slice (FSDP's ``Shard(0)``) is a single run; a dim-1
    slice (a rowwise tensor-parallel weight) is one run per row.
    """
    nd = len(outer_shape)
    if nd == 0:
        return [(0, 1)]
    k = nd - 1
    while k > 0 and box_off[k] == 0 and box_shape[k] == outer_shape[k]:
        k -= 1
    inner = math.prod(outer_shape[k + 1:])
    strides = [math.prod(outer_shape[d + 1:]) for d in range(nd)]
    count = box_shape[k] * inner
    out: list[tuple[int, int]] = []

    def walk(d: int, base: int) -> None:
        if d == k:
            out.append((base + box_off[k] * strides[k], count))
            return
        for i in range(box_off[d], box_off[d] + box_shape[d]):
            walk(d + 1, base + i * strides[d])

    walk(0, 0)
    return out


def block_checksums(algorithm: str, data: memoryview) -> list[str]:
    from chaos.reference.ckptformat.hashing import digest

    return [digest(algorithm, data[i:i + BLOCK]) for i in range(0, len(data), BLOCK)] or [digest(algorithm, b"")]


def validate_section(section: Any, entries: Mapping[str, Any], file: str) -> None:
    """Check the ``dtensors`` section: types, every piece inside the global tensor and an
    existing entry of matching dtype and shape, pieces disjoint and covering every element."""
    if not isinstance(section, dict):
        raise ManifestError(file, "dtensors must be an object")
    for path, d in section.items():
        where = f"dtensor {str(path)[:120]!r}"
        if not isinstance(d, dict):
            raise ManifestError(file, f"{where} is not an object")
        shape, dtype, pieces = d.get("shape"), d.get("dtype"), d.get("pieces")
        if not isinstance(shape, list) or len(shape) > 64 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                     and 0 <= x < 1 << 62 for x in shape):
            raise ManifestError(file, f"{where} has an invalid global shape")
        if not isinstance(dtype, str) or not isinstance(pieces, list) or len(pieces) > MAX_PIECES:
            raise ManifestError(file, f"{where} lacks a dtype or a list of pieces")
        for key in ("placements", "mesh"):
            if not isinstance(d.get(key), list):
                raise ManifestError(file, f"{where} lacks {key!r}")
        covered = 0
        boxes: list[tuple[list[int], list[int]]] = []
        for p in pieces:
            if not isinstance(p, dict) or not isinstance(p.get("entry"), str):
                raise ManifestError(file, f"{where}: a piece is not an object naming an entry")
            off, pshape = p.get("offset"), p.get("shape")
            if not (isinstance(off, list) and isinstance(pshape, list) and len(off) == len(shape) == len(pshape)
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in off + pshape)):
                raise ManifestError(file, f"{where}: piece {p['entry'][:120]!r} has a malformed box")
            if any(o < 0 or n <= 0 or o + n > g for o, n, g in zip(off, pshape, shape, strict=True)):
                raise ManifestError(file, f"{where}: piece {p['entry'][:120]!r} lies outside the global shape {shape}")
            e = entries.get(p["entry"])
            if e is None:
                raise ManifestError(file, f"{where}: piece references undefined entry {p['entry'][:120]!r}")
            if e.get("dtype") != dtype or e.get("shape") != pshape:
                raise ManifestError(file, f"{where}: entry {p['entry'][:120]!r} disagrees on dtype or shape")
            blocks = e.get("blocks")
            nbytes = e["offsets"][1] - e["offsets"][0]
            if not (isinstance(blocks, list) and all(isinstance(b, str) for b in blocks)
                    and len(blocks) == max(1, -(-nbytes // BLOCK))):
                raise ManifestError(file, f"{where}: entry {p['entry'][:120]!r} lacks its block checksums")
            for o2, s2 in boxes:
                if overlap(off, pshape, o2, s2) is not None:
                    raise ManifestError(file, f"{where}: pieces overlap at offset {off}")
            boxes.append((off, pshape))
            covered += math.prod(pshape)
        if covered != math.prod(shape):
            raise ManifestError(file, f"{where}: its pieces cover {covered} of {math.prod(shape)} elements "
                                "(a piece is missing)")


def block_span(first_byte: int, nbytes: int, size: int) -> tuple[int, int]:
    """The block-aligned byte range ``[begin, end)`` of a piece of ``size`` bytes that covers a run."""
    begin = (first_byte // BLOCK) * BLOCK
    end = min(size, -(-(first_byte + nbytes) // BLOCK) * BLOCK)
    return begin, end
