"""Block-level power loss (#32): the state generator, the logger, the explorer and the property.

The generator's tests are pure (synthetic logs, small images). The others make real file
systems on loop devices over the FUSE logger and need root, /dev/fuse, losetup and the
mkfs tools; they skip with the reason otherwise. Every test is watched by a fixture that
looks for mounts, loop devices and daemons left behind *before* cleaning anything up.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults.blocklog import (
    FLUSH,
    HEADER,
    MARK,
    WRITE,
    ZERO,
    BlockLogError,
    append_record,
    can_log,
    leftovers,
    logged_fs,
    loop_detach,
    read_log,
)
from faults.blockstates import SECTOR, Epochs, materialize, plan, state_at

REPO = Path(__file__).resolve().parent.parent
CAN, WHY = can_log()
real = pytest.mark.skipif(not CAN, reason=f"block-level crash states: {WHY}")


def _daemons(root: str) -> list[int]:
    """Block-log daemons serving a mount under ``root`` (their command line names it)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"faults.blocklog" in argv and any(a.startswith(root.encode()) for a in argv):
            out.append(int(pid))
    return out


@pytest.fixture(autouse=True)
def nothing_left(tmp_path):
    """After each test: no mount, loop device or daemon under its tmp_path; observed, then cleaned."""
    yield
    root = os.path.realpath(tmp_path)
    left = {k: v for k, v in leftovers(root).items() if v} if shutil.which("losetup") else {}
    procs = _daemons(root)
    for mp in sorted(left.get("mounts", []), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)
    for dev in left.get("loops", []):
        loop_detach(dev)
    for pid in procs:
        os.kill(pid, signal.SIGKILL)
    assert not left and not procs, f"left behind: {left}, daemons {procs}"


# ------------------------------------------------------------------ synthetic logs

def _log(path: Path, events: list[tuple]) -> list:
    """Write a log of ("w", sector, bytes) / ("z", sector, sectors) / ("f",) / ("m", name) events."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        for e in events:
            if e[0] == "w":
                append_record(fd, WRITE, e[1] * SECTOR, len(e[2]), data=e[2])
            elif e[0] == "z":
                append_record(fd, ZERO, e[1] * SECTOR, e[2] * SECTOR)
            elif e[0] == "f":
                append_record(fd, FLUSH, name=b"fsync")
            else:
                append_record(fd, MARK, name=e[1].encode())
    finally:
        os.close(fd)
    return read_log(path)


def _base(path: Path, sectors: int, seed: int = 0) -> None:
    path.write_bytes(random.Random(seed).randbytes(sectors * SECTOR) if seed else bytes(sectors * SECTOR))


def _image(state, records, log: Path, base: Path, d: Path) -> bytes:
    dest = d / f"img-{state.moment}-{'_'.join(map(str, state.subset))}"
    materialize(state, records, str(log), str(base), str(dest))
    try:
        return dest.read_bytes()
    finally:
        dest.unlink()


SECTORS = 8
_event = st.one_of(
    st.tuples(st.just("w"), st.integers(0, SECTORS - 2), st.integers(1, 2).flatmap(
        lambda n: st.sampled_from([bytes(n * SECTOR), b"\x01" * (n * SECTOR), b"\x02" * (n * SECTOR)]))),
    st.tuples(st.just("z"), st.integers(0, SECTORS - 1), st.just(1)),
    st.tuples(st.just("f")),
    st.tuples(st.just("m"), st.sampled_from(["acknowledged", "other"])),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(_event, max_size=10), seed=st.integers(0, 3), base_seed=st.sampled_from([0, 7]))
def test_states_keep_the_durable_prefix_and_equal_keys_mean_equal_bytes(events, seed, base_seed):
    """Every state: each write before the last flush before its moment survives, its subset is
    pending then; "none" and "all" are planned at every moment; keys (and so ``distinct``) are
    equal exactly when the materialized images are equal, overlaps and base-equal writes included."""
    with tempfile.TemporaryDirectory() as t:
        d = Path(t)
        log, base = d / "log", d / "base"
        records = _log(log, events)
        _base(base, SECTORS, base_seed)
        ep = Epochs(records)
        p = plan(records, str(log), str(base), seed=seed, max_states=500)
        assert p.checked == len(p.states) and p.moments_used == ep.moments
        images: dict[str, bytes] = {}
        for s in p.states:
            last_flush = ep.durable(s.moment)
            assert s.durable == last_flush and set(s.subset) <= set(ep.pending(s.moment))
            img = _image(s, records, log, base, d)
            assert images.setdefault(s.key, img) == img  # equal key: equal bytes
        assert len(set(images.values())) == len(images) == p.distinct  # different keys: different bytes
        for m in range(ep.moments):
            subsets = {s.subset for s in p.states if s.moment == m}
            pend = tuple(ep.pending(m))
            assert () in subsets and pend in subsets
            if len(pend) <= 4:
                assert len(subsets) == 2 ** len(pend)  # few pending writes: every subset


def test_a_state_applies_the_durable_writes_and_its_subset_only(tmp_path):
    """Distinct sectors: a write's bytes are in the image exactly when it is durable or in the subset."""
    writes = [("w", i, bytes([i + 1]) * SECTOR) for i in range(6)]
    events = [writes[0], writes[1], ("f",), writes[2], ("m", "acknowledged"), writes[3], writes[4], ("f",), writes[5]]
    records = _log(tmp_path / "log", events)
    _base(tmp_path / "base", 8)
    p = plan(records, str(tmp_path / "log"), str(tmp_path / "base"), seed=1, max_states=200)
    for s in p.states:
        img = _image(s, records, tmp_path / "log", tmp_path / "base", tmp_path)
        for w in range(6):
            kept = img[w * SECTOR:(w + 1) * SECTOR] == bytes([w + 1]) * SECTOR
            assert kept == (w < s.durable or w in s.subset), (s, w)
    acked = {s.moment: "acknowledged" in s.marks for s in p.states}
    assert acked == {0: False, 1: False, 2: False, 3: False, 4: True, 5: True, 6: True, 7: True}
    # moment 2 is right after write 1, before the flush that follows it: both still pending
    assert {s.subset for s in p.states if s.moment == 2} == {(), (0,), (1,), (0, 1)}


def test_sampling_is_seeded_capped_and_rebuildable(tmp_path):
    """Many pending writes: the same seed plans the same states, another seed others, the cap
    holds, and every state rebuilds from (moment, subset) alone."""
    events = [("w", i % 60, bytes([i % 251 + 1]) * SECTOR) for i in range(40)] + [("f",)]
    records = _log(tmp_path / "log", events)
    _base(tmp_path / "base", 64)
    args = (records, str(tmp_path / "log"), str(tmp_path / "base"))
    a, b, c = plan(*args, seed=3, max_states=50), plan(*args, seed=3, max_states=50), plan(*args, seed=4, max_states=50)
    assert a.states == b.states and a.states != c.states
    assert a.checked == 50 and a.distinct <= a.checked
    assert {s.moment for s in a.states} >= {0, a.moments_total - 1}
    assert any(s.how == "sampled" for s in a.states)
    for s in a.states:
        r = state_at(records, s.moment, s.subset)
        assert (r.durable, r.subset, r.marks) == (s.durable, s.subset, s.marks)
    with pytest.raises(BlockLogError, match="not pending"):
        state_at(records, 41, [0])  # the end of the log: everything flushed, nothing pending


def test_a_truncated_log_is_an_error_naming_the_file(tmp_path):
    log = tmp_path / "log"
    _log(log, [("w", 0, b"\x01" * SECTOR), ("f",)])
    data = log.read_bytes()
    log.write_bytes(data[: HEADER.size + 100])
    with pytest.raises(BlockLogError, match=str(log)):
        read_log(log)


def test_the_property_is_not_judged_off_ext4_xfs_btrfs_and_off_posix(tmp_path):
    """proc (any non-disk type) and an S3 target: not judged, with the reason; options that
    describe the target's device are dropped for a fresh image."""
    from chaos.certify.blockcrash import block_power_loss, fresh_options
    from chaos.certify.harness import Bench
    from chaos.certify.target import Target

    c = block_power_loss(Bench(Target("file:///proc", "posix", "/proc"), str(tmp_path)))
    assert c.result == "not_judged" and "on proc" in c.summary
    c = block_power_loss(Bench(Target("s3://b", "s3", "s3://b"), str(tmp_path)))
    assert c.result == "not_judged" and "s3" in c.summary
    assert fresh_options(["rw", "relatime", "data=writeback", "stripe=4", "subvol=/x", "seclabel"]) == (
        "relatime,data=writeback", ["rw", "stripe=4", "subvol=/x", "seclabel"])


def test_the_reference_judge_flags_an_acknowledged_step_that_did_not_survive(tmp_path):
    """The judge on a plain directory holding step 1 only: fine before the acknowledgement,
    a violation naming step 2 after it; a step whose shard was cut short is flagged too."""
    from chaos.certify.blockcrash import _reference_judge
    from chaos.certify.harness import make_state
    from chaos.reference.checkpoint.engine import ReferenceCheckpointer

    states = {1: make_state(1, 1 << 12), 2: make_state(2, 1 << 12)}
    with ReferenceCheckpointer(str(tmp_path / "ckpt"), 0, 1, keep_last=1000, metrics=False) as c:
        c.save(1, states[1])
    judge = _reference_judge(lambda mp: os.path.join(mp, "ckpt"), states, make_state(0, 1 << 12))
    assert judge(str(tmp_path), False) == []
    assert any("step 2 was acknowledged" in v for v in judge(str(tmp_path), True))
    shard = next(p for p in (tmp_path / "ckpt").rglob("*") if p.is_file() and p.stat().st_size > 4096)
    shard.write_bytes(shard.read_bytes()[:100])
    assert any("does not load" in v or "load_latest" in v for v in judge(str(tmp_path), False))


# ------------------------------------------------------------------ real file systems

@real
def test_an_fsync_inside_the_file_system_reaches_the_log_as_a_flush(tmp_path):
    """The loop device turns the file system's cache flush into an fsync of its backing file:
    the file's bytes are logged as block writes, then a flush, all before the marker."""
    payload = random.Random(5).randbytes(64 << 10)
    with logged_fs(str(tmp_path), "ext4", 64 << 20, ("-E", "lazy_itable_init=0,lazy_journal_init=0")) as lf:
        lf.start()
        with open(os.path.join(lf.mount_point, "f"), "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        lf.mark("acknowledged")
    records = lf.records()
    kinds = [r.kind for r in records]
    mark = kinds.index("mark")
    log = Path(lf.log_path).read_bytes()
    data_at = [i for i, r in enumerate(records[:mark])
               if r.kind == "write" and payload[-1024:] in log[r.pos:r.pos + r.length]]
    assert data_at, "the file's bytes are in no logged write before the marker"
    assert "flush" in kinds[data_at[0]:mark], kinds
    shutil.rmtree(lf.workdir)


@real
def test_an_exception_in_the_body_unmounts_and_detaches(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), logged_fs(str(tmp_path), "ext4", 64 << 20) as lf:
        assert os.path.ismount(lf.mount_point)
        raise RuntimeError("boom")
    assert leftovers(str(tmp_path)) == {"mounts": [], "loops": []}
    shutil.rmtree(lf.workdir)


_HOLDER = """
import sys, time
from faults.blocklog import logged_fs
with logged_fs(sys.argv[1], "ext4", 64 << 20) as lf:
    lf.start()
    print("ready", flush=True)
    time.sleep(60)
"""


@real
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_leave_nothing_mounted_or_attached(tmp_path, sig):
    """The holder is signalled while mounted: its file system, loop device, FUSE mount and
    daemon are gone when it has exited (SIGTERM then dies of SIGTERM, as it would have)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        held = leftovers(str(tmp_path))
        assert len(held["mounts"]) == 2 and len(held["loops"]) == 1, held
        p.send_signal(sig)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc == (-signal.SIGTERM if sig == signal.SIGTERM else rc) and rc != 0
    assert leftovers(str(tmp_path)) == {"mounts": [], "loops": []} and not _daemons(str(tmp_path))


@real
def test_the_reference_passes_block_power_loss_on_an_ext4_target(tmp_path):
    """The certify property on a target that is itself on ext4 (data=ordered, commit=7 from its
    mountinfo): the reference checkpointer loads a committed step bit-exact in every state."""
    from chaos.certify.blockcrash import block_power_loss
    from chaos.certify.harness import Bench
    from chaos.certify.target import Target
    from faults.blocklog import fs_mount, fs_unmount, loop_attach, mkfs

    img, mnt = tmp_path / "target.img", tmp_path / "target"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    mkfs("ext4", str(img))
    dev = loop_attach(str(img))
    try:
        fs_mount(dev, str(mnt), "ext4", "data=ordered,commit=7")
        try:
            scratch = tmp_path / "scratch"
            scratch.mkdir()
            t = time.perf_counter()
            c = block_power_loss(Bench(Target(f"file://{mnt}", "posix", str(mnt)), str(scratch)))
            took = time.perf_counter() - t
        finally:
            fs_unmount(str(mnt))
    finally:
        loop_detach(dev)
    assert c.result == "pass", c.summary
    assert "crash states checked" in c.summary and "distinct" in c.summary and "commit=7" in c.evidence["mount_options"]
    assert c.evidence["distinct"] > 10 and c.evidence["checked"] >= c.evidence["distinct"]
    print(f"ext4 block_power_loss: {c.summary} ({took:.1f} s)")


@real
@pytest.mark.parametrize("fstype", ["ext4", "xfs"])
def test_the_reference_save_survives_every_block_level_crash_state(tmp_path, fstype):
    """The done criterion: a reference save of step 2 on ext4 and xfs loop images, every distinct
    crash state mounted (journal recovery) and loaded: step 1 or 2 bit-exact, 2 once acknowledged."""
    from chaos.certify.blockcrash import explore_reference

    if shutil.which(f"mkfs.{fstype}") is None:
        pytest.skip(f"mkfs.{fstype} is not installed")
    rep = explore_reference(fstype, "", str(tmp_path), max_states=100)
    assert not rep.failing and not rep.mount_failures, rep.to_dict()
    assert rep.distinct >= 5 and rep.checked >= rep.distinct and rep.flushes > 0
    print(f"{fstype}: {rep.checked} checked, {rep.distinct} distinct, {rep.writes} writes, {rep.seconds} s")


@real
def test_rename_without_fsync_loses_the_file_on_ext4_writeback_and_the_safe_save_never_does(tmp_path, capsys):
    """data=writeback: the unsafe saver (no fsync of the file or the directory) is lost (the old
    content after its save returned) or torn in some state; fsync, rename, fsync dir never is.
    Run as a user runs it, ``chaos savers --json``, and rendered by ``chaos findings``."""
    import json

    from chaos.cli.main import main

    out = tmp_path / "savers.json"
    assert main(["savers", "--options", "data=writeback", "--json", str(out), "--dir", str(tmp_path)]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "block-crash-savers" and doc["date"][:2] == "20" and len(doc["rows"]) == 2
    got = {r["saver"]: r for r in doc["rows"]}
    assert got["unsafe"]["lost"] + got["unsafe"]["torn"] >= 1, doc["rows"]
    assert got["safe"]["lost"] == got["safe"]["torn"] == 0 and got["safe"]["ok"] == got["safe"]["distinct"], doc
    capsys.readouterr()
    assert main(["findings", str(out)]) == 0
    table = capsys.readouterr().out
    r = got["unsafe"]
    assert (f"| ext4 | data=writeback | unsafe | {r['states']} | {r['distinct']} | {r['lost']} | {r['torn']} | "
            f"{r['ok']} | {doc['date']} |") in table
    assert not list(tmp_path.glob("chaos-savers-*"))  # its scratch dir is gone


def test_chaos_savers_refuses_an_empty_option_set_in_one_line(capsys):
    from chaos.cli.main import main

    assert main(["savers", "--options", "data=ordered;"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--options 'data=ordered;'" in err and "none empty" in err


@real
def test_data_ordered_loses_the_unsafe_savers_renamed_file_and_never_the_safe_ones(tmp_path):
    """On data=ordered the unsafe saver's renamed file is lost in some crash states: until the
    next journal commit the old content is what a power cut leaves, though the save had
    returned. Whether it is also torn is the kernel's timing, not asserted: auto_da_alloc only
    *starts* the data's writeback at the rename (measured on kernel 6.18: never torn on an idle
    machine, torn in 2 of 59 states once in CI under two pytest-xdist workers, 2026-12-07).
    The safe saver (fsync, rename, fsync of the directory) is neither, ever."""
    from chaos.certify.blockcrash import compare_savers

    rows = compare_savers(str(tmp_path), options=("data=ordered",))
    unsafe = next(r for r in rows if r["saver"] == "unsafe")
    assert unsafe["lost"] >= 1, rows
    assert all(r["lost"] == r["torn"] == 0 for r in rows if r["saver"] == "safe"), rows


_KILLED_HOLDER = """
import sys, time
from chaos.scratch import make_root
from faults.blocklog import logged_fs
root = make_root("chaos-blocklog-", sys.argv[1])
with logged_fs(root, "ext4", 64 << 20) as lf:
    lf.start()
    print(root, flush=True)
    time.sleep(60)
"""


@real
def test_chaos_clean_sweeps_what_a_sigkilled_holder_left_mounted_and_attached(tmp_path, claims):
    """SIGKILL leaves the file system, its loop device, the FUSE mount and the block-log daemon
    behind; the sweep of the dead holder's claimed root (``chaos clean``) takes all four."""
    from chaos import scratch

    base = tmp_path / "base"
    base.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", _KILLED_HOLDER, str(base)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout is not None
        root = p.stdout.readline().strip()
        assert root, p.stderr.read() if p.stderr else ""
        held = leftovers(root)
        assert len(held["mounts"]) == 2 and len(held["loops"]) == 1, held
        [dev] = held["loops"]
        p.kill()
        p.wait(timeout=30)
        assert leftovers(root)["loops"], "the SIGKILL took the loop device with it; nothing to test"
        swept = scratch.sweep()
        assert [s.pid for s in swept] == [p.pid], swept
        assert leftovers(root) == {"mounts": [], "loops": []} and not _daemons(root)
        assert not os.path.exists(root) and not swept[0].refused, swept[0].refused
        # by its name, not its backing path: once the FUSE mount beneath is gone that reads "/disk.img"
        assert swept[0].detached == [dev] and not os.path.exists(f"/sys/block/{os.path.basename(dev)}/loop")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
