"""The program each rank process runs: train, save, resume — and log everything.

It is imported once in the warm fork server (torch preloaded) and entered through
``rank_entry`` in every forked rank, so a launch or restart costs a fork, not a
torch import.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import math
import os
import signal
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F

from chaos import phases, probe
from chaos.errors import ConfigError
from chaos.model import statehash
from chaos.target.protocol import auxiliary_files, load_checkpointer
from chaos.target.workload import device as devices
from chaos.target.workload import parallel, rng
from chaos.target.workload.config import WorkloadConfig
from chaos.target.workload.data import Loader
from chaos.target.workload.log import EventLog
from chaos.target.workload.spec import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, SCENARIO_ENV, RankSpec

# The pid that imported this module (and torch with it). In a rank forked from the warm
# fork server it differs from the rank's own pid: proof that the rank imported nothing.
IMPORTED_IN_PID = os.getpid()


def become_rank_process() -> None:
    """What every forked rank-like process does first: lead its own process group (so one
    killpg takes it and its helpers), die with the process that forked it, one thread."""
    try:
        os.setpgid(0, 0)
    except PermissionError:
        pass  # already a session leader (e.g. under torchrun): its own group already
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    os.environ["OMP_NUM_THREADS"] = "1"


def enter_scratch(scratch: str) -> None:
    """Keep this process's temporary files inside the scenario's scratch root, and mark it.

    ``tempfile`` caches its directory, and the fork server may have looked it up
    already, so both the environment (for children) and the cache are set.
    """
    tmp = os.path.join(scratch, "tmp")
    os.makedirs(tmp, exist_ok=True)
    os.environ["TMPDIR"] = tmp
    os.environ[SCENARIO_ENV] = scratch
    tempfile.tempdir = tmp


def lr_lambda_factory(cfg: WorkloadConfig):
    def lr_lambda(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        span = max(1, cfg.steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return lr_lambda


class Trainer:
    """The training state of one rank and how it maps to the checkpoint state dict.

    The model's layout over the ranks (DDP, FSDP2, HSDP, tensor parallel) is
    ``cfg.parallel``; :mod:`chaos.target.workload.parallel` builds it and says what the state of
    ``model`` and ``optimizer`` is in each mode. ``device`` is where the model and the
    batches live (``train`` passes the rank's GPU for ``device=cuda``, from
    ``chaos.target.workload.device.setup``); without it everything stays on the CPU, as the
    harness's own helpers (crash-state recovery, benches) build their templates.
    """

    def __init__(self, cfg: WorkloadConfig, rank: int, world_size: int, device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.device = device or torch.device("cpu")
        self.layout = parallel.layout(cfg, rank, world_size)
        # Tensor parallel ranks share a batch and must draw the same dropout masks on the
        # replicated activations: they seed by data-parallel rank (0), the others by rank.
        rng.seed_all(cfg.seed * 1000 + self.layout.dp_rank)
        self.model = parallel.wrap(cfg, self.layout, self.device)
        self.optimizer = parallel.make_optimizer(cfg, self.model)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda_factory(cfg))
        self.loader = Loader(cfg, rank, world_size, self.layout.dp_rank, self.layout.dp_size)
        self.step = 0
        self.tokens = 0
        self.tokens_per_step = cfg.batch_size * cfg.seq_len * self.layout.dp_size
        self.noise = None
        if cfg.nondeterminism > 0:
            # Seeded from the OS, never checkpointed (it is hardware, not state), the same on
            # every rank so DDP replicas stay equal, as NCCL's reductions do.
            seed = torch.tensor([int.from_bytes(os.urandom(7), "little")], dtype=torch.long)
            dist.broadcast(seed, 0)
            self.noise = torch.Generator().manual_seed(int(seed.item()))

    def state_dict(self) -> dict[str, Any]:
        model, optimizer = parallel.model_and_optimizer_state(self.cfg, self.model, self.optimizer)
        return {
            "model": model,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "rng": rng.capture(self.device.type),
            "data": self.loader.sampler.state_dict(),
            "progress": {"step": self.step, "tokens": self.tokens},
        }

    def template(self) -> dict[str, Any]:
        """The state as a loader must fill it: shaped like a saved one even before step 1.

        A fresh AdamW has no per-parameter state yet; checkpointers that load in place
        (DCP) need the moments' shapes up front, so the template carries zero-filled
        entries of the right shape and dtype (and, sharded, placement), exactly as AdamW
        creates them — built without stepping the optimizer (see chaos.target.workload.parallel).
        """
        return {
            "model": parallel.model_state(self.cfg, self.model),
            "optimizer": parallel.optimizer_template(self.cfg, self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng.capture(self.device.type),
            "data": self.loader.sampler.state_dict(),
            "progress": {"step": self.step, "tokens": self.tokens},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        parallel.load_model_and_optimizer(self.cfg, self.model, self.optimizer, state["model"], state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.loader.sampler.load_state_dict(state["data"])
        self.step = int(state["progress"]["step"])
        self.tokens = int(state["progress"]["tokens"])
        rng.restore(state["rng"])

    def train_step(self) -> tuple[float, float]:
        x, y = self.loader.next_batch()
        x, y = x.to(self.device), y.to(self.device)  # the batch is made on the CPU (its RNGs are CPU ones)
        self.model.train()
        logits = self.model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.noise is not None:
            for p in self.model.parameters():
                if p.grad is not None:
                    grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad  # a DTensor: its shard
                    noise = torch.randn(grad.shape, generator=self.noise).to(grad.device)
                    grad.mul_(1.0 + self.cfg.nondeterminism * noise)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.tokens += self.tokens_per_step
        return float(loss.item()), float(lr)


class FaultTrigger:
    """Stops this rank at a planned point and lets the supervisor act on it from outside.

    Points are "before training step N" or "phase P of the save at step N" (announced
    through chaos.phases by the checkpointer, or by this loop as phase "save"). The
    rank blocks until the supervisor answers, so the fault lands exactly there.
    """

    def __init__(self, spec: RankSpec, conn: Any, log: EventLog, interposer: Any = None) -> None:
        self.conn, self.log, self.interposer = conn, log, interposer
        self.by_step = {int(t["step"]): t for t in spec.triggers if not t.get("phase")}
        self.by_phase = [t for t in spec.triggers if t.get("phase")]
        self.fired: set[int] = set()
        if self.by_phase:
            phases.subscribe(self.on_phase)

    def _fire(self, trigger: dict[str, Any], **where: Any) -> None:
        if self.conn is None or trigger["index"] in self.fired:
            return
        self.fired.add(trigger["index"])
        self.log.emit("fault_point", index=trigger["index"], **where)
        # A power-loss point (quiesce): the supervisor snapshots the tree and counts the trace
        # while no other thread of this rank is between a syscall and its record.
        quiet = trigger.get("quiesce") and self.interposer is not None
        with self.interposer.quiesced() if quiet else contextlib.nullcontext():
            self.conn.send(("fault", trigger["index"]))
            self.conn.recv()  # the supervisor answers only if the rank is meant to go on

    def settles_before(self, step: int) -> bool:
        """Whether the fault before ``step`` wants every rank settled first (at-rest faults):
        saves in flight acknowledged, then a barrier. Every rank of the attempt has the trigger."""
        trigger = self.by_step.get(step)
        return bool(trigger and trigger.get("settle") and trigger["index"] not in self.fired)

    def at_step(self, step: int) -> None:
        trigger = self.by_step.get(step)
        if trigger is not None and trigger.get("fire", True):
            self._fire(trigger, step=step)

    def on_phase(self, name: str, info: dict[str, Any]) -> None:
        for trigger in self.by_phase:
            if trigger["phase"] == name and trigger.get("step") in (None, info.get("step")):
                self._fire(trigger, step=info.get("step"), phase=name)

    def heartbeat(self, step: int) -> None:
        if self.conn is not None:
            self.conn.send(("hb", step))

    def saved(self, step: int, seconds: float) -> None:
        """Tell the supervisor a save returned, for the live console (latency, throughput)."""
        if self.conn is not None:
            self.conn.send(("save", step, seconds))


def _install_interposer(spec: RankSpec, log: EventLog) -> Any:
    """The I/O interposer goes in before the checkpointer exists, so it sees all its I/O."""
    if spec.trace_path is None or spec.ckpt_root is None:
        return None
    from faults.interposer import Interposer, IORule

    os.makedirs(spec.ckpt_root, exist_ok=True)
    rules = [IORule.from_dict(r) for r in spec.io_rules]
    ix = Interposer(spec.ckpt_root, spec.rank, spec.trace_path, rules,
                    max_data_bytes=(1 << 30) if spec.trace_data else 0, keep_records=False)
    ix.install()
    log.emit("io_trace", path=spec.trace_path, rules=spec.io_rules, data=spec.trace_data)
    return ix


def _make_checkpointer(spec: RankSpec):
    if spec.checkpointer is None:
        return None
    cls = load_checkpointer(spec.checkpointer)
    try:
        return cls(spec.ckpt_root, spec.rank, spec.world_size, **spec.ckpt_options)
    except TypeError as exc:
        raise ConfigError(f"checkpointer {spec.checkpointer!r} rejected its options {spec.ckpt_options}: {exc}") from exc


def _init_process_group(spec: RankSpec, cfg: WorkloadConfig, conn: Any, listener: Any = None) -> None:
    """Rendezvous on MASTER_ADDR:MASTER_PORT, rank 0 hosting the store.

    A client that reaches the store before its server listens backs off for up to a
    second. Forked ranks avoid that with ``listener``: rank 0 gets the store's socket
    already bound and listening from the supervisor (``chaos.launch.cluster.Attempt.launch``),
    so a client's connection waits in its backlog. Without one (containers, network
    namespaces) the supervisor starts the other ranks only once rank 0 says
    ``store_ready``. A ``device=cuda`` job's group is ``cpu:gloo,cuda:nccl``
    (``chaos.target.workload.device.backend``): NCCL for every CUDA tensor, gloo for CPU ones.
    """
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    if spec.init_method is not None:  # a job: the rendezvous its launcher set up (torchrun, chaos run --ranks)
        dist.init_process_group(devices.backend(cfg.device, spec.backend), init_method=spec.init_method,
                                rank=spec.rank, world_size=spec.world_size, timeout=timeout)
        return
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = spec.master_addr, str(spec.master_port)
    master = spec.rank == 0
    fd = listener.detach() if master and listener is not None else None  # the store owns it from here
    store = dist.TCPStore(spec.master_addr, spec.master_port, spec.world_size, is_master=master,
                          timeout=timeout, wait_for_workers=False, master_listen_fd=fd)
    if master and conn is not None:
        conn.send(("store_ready",))
    dist.init_process_group(devices.backend(cfg.device, spec.backend), store=store, rank=spec.rank,
                            world_size=spec.world_size, timeout=timeout)


def _verify(ckpt: Any, trainer: Trainer, log: EventLog) -> None:
    """The final durability check: what does a fresh launch load after the job is done?"""
    t0 = time.time()
    loaded = ckpt.load_latest(trainer.template()) if ckpt is not None else None
    if loaded is None:
        log.emit("verify", step=None, seconds=time.time() - t0, fingerprint=None)
    else:
        log.emit("verify", step=int(loaded[0]), seconds=time.time() - t0, fingerprint=statehash.fingerprint(loaded[1]))
    if ckpt is not None:
        ckpt.close()
    dist.barrier()
    dist.destroy_process_group()


def _acknowledge(ckpt: Any, log: EventLog, pending: list[int]) -> list[int]:
    """Wait for the saves in flight; only then are they acknowledged (the ``ack`` event the
    durability oracles hold the checkpointer to). Returns what is still pending: nothing."""
    t0 = time.time()
    ckpt.wait()
    if pending:
        log.emit("ack", steps=pending, wait_seconds=time.time() - t0)
    for step in pending:  # run as a job (python -m chaos.target.workload): the harness sees the ack
        probe.saved(step)
    return []


def train(spec: RankSpec, conn: Any, log: EventLog, listener: Any = None) -> dict[str, Any] | None:
    """One rank's run: resume, train to ``steps`` saving every ``save_every``, acknowledge.

    Called by :func:`rank_entry` (the fork server's and torchrun's ranks) and by
    ``chaos.target.workload.job`` (the workload as an unmodified job). Every event goes to
    ``log``; the same moments go to ``chaos.probe`` (a no-op unless the harness runs this as
    a job). Returns the final state's fingerprint (None for a ``verify`` launch).
    """
    cfg = WorkloadConfig.from_dict(spec.workload)
    torch.set_num_threads(1)
    device = devices.setup(cfg.device, cfg.deterministic)  # before any CUDA work: the GPU, determinism
    _init_process_group(spec, cfg, conn, listener)
    if device.type == "cuda":  # which GPU this rank got: the supervisor's CUDA_VISIBLE_DEVICES entry
        log.emit("pg_ready", device=str(device), visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    else:
        log.emit("pg_ready", device=str(device))
    trainer = Trainer(cfg, spec.rank, spec.world_size, device)
    log.emit("trainer_ready")
    ix = _install_interposer(spec, log)
    ckpt = _make_checkpointer(spec)
    if ckpt is not None:
        log.emit("ckpt_ready", root=os.path.realpath(spec.ckpt_root), auxiliary=auxiliary_files(ckpt))
    trigger = FaultTrigger(spec, conn, log, ix)

    if spec.mode == "verify":
        _verify(ckpt, trainer, log)
        return None
    if ckpt is not None:
        t0 = time.time()
        loaded = ckpt.load_latest(trainer.template())
        if loaded is not None:
            step, state = loaded
            loaded_fp = statehash.fingerprint(state)
            log.emit("resume", step=int(step), seconds=time.time() - t0, fingerprint=loaded_fp)
            probe.resumed(int(step), loaded_fp)  # (as a job: committed_state compares it with probe.saving's)
            trainer.load_state_dict(state)
            if trainer.step != int(step):
                log.emit("warning", message=f"load_latest said step {step} but the state says {trainer.step}")
        else:
            log.emit("resume", step=0, seconds=time.time() - t0, fingerprint=None)

    pending: list[int] = []
    while trainer.step < cfg.steps:
        if trigger.settles_before(trainer.step + 1):
            if ckpt is not None and pending:
                pending = _acknowledge(ckpt, log, pending)
            # Logged before the barrier: the rank that fires the fault passes it only once every rank
            # has logged it (after the barrier, a rank the fault then killed at once might not have).
            log.emit("settled", step=trainer.step)
            dist.barrier()  # every rank's saves returned and logged before the corruption lands
        trigger.at_step(trainer.step + 1)
        loss, lr = trainer.train_step()
        log.emit("step", step=trainer.step, loss=loss, loss_hex=loss.hex(), lr=lr)
        probe.step(trainer.step, loss)
        trigger.heartbeat(trainer.step)
        if ckpt is not None and cfg.save_every and trainer.step % cfg.save_every == 0:
            if pending:
                pending = _acknowledge(ckpt, log, pending)
            state = trainer.state_dict()
            saved_fp = statehash.fingerprint(state)
            log.emit("save_call", step=trainer.step, fingerprint=saved_fp)
            probe.saving(trainer.step, saved_fp)
            phases.phase("save", step=trainer.step)
            t0 = time.time()
            ckpt.save(trainer.step, state)
            log.emit("save_return", step=trainer.step, seconds=time.time() - t0)
            trigger.saved(trainer.step, time.time() - t0)
            pending.append(trainer.step)
    if ckpt is not None:
        _acknowledge(ckpt, log, pending)
        ckpt.close()
    final = statehash.fingerprint(trainer.state_dict())
    log.emit("final", step=trainer.step, fingerprint=final)
    probe.state(repr(sorted(final.items())), name="final")
    dist.barrier()
    dist.destroy_process_group()
    return {"step": trainer.step, "fingerprint": final}


def rank_entry(spec: RankSpec, conn: Any = None, listener: Any = None) -> None:
    """Process entry point: its own process group, its own log, a typed exit status.

    ``listener`` (rank 0 of a forked launch only) is the rendezvous store's listening socket.
    """
    become_rank_process()
    os.environ.update(spec.env)
    if spec.scratch:
        enter_scratch(spec.scratch)
    if spec.netns:
        from faults.network import enter_netns

        enter_netns(spec.netns)  # still single-threaded: right after the fork
    log = EventLog(spec.log_path, spec.rank, spec.attempt)
    # The rank's own output (library warnings, C++ errors, and the Python stack of a
    # rank that dies of a signal) goes next to its log, not onto the harness's console.
    out = os.open(spec.log_path + ".out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    faulthandler.enable()
    log.emit("start", pid=os.getpid(), preloaded_torch=IMPORTED_IN_PID != os.getpid(), checkpointer=spec.checkpointer)
    code = EXIT_OK
    try:
        train(spec, conn, log, listener)
        log.emit("exit", code=EXIT_OK)
    except ConfigError as exc:
        code = EXIT_CONFIG
        log.emit("error", kind="config", type=type(exc).__name__, message=str(exc))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the record
        code = EXIT_FAILED
        log.emit(
            "error",
            kind="rank",
            type=type(exc).__name__,
            message=str(exc)[:2000],
            traceback=traceback.format_exc()[-4000:],
        )
    finally:
        log.close()
    os._exit(code)
