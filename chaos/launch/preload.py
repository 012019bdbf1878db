"""Which modules the interpreters of a job's attempts import before the job runs a line.

Why: a point of a torch script costs two interpreter starts and two ``import torch`` (the
run to the point and the resume), about 1.5-2 s each, none of it the job's own work. The
spares (``spares.py``) already start an attempt's interpreters while another attempt runs;
with the modules the job will import loaded before their gate as well, the job's own
``import torch`` is instant.

What is preloaded is read, not guessed: the job's tracer writes, at the rank's first file
event, the top-level modules imported since the job started and the environment variables
it changed meanwhile, with their values (``inproc.JobInterposer._write_imports``); and, at
each later file event, the modules the job's calls imported since, each the outermost import
of its chain. A library's submodule imported only when first called is not brought by
importing the library: torch.optim's first optimizer imports ``torch._dynamo`` and sympy,
1.3 s of the 2.1 s a forked attempt of a plain torch script took before they were named.
``explore.reference`` calls :func:`choose` with the first fault-free run's record of rank 0;
``launch.job`` hands the names, in the order the job imported them, to every attempt's boot
path (``CHAOS_JOB_PRELOAD``), which imports them before the gate (``boot/sitecustomize.py``),
or to the exploration's zygote (``zygote.py``), which imports them once and forks each
attempt. Only where that cannot change what the job does:

- modules of an installed distribution (a site- or dist-packages folder, a project's own
  ``.venv`` included), never the job's own code (its script's folder, its source tree: that
  would run it early), nor the standard library's (cheap, and imported by the others anyway);
- only modules the job imported before it changed any environment variable, its calls'
  imports included however late (a module may read one as it is imported:
  ``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES`` set by the script before ``import torch``;
  the tracer's audit hook notes which came after a change, and those the job imports
  itself), but for a call's import after a change that read none of the changed variables
  (the fault-free run's tracer sees every read of ``os.environ``) and loaded no native code,
  whose reads it cannot see (``fsdp2_dcp.py``'s optimizer imports ``torch._dynamo`` after
  the script set ``MASTER_*`` for its own rendezvous); where it changed one before any of them (or the
  record does not say which came when), no spare preloads anything and the note says why,
  and a zygote only if importing the modules alone sets each such variable to the value the
  job had (a library that sets one as it loads, as Lightning does: :class:`Choice`);
- a module whose import made a traced file event (torch._dynamo's makes torch's cache
  folder in the temp dir) is preloaded too, but an attempt that has it loaded does not make
  that event: the record says which events were made inside which imports (``io_at_import``),
  and the attempt's tracer skips their ordinals (``JobSpec.import_events``), so its later
  events keep the fault-free trace's numbers, which name the points (a point at such an
  event runs in a fresh interpreter: ``explore.run_chain``). Only for a one-process job:
  with several copies, modules whose import made an event are not preloaded;
- only where spares are used (``job.can_prestart``: a Python COMMAND the harness launches
  itself), and never with ``--no-preload``.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from dataclasses import dataclass
from typing import Any

from chaos.model import contract as C
from chaos.model.jobspec import JobSpec

_NEVER = frozenset({"__main__", "sitecustomize", "usercustomize", "chaos", "faults", "reports"})


def _installed(path: str) -> bool:
    """A module file of an installed distribution (in any interpreter's site- or dist-packages)."""
    parts = os.path.realpath(path).split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


@dataclass(frozen=True)
class Choice:
    """What ``choose`` found. ``modules``: preloaded wherever attempts start ahead (spares, a
    zygote). ``zygote_only`` with ``env``: the job had changed those variables by its first file
    event, so only a zygote may preload them, and only if importing them sets each one exactly so
    (``env``: name -> value, None for unset; the zygote checks after its preload)."""

    modules: tuple[str, ...] = ()
    note: str | None = None
    zygote_only: tuple[str, ...] = ()
    env: tuple[tuple[str, str | None], ...] = ()
    import_events: tuple[tuple[int, tuple[str, ...]], ...] = ()  # JobSpec.import_events


def choose(job: JobSpec, trace_dir: str, can_prestart: bool) -> Choice:
    """What to preload, from rank 0's record in ``trace_dir`` (modules in the order the job imported them),
    with the record's file events made inside imports (``Choice.import_events``)."""
    if not job.preload or not can_prestart:
        return Choice()
    try:
        record = _read(trace_dir)
    except (OSError, ValueError) as exc:
        return Choice(note=f"no module is preloaded: the fault-free run's record of its imports is unreadable ({exc})")
    if record is None:
        return Choice()  # no file event: nothing to go by
    found = _choose(record)
    if not (found.modules or found.zygote_only):
        return found
    events = _import_events(record)
    if job.ranks is None and not job.torchrun and not job.nodes:
        return dataclasses.replace(found, import_events=events)
    # Several copies: rank 0's numbers would not be the others'. Nothing whose import made an event.
    busy = {m for _, mods in events for m in mods}
    return dataclasses.replace(found, modules=tuple(m for m in found.modules if m not in busy),
                               zygote_only=tuple(m for m in found.zygote_only if m not in busy))


def _import_events(record: Any) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """The record's ``io_at_import``: (ordinal, modules being imported, outermost first) per event."""
    try:
        events = record.get("io_at_import") if isinstance(record, dict) else None
        return tuple((int(n), tuple(str(m) for m in mods)) for n, mods in (events or []))
    except (ValueError, TypeError):
        return ()


def _read(trace_dir: str) -> Any:
    """Rank 0's imports record in ``trace_dir`` as parsed (None: there is none)."""
    found = sorted(glob.glob(os.path.join(glob.escape(trace_dir), C.IMPORTS_FILE.format(rank=0, attempt=0, pid="*"))))
    if not found:
        return None
    with open(found[0], encoding="utf-8") as f:
        return json.loads(f.read(1 << 22))


def _choose(record: Any) -> Choice:
    """What to preload by the record's modules, calls and environment changes (``choose``)."""
    try:
        modules, changed = dict(record["modules"]), [str(k) for k in record["env_changed"]]
        values = record.get("env_values")
        env = None if not isinstance(values, dict) else tuple(
            (str(k), None if values.get(k) is None else str(values[k])) for k in changed)
    except (ValueError, KeyError, TypeError) as exc:
        return Choice(note=f"no module is preloaded: the fault-free run's record of its imports is unreadable ({exc})")
    names = [name for name, path in modules.items() if name not in _NEVER and not name.startswith("_")
             and isinstance(path, str) and _installed(path)]
    late = record.get("imported_after_change") if isinstance(record, dict) else None
    late_packages = {str(x) for x in late} if isinstance(late, list) else set()
    early = [n for n in names if n not in late_packages] if isinstance(late, list) else []
    # A call's import after the job changed a variable (at its first file event or later) that may
    # have read it is the job's own to import; one that read none loads alike before the change.
    calls = [n for n, after, clean in _calls(record.get("calls")) if n not in names and (clean or not after)]
    names += calls
    if early:  # a call whose package the job imported before its change; else a zygote may check (below)
        early += [n for n in calls if n.partition(".")[0] not in late_packages]
    if changed and early:
        # Imported before the job changed anything: they loaded with the environment they load with here.
        # The others are left for the job to import itself, after its change, as in a fresh interpreter.
        return Choice(tuple(early), (f"preloaded before each attempt's gate, as the fault-free run had imported them "
                                     f"by its first file event, before it set {', '.join(changed[:5])}: "
                                     f"{shown(early)} (--no-preload: off)"))
    if changed:
        refused = (f"no module is preloaded in the interpreters started ahead of an attempt: the job set "
                   f"{', '.join(changed[:5])} before its first file event, which a module imported earlier "
                   "might read as it loads")
        if env is None or not names:  # a record from before values were kept: nothing to check against
            return Choice(note=refused)
        return Choice(note=refused, zygote_only=tuple(names), env=env)
    if not names:
        return Choice()
    return Choice(tuple(names), (f"preloaded before each attempt's gate, as the fault-free run had imported them by "
                                 f"its first file event: {shown(names)} (--no-preload: off)"))


def _calls(entries: object) -> list[tuple[str, bool, bool]]:
    """The modules the job's own calls imported (the record's ``calls``), in order, of installed
    distributions: a library's submodule that it imports only when first called is not brought
    by importing the library, so it is named. Each as (name, imported after an environment
    change, clean): clean where the entry says its import read none of the variables the job had
    changed by then and loaded no native code (``inproc.JobInterposer._call_entry``: name, file,
    after, variables read, native), so it loads alike before the job's change; an entry of three
    (a record from before those were kept) is not clean."""
    if not isinstance(entries, list):
        return []  # a record from before calls were kept
    found: list[tuple[str, bool, bool]] = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) in (3, 5) and isinstance(entry[0], str)
                and isinstance(entry[1], str) and _installed(entry[1])):
            continue
        top = entry[0].partition(".")[0]
        if top not in _NEVER and not top.startswith("_") and entry[0] not in {n for n, _, _ in found}:
            clean = len(entry) == 5 and entry[3] == [] and entry[4] is False
            found.append((entry[0], bool(entry[2]), clean))
    return found


def shown(names: tuple[str, ...] | list[str]) -> str:
    """Module names for a note: the first eight, then how many more."""
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


__all__ = ["Choice", "choose", "shown"]
