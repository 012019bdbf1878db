"""The built-in ``ckpt:stepS:KIND`` in a user's job: a file of the newest checkpoint, struck at rest.

The built-in workload's at-rest faults (``ckpt:step8:bitflip,bits=16,region=data,seed=1``,
``ckpt:step8:payload,format=pickle``, ``truncate``, ``zero``, ``delete``, ``stale``, ``swap``)
strike "the newest checkpoint" once every rank reached step S. In a job (``chaos run --as-job
--fault ...``, or the replay of a built-in result) the point halts every copy when rank 0
announces step S (``chaos.target.job.inproc``); then, with every copy stopped,
:func:`newest_files` reads which files under {out} are the newest checkpoint's from the halted
attempt's own traces, :func:`choose` draws the target with the fault's seed, and :func:`apply`
makes the built-in fault's own edit of it: the corruptions through ``faults.corrupt``'s plan with
the fault's settings (what :func:`edit` does for the built-in environment too, one code path),
a payload in the fault's format (``chaos.nemesis.payload.plant``, with its marker), a stale copy
and a swap through those families' own edits of the chosen file.

Which files are the newest checkpoint's: every file present at the halt is dated by the save
its last completion (a close of it, or a rename of it or of a directory holding it) belongs to
(``sites.save_steps``); the newest is the latest such save at or before step S. Not the newest
the job acknowledged: a job acknowledges lazily (the built-in workload at its next save), so at
step 8 of a run saving every 3 steps that would be step 3's. The built-in workload lets its
async save finish before it is struck; a job's async save still in flight at step S is the
newest here (its files under their temporary names), so aim such a fault at a step after it
committed, or with ``file=GLOB``, which narrows the files (matched against the path under {out}
or the file's name). Unlike the built-in environment no fault-free load is traced, so the draw
is among all those files.

Called by ``chaos.run.explore`` (``_at_rest``) for a point with ``Point.builtin`` and by
``chaos.nemesis.environment`` (:func:`edit`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import os
import random
from typing import Any

from chaos.model.fault import Fault
from chaos.model.grammar import parse_fault
from chaos.model.jobspec import Point
from chaos.nemesis import atrest, corrupt, payload, stale, swap
from chaos.nemesis.atrest import Applied
from chaos.nemesis.sites import Traces, op_records, save_steps
from faults import FaultError
from faults import corrupt as C


def newest_files(out: str, traces: Traces, upto: int) -> tuple[int | None, list[str]]:
    """(the newest checkpoint's step, its files under {out} now, relative and sorted); (None, []) where no
    save at or before ``upto`` left a file there."""
    root = os.path.realpath(out)
    present = sorted(os.path.relpath(os.path.join(d, f), root) for d, _dirs, names in os.walk(root) for f in names)
    steps = save_steps(traces)
    done: dict[str, int] = {}  # file -> the step of the save that last completed it
    for r in op_records(traces):
        if r["op"] not in ("close", "rename") or not isinstance(r.get("rel"), str):
            continue
        step = steps.get((r["rank"], r.get("ord")))
        rel = r["rel"]
        for f in present:  # (a directory's close, after its fsync, completes none of its files)
            if f == rel or r["op"] == "rename" and f.startswith(rel + os.sep):
                if step is None:
                    done.pop(f, None)
                else:
                    done[f] = step
    dated = {s for s in done.values() if s <= upto}
    if not dated:
        return None, []
    newest = max(dated)
    return newest, sorted(f for f, s in done.items() if s == newest)


def choose(fault: Fault, out: str, files: list[str]) -> tuple[str | None, dict[str, Any]]:
    """The file ``fault`` strikes among the newest checkpoint's ``files`` (``file=`` narrowing them; a
    bit flip or a zeroing only a file its region holds bytes in), drawn with the fault's seed; and the
    record of the choice. None where no file is left to draw from."""
    pattern = fault.param("file")
    pool = [f for f in files if pattern is None or fnmatch.fnmatchcase(f, str(pattern))
            or fnmatch.fnmatchcase(os.path.basename(f), str(pattern))]
    if fault.kind in ("bitflip", "zero"):
        able = set(C.corruptible([os.path.join(out, f) for f in pool], fault.kind,
                                 region=fault.param("region", "any"), offset=fault.param("offset"),
                                 at=fault.param("at")))
        pool = [f for f in pool if os.path.join(out, f) in able]
    key = f"{fault.param('seed', 0)}:{fault.kind}"
    record = {"files": pool[:20], "of": len(files), "file": pattern, "random_key": key}
    return (random.Random(key).choice(pool) if pool else None), record


def edit(fault: Fault, ckpt_dir: str, target: str, scratch_root: str, older: str | None = None) -> C.CorruptionRecord:
    """The built-in corruption ``fault`` (truncate, bitflip, zero, delete, stale, swap) of ``target`` in
    ``ckpt_dir``, with the fault's settings and seed (``faults.corrupt.plan_corruption``). Called by
    :func:`apply` and ``Environment._corrupt_tree``: both targets' ``ckpt:`` edits are this one."""
    plan = C.plan_corruption(ckpt_dir, fault.kind, int(fault.param("seed", 0)), scratch_root=scratch_root,
                             pattern=glob.escape(os.path.basename(target)), region=fault.param("region", "any"),
                             n_bits=int(fault.param("bits", 1)), fraction=fault.param("fraction"),
                             zero_len=int(fault.param("length", 64)), older_dir=older, offset=fault.param("offset"),
                             at=fault.param("at"))
    return C.apply(plan)


def apply(point: Point, out: str, scratch: str, halt: dict[str, Any], seed: int, traces: Traces) -> Applied:
    """Strike the newest checkpoint of the halted job as the built-in ``ckpt:`` fault ``point.builtin`` says."""
    assert point.builtin is not None and point.at_step is not None
    fault = parse_fault(point.builtin)
    step, files = newest_files(out, traces, point.at_step)
    said = f"{fault.kind} of the newest checkpoint at step {point.at_step}"
    if step is None:
        return Applied(said, {"family": fault.kind}, skipped=f"no save at or before step {point.at_step} left a file "
                       "under {out} when every copy stopped: no checkpoint to strike")
    target, choice = choose(fault, out, files)
    base = {"family": fault.kind, "checkpoint_step": step, "choice": choice, "seed": int(fault.param("seed", 0))}
    if target is None:
        return Applied(said, base, skipped=f"none of the {len(files)} file(s) of the checkpoint of step {step} can "
                       f"take it (file={fault.param('file')!r}, {fault.kind}: see the choice)")
    aimed = dataclasses.replace(point, file=target)
    if fault.kind == "stale":
        applied = stale.apply(aimed, out, scratch, halt, seed)
    elif fault.kind == "swap":
        applied = swap.apply(aimed, out, scratch, halt, seed)
    elif fault.kind == "payload":
        applied = payload.plant_in(aimed, out, scratch, target, int(fault.param("seed", 0)),
                                   fault.param("format"), fault.param("variant"))
    else:
        try:
            rec = edit(fault, os.path.dirname(os.path.join(out, target)), os.path.join(out, target), out)
        except FaultError as exc:
            return Applied(f"{fault.kind} of {target}", base, skipped=f"{target}: {exc}", excluded=[target])
        record = {**base, "file": target, "corruption": atrest.relative(rec.to_dict(), out)}
        if not rec.changed:
            return Applied(f"{fault.kind} of {target}", record, skipped=f"{target}: {C.why_unchanged(rec)}",
                           excluded=[target])
        applied = Applied(f"{target}: {corrupt.describe(fault.kind, rec)}", record, excluded=[target])
    applied.record.update({k: v for k, v in base.items() if k not in applied.record})
    if not applied.skipped:  # one file struck spoils the checkpoint: no rank may rely on any file of it
        applied.excluded = sorted(set(applied.excluded) | set(files))
        applied.ranks = sorted({rank for (rank, _a) in traces})
    applied.what = f"the checkpoint of step {step}, newest when rank {point.rank} announced step {point.at_step}: " \
                   f"{applied.what}"
    return applied


__all__ = ["apply", "choose", "edit", "newest_files"]
