"""Block-level power loss on a real file system: dm-log-writes' method, without device-mapper.

Why: :mod:`faults.crashstate` asks what an abstract POSIX file system may keep after a
power cut (the ALICE worst case). A real one keeps what its journal and ordering rules
keep, and that depends on the file system and its mount options (ext4 ``data=ordered``
with ``auto_da_alloc`` starts a renamed file's writeback at the rename, and usually
commits its data before the rename; ``data=writeback`` does not try). This module asks
the real file system: it
makes one on a loop image whose block writes and flushes are logged
(:mod:`faults.blocklog`), runs a save, replays the crash states a volatile device cache
allows (:mod:`faults.blockstates`) onto copies of the image, mounts each (journal
recovery runs at mount) and judges what a fresh reader finds there.

Who calls what:

- :func:`explore` is the engine: ``setup`` on the fresh file system (unlogged), then
  ``action`` with the log on (it calls ``mark("acknowledged")`` when its save returns),
  then ``judge(mount_point, acknowledged)`` on every distinct crash state;
- :func:`block_power_loss` is ``chaos certify``'s property (registered in
  :mod:`chaos.certify.battery`): the reference checkpointer on the target's own file
  system type and mount options;
- :func:`compare_savers` runs a deliberately unsafe save (rename without any fsync) and a
  safe one on ext4 ``data=ordered`` and ``data=writeback`` and returns a findings table's
  rows.

Crash states are mounted one at a time from an image copy in a private work directory
under the caller's scratch dir, unmounted, detached and deleted before the next; the work
directory goes at the end, whatever happened (the explorer checks that no mount or loop
device is left and says so in its report).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.model.check import Check
from faults import FaultError, Unsupported
from faults.blocklog import (
    BlockLogError,
    can_log,
    fs_mount,
    fs_unmount,
    leftovers,
    logged_fs,
    loop_attach,
    loop_detach,
    mount_options_of,
    read_log,
)
from faults.blockstates import materialize, plan

# Image sizes: mkfs.xfs refuses file systems under 300 MB; btrfs's non-mixed minimum is ~110 MB.
IMAGE_BYTES = {"ext4": 64 << 20, "xfs": 300 << 20, "btrfs": 128 << 20}
# ext4: 4 KiB blocks as on any real disk (mke2fs picks 1 KiB for a small image); inode tables
# and the journal zeroed at mkfs, so no lazy-init thread writes while the log runs.
MKFS_ARGS: dict[str, tuple[str, ...]] = {"ext4": ("-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0"),
                                         "xfs": (), "btrfs": ()}
SUPPORTED = tuple(IMAGE_BYTES)
# Mount options that describe the target's device or place, not the file system's behaviour:
# on a fresh loop image they are wrong (stripe geometry, subvolumes, an external journal) or
# not mount options at all (seclabel). ro: the crash states must be recovered read-write.
DROP_OPTIONS = ("ro", "rw", "seclabel", "sunit", "swidth", "stripe", "subvol", "subvolid", "journal_path",
                "journal_dev", "logdev", "rtdev", "dax", "context", "fscontext", "defcontext", "rootcontext",
                "usrquota", "grpquota", "prjquota", "usrjquota", "grpjquota", "jqfmt", "quota", "uquota",
                "gquota", "pquota", "noquota")

Judge = Callable[[str, bool], list[str]]


class BlockCrashError(FaultError):
    """The exploration could not run as asked (bad file-system type, a step that failed)."""


@dataclass
class StateOutcome:
    """One distinct crash state that a judge or a mount found wrong, and how to rebuild it."""

    moment: int
    subset: list[int]
    durable: int
    acknowledged: bool
    how: str
    violations: list[str]


@dataclass
class ExploreReport:
    """What :func:`explore` did and found; plain data (``to_dict`` for a report).

    ``checked``: crash states planned; ``distinct``: different images among them (each was
    mounted and judged); ``failing``: states whose judge found violations; ``mount_failures``:
    states the file system refused to mount (a finding too); a state rebuilds from
    ``(seed, moment, subset)`` with :func:`faults.blockstates.state_at`.
    """

    fstype: str
    mkfs_args: list[str]
    mount_options: str
    image_bytes: int
    seed: int
    max_states: int
    writes: int = 0
    flushes: int = 0
    checked: int = 0
    distinct: int = 0
    failing: list[StateOutcome] = field(default_factory=list)
    mount_failures: list[StateOutcome] = field(default_factory=list)
    violations_by_state: dict[str, list[str]] = field(default_factory=dict)
    leftovers: dict[str, list[str]] = field(default_factory=dict)
    log_seconds: float = 0.0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["failing"] = d["failing"][:50]
        d["mount_failures"] = d["mount_failures"][:50]
        d.pop("violations_by_state")
        return d


def explore(fstype: str, mkfs_args: tuple[str, ...] | list[str], mount_opts: str,
            setup: Callable[[str], None], action: Callable[[str, Callable[[str], None]], None], judge: Judge,
            scratch: str, *, image_bytes: int | None = None, seed: int = 0, max_states: int = 60,
            keep_outcomes: bool = False) -> ExploreReport:
    """Log ``action`` on a fresh ``fstype`` and judge every distinct crash state it can leave.

    ``setup(mount_point)`` runs unlogged on the fresh file system; ``action(mount_point,
    mark)`` runs logged and calls ``mark("acknowledged")`` when its save returns; after it
    the file system is synced (so the log ends with everything committed: the crash window
    covers "before the file system got round to it"). Each distinct state is materialized,
    loop-mounted read-write with ``mount_opts`` (journal recovery), handed to
    ``judge(mount_point, acknowledged)`` (violations, empty when fine), unmounted, detached
    and deleted. ``keep_outcomes``: record every state's violations (``violations_by_state``,
    keyed ``moment:subset``), also the empty ones, for tables that count outcomes.
    Raises :class:`~faults.Unsupported` where the machine cannot do it.
    """
    t0 = time.perf_counter()
    size = image_bytes or IMAGE_BYTES.get(fstype, 128 << 20)
    report = ExploreReport(fstype, list(mkfs_args), mount_opts, size, seed, max_states)
    work = tempfile.mkdtemp(prefix=f"blockcrash-{fstype}-", dir=scratch)
    try:
        with logged_fs(work, fstype, size, mkfs_args, mount_opts) as lf:
            setup(lf.mount_point)
            lf.start()
            action(lf.mount_point, lf.mark)
            lf.sync()
            lf.stop()
        report.log_seconds = round(time.perf_counter() - t0, 3)
        records = read_log(lf.log_path)
        p = plan(records, lf.log_path, lf.base_path, seed=seed, max_states=max_states)
        report.writes, report.flushes, report.checked, report.distinct = p.writes, p.flushes, p.checked, p.distinct
        check_dir = os.path.join(work, "check")
        os.mkdir(check_dir, 0o700)
        for i, st in enumerate(p.unique()):
            img = os.path.join(work, f"state-{i}.img")
            materialize(st, records, lf.log_path, lf.base_path, img)
            acked = "acknowledged" in st.marks
            outcome = StateOutcome(st.moment, list(st.subset), st.durable, acked, st.how, [])
            dev = loop_attach(img)
            try:
                try:
                    fs_mount(dev, check_dir, fstype, mount_opts)
                except BlockLogError as e:
                    outcome.violations = [f"the crash state does not mount: {e}"]
                    report.mount_failures.append(outcome)
                    continue
                try:
                    outcome.violations = list(judge(check_dir, acked))
                finally:
                    fs_unmount(check_dir)
            finally:
                loop_detach(dev)
                os.unlink(img)
            if keep_outcomes:
                report.violations_by_state[f"{st.moment}:{','.join(map(str, st.subset))}"] = outcome.violations
            if outcome.violations:
                report.failing.append(outcome)
    finally:
        report.leftovers = {k: v for k, v in leftovers(work).items() if v}
        if not report.leftovers:
            shutil.rmtree(work, ignore_errors=True)
        report.seconds = round(time.perf_counter() - t0, 3)
    if report.leftovers:
        raise BlockCrashError(f"exploration of {fstype} left {report.leftovers} under {work}")
    return report


# ------------------------------------------------------------------- the certify property

def fresh_options(options: list[str]) -> tuple[str, list[str]]:
    """The options a fresh image of the same type is mounted with, and the ones dropped (DROP_OPTIONS)."""
    keep, dropped = [], []
    for o in options:
        (dropped if o.split("=", 1)[0] in DROP_OPTIONS else keep).append(o)
    return ",".join(keep), dropped


class _MountReader:
    """Stands in for a Bench where :func:`chaos.certify.harness.expect_only` asks for a reader:
    a fresh reference checkpointer on the crash state's checkpoint root."""

    def __init__(self, root: str) -> None:
        self.root = root

    def reader(self, sub: str) -> Any:
        from chaos.reference.checkpoint.engine import ReferenceCheckpointer

        return ReferenceCheckpointer(self.root, 0, 1, keep_last=1000, metrics=False)


def _reference_judge(root_of: Callable[[str], str], states: dict[int, Any], template: Any) -> Judge:
    """A fresh reference checkpointer's view of a crash state: step 1 or 2 bit-exact (2 once
    acknowledged), ``latest`` committed, every listed step whole and as saved (the battery's
    own check of that, :func:`chaos.certify.harness.expect_only`)."""
    from chaos.certify.harness import error_text, expect_only, fingerprint

    prints = {k: fingerprint(v) for k, v in states.items()}

    def judge(mount_point: str, acknowledged: bool) -> list[str]:
        bad: list[str] = []
        reader = _MountReader(root_of(mount_point))
        try:
            r = reader.reader("")
        except Exception as exc:  # noqa: BLE001 - a reader that cannot start is the finding
            return [f"a fresh reader does not start: {error_text(exc, 200)}"]
        try:
            got = r.load_latest(template)
        except Exception as exc:  # noqa: BLE001
            got = None
            bad.append(f"load_latest failed: {error_text(exc, 200)}")
        else:
            if got is None:
                bad.append("load_latest found no checkpoint (step 1 was committed before the save began)")
            elif got[0] not in prints or fingerprint(got[1]) != prints[got[0]]:
                bad.append(f"load_latest returned step {got[0]} with a state never saved at it")
            elif acknowledged and got[0] != max(states):
                bad.append(f"step {max(states)} was acknowledged before the crash, but load_latest returned step {got[0]}")
        finally:
            r.close()
        return bad + expect_only(reader, "", states, "after the crash")  # type: ignore[arg-type]

    return judge


def explore_reference(fstype: str, mount_opts: str, scratch: str, *, seed: int = 0, max_states: int = 60,
                      nbytes: int = 1 << 16, mkfs_args: tuple[str, ...] | None = None) -> ExploreReport:
    """The reference checkpointer on a fresh ``fstype``: step 1 committed unlogged, step 2's save logged.

    Who calls it: :func:`block_power_loss` and the tests. ``nbytes``: the model's size
    (small: every crash state copies and mounts an image).
    """
    from chaos.certify.harness import make_state
    from chaos.reference.checkpoint.engine import ReferenceCheckpointer

    states = {1: make_state(1, nbytes, seed), 2: make_state(2, nbytes, seed)}

    def root(mp: str) -> str:
        return os.path.join(mp, "ckpt")

    def setup(mp: str) -> None:
        with ReferenceCheckpointer(root(mp), 0, 1, keep_last=1000, metrics=False) as c:
            c.save(1, states[1])

    def action(mp: str, mark: Callable[[str], None]) -> None:
        c = ReferenceCheckpointer(root(mp), 0, 1, keep_last=1000, metrics=False)
        try:
            c.save(2, states[2])
            mark("acknowledged")
        finally:
            c.close()

    return explore(fstype, MKFS_ARGS.get(fstype, ()) if mkfs_args is None else mkfs_args, mount_opts, setup, action,
                   _reference_judge(root, states, make_state(0, nbytes, seed)), scratch, seed=seed,
                   max_states=max_states)


def block_power_loss(b: Any, max_states: int = 100) -> Check:
    """Power cuts beneath the target's own file-system type: every crash state loads a committed step.

    For a POSIX target on ext4, xfs or btrfs: the same type is made on a loop image in the
    bench's scratch dir and mounted with the target's mount options (less DROP_OPTIONS),
    the reference checkpointer commits step 1, then step 2's save is logged at block level
    and every distinct crash state is mounted and loaded by a fresh reader. Other types,
    and machines without root, FUSE or losetup, are not judged, with the reason.
    """
    name = "block_power_loss"
    if b.target.kind != "posix":
        return Check(name, "not_judged", f"a {b.target.kind} backend has no block device beneath it that a client can log")
    found = mount_options_of(b.target.location())
    if found is None:
        return Check(name, "not_judged", f"no mount in /proc/self/mountinfo holds {b.target.location()}")
    fstype, options = found
    if fstype not in SUPPORTED:
        return Check(name, "not_judged", f"{b.target.location()} is on {fstype}: block-level crash states are "
                     f"made for {', '.join(SUPPORTED)} only (a loop image of the same type)")
    ok, why = can_log()
    if not ok:
        return Check(name, "not_judged", f"cannot log block writes here: {why}")
    opts, dropped = fresh_options(options)
    try:
        rep = explore_reference(fstype, opts, b.scratch, seed=b.seed, max_states=max_states)
    except (Unsupported, BlockLogError) as e:  # mkfs, losetup or the fresh mount refused: the machine's limit
        return Check(name, "not_judged", f"could not make or log a {fstype} loop image here: {e}",
                     {"mount_options": opts, "dropped_options": dropped})
    ev = rep.to_dict() | {"dropped_options": dropped}
    counts = f"{rep.checked} crash states checked, {rep.distinct} distinct"
    if rep.mount_failures or rep.failing:
        first = (rep.mount_failures or rep.failing)[0]
        return Check(name, "fail", f"{fstype} ({opts or 'defaults'}): {counts}; {len(rep.failing)} failing, "
                     f"{len(rep.mount_failures)} not mountable; first at moment {first.moment} "
                     f"subset {first.subset}: {first.violations[0]}", ev)
    return Check(name, "pass", f"{fstype} ({opts or 'defaults'}): {counts} ({rep.writes} block writes, "
                 f"{rep.flushes} flushes during step 2's save): each mounted and loaded a committed step bit-exact, "
                 "step 2 whenever acknowledged", ev)


# ------------------------------------------------------------ unsafe vs safe savers

def _payload(n: int, seed: int, salt: int) -> bytes:
    import random

    return random.Random(seed * 7919 + salt).randbytes(n)


def _unsafe_save(path: str, data: bytes) -> None:
    """Write a temp file, rename it over ``path``: no fsync of the file, none of the directory."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, path)


def _safe_save(path: str, data: bytes) -> None:
    """Write a temp file, fsync it, rename it over ``path``, fsync the directory."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


SAVERS: dict[str, Callable[[str, bytes], None]] = {"unsafe": _unsafe_save, "safe": _safe_save}
# ext4's two data modes, each also without auto_da_alloc (the heuristic that starts a file's
# delayed allocation when a rename replaces another file: the guard against zero-length files).
COMPARED_OPTIONS = ("data=ordered", "data=writeback", "data=ordered,noauto_da_alloc", "data=writeback,noauto_da_alloc")


def explore_saver(saver: str, mount_opts: str, scratch: str, *, seed: int = 0, max_states: int = 60,
                  old_bytes: int = 96 << 10, new_bytes: int = 128 << 10) -> tuple[ExploreReport, dict[str, int]]:
    """One saver replacing ``ckpt.bin`` on ext4 with ``mount_opts``: the report and its counts.

    Each distinct state is one of: ``ok`` (the new content, or the old one while the save
    was not yet acknowledged), ``lost`` (the file missing, or the old content after the
    save was acknowledged) or ``torn`` (neither: zeros, short, a mixture).
    """
    if saver not in SAVERS:
        raise BlockCrashError(f"unknown saver {saver!r}: one of {', '.join(SAVERS)}")
    old, new = _payload(old_bytes, seed, 1), _payload(new_bytes, seed, 2)

    def setup(mp: str) -> None:
        _safe_save(os.path.join(mp, "ckpt.bin"), old)

    def action(mp: str, mark: Callable[[str], None]) -> None:
        SAVERS[saver](os.path.join(mp, "ckpt.bin"), new)
        mark("acknowledged")

    def judge(mp: str, acknowledged: bool) -> list[str]:
        path = os.path.join(mp, "ckpt.bin")
        if not os.path.lexists(path):
            return ["lost: ckpt.bin is missing"]
        with open(path, "rb") as f:
            got = f.read(max(old_bytes, new_bytes) + 1)
        if got == new:
            return []
        if got == old:
            return ["lost: ckpt.bin holds the old content after the save was acknowledged"] if acknowledged else []
        zeros = got.count(0) == len(got)
        return [f"torn: ckpt.bin holds {len(got)} bytes{' of zeros' if zeros and got else ''}, neither old "
                f"({len(old)}) nor new ({len(new)})"]

    rep = explore("ext4", MKFS_ARGS["ext4"], mount_opts, setup, action, judge, scratch, seed=seed,
                  max_states=max_states, keep_outcomes=True)
    outcomes = list(rep.violations_by_state.values()) + [o.violations for o in rep.mount_failures]
    lost = sum(1 for v in outcomes if v and v[0].startswith("lost"))
    torn = sum(1 for v in outcomes if v and (v[0].startswith("torn") or v[0].startswith("the crash state")))
    return rep, {"lost": lost, "torn": torn, "ok": sum(1 for v in outcomes if not v)}


def compare_savers(scratch: str, *, seed: int = 0, max_states: int = 60,
                   options: tuple[str, ...] = COMPARED_OPTIONS) -> list[dict[str, Any]]:
    """The unsafe and the safe saver on ext4 under each of ``options``: one row each, for a findings table.

    Rows are plain dicts: fs, options, saver, states (checked), distinct, lost, torn, ok
    (the last three count distinct states), seconds. Deterministic given ``seed`` and the
    logs (the kernel decides the block writes; the states drawn from them follow the seed).
    """
    rows = []
    for opts in options:
        for saver in SAVERS:
            rep, counts = explore_saver(saver, opts, scratch, seed=seed, max_states=max_states)
            rows.append({"fs": "ext4", "options": opts, "saver": saver, "states": rep.checked, "distinct": rep.distinct,
                         **counts, "writes": rep.writes, "flushes": rep.flushes, "seconds": rep.seconds})
    return rows
