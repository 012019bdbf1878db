"""One planned fault of the built-in workload, as plain data, and its spelling in the one grammar.

A fault on the command line reads ``rank1:step23:kill`` (or, in the older spelling still read,
``kill:rank=1,step=23``); ``chaos.model.grammar`` reads both. Every fault round-trips
through ``Fault.spec()`` so a scenario's replay command is exactly the faults it ran. ``chaos.plan.scenario`` builds scenarios of them; the
launchers (``chaos.launch.cluster``, the docker driver) and the environment
(``chaos.nemesis.environment``) carry them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.model.keyvalue import format_value


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
# an ``io`` fault's kind -> the interposer's rule action (``Fault.io_rule``)
IO_ACTIONS = {"crash": "kill", "eio": "eio", "enospc": "enospc", "fsyncfail": "fsync_fail",
              "shortwrite": "short_write", "slowio": "delay"}
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

    def io_rule(self) -> dict[str, Any]:
        """The interposer's rule (``faults.interposer.IORule`` as a dict) that carries out this ``io`` fault.

        One translation for both targets: the built-in workload's environment hands it to its
        ranks (``chaos.nemesis.environment.Environment.io_rules``), and a job's point made from
        the same fault (``chaos.model.grammar.parse_point``: ``--as-job --fault
        rank0:step4:crash,op=write,nth=1``) hands it to the job's tracer, which fires it
        exactly as the built-in rank does. Its ``step`` restricts the rule to file events after
        the most recent announcement of that step (a ``chaos.phases`` phase with ``step=S``; in a
        job also ``chaos.probe.step(S)``). An impossible rule (a byte of an fsync) is a ConfigError.
        """
        from faults.interposer import IORule

        if self.family != "io":
            raise ValueError(f"{self.spec()} is no I/O fault")
        action = IO_ACTIONS[self.kind]
        return IORule(action, op=self.param("op"), nth=int(self.param("nth", 1)), path_glob=self.param("path"),
                      byte=self.param("byte"), phase=self.param("phase"), step=self.step,
                      delay_s=float(self.param("delay", 0.0)), keep=self.param("keep"),
                      times=self.param("times", 1)).to_dict()

    def spec(self) -> str:
        """The fault in the one grammar (``chaos.model.grammar``): ``rank1:step11:kill,phase=vote``,
        ``ckpt:step8:bitflip,bits=2``, ``rank0:eio,op=fsync``. What a scenario's id and replay
        command carry; ``parse_fault`` reads it back to this fault (and the older
        ``kill:rank=1,step=11`` spelling of results written before)."""
        family = FAULT_KINDS[self.kind].family if self.kind in FAULT_KINDS else None
        settings = []
        if self.kind == "diskfull":
            who, what = "disk", "full"
        elif self.kind == "powerloss":
            who, what = "all", "power"
        elif family == "rest" or self.rank is None:
            who, what = "ckpt" if family == "rest" else "all", self.kind
        else:
            who, what = f"rank{self.rank}", "net" if self.kind == "netdrop" else self.kind
        if self.rank is not None and not who.startswith("rank"):
            settings.append(f"rank={self.rank}")
        if self.attempt:
            settings.append(f"attempt={self.attempt}")
        settings += [f"{k}={format_value(v)}" for k, v in self.params]
        place = f"{who}:step{self.step}:{what}" if self.step is not None else f"{who}:{what}"
        return ",".join([place, *settings])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "step": self.step, "attempt": self.attempt,
                "params": dict(self.params), "spec": self.spec()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fault:
        return cls(data["kind"], data.get("rank"), data.get("step"), int(data.get("attempt", 0)),
                   tuple(sorted(data.get("params", {}).items())))
