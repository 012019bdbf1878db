"""Save/load events, alert rules and Prometheus metrics (through ``prometheus_client``).

Every save and load appends a plain dict to ``events`` (the harness copies them into
its run record) and updates counters, gauges and histograms in a
:class:`~prometheus_client.CollectorRegistry` of this instance's own — never the
process-wide default registry, because several checkpointers live in one process (tests,
the recovery pool). :meth:`Metrics.prometheus_text` is that registry in the Prometheus
text format; rank 0 also writes it to ``metrics.prom`` in the checkpoint root for a
node-exporter textfile collector (``prometheus_client.write_to_textfile``: a temp file
``metrics.prom.<pid>.<thread>`` beside it, then a rename, so a reader never sees half a
file). With ``port`` set, every rank serves its registry over HTTP on ``port + rank``
(ranks of one host do not collide) until :meth:`Metrics.close`.

Alert rules run on each event: a save-latency spike (slower than ``latency_factor`` x the
median of the previous saves), any checksum failure, and a disk nearing full (free space
under the configured fraction, or under twice the last checkpoint). Alerts are events too
(``kind="alert"``), are logged at WARNING and counted in ``chaos_ckpt_alerts_total``.
The same three rules for a Prometheus server are shipped as ``alerts.yml`` beside this
module (:func:`alert_rules_path`), written against the metric names exported here.

Who calls what: :class:`~chaos.reference.checkpoint.engine.ReferenceCheckpointer` calls
:meth:`save`, :meth:`reject`, :meth:`load` and :meth:`emit`; a failure to write the
textfile only logs (the file is auxiliary, see ``AUXILIARY_FILES``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import statistics
import time
from importlib import resources
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
    write_to_textfile,
)

from chaos.errors import ConfigError
from chaos.reference.ckptformat.errors import CheckpointConfigError

log = logging.getLogger("chaos.reference.checkpoint")

TEXTFILE = "metrics.prom"
# What the textfile and its temp files are called in the root: globs for a checkpointer's
# ``auxiliary_files`` (written beside the checkpoints, read by no load).
AUXILIARY_FILES = (TEXTFILE, TEXTFILE + ".*")
_TEMP = re.compile(r"^" + re.escape(TEXTFILE) + r"\.(\d+)\.(\d+)$")
ALERT_RULES = ("save_latency_spike", "checksum_failure", "disk_nearly_full")
# Checkpoint saves take from milliseconds (tiny models, tmpfs) to many minutes.
SAVE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, float("inf"))


def alert_rules_path() -> str:
    """The shipped Prometheus rules file (``alerts.yml``) for the metrics exported here."""
    return str(resources.files("chaos.reference.checkpoint").joinpath("alerts.yml"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


class Metrics:
    """Events plus a private Prometheus registry for one checkpointer on one rank."""

    def __init__(self, root: str, rank: int, latency_factor: float = 3.0, disk_free_fraction: float = 0.05,
                 write_file: bool = True, port: int = 0, addr: str = "0.0.0.0") -> None:
        self.root = root
        self.rank = rank
        self.latency_factor = latency_factor
        self.disk_free_fraction = disk_free_fraction
        self.write_file = write_file and rank == 0
        self.events: list[dict[str, Any]] = []
        self.save_seconds: list[float] = []
        self.alerts: dict[str, int] = {}
        self.registry = CollectorRegistry()
        r = ("rank",)
        reg = self.registry
        self._saves = Counter("chaos_ckpt_saves", "Checkpoint saves by outcome (ok | failed).", r + ("outcome",), registry=reg)
        self._save_seconds = Histogram("chaos_ckpt_save_seconds", "Wall time of successful saves, call to durable commit.",
                                       r, registry=reg, buckets=SAVE_BUCKETS)
        self._stall = Counter("chaos_ckpt_stall_seconds", "Training time blocked in save() (the snapshot, when async).", r, registry=reg)
        self._save_bytes = Counter("chaos_ckpt_save_bytes", "Bytes this rank wrote in successful saves.", r, registry=reg)
        self._last_seconds = Gauge("chaos_ckpt_last_save_seconds", "Wall time of the last successful save.", r, registry=reg)
        self._last_step = Gauge("chaos_ckpt_last_save_step", "Step of the last successful save.", r, registry=reg)
        self._last_time = Gauge("chaos_ckpt_last_save_timestamp_seconds", "Unix time the last successful save finished.", r, registry=reg)
        self._last_rate = Gauge("chaos_ckpt_last_save_throughput_bytes_per_second", "Write throughput of the last successful save.",
                                r, registry=reg)
        self._last_ckpt = Gauge("chaos_ckpt_last_checkpoint_bytes", "Size of the last committed checkpoint, all ranks.", r, registry=reg)
        self._loads = Counter("chaos_ckpt_loads", "load_latest calls by outcome (loaded | none | no_valid).", r + ("outcome",), registry=reg)
        self._load_bytes = Counter("chaos_ckpt_load_bytes", "Bytes this rank read in successful loads.", r, registry=reg)
        self._last_load = Gauge("chaos_ckpt_last_load_seconds", "Wall time of the last load_latest call.", r, registry=reg)
        self._rejected = Counter("chaos_ckpt_rejected_checkpoints", "Checkpoints a load rejected (any reason).", r, registry=reg)
        self._checksum = Counter("chaos_ckpt_checksum_failures", "Checkpoints a load rejected for a checksum mismatch.", r, registry=reg)
        self._alerts = Counter("chaos_ckpt_alerts", "Alerts raised by the in-process rules, by rule.", r + ("rule",), registry=reg)
        self._disk_free = Gauge("chaos_ckpt_disk_free_bytes", "Free bytes on the file system of the checkpoint root.", r, registry=reg)
        self._disk_total = Gauge("chaos_ckpt_disk_total_bytes", "Size of the file system of the checkpoint root.", r, registry=reg)
        # Counters an alert or a rate() reads exist from the start at 0: Prometheus's
        # increase() cannot see the first increment of a series that appears at 1.
        rank_label = str(rank)
        for outcome in ("ok", "failed"):
            self._saves.labels(rank_label, outcome)
        for c in (self._stall, self._save_bytes, self._rejected, self._checksum):
            c.labels(rank_label)
        for rule in ALERT_RULES:
            self._alerts.labels(rank_label, rule)
        self._server: Any = None
        self._thread: Any = None
        if self.write_file:
            self._remove_stale_temps()
        if port:
            self._serve(port, addr)

    # -- events -------------------------------------------------------------------
    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"kind": kind, "rank": self.rank, "time": time.time(), **fields}
        self.events.append(event)
        return event

    def alert(self, rule: str, message: str, **fields: Any) -> None:
        self.alerts[rule] = self.alerts.get(rule, 0) + 1
        self._alerts.labels(str(self.rank), rule).inc()
        log.warning("checkpoint alert %s: %s", rule, message)
        self.emit("alert", rule=rule, message=message, **fields)

    def save(self, step: int, ok: bool, seconds: float, stall_s: float, bytes_written: int, checkpoint_bytes: int, error: str | None = None) -> dict[str, Any]:
        mb_s = bytes_written / seconds / 1e6 if seconds > 0 else 0.0
        event = self.emit(
            "save", step=step, ok=ok, seconds=seconds, stall_s=stall_s, bytes=bytes_written,
            checkpoint_bytes=checkpoint_bytes, throughput_mb_s=mb_s, error=error,
        )
        rank = str(self.rank)
        self._saves.labels(rank, "ok" if ok else "failed").inc()
        self._stall.labels(rank).inc(max(0.0, stall_s))
        if ok:
            self._save_bytes.labels(rank).inc(max(0, bytes_written))
            self._save_seconds.labels(rank).observe(seconds)
            self._last_seconds.labels(rank).set(seconds)
            self._last_step.labels(rank).set(step)
            self._last_time.labels(rank).set(time.time())
            self._last_rate.labels(rank).set(mb_s * 1e6)
            self._last_ckpt.labels(rank).set(checkpoint_bytes)
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
        self._rejected.labels(str(self.rank)).inc()
        if "checksum" in reason:
            self._checksum.labels(str(self.rank)).inc()
            self.alert("checksum_failure", f"step {step}: {reason}", step=step)
        self.flush()

    def load(self, step: int | None, outcome: str, seconds: float, bytes_read: int, verified: bool, rejected: list[tuple[int, str]], kept_from_template: list[str] | None = None) -> dict[str, Any]:
        mb_s = bytes_read / seconds / 1e6 if seconds > 0 else 0.0
        event = self.emit(
            "load", step=step, outcome=outcome, ok=outcome != "no_valid", seconds=seconds, bytes=bytes_read,
            throughput_mb_s=mb_s, verified=verified, rejected=[{"step": s, "reason": r} for s, r in rejected],
            kept_from_template=list(kept_from_template or []),
        )
        rank = str(self.rank)
        self._loads.labels(rank, outcome).inc()
        self._load_bytes.labels(rank).inc(max(0, bytes_read))
        self._last_load.labels(rank).set(seconds)
        self.flush()
        return event

    def check_disk(self, checkpoint_bytes: int) -> None:
        try:
            usage = shutil.disk_usage(self.root)
        except OSError:
            return
        self._disk_free.labels(str(self.rank)).set(usage.free)
        self._disk_total.labels(str(self.rank)).set(usage.total)
        if usage.free < self.disk_free_fraction * usage.total or usage.free < 2 * checkpoint_bytes:
            self.alert("disk_nearly_full", f"{usage.free} bytes free of {usage.total} under {self.root}; last checkpoint {checkpoint_bytes} bytes")

    # -- exposition ---------------------------------------------------------------
    def prometheus_text(self) -> str:
        """This instance's registry in the Prometheus text exposition format."""
        return generate_latest(self.registry).decode("utf-8")

    def flush(self) -> None:
        """Rank 0: write ``metrics.prom`` atomically (temp file + rename); failures only log."""
        if not self.write_file:
            return
        path = os.path.join(self.root, TEXTFILE)
        try:
            write_to_textfile(path, self.registry)
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)

    @property
    def http_address(self) -> tuple[str, int] | None:
        """``(host, port)`` of the HTTP endpoint while it serves, else None."""
        return self._server.server_address[:2] if self._server is not None else None

    def close(self) -> None:
        """Stop the HTTP endpoint (if any) and free its port; idempotent."""
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=10)

    def _serve(self, port: int, addr: str) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port + self.rank < 65536:
            raise CheckpointConfigError(f"metrics_port {port!r}: expected 0 (off) or a TCP port, "
                                        f"and port + rank ({self.rank}) must stay below 65536")
        try:
            self._server, self._thread = start_http_server(port + self.rank, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"metrics_port {port}: rank {self.rank} cannot serve metrics on "
                              f"{addr}:{port + self.rank}: {exc.strerror or exc}") from None

    def _remove_stale_temps(self) -> None:
        """Remove ``metrics.prom.<pid>.<thread>`` left by a writer that died mid-write.

        The checkpointer's own ``clean_stale`` removes ``.tmp-`` names only; a live
        process's temp file (another writer, by misuse) is left alone.
        """
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            m = _TEMP.match(name)
            if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
                try:
                    os.unlink(os.path.join(self.root, name))
                except OSError:
                    pass
