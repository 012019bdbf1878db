"""Scenarios: what the built-in workload runs and what to break in it, as plain data.

A scenario's faults are :class:`chaos.model.fault.Fault` (``rank1:step23:kill`` on the
command line); its replay command is exactly the faults it ran.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from chaos.errors import ConfigError
from chaos.model.fault import (  # noqa: F401 - moved to chaos.model.fault; this path still imports them
    COMMON_KEYS,
    FAULT_KINDS,
    PROCESS_SIGNALS,
    Fault,
    FaultKind,
)
from chaos.model.grammar import parse_fault  # noqa: F401 - moved to chaos.model.grammar
from chaos.model.keyvalue import format_value
from chaos.target.workload.config import WorkloadConfig


@dataclass
class Scenario:
    """One run to judge: a checkpointer, a cluster shape, a workload and its faults."""

    checkpointer: str
    world_size: int = 2
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    faults: list[Fault] = field(default_factory=list)
    ckpt_options: dict[str, Any] = field(default_factory=dict)
    backend: str = "file"
    max_restarts: int = 3
    driver: str = "process"  # how ranks run: "process" (forked) or "docker" (containers)
    image: str | None = None  # docker driver: a real image instead of the host-mounted empty one
    id: str = ""
    loss_band: float | None = None  # loss_continuity's relative band (None: oracles.DEFAULT_LOSS_BAND)

    def __post_init__(self) -> None:
        if not self.id:
            tag = "+".join(f.spec() for f in self.faults) or "nofault"
            raw = f"{self.checkpointer}-{tag}-seed{self.workload.seed}"
            if self.driver != "process":
                raw += f"-{self.driver}"
            if self.workload.device != "cpu":
                raw += f"-{self.workload.device}"
            self.id = re.sub(r"[^A-Za-z0-9_.=+-]+", "_", raw)

    def validate(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"--world-size must be at least 1, got {self.world_size}")
        self.workload.check_world_size(self.world_size)  # hsdp needs an even world size, tp a divisor
        if self.workload.steps < 1:
            raise ConfigError(f"--steps must be at least 1, got {self.workload.steps}")
        if self.workload.save_every < 0:
            raise ConfigError(f"--save-every must be non-negative, got {self.workload.save_every}")
        if self.driver not in ("process", "docker"):
            raise ConfigError(f"unknown --driver {self.driver!r}: known drivers are process, docker")
        if self.image is not None and self.driver != "docker":
            raise ConfigError(f"--image {self.image!r} needs --driver docker")
        restarts = [f.spec() for f in self.faults if f.kind == "restart"]
        if restarts and self.driver != "docker":
            raise ConfigError(f"fault {restarts[0]!r}: a container restart needs --driver docker")
        if self.workload.device != "cpu" and self.driver != "process":
            raise ConfigError(f"--device {self.workload.device} needs --driver process (containers get no GPU)")
        for f in self.faults:
            if f.rank is not None and f.rank >= self.world_size:
                raise ConfigError(f"fault {f.spec()!r}: rank {f.rank} does not exist with --world-size {self.world_size}")
            if f.step is not None and not 1 <= f.step <= self.workload.steps:
                raise ConfigError(f"fault {f.spec()!r}: step must be in 1..{self.workload.steps}")
            if f.attempt > self.max_restarts:
                raise ConfigError(f"fault {f.spec()!r}: attempt {f.attempt} exceeds --max-restarts {self.max_restarts}")
            if f.param("lost") is not None and not (f.param("lost") is True and self.world_size > 1):
                raise ConfigError(f"fault {f.spec()!r}: lost=true needs --world-size 2 or more (a rank must remain)")
        lost = sum(1 for f in self.faults if f.param("lost") is True)
        if lost and self.world_size - lost >= 1:
            self.workload.check_world_size(self.world_size - lost)  # the world the job resumes on
        from chaos.target.workload.device import check as check_device

        check_device(self.workload.device, self.world_size)  # last: the one check that asks the machine

    def replay_command(self) -> str:
        w = self.workload
        args = ["chaos", "run", "--checkpointer", self.checkpointer, "--world-size", str(self.world_size),
                "--steps", str(w.steps), "--save-every", str(w.save_every), "--seed", str(w.seed),
                "--max-restarts", str(self.max_restarts)]
        if self.driver != "process":
            args += ["--driver", self.driver]
        if self.image is not None:
            args += ["--image", self.image]
        if w.device != "cpu":
            args += ["--device", w.device]
        default = WorkloadConfig()
        for f in dataclasses.fields(WorkloadConfig):
            if f.name in ("seed", "steps", "save_every", "device"):
                continue
            value = getattr(w, f.name)
            if value != getattr(default, f.name):
                args += ["--workload", f"{f.name}={format_value(value)}"]
        for key, value in sorted(self.ckpt_options.items()):
            args += ["--ckpt-opt", f"{key}={format_value(value)}"]
        if self.loss_band is not None:
            args += ["--loss-band", format_value(self.loss_band)]
        for fault in self.faults:
            args += ["--fault", fault.spec()]
        return shlex.join(args)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "checkpointer": self.checkpointer, "world_size": self.world_size,
                "workload": self.workload.to_dict(), "faults": [f.to_dict() for f in self.faults],
                "ckpt_options": dict(self.ckpt_options), "backend": self.backend,
                "max_restarts": self.max_restarts, "loss_band": self.loss_band,
                "driver": self.driver, "image": self.image}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        return cls(checkpointer=data["checkpointer"], world_size=int(data["world_size"]),
                   workload=WorkloadConfig.from_dict(data["workload"]),
                   faults=[Fault.from_dict(f) for f in data.get("faults", [])],
                   ckpt_options=dict(data.get("ckpt_options", {})), backend=data.get("backend", "file"),
                   max_restarts=int(data.get("max_restarts", 3)), id=data.get("id", ""),
                   driver=data.get("driver", "process"), image=data.get("image"),
                   loss_band=data.get("loss_band"))
