"""Point: one place to break a user's job, as plain data (``rank0:op17:before``, ``rank1:step6:net``).

Parsed by :mod:`chaos.model.grammar` (``--point``), planned by ``chaos.plan.pointset`` from the
fault-free run's trace, fired in-rank by ``chaos.target.job.inproc`` (``Point.env``) or by the
harness (a full disk, a node fault), and written into the results as a ``faults`` entry
(``Point.to_fault``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.model.contract import AT_REST_FAMILIES, AT_REST_KINDS, ERRNO_MODES, SCHED_MODES

# Node faults of a job spread over simulated nodes (``--nodes N``, chaos/nemesis/nodes.py): harness-side
# only, so they are not part of contract.py (a node point fires in-rank as a ``net`` request).
NODE_MODES = ("loss", "link", "rdzv")  # node<i>:step<n>:MODE


@dataclass(frozen=True)
class Point:
    """One place to break a job.

    - ``op`` (ordinal of the rank's traced file events in attempt 0, counted from 0) with
      ``mode``: before / after / torn (a kill), a corruption family (stop every copy right
      after the event, corrupt the file it completed, restart), ``power`` (stop every copy
      there and replace {out} by a power-loss crash state: every pending change lost, or with
      ``state`` k the k-th of the other states the cut allows, drawn with the point's seed:
      some un-fsynced data or directory entries kept, a write torn), ``enospc`` / ``eio`` (the event
      raises instead of being performed); a corruption with ``at_step`` S waits until the rank
      announces step S (the save that wrote the file is over and the job trusts it: bit rot
      at rest), then stops every copy and corrupts the file event N completed; ``payload``,
      ``stale`` and ``swap`` strike the same file at the same moments, each its own family
      (``chaos.nemesis.payload`` / ``stale`` / ``swap``);
    - ``step`` with mode ``kill`` (SIGKILL) or ``term`` (SIGTERM, SIGKILL after the grace);
    - ``step`` or ``op`` with mode ``net``: the rank's network link is cut there (after the
      event, for an op) for ``--net-hold`` seconds while the job goes on (``netcut.py``);
    - ``size`` with mode ``diskfull``: {out} is a tmpfs of that many bytes for attempt 0; with ``step``
      S too (the built-in ``disk:stepS:full,free=B``), {out} is a roomy tmpfs until rank 0 announces
      step S, when the launcher shrinks it to what is in use plus ``size`` = B bytes
      (``chaos.nemesis.diskfull.fill``).
    - ``step`` or ``op`` with mode ``requeue``, ``preempt`` or ``node`` (``sched``, ``--launcher sbatch``):
      Slurm requeues the job there, preempts it, or sets its node down (``chaos.nemesis.sched``).
    - ``builtin``: a built-in workload's fault as written, which is the point's id (``chaos run
      --as-job --fault ...``, or the replay of a built-in result):

      - with ``rule``, an I/O fault (``rank0:step4:crash,nth=1,op=write``; mode its kind: crash,
        shortwrite, eio, enospc, fsyncfail, slowio), fired by the job's tracer through the
        interposer's own ``rule`` (``Fault.io_rule``) at the exact op it names, counted as the
        built-in rank counts it;
      - with an at-rest mode (bitflip, truncate, zero, delete, stale, swap, payload), ``at_step`` S
        and no ``op``, the built-in ``ckpt:stepS:KIND`` (its ``settings``: bits, region, file, seed,
        format ...): every copy halts when rank 0 announces step S, and a file of the newest
        checkpoint is struck as the built-in fault says (``chaos.nemesis.newest``);
      - with mode ``power`` and ``step`` S, the power cuts of the whole save at step S
        (``all:step8:power,max_states=60,seed=0``): a stand-in that never runs, replaced once the
        fault-free run is traced by the ``power`` points of that save (:attr:`whole_save`).

    ``kind``, ``path`` (relative to {out}; for a corruption the file corrupted), ``seq``
    (trace sequence number) and ``nth`` (how many events of this kind on this path came
    before, plus one) describe what the fault-free run did there. With ``anchored`` they
    also say where the point fires: both fault-free runs had this rank's ``nth`` event of
    ``kind`` on ``path`` (so the path is no random temp name), and a rank fires at that
    event whatever its ordinal in that run. Ranks that race (two creating one directory,
    whichever is first) shift each other's ordinals between runs, never another path's
    count. ``op`` still names the point (``id``); :attr:`replay_id` adds the anchor.

    ``then``: a second fault, a kill (before / after / torn) at the resume's event ``then.op``
    or a power cut right after it (``power``), in ``attempt`` 1, its ordinals those of the
    restart's own trace, after which the job is restarted once more: the crash during recovery
    a first fault's restart may not survive (``rank0:op17:after+rank0:op4:before``,
    ``rank0:step5:kill+rank0:op6:power``; kills chosen by ``chaos.plan.resumepoints``).
    """

    rank: int
    mode: str
    op: int | None = None
    step: int | None = None
    kind: str | None = None
    path: str | None = None
    seq: int | None = None
    nth: int | None = None
    size: int | None = None
    node: int | None = None  # a node point (``--nodes``): the node; ``rank`` is the rank that announces the step
    state: int | None = None  # a power point: which mixed crash state at its cut (None: every pending change lost)
    at_step: int | None = None  # a corruption point: strike once the rank announced this step, not right after event N
    anchored: bool = False  # fire at the nth ``kind`` event on ``path``, not at ordinal ``op`` (see above)
    # an at-rest point whose event is not on its file (a directory renamed into place completes every file in
    # it): the file it strikes, named in its id (``rank0:op9:payload=ckpt/step-6/manifest.pkl``), so that
    # each file's point has its own id and its replay strikes that file
    file: str | None = None
    # a step kill at a named phase of that step's save, as the checkpointer announces it through
    # ``chaos.phases`` (``rank1:step23:kill,phase=vote``: the built-in fault's spelling, as --as-job passes it)
    phase: str | None = None
    # a built-in fault (see above): as written, and for an I/O fault the interposer's rule, as sorted items
    builtin: str | None = None
    rule: tuple[tuple[str, Any], ...] | None = None
    settings: tuple[tuple[str, Any], ...] = ()  # the built-in fault's own key=value settings (seed, bits, file ...)
    attempt: int = 0  # the attempt it fires in: 0, or 1 for the second fault of a point (``then``)
    # a second fault, in the restart the first one caused: a kill at the resume's event ``then.op``
    # (``rank0:op17:after+rank0:op4:before``) or a power cut right after it (``...+rank0:op4:power``):
    # a crash during recovery, then one more restart
    then: Point | None = None

    @property
    def anchor(self) -> str | None:
        """``KIND:PATH:NTH`` where the point fires (``anchored``); None where it fires by ordinal.

        Colons, not a ``#``, so a replay command needs no quoting for the usual path."""
        if not self.anchored or self.op is None or not self.kind or not self.path or not self.nth:
            return None
        return f"{self.kind}:{self.path}:{self.nth}"

    @property
    def replay_id(self) -> str:
        """What a replay command passes to ``--point``: :attr:`id`, with ``@`` and the anchor if any
        before the second fault's ``+`` (``rank0:op17:after@write:ckpt/a.pt:3+rank0:op4:before``)."""
        anchor = self.anchor
        own = self.own_id if anchor is None else f"{self.own_id}@{anchor}"
        return own + self._then_id

    @property
    def id(self) -> str:
        return self.own_id + self._then_id

    @property
    def _then_id(self) -> str:
        return "" if self.then is None else f"+{self.then.id}"

    @property
    def own_id(self) -> str:
        """This fault's id alone, without a second fault's ``+...``: what seeds what it does
        (``atrest.point_seed``), so a point struck again in its resume does the same first."""
        if self.node is not None:
            return f"node{self.node}:step{self.step}:{self.mode}"
        if self.builtin is not None:
            return self.builtin
        if self.mode == "diskfull":
            return f"disk:full:{self.size}"
        if self.step is not None:
            return f"rank{self.rank}:step{self.step}:{self.mode}" + (f",phase={self.phase}" if self.phase else "")
        on = f"={self.file}" if self.file is not None else ""
        if self.at_step is not None:
            return f"rank{self.rank}:op{self.op}:{self.mode}:step{self.at_step}{on}"
        return f"rank{self.rank}:op{self.op}:{self.mode}" + (f":s{self.state}" if self.state is not None else "") + on

    @property
    def grace_s(self) -> float | None:
        """A SIGTERM's own grace (the built-in ``term:...,grace=S``); None: the job's ``--grace``."""
        grace = dict(self.settings).get("grace")
        return None if grace is None else float(grace)

    @property
    def linger_s(self) -> float:
        """How long the other copies run on once the struck one is gone (the built-in ``linger=S``), 0: none."""
        return float(dict(self.settings).get("linger", 0.0))

    @property
    def lost(self) -> bool:
        """A kill with ``lost=true``: the rank never comes back and the restarts run on one rank fewer
        (``chaos.nemesis.shrink``)."""
        return dict(self.settings).get("lost") is True

    @property
    def strikes_newest(self) -> bool:
        """The built-in ``ckpt:stepS:KIND``: every copy halts at step ``at_step`` and a file of the newest
        checkpoint is struck (``chaos.nemesis.newest``), not the file a traced event completed."""
        return self.builtin is not None and self.op is None and self.at_step is not None

    @property
    def whole_save(self) -> bool:
        """A stand-in for the power cuts of the whole save at ``step`` (the built-in ``all:stepS:power``):
        ``chaos.plan.translate.points_for`` replaces it by that save's ``power`` points before any runs."""
        return self.builtin is not None and self.rule is None and self.mode == "power"

    @property
    def family(self) -> str:
        """Which ``--faults`` kind this point belongs to."""
        if self.node is not None:
            return "node"
        if self.mode == "diskfull":
            return "diskfull"
        if self.mode == "term":
            return "term"
        if self.mode in ("net", "stop", "restart"):
            return self.mode
        if self.rule is not None:  # a built-in I/O fault: a death at an exact op is a kill, the rest the errno kind's
            return "kill" if self.mode in ("crash", "shortwrite") else "errno"
        if self.mode in SCHED_MODES:
            return "sched"
        for family, modes in AT_REST_FAMILIES.items():
            if self.mode in modes:
                return family
        if self.mode == "power":
            return "power"
        if self.mode in ERRNO_MODES:
            return "errno"
        return "kill"

    @property
    def in_rank(self) -> bool:
        """Whether a rank fires it (everything but a full disk, which the harness mounts)."""
        return self.mode != "diskfull" or self.step is not None  # (a fill at a step: rank 0 asks for it)

    def env(self) -> dict[str, Any]:
        """What the boot path needs to fire this point (a node point: the announcing rank asks the
        launcher for the node fault with a ``net`` request, and waits for its answer)."""
        if self.node is not None:
            return {"rank": self.rank, "mode": "net", "op": None, "step": self.step}
        env = {"rank": self.rank, "mode": self.mode, "op": self.op, "step": self.step}
        if self.at_step is not None:
            env["at_step"] = self.at_step  # (without an op: the built-in ckpt:stepS:KIND halts at the step)
        if self.anchor is not None:
            env["anchor"] = [self.kind, self.path, self.nth]
        if self.attempt:
            env["attempt"] = self.attempt
        if self.phase is not None:
            env["phase"] = self.phase
        if self.rule is not None:
            env["rule"] = dict(self.rule)
        return env

    def to_fault(self, **extra: Any) -> dict[str, Any]:
        """The point as an entry of the results' ``faults`` list (the existing schema).

        ``kind``: crash (before/after/torn), kill, term, corrupt, stale, swap, payload,
        powerloss, ioerror, diskfull or netcut; ``params.when`` the finer mode (``corrupt`` +
        ``bitflip``, ...).
        """
        fam = self.family
        if fam == "node":
            return _node_fault(self, extra)
        kind = {"kill": "crash" if self.step is None else "kill", "corrupt": "corrupt", "power": "powerloss",
                "errno": "ioerror", "term": "term", "diskfull": "diskfull", "net": "netcut", "sched": "sched", "stop": "stop", "restart": "restart",
                **{k: k for k in AT_REST_KINDS}}[fam]  # an at-rest family's kind is its name
        if self.rule is not None:
            return _io_fault(self, extra)
        if self.strikes_newest:
            params = {"when": self.mode, **{k: v for k, v in extra.items() if v is not None}, **dict(self.settings)}
            return {"kind": self.mode, "rank": None, "step": self.at_step, "attempt": self.attempt, "params": params,
                    "spec": self.own_id}
        when = None if fam in ("power", "diskfull", "net", "stop", *AT_REST_KINDS) else self.mode
        params = {k: v for k, v in (("op", self.op), ("when", when), ("event", self.kind),
                                    ("path", self.path), ("seq", self.seq), ("nth", self.nth),
                                    ("size_bytes", self.size), ("at_step", self.at_step), ("phase", self.phase))
                  if v is not None}
        params.update({k: v for k, v in extra.items() if v is not None})
        params.update(dict(self.settings))  # a built-in fault's own (a SIGTERM's grace, a linger)
        if fam == "diskfull" and self.step is not None:  # the built-in fault's own entry: its step and free bytes
            params = {"free": self.size, **{k: v for k, v in extra.items() if v is not None}}
            return {"kind": "diskfull", "rank": None, "step": self.step, "attempt": self.attempt, "params": params,
                    "spec": self.own_id}
        return {"kind": kind, "rank": None if fam == "diskfull" else self.rank, "step": self.step,
                "attempt": self.attempt, "params": params, "spec": self.own_id}


_RULE_KEYS = {"op": "op", "nth": "nth", "path_glob": "path", "byte": "byte", "phase": "phase", "delay_s": "delay",
              "keep": "keep", "times": "times"}  # an interposer rule's settings -> the built-in fault's keys


def _io_fault(point: Point, extra: dict[str, Any]) -> dict[str, Any]:
    """A built-in I/O fault's point as the built-in fault's own entry (kind crash, eio, ...; its settings)."""
    rule = dict(point.rule or ())
    params = {key: rule[k] for k, key in _RULE_KEYS.items()
              if rule.get(k) is not None and not (k == "delay_s" and not rule[k])}
    params.update({k: v for k, v in extra.items() if v is not None})
    return {"kind": point.mode, "rank": point.rank, "step": rule.get("step"), "attempt": point.attempt,
            "params": {"when": point.mode, **params}, "spec": point.own_id}


def _node_fault(point: Point, extra: dict[str, Any]) -> dict[str, Any]:
    """A node point as an entry of the results' ``faults`` list."""
    kind = {"loss": "node_loss", "rdzv": "rendezvous_host_loss", "link": "node_link_cut"}[point.mode]
    params = {"node": point.node, "announced_by_rank": point.rank, **{k: v for k, v in extra.items() if v is not None}}
    return {"kind": kind, "rank": None, "step": point.step, "attempt": 0, "params": params, "spec": point.id}
