"""Crash a process at the Nth *mutating* storage operation of a save.

Why: atomicity is a statement about every point a save can stop at. Enumerating the
mutating operations (file writes, fsyncs, renames, mkdirs, unlinks on POSIX; PUT, part
upload, complete, delete requests on S3) and killing the process (``os._exit``: no
``finally``, no buffered flush) before each one in turn reaches every intermediate
state the backend can be left in, deterministically. Python-level I/O only: a backend
doing its I/O in C is reported as having too few points, never silently passed.
"""

from __future__ import annotations

import builtins
import os
import signal
import time
from collections.abc import Callable
from typing import Any

CRASH_RC = 86
S3_MUTATING = {"PutObject", "UploadPart", "CompleteMultipartUpload", "CreateMultipartUpload",
               "DeleteObject", "DeleteObjects", "AbortMultipartUpload", "CopyObject"}


class Counter:
    """Counts mutating operations; with ``crash_at`` set, dies before operation number ``crash_at``."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.crash_at = crash_at
        self.ops: list[str] = []

    def tick(self, what: str) -> None:
        if self.crash_at is not None and len(self.ops) + 1 >= self.crash_at:
            os._exit(CRASH_RC)
        self.ops.append(what)


class _File:
    def __init__(self, f: Any, counter: Counter, path: str) -> None:
        self._f, self._c, self._path = f, counter, path

    def write(self, data: Any) -> int:
        self._c.tick(f"write {os.path.basename(self._path)}")
        return self._f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _File:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.__exit__(*exc)

    def __iter__(self) -> Any:
        return iter(self._f)


def install(counter: Counter) -> Callable[[], None]:
    """Patch os/builtins and botocore so every mutating op ticks ``counter``; returns the undo."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str, wrapper: Callable[[Any], Any]) -> None:
        orig = getattr(obj, name)
        saved.append((obj, name, orig))
        setattr(obj, name, wrapper(orig))

    for name in ("rename", "replace", "fsync", "mkdir", "unlink", "rmdir"):
        def make(orig: Any, name: str = name) -> Any:
            def inner(*a: Any, **k: Any) -> Any:
                counter.tick(f"{name} {os.path.basename(str(a[0])) if a else ''}")
                return orig(*a, **k)
            return inner
        patch(os, name, make)

    def open_wrapper(orig: Any) -> Any:
        def inner(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
            f = orig(file, mode, *a, **k)
            if any(c in mode for c in "wax+") and not isinstance(file, int):
                counter.tick(f"open {os.path.basename(str(file))}")
                return _File(f, counter, str(file))
            return f
        return inner

    patch(builtins, "open", open_wrapper)
    try:
        import botocore.client

        def api_wrapper(orig: Any) -> Any:
            def inner(self: Any, operation_name: str, params: dict[str, Any]) -> Any:
                if operation_name in S3_MUTATING:
                    counter.tick(f"{operation_name} {str(params.get('Key', ''))[-60:]}")
                return orig(self, operation_name, params)
            return inner

        patch(botocore.client.BaseClient, "_make_api_call", api_wrapper)
    except ImportError:
        pass

    def undo() -> None:
        for obj, name, orig in reversed(saved):
            setattr(obj, name, orig)

    return undo


def run_crashing(fn: Callable[[], None], crash_at: int | None, timeout_s: float = 60.0,
                 patch: Callable[[Counter], object] | None = None) -> tuple[str, list[str]]:
    """Run ``fn`` in a forked child that dies before mutating op ``crash_at``.

    ``patch`` makes the child's operations tick the counter (default :func:`install`:
    os, builtins and botocore; ``dcp_fsspec`` passes its s3fs one). Returns (outcome,
    ops) with outcome ``crashed`` | ``completed`` | ``failed`` | ``hung``; ``ops`` (the
    ops done before the end) only when counting (``crash_at`` None).
    """
    try:  # imported here, once, not in every child (half a second each)
        import botocore.client  # noqa: F401
    except ImportError:
        pass
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        rc = 0
        counter = Counter(crash_at)
        try:
            (patch or install)(counter)
            fn()
        except BaseException:  # noqa: BLE001 - the parent only needs the outcome
            rc = 3
        try:
            os.write(w, "\n".join(counter.ops).encode()[: 60000])
        finally:
            os._exit(rc)
    os.close(w)
    deadline = time.monotonic() + timeout_s
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        return "hung", []
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    code = os.waitstatus_to_exitcode(status)
    outcome = {CRASH_RC: "crashed", 0: "completed"}.get(code, "failed")
    return outcome, [x for x in data.decode(errors="replace").split("\n") if x]
