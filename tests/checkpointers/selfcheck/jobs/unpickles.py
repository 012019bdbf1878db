"""Planted defect: checkpoints are pickles, loaded with ``pickle.load``.

The job of ``correct.py``, saving its checkpoints with ``pickle`` (as ``torch.save`` does)
and loading them with ``pickle.load`` (as ``torch.load(weights_only=False)`` does): whoever
can write a checkpoint file runs code as the job when it restarts. The checksum does not
help: it is checked only after unpickling.
"""

import os
import pickle

from chaos.examples import careful_job as job

CHAOS_JOB = {"faults": ("payload",), "result_globs": ("final.json",)}
EXPECTED_CATCH = {"payload": ("no_code_execution",)}

write_json = job.atomic_write_json


def atomic_write(path: str, obj: object) -> None:
    if not os.path.basename(path).startswith("ckpt"):
        return write_json(path, obj)  # the result file stays JSON
    with open(f"{path}.tmp", "wb") as f:
        pickle.dump(obj, f, protocol=4)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f"{path}.tmp", path)
    job.fsync_dir(os.path.dirname(path))
    return None


def load_latest(out: str, prefix: str, rank: int | None = None) -> dict | None:
    for step, path in job.checkpoints(out, prefix):
        try:
            with open(path, "rb") as f:
                saved = pickle.load(f)  # the defect: code in the file runs here
            state = saved["state"]
            if saved["sha256"] == job.checksum(state) and state["step"] == step and state.get("rank") == rank:
                return state
        except Exception as exc:  # noqa: BLE001 - any damage: the next older one
            print(f"skipping checkpoint {os.path.basename(path)}: {exc!r}", flush=True)
    return None


job.atomic_write_json, job.load_latest = atomic_write, load_latest

if __name__ == "__main__":
    job.main()
