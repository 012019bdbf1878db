"""Planted defect: the loader reads the weights back in single precision.

The job of ``correct.py``, but every weight it loads is rounded to float32 (a loader that
casts to the model's dtype before the full-precision copy is restored): the resumed job
trains on from a state close to, but not exactly, the one it saved. Its probe says so:
``probe.resumed(n, state)`` is not the state ``probe.saving(n, state)`` announced.
"""

import struct

from chaos.examples import careful_job as job

CHAOS_JOB = {"faults": ("kill",), "result_globs": ("final.json",), "max_points": 12}
EXPECTED_CATCH = {"kill": ("committed_state",)}

load = job.load_latest


def load_latest(out: str, prefix: str, rank: int | None = None) -> dict | None:
    state = load(out, prefix, rank)
    if state is not None:  # the defect: a float64 weight through a float32
        state = {**state, "weights": [struct.unpack("f", struct.pack("f", w))[0] for w in state["weights"]]}
    return state


job.load_latest = load_latest

if __name__ == "__main__":
    job.main()
