"""Synthetic token corpus (a Markov chain, or Faker text) and a resumable, reshuffling distributed sampler.

The batch a rank sees depends on four pieces of state, all of which a checkpoint must
carry: the sampler's own generator (epoch permutation), the position within the
epoch, python's ``random`` (crop offsets) and numpy's global RNG (token noise). A
checkpointer that drops any of them resumes onto different data and the bit-exact
oracle sees it.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from chaos.errors import ConfigError
from chaos.target.workload.config import WorkloadConfig


def make_corpus(cfg: WorkloadConfig) -> torch.Tensor:
    """The ``corpus_sequences`` rows of ``seq_len + 1 + crop_slack`` tokens every rank trains on.

    ``corpus=markov`` (the default): a seeded first-order Markov chain over the vocabulary,
    learnable, not trivial. ``corpus=faker``: byte-level text from Faker (``faker_text``).
    Both depend on ``cfg.seed`` alone, so every rank and every restart builds the same rows.
    """
    if cfg.corpus == "faker":
        return faker_corpus(cfg)
    g = torch.Generator().manual_seed(cfg.seed + 7919)
    row_len = cfg.seq_len + 1 + cfg.crop_slack
    fanout = 4
    successors = torch.randint(0, cfg.vocab, (cfg.vocab, fanout), generator=g)
    corpus = torch.empty(cfg.corpus_sequences, row_len, dtype=torch.long)
    corpus[:, 0] = torch.randint(0, cfg.vocab, (cfg.corpus_sequences,), generator=g)
    choices = torch.randint(0, fanout, (cfg.corpus_sequences, row_len), generator=g)
    for i in range(1, row_len):
        corpus[:, i] = successors[corpus[:, i - 1], choices[:, i]]
    return corpus


# Faker's generators the text is drawn from, one line each (newlines inside an address
# become ", "): prose, and the names, places, dates and addresses real corpora are full of.
FAKER_PROVIDERS = ("sentence", "paragraph", "name", "address", "company", "catch_phrase", "job", "email",
                   "date", "city", "street_address", "phone_number")


def faker_text(seed: int, n_bytes: int) -> bytes:
    """At least ``n_bytes`` of UTF-8 text from Faker's ``en_US`` generators, seeded with ``seed``.

    ``Faker.seed_instance`` gives the generator its own ``random.Random``: the text is the
    same for the same seed (and Faker version: the golden-run key includes it), and the
    global RNGs the workload checkpoints are never touched. Faker is imported only here —
    the default corpus needs nothing — and a missing install is a ConfigError naming the fix.
    """
    try:
        from faker import Faker
    except ImportError:
        raise ConfigError("workload corpus=faker needs the faker package: pip install 'chaos-ckpt[faker]' "
                          "(or pip install faker)") from None
    fake = Faker("en_US")
    fake.seed_instance(seed)
    makers = [getattr(fake, name) for name in FAKER_PROVIDERS]
    parts: list[bytes] = []
    size = 0
    while size < n_bytes:
        line = (str(makers[fake.random.randrange(len(makers))]()).replace("\n", ", ") + "\n").encode()
        parts.append(line)
        size += len(line)
    return b"".join(parts)


def faker_corpus(cfg: WorkloadConfig) -> torch.Tensor:
    """Byte-level rows cut one after another from ``faker_text(cfg.seed)``: a row is a window of
    running text, so the model learns spelling, words and line shapes (a language-like loss curve)."""
    row_len = cfg.seq_len + 1 + cfg.crop_slack
    text = faker_text(cfg.seed, cfg.corpus_sequences * row_len)
    flat = torch.frombuffer(bytearray(text[: cfg.corpus_sequences * row_len]), dtype=torch.uint8)
    return flat.to(torch.long).view(cfg.corpus_sequences, row_len)


class ResumableSampler:
    """Per-epoch reshuffle from a dedicated generator; this rank takes every world_size-th index.

    ``sampler_rng`` is the generator state *before* the current epoch's permutation was
    drawn, so restoring it and redrawing reproduces the permutation exactly.
    """

    def __init__(self, n: int, rank: int, world_size: int, batch_size: int, seed: int) -> None:
        self.n, self.rank, self.world_size, self.batch_size = n, rank, world_size, batch_size
        self.gen = torch.Generator().manual_seed(seed + 104729)
        self.epoch = 0
        self.position = 0
        self._start_epoch()

    @property
    def batches_per_epoch(self) -> int:
        return (self.n // self.world_size) // self.batch_size

    def _start_epoch(self) -> None:
        self._epoch_rng = self.gen.get_state()
        perm = torch.randperm(self.n, generator=self.gen)
        per_rank = self.n // self.world_size
        self._indices = perm[self.rank :: self.world_size][:per_rank]

    def next_indices(self) -> torch.Tensor:
        if self.position >= self.batches_per_epoch:
            self.epoch += 1
            self.position = 0
            self._start_epoch()
        b = self.batch_size
        idx = self._indices[self.position * b : (self.position + 1) * b]
        self.position += 1
        return idx

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "sampler_rng": self._epoch_rng.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.gen.set_state(state["sampler_rng"].clone())  # a view into a load buffer segfaults set_state
        self._start_epoch()


class GlobalSampler:
    """The sharded modes' sampler: one global sample stream, whatever the world size.

    Every rank draws the same per-epoch permutation of the corpus; a training step
    consumes the next ``dp_size * batch_size`` samples of it and data-parallel rank
    ``dp_rank`` takes its ``batch_size`` of them. The state — epoch, *global* position
    (samples consumed this epoch) and the generator state before the epoch's permutation
    — is the same on every rank, so a resume at another world size continues exactly the
    same stream (only how the next samples are split over ranks changes). An epoch ends
    when fewer than a whole step's samples remain. The per-rank crop offsets and token
    noise still come from each rank's own RNGs (``Loader``), so a resized run is judged
    by loss continuity, not bit for bit.
    """

    def __init__(self, n: int, dp_rank: int, dp_size: int, batch_size: int, seed: int) -> None:
        self.n, self.dp_rank, self.dp_size, self.batch_size = n, dp_rank, dp_size, batch_size
        if dp_size * batch_size > n:
            raise ConfigError(f"workload: a step needs {dp_size * batch_size} samples but the corpus has {n} "
                              "(raise corpus_sequences)")
        self.gen = torch.Generator().manual_seed(seed + 104729)
        self.epoch = 0
        self.position = 0
        self._start_epoch()

    def _start_epoch(self) -> None:
        self._epoch_rng = self.gen.get_state()
        self._perm = torch.randperm(self.n, generator=self.gen)

    def next_indices(self) -> torch.Tensor:
        step = self.dp_size * self.batch_size
        if self.position + step > self.n:
            self.epoch += 1
            self.position = 0
            self._start_epoch()
        begin = self.position + self.dp_rank * self.batch_size
        self.position += step
        return self._perm[begin : begin + self.batch_size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "sampler_rng": self._epoch_rng.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.gen.set_state(state["sampler_rng"].clone())
        self._start_epoch()


class Loader:
    """Turns sampled rows into (input, target) batches with random crops and token noise.

    DDP keeps its per-rank sampler (``ResumableSampler``, unchanged since the first golden
    runs); the sharded modes read the global stream (``GlobalSampler``) at their
    data-parallel coordinates.
    """

    def __init__(self, cfg: WorkloadConfig, rank: int, world_size: int, dp_rank: int | None = None,
                 dp_size: int | None = None) -> None:
        self.cfg = cfg
        self.corpus = make_corpus(cfg)
        self.sampler: ResumableSampler | GlobalSampler
        if cfg.parallel == "ddp":
            self.sampler = ResumableSampler(cfg.corpus_sequences, rank, world_size, cfg.batch_size, cfg.seed)
        else:
            self.sampler = GlobalSampler(cfg.corpus_sequences, rank if dp_rank is None else dp_rank,
                                         world_size if dp_size is None else dp_size, cfg.batch_size, cfg.seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        rows = self.corpus[self.sampler.next_indices()]
        offsets = [random.randrange(cfg.crop_slack + 1) for _ in range(rows.size(0))]
        window = torch.stack([r[o : o + cfg.seq_len + 1] for r, o in zip(rows, offsets, strict=True)])
        noise = np.random.random(tuple(window.shape)) < cfg.noise_p
        replacement = np.random.randint(0, cfg.vocab, size=tuple(window.shape))
        window = torch.where(torch.from_numpy(noise), torch.from_numpy(replacement), window)
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()
