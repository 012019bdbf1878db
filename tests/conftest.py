"""Session-wide hygiene of the test suite itself: nothing escapes it.

At the start of a session the repository's ``git status``, the system temp directory
and the user's chaos cache are recorded; at the end anything new in them fails the
run (exit status 1) with the list of what was left — the check observes before
anything is cleaned. Names below ``ALLOWED_TMP`` belong to the test runner or to
Python itself and go away on their own.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# pytest's own tmp_path root; multiprocessing's per-process dir (removed at exit); a
# non-root user's claims directory (chaos.scratch: kept, private, its claim files removed
# at each harness's exit; root's lies under /run).
ALLOWED_TMP = ("pytest-of-*", "pymp-*", "chaos-claims-*")
# The native tracer's compiled library, kept in the user's chaos cache across runs as the
# golden runs are (chaos.scratch.cache_root): the first job exploration on a machine makes it.
ALLOWED_CACHE = ("native",)
_KEY = pytest.StashKey[dict]()


def _git_status() -> str | None:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _listing(path: Path) -> set[str]:
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


def _places() -> dict[str, Path]:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chaos"
    state = Path.home() / ".local" / "state" / "chaos"  # the real one: the session points XDG_STATE_HOME away
    return {"temp directory": Path(tempfile.gettempdir()), "user cache": cache, "user state": state}


def snapshot() -> dict:
    return {"git": _git_status(), **{name: _listing(p) for name, p in _places().items()}}


def escaped(before: dict, after: dict) -> list[str]:
    """What the session left behind: new files in the checkout, temp dir or chaos cache."""
    found = []
    if before["git"] is not None and after["git"] is not None and after["git"] != before["git"]:
        new = sorted(set(after["git"].splitlines()) - set(before["git"].splitlines()))
        found += [f"repository: {line.strip()}" for line in new] or ["repository: git status changed"]
    for name, path in _places().items():
        for entry in sorted(after[name] - before[name]):
            if name == "temp directory" and any(fnmatch.fnmatchcase(entry, g) for g in ALLOWED_TMP):
                continue
            if name == "user cache" and entry in ALLOWED_CACHE:
                continue
            found.append(f"{name}: {path / entry}")
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # under pytest-xdist the controller checks, once
        session.stash[_KEY] = snapshot()
    # Per-user state the harness keeps (chaos.model.resultschema's origin key) goes to the session's
    # own folder: a test run writes nothing in the real home. suites/conftest.py does the same.
    os.environ["XDG_STATE_HOME"] = str(session.config._tmp_path_factory.mktemp("xdg-state"))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.stash.get(_KEY, None)
    if before is None or os.environ.get("CHAOS_SKIP_ESCAPE_CHECK"):
        return
    left = escaped(before, snapshot())
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["the test session wrote outside its scratch roots:"] + [f"  {x}" for x in left[:50]]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private claims directory for this test (``chaos.scratch``): its sweeps see only its own claims."""
    from chaos import scratch

    d = tmp_path / "claims"
    monkeypatch.setenv(scratch.CLAIMS_ENV, str(d))
    return d
