"""Configuration of the deterministic workload; also the golden-run cache key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkloadConfig:
    """Everything that decides the numbers a run produces (besides world size).

    Defaults give a ~1.6 M parameter model that trains a step in tens of
    milliseconds on one CPU thread, so a 40-step 2-rank scenario takes seconds.
    """

    seed: int = 0
    steps: int = 40
    save_every: int = 5
    vocab: int = 256
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 32
    batch_size: int = 4
    dropout: float = 0.1
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup_steps: int = 5
    corpus_sequences: int = 256
    crop_slack: int = 8
    noise_p: float = 0.02
    collective_timeout_s: float = 20.0
    # Relative std of noise multiplied into every gradient after the all-reduce, drawn from a
    # generator seeded afresh per launch (shared by all ranks): stands in for NCCL's and
    # nondeterministic kernels' run-to-run differences. 0 = bit-exact reproducible runs.
    nondeterminism: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save_steps(self) -> list[int]:
        return [s for s in range(1, self.steps + 1) if self.save_every and s % self.save_every == 0]
