"""Typed encoding of a state tree into JSON, and back, without pickle.

JSON alone loses the difference between ``0`` and ``"0"`` keys, tuples and lists, ints
and floats, and the exact bits of a float. Every node therefore carries its type
(``{"t": "int", "v": "3"}``), floats are stored as their 64 IEEE bits (so ``nan``
payloads, ``-0.0`` and ``inf`` survive) and ints as decimal strings (no precision
loss in other JSON readers). Tensors are replaced by references to manifest entries.

A DTensor leaf becomes ``{"t": "dtensor", "key": path}``: its pieces are described in
the manifest's ``dtensors`` section (:mod:`chaos.reference.ckptformat.dtensor`), not by one entry.

Nodes that differ between ranks are merged into ``{"t": "per_rank", "values": [...]}``
at the shallowest point where they differ, so identical values are stored once.
Decoding validates every node: a hostile manifest yields :class:`ManifestError`,
never a crash or a huge allocation.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from chaos.reference.ckptformat.dtensor import is_dtensor
from chaos.reference.ckptformat.errors import ManifestError, UnsupportedValueError

MAX_DEPTH = 200
MAX_INT_DIGITS = 1000
LEAF_KINDS = ("none", "bool", "int", "float", "str", "bytes", "npscalar")


def _escape(key: str) -> str:
    return key.replace("%", "%25").replace("/", "%2F").replace("[", "%5B").replace("@", "%40")


def render_key(key: Any) -> str:
    """Path component of a key; int ``0`` renders as ``[0]``, str ``"0"`` as ``0``."""
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        return "{" + type(key).__name__ + ":" + _escape(str(key)) + "}"
    if isinstance(key, int):
        return f"[{key}]"
    return _escape(key)


def join(prefix: str, part: str) -> str:
    return f"{prefix}/{part}" if prefix else part


def _encode_leaf(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {"t": "none"}
    if isinstance(value, bool):
        return {"t": "bool", "v": value}
    if isinstance(value, int):
        return {"t": "int", "v": str(value)}
    if isinstance(value, float):
        return {"t": "float", "v": repr(value), "bits": struct.pack(">d", value).hex()}
    if isinstance(value, str):
        return {"t": "str", "v": value}
    if isinstance(value, (bytes, bytearray)):
        return {"t": "bytes" if isinstance(value, bytes) else "bytearray", "v": bytes(value).hex()}
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return {"t": "npscalar", "dtype": value.dtype.str, "v": value.tobytes().hex()}
    raise UnsupportedValueError(
        f"state path {path or '<root>'}: cannot store a {type(value).__module__}.{type(value).__qualname__} "
        "without pickle (supported: tensors, numpy arrays, dict/list/tuple, int, float, bool, None, str, bytes)"
    )


def encode(state: Any, path: str = "", tensors: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return ``(node, tensors)``: the typed skeleton and ``{path: tensor}`` of its tensor leaves.

    Numpy arrays are carried as tensors and restored as arrays.
    """
    if tensors is None:
        tensors = {}
    if isinstance(state, torch.Tensor):
        tensors[path] = state
        return {"t": "dtensor" if is_dtensor(state) else "tensor", "path": path}, tensors
    if isinstance(state, np.ndarray):
        if state.dtype.kind not in "biufc":
            raise UnsupportedValueError(f"state path {path}: numpy dtype {state.dtype} is not storable")
        tensors[path] = torch.from_numpy(np.ascontiguousarray(state))
        return {"t": "ndarray", "path": path}, tensors
    if isinstance(state, Mapping):
        items = []
        for key, value in state.items():
            knode = _encode_leaf(key, path)
            vnode, _ = encode(value, join(path, render_key(key)), tensors)
            items.append([knode, vnode])
        return {"t": "dict", "items": items}, tensors
    if isinstance(state, (list, tuple)):
        kind = "tuple" if isinstance(state, tuple) else "list"
        return {"t": kind, "items": [encode(v, f"{path}[{i}]", tensors)[0] for i, v in enumerate(state)]}, tensors
    return _encode_leaf(state, path), tensors


def tensor_paths(state: Any, path: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{path: tensor}`` exactly as :func:`encode` names them, without building the skeleton.

    Structure checks at load time only need paths, dtypes and shapes; skipping the
    typed leaf encoding makes them several times cheaper, which matters when
    crash-state exploration loads thousands of times.
    """
    if out is None:
        out = {}
    if isinstance(state, torch.Tensor):
        out[path] = state
    elif isinstance(state, np.ndarray):
        out[path] = torch.from_numpy(np.ascontiguousarray(state))
    elif isinstance(state, Mapping):
        for key, value in state.items():
            tensor_paths(value, join(path, render_key(key)), out)
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            tensor_paths(v, f"{path}[{i}]", out)
    return out


def resolve(node: Any, entry_of: Callable[[str], str]) -> Any:
    """Replace ``path`` references of tensor nodes by manifest entry names."""
    t = node["t"]
    if t in ("tensor", "ndarray"):
        return {"t": t, "entry": entry_of(node["path"])}
    if t == "dtensor":
        return {"t": t, "key": node["path"]}
    if t in ("list", "tuple"):
        return {"t": t, "items": [resolve(n, entry_of) for n in node["items"]]}
    if t == "dict":
        return {"t": t, "items": [[k, resolve(v, entry_of)] for k, v in node["items"]]}
    return node


def merge(nodes: list[Any]) -> Any:
    """One node for all ranks; where ranks differ, a ``per_rank`` node lists each rank's."""
    first = nodes[0]
    if all(n == first for n in nodes[1:]):
        return first
    kinds = {n["t"] for n in nodes}
    if len(kinds) == 1 and first["t"] in ("list", "tuple") and len({len(n["items"]) for n in nodes}) == 1:
        return {"t": first["t"], "items": [merge([n["items"][i] for n in nodes]) for i in range(len(first["items"]))]}
    if len(kinds) == 1 and first["t"] == "dict":
        keys = [k for k, _ in first["items"]]
        if all([k for k, _ in n["items"]] == keys for n in nodes):
            items = [[k, merge([n["items"][i][1] for n in nodes])] for i, k in enumerate(keys)]
            return {"t": "dict", "items": items}
    return {"t": "per_rank", "values": nodes}


def _leaves(node: Any, kinds: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Every node of one of ``kinds`` under a (resolved, merged) node, in order."""
    t = node.get("t") if isinstance(node, dict) else None
    if t in kinds:
        yield node
    elif t in ("list", "tuple"):
        for n in node["items"]:
            yield from _leaves(n, kinds)
    elif t == "dict":
        for _, v in node["items"]:
            yield from _leaves(v, kinds)
    elif t == "per_rank":
        for n in node["values"]:
            yield from _leaves(n, kinds)


def iter_dtensors(node: Any) -> Iterator[str]:
    """Every ``dtensors`` key a (resolved, merged) node references."""
    return (n["key"] for n in _leaves(node, ("dtensor",)))


def iter_entries(node: Any) -> Iterator[str]:
    """Every entry name a (resolved, merged) node references."""
    return (n["entry"] for n in _leaves(node, ("tensor", "ndarray")))


class Decoder:
    """Rebuild a state for one rank from a validated tree.

    ``load(entry) -> tensor`` supplies tensors; ``fallback(path)`` supplies the template's
    value where a per-rank node has no value for this rank (loading at a larger world
    size) and returns ``(found, value)``; ``load_dtensor(key, path)`` assembles this
    rank's part of a sharded tensor (a checkpoint without any needs none).
    """

    def __init__(
        self,
        file: str,
        rank: int,
        load: Callable[[str], torch.Tensor],
        fallback: Callable[[str], tuple[bool, Any]] | None = None,
        load_dtensor: Callable[[str, str], Any] | None = None,
    ) -> None:
        self.file = file
        self.rank = rank
        self.load = load
        self.fallback = fallback
        self.load_dtensor = load_dtensor
        self.kept_from_template: list[str] = []

    def _bad(self, path: str, problem: str) -> ManifestError:
        return ManifestError(self.file, f"tree at {path or '<root>'}: {problem}")

    def _field(self, node: dict, name: str, kind: type, path: str) -> Any:
        if name not in node:
            raise self._bad(path, f"node lacks field {name!r}")
        value = node[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self._bad(path, f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
        return value

    def _leaf(self, node: dict, t: str, path: str) -> Any:
        if t == "none":
            return None
        if t == "bool":
            return self._field(node, "v", bool, path)
        if t == "int":
            text = self._field(node, "v", str, path)
            body = text[1:] if text.startswith("-") else text
            if not body.isdigit() or not body.isascii() or len(body) > MAX_INT_DIGITS:
                raise self._bad(path, f"malformed or oversized int {text[:40]!r}")
            return int(text)
        if t == "float":
            bits = self._field(node, "bits", str, path)
            try:
                raw = bytes.fromhex(bits)
            except ValueError:
                raw = b""
            if len(raw) != 8:
                raise self._bad(path, f"float bits must be 16 hex digits, got {bits[:40]!r}")
            return struct.unpack(">d", raw)[0]
        if t == "str":
            return self._field(node, "v", str, path)
        if t in ("bytes", "bytearray"):
            try:
                raw = bytes.fromhex(self._field(node, "v", str, path))
            except ValueError:
                raise self._bad(path, "bytes value is not hex") from None
            return raw if t == "bytes" else bytearray(raw)
        if t == "npscalar":
            try:
                dtype = np.dtype(self._field(node, "dtype", str, path))
                raw = bytes.fromhex(self._field(node, "v", str, path))
            except (TypeError, ValueError):
                raise self._bad(path, "malformed numpy scalar") from None
            if dtype.kind not in "biufc" or len(raw) != dtype.itemsize:
                raise self._bad(path, f"numpy scalar of dtype {dtype} with {len(raw)} bytes")
            return np.frombuffer(raw, dtype=dtype)[0]
        raise self._bad(path, f"unknown node type {t!r}")

    def decode(self, node: Any, path: str = "", depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise self._bad(path, f"nesting deeper than {MAX_DEPTH}")
        if not isinstance(node, dict) or not isinstance(node.get("t"), str):
            raise self._bad(path, "node is not a typed object")
        t = node["t"]
        if t in ("tensor", "ndarray"):
            entry = self._field(node, "entry", str, path)
            tensor = self.load(entry)
            return tensor.numpy() if t == "ndarray" else tensor
        if t == "dtensor":
            key = self._field(node, "key", str, path)
            if self.load_dtensor is None:
                raise self._bad(path, "sharded tensor in a checkpoint without a dtensors section")
            return self.load_dtensor(key, path)
        if t in ("list", "tuple"):
            items = self._field(node, "items", list, path)
            out = [self.decode(n, f"{path}[{i}]", depth + 1) for i, n in enumerate(items)]
            return tuple(out) if t == "tuple" else out
        if t == "dict":
            result: dict[Any, Any] = {}
            for pair in self._field(node, "items", list, path):
                if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], dict):
                    raise self._bad(path, "dict item is not a [key, value] pair")
                kt = pair[0].get("t")
                if kt not in LEAF_KINDS:
                    raise self._bad(path, f"dict key of type {kt!r} is not allowed")
                key = self._leaf(pair[0], kt, path)
                if key in result:
                    raise self._bad(path, f"duplicate key {key!r}")
                result[key] = self.decode(pair[1], join(path, render_key(key)), depth + 1)
            return result
        if t == "per_rank":
            values = self._field(node, "values", list, path)
            if self.rank < len(values):
                return self.decode(values[self.rank], path, depth + 1)
            if self.fallback is not None:
                found, value = self.fallback(path)
                if found:
                    self.kept_from_template.append(path)
                    return value
            raise self._bad(path, f"per-rank value saved by {len(values)} rank(s) has none for rank {self.rank} and the template has no value there")
        return self._leaf(node, t, path)


def template_index(template: Any) -> dict[str, Any]:
    """Every node of ``template`` by its rendered path (for per-rank fallbacks and devices)."""
    out: dict[str, Any] = {}

    def walk(value: Any, path: str) -> None:
        out[path] = value
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, join(path, render_key(k)))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")

    walk(template, "")
    return out

