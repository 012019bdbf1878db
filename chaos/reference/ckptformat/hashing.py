"""Checksums of shards and entries, computed while writing.

xxh3-128 is the default because it hashes at memory speed, so verification costs
little next to the I/O; SHA-256 is there for users who want a cryptographic digest and
crc32c for storage stacks that already speak it (needs the optional ``crc32c`` package).
Every checksum string carries its algorithm (``xxh3:...``) so a manifest is
self-describing.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

import xxhash

from chaos.reference.ckptformat.errors import CheckpointConfigError


class Hasher(Protocol):
    def update(self, data: Any) -> None: ...

    def hexdigest(self) -> str: ...


class _Crc32c:
    def __init__(self) -> None:
        try:
            import crc32c  # type: ignore[import-not-found]
        except ImportError:  # pragma: no cover - depends on the environment
            raise CheckpointConfigError(
                "hash=crc32c needs the optional 'crc32c' package (pip install crc32c); "
                "use hash=xxh3 or hash=sha256"
            ) from None
        self._mod = crc32c
        self._value = 0

    def update(self, data: Any) -> None:
        self._value = self._mod.crc32c(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"


def new_hasher(algorithm: str) -> Hasher:
    """A fresh streaming hasher for ``algorithm`` (xxh3, sha256 or crc32c)."""
    if algorithm == "xxh3":
        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "crc32c":
        return _Crc32c()
    raise CheckpointConfigError(f"unknown hash algorithm {algorithm!r}")


def digest(algorithm: str, *chunks: Any) -> str:
    """``algorithm:hex`` over the concatenation of ``chunks`` (buffers)."""
    h = new_hasher(algorithm)
    for chunk in chunks:
        h.update(chunk)
    return f"{algorithm}:{h.hexdigest()}"


def tensor_bytes(tensor: Any) -> memoryview:
    """The raw little-endian bytes of a contiguous CPU tensor, without copying."""
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    import torch

    return memoryview(flat.view(torch.uint8).numpy()).cast("B")
