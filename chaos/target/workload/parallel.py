"""How the workload's model and optimizer are laid out over the ranks (``WorkloadConfig.parallel``).

``Trainer`` asks this module for three things, whatever the mode: the wrapped model,
the state a checkpointer is handed (and how to load one back), and the load template.

* ``ddp``: ``DistributedDataParallel``; the state is ``module.state_dict()`` and
  ``optimizer.state_dict()``, the same on every rank (unchanged since the first golden run).
* ``fsdp`` / ``hsdp`` / ``tp``: the state is exactly what torch's
  ``torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer)`` gives —
  parameters and AdamW moments as DTensors (each rank holds its local shards), optimizer
  state keyed by parameter name — and a loaded state goes back through ``set_state_dict``,
  as torchtitan does. A checkpointer therefore meets the same sharded state a real
  FSDP2 / tensor-parallel job hands it.

The template never calls ``get_optimizer_state_dict`` on a fresh optimizer: torch then
initialises the optimizer state by running a zero-gradient ``step()``, which would make a
checkpointed run differ from its checkpoint-free golden run (AdamW's step count starts at
1). The template's moments are built the way AdamW builds them instead (zeros shaped,
placed and sharded like each parameter, ``step`` 0.0), keyed like ``get_state_dict``.

All modes run on gloo (CPU) in torch 2.13; ``hsdp`` needs an even world size, ``tp``
shards only the MLPs (attention stays replicated), and its ranks all read the same batch
(data-parallel degree 1). With ``device=cuda`` the model is built on the CPU (the same
initial weights), moved to the rank's one GPU, and the device mesh is a cuda mesh, so
the sharded modes' collectives run on NCCL (see chaos.target.workload.device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from chaos.target.workload.config import WorkloadConfig
from chaos.target.workload.model import build_model


@dataclass
class Layout:
    """Where this rank sits: its data-parallel coordinates and its device mesh (None for ddp)."""

    mode: str
    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    mesh: Any = None


def layout(cfg: WorkloadConfig, rank: int, world_size: int) -> Layout:
    """Data-parallel coordinates of ``rank``: every mode but ``tp`` feeds each rank its own batch."""
    cfg.check_world_size(world_size)
    if cfg.parallel == "tp":
        return Layout(cfg.parallel, rank, world_size, 0, 1)
    return Layout(cfg.parallel, rank, world_size, rank, world_size)


def wrap(cfg: WorkloadConfig, where: Layout, device: torch.device | None = None) -> nn.Module:
    """Build the model (same initial weights everywhere), move it to ``device`` and distribute
    it (collective for sharded modes)."""
    device = device or torch.device("cpu")
    model = build_model(cfg, device).to(device)
    if where.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        if where.world_size > 2 or device.type != "cpu":
            settle_buckets(cfg, ddp, device)
        return ddp
    from torch.distributed.device_mesh import init_device_mesh

    if where.mode == "tp":
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        where.mesh = init_device_mesh(device.type, (where.world_size,), mesh_dim_names=("tp",))
        for block in model.blocks:
            parallelize_module(block.mlp, where.mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        return model
    from torch.distributed.fsdp import fully_shard

    if where.mode == "hsdp":
        where.mesh = init_device_mesh(device.type, (where.world_size // 2, 2), mesh_dim_names=("replicate", "shard"))
    else:
        where.mesh = init_device_mesh(device.type, (where.world_size,), mesh_dim_names=("shard",))
    for block in model.blocks:
        fully_shard(block, mesh=where.mesh)
    fully_shard(model, mesh=where.mesh)
    return model


def settle_buckets(cfg: WorkloadConfig, ddp: nn.Module, device: torch.device) -> None:
    """Two throwaway iterations so that every real step runs on DDP's final gradient buckets.

    Called by :func:`wrap` (collective: every rank builds its DDP). DDP regroups the
    gradients into buckets once, after its first iteration, in the order they became
    ready; until then it all-reduces the initial grouping. With three ranks or more a
    bucket's all-reduce adds the ranks' values in an order that depends on the grouping,
    so a restarted run's first step (a new DDP, initial buckets) was not the same float
    sums as the uninterrupted run's step there, whose buckets had long been rebuilt: at 4
    ranks the loss after a restart differed by ~2e-7 and ``bit_exact`` failed every
    checkpointer. Here, right after construction, in fresh and restarted runs alike: a
    forward and backward of a zero batch (the RNG forked, so dropout draws nothing) to
    record the order, a second to rebuild, the gradients dropped. No parameter, optimizer
    or RNG state changes; two ranks were bit-exact either way (a + b is b + a).

    So :func:`wrap` skips it for one or two CPU ranks (gloo): there the grouping cannot
    change a sum, and the two iterations (an all-reduce of every gradient each) cost
    every launch, restart and final load ~40 ms on two cores. GPU ranks always settle.
    """
    idx = torch.zeros((1, cfg.seq_len), dtype=torch.long, device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for _ in range(2):
            ddp(idx).float().sum().backward()
    for p in ddp.parameters():
        p.grad = None


def make_optimizer(cfg: WorkloadConfig, model: nn.Module) -> torch.optim.Optimizer:
    # Tensor parallel mixes DTensor and plain parameters, which AdamW's foreach path refuses.
    foreach = False if cfg.parallel == "tp" else None
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                             foreach=foreach)


def model_and_optimizer_state(cfg: WorkloadConfig, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """What a checkpointer is handed under ``model`` and ``optimizer``."""
    if cfg.parallel == "ddp":
        return model.module.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, optimizer)


def model_state(cfg: WorkloadConfig, model: nn.Module) -> dict:
    """The model part alone (``get_model_state_dict``: it never touches the optimizer)."""
    if cfg.parallel == "ddp":
        return model.module.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model)


def load_model_and_optimizer(cfg: WorkloadConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                             model_state: dict, optimizer_state: dict) -> None:
    if cfg.parallel == "ddp":
        model.module.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)


def _fresh_moments(p: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}


def optimizer_template(cfg: WorkloadConfig, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state shaped as a loader must fill it, without touching the optimizer.

    DDP: ``optimizer.state_dict()`` with integer keys; sharded modes: keyed by parameter
    name like ``get_optimizer_state_dict``, moments as DTensors placed like the parameters.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if cfg.parallel == "ddp":
        opt = optimizer.state_dict()
        if not opt["state"]:
            opt["state"] = {i: _fresh_moments(p) for i, p in enumerate(params)}
        return opt
    if optimizer.state:
        return model_and_optimizer_state(cfg, model, optimizer)[1]
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    for saved in optimizer.state_dict()["param_groups"]:
        group = {k: v for k, v in saved.items() if k != "params"}
        group["params"] = [names[id(params[i])] for i in saved["params"]]
        groups.append(group)
    return {"state": {names[id(p)]: _fresh_moments(p) for p in params}, "param_groups": groups}
