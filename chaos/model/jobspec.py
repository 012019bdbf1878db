"""What ``chaos run -- COMMAND`` runs and where it breaks it, as plain data.

A *job* is a user's own training command: the second kind of target beside a
checkpointer in the built-in workload. ``JobSpec`` says how to launch and judge it;
``Point`` is one place to break it: a kill before, after or in the middle of one traced
file event of one rank; a corruption of the file an event completed (or, each its own
kind, a payload planted in it in its own format, its replacement by an older version of
it, or its swap with another rank's file of the same checkpoint); a power loss there; an injected ENOSPC / EIO at an event; a SIGKILL or a SIGTERM with a grace period
at a step; a real full disk; a network cut between the ranks (a rank's link down for
``--net-hold`` seconds) at a step or a file event; on simulated nodes (``--nodes N``,
``nodes.py``) a node's loss, its link cut for ``--node-hold`` seconds, or the loss of the
rendezvous host, at a step. Both round-trip through text: a
point's ``id`` (``rank0:op17:before``, ``rank0:op9:bitflip``, ``rank0:op9:payload:step4``, ``rank1:step6:net``,
``disk:full:8192``, ``node1:step3:loss``) is what ``--point``
takes, so every failing point's replay command reruns exactly that point.

``Point`` lives in ``point.py`` and both are read by ``grammar.py`` (``parse_point``); the
names are re-exported here.

The ``ENV_*`` names and the other constants the harness shares with the boot path it
puts on ``PYTHONPATH`` (``boot/sitecustomize.py`` -> ``inproc.py``) live in
``contract.py``, re-exported here.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chaos.errors import ConfigError
from chaos.model.contract import (  # noqa: F401 - the contract, re-exported for the harness's side
    AT_REST_FAMILIES,
    AT_REST_KINDS,
    CORRUPT_FAMILIES,
    DEFAULT_GRACE_S,
    DEFAULT_NET_HOLD_S,
    DEFAULT_STOP_SILENCE_S,
    ENV_ATTEMPT,
    ENV_BOOTED,
    ENV_CHILDREN,
    ENV_IMPORT_EVENTS,
    ENV_LOSS_REGEX,
    ENV_MARK,
    ENV_OUT,
    ENV_POINT,
    ENV_POINT_THEN,
    ENV_PRELOAD,
    ENV_PYCACHE,
    ENV_RANK,
    ENV_RANKS_ONLY,
    ENV_STEP_REGEX,
    ENV_TMP,
    ENV_TRACE_DIR,
    ENV_ZYGOTE,
    ENV_ZYGOTE_ENV,
    ERRNO_MODES,
    FAULT_KINDS,
    FILL_DONE,
    FILL_REQUEST,
    HALT_FAMILIES,
    HALT_MODES,
    HALT_REQUEST,
    MODES,
    NET_DOWN,
    NET_REQUEST,
    OP_MODES,
    OUT,
    PROBE_FILE_ENV,
    RESTART_DONE,
    RESTART_REQUEST,
    ROT_MODES,
    SCHED_DONE,
    SCHED_MODES,
    SCHED_REQUEST,
    STEP_KINDS,
    STEP_MODES,
    STOP_REQUEST,
    TERM_REQUEST,
    TERM_SENT,
    TORCHRUN_STRIDE,
    loss_groups,
)
from chaos.model.grammar import parse_point, replay_point  # noqa: F401 - read here too by the job's callers
from chaos.model.point import NODE_MODES, Point  # noqa: F401 - the job's point, re-exported

# Node faults of a job spread over simulated nodes (``--nodes N``, chaos/nemesis/nodes.py): NODE_MODES
# and the node point itself live in point.py.
FAULT_KINDS = (*FAULT_KINDS, "node")   # noqa: F811 - the contract's kinds plus the node family
DEFAULT_NODE_HOLD_S = 5.0  # --node-hold: a node's link stays down this long, then comes back up
RDZV = "{rdzv}"  # in a --nodes COMMAND: the rendezvous endpoint the harness fills in (nodes.py)
MAX_NODES = 8    # node addresses sort as strings; 10.x.x.10 would sort before 10.x.x.2
KINDS_WITH_NODES = ("kill", "errno", "node")  # in-rank faults need nothing from the launcher; node is its own

# ``--launcher``: who starts each attempt. ``subprocess``: the harness itself (chaos.launch.job);
# ``sbatch``: Slurm, as a batch job (chaos.launch.sbatch), which also restarts it at a sched point;
# ``docker``: the harness, each copy as a container of its own (chaos.launch.containers).
LAUNCHERS = ("subprocess", "sbatch", "docker")
IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")  # --image: a Docker image reference, never an option
# What a job Slurm launches is explored with: faults its own rank fires (a SIGKILL, an injected
# error; the harness restarts it as a new batch job) and Slurm's own (sched: Slurm restarts it).
KINDS_WITH_SBATCH = ("kill", "errno", "sched")


def _is_torchrun(argv: tuple[str, ...]) -> bool:
    if not argv:
        return False
    if os.path.basename(argv[0]) == "torchrun":
        return True
    return len(argv) >= 3 and argv[1] == "-m" and argv[2] in ("torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class JobSpec:
    """How to launch and judge a user's job (``chaos run [options] -- COMMAND``).

    ``command`` and ``resume_command`` carry ``{out}`` where the job takes its output
    directory. ``ranks`` None: one plain process (no torchrun variables); N: N copies
    with torchrun's environment. A ``torchrun ...`` command is launched once and its
    agent does the restarts (``torchrun``): the harness only observes.
    """

    command: tuple[str, ...]
    resume_command: tuple[str, ...] | None = None
    ranks: int | None = None
    result_globs: tuple[str, ...] = ()
    step_regex: str | None = None
    loss_regex: str | None = None           # --loss-regex: groups `step` and `loss` (or the first two, in that order)
    loss_band: float | None = None          # --loss-band; None: exact, or 0.5 % when the fault-free runs differ
    checkpoint_glob: str | None = None
    max_restarts: int = 1
    timeout_s: float = 300.0
    hang_timeout_s: float | None = None     # --hang-timeout: an attempt silent this long is stopped as hung
    rtol: float = 1e-3
    modes: tuple[str, ...] = MODES
    faults: tuple[str, ...] | None = None  # --faults; None: every kind that applies here
    grace_s: float = DEFAULT_GRACE_S        # --grace: SIGTERM to SIGKILL at a term point
    net_hold_s: float = DEFAULT_NET_HOLD_S  # --net-hold: a net point's link stays down this long
    cwd: str = field(default_factory=os.getcwd)
    nodes: int | None = None                # --nodes N: one torchrun agent per simulated node (nodes.py)
    node_hold_s: float = DEFAULT_NODE_HOLD_S  # --node-hold: a link point's node stays cut off this long
    preload: bool = True                    # --no-preload: False
    native_trace: bool = True               # --no-native-trace: False (faults/chaosio.c not preloaded)
    materialize: bool = True                # --no-materialize: False (a point's attempt 0 always runs to the point)
    launcher: str = "subprocess"            # --launcher: subprocess | sbatch (chaos.launch.sbatch) | docker (containers)
    sbatch_options: tuple[str, ...] = ()    # --sbatch-opt: passed to sbatch as given (--signal=..., --partition=...)
    image: str | None = None                # --image: --launcher docker's image (None: the host-mounted empty one)
    # what explore found the fault-free run imported before its first file event (run-time only: never
    # recorded, never replayed); the boot path imports them before the gate (ENV_PRELOAD)
    preload_modules: tuple[str, ...] = ()
    # modules only a zygote may preload (launch.begin_zygote), since the job had changed these environment
    # variables by its first file event: the zygote checks that importing them sets the same (run-time only)
    zygote_preload: tuple[str, ...] = ()
    zygote_env: tuple[tuple[str, str | None], ...] = ()
    # the fault-free run's file events made while modules were being imported: (ordinal, those modules,
    # outermost first). An attempt that has one of them loaded before its tracer starts does not make
    # that event and skips its ordinal (inproc.JobInterposer), so its events keep the trace's numbers
    import_events: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("chaos run --: no COMMAND after --")
        if not any(OUT in a for a in self.command):
            raise ConfigError(f"COMMAND {shlex.join(self.command)!r} has no {OUT}: put {OUT} where the job "
                              "takes its output / checkpoint directory")
        if self.ranks is not None and self.ranks < 1:
            raise ConfigError(f"--ranks must be at least 1, got {self.ranks}")
        if self.ranks is not None and self.torchrun:
            raise ConfigError("--ranks with a torchrun COMMAND: torchrun launches the ranks itself "
                              "(use --nproc-per-node)")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be non-negative, got {self.max_restarts}")
        if self.timeout_s <= 0:
            raise ConfigError(f"--timeout must be positive, got {self.timeout_s:g}")
        if self.hang_timeout_s is not None and not self.hang_timeout_s > 0:
            raise ConfigError(f"--hang-timeout must be a positive number of seconds, got {self.hang_timeout_s:g}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ConfigError(f"--modes {','.join(self.modes)!r}: choose from {','.join(MODES)}")
        if self.faults is not None:
            bad = [f for f in self.faults if f not in FAULT_KINDS]
            if bad or not self.faults:
                raise ConfigError(f"--faults {','.join(self.faults)!r}: choose from {','.join(FAULT_KINDS)}")
        if not self.grace_s >= 0:
            raise ConfigError(f"--grace must be a non-negative number of seconds, got {self.grace_s:g}")
        if not self.net_hold_s > 0:
            raise ConfigError(f"--net-hold must be a positive number of seconds, got {self.net_hold_s:g}")
        if self.faults is not None and "net" in self.faults and self.net_unavailable:
            raise ConfigError(f"--faults net: {self.net_unavailable}")
        if self.faults is not None and "stop" in self.faults and self.nodes is not None:
            raise ConfigError("--faults stop with --nodes: a node's agent restarts its own workers, and the "
                              "simulated nodes' launcher does not watch for a stopped one")
        if self.step_regex is not None:
            try:
                rx = re.compile(self.step_regex)
            except re.error as exc:
                raise ConfigError(f"--step-regex {self.step_regex!r} is not a regular expression: {exc}") from None
            if rx.groups < 1:
                raise ConfigError(f"--step-regex {self.step_regex!r} needs one group that captures the step number")
        if self.loss_regex is not None:
            loss_groups(self.loss_regex)
        if self.loss_band is not None and not 0 <= self.loss_band < 1:
            raise ConfigError(f"--loss-band is a relative band in [0, 1), got {self.loss_band:g}")
        if self.nodes is not None or (self.faults is not None and "node" in self.faults):
            _check_nodes(self)
        _check_launcher(self)

    @property
    def torchrun(self) -> bool:
        return _is_torchrun(self.command)

    @property
    def net_unavailable(self) -> str | None:
        """Why network cuts between ranks cannot apply to this job at all (None: they can, given root).

        The harness puts each copy in its own network namespace, so it must start the copies
        itself: ``--ranks N``, N >= 2 (with ``--launcher docker``, each copy's container on a network
        of the engine, ``chaos.launch.containernet``). torchrun starts its workers itself, in its own
        namespace."""
        if self.torchrun:
            return ("a torchrun COMMAND starts its workers itself, so the harness cannot put each rank in its "
                    "own network namespace; run the training script with --ranks N instead")
        if self.ranks is None or self.ranks < 2:
            return "a network cut between ranks needs at least two: --ranks N with N >= 2"
        return None

    @property
    def world_size(self) -> int:
        if self.ranks is not None:
            return self.ranks
        if self.nodes is not None:
            return self.nodes * nproc_per_node(self.command)
        if self.torchrun:
            for i, a in enumerate(self.command):
                if a.startswith("--nproc-per-node=") or a.startswith("--nproc_per_node="):
                    v = a.split("=", 1)[1]
                    return int(v) if v.isdigit() else 1
                if a in ("--nproc-per-node", "--nproc_per_node") and i + 1 < len(self.command):
                    v = self.command[i + 1]
                    return int(v) if v.isdigit() else 1
        return 1

    def argv(self, out: str, resume: bool) -> list[str]:
        """The command line of one attempt with ``{out}`` filled in."""
        cmd = self.resume_command if resume and self.resume_command else self.command
        return [a.replace(OUT, out) for a in cmd]

    def relative_globs(self, globs: tuple[str, ...]) -> tuple[str, ...]:
        """``{out}/final.pt`` and ``final.pt`` both mean the file under {out}."""
        return tuple(g.replace(OUT + "/", "").replace(OUT, "") or "*" for g in globs)

    def replay_args(self) -> list[str]:
        """The options of ``chaos run`` that rebuild this spec (COMMAND follows ``--``)."""
        args: list[str] = []
        if self.ranks is not None:
            args += ["--ranks", str(self.ranks)]
        if self.resume_command:
            args += ["--resume-cmd", shlex.join(self.resume_command)]
        for g in self.result_globs:
            args += ["--result-file", g]
        if self.step_regex is not None:
            args += ["--step-regex", self.step_regex]
        if self.loss_regex is not None:
            args += ["--loss-regex", self.loss_regex]
        if self.loss_band is not None:
            args += ["--loss-band", repr(self.loss_band)]
        if self.checkpoint_glob is not None:
            args += ["--checkpoint-glob", self.checkpoint_glob]
        if self.max_restarts != 1:
            args += ["--max-restarts", str(self.max_restarts)]
        if self.timeout_s != 300.0:
            args += ["--timeout", repr(self.timeout_s)]
        if self.hang_timeout_s is not None:
            args += ["--hang-timeout", repr(self.hang_timeout_s)]
        if self.rtol != 1e-3:
            args += ["--rtol", repr(self.rtol)]
        if self.modes != MODES:
            args += ["--modes", ",".join(self.modes)]
        if self.faults is not None:
            args += ["--faults", ",".join(self.faults)]
        if self.grace_s != DEFAULT_GRACE_S:
            args += ["--grace", repr(self.grace_s)]
        if self.net_hold_s != DEFAULT_NET_HOLD_S:
            args += ["--net-hold", repr(self.net_hold_s)]
        if not self.preload:
            args += ["--no-preload"]
        if not self.native_trace:
            args += ["--no-native-trace"]
        if not self.materialize:
            args += ["--no-materialize"]
        if self.nodes is not None:
            args += ["--nodes", str(self.nodes)]
        if self.node_hold_s != DEFAULT_NODE_HOLD_S:
            args += ["--node-hold", repr(self.node_hold_s)]
        if self.launcher != "subprocess":
            args += ["--launcher", self.launcher]
        for opt in self.sbatch_options:
            args += [f"--sbatch-opt={opt}"]
        if self.image is not None:
            args += ["--image", self.image]
        return args

    def replay_command(self, point: Point | None = None, seed: int = 0) -> str:
        """``chaos run ... --point ID -- COMMAND``; a non-zero run ``seed`` is part of it, since
        it decides a corruption's bytes and a power-loss state at that point."""
        args = ["chaos", "run", *self.replay_args()]
        if seed:
            args += ["--seed", str(seed)]
        if point is not None:
            args += ["--point", point.replay_id]
        return shlex.join([*args, "--", *self.command])

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> JobSpec:
        """The spec a results JSON recorded (``to_dict``), for ``chaos replay`` and ``chaos repro``.
        KeyError / TypeError / ValueError when the record is not one: the caller names its file.
        A spec without ``materialize`` was written while running to the point was the default,
        so it replays that way."""
        return cls(command=tuple(str(a) for a in spec["command"]),
                   resume_command=tuple(spec["resume_command"]) if spec.get("resume_command") else None,
                   ranks=spec.get("ranks"), result_globs=tuple(spec.get("result_files") or ()),
                   step_regex=spec.get("step_regex"), loss_regex=spec.get("loss_regex"),
                   loss_band=None if spec.get("loss_band") is None else float(spec["loss_band"]),
                   checkpoint_glob=spec.get("checkpoint_glob"), max_restarts=int(spec.get("max_restarts", 1)),
                   timeout_s=float(spec.get("timeout_s", 300.0)),
                   hang_timeout_s=None if spec.get("hang_timeout_s") is None else float(spec["hang_timeout_s"]),
                   rtol=float(spec.get("rtol", 1e-3)),
                   modes=tuple(spec.get("modes") or MODES),
                   faults=tuple(spec["faults"]) if spec.get("faults") is not None else None,
                   grace_s=float(spec.get("grace_s", DEFAULT_GRACE_S)),
                   net_hold_s=float(spec.get("net_hold_s", DEFAULT_NET_HOLD_S)), cwd=spec.get("cwd") or os.getcwd(),
                   nodes=spec.get("nodes"), node_hold_s=float(spec.get("node_hold_s", DEFAULT_NODE_HOLD_S)),
                   preload=spec.get("preload", True) is not False,
                   native_trace=spec.get("native_trace", True) is not False, materialize=spec.get("materialize") is True,
                   launcher=str(spec.get("launcher") or "subprocess"),
                   sbatch_options=tuple(str(o) for o in spec.get("sbatch_options") or ()),
                   image=None if spec.get("image") is None else str(spec["image"]))

    def to_dict(self) -> dict[str, Any]:
        return {"command": list(self.command), "resume_command": list(self.resume_command or []) or None,
                "ranks": self.ranks, "world_size": self.world_size, "torchrun": self.torchrun,
                "result_files": list(self.result_globs), "step_regex": self.step_regex,
                "loss_regex": self.loss_regex, "loss_band": self.loss_band,
                "checkpoint_glob": self.checkpoint_glob, "max_restarts": self.max_restarts,
                "timeout_s": self.timeout_s,
                **({} if self.hang_timeout_s is None else {"hang_timeout_s": self.hang_timeout_s}), "rtol": self.rtol, "modes": list(self.modes),
                "faults": None if self.faults is None else list(self.faults), "grace_s": self.grace_s,
                "net_hold_s": self.net_hold_s, "cwd": self.cwd, "nodes": self.nodes,
                "node_hold_s": self.node_hold_s, **({} if self.preload else {"preload": False}),
                **({} if self.native_trace else {"native_trace": False}),
                "materialize": self.materialize,
                **({"launcher": self.launcher, "sbatch_options": list(self.sbatch_options)}
                   if self.launcher != "subprocess" else {}),
                **({} if self.image is None else {"image": self.image})}


# -- a job on simulated nodes (--nodes N): the pure checks, parsed here; nodes.py runs it

def torchrun_option(argv: Iterable[str], *names: str) -> tuple[int, str] | None:
    """(index of the value's argument, value) of torchrun option ``names`` (``--x v`` or ``--x=v``)."""
    args = list(argv)
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return i + 1, args[i + 1]
            if a.startswith(n + "="):
                return i, a.split("=", 1)[1]
    return None


def _value(argv: Iterable[str], *names: str) -> str | None:
    found = torchrun_option(argv, *names)
    return None if found is None else found[1]


def nproc_per_node(argv: Iterable[str]) -> int:
    """torchrun's ``--nproc-per-node`` as a number (1 where absent or not a number)."""
    v = _value(argv, "--nproc-per-node", "--nproc_per_node")
    return int(v) if v is not None and v.isdigit() else 1


def nnodes_range(text: str) -> tuple[int, int] | None:
    """``--nnodes`` ``N`` or ``MIN:MAX`` as (MIN, MAX); None if it is neither."""
    m = re.fullmatch(r"(\d+)(?::(\d+))?", text.strip())
    if not m:
        return None
    lo = int(m.group(1))
    return lo, int(m.group(2)) if m.group(2) else lo


def _check_nodes(job: JobSpec) -> None:
    """ConfigError unless ``job`` can run on ``job.nodes`` simulated nodes (``JobSpec.__post_init__``)."""
    if job.nodes is None:
        raise ConfigError("--faults node needs --nodes N: a node fault takes a job spread over simulated nodes")
    n = job.nodes
    if not 2 <= n <= MAX_NODES:
        raise ConfigError(f"--nodes must be in 2..{MAX_NODES}, got {n}")
    if not job.node_hold_s > 0:
        raise ConfigError(f"--node-hold must be a positive number of seconds, got {job.node_hold_s:g}")
    for what, cmd in (("COMMAND", job.command), ("--resume-cmd", job.resume_command)):
        if cmd is None:
            continue
        line = " ".join(cmd)
        if not _is_torchrun(tuple(cmd)):
            raise ConfigError(f"--nodes needs a torchrun {what} (one torchrun agent runs on each node), got {line!r}")
        if not any(RDZV in a for a in cmd):
            raise ConfigError(f"--nodes: {what} {line!r} has no {RDZV}: give the agents their rendezvous with "
                              f"--rdzv-endpoint {RDZV} (node 0's address and a free port, filled in by the harness)")
        backend = _value(cmd, "--rdzv-backend", "--rdzv_backend")
        if backend != "c10d":
            raise ConfigError(f"--nodes: {what} needs --rdzv-backend c10d (got {backend or 'the static default'}): "
                              "the nodes meet in torchrun's c10d rendezvous")
        if "--standalone" in cmd:
            raise ConfigError(f"--nodes: {what} has --standalone, which keeps every agent to its own node")
        nn = _value(cmd, "--nnodes")
        span = nnodes_range(nn) if nn is not None else None
        if span is None:
            raise ConfigError(f"--nodes: {what} needs --nnodes {n} (or an elastic --nnodes MIN:MAX that holds {n}), "
                              f"got {nn!r}" if nn is not None else f"--nodes: {what} needs --nnodes {n} (or MIN:MAX)")
        if not span[0] <= n <= span[1]:
            raise ConfigError(f"--nodes {n} does not fit {what}'s --nnodes {nn}")
        procs = _value(cmd, "--nproc-per-node", "--nproc_per_node")
        if procs is not None and not procs.isdigit():
            raise ConfigError(f"--nodes: {what} needs a number for --nproc-per-node (got {procs!r}): the harness "
                              "must know which ranks live on which node")
    if job.faults is not None:
        bad = [k for k in job.faults if k not in KINDS_WITH_NODES]
        if bad:
            raise ConfigError(f"--faults {','.join(bad)} with --nodes: only {','.join(KINDS_WITH_NODES)} are "
                              "explored on simulated nodes")


def _check_launcher(job: JobSpec) -> None:
    """ConfigError unless ``job.launcher`` can launch this job with these faults (``JobSpec.__post_init__``).

    Slurm launches one process per attempt here (a batch job); it restarts the job itself only at a
    sched point. A family that needs the harness's own hands on the copies (SIGTERM, a halt, a tmpfs,
    a network namespace) is refused with sbatch rather than half made."""
    if job.launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher {job.launcher!r}: choose from {', '.join(LAUNCHERS)}")
    if job.image is not None and job.launcher != "docker":
        raise ConfigError("--image needs --launcher docker: it names the image each copy's container runs")
    if job.image is not None and not IMAGE_REF.fullmatch(job.image):
        # never an option: `docker run ... IMAGE` would take "--privileged" from a hostile results file as one
        raise ConfigError(f"--image {job.image!r}: not an image reference (give NAME, NAME:TAG or NAME@DIGEST, as "
                          "docker images lists it)")
    if job.launcher == "docker" and job.nodes is not None:
        raise ConfigError("--launcher docker with --nodes: simulated nodes are network namespaces of this host, "
                          "each running its agent as a process")
    if job.launcher != "sbatch":
        if job.faults is not None and "sched" in job.faults:
            raise ConfigError("--faults sched needs --launcher sbatch: Slurm requeues, preempts or loses the "
                              "node of a job it launched")
        if job.sbatch_options:
            raise ConfigError("--sbatch-opt needs --launcher sbatch")
        return
    shape = ("--ranks" if job.ranks is not None else "--nodes" if job.nodes is not None
             else "a torchrun COMMAND" if job.torchrun else None)
    if shape is not None:
        raise ConfigError(f"--launcher sbatch with {shape}: a Slurm batch job here runs one plain COMMAND "
                          "(one process per attempt)")
    if job.hang_timeout_s is not None:
        raise ConfigError("--hang-timeout with --launcher sbatch: Slurm runs the job, and bounds it by its own "
                          "--time (--sbatch-opt=--time=...)")
    if job.faults is not None:
        bad = [k for k in job.faults if k not in KINDS_WITH_SBATCH]
        if bad:
            raise ConfigError(f"--faults {','.join(bad)} with --launcher sbatch: only "
                              f"{','.join(KINDS_WITH_SBATCH)} are explored on a job Slurm launches")
    check_sbatch_options("--sbatch-opt", job.sbatch_options,
                         ("--requeue", "--no-requeue", "--output", "-o", "--error", "-e", "--wrap", "--parsable"),
                         "--requeue, --output, --error and the batch script itself")


def check_sbatch_options(flag: str, options: Iterable[str], reserved: tuple[str, ...], harness_sets: str) -> None:
    """ConfigError unless each of ``options`` is an sbatch option (``--name=value``) the harness does not set
    itself (``reserved``). For ``--sbatch-opt`` (the job's batch job, here) and ``--executor-opt`` (the
    Slurm executor's array, ``cli.job``)."""
    for opt in options:
        if not opt.startswith("-") or opt.split("=", 1)[0] in reserved:
            raise ConfigError(f"{flag} {opt!r}: give an sbatch option as --name=value (the harness sets "
                              f"{harness_sets})")
