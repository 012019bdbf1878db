"""Hugging Face Accelerate loop with ``save_state`` / ``load_state`` and automatic checkpoint naming.

    python chaos/examples/frameworks/accelerate_loop.py --out DIR [--steps 12] [--save-every 3]
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 chaos/examples/frameworks/accelerate_loop.py --out DIR

Written as Accelerate's checkpointing guide shows: an ``Accelerator`` with
``ProjectConfiguration(project_dir=DIR, automatic_checkpoint_naming=True, total_limit=2)``,
model, optimizer, scheduler and data loader through ``accelerator.prepare``, a progress
counter registered with ``register_for_checkpointing``, ``accelerator.save_state()``
every few steps (``DIR/checkpoints/checkpoint_N``, the oldest removed past the limit)
and, on start, ``accelerator.load_state()`` (the highest ``checkpoint_N``) followed by
``accelerator.skip_first_batches`` to continue inside the epoch. After ``load_state``
the job also sets ``project_configuration.iteration`` past the loaded checkpoint: Accelerate
does not restore it (accelerate #1601, #3306), and without it the next ``save_state``
reuses ``checkpoint_0``. ``--shuffle`` turns on a shuffled loader. At the end
``accelerator.save_model(model, DIR/final)`` writes ``final/model.safetensors``.
"""

import argparse
import os
import re

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, TensorDataset

try:  # chaos probe (optional): a no-op outside `chaos run`
    from chaos import probe
except ImportError:
    probe = None


class Progress:
    """The step counter, checkpointed with the rest through ``register_for_checkpointing``."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--total-limit", type=int, default=2)
    ap.add_argument("--shuffle", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)

    config = ProjectConfiguration(project_dir=args.out, automatic_checkpoint_naming=True,
                                  total_limit=args.total_limit)
    accelerator = Accelerator(cpu=True, project_config=config)
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 8, generator=gen)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True) * 0.1), batch_size=4, shuffle=args.shuffle)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    checkpoints = os.path.join(args.out, "checkpoints")
    if os.path.isdir(checkpoints) and os.listdir(checkpoints):
        accelerator.load_state()  # the highest checkpoint_N
        newest = max(int(re.findall(r"\d+", d)[-1]) for d in os.listdir(checkpoints))
        accelerator.project_configuration.iteration = newest + 1  # accelerate #3306: not restored by load_state
        if probe:  # chaos probe (optional)
            probe.resumed(progress.step)

    steps_per_epoch = len(loader)
    while progress.step < args.steps:
        done_in_epoch = progress.step % steps_per_epoch
        epoch_loader = accelerator.skip_first_batches(loader, done_in_epoch) if done_in_epoch else loader
        for xb, yb in epoch_loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            if probe:  # chaos probe (optional)
                probe.step(progress.step, loss.item())
            if progress.step % args.save_every == 0:
                accelerator.save_state()
                if probe:  # chaos probe (optional): save_state returned
                    probe.saved(progress.step)
            if progress.step >= args.steps:
                break

    accelerator.wait_for_everyone()
    accelerator.save_model(model, os.path.join(args.out, "final"))


if __name__ == "__main__":
    main()
