"""The golden-run cache key covers every source a golden result depends on."""

from pathlib import Path

from chaos.model import statehash
from chaos.record import golden
from chaos.target.workload.config import WorkloadConfig


def test_the_key_changes_when_the_fingerprint_code_changes(monkeypatch, tmp_path):
    cfg = WorkloadConfig()
    before = golden.golden_key(cfg, 2, "gloo")
    assert Path(statehash.__file__) in golden.golden_sources()
    edited = tmp_path / "statehash.py"
    edited.write_bytes(Path(statehash.__file__).read_bytes() + b"\n# a changed fingerprint\n")
    monkeypatch.setattr(statehash, "__file__", str(edited))
    assert golden.golden_key(cfg, 2, "gloo") != before
