"""What the supervisor hands one rank process: plain data, no torch import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 3
# Exported by every rank (the scenario's scratch root) and inherited by all it starts.
SCENARIO_ENV = "CHAOS_SCENARIO"


@dataclass
class RankSpec:
    rank: int
    world_size: int
    attempt: int
    master_addr: str
    master_port: int
    workload: dict[str, Any]
    log_path: str
    checkpointer: str | None = None
    ckpt_options: dict[str, Any] = field(default_factory=dict)
    ckpt_root: str | None = None
    backend: str = "gloo"
    # Points where this rank stops and lets the supervisor act, as dicts
    # {"index": i, "step": N, "phase": P | None}: without a phase, before training
    # step N; with one, when the checkpointer (or the harness) announces phase P of
    # the save at step N.
    triggers: list[dict[str, Any]] = field(default_factory=list)
    # The in-rank I/O interposer: rules (IORule dicts) and where to write the trace.
    io_rules: list[dict[str, Any]] = field(default_factory=list)
    trace_path: str | None = None
    trace_data: bool = False
    # Network namespace to enter before anything opens a socket, and extra environment.
    netns: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # "train", or "verify": load the latest checkpoint, log what loaded, exit.
    mode: str = "train"
    # The scenario's scratch root: the rank's temporary directory lies below it (so a
    # SIGKILLed rank's temp files go when the scenario's scratch root does), and the
    # root is exported as CHAOS_SCENARIO, which every descendant inherits: the hygiene
    # check finds a helper that escaped the rank's process group by it.
    scratch: str | None = None
    # Run as a job (``python -m chaos.target.workload``): ``env://``, the launcher's rendezvous
    # (MASTER_ADDR/MASTER_PORT, or torchrun's agent store) instead of rank 0 hosting its own.
    init_method: str | None = None
