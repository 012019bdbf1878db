"""``diskfull``: a real full disk for a job — {out} on a size-limited tmpfs for attempt 0.

Called by ``explore.py``: :func:`peak_usage` reads the fault-free run's trace and says
how much of {out} the job used at its fullest (in tmpfs pages: a tmpfs charges every
file whole 4 KiB pages, directories nothing); :func:`choose_size` picks, with the seed,
a size between a quarter and three quarters of that, so the job's writes must hit a
real ENOSPC from the kernel at some point. The point ``disk:full:<BYTES>`` then runs
inside :func:`tmpfs_out`: the tmpfs is mounted over {out} (in the harness's mount
namespace, so every copy of the job sees it), attempt 0 runs, :meth:`Tmpfs.grow`
remounts it bigger (``remount,size=``) before the restart, and when the block ends
what the job left is copied back onto the real {out} and the tmpfs is unmounted —
in a ``finally``, so also on an error or Ctrl-C (``explore`` unmounts anything left
under its root once more before it removes the root).

The built-in workload's ``disk:stepS:full,free=B`` is a point too (``--as-job``): {out} is a
roomy tmpfs (:func:`roomy_size`) until rank 0 announces step S and asks; then :func:`fill`
shrinks it to the pages it holds plus B bytes, and the tmpfs grows back before the restart.

Needs root and tmpfs (:func:`available`, ``faults.disk.can_mount_tmpfs``); elsewhere the
point is skipped with that reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from chaos.launch.answers import answer
from chaos.model.jobspec import FILL_DONE, JobSpec, Point
from chaos.nemesis.atrest import merged_records
from chaos.nemesis.family import Family
from chaos.nemesis.sites import Facts, Traces
from faults import disk

PAGE = 4096
MS_REMOUNT = 0x20  # mount(2)'s MS_REMOUNT
_available: tuple[bool, str] | None = None


def available() -> tuple[bool, str]:
    """Whether a size-limited tmpfs can be mounted here (probed once per process), and why not."""
    global _available
    if _available is None:
        _available = disk.can_mount_tmpfs()
    return _available


def _pages(size: int) -> int:
    return -(-size // PAGE)


def peak_usage(out: str, records: list[dict[str, Any]]) -> int:
    """Bytes of tmpfs {out} needed at its fullest, replaying the traced sizes of its files."""
    root = os.path.realpath(out)

    def rel(p: Any) -> str | None:
        return p if isinstance(p, str) and p.startswith(root + os.sep) else None

    sizes: dict[str, int] = {}
    peak = 0
    for r in records:
        if r.get("event") != "op" or r.get("error") is not None:
            continue
        kind, path = r.get("op"), rel(r.get("path"))
        if kind == "open" and path is not None and not r.get("is_dir"):
            sizes[path] = 0 if r.get("trunc") or path not in sizes else sizes[path]
        elif kind == "write" and path is not None:
            sizes[path] = max(sizes.get(path, 0), (r.get("offset") or 0) + (r.get("length") or 0))
        elif kind == "truncate" and path is not None:
            sizes[path] = r.get("length") or 0
        elif kind == "unlink" and path is not None:
            sizes.pop(path, None)
        elif kind == "rename":
            src, dst = r.get("src"), rel(r.get("dst"))
            moved = {k: v for k, v in sizes.items() if isinstance(src, str) and (k == src or k.startswith(src + os.sep))}
            for k in moved:
                del sizes[k]
            if dst is not None:
                for k in [k for k in sizes if k == dst or k.startswith(dst + os.sep)]:
                    del sizes[k]  # replaced
                for k, v in moved.items():
                    sizes[dst + k[len(src):]] = v  # type: ignore[index]
        peak = max(peak, sum(_pages(v) for v in sizes.values()) * PAGE)
    return peak


def choose_size(peak: int, seed: int) -> int | None:
    """A seeded tmpfs size in whole pages, a quarter to three quarters of ``peak`` (None: too small to fill)."""
    pages = peak // PAGE
    if pages < 2:
        return None
    frac = random.Random(f"{seed}:diskfull").uniform(0.25, 0.75)
    return max(1, min(pages - 1, round(pages * frac))) * PAGE


def grown_size(size: int) -> int:
    """What the tmpfs is remounted to before the restart: room for the whole job (a size is at
    least a quarter of the peak, less one page) and more; a tmpfs holds only what is written."""
    return max(8 * size, 64 << 20)


def roomy_size() -> int:
    """A tmpfs size the job cannot fill (half the machine's memory, the kernel's own default), for a disk
    that fills only at a step: a tmpfs holds only what is written, whatever its size."""
    return max(64 << 20, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 // PAGE * PAGE)


def fill(out: str, free: int, req: dict[str, Any], trace_dir: str) -> dict[str, Any]:
    """Fill {out}'s tmpfs now, leaving ``free`` bytes (whole pages, at least that many), then answer the rank.

    Called by ``chaos.launch.job.run_attempt`` when rank 0 announced the step of a built-in
    ``disk:stepS:full,free=B`` point and asked (``FILL_REQUEST``). No filler file is written (the
    job would see it): the tmpfs is remounted to the pages it holds plus ``free``. A copy still
    writing can take a page between the measure and the remount, which the kernel then refuses
    (EINVAL below what it holds): measured again, five times at most. The record says what was in
    use, the size set, and the bytes free after; or why the disk could not be filled.
    """
    record: dict[str, Any] = {"step": req.get("step"), "rank": req.get("rank"), "free_bytes": int(free)}
    for _ in range(5):
        st = os.statvfs(out)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        size = used + _pages(int(free)) * PAGE
        try:
            disk.mount(None, out, None, MS_REMOUNT, f"size={size}")
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                continue
            record["error"] = f"{{out}}'s tmpfs could not be remounted at {size} bytes: {exc}"
            break
        after = os.statvfs(out)
        record.update({"in_use_bytes": used, "remounted_to": size, "free_after": after.f_bavail * after.f_frsize,
                       "ts": time.time()})
        break
    else:
        record["error"] = "{out} kept growing while it was being filled (five tries)"
    answer(trace_dir, FILL_DONE, {"full": "error" not in record, "error": record.get("error")})
    return record


@dataclass
class Tmpfs:
    """A mounted tmpfs over {out}: its record, and the remount that grows it."""

    path: str
    record: dict[str, Any]
    remounts: list[int] = field(default_factory=list)

    def grow(self, size: int) -> None:
        disk.mount(None, self.path, None, MS_REMOUNT, f"size={int(size)}")
        self.remounts.append(int(size))
        self.record["remounted_to"] = int(size)


@contextlib.contextmanager
def tmpfs_out(out: str, size: int, scratch: str) -> Iterator[Tmpfs]:
    """{out} as a ``size``-byte tmpfs for the block; afterwards its contents are on the real {out}."""
    keep = os.path.join(scratch, "out-from-tmpfs")
    copied = False
    try:
        with disk.mounted_tmpfs(out, size, scratch_root=scratch) as rec:
            fs = Tmpfs(out, dict(rec))
            try:
                yield fs
            finally:
                shutil.copytree(out, keep, symlinks=True)  # the unmount discards what the job left
                copied = True
    finally:
        disk.unmount_all(out)
    if copied:
        shutil.copytree(keep, out, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(keep, ignore_errors=True)


# -- the family's planning hooks (chaos.nemesis.family) ---------------------------------------

def _gather(out: str, scratch: str, facts: Facts) -> None:
    facts.peak = peak_usage(out, merged_records(scratch, 0))


def _points(job: JobSpec, traces: Traces, facts: Facts) -> list[Point]:
    """One ``disk:full:<BYTES>``: a seeded size below the fault-free run's peak usage of {out}."""
    size = choose_size(facts.peak, facts.seed)
    return [] if size is None else [Point(0, "diskfull", size=size)]


def _notes(job: JobSpec, traces: Traces, facts: Facts, points: list[Point]) -> list[str]:
    return [] if points else [f"a real full disk is not explored: {{out}} never held more than {facts.peak} "
                              "byte(s) of tmpfs pages, too little to fill a smaller one"]


def _unavailable(job: JobSpec) -> str | None:
    ok, why = available()
    return None if ok else f"a real full disk is not explored: {why}"


FAMILY = Family(name="diskfull", points=_points, gather=_gather, notes=_notes, unavailable=_unavailable,
                needs_facts=True, restarts_torchrun=True)
