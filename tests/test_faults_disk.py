"""Disk full is a real ENOSPC from the kernel, and no mount or filler outlives its test."""

from __future__ import annotations

import errno
import json
import os
import pathlib

import pytest

from faults import FaultError, OutsideScratchRoot, disk

OK, WHY = disk.can_mount_tmpfs()
needs_tmpfs = pytest.mark.skipif(not OK, reason=f"no private tmpfs here: {WHY}")


def in_child(fn) -> dict:  # type: ignore[no-untyped-def]
    """Run ``fn`` in a forked child; return the dict it produced (as JSON over a pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out: dict = {}
        try:
            os.close(r)
            out = fn()
        except BaseException as e:
            out = {"error": repr(e)}
        finally:
            os.write(w, json.dumps(out).encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@needs_tmpfs
def test_private_tmpfs_gives_enospc_and_leaks_nothing(tmp_path: pathlib.Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step-1").mkdir()
    (ckpt / "step-1" / "old.bin").write_bytes(b"o" * 1000)
    assert disk.mounts_under(tmp_path) == []

    def child() -> dict:
        rec = disk.private_tmpfs(ckpt, 1 << 20, scratch_root=tmp_path)
        seen_old = (ckpt / "step-1" / "old.bin").read_bytes() == b"o" * 1000
        mounted = disk.mounts_under(ckpt)
        try:
            with open(ckpt / "big.bin", "wb") as f:
                f.write(os.urandom(2 << 20))
            code = 0
        except OSError as e:
            code = e.errno
        return {"rec": rec, "seen_old": seen_old, "mounted": mounted, "errno": code,
                "written": os.path.getsize(ckpt / "big.bin")}

    out = in_child(child)
    assert "error" not in out, out
    assert out["errno"] == errno.ENOSPC
    assert out["written"] <= 1 << 20
    assert out["seen_old"] and out["rec"]["copied_files"] == 1
    assert out["rec"]["mechanism"] == "tmpfs-private-ns"
    assert out["mounted"] == [str(ckpt.resolve())]
    # the parent never saw the mount, and the child's writes stayed in its namespace
    assert disk.mounts_under(tmp_path) == []
    assert not (ckpt / "big.bin").exists()
    assert str(ckpt.resolve()) not in open("/proc/self/mountinfo").read()


@needs_tmpfs
def test_mounted_tmpfs_and_prefill_leave_exact_room(tmp_path: pathlib.Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    try:
        with disk.mounted_tmpfs(ckpt, 4 << 20, scratch_root=tmp_path) as rec:
            assert disk.mounts_under(tmp_path) == [str(ckpt.resolve())]
            assert rec["mechanism"] == "tmpfs-mount" and disk.fs_type(ckpt) == "tmpfs"
            with disk.filled(ckpt, 256 << 10, scratch_root=tmp_path) as fill:
                assert abs(fill.free_after - (256 << 10)) <= 4096
                (ckpt / "fits").write_bytes(bytes(128 << 10))
                with pytest.raises(OSError) as e:
                    (ckpt / "too_big").write_bytes(bytes(256 << 10))
                assert e.value.errno == errno.ENOSPC
            assert not [p for p in os.listdir(ckpt) if p.startswith(disk.FILLER_PREFIX)]
            assert (ckpt / "too_big").stat().st_size < 256 << 10
    finally:
        disk.unmount_all(ckpt)
    assert disk.mounts_under(tmp_path) == []


def test_prefill_refuses_shared_disks_and_outside_root(tmp_path: pathlib.Path) -> None:
    if disk.fs_type(tmp_path) != "tmpfs":
        with pytest.raises(FaultError, match="refusing to fill"):
            disk.prefill(tmp_path, 1 << 20, scratch_root=tmp_path)
    with pytest.raises(OutsideScratchRoot):
        disk.prefill("/", 0, scratch_root=tmp_path)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(disk.FILLER_PREFIX)]


def test_probe_answers_with_a_reason() -> None:
    ok, why = disk.can_mount_tmpfs()
    assert isinstance(ok, bool) and why
    if os.geteuid() != 0:
        assert not ok and "root" in why
