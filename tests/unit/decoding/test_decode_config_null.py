"""`null` in the decoding YAML: None where a field takes it (``seed: null`` = torch's global
generator), refused where it does not; a key left at its default keeps an export's own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from tiny_model import tiny_config

from litmt.cli.script.config_check import expand_short_overrides
from litmt.config import build
from litmt.data.tokenization.tokenizer import EOS_ID
from litmt.decoding.config import DecodeConfig, decoding_options, job_options
from litmt.decoding.search.dispatch import decode
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer

CONF = Path(__file__).resolve().parents[3] / "conf"
VOCAB = 40


def decoding_node(command: str, overrides: list[str]):
    """The composed ``decoding`` node of `command`, short forms spelled out as the scripts do."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(command, expand_short_overrides(overrides, command, CONF))
    return cfg.decoding


def job_config(overrides: list[str], base: DecodeConfig | None = None) -> DecodeConfig:
    """What translate decodes with: the job's chosen keys over `base` (the translator's)."""
    return DecodeConfig.from_options(job_options(decoding_node("translate", overrides)), base)


def random_model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(src_vocab_size=VOCAB)).eval()
    with torch.no_grad():
        model.tgt_embed.weight[EOS_ID] *= 2.0  # tied output: hypotheses end at varied lengths
    return model


def samples(model: Seq2SeqTransformer, config: DecodeConfig) -> list[list[list[int]]]:
    src = torch.randint(4, VOCAB, (6, 9), generator=torch.Generator().manual_seed(2))
    return [[h.tokens for h in hyps] for hyps in decode(model, src, config)]


def test_seed_null_in_the_yaml_samples_from_torchs_global_generator() -> None:
    config = job_config(["method=sample", "n_best=4", "decoding.seed=null"])
    assert config.seed is None and config.method == "sample"
    model = random_model()
    torch.manual_seed(7)
    first = samples(model, config)
    second = samples(model, config)  # the global generator moved on: other samples
    assert first != second
    torch.manual_seed(7)
    assert samples(model, config) == first  # ... and it alone decides them


def test_the_default_seed_0_reproduces_the_samples_whatever_the_global_generator() -> None:
    config = job_config(["method=sample", "n_best=4"])
    assert config.seed == 0 == DecodeConfig().seed
    model = random_model()
    torch.manual_seed(7)
    first = samples(model, config)
    state = torch.get_rng_state()
    assert samples(model, config) == first
    assert torch.equal(torch.get_rng_state(), state)  # its own generator: global one untouched
    torch.manual_seed(8)
    assert samples(model, config) == first


@pytest.mark.parametrize("key", ["beam_size", "method", "length_penalty"])
def test_null_for_a_field_that_needs_a_value_is_one_line(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^decoding\.{key} cannot be null; .*default") as info:
        job_config([f"decoding.{key}=null"])
    assert "\n" not in str(info.value)


def test_a_key_left_at_its_default_keeps_the_base_and_a_chosen_one_overrides_it() -> None:
    export = DecodeConfig(beam_size=4, length_penalty=0.6)  # an export's litmt.json defaults
    assert job_config([], export) == export  # the YAML repeats DecodeConfig's defaults only
    chosen = job_config(["beam_size=3", "decoding.seed=null"], export)
    assert (chosen.beam_size, chosen.seed, chosen.length_penalty) == (3, None, 0.6)
    # the command line's own keys count even when they repeat DecodeConfig's default
    node = decoding_node("translate", ["beam_size=5"])
    assert job_options(node, named=()) == {}
    assert job_options(node, named=("beam_size",)) == {"beam_size": 5}
    assert DecodeConfig.from_options({"beam_size": 5}, export).beam_size == 5


def test_from_options_absent_keeps_the_base_and_null_is_none_for_seed() -> None:
    base = DecodeConfig(seed=3, beam_size=2)
    assert DecodeConfig.from_options({"top_k": 5}, base) == dataclasses.replace(base, top_k=5)
    assert DecodeConfig.from_options({"seed": None}, base).seed is None
    # the keyword API (Translator.translate(beam_size=None)): None keeps a value-only field
    kept = decoding_options(base, {"beam_size": None, "seed": None})
    assert (kept.beam_size, kept.seed) == (2, None)


@dataclasses.dataclass
class _Settings:
    name: str = "x"
    """a value"""
    limit: int | None = 3
    """null = no limit"""


def test_build_keeps_absent_keys_makes_null_none_and_refuses_null_for_a_plain_field() -> None:
    assert build(_Settings, {}, "demo") == _Settings()
    assert build(_Settings, {"limit": None}, "demo").limit is None
    with pytest.raises(ConfigError, match=r"^demo\.name cannot be null; .*\(default x\)$"):
        build(_Settings, {"name": None}, "demo")
