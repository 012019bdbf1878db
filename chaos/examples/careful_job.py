"""A careful pure-Python training job: temp file, fsync, rename, directory fsync.

    python chaos/examples/careful_job.py --out DIR [--steps 12] [--save-every 3]

The same training as ``careless_job.py``, but each checkpoint is written to a temp
file in the same directory, fsynced, renamed over ``DIR/ckpt.json`` (atomic on POSIX),
and the directory is fsynced so the rename itself is durable; only then is the save
acknowledged. A kill anywhere leaves either the old or the new checkpoint, whole, and
the resume continues from it. ``final.json`` is written the same way.
"""

import argparse
import json
import os

try:
    from chaos import probe
except ImportError:
    probe = None


def train_step(weights: list[float], step: int) -> tuple[list[float], float]:
    new = [w - 0.1 * (w - (i + 1) * 0.5) + 0.001 * step for i, w in enumerate(weights)]
    return new, sum((w - (i + 1) * 0.5) ** 2 for i, w in enumerate(new))


def atomic_write_json(path: str, obj: object) -> None:
    directory = os.path.dirname(path)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    suffix = f"-rank{rank}" if world > 1 else ""  # under --ranks N each copy keeps its own files
    ckpt = os.path.join(args.out, f"ckpt{suffix}.json")
    step, weights = 0, [0.0, 0.0, 0.0, 0.0]
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            saved = json.load(f)
        step, weights = saved["step"], saved["weights"]
        print(f"resumed from step {step}", flush=True)
        if probe:
            probe.resumed(step)
    while step < args.steps:
        step += 1
        weights, loss = train_step(weights, step + rank)
        print(f"step {step} loss {loss:.6f}", flush=True)
        if probe:
            probe.step(step, loss)
        if step % args.save_every == 0:
            atomic_write_json(ckpt, {"step": step, "weights": weights})
            if probe:
                probe.saved(step)
    atomic_write_json(os.path.join(args.out, f"final{suffix}.json"), {"step": step, "weights": weights})


if __name__ == "__main__":
    main()
