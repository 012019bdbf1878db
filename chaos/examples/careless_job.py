"""A careless pure-Python training job: it overwrites its checkpoint in place.

    python chaos/examples/careless_job.py --out DIR [--steps 12] [--save-every 3]

Each step updates a tiny "model" (a few floats) deterministically and prints
``step N loss L``; every ``--save-every`` steps it writes ``DIR/ckpt.json`` straight
over the previous one (no temp file, no fsync, no rename). On start it resumes from
that file if present. At the end it writes ``DIR/final.json``. A kill between the
truncating open and the write leaves an empty checkpoint, and the resume raises:
``chaos run -- python chaos/examples/careless_job.py --out {out}`` finds that point.
"""

import argparse
import json
import os

try:
    from chaos import probe
except ImportError:  # the probe is optional: the job runs without the harness installed
    probe = None


def train_step(weights: list[float], step: int) -> tuple[list[float], float]:
    new = [w - 0.1 * (w - (i + 1) * 0.5) + 0.001 * step for i, w in enumerate(weights)]
    return new, sum((w - (i + 1) * 0.5) ** 2 for i, w in enumerate(new))


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
            saved = json.load(f)  # an empty or half-written file raises here
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
            with open(ckpt, "w") as f:  # in place: truncated first, written later
                json.dump({"step": step, "weights": weights}, f)
            if probe:
                probe.saved(step)
    with open(os.path.join(args.out, f"final{suffix}.json"), "w") as f:
        json.dump({"step": step, "weights": weights}, f)


if __name__ == "__main__":
    main()
