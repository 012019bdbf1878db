"""PyTorch Lightning ``Trainer`` with ``ModelCheckpoint(save_last=True)`` and ``fit(ckpt_path="last")``.

    python chaos/examples/frameworks/lightning_trainer.py --out DIR [--epochs 4] [--every 2]
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 chaos/examples/frameworks/lightning_trainer.py \\
        --out DIR --devices 2

Written as Lightning's checkpointing docs show: a ``LightningModule``, a
``ModelCheckpoint(dirpath=DIR/checkpoints, every_n_train_steps=N, save_last=True)``
callback, and ``trainer.fit(model, loader, ckpt_path="last")``, which resumes from
``last.ckpt`` when there is one and starts fresh (with a warning) when there is none.
``seed_everything(0)`` and ``deterministic=True`` make a fault-free run repeatable.
``--every`` defaults to the steps in one epoch, so each save lands at an epoch's end
(Lightning documents mid-epoch resumes as not reproducible). ``--shuffle`` turns on a
shuffled loader. At the end rank 0 writes the model's ``state_dict`` to ``DIR/final.pt``
(the result file).

Under ``torchrun`` Lightning finds torchelastic's environment itself and runs DDP over
gloo (``--devices 2``); it saves through ``TorchCheckpointIO`` -> ``_atomic_save``
(a ``torch.save`` into memory, then an fsspec transaction: a temp file in the system temp
directory moved into place, never fsynced).
"""

import argparse
import os

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

try:  # chaos probe (optional): a no-op outside `chaos run`
    from chaos import probe
except ImportError:
    probe = None


class TinyRegressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class ProbeCallback(Callback):
    """chaos probe (optional): steps, the resume point and acknowledged saves, from Lightning hooks."""

    def on_train_start(self, trainer, pl_module):
        if probe and trainer.global_step > 0:
            probe.resumed(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if probe:
            probe.step(trainer.global_step)


class AckAfterCheckpoint(ModelCheckpoint):
    """chaos probe (optional): ModelCheckpoint itself, announcing each save once it returned."""

    def _save_checkpoint(self, trainer, filepath):
        super()._save_checkpoint(trainer, filepath)
        if probe and os.path.basename(filepath) == "last.ckpt":
            probe.saved(trainer.global_step)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--every", type=int, default=None, help="every_n_train_steps (default: one epoch)")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--shuffle", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(0, workers=True)

    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(32, 8, generator=gen)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True) * 0.1)
    loader = DataLoader(data, batch_size=8, shuffle=args.shuffle)
    every = args.every or len(loader) // args.devices

    checkpoint = AckAfterCheckpoint(dirpath=os.path.join(args.out, "checkpoints"), every_n_train_steps=every,
                                    save_last=True)
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=args.devices,
                        strategy="ddp" if args.devices > 1 else "auto", deterministic=True,
                        callbacks=[checkpoint, ProbeCallback()], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=args.out)
    model = TinyRegressor()
    trainer.fit(model, loader, ckpt_path="last")
    if trainer.is_global_zero:
        torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))


if __name__ == "__main__":
    main()
