"""Scenarios and fault plans: what to run and what to break, as plain data.

A fault on the command line reads ``KIND:key=value,...``, e.g. ``kill:rank=1,step=23``.
Every fault round-trips through ``Fault.spec()`` so a scenario's replay command is
exactly the faults it ran.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from chaos.errors import ConfigError
from chaos.model.keyvalue import _parse_value, format_value
from chaos.target.workload.config import WorkloadConfig


@dataclass(frozen=True)
class FaultKind:
    """How a kind of fault is carried out, and which ``key=value`` settings it takes.

    family: ``process`` (the supervisor signals the rank), ``io`` (the in-rank I/O
    interposer acts at an exact operation), ``rest`` (every rank is killed at the step,
    then committed files are corrupted at rest before the restart), ``disk`` (the
    checkpoint file system fills up), ``net`` (the rank's link goes down),
    ``powerloss`` (the save at the step is traced and every crash state a file system
    may be left in is recovered and judged).
    """

    family: str
    keys: frozenset[str]
    needs_rank: bool
    needs_step: bool
    doc: str


_IO_KEYS = frozenset({"op", "nth", "path", "byte", "phase", "keep", "times"})
_REST_KEYS = frozenset({"file", "seed", "bits", "region", "fraction", "length", "offset", "at"})
FAULT_KINDS: dict[str, FaultKind] = {
    "kill": FaultKind("process", frozenset({"phase", "lost", "linger"}), True, True,
                      "SIGKILL the rank at step N (or at phase P of the save at step N); lost=true: the rank "
                      "never comes back and the job restarts on fewer ranks (elastic); linger=S: the other "
                      "ranks run on for up to S seconds (a launcher's monitor interval) before teardown"),
    "term": FaultKind("process", frozenset({"phase", "grace", "linger"}), True, True,
                      "SIGTERM, then SIGKILL after grace seconds"),
    "stop": FaultKind("process", frozenset({"phase", "linger"}), True, True, "SIGSTOP: a hung rank"),
    "restart": FaultKind("process", frozenset({"phase", "timeout"}), True, True,
                         "--driver docker: the engine restarts the rank's container (stopped after `timeout` s); "
                         "the job has lost the rank and restarts from its checkpoint"),
    "crash": FaultKind("io", _IO_KEYS, True, False, "the rank dies at an exact I/O point (op/nth, byte of path, phase)"),
    "eio": FaultKind("io", _IO_KEYS, True, False, "an I/O operation fails with EIO"),
    "enospc": FaultKind("io", _IO_KEYS, True, False, "an I/O operation fails with ENOSPC"),
    "fsyncfail": FaultKind("io", _IO_KEYS, True, False, "an fsync fails with EIO"),
    "shortwrite": FaultKind("io", _IO_KEYS, True, False, "a write stores only `keep` bytes, then the rank dies"),
    "slowio": FaultKind("io", _IO_KEYS | {"delay"}, True, False, "an I/O operation is delayed by `delay` seconds"),
    "truncate": FaultKind("rest", _REST_KEYS, False, True, "truncate a file of the newest checkpoint"),
    "bitflip": FaultKind("rest", _REST_KEYS, False, True, "flip `bits` bits of a file of the newest checkpoint"),
    "zero": FaultKind("rest", _REST_KEYS, False, True, "zero `length` bytes of a file of the newest checkpoint"),
    "delete": FaultKind("rest", _REST_KEYS, False, True, "delete a file of the newest checkpoint"),
    "stale": FaultKind("rest", _REST_KEYS, False, True, "replace a file with its copy from the previous checkpoint"),
    "swap": FaultKind("rest", _REST_KEYS, False, True, "swap two files of the newest checkpoint (e.g. rank shards)"),
    "payload": FaultKind("rest", frozenset({"file", "seed", "format", "variant"}), False, True,
                         "plant a payload in the checkpoint's own format (format=pickle|torchzip|safetensors-header) "
                         "in a file of the newest checkpoint; loading must never run it"),
    "diskfull": FaultKind("disk", frozenset({"free"}), False, True, "the checkpoint file system fills up, leaving `free` bytes"),
    "netdrop": FaultKind("net", frozenset({"phase"}), True, True, "the rank's network link goes down"),
    "powerloss": FaultKind("powerloss", frozenset({"seed", "max_states"}), False, True,
                           "explore every crash state of the save at step N"),
}
PROCESS_SIGNALS = {"kill": "SIGKILL", "term": "SIGTERM", "stop": "SIGSTOP"}
COMMON_KEYS = frozenset({"rank", "step", "attempt"})


@dataclass(frozen=True)
class Fault:
    """One planned fault. ``attempt`` is the run attempt (0 = first launch) it fires in."""

    kind: str
    rank: int | None = None
    step: int | None = None
    attempt: int = 0
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    @property
    def family(self) -> str:
        return FAULT_KINDS[self.kind].family

    def spec(self) -> str:
        parts = []
        if self.rank is not None:
            parts.append(f"rank={self.rank}")
        if self.step is not None:
            parts.append(f"step={self.step}")
        if self.attempt:
            parts.append(f"attempt={self.attempt}")
        parts += [f"{k}={format_value(v)}" for k, v in self.params]
        return f"{self.kind}:{','.join(parts)}" if parts else self.kind

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "step": self.step, "attempt": self.attempt,
                "params": dict(self.params), "spec": self.spec()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fault:
        return cls(data["kind"], data.get("rank"), data.get("step"), int(data.get("attempt", 0)),
                   tuple(sorted(data.get("params", {}).items())))


def parse_fault(text: str) -> Fault:
    """Parse ``KIND:key=value,...``; every error names the offending text."""
    kind, _, rest = text.strip().partition(":")
    spec = FAULT_KINDS.get(kind)
    if spec is None:
        known = ", ".join(sorted(FAULT_KINDS))
        raise ConfigError(f"unknown fault kind {kind!r} in {text!r}: known kinds are {known}")
    allowed = COMMON_KEYS | spec.keys
    values: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, raw = item.partition("=")
        if not eq or not key or not raw:
            raise ConfigError(f"malformed fault {text!r}: expected key=value, got {item!r}")
        if key not in allowed:
            raise ConfigError(f"fault {text!r}: {kind} takes {', '.join(sorted(allowed))}, not {key!r}")
        if key in values:
            raise ConfigError(f"fault {text!r}: {key!r} given twice")
        values[key] = _parse_value(raw)
    for key in ("rank", "step", "attempt", "nth", "byte", "keep", "bits", "free", "length", "seed", "max_states",
                "offset"):
        if key in values and (not isinstance(values[key], int) or values[key] < 0):
            raise ConfigError(f"fault {text!r}: {key} must be a non-negative integer")
    if "at" in values and not (isinstance(values["at"], int | float) and 0 <= values["at"] <= 1):
        raise ConfigError(f"fault {text!r}: at must be a fraction of the file's length in [0, 1]")
    if kind == "payload":
        from faults.payload import FORMATS, HEADER_VARIANTS

        if values.get("format", "pickle") not in FORMATS:
            raise ConfigError(f"fault {text!r}: format must be one of {', '.join(FORMATS)}")
        if values.get("variant", HEADER_VARIANTS[0]) not in HEADER_VARIANTS:
            raise ConfigError(f"fault {text!r}: variant must be one of {', '.join(HEADER_VARIANTS)}")
    if spec.needs_step and "step" not in values:
        raise ConfigError(f"fault {text!r}: {kind} needs step=N (the step at which it fires)")
    if spec.needs_rank and "rank" not in values:
        raise ConfigError(f"fault {text!r}: {kind} needs rank=R")
    if spec.family == "io" and not {"op", "byte", "phase", "path"} & set(values):
        raise ConfigError(f"fault {text!r}: {kind} needs a point: op=KIND[,nth=N], byte=X[,path=GLOB] or phase=NAME")
    params = tuple(sorted((k, v) for k, v in values.items() if k not in COMMON_KEYS))
    return Fault(kind, values.get("rank"), values.get("step"), values.get("attempt", 0), params)


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
