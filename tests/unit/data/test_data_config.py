"""Every `conf/data/*.yaml` composes through Hydra (on `base.yaml`), documents every key, and
builds a DataModule; `DataConfig` reads null as its default at every level."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import hydra
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from tiny_corpora import TINY_TOKENIZER, write_text_corpus

from litmt.data import TranslationDataModule
from litmt.data.config import DataConfig
from litmt.errors import ConfigError

CONF_ROOT = Path(__file__).resolve().parents[3] / "conf"
CONF = CONF_ROOT / "data"
CONFIGS = sorted(p.stem for p in CONF.glob("*.yaml"))
CORPORA = [c for c in CONFIGS if c != "base"]


def data_node(name: str, *overrides: str) -> DictConfig:
    """`data=NAME` composed by Hydra (its defaults list included), with command-line
    overrides such as ``data.splits.test=x``."""
    with initialize_config_dir(str(CONF_ROOT), version_base=None):
        return compose(overrides=[f"+data={name}", *overrides]).data


def build(name: str, tmp_path: Path, *cli: str, **overrides: object) -> TranslationDataModule:
    root = OmegaConf.create({"seed": 3, "paths": {"data_dir": str(tmp_path / "data")}})
    root.data = data_node(name, *cli)
    for key, value in overrides.items():
        OmegaConf.update(root, f"data.{key}", value, force_add=True)
    return hydra.utils.instantiate(root.data)


def test_expected_configs_exist() -> None:
    assert {"base", "multi30k", "wmt14_en_de", "iwslt2017_de_en", "local"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_key_is_commented(name: str) -> None:
    for i, line in enumerate((CONF / f"{name}.yaml").read_text().splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            assert "#" in line, f"{name}.yaml:{i} has no comment: {line!r}"


@pytest.mark.parametrize("name", CORPORA)
def test_corpus_configs_inherit_base(name: str) -> None:
    """Each corpus file lists its differences only; every key comes from base.yaml."""
    own = OmegaConf.load(CONF / f"{name}.yaml")
    assert list(own.defaults) == ["base", "_self_"]
    base_keys = set(OmegaConf.load(CONF / "base.yaml").keys())
    assert set(own.keys()) - {"defaults"} <= base_keys
    assert set(data_node(name).keys()) == base_keys


@pytest.mark.parametrize("name", CONFIGS)
def test_data_dir_switches_any_config_to_local_files(name: str, tmp_path: Path) -> None:
    node = data_node(name)
    src, tgt = node.src_lang or "en", node.tgt_lang or "de"
    test = node.splits.test or "test"
    corpus = write_text_corpus(
        tmp_path / "c", {"train": 120, "valid": 10, test: 10}, langs=(src, tgt)
    )
    dm = build(name, tmp_path, dir=str(corpus), tokenizer=TINY_TOKENIZER, num_workers=0)
    assert isinstance(dm, TranslationDataModule)
    assert dm.seed == 3 and dm.cache_dir == tmp_path / "data"
    assert dm.tokenizer_settings.seed == 3  # tokenizer.seed: ${..seed}
    dm.setup("test")
    assert len(dm.references("test")) == 10
    assert str(dm.tokenizer_dir()).startswith(str(tmp_path / "data" / "tokenizers"))


def test_multi30k_defaults(tmp_path: Path) -> None:
    dm = build("multi30k", tmp_path)
    c = dm.corpus
    assert not c.is_local and c.hub.path == "bentrevett/multi30k" and c.layout == "columns"
    assert (dm.src_lang, dm.tgt_lang) == ("en", "de")
    assert c.split_name("valid") == "validation" and c.splits["test"] == "test2016"
    assert c.splits["train"] == "train"  # base's default, not written in multi30k.yaml
    s = dm.tokenizer_settings
    assert (s.vocab_size, s.model_type, s.joint) == (8000, "unigram", True)
    assert dm.config.num_workers == 2 and dm.config.eval_max_tokens == 8192


def test_hub_configs_use_the_translation_layout(tmp_path: Path) -> None:
    wmt = build("wmt14_en_de", tmp_path)
    c = wmt.corpus
    assert (c.hub.path, c.hub.name, c.layout) == ("wmt/wmt14", "de-en", "translation")
    assert (wmt.tokenizer_settings.vocab_size, wmt.filter.dedup, wmt.config.num_proc) == (
        32000,
        True,
        2,
    )
    iwslt = build("iwslt2017_de_en", tmp_path)
    assert (iwslt.src_lang, iwslt.tgt_lang) == ("de", "en")
    assert iwslt.corpus.layout == "translation"
    assert iwslt.corpus.hub.revision == "refs/convert/parquet"


def test_split_names_override_from_the_command_line(tmp_path: Path) -> None:
    """base.yaml lists the split keys, so `data.splits.test=...` works on any corpus file."""
    dm = build("wmt14_en_de", tmp_path, "data.splits.test=newstest", "data.hub.splits.test=nt14")
    assert dm.corpus.splits == {"train": "train", "valid": "valid", "test": "newstest"}
    assert dm.corpus.hub.splits == {"train": "train", "valid": "validation", "test": "nt14"}


def test_relative_dir_is_relative_to_launch_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_text_corpus(tmp_path / "rel", {"train": 50, "valid": 5, "test": 5})
    monkeypatch.chdir(tmp_path)
    dm = build("local", tmp_path, dir="rel", tokenizer=TINY_TOKENIZER)
    assert dm.corpus.files("train")[0] == Path("rel/train.en")
    dm.setup("validate")


# -- DataConfig ---------------------------------------------------------------------------
def test_null_is_the_default_at_every_level() -> None:
    nulls = {
        "max_tokens": None, "num_workers": None, "splits": {"train": None},
        "hub": {"splits": {"valid": None}}, "tokenizer": {"vocab_size": None},
        "filter": {"max_ratio": None}, "seed": None,
    }  # fmt: skip
    assert DataConfig.from_kwargs(nulls) == DataConfig()


def test_the_tokenizer_sample_follows_the_data_seed() -> None:
    assert DataConfig.from_kwargs({"seed": 9}).tokenizer.seed == 9
    assert DataConfig.from_kwargs({"seed": 9, "tokenizer": {"seed": None}}).tokenizer.seed == 9
    assert DataConfig.from_kwargs({"seed": 9, "tokenizer": {"seed": 4}}).tokenizer.seed == 4


def test_zero_switches_a_budget_or_a_cap_off() -> None:
    cfg = DataConfig.from_kwargs({"max_tokens": 0, "batch_size": 32, "max_positions": 0})
    assert cfg.batch_budget(train=True) == (None, 32)
    assert cfg.batch_budget(train=False) == (8192, 32)  # eval_batch_size null = batch_size
    assert cfg.eval_max_len() == (None, None)
    assert DataConfig(max_positions=10).eval_max_len() == (10, 9)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_token": 1}, r"unknown data keys \['max_token'\] \(did you mean max_token -> "),
        ({"splits": {"tset": "x"}}, r"unknown data.splits keys \['tset'\] \(did you mean tset"),
        ({"hub": {"splits": {"dev": "x"}}}, r"unknown data.hub.splits keys \['dev'\]"),
        ({"max_tokens": -1}, r"data.max_tokens must be >= 0 \(0 = off\), got -1"),
        ({"tag_placement": "middle"}, r"unknown data.tag_placement 'middle'"),
        ({"max_tokens": 1}, r"data.max_tokens=1 / data.max_positions=1024 leave no room"),
    ],
)
def test_bad_settings_name_the_key(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DataConfig.from_kwargs(settings)


def test_the_filter_fits_the_batch_and_position_caps() -> None:
    cfg = DataConfig.from_kwargs({"max_tokens": 100, "max_positions": 50})
    assert cfg.filter.max_len == 49
    assert DataConfig.from_kwargs({"max_tokens": 0, "max_positions": 0}).filter.max_len == 256


def test_a_given_config_is_copied(tmp_path: Path) -> None:
    write_text_corpus(tmp_path / "c", {"train": 30, "valid": 5, "test": 5})
    cfg = DataConfig(dir=str(tmp_path / "c"), extra_test=["x"])
    dm = TranslationDataModule(cfg)
    dm.tokenizer_settings.user_defined_symbols.append("<X>")
    assert cfg.tokenizer.user_defined_symbols == [] and dataclasses.is_dataclass(dm.config)
    with pytest.raises(ConfigError, match="pass a DataConfig or data settings, not both"):
        TranslationDataModule(cfg, seed=1)
