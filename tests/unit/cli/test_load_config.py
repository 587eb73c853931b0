"""The checkpoint-loading group (conf/load/default.yaml, `LoadConfig`) shared by the commands,
and the old spellings of renamed keys: still accepted for one release, with a deprecation line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tiny_checkpoint import tiny_checkpoint_path

from litmt.cli.average import average
from litmt.cli.translate import wants_scores
from litmt.deploy.loader import LoadConfig, engine_options, load_translator
from litmt.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf"
COMMANDS = (
    "translate",
    "evaluate",
    "score",
    "visualize_attention",
    "export",
    "average_checkpoints",
)


def composed(name: str, overrides: list[str] | None = None):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=name, overrides=overrides or [])


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_composes_the_load_keys_at_its_top_level(command):
    cfg = composed(command, ["ckpt_path=m.ckpt", "run_dir=R"])
    load = LoadConfig.from_cfg(cfg, command)
    assert (load.ckpt_path, load.run_dir) == ("m.ckpt", "R")
    assert load.ensemble is False and load.allow_zero_shot is False  # null = the default
    expected = "cpu" if command == "visualize_attention" else None  # its own file overrides it
    assert load.device == expected


def test_load_config_reads_lists_paths_and_directions(tmp_path):
    cfg = OmegaConf.create(
        {"ckpt_path": ["a.ckpt", "b.ckpt"], "src_lang": "en", "tgt_lang": "fr", "other": 1}
    )
    load = LoadConfig.from_cfg(cfg, "translate")
    assert load.paths() == ["a.ckpt", "b.ckpt"]
    assert load.direction() == {"src_lang": "en", "tgt_lang": "fr", "allow_zero_shot": False}
    with pytest.raises(ConfigError, match="no checkpoint given"):
        LoadConfig.from_cfg(OmegaConf.create({}), "translate").paths()


def test_a_key_the_command_does_not_read_is_refused_in_one_line():
    cfg = composed("export", ["ckpt_path=m.ckpt", "out=o", "device=cuda"])
    with pytest.raises(ConfigError, match=r"^export does not read device=cuda; drop it$"):
        LoadConfig.from_cfg(cfg, "export", ignores=("device", "attention"))
    cfg = composed("score", ["ckpt_path=m.ckpt", "ensemble=true"])
    with pytest.raises(ConfigError, match="score does not read ensemble=True"):
        LoadConfig.from_cfg(cfg, "score", ignores=("ensemble",))


# -- renamed keys: the old spelling works one release, with a deprecation line ---------------
def test_translate_scores_is_the_old_name_of_return_scores(caplog):
    caplog.set_level(logging.WARNING, logger="litmt")
    assert wants_scores(composed("translate", ["return_scores=true"]))
    assert "deprecated" not in caplog.text
    assert wants_scores(composed("translate", ["scores=true"]))
    assert "translate: scores is deprecated" in caplog.text
    assert "use return_scores" in caplog.text
    assert not wants_scores(composed("translate"))


def test_ct2_cache_is_the_old_name_of_ct2_cache_dir(caplog, tmp_path):
    caplog.set_level(logging.WARNING, logger="litmt")
    new = engine_options(composed("translate", [f"ct2_cache_dir={tmp_path}"]))
    assert new["ct2_cache_dir"] == str(tmp_path) and "deprecated" not in caplog.text
    old = engine_options(composed("evaluate", [f"ct2_cache={tmp_path}"]))
    assert old["ct2_cache_dir"] == str(tmp_path)
    assert "engine: ct2_cache is deprecated" in caplog.text and "use ct2_cache_dir" in caplog.text
    with pytest.raises(ConfigError, match=r"set only ct2_cache_dir"):
        engine_options(composed("translate", ["ct2_cache=a", "ct2_cache_dir=b"]))


def test_load_translator_cache_dir_is_the_old_name_of_ct2_cache_dir(caplog, tmp_path_factory):
    caplog.set_level(logging.WARNING, logger="litmt")
    ckpt = tiny_checkpoint_path(tmp_path_factory)
    load_translator(ckpt, engine="torch", device="cpu", cache_dir="old-dir")
    assert "load_translator: cache_dir is deprecated" in caplog.text
    # the old keyword reaches the new one: engine=torch reports it under its new name
    assert "ct2_cache_dir=old-dir ignored by engine=torch" in caplog.text


def test_average_inputs_is_the_old_name_of_ckpt_path(caplog, tmp_path, tmp_path_factory):
    caplog.set_level(logging.WARNING, logger="litmt")
    ckpt = tiny_checkpoint_path(tmp_path_factory)
    out = average(composed("average_checkpoints", [f"inputs=[{ckpt}]", f"output={tmp_path / 'a'}"]))
    assert out.is_file()
    assert "average_checkpoints: inputs is deprecated" in caplog.text
    assert "use ckpt_path" in caplog.text
