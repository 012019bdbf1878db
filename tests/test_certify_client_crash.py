"""#32: certify crashes the storage client of a FUSE mount, not only the checkpointer.

The cheap tests run per commit: finding an s3fs daemon from its mount, killing it and
mounting it again with its own command line; planning crash points. The whole property on
s3fs (about a minute) is in the ``storage`` suite (``suites/test_storage.py``).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from chaos.certify.clientcrash import Op, Point, plan
from chaos.certify.mounts import fuse_ready, s3fs_mount
from faults.disk import mount_of
from faults.errors import Unsupported
from faults.fusemount import alive, find_daemon, kill, remount


@pytest.fixture()
def s3fs(tmp_path):
    """An s3fs-fuse mount over the embedded S3; afterwards no s3fs daemon serves anything under tmp_path."""
    why = fuse_ready("s3fs", "strace")
    if why:
        pytest.skip(why)
    from chaos.certify.local_s3 import LocalS3

    with LocalS3("chaos-fuse") as s3, s3fs_mount(s3.endpoint, s3.bucket, str(tmp_path)) as mnt:
        yield mnt
    left = subprocess.run(["pgrep", "-af", f"s3fs .*{tmp_path}"], capture_output=True, text=True).stdout
    assert not left.strip(), f"an s3fs daemon outlived its mount: {left}"
    assert mount_of(str(tmp_path / "mnt"))["mount_point"] != str(tmp_path / "mnt"), "the mount outlived the test"


def test_the_daemon_of_an_s3fs_mount_is_found_killed_and_mounted_again(s3fs):
    with open(os.path.join(s3fs, "kept"), "w") as f:
        f.write("acknowledged")
        f.flush()
        os.fsync(f.fileno())
    daemon = find_daemon(os.path.join(s3fs, "kept"))  # any path under the mount finds its daemon
    assert daemon.fstype == "fuse.s3fs" and daemon.mount_point == s3fs
    assert daemon.argv[0].endswith("s3fs") and s3fs in daemon.argv
    kill(daemon)
    assert not alive(daemon.pid)
    with pytest.raises(OSError):  # a dead client: ENOTCONN, the mount answers nothing
        os.listdir(s3fs)
    fresh = remount(daemon)
    assert fresh.pid != daemon.pid and fresh.argv == daemon.argv and alive(fresh.pid)
    with open(os.path.join(s3fs, "kept")) as f:
        assert f.read() == "acknowledged"  # fsynced before the crash: uploaded, so still there


def test_a_path_on_no_fuse_mount_has_no_daemon_to_crash(tmp_path):
    with pytest.raises(Unsupported, match="not a FUSE mount"):
        find_daemon(str(tmp_path))


def test_client_crash_is_not_judged_where_there_is_no_client_of_its_own(tmp_path):
    from chaos.certify import certify

    d = tmp_path / "backend"
    d.mkdir()
    report = certify(f"file://{d}", None, campaign=False, throughput_mib=0, only=["client_crash"])
    p = report["properties"][0]
    assert p["name"] == "client_crash" and p["status"] == "n/a" and "not a FUSE mount" in p["summary"]
    assert report["failing"] == []


def test_the_plan_crashes_at_every_request_that_fits_and_before_every_operation():
    ops = [Op("mkdir d", 1, ("PUT /b/d/",)), Op("write x", 0), Op("fsync 3", 1, ("PUT /b/d/x",)),
           Op("rename d", 4, ("PUT /b/e/", "PUT /b/e/x", "DELETE /b/d/x", "DELETE /b/d/"))]
    points = plan(ops, max_points=40)
    assert points[-1] == Point(len(ops) + 1), "always once after the save returned"
    assert {Point(4, k) for k in (1, 2, 3, 4)} <= set(points), "every request of the rename"
    assert {Point(i) for i in (1, 2, 3, 4)} <= set(points), "before every operation"
    assert Point(4, 2).describe(ops) == "as request 2 of op 4 (rename d) left: PUT /b/e/x"
    small = plan(ops, max_points=6)
    assert len(small) <= 6 and small[-1] == Point(5)
    many = [Op(f"fsync {i}", 50, ()) for i in range(10)]
    assert len(plan(many, max_points=20)) <= 20


def test_without_strace_a_fuse_mount_is_not_tested_rather_than_failed(s3fs, monkeypatch):
    """The crashes inside an operation need strace: without it the property says so (n/a), never fail."""
    import shutil

    from chaos.certify import certify

    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "strace" else which(name, *a, **k))
    report = certify(f"file://{s3fs}", None, campaign=False, throughput_mib=0, only=["client_crash"])
    p = report["properties"][0]
    assert p["status"] == "n/a" and "strace is not installed" in p["summary"] and report["failing"] == []
