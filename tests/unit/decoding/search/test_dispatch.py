"""One decoding API: `DecodeConfig` holds the defaults, every entry point resolves the same ones."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from tiny_checkpoint import tiny_checkpoint_path
from tiny_model import tiny_config

import litmt.decoding.translator
import litmt.training.module
from litmt.cli.script.config_check import expand_short_overrides
from litmt.decoding.config import DecodeConfig, decoding_options
from litmt.decoding.search.beam import beam_search
from litmt.decoding.search.dispatch import decode
from litmt.decoding.search.greedy import greedy_search
from litmt.decoding.translator import Translator
from litmt.deploy.export.base import DEFAULT_DECODING
from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer

REPO = Path(__file__).resolve().parents[4]
CONF = REPO / "conf"
DEFAULTS = DecodeConfig()


def compose_cfg(name: str, overrides: list[str] | None = None):
    """The config the script composes (the short form beam_size=2 expanded first, as run_script)."""
    overrides = expand_short_overrides(overrides or [], name, CONF)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint_path(tmp_path_factory), device="cpu")


@pytest.fixture
def recorded(monkeypatch) -> list[DecodeConfig]:
    """The configs `decode` is called with, from the Translator and the LightningModule."""
    seen: list[DecodeConfig] = []

    def spy(models, src, config=None, **kw):
        seen.append(config or DecodeConfig())
        return decode(models, src, config, **kw)

    monkeypatch.setattr(litmt.decoding.translator, "decode", spy)
    monkeypatch.setattr(litmt.training.module, "decode", spy)
    return seen


def test_job_configs_resolve_to_the_dataclass_defaults():
    assert DecodeConfig.from_options(compose_cfg("translate").decoding) == DEFAULTS
    assert DecodeConfig.from_options(compose_cfg("evaluate").decoding) == DEFAULTS
    assert DecodeConfig.from_options(compose_cfg("serve").decoding) == DEFAULTS
    assert DecodeConfig.from_options(compose_cfg("export").decoding) == DEFAULTS
    assert {k: getattr(DEFAULTS, k) for k in DEFAULT_DECODING} == DEFAULT_DECODING
    score = compose_cfg("score")
    assert DecodeConfig.from_options(score.decoding).length_penalty == DEFAULTS.length_penalty
    # the validation callback overrides one field, on purpose (greedy validation is fast)
    scorer = instantiate(compose_cfg("train").callbacks.bleu)
    assert scorer.decode_config == dataclasses.replace(DEFAULTS, beam_size=1)


def test_a_yaml_override_reaches_the_config():
    cfg = compose_cfg("translate", ["beam_size=2", "method=sample", "top_p=0.5", "n_best=3"])
    got = DecodeConfig.from_options(cfg.decoding)
    assert (got.beam_size, got.method, got.top_p, got.n_best) == (2, "sample", 0.5, 3)
    assert got.max_len_a == DEFAULTS.max_len_a


@pytest.mark.parametrize("path", ["callbacks/default.yaml"])
def test_defaults_quoted_in_yaml_comments_are_the_dataclass_ones(path):
    """A YAML may quote a default as ``[value]`` in a comment; it must be the real one
    (``conf/decoding/default.yaml`` shows the real values themselves, held by
    tests/unit/test_config_defaults.py)."""
    quoted = 0
    for line in (CONF / path).read_text().splitlines():
        m = re.match(r"\s*(\w+): .*#.*\[([^\]]+)\]\s*$", line)
        if m and m.group(1) in {f.name for f in dataclasses.fields(DecodeConfig)}:
            assert m.group(2) == str(getattr(DEFAULTS, m.group(1))), line
            quoted += 1
    assert quoted > 0


def test_translator_and_server_and_module_decode_with_the_defaults(translator, recorded):
    translator.translate(["A red dog runs."])
    assert recorded == [DEFAULTS]

    from fastapi.testclient import TestClient

    from litmt.deploy.server.app import ServeConfig, create_app

    settings = ServeConfig(decoding=dict(compose_cfg("serve").decoding))
    with TestClient(create_app(translator, settings)) as client:
        r = client.post("/translate", json={"q": "A red dog runs.", "source": "en", "target": "de"})
    assert r.status_code == 200, r.text
    assert recorded == [DEFAULTS, DEFAULTS]

    module = SimpleNamespace(model=translator.model)
    litmt.training.module.TranslationModule.forward(module, torch.tensor([[5, 6, 7]]))  # type: ignore[arg-type]
    assert recorded == [DEFAULTS] * 3


def test_validation_decodes_with_the_callback_config(translator, recorded):
    from litmt.training.callbacks.validation_bleu import ValidationBleu

    module = SimpleNamespace(model=translator.model)
    forward = litmt.training.module.TranslationModule.forward
    trainer = SimpleNamespace(
        model=lambda src, config, sync_steps: forward(module, src, config, sync_steps),  # type: ignore[arg-type]
        strategy=None,  # no process group: no lock step
    )
    pl_module = SimpleNamespace(trainer=trainer, tokenizer=translator.tokenizer)
    scorer = ValidationBleu(beam_size=3, length_penalty=0.6)
    scorer.hypotheses(pl_module, {"src": torch.tensor([[5, 6, 7]])})  # type: ignore[arg-type]
    assert recorded == [dataclasses.replace(DEFAULTS, beam_size=3, length_penalty=0.6)]


def test_decode_dispatches_to_the_searches():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(src_vocab_size=40)).eval()
    src = torch.randint(4, 40, (3, 7))
    greedy = greedy_search(model, src)
    beam = beam_search(model, src, beam_size=4, n_best=2, length_penalty=0.6)
    assert decode(model, src, DecodeConfig(method="greedy")) == [[h] for h in greedy]
    assert decode(model, src, DecodeConfig(beam_size=1)) == [[h] for h in greedy]
    assert decode(model, src, DecodeConfig(beam_size=4, n_best=2, length_penalty=0.6)) == beam


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"method": "nucleus"}, "method must be one of beam, greedy, sample, got 'nucleus'"),
        ({"beam_size": 0}, "beam_size must be at least 1, got 0"),
        ({"beam_size": 2, "n_best": 3}, "n_best=3 needs beam_size >= 3"),
        ({"method": "greedy", "n_best": 2}, "greedy decoding gives one hypothesis"),
        ({"min_len": -1}, "min_len must be >= 0, got -1"),
        ({"max_len_b": -1}, "max_len_a and max_len_b must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_k": -2}, "top_k must be >= 0"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
    ],
)
def test_bad_settings_are_one_line_config_errors(fields, message):
    with pytest.raises(ConfigError, match=message) as err:
        DecodeConfig(**fields)
    assert "\n" not in str(err.value)


def test_options_merge_rules():
    base = DecodeConfig(beam_size=3)
    assert decoding_options(base, {"beam_size": None, "n_best": 2}) == DecodeConfig(
        beam_size=3, n_best=2
    )
    assert DecodeConfig.from_options({"length_penalty": 1, "max_tokens": 9}).length_penalty == 1.0
    with pytest.raises(ConfigError, match="unknown decoding option"):
        decoding_options(None, {"beam": 5})
    with pytest.raises(ConfigError, match="beam_size must be of type int"):
        DecodeConfig.from_options({"beam_size": "five"})
    with pytest.raises(ConfigError, match=r"beam_size must be a whole number, got 1\.7"):
        DecodeConfig.from_options({"beam_size": 1.7})  # int() would truncate it to 1
    assert DecodeConfig.from_options({"beam_size": 4.0}).beam_size == 4
