"""``--workload corpus=faker``: byte-level training text from Faker's generators, seeded.

The default corpus (a Markov chain) is untouched: its golden losses are facts other
tests rely on. The Faker corpus is the same for the same seed, leaves the RNGs the
workload checkpoints alone, and two ranks training on it still resume bit for bit.
"""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import torch

from chaos.errors import ConfigError
from chaos.record import golden
from chaos.target.workload.config import WorkloadConfig
from chaos.target.workload.data import faker_text, make_corpus

FAKER = WorkloadConfig(corpus="faker")


def test_the_default_corpus_is_still_the_markov_chain():
    assert WorkloadConfig().corpus == "markov"
    assert "corpus" not in WorkloadConfig().to_dict()  # the default's golden key is what it was
    assert FAKER.to_dict()["corpus"] == "faker" and WorkloadConfig.from_dict(FAKER.to_dict()) == FAKER
    assert golden.golden_key(FAKER, 2, "gloo") != golden.golden_key(WorkloadConfig(), 2, "gloo")


def test_the_corpus_is_reproducible_from_the_seed():
    corpus = make_corpus(FAKER)
    assert corpus.shape == (FAKER.corpus_sequences, FAKER.seq_len + 1 + FAKER.crop_slack)
    assert corpus.dtype == torch.long
    assert torch.equal(corpus, make_corpus(WorkloadConfig(corpus="faker")))
    assert not torch.equal(corpus, make_corpus(WorkloadConfig(corpus="faker", seed=1)))
    assert faker_text(0, 500) == faker_text(0, 500)


def test_the_corpus_is_text_cut_into_rows():
    corpus = make_corpus(FAKER)
    assert 0 <= int(corpus.min()) and int(corpus.max()) < 256
    text = bytes(corpus.flatten().tolist())
    assert text == faker_text(FAKER.seed, len(text))[: len(text)]  # rows follow each other in the running text
    decoded = text.decode("utf-8", errors="replace")
    letters = sum(c.isalpha() or c.isspace() for c in decoded)
    assert letters / len(decoded) > 0.7, decoded[:200]
    assert len(set(decoded.split())) > 300  # words, not a handful of symbols


def test_building_it_leaves_the_checkpointed_rngs_alone():
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    make_corpus(FAKER)
    assert random.getstate() == before[0]
    assert (np.random.get_state()[1] == before[1]).all()
    assert torch.equal(torch.get_rng_state(), before[2])


def test_faker_text_needs_a_byte_vocabulary():
    with pytest.raises(ConfigError, match="corpus=faker is byte-level text and needs vocab >= 256, got 64"):
        WorkloadConfig(corpus="faker", vocab=64)
    with pytest.raises(ConfigError, match="corpus='poems' is unknown: choose one of markov, faker"):
        WorkloadConfig(corpus="poems")


def test_a_missing_faker_is_a_config_error_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "faker", None)  # import faker now raises ImportError
    with pytest.raises(ConfigError, match=r"corpus=faker needs the faker package: pip install 'chaos-ckpt\[faker\]'"):
        make_corpus(FAKER)


def test_the_golden_key_follows_the_faker_version(monkeypatch):
    key = golden.golden_key(FAKER, 2, "gloo")
    monkeypatch.setattr(golden, "_faker_version", lambda: "0.0.1")
    assert golden.golden_key(FAKER, 2, "gloo") != key
    assert golden.golden_key(WorkloadConfig(), 2, "gloo") == golden.golden_key(WorkloadConfig(), 2, "gloo")


@pytest.mark.chaos
def test_two_ranks_on_faker_text_resume_bit_exactly_after_a_kill(chaos):
    result = chaos.run(chaos.scenario("reference", ["kill:rank=1,step=10"], world_size=2, steps=12, save_every=4,
                                      corpus="faker"))
    chaos.check(result)
    assert result.oracles["bit_exact"].passed, result.oracles["bit_exact"].summary
    assert len(result.record.attempts) == 2
    assert "--workload corpus=faker" in result.replay
    # It learns: from about ln(256) = 5.55 nats at step 1 (measured 5.70) to about 3.6 over
    # steps 9-12 (measured); a margin of 1 nat keeps this a fact, not a timing.
    curve = result.golden.curves[0]
    assert abs(curve[0] - 5.55) < 0.5
    assert sum(curve[-4:]) / 4 < curve[0] - 1.0, curve
