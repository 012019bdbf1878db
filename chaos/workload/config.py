"""Configuration of the deterministic workload; also the golden-run cache key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from chaos.errors import ConfigError

# How the model's state is laid out over the ranks (chaos.workload.parallel):
#   ddp   every rank holds the whole model and optimizer (replicated; the default)
#   fsdp  FSDP2 fully_shard per transformer block and the root: parameters and AdamW
#         moments are DTensors sharded on dim 0 over all ranks (ZeRO-3)
#   hsdp  FSDP2 on a 2-D mesh (replicate x shard, shard groups of 2): needs an even world size
#   tp    DTensor tensor parallel on every block's MLP (colwise up, rowwise down), other
#         parameters replicated; every rank sees the same batch
PARALLEL_MODES = ("ddp", "fsdp", "hsdp", "tp")

# Fields added after golden-run cache keys were first derived from ``to_dict()``: left
# out at their default value, so every existing configuration keeps its key (and its
# JSON) and only a non-default value makes a new one.
_OMITTED_AT_DEFAULT = ("parallel",)


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
    parallel: str = "ddp"

    def __post_init__(self) -> None:
        if self.parallel not in PARALLEL_MODES:
            raise ConfigError(f"workload parallel={self.parallel!r} is unknown: choose one of {', '.join(PARALLEL_MODES)}")

    @property
    def sharded(self) -> bool:
        """Whether the state handed to a checkpointer holds DTensors (torch's get_state_dict)."""
        return self.parallel != "ddp"

    def check_world_size(self, world_size: int) -> None:
        """Raise a ConfigError where this parallelism cannot run on ``world_size`` ranks."""
        if self.parallel == "hsdp" and (world_size < 2 or world_size % 2):
            raise ConfigError(f"workload parallel=hsdp needs an even world size (shard groups of 2), got {world_size}")
        if self.parallel == "tp" and (4 * self.d_model) % world_size:
            raise ConfigError(f"workload parallel=tp shards the MLP's {4 * self.d_model} hidden units over "
                              f"{world_size} ranks: they must divide evenly")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in _OMITTED_AT_DEFAULT:
            if out[name] == defaults[name]:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save_steps(self) -> list[int]:
        return [s for s in range(1, self.steps + 1) if self.save_every and s % self.save_every == 0]
