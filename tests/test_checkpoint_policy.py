"""Cadence (Young/Daly, schedule, 2% budget), `chaos interval`, metrics and alert rules."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections import namedtuple

import pytest
import torch

from chaos.cli.commands import interval
from chaos.reference.checkpoint import ReferenceCheckpointer, policy
from chaos.reference.checkpoint.metrics import Metrics


def test_young_and_daly_numbers():
    c, m = 60.0, 24 * 3600.0
    assert policy.young_interval(c, m) == pytest.approx(math.sqrt(2 * 60 * 86400))  # 3219.9 s
    x = c / (2 * m)
    assert policy.daly_interval(c, m) == pytest.approx(math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c)
    assert policy.daly_interval(c, m) < policy.young_interval(c, m)
    assert policy.daly_interval(5000.0, 2000.0) == 2000.0  # C >= 2M: save as often as failures come
    assert policy.expected_lost_work(3000.0, 60.0) == 1530.0
    with pytest.raises(ValueError):
        policy.young_interval(0, m)


def test_overhead_is_minimal_near_daly_interval():
    c, m = 30.0, 6 * 3600.0
    best = policy.daly_interval(c, m)
    at = policy.overhead_fraction(best, c, m)
    assert at < policy.overhead_fraction(best / 3, c, m) and at < policy.overhead_fraction(best * 3, c, m)
    # First-order check: overhead ~ C/tau + tau/(2M) for C << tau << M.
    assert at == pytest.approx(c / best + best / (2 * m), rel=0.1)


def test_budget_stretches_interval():
    assert policy.budget_interval(10.0, 0.02) == 500.0
    cad = policy.Cadence(early_every=500, late_every=2000, early_until=10_000, budget=0.02)
    assert cad.interval_steps(100) == 500 and cad.interval_steps(20_000) == 2000  # denser early
    for _ in range(100):
        cad.record_step(0.1)  # 10 s of training
    cad.record_save(2.0)  # one 2 s stall: 20% of training time, 10x the budget
    assert cad.stall_fraction() == pytest.approx(0.2)
    # budget floor: 2 s / 0.02 = 100 s of training = 1000 steps; and the 10x overrun stretch.
    assert cad.interval_steps(100) >= 5000 and cad.interval_steps(20_000) >= 20_000
    assert not cad.due(6000, last_saved=2000) and cad.due(2000, last_saved=None)
    cheap = policy.Cadence()
    for _ in range(1000):
        cheap.record_step(1.0)
    cheap.record_save(0.5)
    assert cheap.interval_steps(100) == 500  # within budget: the schedule stands


def test_cadence_uses_daly_late_in_training():
    cad = policy.Cadence(early_every=10, late_every=10_000, early_until=100, mtbf_s=3600.0)
    for _ in range(1000):
        cad.record_step(1.0)
    cad.record_save(1.0)  # 0.1% stall: within budget, budget floor 50 steps < Daly's ~84
    assert cad.interval_steps(1000) == round(policy.daly_interval(1.0, 3600.0))
    assert cad.interval_steps(50) == 50  # early schedule (10) stretched to the budget floor


def _interval(argv):
    p = argparse.ArgumentParser()
    interval.add_arguments(p)
    return interval.run(p.parse_args(argv))


def test_interval_command_json_and_table(capsys):
    assert _interval(["--save-seconds", "30", "--mtbf-hours", "24", "--step-seconds", "1.5", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["young_interval_seconds"] == pytest.approx(math.sqrt(2 * 30 * 86400))
    assert r["interval_seconds"] == pytest.approx(policy.daly_interval(30, 86400))
    assert r["interval_steps"] == math.ceil(r["interval_seconds"] / 1.5)
    assert r["expected_lost_work_seconds"] == pytest.approx((r["interval_seconds"] + 30) / 2)
    assert not r["stretched_by_budget"]
    assert _interval(["--save-seconds", "600", "--mtbf-hours", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["stretched_by_budget"] and r["interval_seconds"] == pytest.approx(600 / 0.02)
    assert _interval(["--save-seconds", "30", "--mtbf-hours", "24"]) == 0
    assert "Young" in capsys.readouterr().out
    assert _interval(["--save-seconds", "-1", "--mtbf-hours", "24"]) == 2


def test_latency_spike_and_disk_alerts(tmp_path, monkeypatch):
    m = Metrics(str(tmp_path), 0)
    for step, seconds in enumerate([1.0, 1.1, 0.9, 1.0]):
        m.save(step, True, seconds, seconds, 100, 100)
    assert not [e for e in m.events if e["kind"] == "alert"]
    m.save(9, True, 5.0, 5.0, 100, 100)
    assert [e["rule"] for e in m.events if e["kind"] == "alert"] == ["save_latency_spike"]
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr("shutil.disk_usage", lambda p: Usage(1000, 990, 10))
    m.save(10, True, 1.0, 1.0, 100, 100)
    assert "disk_nearly_full" in [e["rule"] for e in m.events if e["kind"] == "alert"]
    m.reject(3, "shard x: checksum mismatch")
    text = m.prometheus_text()
    assert 'chaos_ckpt_alerts_total{rank="0",rule="checksum_failure"} 1' in text
    assert 'chaos_ckpt_saves_total{outcome="ok",rank="0"} 6.0' in text
    assert "# TYPE chaos_ckpt_save_seconds histogram" in text and "chaos_ckpt_checksum_failures_total" in text
    with open(os.path.join(str(tmp_path), "metrics.prom")) as f:
        assert f.read() == text


def test_engine_emits_save_and_load_events(tmp_path):
    c = ReferenceCheckpointer(str(tmp_path), 0, 1)
    st = {"model": {"w": torch.ones(1000)}, "optimizer": {"state": {}, "param_groups": []}}
    c.save(1, st)
    c.load_latest(st)
    save, load = [e for e in c.events if e["kind"] in ("save", "load")]
    assert save["ok"] and save["bytes"] > 4000 and save["seconds"] > 0 and save["stall_s"] == save["seconds"]
    assert save["throughput_mb_s"] == pytest.approx(save["bytes"] / save["seconds"] / 1e6)
    assert load["outcome"] == "loaded" and load["verified"] and load["step"] == 1 and load["bytes"] == save["bytes"]
    assert "chaos_ckpt_loads_total" in c.prometheus_text()


def test_background_commit_runs_jobs_in_order_on_one_thread_and_keeps_errors():
    import threading

    from chaos.reference.checkpoint.async_writer import BackgroundCommit

    bg = BackgroundCommit()
    seen: list[tuple[int, int]] = []
    release = threading.Event()

    def job(i: int) -> None:
        if i == 0:
            release.wait(5)
        seen.append((i, threading.get_ident()))

    bg.submit(lambda: job(0))
    assert bg.busy()
    release.set()
    bg.submit(lambda: job(1))  # waits for job 0: at most one in flight
    bg.join()
    assert [i for i, _ in seen] == [0, 1] and len({t for _, t in seen}) == 1
    assert not bg.busy() and bg.take_error() is None

    bg.submit(lambda: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    bg.join()
    err = bg.take_error()
    assert isinstance(err, OSError) and err.errno == 28 and bg.take_error() is None
    thread = bg.thread
    bg.stop()
    assert thread is not None and not thread.is_alive() and bg.thread is None
