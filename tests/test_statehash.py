import math

import numpy as np
import torch

from chaos.model.statehash import fingerprint, first_difference, state_digest


def test_int_and_str_keys_fingerprint_apart():
    a = fingerprint({"state": {0: torch.ones(2)}})
    b = fingerprint({"state": {"0": torch.ones(2)}})
    assert a != b
    assert first_difference(a, b) is not None


def test_tensor_digest_covers_dtype_shape_and_bytes():
    base = fingerprint({"t": torch.zeros(4, dtype=torch.float32)})
    assert base != fingerprint({"t": torch.zeros(4, dtype=torch.float64)})
    assert base != fingerprint({"t": torch.zeros(2, 2, dtype=torch.float32)})
    flipped = torch.zeros(4)
    flipped.view(torch.int32)[2] ^= 1  # one bit of one element
    assert base != fingerprint({"t": flipped})
    assert base == fingerprint({"t": torch.zeros(4)})


def test_leaf_types_and_exact_floats_are_kept_apart():
    prints = [fingerprint({"v": v}) for v in (1, 1.0, True, "1", None, b"1", [1])]
    assert len({state_digest(p) for p in prints}) == len(prints)
    assert fingerprint({"v": 0.1 + 0.2}) != fingerprint({"v": 0.3})
    assert fingerprint({"v": math.nan}) == fingerprint({"v": float("nan")})


def test_numpy_and_bfloat16_and_scalar_tensors_hash():
    prints = fingerprint({"a": np.arange(3), "b": torch.ones(3, dtype=torch.bfloat16), "c": torch.tensor(2.0)})
    assert set(prints) == {"a", "b", "c"}


def test_first_difference_names_missing_extra_and_changed_paths():
    a = {"x": "1", "y": "2"}
    assert first_difference(a, {"x": "1"}) == "y: missing"
    assert first_difference(a, {"x": "1", "y": "2", "z": "3"}) == "z: unexpected"
    assert first_difference(a, {"x": "9", "y": "2"}) == "x: differs"
    assert first_difference(a, dict(a)) is None


def test_empty_containers_are_leaves():
    assert fingerprint({"opt": {"state": {}}}) != fingerprint({"opt": {}})
