"""#32: ``chaos certify`` on the storage people mount, with nothing but the path on its command line.

Each row mounts a real file system here (s3fs-fuse over the embedded S3, a tmpfs, ext4 on a
loop image) and runs ``chaos certify --backend file:///MOUNT`` as a user would. A mount
that is refused is a strict xfail that names the exact failure it expects: the test
checks the refusal is exactly that and then raises :class:`NotCertified`, so any other
failure is a plain test failure, and a mount that becomes certified one day shows up as
an unexpected pass. Minutes each: marked ``storage`` (the nightly runs it). Rows skip with
the reason where root, FUSE or a tool is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from faults.errors import Unsupported

pytestmark = [pytest.mark.storage, pytest.mark.root]


class NotCertified(Exception):
    """The mount was refused exactly as its row expects."""


def _certify(mount: str, tmp_path) -> dict:
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "chaos.cli.main", "certify", "--backend", f"file://{mount}",
                           "--json", str(out), "--scratch", str(tmp_path)], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert (done.returncode == 0) == (report["verdict"] == "CERTIFIED"), done.stdout[-1000:]
    return report


def _refused_exactly(report: dict, failing: list[str]) -> None:
    """Raise NotCertified when the report refuses the mount for exactly ``failing``; anything else fails the test."""
    assert report["verdict"] == "NOT CERTIFIED" and report["failing"] == failing, (
        report["verdict"], report["failing"], report["not_tested"])
    raise NotCertified(f"{report['backend']}: {', '.join(failing)}")


def _property(report: dict, name: str) -> dict:
    return next(p for p in report["properties"] if p["name"] == name)


def _mounted(cm):
    try:
        return cm.__enter__()
    except Unsupported as exc:
        pytest.skip(str(exc))


@pytest.mark.xfail(strict=True, raises=NotCertified,
                   reason="s3fs renames a directory object by object: a client crash leaves a half-renamed step")
def test_an_s3fs_mount_over_s3(tmp_path):
    from chaos.certify.local_s3 import LocalS3
    from chaos.certify.mounts import fuse_ready, s3fs_mount

    why = fuse_ready("s3fs", "strace")
    if why:
        pytest.skip(why)
    with LocalS3("chaos-storage") as s3:
        cm = s3fs_mount(s3.endpoint, s3.bucket, str(tmp_path))
        mnt = _mounted(cm)
        try:
            report = _certify(mnt, tmp_path)
        finally:
            cm.__exit__(None, None, None)
    crash = _property(report, "client_crash")
    assert "step-0000000002" in crash["summary"], crash["summary"]
    assert any("rename" in t["where"] for t in crash["evidence"]["tried"] if t["violations"])
    _refused_exactly(report, ["client_crash"])


@pytest.mark.xfail(strict=True, raises=NotCertified, reason="a tmpfs loses every checkpoint at a node crash")
def test_a_tmpfs(tmp_path):
    from chaos.certify.mounts import tmpfs_mount

    cm = tmpfs_mount(str(tmp_path), "4g")  # room for the power-loss scenario's crash states (memory only as written)
    mnt = _mounted(cm)
    try:
        report = _certify(mnt, tmp_path)
    finally:
        cm.__exit__(None, None, None)
    assert "Staging only" in _property(report, "durable_medium")["summary"]
    _refused_exactly(report, ["durable_medium"])


def test_ext4_on_a_loop_image_is_certified(tmp_path):
    from chaos.certify.mounts import loop_mount

    cm = loop_mount(str(tmp_path), "ext4", 4096)  # sparse: room for the power-loss scenario's crash states
    mnt = _mounted(cm)
    try:
        report = _certify(mnt, tmp_path)
    finally:
        cm.__exit__(None, None, None)
    assert report["verdict"] == "CERTIFIED", (report["failing"], report["not_tested"])
    block = _property(report, "block_power_loss")
    assert block["status"] == "pass" and "distinct" in block["summary"]
    assert _property(report, "client_crash")["status"] == "n/a"
