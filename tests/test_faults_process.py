"""Signals reach whole process groups, and reaping leaves nothing of a group alive."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from faults import process as P

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def spawn(cmd: list[str]) -> subprocess.Popen:
    p = subprocess.Popen(cmd, start_new_session=True)  # pgid == pid
    deadline = time.monotonic() + 5
    while not P.group_members(p.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return p


def test_reap_group_kills_children_and_grandchildren() -> None:
    p = spawn(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    deadline = time.monotonic() + 5
    while len(P.group_members(p.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    members = P.group_members(p.pid)
    assert len(members) == 3 and all(P.alive(m) for m in members)
    rec = P.reap_group(p.pid, timeout=5)
    assert rec["survivors"] == [] and sorted(rec["members_before"]) == members
    assert P.group_members(p.pid) == []
    assert p.wait(timeout=5) == -9  # exit status left for its owner
    assert not any(P.alive(m) for m in members)


def test_terminate_escalates_only_when_ignored() -> None:
    polite = spawn(["sleep", "60"])
    rec = P.terminate_group(polite.pid, grace_s=2)
    assert rec["escalated"] is False and rec["survivors"] == []
    assert polite.wait(timeout=5) == -15
    stubborn = spawn([sys.executable, "-c", IGNORE_TERM])
    time.sleep(0.3)  # let it install the handler
    t = time.monotonic()
    rec = P.terminate_group(stubborn.pid, grace_s=0.5)
    assert rec["escalated"] is True and rec["survivors"] == [] and time.monotonic() - t >= 0.5
    assert stubborn.wait(timeout=5) == -9


def test_stop_and_cont() -> None:
    p = spawn(["sleep", "60"])
    try:
        P.stop_group(p.pid)
        deadline = time.monotonic() + 5
        while P.state(p.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert P.state(p.pid) == "T" and P.alive(p.pid)
        P.cont_group(p.pid)
        deadline = time.monotonic() + 5
        while P.state(p.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert P.state(p.pid) in ("S", "R")
    finally:
        P.reap_group(p.pid)
        p.wait()


def test_alive_treats_zombies_as_dead() -> None:
    p = spawn(["sleep", "60"])
    P.kill_group(p.pid)
    deadline = time.monotonic() + 5
    while P.alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert P.state(p.pid) == "Z" and not P.alive(p.pid)  # not yet waited for
    p.wait()
    assert P.state(p.pid) is None
    assert P.signal_group(p.pid, 0)["delivered"] is False  # empty group is not an error


def test_reap_raises_if_something_survives(monkeypatch: pytest.MonkeyPatch) -> None:
    from faults import FaultError

    monkeypatch.setattr(P, "group_members", lambda pgid: [12345678])
    monkeypatch.setattr(P, "state", lambda pid: "D")
    with pytest.raises(FaultError, match="survived"):
        P.reap_group(987654321, timeout=0.2)


def test_read_pidfile_names_only_a_live_process_and_never_follows_a_link(tmp_path) -> None:
    pidfile = tmp_path / "d.pid"
    assert P.read_pidfile(pidfile) is None  # no file
    pidfile.write_text(f"{os.getpid()}\n")
    assert P.read_pidfile(pidfile) == os.getpid()
    for text in ("", "0", "-1", "x12", "9" * 40):
        pidfile.write_text(text)
        assert P.read_pidfile(pidfile) is None, text
    gone = subprocess.Popen(["true"])
    gone.wait()
    pidfile.write_text(str(gone.pid))
    assert P.read_pidfile(pidfile) is None  # its process has ended
    link = tmp_path / "link.pid"
    (tmp_path / "real.pid").write_text(str(os.getpid()))
    link.symlink_to(tmp_path / "real.pid")
    assert P.read_pidfile(link) is None  # a link swapped in for the pidfile is not read
    fifo = tmp_path / "fifo.pid"
    os.mkfifo(fifo)
    assert P.read_pidfile(fifo) is None  # a FIFO without a writer: no hang
