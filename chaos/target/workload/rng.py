"""Capture and restore every RNG a rank uses, as tensors and plain numbers.

Python's and numpy's states are tuples holding big ints and arrays; they are stored as
int64 tensors so that any checkpointer that can store tensors can store them, and no
pickle is needed. ``gauss`` values use NaN for "no cached value" (None).

A rank that computes on a GPU also carries that device's CUDA generator state under
``cuda`` (a CPU uint8 tensor: philox seed and offset), captured from and restored to the
rank's current device — per device, whatever else the process can see, so the state
has the same shape under any ``CUDA_VISIBLE_DEVICES``. A cpu rank leaves CUDA alone,
even on a machine with GPUs: its state has no ``cuda`` entry and it never initialises CUDA.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch


def capture(device: str = "cpu") -> dict:
    version, words, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    assert np_name == "MT19937"
    state = {
        "python": {
            "version": int(version),
            "state": torch.tensor(list(words), dtype=torch.int64),
            "gauss": float("nan") if gauss is None else float(gauss),
        },
        "numpy": {
            "state": torch.from_numpy(np.asarray(np_keys, dtype=np.int64).copy()),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "torch": torch.get_rng_state(),
    }
    if device == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def restore(state: dict) -> None:
    py = state["python"]
    gauss = None if math.isnan(py["gauss"]) else py["gauss"]
    random.setstate((int(py["version"]), tuple(int(w) for w in py["state"].tolist()), gauss))
    npst = state["numpy"]
    keys = npst["state"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, int(npst["pos"]), int(npst["has_gauss"]), float(npst["cached_gaussian"])))
    torch.set_rng_state(state["torch"].to(torch.uint8).clone())
    if "cuda" in state:
        if not torch.cuda.is_available():
            raise RuntimeError("the checkpoint holds a CUDA RNG state but this rank sees no CUDA device")
        torch.cuda.set_rng_state(state["cuda"].to(torch.uint8).clone(), torch.cuda.current_device())


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
