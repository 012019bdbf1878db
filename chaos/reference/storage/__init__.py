"""Storage backends for the reference checkpointer, chosen by URL.

``file:///path`` and plain paths: :class:`~chaos.reference.storage.posix.PosixStorage` (today's
POSIX commit protocol, unchanged). ``s3://bucket/prefix?endpoint_url=...``:
:class:`~chaos.reference.storage.s3.S3Storage` (conditional commit object). ``s3-local`` is not a
URL but a harness feature: :mod:`chaos.certify.local_s3` starts a moto server and hands
out ``s3://`` URLs pointing at it. Any other scheme fsspec knows (``memory://``,
``local:///abs``, ``gcs://`` ...): :class:`~chaos.reference.storage.fsspec_store.FsspecStorage`
(commit object written last; not exclusive). Every backend states its ``commit_protocol``.
S3 and fsspec share their read side (:mod:`chaos.reference.storage.objects`).

URLs are parsed strictly (:func:`~chaos.reference.storage.base.parse_url`): a ``scheme:`` without
``//`` is refused, never read as a relative path. This package sits below
``chaos.reference.checkpoint`` and never imports it; the format both use is :mod:`chaos.reference.ckptformat`.
"""

from __future__ import annotations

from typing import Any

from chaos.reference.storage.base import (
    CommitConflict,
    Storage,
    StorageConfigError,
    StorageError,
    StorageURL,
    parse_url,
)

__all__ = [
    "CommitConflict", "Storage", "StorageConfigError", "StorageError", "StorageURL",
    "as_storage", "load_wrapper", "open_storage", "parse_url", "wrap_storage",
]


def open_storage(url: str, local_dir: str | None = None) -> Any:
    """The backend for ``url``; ``local_dir`` is a private scratch dir (download cache)."""
    u = parse_url(url)
    if u.scheme == "file":
        from chaos.reference.storage.posix import PosixStorage

        return PosixStorage(u.location)
    if u.scheme == "s3":
        from chaos.reference.storage.s3 import S3Storage

        return S3Storage(u, local_dir)
    from chaos.reference.storage.fsspec_store import FsspecStorage

    return FsspecStorage(u, local_dir)  # any other scheme fsspec knows; unknown ones are refused there


def load_wrapper(spec: str) -> Any:
    """Resolve ``pkg.module:Class`` or ``path/file.py:Class`` (a storage wrapper factory)."""
    import importlib
    import importlib.util
    import os

    mod_name, sep, attr = str(spec).rpartition(":")
    if not sep or not mod_name or not attr:
        raise StorageConfigError(f"storage wrapper {spec!r}: expected module:Class or file.py:Class")
    try:
        if mod_name.endswith(".py"):
            path = os.path.abspath(mod_name)
            mspec = importlib.util.spec_from_file_location(f"_chaos_wrap_{abs(hash(path))}", path)
            if mspec is None or mspec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(mspec)
            mspec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
        return getattr(module, attr)
    except (ImportError, AttributeError, OSError, SyntaxError) as exc:
        raise StorageConfigError(f"storage wrapper {spec!r}: {type(exc).__name__}: {exc}") from None


def wrap_storage(store: Any, spec: str | None) -> Any:
    """Apply a wrapper (``Class(inner_storage)``) named by ``spec``; None: ``store`` unchanged.

    Why: certification must be able to test a deliberately broken variant of a backend
    end to end, in the rank processes too, so the wrapper travels as a checkpointer option.
    """
    return store if not spec else load_wrapper(spec)(store)


def as_storage(root: Any) -> Any:
    """A Storage as is; a path string becomes the POSIX backend (what older callers pass)."""
    if isinstance(root, str):
        from chaos.reference.storage.posix import PosixStorage

        return PosixStorage(root)
    return root
