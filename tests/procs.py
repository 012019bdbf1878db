"""Process checks the leak tests share (imported as ``procs``, like ``ckpt_dist``)."""

from __future__ import annotations

import os
from pathlib import Path


def live_holders(root: str | Path) -> list[str]:
    """Live processes (not zombies, not this one) whose command line, cwd or an open file names ``root``:
    what a test that cleaned up must find none of (a daemon, a slurmstepd, a job's child)."""
    found, needle = [], str(root)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            links = [os.readlink(f"/proc/{entry}/cwd")]
            links += [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        if needle in cmdline or any(link.startswith(needle) for link in links):
            found.append(f"{entry}: {cmdline[:120]}")
    return found
