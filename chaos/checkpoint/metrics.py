"""Save/load events, alert rules and Prometheus text exposition.

Every save and load appends a plain dict to ``events`` (the harness copies them into
its run record) and updates counters that :meth:`Metrics.prometheus_text` renders in
the Prometheus text format; rank 0 also writes them atomically to ``metrics.prom`` in
the checkpoint root for a node-exporter textfile collector. Alert rules run on each
event: a save-latency spike (slower than ``latency_alert_factor`` x the median of the
previous saves), any checksum failure, and a disk nearing full (free space under the
configured fraction, or under twice the last checkpoint). Alerts are events too
(``kind="alert"``) and are logged at WARNING.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import time
from typing import Any

log = logging.getLogger("chaos.checkpoint")


class Metrics:
    def __init__(self, root: str, rank: int, latency_factor: float = 3.0, disk_free_fraction: float = 0.05, write_file: bool = True) -> None:
        self.root = root
        self.rank = rank
        self.latency_factor = latency_factor
        self.disk_free_fraction = disk_free_fraction
        self.write_file = write_file and rank == 0
        self.events: list[dict[str, Any]] = []
        self.counters: dict[str, float] = {}
        self.save_seconds: list[float] = []
        self.alerts: dict[str, int] = {}

    def _inc(self, name: str, by: float = 1.0) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + by

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"kind": kind, "rank": self.rank, "time": time.time(), **fields}
        self.events.append(event)
        return event

    def alert(self, rule: str, message: str, **fields: Any) -> None:
        self.alerts[rule] = self.alerts.get(rule, 0) + 1
        log.warning("checkpoint alert %s: %s", rule, message)
        self.emit("alert", rule=rule, message=message, **fields)

    def save(self, step: int, ok: bool, seconds: float, stall_s: float, bytes_written: int, checkpoint_bytes: int, error: str | None = None) -> dict[str, Any]:
        mb_s = bytes_written / seconds / 1e6 if seconds > 0 else 0.0
        event = self.emit(
            "save", step=step, ok=ok, seconds=seconds, stall_s=stall_s, bytes=bytes_written,
            checkpoint_bytes=checkpoint_bytes, throughput_mb_s=mb_s, error=error,
        )
        self._inc(f'chaos_ckpt_saves_total{{outcome="{"ok" if ok else "failed"}"}}')
        self._inc("chaos_ckpt_stall_seconds_total", stall_s)
        if ok:
            self._inc("chaos_ckpt_save_bytes_total", bytes_written)
            self._inc("chaos_ckpt_save_seconds_sum", seconds)
            self._inc("chaos_ckpt_save_seconds_count")
            self.counters["chaos_ckpt_last_save_seconds"] = seconds
            self.counters["chaos_ckpt_last_save_step"] = step
            self.counters["chaos_ckpt_last_save_throughput_bytes_per_second"] = mb_s * 1e6
            self.counters["chaos_ckpt_last_checkpoint_bytes"] = checkpoint_bytes
            previous = self.save_seconds[-20:]
            if len(previous) >= 3 and seconds > self.latency_factor * statistics.median(previous):
                self.alert("save_latency_spike", f"save of step {step} took {seconds:.3f}s, median {statistics.median(previous):.3f}s", step=step)
            self.save_seconds.append(seconds)
            self.check_disk(checkpoint_bytes)
        else:
            log.error("checkpoint save of step %d failed: %s", step, error)
        self.flush()
        return event

    def reject(self, step: int, reason: str) -> None:
        log.warning("checkpoint step %d rejected: %s", step, reason)
        self.emit("load_reject", step=step, reason=reason)
        self._inc("chaos_ckpt_rejected_checkpoints_total")
        if "checksum" in reason:
            self._inc("chaos_ckpt_checksum_failures_total")
            self.alert("checksum_failure", f"step {step}: {reason}", step=step)
        self.flush()

    def load(self, step: int | None, outcome: str, seconds: float, bytes_read: int, verified: bool, rejected: list[tuple[int, str]], kept_from_template: list[str] | None = None) -> dict[str, Any]:
        mb_s = bytes_read / seconds / 1e6 if seconds > 0 else 0.0
        event = self.emit(
            "load", step=step, outcome=outcome, ok=outcome != "no_valid", seconds=seconds, bytes=bytes_read,
            throughput_mb_s=mb_s, verified=verified, rejected=[{"step": s, "reason": r} for s, r in rejected],
            kept_from_template=list(kept_from_template or []),
        )
        self._inc(f'chaos_ckpt_loads_total{{outcome="{outcome}"}}')
        self.counters["chaos_ckpt_last_load_seconds"] = seconds
        self.flush()
        return event

    def check_disk(self, checkpoint_bytes: int) -> None:
        try:
            usage = shutil.disk_usage(self.root)
        except OSError:
            return
        self.counters["chaos_ckpt_disk_free_bytes"] = usage.free
        if usage.free < self.disk_free_fraction * usage.total or usage.free < 2 * checkpoint_bytes:
            self.alert("disk_nearly_full", f"{usage.free} bytes free of {usage.total} under {self.root}; last checkpoint {checkpoint_bytes} bytes")

    def prometheus_text(self) -> str:
        """Counters and gauges in the Prometheus text exposition format."""
        lines: list[str] = []
        seen: set[str] = set()
        rank = f'rank="{self.rank}"'
        values = dict(self.counters)
        for rule, n in self.alerts.items():
            values[f'chaos_ckpt_alerts_total{{rule="{rule}"}}'] = n
        for key in sorted(values):
            name, _, labels = key.partition("{")
            family = name.removesuffix("_sum").removesuffix("_count") if name.startswith("chaos_ckpt_save_seconds_") else name
            if family not in seen:
                seen.add(family)
                kind = "counter" if family.endswith("_total") else ("summary" if family != name else "gauge")
                lines.append(f"# TYPE {family} {kind}")
            label_text = "{" + rank + ("," + labels.rstrip("}") if labels else "") + "}"
            value = values[key]
            lines.append(f"{name}{label_text} {int(value) if float(value).is_integer() else repr(float(value))}")
        return "\n".join(lines) + "\n"

    def flush(self) -> None:
        """Write ``metrics.prom`` atomically (temp file + rename); failures only log."""
        if not self.write_file:
            return
        path = os.path.join(self.root, "metrics.prom")
        tmp = os.path.join(self.root, f".tmp-metrics-{os.getpid()}.prom")
        try:
            with open(tmp, "w") as f:
                f.write(self.prometheus_text())
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass
