"""The suite's own escape check (tests/conftest.py) fails a session that leaves files behind."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LEAKY = """
import tempfile
def test_leaks():
    tempfile.mkdtemp(prefix="chaos-escape-probe-")
"""
TIDY = """
def test_tidy(tmp_path):
    (tmp_path / "x").write_text("inside pytest's own temp root")
"""


def _session(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_probe.py").write_text(body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "CHAOS_SKIP_ESCAPE_CHECK": ""})


def test_a_session_that_leaves_a_temp_dir_fails_and_names_it(tmp_path):
    before = set(Path(tempfile.gettempdir()).glob("chaos-escape-probe-*"))
    try:
        out = _session(tmp_path, LEAKY)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "wrote outside its scratch roots" in out.stdout and "chaos-escape-probe-" in out.stdout
    finally:
        for p in set(Path(tempfile.gettempdir()).glob("chaos-escape-probe-*")) - before:
            shutil.rmtree(p, ignore_errors=True)


def test_a_tidy_session_passes(tmp_path):
    out = _session(tmp_path, TIDY)
    assert out.returncode == 0, out.stdout + out.stderr
