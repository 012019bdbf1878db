"""A tiny torch DDP job for ``torchrun``, with a careless and a careful way to save.

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 chaos/examples/ddp_job.py \\
        --out DIR [--save careless|careful] [--steps 8] [--save-every 2]

Two ranks (gloo, CPU) train a small linear model on seeded data and print
``step N loss L``; every rank resumes from rank 0's checkpoint when there is one
(torchelastic restarts the workers after a failure). At the end rank 0 writes
``DIR/final.pt``.

``--save careless`` is how many jobs start out: ``torch.save`` straight into
``DIR/ckpt.pt``, overwritten in place, loaded back without a question.

``--save careful`` survives what ``chaos run`` throws at it:

- every ``--save-every`` steps a new ``DIR/ckpt-<step>.pt`` is written to a temp file,
  fsynced and renamed into place, then its SHA-256 the same way in
  ``ckpt-<step>.pt.sha256`` (whose presence marks the checkpoint complete), then the
  directory is fsynced; only then, after a barrier, is the save acknowledged
  (``probe.saved``). The newest two stay, so there is always one to fall back to;
- on start every rank loads the newest checkpoint whose digest verifies, naming (and
  skipping) every newer one that does not: ``torch.load`` checks no CRC, so a flipped bit
  would otherwise load silently;
- an I/O error is never swallowed (the job fails and torchelastic restarts it);
- on SIGTERM (a preemption; torchrun forwards it) the ranks agree at the end of the step
  (an all-reduce of the flag, so all stop at the same step), save it and exit 143.
"""

import argparse
import glob
import hashlib
import io
import os
import re
import signal
import sys

import torch
import torch.distributed as dist

try:
    from chaos import probe
except ImportError:
    probe = None


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Temp file, fsync, rename into place (the caller fsyncs the directory)."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_careless(obj: dict, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)


def checkpoints(out: str) -> list[tuple[int, str]]:
    """(step, path) of every careful checkpoint file, newest first."""
    found = []
    for path in glob.glob(os.path.join(out, "ckpt-*.pt")):
        m = re.fullmatch(r"ckpt-(\d+)\.pt", os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


def save_careful(obj: dict, out: str, step: int, keep: int = 2) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    path = os.path.join(out, f"ckpt-{step:06d}.pt")
    atomic_write(path, data)
    atomic_write(path + ".sha256", hashlib.sha256(data).hexdigest().encode())
    fsync_dir(out)
    old = checkpoints(out)[keep:]
    for _step, p in old:  # the sha256 first: a checkpoint without it is never loaded
        for victim in (p + ".sha256", p):
            if os.path.exists(victim):
                os.unlink(victim)
    if old:
        fsync_dir(out)


def load_careful(out: str) -> dict | None:
    """The newest checkpoint whose SHA-256 verifies; None: start from scratch."""
    for step, path in checkpoints(out):
        try:
            with open(path + ".sha256", "rb") as f:
                want = f.read().decode()
            with open(path, "rb") as f:
                data = f.read()
            if hashlib.sha256(data).hexdigest() != want:
                raise ValueError("SHA-256 mismatch")
            state = torch.load(io.BytesIO(data), weights_only=True)
            if state["step"] != step:
                raise ValueError(f"holds step {state['step']}")
            return state
        except (OSError, ValueError, KeyError, RuntimeError, UnicodeDecodeError) as exc:
            print(f"skipping checkpoint {os.path.basename(path)}: {type(exc).__name__}: {exc}", flush=True)
    return None


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
    careful = args.save == "careful"
    stop = {"term": False}
    if careful:
        signal.signal(signal.SIGTERM, lambda *_: stop.update(term=True))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt = os.path.join(args.out, "ckpt.pt")
    step = 0
    state = None
    if careful:
        state = load_careful(args.out) if os.path.isdir(args.out) else None
    elif os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)  # a torn or empty file raises here
    if state is not None:
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
        preempted = False
        if careful:  # every rank stops at the same step, whichever saw the SIGTERM first
            flag = torch.tensor([1.0 if stop["term"] else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            preempted = bool(flag.item())
        if step % args.save_every == 0 or preempted:
            full = {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}
            if rank == 0:
                os.makedirs(args.out, exist_ok=True)
                if careful:
                    save_careful(full, args.out, step)
                else:
                    save_careless(full, ckpt)
                    if probe:
                        probe.saved(step)
            dist.barrier()
            if careful and rank == 0 and probe:
                probe.saved(step)  # durable on disk, and every rank is past it
        if preempted:
            print(f"rank {rank} SIGTERM: saved step {step}, exiting", flush=True)
            dist.destroy_process_group()
            sys.exit(128 + signal.SIGTERM)
    if rank == 0:
        final = {"model": model.module.state_dict(), "step": step}
        if careful:
            buf = io.BytesIO()
            torch.save(final, buf)
            atomic_write(os.path.join(args.out, "final.pt"), buf.getvalue())
            fsync_dir(args.out)
        else:
            save_careless(final, os.path.join(args.out, "final.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
