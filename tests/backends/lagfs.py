"""An fsspec filesystem whose listings lag for every client but the one that wrote.

Why: a backend can be read-your-writes for one client and eventually consistent for
every other one (a client-side write-back or listing cache, a gateway per connection).
A certification whose "fresh" reader is really the writer's cached fsspec instance
would pass such a backend; :class:`ClientLaggingMemoryFS` makes that hole testable.
It is ``memory://`` with its own store, registered as ``lagmem://`` by :func:`register`;
each *instance* is one client: the files it wrote are listed at once, another client's
only ``LAG_S`` seconds after they were created.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import fsspec
from fsspec.implementations.memory import MemoryFileSystem

PROTOCOL = "lagmem"


class ClientLaggingMemoryFS(MemoryFileSystem):
    protocol = (PROTOCOL,)
    store: ClassVar[dict[str, Any]] = {}  # not memory://'s store
    pseudo_dirs: ClassVar[list[str]] = [""]
    LAG_S = 3.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.written: set[str] = set()  # paths this client wrote: listed at once

    def _mark(self, path: str) -> None:
        self.written.add(self._strip_protocol(path))

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if any(c in mode for c in "wxa+"):
            self._mark(path)
        return super()._open(path, mode, *args, **kwargs)

    def pipe_file(self, path: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        self._mark(path)
        return super().pipe_file(path, value, *args, **kwargs)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> Any:
        self._mark(path2)
        return super().cp_file(path1, path2, **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        now = time.time()
        entries = [e for e in super().ls(path, detail=True, **kwargs)
                   if e["type"] != "file" or e["name"] in self.written or now - e["created"] > self.LAG_S]
        return entries if detail else [e["name"] for e in entries]


def register() -> None:
    """Make ``lagmem://`` known to fsspec in this process."""
    fsspec.register_implementation(PROTOCOL, ClientLaggingMemoryFS, clobber=True)


def clear() -> None:
    ClientLaggingMemoryFS.store.clear()
    ClientLaggingMemoryFS.pseudo_dirs[:] = [""]
