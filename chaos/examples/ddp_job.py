"""A tiny torch DDP job for ``torchrun``, with a careless and a careful way to save.

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 chaos/examples/ddp_job.py \\
        --out DIR [--save careless|careful] [--steps 8] [--save-every 2]

Two ranks (gloo, CPU) train a small linear model on seeded data and print
``step N loss L``. Rank 0 saves ``DIR/ckpt.pt`` every ``--save-every`` steps with
``torch.save`` into a Python file object; every rank resumes from it when it exists
(torchelastic restarts the workers after a failure). ``--save careless`` writes the
file in place; ``--save careful`` writes a temp file, fsyncs it, renames it over the
checkpoint and fsyncs the directory. At the end rank 0 writes ``DIR/final.pt``.
"""

import argparse
import os

import torch
import torch.distributed as dist

try:
    from chaos import probe
except ImportError:
    probe = None


def save(obj: dict, path: str, careful: bool) -> None:
    if not careful:
        with open(path, "wb") as f:
            torch.save(obj, f)
        return
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--save", choices=("careless", "careful"), default="careful")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    # Keys of this restart apart from the last one's: torchelastic's agent store keeps the old
    # round's gloo addresses, and a plain init_process_group after a restart then fails about
    # half the time here (torch 2.13: "Gloo connectFullMesh failed ... Connection refused").
    store, rank, world = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"restart{attempt}/", store), rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt = os.path.join(args.out, "ckpt.pt")
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)  # a torn or empty file raises here
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"rank {rank} resumed from step {step}", flush=True)
        if probe:
            probe.resumed(step)
    gen = torch.Generator().manual_seed(1234)
    xs, ys = torch.randn(args.steps, 16, 8, generator=gen), torch.randn(args.steps, 16, 1, generator=gen)
    while step < args.steps:
        loss = torch.nn.functional.mse_loss(model(xs[step] + rank), ys[step])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
        if probe:
            probe.step(step, loss.item())
        if step % args.save_every == 0:
            if rank == 0:
                os.makedirs(args.out, exist_ok=True)
                save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}, ckpt,
                     args.save == "careful")
                if probe:
                    probe.saved(step)
            dist.barrier()
    if rank == 0:
        save({"model": model.module.state_dict(), "step": step}, os.path.join(args.out, "final.pt"),
             args.save == "careful")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
