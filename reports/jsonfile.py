"""Write a JSON document so that no reader ever sees half of it; read one that may come from anyone.

Called by everything that leaves JSON for another process or a later run to read: the
results file (``chaos.run.results``, ``chaos.run.jobresults``: rewritten after every scenario,
so a CI step reading it mid-run must see a whole document), the golden-run cache
(``chaos.record.golden``) and the fault-point cache (``chaos.record.points``), which concurrent
sessions may share. The document goes to a temporary file beside the target, then
``os.replace`` swaps it in; the temporary file is removed if writing it fails (a value
JSON cannot encode), so a failed write leaves the old file and nothing else. The
reports (``reports.junit``, ``reports.html``) are written the same way through
:func:`atomic_file`. ``mkstemp`` makes its file 0600 whatever the umask says, so
:func:`atomic_file` gives it the mode a plain ``open`` would (``0666 & ~umask``): a
results file or report meant for a CI artifact or a colleague is as readable as any
other file this user writes.

:func:`read_json` is the one reader of JSON inputs (results, annotations, a report's
extras), which may come from a CI artifact, i.e. from someone else: it refuses what is
not a regular file before it can block (a FIFO) or never end (``/dev/zero``), reads at
most :data:`MAX_JSON_BYTES`, and refuses nesting deeper than :data:`MAX_JSON_DEPTH`, so
that no reader further on meets a RecursionError. Every refusal is a ``ConfigError``
naming the file. Standard library only: job mode imports it without torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

# The largest JSON input read, in bytes. A built-in campaign's results weigh ~40 kB a
# scenario and a job's ~6 kB a point (2026-12), so this holds about 1,500 scenarios or
# 10,000 points; a bigger file is refused at once instead of costing minutes and
# gigabytes of memory to parse.
MAX_JSON_BYTES = 64 * 1024 * 1024
# The deepest nesting read. Results written by chaos are about 12 levels deep; evidence
# is rendered recursively (json.dumps with indent, jinja), which a deeper document could
# turn into a RecursionError.
MAX_JSON_DEPTH = 64


def current_umask() -> int:
    """This process's umask, without changing it for other threads where Linux can tell (``/proc``)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it (and put it back at once)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8",
                errors: str | None = None) -> Iterator[IO[Any]]:
    """An open temporary file beside ``path`` that replaces ``path`` when the block ends without an error.

    Its folder is made if missing; its mode is what ``open`` would give under the umask.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        binary = "b" in mode
        with os.fdopen(fd, mode, encoding=None if binary else encoding, errors=None if binary else errors) as f:
            yield f
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike[str], doc: Any, *, indent: int | None = None,
                      default: Callable[[Any], Any] | None = None) -> None:
    """Replace ``path`` with ``doc`` as JSON in one step (its folder made if missing)."""
    with atomic_file(path) as f:
        json.dump(doc, f, indent=indent, default=default)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def read_regular(path: str | os.PathLike[str], what: str = "results", max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``max_bytes``; ConfigError naming it otherwise.

    Opened without blocking (a FIFO's open would wait for a writer), then checked on the
    open descriptor (a symlink is followed, to a regular file only), then read to at most
    ``max_bytes`` + 1 bytes whatever its size claims (a ``/proc`` file says 0).
    """
    from faults.errors import ConfigError

    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found: {p}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file {p}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "something else")
            raise ConfigError(f"{p}: refusing to read a {what} file that is {kind}, not a regular file")
        raise ConfigError(f"{p}: the {what} file is {st.st_size / 2**20:.1f} MiB, over the "
                          f"{max_bytes / 2**20:g} MiB a {what} file may have (MAX_JSON_BYTES)")
    with os.fdopen(fd, "rb", buffering=0) as f:
        chunks, got = [], 0
        try:
            while got <= max_bytes:
                chunk = f.read(min(1 << 20, max_bytes + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except OSError as exc:
            raise ConfigError(f"cannot read {what} file {p}: {exc.strerror or exc}") from None
        if got > max_bytes:
            raise ConfigError(f"{p}: the {what} file is over the {max_bytes / 2**20:g} MiB a {what} file may have "
                              "(MAX_JSON_BYTES)")
    return b"".join(chunks)


def _too_deep(doc: Any, limit: int) -> str | None:
    """The JSON path of a container nested deeper than ``limit``, else None.

    A walk without recursion; each container carries its key and its parent's trail
    (``(parent_trail, key)``), so a path is only spelt out for the one reported.
    """
    stack: list[tuple[Any, int, Any]] = [(doc, 1, None)]
    while stack:
        node, depth, trail = stack.pop()
        if depth > limit:
            keys = []
            while trail is not None:
                trail, key = trail
                keys.append(f"[{key}]" if isinstance(key, int) else f".{key}")
            return "$" + "".join(reversed(keys))
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((v, depth + 1, (trail, k)) for k, v in items if isinstance(v, dict | list))
    return None


def read_json(path: str | os.PathLike[str], what: str = "results", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A JSON input (results, a report's data, annotations): any problem is one ConfigError naming the file.
    Called by ``chaos.model.resultschema.load_results``, ``reports.html.load_json`` and ``chaos.cli.findings``."""
    from faults.errors import ConfigError

    p = Path(path)
    raw = read_regular(p, what, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read {what} file {p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{p} is not valid JSON ({what}): nested deeper than it can be parsed "
                          f"(a {what} file is at most {MAX_JSON_DEPTH} levels deep)") from None
    except ValueError as exc:
        raise ConfigError(f"{p} is not valid JSON ({what}): {exc}") from None
    deep = _too_deep(doc, MAX_JSON_DEPTH)
    if deep is not None:
        raise ConfigError(f"{p}: {deep[:300]} is nested more than {MAX_JSON_DEPTH} levels deep (MAX_JSON_DEPTH); "
                          f"a {what} file written by chaos is about 12")
    return doc
