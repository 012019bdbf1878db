"""A careful pure-Python training job: checksummed checkpoints, durable before acknowledged.

    python chaos/examples/careful_job.py --out DIR [--steps 12] [--save-every 3] [--keep 2]

The same training as ``careless_job.py``, saved the way a job that survives crashes,
power loss, bad disks and preemption does:

- every ``--save-every`` steps a new checkpoint ``DIR/ckpt-<step>.json`` holding the
  state and its SHA-256 is written to a temp file, fsynced, renamed into place (atomic
  on POSIX) and the directory is fsynced so the rename itself survives a power loss;
  only then is the save acknowledged (``probe.saved``). The newest ``--keep``
  checkpoints stay, older ones are removed after the new one is durable;
- on start it loads the newest checkpoint whose checksum verifies, and names (and
  skips) every newer one that does not: a corrupted, truncated or deleted newest
  checkpoint costs the steps since the one before it, never a wrong resume;
- an I/O error (ENOSPC, EIO, a failed fsync) is never swallowed: the job stops, and
  the restart resumes from what really is on disk;
- on SIGTERM (a preemption) it finishes the step it is in, saves it and exits 143
  (128 + SIGTERM, as if the signal had ended it): a supervisor restarts a job that
  failed, never one that exited 0, and the restart loses no work.

``final.json`` is written the same way (temp file, fsync, rename, directory fsync).
Under ``--ranks N`` each copy keeps its own files (``ckpt-rank<R>-<step>.json``), and
its state names its rank, under the checksum: another rank's file, swapped in, verifies
as a file but is skipped as not this rank's.
"""

import argparse
import glob
import hashlib
import json
import os
import re
import signal
import sys

try:
    from chaos import probe
except ImportError:
    probe = None

_stop = {"term": False}


def train_step(weights: list[float], step: int) -> tuple[list[float], float]:
    new = [w - 0.1 * (w - (i + 1) * 0.5) + 0.001 * step for i, w in enumerate(weights)]
    return new, sum((w - (i + 1) * 0.5) ** 2 for i, w in enumerate(new))


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: str, obj: object) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def checksum(state: dict) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def checkpoints(out: str, prefix: str) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint file, newest first."""
    found = []
    for path in glob.glob(os.path.join(out, f"{prefix}-*.json")):
        m = re.fullmatch(re.escape(prefix) + r"-(\d+)\.json", os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


def load_latest(out: str, prefix: str, rank: int | None = None) -> dict | None:
    """The newest checkpoint that reads back whole and verifies (and, ``rank`` given, is that
    rank's); None: start from scratch."""
    for step, path in checkpoints(out, prefix):
        try:
            with open(path) as f:
                saved = json.load(f)
            state = saved["state"]
            if saved["sha256"] != checksum(state) or state["step"] != step:
                raise ValueError("checksum mismatch")
            if rank is not None and state.get("rank") != rank:
                raise ValueError(f"rank {state.get('rank')}'s checkpoint, not rank {rank}'s")
            return state
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"skipping checkpoint {os.path.basename(path)}: {type(exc).__name__}: {exc}", flush=True)
    return None


def save(out: str, prefix: str, state: dict, keep: int) -> None:
    if probe:
        probe.saving(state["step"], state)  # what a resume of this step must load, exactly
    atomic_write_json(os.path.join(out, f"{prefix}-{state['step']:06d}.json"),
                      {"state": state, "sha256": checksum(state)})
    if probe:
        probe.saved(state["step"])  # durable: file and directory entry are on disk
    old = checkpoints(out, prefix)[keep:]
    for _step, path in old:
        os.unlink(path)
    if old:
        fsync_dir(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--keep", type=int, default=2, help="checkpoints kept (at least 2: one to fall back to)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: _stop.update(term=True))
    os.makedirs(args.out, exist_ok=True)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    suffix = f"-rank{rank}" if world > 1 else ""  # under --ranks N each copy keeps its own files
    prefix = f"ckpt{suffix}"
    step, weights = 0, [0.0, 0.0, 0.0, 0.0]
    owner = rank if world > 1 else None  # a single process's files name no rank
    state = load_latest(args.out, prefix, owner)
    if state is not None:
        step, weights = state["step"], state["weights"]
        print(f"resumed from step {step}", flush=True)
        if probe:
            probe.resumed(step, state)
    while step < args.steps:
        step += 1
        weights, loss = train_step(weights, step + rank)
        print(f"step {step} loss {loss:.6f}", flush=True)
        if probe:
            probe.step(step, loss)
        saved = step % args.save_every == 0
        mine = {"step": step, "weights": weights, **({"rank": owner} if owner is not None else {})}
        if saved:
            save(args.out, prefix, mine, args.keep)
        if _stop["term"]:
            if not saved:
                save(args.out, prefix, mine, args.keep)
            print(f"SIGTERM: saved step {step}, exiting", flush=True)
            sys.exit(128 + signal.SIGTERM)
    atomic_write_json(os.path.join(args.out, f"final{suffix}.json"), {"step": step, "weights": weights})


if __name__ == "__main__":
    main()
