"""The checkpoint manifest: what it records and how a hostile one is rejected.

A checkpoint directory ``step-0000000010/`` holds one safetensors shard per rank and
``manifest.json``, written last, that describes everything needed to verify and load
it: format version, step, world size, hash algorithm, every shard's size and checksum,
every tensor entry's shard, dtype, shape, absolute byte range and checksum, the typed
tree of the state (non-tensor values inline), the model-structure fingerprint, the
torch version and the creation time. A checkpoint of sharded tensors (DTensor) adds a
``dtensors`` section — global shape, dtype, placements and every piece's box — and is
format version 2 (:mod:`chaos.reference.ckptformat.dtensor`); one without is version 1, unchanged.

:func:`parse_manifest` trusts nothing: sizes are checked before reading, JSON with
duplicate keys, NaN or oversized numbers is refused, shard names must be plain file
names inside the directory, and entry byte ranges must fit dtype, shape and shard.
Every failure is a :class:`ManifestError` naming the file and the problem.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import torch

from chaos.reference.ckptformat import tree
from chaos.reference.ckptformat.dtensor import validate_section
from chaos.reference.ckptformat.errors import ManifestError
from chaos.reference.ckptformat.safeio import open_regular, read_upto

FORMAT = "chaos-ckpt"
FORMAT_VERSION = 1
# A checkpoint holding sharded tensors (a ``dtensors`` section, chaos.reference.ckptformat.dtensor)
# is version 2; one without stays version 1, byte for byte what it always was.
FORMAT_VERSION_SHARDED = 2
READABLE_VERSIONS = (FORMAT_VERSION, FORMAT_VERSION_SHARDED)
MANIFEST_NAME = "manifest.json"
MAX_DIM = 1 << 62
MAX_RANKS = 1 << 20
# ``\Z``, not ``$`` (which also matches before a trailing newline: "shard\n" would pass).
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\Z")

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
for _name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        DTYPES[_name] = getattr(torch, _name)
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ManifestError("<state>", f"tensor dtype {dtype} is not supported by the format") from None


def safe_json_loads(data: bytes, file: str) -> Any:
    """``json.loads`` that refuses duplicate keys, NaN/Infinity and oversized numbers."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise ManifestError(file, f"duplicate JSON key {k[:80]!r}")
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise ManifestError(file, f"non-finite JSON number {name}")

    def parse_int(text: str) -> int:
        if len(text) > 40:
            raise ManifestError(file, f"JSON integer with {len(text)} digits is out of range")
        return int(text)

    def parse_float(text: str) -> float:
        if len(text) > 64:
            raise ManifestError(file, "JSON number too long")
        value = float(text)
        if not math.isfinite(value):
            raise ManifestError(file, f"JSON number {text[:40]} overflows")
        return value

    try:
        text = data.decode("utf-8")
        return json.loads(
            text, object_pairs_hook=pairs, parse_constant=constant, parse_int=parse_int, parse_float=parse_float
        )
    except ManifestError:
        raise
    except UnicodeDecodeError as exc:
        raise ManifestError(file, f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(file, f"truncated or malformed JSON: {exc.msg} at char {exc.pos}") from None
    except (RecursionError, ValueError) as exc:
        raise ManifestError(file, f"malformed JSON: {type(exc).__name__}") from None


def check_name(name: Any, file: str, what: str) -> str:
    """A file name referenced from a manifest must be a plain name inside the directory."""
    if not isinstance(name, str):
        raise ManifestError(file, f"{what} name must be a string, got {type(name).__name__}")
    if name.startswith("/") or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        raise ManifestError(file, f"{what} {name[:120]!r} is an absolute path")
    if ".." in name.replace("\\", "/").split("/") or "/" in name or "\\" in name:
        raise ManifestError(file, f"{what} {name[:120]!r} escapes the checkpoint directory (path traversal)")
    if not SAFE_NAME.match(name) or name == MANIFEST_NAME:
        raise ManifestError(file, f"{what} {name[:120]!r} is not an allowed file name")
    return name


def structure_of(value: Any) -> dict[str, list]:
    """``{path: [dtype, shape]}`` of the tensor leaves of ``value`` (for fingerprints)."""
    out: dict[str, list] = {}
    tensors = tree.tensor_paths(value) if value is not None else {}
    for path, t in tensors.items():
        out[path] = [DTYPE_NAMES.get(t.dtype, str(t.dtype)), list(t.shape)]
    return out


def fingerprint_structure(structure: Mapping[str, list]) -> str:
    blob = json.dumps(sorted(structure.items()), separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _need(obj: Mapping, key: str, kind: type | tuple, file: str, where: str = "manifest") -> Any:
    if key not in obj:
        raise ManifestError(file, f"{where} lacks {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(file, f"{where} field {key!r} has the wrong type ({type(value).__name__})")
    return value


def validate_entry(name: str, e: Any, shards: Mapping[str, Any], file: str) -> None:
    where = f"entry {name[:120]!r}"
    if not isinstance(e, dict):
        raise ManifestError(file, f"{where} is not an object")
    shard = check_name(_need(e, "shard", str, file, where), file, f"{where} shard")
    if shard not in shards:
        raise ManifestError(file, f"{where} names unknown shard {shard!r}")
    dtype = _need(e, "dtype", str, file, where)
    if dtype not in DTYPES:
        raise ManifestError(file, f"{where} has unknown dtype {dtype[:40]!r}")
    shape = _need(e, "shape", list, file, where)
    if len(shape) > 64 or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < MAX_DIM for d in shape):
        raise ManifestError(file, f"{where} has an invalid shape {str(shape)[:80]}")
    offsets = _need(e, "offsets", list, file, where)
    if len(offsets) != 2 or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        raise ManifestError(file, f"{where} offsets must be [begin, end]")
    begin, end = offsets
    size = shards[shard]["size"]
    if not 0 <= begin <= end <= size:
        raise ManifestError(file, f"{where} byte range [{begin}, {end}) lies outside shard {shard} of {size} bytes")
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=DTYPES[dtype]).element_size()
    if numel * itemsize != end - begin:
        raise ManifestError(
            file, f"{where}: dtype {dtype} x shape {shape} needs {numel * itemsize} bytes but its range holds {end - begin}"
        )
    _need(e, "checksum", str, file, where)


def validate(m: Any, file: str, expect_step: int | None = None) -> dict[str, Any]:
    """Check a parsed manifest's schema and internal consistency; return it."""
    if not isinstance(m, dict):
        raise ManifestError(file, "manifest is not a JSON object")
    if m.get("format") != FORMAT:
        raise ManifestError(file, f"not a {FORMAT} manifest (format={str(m.get('format'))[:40]!r})")
    version = _need(m, "format_version", int, file)
    if version not in READABLE_VERSIONS:
        raise ManifestError(file, f"unsupported format version {version} (this reader knows {list(READABLE_VERSIONS)})")
    step = _need(m, "step", int, file)
    if step < 0:
        raise ManifestError(file, f"negative step {step}")
    if expect_step is not None and step != expect_step:
        raise ManifestError(file, f"manifest says step {step} but its directory is for step {expect_step}")
    world = _need(m, "world_size", int, file)
    if not 1 <= world <= MAX_RANKS:
        raise ManifestError(file, f"world size {world} out of range")
    _need(m, "hash", str, file)
    shards = _need(m, "shards", dict, file)
    for name, s in shards.items():
        check_name(name, file, "shard")
        if not isinstance(s, dict):
            raise ManifestError(file, f"shard {name!r} is not an object")
        size = _need(s, "size", int, file, f"shard {name!r}")
        if size < 8:
            raise ManifestError(file, f"shard {name!r} size {size} is too small for a safetensors file")
        rank = _need(s, "rank", int, file, f"shard {name!r}")
        if not 0 <= rank < world:
            raise ManifestError(file, f"shard {name!r} rank {rank} outside world size {world}")
        _need(s, "checksum", str, file, f"shard {name!r}")
    entries = _need(m, "entries", dict, file)
    for name, e in entries.items():
        validate_entry(name, e, shards, file)
    node = _need(m, "tree", dict, file)
    try:
        referenced = set(tree.iter_entries(node))
        sharded = set(tree.iter_dtensors(node))
    except (KeyError, TypeError, AttributeError, RecursionError):
        raise ManifestError(file, "tree is malformed") from None
    missing = sorted(referenced - set(entries))
    if missing:
        raise ManifestError(file, f"tree references undefined entr{'y' if len(missing) == 1 else 'ies'} {missing[:3]}")
    if sharded or "dtensors" in m:
        if version != FORMAT_VERSION_SHARDED:
            raise ManifestError(file, f"sharded tensors need format version {FORMAT_VERSION_SHARDED}, manifest says {version}")
        section = _need(m, "dtensors", dict, file)
        validate_section(section, entries, file)
        undefined = sorted(sharded - set(section))
        if undefined:
            raise ManifestError(file, f"tree references undefined dtensor(s) {undefined[:3]}")
    for key in ("model_structure", "optimizer_structure"):
        if key in m and not isinstance(m[key], dict):
            raise ManifestError(file, f"{key} must be an object")
    return m


def read_manifest(directory: str, expect_step: int | None = None, max_bytes: int = 256 * 1024 * 1024) -> dict[str, Any]:
    """Read and validate ``directory/manifest.json``; size is checked before reading.

    ``directory`` (a step directory) and the manifest are opened without following a
    link, and the manifest must be a regular file: a checkpoint tree is hostile input
    (:mod:`chaos.reference.ckptformat.safeio`). The directory's parent is taken as the root the
    caller chose. At most ``max_bytes + 1`` bytes are ever read.
    """
    directory = directory.rstrip(os.sep) or os.sep
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        f, st = open_regular(path, os.path.dirname(directory) or ".", ManifestError)
    except FileNotFoundError:
        raise ManifestError(path, "missing (the save never committed)") from None
    with f:
        if st.st_size > max_bytes:
            raise ManifestError(path, f"manifest of {st.st_size} bytes exceeds the {max_bytes}-byte limit")
        data = read_upto(f, st.st_size + 1)
    if len(data) > st.st_size:
        raise ManifestError(path, "manifest grew while being read")
    return validate(safe_json_loads(data, path), path, expect_step)


def encode_manifest(m: Mapping[str, Any]) -> bytes:
    return json.dumps(m, separators=(",", ":"), allow_nan=False).encode("utf-8")
