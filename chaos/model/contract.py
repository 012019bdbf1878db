"""The contract between the harness and a job's rank processes: names and constants only.

``launch.py`` sets the ``ENV_*`` variables for every process of a job; the boot path it
puts on ``PYTHONPATH`` (``boot/sitecustomize.py`` -> ``inproc.py``) reads them, and the
two meet again in the trace directory through the request names. ``spec.py`` re-exports
all of it for the harness's side. It lives apart from ``spec.py`` because it is imported
as every traced rank starts: nothing here may import ``dataclasses``, ``typing`` or
``shlex``, which a pure-Python job would otherwise pay for in every process.
"""

from __future__ import annotations

import os
import re

from chaos.errors import ConfigError

OUT = "{out}"
MODES = ("before", "after", "torn")  # kill points at a file event (``--modes``); a step point's mode is kill or term
CORRUPT_FAMILIES = ("bitflip", "truncate", "zero", "delete")  # at-rest corruption of a file the job completed
# The at-rest families (``chaos.nemesis.family``: each one module), one line a family: its ``--faults``
# kind -> the point modes it carries. Each strikes a file the job completed, right after the event
# that completed it or once a later step is announced (:stepS), with every copy stopped.
AT_REST_FAMILIES: dict[str, tuple[str, ...]] = {
    "corrupt": CORRUPT_FAMILIES,   # bit rot: a bit flipped, truncated, zeroed, deleted
    "stale": ("stale",),           # an older version of the file put back in its place
    "swap": ("swap",),             # two ranks' files of one checkpoint swapped
    "payload": ("payload",),       # code planted in the file, in its own format (pickle, torch zip)
    "reorder": ("reorder",),       # its writes since the last fsync reaching the disk out of order
}
AT_REST_KINDS = tuple(k for k in AT_REST_FAMILIES if k != "corrupt")  # families whose mode is their name
ROT_MODES = tuple(m for modes in AT_REST_FAMILIES.values() for m in modes)  # every at-rest point mode
ERRNO_MODES = ("enospc", "eio")          # the event raises OSError instead of being performed (fsync: fsync_fail)
# Every family that stops every copy right after an event and then edits {out}: the at-rest ones,
# and a power loss (right after the event only: a power cut does not wait for a step).
HALT_FAMILIES: dict[str, tuple[str, ...]] = {**AT_REST_FAMILIES, "power": ("power",)}
HALT_MODES = tuple(m for modes in HALT_FAMILIES.values() for m in modes)
# A scheduler's fault (``chaos.nemesis.sched``, ``--launcher sbatch``): Slurm requeues the job, preempts it,
# or loses its node, at a step or right after a file event; the rank asks, the sbatch launcher acts.
SCHED_MODES = ("requeue", "preempt", "node")
OP_MODES = (*MODES, *HALT_MODES, *ERRNO_MODES, "net", *SCHED_MODES, "stop")
STEP_MODES = ("kill", "term", "net", *SCHED_MODES, "stop", "restart")
# ``--faults``: the families a job is explored with (default: every one that applies here; ``stop`` and
# ``restart`` only when asked for, ``chaos.nemesis.stop`` / ``chaos.nemesis.restart``).
FAULT_KINDS = ("kill", *HALT_FAMILIES, "errno", "term", "diskfull", "net", "sched", "stop", "restart")
DEFAULT_GRACE_S = 5.0
DEFAULT_NET_HOLD_S = 5.0  # --net-hold: how long a cut rank's link stays down before the copies are SIGKILLed
DEFAULT_STOP_SILENCE_S = 10.0  # a stop point without --hang-timeout: the silence after which the attempt is hung

# Set by the harness for every process of a job; read by the boot path.
ENV_OUT = "CHAOS_JOB_OUT"                # the job's {out}: the interposer traces under it
ENV_TRACE_DIR = "CHAOS_JOB_TRACE_DIR"    # where each traced process writes its trace
ENV_POINT = "CHAOS_JOB_POINT"            # JSON of the point to fire in this attempt: Point.env(), "anchor" included
# JSON of a second fault (Point.then) that a torchrun COMMAND's workers fire in the agent's first restart
ENV_POINT_THEN = "CHAOS_JOB_POINT_THEN"
ENV_RANKS_ONLY = "CHAOS_JOB_RANKS_ONLY"  # "1": only processes with RANK set (torchrun workers)
ENV_CHILDREN = "CHAOS_JOB_CHILDREN"      # "1": also trace children of a traced process
ENV_STEP_REGEX = "CHAOS_JOB_STEP_REGEX"  # --step-regex, scanned in the job's own stdout/stderr
ENV_LOSS_REGEX = "CHAOS_JOB_LOSS_REGEX"  # --loss-regex, scanned there too
ENV_BOOTED = "CHAOS_JOB_BOOTED"          # pid of the traced ancestor (set by the boot itself)
ENV_RANK = "CHAOS_JOB_RANK"              # rank when the launcher sets no RANK (a plain command)
ENV_ATTEMPT = "CHAOS_JOB_ATTEMPT"        # attempt when no TORCHELASTIC_RESTART_COUNT is set
ENV_MARK = "CHAOS_JOB_MARK"              # every process of a point carries it: cleanup finds them
ENV_TMP = "CHAOS_JOB_TMP"                # the point's temp dir: each rank's TMPDIR is its own folder in it
ENV_PYCACHE = "CHAOS_JOB_PYCACHE"        # where the boot path compiles the tracer's modules (scratch root)
ENV_GATE = "CHAOS_JOB_GATE"              # "GO_FD,READY_FD": a spare interpreter waits there (spares.py)
ENV_PRELOAD = "CHAOS_JOB_PRELOAD"        # modules the boot path imports before the gate (explore.preload)
ENV_IMPORT_EVENTS = "CHAOS_JOB_IMPORT_EVENTS"  # the fault-free run's file events made inside imports (launch.preload)
ENV_ZYGOTE = "CHAOS_JOB_ZYGOTE"          # fd of the socket a zygote forks attempts on (launch/zygote.py)
ENV_ZYGOTE_ENV = "CHAOS_JOB_ZYGOTE_ENV"  # JSON {name: value|null} the zygote's preload must leave set so
IMPORTS_FILE = "imports-r{rank}-a{attempt}-p{pid}.json"  # what a rank had imported at its first file event
PROBE_FILE_ENV = "CHAOS_PROBE_FILE"      # chaos.probe writes its JSON lines here
# The ``chaos.probe`` announcements that say "step n ran": probe.step, a --step-regex match,
# a --loss-regex match. Kill and term points at steps fire on them.
STEP_KINDS = ("step", "regex", "loss")

# A torchrun COMMAND relaunched by the harness (after a SIGTERM, a corruption, a power loss):
# its workers' attempt is TORCHRUN_STRIDE * the harness's attempt + torchelastic's restart count.
TORCHRUN_STRIDE = 100

# Requests a rank leaves in the trace directory for the launcher's poll loop (launch.py):
HALT_REQUEST = "halt-request"  # stop every copy now (a corruption or power-loss point fired)
TERM_REQUEST = "term-request"  # send SIGTERM to every copy, then SIGKILL after the grace
TERM_SENT = "term-sent"        # the launcher's answer: SIGTERM was sent
NET_REQUEST = "net-request"    # cut this rank's link (a net point fired); the rank goes on
NET_DOWN = "net-down"          # the launcher's answer: the link is down (or why it is not)
SCHED_REQUEST = "sched-request"  # have Slurm requeue / preempt the job or down its node (a sched point fired)
SCHED_DONE = "sched-done"        # the sbatch launcher's answer: what Slurm was told (or why nothing was)
STOP_REQUEST = "stop-request"    # this rank stops itself (SIGSTOP) right after leaving it: watch for the hang
FILL_REQUEST = "fill-request"    # fill {out}'s tmpfs now, leaving the point's bytes free (disk:stepS:full fired)
FILL_DONE = "fill-done"          # the launcher's answer: the disk is full (or why it is not)
SYNC_OPS = ("fsync", "fdatasync")  # the traced ops that make a file's data durable (a failed one may lose it)
RESTART_REQUEST = "restart-request"  # have the engine restart this rank's container in place (--launcher docker)
RESTART_DONE = "restart-done"        # the launcher's answer: what the engine did (or why it did nothing)
RESTART_FIRED = "restart-fired-r{rank}-a{attempt}"  # the point fired: the restarted process's tracer does not again
# The process the engine started again in a restarted container traces as attempt IN_PLACE_BASE + its attempt:
# a restart of its own, after the attempt it belongs to and before the harness's next one in time, never
# before it in number for a rank the harness restarted too
IN_PLACE_BASE = 10_000


def restart_marker(trace_dir: str, rank: int, attempt: int) -> str:
    """The file that says rank ``rank``'s restart point of ``attempt`` fired already (:data:`RESTART_FIRED`):
    the tracer of the process the engine restarted finds it and neither fires again nor writes into the
    first process's trace. Written and read by the rank's tracer (``chaos.target.job.inproc``)."""
    return os.path.join(trace_dir, RESTART_FIRED.format(rank=rank, attempt=attempt))


def loss_groups(regex: str) -> tuple[int | str, int | str]:
    """Which groups of a ``--loss-regex`` hold the step and the loss: the named ``step`` and
    ``loss``, else the first two in that order. Called by the spec (to validate) and by the
    boot path's output scanner."""
    try:
        rx = re.compile(regex)
    except re.error as exc:
        raise ConfigError(f"--loss-regex {regex!r} is not a regular expression: {exc}") from None
    named = rx.groupindex
    if "step" in named and "loss" in named:
        return "step", "loss"
    if named.keys() & {"step", "loss"} or rx.groups < 2:
        raise ConfigError(f"--loss-regex {regex!r} needs the step and the loss: groups named step and loss, "
                          "or two groups, step first (e.g. 'step (\\d+) loss ([0-9.eE+-]+)')")
    return 1, 2
