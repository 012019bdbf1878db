"""Which modules the interpreters of a job's attempts import before the job runs a line.

Why: a point of a torch script costs two interpreter starts and two ``import torch`` (the
run to the point and the resume), about 1.5-2 s each, none of it the job's own work. The
spares (``spares.py``) already start an attempt's interpreters while another attempt runs;
with the modules the job will import loaded before their gate as well, the job's own
``import torch`` is instant.

What is preloaded is read, not guessed: the job's tracer writes, at the rank's first file
event, the top-level modules imported since the job started and the environment variables
it changed meanwhile (``inproc.JobInterposer._write_imports``). ``explore.reference`` calls
:func:`choose` with the first fault-free run's record of rank 0; ``launch.job`` hands the
names to every attempt's boot path (``CHAOS_JOB_PRELOAD``), which imports them before the
gate (``boot/sitecustomize.py``). Only where that cannot change what the job does:

- modules of an installed distribution (a site- or dist-packages folder, a project's own
  ``.venv`` included), never the job's own code (its script's folder, its source tree: that
  would run it early), nor the standard library's (cheap, and imported by the others anyway);
- only when the job changed no environment variable before its first file event (a module
  may read one as it is imported: ``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES`` set by the
  script before ``import torch``); then nothing is preloaded and the note says why;
- only where spares are used (``job.can_prestart``: a Python COMMAND the harness launches
  itself), and never with ``--no-preload``.
"""

from __future__ import annotations

import glob
import json
import os

from chaos.model import contract as C
from chaos.model.jobspec import JobSpec

_NEVER = frozenset({"__main__", "sitecustomize", "usercustomize", "chaos", "faults", "reports"})


def _installed(path: str) -> bool:
    """A module file of an installed distribution (in any interpreter's site- or dist-packages)."""
    parts = os.path.realpath(path).split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


def choose(job: JobSpec, trace_dir: str, can_prestart: bool) -> tuple[tuple[str, ...], str | None]:
    """(modules to preload, sorted; a note for the user or None) from rank 0's record in ``trace_dir``."""
    if not job.preload or not can_prestart:
        return (), None
    found = sorted(glob.glob(os.path.join(glob.escape(trace_dir), C.IMPORTS_FILE.format(rank=0, attempt=0, pid="*"))))
    if not found:
        return (), None  # no file event: nothing to go by
    try:
        with open(found[0], encoding="utf-8") as f:
            record = json.loads(f.read(1 << 20))
        modules, changed = dict(record["modules"]), list(record["env_changed"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return (), f"no module is preloaded: the fault-free run's record of its imports is unreadable ({exc})"
    if changed:
        return (), (f"no module is preloaded in the interpreters started ahead of an attempt: the job set "
                    f"{', '.join(changed[:5])} before its first file event, which a module imported earlier "
                    "might read as it loads")
    names = [name for name, path in modules.items() if name not in _NEVER and not name.startswith("_")
             and isinstance(path, str) and _installed(path)]
    if not names:
        return (), None
    names.sort()
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return tuple(names), (f"preloaded before each attempt's gate, as the fault-free run had imported them by its "
                          f"first file event: {shown} (--no-preload: off)")


__all__ = ["choose"]
