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

Needs root and tmpfs (:func:`available`, ``faults.disk.can_mount_tmpfs``); elsewhere the
point is skipped with that reason.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from chaos.model.jobspec import JobSpec, Point
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
