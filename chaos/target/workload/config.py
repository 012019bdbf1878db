"""Configuration of the deterministic workload; also the golden-run cache key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from chaos.errors import ConfigError

# How the model's state is laid out over the ranks (chaos.target.workload.parallel):
#   ddp   every rank holds the whole model and optimizer (replicated; the default)
#   fsdp  FSDP2 fully_shard per transformer block and the root: parameters and AdamW
#         moments are DTensors sharded on dim 0 over all ranks (ZeRO-3)
#   hsdp  FSDP2 on a 2-D mesh (replicate x shard, shard groups of 2): needs an even world size
#   tp    DTensor tensor parallel on every block's MLP (colwise up, rowwise down), other
#         parameters replicated; every rank sees the same batch
PARALLEL_MODES = ("ddp", "fsdp", "hsdp", "tp")
# Where the ranks compute (chaos.target.workload.device):
#   cpu   gloo, every run bit-exact (the default)
#   cuda  one GPU per rank (CUDA_VISIBLE_DEVICES set per rank by the supervisor), the
#         default process group "cpu:gloo,cuda:nccl" (CUDA tensors over NCCL, CPU over gloo)
DEVICES = ("cpu", "cuda")
# The training text (chaos.target.workload.data):
#   markov  a seeded first-order Markov chain over the vocabulary (the default; every
#           measured golden loss in the tests and README comes from it)
#   faker   byte-level text from Faker's generators seeded with the workload seed
#           (sentences, names, addresses, ...): a language-like loss curve. Needs the
#           faker package (pip install 'chaos-ckpt[faker]'), imported only then.
CORPORA = ("markov", "faker")

# Fields added after golden-run cache keys were first derived from ``to_dict()``: left
# out at their default value, so every existing configuration keeps its key (and its
# JSON) and only a non-default value makes a new one.
_OMITTED_AT_DEFAULT = ("parallel", "device", "deterministic", "corpus")


@dataclass(frozen=True)
class WorkloadConfig:
    """Everything that decides the numbers a run produces (besides world size).

    Defaults give a ~0.47 M parameter model (two pre-LN blocks, d_model 128, full AdamW
    state) that trains a 2-rank DDP step in ~17 ms on one CPU thread each, so a 40-step
    kill scenario takes under 2 s. (d_model was 256 until 2026-12-04: ~1.7 M parameters,
    ~38 ms a step; nothing a checkpointer does depends on the width.)
    """

    seed: int = 0
    steps: int = 40
    save_every: int = 5
    vocab: int = 256
    d_model: int = 128
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
    # cpu | cuda; the CLI's ``--device`` sets it (and ``chaos replay`` reads it back).
    device: str = "cpu"
    # device=cuda only: ask for bit-exact runs (torch.use_deterministic_algorithms(True),
    # CUBLAS_WORKSPACE_CONFIG=:4096:8, deterministic cuDNN). Off, a cuda run is judged in
    # tolerance mode. On CPU every run is deterministic already; the key changes nothing there.
    deterministic: bool = False
    corpus: str = "markov"

    def __post_init__(self) -> None:
        if self.parallel not in PARALLEL_MODES:
            raise ConfigError(f"workload parallel={self.parallel!r} is unknown: choose one of {', '.join(PARALLEL_MODES)}")
        if self.device not in DEVICES:
            raise ConfigError(f"workload device={self.device!r} is unknown: choose one of {', '.join(DEVICES)}")
        if not isinstance(self.deterministic, bool):
            raise ConfigError(f"workload deterministic={self.deterministic!r} must be true or false")
        if self.corpus not in CORPORA:
            raise ConfigError(f"workload corpus={self.corpus!r} is unknown: choose one of {', '.join(CORPORA)}")
        if self.corpus == "faker" and self.vocab < 256:
            raise ConfigError(f"workload corpus=faker is byte-level text and needs vocab >= 256, got {self.vocab}")

    @property
    def nondeterministic(self) -> bool:
        """Whether two runs of this configuration may differ (tolerance mode: loss_continuity
        judges, bit_exact is not judged); what the runner passes to ``oracles.judge``.

        Which case is judged bit-exact:

        * ``device=cpu`` (gloo): always, unless ``nondeterminism > 0`` (the simulated noise).
        * ``device=cuda``: only with ``deterministic=true``, which switches on
          ``torch.use_deterministic_algorithms(True)`` (with ``CUBLAS_WORKSPACE_CONFIG`` and
          deterministic cuDNN) so kernels repeat their results, and only while the world
          size stays fixed (NCCL then picks the same algorithm for the same ranks and
          topology; a run that changes world size is tolerance mode on any device).
          Without it a cuda run is tolerance mode by default: atomics-based kernels and
          NCCL's reductions are not bit-reproducible across restarts.
        """
        return self.nondeterminism > 0 or (self.device == "cuda" and not self.deterministic)

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
