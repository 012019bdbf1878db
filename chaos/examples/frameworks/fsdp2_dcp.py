"""A torchtitan-style FSDP2 loop: ``fully_shard`` per block, DCP checkpoints, ``StatefulDataLoader`` state.

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 chaos/examples/frameworks/fsdp2_dcp.py \\
        --out DIR [--async] [--steps 8] [--save-every 2]
    python chaos/examples/frameworks/fsdp2_dcp.py --out DIR        # one rank (a plain process)

Shaped like torchtitan's train loop and ``CheckpointManager``: a tiny MLP-block model,
``fully_shard`` on each block and then on the root (parameters become ``DTensor``s
sharded on dim 0), AdamW, a ``torchdata.stateful_dataloader.StatefulDataLoader`` over a
``DistributedSampler``, and every ``--save-every`` steps a DCP checkpoint of
``{"model", "optimizer", "dataloader", "train_state"}`` (model and optimizer through
``torch.distributed.checkpoint.state_dict``, each rank's loader state under its own
``dp_rank_R`` key, as torchtitan does) into ``DIR/checkpoint/step-N``:
``dcp.save`` (sync), or ``dcp.async_save`` over a separate gloo group with the previous
save's future waited on before the next one starts (``--async``, torchtitan's
``async_mode="async"``). On start the job loads the newest ``step-N`` folder that has
a ``.metadata`` file (torchtitan's rule). At the end the full model state dict is
gathered and rank 0 writes ``DIR/final.pt`` (the result file).
"""

import argparse
import os
import pickle
import re
import socket

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

try:  # chaos probe (optional): a no-op outside `chaos run`
    from chaos import probe
except ImportError:
    probe = None


class Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.ff = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class Model(torch.nn.Module):
    def __init__(self, dim: int = 16, n_layers: int = 2) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.out = torch.nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


class ModelWrapper(Stateful):
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict) -> None:
        set_model_state_dict(self.model, state)


class OptimizerWrapper(Stateful):
    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        self.model, self.optim = model, optim

    def state_dict(self) -> dict:
        return get_optimizer_state_dict(self.model, self.optim)

    def load_state_dict(self, state: dict) -> None:
        set_optimizer_state_dict(self.model, self.optim, state)


class DataLoaderState(Stateful):
    """Each data-parallel rank's loader state under its own key (torchtitan's ParallelAwareDataloader)."""

    def __init__(self, loader: StatefulDataLoader, rank: int) -> None:
        self.loader, self.key = loader, f"dp_rank_{rank}"

    def state_dict(self) -> dict:
        return {self.key: pickle.dumps(self.loader.state_dict())}

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(pickle.loads(state[self.key]))


class TrainState(Stateful):
    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def newest_complete(folder: str) -> int | None:
    """torchtitan's rule: the highest ``step-N`` that has a ``.metadata`` file."""
    if not os.path.isdir(folder):
        return None
    steps = [int(m.group(1)) for d in os.listdir(folder) if (m := re.fullmatch(r"step-(\d+)", d))
             and os.path.isfile(os.path.join(folder, d, ".metadata"))]
    return max(steps, default=None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--async", dest="async_save", action="store_true", help="dcp.async_save instead of dcp.save")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if "RANK" not in os.environ:  # a plain process: a world of one, on a free port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # Keys of this restart apart from the last one's (see chaos/examples/ddp_job.py: torchelastic's store
    # keeps the old round's gloo addresses).
    store, rank, world = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"restart{attempt}/", store), rank=rank, world_size=world)
    save_group = dist.new_group(backend="gloo") if args.async_save else None

    torch.manual_seed(0)
    model = Model()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(128, 16, generator=gen)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True) * 0.1)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = StatefulDataLoader(data, batch_size=4, sampler=sampler)

    train_state = TrainState()
    states = {"model": ModelWrapper(model), "optimizer": OptimizerWrapper(model, optimizer),
              "dataloader": DataLoaderState(loader, rank), "train_state": train_state}
    folder = os.path.join(args.out, "checkpoint")
    # Every rank makes the folder once, up front. Left to dcp.save, each rank's first save
    # makes it (and step-N) with mkdir(parents=True), and which rank gets there first decides
    # whether the other's mkdir of step-N fails (ENOENT, then two more mkdirs) or not: the
    # ranks' file events, and so the ordinals of chaos's points, would differ run to run.
    os.makedirs(folder, exist_ok=True)
    step = newest_complete(folder)
    if step is not None:
        dcp.load(states, checkpoint_id=os.path.join(folder, f"step-{step}"))
        if probe:  # chaos probe (optional)
            probe.resumed(train_state.step)

    pending = None  # the previous async save's future
    pending_step = None
    it = iter(loader)
    while train_state.step < args.steps:
        try:
            xb, yb = next(it)
        except StopIteration:  # one epoch ends: the sampler reshuffles by epoch
            sampler.set_epoch(sampler.epoch + 1)
            it = iter(loader)
            xb, yb = next(it)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        train_state.step += 1
        if probe:  # chaos probe (optional)
            probe.step(train_state.step, loss.item())
        if train_state.step % args.save_every == 0:
            checkpoint_id = os.path.join(folder, f"step-{train_state.step}")
            if args.async_save:
                if pending is not None:
                    pending.result()
                    if probe:  # chaos probe (optional): the previous async save finished
                        probe.saved(pending_step)
                pending = dcp.async_save(states, checkpoint_id=checkpoint_id, process_group=save_group)
                pending_step = train_state.step
            else:
                dcp.save(states, checkpoint_id=checkpoint_id)
                if probe:  # chaos probe (optional): dcp.save returned
                    probe.saved(train_state.step)
    if pending is not None:
        pending.result()
        if probe:  # chaos probe (optional)
            probe.saved(pending_step)

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, os.path.join(args.out, "final.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
