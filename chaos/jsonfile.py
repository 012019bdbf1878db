"""Write a JSON document so that no reader ever sees half of it.

Called by everything that leaves JSON for another process or a later run to read: the
results file (``chaos.results``, ``chaos.job.results``: rewritten after every scenario,
so a CI step reading it mid-run must see a whole document), the golden-run cache
(``chaos.golden``) and the fault-point cache (``chaos.points``), which concurrent
sessions may share. The document goes to a temporary file beside the target, then
``os.replace`` swaps it in; the temporary file is removed if writing it fails (a value
JSON cannot encode), so a failed write leaves the old file and nothing else.
Standard library only: job mode imports it without torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | os.PathLike[str], doc: Any, *, indent: int | None = None,
                      default: Callable[[Any], Any] | None = None) -> None:
    """Replace ``path`` with ``doc`` as JSON in one step (its folder made if missing)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=indent, default=default)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: str | os.PathLike[str], what: str = "results") -> Any:
    """A JSON input (results, a report's data): any problem is one ConfigError naming the file.
    Called by ``reports.html.load_json`` and ``chaos repro``."""
    from chaos.errors import ConfigError

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} file {p}: {exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{p} is not valid JSON ({what}): {exc}") from None
