"""The one registry of launched processes: kill_all's scope, a job's marked children, what it forgets."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from chaos.launch import reaper
from chaos.model.contract import ENV_MARK
from faults.process import alive, marked_with

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
# A job copy that starts a child in a session of its own (as torchrun's workers do): only its mark finds it.
ESCAPES = [sys.executable, "-c", "import subprocess, sys, time; "
           "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True).pid, "
           "flush=True); time.sleep(60)"]


def _copy(argv: list[str], mark: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env={**os.environ, ENV_MARK: mark}, stdout=subprocess.PIPE, start_new_session=True)


def test_kill_all_keeps_to_its_scope_and_finds_a_marked_copys_escaped_children() -> None:
    a, b = f"scope-a-{os.getpid()}", f"scope-b-{os.getpid()}"  # no other test run's copies
    ours, theirs = _copy(ESCAPES, a), _copy(SLEEP, b)
    reaper.track(ours, a, marked=True)
    reaper.track(theirs, b, marked=True)
    try:
        assert ours.stdout is not None
        child = int(ours.stdout.readline())
        deadline = time.monotonic() + 10  # a process just started may not show its environment in /proc yet
        while child not in marked_with(ENV_MARK, a) and time.monotonic() < deadline:
            time.sleep(0.01)
        reaper.kill_all(scope=a)
        assert ours.wait(timeout=10) < 0 and not alive(child)
        assert theirs.poll() is None, "another scope's copy runs on"
        assert ours.pid in reaper._live, "a marked copy is forgotten by the attempt that waits for it"
        reaper.forget(ours)
        reaper.kill_all()
        assert theirs.wait(timeout=10) < 0
    finally:
        reaper.forget(ours, theirs)
        for p in (ours, theirs):
            p.kill()
            p.wait()
        reaper.kill_marked(a)
