"""The reference checkpointer's metrics through prometheus_client, and its alert rules file.

What is checked: the exposition text and the ``metrics.prom`` textfile come from the
instance's own registry (parsed back with prometheus_client's parser, values asserted);
instances in one process do not share counters; the textfile is written atomically and a
failure to write it only logs; a dead writer's temp file is removed; the optional HTTP
endpoint serves the registry and frees its port on close; bad ports are typed errors.
The shipped ``alerts.yml`` is a Prometheus rules file whose every expression reads
metrics exported here (PyYAML, always), that ``promtool check rules`` accepts, and whose
three alerts fire, in ``promtool test rules``, on series recorded from a real
:class:`Metrics` — those two only where promtool is installed.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
import urllib.request
from collections import namedtuple

import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from chaos.errors import ConfigError
from chaos.launch.ports import free_port
from chaos.reference.checkpoint.metrics import (
    ALERT_RULES,
    AUXILIARY_FILES,
    Metrics,
    alert_rules_path,
)
from chaos.reference.ckptformat.errors import CheckpointConfigError

Usage = namedtuple("Usage", "total used free")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of an exposition text."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def _drive(m: Metrics) -> None:
    for step, seconds in enumerate([1.0, 1.1, 0.9, 1.0]):
        m.save(step, True, seconds, seconds / 2, 1000, 4000)
    m.save(4, True, 5.0, 5.0, 1000, 4000)  # a latency spike
    m.save(5, False, 0.2, 0.2, 0, 0, error="EIO")
    m.reject(3, "rank 0: shard x: checksum mismatch")
    m.reject(2, "rank 1: manifest missing")
    m.load(2, "loaded", 0.5, 3000, True, [(3, "checksum"), (2, "missing")])


def test_text_and_textfile_are_the_registry(tmp_path):
    m = Metrics(str(tmp_path), 0)
    _drive(m)
    text = m.prometheus_text()
    assert value(text, "chaos_ckpt_saves_total", rank="0", outcome="ok") == 5
    assert value(text, "chaos_ckpt_saves_total", rank="0", outcome="failed") == 1
    assert value(text, "chaos_ckpt_save_seconds_count", rank="0") == 5
    assert value(text, "chaos_ckpt_save_seconds_sum", rank="0") == pytest.approx(9.0)
    assert value(text, "chaos_ckpt_save_seconds_bucket", rank="0", le="1.0") == 3  # 1.0, 0.9, 1.0
    assert value(text, "chaos_ckpt_save_seconds_bucket", rank="0", le="+Inf") == 5
    assert value(text, "chaos_ckpt_save_bytes_total", rank="0") == 5000
    assert value(text, "chaos_ckpt_stall_seconds_total", rank="0") == pytest.approx(2.0 + 5.0 + 0.2)
    assert value(text, "chaos_ckpt_last_save_step", rank="0") == 4
    assert value(text, "chaos_ckpt_last_checkpoint_bytes", rank="0") == 4000
    assert value(text, "chaos_ckpt_rejected_checkpoints_total", rank="0") == 2
    assert value(text, "chaos_ckpt_checksum_failures_total", rank="0") == 1
    assert value(text, "chaos_ckpt_loads_total", rank="0", outcome="loaded") == 1
    assert value(text, "chaos_ckpt_load_bytes_total", rank="0") == 3000
    assert value(text, "chaos_ckpt_alerts_total", rank="0", rule="save_latency_spike") == 1
    assert value(text, "chaos_ckpt_alerts_total", rank="0", rule="checksum_failure") == 1
    assert value(text, "chaos_ckpt_alerts_total", rank="0", rule="disk_nearly_full") == 0
    assert value(text, "chaos_ckpt_disk_free_bytes", rank="0") > 0
    assert "# TYPE chaos_ckpt_save_seconds histogram" in text
    # The events the harness records are unchanged by the exposition.
    assert [e["rule"] for e in m.events if e["kind"] == "alert"] == ["save_latency_spike", "checksum_failure"]
    # Rank 0's textfile is the same text, and the atomic write left no temp file behind.
    assert (tmp_path / "metrics.prom").read_text() == text
    assert os.listdir(tmp_path) == ["metrics.prom"]


def test_disk_alert_and_its_gauges(tmp_path, monkeypatch):
    m = Metrics(str(tmp_path), 0)
    monkeypatch.setattr("shutil.disk_usage", lambda p: Usage(10_000, 9_000, 1_000))
    m.save(1, True, 1.0, 1.0, 100, 100)
    assert not [e for e in m.events if e["kind"] == "alert"], "1000 free of 10000 and a 100-byte checkpoint: fine"
    m.save(2, True, 1.0, 1.0, 600, 600)  # twice the checkpoint no longer fits
    assert [e["rule"] for e in m.events if e["kind"] == "alert"] == ["disk_nearly_full"]
    text = m.prometheus_text()
    assert value(text, "chaos_ckpt_disk_free_bytes", rank="0") == 1000
    assert value(text, "chaos_ckpt_disk_total_bytes", rank="0") == 10_000
    assert value(text, "chaos_ckpt_alerts_total", rank="0", rule="disk_nearly_full") == 1


def test_instances_in_one_process_keep_their_own_registries(tmp_path):
    a = Metrics(str(tmp_path / "a"), 0)
    b = Metrics(str(tmp_path / "b"), 1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a.save(1, True, 1.0, 1.0, 10, 10)
    a.save(2, True, 1.0, 1.0, 10, 10)
    b.save(1, True, 1.0, 1.0, 10, 10)
    assert value(a.prometheus_text(), "chaos_ckpt_saves_total", rank="0", outcome="ok") == 2
    assert value(b.prometheus_text(), "chaos_ckpt_saves_total", rank="1", outcome="ok") == 1
    assert not any(k[0].startswith("chaos_ckpt") for k in samples(a.prometheus_text()) if ("rank", "1") in k[1])
    # Nothing went to the process-wide default registry, and only rank 0 writes the textfile.
    assert not [f.name for f in REGISTRY.collect() if f.name.startswith("chaos_ckpt")]
    assert os.listdir(tmp_path / "a") == ["metrics.prom"] and os.listdir(tmp_path / "b") == []


def test_metrics_off_writes_no_file(tmp_path):
    m = Metrics(str(tmp_path), 0, write_file=False)
    m.save(1, True, 1.0, 1.0, 10, 10)
    assert os.listdir(tmp_path) == [] and value(m.prometheus_text(), "chaos_ckpt_saves_total", rank="0", outcome="ok") == 1


def test_a_textfile_that_cannot_be_written_only_logs(tmp_path, caplog):
    root = tmp_path / "gone"  # never created: the write fails
    m = Metrics(str(root), 0)
    with caplog.at_level(logging.WARNING, logger="chaos.reference.checkpoint"):
        event = m.save(1, True, 1.0, 1.0, 10, 10)
    assert event["ok"] and not root.exists()
    assert any("could not write" in r.getMessage() and "metrics.prom" in r.getMessage() for r in caplog.records)


def test_the_textfile_temp_name_is_declared_auxiliary(tmp_path, monkeypatch):
    """The temp file prometheus_client writes beside metrics.prom matches AUXILIARY_FILES."""
    seen = []
    real = os.rename

    def spy(src, dst, *a, **k):
        seen.append((os.path.basename(src), os.path.basename(dst)))
        return real(src, dst, *a, **k)

    m = Metrics(str(tmp_path), 0)
    monkeypatch.setattr(os, "rename", spy)
    m.save(1, True, 1.0, 1.0, 10, 10)
    monkeypatch.undo()
    assert seen and seen[-1][1] == "metrics.prom"
    tmp = seen[-1][0]
    assert tmp == f"metrics.prom.{os.getpid()}.{threading.get_ident()}"
    assert any(fnmatch.fnmatchcase(tmp, g) for g in AUXILIARY_FILES)
    assert any(fnmatch.fnmatchcase("metrics.prom", g) for g in AUXILIARY_FILES)


def test_a_dead_writers_temp_file_is_removed_a_live_ones_kept(tmp_path):
    dead = 2**22 + 12345  # above any Linux pid_max: no such process
    (tmp_path / f"metrics.prom.{dead}.1").write_text("half")
    (tmp_path / f"metrics.prom.{os.getppid()}.2").write_text("in progress")  # the parent is alive
    (tmp_path / "metrics.prom.notes").write_text("not ours")
    Metrics(str(tmp_path), 1)  # rank 1 writes no textfile: it leaves everything alone
    assert len(os.listdir(tmp_path)) == 3
    Metrics(str(tmp_path), 0)
    assert sorted(os.listdir(tmp_path)) == sorted([f"metrics.prom.{os.getppid()}.2", "metrics.prom.notes"])


def test_http_endpoint_serves_the_registry_and_close_frees_the_port(tmp_path):
    base = free_port() - 1  # rank 1 serves on base + 1
    m = Metrics(str(tmp_path), 1, port=base, addr="127.0.0.1")
    try:
        assert m.http_address == ("127.0.0.1", base + 1)
        m.save(7, True, 1.0, 1.0, 10, 10)
        with urllib.request.urlopen(f"http://127.0.0.1:{base + 1}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert value(body, "chaos_ckpt_saves_total", rank="1", outcome="ok") == 1
        assert value(body, "chaos_ckpt_last_save_step", rank="1") == 7
    finally:
        m.close()
    m.close()  # idempotent
    assert m.http_address is None
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", base + 1))  # free again


def test_a_port_in_use_and_bad_ports_are_typed_errors(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"metrics_port {port}: rank 0 cannot serve metrics on 127.0.0.1:{port}"):
            Metrics(str(tmp_path), 0, port=port, addr="127.0.0.1")
    for bad in (-5, 70000, "9100", True):
        with pytest.raises(CheckpointConfigError, match="metrics_port"):
            Metrics(str(tmp_path), 0, port=bad)
    assert os.listdir(tmp_path) == []


# -- the rules file -----------------------------------------------------------------

def _rules() -> list[dict]:
    with open(alert_rules_path()) as f:
        doc = yaml.safe_load(f)
    assert set(doc) == {"groups"} and isinstance(doc["groups"], list) and doc["groups"]
    rules = []
    for group in doc["groups"]:
        assert isinstance(group.get("name"), str) and group["name"]
        assert isinstance(group.get("rules"), list) and group["rules"]
        rules += group["rules"]
    return rules


def _exported_names(tmp_path) -> set[str]:
    m = Metrics(str(tmp_path), 0, write_file=False)
    _drive(m)
    return {name for name, _ in samples(m.prometheus_text())}


def test_rules_file_has_the_three_alerts_and_reads_only_exported_metrics(tmp_path):
    rules = _rules()
    assert [r["alert"] for r in rules] == ["CheckpointSaveLatencySpike", "CheckpointChecksumFailure", "CheckpointDiskNearlyFull"]
    assert len(ALERT_RULES) == len(rules)
    exported = _exported_names(tmp_path)
    for r in rules:
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
        assert re.fullmatch(r"\d+[smh]", str(r["for"])), r["alert"]
        assert r["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description"} <= set(r["annotations"])
        names = set(re.findall(r"\bchaos_ckpt_\w+", r["expr"]))
        assert names, f"{r['alert']} reads no checkpoint metric"
        assert names <= exported, f"{r['alert']} reads metrics nobody exports: {sorted(names - exported)}"
    # The thresholds are the checkpointer's defaults.
    m = Metrics("/nonexistent", 1, write_file=False)
    assert f"> on (job, instance, rank) {m.latency_factor:g} * histogram_quantile" in rules[0]["expr"]
    assert f"< {m.disk_free_fraction:g} * chaos_ckpt_disk_total_bytes" in rules[2]["expr"]


@needs_promtool
def test_promtool_accepts_the_rules_file():
    out = subprocess.run([PROMTOOL, "check", "rules", alert_rules_path()], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 3 rules found" in out.stdout


INSTANCE = {"job": "node", "instance": "trainer-0:9100"}


def _series(scrapes: list[str]) -> list[dict]:
    """promtool ``input_series`` from one exposition text per minute ('_' where absent)."""
    per = [samples(t) for t in scrapes]
    out = []
    for key in sorted({k for s in per for k in s if not k[0].endswith("_created")}):
        name, labels = key
        selector = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted({**dict(labels), **INSTANCE}.items())) + "}"
        out.append({"series": selector, "values": " ".join(repr(s[key]) if key in s else "_" for s in per)})
    return out


@needs_promtool
def test_the_rules_fire_on_series_recorded_from_metrics(tmp_path, monkeypatch):
    """Minute by minute: ten 1 s saves, a 5 s save (spike), a checksum rejection, then a full disk."""
    disk = {"free": 10**12}
    monkeypatch.setattr("shutil.disk_usage", lambda p: Usage(10**12, 10**12 - disk["free"], disk["free"]))
    m = Metrics(str(tmp_path), 0, write_file=False)
    scrapes = [m.prometheus_text()]  # minute 0: nothing yet
    for minute in range(1, 26):
        if minute <= 10 or minute >= 15:
            if minute == 15:
                disk["free"] = 10_000  # under 5% and under twice the checkpoint
            m.save(minute, True, 1.0, 1.0, 50_000, 50_000)
        elif minute == 11:
            m.save(minute, True, 5.0, 5.0, 50_000, 50_000)
        elif minute == 13:
            m.reject(10, "rank 0: shard-r00000.safetensors: checksum mismatch")
        scrapes.append(m.prometheus_text())
    assert [e["rule"] for e in m.events if e["kind"] == "alert"][:2] == ["save_latency_spike", "checksum_failure"]

    labels = {**INSTANCE, "rank": "0"}
    summary = {
        "CheckpointSaveLatencySpike": "Checkpoint save latency spike on rank 0 (trainer-0:9100)",
        "CheckpointChecksumFailure": "Checkpoint checksum failure on rank 0 (trainer-0:9100)",
        "CheckpointDiskNearlyFull": "Checkpoint disk nearly full on rank 0 (trainer-0:9100)",
    }
    rules = {r["alert"]: r for r in _rules()}

    def firing(name: str, **extra: str) -> dict:
        return {"exp_labels": {**labels, "severity": rules[name]["labels"]["severity"]},
                "exp_annotations": {"summary": summary[name], **extra}}

    spike = firing("CheckpointSaveLatencySpike", description=rules["CheckpointSaveLatencySpike"]["annotations"]["description"]
                   .replace("{{ $value | humanizeDuration }}", "5s"))
    checksum = firing("CheckpointChecksumFailure", description=rules["CheckpointChecksumFailure"]["annotations"]["description"])
    full = firing("CheckpointDiskNearlyFull", description=rules["CheckpointDiskNearlyFull"]["annotations"]["description"]
                  .replace("{{ $value | humanize1024 }}", "9.766ki"))
    cases = [
        ("10m", "CheckpointSaveLatencySpike", []), ("11m", "CheckpointSaveLatencySpike", [spike]),
        ("12m", "CheckpointChecksumFailure", []), ("13m", "CheckpointChecksumFailure", [checksum]),
        ("16m", "CheckpointSaveLatencySpike", []),  # a normal save followed
        ("18m", "CheckpointDiskNearlyFull", []),  # pending, not yet for 5m
        ("21m", "CheckpointDiskNearlyFull", [full]),
    ]
    spec = {
        "rule_files": [alert_rules_path()],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": _series(scrapes),
            "alert_rule_test": [{"eval_time": t, "alertname": n, "exp_alerts": exp} for t, n, exp in cases],
        }],
    }
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
