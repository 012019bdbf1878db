"""A tiny torch DDP job for ``torchrun`` over several nodes (``chaos run --nodes N``).

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 2 --nproc-per-node 2 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:PORT --max-restarts 2 \\
        chaos/examples/ddp_nodes_job.py --out DIR [--steps 8] [--save-every 2]

The same model and data as ``ddp_job.py``, saved in one file the durable way (temp file,
fsync, rename, directory fsync; rank 0 saves ``DIR/ckpt.pt``, every rank resumes from
it, rank 0 writes ``DIR/final.pt``; no checksum or second checkpoint to fall back to, as
the node faults corrupt nothing), with one difference that matters when a node is replaced:
the process group is made with a plain ``init_process_group("gloo")`` on the store
torchelastic gives the workers, never with a per-restart key prefix.
``ddp_job.py`` keys each restart apart with ``TORCHELASTIC_RESTART_COUNT``; after a
node loss the surviving agent's workers are at restart 1 while the replacement
agent's are at restart 0, so those prefixes never meet and the new round hangs in
``init_process_group`` (seen here). Run it with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``:
torch 2.13's shared rendezvous store does not let a replacement agent join a later
round at all (README, "Many nodes"), and without sharing every round's worker store is
a fresh one, so no prefix is needed.

Each line names the node (``GROUP_RANK``) and torchelastic's restart count, so the
log shows who was restarted by whom.
"""

import argparse
import os

import torch
import torch.distributed as dist

try:
    from chaos import probe
except ImportError:
    probe = None


def save(obj: dict, path: str) -> None:
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
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node = os.environ.get("GROUP_RANK", "?")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"rank {rank} of {world} on node {node}, torchelastic restart {restart}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    ckpt = os.path.join(args.out, "ckpt.pt")
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"rank {rank} resumed from step {step}", flush=True)
        if probe:
            probe.resumed(step)
    gen = torch.Generator().manual_seed(1234)
    xs, ys = torch.randn(args.steps, 16, 8, generator=gen), torch.randn(args.steps, 16, 1, generator=gen)
    while step < args.steps:
        loss = torch.nn.functional.mse_loss(model(xs[step] + 0.1 * rank), ys[step])
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
                save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}, ckpt)
                if probe:
                    probe.saved(step)
            dist.barrier()
    if rank == 0:
        save({"model": model.module.state_dict(), "step": step}, os.path.join(args.out, "final.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
