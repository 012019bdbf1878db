"""Lightning Fabric training loop with ``fabric.save`` / ``fabric.load``.

    python chaos/examples/frameworks/fabric_loop.py --out DIR [--steps 12] [--save-every 3]
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 chaos/examples/frameworks/fabric_loop.py \\
        --out DIR --devices 2

Written as Fabric's "Saving and Loading Checkpoints" guide shows: the state is a dict of
the model, the optimizer and plain values, ``fabric.save(path, state)`` every few steps,
and on start, when the checkpoint exists, ``fabric.load(path, state)`` restores it in
place. One checkpoint file, ``DIR/checkpoint.ckpt``, overwritten each time (Fabric's
``_atomic_save``: a ``torch.save`` into memory, then an fsspec transaction that writes a
temp file in the system temp directory and moves it over the checkpoint, no fsync).
At the end rank 0 writes the model's ``state_dict`` to ``DIR/final.pt``.
"""

import argparse
import os

import lightning as L
import torch

try:  # chaos probe (optional): a no-op outside `chaos run`
    from chaos import probe
except ImportError:
    probe = None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--devices", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)

    fabric = L.Fabric(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto")
    fabric.launch()
    fabric.seed_everything(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)

    gen = torch.Generator().manual_seed(1234 + fabric.global_rank)
    xs = torch.randn(args.steps, 8, 8, generator=gen)
    ys = xs.sum(dim=2, keepdim=True) * 0.1

    path = os.path.join(args.out, "checkpoint.ckpt")
    state = {"model": model, "optimizer": optimizer, "step": 0}
    if os.path.exists(path):
        fabric.load(path, state)
        if probe:  # chaos probe (optional)
            probe.resumed(state["step"])

    while state["step"] < args.steps:
        step = state["step"]
        loss = torch.nn.functional.mse_loss(model(xs[step]), ys[step])
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        state["step"] = step + 1
        if probe:  # chaos probe (optional)
            probe.step(state["step"], loss.item())
        if state["step"] % args.save_every == 0:
            fabric.save(path, state)
            if probe:  # chaos probe (optional): fabric.save returned
                probe.saved(state["step"])

    if fabric.global_rank == 0:
        torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
    fabric.barrier()


if __name__ == "__main__":
    main()
