"""Every `conf/data/*.yaml` instantiates through Hydra and documents every key."""

from __future__ import annotations

from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf
from tiny_corpora import TINY_TOKENIZER, write_text_corpus

from litmt.data import TranslationDataModule

CONF = Path(__file__).resolve().parents[3] / "conf" / "data"
CONFIGS = sorted(p.stem for p in CONF.glob("*.yaml"))


def compose(name: str, tmp_path: Path, **overrides: object) -> TranslationDataModule:
    root = OmegaConf.create({"seed": 3, "paths": {"data_dir": str(tmp_path / "data")}})
    root.data = OmegaConf.load(CONF / f"{name}.yaml")
    for key, value in overrides.items():
        OmegaConf.update(root, f"data.{key}", value, force_add=True)
    return hydra.utils.instantiate(root.data)


def test_expected_configs_exist() -> None:
    assert {"multi30k", "wmt14_en_de", "iwslt2017_de_en", "local"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_key_is_commented(name: str) -> None:
    for i, line in enumerate((CONF / f"{name}.yaml").read_text().splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            assert "#" in line, f"{name}.yaml:{i} has no comment: {line!r}"


@pytest.mark.parametrize("name", CONFIGS)
def test_data_dir_switches_any_config_to_local_files(name: str, tmp_path: Path) -> None:
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    src, tgt = cfg.src_lang, cfg.tgt_lang
    corpus = write_text_corpus(
        tmp_path / "c", {"train": 120, "valid": 10, cfg.splits.test: 10}, langs=(src, tgt)
    )
    dm = compose(name, tmp_path, dir=str(corpus), tokenizer=TINY_TOKENIZER, num_workers=0)
    assert isinstance(dm, TranslationDataModule)
    assert dm.seed == 3 and dm.cache_dir == tmp_path / "data"
    dm.setup("test")
    assert len(dm.references("test")) == 10
    assert str(dm.tokenizer_dir()).startswith(str(tmp_path / "data" / "tokenizers"))


def test_multi30k_defaults(tmp_path: Path) -> None:
    dm = compose("multi30k", tmp_path)
    c = dm.corpus
    assert not c.is_local and c.hub.path == "bentrevett/multi30k" and c.layout == "columns"
    assert (dm.src_lang, dm.tgt_lang) == ("en", "de")
    assert c.split_name("valid") == "validation" and c.splits["test"] == "test2016"
    s = dm.tokenizer_settings
    assert (s.vocab_size, s.model_type, s.joint) == (8000, "unigram", True)


def test_hub_configs_use_the_translation_layout(tmp_path: Path) -> None:
    wmt = compose("wmt14_en_de", tmp_path).corpus
    assert (wmt.hub.path, wmt.hub.name, wmt.layout) == ("wmt/wmt14", "de-en", "translation")
    iwslt = compose("iwslt2017_de_en", tmp_path)
    assert (iwslt.src_lang, iwslt.tgt_lang) == ("de", "en")
    assert iwslt.corpus.layout == "translation"


def test_relative_dir_is_relative_to_launch_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_text_corpus(tmp_path / "rel", {"train": 50, "valid": 5, "test": 5})
    monkeypatch.chdir(tmp_path)
    dm = compose("local", tmp_path, dir="rel", tokenizer=TINY_TOKENIZER)
    assert dm.corpus.files("train")[0] == Path("rel/train.en")
    dm.setup("validate")
